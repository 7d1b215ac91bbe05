"""The Segmenter protocol: the seam every attack, grid and simulated user plugs into.

A promptable model is split in three pure functions so that the expensive
image encoder runs once per image and every prompt attack runs on cached
features, plus the family's interactive state:

  preprocess(image uint8[H, W, 3], *, frame_hw) -> (model_input, Transform)
  embed(params, model_input) -> Features            (once per image)
  decode(params, features, prompts, transform, *, multimask_output) -> Prediction
                                                    (cheap, differentiable
                                                     w.r.t. prompt coordinates)
  feedback_shape(frame_hw) -> (h, w)                static shape of the map the
                                                    model reads as Prompts.mask_logits
  feedback(prediction) -> f32[h, w]                 what the model feeds itself for
                                                    the next click
  probability_threshold: float                      the family's decision threshold
                                                    on sigmoid(logits)

Protocols build no model-specific state: between clicks they pass
``feedback(previous prediction)`` as ``Prompts.mask_logits`` (SAM: the
selected low-res logits; a click-map model: its previous logits at the frame).
Where the authors' code treats a family differently, the family declares it:
its segmenter subclasses `SegmenterBase` (the SAM family's defaults), states a
`FamilyRules` and overrides the `InteractivePredictor` members it owns;
protocols read them through the functions below, never by probing.
Parameters are explicit pytrees handed to these functions; a model object
carries only its static configuration (frozen and hashable), so it can be
closed over by `jit` without baking weights in as constants. See
docs/ARCHITECTURE.md, "The Segmenter seam" and "How to add a model family".
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Protocol, runtime_checkable

import flax.struct
import jax
import jax.numpy as jnp

from jaxseg_robust.prompts.types import Prompts, click_prompts

Params = Any
Features = Any


@flax.struct.dataclass
class Transform:
    """Geometry that maps the original (evaluation) frame to the model frame.

    All fields are arrays (not static), so instances of different sizes that
    were padded into one bucket share one compiled function.

    Attributes:
      original_hw: i32[2] (H, W) of the original image inside its padded frame.
      resized_hw: i32[2] (h', w') of the image inside the model input after
        resizing (before the model's own padding).
      scale_xy: f32[2] (sx, sy) = (w' / W, h' / H), the per-axis factors that
        map original-frame coordinates to the model frame.
      frame_hw: static (Hf, Wf) >= (H, W), the frame full-resolution outputs
        are produced in (the image's own size, or the bucket it was padded
        into). Not a pytree leaf: part of the tree structure, so one compiled
        function serves every Transform with the same frame; None when a
        model needs no full-resolution frame.
    """

    original_hw: jnp.ndarray
    resized_hw: jnp.ndarray
    scale_xy: jnp.ndarray
    frame_hw: tuple[int, int] | None = flax.struct.field(pytree_node=False, default=None)


@flax.struct.dataclass
class Prediction:
    """What `decode` returns for one prompt set.

    Attributes:
      logits: f32[Hp, Wp] logits of the selected mask, bilinearly upsampled
        to the original frame (padded to the frame the image was given in;
        pixels outside ``Transform.original_hw`` hold -inf-like values).
      low_res_logits: f32[C, h, w] logits of every candidate mask at the
        model's low resolution (SAM: C = 1 or 3, h = w = 256).
      scores: f32[C] the model's predicted quality (SAM: predicted IoU).
      index: i32[] index in [0, C) of the selected candidate.
    """

    logits: jnp.ndarray
    low_res_logits: jnp.ndarray
    scores: jnp.ndarray
    index: jnp.ndarray

    @property
    def selected_low_res(self) -> jnp.ndarray:
        """f32[h, w] low-resolution logits of the selected candidate (SAM's feedback)."""
        return jnp.take(self.low_res_logits, self.index, axis=-3)


def image_region(transform: Transform) -> jnp.ndarray:
    """bool[Hf, Wf]: the pixels of the original image inside the transform's static frame."""
    if transform.frame_hw is None:
        raise ValueError("transform.frame_hw must be set")
    frame_h, frame_w = transform.frame_hw
    rows = jnp.arange(frame_h) < transform.original_hw[0]
    cols = jnp.arange(frame_w) < transform.original_hw[1]
    return rows[:, None] & cols[None, :]


def unit_scale(transform: Transform) -> Transform:
    """The transform with scale (1, 1): prompts are given in the model's (resized) frame."""
    return transform.replace(scale_xy=jnp.ones_like(jnp.asarray(transform.scale_xy, jnp.float32)))


SEGMENTER_MEMBERS = ("preprocess", "embed", "decode", "feedback_shape", "feedback", "probability_threshold")


def check_segmenter(segmenter) -> None:
    """ValueError naming every member of the Segmenter protocol that ``segmenter`` lacks."""
    missing = [name for name in SEGMENTER_MEMBERS if not hasattr(segmenter, name)]
    if missing:
        raise ValueError(f"{type(segmenter).__name__} is not a Segmenter: it lacks {', '.join(missing)} "
                         "(docs/ARCHITECTURE.md, 'The Segmenter seam')")


# ---- the family's rules in the authors' protocol code ------------------------------------------------
# A family declares them: its segmenter subclasses `SegmenterBase` and states `rules` (a `FamilyRules`)
# and, where it owns an interactive predictor, overrides the `InteractivePredictor` members. A segmenter
# that only implements the structural `Segmenter` follows the base's defaults, the SAM family's rules
# (docs/ARCHITECTURE.md, "The Segmenter seam"; per protocol: docs/protocols/*.md).

CLICK_STEP_ORIGINAL = "original"  # the evaluation frame (original_hw): the SAM family
CLICK_STEP_RESIZED = "resized"    # the network input the clicks are rendered on (resized_hw): click-map models
FRAME_POLICY_ANY = "any"          # outputs do not depend on the padded frame: any bucket
FRAME_POLICY_EXACT = "exact"      # the network sees the padded frame: every image in its own frame


@dataclasses.dataclass(frozen=True)
class FamilyRules:
    """How the authors' protocol code treats a family; the defaults are the SAM family's.

    Attributes:
      family: the family's name in messages ("sam", "ritm", "cfr_icl", ...).
      click_step: which (h, w) the TETRIS step's diagonal is taken of (``lr = lr_mult 5 diag /
        (400 sqrt 2)``): "original" (the evaluation frame, ``Transform.original_hw``) or "resized"
        (the network input, ``Transform.resized_hw``).
      click_step_hw: a fixed network input (h, w) that replaces ``click_step`` (a zoom-in's crop size),
        or None.
      resets_feedback_on_two_slots: the wrapper drops the mask input while isegm's padded point tensor
        has two slots (``max(#positive, #negative) <= 1``): the SAM-family wrappers; click-map models
        feed their previous prediction at every click.
      evaluation_multimask: the ``multimask_output`` RClicks' evaluation wrapper decodes with (SAM 2:
        False, one mask with the official dynamic fallback).
      accepts_boxes: the family takes box prompts (click-map models: False; box protocols refuse them).
      differentiable_clicks: ``decode`` is differentiable in the click coordinates as it is; where
        False, a gradient attack runs `SegmenterBase.with_differentiable_clicks` (click-map models'
        soft disks).
      resized_frame: the family has ``resized_logits(prediction, transform)`` (the BREPS fixed-box
        baselines' IoU in the resized frame, ``iou_resized``): SAM, MobileSAM, SAM-HQ.
      frame_policy: "any" or "exact" (the network sees the padded frame: the batch program runs every
        image in its own frame, `jaxseg_robust.runner.program.family_frame_policy`).
      authors_predictor: the family has an authors' evaluation predictor that
        `InteractivePredictor.with_predictor` switches on and off (click-map models: isegm's zoom-in,
        flip and CFR-ICL's cascade; ``--isegm authors|off``).
    """

    family: str = "sam"
    click_step: str = CLICK_STEP_ORIGINAL
    click_step_hw: tuple[int, int] | None = None
    resets_feedback_on_two_slots: bool = True
    evaluation_multimask: bool = True
    accepts_boxes: bool = True
    differentiable_clicks: bool = True
    resized_frame: bool = False
    frame_policy: str = FRAME_POLICY_ANY
    authors_predictor: bool = False

    def __post_init__(self):
        if self.click_step not in (CLICK_STEP_ORIGINAL, CLICK_STEP_RESIZED):
            raise ValueError(f"click_step must be {CLICK_STEP_ORIGINAL!r} or {CLICK_STEP_RESIZED!r}; "
                             f"got {self.click_step!r}")
        if self.frame_policy not in (FRAME_POLICY_ANY, FRAME_POLICY_EXACT):
            raise ValueError(f"frame_policy must be {FRAME_POLICY_ANY!r} or {FRAME_POLICY_EXACT!r}; "
                             f"got {self.frame_policy!r}")


SAM_FAMILY_RULES = FamilyRules()


class InteractivePredictor(Protocol):
    """The interactive predictor a family owns between clicks (typed members of `SegmenterBase`).

    ``interactive_state(frame_hw)`` -> the state before the first click (a pytree of arrays);
    ``interactive_predict(params, features, transform, points, labels, state, use_state, num_clicks, *,
    multimask_output)`` -> (probability f32[Hf, Wf], next state) (see `interactive_step`);
    ``predictor_view()`` -> the predictor as a click attack optimises through it, or None (the attack
    runs ``decode`` on the frame); ``with_predictor(use, dataset, protocol)`` -> the segmenter with or
    without the authors' predictor of ``protocol`` ("tetris" or "rclicks") for ``dataset``.
    """

    def interactive_state(self, frame_hw: tuple[int, int]) -> Any: ...

    def interactive_predict(self, params, features, transform: Transform, points, labels, state, use_state,
                            num_clicks, *, multimask_output: bool) -> tuple[jnp.ndarray, Any]: ...

    def predictor_view(self) -> Any: ...

    def with_predictor(self, use: bool, dataset: str | None = None, protocol: str = "tetris") -> Any: ...


class SegmenterBase:
    """The base a family's segmenter subclasses: the family rules and the interactive predictor, with
    the SAM family's defaults (a subclass is a frozen dataclass and implements the `Segmenter` members).

    Defaults: ``rules = SAM_FAMILY_RULES``; the interactive state is the feedback map
    (zeros of ``feedback_shape``), a round is ``decode`` with it as mask input; no predictor view; no
    authors' predictor to switch; ``decode`` differentiable in the clicks as it is.
    """

    rules: ClassVar[FamilyRules] = SAM_FAMILY_RULES

    def interactive_state(self, frame_hw: tuple[int, int]):
        """f32[``feedback_shape(frame_hw)``] zeros: the feedback map before the first click."""
        return jnp.zeros(self.feedback_shape(tuple(frame_hw)), jnp.float32)

    def interactive_predict(self, params, features, transform: Transform, points, labels, state, use_state,
                            num_clicks, *, multimask_output: bool):
        """``decode`` with ``Prompts.mask_logits = state`` (read where ``use_state``) ->
        (``sigmoid(prediction.logits)``, ``feedback(prediction)``)."""
        del num_clicks
        prompts = click_prompts(points, labels, state, use_state)
        prediction = self.decode(params, features, prompts, transform, multimask_output=multimask_output)
        return jax.nn.sigmoid(prediction.logits), self.feedback(prediction)

    def predictor_view(self):
        """None: the click attack runs ``decode`` on the frame."""
        return None

    def with_predictor(self, use: bool, dataset: str | None = None, protocol: str = "tetris"):
        """The segmenter itself: the family has no authors' predictor to switch."""
        del use, dataset, protocol
        return self

    def with_differentiable_clicks(self):
        """The segmenter itself (prompt coordinates enter the network directly)."""
        return self

    def image_resize_path(self) -> str | None:
        """The image resize path the family's preprocessing follows, recorded in run manifests (SAM's
        ``image_resize``: "float" or "pil"); None: the family has one path."""
        return None


@dataclasses.dataclass(frozen=True)
class _StructuralSegmenter(SegmenterBase):
    """A `Segmenter` that does not subclass `SegmenterBase`, given the base's (SAM-family) defaults."""

    segmenter: Any

    def decode(self, params, features, prompts, transform, *, multimask_output: bool = True):
        return self.segmenter.decode(params, features, prompts, transform, multimask_output=multimask_output)

    def feedback_shape(self, frame_hw):
        return self.segmenter.feedback_shape(frame_hw)

    def feedback(self, prediction):
        return self.segmenter.feedback(prediction)


def family_segmenter(segmenter) -> SegmenterBase:
    """``segmenter`` as a `SegmenterBase`: itself, or a plain `Segmenter` with the SAM family's defaults."""
    return segmenter if isinstance(segmenter, SegmenterBase) else _StructuralSegmenter(segmenter)


def family_rules(segmenter) -> FamilyRules:
    """The rules ``segmenter``'s family declares (`SAM_FAMILY_RULES` for a plain `Segmenter`)."""
    return family_segmenter(segmenter).rules


def click_step_hw(segmenter, transform: Transform) -> jnp.ndarray:
    """i32[2] (h, w) whose diagonal scales the TETRIS click step (``lr = lr_mult 5 diag / (400 sqrt 2)``).

    The authors' attack takes the size of the tensor its wrapper receives:
    for the SAM family the image before SAM's own resize (the evaluation
    frame, ``original_hw``), for click-map models the network input the click
    variable lives on (``resized_hw``, or the zoom-in's fixed crop size):
    `FamilyRules.click_step` / ``click_step_hw``.
    """
    rules = family_rules(segmenter)
    if rules.click_step_hw is not None:
        return jnp.asarray(rules.click_step_hw, jnp.int32)
    hw = transform.original_hw if rules.click_step == CLICK_STEP_ORIGINAL else transform.resized_hw
    return jnp.asarray(hw, jnp.int32)


def predictor_view(segmenter):
    """The family's predictor as a click attack sees it, or None (the attack runs ``decode`` on the
    frame: the SAM family and click-map models without their evaluation machinery).

    A click-map segmenter with the authors' predictor (``evaluation``) returns a
    view whose crop, prediction and click mapping the TETRIS attack optimises
    through (`jaxseg_robust.models.clickmap.attack_view.PredictorView`;
    docs/protocols/tetris.md, "Families").
    """
    return family_segmenter(segmenter).predictor_view()


def with_predictor(segmenter, use: bool, dataset: str | None = None, protocol: str = "tetris"):
    """The segmenter with (``use``) or without its family's authors' predictor for ``protocol``
    ("tetris": the authors' TETRIS options; "rclicks": the RClicks authors'; click-map models: zoom-in,
    flip, CFR-ICL's cascade, docs/protocols/tetris.md "Families"); other families are returned as they are."""
    if not isinstance(segmenter, SegmenterBase):
        return segmenter
    return segmenter.with_predictor(use, dataset, protocol)


def resets_feedback(segmenter) -> bool:
    """`FamilyRules.resets_feedback_on_two_slots` of the segmenter's family."""
    return family_rules(segmenter).resets_feedback_on_two_slots


def evaluation_multimask(segmenter) -> bool:
    """`FamilyRules.evaluation_multimask`: the ``multimask_output`` the authors' evaluation wrapper
    (RClicks) decodes this family with (SAM 2: False)."""
    return family_rules(segmenter).evaluation_multimask


def differentiable(segmenter):
    """The segmenter whose ``decode`` is differentiable w.r.t. click coordinates (what a gradient
    attack runs): itself where `FamilyRules.differentiable_clicks`, else its
    ``with_differentiable_clicks()`` (click-map models: soft disks)."""
    if family_rules(segmenter).differentiable_clicks:
        return segmenter
    return segmenter.with_differentiable_clicks()


def initial_state(segmenter, frame_hw: tuple[int, int]):
    """The family's interactive state before the first click of an instance (a pytree of arrays):
    `InteractivePredictor.interactive_state` (the base: the feedback map of zeros; click-map models
    with the authors' evaluation machinery: `IsegmState`, previous probability map and zoom-in ROI)."""
    return family_segmenter(segmenter).interactive_state(tuple(frame_hw))


def interactive_step(segmenter, params, features, transform: Transform, points, labels, state, use_state,
                     num_clicks, *, multimask_output: bool):
    """One round of an interactive protocol: (probability map f32[Hf, Wf], the state for the next round).

    Args:
      points: f32[N, 2] every click so far, (x, y) original pixels; labels: i32[N] (-1 = padding).
      state: the previous round's state (`initial_state` before the first click).
      use_state: bool[] whether the model reads its state this round (the protocol's feedback
        rule); where false the model starts from `initial_state`.
      num_clicks: i32[] (or int) the click count so far (CFR-ICL refines the first click).
      multimask_output: the family's decoding mode.

    `InteractivePredictor.interactive_predict` of the family (the base, the SAM family: ``decode``
    with ``Prompts.mask_logits = state``, ``sigmoid(prediction.logits)`` and ``feedback(prediction)``
    as the next state).
    """
    return family_segmenter(segmenter).interactive_predict(params, features, transform, points, labels, state,
                                                           use_state, num_clicks, multimask_output=multimask_output)


def takes_boxes(segmenter) -> bool:
    """`FamilyRules.accepts_boxes` of the segmenter's family (click-map models: False)."""
    return family_rules(segmenter).accepts_boxes


def has_resized_frame(segmenter) -> bool:
    """`FamilyRules.resized_frame`: the family has ``resized_logits`` (SAM, MobileSAM, SAM-HQ)."""
    return family_rules(segmenter).resized_frame


def require_boxes(segmenter, what: str) -> None:
    """ValueError naming ``what`` and the segmenter when its family takes clicks only."""
    if not takes_boxes(segmenter):
        raise ValueError(f"{what} needs box prompts; {type(segmenter).__name__} "
                         f"({family_rules(segmenter).family}) takes clicks only")


@runtime_checkable
class Segmenter(Protocol):
    """A promptable segmentation model, used functionally.

    Implementations keep static configuration only (a frozen dataclass);
    weights travel as the explicit ``params`` pytree.

    Attributes:
      probability_threshold: the family's decision threshold on
        ``sigmoid(logits)``; protocols use it unless told otherwise (SAM
        family 0.5, isegm click-map models 0.49).
    """

    probability_threshold: float

    def preprocess(self, image, *, frame_hw: tuple[int, int] | None = None) -> tuple[jnp.ndarray, Transform]:
        """uint8[H, W, 3] image -> (model input, Transform with ``frame_hw`` set; default (H, W))."""

    def embed(self, params: Params, model_input: jnp.ndarray) -> Features:
        """Runs the image encoder once; returns a cacheable feature pytree."""

    def decode(
        self,
        params: Params,
        features: Features,
        prompts: Prompts,
        transform: Transform,
        *,
        multimask_output: bool = True,
    ) -> Prediction:
        """Decodes one prompt set on cached features; differentiable in prompts.

        ``prompts.mask_logits`` (read where ``has_mask``) is a map of
        ``feedback_shape(transform.frame_hw)`` made by ``feedback``.
        """

    def feedback_shape(self, frame_hw: tuple[int, int]) -> tuple[int, int]:
        """Static (h, w) of the feedback map ``decode`` reads as ``Prompts.mask_logits`` for a frame."""

    def feedback(self, prediction: Prediction) -> jnp.ndarray:
        """f32[h, w] the map the model feeds itself for the next click (pure, differentiable)."""
