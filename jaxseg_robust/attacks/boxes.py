"""BREPS adversarial boxes (MIN / MAX) on the Segmenter protocol.

The protocol, its defaults and every paper/code choice are in
docs/protocols/breps.md (§2.4 the box prompt, §4 the attack, §7 the
hyper-parameters and the paper/code table rows 7-13, 17-18). In short, for
one instance (`breps_attack`; vmap it):

  * ``B*`` = inclusive tight box of ``gt == 1`` in the evaluation frame (empty
    mask -> (0, 0, 1, 1)); the variable ``b`` starts at ``B*_r = (x1 sx, y1
    sy, x2 sx, y2 sy)`` in the model frame and is fed to the model raw (no
    clipping, ordering or rounding) unless ``clip_and_order`` (the paper);
  * Adam with ``lr = lr_mult sqrt(H^2 + W^2) / (1024 sqrt 2)``; ``n_steps``
    evaluated iterates (the tight box, then one update per iterate; the
    update after the last is dropped);
  * per iterate: multimask decode (the model's selection), ``P =
    sigmoid(logits)``, ``L = s Dice(P, G+) - lam log p(X)`` with ``X =
    nan_to_num(CIoU(relu(b), B*_r))`` (the Gamma term skipped at ``X == 0``);
  * acceptance: the selection ``(IoU, BIoU)`` lexicographically better than
    the best so far; the best evaluated iterate is reported (iterate 0 gives
    IoU-Tight@BBox), its box three ways (``box`` evaluation frame unclipped,
    ``box_clipped`` the reference's copy, ``box_resized`` what the model saw).

`BrepsProtocol` runs MIN, MAX or both on one embedding as a per-instance
function of `jaxseg_robust.runner.program.BatchProgram`; the fixed-box
baselines (tight, jitter, user boxes) are in `jaxseg_robust.attacks.fixed_boxes`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import optax
from jax import lax

from jaxseg_robust.attacks.objectives import dice_loss
from jaxseg_robust.attacks.scoring import START_MAX, START_MIN, is_better
from jaxseg_robust.metrics.masks import DEFAULT_DILATION_RATIO
from jaxseg_robust.metrics.packed import PackedScores, PackedTarget, pack_target, packed_scores
from jaxseg_robust.models.base import Transform, image_region, unit_scale
from jaxseg_robust.ops.boxes import (
    GAMMA_K,
    GAMMA_THETA,
    breps_ciou_loss,
    breps_realism_log_prob,
    clip_and_order_boxes,
    clip_boxes,
    scale_boxes,
    tight_box,
    unscale_boxes,
)
from jaxseg_robust.prompts.types import box_prompts
from jaxseg_robust.runner.program import BatchProgram, ConfigProtocol, InstanceInputs

DEFAULT_N_STEPS = 50
DEFAULT_LR_MULT = 9.0
DEFAULT_LAMBDA = 0.1
DEFAULT_THRESHOLD = 0.5
LR_REFERENCE_SIZE = 1024  # "lr rescaled w.r.t. SAM's 1024 x 1024 input"
ATTACK_MODES = ("min", "max")
_TIGHT_FIELDS = ("tight_box", "tight_selection_iou", "tight_selection_biou", "tight_iou", "tight_biou")


# ---- configuration --------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class BrepsConfig:
    """Static settings of the BREPS attack (defaults: the reference code, docs/protocols/breps.md §7.1).

    Attributes:
      mode: "min" (IoU-decreasing, s = -1) or "max" (IoU-increasing, s = +1).
      n_steps: evaluated iterates (tight box + n_steps - 1 updates); 1 = tight box only.
      lr_mult: lr multiplier (lr = lr_mult sqrt(H^2 + W^2) / (1024 sqrt 2)).
      lam: weight of the realism term -lam log p(X).
      thr: probability threshold for the metrics (P > thr).
      clip_and_order: the paper's projection of the variable after every update.
      record_trajectory: also return the per-iterate log (`BrepsTrajectory`).
      return_mask: also return the best iterate's binary mask (frame-sized).
      gamma_k, gamma_theta: Gamma prior shape and scale.
      dilation_ratio: Boundary IoU band ratio of the widths the program passes.
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
      f32[...] learning rate in model-frame pixels per step (480 x 640 -> 4.97; 1024 x 1024 -> 9).
    """
    h = jnp.asarray(height, jnp.float32)
    w = jnp.asarray(width, jnp.float32)
    return jnp.float32(lr_mult) * jnp.sqrt(h * h + w * w) / jnp.float32(reference_size * math.sqrt(2.0))


def _check_frame(gt, transform: Transform) -> None:
    if transform.frame_hw is None:
        raise ValueError("transform.frame_hw must be set (Segmenter.preprocess sets it)")
    if tuple(gt.shape) != tuple(transform.frame_hw):
        raise ValueError(f"gt must have the transform's frame shape {tuple(transform.frame_hw)}; got {gt.shape}")


# ---- results ----------------------------------------------------------------------------

@flax.struct.dataclass
class BrepsTrajectory:
    """Per-iterate log of one attack (S = n_steps), as the reference's ``metrics_dict``.

    Attributes:
      selection_iou, selection_biou: f32[S] acceptance metrics.
      iou, biou: f32[S] reported metrics (ignore excluded).
      box_resized: f32[S, 4] the variable the model saw (model frame).
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
        scores of iterate 0 (tight box, multimask + selection): IoU-Tight@BBox.
      selection_iou, selection_biou, iou, biou: f32[] scores of the best iterate.
      box: f32[4] best box, evaluation frame, unclipped.
      box_clipped: f32[4] the reference's reported (clipped) box.
      box_resized: f32[4] best box as the model saw it (model frame).
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
    """Evaluation-frame boxes from model-frame ones: (unclipped, reference-clipped).

    ``box = (x / sx, y / sy, ...)``; ``box_clipped`` clamps x to ``[1, w' - 1]``
    and y to ``[1, h' - 1]`` (resized-frame bounds on evaluation-frame numbers:
    the reference's behaviour, docs/protocols/breps.md §4.5).

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


# ---- the attack ----------------------------------------------------------------------

@flax.struct.dataclass
class BoxInstance:
    """Constants of one instance's attack (built once by `box_instance`).

    Attributes:
      transform: its `Transform`; region: bool[Hf, Wf] image pixels; target_float: f32 G+.
      packed: the packed ground truth; width: i32[] band width.
      tight: i32[4] the tight box; tight_resized: f32[4] in the model frame.
      learning_rate: f32[]; maximise: bool[]; sign: f32[] s; start: f32[] the unbeatable first best.
    """

    transform: Transform
    region: jnp.ndarray
    target_float: jnp.ndarray
    packed: PackedTarget
    width: jnp.ndarray
    tight: jnp.ndarray
    tight_resized: jnp.ndarray
    learning_rate: jnp.ndarray
    maximise: jnp.ndarray
    sign: jnp.ndarray
    start: jnp.ndarray


@flax.struct.dataclass
class BestBox:
    """The accepted iterate so far: its scores, box (model frame), step, acceptances and mask (or None)."""

    selection_iou: jnp.ndarray
    selection_biou: jnp.ndarray
    iou: jnp.ndarray
    biou: jnp.ndarray
    box: jnp.ndarray
    step: jnp.ndarray
    accepted: jnp.ndarray
    mask: Any = None


def box_instance(transform: Transform, gt, width, config: BrepsConfig, maximise=None) -> BoxInstance:
    """The `BoxInstance` of one instance (``maximise``: optional bool[] overriding ``config.mode``)."""
    region = image_region(transform)
    target = (gt == 1) & region
    tight = tight_box(target)
    scale = jnp.asarray(transform.scale_xy, jnp.float32)
    maximise = jnp.asarray(config.mode == "max" if maximise is None else maximise, bool)
    return BoxInstance(
        transform=transform, region=region, target_float=target.astype(jnp.float32),
        packed=pack_target(gt, region, width), width=width, tight=tight,
        tight_resized=scale_boxes(tight, scale[0], scale[1]),
        learning_rate=breps_learning_rate(transform.original_hw[0], transform.original_hw[1], config.lr_mult),
        maximise=maximise, sign=jnp.where(maximise, jnp.float32(1.0), jnp.float32(-1.0)),
        start=jnp.where(maximise, jnp.float32(START_MAX), jnp.float32(START_MIN)))


def box_objective(decode, ctx: BoxInstance, config: BrepsConfig):
    """``b -> (L, (P, Dice, X))`` of the attack (differentiable in the box b, model frame)."""

    def objective(box):
        prediction = decode(box)
        probability = jax.nn.sigmoid(prediction.logits)
        dice = dice_loss(probability, ctx.target_float, ctx.region)
        distance = breps_ciou_loss(box, ctx.tight_resized)
        log_prob = breps_realism_log_prob(distance, config.gamma_k, config.gamma_theta)
        loss = ctx.sign * dice - config.lam * log_prob
        return loss, (probability, dice, distance)

    return objective


def box_step(objective, optimizer, ctx: BoxInstance, config: BrepsConfig, carry, index):
    """One evaluated iterate: score and accept, then one Adam update; returns (carry, log or None)."""
    box, opt_state, best, tight_scores = carry
    (loss, (probability, dice, distance)), grad = jax.value_and_grad(objective, has_aux=True)(box)
    pred = probability > config.thr
    scores = packed_scores(pred, ctx.packed, ctx.width)
    accept = is_better(scores, best.selection_iou, best.selection_biou, ctx.maximise)
    candidate = BestBox(selection_iou=scores.selection_iou, selection_biou=scores.selection_biou, iou=scores.iou,
                        biou=scores.biou, box=box, step=index, accepted=best.accepted + 1,
                        mask=pred if config.return_mask else None)
    best = jax.tree.map(lambda new, old: jnp.where(accept, new, old), candidate, best)
    tight_scores = jax.tree.map(lambda new, old: jnp.where(index == 0, new, old), scores, tight_scores)
    updates, opt_state = optimizer.update(grad, opt_state, box)
    new_box = optax.apply_updates(box, updates)
    if config.clip_and_order:
        new_box = clip_and_order_boxes(new_box, ctx.transform.resized_hw[1].astype(jnp.float32),
                                       ctx.transform.resized_hw[0].astype(jnp.float32))
    log = None
    if config.record_trajectory:
        reported, clipped = reported_boxes(box, ctx.transform)
        log = BrepsTrajectory(selection_iou=scores.selection_iou, selection_biou=scores.selection_biou,
                              iou=scores.iou, biou=scores.biou, box_resized=box, box=reported, box_clipped=clipped,
                              loss=loss, dice=dice, ciou=distance, accepted=accept,
                              grad_norm=jnp.sqrt(jnp.sum(grad * grad)))
    return (new_box, opt_state, best, tight_scores), log


def breps_attack(segmenter, params, features, transform: Transform, gt, width,
                 config: BrepsConfig = BrepsConfig(), maximise=None) -> BrepsResult:
    """The BREPS box attack on one instance (pure; jit it, vmap it over instances).

    Args:
      segmenter: a Segmenter whose ``decode`` takes a box prompt (static, closed over).
      params: its parameter pytree.
      features: the instance's cached image features (one image).
      transform: its `Transform` (``frame_hw`` = the frame of ``gt``).
      gt: int [Hf, Wf] 1 object / 0 background / -1 ignore (anything outside
        the image is ignored via ``transform.original_hw``).
      width: i32[] Boundary IoU band width of the image (`metrics.masks.boundary_widths`).
      config: static `BrepsConfig`.
      maximise: optional bool[] overriding ``config.mode`` as *data* (True =
        MAX), so one compiled program runs both modes (`breps_attack_min_max`).

    Returns:
      `BrepsResult` (see its docstring; docs/protocols/breps.md for the protocol).
    """
    gt = jnp.asarray(gt)
    _check_frame(gt, transform)
    ctx = box_instance(transform, gt, jnp.asarray(width, jnp.int32), config, maximise)
    mask_shape = segmenter.feedback_shape(tuple(gt.shape))
    model_transform = unit_scale(transform)

    def decode(box):
        return segmenter.decode(params, features, box_prompts(box, mask_shape), model_transform,
                                multimask_output=True)

    optimizer = optax.adam(ctx.learning_rate)
    best0 = BestBox(selection_iou=ctx.start, selection_biou=ctx.start, iou=jnp.float32(jnp.nan),
                    biou=jnp.float32(jnp.nan), box=ctx.tight_resized, step=jnp.int32(0), accepted=jnp.int32(0),
                    mask=jnp.zeros(gt.shape, bool) if config.return_mask else None)
    tight0 = PackedScores(*(jnp.float32(jnp.nan),) * 5)
    step = functools.partial(box_step, box_objective(decode, ctx, config), optimizer, ctx, config)
    init = (ctx.tight_resized, optimizer.init(ctx.tight_resized), best0, tight0)
    (_, _, best, tight_scores), trajectory = lax.scan(step, init, jnp.arange(config.n_steps, dtype=jnp.int32))
    box, box_clipped = reported_boxes(best.box, transform)
    return BrepsResult(
        tight_box=ctx.tight, tight_selection_iou=tight_scores.selection_iou,
        tight_selection_biou=tight_scores.selection_biou, tight_iou=tight_scores.iou, tight_biou=tight_scores.biou,
        selection_iou=best.selection_iou, selection_biou=best.selection_biou, iou=best.iou, biou=best.biou,
        box=box, box_clipped=box_clipped, box_resized=best.box, best_step=best.step, n_accepted=best.accepted,
        learning_rate=ctx.learning_rate, trajectory=trajectory, mask=best.mask)


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


# ---- the protocol ---------------------------------------------------------------------

def result_outputs(result: BrepsResult, config: BrepsConfig, with_tight: bool = True) -> dict:
    """A `BrepsResult` as the protocol's output dict (``trajectory`` / ``mask`` as the config asks)."""
    outputs = {field.name: getattr(result, field.name) for field in dataclasses.fields(result)
               if field.name not in ("trajectory", "mask") and (with_tight or field.name not in _TIGHT_FIELDS)}
    if config.record_trajectory:
        outputs["trajectory"] = {field.name: getattr(result.trajectory, field.name)
                                 for field in dataclasses.fields(result.trajectory)}
    if config.return_mask:
        outputs["mask"] = result.mask
    return outputs


@dataclasses.dataclass(frozen=True)
class BrepsProtocol(ConfigProtocol):
    """The BREPS attack as one per-instance function (`runner.program.BatchProtocol`).

    Attributes:
      config: the `BrepsConfig`.
      minmax: both attacks on one embedding: outputs the ``tight_*`` fields and
        ``{"min", "max"}`` parts; else one attack's fields (``config.mode``).
    """

    config: BrepsConfig = BrepsConfig()
    minmax: bool = False

    name = "BREPS"

    @property
    def description(self) -> str:
        """What the compile announcement calls the program, e.g. "BREPS program (minmax)"."""
        return f"BREPS program ({'minmax' if self.minmax else self.config.mode})"

    def instance(self, segmenter, params, aux_params, inputs: InstanceInputs) -> dict:
        """The attack(s) of one instance."""
        args = (segmenter, params, inputs.features, inputs.transform, inputs.gt, inputs.width)
        if not self.minmax:
            return result_outputs(breps_attack(*args, config=self.config), self.config)
        both = breps_attack_min_max(*args, config=self.config)
        outputs = {name: getattr(both, name)[0] for name in _TIGHT_FIELDS}
        for index, mode in enumerate(ATTACK_MODES):
            outputs[mode] = result_outputs(jax.tree.map(lambda leaf, i=index: leaf[i], both), self.config,
                                           with_tight=False)
        return outputs


def make_breps_batch_fn(segmenter, params, *, mode: str = "min", n_steps: int = DEFAULT_N_STEPS,
                        lr_mult: float = DEFAULT_LR_MULT, lam: float = DEFAULT_LAMBDA, thr: float | None = None,
                        clip_and_order: bool = False, record_trajectory: bool = False, return_mask: bool = False,
                        dilation_ratio: float = DEFAULT_DILATION_RATIO, announce=None) -> BatchProgram:
    """A batch function for `jaxseg_robust.runner.engine.run` running the BREPS attack.

    Args:
      segmenter, params: the model (params replicated over the mesh for several devices).
      mode: "min", "max" or "minmax" (both attacks on one embedding, one compile).
      n_steps, lr_mult, lam, clip_and_order, record_trajectory, return_mask,
        dilation_ratio: see `BrepsConfig`.
      thr: probability threshold (default: ``segmenter.probability_threshold``).
      announce: ``text -> None`` told before a bucket's program is compiled.

    Returns:
      A `runner.program.BatchProgram`. Outputs (leading axis B):
        min/max: tight_box, tight_{selection_iou, selection_biou, iou, biou},
          selection_iou, selection_biou, iou, biou, box, box_clipped,
          box_resized, best_step, n_accepted, learning_rate [, trajectory/*] [, mask];
        minmax: the tight_* fields, and "min" / "max" sub-dicts with the other fields.
    """
    if mode not in ATTACK_MODES + ("minmax",):
        raise ValueError(f"mode must be one of {ATTACK_MODES + ('minmax',)}; got {mode!r}")
    thr = float(segmenter.probability_threshold) if thr is None else thr
    config = BrepsConfig(mode="min" if mode == "minmax" else mode, n_steps=n_steps, lr_mult=lr_mult, lam=lam,
                         thr=thr, clip_and_order=clip_and_order, record_trajectory=record_trajectory,
                         return_mask=return_mask, dilation_ratio=dilation_ratio)
    return BatchProgram(segmenter, params, BrepsProtocol(config, minmax=mode == "minmax"), announce=announce)


__all__ = [
    "DEFAULT_N_STEPS", "DEFAULT_LR_MULT", "DEFAULT_LAMBDA", "DEFAULT_THRESHOLD", "LR_REFERENCE_SIZE",
    "ATTACK_MODES", "BrepsConfig", "breps_learning_rate", "BrepsTrajectory", "BrepsResult", "reported_boxes",
    "BoxInstance", "BestBox", "box_instance", "box_objective", "box_step", "breps_attack", "breps_attack_min_max",
    "result_outputs", "BrepsProtocol", "make_breps_batch_fn",
]
