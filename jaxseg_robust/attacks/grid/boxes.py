"""The centred box grid: the IoU of every box size around the tight box's centre (docs/protocols/grids.md §5.2-5.3).

For one instance (`box_grid`; vmap it): centre ``cx = (x2 - x1) // 2 + x1``,
``cy = (y2 - y1) // 2 + y1`` of the inclusive tight box of G+; for every
``h = 0 .. 2H`` and ``w = 0 .. 2W`` (step ``stride``) the box ``x1 = cx - w //
2``, ``x2 = cx + (w + 1) // 2`` (likewise y), clipped to the image. Clipped
boxes repeat; only the distinct boxes are decoded (single-mask output,
``logit > 0``) and gathered back into the ``(h, w)`` heat map. Scores per box:
``iou`` / ``biou`` (ignore excluded, NaN on an empty union) and
``iou_reference`` (the script's ``inter / (union + 1e-6)``). `corner_heatmap`
draws every distinct box's score at its four corners (§5.3).
"""

from __future__ import annotations

import dataclasses

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from jaxseg_robust.attacks.grid.candidates import (
    DEFAULT_CHUNK_SIZE,
    DEFAULT_STRIDE,
    Extremes,
    check_positive_int,
    check_stride,
    evaluate_candidates,
    heatmap_extremes,
)
from jaxseg_robust.attacks.grid.clicks import check_frame
from jaxseg_robust.metrics.masks import DEFAULT_DILATION_RATIO, check_dilation_ratio
from jaxseg_robust.metrics.packed import pack_target, packed_scores
from jaxseg_robust.models.base import Transform, image_region
from jaxseg_robust.ops.boxes import tight_box
from jaxseg_robust.prompts.types import box_prompts
from jaxseg_robust.runner.program import BatchProgram, ConfigProtocol, InstanceInputs


@flax.struct.dataclass
class GridScores:
    """Scores of the extra boxes (each f32[K]): ``iou``, ``biou``, ``iou_reference`` (see the module docstring)."""

    iou: jnp.ndarray
    biou: jnp.ndarray
    iou_reference: jnp.ndarray


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
    check_stride(stride)
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
    check_frame(gt, transform)
    width = jnp.asarray(width, jnp.int32)
    image = image_region(transform)
    target = pack_target(gt, image, width)
    tight = tight_box((gt == 1) & image)
    grid = centred_boxes(tight, transform.original_hw, transform.frame_hw, stride)
    distinct, distinct_valid = grid.distinct_boxes()
    n_cols = distinct.shape[1]
    n_grid = distinct_valid.size
    mask_shape = segmenter.feedback_shape(tuple(gt.shape))
    extra = jnp.zeros((0, 4), jnp.float32) if extra_boxes is None else jnp.asarray(extra_boxes, jnp.float32)
    if extra.ndim != 2 or extra.shape[1] != 4:
        raise ValueError(f"extra_boxes must have shape [K, 4]; got {extra.shape}")

    def evaluate(flat):
        box = distinct[(flat // n_cols) % distinct.shape[0], flat % n_cols].astype(jnp.float32)
        if extra.shape[0]:
            box = jnp.where(flat < n_grid, box, extra[jnp.clip(flat - n_grid, 0, extra.shape[0] - 1)])
        prediction = segmenter.decode(params, features, box_prompts(box, mask_shape), transform,
                                      multimask_output=multimask_output)
        scores = packed_scores(prediction.logits > 0, target, width)
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


@dataclasses.dataclass(frozen=True)
class BoxGridConfig:
    """Static settings of the box grid batch function (see `make_box_grid_batch_fn`)."""

    stride: int = DEFAULT_STRIDE
    chunk_size: int = DEFAULT_CHUNK_SIZE
    multimask_output: bool = False
    corner_heatmap: bool = True
    dilation_ratio: float = DEFAULT_DILATION_RATIO

    def __post_init__(self):
        check_positive_int("stride", self.stride)
        check_positive_int("chunk_size", self.chunk_size)
        for name in ("multimask_output", "corner_heatmap"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a bool; got {getattr(self, name)!r}")
        check_dilation_ratio(self.dilation_ratio)


@dataclasses.dataclass(frozen=True)
class BoxGridProtocol(ConfigProtocol):
    """The centred box grid as one per-instance function (`runner.program.BatchProtocol`)."""

    config: BoxGridConfig = BoxGridConfig()

    name = "box grid"

    def instance(self, segmenter, params, aux_params, inputs: InstanceInputs) -> dict:
        """Heat maps, extremes and the tight box's scores of one instance (`make_box_grid_batch_fn`)."""
        config, params, features, transform, gt, width = (self.config, params, inputs.features, inputs.transform,
                                                          inputs.gt, inputs.width)
        tight = tight_box((gt == 1) & image_region(transform))
        result = box_grid(segmenter, params, features, transform, gt, width,
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
                           dilation_ratio: float = DEFAULT_DILATION_RATIO, announce=None) -> BatchProgram:
    """A batch function for `jaxseg_robust.runner.engine.run` computing BREPS centred (h, w) box heatmaps.

    Args:
      segmenter: any Segmenter that takes box prompts (static).
      params: its parameters (for several devices: ``replicate(params, mesh)``).
      stride: step of h and w (1 = comp_hw.py).
      chunk_size: boxes decoded together per instance.
      multimask_output: False = the single-mask output of the reference.
      corner_heatmap: also return the §5.3 pixel heatmap (frame-sized).
      dilation_ratio: Boundary IoU band ratio (0.02).
      announce: ``text -> None`` told before a bucket's program is compiled.

    Returns:
      A `runner.program.BatchProgram`. Outputs (leading axis B; Lh = len(range(0,
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
    return BatchProgram(segmenter, params, BoxGridProtocol(config), announce=announce)


__all__ = ["GridScores", "CentredAxis", "centred_axis", "CentredBoxes", "centred_boxes", "corner_heatmap",
           "BoxGridResult", "box_grid", "BoxGridConfig", "BoxGridProtocol", "make_box_grid_batch_fn"]
