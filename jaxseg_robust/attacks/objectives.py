"""Loss terms shared by the prompt attacks (TETRIS clicks, BREPS boxes).

Reference: docs/protocols/tetris.md §3.3 (Dice), §3.2 (interaction-location
loss, in `jaxseg_robust.attacks.clicks`), §4.3-4.4 (realism term, in
`jaxseg_robust.ops.boxes`).
"""

from __future__ import annotations

import jax.numpy as jnp

# segmentation_models_pytorch DiceLoss(mode="binary", from_logits=False): smooth 0, eps 1e-7.
DICE_EPS = 1e-7


def dice_loss(probabilities, target, valid=None, *, eps: float = DICE_EPS) -> jnp.ndarray:
    """Binary Dice loss as segmentation_models_pytorch computes it for one instance.

    ``(1 - 2·Σ P·T / max(Σ P + Σ T, eps)) · [Σ T > 0]``: sums over every pixel
    (of ``valid`` when given), no smoothing, and 0 when the target is empty.

    Args:
      probabilities: f32[H, W] predicted foreground probabilities in [0, 1]
        (the model's sigmoid, not logits).
      target: bool or {0, 1} [H, W] ground-truth foreground (ignore pixels
        already mapped to background or excluded through ``valid``).
      valid: optional bool[H, W]; pixels outside it take no part (padding of
        a bucketed frame). ``None`` = every pixel.
      eps: lower clamp of the denominator.

    Returns:
      f32[] loss in [0, 1]; differentiable w.r.t. ``probabilities``.
    """
    p = jnp.asarray(probabilities, jnp.float32)
    t = jnp.asarray(target, jnp.float32)
    if p.shape != t.shape:
        raise ValueError(f"probabilities {p.shape} and target {t.shape} must have the same shape")
    if valid is not None:
        v = jnp.asarray(valid, jnp.float32)
        if v.shape != p.shape:
            raise ValueError(f"valid {v.shape} must have the shape of probabilities {p.shape}")
        p = p * v
        t = t * v
    intersection = jnp.sum(p * t)
    cardinality = jnp.sum(p) + jnp.sum(t)
    score = 2.0 * intersection / jnp.maximum(cardinality, eps)
    return (1.0 - score) * (jnp.sum(t) > 0).astype(jnp.float32)
