"""ALMA prox (Rony et al., CVPR'23), as adv-lib 0.2.8 ``attacks.segmentation.alma_prox`` (§4.2).

Per step i (0-based) of N: forward at x + δ; track the best iterate (smallest
‖δ‖∞ among iterates with >= 99 % of masked pixels misclassified, else the most
adversarial one); adapt the constraint scale w; constraints
``g = w·DLR`` (positive while correct); drop the K_i largest constraints
(``K_i = ⌊0.01·Σm·i/(N-1)⌋``); every 10 steps double ρ where a constraint
neither improved by τ = 0.95 nor was ever adversarial; EMA-update the
multipliers μ with the penalty derivative; gradient step on
``Σ A·P(g; ρ, μ)`` preconditioned by an RMS metric H; then the proximal
operator of ``λ‖·‖∞ + box`` in metric H by ternary search.

Numerics (§10.3): everything float32. The reference keeps μ, ρ and the
penalty in float64 but its δ-gradient, the RMS accumulator S and the
constraints are float32, so float32 overflow of ``S`` (-> H = inf, the
coordinate stops moving) happens in the reference too and is reproduced, not
clamped. The ternary search runs a fixed 35 iterations with a per-image stop
at the reference's step count ``⌈log(1e-6/‖δ̄‖∞)/log(2/3)⌉`` computed from the
image's own ‖δ̄‖∞ (the reference uses the batch maximum: identical at B = 1,
otherwise a bracket difference < 1e-6).

``reference_quirks=True`` uses adv-lib's penalty derivative on y >= 0,
``μ·y + 2μρy + ½ρ²y²``; False the analytic ``μ + 2μρy + ½ρ²y²`` (§8.2 #10).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from jaxseg_robust.attacks.perturb import losses
from jaxseg_robust.attacks.perturb.common import (
    AttackResult,
    LogitsFn,
    batch_view,
    check_attack_inputs,
    check_positive,
    clip_to_ball,
    count_pixels,
    linf_norm,
    table,
)
from jaxseg_robust.attacks.perturb.common import check_steps as require_int
from jaxseg_robust.attacks.perturb.dag import success_fraction

TERNARY_MAX_STEPS = 35  # ⌈log(1e-6)/log(2/3)⌉ for ‖δ̄‖∞ <= 1
TERNARY_TOLERANCE = 1e-6
TERNARY_SECTION = 1.0 / 3.0


def penalty(y, rho, mu) -> jnp.ndarray:
    """Penalty-Lagrangian P2 (segmentation variant): ``μy + μρy² + ρ²y³/6`` (y >= 0), ``μy/(1 - max(ρ,1)·y)`` (y < 0).

    Args:
      y, rho, mu: broadcastable f32 arrays (constraint, penalty parameter, multiplier).

    Returns:
      f32 array of the broadcast shape.
    """
    upper = mu * y + mu * rho * y ** 2 + (1.0 / 6.0) * rho ** 2 * y ** 3
    lower = mu * y / (1.0 - jnp.maximum(rho, 1.0) * jnp.minimum(y, 0.0))
    return jnp.where(y >= 0, upper, lower)


def penalty_derivative(y, rho, mu, *, reference_quirks: bool = True) -> jnp.ndarray:
    """dP/dy as used by the attack (adv-lib's custom backward under ``reference_quirks``).

    y >= 0: ``μ·y + 2μρy + ½ρ²y²`` (quirk) or ``μ + 2μρy + ½ρ²y²`` (analytic);
    y < 0: ``μ / (1 - max(ρ,1)·y)²``.
    """
    first = mu * y if reference_quirks else mu
    upper = first + 2.0 * mu * rho * y + 0.5 * rho ** 2 * y ** 2
    lower = mu / jnp.square(1.0 - jnp.maximum(rho, 1.0) * jnp.minimum(y, 0.0))
    return jnp.where(y >= 0, upper, lower)


def kth_largest_mask(constraints, mask, k, k_max: int) -> jnp.ndarray:
    """Constraint masking: ``mask & (g <= ξ)`` with ξ the k-th largest masked g; ``mask`` where k = 0.

    Args:
      constraints: f32[B, H, W].
      mask: bool[B, H, W].
      k: int32[B] number of constraints to consider dropped (the k-1 strictly
        largest are dropped, as adv-lib).
      k_max: static upper bound of k (>= 1).

    Returns:
      bool[B, H, W].
    """
    flat = jnp.where(mask, constraints, -jnp.inf).reshape(constraints.shape[0], -1)
    top = lax.top_k(flat, k_max)[0]
    xi = jnp.take_along_axis(top, jnp.clip(k - 1, 0, k_max - 1)[:, None], axis=1)[:, 0]
    masked = mask & (constraints <= batch_view(xi, 3))
    return jnp.where(batch_view(k >= 1, 3), masked, mask)


def prox_linf_box(delta, lower, upper, weight, step) -> jnp.ndarray:
    """Proximal operator of ``λ‖·‖∞ + ι_[lower, upper]`` in the diagonal metric H (adv-lib ``prox_linf_indicator``).

    Minimises ``φ(t) = Σ_j H_j (clip(δ̄_j, -t, t) - δ_j)² + 2λt`` over
    ``t ∈ [0, ‖δ̄‖∞]``, ``δ̄ = clip(δ, lower, upper)``, by ternary search
    (section 1/3) to a bracket below 1e-6, and returns ``clip(δ̄, -t*, t*)``.

    Args:
      delta: f32[B, ...] point δ.
      lower, upper: f32[B, ...] box bounds (-x and 1 - x).
      weight: f32[B, ...] metric H (> 0).
      step: f32[B] λ >= 0.

    Returns:
      f32[B, ...].
    """
    shape = delta.shape
    flat = lambda a: a.reshape(shape[0], -1)
    delta_f, weight_f = flat(delta), flat(weight)
    projected = jnp.clip(delta_f, flat(lower), flat(upper))
    right = jnp.max(jnp.abs(projected), axis=1)
    steps = jnp.ceil(jnp.log(jnp.float32(TERNARY_TOLERANCE) / right) / jnp.float32(math.log(1 - TERNARY_SECTION)))
    steps = jnp.where(jnp.isfinite(steps), steps, 0.0)
    twice_step = 2.0 * step
    high_weight = jnp.float32(1 - TERNARY_SECTION)

    def objective(t):
        clipped = jnp.clip(projected, -t[:, None], t[:, None])
        return jnp.sum(jnp.square(clipped - delta_f) * weight_f, axis=1) + t * twice_step

    def body(j, bracket):
        left, right = bracket
        left_third = left + jnp.float32(TERNARY_SECTION) * (right - left)
        right_third = right - (right - left) * (1.0 - high_weight)
        move_left = objective(left_third) >= objective(right_third)
        running = j < steps
        left = jnp.where(running & move_left, left_third, left)
        right = jnp.where(running & ~move_left, right_third, right)
        return left, right

    left, right = lax.fori_loop(0, TERNARY_MAX_STEPS, body, (jnp.zeros_like(right), right))
    radius = right - (right - left) * 0.5
    return jnp.clip(projected, -radius[:, None], radius[:, None]).reshape(shape)


class _AlmaState(NamedTuple):
    delta: jnp.ndarray        # f32[B, H, W, 3]
    square_avg: jnp.ndarray   # S, f32[B, H, W, 3]
    mu: jnp.ndarray           # f32[B, H, W]
    rho: jnp.ndarray          # f32[B, H, W]
    scale: jnp.ndarray        # w, f32[B]
    pixel_adv_seen: jnp.ndarray  # bool[B, H, W]
    prev_constraints: jnp.ndarray  # f32[B, H, W]
    best_dist: jnp.ndarray    # f32[B]
    best_fraction: jnp.ndarray  # f32[B]
    found: jnp.ndarray        # bool[B]
    step_found: jnp.ndarray   # f32[B]
    output: jnp.ndarray       # f32[B, H, W, 3]


def track_best(output, best_dist, best_fraction, found, candidate, dist, fraction, threshold):
    """adv-lib's best-iterate rule shared by ALMA prox and PDPGD.

    ``better = (dist <= best_dist ∧ adv) ∨ (¬found ∧ fraction >= min(best_fraction, threshold))``.

    Returns:
      (output, best_dist, best_fraction, found, is_adv).
    """
    is_adv = fraction >= threshold
    better = ((dist <= best_dist) & is_adv) | (~found & (fraction >= jnp.minimum(best_fraction, threshold)))
    output = jnp.where(batch_view(better, 4), candidate, output)
    return (output, jnp.where(better, dist, best_dist), jnp.where(better, fraction, best_fraction),
            found | is_adv, is_adv)


def decay_counts(mask_count, num_steps: int, fraction: float) -> jnp.ndarray:
    """Per-step numbers of masked constraints ``⌊(fraction·Σm)·(i/(N-1))⌋`` in float32 as adv-lib: int32[N, B]."""
    base = jnp.float32(fraction) * mask_count.astype(jnp.float32)
    ratios = table([i / (num_steps - 1) if num_steps > 1 else 0.0 for i in range(num_steps)])
    return jnp.floor(ratios[:, None] * base[None, :]).astype(jnp.int32)


@dataclasses.dataclass(frozen=True)
class AlmaConfig:
    """Static settings of ALMA prox (defaults: C-R's call, ``lr_init = 1e-4``; Rony et al. use 1e-3).

    Attributes:
      num_steps .. mask_decay: adv-lib's hyperparameters (same names; Greek
        letters spelled out; ``alpha_rms=None`` means ``alpha``).
      threshold: fraction of masked pixels that must be misclassified.
      epsilon: if not None, clip the result into x ± ε (battery behaviour).
      reference_quirks: adv-lib's penalty derivative (see the module docstring).
    """

    num_steps: int = 500
    lr_init: float = 1e-4
    lr_reduction: float = 0.1
    mu_init: float = 1.0
    rho_init: float = 0.01
    check_steps: int = 10
    tau: float = 0.95
    gamma: float = 2.0
    alpha: float = 0.8
    alpha_rms: float | None = None
    scale_min: float = 0.1
    scale_max: float = 1.0
    scale_init: float = 1.0
    scale_gamma: float = 0.02
    logit_tolerance: float = 1e-4
    constraint_masking: bool = True
    mask_decay: bool = True
    threshold: float = 0.99
    epsilon: float | None = None
    reference_quirks: bool = True

    def __post_init__(self):
        require_int(self.num_steps, "num_steps")
        require_int(self.check_steps, "check_steps")
        check_positive(self.lr_init, "lr_init")
        if self.epsilon is not None:
            check_positive(self.epsilon, "epsilon")


class _AlmaConstants(NamedTuple):
    """Per-call constants of the loop (built once by `alma_prox_attack`)."""

    images: jnp.ndarray
    labels: jnp.ndarray
    mask: jnp.ndarray
    counts: jnp.ndarray
    fixed_count: jnp.ndarray
    k_max: int
    rms_corrections: jnp.ndarray
    tangent_factor: object
    lower: jnp.ndarray
    upper: jnp.ndarray


def _alma_forward(logits_fn, params, c: _AlmaConstants, config: AlmaConfig, delta, state: _AlmaState, i):
    """adv-lib's surrogate ``Σ A·P'(g)·g`` of step ``i`` (its gradient is adv-lib's backward) and the new multipliers."""
    logits = logits_fn(params, c.images + delta)
    constraint_raw = losses.difference_of_logits_ratio(logits, c.labels, config.logit_tolerance)
    pred_adv = lax.stop_gradient(jnp.argmax(logits, axis=-1) != c.labels)
    fraction = success_fraction(pred_adv, c.mask)
    is_adv = fraction >= config.threshold
    scale = jnp.clip(state.scale / jnp.where(is_adv, jnp.float32(1 + config.scale_gamma),
                                             jnp.float32(1 - config.scale_gamma)), config.scale_min, config.scale_max)
    constraints = batch_view(scale, 3) * constraint_raw
    g = lax.stop_gradient(constraints)
    if config.constraint_masking:
        k = c.counts[i] if config.mask_decay else c.fixed_count
        active = kth_largest_mask(g, c.mask, k, c.k_max)
    else:
        active = c.mask
    seen = state.pixel_adv_seen | pred_adv
    check = (i > 0) & ((i + 1) % config.check_steps == 0)
    improved = jnp.where(active, g, 0.0) <= jnp.float32(config.tau) * state.prev_constraints
    rho = jnp.where(check & ~(seen | improved), jnp.float32(config.gamma) * state.rho, state.rho)
    prev = jnp.where((i == 0) | check, g, state.prev_constraints)
    seen = jnp.where(check, False, seen)
    derivative_old = penalty_derivative(g, rho, state.mu, reference_quirks=config.reference_quirks)
    mu_target = jnp.where(active, derivative_old, 0.0)
    mu_blend = jnp.clip(state.mu + jnp.float32(1 - config.alpha) * (mu_target - state.mu), 1e-12, 1.0)
    mu = jnp.where(i > 0, mu_blend, state.mu)
    coefficient = jnp.where(active, penalty_derivative(g, rho, mu, reference_quirks=config.reference_quirks), 0.0)
    surrogate = jnp.sum(coefficient * constraints)  # gradient = Σ A·P'(g)·∂g/∂δ, adv-lib's backward
    aux = dict(fraction=fraction, is_adv=is_adv, scale=scale, rho=rho, mu=mu, prev=prev, seen=seen)
    return surrogate, aux


def _alma_step(logits_fn, params, c: _AlmaConstants, config: AlmaConfig, i, state: _AlmaState) -> _AlmaState:
    """One ALMA prox iteration: track the best iterate, then an RMSProp step and the L∞ box prox."""
    num_steps, lr_init, alpha_rms = config.num_steps, config.lr_init, _alpha_rms(config)
    dist = linf_norm(state.delta)
    forward = functools.partial(_alma_forward, logits_fn, params, c, config)
    (_, aux), grad = jax.value_and_grad(forward, has_aux=True)(state.delta, state, i)
    fraction, is_adv = aux["fraction"], aux["is_adv"]
    # step_found: first success before N // 2 (update before found, as adv-lib)
    step_found = jnp.where((i < num_steps // 2) & ~state.found & is_adv, i.astype(jnp.float32), state.step_found)
    output, best_dist, best_fraction, found, _ = track_best(
        state.output, state.best_dist, state.best_fraction, state.found, c.images + state.delta, dist, fraction,
        config.threshold)
    if c.tangent_factor is not None:
        tangent = c.tangent_factor * jnp.maximum(num_steps - step_found, 1.0)
        decay = tangent / (jnp.maximum(i - step_found, 0.0) + tangent)
        step = jnp.float32(lr_init) * decay
    else:
        step = jnp.full(c.images.shape[0], lr_init, jnp.float32)
    square_avg = state.square_avg * jnp.float32(alpha_rms) + jnp.float32(1 - alpha_rms) * (grad * grad)
    metric = jnp.maximum(jnp.sqrt(square_avg / c.rms_corrections[i]), 1e-8)
    delta = state.delta - grad * (batch_view(step, 4) / metric)
    delta = prox_linf_box(delta, c.lower, c.upper, metric, step)
    return _AlmaState(delta=delta, square_avg=square_avg, mu=aux["mu"], rho=aux["rho"], scale=aux["scale"],
                      pixel_adv_seen=aux["seen"], prev_constraints=aux["prev"], best_dist=best_dist,
                      best_fraction=best_fraction, found=found, step_found=step_found, output=output)


def _alpha_rms(config: AlmaConfig) -> float:
    return config.alpha if config.alpha_rms is None else config.alpha_rms


@functools.partial(jax.jit, static_argnames=("logits_fn", "config"))
def alma_prox_attack(logits_fn: LogitsFn, params, images, labels, mask, config: AlmaConfig) -> AttackResult:
    """ALMA prox minimum-L∞-norm attack with a static `AlmaConfig` (see `alma_prox`)."""
    check_attack_inputs(images, labels, mask)
    num_steps, threshold = config.num_steps, config.threshold
    images = images.astype(jnp.float32)
    batch = images.shape[0]
    mask_count = count_pixels(mask)
    lr_reduction = config.lr_reduction
    constants = _AlmaConstants(
        images=images, labels=labels, mask=mask, counts=decay_counts(mask_count, num_steps, 1 - threshold),
        fixed_count=jnp.floor(jnp.float32(1 - threshold) * mask_count.astype(jnp.float32)).astype(jnp.int32),
        k_max=max(1, int(math.floor((1 - threshold) * mask.shape[1] * mask.shape[2])) + 1),
        rms_corrections=table([1 - _alpha_rms(config) ** (i + 1) for i in range(num_steps)]),
        tangent_factor=jnp.float32(lr_reduction / (1 - lr_reduction)) if lr_reduction != 1 else None,
        lower=-images, upper=1.0 - images)
    pixels = mask.shape
    initial = _AlmaState(
        delta=jnp.zeros_like(images), square_avg=jnp.zeros_like(images),
        mu=jnp.full(pixels, config.mu_init, jnp.float32), rho=jnp.full(pixels, config.rho_init, jnp.float32),
        scale=jnp.full(batch, config.scale_init, jnp.float32), pixel_adv_seen=jnp.zeros(pixels, bool),
        prev_constraints=jnp.zeros(pixels, jnp.float32), best_dist=jnp.full(batch, jnp.inf, jnp.float32),
        best_fraction=jnp.zeros(batch, jnp.float32), found=jnp.zeros(batch, bool),
        step_found=jnp.full(batch, num_steps // 2, jnp.float32), output=images)
    final = lax.fori_loop(0, num_steps, functools.partial(_alma_step, logits_fn, params, constants, config), initial)
    output = final.output if config.epsilon is None else clip_to_ball(final.output, images, config.epsilon)
    count = jnp.full(batch, num_steps, jnp.int32)
    info = {"success": final.found, "best_linf": jnp.where(final.found, final.best_dist, jnp.inf),
            "best_fraction": final.best_fraction}
    return AttackResult(images=output, forwards=count, backwards=count, info=info)


def alma_prox(logits_fn: LogitsFn, params, images, labels, mask, config: AlmaConfig | None = None,
              **settings) -> AttackResult:
    """ALMA prox minimum-L∞-norm attack (docs/protocols/perturbation.md; defaults: `AlmaConfig`).

    Args:
      logits_fn: ``(params, f32[B,H,W,3]) -> f32[B,H,W,C]`` (static), C >= 3.
      params: model parameters.
      images: f32[B, H, W, 3] clean images in [0, 1].
      labels: int[B, H, W] labels in [0, C).
      mask: bool[B, H, W] attacked pixels (void excluded).
      config: the `AlmaConfig` (default: the defaults).
      **settings: `AlmaConfig` fields overriding ``config`` (e.g. ``num_steps=100``).

    Returns:
      AttackResult (forwards = backwards = N); info: ``success`` bool[B],
      ``best_linf`` f32[B] (‖δ‖∞ of the returned iterate before clipping; inf
      if none succeeded), ``best_fraction`` f32[B] (its misclassified fraction).

    Raises:
      ValueError: a bad setting or input (naming it).
    """
    config = dataclasses.replace(AlmaConfig() if config is None else config, **settings)
    return alma_prox_attack(logits_fn, params, images, labels, mask, config)

