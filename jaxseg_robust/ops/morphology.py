"""Binary erosion and dilation with square (Chebyshev) and disk (Euclidean) structuring elements.

Structuring elements of radius ``r`` (a static Python int, ``r >= 0``):
  * ``"square"``: the (2r+1) x (2r+1) square, i.e. every offset with
    ``max(|dy|, |dx|) <= r`` (Chebyshev ball). ``r`` iterations of a 3x3
    erosion equal one erosion by this square.
  * ``"disk"``: every offset with ``dy**2 + dx**2 <= r**2`` (closed Euclidean
    ball on the pixel grid; :func:`disk_footprint` returns it). This is
    scipy's footprint ``x**2 + y**2 <= r**2``; it is *not* OpenCV's
    ``MORPH_ELLIPSE``, which differs on the rim.

Border: pixels outside the image take the value ``border_value`` (default
``False`` = background). With the default, an object touching the image border
is eroded from the border, exactly as the Boundary IoU API's zero-padding does
(``mask_to_boundary`` pads with zeros because OpenCV's own default border
would count the outside as foreground). ``scipy.ndimage.binary_erosion`` and
``binary_dilation`` use the same default (``border_value=0``).

Algorithm and why
-----------------
A square is separable, so an erosion is a running minimum (logical AND) over
a window of ``k = 2r + 1`` along rows and then along columns. The classic
O(1)-per-pixel scheme for that is van Herk / Gil-Werman (prefix and suffix
minima over blocks of ``k``). In XLA on CPU, however, the block prefix scans
lower to ``associative_scan`` (log k strided slice/concatenate levels,
several full-size temporaries): slower than the doubling scheme below even on
one byte per pixel, and far slower than the bit-packed doubling this module
uses (docs/benchmarking.md, "Measurements behind design choices", "Square
erosion on packed bits"). This module uses
the doubling ("sparse table") scheme instead:

    m_1 = x;  m_{2s}[i] = m_s[i] AND m_s[i + s]          (m_s = AND over [i, i+s))
    out[i]  = m_s[i - r] AND m_s[i + r + 1 - s]           (s = largest power of 2 <= k)

i.e. ``floor(log2 k) + 1`` shifted ANDs per axis, each a static slice that XLA
fuses; no transposes and no scan. On top of that the mask is **bit-packed**:
32 image rows go into one ``uint32`` word (bit ``j`` of word row ``i`` is
image row ``32 i + j``), so a vertical shift is a pair of bit shifts and a
horizontal shift is a plain slice, and every AND processes 32 pixels. Work per
pixel is ``O(log r / 32)``, far below r repeated 3x3 erosions (``O(r)``) and
below van Herk's 3 comparisons per pixel at the radii used here (d <= 64).
Packing is one fused reduction over the mask; metrics keep masks packed and
count pixels with ``population_count``.

A disk is not separable: it is the union of the rectangles
``(2h+1) x (2w+1)`` formed by its rows (one per distinct half-width ``w``,
``h`` the largest row offset that still has half-width ``>= w``), and an
erosion by a union of structuring elements is the AND of the erosions by each
of them. That costs O(r) rectangles (``len(disk_rectangles(r))``).
Dilation uses duality: ``dilate(x, b) = NOT erode(NOT x, NOT b)`` (both
structuring elements are symmetric).

Packed representation (for callers that chain operations, e.g. the metrics):
``pack_rows(mask bool[..., H, W]) -> uint32[..., ceil(H/32), W]``; bits that
lie below row ``H - 1`` (padding) are always 0 in inputs and outputs of the
``*_packed`` functions. ``height`` (the true H) must be passed to them.

Every public array function is wrapped in ``jax.jit`` (radius, height, shape and
border value static), so eager calls compile once per input shape; the
functions compose with ``jit`` and ``vmap`` as usual.

Accelerators: the same program serves every platform. Every function here is
loop-free: the doubling levels are unrolled at trace time (``floor(log2 k) + 1``
shifted ANDs per axis, a log-depth chain of whole-array steps that XLA fuses), the
disk's rectangles are a static list, and the traced-radius erosions below select
their level with selects and read it with dynamic slices. There is no scan or loop
whose trip count grows with the image or the radius, so nothing needs a
per-platform variant (docs/ARCHITECTURE.md, ops); ``tests/test_ops_morphology.py``
pins that the CUDA lowering has no while loop. ``metrics.packed`` erodes by a traced
band width with these tables on accelerators.
"""

from __future__ import annotations

import functools
import math
import operator

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

WORD_BITS = 32
_ALL_ONES = 0xFFFFFFFF
SHAPES = ("square", "disk")


# ---- argument checks ---------------------------------------------------------

def check_radius(radius, name: str = "radius") -> int:
    """Returns ``radius`` as a Python int; ValueError unless it is an integer >= 0."""
    if isinstance(radius, bool) or not isinstance(radius, (int, np.integer)):
        raise ValueError(f"{name} must be a non-negative Python int, got {radius!r}")
    radius = operator.index(radius)
    if radius < 0:
        raise ValueError(f"{name} must be >= 0, got {radius}")
    return radius


def _check_shape(shape: str) -> str:
    if shape not in SHAPES:
        raise ValueError(f"shape must be one of {SHAPES}, got {shape!r}")
    return shape


def as_binary_mask(mask, name: str = "mask") -> jnp.ndarray:
    """Returns ``mask != 0`` as bool[..., H, W].

    Args:
      mask: bool or integer array with at least 2 dimensions (non-zero = foreground).
        Floating arrays are rejected: threshold probabilities or logits explicitly.
      name: argument name used in error messages.
    """
    mask = jnp.asarray(mask)
    if mask.ndim < 2:
        raise ValueError(f"{name} must have at least 2 dimensions (..., H, W), got shape {mask.shape}")
    if mask.dtype == jnp.bool_:
        return mask
    if not jnp.issubdtype(mask.dtype, jnp.integer):
        raise ValueError(
            f"{name} must be a bool or integer mask, got dtype {mask.dtype}; "
            "threshold probabilities or logits explicitly (e.g. logits > 0)"
        )
    return mask != 0


# ---- structuring elements ----------------------------------------------------

def square_footprint(radius: int) -> np.ndarray:
    """bool[2r+1, 2r+1] all True: the Chebyshev ball of radius ``radius``."""
    radius = check_radius(radius)
    return np.ones((2 * radius + 1, 2 * radius + 1), dtype=bool)


def disk_footprint(radius: int) -> np.ndarray:
    """bool[2r+1, 2r+1]: offsets (dy, dx) with ``dy**2 + dx**2 <= radius**2``."""
    radius = check_radius(radius)
    offsets = np.arange(-radius, radius + 1)
    return offsets[:, None] ** 2 + offsets[None, :] ** 2 <= radius**2


def disk_rectangles(radius: int) -> tuple[tuple[int, int], ...]:
    """The disk as a union of centred rectangles.

    Returns:
      ((half_height, half_width), ...): the union of the rectangles
      ``|dy| <= half_height, |dx| <= half_width`` is exactly
      :func:`disk_footprint` (``radius``); one rectangle per distinct row
      half-width, widest first.
    """
    radius = check_radius(radius)
    half_widths = [math.isqrt(radius**2 - dy**2) for dy in range(radius + 1)]
    rectangles = []
    for half_width in sorted(set(half_widths), reverse=True):
        half_height = max(dy for dy, w in enumerate(half_widths) if w >= half_width)
        rectangles.append((half_height, half_width))
    return tuple(rectangles)


def _rectangles(shape: str, radius: int) -> tuple[tuple[int, int], ...]:
    if _check_shape(shape) == "square":
        return ((radius, radius),)
    return disk_rectangles(radius)


# ---- bit packing -------------------------------------------------------------

def packed_rows(height: int) -> int:
    """Number of uint32 word rows that hold ``height`` image rows: ceil(height / 32)."""
    return -(-height // WORD_BITS)


@jax.jit
def pack_rows(mask) -> jnp.ndarray:
    """Packs 32 image rows into one uint32 word per column.

    Args:
      mask: bool or integer [..., H, W] (non-zero = foreground).

    Returns:
      uint32[..., ceil(H/32), W]; bit ``j`` of word ``[i, x]`` is pixel
      ``[32 i + j, x]``; padding bits (rows >= H) are 0.
    """
    mask = as_binary_mask(mask)
    height = mask.shape[-2]
    rows = packed_rows(height) * WORD_BITS
    pad = [(0, 0)] * (mask.ndim - 2) + [(0, rows - height), (0, 0)]
    bits = jnp.pad(mask, pad).astype(jnp.uint32)
    bits = bits.reshape(bits.shape[:-2] + (rows // WORD_BITS, WORD_BITS, bits.shape[-1]))
    shifts = jnp.arange(WORD_BITS, dtype=jnp.uint32)[:, None]
    return jnp.sum(bits << shifts, axis=-2, dtype=jnp.uint32)


@functools.partial(jax.jit, static_argnames=("height",))
def unpack_rows(words, height: int) -> jnp.ndarray:
    """Inverse of :func:`pack_rows`: uint32[..., ceil(H/32), W] -> bool[..., H, W]."""
    words = jnp.asarray(words, dtype=jnp.uint32)
    if words.shape[-2] != packed_rows(height):
        raise ValueError(f"words has {words.shape[-2]} word rows, height {height} needs {packed_rows(height)}")
    shifts = jnp.arange(WORD_BITS, dtype=jnp.uint32)[:, None]
    bits = (words[..., :, None, :] >> shifts) & jnp.uint32(1)
    bits = bits.reshape(words.shape[:-2] + (words.shape[-2] * WORD_BITS, words.shape[-1]))
    return bits[..., :height, :].astype(bool)


@jax.jit
def count_packed(words) -> jnp.ndarray:
    """int32[...]: number of set bits over the last two axes of uint32[..., h, W]."""
    return jnp.sum(lax.population_count(words).astype(jnp.int32), axis=(-2, -1))


def _row_keep_mask(height: int) -> np.ndarray:
    """uint32[ceil(H/32), 1] with the bits of real image rows set (padding bits clear)."""
    n_words = packed_rows(height)
    keep = np.full((n_words, 1), _ALL_ONES, dtype=np.uint32)
    tail = height - (n_words - 1) * WORD_BITS
    if n_words and tail < WORD_BITS:
        keep[-1, 0] = np.uint32((1 << tail) - 1)
    return keep


def _check_packed(words, height: int) -> jnp.ndarray:
    words = jnp.asarray(words)
    if words.dtype != jnp.uint32:
        raise ValueError(f"words must be uint32 (from pack_rows), got dtype {words.dtype}")
    if words.ndim < 2 or words.shape[-2] != packed_rows(height):
        raise ValueError(f"words of shape {words.shape} do not hold height {height} ({packed_rows(height)} word rows)")
    return words


# ---- running AND along one axis (doubling scheme) -----------------------------

def _doubling_steps(window: int) -> tuple[list[int], int]:
    """Shift sizes 1, 2, 4, ... below ``window`` and the final span s (largest power of 2 <= window)."""
    steps, span = [], 1
    while 2 * span <= window:
        steps.append(span)
        span *= 2
    return steps, span


def _bit_window(words, shift: int, length: int) -> jnp.ndarray:
    """Word rows ``[0, length)`` of the packed map shifted by ``shift`` >= 0 image rows.

    Row ``y`` of the result is row ``y + shift`` of ``words`` (axis -2 holds
    32 rows per word); the caller guarantees the source rows exist.
    """
    axis = words.ndim - 2
    q, b = divmod(shift, WORD_BITS)
    low = lax.slice_in_dim(words, q, q + length, axis=axis)
    if b == 0:
        return low
    high = lax.slice_in_dim(words, q + 1, q + 1 + length, axis=axis)
    return (low >> jnp.uint32(b)) | (high << jnp.uint32(WORD_BITS - b))


def _bit_rows_needed(length: int, shift: int) -> int:
    q, b = divmod(shift, WORD_BITS)
    return q + length + (1 if b else 0)


def _and_filter_rows(words, radius: int, fill: int) -> jnp.ndarray:
    """AND over image rows ``[y - r, y + r]`` of a packed map (outside = ``fill`` bits)."""
    if radius == 0:
        return words
    window = 2 * radius + 1
    n_words = words.shape[-2]
    steps, span = _doubling_steps(window)
    left = -(-radius // WORD_BITS)
    # Find the right padding (in words) that keeps every slice in range.
    right = 0
    while True:
        length = n_words + left + right
        for step in steps:
            length -= _bit_rows_needed(0, step)
        if _bit_rows_needed(n_words, WORD_BITS * left + radius + 1 - span) <= length:
            break
        right += 1
    pad = [(0, 0)] * words.ndim
    pad[-2] = (left, right)
    m = jnp.pad(words, pad, constant_values=jnp.uint32(fill))
    for step in steps:
        length = m.shape[-2] - _bit_rows_needed(0, step)
        m = _bit_window(m, 0, length) & _bit_window(m, step, length)
    return _bit_window(m, WORD_BITS * left - radius, n_words) & _bit_window(
        m, WORD_BITS * left + radius + 1 - span, n_words
    )


def _and_filter_columns(words, radius: int, fill: int) -> jnp.ndarray:
    """AND over columns ``[x - r, x + r]`` (axis -1, one pixel per entry; outside = ``fill``)."""
    if radius == 0:
        return words
    axis = words.ndim - 1
    n = words.shape[axis]
    window = 2 * radius + 1
    steps, span = _doubling_steps(window)
    pad = [(0, 0)] * words.ndim
    pad[axis] = (radius, radius)
    m = jnp.pad(words, pad, constant_values=jnp.uint32(fill))
    for step in steps:
        size = m.shape[axis]
        m = lax.slice_in_dim(m, 0, size - step, axis=axis) & lax.slice_in_dim(m, step, size, axis=axis)
    return lax.slice_in_dim(m, 0, n, axis=axis) & lax.slice_in_dim(m, window - span, window - span + n, axis=axis)


# ---- packed erosion / dilation -------------------------------------------------

@functools.partial(jax.jit, static_argnames=("radius", "height", "shape", "border_value"))
def erode_packed(words, radius: int, height: int, *, shape: str = "square", border_value: bool = False) -> jnp.ndarray:
    """Binary erosion of a bit-packed mask.

    Args:
      words: uint32[..., ceil(H/32), W] from :func:`pack_rows` (padding bits 0).
      radius: static int >= 0, radius of the structuring element in pixels.
      height: static int, the image height H.
      shape: ``"square"`` (Chebyshev) or ``"disk"`` (Euclidean); see module doc.
      border_value: value of the pixels outside the image (False = background).

    Returns:
      uint32[..., ceil(H/32), W], the packed erosion (padding bits 0).
    """
    radius = check_radius(radius)
    words = _check_packed(words, height)
    keep = jnp.asarray(_row_keep_mask(height))
    fill = _ALL_ONES if border_value else 0
    x = words | ~keep if border_value else words & keep
    eroded = None
    for half_height, half_width in _rectangles(shape, radius):
        part = _and_filter_columns(_and_filter_rows(x, half_height, fill), half_width, fill)
        eroded = part if eroded is None else eroded & part
    return eroded & keep


@functools.partial(jax.jit, static_argnames=("radius", "height", "shape", "border_value"))
def dilate_packed(words, radius: int, height: int, *, shape: str = "square", border_value: bool = False) -> jnp.ndarray:
    """Binary dilation of a bit-packed mask (same arguments as :func:`erode_packed`).

    Returns:
      uint32[..., ceil(H/32), W], the packed dilation (padding bits 0).
    """
    words = _check_packed(words, height)
    keep = jnp.asarray(_row_keep_mask(height))
    eroded_complement = erode_packed(~words & keep, radius, height, shape=shape, border_value=not border_value)
    return ~eroded_complement & keep


# ---- user-facing bool API ------------------------------------------------------

@functools.partial(jax.jit, static_argnames=("radius", "shape", "border_value"))
def erode(mask, radius: int, *, shape: str = "square", border_value: bool = False) -> jnp.ndarray:
    """Binary erosion: pixel kept iff every pixel under the structuring element is foreground.

    Args:
      mask: bool or integer [..., H, W] (non-zero = foreground); leading axes are batch axes.
      radius: static int >= 0 (pixels); 0 returns the mask unchanged.
      shape: ``"square"`` ((2r+1)^2, Chebyshev) or ``"disk"`` (dy^2 + dx^2 <= r^2).
      border_value: value of pixels outside the image; False (default) erodes
        objects from the image border (Boundary IoU API / scipy convention).

    Returns:
      bool[..., H, W].
    """
    mask = as_binary_mask(mask)
    height = mask.shape[-2]
    return unpack_rows(erode_packed(pack_rows(mask), radius, height, shape=shape, border_value=border_value), height)


@functools.partial(jax.jit, static_argnames=("radius", "shape", "border_value"))
def dilate(mask, radius: int, *, shape: str = "square", border_value: bool = False) -> jnp.ndarray:
    """Binary dilation: pixel set iff any pixel under the structuring element is foreground.

    Args:
      mask: bool or integer [..., H, W] (non-zero = foreground); leading axes are batch axes.
      radius: static int >= 0 (pixels); 0 returns the mask unchanged.
      shape: ``"square"`` or ``"disk"``; see :func:`erode`.
      border_value: value of pixels outside the image (False = background).

    Returns:
      bool[..., H, W].
    """
    mask = as_binary_mask(mask)
    height = mask.shape[-2]
    return unpack_rows(dilate_packed(pack_rows(mask), radius, height, shape=shape, border_value=border_value), height)


# ---- square erosion with a traced radius ------------------------------------------
#
# The dataset evaluators (Boundary AP / PQ, docs/protocols/boundary_ap_pq.md) pad
# images of many sizes into a few canvases, and each image has its own boundary
# width d. A static radius would compile one program per (canvas, d); these
# functions take the radius as a traced scalar shared by the whole batch (a
# dynamic slice, never a gather) and ``max_radius`` as the static bound, so one
# program serves every width up to it. Same doubling scheme as above, with the
# doubling tables unrolled up to ``max_radius`` and the level floor(log2(2r + 1)) of the
# traced radius picked by a chain of selects (no loop).

def _traced_level(radius) -> jnp.ndarray:
    """``floor(log2(2r + 1))``: the doubling level whose span covers half the window ``2r + 1``."""
    return 31 - lax.clz(2 * radius + 1)


def _bit_rows_traced(words, start, count: int) -> jnp.ndarray:
    """Packed image rows ``[start, start + 32 count)`` of ``words`` (axis -2; ``start`` traced >= 0).

    The caller guarantees ``start // 32 + 1 + count <= words.shape[-2]`` (a
    dynamic slice would silently clamp an out-of-range start).
    """
    axis = words.ndim - 2
    q = start // WORD_BITS
    b = (start % WORD_BITS).astype(jnp.uint32)
    low = lax.dynamic_slice_in_dim(words, q, count, axis=axis)
    high = lax.dynamic_slice_in_dim(words, q + 1, count, axis=axis)
    high = jnp.where(b == 0, jnp.uint32(0), high << (jnp.uint32(WORD_BITS) - b))
    return (low >> b) | high


def _and_rows_traced(words, radius, max_radius: int) -> jnp.ndarray:
    """AND over image rows ``[y - r, y + r]`` of a packed map; outside = 0; ``r`` traced <= ``max_radius``.

    The doubling tables are unrolled for every level up to ``max_radius``
    (static shrinking slices, which XLA fuses); a chain of selects picks the
    table of the traced level, and two dynamic slices read it.
    """
    n_words = words.shape[-2]
    steps, _ = _doubling_steps(2 * max_radius + 1)
    top = -(-max_radius // WORD_BITS)
    bottom = top + 1 + sum(_bit_rows_needed(0, step) for step in steps)
    pad = [(0, 0)] * words.ndim
    pad[-2] = (top, bottom)
    tables = [jnp.pad(words, pad)]
    for step in steps:
        table = tables[-1]
        length = table.shape[-2] - _bit_rows_needed(0, step)
        tables.append(_bit_window(table, 0, length) & _bit_window(table, step, length))
    base = WORD_BITS * top
    length = n_words + (base + max_radius) // WORD_BITS + 1
    table = _select_level(tables, _traced_level(radius), length, axis=words.ndim - 2)
    return _bit_rows_traced(table, base - radius, n_words) & _bit_rows_traced(table, base + radius + 1 - _span(radius),
                                                                             n_words)


def _span(radius) -> jnp.ndarray:
    return jnp.left_shift(jnp.int32(1), _traced_level(radius))


def _select_level(tables: list, level, length: int, axis: int) -> jnp.ndarray:
    """``tables[level]`` (traced level) cut to ``length`` along ``axis``: one fused select, no gather."""
    selected = lax.slice_in_dim(tables[0], 0, length, axis=axis)
    for index, table in enumerate(tables[1:], start=1):
        selected = jnp.where(level == index, lax.slice_in_dim(table, 0, length, axis=axis), selected)
    return selected


def _filter_columns_traced(values, radius, max_radius: int, combine, fill) -> jnp.ndarray:
    """``combine``-reduction over columns ``[x - r, x + r]`` (axis -1; outside = ``fill``; ``r`` traced)."""
    axis = values.ndim - 1
    n = values.shape[axis]
    steps, _ = _doubling_steps(2 * max_radius + 1)
    pad = [(0, 0)] * values.ndim
    pad[axis] = (max_radius, max_radius + sum(steps))
    tables = [jnp.pad(values, pad, constant_values=fill)]
    for step in steps:
        table = tables[-1]
        size = table.shape[axis]
        tables.append(combine(lax.slice_in_dim(table, 0, size - step, axis=axis),
                              lax.slice_in_dim(table, step, size, axis=axis)))

    table = _select_level(tables, _traced_level(radius), n + 2 * max_radius, axis=axis)
    first = lax.dynamic_slice_in_dim(table, max_radius - radius, n, axis=axis)
    second = lax.dynamic_slice_in_dim(table, max_radius + radius + 1 - _span(radius), n, axis=axis)
    return combine(first, second)


def _filter_rows_traced(values, radius, max_radius: int, combine, fill) -> jnp.ndarray:
    """The same reduction over rows ``[y - r, y + r]`` (axis -2) of an unpacked map."""
    return jnp.swapaxes(_filter_columns_traced(jnp.swapaxes(values, -1, -2), radius, max_radius, combine, fill), -1, -2)


def _check_traced_radius(radius, max_radius: int) -> jnp.ndarray:
    check_radius(max_radius, "max_radius")
    radius = jnp.asarray(radius)
    if radius.ndim != 0 or not jnp.issubdtype(radius.dtype, jnp.integer):
        raise ValueError(f"radius must be an integer scalar, got shape {radius.shape} dtype {radius.dtype}")
    return jnp.clip(radius.astype(jnp.int32), 0, max_radius)


@functools.partial(jax.jit, static_argnames=("max_radius",))
def erode_square_packed_traced(words, radius, max_radius: int) -> jnp.ndarray:
    """Square (Chebyshev) erosion of bit-packed masks with a traced radius; outside = background.

    Every bit of ``words`` is an image pixel: a caller padding a smaller image
    into the canvas fills the padding with 0, which is then background exactly
    like the outside of the image (the Boundary IoU API's zero padding).

    Args:
      words: uint32[..., h, W] packed rows (:func:`pack_rows` layout).
      radius: int scalar (may be traced), the radius r >= 0 for the whole batch;
        clipped to ``[0, max_radius]``.
      max_radius: static int, the largest radius the program supports.

    Returns:
      uint32[..., h, W]: pixels whose (2r+1)^2 square lies inside the mask.
    """
    words = jnp.asarray(words)
    if words.dtype != jnp.uint32 or words.ndim < 2:
        raise ValueError(f"words must be uint32[..., h, W], got {words.dtype} {words.shape}")
    radius = _check_traced_radius(radius, max_radius)
    # Columns first, then rows, with a barrier between: in the other order (or fused) XLA on CPU ran the
    # pair of passes far slower (docs/benchmarking.md, "Measurements behind design choices").
    columns = lax.optimization_barrier(_filter_columns_traced(words, radius, max_radius, jnp.bitwise_and,
                                                              jnp.uint32(0)))
    return _and_rows_traced(columns, radius, max_radius)


@functools.partial(jax.jit, static_argnames=("max_radius",))
def uniform_window_traced(labels, radius, max_radius: int) -> jnp.ndarray:
    """True where every pixel of the (2r+1)^2 square around a pixel lies in the map and has its label.

    A pixel of segment ``s`` where this is False is on the inner boundary band
    of ``s`` of width r (the Boundary IoU API's band, computed for every
    segment of a label map at once).

    Args:
      labels: int[..., H, W] labels >= 0 (negative values count as outside the image).
      radius: int scalar (may be traced), r >= 0 for the whole batch; clipped to ``[0, max_radius]``.
      max_radius: static int bound on r.

    Returns:
      bool[..., H, W].
    """
    labels = jnp.asarray(labels)
    if not jnp.issubdtype(labels.dtype, jnp.integer) or labels.ndim < 2:
        raise ValueError(f"labels must be an integer [..., H, W] map, got {labels.dtype} {labels.shape}")
    labels = labels.astype(jnp.int32)
    radius = _check_traced_radius(radius, max_radius)
    outside = jnp.int32(-1)
    low = jnp.maximum(labels, outside)
    low = _filter_rows_traced(_filter_columns_traced(low, radius, max_radius, jnp.minimum, outside),
                              radius, max_radius, jnp.minimum, outside)
    high = _filter_rows_traced(_filter_columns_traced(labels, radius, max_radius, jnp.maximum, outside),
                               radius, max_radius, jnp.maximum, outside)
    return (low == high) & (low >= 0)
