"""Click trajectories on the Segmenter protocol: the RITM baseline and TETRIS adversarial clicks (min/max).

Spec: docs/protocols/tetris.md §1 (baseline clicker), §2.2 (disk
rendering), §2.3 (SAM input pipeline), §3.1-3.3 and §3.5 (the attack and its
metrics), §7 (hyper-parameters, paper/code table rows 1-6), §8 (pitfalls).

Trajectory (`click_trajectory`, one instance; vmap it over instances), K clicks,
greedy, no early stop (spec §3.1):

  for k = 1..K:
    c_k   = baseline click of ``P_{k-1} > thr`` (RITM clicker, §1; sign fixed)
    P_k   = optimise_click(c_k)          (baseline: iterate 0 only)
    the clicker stores the optimised float click; IoU_k, BIoU_k of ``P_k > thr``

Per-click optimisation (SAM family, §3.2), ``S = n_opt_steps`` evaluated
iterates (iterate 0 = the baseline click, then one Adam update per iterate):
  * variable ``q = (col sx, row sy)`` in SAM's resized frame, fed to SAM raw
    (unclipped) together with the previous clicks (chronological; the previous
    clicks are the *reported* ones re-scaled); SAM adds +0.5 itself;
  * mask input: the previous click's accepted low-res logits of the selected
    mask, except that the reference resets it when ``max(#pos, #neg) <= 1``
    (current click included): click 1 and the state (1 pos, 1 neg) get none
    (``mask_input="code"``; ``"always"`` feeds it from click 2 on);
  * multimask output, argmax predicted IoU, ``P = sigmoid(logits)`` at the
    evaluation frame (``SamSegmenter.decode``);
  * ``L = Lloc + s Dice(P, G+) dice_weight`` with ``s = +1`` MAX / ``-1`` MIN
    (both minimise L), ``dice_weight = 1/1000``;
  * ``Lloc = mean over the h' x w' resized grid of disk(q) * D`` where the disk
    (radius 5, centre ``clamp(q + 0.5, [0, w'-1] x [0, h'-1])``, torch clamp
    gradient) is rendered with `jaxseg_robust.ops.render.render_soft_disk`
    (exact-area coverage by default, the spec's ramp with
    ``coverage="ramp"``; both are deliberate surrogates of pydiffvg) and ``D``
    is the Euclidean distance (original-image pixels) to the nearest FN pixel
    (positive click) or FP pixel (negative click) of ``P_{k-1} > 0.5`` against
    ``G+`` (ignore = background), resized to ``(h', w')`` with bilinear
    ``align_corners=True``. With no such pixel the reference's OpenCV returns
    ~1.8e19 everywhere; here ``D`` is then the image diagonal
    ``sqrt(H^2 + W^2)`` everywhere (finite; documented deviation, only
    reachable in degenerate cases). Only the disk's (2 ceil(R) + 5)^2 window of
    the grid is evaluated: the disk is zero elsewhere, so the mean is exact;
  * Adam (optax defaults = torch defaults) with ``lr = lr_mult 5 sqrt(H^2 +
    W^2) / (400 sqrt 2)``, H, W = the evaluation-frame size although q lives in
    the resized frame (code behaviour); re-created per click;
  * acceptance (``acceptance="code"``): ``Lloc <= tolerance * bestLoc``
    (``tolerance = 1.05``, bestLoc = the last *accepted* Lloc, +inf before
    iterate 0) and ``(IoU, BIoU)`` lexicographically better than the best so
    far (``<`` MIN, ``>`` MAX; start (2, 2) / (-2, -2)), with the *selection*
    metrics (ignore pixels counted as background, 0 on an empty union).
    Iterate 0 is always accepted. On accept: P, the low-res logits and the
    reported click ``r = clip((q_y / sy, q_x / sx), [0, H-1] x [0, W-1])``
    are stored. ``acceptance="paper"`` (spec §7.2 row 5, the paper's text as
    we read it): IoU alone (strict), tolerance relative to iterate 0's Lloc;
  * the update after the last iterate is computed by the reference and never
    evaluated; it is skipped here (S evaluations, S - 1 gradients).

Empty GT (the reference crashes): the selection scores are 0 for every
iterate, so only iterate 0 (or a different BIoU) is accepted; the reported
scores are NaN.

Guarantees worth knowing (tested): per click, the accepted selection (IoU, BIoU)
is lexicographically <= (MIN) / >= (MAX) iterate 0's, i.e. MIN <= baseline <=
MAX *given the same history* (at click 1 the history is empty, so the MIN/MAX
runs' click 1 brackets the baseline run's click 1); every accepted Lloc is <=
tolerance x the previously accepted one (so an iterate-0 disk lying fully in
the error region keeps every accepted disk there); reported clicks lie in
``[0, H-1] x [0, W-1]``; the click sign is the baseline's. The *reported*
metrics (ignore pixels excluded, NaN on an empty union, spec §3.5) can break
the per-click order on datasets with ignore pixels (spec §8 pitfall 10).

Paper/code options (spec §7.2): ``n_opt_steps=10`` (row 1, "at most 10
iterations"), ``optimise_first_click=False`` (row 2: the first click is the
baseline click), ``acceptance="paper"`` (row 5). Row 3 (the paper's "sum of
distances in FN positions under the circle") is not offered: its sign and
normalisation are not recoverable from the text; rows 4 and 6 coincide with the
code for SAM.

Baseline (``mode="baseline"``): the same loop with one evaluated iterate per
click and no gradient (spec §3.5: ``--lr_mult=0 --n_opt_steps=1``), e.g. 20
clicks for NoC.

Boundary IoU band widths are per-instance data (``max(1, round(0.02 sqrt(H^2
+ W^2)))``); frames are padded (bucket frame ``(Hf, Wf)``), everything outside
the image is masked, so a padded frame gives the unpadded numbers.

Batch adapter (`make_click_batch_fn`): ``PaddedBatch -> dict of arrays [B, ...]``
for `jaxseg_robust.runner.engine.run`; host preprocessing as
`jaxseg_robust.attacks.boxes.make_box_batch_fn` (crop each slot to its size,
``SamSegmenter.preprocess(..., frame_hw=bucket frame)``), then one jitted
program: embed the batch once, ``vmap`` the trajectory over instances
(``lax.scan`` over clicks, ``lax.scan`` over optimisation steps), MIN and MAX of
``mode="minmax"`` vmapped over the mode on the same features. Dataset scores
from records: `tetris_scores`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping, Sequence

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import lax

from jaxseg_robust.attacks.batching import (
    check_batch,
    low_res_shape,
    place_like,
    preprocess_slots,
    stack_trees,
    unit_scale,
)
from jaxseg_robust.attacks.objectives import dice_loss
from jaxseg_robust.attacks.scoring import (
    IGNORE_LABEL,
    START_MAX,
    START_MIN,
    attack_scores,
    boundary_widths,
    gt_words,
    image_region,
    is_better,
)
from jaxseg_robust.metrics.interactive import (
    TETRIS_NUM_CLICKS,
    normalized_auc,
    number_of_clicks,
    number_of_failures,
    tetris_auc,
    tetris_min_max_delta,
)
from jaxseg_robust.metrics.masks import DEFAULT_DILATION_RATIO
from jaxseg_robust.models.base import Transform
from jaxseg_robust.ops.distance import distance_transform_edt
from jaxseg_robust.ops.render import COVERAGE_AREA, COVERAGE_RAMP, DEFAULT_CLICK_RADIUS, render_soft_disk
from jaxseg_robust.prompts.clicker import mark_clicked, next_click
from jaxseg_robust.prompts.types import NEGATIVE_LABEL, PADDING_LABEL, POSITIVE_LABEL, Prompts

DEFAULT_N_CLICKS = TETRIS_NUM_CLICKS  # 10 (TETRIS); use 20 for NoC
DEFAULT_N_OPT_STEPS = 11  # evaluated iterates per click: the baseline click + 10 updates (run.sh)
DEFAULT_LR_MULT = 1.0
DEFAULT_THRESHOLD = 0.5  # SAM family (run.sh); the RITM tools default to 0.49
LOCATION_THRESHOLD = 0.5  # the location-loss DTs always binarise the previous map at 0.5
DEFAULT_TOLERANCE = 1.05  # Lloc <= 1.05 * bestLoc
DEFAULT_DICE_WEIGHT = 1e-3  # L = Lloc + s * Dice / 1000
LR_BASE = 5.0
LR_REFERENCE_SIZE = 400  # lr = lr_mult * 5 * sqrt(H^2 + W^2) / (400 sqrt 2)
ATTACK_MODES = ("min", "max")
TRAJECTORY_MODES = ("baseline", "min", "max")
BATCH_MODES = ("baseline", "min", "max", "minmax")
MASK_INPUT_MODES = ("code", "always")
ACCEPTANCE_MODES = ("code", "paper")


# ---- configuration --------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class TetrisConfig:
    """Static settings of a click trajectory (defaults: the TETRIS reference code, spec §7.1).

    Attributes:
      mode: "baseline" (RITM clicker, no optimisation), "min" (IoU-decreasing,
        s = -1) or "max" (IoU-increasing, s = +1).
      n_clicks: clicks per trajectory K (10 for TETRIS AuC@10, 20 for NoC).
      n_opt_steps: evaluated iterates per click S (baseline click + S - 1 Adam
        updates); ignored (1) in "baseline" mode. Paper: 10, code: 11.
      lr_mult: lr multiplier (lr = lr_mult 5 sqrt(H^2 + W^2) / (400 sqrt 2)).
      thr: probability threshold of the metrics and the clicker (P > thr;
        0.5 == logit > 0).
      radius: disk radius of the location loss, resized-frame pixels (5).
      tolerance: location-loss acceptance factor (1.05).
      dice_weight: weight of the signed Dice term (1/1000).
      location_threshold: threshold of the previous map for the location-loss
        distance maps (0.5 whatever ``thr`` is).
      coverage, samples_per_axis: disk renderer (`ops.render.render_soft_disk`):
        "area" (exact area, default) or "ramp" (the spec's anti-aliased ramp).
      mask_input: "code" (the reference's reset quirk, §2.3 item 3) or "always".
      optimise_first_click: False = the paper's reading (§7.2 row 2): click 1
        is the baseline click.
      acceptance: "code" (lexicographic (IoU, BIoU), tolerance vs the last
        accepted Lloc) or "paper" (IoU only, tolerance vs iterate 0's Lloc).
      record_trajectory: also return the per-iterate log (`ClickIterates`).
      return_mask: also return the last click's binary mask (frame-sized).
      dilation_ratio: Boundary IoU band ratio (documents the widths the caller
        passes; `boundary_widths` uses it).
    """

    mode: str = "min"
    n_clicks: int = DEFAULT_N_CLICKS
    n_opt_steps: int = DEFAULT_N_OPT_STEPS
    lr_mult: float = DEFAULT_LR_MULT
    thr: float = DEFAULT_THRESHOLD
    radius: float = DEFAULT_CLICK_RADIUS
    tolerance: float = DEFAULT_TOLERANCE
    dice_weight: float = DEFAULT_DICE_WEIGHT
    location_threshold: float = LOCATION_THRESHOLD
    coverage: str = COVERAGE_AREA
    samples_per_axis: int = 1
    mask_input: str = "code"
    optimise_first_click: bool = True
    acceptance: str = "code"
    record_trajectory: bool = False
    return_mask: bool = False
    dilation_ratio: float = DEFAULT_DILATION_RATIO

    def __post_init__(self):
        if self.mode not in TRAJECTORY_MODES:
            raise ValueError(f"mode must be one of {TRAJECTORY_MODES}; got {self.mode!r}")
        for name in ("n_clicks", "n_opt_steps", "samples_per_axis"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int; got {value!r}")
        for name in ("lr_mult", "thr", "radius", "tolerance", "dice_weight", "location_threshold",
                     "dilation_ratio"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number; got {value!r}")
        if self.lr_mult < 0 or self.dice_weight < 0 or self.tolerance < 0:
            raise ValueError(f"lr_mult, dice_weight and tolerance must be >= 0; got {self.lr_mult}, "
                             f"{self.dice_weight}, {self.tolerance}")
        if not self.radius > 0:
            raise ValueError(f"radius must be > 0; got {self.radius}")
        for name in ("thr", "location_threshold"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"{name} must be in [0, 1); got {getattr(self, name)}")
        if self.coverage not in (COVERAGE_AREA, COVERAGE_RAMP):
            raise ValueError(f"coverage must be {COVERAGE_AREA!r} or {COVERAGE_RAMP!r}; got {self.coverage!r}")
        if self.coverage == COVERAGE_AREA and self.samples_per_axis != 1:
            raise ValueError("samples_per_axis applies to coverage='ramp' only")
        if self.mask_input not in MASK_INPUT_MODES:
            raise ValueError(f"mask_input must be one of {MASK_INPUT_MODES}; got {self.mask_input!r}")
        if self.acceptance not in ACCEPTANCE_MODES:
            raise ValueError(f"acceptance must be one of {ACCEPTANCE_MODES}; got {self.acceptance!r}")
        if not isinstance(self.optimise_first_click, bool):
            raise ValueError(f"optimise_first_click must be a bool; got {self.optimise_first_click!r}")

    @property
    def optimises(self) -> bool:
        """True for the attacks (clicks are optimised)."""
        return self.mode in ATTACK_MODES

    @property
    def evaluated_iterates(self) -> int:
        """Iterates evaluated per click (1 for the baseline)."""
        return self.n_opt_steps if self.optimises else 1


def tetris_learning_rate(height, width, lr_mult: float = DEFAULT_LR_MULT) -> jnp.ndarray:
    """TETRIS Adam step size ``lr_mult 5 sqrt(H^2 + W^2) / (400 sqrt 2)``.

    Args:
      height, width: evaluation-frame image size in pixels (ints or i32 arrays, may be traced).
      lr_mult: multiplier (reference: 1).

    Returns:
      f32[...] learning rate in resized-frame pixels per step (480 x 640 -> 7.07).
    """
    h = jnp.asarray(height, jnp.float32)
    w = jnp.asarray(width, jnp.float32)
    return jnp.float32(lr_mult * LR_BASE) * jnp.sqrt(h * h + w * w) / jnp.float32(LR_REFERENCE_SIZE * math.sqrt(2.0))


# ---- the interaction-location loss -------------------------------------------------------

def location_error_region(target, previous_probability, is_positive, region,
                          threshold: float = LOCATION_THRESHOLD) -> jnp.ndarray:
    """The error region a click of the given sign should lie in (spec §3.2 item 1).

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
    (OpenCV returns ~1.8e19 there; spec §8 pitfall 6).

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
    """TETRIS interaction-location loss of one click (spec §3.2 item 4a), differentiable in ``point``.

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


# ---- results --------------------------------------------------------------------------

@flax.struct.dataclass
class ClickIterates:
    """Per-iterate log of every click (each [K, S, ...]; S = evaluated iterates).

    Attributes:
      point_resized: f32[K, S, 2] the variable q (x, y) SAM saw (resized frame).
      click: f32[K, S, 2] reported (row, col), evaluation frame, clipped.
      loss, dice, location: f32[K, S] L, Dice loss, Lloc.
      selection_iou, selection_biou, iou, biou: f32[K, S].
      accepted: bool[K, S].
    """

    point_resized: jnp.ndarray
    click: jnp.ndarray
    loss: jnp.ndarray
    dice: jnp.ndarray
    location: jnp.ndarray
    selection_iou: jnp.ndarray
    selection_biou: jnp.ndarray
    iou: jnp.ndarray
    biou: jnp.ndarray
    accepted: jnp.ndarray


@flax.struct.dataclass
class ClickTrajectory:
    """Outcome of one trajectory (add a leading axis when vmapped; K = n_clicks).

    Attributes:
      clicks: f32[K, 2] reported clicks (row, col), evaluation frame (float;
        integers for the baseline).
      is_positive: bool[K] click signs (the baseline clicker's).
      baseline_clicks: i32[K, 2] (row, col) of the baseline clicker, the
        initial position of each optimised click.
      has_mask_input: bool[K] whether SAM got the previous low-res logits.
      iou, biou: f32[K] reported scores of the accepted iterate (ignore
        excluded, NaN on an empty union): the curves of AuC@10.
      selection_iou, selection_biou: f32[K] acceptance scores (ignore =
        background, 0 on an empty union).
      start_selection_iou, start_selection_biou, start_iou, start_biou: f32[K]
        scores of iterate 0 (the baseline click given the same history).
      location_loss, start_location_loss: f32[K] Lloc of the accepted iterate
        and of iterate 0 (0 for the baseline).
      in_error_region: bool[K] the rounded reported click lies in the error
        region of its sign (location-loss definition, ``P_{k-1} > 0.5``).
      best_step: i32[K] accepted iterate; n_accepted: i32[K].
      learning_rate: f32[] Adam step size.
      iterates: `ClickIterates` or None; mask: bool[Hf, Wf] last mask or None.
    """

    clicks: jnp.ndarray
    is_positive: jnp.ndarray
    baseline_clicks: jnp.ndarray
    has_mask_input: jnp.ndarray
    iou: jnp.ndarray
    biou: jnp.ndarray
    selection_iou: jnp.ndarray
    selection_biou: jnp.ndarray
    start_selection_iou: jnp.ndarray
    start_selection_biou: jnp.ndarray
    start_iou: jnp.ndarray
    start_biou: jnp.ndarray
    location_loss: jnp.ndarray
    start_location_loss: jnp.ndarray
    in_error_region: jnp.ndarray
    best_step: jnp.ndarray
    n_accepted: jnp.ndarray
    learning_rate: jnp.ndarray
    iterates: object = None
    mask: object = None


def _check_frame(gt, transform: Transform) -> None:
    if transform.frame_hw is None:
        raise ValueError("transform.frame_hw must be set (SamSegmenter.preprocess sets it)")
    if gt.ndim != 2 or tuple(gt.shape) != tuple(transform.frame_hw):
        raise ValueError(f"gt must have the transform's frame shape {tuple(transform.frame_hw)}; got {gt.shape}")


def click_prompts(points, labels, mask_logits, has_mask) -> Prompts:
    """Clicks-only `Prompts` (no box): points f32[K, 2] (x, y), labels i32[K] (-1 unused)."""
    return Prompts(points=points, labels=labels, box=jnp.zeros((4,), jnp.float32), has_box=jnp.asarray(False),
                   mask_logits=mask_logits, has_mask=jnp.asarray(has_mask, bool))


def reported_click(point_resized, transform: Transform) -> jnp.ndarray:
    """f32[2] (row, col) of a resized-frame point (x, y): ``(y / sy, x / sx)`` clipped to the image."""
    scale = jnp.asarray(transform.scale_xy, jnp.float32)
    hw = jnp.asarray(transform.original_hw, jnp.float32)
    row = jnp.clip(point_resized[1] / scale[1], 0.0, hw[0] - 1.0)
    col = jnp.clip(point_resized[0] / scale[0], 0.0, hw[1] - 1.0)
    return jnp.stack([row, col])


def _pixel_at(mask, click):
    """mask value at the rounded (row, col) click (clipped into the frame)."""
    row = jnp.clip(jnp.round(click[0]).astype(jnp.int32), 0, mask.shape[0] - 1)
    col = jnp.clip(jnp.round(click[1]).astype(jnp.int32), 0, mask.shape[1] - 1)
    return mask[row, col]


# ---- the trajectory -------------------------------------------------------------------

def click_trajectory(segmenter, params, features, transform: Transform, gt, width,
                     config: TetrisConfig = TetrisConfig(), maximise=None) -> ClickTrajectory:
    """A baseline or TETRIS (min/max) click trajectory of one instance (pure; jit, vmap over instances).

    Args:
      segmenter: a SAM-family Segmenter (static, closed over).
      params: its parameter pytree.
      features: the instance's cached image features (one image; no gradient flows to them).
      transform: its `Transform` (``frame_hw`` = the frame of ``gt``).
      gt: int [Hf, Wf] 1 object / 0 background / -1 ignore (anything outside
        the image is ignored via ``transform.original_hw``).
      width: i32[] Boundary IoU band width of the image (`boundary_widths`).
      config: static `TetrisConfig`.
      maximise: optional bool[] overriding the MIN/MAX choice of
        ``config.mode`` as *data* (True = MAX), so one program runs both
        (`tetris_min_max`). Only for the attack modes.

    Returns:
      `ClickTrajectory` (module docstring for the protocol).
    """
    gt = jnp.asarray(gt)
    _check_frame(gt, transform)
    if maximise is not None and not config.optimises:
        raise ValueError("maximise applies to the 'min'/'max' modes only")
    features = jax.tree.map(lax.stop_gradient, features)
    width = jnp.asarray(width, jnp.int32)
    n_clicks, n_iterates = config.n_clicks, config.evaluated_iterates
    mask_shape = low_res_shape(segmenter)
    region = image_region(transform)
    target = (gt == 1) & region
    labelled = region & (gt != IGNORE_LABEL)
    target_float = target.astype(jnp.float32)
    packed_gt = gt_words(gt, region, width)
    scale = jnp.asarray(transform.scale_xy, jnp.float32)
    model_transform = unit_scale(transform)
    learning_rate = tetris_learning_rate(transform.original_hw[0], transform.original_hw[1], config.lr_mult)
    optimizer = optax.adam(learning_rate)
    maximise = jnp.asarray(config.mode == "max" if maximise is None else maximise, bool)
    sign = jnp.where(maximise, jnp.float32(1.0), jnp.float32(-1.0))
    start = jnp.where(maximise, jnp.float32(START_MAX), jnp.float32(START_MIN))
    slots = jnp.arange(n_clicks)
    paper_acceptance = config.acceptance == "paper"

    def one_click(state, index):
        points, labels, not_clicked, probability, low_res = state
        pred = (probability > config.thr) & region
        is_positive, row, col = next_click(target, pred, not_clicked, labelled)
        label = jnp.where(is_positive, POSITIVE_LABEL, NEGATIVE_LABEL).astype(jnp.int32)
        labels_now = jnp.where(slots == index, label, labels)
        positives = jnp.sum(labels_now == POSITIVE_LABEL)
        negatives = jnp.sum(labels_now == NEGATIVE_LABEL)
        if config.mask_input == "code":
            has_mask = (index > 0) & (jnp.maximum(positives, negatives) > 1)
        else:
            has_mask = index > 0
        errors = location_error_region(target, probability, is_positive, region, config.location_threshold)
        distance = location_distance_map(errors, transform.original_hw) if config.optimises else None
        q0 = jnp.stack([col.astype(jnp.float32) * scale[0], row.astype(jnp.float32) * scale[1]])
        current = (slots == index)[:, None]

        def objective(q):
            prompt_points = jnp.where(current, q[None, :], points)
            prompts = click_prompts(prompt_points, labels_now, low_res, has_mask)
            prediction = segmenter.decode(params, features, prompts, model_transform, multimask_output=True)
            prob = jax.nn.sigmoid(prediction.logits)
            dice = dice_loss(prob, target_float, region)
            if config.optimises:
                loc = location_loss(q, distance, transform.original_hw, transform.resized_hw, config.radius,
                                    coverage=config.coverage, samples_per_axis=config.samples_per_axis)
            else:
                loc = jnp.float32(0.0)
            loss = loc + sign * jnp.float32(config.dice_weight) * dice
            return loss, (prob, prediction.selected_low_res, dice, loc)

        may_accept = jnp.asarray(True) if config.optimise_first_click else index > 0

        def consider(best, q, loss, aux, step):
            prob, low, dice, loc = aux
            scores = attack_scores((prob > config.thr) & region, packed_gt, width)
            if paper_acceptance:
                better = jnp.where(maximise, scores.selection_iou > best["selection_iou"],
                                   scores.selection_iou < best["selection_iou"])
            else:
                better = is_better(scores, best["selection_iou"], best["selection_biou"], maximise)
            reference_loc = best["reference_loc"]
            within = (reference_loc == jnp.inf) | (loc <= jnp.float32(config.tolerance) * reference_loc)
            accept = within & better & ((step == 0) | may_accept)
            candidate = {"selection_iou": scores.selection_iou, "selection_biou": scores.selection_biou,
                         "iou": scores.iou, "biou": scores.biou, "loc": loc, "reference_loc": loc,
                         "probability": prob, "low_res": low, "point": q, "step": step,
                         "accepted": best["accepted"] + 1}
            new = jax.tree.map(lambda c, o: jnp.where(accept, c, o), candidate, best)
            if paper_acceptance:  # tolerance relative to iterate 0's Lloc
                new["reference_loc"] = jnp.where(step == 0, loc, best["reference_loc"])
            log = {"point_resized": q, "click": reported_click(q, transform), "loss": loss, "dice": dice,
                   "location": loc, "selection_iou": scores.selection_iou,
                   "selection_biou": scores.selection_biou, "iou": scores.iou, "biou": scores.biou,
                   "accepted": accept}
            return new, log

        best = {"selection_iou": start, "selection_biou": start, "iou": jnp.float32(jnp.nan),
                "biou": jnp.float32(jnp.nan), "loc": jnp.float32(jnp.inf), "reference_loc": jnp.float32(jnp.inf),
                "probability": probability, "low_res": low_res, "point": q0, "step": jnp.int32(0),
                "accepted": jnp.int32(0)}

        if n_iterates > 1:
            def step(carry, step_index):
                q, opt_state, best = carry
                (loss, aux), grad = jax.value_and_grad(objective, has_aux=True)(q)
                best, log = consider(best, q, loss, aux, step_index)
                updates, opt_state = optimizer.update(grad, opt_state, q)
                return (optax.apply_updates(q, updates), opt_state, best), log

            (q_last, _, best), logs = lax.scan(step, (q0, optimizer.init(q0), best),
                                               jnp.arange(n_iterates - 1, dtype=jnp.int32))
        else:
            q_last, logs = q0, None
        loss, aux = objective(q_last)
        best, last_log = consider(best, q_last, loss, aux, jnp.int32(n_iterates - 1))
        last_log = jax.tree.map(lambda leaf: leaf[None], last_log)
        logs = last_log if logs is None else jax.tree.map(
            lambda a, b: jnp.concatenate([a, b]), logs, last_log)

        click = reported_click(best["point"], transform)
        if not config.optimises:  # the baseline's click is the integer pixel itself
            click = jnp.stack([row, col]).astype(jnp.float32)
        point_resized = jnp.stack([click[1] * scale[0], click[0] * scale[1]])
        points = jnp.where(current, point_resized[None, :], points)
        not_clicked = mark_clicked(not_clicked, click[0], click[1])
        record = {
            "clicks": click, "is_positive": is_positive, "baseline_clicks": jnp.stack([row, col]),
            "has_mask_input": has_mask, "iou": best["iou"], "biou": best["biou"],
            "selection_iou": best["selection_iou"], "selection_biou": best["selection_biou"],
            "start_selection_iou": logs["selection_iou"][0], "start_selection_biou": logs["selection_biou"][0],
            "start_iou": logs["iou"][0], "start_biou": logs["biou"][0],
            "location_loss": best["loc"], "start_location_loss": logs["location"][0],
            "in_error_region": _pixel_at(errors, click),
            "best_step": best["step"], "n_accepted": best["accepted"],
        }
        if config.record_trajectory:
            record["iterates"] = logs
        new_state = (points, labels_now, not_clicked, best["probability"], best["low_res"])
        return new_state, record

    state0 = (jnp.zeros((n_clicks, 2), jnp.float32), jnp.full((n_clicks,), PADDING_LABEL, jnp.int32),
              jnp.ones(gt.shape, bool), jnp.zeros(gt.shape, jnp.float32), jnp.zeros(mask_shape, jnp.float32))
    final_state, records = lax.scan(one_click, state0, jnp.arange(n_clicks, dtype=jnp.int32))
    iterates = records.pop("iterates", None)
    mask = ((final_state[3] > config.thr) & region) if config.return_mask else None
    return ClickTrajectory(learning_rate=learning_rate,
                           iterates=None if iterates is None else ClickIterates(**iterates), mask=mask,
                           **records)



def tetris_min_max(segmenter, params, features, transform: Transform, gt, width,
                   config: TetrisConfig = TetrisConfig(mode="min")) -> ClickTrajectory:
    """MIN and MAX trajectories of one instance on shared features (``config.mode`` must be an attack).

    Same arguments as `click_trajectory`.

    Returns:
      `ClickTrajectory` with a leading axis of size 2: index 0 = MIN, 1 = MAX.
    """
    if not config.optimises:
        raise ValueError(f"tetris_min_max needs an attack config (mode 'min' or 'max'); got {config.mode!r}")
    run = functools.partial(click_trajectory, segmenter, params, features, transform, gt, width, config)
    return jax.vmap(lambda maximise: run(maximise=maximise))(jnp.array([False, True]))


# ---- batch adapter for the engine -----------------------------------------------------

_PER_CLICK_FIELDS = ("clicks", "is_positive", "baseline_clicks", "has_mask_input", "iou", "biou",
                     "selection_iou", "selection_biou", "start_selection_iou", "start_selection_biou",
                     "start_iou", "start_biou", "location_loss", "start_location_loss", "in_error_region",
                     "best_step", "n_accepted")


def trajectory_outputs(result: ClickTrajectory, config: TetrisConfig) -> dict:
    """A batched `ClickTrajectory` as the engine's output dict (leading axis B).

    Keys: the per-click fields of `ClickTrajectory` ([B, K] / [B, K, 2]),
    ``learning_rate`` [B], ``auc_iou`` / ``auc_biou`` [B] (per-instance
    normalised AuC over the K clicks, NaN for K = 1), and with the options
    ``iterates`` (dict of [B, K, S, ...]) and ``mask`` [B, Hf, Wf].
    The attack-only fields (iterate 0 and location losses, steps) are left
    out for the baseline.
    """
    fields = _PER_CLICK_FIELDS if config.optimises else (
        "clicks", "is_positive", "has_mask_input", "iou", "biou", "selection_iou", "selection_biou",
        "in_error_region")
    outputs = {name: getattr(result, name) for name in fields}
    outputs["learning_rate"] = result.learning_rate
    for name in ("iou", "biou"):
        curve = getattr(result, name)
        outputs[f"auc_{name}"] = (normalized_auc(curve) if config.n_clicks > 1
                                  else jnp.full(curve.shape[:-1], jnp.nan, jnp.float32))
    if config.record_trajectory and config.optimises:
        outputs["iterates"] = {field.name: getattr(result.iterates, field.name)
                               for field in dataclasses.fields(result.iterates)}
    if config.return_mask:
        outputs["mask"] = result.mask
    return outputs


class ClickBatchFunction:
    """``PaddedBatch -> dict[str, arrays [B, ...]]`` for one click protocol (see `make_click_batch_fn`).

    Attributes:
      traces: how many times the jitted core was traced (one per bucket shape and placement).
      mode: "baseline", "min", "max" or "minmax"; config: the `TetrisConfig`.
    """

    def __init__(self, segmenter, params, mode: str, config: TetrisConfig):
        self.segmenter = segmenter
        self.params = params
        self.mode = mode
        self.config = config
        self.traces = 0
        self._core = jax.jit(self._run)

    def _run(self, params, model_input, transform, gt, width):
        self.traces += 1  # runs once per trace
        features = self.segmenter.embed(params, model_input)
        if self.mode == "minmax":
            attack = functools.partial(tetris_min_max, self.segmenter, params, config=self.config)
            result = jax.vmap(attack)(features, transform, gt, width)  # leaves [B, 2, ...]
            return {mode: trajectory_outputs(jax.tree.map(lambda leaf: leaf[:, index], result), self.config)
                    for index, mode in enumerate(ATTACK_MODES)}
        trajectory = functools.partial(click_trajectory, self.segmenter, params, config=self.config)
        return trajectory_outputs(jax.vmap(trajectory)(features, transform, gt, width), self.config)

    def __call__(self, batch) -> dict:
        """Runs the protocol on a `PaddedBatch` (host preprocessing, then one jitted call)."""
        images, gts, sizes = check_batch(batch)
        model_input, transforms = preprocess_slots(self.segmenter, images, sizes, (gts.shape[1], gts.shape[2]))
        args = (model_input, stack_trees(transforms), gts, boundary_widths(sizes, self.config.dilation_ratio))
        return self._core(self.params, *place_like(args, batch.gt))


def make_click_batch_fn(segmenter, params, *, mode: str = "minmax", n_clicks: int = DEFAULT_N_CLICKS,
                        n_opt_steps: int = DEFAULT_N_OPT_STEPS, lr_mult: float = DEFAULT_LR_MULT,
                        thr: float = DEFAULT_THRESHOLD, **options) -> ClickBatchFunction:
    """A batch function for `jaxseg_robust.runner.engine.run` running one click protocol.

    Args:
      segmenter: a SAM-family Segmenter (static).
      params: its parameters (for several devices: ``replicate(params, mesh)``).
      mode: "baseline" (RITM clicker, the previous low-res mask fed back as the
        reference does; 20 clicks for NoC), "min" / "max" (TETRIS attacks),
        "minmax" (both attacks in one compiled program on one embedding per image).
      n_clicks: clicks per trajectory (``--n-clicks``; 10 for TETRIS).
      n_opt_steps: evaluated iterates per click (``--n_opt_steps``; 11 =
        baseline click + 10 Adam updates); ignored by "baseline".
      lr_mult: ``--lr_mult`` (lr = lr_mult 5 sqrt(H^2 + W^2) / (400 sqrt 2)).
      thr: ``--thr`` probability threshold (0.5 for SAM).
      **options: any other `TetrisConfig` field (radius, tolerance,
        dice_weight, location_threshold, coverage, samples_per_axis,
        mask_input, optimise_first_click, acceptance, record_trajectory,
        return_mask, dilation_ratio).

    Returns:
      A `ClickBatchFunction`; its outputs (leading axis B, K = n_clicks):
        baseline: clicks [B, K, 2] (row, col), is_positive, has_mask_input,
          iou, biou, selection_iou, selection_biou, in_error_region [B, K],
          learning_rate, auc_iou, auc_biou [B] [, mask];
        min / max: the above plus baseline_clicks [B, K, 2], start_iou,
          start_biou, start_selection_iou, start_selection_biou,
          location_loss, start_location_loss, best_step, n_accepted [B, K]
          [, iterates/*];
        minmax: {"min": ..., "max": ...} with the attack fields.

    Raises:
      ValueError: unknown mode or option, or an invalid setting.
    """
    if mode not in BATCH_MODES:
        raise ValueError(f"mode must be one of {BATCH_MODES}; got {mode!r}")
    known = {field.name for field in dataclasses.fields(TetrisConfig)} - {"mode", "n_clicks", "n_opt_steps",
                                                                        "lr_mult", "thr"}
    unknown = set(options) - known
    if unknown:
        raise ValueError(f"unknown options {sorted(unknown)}; known: {sorted(known)}")
    config = TetrisConfig(mode="min" if mode == "minmax" else mode, n_clicks=n_clicks, n_opt_steps=n_opt_steps,
                          lr_mult=lr_mult, thr=thr, **options)
    return ClickBatchFunction(segmenter, params, mode, config)


# ---- dataset scores from records ----------------------------------------------------------

def _curves(payloads: Sequence[Mapping], name: str, num_clicks: int) -> np.ndarray:
    rows = []
    for index, payload in enumerate(payloads):
        curve = np.asarray(payload[name], np.float64).reshape(-1)
        if curve.shape[0] < num_clicks:
            raise ValueError(f"payload {index} has {curve.shape[0]} clicks of {name!r}; need {num_clicks}")
        rows.append(curve[:num_clicks])
    return np.stack(rows).astype(np.float32)


def trajectory_scores(payloads: Sequence[Mapping], *, num_clicks: int = DEFAULT_N_CLICKS,
                      skip_nan: bool = False, noc_thresholds: Sequence[float] = (0.85, 0.9)) -> dict:
    """Dataset scores of one run's trajectories (baseline, MIN or MAX), in [0, 1].

    Args:
      payloads: per-instance outputs of one mode (record payloads of a
        "baseline"/"min"/"max" run, or the "min"/"max" parts of "minmax").
      num_clicks: clicks used (AuC@num_clicks, NoC max clicks).
      skip_nan: drop instances with a NaN in their curve (see `metrics.interactive`).
      noc_thresholds: NoC@t / NoF@t thresholds.

    Returns:
      {"iou_auc", "biou_auc": AuC of the mean curve (TETRIS AuC@K),
       "mean_iou", "mean_biou": the mean curves (lists of K floats),
       "noc@t", "nof@t" per threshold (NoC averaged over instances),
       "instances": N}.
    """
    if not payloads:
        raise ValueError("payloads must not be empty")
    if num_clicks < 2:
        raise ValueError(f"num_clicks must be >= 2 for an AuC; got {num_clicks}")
    ious = _curves(payloads, "iou", num_clicks)
    bious = _curves(payloads, "biou", num_clicks)
    scores = {"iou_auc": float(tetris_auc(ious, num_clicks, skip_nan=skip_nan)),
              "biou_auc": float(tetris_auc(bious, num_clicks, skip_nan=skip_nan)),
              "instances": len(payloads)}
    for name, curves in (("mean_iou", ious), ("mean_biou", bious)):
        kept = curves[~np.isnan(curves).any(axis=1)] if skip_nan else curves
        scores[name] = [float(v) for v in (kept.mean(axis=0) if len(kept) else np.full(num_clicks, np.nan))]
    for threshold in noc_thresholds:
        label = f"{round(100 * threshold)}"
        scores[f"noc@{label}"] = float(np.mean(number_of_clicks(ious, threshold, num_clicks)))
        scores[f"nof@{label}"] = int(number_of_failures(ious, threshold, num_clicks))
    return scores


def tetris_scores(min_payloads: Sequence[Mapping], max_payloads: Sequence[Mapping] | None = None, *,
                  num_clicks: int = DEFAULT_N_CLICKS, skip_nan: bool = False) -> dict:
    """TETRIS IoU/BIoU-AuC@K Min / Max / Δ of a dataset (spec §3.5), in [0, 1] (×100 for the tables).

    Args:
      min_payloads: record payloads of a MIN run, or of a "minmax" run (each
        with "min" and "max" parts) when ``max_payloads`` is None.
      max_payloads: record payloads of the MAX run (same instances).
      num_clicks: K (10).
      skip_nan: drop instances with NaN curves (per run).

    Returns:
      {"iou_min", "iou_max", "iou_delta", "biou_min", "biou_max", "biou_delta", "instances"}.
    """
    if max_payloads is None:
        try:
            max_payloads = [payload["max"] for payload in min_payloads]
            min_payloads = [payload["min"] for payload in min_payloads]
        except (KeyError, TypeError):
            raise ValueError("without max_payloads, every payload must hold 'min' and 'max' parts") from None
    if not min_payloads or len(min_payloads) != len(max_payloads):
        raise ValueError(f"need equally many MIN and MAX payloads (>= 1); got {len(min_payloads)}, "
                         f"{len(max_payloads)}")
    scores = {"instances": len(min_payloads)}
    for name in ("iou", "biou"):
        summary = tetris_min_max_delta(_curves(min_payloads, name, num_clicks),
                                       _curves(max_payloads, name, num_clicks), num_clicks, skip_nan=skip_nan)
        scores[f"{name}_min"] = float(summary.min)
        scores[f"{name}_max"] = float(summary.max)
        scores[f"{name}_delta"] = float(summary.delta)
    return scores


__all__ = [
    "DEFAULT_N_CLICKS", "DEFAULT_N_OPT_STEPS", "DEFAULT_LR_MULT", "DEFAULT_THRESHOLD", "LOCATION_THRESHOLD",
    "DEFAULT_TOLERANCE", "DEFAULT_DICE_WEIGHT", "ATTACK_MODES", "TRAJECTORY_MODES", "BATCH_MODES",
    "MASK_INPUT_MODES", "ACCEPTANCE_MODES", "TetrisConfig", "tetris_learning_rate", "location_error_region",
    "location_distance_map", "location_loss", "ClickIterates", "ClickTrajectory", "click_prompts",
    "reported_click", "click_trajectory", "tetris_min_max", "trajectory_outputs", "ClickBatchFunction",
    "make_click_batch_fn", "trajectory_scores", "tetris_scores",
]
