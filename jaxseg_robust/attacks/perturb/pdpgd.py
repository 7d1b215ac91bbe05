"""PDPGD with the L∞ proximal operator, as adv-lib 0.2.8 ``attacks.segmentation.pdpgd(norm=inf)`` (§4.3).

Section numbers (§) refer to docs/protocols/perturbation.md.

Per step i (0-based) of N: forward at x + r; track the best iterate (as ALMA
prox); margins ``q = z_y - max_{k≠y} z_k``; EMA of the dual weights
``λ̄ <- 0.9·λ̄ + 0.1·σ⁺(λ)`` (σ⁺ = softmax with an extra zero logit, per image);
Adam step on ``Σ_p λ̄_p·softplus(q_p)`` (lr ``0.01·0.01^{i/N}``), box projection;
≤ 5 proximal-Adam sub-iterations for ``((1-Σλ̄)/Σλ̄)·‖·‖∞`` in the Adam metric
(prox via Moreau: ``u - ν·Proj_{ℓ1-ball}(u/ν)``, sort-based projection over
the whole image); dual ascent ``λ <- clip(λ + θ_i·sign(q), ln 1e-12, -ln 1e-12)``.
Constraint masking is off by default (C-R); the switch reproduces adv-lib's.

Everything float32 (the reference keeps λ and λ̄ in float64; the log-weights
are bounded by ±27.6, §10.3). The sub-iteration ``break`` of adv-lib is a
per-image freeze (frozen images stay frozen, so the result is identical). An
image with no attacked pixel (Σλ̄ = 0) keeps its proximal input instead of the
reference's NaN. With ``epsilon`` set (the battery), the output is clipped
into x ± ε at the end (§1.1).
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from jaxseg_robust.attacks.perturb import losses
from jaxseg_robust.attacks.perturb.alma_prox import decay_counts, kth_largest_mask, track_best
from jaxseg_robust.attacks.perturb.common import (
    AttackResult,
    LogitsFn,
    batch_view,
    check_attack_inputs,
    check_positive,
    check_steps,
    clip_to_ball,
    count_pixels,
    linf_norm,
    table,
)
from jaxseg_robust.attacks.perturb.dag import success_fraction


def softmax_plus_one(log_weights) -> jnp.ndarray:
    """σ⁺: per-image softmax over the flattened log-weights plus one extra zero logit (dropped).

    Args:
      log_weights: f32[B, ...]; -inf entries get weight 0.

    Returns:
      f32[B, ...] with per-image sum < 1.
    """
    flat = log_weights.reshape(log_weights.shape[0], -1)
    padded = jnp.concatenate([jnp.zeros((flat.shape[0], 1), flat.dtype), flat], axis=1)
    return jax.nn.softmax(padded, axis=1)[:, 1:].reshape(log_weights.shape)


L1_METHODS = ("threshold", "sort")


def _l1_threshold_sort(magnitude) -> jnp.ndarray:
    """θ of the ℓ1-ball projection by sorting (Duchi et al. 2008; adv-lib's method): f32[B, 1]."""
    sorted_desc = -jnp.sort(-magnitude, axis=1)
    positions = jnp.arange(magnitude.shape[1])
    thresholds = (jnp.cumsum(sorted_desc, axis=1) - 1.0) / (positions + 1).astype(magnitude.dtype)
    last = jnp.max(jnp.where(thresholds < sorted_desc, positions, 0), axis=1)
    return jnp.take_along_axis(thresholds, last[:, None], axis=1)


def _l1_threshold_search(magnitude, bisection_steps: int = 30, refinement_steps: int = 4) -> jnp.ndarray:
    """θ of the ℓ1-ball projection without sorting: f32[B, 1].

    Bisection on ``f(θ) = Σ max(|u| - θ, 0) - 1`` (decreasing) keeps a lower
    bound θ_lo <= θ*, then Michelot's fixed point ``θ <- (Σ_{|u|>θ} |u| - 1) /
    #{|u| > θ}`` climbs from below to the exact θ* (it stops changing once the
    active set is the true one). This is the sort method's θ up to the
    summation order, in O(D) passes instead of an O(D log D) sort (XLA:CPU's
    sort is slow).
    """
    def excess(theta):
        return jnp.sum(jnp.maximum(magnitude - theta, 0.0), axis=1, keepdims=True) - 1.0

    def bisect(_, bracket):
        low, high = bracket
        middle = 0.5 * (low + high)
        above = excess(middle) > 0
        return jnp.where(above, middle, low), jnp.where(above, high, middle)

    low = jnp.zeros((magnitude.shape[0], 1), magnitude.dtype)
    high = jnp.max(magnitude, axis=1, keepdims=True)
    low, _ = lax.fori_loop(0, bisection_steps, bisect, (low, high))

    def refine(_, theta):
        active = magnitude > theta
        count = jnp.sum(active, axis=1, keepdims=True).astype(magnitude.dtype)
        total = jnp.sum(jnp.where(active, magnitude, 0.0), axis=1, keepdims=True)
        return jnp.where(count > 0, (total - 1.0) / jnp.maximum(count, 1.0), theta)

    return lax.fori_loop(0, refinement_steps, refine, low)


def project_l1_ball(values, method: str = "threshold") -> jnp.ndarray:
    """Euclidean projection of each image's flattened values onto the unit ℓ1 ball.

    As adv-lib's ``l1_ball_euclidean_projection(ε=1)``: images with ‖u‖₁ <= 1
    are returned unchanged; otherwise ``sign(u)·max(|u| - θ, 0)``.

    Args:
      values: f32[B, ...].
      method: ``"threshold"`` (bisection + exact refinement, default) or
        ``"sort"`` (adv-lib's sort-based θ).

    Returns:
      f32[B, ...].
    """
    if method not in L1_METHODS:
        raise ValueError(f"method must be one of {L1_METHODS}, got {method!r}")
    flat = values.reshape(values.shape[0], -1)
    magnitude = jnp.abs(flat)
    theta = _l1_threshold_sort(magnitude) if method == "sort" else _l1_threshold_search(magnitude)
    projected = jnp.copysign(jnp.maximum(magnitude - theta, 0.0), flat)
    outside = jnp.sum(magnitude, axis=1) > 1.0
    return jnp.where(outside[:, None], projected, flat).reshape(values.shape)


def prox_linf(values, weight, method: str = "threshold") -> jnp.ndarray:
    """Proximal operator of ``ν‖·‖∞`` per image: ``u - ν·Proj_{ℓ1-ball}(u/ν)`` (Moreau decomposition).

    Args:
      values: f32[B, ...] u.
      weight: f32[B] ν; images with ν <= 0 or non-finite keep ``u``.
      method: ℓ1 projection method (:func:`project_l1_ball`).

    Returns:
      f32[B, ...].
    """
    usable = jnp.isfinite(weight) & (weight > 0)
    safe = batch_view(jnp.where(usable, weight, 1.0), values.ndim)
    result = values - project_l1_ball(values / safe, method) * safe
    return jnp.where(batch_view(usable, values.ndim), result, values)


class _PdpgdState(NamedTuple):
    perturbation: jnp.ndarray  # r, f32[B, H, W, 3]
    exp_avg: jnp.ndarray
    exp_avg_sq: jnp.ndarray
    log_weights: jnp.ndarray   # λ, f32[B, H, W] (-inf off the mask)
    weights_ema: jnp.ndarray   # λ̄, f32[B, H, W]
    best_dist: jnp.ndarray
    best_fraction: jnp.ndarray
    found: jnp.ndarray
    output: jnp.ndarray
    prox_iterations: jnp.ndarray  # int32[B] proximal sub-iterations run (diagnostic)


ADAM_BETAS = (0.9, 0.999)  # the primal Adam's (β1, β2), adv-lib's


def _schedules(num_steps: int, primal_lr: float, primal_lr_decrease: float, dual_lr: float,
               dual_lr_decrease: float) -> tuple[jnp.ndarray, ...]:
    """Per-step tables f32[N]: primal step sizes, Adam's scaled steps ``-lr_i / (1 - β1^(i+1))``,
    ``sqrt(1 - β2^(i+1))`` and the dual step sizes (linear from ``dual_lr`` down to
    ``dual_lr · dual_lr_decrease``)."""
    beta1, beta2 = ADAM_BETAS
    step_sizes = table([primal_lr * primal_lr_decrease ** (i / num_steps) for i in range(num_steps)])
    adam_scales = table([-(primal_lr * primal_lr_decrease ** (i / num_steps)) / (1 - beta1 ** (i + 1))
                         for i in range(num_steps)])
    correction2_sqrt = table([(1 - beta2 ** (i + 1)) ** 0.5 for i in range(num_steps)])
    dual_steps = table([dual_lr * ((num_steps - 1 - i) / max(num_steps - 1, 1) * (1 - dual_lr_decrease)
                                   + dual_lr_decrease) for i in range(num_steps)])
    return step_sizes, adam_scales, correction2_sqrt, dual_steps


def _proximal_distance_step(images, r, denominator, step_size, weight_sum, prox_iterations, *,
                            proximal_steps: int, prox_threshold: float, l1_method: str):
    """Proximal Adam (arXiv 1910.10094) for the distance term of one PDPGD step.

    Args:
      images: f32[B, H, W, 3] clean images; r: f32[B, H, W, 3] the perturbation after the Adam step.
      denominator: f32[B, H, W, 3] Adam's ``sqrt(v̂) + 1e-8``; step_size: f32[] the step's primal rate.
      weight_sum: f32[B] the constraint weights' sum; prox_iterations: int32[B] sub-iterations so far.

    Returns:
      (z f32[B, H, W, 3] the new perturbation, int32[B] sub-iterations run so far).
    """
    batch = images.shape[0]
    psi = jnp.max(denominator.reshape(batch, -1), axis=1)
    effective_lr = step_size / psi
    prox_weight = ((1.0 - weight_sum) / weight_sum) * effective_lr
    scaled_metric = denominator / batch_view(psi, 4)

    def sub_iteration(_, carry):
        z, error, iterations = carry
        running = error > prox_threshold
        z_new = prox_linf(z - scaled_metric * (z - r), prox_weight, l1_method)
        z_new = jnp.clip(images + z_new, 0.0, 1.0) - images
        z_next = jnp.where(batch_view(running, 4), z_new, z)
        error = (jnp.sqrt(jnp.sum(jnp.square(z_next - z).reshape(batch, -1), axis=1))
                 / jnp.sqrt(jnp.sum(jnp.square(z_next).reshape(batch, -1), axis=1)))
        return z_next, error, iterations + running.astype(jnp.int32)

    z, _, iterations = lax.fori_loop(0, proximal_steps, sub_iteration,
                                     (r, jnp.ones(batch, jnp.float32), prox_iterations))
    return z, iterations


def _initial_state(images, mask, mask_count, dual_ratio_init: float) -> _PdpgdState:
    """Zero perturbation and Adam moments, λ = -log(|mask| · ratio) on the mask, nothing found yet."""
    batch = images.shape[0]
    initial_log = -jnp.log(mask_count.astype(jnp.float32) * jnp.float32(dual_ratio_init))
    log_weights = jnp.where(mask, batch_view(initial_log, 3), -jnp.inf)
    return _PdpgdState(
        perturbation=jnp.zeros_like(images), exp_avg=jnp.zeros_like(images), exp_avg_sq=jnp.zeros_like(images),
        log_weights=log_weights, weights_ema=softmax_plus_one(log_weights),
        best_dist=jnp.full(batch, jnp.inf, jnp.float32), best_fraction=jnp.zeros(batch, jnp.float32),
        found=jnp.zeros(batch, bool), output=images, prox_iterations=jnp.zeros(batch, jnp.int32))


@functools.partial(jax.jit, static_argnames=(
    "logits_fn", "num_steps", "primal_lr", "primal_lr_decrease", "dual_ratio_init", "dual_lr", "dual_lr_decrease",
    "dual_ema", "dual_min_ratio", "proximal_steps", "prox_threshold", "constraint_masking", "mask_decay",
    "threshold", "epsilon", "l1_method"))
def pdpgd(logits_fn: LogitsFn, params, images, labels, mask, *, num_steps: int = 500, primal_lr: float = 0.01,
          primal_lr_decrease: float = 0.01, dual_ratio_init: float = 1.0, dual_lr: float = 0.1,
          dual_lr_decrease: float = 0.1, dual_ema: float = 0.9, dual_min_ratio: float = 1e-12,
          proximal_steps: int = 5, prox_threshold: float = 1e-2, constraint_masking: bool = False,
          mask_decay: bool = False, threshold: float = 0.99, epsilon: float | None = None,
          l1_method: str = "threshold") -> AttackResult:
    """PDPGD minimum-L∞-norm attack (defaults: C-R's call, ``primal_lr = 0.01``; adv-lib's default is 0.1).

    Args:
      logits_fn: ``(params, f32[B,H,W,3]) -> f32[B,H,W,C]`` (static).
      params: model parameters.
      images: f32[B, H, W, 3] clean images in [0, 1].
      labels: int[B, H, W] labels in [0, C).
      mask: bool[B, H, W] attacked pixels (void excluded).
      num_steps .. mask_decay: adv-lib's hyperparameters (``prox_threshold`` is
        adv-lib's ``ε_threshold``); random init is not supported (C-R uses 0).
      threshold: fraction of masked pixels that must be misclassified.
      epsilon: if not None, clip the result into x ± ε (battery behaviour).
      l1_method: ℓ1-ball projection inside the prox: ``"threshold"`` (default,
        sort-free, same θ up to rounding) or ``"sort"`` (adv-lib's algorithm).

    Returns:
      AttackResult (forwards = backwards = N); info: ``success`` bool[B],
      ``best_linf`` f32[B] (‖δ‖∞ of the returned iterate before clipping; inf
      if none succeeded), ``best_fraction`` f32[B], ``prox_iterations`` int32[B]
      (total proximal sub-iterations, for cost accounting).
    """
    check_attack_inputs(images, labels, mask)
    num_steps = check_steps(num_steps, "num_steps")
    proximal_steps = check_steps(proximal_steps, "proximal_steps")
    check_positive(primal_lr, "primal_lr")
    images = images.astype(jnp.float32)
    batch = images.shape[0]
    mask_count = count_pixels(mask)
    log_min = math.log(check_positive(dual_min_ratio, "dual_min_ratio"))
    beta1, beta2 = ADAM_BETAS
    step_sizes, adam_scales, correction2_sqrt, dual_steps = _schedules(num_steps, primal_lr, primal_lr_decrease,
                                                                       dual_lr, dual_lr_decrease)
    k_max = max(1, int((1 - threshold) * mask.shape[1] * mask.shape[2]) + 1)
    counts = decay_counts(mask_count, num_steps, 1 - threshold)
    fixed_count = jnp.floor(jnp.float32(1 - threshold) * mask_count.astype(jnp.float32)).astype(jnp.int32)

    def forward(perturbation, state: _PdpgdState, i):
        logits = logits_fn(params, images + perturbation)
        margin = losses.logit_margin(logits, labels)
        pred_adv = lax.stop_gradient(jnp.argmax(logits, axis=-1) != labels)
        fraction = success_fraction(pred_adv, mask)
        q = lax.stop_gradient(margin)
        if constraint_masking:
            k = counts[i] if mask_decay else fixed_count
            active = kth_largest_mask(q, mask, k, k_max)
        else:
            active = mask
        target = softmax_plus_one(jnp.where(active, state.log_weights, -jnp.inf))
        weights_ema = jnp.where(i > 0, state.weights_ema + jnp.float32(1 - dual_ema) * (target - state.weights_ema),
                                state.weights_ema)
        weights = jnp.where(active, weights_ema, 0.0)
        loss = jnp.sum(jax.nn.softplus(margin) * weights)
        dual_grad = jnp.where(active, jnp.sign(q), 0.0)
        return loss, dict(fraction=fraction, weights_ema=weights_ema, weight_sum=jnp.sum(
            weights.reshape(batch, -1), axis=1), dual_grad=dual_grad)

    def body(i, state: _PdpgdState) -> _PdpgdState:
        dist = linf_norm((images + state.perturbation) - images)
        (_, aux), grad = jax.value_and_grad(forward, has_aux=True)(state.perturbation, state, i)
        output, best_dist, best_fraction, found, _ = track_best(
            state.output, state.best_dist, state.best_fraction, state.found, images + state.perturbation, dist,
            aux["fraction"], threshold)

        exp_avg = state.exp_avg + jnp.float32(1 - beta1) * (grad - state.exp_avg)
        exp_avg_sq = state.exp_avg_sq * jnp.float32(beta2) + jnp.float32(1 - beta2) * (grad * grad)
        denominator = jnp.sqrt(exp_avg_sq) / correction2_sqrt[i] + 1e-8
        r = state.perturbation + adam_scales[i] * (exp_avg / denominator)
        r = jnp.clip(images + r, 0.0, 1.0) - images

        z, iterations = _proximal_distance_step(images, r, denominator, step_sizes[i], aux["weight_sum"],
                                                state.prox_iterations, proximal_steps=proximal_steps,
                                                prox_threshold=prox_threshold, l1_method=l1_method)

        log_weights = jnp.clip(state.log_weights + dual_steps[i] * aux["dual_grad"], log_min, -log_min)
        log_weights = jnp.where(mask, log_weights, -jnp.inf)
        return _PdpgdState(perturbation=z, exp_avg=exp_avg, exp_avg_sq=exp_avg_sq, log_weights=log_weights,
                           weights_ema=aux["weights_ema"], best_dist=best_dist, best_fraction=best_fraction,
                           found=found, output=output, prox_iterations=iterations)

    final = lax.fori_loop(0, num_steps, body, _initial_state(images, mask, mask_count, dual_ratio_init))
    output = final.output if epsilon is None else clip_to_ball(final.output, images, check_positive(epsilon, "epsilon"))
    count = jnp.full(batch, num_steps, jnp.int32)
    info = {"success": final.found, "best_linf": jnp.where(final.found, final.best_dist, jnp.inf),
            "best_fraction": final.best_fraction, "prox_iterations": final.prox_iterations}
    return AttackResult(images=output, forwards=count, backwards=count, info=info)
