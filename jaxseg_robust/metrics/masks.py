"""Binary-mask metrics: mask IoU, Boundary IoU, min(IoU, BIoU), trimap IoU, boundary F-measure.

Follows docs/protocols/boundary_iou.md (the official Boundary IoU API and the
RITM-style wrappers of the interactive-segmentation benchmarks).

Inputs (the same for every function here):
  * ``gt``, ``pred``: bool or integer [..., H, W] masks, non-zero = foreground
    (floating arrays are rejected: threshold them explicitly).
  * ``valid``: optional bool [..., H, W]; False marks *ignore* pixels (e.g. the
    128-valued band of GrabCut/Berkeley GT). Ignore pixels are left out of every
    count, and the GT boundary / contour is computed with them as background,
    whatever ``gt`` holds there (§5: ``B_G = boundary(gt == 1)``).
    A RITM-style GT in {-1, 0, 1} is converted with :func:`split_ignore_label`.
  * Leading axes are batch axes. Every array function is wrapped in ``jax.jit``
    with ``dilation_ratio`` and ``width`` static (Python numbers), so eager
    calls compile once per shape; all compose with ``jit`` and ``vmap``.

Boundary width: ``d = max(1, round(dilation_ratio * sqrt(H^2 + W^2)))`` with
Python's round-half-to-even (:func:`boundary_width`), computed on the host from
the static image shape; ``width=`` overrides it.

Pixel counts are int32; ratios are float32. An empty denominator (e.g. both
masks empty for IoU/BIoU) gives ``empty_value`` (default NaN, the reference
wrappers' 0/0; pass 0.0 to emulate the COCO API / numba variants).

Trimap IoU and F-measure (§3, project convention): contour ``X_1 =
mask_to_boundary(X, width=1)`` (pixels with an 8-neighbour outside the mask or
the image); band ``X_d`` = ``X_1`` dilated by the (2d+1)^2 square.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxseg_robust.metrics.packed import boundary_band, ratio
from jaxseg_robust.ops.morphology import (
    as_binary_mask,
    check_radius,
    count_packed,
    dilate_packed,
    pack_rows,
    unpack_rows,
)

DEFAULT_DILATION_RATIO = 0.02


# ---- geometry helpers (host) ---------------------------------------------------

def check_dilation_ratio(dilation_ratio) -> None:
    """ValueError unless ``dilation_ratio`` (the band width relative to the image diagonal) is a finite number >= 0."""
    is_number = isinstance(dilation_ratio, (int, float, np.floating)) and not isinstance(dilation_ratio, bool)
    if not is_number or not math.isfinite(dilation_ratio) or dilation_ratio < 0:
        raise ValueError(f"dilation_ratio must be a finite number >= 0, got {dilation_ratio!r}")


def boundary_width(height: int, width: int, dilation_ratio: float = DEFAULT_DILATION_RATIO) -> int:
    """Boundary band width d in pixels for an ``height x width`` image (host-side Python).

    ``d = max(1, round(dilation_ratio * sqrt(height**2 + width**2)))`` with
    Python's round-half-to-even on a float64, exactly as the official API
    (e.g. 75x100 at 0.02 -> 2.5 -> 2).
    """
    for name, value in (("height", height), ("width", width)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
            raise ValueError(f"{name} must be a non-negative int, got {value!r}")
    check_dilation_ratio(dilation_ratio)
    diagonal = math.sqrt(float(height) ** 2 + float(width) ** 2)
    return max(int(round(dilation_ratio * diagonal)), 1)


def boundary_widths(sizes, dilation_ratio: float = DEFAULT_DILATION_RATIO) -> np.ndarray:
    """Per-instance band widths `boundary_width` of int [B, 2] (H, W) sizes (host): int32[B]."""
    sizes = np.asarray(sizes).reshape(-1, 2)
    return np.array([boundary_width(int(h), int(w), dilation_ratio) for h, w in sizes], np.int32)


def _resolve_width(shape, dilation_ratio: float, width: int | None) -> int:
    if width is not None:
        width = check_radius(width, "width")
        if width < 1:
            raise ValueError(f"width must be >= 1, got {width}")
        return width
    return boundary_width(shape[-2], shape[-1], dilation_ratio)


@functools.partial(jax.jit, static_argnames=("ignore_label",))
def split_ignore_label(gt_labels, ignore_label: int = -1) -> tuple[jnp.ndarray, jnp.ndarray]:
    """Splits a RITM-style GT map into (foreground, valid).

    Args:
      gt_labels: integer [..., H, W] with 1 = object, 0 = background,
        ``ignore_label`` = ignore (other values count as background, as in the
        reference ``gt == 1``).
      ignore_label: the ignore value (RITM: -1).

    Returns:
      (gt bool[..., H, W] = ``gt_labels == 1``, valid bool[..., H, W] = ``gt_labels != ignore_label``).
    """
    gt_labels = jnp.asarray(gt_labels)
    if not jnp.issubdtype(gt_labels.dtype, jnp.integer):
        raise ValueError(f"gt_labels must be an integer array, got dtype {gt_labels.dtype}")
    return gt_labels == 1, gt_labels != ignore_label


# ---- shared preparation (packed) ------------------------------------------------

class _Packed(NamedTuple):
    masks: jnp.ndarray  # uint32[..., 2, h, W]: packed GT (ignore pixels cleared) and prediction
    valid: jnp.ndarray  # uint32[..., h, W]
    shape: tuple  # static (..., H, W)

    @property
    def height(self) -> int:
        return self.shape[-2]

    @property
    def gt(self) -> jnp.ndarray:
        return self.masks[..., 0, :, :]

    @property
    def pred(self) -> jnp.ndarray:
        return self.masks[..., 1, :, :]


def _prepare(gt, pred, valid) -> _Packed:
    gt = as_binary_mask(gt, "gt")
    pred = as_binary_mask(pred, "pred")
    if gt.shape != pred.shape:
        raise ValueError(f"gt and pred must have the same shape, got {gt.shape} and {pred.shape}")
    if valid is None:
        valid = jnp.ones(gt.shape, dtype=bool)
    else:
        valid = jnp.asarray(valid)
        if valid.dtype != jnp.bool_:
            raise ValueError(f"valid must be a bool mask, got dtype {valid.dtype}")
        if valid.shape != gt.shape:
            raise ValueError(f"valid must have the shape of gt {gt.shape}, got {valid.shape}")
    valid_words = pack_rows(valid)
    # GT and prediction share one stacked array so each filter is traced once.
    masks = pack_rows(jnp.stack([gt & valid, pred], axis=-3))
    return _Packed(masks, valid_words, tuple(gt.shape))


def _prepare_with_width(gt, pred, valid, dilation_ratio: float, width: int | None) -> tuple[_Packed, int]:
    """The packed masks (`_prepare`) and the static band width d in pixels (`_resolve_width`)."""
    packed = _prepare(gt, pred, valid)
    return packed, _resolve_width(packed.shape, dilation_ratio, width)


def _boundary_words(words, width: int, height: int) -> jnp.ndarray:
    return boundary_band(words, int(width), height)


def _split(stacked) -> tuple[jnp.ndarray, jnp.ndarray]:
    return stacked[..., 0, :, :], stacked[..., 1, :, :]


def _iou_counts(packed: _Packed) -> tuple[jnp.ndarray, jnp.ndarray]:
    """int32 (|G AND P AND V|, |(G OR P) AND V|)."""
    inter = count_packed(packed.gt & packed.pred & packed.valid)
    union = count_packed((packed.gt | packed.pred) & packed.valid)
    return inter, union


# ---- boundary ------------------------------------------------------------------

@functools.partial(jax.jit, static_argnames=("dilation_ratio", "width"))
def mask_to_boundary(mask, *, dilation_ratio: float = DEFAULT_DILATION_RATIO, width: int | None = None) -> jnp.ndarray:
    """The official API's inner boundary band of a mask.

    ``B = M AND NOT erode_square(zero_pad(M), d)``: mask pixels within
    Chebyshev distance ``d`` of a background pixel or of the outside of the
    image (§1 closed form; identical to OpenCV ``erode`` 3x3 with
    ``iterations=d`` on the 1-pixel zero-padded mask).

    Args:
      mask: bool or integer [..., H, W] (non-zero = foreground; 0/1 and 0/255 both work).
      dilation_ratio: static float, d relative to the image diagonal (default 0.02).
      width: static int >= 1, overrides ``dilation_ratio`` (d in pixels).

    Returns:
      bool[..., H, W].
    """
    mask = as_binary_mask(mask)
    d = _resolve_width(mask.shape, dilation_ratio, width)
    height = mask.shape[-2]
    return unpack_rows(_boundary_words(pack_rows(mask), d, height), height)


# ---- IoU family ------------------------------------------------------------------

@jax.jit
def mask_iou(gt, pred, valid=None, *, empty_value: float = math.nan) -> jnp.ndarray:
    """Mask IoU ``|G AND P AND V| / |(G OR P) AND V|``.

    Args:
      gt, pred: bool or integer [..., H, W]; valid: optional bool [..., H, W]
        (see module doc).
      empty_value: result when the union is empty (default NaN).

    Returns:
      float32[...].
    """
    return ratio(*_iou_counts(_prepare(gt, pred, valid)), empty_value)


def _boundary_iou_packed(packed: _Packed, d: int, empty_value) -> jnp.ndarray:
    boundary_gt, boundary_pred = _split(_boundary_words(packed.masks, d, packed.height))
    inter = count_packed(boundary_gt & boundary_pred & packed.valid)
    union = count_packed((boundary_gt | boundary_pred) & packed.valid)
    return ratio(inter, union, empty_value)


@functools.partial(jax.jit, static_argnames=("dilation_ratio", "width"))
def boundary_iou(
    gt,
    pred,
    valid=None,
    *,
    dilation_ratio: float = DEFAULT_DILATION_RATIO,
    width: int | None = None,
    empty_value: float = math.nan,
) -> jnp.ndarray:
    """Boundary IoU ``|B_G AND B_P AND V| / |(B_G OR B_P) AND V|`` (§2, §5).

    ``B_X = mask_to_boundary(X, d)``; the GT boundary is formed with ignore
    pixels as background.

    Args:
      gt, pred: bool or integer [..., H, W]; valid: optional bool [..., H, W].
      dilation_ratio: static float, boundary width relative to the image diagonal.
      width: static int >= 1, the boundary width d in pixels (overrides the ratio).
      empty_value: result when both boundaries are empty (default NaN).

    Returns:
      float32[...].
    """
    packed, d = _prepare_with_width(gt, pred, valid, dilation_ratio, width)
    return _boundary_iou_packed(packed, d, empty_value)


@functools.partial(jax.jit, static_argnames=("dilation_ratio", "width"))
def min_iou_boundary_iou(
    gt,
    pred,
    valid=None,
    *,
    dilation_ratio: float = DEFAULT_DILATION_RATIO,
    width: int | None = None,
    empty_value: float = math.nan,
) -> jnp.ndarray:
    """``min(mask IoU, Boundary IoU)``, the Boundary AP / PQ similarity (§2).

    Each term is computed as in :func:`mask_iou` / :func:`boundary_iou` with
    ``empty_value`` substituted for an empty union; a NaN term makes the result NaN.

    Returns:
      float32[...].
    """
    packed, d = _prepare_with_width(gt, pred, valid, dilation_ratio, width)
    return jnp.minimum(ratio(*_iou_counts(packed), empty_value), _boundary_iou_packed(packed, d, empty_value))


def _trimap_iou_packed(packed: _Packed, band_gt, empty_value) -> jnp.ndarray:
    inter = count_packed(band_gt & packed.gt & packed.pred & packed.valid)
    union = count_packed(band_gt & (packed.gt | packed.pred) & packed.valid)
    return ratio(inter, union, empty_value)


@functools.partial(jax.jit, static_argnames=("dilation_ratio", "width"))
def trimap_iou(
    gt,
    pred,
    valid=None,
    *,
    dilation_ratio: float = DEFAULT_DILATION_RATIO,
    width: int | None = None,
    empty_value: float = math.nan,
) -> jnp.ndarray:
    """Trimap IoU ``|G_d AND G AND P| / |G_d AND (G OR P)|`` (§3; asymmetric).

    ``G_d`` is the GT contour dilated by the (2d+1)^2 square (a band of half
    width d on both sides of the contour); counts are restricted to ``valid``.

    Args:
      gt, pred, valid: see module doc.
      dilation_ratio, width: band half-width d (see :func:`boundary_iou`).
      empty_value: result when the denominator is empty (default NaN).

    Returns:
      float32[...].
    """
    packed, d = _prepare_with_width(gt, pred, valid, dilation_ratio, width)
    band_gt = dilate_packed(_boundary_words(packed.gt, 1, packed.height), d, packed.height)
    return _trimap_iou_packed(packed, band_gt, empty_value)


class BoundaryF(NamedTuple):
    """Approximate boundary F-measure (§3) and its two parts, each float32[...]."""

    f_measure: jnp.ndarray
    precision: jnp.ndarray
    recall: jnp.ndarray


def _contours_and_bands(packed: _Packed, d: int) -> tuple[jnp.ndarray, jnp.ndarray]:
    """Stacked [..., 2, h, W] contours (X_1) and bands (X_d) of GT and prediction."""
    contours = _boundary_words(packed.masks, 1, packed.height)
    return contours, dilate_packed(contours, d, packed.height)


def _boundary_f_packed(packed: _Packed, contours, bands) -> BoundaryF:
    # packed.gt has ignore pixels cleared, so its contour lies inside valid.
    contour_gt, contour_pred = _split(contours)
    band_gt, band_pred = _split(bands)
    counted_pred = contour_pred & packed.valid
    # 0/0 -> 1 gives the DAVIS-toolkit conventions of §3 for empty contours.
    precision = ratio(count_packed(counted_pred & band_gt), count_packed(counted_pred), 1.0)
    recall = ratio(count_packed(contour_gt & band_pred), count_packed(contour_gt), 1.0)
    total = precision + recall
    f = jnp.where(total > 0, 2.0 * precision * recall / jnp.where(total > 0, total, 1.0), 0.0)
    return BoundaryF(f, precision, recall)


@functools.partial(jax.jit, static_argnames=("dilation_ratio", "width"))
def boundary_f_measure(
    gt,
    pred,
    valid=None,
    *,
    dilation_ratio: float = DEFAULT_DILATION_RATIO,
    width: int | None = None,
) -> BoundaryF:
    """Approximate boundary F-measure with duplicate matches allowed (§3).

    ``p = |P_1 AND G_d| / |P_1|``, ``r = |G_1 AND P_d| / |G_1|``,
    ``F = 2 p r / (p + r)``; contours restricted to ``valid``. Empty contours:
    both empty -> p = r = 1; only ``P_1`` empty -> p = 1, r = 0; only ``G_1``
    empty -> p = 0, r = 1; ``F = 0`` when ``p + r = 0``.

    Args:
      gt, pred, valid: see module doc.
      dilation_ratio, width: matching tolerance d (see :func:`boundary_iou`).

    Returns:
      BoundaryF(f_measure, precision, recall), each float32[...].
    """
    packed, d = _prepare_with_width(gt, pred, valid, dilation_ratio, width)
    return _boundary_f_packed(packed, *_contours_and_bands(packed, d))


class MaskScores(NamedTuple):
    """Every score of this module for one (batch of) mask pair(s), each [...]."""

    iou: jnp.ndarray
    boundary_iou: jnp.ndarray
    min_iou_boundary_iou: jnp.ndarray
    trimap_iou: jnp.ndarray
    f_measure: jnp.ndarray
    precision: jnp.ndarray
    recall: jnp.ndarray
    intersection: jnp.ndarray  # int32 |G AND P AND V|
    union: jnp.ndarray  # int32 |(G OR P) AND V|


@functools.partial(jax.jit, static_argnames=("dilation_ratio", "width"))
def mask_scores(
    gt,
    pred,
    valid=None,
    *,
    dilation_ratio: float = DEFAULT_DILATION_RATIO,
    width: int | None = None,
    empty_value: float = math.nan,
) -> MaskScores:
    """All mask scores at once, sharing the packed masks and boundaries.

    Same arguments and results as :func:`mask_iou`, :func:`boundary_iou`,
    :func:`min_iou_boundary_iou`, :func:`trimap_iou` and
    :func:`boundary_f_measure` (one width d for the boundary band, the trimap
    band and the F tolerance).

    Returns:
      MaskScores of float32[...] scores and int32[...] counts.
    """
    packed, d = _prepare_with_width(gt, pred, valid, dilation_ratio, width)
    inter, union = _iou_counts(packed)
    iou = ratio(inter, union, empty_value)
    biou = _boundary_iou_packed(packed, d, empty_value)
    contours, bands = _contours_and_bands(packed, d)
    f = _boundary_f_packed(packed, contours, bands)
    return MaskScores(
        iou=iou,
        boundary_iou=biou,
        min_iou_boundary_iou=jnp.minimum(iou, biou),
        trimap_iou=_trimap_iou_packed(packed, _split(bands)[0], empty_value),
        f_measure=f.f_measure,
        precision=f.precision,
        recall=f.recall,
        intersection=inter,
        union=union,
    )


@functools.lru_cache(maxsize=None)
def batched_mask_scores(width: int):
    """`mask_scores` of B pairs with boundary width ``width`` px, jitted and vmapped (one compile per canvas).

    Returns:
      ``(gt bool[B, H, W], pred bool[B, H, W], valid bool[B, H, W]) -> MaskScores`` of [B] arrays.
    """
    return jax.jit(jax.vmap(functools.partial(mask_scores, width=width)))
