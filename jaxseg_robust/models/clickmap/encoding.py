"""Click maps of the isegm models (RITM, SimpleClick, CFR-ICL): docs/models/click_models.md.

The network reads its clicks as image-sized maps stacked with the previous
prediction: channels ``[prev, positive, negative]`` (isegm ``ISModel.
get_coord_features``: the previous mask first). Two renderings of the click
disks:

* ``"hard"`` — isegm's ``DistMaps(use_disks=True)``: a pixel ``(r, c)`` is 1
  iff some click ``(x, y)`` of that sign has ``(r - y)^2 + (c - x)^2 <= R^2``
  (float32, pixel indices compared with the coordinates directly). A click
  whose coordinates are both negative is isegm's padding marker and is not
  drawn. This is what the authors' models see; it has no gradient.
* ``"soft"`` — the differentiable rendering TETRIS attacks these models with:
  each click's disk of radius R centred on ``(x + 0.5, y + 0.5)`` (clamped
  into the grid) with exact per-pixel area coverage
  (`jaxseg_robust.ops.render.render_soft_click_maps`), per-sign sums clamped
  to [0, 1]. Geometrically the same disk as the hard one; its area coverage
  makes the maps (and the model output) differentiable w.r.t. the click
  coordinates.

Coordinates are (x, y) = (column, row) in pixels of the grid the network
sees; labels 1 positive, 0 negative, -1 padding.
"""

from __future__ import annotations

import jax.numpy as jnp

from jaxseg_robust.ops.render import (
    COVERAGE_AREA,
    hard_disk_click_maps,
    render_soft_click_maps,
)
from jaxseg_robust.prompts.types import PADDING_LABEL

ENCODINGS = ("hard", "soft")


def isegm_valid_labels(points: jnp.ndarray, labels: jnp.ndarray) -> jnp.ndarray:
    """Labels with isegm's padding rule applied: a click with ``max(x, y) < 0`` is padding.

    Args:
      points: f32[N, 2] (x, y).
      labels: i32[N].

    Returns:
      i32[N] labels, -1 where the click is padding by label or by coordinates.
    """
    invalid = jnp.max(points, axis=-1) < 0
    return jnp.where(invalid, PADDING_LABEL, labels)


def click_maps(points: jnp.ndarray, labels: jnp.ndarray, shape: tuple[int, int], radius: float,
               *, encoding: str = "hard", coverage: str = COVERAGE_AREA) -> jnp.ndarray:
    """Positive / negative click disks on a grid.

    Args:
      points: f32[N, 2] clicks (x, y) in grid pixels.
      labels: i32[N] 1 / 0 / -1.
      shape: static (rows, cols).
      radius: disk radius in grid pixels (the model's ``norm_radius``).
      encoding: "hard" (isegm, exact) or "soft" (differentiable).
      coverage: soft-disk coverage model (`render_soft_click_maps`).

    Returns:
      f32[rows, cols, 2]: channel 0 positive, channel 1 negative, in [0, 1]
      (float64 for float64 points with the soft encoding under ``jax.enable_x64``).
    """
    if encoding not in ENCODINGS:
        raise ValueError(f"click encoding must be one of {ENCODINGS}; got {encoding!r}")
    points = jnp.asarray(points)
    points = points.astype(jnp.float64 if points.dtype == jnp.float64 else jnp.float32)
    labels = isegm_valid_labels(points, jnp.asarray(labels))
    if encoding == "hard":
        maps = hard_disk_click_maps(points, labels, shape, radius)
    else:
        maps = render_soft_click_maps(points, labels, shape, radius, coverage=coverage)
    return jnp.moveaxis(maps, 0, -1)


def coord_features(points: jnp.ndarray, labels: jnp.ndarray, prev_prob: jnp.ndarray,
                   radius: float, *, with_prev_mask: bool = True, encoding: str = "hard",
                   coverage: str = COVERAGE_AREA) -> jnp.ndarray:
    """The network's click input on the grid of ``prev_prob``.

    Args:
      points, labels: clicks as in `click_maps`.
      prev_prob: f32[H, W] previous probability map (zeros before the first
        click); it also fixes the grid.
      radius, encoding, coverage: see `click_maps`.
      with_prev_mask: static; the model has the previous-mask channel.

    Returns:
      f32[H, W, 3] = [prev, pos, neg], or f32[H, W, 2] = [pos, neg] without
      the previous-mask channel.
    """
    maps = click_maps(points, labels, prev_prob.shape, radius, encoding=encoding,
                      coverage=coverage)
    if not with_prev_mask:
        return maps
    return jnp.concatenate([prev_prob[..., None].astype(maps.dtype), maps], axis=-1)
