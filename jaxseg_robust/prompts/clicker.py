"""The RITM baseline clicker as pure functions (docs/protocols/tetris.md §1).

One step of the RITM ``Clicker`` (``isegm/inference/clicker.py``, identical in the
TETRIS, BREPS and RClicks code; RClicks' version only adds an optional click model
that samples inside the chosen error region, which its simulator builds on top of
``error_masks`` and ``next_click``):

1. ``FN = gt & ~pred & valid``, ``FP = ~gt & pred & valid``.
2. Zero-pad both by one pixel (the image border counts as background), exact
   Euclidean distance transform, crop.
3. Multiply both maps by ``not_clicked`` (a clicked pixel is never chosen again).
4. Positive click iff ``max DT_FN > max DT_FP`` (strict); ties, including "no error
   at all", give a negative click.
5. Location: the first pixel in row-major order among the maxima of the chosen map
   (``argmax`` of the flattened map). With no error at all every value is 0 and the
   click is (0, 0), even if (0, 0) was clicked before.

Comparisons use exact integer squared distances, as the spec prescribes. The
reference compares OpenCV's float32 distances; correctly rounded float32 square roots
of distinct integers below 2**22 (distances below 2048 px) are distinct, so the
decisions agree up to OpenCV's own ~1e-6 rounding (the spec reports identical
clicks on 300 random masks; the tests compare against OpenCV directly).

``mark_clicked`` is the state update: ``not_clicked[min(round(row), H-1),
min(round(col), W-1)] = False`` with Python's round (half to even, like
``jnp.round``); the TETRIS attack stores float clicks, so this matters.

Coordinates are (row, col) = (y, x) in pixels of the mask grid; `xy_of` turns
them into the (x, y) every record stores (docs/ARCHITECTURE.md, "Clicks in
records").
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxseg_robust.ops.distance import squared_distance_transform

__all__ = ["error_masks", "next_click", "mark_clicked", "xy_of"]


def _as_bool_2d(name: str, x: jax.Array, shape: tuple[int, ...] | None) -> jax.Array:
    x = jnp.asarray(x)
    if x.ndim != 2:
        raise ValueError(f"{name} must be 2-D [H, W], got shape {x.shape}; use jax.vmap for batches")
    if shape is not None and x.shape != shape:
        raise ValueError(f"{name} has shape {x.shape}, expected {shape} (same as gt)")
    return x if x.dtype == jnp.bool_ else x != 0


def error_masks(gt: jax.Array, pred: jax.Array,
                valid: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
    """False-negative and false-positive regions, restricted to valid pixels.

    Args:
      gt: [H, W] ground-truth object mask (bool, or non-zero = object).
      pred: [H, W] predicted mask (bool, or non-zero = object).
      valid: optional [H, W] mask of non-ignored pixels (default: all valid).
    Returns:
      (fn bool[H, W], fp bool[H, W]): ``gt & ~pred & valid`` and ``~gt & pred & valid``.
    """
    gt = _as_bool_2d("gt", gt, None)
    pred = _as_bool_2d("pred", pred, gt.shape)
    valid = jnp.ones(gt.shape, bool) if valid is None else _as_bool_2d("valid", valid, gt.shape)
    return gt & ~pred & valid, ~gt & pred & valid


def next_click(gt: jax.Array, pred: jax.Array, not_clicked: jax.Array,
               valid: jax.Array | None = None) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The RITM baseline click for the current prediction (pure; jit/vmap-safe).

    Args:
      gt: [H, W] ground-truth object mask (bool, or non-zero = object).
      pred: [H, W] previous binarised prediction (all False before the first click).
      not_clicked: [H, W] bool, False at pixels already clicked.
      valid: optional [H, W] mask of non-ignored pixels (default: all valid).
    Returns:
      (is_positive bool[], row int32[], col int32[]): click polarity and location.
    """
    fn, fp = error_masks(gt, pred, valid)
    not_clicked = _as_bool_2d("not_clicked", not_clicked, fn.shape)
    height, width = fn.shape
    both = jnp.stack([fn, fp])
    squared = jax.vmap(lambda m: squared_distance_transform(m, pad_border=True))(both)
    squared = jnp.where(not_clicked[None], squared, 0)
    deepest = jnp.max(squared, axis=(1, 2))
    is_positive = deepest[0] > deepest[1]
    chosen = jnp.where(is_positive, squared[0], squared[1])
    flat = jnp.argmax(chosen.reshape(-1)).astype(jnp.int32)
    return is_positive, flat // width, flat % width


def mark_clicked(not_clicked: jax.Array, row: jax.Array, col: jax.Array) -> jax.Array:
    """Mark a (possibly float) click as used, exactly like the RITM ``Clicker.add_click``.

    The pixel ``(min(round(row), H-1), min(round(col), W-1))`` becomes False, with
    round-half-to-even (Python ``round`` = ``jnp.round``). Coordinates are expected
    in ``[0, H-1] x [0, W-1]`` (the attacks clip them); a negative rounded index
    counts from the end as in the numpy reference, and one below ``-H`` (``-W``) is
    ignored. Rounding happens in the coordinates' dtype (float32 by default in JAX),
    so a float64 value within float32 precision of ``k + 0.5`` may round differently
    from Python's ``round`` on the float64 value.

    Args:
      not_clicked: bool[H, W] current state.
      row, col: scalar click coordinates in pixels (int or float).
    Returns:
      bool[H, W] updated state (a new array).
    """
    not_clicked = _as_bool_2d("not_clicked", not_clicked, None)
    row = jnp.asarray(row)
    col = jnp.asarray(col)
    if row.ndim != 0 or col.ndim != 0:
        raise ValueError(f"row and col must be scalars, got shapes {row.shape} and {col.shape}")
    height, width = not_clicked.shape
    r = jnp.minimum(jnp.round(row).astype(jnp.int32), height - 1)
    c = jnp.minimum(jnp.round(col).astype(jnp.int32), width - 1)
    r = jnp.where(r < 0, r + height, r)
    c = jnp.where(c < 0, c + width, c)
    hit = (jnp.arange(height)[:, None] == r) & (jnp.arange(width)[None, :] == c)
    return not_clicked & ~hit


def xy_of(row_col):
    """[..., 2] (row, col) pixels as [..., 2] (x, y) = (col, row), the click convention of every record.

    Works on jax and numpy arrays and keeps the dtype; (-1, -1) stays (-1, -1).
    """
    return row_col[..., ::-1]
