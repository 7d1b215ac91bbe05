"""BREPS box protocols on the Segmenter protocol: adversarial boxes (min/max), tight, jitter, fixed boxes.

Spec: docs/protocols/breps.md §2.3-2.4 (SAM input pipeline, boxes),
§4 (the attack), §4.8 (jitter), §4.9 (real-user boxes), §7 (hyper-parameters,
paper/code table rows 7-15), §8 (pitfalls).

Attack (`breps_attack`, one instance; vmap it over instances):
  * ``B*`` = inclusive tight box of ``gt == 1`` in the evaluation frame (empty
    mask -> (0, 0, 1, 1)); ``b := B*_r = (x1 sx, y1 sy, x2 sx, y2 sy)`` in SAM's
    resized frame (per-axis factors of the ``Transform``). SAM sees ``b`` raw:
    no clipping, ordering or rounding (code behaviour, §7.2 row 7) unless
    ``clip_and_order=True`` (the paper's option: after every Adam update the
    variable is ordered and clipped to ``[0, w'-1] x [0, h'-1]`` of the
    resized frame, where it lives).
  * Adam (optax defaults = torch defaults) with ``lr = lr_mult sqrt(H^2 + W^2)
    / (1024 sqrt 2)``, H, W = the evaluation-frame image size (per instance,
    as data).
  * ``n_steps`` evaluated iterates: iterate 0 is the tight box, then one Adam
    update per iterate; the update after the last iterate is computed by the
    reference and never evaluated, here its gradient is computed (it is
    logged as the grad norm, as the reference logs it) and the step dropped.
  * Per iterate: SAM forward with ``multimask_output=True`` and argmax of the
    predicted IoU (§2.3.4), ``P = sigmoid(logits)`` at the evaluation frame,
    ``L = s Dice(P, G+) - lam log p(X)`` with ``X = nan_to_num(CIoU(relu(b),
    B*_r))`` and the Gamma log-density skipped where X == 0 (``s = +1`` MAX,
    ``-1`` MIN; both minimise L).
  * Acceptance: ``(IoU, BIoU)`` of ``P > thr`` against ``G+`` with ignore
    pixels counted as background (the reference's numba "selection" metrics,
    0 on an empty union), lexicographically better than the best so far
    (``>`` MAX, ``<`` MIN; iterate 0 is always accepted, so ``Min <= Tight <=
    Max`` in the selection IoU by construction). The best evaluated iterate is
    reported, not the last.
  * Reported metrics of the best iterate: IoU and BIoU with ignore pixels
    excluded (NaN on an empty union, as the reference's numpy metrics) —
    IoU-Min/Max@BBox; iterate 0 gives IoU-Tight@BBox (``tight_iou``).
  * Reported box: ``b`` mapped back to the evaluation frame (``x / sx``,
    ``y / sy``) *unclipped* (``box``), plus the code-compatible copy
    (``box_clipped``: x clamped to ``[1, w'-1]`` and y to ``[1, h'-1]``, the
    resized-frame bounds applied to evaluation-frame numbers, as the
    reference does), plus the raw variable (``box_resized``).

Boundary IoU: band width ``d = max(1, round(0.02 sqrt(H^2 + W^2)))`` of each
instance's own image size, passed as data (``boundary_width``, computed on the
host with `jaxseg_robust.metrics.masks.boundary_width`); the band is ``d``
iterated 3x3 erosions with a zero outside, which equals the official
zero-padded erosion, and pixels of a bucket frame outside the image are zero in
both masks, so a padded frame gives the unpadded numbers.

Fixed boxes (`evaluate_boxes`: tight-box, jitter and user baselines) use
``multimask_output=False`` and the boolean mask ``logit > 0`` (§2.4). Two IoUs
are recorded per box:
  * ``iou`` / ``biou``: evaluation frame, ignore excluded (the default,
    comparable with the attack's IoU-Tight/Min/Max);
  * ``iou_resized``: what the reference scripts compute — the prediction at
    SAM's resized resolution ``(h', w')`` (the 1024-frame upsampling cropped,
    no final resize) against the GT resized there (torch antialiased bilinear
    of ``G+``, ``> 0``), ``inter / (union + 1e-6)``. Differences from the
    scripts: they binarise the *raw grey* GT (``> 0``), so GrabCut/Berkeley's
    128 ignore band counts as object there; here ``G+`` is resized. Their
    image goes through the uint8 PIL resize (``SamSegmenter(...,
    image_resize="pil")`` reproduces it).

Batch adapter (`make_box_batch_fn`) for `jaxseg_robust.runner.engine.run`:
``PaddedBatch -> dict of arrays [B, ...]``. ``SamSegmenter.preprocess`` takes
an *unpadded* image (it resizes whatever it is given), so each slot's image is
cropped to its ``size`` on the host, preprocessed with ``frame_hw`` = the
bucket frame (outputs then live in the padded frame, -1e4 logits outside the
image), stacked, and the batch is embedded once and attacked inside one
``jit`` (``lax.scan`` over steps, ``vmap`` over instances; sizes, scale
factors, learning rates and boundary widths are per-instance data, so one
compiled program serves every batch of a bucket).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

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
    AttackScores,
    attack_scores,
    boundary_widths,
    gt_words,
    image_region,
    is_better,
)
from jaxseg_robust.metrics.masks import DEFAULT_DILATION_RATIO, boundary_width
from jaxseg_robust.models.base import Transform
from jaxseg_robust.ops.boxes import (
    GAMMA_K,
    GAMMA_THETA,
    breps_ciou_loss,
    breps_realism_log_prob,
    clip_and_order_boxes,
    clip_boxes,
    complete_box_iou_loss,
    scale_boxes,
    tight_box,
    unscale_boxes,
)
from jaxseg_robust.ops.resize import longest_side_shape, resize_bilinear_antialias_host
from jaxseg_robust.prompts.jitter import JITTER_USED, jitter_boxes, pad_boxes
from jaxseg_robust.prompts.types import PADDING_LABEL, Prompts

DEFAULT_N_STEPS = 50
DEFAULT_LR_MULT = 9.0
DEFAULT_LAMBDA = 0.1
DEFAULT_THRESHOLD = 0.5
LR_REFERENCE_SIZE = 1024  # "lr rescaled w.r.t. SAM's 1024 x 1024 input"
REFERENCE_IOU_EPS = 1e-6  # eps of the jitter / user scripts' IoU
ATTACK_MODES = ("min", "max")
BATCH_MODES = ("min", "max", "minmax", "tight", "jitter")
_TIGHT_FIELDS = ("tight_box", "tight_selection_iou", "tight_selection_biou", "tight_iou", "tight_biou")
BOX_FRAMES = ("evaluation", "resized")


# ---- configuration --------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class BrepsConfig:
    """Static settings of the BREPS attack (defaults: the reference code, spec §7.1).

    Attributes:
      mode: "min" (IoU-decreasing, s = -1) or "max" (IoU-increasing, s = +1).
      n_steps: evaluated iterates (tight box + n_steps - 1 updates); 1 = tight box only.
      lr_mult: lr multiplier (lr = lr_mult sqrt(H^2 + W^2) / (1024 sqrt 2)).
      lam: weight of the realism term -lam log p(X).
      thr: probability threshold for the metrics (P > thr; 0.5 == logit > 0).
      clip_and_order: the paper's projection of the variable after every update.
      record_trajectory: also return the per-iterate log (`BrepsTrajectory`).
      return_mask: also return the best iterate's binary mask (frame-sized).
      gamma_k, gamma_theta: Gamma prior shape and scale.
      dilation_ratio: Boundary IoU band ratio (only documents the widths the
        caller passes; `boundary_widths` uses it).
    """

    mode: str = "min"
    n_steps: int = DEFAULT_N_STEPS
    lr_mult: float = DEFAULT_LR_MULT
    lam: float = DEFAULT_LAMBDA
    thr: float = DEFAULT_THRESHOLD
    clip_and_order: bool = False
    record_trajectory: bool = False
    return_mask: bool = False
    gamma_k: float = GAMMA_K
    gamma_theta: float = GAMMA_THETA
    dilation_ratio: float = DEFAULT_DILATION_RATIO

    def __post_init__(self):
        if self.mode not in ATTACK_MODES:
            raise ValueError(f"mode must be one of {ATTACK_MODES}; got {self.mode!r}")
        if isinstance(self.n_steps, bool) or not isinstance(self.n_steps, int) or self.n_steps < 1:
            raise ValueError(f"n_steps must be a positive int; got {self.n_steps!r}")
        for name in ("lr_mult", "lam", "thr", "gamma_k", "gamma_theta", "dilation_ratio"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number; got {value!r}")
        if self.lr_mult < 0 or self.lam < 0:
            raise ValueError(f"lr_mult and lam must be >= 0; got {self.lr_mult}, {self.lam}")
        if not 0.0 <= self.thr < 1.0:
            raise ValueError(f"thr must be in [0, 1); got {self.thr}")
        if self.gamma_k <= 0 or self.gamma_theta <= 0:
            raise ValueError(f"gamma_k and gamma_theta must be > 0; got {self.gamma_k}, {self.gamma_theta}")

    @property
    def sign(self) -> float:
        """s: +1 for MAX (minimise Dice), -1 for MIN (maximise Dice)."""
        return 1.0 if self.mode == "max" else -1.0


def breps_learning_rate(height, width, lr_mult: float = DEFAULT_LR_MULT,
                        reference_size: int = LR_REFERENCE_SIZE) -> jnp.ndarray:
    """BREPS Adam step size ``lr_mult sqrt(H^2 + W^2) / (reference_size sqrt 2)``.

    Args:
      height, width: evaluation-frame image size in pixels (ints or i32 arrays, may be traced).
      lr_mult: multiplier (reference: 9).
      reference_size: SAM's input side (1024).

    Returns:
      f32[...] learning rate in resized-frame pixels per step (480 x 640 -> 4.97;
      1024 x 1024 -> 9).
    """
    h = jnp.asarray(height, jnp.float32)
    w = jnp.asarray(width, jnp.float32)
    return jnp.float32(lr_mult) * jnp.sqrt(h * h + w * w) / jnp.float32(reference_size * math.sqrt(2.0))


# ---- small pieces ------------------------------------------------------------------

def box_prompts(box, mask_shape: tuple[int, int]) -> Prompts:
    """A box-only `Prompts`: one padding point slot (label -1), ``has_box``, no mask input.

    Args:
      box: f32[4] (x1, y1, x2, y2) (may be traced).
      mask_shape: static (h, w) of the model's low-res mask input.
    """
    box = jnp.asarray(box, jnp.float32)
    return Prompts(points=jnp.zeros((1, 2), jnp.float32),
                   labels=jnp.full((1,), PADDING_LABEL, jnp.int32),
                   box=box, has_box=jnp.asarray(True),
                   mask_logits=jnp.zeros(mask_shape, jnp.float32), has_mask=jnp.asarray(False))


def resized_frame_transform(transform: Transform, model_size: int) -> Transform:
    """A `Transform` whose outputs are SAM's resized-resolution masks in a ``model_size`` square frame.

    ``upsample`` with it gives the 1024-frame upsampling cropped to ``(h', w')``
    (the crop-to-crop resize is the identity), i.e. what ``predict`` returns
    for an image that was already resized (the jitter / user scripts). Box
    coordinates are taken as resized-frame pixels (scale 1).
    """
    return Transform(original_hw=transform.resized_hw, resized_hw=transform.resized_hw,
                     scale_xy=jnp.ones_like(jnp.asarray(transform.scale_xy, jnp.float32)),
                     frame_hw=(int(model_size), int(model_size)))


def _check_frame(gt, transform: Transform) -> None:
    if transform.frame_hw is None:
        raise ValueError("transform.frame_hw must be set (SamSegmenter.preprocess sets it)")
    if tuple(gt.shape) != tuple(transform.frame_hw):
        raise ValueError(f"gt must have the transform's frame shape {tuple(transform.frame_hw)}; got {gt.shape}")


# ---- the attack ----------------------------------------------------------------------

@flax.struct.dataclass
class BrepsTrajectory:
    """Per-iterate log of one attack (S = n_steps), as the reference's ``metrics_dict``.

    Attributes:
      selection_iou, selection_biou: f32[S] acceptance metrics.
      iou, biou: f32[S] reported metrics (ignore excluded).
      box_resized: f32[S, 4] the variable SAM saw (resized frame).
      box: f32[S, 4] reported box, evaluation frame, unclipped.
      box_clipped: f32[S, 4] the reference's clipped copy.
      loss: f32[S] L = s Dice - lam log p(X) (realism skipped at X == 0).
      dice: f32[S] Dice loss; ciou: f32[S] X.
      accepted: bool[S] whether the iterate became the best.
      grad_norm: f32[S] ||dL/db||_2 at the iterate.
    """

    selection_iou: jnp.ndarray
    selection_biou: jnp.ndarray
    iou: jnp.ndarray
    biou: jnp.ndarray
    box_resized: jnp.ndarray
    box: jnp.ndarray
    box_clipped: jnp.ndarray
    loss: jnp.ndarray
    dice: jnp.ndarray
    ciou: jnp.ndarray
    accepted: jnp.ndarray
    grad_norm: jnp.ndarray


@flax.struct.dataclass
class BrepsResult:
    """Outcome of one BREPS attack (add a leading axis when vmapped).

    Attributes:
      tight_box: i32[4] inclusive tight box of G+ (evaluation frame).
      tight_selection_iou, tight_selection_biou, tight_iou, tight_biou: f32[]
        scores of iterate 0 (tight box, multimask + argmax): IoU-Tight@BBox.
      selection_iou, selection_biou, iou, biou: f32[] scores of the best iterate.
      box: f32[4] best box, evaluation frame, unclipped.
      box_clipped: f32[4] the reference's reported (clipped) box.
      box_resized: f32[4] best box as SAM saw it (resized frame).
      best_step: i32[] index of the best iterate (0 = tight box).
      n_accepted: i32[] number of accepted iterates.
      learning_rate: f32[] Adam step size used.
      trajectory: `BrepsTrajectory` or None.
      mask: bool[Hf, Wf] best binary mask (``P > thr``) or None.
    """

    tight_box: jnp.ndarray
    tight_selection_iou: jnp.ndarray
    tight_selection_biou: jnp.ndarray
    tight_iou: jnp.ndarray
    tight_biou: jnp.ndarray
    selection_iou: jnp.ndarray
    selection_biou: jnp.ndarray
    iou: jnp.ndarray
    biou: jnp.ndarray
    box: jnp.ndarray
    box_clipped: jnp.ndarray
    box_resized: jnp.ndarray
    best_step: jnp.ndarray
    n_accepted: jnp.ndarray
    learning_rate: jnp.ndarray
    trajectory: Any = None
    mask: Any = None


def reported_boxes(box_resized, transform: Transform):
    """Evaluation-frame boxes from resized-frame ones: (unclipped, reference-clipped).

    ``box = (x / sx, y / sy, ...)``; ``box_clipped`` clamps x to ``[1, w' - 1]``
    and y to ``[1, h' - 1]`` (resized-frame bounds on evaluation-frame numbers:
    the reference's behaviour, spec §4.5).

    Args:
      box_resized: f32[..., 4]; transform: the instance's `Transform`.

    Returns:
      (f32[..., 4], f32[..., 4]).
    """
    scale = jnp.asarray(transform.scale_xy, jnp.float32)
    box = unscale_boxes(box_resized, scale[0], scale[1])
    resized_h = transform.resized_hw[0].astype(jnp.float32)
    resized_w = transform.resized_hw[1].astype(jnp.float32)
    return box, clip_boxes(box, (1.0, resized_w - 1.0), (1.0, resized_h - 1.0))


def breps_attack(segmenter, params, features, transform: Transform, gt, width,
                 config: BrepsConfig = BrepsConfig(), maximise=None) -> BrepsResult:
    """The BREPS box attack on one instance (pure; jit it, vmap it over instances).

    Args:
      segmenter: a Segmenter whose ``decode`` takes a box prompt (SAM family;
        static, closed over).
      params: its parameter pytree.
      features: the instance's cached image features (one image).
      transform: its `Transform` (``frame_hw`` = the frame of ``gt``).
      gt: int [Hf, Wf] 1 object / 0 background / -1 ignore (anything outside
        the image is ignored via ``transform.original_hw``).
      width: i32[] Boundary IoU band width of the image (`boundary_widths`).
      config: static `BrepsConfig`.
      maximise: optional bool[] overriding ``config.mode`` as *data* (True =
        MAX), so one compiled program runs both modes (`breps_attack_min_max`).

    Returns:
      `BrepsResult` (see its docstring; module docstring for the protocol).
    """
    gt = jnp.asarray(gt)
    _check_frame(gt, transform)
    width = jnp.asarray(width, jnp.int32)
    mask_shape = low_res_shape(segmenter)
    region = image_region(transform)
    target = (gt == 1) & region
    target_float = target.astype(jnp.float32)
    packed_gt = gt_words(gt, region, width)
    tight = tight_box(target)
    scale = jnp.asarray(transform.scale_xy, jnp.float32)
    tight_resized = scale_boxes(tight, scale[0], scale[1])
    learning_rate = breps_learning_rate(transform.original_hw[0], transform.original_hw[1], config.lr_mult)
    optimizer = optax.adam(learning_rate)
    model_transform = unit_scale(transform)
    resized_h = transform.resized_hw[0].astype(jnp.float32)
    resized_w = transform.resized_hw[1].astype(jnp.float32)
    maximise = jnp.asarray(config.mode == "max" if maximise is None else maximise, bool)
    sign = jnp.where(maximise, jnp.float32(1.0), jnp.float32(-1.0))

    def objective(box):
        prediction = segmenter.decode(params, features, box_prompts(box, mask_shape), model_transform,
                                      multimask_output=True)
        probability = jax.nn.sigmoid(prediction.logits)
        dice = dice_loss(probability, target_float, region)
        distance = breps_ciou_loss(box, tight_resized)
        log_prob = breps_realism_log_prob(distance, config.gamma_k, config.gamma_theta)
        loss = sign * dice - config.lam * log_prob
        return loss, (probability, dice, distance)

    start = jnp.where(maximise, jnp.float32(START_MAX), jnp.float32(START_MIN))
    best0 = {
        "selection_iou": start, "selection_biou": start,
        "iou": jnp.float32(jnp.nan), "biou": jnp.float32(jnp.nan),
        "box": tight_resized, "step": jnp.int32(0), "accepted": jnp.int32(0),
    }
    if config.return_mask:
        best0["mask"] = jnp.zeros(gt.shape, bool)
    tight0 = AttackScores(*(jnp.float32(jnp.nan),) * 4)

    def step(carry, index):
        box, opt_state, best, tight_scores = carry
        (loss, (probability, dice, distance)), grad = jax.value_and_grad(objective, has_aux=True)(box)
        pred = probability > config.thr
        scores = attack_scores(pred, packed_gt, width)
        accept = is_better(scores, best["selection_iou"], best["selection_biou"], maximise)
        candidate = {"selection_iou": scores.selection_iou, "selection_biou": scores.selection_biou,
                     "iou": scores.iou, "biou": scores.biou, "box": box, "step": index,
                     "accepted": best["accepted"] + 1}
        if config.return_mask:
            candidate["mask"] = pred
        best = jax.tree.map(lambda new, old: jnp.where(accept, new, old), candidate, best)
        tight_scores = jax.tree.map(lambda new, old: jnp.where(index == 0, new, old), scores, tight_scores)
        updates, opt_state = optimizer.update(grad, opt_state, box)
        new_box = optax.apply_updates(box, updates)
        if config.clip_and_order:
            new_box = clip_and_order_boxes(new_box, resized_w, resized_h)
        log = None
        if config.record_trajectory:
            reported, clipped = reported_boxes(box, transform)
            log = BrepsTrajectory(
                selection_iou=scores.selection_iou, selection_biou=scores.selection_biou,
                iou=scores.iou, biou=scores.biou, box_resized=box, box=reported, box_clipped=clipped,
                loss=loss, dice=dice, ciou=distance, accepted=accept,
                grad_norm=jnp.sqrt(jnp.sum(grad * grad)))
        return (new_box, opt_state, best, tight_scores), log

    init = (tight_resized, optimizer.init(tight_resized), best0, tight0)
    (_, _, best, tight_scores), trajectory = lax.scan(step, init, jnp.arange(config.n_steps, dtype=jnp.int32))
    box, box_clipped = reported_boxes(best["box"], transform)
    return BrepsResult(
        tight_box=tight,
        tight_selection_iou=tight_scores.selection_iou, tight_selection_biou=tight_scores.selection_biou,
        tight_iou=tight_scores.iou, tight_biou=tight_scores.biou,
        selection_iou=best["selection_iou"], selection_biou=best["selection_biou"],
        iou=best["iou"], biou=best["biou"],
        box=box, box_clipped=box_clipped, box_resized=best["box"],
        best_step=best["step"], n_accepted=best["accepted"], learning_rate=learning_rate,
        trajectory=trajectory, mask=best.get("mask"))


def breps_attack_min_max(segmenter, params, features, transform: Transform, gt, width,
                         config: BrepsConfig = BrepsConfig()) -> BrepsResult:
    """MIN and MAX attacks on one instance, sharing its features (``config.mode`` is ignored).

    Same arguments as `breps_attack`.

    Returns:
      `BrepsResult` with a leading axis of size 2: index 0 = MIN, 1 = MAX
      (iterate 0, hence the ``tight_*`` fields, is the same in both).
    """
    run = functools.partial(breps_attack, segmenter, params, features, transform, gt, width, config)
    return jax.vmap(lambda maximise: run(maximise=maximise))(jnp.array([False, True]))


# ---- fixed boxes (tight / jitter / user) ----------------------------------------------

@flax.struct.dataclass
class FixedBoxScores:
    """Single-mask scores of K fixed boxes on one image (each f32[K]; NaN where the slot is unused).

    Attributes:
      iou, biou: evaluation frame, ignore excluded, NaN on an empty union.
      iou_resized: the reference scripts' IoU at the resized resolution with
        eps 1e-6 (NaN when no resized GT was given).
    """

    iou: jnp.ndarray
    biou: jnp.ndarray
    iou_resized: jnp.ndarray


def evaluate_boxes(segmenter, params, features, transform: Transform, boxes_resized, gt, width,
                   box_valid=None, resized_gt=None) -> FixedBoxScores:
    """Scores of K fixed boxes with ``multimask_output=False`` and ``logit > 0`` (one image).

    Args:
      segmenter, params, features, transform: as in `breps_attack`.
      boxes_resized: f32[K, 4] boxes in SAM's resized frame (evaluation-frame
        boxes times ``(sx, sy)``), fed to the model as they are.
      gt: int [Hf, Wf] 1 / 0 / -1.
      width: i32[] Boundary IoU band width.
      box_valid: optional bool[K]; unused slots get NaN.
      resized_gt: optional bool[S, S] the GT at the resized resolution,
        zero-padded to the model input size S (`resized_reference_gt`).

    Returns:
      `FixedBoxScores`.
    """
    gt = jnp.asarray(gt)
    _check_frame(gt, transform)
    boxes_resized = jnp.asarray(boxes_resized, jnp.float32)
    if boxes_resized.ndim != 2 or boxes_resized.shape[1] != 4:
        raise ValueError(f"boxes_resized must have shape [K, 4]; got {boxes_resized.shape}")
    width = jnp.asarray(width, jnp.int32)
    mask_shape = low_res_shape(segmenter)
    region = image_region(transform)
    packed_gt = gt_words(gt, region, width)
    model_transform = unit_scale(transform)

    def one(box):
        prediction = segmenter.decode(params, features, box_prompts(box, mask_shape), model_transform,
                                      multimask_output=False)
        scores = attack_scores(prediction.logits > 0, packed_gt, width)
        if resized_gt is None:
            return scores.iou, scores.biou, jnp.float32(jnp.nan)
        resized_gt_ = jnp.asarray(resized_gt, bool)
        frame = resized_frame_transform(transform, resized_gt_.shape[-1])
        pred_resized = segmenter.upsample(prediction.selected_low_res, frame) > 0
        inter = jnp.sum(pred_resized & resized_gt_).astype(jnp.float32)
        union = jnp.sum(pred_resized | resized_gt_).astype(jnp.float32)
        return scores.iou, scores.biou, inter / (union + jnp.float32(REFERENCE_IOU_EPS))

    iou, biou, iou_resized = jax.vmap(one)(boxes_resized)
    if box_valid is not None:
        box_valid = jnp.asarray(box_valid, bool)
        iou, biou, iou_resized = (jnp.where(box_valid, v, jnp.nan) for v in (iou, biou, iou_resized))
    return FixedBoxScores(iou=iou, biou=biou, iou_resized=iou_resized)


# ---- host helpers (boxes and GT in the reference's resized frame) ---------------------

def tight_box_host(mask) -> np.ndarray:
    """Inclusive tight box of ``mask > 0`` on the host: int32[4] (x1, y1, x2, y2); empty -> (0, 0, 1, 1)."""
    mask = np.asarray(mask) > 0
    rows = np.flatnonzero(mask.any(axis=1))
    cols = np.flatnonzero(mask.any(axis=0))
    if rows.size == 0:
        return np.array([0, 0, 1, 1], np.int32)
    return np.array([cols[0], rows[0], cols[-1], rows[-1]], np.int32)


def resized_mask(mask, long_side: int) -> np.ndarray:
    """A binary mask resized to SAM's frame as the reference scripts do (host).

    torch antialiased bilinear resize (``ResizeLongestSide.apply_image_torch``)
    of the {0, 1} mask to ``longest_side_shape``, then ``> 0``.

    Args:
      mask: [H, W] (non-zero = object).
      long_side: SAM's input side (1024).

    Returns:
      bool[h', w'].
    """
    mask = np.asarray(mask) > 0
    out_hw = longest_side_shape(mask.shape[0], mask.shape[1], long_side)
    return resize_bilinear_antialias_host(mask[..., None].astype(np.float32), out_hw)[..., 0] > 0


def resized_reference_gt(target, model_size: int) -> np.ndarray:
    """bool[S, S]: `resized_mask` of ``target`` zero-padded to the model input size S (host)."""
    resized = resized_mask(target, model_size)
    out = np.zeros((model_size, model_size), bool)
    out[:resized.shape[0], :resized.shape[1]] = resized
    return out


# ---- batch adapter for the engine -----------------------------------------------------

class BoxBatchFunction:
    """``PaddedBatch -> dict[str, arrays [B, ...]]`` for one BREPS box protocol (see `make_box_batch_fn`).

    Attributes:
      traces: how many times the jitted core was traced (one per bucket shape).
      mode, config, box_frame: the protocol's settings.
    """

    def __init__(self, segmenter, params, mode: str, config: BrepsConfig, box_frame: str,
                 integer_boxes: bool, reference_iou: bool, jitter_options: dict):
        self.segmenter = segmenter
        self.params = params
        self.mode = mode
        self.config = config
        self.box_frame = box_frame
        self.integer_boxes = integer_boxes
        self.reference_iou = reference_iou
        self.jitter_options = dict(jitter_options)
        self.traces = 0
        self._core = jax.jit(self._attack_core if self.is_attack else self._fixed_core)

    @property
    def is_attack(self) -> bool:
        """True for the "min", "max" and "minmax" protocols."""
        return self.mode in ATTACK_MODES + ("minmax",)

    # -- device side --
    def _embed(self, params, model_input):
        return self.segmenter.embed(params, model_input)

    def _attack_core(self, params, model_input, transform, gt, width):
        self.traces += 1  # runs once per trace
        features = self._embed(params, model_input)
        if self.mode == "minmax":
            attack = functools.partial(breps_attack_min_max, self.segmenter, params, config=self.config)
            result = jax.vmap(attack)(features, transform, gt, width)  # leaves [B, 2, ...]
            outputs = {name: getattr(result, name)[:, 0] for name in _TIGHT_FIELDS}
            for index, mode in enumerate(ATTACK_MODES):
                outputs[mode] = self._result_outputs(jax.tree.map(lambda leaf: leaf[:, index], result),
                                                     with_tight=False)
            return outputs
        attack = functools.partial(breps_attack, self.segmenter, params, config=self.config)
        return self._result_outputs(jax.vmap(attack)(features, transform, gt, width), with_tight=True)

    def _result_outputs(self, result: BrepsResult, with_tight: bool) -> dict:
        outputs = {field.name: getattr(result, field.name) for field in dataclasses.fields(result)
                   if field.name not in ("trajectory", "mask") and (with_tight or field.name not in _TIGHT_FIELDS)}
        if self.config.record_trajectory:
            outputs["trajectory"] = {field.name: getattr(result.trajectory, field.name)
                                     for field in dataclasses.fields(result.trajectory)}
        if self.config.return_mask:
            outputs["mask"] = result.mask
        return outputs

    def _fixed_core(self, params, model_input, transform, gt, width, boxes_resized, box_valid, extras):
        self.traces += 1
        features = self._embed(params, model_input)
        resized_gt = extras.get("resized_gt")

        def one(f, t, g, w, boxes, valid, rgt):
            return evaluate_boxes(self.segmenter, params, f, t, boxes, g, w, valid, rgt)

        scores = jax.vmap(one)(features, transform, gt, width, boxes_resized, box_valid, resized_gt)
        outputs = {"iou": scores.iou, "biou": scores.biou, "iou_resized": scores.iou_resized,
                   "boxes_resized": boxes_resized, "box_valid": box_valid,
                   "boxes": extras["boxes"], "tight_box": extras["tight_box"]}
        if self.mode == "jitter":
            count = jnp.sum(box_valid, axis=1)
            outputs["n_boxes"] = count.astype(jnp.int32)
            outputs["ciou"] = jnp.where(box_valid, complete_box_iou_loss(
                extras["boxes_float"], extras["tight_box"][:, None, :].astype(jnp.float32)), jnp.nan)
            for name in ("iou", "biou", "iou_resized"):  # mean over the valid, non-NaN boxes
                counted = box_valid & ~jnp.isnan(outputs[name])
                outputs[f"mean_{name}"] = (jnp.sum(jnp.where(counted, outputs[name], 0.0), axis=1)
                                           / jnp.sum(counted, axis=1))
        else:  # tight: one box per instance, squeeze the box axis
            for name in ("iou", "biou", "iou_resized", "boxes", "boxes_resized"):
                outputs[name] = outputs[name][:, 0]
            outputs["box"] = outputs.pop("boxes")
            outputs["box_resized"] = outputs.pop("boxes_resized")
            del outputs["box_valid"]
        return outputs

    # -- host side --
    def _boxes_of(self, target, transform_np, model_size):
        """Host boxes of one instance: (tight, boxes, boxes_float, boxes_resized, valid)."""
        scale = np.asarray(transform_np.scale_xy, np.float32)
        if self.box_frame == "resized":
            frame_mask = resized_mask(target, model_size)
        else:
            frame_mask = target
        tight = tight_box_host(frame_mask)
        if self.mode == "jitter":
            floats = jitter_boxes(tight.astype(np.float32), frame_mask.shape, **self.jitter_options)
            slots = self.jitter_options.get("n_used", JITTER_USED)
        else:
            floats, slots = tight[None].astype(np.float32), 1
        boxes = np.trunc(floats) if self.integer_boxes else floats
        boxes, valid = pad_boxes(boxes, slots)
        floats, _ = pad_boxes(floats, slots)
        if self.box_frame == "resized":
            in_model = boxes
        else:
            in_model = (boxes * np.concatenate([scale, scale])[None, :]).astype(np.float32)
        return tight, boxes, floats, in_model, valid

    def __call__(self, batch) -> dict:
        """Runs the protocol on a `PaddedBatch` (host preprocessing, then one jitted call)."""
        images, gts, sizes = check_batch(batch)
        model_input, transforms = preprocess_slots(self.segmenter, images, sizes, (gts.shape[1], gts.shape[2]))
        transform = stack_trees(transforms)
        widths = boundary_widths(sizes, self.config.dilation_ratio)
        if self.is_attack:
            args = (model_input, transform, gts, widths)
        else:
            model_size = int(model_input.shape[1])
            per_slot = []
            for slot in range(gts.shape[0]):
                height, width = (int(v) for v in sizes[slot])
                target = gts[slot, :height, :width] == 1
                per_slot.append(self._boxes_of(target, transforms[slot], model_size)
                                + ((resized_reference_gt(target, model_size),) if self.reference_iou else ()))
            tight, boxes, floats, in_model, valid = (np.stack([s[i] for s in per_slot]) for i in range(5))
            extras = {"tight_box": tight, "boxes": boxes, "boxes_float": floats}
            if self.reference_iou:
                extras["resized_gt"] = np.stack([s[5] for s in per_slot])
            args = (model_input, transform, gts, widths, in_model, valid, extras)
        return self._core(self.params, *place_like(args, batch.gt))


def make_box_batch_fn(segmenter, params, *, mode: str = "min", n_steps: int = DEFAULT_N_STEPS,
                      lr_mult: float = DEFAULT_LR_MULT, lam: float = DEFAULT_LAMBDA,
                      thr: float = DEFAULT_THRESHOLD, clip_and_order: bool = False,
                      record_trajectory: bool = False, return_mask: bool = False,
                      box_frame: str = "evaluation", integer_boxes: bool = True,
                      reference_iou: bool = True, jitter_options: dict | None = None,
                      dilation_ratio: float = DEFAULT_DILATION_RATIO) -> BoxBatchFunction:
    """A batch function for `jaxseg_robust.runner.engine.run` running one BREPS box protocol.

    Args:
      segmenter: a SAM-family Segmenter (static).
      params: its parameters (for several devices: ``replicate(params, mesh)``).
      mode: "min" / "max" (the attack; IoU-Tight@BBox comes with it as
        ``tight_*``), "minmax" (both attacks on one embedding, one compile),
        "tight" (the tight box alone, single-mask output) or "jitter" (the 10
        jittered boxes, single-mask output).
      n_steps, lr_mult, lam, thr, clip_and_order, record_trajectory,
        return_mask, dilation_ratio: see `BrepsConfig` (thr, and the attack
        settings, apply to "min"/"max"; fixed boxes use ``logit > 0``).
      box_frame: fixed boxes only: "evaluation" (tight box of the GT in the
        evaluation frame, jitter clamped to that image) or "resized" (the
        reference scripts: tight box of the resized GT in SAM's resized frame,
        jitter clamped to ``[0, w'-1] x [0, h'-1]``).
      integer_boxes: fixed boxes only: truncate box coordinates to integers in
        their frame before the model sees them (the jitter script's int32 cast).
      reference_iou: fixed boxes only: also compute ``iou_resized``.
      jitter_options: keyword overrides for `prompts.jitter.jitter_boxes`.

    Returns:
      A `BoxBatchFunction`. Outputs (leading axis B):
        min/max: tight_box, tight_{selection_iou, selection_biou, iou, biou},
          selection_iou, selection_biou, iou, biou, box, box_clipped,
          box_resized, best_step, n_accepted, learning_rate [, trajectory/*]
          [, mask];
        minmax: the tight_* fields, and "min" / "max" sub-dicts with the
          other attack fields;
        tight: tight_box, box, box_resized, iou, biou, iou_resized;
        jitter: tight_box, boxes [B, 10, 4], boxes_resized, box_valid, n_boxes,
          iou, biou, iou_resized, ciou [B, 10], mean_iou, mean_biou, mean_iou_resized.
    """
    if mode not in BATCH_MODES:
        raise ValueError(f"mode must be one of {BATCH_MODES}; got {mode!r}")
    if box_frame not in BOX_FRAMES:
        raise ValueError(f"box_frame must be one of {BOX_FRAMES}; got {box_frame!r}")
    config = BrepsConfig(mode=mode if mode in ATTACK_MODES else "min", n_steps=n_steps, lr_mult=lr_mult,
                         lam=lam, thr=thr, clip_and_order=clip_and_order,
                         record_trajectory=record_trajectory, return_mask=return_mask,
                         dilation_ratio=dilation_ratio)
    options = dict(jitter_options or {})
    unknown = set(options) - {"max_shift_frac", "min_iou", "n_accepted", "n_used", "draws_per_accepted", "seed"}
    if unknown:
        raise ValueError(f"jitter_options has unknown keys {sorted(unknown)}")
    return BoxBatchFunction(segmenter, params, mode, config, box_frame, integer_boxes, reference_iou, options)


# ---- one image, any boxes (user boxes) --------------------------------------------------

@functools.lru_cache(maxsize=8)
def _embed_program(segmenter):
    return jax.jit(segmenter.embed)


@functools.lru_cache(maxsize=8)
def _fixed_program(segmenter, with_resized_gt: bool):
    def program(params, features, transform, gt, width, boxes_resized, box_valid, resized_gt):
        return evaluate_boxes(segmenter, params, features, transform, boxes_resized, gt, width, box_valid,
                              resized_gt if with_resized_gt else None)
    return jax.jit(program)


def evaluate_image_boxes(segmenter, params, image, gt, boxes, *, box_frame: str = "evaluation",
                         reference_iou: bool = True, frame_hw: tuple[int, int] | None = None,
                         slot_multiple: int = 16,
                         dilation_ratio: float = DEFAULT_DILATION_RATIO) -> dict:
    """Single-mask scores of N boxes on one image (e.g. the user boxes of §4.9; host entry point).

    The image is embedded once (the embedding program compiles once for every
    image size); the box program compiles once per frame and slot count:
    boxes are padded to a multiple of ``slot_multiple`` and ``frame_hw`` may
    pad the image into a larger frame shared by many images.

    Args:
      segmenter, params: the model.
      image: uint8[H, W, 3].
      gt: [H, W] int 1 / 0 / -1, or bool (no ignore).
      boxes: [N, 4] (x1, y1, x2, y2) in the evaluation frame ("evaluation") or
        in SAM's resized frame ("resized", e.g. boxes of resized prompt masks
        as the reference script takes them).
      box_frame: see above.
      reference_iou: also compute ``iou_resized`` (resized-resolution IoU, eps 1e-6).
      frame_hw: optional output frame (Hf, Wf) >= (H, W); default (H, W).
      slot_multiple: padding granularity of the box axis.
      dilation_ratio: Boundary IoU band ratio.

    Returns:
      {"iou", "biou", "iou_resized"}: float32[N] NumPy arrays (``iou_resized``
      NaN when not computed).
    """
    if box_frame not in BOX_FRAMES:
        raise ValueError(f"box_frame must be one of {BOX_FRAMES}; got {box_frame!r}")
    if isinstance(slot_multiple, bool) or not isinstance(slot_multiple, int) or slot_multiple < 1:
        raise ValueError(f"slot_multiple must be a positive int; got {slot_multiple!r}")
    gt = np.asarray(gt)
    gt = gt.astype(np.int8) if gt.dtype == bool else gt
    boxes = np.asarray(boxes, np.float32)
    if boxes.ndim != 2 or boxes.shape[1] != 4 or boxes.shape[0] < 1 or not np.isfinite(boxes).all():
        raise ValueError(f"boxes must be finite [N, 4] with N >= 1; got shape {boxes.shape}")
    if gt.ndim != 2 or gt.shape != np.shape(image)[:2]:
        raise ValueError(f"gt {gt.shape} must match the image size {np.shape(image)[:2]}")
    model_input, transform = segmenter.preprocess(image, frame_hw=frame_hw)
    frame = transform.frame_hw
    framed_gt = np.full(frame, IGNORE_LABEL, np.int8)
    framed_gt[:gt.shape[0], :gt.shape[1]] = gt
    scale = np.asarray(transform.scale_xy, np.float32)
    in_model = boxes if box_frame == "resized" else boxes * np.concatenate([scale, scale])[None, :]
    slots = -(-boxes.shape[0] // slot_multiple) * slot_multiple
    in_model, valid = pad_boxes(in_model, slots)
    width = np.int32(boundary_width(gt.shape[0], gt.shape[1], dilation_ratio))
    model_size = int(model_input.shape[0])
    resized_gt = resized_reference_gt(gt == 1, model_size) if reference_iou else np.zeros((1, 1), bool)
    features = _embed_program(segmenter)(params, model_input)
    scores = _fixed_program(segmenter, reference_iou)(params, features, transform, framed_gt, width,
                                                      in_model, valid, resized_gt)
    n = boxes.shape[0]
    return {name: np.asarray(getattr(scores, name))[:n] for name in ("iou", "biou", "iou_resized")}


__all__ = [
    "DEFAULT_N_STEPS", "DEFAULT_LR_MULT", "DEFAULT_LAMBDA", "DEFAULT_THRESHOLD", "LR_REFERENCE_SIZE",
    "REFERENCE_IOU_EPS", "ATTACK_MODES", "BATCH_MODES", "BOX_FRAMES",
    "BrepsConfig", "breps_learning_rate", "box_prompts", "resized_frame_transform", "BrepsTrajectory",
    "BrepsResult", "reported_boxes", "breps_attack", "breps_attack_min_max", "FixedBoxScores", "evaluate_boxes",
    "tight_box_host", "resized_mask", "resized_reference_gt", "BoxBatchFunction", "make_box_batch_fn",
    "evaluate_image_boxes",
]
