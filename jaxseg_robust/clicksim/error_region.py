"""Error type and error region of one simulated round (RClicks benchmark clicker).

Reference: docs/protocols/rclicks.md §5.2 steps 1-3 (C-R ``isegm/inference/clicker.py``
``Clicker._get_next_click``). The polarity is chosen exactly as the RITM baseline
clicker does; the region handed to the clickability model is then the **whole**
FN or FP mask (every connected component), not only its largest region.

    FN = gt & ~pred & valid,   FP = ~gt & pred & valid
    DT_X = EDT(X zero-padded by one pixel, cropped back) * not_clicked
    positive  <=>  max DT_FN > max DT_FP        (strict: ties and no error -> negative)

The chosen DT map is also the fallback: its first row-major maximum is the
baseline click used when a clicking group's band has no mass.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxseg_robust.ops.distance import distance_transform_edt

__all__ = ["ErrorRegion", "choose_error_region"]


class ErrorRegion(NamedTuple):
    """Outcome of the polarity rule for one round."""

    is_positive: jax.Array  # bool[]: True = FN round (positive click), False = FP round
    region: jax.Array       # bool[H, W]: the whole FN (positive) or FP (negative) mask
    distance: jax.Array     # float32[H, W]: chosen error's padded EDT times not_clicked (fallback map)


def _mask(array, name: str, shape: tuple[int, ...] | None) -> jax.Array:
    array = jnp.asarray(array)
    if array.ndim != 2 or array.size < 1:
        raise ValueError(f"{name} must be a non-empty 2-D array [H, W], got shape {array.shape}; "
                         "use jax.vmap for batches")
    if shape is not None and array.shape != shape:
        raise ValueError(f"{name} shape {array.shape} differs from gt shape {shape}")
    return array.astype(bool)


@jax.jit
def choose_error_region(gt: jax.Array, pred: jax.Array, valid: jax.Array | None = None,
                        not_clicked: jax.Array | None = None) -> ErrorRegion:
    """Polarity, error region and fallback map of the next simulated click (§5.2 steps 1-3).

    Args:
      gt: bool[H, W] GT object mask.
      pred: bool[H, W] current prediction (all False before round 1).
      valid: optional bool[H, W] non-ignore pixels (GrabCut/Berkeley band); None = all.
      not_clicked: optional bool[H, W], False where a click was already placed; None = all True.
    Returns:
      ErrorRegion. Round 1 (empty prediction, non-empty gt) is positive with
      ``region = gt & valid``.
    """
    gt = _mask(gt, "gt", None)
    pred = _mask(pred, "pred", gt.shape)
    valid = jnp.ones_like(gt) if valid is None else _mask(valid, "valid", gt.shape)
    not_clicked = jnp.ones_like(gt) if not_clicked is None else _mask(not_clicked, "not_clicked", gt.shape)
    false_negative = gt & ~pred & valid
    false_positive = ~gt & pred & valid
    # Both maps in one (vmapped) transform: one stack, so one row-pass loop on an accelerator.
    both = jax.vmap(lambda m: distance_transform_edt(m, pad_border=True))(jnp.stack([false_negative, false_positive]))
    fn_distance, fp_distance = jnp.where(not_clicked, both, 0.0)
    is_positive = jnp.max(fn_distance) > jnp.max(fp_distance)
    return ErrorRegion(is_positive,
                       jnp.where(is_positive, false_negative, false_positive),
                       jnp.where(is_positive, fn_distance, fp_distance))
