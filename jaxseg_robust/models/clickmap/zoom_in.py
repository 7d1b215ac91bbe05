"""isegm's ZoomIn, jittable at a fixed output size (docs/models/click_models.md, "Zoom-in").

The authors' ``ZoomIn`` (``isegm/inference/transforms/zoom_in.py``, identical
in RITM, SimpleClick and CFR-ICL) crops the image around the current
prediction and resizes the crop for the network; the prediction is resized
back and pasted into an empty canvas. With ``target_size`` a pair (SimpleClick
and CFR-ICL: (448, 448), (672, 672) on DAVIS; RITM's ``fixed<N>`` mode) the
crop always has the same shape, so the whole step is one static-shape
function here; the ROI is data. With ``skip_clicks=-1`` (those modes) it
applies from the first click, where the ROI is the whole image.

Per click (state: the ROI of the previous click, whether there is one, and
the previous probability map):

1. ``current``: if a previous prediction exists and ``prev > prob_thresh``
   (0.5) is not empty, its bounding box joined with the positive clicks,
   expanded by ``expansion_ratio`` (1.4) to at least ``min_crop_size`` (200)
   around its centre and clamped to the image; else the whole image.
2. The ROI becomes ``current`` when there is none, when a positive click lies
   outside it (``r < rmin or r >= rmax``, columns alike) or when the box IoU
   (1-pixel-inclusive segments) of ``current`` and the ROI is below
   ``recompute_thresh_iou`` (0.5); else it is kept.
3. Image, previous probability map and clicks are mapped into the crop
   (bilinear ``align_corners=True`` resize of rows ``rmin..rmax`` and
   columns ``cmin..cmax``; click row ``th (r - rmin) / (rmax - rmin + 1)``).
4. After the network, the probability map is resized back to the ROI
   (``align_corners=True``) and pasted into zeros.

Exactness: ``expand_bbox`` rounds ``centre -/+ 0.5 max(1.4 n, 200)`` with
Python's ``round`` in float64, where ``1.4 n`` is rarely exact; `expand_bounds`
reproduces that float64 arithmetic bit for bit with integer tables built on
the host (float64 is not available inside jit by default). The box-IoU test
is done in exact integer arithmetic (the authors' float64 product of two
ratios can differ only when it is exactly 0.5).
"""

from __future__ import annotations

import dataclasses
import functools
from fractions import Fraction

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from jaxseg_robust.prompts.types import POSITIVE_LABEL

_NEAR_TIE = Fraction(1, 1 << 20)
_ALWAYS = -(1 << 20)


@dataclasses.dataclass(frozen=True)
class ZoomInConfig:
    """isegm ``ZoomIn`` settings (defaults: SimpleClick's and CFR-ICL's evaluation).

    Attributes:
      target_hw: (h, w) the crop is resized to (static).
      skip_clicks: -1 (zoom from the first click; the authors' SimpleClick/CFR-ICL
        default and RITM's ``fixed<N>`` mode), or with ``native_crop`` a count
        ``n >= 0``: while at most ``n`` clicks are given, or no previous
        prediction exceeds ``prob_thresh``, the zoom is skipped (the whole
        image) and its ROI forgotten (GPCIS's ``ZoomIn``).
      native_crop: GPCIS's ``ZoomIn``, which crops at the image's resolution
        and leaves the resize to ``target_hw`` to the ``ResizeTrans`` after it
        (every input, the skipped zoom's whole image included); the composition
        is the same crop-and-resize to ``target_hw``.
      expansion_ratio: box expansion around the prediction.
      min_crop_size: minimal crop side before clamping.
      recompute_thresh_iou: keep the previous ROI while its box IoU with the
        new one is at least this.
      prob_thresh: the prediction's threshold for the ROI (0.5, not 0.49).
    """

    target_hw: tuple[int, int] = (448, 448)
    skip_clicks: int = -1
    expansion_ratio: float = 1.4
    min_crop_size: int = 200
    recompute_thresh_iou: float = 0.5
    prob_thresh: float = 0.5
    native_crop: bool = False

    def __post_init__(self):
        object.__setattr__(self, "target_hw", (int(self.target_hw[0]), int(self.target_hw[1])))
        if self.native_crop and self.skip_clicks < -1:
            raise ValueError(f"ZoomInConfig.skip_clicks must be -1 or a click count >= 0; got {self.skip_clicks}")
        if self.skip_clicks != -1 and not self.native_crop:
            raise ValueError(
                f"ZoomInConfig.skip_clicks={self.skip_clicks} is not supported: the jittable "
                f"zoom-in runs every click on the fixed target size (skip_clicks=-1, the "
                f"authors' SimpleClick/CFR-ICL default and RITM's fixed<N> mode); RITM's "
                f"'cvpr' mode (first click at native size, aspect-preserving crops) has "
                f"data-dependent shapes")
        if min(self.target_hw) < 2:
            raise ValueError(f"target_hw must be at least 2x2; got {self.target_hw}")
        if not 0 < self.recompute_thresh_iou <= 1:
            raise ValueError(f"recompute_thresh_iou must be in (0, 1]; got "
                             f"{self.recompute_thresh_iou}")


@flax.struct.dataclass
class ZoomState:
    """The zoom-in's memory between clicks.

    Attributes:
      roi: i32[4] (rmin, rmax, cmin, cmax), inclusive, of the last crop.
      has_roi: bool[] whether ``roi`` is set.
    """

    roi: jnp.ndarray
    has_roi: jnp.ndarray

    @classmethod
    def empty(cls) -> ZoomState:
        return cls(roi=jnp.zeros((4,), jnp.int32), has_roi=jnp.asarray(False))


# ---- expand_bbox, emulating float64 exactly -------------------------------------------

def _tie_entry(g: Fraction) -> tuple[int, int, int, int]:
    """Rounding data for ``B + g`` (B integer, g in [-0.5, 1.5]): (offset, near_tie, tie_low, tie_e).

    Away from a tie the rounded value is ``B + offset``. Near a tie point
    ``B + tie_low + 0.5`` the float64 subtraction collapses onto the tie (then
    half-to-even applies) iff floor(log2 T) >= tie_e; otherwise the sign of
    ``g - tie`` decides, folded into ``offset``.
    """
    for half in (Fraction(-1, 2), Fraction(1, 2), Fraction(3, 2)):
        delta = g - half
        if abs(delta) < _NEAR_TIE:
            low = int(half - Fraction(1, 2))
            if delta == 0:
                return low, 1, low, _ALWAYS
            e = 0
            while Fraction(2) ** (e - 53) < abs(delta):
                e += 1
            while Fraction(2) ** (e - 54) >= abs(delta):
                e -= 1
            return low + (1 if delta > 0 else 0), 1, low, e
    return int(np.floor(g + Fraction(1, 2))), 0, 0, 0


@functools.lru_cache(maxsize=32)
def expand_tables(max_side: int, ratio: float, min_size: int) -> np.ndarray:
    """Host tables of `expand_bounds` for box sides n = 1..max_side.

    Returns:
      int32[max_side + 1, 2 (lower/upper bound), 2 (parity of lo + hi), 5]:
      (q, offset, near_tie, tie_low, tie_e) with q the integer part of the
      half-extent, so that the bound is ``(lo + hi) // 2 -/+ q`` plus the
      rounding data of `_tie_entry`.
    """
    out = np.zeros((max_side + 1, 2, 2, 5), np.int32)
    for n in range(1, max_side + 1):
        extent = ratio * n
        extent = max(extent, min_size)
        half = Fraction(extent) / 2
        q = int(np.floor(half + Fraction(1, 2)))
        f = half - q
        for parity in (0, 1):
            s = Fraction(parity, 2)
            out[n, 0, parity] = (q,) + _tie_entry(s - f)
            out[n, 1, parity] = (q,) + _tie_entry(s + f)
    return out


def _bit_length(x: jnp.ndarray) -> jnp.ndarray:
    """Number of bits of a positive int32 (32 - clz)."""
    return 32 - jax.lax.clz(jnp.maximum(x, 1).astype(jnp.int32))


def _round_bound(base: jnp.ndarray, entry: jnp.ndarray) -> jnp.ndarray:
    """``round(B + g)`` in float64 semantics from a table entry (see `_tie_entry`)."""
    _, offset, near, low, tie_e = (entry[i] for i in range(5))
    lower = base + low
    t_exp = _bit_length(2 * lower + 1) - 2  # floor(log2(lower + 0.5)) for lower >= 0
    collapsed = (near == 1) & (t_exp >= tie_e)
    half_even = lower + (lower % 2)
    return jnp.where(collapsed, half_even, base + offset)


def expand_bounds(lo: jnp.ndarray, hi: jnp.ndarray, tables: jnp.ndarray) -> tuple:
    """isegm ``expand_bbox`` along one axis: (lo, hi) inclusive -> expanded (lo', hi') (unclamped).

    ``lo' = round(c - 0.5 max(r n, m))``, ``hi' = round(c + 0.5 max(r n, m))``
    with ``c = (lo + hi) / 2``, ``n = hi - lo + 1``, float64 and Python's
    round-half-to-even, exactly.
    """
    n = jnp.clip(hi - lo + 1, 1, tables.shape[0] - 1)
    k = lo + hi
    parity = k % 2
    centre = k // 2
    entry_lo = tables[n, 0, parity]
    entry_hi = tables[n, 1, parity]
    new_lo = _round_bound(centre - entry_lo[0], entry_lo)
    new_hi = _round_bound(centre + entry_hi[0], entry_hi)
    return new_lo, new_hi


# ---- the ROI -----------------------------------------------------------------------------

def object_roi(prev_prob: jnp.ndarray, points: jnp.ndarray, labels: jnp.ndarray,
               original_hw: jnp.ndarray, config: ZoomInConfig):
    """isegm ``get_object_roi``: (roi i32[4], found bool[]) from the previous prediction.

    Args:
      prev_prob: f32[Hf, Wf] previous probability map (zeros outside the image).
      points: f32[N, 2] clicks (x, y) in original pixels; labels i32[N].
      original_hw: i32[2] image size inside the frame.
      config: the zoom-in settings.

    Returns:
      roi (rmin, rmax, cmin, cmax) expanded and clamped to the image, and
      whether ``prev_prob > prob_thresh`` had any pixel (else the roi is unused).
    """
    hf, wf = prev_prob.shape
    mask = prev_prob > config.prob_thresh
    found = jnp.any(mask)
    rows = jnp.any(mask, axis=1)
    cols = jnp.any(mask, axis=0)
    big = jnp.int32(1 << 30)
    r_idx = jnp.arange(hf, dtype=jnp.int32)
    c_idx = jnp.arange(wf, dtype=jnp.int32)
    rmin = jnp.min(jnp.where(rows, r_idx, big))
    rmax = jnp.max(jnp.where(rows, r_idx, -1))
    cmin = jnp.min(jnp.where(cols, c_idx, big))
    cmax = jnp.max(jnp.where(cols, c_idx, -1))
    positive = labels == POSITIVE_LABEL
    pr = jnp.trunc(points[:, 1]).astype(jnp.int32)
    pc = jnp.trunc(points[:, 0]).astype(jnp.int32)
    rmin = jnp.minimum(rmin, jnp.min(jnp.where(positive, pr, big)))
    rmax = jnp.maximum(rmax, jnp.max(jnp.where(positive, pr, -1)))
    cmin = jnp.minimum(cmin, jnp.min(jnp.where(positive, pc, big)))
    cmax = jnp.maximum(cmax, jnp.max(jnp.where(positive, pc, -1)))
    tables = jnp.asarray(expand_tables(max(hf, wf), float(config.expansion_ratio),
                                       int(config.min_crop_size)))
    rmin, rmax = expand_bounds(rmin, rmax, tables)
    cmin, cmax = expand_bounds(cmin, cmax, tables)
    h, w = original_hw[0], original_hw[1]
    roi = jnp.stack([jnp.maximum(rmin, 0), jnp.minimum(rmax, h - 1),
                     jnp.maximum(cmin, 0), jnp.minimum(cmax, w - 1)]).astype(jnp.int32)
    return roi, found


def _segments_iou_parts(a, b, c, d):
    inter = jnp.maximum(0, jnp.minimum(b, d) - jnp.maximum(a, c) + 1)
    union = jnp.maximum(1, jnp.maximum(b, d) - jnp.minimum(a, c) + 1)
    return inter, union


def box_iou_below(b1: jnp.ndarray, b2: jnp.ndarray, threshold: float) -> jnp.ndarray:
    """isegm ``get_bbox_iou(b1, b2) < threshold`` for (rmin, rmax, cmin, cmax) boxes (exact)."""
    ih, uh = _segments_iou_parts(b1[0], b1[1], b2[0], b2[1])
    iw, uw = _segments_iou_parts(b1[2], b1[3], b2[2], b2[3])
    thr = Fraction(threshold).limit_denominator(1 << 16)
    return ih * iw * thr.denominator < uh * uw * thr.numerator


def clicks_inside(roi: jnp.ndarray, points: jnp.ndarray, labels: jnp.ndarray) -> jnp.ndarray:
    """isegm ``check_object_roi``: every positive click has ``rmin <= r < rmax`` and ``cmin <= c < cmax``."""
    r, c = points[:, 1], points[:, 0]
    ok = (r >= roi[0]) & (r < roi[1]) & (c >= roi[2]) & (c < roi[3])
    return jnp.all(ok | (labels != POSITIVE_LABEL))


def update_roi(state: ZoomState, prev_prob: jnp.ndarray, has_prev: jnp.ndarray,
               points: jnp.ndarray, labels: jnp.ndarray, original_hw: jnp.ndarray,
               config: ZoomInConfig) -> ZoomState:
    """Steps 1-2 of the module docstring: the ROI used for this click.

    With ``skip_clicks >= 0`` (``native_crop``) a skipped zoom (at most that
    many clicks, or no previous prediction above the threshold) uses the
    whole image and leaves no ROI (``has_roi`` false), so the next zoom takes
    its ``current`` box; the authors' ``ZoomIn`` returns before touching its
    ROI there (docs/models/gpcis.md)."""
    roi, found = object_roi(prev_prob, points, labels, original_hw, config)
    whole = jnp.stack([0, original_hw[0] - 1, 0, original_hw[1] - 1]).astype(jnp.int32)
    current = jnp.where(has_prev & found, roi, whole)
    update = (~state.has_roi) | (~clicks_inside(state.roi, points, labels)) | \
        box_iou_below(current, state.roi, config.recompute_thresh_iou)
    kept = ZoomState(roi=jnp.where(update, current, state.roi), has_roi=jnp.asarray(True))
    if config.skip_clicks < 0:
        return kept
    skipped = (jnp.sum(labels >= 0) <= config.skip_clicks) | ~(has_prev & found)
    return ZoomState(roi=jnp.where(skipped, whole, kept.roi), has_roi=~skipped)


# ---- crop, clicks, paste -------------------------------------------------------------------

def _crop_taps(start: jnp.ndarray, length: jnp.ndarray, out_len: int):
    """align_corners=True taps from ``length`` source samples at ``start`` to ``out_len`` outputs."""
    scale = jnp.where(out_len > 1, (length - 1).astype(jnp.float32) / jnp.float32(out_len - 1),
                      jnp.float32(0))
    src = scale * jnp.arange(out_len, dtype=jnp.float32)
    i0 = jnp.minimum(jnp.floor(src).astype(jnp.int32), length - 1)
    lam = jnp.clip(src - i0.astype(jnp.float32), 0.0, 1.0)
    i1 = jnp.where(i0 < length - 1, i0 + 1, i0)
    return start + i0, start + i1, lam


def _resample(x: jnp.ndarray, axis: int, i0, i1, lam) -> jnp.ndarray:
    shape = [1] * x.ndim
    shape[axis] = lam.shape[0]
    lam = lam.reshape(shape)
    return jnp.take(x, i0, axis=axis) * (1 - lam) + jnp.take(x, i1, axis=axis) * lam


def crop_resize(x: jnp.ndarray, roi: jnp.ndarray, target_hw: tuple[int, int]) -> jnp.ndarray:
    """isegm ``get_roi_image_nd``: rows rmin..rmax, cols cmin..cmax of f32[Hf, Wf, C] ->
    f32[th, tw, C] (bilinear, ``align_corners=True``, width first)."""
    c0, c1, lc = _crop_taps(roi[2], roi[3] - roi[2] + 1, target_hw[1])
    x = _resample(x, 1, c0, c1, lc)
    r0, r1, lr = _crop_taps(roi[0], roi[1] - roi[0] + 1, target_hw[0])
    return _resample(x, 0, r0, r1, lr)


def crop_clicks(points: jnp.ndarray, roi: jnp.ndarray, target_hw: tuple[int, int]) -> jnp.ndarray:
    """Clicks (x, y) -> crop coordinates ``t (v - vmin) / (vmax - vmin + 1)`` per axis (f32)."""
    th, tw = target_hw
    h = (roi[1] - roi[0] + 1).astype(jnp.float32)
    w = (roi[3] - roi[2] + 1).astype(jnp.float32)
    y = (th * (points[:, 1] - roi[0].astype(jnp.float32))) / h
    x = (tw * (points[:, 0] - roi[2].astype(jnp.float32))) / w
    return jnp.stack([x, y], axis=-1)


def paste_back(prob: jnp.ndarray, roi: jnp.ndarray, frame_hw: tuple[int, int]) -> jnp.ndarray:
    """isegm ``ZoomIn.inv_transform``: f32[th, tw] -> the ROI's size (``align_corners=True``),
    pasted into zeros of the frame f32[Hf, Wf]."""
    th, tw = prob.shape
    hf, wf = frame_hw

    def taps(start, length, out_len, in_len):
        o = jnp.arange(out_len, dtype=jnp.int32) - start
        inside = (o >= 0) & (o < length)
        scale = jnp.where(length > 1, jnp.float32(in_len - 1) / (length - 1).astype(jnp.float32),
                          jnp.float32(0))
        src = scale * jnp.clip(o, 0, None).astype(jnp.float32)
        i0 = jnp.minimum(jnp.floor(src).astype(jnp.int32), in_len - 1)
        lam = jnp.clip(src - i0.astype(jnp.float32), 0.0, 1.0)
        i1 = jnp.where(i0 < in_len - 1, i0 + 1, i0)
        return i0, i1, lam, inside

    c0, c1, lc, cin = taps(roi[2], roi[3] - roi[2] + 1, wf, tw)
    x = _resample(prob, 1, c0, c1, lc)
    r0, r1, lr, rin = taps(roi[0], roi[1] - roi[0] + 1, hf, th)
    x = _resample(x, 0, r0, r1, lr)
    return jnp.where(rin[:, None] & cin[None, :], x, 0.0)
