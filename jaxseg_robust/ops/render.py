"""Click rendering: hard disk maps (RITM-type models) and soft, differentiable disks.

Two renderers, both pure, jit- and vmap-safe:

* `hard_disk_click_maps` reproduces RITM's ``DistMaps(use_disks=True)``
  (docs/protocols/tetris.md §2.1): pixel ``(r, c)`` is 1 in a channel iff some click
  of that sign satisfies ``(r - y)^2 + (c - x)^2 <= R^2``. Pixel indices are
  compared with the click position directly (no +0.5). It has no useful
  gradient.

* `render_soft_disk` / `render_click_disk` / `render_soft_click_maps` replace
  the pydiffvg filled circle that the TETRIS click attack renders (§2.2).
  pydiffvg averages 2x2 jittered samples per pixel (seed 0) under a box filter
  and obtains gradients w.r.t. the centre by edge sampling: its expected
  output is the *area* of the disk inside each pixel and its expected
  gradient the gradient of that area. Both renderers here are deliberate,
  deterministic surrogates of it (pydiffvg itself is not used):

  - ``coverage="area"`` (default): the exact area of disk ∩ pixel, from a
    closed-form quadrant-area function evaluated on the (rows+1) x (cols+1)
    pixel corners, with an analytic derivative (chord lengths). It equals
    pydiffvg's expected value and expected gradient; its total mass is
    pi R^2 for every centre inside the canvas, so a constant weight gets zero
    gradient.
  - ``coverage="ramp"``: the anti-aliased surrogate proposed by the spec,
    ``cov(p) = clip(R + 0.5 - |p - c|, 0, 1)`` at pixel centres
    ``p = (j + 0.5, i + 0.5)``: a linear ramp of width one pixel across the
    circle. With ``samples_per_axis = n > 1`` the ramp, narrowed to width 1/n,
    is evaluated at the n x n stratum centres of each pixel and averaged (a
    deterministic stand-in for pydiffvg's jittered n x n samples). Cheap, but
    its gradient is aliased: the number of pixel centres inside the ramp band
    changes with the sub-pixel position, so its mass (about pi (R^2 + 1/12))
    fluctuates with the centre. Measured for R = 5 and a linear weight f = x
    over 64 sub-pixel positions: d/dcx sum(cov f) ranges 54..111 (ramp, n=1)
    and 67..88 (n=2) around pi R^2 = 78.5, against 75.9..79.3 for "area";
    the gradient of a smooth weighted sum of exact areas is reproduced to
    < 0.05 % by "area" and to 2-55 % by "ramp" (tests/test_ops_render.py).

  Gradients w.r.t. the centre are non-zero exactly on the pixels that the
  circle (area) or the ramp band (ramp) touches. The radius is treated as a
  constant (zero gradient) by ``coverage="area"``.

Accelerators: both renderers are closed forms per pixel, evaluated by one broadcast
over clicks and pixels (``vmap`` over the clicks, then a sum per sign); there is no
loop, so the same program serves the CPU and accelerators (docs/ARCHITECTURE.md, ops;
``tests/test_ops_render.py`` pins that the CUDA lowering, gradient included, has no
while loop).

Precision: the hard disks are float32 (as the reference); the soft renderers
compute in float32, or in float64 when given float64 points under
``jax.enable_x64`` (the precise finite-difference references of the gradient
tests use that).

Canvas convention (pydiffvg's): pixel ``(i, j)`` (row i, column j) covers
``[j, j + 1] x [i, i + 1]`` in continuous ``(x, y)`` canvas coordinates, so its
centre is ``(j + 0.5, i + 0.5)``. A click at integer pixel ``(x, y)`` (column,
row) is drawn by TETRIS at centre ``(x + 0.5, y + 0.5)``, clamped to
``[0, cols - 1] x [0, rows - 1]`` *after* adding 0.5 (the RITM path and the SAM
location-loss path of the TETRIS code, `TETRIS_CLAMP_INSET`); the unused copy of
``DistMapsSAM`` in the BREPS code clamps to ``[5, cols - 5] x [5, rows - 5]``
(`BREPS_SAM_CLAMP_INSET`). Clamping stops the gradient outside the range (as
``torch.clamp``: the gradient passes for values inside the closed interval).
"""

from __future__ import annotations

from typing import Optional, Sequence, Tuple

import jax
import jax.numpy as jnp

from jaxseg_robust.ops.labels import NEGATIVE_LABEL, POSITIVE_LABEL

# Radius (pixels of the rendering grid) used by TETRIS for the SAM location
# loss and by the RITM HRNet / SimpleClick checkpoints (``norm_radius``).
DEFAULT_CLICK_RADIUS = 5.0
# pydiffvg draws a click at integer pixel (x, y) centred on (x + 0.5, y + 0.5).
PIXEL_CENTER_OFFSET = 0.5
# (low, high) insets: centre x clamped to [low, cols - high], y to [low, rows - high].
TETRIS_CLAMP_INSET = (0.0, 1.0)
BREPS_SAM_CLAMP_INSET = (5.0, 5.0)
# Soft-disk coverage models (module docstring).
COVERAGE_AREA = "area"
COVERAGE_RAMP = "ramp"


def _check_shape(shape: Sequence[int]) -> Tuple[int, int]:
    """Validates a static (rows, cols) grid shape."""
    try:
        rows, cols = (int(s) for s in shape)
    except (TypeError, ValueError):
        raise ValueError(f"shape must be a static (rows, cols) pair of ints; got {shape!r}") from None
    if rows <= 0 or cols <= 0:
        raise ValueError(f"shape must be positive (rows, cols); got {shape!r}")
    return rows, cols


def _as_float(x) -> jnp.ndarray:
    """``x`` as float32, or as float64 when it already is float64 (precise references under
    ``jax.enable_x64``; without x64 JAX has no float64 and everything is float32)."""
    x = jnp.asarray(x)
    return x.astype(jnp.float64 if x.dtype == jnp.float64 else jnp.float32)


def _check_points(points: jnp.ndarray, labels: jnp.ndarray) -> None:
    """Validates padded click arrays of shapes [N, 2] and [N]."""
    if points.ndim != 2 or points.shape[-1] != 2:
        raise ValueError(f"points must have shape [N, 2] (x, y); got {points.shape}")
    if labels.shape != points.shape[:1]:
        raise ValueError(f"labels must have shape [{points.shape[0]}] to match points; got {labels.shape}")


def _check_samples(samples_per_axis: int) -> int:
    """Validates the static per-axis sample count of the ramp renderer."""
    if not isinstance(samples_per_axis, int) or samples_per_axis < 1:
        raise ValueError(f"samples_per_axis must be a positive int; got {samples_per_axis!r}")
    return samples_per_axis


def hard_disk_click_maps(
    points: jnp.ndarray,
    labels: jnp.ndarray,
    shape: Sequence[int],
    radius: float = DEFAULT_CLICK_RADIUS,
) -> jnp.ndarray:
    """Binary disk maps of padded clicks, as RITM's ``DistMaps(use_disks=True)``.

    Pixel ``(r, c)`` is 1 in the positive (negative) channel iff some positive
    (negative) click ``(x, y)`` satisfies ``(r - y)^2 + (c - x)^2 <= radius^2``,
    evaluated in float32 like the reference. Row/column indices are compared
    with the click coordinates directly (no pixel-centre offset).

    Args:
      points: f32[N, 2] click coordinates (x, y) = (column, row) in pixels of
        the grid; may be fractional.
      labels: i32[N] 1 positive, 0 negative, -1 padding (ignored; RITM marks
        padding by coordinates (-1, -1), our `Prompts` by label -1).
      shape: static (rows, cols) of the output grid.
      radius: disk radius R in grid pixels (RITM: ``norm_radius *
        spatial_scale``).

    Returns:
      f32[2, rows, cols]: channel 0 positive clicks, channel 1 negative clicks,
      values in {0, 1}.
    """
    rows, cols = _check_shape(shape)
    points = jnp.asarray(points, jnp.float32)
    labels = jnp.asarray(labels)
    _check_points(points, labels)
    row_index = jnp.arange(rows, dtype=jnp.float32)[None, :, None]
    col_index = jnp.arange(cols, dtype=jnp.float32)[None, None, :]
    x = points[:, 0, None, None]
    y = points[:, 1, None, None]
    squared_distance = (row_index - y) ** 2 + (col_index - x) ** 2  # [N, rows, cols]
    inside = squared_distance <= jnp.square(jnp.asarray(radius, jnp.float32))
    positive = jnp.any(inside & (labels == POSITIVE_LABEL)[:, None, None], axis=0)
    negative = jnp.any(inside & (labels == NEGATIVE_LABEL)[:, None, None], axis=0)
    return jnp.stack([positive, negative]).astype(jnp.float32)


def _clamp_like_torch(value: jnp.ndarray, low, high) -> jnp.ndarray:
    """``torch.clamp``: value clipped to [low, high]; gradient 1 inside the closed range, else 0."""
    return jnp.where(value < low, low, jnp.where(value > high, high, value))


def disk_center(
    points: jnp.ndarray,
    shape: Sequence[int],
    *,
    center_offset: float = PIXEL_CENTER_OFFSET,
    clamp_inset: Optional[Tuple[float, float]] = TETRIS_CLAMP_INSET,
) -> jnp.ndarray:
    """Canvas centre(s) at which the TETRIS renderer draws click(s).

    ``c = (x + center_offset, y + center_offset)``, then, unless
    ``clamp_inset`` is None, x clamped to ``[low, cols - high]`` and y to
    ``[low, rows - high]`` with ``(low, high) = clamp_inset``. Defaults give the
    TETRIS convention ``clamp((x + 0.5, y + 0.5), [0, cols - 1] x [0, rows - 1])``;
    `BREPS_SAM_CLAMP_INSET` gives the ``[5, cols - 5]`` variant.

    Args:
      points: f32[..., 2] click coordinates (x, y) in grid pixels.
      shape: static (rows, cols) of the rendering grid.
      center_offset: added to both coordinates (pixels).
      clamp_inset: (low, high) insets in pixels, or None for no clamping.

    Returns:
      f32[..., 2] canvas centres (x, y); gradient 1 where not clamped, 0 where clamped.
    """
    rows, cols = _check_shape(shape)
    points = _as_float(points)
    if points.shape[-1:] != (2,):
        raise ValueError(f"points must have a trailing axis of size 2 (x, y); got {points.shape}")
    center = points + jnp.asarray(center_offset, points.dtype)
    if clamp_inset is None:
        return center
    low, high = (float(v) for v in clamp_inset)
    cx = _clamp_like_torch(center[..., 0], low, cols - high)
    cy = _clamp_like_torch(center[..., 1], low, rows - high)
    return jnp.stack([cx, cy], axis=-1)


def _safe_norm(dx: jnp.ndarray, dy: jnp.ndarray) -> jnp.ndarray:
    """sqrt(dx^2 + dy^2) with a finite (zero) gradient at the origin (double where)."""
    squared = dx * dx + dy * dy
    positive = squared > 0
    return jnp.where(positive, jnp.sqrt(jnp.where(positive, squared, 1.0)), 0.0)


def _half_chord(u: jnp.ndarray, radius: jnp.ndarray) -> jnp.ndarray:
    """sqrt(R^2 - u^2) for |u| <= R (else 0), as sqrt((R - |u|)(R + |u|)) to avoid cancellation."""
    distance_to_rim = jnp.maximum(radius - jnp.abs(u), 0.0)
    return jnp.sqrt(distance_to_rim * (radius + jnp.abs(u)))


def _half_disk_area_left_of(t: jnp.ndarray, radius: jnp.ndarray) -> jnp.ndarray:
    """int_{-R}^{t} sqrt(R^2 - u^2) du (half the disk area left of u = t; centre 0).

    Written with atan2(t, s) rather than asin(t / R): with s = sqrt(R^2 - t^2)
    the result is then insensitive to rounding of s to first order (near
    |t| = R, asin amplifies the rounding of t / R by 1/s).
    """
    t = jnp.clip(t, -radius, radius)
    s = _half_chord(t, radius)
    return 0.5 * (t * s + radius * radius * jnp.arctan2(t, s)) + 0.25 * jnp.pi * radius * radius


def _chord_below(u: jnp.ndarray, v: jnp.ndarray, radius: jnp.ndarray) -> jnp.ndarray:
    """Length of the disk's vertical chord at abscissa u below ordinate v (centre 0)."""
    half_chord = _half_chord(u, radius)
    return jnp.maximum(jnp.minimum(v, half_chord) + half_chord, 0.0)


@jax.custom_jvp
def _disk_quadrant_area(x: jnp.ndarray, y: jnp.ndarray, radius: jnp.ndarray) -> jnp.ndarray:
    """Area of {(u, v): u^2 + v^2 <= R^2, u <= x, v <= y}, closed form.

    With w = sqrt(R^2 - y^2) the vertical chord at u is cut by v <= y only for
    |u| < w, so the area is 2 P(x) - (P(xc) - P(-w)) + y (xc + w) for y >= 0
    and (P(xc) - P(-w)) + y (xc + w) for y < 0, with xc = clip(x, -w, w) and
    P = `_half_disk_area_left_of`. Inputs are relative to the centre (pixels).
    """
    x = jnp.clip(x, -radius, radius)
    y = jnp.clip(y, -radius, radius)
    cut_half_width = _half_chord(y, radius)
    x_cut = jnp.clip(x, -cut_half_width, cut_half_width)
    cut_strip = _half_disk_area_left_of(x_cut, radius) - _half_disk_area_left_of(-cut_half_width, radius)
    rectangle = y * (x_cut + cut_half_width)
    upper = 2.0 * _half_disk_area_left_of(x, radius) - cut_strip + rectangle
    lower = cut_strip + rectangle
    return jnp.where(y >= 0, upper, lower)


@_disk_quadrant_area.defjvp
def _disk_quadrant_area_jvp(primals, tangents):
    # dA/dx = vertical chord length at u = x below y, dA/dy = horizontal chord
    # length at v = y left of x (A is C^1); the radius is treated as constant.
    x, y, radius = primals
    dx, dy, _ = tangents
    area = _disk_quadrant_area(x, y, radius)
    return area, _chord_below(x, y, radius) * dx + _chord_below(y, x, radius) * dy


def _area_coverage(center: jnp.ndarray, rows: int, cols: int, radius: jnp.ndarray) -> jnp.ndarray:
    """Exact area of disk ∩ pixel for every pixel, by inclusion-exclusion over pixel corners."""
    corner_x = jnp.arange(cols + 1, dtype=center.dtype)[None, :] - center[0]
    corner_y = jnp.arange(rows + 1, dtype=center.dtype)[:, None] - center[1]
    quadrant = _disk_quadrant_area(corner_x, corner_y, jax.lax.stop_gradient(radius))  # [rows+1, cols+1]
    area = quadrant[1:, 1:] - quadrant[:-1, 1:] - quadrant[1:, :-1] + quadrant[:-1, :-1]
    return jnp.clip(area, 0.0, 1.0)


def _ramp_coverage(center: jnp.ndarray, rows: int, cols: int, radius: jnp.ndarray, n: int) -> jnp.ndarray:
    """Mean over n x n stratum centres s of clip(n (R - |s - c|) + 0.5, 0, 1)."""
    col_origin = jnp.arange(cols, dtype=center.dtype)[None, :]
    row_origin = jnp.arange(rows, dtype=center.dtype)[:, None]
    coverage = jnp.zeros((rows, cols), center.dtype)
    for a in range(n):
        for b in range(n):
            dx = col_origin + (a + 0.5) / n - center[0]
            dy = row_origin + (b + 0.5) / n - center[1]
            coverage = coverage + jnp.clip(n * (radius - _safe_norm(dx, dy)) + 0.5, 0.0, 1.0)
    return coverage / (n * n)


def render_soft_disk(
    center: jnp.ndarray,
    shape: Sequence[int],
    radius: float = DEFAULT_CLICK_RADIUS,
    *,
    coverage: str = COVERAGE_AREA,
    samples_per_axis: int = 1,
) -> jnp.ndarray:
    """Filled disk on a pixel grid with per-pixel coverage, differentiable w.r.t. its centre.

    ``coverage="area"``: the exact area of the disk inside each unit pixel.
    ``coverage="ramp"``: with ``n = samples_per_axis`` and stratum centres
    ``s_ab = (j + (a + 0.5)/n, i + (b + 0.5)/n)``, pixel ``(i, j)`` gets
    ``mean_ab clip(n (R - |s_ab - c|) + 0.5, 0, 1)``; for n = 1 this is the
    spec's ``clip(R + 0.5 - |p - c|, 0, 1)`` at the pixel centre ``p``. Both
    are deliberate surrogates of pydiffvg's 2x2-supersampled edge-sampling
    renderer; see the module docstring for their accuracy.

    Args:
      center: f32[2] disk centre (x, y) in canvas coordinates (pixel (i, j)
        spans [j, j+1] x [i, i+1]); see `disk_center` for click conventions.
      shape: static (rows, cols) of the grid.
      radius: disk radius in pixels, > 0 (scalar, may be traced; constant
        for differentiation with ``coverage="area"``).
      coverage: static, "area" or "ramp".
      samples_per_axis: static int n >= 1, only for ``coverage="ramp"``.

    Returns:
      f32[rows, cols] coverage in [0, 1].
    """
    rows, cols = _check_shape(shape)
    n = _check_samples(samples_per_axis)
    if coverage not in (COVERAGE_AREA, COVERAGE_RAMP):
        raise ValueError(f"coverage must be {COVERAGE_AREA!r} or {COVERAGE_RAMP!r}; got {coverage!r}")
    if coverage == COVERAGE_AREA and n != 1:
        raise ValueError(f"samples_per_axis applies to coverage='ramp' only; got {n} with coverage='area'")
    if isinstance(radius, (int, float)) and not radius > 0:
        raise ValueError(f"radius must be positive; got {radius!r}")
    center = _as_float(center)
    if center.shape != (2,):
        raise ValueError(f"center must have shape [2] (x, y); got {center.shape} (vmap for several disks)")
    radius = jnp.asarray(radius, center.dtype)
    if coverage == COVERAGE_AREA:
        return _area_coverage(center, rows, cols, radius)
    return _ramp_coverage(center, rows, cols, radius, n)


def render_click_disk(
    point: jnp.ndarray,
    shape: Sequence[int],
    radius: float = DEFAULT_CLICK_RADIUS,
    *,
    center_offset: float = PIXEL_CENTER_OFFSET,
    clamp_inset: Optional[Tuple[float, float]] = TETRIS_CLAMP_INSET,
    coverage: str = COVERAGE_AREA,
    samples_per_axis: int = 1,
) -> jnp.ndarray:
    """Soft disk of one click with the TETRIS centre convention (`disk_center`).

    Args:
      point: f32[2] click (x, y) in grid pixels (e.g. the SAM resized frame).
      shape: static (rows, cols) of the grid.
      radius: disk radius in pixels (TETRIS SAM location loss: 5).
      center_offset, clamp_inset: see `disk_center`.
      coverage, samples_per_axis: see `render_soft_disk`.

    Returns:
      f32[rows, cols] coverage in [0, 1], differentiable w.r.t. ``point``.
    """
    center = disk_center(point, shape, center_offset=center_offset, clamp_inset=clamp_inset)
    return render_soft_disk(center, shape, radius, coverage=coverage, samples_per_axis=samples_per_axis)


def render_soft_click_maps(
    points: jnp.ndarray,
    labels: jnp.ndarray,
    shape: Sequence[int],
    radius: float = DEFAULT_CLICK_RADIUS,
    *,
    center_offset: float = PIXEL_CENTER_OFFSET,
    clamp_inset: Optional[Tuple[float, float]] = TETRIS_CLAMP_INSET,
    coverage: str = COVERAGE_AREA,
    samples_per_axis: int = 1,
) -> jnp.ndarray:
    """Soft positive/negative click maps: the differentiable RITM-path rendering.

    Each non-padding click is drawn with `render_click_disk`; disks are summed
    per sign and the sums clamped to [0, 1] with ``torch.clamp`` semantics (as
    the TETRIS RITM path clamps the sum of the fixed clicks' map and the
    optimised click's disk). The gradient flows to every point; pass
    ``jax.lax.stop_gradient`` on the points that the attack keeps fixed.

    Args:
      points: f32[N, 2] clicks (x, y) in grid pixels.
      labels: i32[N] 1 positive, 0 negative, -1 padding (contributes nothing).
      shape: static (rows, cols) of the grid.
      radius, center_offset, clamp_inset, coverage, samples_per_axis: as in
        `render_click_disk`.

    Returns:
      f32[2, rows, cols]: channel 0 positive, channel 1 negative, in [0, 1].
    """
    points = _as_float(points)
    labels = jnp.asarray(labels)
    _check_points(points, labels)
    disks = jax.vmap(
        lambda p: render_click_disk(
            p, shape, radius, center_offset=center_offset, clamp_inset=clamp_inset,
            coverage=coverage, samples_per_axis=samples_per_axis,
        )
    )(points)  # [N, rows, cols]
    weights = jnp.stack([labels == POSITIVE_LABEL, labels == NEGATIVE_LABEL]).astype(disks.dtype)
    return _clamp_like_torch(jnp.einsum("kn,nhw->khw", weights, disks), 0.0, 1.0)
