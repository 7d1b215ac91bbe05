"""BREPS fixed-box baselines: the tight box, the jittered boxes and real user boxes (docs/protocols/breps.md §4.8-4.9).

Fixed boxes are decoded with single-mask output and scored on the boolean
mask ``logit > 0``. Two IoUs are recorded per box:

  * ``iou`` / ``biou``: evaluation frame, ignore excluded (comparable with the
    attack's IoU-Tight/Min/Max);
  * ``iou_resized``: what the reference scripts compute: the prediction at
    the model's resized resolution against the GT resized there (antialiased
    bilinear of ``G+``, ``> 0``), ``inter / (union + 1e-6)``. This needs the
    family feature ``Segmenter.resized_logits`` (the SAM family has it); for a
    family without it ``iou_resized`` is off (NaN), and ``box_frame="resized"``
    (boxes drawn in the model's resized frame, as the scripts do) is refused.

`FixedBoxProtocol` is the per-instance function of
`jaxseg_robust.runner.program.BatchProgram`: its host inputs are the boxes of
each slot (tight box, the jitter draws of `jaxseg_robust.prompts.jitter` or
the user boxes of the instance, padded to a fixed number of slots) and the
resized GT; `make_box_batch_fn` builds the batch function of every BREPS mode
(the attacks come from `jaxseg_robust.attacks.boxes`). `evaluate_image_boxes`
scores any boxes on one image (host entry point).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from jaxseg_robust.attacks.boxes import (
    ATTACK_MODES,
    DEFAULT_LAMBDA,
    DEFAULT_LR_MULT,
    DEFAULT_N_STEPS,
    make_breps_batch_fn,
)
from jaxseg_robust.metrics.masks import DEFAULT_DILATION_RATIO, boundary_width
from jaxseg_robust.metrics.packed import REFERENCE_IOU_EPS, pack_target, packed_scores
from jaxseg_robust.models.base import Transform, has_resized_frame, image_region, unit_scale
from jaxseg_robust.ops.boxes import complete_box_iou_loss
from jaxseg_robust.ops.labels import IGNORE_LABEL
from jaxseg_robust.ops.resize import longest_side_shape, resize_bilinear_antialias_host
from jaxseg_robust.prompts.jitter import JITTER_USED, jitter_boxes, pad_boxes
from jaxseg_robust.prompts.types import box_prompts
from jaxseg_robust.runner.program import BatchProgram, InstanceInputs

FIXED_MODES = ("tight", "jitter", "user")
BATCH_MODES = ATTACK_MODES + ("minmax", "tight", "jitter")
BOX_FRAMES = ("evaluation", "resized")
JITTER_OPTIONS = ("max_shift_frac", "min_iou", "n_accepted", "n_used", "draws_per_accepted", "seed")


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
    """Scores of K fixed boxes with ``multimask_output=False`` and ``logit > 0`` (one image; pure).

    Args:
      segmenter, params, features, transform: the model and one instance.
      boxes_resized: f32[K, 4] boxes in the model frame (evaluation-frame boxes
        times ``(sx, sy)``), fed to the model as they are.
      gt: int [Hf, Wf] 1 / 0 / -1.
      width: i32[] Boundary IoU band width.
      box_valid: optional bool[K]; unused slots get NaN.
      resized_gt: optional bool[S, S] the GT at the resized resolution,
        zero-padded to the model input size S (`resized_reference_gt`); needs
        ``segmenter.resized_logits``.

    Returns:
      `FixedBoxScores`.
    """
    gt = jnp.asarray(gt)
    if transform.frame_hw is None or tuple(gt.shape) != tuple(transform.frame_hw):
        raise ValueError(f"gt must have the transform's frame shape {transform.frame_hw}; got {gt.shape}")
    boxes_resized = jnp.asarray(boxes_resized, jnp.float32)
    if boxes_resized.ndim != 2 or boxes_resized.shape[1] != 4:
        raise ValueError(f"boxes_resized must have shape [K, 4]; got {boxes_resized.shape}")
    width = jnp.asarray(width, jnp.int32)
    mask_shape = segmenter.feedback_shape(tuple(gt.shape))
    packed = pack_target(gt, image_region(transform), width)
    model_transform = unit_scale(transform)

    def one(box):
        prediction = segmenter.decode(params, features, box_prompts(box, mask_shape), model_transform,
                                      multimask_output=False)
        scores = packed_scores(prediction.logits > 0, packed, width)
        if resized_gt is None:
            return scores.iou, scores.biou, jnp.float32(jnp.nan)
        reference = jnp.asarray(resized_gt, bool)
        pred_resized = segmenter.resized_logits(prediction, transform) > 0
        inter = jnp.sum(pred_resized & reference).astype(jnp.float32)
        union = jnp.sum(pred_resized | reference).astype(jnp.float32)
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
    """A binary mask resized to the model's resized frame as the reference scripts do (host).

    torch antialiased bilinear resize (``ResizeLongestSide.apply_image_torch``)
    of the {0, 1} mask to ``longest_side_shape``, then ``> 0``.

    Args:
      mask: [H, W] (non-zero = object); long_side: the model's input side (SAM: 1024).

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


# ---- the protocol ---------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class FixedBoxProtocol:
    """Fixed boxes of every instance as one per-instance function (`runner.program.BatchProtocol`).

    Attributes:
      mode: "tight" (the tight GT box), "jitter" (the jittered tight boxes) or
        "user" (the instance's boxes in ``user_boxes``).
      box_frame: "evaluation" (boxes of the GT in the evaluation frame) or
        "resized" (the reference scripts: boxes in the model's resized frame).
      integer_boxes: truncate tight / jitter boxes to integers in their frame.
      reference_iou: also compute ``iou_resized``.
      jitter_options: sorted (name, value) overrides of `prompts.jitter.jitter_boxes`.
      slots: box slots per instance (1 tight, the jitter's ``n_used``, user: a multiple of 16).
      dilation_ratio: Boundary IoU band ratio.
      user_boxes: user mode: {instance seed: f32[n, 4] boxes in ``box_frame``}
        (data, not part of the program's identity).
    """

    mode: str = "tight"
    box_frame: str = "evaluation"
    integer_boxes: bool = True
    reference_iou: bool = True
    jitter_options: tuple = ()
    slots: int = 1
    dilation_ratio: float = DEFAULT_DILATION_RATIO
    user_boxes: Mapping | None = dataclasses.field(default=None, compare=False, hash=False, repr=False)

    name = "BREPS"

    def __post_init__(self):
        if self.mode not in FIXED_MODES:
            raise ValueError(f"mode must be one of {FIXED_MODES}; got {self.mode!r}")
        if self.box_frame not in BOX_FRAMES:
            raise ValueError(f"box_frame must be one of {BOX_FRAMES}; got {self.box_frame!r}")
        unknown = {name for name, _ in self.jitter_options} - set(JITTER_OPTIONS)
        if unknown:
            raise ValueError(f"jitter_options has unknown keys {sorted(unknown)}")
        if self.mode == "user" and self.user_boxes is None:
            raise ValueError("mode 'user' needs user_boxes")

    @property
    def description(self) -> str:
        """What the compile announcement calls the program, e.g. "BREPS program (jitter)"."""
        return f"BREPS program ({self.mode})"

    def _frame_boxes(self, target, model_size: int, seed: int):
        """(tight box, float boxes [n, 4]) of one slot in ``box_frame`` (host)."""
        frame_mask = resized_mask(target, model_size) if self.box_frame == "resized" else target
        tight = tight_box_host(frame_mask)
        if self.mode == "user":
            return tight, np.asarray(self.user_boxes[seed], np.float32).reshape(-1, 4)
        if self.mode == "jitter":
            return tight, jitter_boxes(tight.astype(np.float32), frame_mask.shape, **dict(self.jitter_options))
        return tight, tight[None].astype(np.float32)

    def host_inputs(self, segmenter, slot) -> dict:
        """The slot's boxes (as given, as the model sees them, valid flags) and its resized GT."""
        target = slot.gt == 1
        model_size = int(np.shape(slot.model_input)[0])
        tight, floats = self._frame_boxes(target, model_size, slot.seed)
        boxes = np.trunc(floats) if self.integer_boxes and self.mode != "user" else floats
        boxes, valid = pad_boxes(boxes, self.slots)
        floats, _ = pad_boxes(floats, self.slots)
        scale = np.asarray(slot.transform.scale_xy, np.float32)
        in_model = boxes if self.box_frame == "resized" else (boxes * np.concatenate([scale, scale])[None, :])
        inputs = {"tight_box": tight, "boxes": boxes, "boxes_float": floats,
                  "boxes_resized": in_model.astype(np.float32), "box_valid": valid}
        if self.reference_iou:
            inputs["resized_gt"] = resized_reference_gt(target, model_size)
        return inputs

    def instance(self, segmenter, params, aux_params, inputs: InstanceInputs) -> dict:
        """Scores of the instance's boxes (layout: `make_box_batch_fn`)."""
        extras = inputs.extras
        valid = extras["box_valid"]
        scores = evaluate_boxes(segmenter, params, inputs.features, inputs.transform, extras["boxes_resized"],
                                inputs.gt, inputs.width, valid, extras.get("resized_gt"))
        outputs = {"iou": scores.iou, "biou": scores.biou, "iou_resized": scores.iou_resized,
                   "boxes_resized": extras["boxes_resized"], "box_valid": valid, "boxes": extras["boxes"],
                   "tight_box": extras["tight_box"]}
        if self.mode == "user":
            return {name: outputs[name] for name in ("iou", "biou", "iou_resized", "boxes", "box_valid")}
        if self.mode == "jitter":
            outputs["n_boxes"] = jnp.sum(valid).astype(jnp.int32)
            outputs["ciou"] = jnp.where(valid, complete_box_iou_loss(
                extras["boxes_float"], extras["tight_box"][None, :].astype(jnp.float32)), jnp.nan)
            for name in ("iou", "biou", "iou_resized"):  # mean over the valid, non-NaN boxes
                counted = valid & ~jnp.isnan(outputs[name])
                outputs[f"mean_{name}"] = (jnp.sum(jnp.where(counted, outputs[name], 0.0), axis=-1)
                                           / jnp.sum(counted, axis=-1))
            return outputs
        for name in ("iou", "biou", "iou_resized", "boxes", "boxes_resized"):  # tight: one box
            outputs[name] = outputs[name][0]
        outputs["box"] = outputs.pop("boxes")
        outputs["box_resized"] = outputs.pop("boxes_resized")
        del outputs["box_valid"]
        return outputs


def fixed_box_protocol(segmenter, mode: str, *, box_frame: str = "evaluation", integer_boxes: bool = True,
                       reference_iou: bool | None = None, jitter_options: Mapping | None = None,
                       user_boxes: Mapping | None = None, slots: int | None = None,
                       dilation_ratio: float = DEFAULT_DILATION_RATIO) -> FixedBoxProtocol:
    """A checked `FixedBoxProtocol` for ``segmenter`` (``reference_iou`` default: the family has the feature).

    Raises:
      ValueError: an unknown option, or ``box_frame="resized"`` / ``reference_iou=True`` for a
        family without ``resized_logits``.
    """
    capable = has_resized_frame(segmenter)
    reference_iou = capable if reference_iou is None else bool(reference_iou)
    if (reference_iou or box_frame == "resized") and not capable:
        raise ValueError(f"{type(segmenter).__name__} has no resized frame (Segmenter.resized_logits): "
                         "use box_frame='evaluation' and reference_iou=False")
    options = dict(jitter_options or {})
    if slots is None:
        slots = options.get("n_used", JITTER_USED) if mode == "jitter" else 1
    return FixedBoxProtocol(mode=mode, box_frame=box_frame, integer_boxes=integer_boxes, reference_iou=reference_iou,
                            jitter_options=tuple(sorted(options.items())), slots=int(slots),
                            dilation_ratio=dilation_ratio, user_boxes=user_boxes)


def make_box_batch_fn(segmenter, params, *, mode: str = "min", n_steps: int = DEFAULT_N_STEPS,
                      lr_mult: float = DEFAULT_LR_MULT, lam: float = DEFAULT_LAMBDA, thr: float | None = None,
                      clip_and_order: bool = False, record_trajectory: bool = False, return_mask: bool = False,
                      box_frame: str = "evaluation", integer_boxes: bool = True, reference_iou: bool | None = None,
                      jitter_options: dict | None = None, dilation_ratio: float = DEFAULT_DILATION_RATIO,
                      announce=None) -> BatchProgram:
    """A batch function for `jaxseg_robust.runner.engine.run` running one BREPS box protocol.

    Args:
      segmenter: any Segmenter that takes box prompts (static).
      params: its parameters (for several devices: ``replicate(params, mesh)``).
      mode: "min" / "max" / "minmax" (the attack, `attacks.boxes.make_breps_batch_fn`),
        "tight" (the tight box alone, single-mask output) or "jitter" (the 10
        jittered boxes, single-mask output).
      n_steps, lr_mult, lam, thr, clip_and_order, record_trajectory, return_mask:
        the attack's settings (`attacks.boxes.BrepsConfig`).
      box_frame, integer_boxes, reference_iou, jitter_options: fixed boxes
        only (`FixedBoxProtocol`; ``reference_iou`` default: whether the family
        has ``resized_logits``).
      dilation_ratio: Boundary IoU band ratio.
      announce: ``text -> None`` told before a bucket's program is compiled.

    Returns:
      A `runner.program.BatchProgram`. Fixed-box outputs (leading axis B):
        tight: tight_box, box, box_resized, iou, biou, iou_resized;
        jitter: tight_box, boxes [B, 10, 4], boxes_resized, box_valid, n_boxes,
          iou, biou, iou_resized, ciou [B, 10], mean_iou, mean_biou, mean_iou_resized.
    """
    if mode not in BATCH_MODES:
        raise ValueError(f"mode must be one of {BATCH_MODES}; got {mode!r}")
    if box_frame not in BOX_FRAMES:
        raise ValueError(f"box_frame must be one of {BOX_FRAMES}; got {box_frame!r}")
    if mode not in ("tight", "jitter"):
        return make_breps_batch_fn(segmenter, params, mode=mode, n_steps=n_steps, lr_mult=lr_mult, lam=lam, thr=thr,
                                   clip_and_order=clip_and_order, record_trajectory=record_trajectory,
                                   return_mask=return_mask, dilation_ratio=dilation_ratio, announce=announce)
    protocol = fixed_box_protocol(segmenter, mode, box_frame=box_frame, integer_boxes=integer_boxes,
                                  reference_iou=reference_iou, jitter_options=jitter_options,
                                  dilation_ratio=dilation_ratio)
    return BatchProgram(segmenter, params, protocol, announce=announce)


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
                         reference_iou: bool | None = None, frame_hw: tuple[int, int] | None = None,
                         slot_multiple: int = 16, dilation_ratio: float = DEFAULT_DILATION_RATIO) -> dict:
    """Single-mask scores of N boxes on one image (host entry point; docs/protocols/breps.md §4.9).

    The image is embedded once; the box program compiles once per frame and
    slot count (boxes are padded to a multiple of ``slot_multiple``).

    Args:
      segmenter, params: the model.
      image: uint8[H, W, 3].
      gt: [H, W] int 1 / 0 / -1, or bool (no ignore).
      boxes: [N, 4] (x1, y1, x2, y2) in the evaluation frame ("evaluation") or
        in the model's resized frame ("resized").
      box_frame: see above.
      reference_iou: also compute ``iou_resized`` (default: the family has ``resized_logits``).
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
    reference_iou = has_resized_frame(segmenter) if reference_iou is None else reference_iou
    gt = np.asarray(gt)
    gt = gt.astype(np.int8) if gt.dtype == bool else gt
    boxes = np.asarray(boxes, np.float32)
    if boxes.ndim != 2 or boxes.shape[1] != 4 or boxes.shape[0] < 1 or not np.isfinite(boxes).all():
        raise ValueError(f"boxes must be finite [N, 4] with N >= 1; got shape {boxes.shape}")
    if gt.ndim != 2 or gt.shape != np.shape(image)[:2]:
        raise ValueError(f"gt {gt.shape} must match the image size {np.shape(image)[:2]}")
    model_input, transform = segmenter.preprocess(image, frame_hw=frame_hw)
    framed_gt = np.full(transform.frame_hw, IGNORE_LABEL, np.int8)
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
    "FIXED_MODES", "BATCH_MODES", "BOX_FRAMES", "JITTER_OPTIONS", "FixedBoxScores", "evaluate_boxes",
    "tight_box_host", "resized_mask", "resized_reference_gt", "has_resized_frame", "FixedBoxProtocol",
    "fixed_box_protocol", "make_box_batch_fn", "evaluate_image_boxes",
]
