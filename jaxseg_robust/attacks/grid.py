"""Exhaustive prompt grids: TETRIS per-pixel click heatmaps and BREPS centred (h, w) box heatmaps.

Spec: docs/protocols/grids.md §5.1 (click grid), §5.2 (centred box
grid, C-B heatmaps/comp_hw.py), §5.3 (corner heatmap, draw_heatmaps.py), §2.3
(SAM input pipeline), §6 (Boundary IoU), §7.

Click grid (`click_grid`, one image; vmap it over instances):
  * one click at every integer pixel ``(row, col)`` of a stride grid
    (``rows = 0, s, 2s, ... < Hf``, same for columns) of the instance's frame,
    fed to SAM as ``(x, y) = (col, row)`` in evaluation-frame pixels (the
    segmenter maps them with ``(sx, sy)``; SAM adds +0.5 itself, §2.3.2);
  * first-click grid (§5.1): a positive click, no mask input, multimask +
    argmax of the predicted IoU; optionally a *prefix* of fixed clicks (and
    its mask input) before the grid click — the second-round grid that TETRIS
    calls (H W)^2 work becomes H W work once the first click is fixed (here the
    baseline first click, see `make_click_grid_batch_fn`);
  * metrics of ``P > thr`` (``P = sigmoid(logits)`` at the evaluation frame,
    as the TETRIS attack scores its iterates) against G: IoU and Boundary IoU
    with ignore pixels excluded, NaN on an empty union (§3.5 / §6);
  * heatmaps ``[ceil(Hf / s), ceil(Wf / s)]`` indexed like the positions;
    NaN (and ``evaluated`` false) outside the image and outside the optional
    region (e.g. the object, or the error region of the prefix's prediction).

Box grid (`box_grid`, §5.2): centre ``cx = (x2 - x1) // 2 + x1``, ``cy = (y2 -
y1) // 2 + y1`` of the inclusive tight box of G+ (empty -> (0, 0, 1, 1)); for
``h = 0 .. 2H`` and ``w = 0 .. 2W`` (step ``stride``; H, W = the image size)
the box ``x1 = cx - w // 2``, ``x2 = cx + (w + 1) // 2``, ``y1 = cy - h // 2``,
``y2 = cy + (h + 1) // 2``, clipped to ``[0, W - 1] x [0, H - 1]``. Clipped
boxes repeat: along one axis the clipped intervals form a monotone path that
visits exactly ``W`` distinct intervals (one end moves per step until it hits
the border), so the reference's deduplicated box list has exactly ``H W``
boxes at stride 1. Only distinct boxes are decoded (``min(#sizes, Hf) x
min(#sizes, Wf)`` slots, the unused ones skipped); the ``(h, w)`` heatmap
``[len(heights), len(widths)]`` gathers them back. Single-mask output and the
boolean mask ``logit > 0`` (§2.4, §7.1). Scores per box: ``iou`` / ``biou``
(evaluation frame, ignore excluded, NaN on an empty union) and
``iou_reference`` (the script's ``inter / (union + 1e-6)`` with ignore pixels
counted as background; the script binarises the raw grey mask, so for
GrabCut/Berkeley it would count the 128 band as object — here G+ is used).
Differences from comp_hw.py: no squashing of images whose sides both exceed
1024 (that is a loader decision: squash the instance before the grid to
reproduce it); the image path is the segmenter's (``SamSegmenter(...,
image_resize="pil")`` is the script's uint8 ``set_image`` path).

Corner heatmap (`corner_heatmap`, §5.3): every distinct box with positive
width and height adds its score to its four corner pixels; heat = sum / count,
0 where no corner lands (evaluation-frame boxes, so the script's round trip
through the resized frame is the identity).

Evaluation is chunked: the grid's candidate positions (boxes) are compacted
(``jnp.nonzero`` with a static size) and decoded ``chunk_size`` at a time
(``vmap`` of the decoder inside a ``fori_loop`` whose trip count is the
instance's own number of candidates), so memory is bounded by ``chunk_size``
decodes and restricted grids cost only their candidates. The image is
embedded once per instance. Results do not depend on ``chunk_size`` beyond
float reassociation inside XLA's batched kernels (in practice identical;
tested).

Batch adapters (`make_click_grid_batch_fn`, `make_box_grid_batch_fn`) map a
`PaddedBatch` to per-instance dicts for `jaxseg_robust.runner.engine.run`,
with one trace per bucket (the ``traces`` counter), as `attacks.boxes`.
Memory there is ~ batch size x chunk_size decodes (instances are vmapped).
"""

from __future__ import annotations

import dataclasses
import math

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxseg_robust.attacks.batching import check_batch, low_res_shape, place_like, preprocess_slots, stack_trees
from jaxseg_robust.attacks.boxes import box_prompts
from jaxseg_robust.attacks.scoring import IGNORE_LABEL, boundary_widths, image_region
from jaxseg_robust.metrics.masks import DEFAULT_DILATION_RATIO
from jaxseg_robust.models.base import Transform
from jaxseg_robust.ops.boxes import tight_box
from jaxseg_robust.ops.morphology import count_packed, erode_packed, pack_rows
from jaxseg_robust.prompts.clicker import error_masks, mark_clicked, next_click
from jaxseg_robust.prompts.types import NEGATIVE_LABEL, POSITIVE_LABEL, Prompts

DEFAULT_STRIDE = 1
DEFAULT_CHUNK_SIZE = 64
DEFAULT_THRESHOLD = 0.5
REFERENCE_IOU_EPS = 1e-6  # comp_hw.py: inter / (union + 1e-6)
CLICK_REGIONS = ("image", "object", "error")
CLICK_PREFIXES = ("none", "baseline")


# ---- scores of many predictions against one GT --------------------------------------

@flax.struct.dataclass
class GridTarget:
    """Packed GT pieces of one instance, reused by every grid position (uint32 words, `pack_rows`).

    Attributes:
      target: G+ within the image.
      target_band: its Boundary IoU band (width d).
      region: the image pixels of the frame.
      labelled: image pixels with gt != -1.
    """

    target: jnp.ndarray
    target_band: jnp.ndarray
    region: jnp.ndarray
    labelled: jnp.ndarray


@flax.struct.dataclass
class GridScores:
    """Scores of one binary prediction (each f32[]).

    Attributes:
      iou, biou: ignore pixels excluded, NaN on an empty union.
      iou_reference: ``|P & G+| / (|P | G+| + 1e-6)`` over the image, ignore
        pixels counted as background (the box-grid script's IoU).
    """

    iou: jnp.ndarray
    biou: jnp.ndarray
    iou_reference: jnp.ndarray


def _band(words, width, height: int):
    """Packed inner boundary band: ``words & ~erode^width(words)`` (3x3 square, outside = 0; width traced)."""
    eroded = lax.fori_loop(0, width, lambda _, w: erode_packed(w, 1, height), words)
    return words & ~eroded


def grid_target(gt, region, width) -> GridTarget:
    """Packs the GT of one instance for `grid_scores`.

    Args:
      gt: int [Hf, Wf] 1 object / 0 background / -1 ignore.
      region: bool[Hf, Wf] the image's pixels in the frame.
      width: i32[] Boundary IoU band width d (may be traced; `attacks.scoring.boundary_widths`).

    Returns:
      `GridTarget`.
    """
    gt = jnp.asarray(gt)
    region = jnp.asarray(region, bool)
    if gt.ndim != 2 or region.shape != gt.shape:
        raise ValueError(f"gt and region must be equal [H, W]; got {gt.shape}, {region.shape}")
    target = pack_rows((gt == 1) & region)
    return GridTarget(target=target, target_band=_band(target, jnp.asarray(width, jnp.int32), gt.shape[0]),
                      region=pack_rows(region), labelled=pack_rows(region & (gt != IGNORE_LABEL)))


def _ratio(numerator, denominator, empty_value: float):
    numerator = numerator.astype(jnp.float32)
    denominator = denominator.astype(jnp.float32)
    safe = jnp.where(denominator > 0, denominator, 1.0)
    return jnp.where(denominator > 0, numerator / safe, jnp.float32(empty_value))


def grid_scores(pred, target: GridTarget, width) -> GridScores:
    """IoU, Boundary IoU and the reference IoU of one prediction (pure; vmap over predictions).

    Args:
      pred: bool[Hf, Wf] predicted mask (pixels outside the image are ignored).
      target: `grid_target` of the instance.
      width: i32[] Boundary IoU band width (the one ``target`` was made with).

    Returns:
      `GridScores`; ``iou``/``biou`` equal `metrics.masks.mask_iou` /
      ``boundary_iou`` of the image crop with ``valid = gt != -1``.
    """
    pred = jnp.asarray(pred, bool)
    height = pred.shape[-2]
    width = jnp.asarray(width, jnp.int32)
    words = pack_rows(pred) & target.region
    band = _band(words, width, height)
    inter = count_packed(words & target.target & target.labelled)
    union = count_packed((words | target.target) & target.labelled)
    band_inter = count_packed(band & target.target_band & target.labelled)
    band_union = count_packed((band | target.target_band) & target.labelled)
    ref_inter = count_packed(words & target.target).astype(jnp.float32)
    ref_union = count_packed(words | target.target).astype(jnp.float32)
    return GridScores(iou=_ratio(inter, union, math.nan), biou=_ratio(band_inter, band_union, math.nan),
                      iou_reference=ref_inter / (ref_union + jnp.float32(REFERENCE_IOU_EPS)))


# ---- chunked evaluation of a compacted candidate list ----------------------------------

def evaluate_candidates(evaluate, candidates, chunk_size: int):
    """Evaluates ``evaluate(i)`` at every flat index i where ``candidates`` is true, ``chunk_size`` at a time.

    The true indices are compacted (row-major order) and evaluated in chunks
    of ``chunk_size`` (``vmap``) inside a ``fori_loop`` that runs
    ``ceil(count / chunk_size)`` times (a traced count: restricted grids cost
    only their candidates; under ``vmap`` the loop runs to the batch's
    largest count). Pure and jit/vmap-safe.

    Args:
      evaluate: ``i32[] -> pytree of f32[...]`` (closed over everything else).
      candidates: bool[...] which flat indices to evaluate (P = its size).
      chunk_size: static positive int, evaluations per chunk.

    Returns:
      The pytree of ``evaluate`` with a leading axis P; NaN at non-candidates.
    """
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive int; got {chunk_size!r}")
    candidates = jnp.asarray(candidates, bool).reshape(-1)
    total = candidates.shape[0]
    slots = -(-total // chunk_size) * chunk_size
    (order,) = jnp.nonzero(candidates, size=slots, fill_value=total)
    order = order.astype(jnp.int32)
    count = jnp.sum(candidates, dtype=jnp.int32)
    n_chunks = (count + chunk_size - 1) // chunk_size
    shapes = jax.eval_shape(evaluate, jnp.zeros((), jnp.int32))
    init = jax.tree.map(lambda s: jnp.full((total,) + s.shape, jnp.nan, s.dtype), shapes)

    def body(chunk, out):
        index = lax.dynamic_slice(order, (chunk * chunk_size,), (chunk_size,))
        values = jax.vmap(evaluate)(jnp.minimum(index, total - 1))
        return jax.tree.map(lambda o, v: o.at[index].set(v, mode="drop"), out, values)

    return lax.fori_loop(0, n_chunks, body, init)


@flax.struct.dataclass
class Extremes:
    """Minimum and maximum of a heatmap over its finite cells (each field f32[] or i32[]).

    Attributes:
      min, max: NaN when no cell is finite.
      argmin, argmax: flat index of the first minimum / maximum in row-major
        order (-1 when no cell is finite).
    """

    min: jnp.ndarray
    max: jnp.ndarray
    argmin: jnp.ndarray
    argmax: jnp.ndarray


def heatmap_extremes(heatmap) -> Extremes:
    """Row-major-first extremes of a heatmap ignoring NaN (pure; jit/vmap-safe).

    Args:
      heatmap: f32[...] (NaN = not evaluated / undefined).

    Returns:
      `Extremes` with flat indices into ``heatmap``.
    """
    flat = jnp.asarray(heatmap, jnp.float32).reshape(-1)
    finite = ~jnp.isnan(flat)
    any_finite = jnp.any(finite)
    argmin = jnp.argmin(jnp.where(finite, flat, jnp.inf)).astype(jnp.int32)
    argmax = jnp.argmax(jnp.where(finite, flat, -jnp.inf)).astype(jnp.int32)
    return Extremes(min=jnp.where(any_finite, flat[argmin], jnp.nan),
                    max=jnp.where(any_finite, flat[argmax], jnp.nan),
                    argmin=jnp.where(any_finite, argmin, -1), argmax=jnp.where(any_finite, argmax, -1))


# ---- click grid ------------------------------------------------------------------------

def grid_axis(frame_size: int, stride: int) -> np.ndarray:
    """int32[ceil(frame_size / stride)]: pixel indices 0, stride, 2 stride, ... < frame_size (host, static)."""
    _check_stride(stride)
    return np.arange(0, int(frame_size), stride, dtype=np.int32)


def _check_stride(stride) -> None:
    if isinstance(stride, bool) or not isinstance(stride, (int, np.integer)) or stride < 1:
        raise ValueError(f"stride must be a positive int; got {stride!r}")


def _check_frame(gt, transform: Transform) -> None:
    if transform.frame_hw is None:
        raise ValueError("transform.frame_hw must be set (SamSegmenter.preprocess sets it)")
    if tuple(gt.shape) != tuple(transform.frame_hw):
        raise ValueError(f"gt must have the transform's frame shape {tuple(transform.frame_hw)}; got {gt.shape}")


def _binarise(logits, thr: float):
    """``sigmoid(logits) > thr`` as the attacks score their iterates (thr static)."""
    return jax.nn.sigmoid(logits) > thr


def append_click(prefix: Prompts, point, label) -> Prompts:
    """``prefix`` with one more point slot holding ``point`` (x, y) and ``label`` (both may be traced).

    Args:
      prefix: one `Prompts` with N slots (its box and mask input are kept).
      point: f32[2] (x, y) in evaluation-frame pixels.
      label: i32[] 1 positive / 0 negative.

    Returns:
      `Prompts` with N + 1 slots; the new click is the last point (§2.3.2:
      the current click is the last point).
    """
    point = jnp.asarray(point, jnp.float32).reshape(1, 2)
    label = jnp.asarray(label, jnp.int32).reshape(1)
    return prefix.replace(points=jnp.concatenate([prefix.points, point], axis=0),
                          labels=jnp.concatenate([prefix.labels, label], axis=0))


def empty_prefix(mask_shape: tuple[int, int]) -> Prompts:
    """A `Prompts` with no point slot, no box and no mask input (the first-click grid's prefix)."""
    return Prompts(points=jnp.zeros((0, 2), jnp.float32), labels=jnp.zeros((0,), jnp.int32),
                   box=jnp.zeros((4,), jnp.float32), has_box=jnp.asarray(False),
                   mask_logits=jnp.zeros(mask_shape, jnp.float32), has_mask=jnp.asarray(False))


@flax.struct.dataclass
class ClickGridResult:
    """Heatmaps of one instance's click grid (add a leading axis when vmapped). Gh, Gw = grid size.

    Attributes:
      iou, biou: f32[Gh, Gw] scores of the click at ``(rows[i], cols[j])``;
        NaN where not evaluated (outside the image or the region) or undefined.
      evaluated: bool[Gh, Gw] the positions that were decoded.
      rows, cols: i32[Gh], i32[Gw] pixel coordinates of the grid (frame).
      n_evaluated: i32[] number of decoded positions.
      iou_extremes, biou_extremes: `Extremes` of the heatmaps (flat indices
        into [Gh, Gw]; `flat_to_click` maps them to (row, col)).
      extra_iou, extra_biou: f32[K] scores of the ``extra_clicks``.
    """

    iou: jnp.ndarray
    biou: jnp.ndarray
    evaluated: jnp.ndarray
    rows: jnp.ndarray
    cols: jnp.ndarray
    n_evaluated: jnp.ndarray
    iou_extremes: Extremes
    biou_extremes: Extremes
    extra_iou: jnp.ndarray
    extra_biou: jnp.ndarray


def flat_to_click(flat_index, rows, cols):
    """i32[2] (row, col) pixel of a flat grid index (-1 -> (-1, -1)).

    Args:
      flat_index: i32[] index into the [len(rows), len(cols)] grid.
      rows, cols: the grid's pixel coordinates.
    """
    n_cols = cols.shape[-1]
    i = jnp.maximum(flat_index, 0)
    click = jnp.stack([rows[i // n_cols], cols[i % n_cols]]).astype(jnp.int32)
    return jnp.where(flat_index >= 0, click, -1)


def click_grid(segmenter, params, features, transform: Transform, gt, width, *, region=None,
               prefix: Prompts | None = None, click_label=POSITIVE_LABEL, extra_clicks=None,
               stride: int = DEFAULT_STRIDE,
               chunk_size: int = DEFAULT_CHUNK_SIZE, thr: float = DEFAULT_THRESHOLD,
               multimask_output: bool = True) -> ClickGridResult:
    """IoU / BIoU heatmaps of one click at every grid pixel of one instance (pure; jit it, vmap it).

    Args:
      segmenter: a SAM-family Segmenter (static, closed over).
      params: its parameters.
      features: the instance's cached image features (one image).
      transform: its `Transform` (``frame_hw`` = the frame of ``gt``).
      gt: int [Hf, Wf] 1 / 0 / -1 (outside the image: ignored via the transform).
      width: i32[] Boundary IoU band width of the image (`attacks.scoring.boundary_widths`).
      region: optional bool[Hf, Wf]: only positions inside it are decoded
        (always intersected with the image).
      prefix: optional `Prompts` of fixed earlier clicks (and mask input);
        the grid click is appended as the last point. None = first click
        (no other point, no mask input).
      click_label: i32[] label of the grid click (1 positive, 0 negative; may be traced).
      extra_clicks: optional [K, 2] (row, col) clicks (float allowed) scored
        in the same loop as the grid (e.g. the baseline click off the stride
        grid), with the same prefix and label.
      stride: static grid step in pixels (rows/cols 0, s, 2s, ...).
      chunk_size: static number of positions decoded together (memory bound).
      thr: static probability threshold (``sigmoid(logits) > thr``).
      multimask_output: static; True = 3 candidates + argmax predicted IoU (§5.1).

    Returns:
      `ClickGridResult`.
    """
    gt = jnp.asarray(gt)
    _check_frame(gt, transform)
    _check_stride(stride)
    frame_h, frame_w = transform.frame_hw
    rows = jnp.asarray(grid_axis(frame_h, stride))
    cols = jnp.asarray(grid_axis(frame_w, stride))
    width = jnp.asarray(width, jnp.int32)
    image = image_region(transform)
    allowed = image if region is None else image & jnp.asarray(region, bool)
    candidates = allowed[rows[:, None], cols[None, :]]
    target = grid_target(gt, image, width)
    if prefix is None:
        prefix = empty_prefix(low_res_shape(segmenter))

    extra = jnp.zeros((0, 2), jnp.float32) if extra_clicks is None else jnp.asarray(extra_clicks, jnp.float32)
    if extra.ndim != 2 or extra.shape[1] != 2:
        raise ValueError(f"extra_clicks must have shape [K, 2] (row, col); got {extra.shape}")
    n_grid = candidates.size

    def evaluate(flat):
        grid_point = jnp.stack([cols[flat % cols.shape[0]], rows[flat // cols.shape[0]]]).astype(jnp.float32)
        extra_point = extra[jnp.clip(flat - n_grid, 0, max(extra.shape[0] - 1, 0))][::-1] if extra.shape[0] \
            else grid_point
        point = jnp.where(flat < n_grid, grid_point, extra_point)
        prediction = segmenter.decode(params, features, append_click(prefix, point, click_label), transform,
                                      multimask_output=multimask_output)
        scores = grid_scores(_binarise(prediction.logits, thr), target, width)
        return scores.iou, scores.biou

    everything = jnp.concatenate([candidates.reshape(-1), jnp.ones((extra.shape[0],), bool)])
    iou, biou = evaluate_candidates(evaluate, everything, chunk_size)
    shape = candidates.shape
    grid_iou, grid_biou = iou[:n_grid].reshape(shape), biou[:n_grid].reshape(shape)
    return ClickGridResult(iou=grid_iou, biou=grid_biou, evaluated=candidates, rows=rows, cols=cols,
                           n_evaluated=jnp.sum(candidates, dtype=jnp.int32),
                           iou_extremes=heatmap_extremes(grid_iou), biou_extremes=heatmap_extremes(grid_biou),
                           extra_iou=iou[n_grid:], extra_biou=biou[n_grid:])


# ---- centred box grid ------------------------------------------------------------------

@flax.struct.dataclass
class CentredAxis:
    """The centred intervals along one axis (x: widths w, y: heights h). L = number of sizes, D = slots.

    Attributes:
      sizes: i32[L] sizes 0, s, 2s, ... <= 2 F (F = the frame side).
      size_valid: bool[L] size <= 2 N (N = the image side).
      index: i32[L] index of the size's clipped interval in the distinct list.
      lo, hi: i32[D] distinct clipped intervals ``[lo, hi]`` (inclusive ends) in size order.
      count: i32[] number of distinct intervals (N at stride 1).
      centre: i32[] ``(t2 - t1) // 2 + t1`` of the tight box.
    """

    sizes: jnp.ndarray
    size_valid: jnp.ndarray
    index: jnp.ndarray
    lo: jnp.ndarray
    hi: jnp.ndarray
    count: jnp.ndarray
    centre: jnp.ndarray


def centred_axis(t1, t2, side, frame_side: int, stride: int = DEFAULT_STRIDE) -> CentredAxis:
    """comp_hw.py along one axis: intervals of every size centred on the tight box, clipped, deduplicated.

    ``c = (t2 - t1) // 2 + t1``; size ``w`` -> ``[clip(c - w // 2), clip(c +
    (w + 1) // 2)]`` in ``[0, side - 1]`` for ``w = 0, s, ... <= 2 side``.

    Args:
      t1, t2: i32[] inclusive tight-box ends (x1, x2 or y1, y2; may be traced).
      side: i32[] the image's side (W or H; may be traced).
      frame_side: static frame side F >= side.
      stride: static size step.

    Returns:
      `CentredAxis` (D = min(L, F) slots, the first ``count`` used).
    """
    _check_stride(stride)
    sizes = jnp.asarray(np.arange(0, 2 * int(frame_side) + 1, stride, dtype=np.int32))
    slots = min(int(sizes.shape[0]), int(frame_side))
    t1 = jnp.asarray(t1, jnp.int32)
    t2 = jnp.asarray(t2, jnp.int32)
    side = jnp.asarray(side, jnp.int32)
    centre = (t2 - t1) // 2 + t1
    lo = jnp.clip(centre - sizes // 2, 0, side - 1)
    hi = jnp.clip(centre + (sizes + 1) // 2, 0, side - 1)
    size_valid = sizes <= 2 * side
    changed = jnp.concatenate([jnp.ones((1,), bool), (lo[1:] != lo[:-1]) | (hi[1:] != hi[:-1])])
    new = changed & size_valid
    index = jnp.cumsum(new.astype(jnp.int32)) - 1
    target = jnp.where(new, index, slots)
    distinct_lo = jnp.zeros((slots,), jnp.int32).at[target].set(lo, mode="drop")
    distinct_hi = jnp.zeros((slots,), jnp.int32).at[target].set(hi, mode="drop")
    return CentredAxis(sizes=sizes, size_valid=size_valid, index=index, lo=distinct_lo, hi=distinct_hi,
                       count=jnp.sum(new, dtype=jnp.int32), centre=centre)


@flax.struct.dataclass
class CentredBoxes:
    """comp_hw.py's box set of one instance: `CentredAxis` for x (widths) and y (heights).

    Distinct box (i, j) = ``(x.lo[j], y.lo[i], x.hi[j], y.hi[i])``, valid for
    ``i < y.count``, ``j < x.count``; size (h, w) = (y.sizes[a], x.sizes[b])
    maps to distinct box ``(y.index[a], x.index[b])``.
    """

    x: CentredAxis
    y: CentredAxis

    def distinct_boxes(self) -> tuple[jnp.ndarray, jnp.ndarray]:
        """(i32[Dy, Dx, 4] boxes (x1, y1, x2, y2), bool[Dy, Dx] valid)."""
        dy, dx = self.y.lo.shape[0], self.x.lo.shape[0]
        boxes = jnp.stack([jnp.broadcast_to(self.x.lo[None, :], (dy, dx)),
                           jnp.broadcast_to(self.y.lo[:, None], (dy, dx)),
                           jnp.broadcast_to(self.x.hi[None, :], (dy, dx)),
                           jnp.broadcast_to(self.y.hi[:, None], (dy, dx))], axis=-1)
        valid = (jnp.arange(dy) < self.y.count)[:, None] & (jnp.arange(dx) < self.x.count)[None, :]
        return boxes, valid

    def box_of_sizes(self, h_index, w_index) -> jnp.ndarray:
        """i32[..., 4] box of the sizes ``(y.sizes[h_index], x.sizes[w_index])``."""
        i, j = self.y.index[h_index], self.x.index[w_index]
        return jnp.stack([self.x.lo[j], self.y.lo[i], self.x.hi[j], self.y.hi[i]], axis=-1)


def centred_boxes(tight, original_hw, frame_hw: tuple[int, int], stride: int = DEFAULT_STRIDE) -> CentredBoxes:
    """The centred (h, w) box grid of comp_hw.py for one instance (pure; jit/vmap-safe).

    Args:
      tight: i32[4] inclusive tight box (x1, y1, x2, y2) of G+ (`ops.boxes.tight_box`).
      original_hw: i32[2] (H, W) of the image (may be traced).
      frame_hw: static (Hf, Wf) >= (H, W).
      stride: static step of h and w.

    Returns:
      `CentredBoxes`.
    """
    tight = jnp.asarray(tight, jnp.int32)
    original_hw = jnp.asarray(original_hw, jnp.int32)
    return CentredBoxes(x=centred_axis(tight[0], tight[2], original_hw[1], frame_hw[1], stride),
                        y=centred_axis(tight[1], tight[3], original_hw[0], frame_hw[0], stride))


def corner_heatmap(boxes, values, valid, frame_hw: tuple[int, int]) -> jnp.ndarray:
    """draw_heatmaps.py: mean score of the boxes with a corner at each pixel (pure; jit/vmap-safe).

    Boxes with ``x2 - x1 <= 0`` or ``y2 - y1 <= 0`` are dropped; each other
    box adds its value to its four corner pixels ``(y1, x1), (y1, x2), (y2,
    x1), (y2, x2)`` (a corner pixel shared by two corners of one box counts
    twice, as the script's four additions).

    Args:
      boxes: i32[K, 4] (x1, y1, x2, y2) inside ``frame_hw``.
      values: f32[K] scores (NaN counts as not drawn).
      valid: bool[K] which boxes exist.
      frame_hw: static (Hf, Wf).

    Returns:
      f32[Hf, Wf] heat; 0 where no corner lands.
    """
    boxes = jnp.asarray(boxes, jnp.int32).reshape(-1, 4)
    values = jnp.asarray(values, jnp.float32).reshape(-1)
    valid = jnp.asarray(valid, bool).reshape(-1)
    frame_h, frame_w = (int(v) for v in frame_hw)
    keep = valid & (boxes[:, 2] > boxes[:, 0]) & (boxes[:, 3] > boxes[:, 1]) & ~jnp.isnan(values)
    x1, y1, x2, y2 = (jnp.clip(boxes[:, k], 0, (frame_w, frame_h)[k % 2] - 1) for k in range(4))
    flat = jnp.concatenate([y1 * frame_w + x1, y1 * frame_w + x2, y2 * frame_w + x1, y2 * frame_w + x2])
    flat = jnp.where(jnp.tile(keep, 4), flat, frame_h * frame_w)
    weights = jnp.tile(jnp.where(keep, values, 0.0), 4)
    total = jnp.zeros((frame_h * frame_w,), jnp.float32).at[flat].add(weights, mode="drop")
    count = jnp.zeros((frame_h * frame_w,), jnp.float32).at[flat].add(1.0, mode="drop")
    heat = jnp.where(count > 0, total / jnp.maximum(count, 1.0), 0.0)
    return heat.reshape(frame_h, frame_w)


@flax.struct.dataclass
class BoxGridResult:
    """Heatmaps of one instance's centred box grid (add a leading axis when vmapped).

    Lh, Lw = number of heights / widths; Dy, Dx = distinct-interval slots.

    Attributes:
      iou, biou, iou_reference: f32[Lh, Lw] scores of the box of size
        ``(heights[a], widths[b])`` (see `GridScores`); NaN for sizes beyond
        ``2H`` / ``2W``.
      valid: bool[Lh, Lw] sizes within the image's range.
      heights, widths: i32[Lh], i32[Lw] the sizes h and w.
      boxes: `CentredBoxes` (the distinct boxes and the size -> box maps).
      distinct_iou, distinct_iou_reference: f32[Dy, Dx] scores of the distinct boxes.
      tight_box: i32[4]; tight_hw: i32[2] (h, w) = (y2 - y1, x2 - x1), the
        grid size whose box is the tight box; centre: i32[2] (cx, cy).
      n_boxes: i32[] number of distinct boxes decoded (H W at stride 1).
      iou_extremes: `Extremes` of ``iou`` (flat indices into [Lh, Lw]).
      extra_scores: `GridScores` with f32[K] fields for the ``extra_boxes``.
    """

    iou: jnp.ndarray
    biou: jnp.ndarray
    iou_reference: jnp.ndarray
    valid: jnp.ndarray
    heights: jnp.ndarray
    widths: jnp.ndarray
    boxes: CentredBoxes
    distinct_iou: jnp.ndarray
    distinct_iou_reference: jnp.ndarray
    tight_box: jnp.ndarray
    tight_hw: jnp.ndarray
    centre: jnp.ndarray
    n_boxes: jnp.ndarray
    iou_extremes: Extremes
    extra_scores: GridScores


def box_grid(segmenter, params, features, transform: Transform, gt, width, *, extra_boxes=None,
             stride: int = DEFAULT_STRIDE, chunk_size: int = DEFAULT_CHUNK_SIZE,
             multimask_output: bool = False) -> BoxGridResult:
    """Scores of every centred (h, w) box of one instance (comp_hw.py, §5.2; pure; jit it, vmap it).

    Args:
      segmenter, params, features, transform, gt, width: as in `click_grid`.
      extra_boxes: optional [K, 4] evaluation-frame boxes (x1, y1, x2, y2)
        scored in the same loop (e.g. the tight box, whatever the stride).
      stride: static step of h and w (1 = the reference).
      chunk_size: static number of boxes decoded together.
      multimask_output: static; False = the single-mask output (the reference).
        With True, 3 candidates + argmax predicted IoU.

    Returns:
      `BoxGridResult`; masks are ``logit > 0`` (the predictor's boolean output).
    """
    gt = jnp.asarray(gt)
    _check_frame(gt, transform)
    width = jnp.asarray(width, jnp.int32)
    image = image_region(transform)
    target = grid_target(gt, image, width)
    tight = tight_box((gt == 1) & image)
    grid = centred_boxes(tight, transform.original_hw, transform.frame_hw, stride)
    distinct, distinct_valid = grid.distinct_boxes()
    n_cols = distinct.shape[1]
    n_grid = distinct_valid.size
    mask_shape = low_res_shape(segmenter)
    extra = jnp.zeros((0, 4), jnp.float32) if extra_boxes is None else jnp.asarray(extra_boxes, jnp.float32)
    if extra.ndim != 2 or extra.shape[1] != 4:
        raise ValueError(f"extra_boxes must have shape [K, 4]; got {extra.shape}")

    def evaluate(flat):
        box = distinct[(flat // n_cols) % distinct.shape[0], flat % n_cols].astype(jnp.float32)
        if extra.shape[0]:
            box = jnp.where(flat < n_grid, box, extra[jnp.clip(flat - n_grid, 0, extra.shape[0] - 1)])
        prediction = segmenter.decode(params, features, box_prompts(box, mask_shape), transform,
                                      multimask_output=multimask_output)
        scores = grid_scores(prediction.logits > 0, target, width)
        return scores.iou, scores.biou, scores.iou_reference

    everything = jnp.concatenate([distinct_valid.reshape(-1), jnp.ones((extra.shape[0],), bool)])
    values = evaluate_candidates(evaluate, everything, chunk_size)
    d_iou, d_biou, d_ref = (v[:n_grid].reshape(distinct_valid.shape) for v in values)
    valid = grid.y.size_valid[:, None] & grid.x.size_valid[None, :]
    rows, cols = grid.y.index[:, None], grid.x.index[None, :]

    def gather(distinct_values):
        return jnp.where(valid, distinct_values[rows, cols], jnp.nan)

    iou = gather(d_iou)
    return BoxGridResult(
        iou=iou, biou=gather(d_biou), iou_reference=gather(d_ref), valid=valid,
        heights=grid.y.sizes, widths=grid.x.sizes, boxes=grid, distinct_iou=d_iou,
        distinct_iou_reference=d_ref, tight_box=tight,
        tight_hw=jnp.stack([tight[3] - tight[1], tight[2] - tight[0]]).astype(jnp.int32),
        centre=jnp.stack([grid.x.centre, grid.y.centre]).astype(jnp.int32),
        n_boxes=jnp.sum(distinct_valid, dtype=jnp.int32), iou_extremes=heatmap_extremes(iou),
        extra_scores=GridScores(*(v[n_grid:] for v in values)))


# ---- batch adapters for the engine -----------------------------------------------------

def _check_positive_int(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int; got {value!r}")


class _GridBatchFunction:
    """Shared host side: crop, preprocess into the bucket frame, stack, one jitted call."""

    def __init__(self, segmenter, params, dilation_ratio: float):
        self.segmenter = segmenter
        self.params = params
        self.dilation_ratio = dilation_ratio
        self.traces = 0
        self._core = jax.jit(self._traced_core)

    def _traced_core(self, params, model_input, transform, gt, width):
        self.traces += 1  # runs once per trace
        features = self.segmenter.embed(params, model_input)
        return self._instances(params, features, transform, gt, width)

    def __call__(self, batch) -> dict:
        """Runs the grid on a `PaddedBatch` (host preprocessing, then one jitted call)."""
        images, gts, sizes = check_batch(batch)
        model_input, transforms = preprocess_slots(self.segmenter, images, sizes, (gts.shape[1], gts.shape[2]))
        args = (model_input, stack_trees(transforms), gts, boundary_widths(sizes, self.dilation_ratio))
        return self._core(self.params, *place_like(args, batch.gt))


@dataclasses.dataclass(frozen=True)
class ClickGridConfig:
    """Static settings of the click grid batch function (see `make_click_grid_batch_fn`)."""

    stride: int = DEFAULT_STRIDE
    chunk_size: int = DEFAULT_CHUNK_SIZE
    region: str = "image"
    prefix: str = "none"
    thr: float = DEFAULT_THRESHOLD
    multimask_output: bool = True
    dilation_ratio: float = DEFAULT_DILATION_RATIO

    def __post_init__(self):
        _check_positive_int("stride", self.stride)
        _check_positive_int("chunk_size", self.chunk_size)
        if self.region not in CLICK_REGIONS:
            raise ValueError(f"region must be one of {CLICK_REGIONS}; got {self.region!r}")
        if self.prefix not in CLICK_PREFIXES:
            raise ValueError(f"prefix must be one of {CLICK_PREFIXES}; got {self.prefix!r}")
        if isinstance(self.thr, bool) or not isinstance(self.thr, (int, float)) or not 0.0 <= self.thr < 1.0:
            raise ValueError(f"thr must be a number in [0, 1); got {self.thr!r}")
        if not isinstance(self.multimask_output, bool):
            raise ValueError(f"multimask_output must be a bool; got {self.multimask_output!r}")
        ratio = self.dilation_ratio
        if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not math.isfinite(ratio) or ratio < 0:
            raise ValueError(f"dilation_ratio must be a finite number >= 0; got {ratio!r}")


def _extreme_outputs(prefix: str, extremes: Extremes, to_position) -> dict:
    return {f"{prefix}_min": extremes.min, f"{prefix}_max": extremes.max,
            f"{prefix}_argmin": to_position(extremes.argmin), f"{prefix}_argmax": to_position(extremes.argmax)}


class ClickGridBatchFunction(_GridBatchFunction):
    """``PaddedBatch -> dict[str, arrays [B, ...]]`` for the click grid (see `make_click_grid_batch_fn`).

    Attributes:
      traces: how many times the jitted core was traced (one per bucket shape).
      config: the `ClickGridConfig`.
    """

    def __init__(self, segmenter, params, config: ClickGridConfig):
        self.config = config
        super().__init__(segmenter, params, config.dilation_ratio)

    def _instances(self, params, features, transform, gt, width):
        return jax.vmap(lambda f, t, g, w: self._one(params, f, t, g, w))(features, transform, gt, width)

    def _one(self, params, features, transform, gt, width):
        config, seg = self.config, self.segmenter
        image = image_region(transform)
        labelled = image & (gt != IGNORE_LABEL)
        target = (gt == 1) & image
        # the baseline first click: deepest interior point of G+ (always used as a positive click;
        # the clicker would make it negative only for an empty G+)
        _, row0, col0 = next_click(target, jnp.zeros(gt.shape, bool), jnp.ones(gt.shape, bool), labelled)
        first_point = jnp.stack([col0, row0]).astype(jnp.float32)
        empty = empty_prefix(low_res_shape(seg))
        grid_width = jnp.asarray(width, jnp.int32)
        outputs = {"first_click": jnp.stack([row0, col0]).astype(jnp.int32)}
        if config.prefix == "none":
            prefix, label = None, jnp.int32(POSITIVE_LABEL)
            baseline_click = outputs["first_click"]
            error_region = target
        else:
            first_prediction = seg.decode(params, features, append_click(empty, first_point, POSITIVE_LABEL),
                                          transform, multimask_output=config.multimask_output)
            first_pred = _binarise(first_prediction.logits, config.thr)
            clicked = mark_clicked(jnp.ones(gt.shape, bool), row0, col0)
            positive, row1, col1 = next_click(target, first_pred, clicked, labelled)
            label = jnp.where(positive, POSITIVE_LABEL, NEGATIVE_LABEL).astype(jnp.int32)
            # mask input of click 2: the first prediction's selected low-res logits, reset when
            # max(#pos, #neg) <= 1, i.e. for a negative second click (spec §2.3.3 quirk)
            prefix = append_click(empty, first_point, POSITIVE_LABEL).replace(
                mask_logits=first_prediction.selected_low_res, has_mask=positive)
            baseline_click = jnp.stack([row1, col1]).astype(jnp.int32)
            false_negative, false_positive = error_masks(target, first_pred, labelled)
            error_region = jnp.where(positive, false_negative, false_positive)
            outputs["grid_click_positive"] = positive
        region = {"image": None, "object": target, "error": error_region}[config.region]
        result = click_grid(seg, params, features, transform, gt, grid_width, region=region, prefix=prefix,
                            click_label=label, extra_clicks=baseline_click[None], stride=config.stride,
                            chunk_size=config.chunk_size, thr=config.thr,
                            multimask_output=config.multimask_output)

        def to_click(flat):
            return flat_to_click(flat, result.rows, result.cols)

        outputs.update({
            "iou": result.iou, "biou": result.biou, "evaluated": result.evaluated,
            "rows": result.rows, "cols": result.cols, "n_evaluated": result.n_evaluated,
            "baseline_click": baseline_click, "baseline_iou": result.extra_iou[0],
            "baseline_biou": result.extra_biou[0],
            **_extreme_outputs("iou", result.iou_extremes, to_click),
            **_extreme_outputs("biou", result.biou_extremes, to_click),
        })
        return outputs


def make_click_grid_batch_fn(segmenter, params, *, stride: int = DEFAULT_STRIDE,
                             chunk_size: int = DEFAULT_CHUNK_SIZE, region: str = "image", prefix: str = "none",
                             thr: float = DEFAULT_THRESHOLD, multimask_output: bool = True,
                             dilation_ratio: float = DEFAULT_DILATION_RATIO) -> ClickGridBatchFunction:
    """A batch function for `jaxseg_robust.runner.engine.run` computing TETRIS click-grid heatmaps.

    Args:
      segmenter: a SAM-family Segmenter (static).
      params: its parameters (for several devices: ``replicate(params, mesh)``).
      stride: grid step in pixels (positions 0, s, 2s, ... of the bucket frame).
      chunk_size: positions decoded together per instance (memory ~ batch
        size x chunk_size decodes at the frame resolution).
      region: which positions are decoded: "image" (every pixel), "object"
        (G+), "error" (the baseline's error region the grid click belongs to:
        G+ for the first click; with ``prefix="baseline"`` the FN region of
        the first prediction for a positive second click, else the FP region).
      prefix: "none" (the first-click grid of §5.1: one positive click, no
        mask input) or "baseline" (the RITM baseline first click is fixed;
        the grid click is the second click, with the sign the baseline
        clicker gives click 2 and, for a positive one, the first prediction's
        low-res logits as mask input — the reference's reset quirk, §2.3.3).
      thr: probability threshold (``sigmoid(logits) > thr``; 0.5 for SAM).
      multimask_output: True = multimask + argmax predicted IoU (§5.1).
      dilation_ratio: Boundary IoU band ratio (0.02).

    Returns:
      A `ClickGridBatchFunction`. Outputs (leading axis B; Gh, Gw = grid size):
        iou, biou: f32[B, Gh, Gw] heatmaps (NaN where not evaluated);
        evaluated: bool[B, Gh, Gw]; rows: i32[B, Gh]; cols: i32[B, Gw]
          (pixel coordinates of the grid, evaluation frame);
        n_evaluated: i32[B];
        first_click: i32[B, 2] (row, col) baseline first click;
        baseline_click: i32[B, 2] (row, col) the baseline's click at the grid
          click's place (= first_click, or the baseline second click);
        baseline_iou, baseline_biou: f32[B] its scores (whatever the stride);
        grid_click_positive: bool[B] (prefix "baseline" only);
        {iou, biou}_{min, max}: f32[B]; {iou, biou}_{argmin, argmax}: i32[B, 2]
          (row, col) of the first extreme in row-major order ((-1, -1) if none).
    """
    config = ClickGridConfig(stride=stride, chunk_size=chunk_size, region=region, prefix=prefix, thr=thr,
                             multimask_output=multimask_output, dilation_ratio=dilation_ratio)
    return ClickGridBatchFunction(segmenter, params, config)


@dataclasses.dataclass(frozen=True)
class BoxGridConfig:
    """Static settings of the box grid batch function (see `make_box_grid_batch_fn`)."""

    stride: int = DEFAULT_STRIDE
    chunk_size: int = DEFAULT_CHUNK_SIZE
    multimask_output: bool = False
    corner_heatmap: bool = True
    dilation_ratio: float = DEFAULT_DILATION_RATIO

    def __post_init__(self):
        _check_positive_int("stride", self.stride)
        _check_positive_int("chunk_size", self.chunk_size)
        for name in ("multimask_output", "corner_heatmap"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a bool; got {getattr(self, name)!r}")
        ratio = self.dilation_ratio
        if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not math.isfinite(ratio) or ratio < 0:
            raise ValueError(f"dilation_ratio must be a finite number >= 0; got {ratio!r}")


class BoxGridBatchFunction(_GridBatchFunction):
    """``PaddedBatch -> dict[str, arrays [B, ...]]`` for the centred box grid (see `make_box_grid_batch_fn`).

    Attributes:
      traces: how many times the jitted core was traced (one per bucket shape).
      config: the `BoxGridConfig`.
    """

    def __init__(self, segmenter, params, config: BoxGridConfig):
        self.config = config
        super().__init__(segmenter, params, config.dilation_ratio)

    def _instances(self, params, features, transform, gt, width):
        return jax.vmap(lambda f, t, g, w: self._one(params, f, t, g, w))(features, transform, gt, width)

    def _one(self, params, features, transform, gt, width):
        config = self.config
        tight = tight_box((gt == 1) & image_region(transform))
        result = box_grid(self.segmenter, params, features, transform, gt, width,
                          extra_boxes=tight[None].astype(jnp.float32), stride=config.stride,
                          chunk_size=config.chunk_size, multimask_output=config.multimask_output)
        n_widths = result.widths.shape[0]

        def to_sizes(flat):
            i = jnp.maximum(flat, 0)
            sizes = jnp.stack([result.heights[i // n_widths], result.widths[i % n_widths]]).astype(jnp.int32)
            return jnp.where(flat >= 0, sizes, -1)

        def to_box(flat):
            i = jnp.maximum(flat, 0)
            return jnp.where(flat >= 0, result.boxes.box_of_sizes(i // n_widths, i % n_widths), -1)

        extremes = result.iou_extremes
        tight_scores = jax.tree.map(lambda v: v[0], result.extra_scores)
        outputs = {
            "iou": result.iou, "biou": result.biou, "iou_reference": result.iou_reference, "valid": result.valid,
            "heights": result.heights, "widths": result.widths, "tight_box": result.tight_box,
            "tight_hw": result.tight_hw, "centre": result.centre, "n_boxes": result.n_boxes,
            "tight_iou": tight_scores.iou, "tight_biou": tight_scores.biou,
            "tight_iou_reference": tight_scores.iou_reference,
            "iou_min": extremes.min, "iou_max": extremes.max,
            "iou_argmin_hw": to_sizes(extremes.argmin), "iou_argmax_hw": to_sizes(extremes.argmax),
            "iou_argmin_box": to_box(extremes.argmin), "iou_argmax_box": to_box(extremes.argmax),
        }
        if config.corner_heatmap:
            boxes, valid = result.boxes.distinct_boxes()
            outputs["corner_heatmap"] = corner_heatmap(boxes.reshape(-1, 4), result.distinct_iou_reference,
                                                       valid, transform.frame_hw)
        return outputs


def make_box_grid_batch_fn(segmenter, params, *, stride: int = DEFAULT_STRIDE,
                           chunk_size: int = DEFAULT_CHUNK_SIZE, multimask_output: bool = False,
                           corner_heatmap: bool = True,
                           dilation_ratio: float = DEFAULT_DILATION_RATIO) -> BoxGridBatchFunction:
    """A batch function for `jaxseg_robust.runner.engine.run` computing BREPS centred (h, w) box heatmaps.

    Args:
      segmenter: a SAM-family Segmenter (static).
      params: its parameters (for several devices: ``replicate(params, mesh)``).
      stride: step of h and w (1 = comp_hw.py).
      chunk_size: boxes decoded together per instance.
      multimask_output: False = the single-mask output of the reference.
      corner_heatmap: also return the §5.3 pixel heatmap (frame-sized).
      dilation_ratio: Boundary IoU band ratio (0.02).

    Returns:
      A `BoxGridBatchFunction`. Outputs (leading axis B; Lh = len(range(0,
      2 Hf + 1, stride)), Lw likewise):
        iou, biou, iou_reference: f32[B, Lh, Lw] (NaN for sizes beyond 2H / 2W);
        valid: bool[B, Lh, Lw]; heights: i32[B, Lh]; widths: i32[B, Lw];
        tight_box: i32[B, 4]; tight_hw: i32[B, 2] (h, w) of the tight box in
          the grid (the plot marker); centre: i32[B, 2] (cx, cy);
        n_boxes: i32[B] distinct boxes decoded;
        tight_iou, tight_biou, tight_iou_reference: f32[B] the tight box's scores;
        iou_min, iou_max: f32[B]; iou_argmin_hw, iou_argmax_hw: i32[B, 2] (h, w);
        iou_argmin_box, iou_argmax_box: i32[B, 4] the clipped boxes;
        corner_heatmap: f32[B, Hf, Wf] (when requested; mean ``iou_reference``
          of the distinct boxes with a corner at the pixel).
    """
    config = BoxGridConfig(stride=stride, chunk_size=chunk_size, multimask_output=multimask_output,
                           corner_heatmap=corner_heatmap, dilation_ratio=dilation_ratio)
    return BoxGridBatchFunction(segmenter, params, config)


__all__ = [
    "DEFAULT_STRIDE", "DEFAULT_CHUNK_SIZE", "DEFAULT_THRESHOLD", "REFERENCE_IOU_EPS", "CLICK_REGIONS",
    "CLICK_PREFIXES", "GridTarget", "GridScores", "grid_target", "grid_scores", "evaluate_candidates",
    "Extremes", "heatmap_extremes", "grid_axis", "append_click", "empty_prefix", "ClickGridResult",
    "flat_to_click", "click_grid", "CentredAxis", "centred_axis", "CentredBoxes", "centred_boxes",
    "corner_heatmap", "BoxGridResult", "box_grid", "ClickGridConfig", "ClickGridBatchFunction",
    "make_click_grid_batch_fn", "BoxGridConfig", "BoxGridBatchFunction", "make_box_grid_batch_fn",
]
