"""The TETRIS interaction-location loss: where an optimised click may go (docs/protocols/tetris.md §3.2).

``Lloc = mean over the h' x w' resized grid of disk(q) * D``: the disk (radius
5, centre ``clamp(q + 0.5, [0, w'-1] x [0, h'-1])``, torch clamp gradient) is
rendered with `jaxseg_robust.ops.render.render_soft_disk` and ``D`` is the
Euclidean distance (original-image pixels) to the nearest pixel of the click's
error region (`location_error_region`, FN for a positive click, FP for a
negative one, of the previous map ``> 0.5`` against ``G+``), resized to the
grid with bilinear ``align_corners=True``. Pure, jit-, vmap- and grad-safe.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
from jax import lax

from jaxseg_robust.ops.distance import distance_transform_edt
from jaxseg_robust.ops.render import COVERAGE_AREA, DEFAULT_CLICK_RADIUS, render_soft_disk

LOCATION_THRESHOLD = 0.5  # the location-loss DTs always binarise the previous map at 0.5


def location_error_region(target, previous_probability, is_positive, region,
                          threshold: float = LOCATION_THRESHOLD) -> jnp.ndarray:
    """The error region a click of the given sign should lie in (§3.2 item 1).

    ``prev = P_prev > threshold``; positive click: ``FN = G+ & ~prev``,
    negative click: ``FP = ~G+ & prev`` (ignore pixels count as background).

    Args:
      target: bool[Hf, Wf] G+ within the image.
      previous_probability: f32[Hf, Wf] the previous accepted probability map.
      is_positive: bool[] click sign.
      region: bool[Hf, Wf] pixels of the image.
      threshold: binarisation of the previous map (0.5).

    Returns:
      bool[Hf, Wf].
    """
    prev = (previous_probability > threshold) & region
    return jnp.where(is_positive, target & ~prev, ~target & prev)


def location_distance_map(errors, original_hw) -> jnp.ndarray:
    """f32[Hf, Wf] Euclidean distance (original pixels) to the nearest pixel of ``errors``.

    The EDT of ``~errors`` without border padding (0 on the region). With an
    empty region it is the image diagonal ``sqrt(H^2 + W^2)`` everywhere
    (OpenCV returns ~1.8e19 there; §8 pitfall 6).

    Args:
      errors: bool[Hf, Wf] (`location_error_region`).
      original_hw: i32[2] (H, W) of the image (may be traced).
    """
    distance = distance_transform_edt(~errors)
    hw = jnp.asarray(original_hw, jnp.float32)
    diagonal = jnp.sqrt(hw[0] * hw[0] + hw[1] * hw[1])
    return jnp.where(jnp.any(errors), distance, diagonal)


def _clamp_like_torch(value, low, high):
    """torch.clamp: gradient 1 inside the closed range, 0 outside."""
    return jnp.where(value < low, low, jnp.where(value > high, high, value))


def _bilinear_align_corners(image, src_y, src_x, height, width):
    """Bilinear samples of ``image`` at rows ``src_y`` [m] x cols ``src_x`` [n] (torch align_corners=True taps)."""
    y0 = jnp.clip(jnp.floor(src_y), 0, height - 1)
    x0 = jnp.clip(jnp.floor(src_x), 0, width - 1)
    wy = (src_y - y0)[:, None]
    wx = (src_x - x0)[None, :]
    y1 = jnp.minimum(y0 + 1, height - 1)
    x1 = jnp.minimum(x0 + 1, width - 1)
    y0, y1, x0, x1 = (v.astype(jnp.int32) for v in (y0, y1, x0, x1))
    top = image[y0[:, None], x0[None, :]] * (1 - wx) + image[y0[:, None], x1[None, :]] * wx
    bottom = image[y1[:, None], x0[None, :]] * (1 - wx) + image[y1[:, None], x1[None, :]] * wx
    return top * (1 - wy) + bottom * wy


def location_loss(point, distance, original_hw, resized_hw, radius: float = DEFAULT_CLICK_RADIUS, *,
                  coverage: str = COVERAGE_AREA, samples_per_axis: int = 1) -> jnp.ndarray:
    """TETRIS interaction-location loss of one click (§3.2 item 4a), differentiable in ``point``.

    ``mean over the h' x w' grid of disk(point) * resize_ac(D)``: the disk of
    ``radius`` drawn at ``clamp(point + 0.5, [0, w'-1] x [0, h'-1])`` (torch
    clamp gradient; see `ops.render`), ``resize_ac`` = bilinear
    ``align_corners=True`` from (H, W) to (h', w'). Evaluated on the disk's
    window of the grid only (exact: the disk is zero elsewhere).

    Args:
      point: f32[2] (x, y) in SAM's resized frame.
      distance: f32[Hf, Wf] D (`location_distance_map`), original-image pixels.
      original_hw: i32[2] (H, W); resized_hw: i32[2] (h', w') (may be traced).
      radius: static disk radius (pixels of the resized grid).
      coverage, samples_per_axis: static renderer settings (`render_soft_disk`).

    Returns:
      f32[] loss (original-image pixels).
    """
    point = jnp.asarray(point, jnp.float32)
    original = jnp.asarray(original_hw, jnp.float32)
    resized = jnp.asarray(resized_hw, jnp.float32)
    rows, cols = resized[0], resized[1]
    cx = _clamp_like_torch(point[0] + 0.5, 0.0, cols - 1.0)
    cy = _clamp_like_torch(point[1] + 0.5, 0.0, rows - 1.0)
    half = int(math.ceil(radius)) + 2
    window = 2 * half + 1
    origin_x = lax.stop_gradient(jnp.floor(cx)) - half
    origin_y = lax.stop_gradient(jnp.floor(cy)) - half
    disk = render_soft_disk(jnp.stack([cx - origin_x, cy - origin_y]), (window, window), radius,
                            coverage=coverage, samples_per_axis=samples_per_axis)
    offsets = jnp.arange(window, dtype=jnp.float32)
    pixel_y = origin_y + offsets
    pixel_x = origin_x + offsets
    inside = ((pixel_y >= 0) & (pixel_y < rows))[:, None] & ((pixel_x >= 0) & (pixel_x < cols))[None, :]
    scale_y = jnp.where(rows > 1, (original[0] - 1.0) / jnp.maximum(rows - 1.0, 1.0), 0.0)
    scale_x = jnp.where(cols > 1, (original[1] - 1.0) / jnp.maximum(cols - 1.0, 1.0), 0.0)
    src_y = jnp.clip(pixel_y, 0.0, rows - 1.0) * scale_y
    src_x = jnp.clip(pixel_x, 0.0, cols - 1.0) * scale_x
    sampled = _bilinear_align_corners(distance, src_y, src_x, original[0], original[1])
    return jnp.sum(jnp.where(inside, disk * sampled, 0.0)) / (rows * cols)


__all__ = ["LOCATION_THRESHOLD", "location_error_region", "location_distance_map", "location_loss"]
