"""PAdam-CE and PAdam-Cos: projected AMSGrad ascent (§2; C-R ``rse/attacks.py``).

Section numbers (§) refer to docs/protocols/perturbation.md.

    δ <- clip(x + U(-ε, ε), 0, 1) - x
    repeat T times:  g = ∇_δ J(x + δ);  δ <- δ + AMSGrad_torch(g);  δ <- clip(δ, -ε, ε);  δ <- clip(x + δ, 0, 1) - x
    return x + δ                                      (last iterate; no best tracking, no early stop)

Objective per image ``J_b = (1/N) Σ_p m_p ℓ_p`` with ``ℓ = CE`` (PAdam-CE) or
``ℓ = 1 - z_y/max(‖z‖₂, 1e-8)`` (PAdam-Cos); the gradient is that of Σ_b J_b,
so images are independent (C-R takes the mean over the whole batch, which only
rescales the gradients by 1/B and matters only through Adam's eps; §8.2 #13).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from jaxseg_robust.attacks.perturb import losses
from jaxseg_robust.attacks.perturb.amsgrad import torch_amsgrad
from jaxseg_robust.attacks.perturb.common import (
    DEFAULT_EPSILON,
    AttackResult,
    LogitsFn,
    check_attack_inputs,
    check_positive,
    check_steps,
    uniform_start,
)

PADAM_LOSSES = ("ce", "cos")


def padam_pixel_loss(logits, labels, loss: str) -> jnp.ndarray:
    """Per-pixel PAdam loss f32[B, H, W] (``loss`` = ``"ce"`` or ``"cos"``)."""
    if loss == "ce":
        return losses.cross_entropy(logits, labels)
    if loss == "cos":
        return losses.cosine_loss(logits, labels)
    raise ValueError(f"loss must be one of {PADAM_LOSSES}, got {loss!r}")


def _named_pixel_loss(name: str, logits, labels) -> jnp.ndarray:
    return padam_pixel_loss(logits, labels, name)


@functools.partial(jax.jit, static_argnames=("logits_fn", "loss", "epsilon", "num_steps", "step_size", "b1", "b2",
                                             "adam_eps"))
def padam(logits_fn: LogitsFn, params, images, labels, mask, keys, *, loss: str | tuple[str, ...] = "cos",
          epsilon: float = DEFAULT_EPSILON, num_steps: int = 200, step_size: float = 2.0 / 255.0,
          b1: float = 0.9, b2: float = 0.999, adam_eps: float = 1e-8, loss_index=None) -> AttackResult:
    """PAdam attack (maximises the masked mean loss inside the L∞ ball ∩ [0, 1]).

    Args:
      logits_fn: ``(params, f32[B,H,W,3]) -> f32[B,H,W,C]`` (static; hashed by identity).
      params: model parameter pytree.
      images: f32[B, H, W, 3] clean images in [0, 1].
      labels: int[B, H, W] attack labels in [0, C).
      mask: bool[B, H, W] attack mask m.
      keys: typed PRNG key array [B] (random start).
      loss: ``"ce"`` (PAdam-CE) or ``"cos"`` (PAdam-Cos).
      epsilon: L∞ radius ε (image units), default 8/255.
      num_steps: T = 200 gradient steps.
      step_size: Adam learning rate η = 2/255.
      b1, b2, adam_eps: AMSGrad constants (PyTorch defaults).
      loss_index: with ``loss`` a tuple of names, the traced int32 index of the
        one to use (one compiled program for PAdam-CE and PAdam-Cos).

    Returns:
      AttackResult: images = last iterate; forwards = backwards = T;
      info["objective"] f32[B] = J_b at the last evaluated iterate (the point
      before the final update).
    """
    check_attack_inputs(images, labels, mask)
    for name in (loss,) if isinstance(loss, str) else loss:
        if name not in PADAM_LOSSES:
            raise ValueError(f"loss must be one of {PADAM_LOSSES} (or a tuple of them), got {name!r}")
    if not isinstance(loss, str) and loss_index is None:
        raise ValueError("a tuple of losses needs a loss_index")
    epsilon = check_positive(epsilon, "epsilon")
    num_steps = check_steps(num_steps, "num_steps")
    check_positive(step_size, "step_size")
    images = images.astype(jnp.float32)
    optimizer = torch_amsgrad(step_size, b1, b2, adam_eps, maximize=True)

    def objective(delta):
        logits = logits_fn(params, images + delta)
        if isinstance(loss, str):
            per_pixel = padam_pixel_loss(logits, labels, loss)
        else:
            branches = [functools.partial(_named_pixel_loss, name) for name in loss]
            per_pixel = lax.switch(loss_index, branches, logits, labels)
        per_image = losses.image_mean(per_pixel, mask)
        return jnp.sum(per_image), per_image

    def step(_, carry):
        delta, opt_state, _ = carry
        (_, per_image), grad = jax.value_and_grad(objective, has_aux=True)(delta)
        updates, opt_state = optimizer.update(grad, opt_state)
        delta = jnp.clip(delta + updates, -epsilon, epsilon)
        delta = jnp.clip(images + delta, 0.0, 1.0) - images
        return delta, opt_state, per_image

    delta0 = uniform_start(keys, images, epsilon) - images
    carry = (delta0, optimizer.init(delta0), jnp.zeros(images.shape[0], jnp.float32))
    delta, _, objective_last = lax.fori_loop(0, num_steps, step, carry)
    count = jnp.full(images.shape[0], num_steps, jnp.int32)
    adversarial = jnp.clip(images + delta, 0.0, 1.0)
    return AttackResult(images=adversarial, forwards=count, backwards=count, info={"objective": objective_last})
