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
Parameters are explicit pytrees handed to these functions; a model object
carries only its static configuration (frozen and hashable), so it can be
closed over by `jit` without baking weights in as constants. See
docs/ARCHITECTURE.md, "The Segmenter seam" and "How to add a model family".
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

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


# ---- optional members: the family's rules in the authors' protocol code ----------------------------
# A family states them on its segmenter; without them a segmenter follows the SAM family's rules
# (docs/ARCHITECTURE.md, "The Segmenter seam"; per protocol: docs/protocols/*.md).

def click_step_hw(segmenter, transform: Transform) -> jnp.ndarray:
    """i32[2] (h, w) whose diagonal scales the TETRIS click step (``lr = lr_mult 5 diag / (400 sqrt 2)``).

    The authors' attack takes the size of the tensor its wrapper receives:
    for the SAM family the image before SAM's own resize (the evaluation
    frame, ``original_hw``; the fallback), for click-map models the network
    input the click variable lives on (``segmenter.click_step_hw``).
    """
    method = getattr(segmenter, "click_step_hw", None)
    return jnp.asarray(transform.original_hw if method is None else method(transform), jnp.int32)


def predictor_view(segmenter):
    """The family's predictor as a click attack sees it, or None (the attack runs ``decode`` on the
    frame: the SAM family and click-map models without their evaluation machinery).

    A click-map segmenter with the authors' predictor (``evaluation``) returns a
    view whose crop, prediction and click mapping the TETRIS attack optimises
    through (`jaxseg_robust.models.clickmap.attack_view.PredictorView`;
    docs/protocols/tetris.md, "Families").
    """
    method = getattr(segmenter, "predictor_view", None)
    return None if method is None else method()


def with_predictor(segmenter, use: bool, dataset: str | None = None):
    """The segmenter with (``use``) or without its family's evaluation predictor for a click attack
    (``segmenter.with_predictor``: click-map models, the authors' zoom-in and flip,
    docs/protocols/tetris.md "Families"); a segmenter without that member is returned as it is."""
    method = getattr(segmenter, "with_predictor", None)
    return segmenter if method is None else method(use, dataset)


def resets_feedback(segmenter) -> bool:
    """Whether the authors' wrapper drops the mask input while isegm's padded point tensor has two
    slots (``max(#positive, #negative) <= 1``): the SAM-family wrappers do (fallback True); click-map
    models feed their previous prediction at every click (``resets_feedback_on_two_slots = False``)."""
    return bool(getattr(segmenter, "resets_feedback_on_two_slots", True))


def evaluation_multimask(segmenter) -> bool:
    """The ``multimask_output`` the authors' evaluation wrapper (RClicks) decodes this family with:
    True (best of three by predicted IoU) unless the segmenter says ``evaluation_multimask = False``
    (SAM 2: one mask with the official dynamic fallback)."""
    return bool(getattr(segmenter, "evaluation_multimask", True))


def differentiable(segmenter):
    """The segmenter whose ``decode`` is differentiable w.r.t. click coordinates (what a gradient
    attack runs): ``segmenter.differentiable_clicks()`` where the family renders clicks (click-map
    models: soft disks), else the segmenter itself (prompt coordinates enter the network directly)."""
    method = getattr(segmenter, "differentiable_clicks", None)
    return segmenter if method is None else method()


def initial_state(segmenter, frame_hw: tuple[int, int]):
    """The family's interactive state before the first click of an instance (a pytree of arrays).

    A segmenter with ``interactive_state(frame_hw)`` owns its state (click-map
    models with the authors' evaluation machinery: previous probability map and
    zoom-in ROI); the fallback is the feedback map of zeros,
    f32[``feedback_shape(frame_hw)``] (the SAM family's low-res logits).
    """
    method = getattr(segmenter, "interactive_state", None)
    if method is None:
        return jnp.zeros(segmenter.feedback_shape(tuple(frame_hw)), jnp.float32)
    return method(tuple(frame_hw))


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

    The fallback (the SAM family, and any segmenter without ``interactive_predict``):
    ``decode`` with ``Prompts.mask_logits = state`` (read where ``use_state``),
    ``sigmoid(prediction.logits)`` and ``feedback(prediction)`` as the next state.
    """
    method = getattr(segmenter, "interactive_predict", None)
    if method is None:
        prompts = click_prompts(points, labels, state, use_state)
        prediction = segmenter.decode(params, features, prompts, transform, multimask_output=multimask_output)
        return jax.nn.sigmoid(prediction.logits), segmenter.feedback(prediction)
    return method(params, features, transform, points, labels, state, use_state, num_clicks,
                  multimask_output=multimask_output)


def takes_boxes(segmenter) -> bool:
    """Whether the family takes box prompts (``accepts_boxes``; default True; click-map models: False)."""
    return bool(getattr(segmenter, "accepts_boxes", True))


def require_boxes(segmenter, what: str) -> None:
    """ValueError naming ``what`` and the segmenter when its family takes clicks only."""
    if not takes_boxes(segmenter):
        raise ValueError(f"{what} needs box prompts; {type(segmenter).__name__} "
                         f"({_family_name(segmenter)}) takes clicks only")


def _family_name(segmenter) -> str:
    config = getattr(segmenter, "config", None)
    return str(getattr(config, "family", None) or getattr(config, "variant", None) or "this family")


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
