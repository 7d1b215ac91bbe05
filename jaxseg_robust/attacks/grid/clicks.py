"""The exhaustive click grid: the IoU of one click at every grid pixel (docs/protocols/grids.md §5.1).

For one instance (`click_grid`; vmap it): one click at every integer pixel
``(row, col)`` of a stride grid of the frame, fed to the model as ``(x, y) =
(col, row)`` in evaluation-frame pixels; multimask output (the model's
selection), scores of ``sigmoid(logits) > thr`` against G (IoU and Boundary
IoU, ignore excluded, NaN on an empty union); heat maps ``[ceil(Hf/s),
ceil(Wf/s)]``, NaN outside the image or the optional region. With a prefix
(`ClickGridProtocol` ``prefix="baseline"``) the baseline first click and the
model's feedback of its prediction are fixed and the grid click is the second.
"""

from __future__ import annotations

import dataclasses

import flax.struct
import jax
import jax.numpy as jnp

from jaxseg_robust.attacks.grid.candidates import (
    DEFAULT_CHUNK_SIZE,
    DEFAULT_STRIDE,
    Extremes,
    check_positive_int,
    check_stride,
    evaluate_candidates,
    flat_to_click,
    grid_axis,
    heatmap_extremes,
)
from jaxseg_robust.metrics.masks import DEFAULT_DILATION_RATIO, check_dilation_ratio
from jaxseg_robust.metrics.packed import pack_target, packed_scores
from jaxseg_robust.models.base import Transform, image_region
from jaxseg_robust.ops.labels import IGNORE_LABEL
from jaxseg_robust.prompts.clicker import error_masks, mark_clicked, next_click, xy_of
from jaxseg_robust.prompts.types import NEGATIVE_LABEL, POSITIVE_LABEL, Prompts, append_click, empty_prompts
from jaxseg_robust.runner.program import BatchProgram, ConfigProtocol, InstanceInputs

DEFAULT_THRESHOLD = 0.5  # the SAM family's (Segmenter.probability_threshold is the default of the builders)
CLICK_REGIONS = ("image", "object", "error")
CLICK_PREFIXES = ("none", "baseline")
# the layout of the click grid's records (a run directory's manifest names it; runner.rundir refuses to resume
# one written in another): every click as (x, y) under *_xy
RECORDS_FORMAT = "click grid/2: clicks as (x, y) *_xy"


def check_frame(gt, transform: Transform) -> None:
    """ValueError unless ``gt`` has the transform's static frame shape."""
    if transform.frame_hw is None:
        raise ValueError("transform.frame_hw must be set (Segmenter.preprocess sets it)")
    if tuple(gt.shape) != tuple(transform.frame_hw):
        raise ValueError(f"gt must have the transform's frame shape {tuple(transform.frame_hw)}; got {gt.shape}")


def binarise(logits, thr: float):
    """``sigmoid(logits) > thr`` as the attacks score their iterates (thr static)."""
    return jax.nn.sigmoid(logits) > thr


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


def click_grid(segmenter, params, features, transform: Transform, gt, width, *, region=None,
               prefix: Prompts | None = None, click_label=POSITIVE_LABEL, extra_clicks=None,
               stride: int = DEFAULT_STRIDE, chunk_size: int = DEFAULT_CHUNK_SIZE, thr: float = DEFAULT_THRESHOLD,
               multimask_output: bool = True) -> ClickGridResult:
    """IoU / BIoU heatmaps of one click at every grid pixel of one instance (pure; jit it, vmap it).

    Args:
      segmenter: any Segmenter (static, closed over).
      params: its parameters.
      features: the instance's cached image features (one image).
      transform: its `Transform` (``frame_hw`` = the frame of ``gt``).
      gt: int [Hf, Wf] 1 / 0 / -1 (outside the image: ignored via the transform).
      width: i32[] Boundary IoU band width of the image (`metrics.masks.boundary_widths`).
      region: optional bool[Hf, Wf]: only positions inside it are decoded
        (always intersected with the image).
      prefix: optional `Prompts` of fixed earlier clicks (and the model's
        feedback map); the grid click is appended as the last point. None =
        first click (no other point, no mask input).
      click_label: i32[] label of the grid click (1 positive, 0 negative; may be traced).
      extra_clicks: optional [K, 2] (row, col) clicks (float allowed) scored
        in the same loop as the grid, with the same prefix and label.
      stride: static grid step in pixels (rows/cols 0, s, 2s, ...).
      chunk_size: static number of positions decoded together (memory bound).
      thr: static probability threshold (``sigmoid(logits) > thr``).
      multimask_output: static; True = the multimask output and the model's selection (§5.1).

    Returns:
      `ClickGridResult`.
    """
    gt = jnp.asarray(gt)
    check_frame(gt, transform)
    check_stride(stride)
    frame_h, frame_w = transform.frame_hw
    rows = jnp.asarray(grid_axis(frame_h, stride))
    cols = jnp.asarray(grid_axis(frame_w, stride))
    width = jnp.asarray(width, jnp.int32)
    image = image_region(transform)
    allowed = image if region is None else image & jnp.asarray(region, bool)
    candidates = allowed[rows[:, None], cols[None, :]]
    target = pack_target(gt, image, width)
    if prefix is None:
        prefix = empty_prompts(segmenter.feedback_shape(tuple(gt.shape)))
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
        scores = packed_scores(binarise(prediction.logits, thr), target, width)
        return scores.iou, scores.biou

    everything = jnp.concatenate([candidates.reshape(-1), jnp.ones((extra.shape[0],), bool)])
    iou, biou = evaluate_candidates(evaluate, everything, chunk_size)
    shape = candidates.shape
    grid_iou, grid_biou = iou[:n_grid].reshape(shape), biou[:n_grid].reshape(shape)
    return ClickGridResult(iou=grid_iou, biou=grid_biou, evaluated=candidates, rows=rows, cols=cols,
                           n_evaluated=jnp.sum(candidates, dtype=jnp.int32),
                           iou_extremes=heatmap_extremes(grid_iou), biou_extremes=heatmap_extremes(grid_biou),
                           extra_iou=iou[n_grid:], extra_biou=biou[n_grid:])


@dataclasses.dataclass(frozen=True)
class ClickGridConfig:
    """Static settings of the click grid (see `make_click_grid_batch_fn`)."""

    stride: int = DEFAULT_STRIDE
    chunk_size: int = DEFAULT_CHUNK_SIZE
    region: str = "image"
    prefix: str = "none"
    thr: float = DEFAULT_THRESHOLD
    multimask_output: bool = True
    dilation_ratio: float = DEFAULT_DILATION_RATIO

    def __post_init__(self):
        check_positive_int("stride", self.stride)
        check_positive_int("chunk_size", self.chunk_size)
        if self.region not in CLICK_REGIONS:
            raise ValueError(f"region must be one of {CLICK_REGIONS}; got {self.region!r}")
        if self.prefix not in CLICK_PREFIXES:
            raise ValueError(f"prefix must be one of {CLICK_PREFIXES}; got {self.prefix!r}")
        if isinstance(self.thr, bool) or not isinstance(self.thr, (int, float)) or not 0.0 <= self.thr < 1.0:
            raise ValueError(f"thr must be a number in [0, 1); got {self.thr!r}")
        if not isinstance(self.multimask_output, bool):
            raise ValueError(f"multimask_output must be a bool; got {self.multimask_output!r}")
        check_dilation_ratio(self.dilation_ratio)


def extreme_outputs(prefix: str, extremes: Extremes, to_position) -> dict:
    """``{prefix}_min``, ``_max``, ``_argmin_xy``, ``_argmax_xy`` of `Extremes` (``to_position``: a flat
    index -> the click's (x, y))."""
    return {f"{prefix}_min": extremes.min, f"{prefix}_max": extremes.max,
            f"{prefix}_argmin_xy": to_position(extremes.argmin), f"{prefix}_argmax_xy": to_position(extremes.argmax)}


def baseline_prefix(segmenter, params, features, transform: Transform, gt, config: ClickGridConfig):
    """The grid's prefix: (prefix `Prompts` or None, grid click label, baseline click (row, col), error
    region of the grid click, extra outputs) for ``config.prefix`` (docs/protocols/grids.md §5.1).

    The extra outputs: ``first_click_xy`` i32[2] (x, y) of the baseline first click (always positive)
    and ``grid_click_positive`` bool[] (the label of the grid click and of the baseline click at its place).
    """
    image = image_region(transform)
    labelled = image & (gt != IGNORE_LABEL)
    target = (gt == 1) & image
    # the baseline first click: deepest interior point of G+ (always a positive click; the clicker would
    # make it negative only for an empty G+)
    _, row0, col0 = next_click(target, jnp.zeros(gt.shape, bool), jnp.ones(gt.shape, bool), labelled)
    first_click = jnp.stack([row0, col0]).astype(jnp.int32)
    outputs = {"first_click_xy": xy_of(first_click)}
    if config.prefix == "none":
        outputs["grid_click_positive"] = jnp.asarray(True)
        return None, jnp.int32(POSITIVE_LABEL), first_click, target, outputs
    first_point = jnp.stack([col0, row0]).astype(jnp.float32)
    first = append_click(empty_prompts(segmenter.feedback_shape(tuple(gt.shape))), first_point, POSITIVE_LABEL)
    first_prediction = segmenter.decode(params, features, first, transform, multimask_output=config.multimask_output)
    first_pred = binarise(first_prediction.logits, config.thr)
    clicked = mark_clicked(jnp.ones(gt.shape, bool), row0, col0)
    positive, row1, col1 = next_click(target, first_pred, clicked, labelled)
    label = jnp.where(positive, POSITIVE_LABEL, NEGATIVE_LABEL).astype(jnp.int32)
    # mask input of click 2: the model's feedback of the first prediction, reset when max(#pos, #neg) <= 1,
    # i.e. for a negative second click (the reference's quirk, docs/protocols/tetris.md §2.3)
    prefix = first.replace(mask_logits=segmenter.feedback(first_prediction), has_mask=positive)
    false_negative, false_positive = error_masks(target, first_pred, labelled)
    outputs["grid_click_positive"] = positive
    return (prefix, label, jnp.stack([row1, col1]).astype(jnp.int32),
            jnp.where(positive, false_negative, false_positive), outputs)


@dataclasses.dataclass(frozen=True)
class ClickGridProtocol(ConfigProtocol):
    """The click grid as one per-instance function (`runner.program.BatchProtocol`)."""

    config: ClickGridConfig = ClickGridConfig()

    name = "click grid"

    def instance(self, segmenter, params, aux_params, inputs: InstanceInputs) -> dict:
        """Heat maps, extremes and the baseline click's scores of one instance (`make_click_grid_batch_fn`)."""
        config, gt, transform = self.config, inputs.gt, inputs.transform
        prefix, label, baseline_click, error_region, outputs = baseline_prefix(
            segmenter, params, inputs.features, transform, gt, config)
        target = (gt == 1) & image_region(transform)
        region = {"image": None, "object": target, "error": error_region}[config.region]
        result = click_grid(segmenter, params, inputs.features, transform, gt, jnp.asarray(inputs.width, jnp.int32),
                            region=region, prefix=prefix, click_label=label, extra_clicks=baseline_click[None],
                            stride=config.stride, chunk_size=config.chunk_size, thr=config.thr,
                            multimask_output=config.multimask_output)

        def to_click(flat):
            return xy_of(flat_to_click(flat, result.rows, result.cols))

        outputs.update({
            "iou": result.iou, "biou": result.biou, "evaluated": result.evaluated,
            "rows": result.rows, "cols": result.cols, "n_evaluated": result.n_evaluated,
            "baseline_click_xy": xy_of(baseline_click), "baseline_iou": result.extra_iou[0],
            "baseline_biou": result.extra_biou[0],
            **extreme_outputs("iou", result.iou_extremes, to_click),
            **extreme_outputs("biou", result.biou_extremes, to_click),
        })
        return outputs


def make_click_grid_batch_fn(segmenter, params, *, stride: int = DEFAULT_STRIDE,
                             chunk_size: int = DEFAULT_CHUNK_SIZE, region: str = "image", prefix: str = "none",
                             thr: float | None = None, multimask_output: bool = True,
                             dilation_ratio: float = DEFAULT_DILATION_RATIO, announce=None) -> BatchProgram:
    """A batch function for `jaxseg_robust.runner.engine.run` computing click-grid heatmaps.

    Args:
      segmenter: any Segmenter (static).
      params: its parameters (for several devices: ``replicate(params, mesh)``).
      stride: grid step in pixels (positions 0, s, 2s, ... of the bucket frame).
      chunk_size: positions decoded together per instance (memory ~ batch
        size x chunk_size decodes at the frame resolution).
      region: which positions are decoded: "image" (every pixel), "object"
        (G+), "error" (the baseline's error region the grid click belongs to:
        G+ for the first click; with ``prefix="baseline"`` the FN region of
        the first prediction for a positive second click, else the FP region).
      prefix: "none" (the first-click grid: one positive click, no mask input)
        or "baseline" (the baseline first click is fixed; the grid click is
        the second click, with the sign the baseline clicker gives click 2
        and, for a positive one, the model's feedback of the first prediction
        as mask input: the reference's reset quirk).
      thr: probability threshold (default: ``segmenter.probability_threshold``).
      multimask_output: True = the multimask output and the model's selection.
      dilation_ratio: Boundary IoU band ratio (0.02).
      announce: ``text -> None`` told before a bucket's program is compiled.

    Returns:
      A `runner.program.BatchProgram`. Outputs (leading axis B; Gh, Gw = grid size):
        iou, biou: f32[B, Gh, Gw] heatmaps (NaN where not evaluated);
        evaluated: bool[B, Gh, Gw]; rows: i32[B, Gh]; cols: i32[B, Gw];
        n_evaluated: i32[B]; every click below is (x, y) in original-image pixels:
        first_click_xy: i32[B, 2] the baseline first click (positive);
        baseline_click_xy: i32[B, 2] the baseline's click at the grid click's place;
        grid_click_positive: bool[B] the label of the grid clicks and of that baseline click
          (always True for prefix "none");
        baseline_iou, baseline_biou: f32[B] its scores (whatever the stride);
        {iou, biou}_{min, max}: f32[B]; {iou, biou}_{argmin, argmax}_xy: i32[B, 2]
          (x, y) of the first extreme in row-major order ((-1, -1) if none).
    """
    thr = float(segmenter.probability_threshold) if thr is None else thr
    config = ClickGridConfig(stride=stride, chunk_size=chunk_size, region=region, prefix=prefix, thr=thr,
                             multimask_output=multimask_output, dilation_ratio=dilation_ratio)
    return BatchProgram(segmenter, params, ClickGridProtocol(config), announce=announce)


__all__ = ["DEFAULT_THRESHOLD", "CLICK_REGIONS", "CLICK_PREFIXES", "RECORDS_FORMAT", "check_frame", "binarise",
           "ClickGridResult", "click_grid", "ClickGridConfig", "extreme_outputs", "baseline_prefix",
           "ClickGridProtocol", "make_click_grid_batch_fn"]
