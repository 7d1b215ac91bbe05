"""DAG (Xie et al.), as adv-lib 0.2.8 ``attacks.segmentation.dag`` with p = ∞ (§4.0-§4.1).

Section numbers (§) refer to docs/protocols/perturbation.md.

    r <- 0;  out <- x
    for i < max_iter while the image is active:
        x̃ = clip(x + r, 0, 1);  d_p = z_y - max_{k≠y} z_k
        success when Σ_p m_p·[d_p < 0] / Σ_p m_p >= 0.99: out <- x̃, deactivate
        otherwise r <- r - γ·G / max(‖G‖∞, 1e-8),  G = ∇_r Σ_p m_p·max(d_p, 0)
                   (through the clip with torch.clamp's gradient: 1 on [0, 1], bounds included)
    return out                 (first successful iterate; the clean image if never successful)

Per image instead of adv-lib's shrinking batch: a fixed loop with an
``active`` mask that stops early once no image of the batch is active (the
reference's ``break``). ``r`` itself is never clipped. With ``epsilon`` set
(the battery, §1.1), the output is then clipped into x ± ε.
"""

from __future__ import annotations

import functools
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
    check_steps,
    clamp_unit,
    clip_to_ball,
    count_pixels,
    linf_norm,
)


class _DagState(NamedTuple):
    step: jnp.ndarray        # int32 scalar
    perturbation: jnp.ndarray  # r, f32[B, H, W, 3]
    output: jnp.ndarray
    active: jnp.ndarray      # bool[B]
    success_step: jnp.ndarray  # int32[B], -1 if never successful
    adv_fraction: jnp.ndarray  # f32[B] at the last evaluated iterate
    forwards: jnp.ndarray
    backwards: jnp.ndarray


def success_fraction(flags, mask) -> jnp.ndarray:
    """``Σ_p m_p·flag_p / Σ_p m_p`` per image, f32[B] (NaN when the mask is empty, as adv-lib)."""
    return count_pixels(flags & mask).astype(jnp.float32) / count_pixels(mask).astype(jnp.float32)


def dag_objective(logits_fn: LogitsFn, params, images, labels, mask, perturbation):
    """DAG's objective ``Σ_p m_p·max(d_p, 0)`` at ``clamp(x + r, 0, 1)`` and the margins d (§4.1).

    Args:
      images, perturbation: f32[B, H, W, 3] (x and r); labels int[B, H, W]; mask bool[B, H, W].

    Returns:
      (scalar f32 summed over the batch, margins f32[B, H, W]). Its gradient
      in ``perturbation`` is adv-lib's: the clip differentiates as
      ``torch.clamp`` (`common.clamp_unit`).
    """
    logits = logits_fn(params, clamp_unit(images + perturbation))
    margin = losses.logit_margin(logits, labels)
    pushed = jax.nn.relu(jnp.where(mask, margin, 0.0))
    return jnp.sum(pushed), margin


def dag(logits_fn: LogitsFn, params, images, labels, mask, *, gamma, max_iterations: int = 200,
        threshold: float = 0.99, epsilon: float | None = None) -> AttackResult:
    """DAG with ℓ∞-normalised gradient steps (see `_dag`; a Python ``gamma`` must be positive)."""
    if isinstance(gamma, (int, float)):
        check_positive(gamma, "gamma")
    return _dag(logits_fn, params, images, labels, mask, gamma=jnp.asarray(gamma, jnp.float32),
                max_iterations=max_iterations, threshold=threshold, epsilon=epsilon)


@functools.partial(jax.jit, static_argnames=("logits_fn", "max_iterations", "threshold", "epsilon"))
def _dag(logits_fn: LogitsFn, params, images, labels, mask, *, gamma: float, max_iterations: int = 200,
        threshold: float = 0.99, epsilon: float | None = None) -> AttackResult:
    """DAG with ℓ∞-normalised gradient steps.

    Args:
      logits_fn: ``(params, f32[B,H,W,3]) -> f32[B,H,W,C]`` (static).
      params: model parameters.
      images: f32[B, H, W, 3] clean images in [0, 1].
      labels: int[B, H, W] labels in [0, C).
      mask: bool[B, H, W] attacked pixels (void excluded).
      gamma: step γ (0.001 and 0.003 in the battery); traced, so both members share one program.
      max_iterations: 200 (C-R).
      threshold: success when this fraction of masked pixels is misclassified.
      epsilon: if not None, clip the result into x ± ε (battery behaviour).

    Returns:
      AttackResult; info: ``success`` bool[B], ``success_step`` int32[B] (0-based
      iteration of the returned iterate, -1 if never), ``adv_fraction`` f32[B]
      (at the last evaluated iterate), ``perturbation_linf`` f32[B] (‖r‖∞ at the end).
    """
    check_attack_inputs(images, labels, mask)
    max_iterations = check_steps(max_iterations, "max_iterations")
    check_positive(threshold, "threshold")
    images = images.astype(jnp.float32)
    batch = images.shape[0]

    objective = functools.partial(dag_objective, logits_fn, params, images, labels, mask)

    def body(state: _DagState) -> _DagState:
        (_, margin), grad = jax.value_and_grad(objective, has_aux=True)(state.perturbation)
        fraction = success_fraction(margin < 0, mask)
        success = fraction >= threshold
        stepping = state.active & ~success
        scale = jnp.maximum(linf_norm(grad), 1e-8)
        stepped = state.perturbation - gamma * (grad / batch_view(scale, 4))
        newly = state.active & success
        candidate = jnp.clip(images + state.perturbation, 0.0, 1.0)
        return _DagState(
            step=state.step + 1,
            perturbation=jnp.where(batch_view(stepping, 4), stepped, state.perturbation),
            output=jnp.where(batch_view(newly, 4), candidate, state.output),
            active=stepping,
            success_step=jnp.where(newly, state.step, state.success_step),
            adv_fraction=jnp.where(state.active, fraction, state.adv_fraction),
            forwards=state.forwards + state.active.astype(jnp.int32),
            backwards=state.backwards + stepping.astype(jnp.int32))

    initial = _DagState(
        step=jnp.zeros([], jnp.int32), perturbation=jnp.zeros_like(images), output=images,
        active=jnp.ones(batch, bool), success_step=jnp.full(batch, -1, jnp.int32),
        adv_fraction=jnp.zeros(batch, jnp.float32), forwards=jnp.zeros(batch, jnp.int32),
        backwards=jnp.zeros(batch, jnp.int32))
    final = lax.while_loop(lambda s: (s.step < max_iterations) & jnp.any(s.active), body, initial)
    output = final.output if epsilon is None else clip_to_ball(final.output, images, check_positive(epsilon, "epsilon"))
    info = {"success": final.success_step >= 0, "success_step": final.success_step,
            "adv_fraction": final.adv_fraction, "perturbation_linf": linf_norm(final.perturbation)}
    return AttackResult(images=output, forwards=final.forwards, backwards=final.backwards, info=info)
