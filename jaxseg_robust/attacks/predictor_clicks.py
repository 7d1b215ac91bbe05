"""How one TETRIS click is optimised: on the model frame, or through a family's predictor.

`jaxseg_robust.attacks.clicks.one_click` runs the same loop for every family
(baseline click, S evaluated iterates, the acceptance rule); what differs is
the frame the click variable ``q`` lives in and how an iterate is predicted,
which a `ClickAttempt` states (docs/protocols/tetris.md, §3 and "Families"):

* `decode_attempt` (the SAM family, and click-map models without their
  evaluation machinery): ``q`` (x, y) in the model frame, ``decode`` on the
  frame, Dice and the location loss on the frame.
* `predictor_attempt` (click-map models with the authors' predictor,
  `jaxseg_robust.models.base.predictor_view`): the ROI of the zoom-in is fixed
  from the baseline click; ``q`` lives in the crop's pixels; Dice over both
  flip halves against the cropped G+; the location loss's distance map from
  the cropped G+ and the cropped previous map (``> 0.5``), on the crop grid;
  the acceptance scores on the pasted-back prediction against the full G+;
  the accepted click maps back to image pixels (clipped to the crop);
  CFR-ICL's cascade runs after acceptance and gives the click's prediction.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp

from jaxseg_robust.attacks.click_state import BestIterate, ClickInstance, ClickSetup, ClickState
from jaxseg_robust.attacks.location import location_distance_map, location_error_region, location_loss
from jaxseg_robust.attacks.objectives import dice_loss
from jaxseg_robust.metrics.packed import packed_scores
from jaxseg_robust.prompts.types import click_prompts


class ClickAttempt(NamedTuple):
    """How one click is optimised (Python callables closed over traced arrays).

    Attributes:
      objective: ``q -> (L, (P f32[Hf, Wf], feedback, Dice, Lloc))``, differentiable in q f32[2].
      q0: f32[2] iterate 0 (the baseline click in q's frame).
      to_click: ``q -> f32[2]`` (row, col) evaluation-frame pixels of an iterate.
      finish: ``(best BestIterate, points f32[K, 2], labels i32[K]) -> (P, feedback, iou, biou)`` the
        click's prediction, the state carried to the next click and its reported scores.
    """

    objective: Callable
    q0: jnp.ndarray
    to_click: Callable
    finish: Callable


def decode_attempt(segmenter, decode, ctx: ClickInstance, config, state: ClickState, setup: ClickSetup,
                   reported_click) -> ClickAttempt:
    """``q`` in the model frame, each iterate one ``decode`` (``Prompts -> Prediction``) on the frame."""

    def objective(q):
        prompt_points = jnp.where(setup.current, q[None, :], state.points)
        prediction = decode(click_prompts(prompt_points, setup.labels, state.feedback, setup.has_mask))
        prob = jax.nn.sigmoid(prediction.logits)
        dice = dice_loss(prob, ctx.target_float, ctx.region)
        if config.optimises:
            loc = location_loss(q, setup.distance, ctx.transform.original_hw, ctx.transform.resized_hw,
                                config.radius, coverage=config.coverage, samples_per_axis=config.samples_per_axis)
        else:
            loc = jnp.float32(0.0)
        loss = loc + ctx.sign * jnp.float32(config.dice_weight) * dice
        return loss, (prob, segmenter.feedback(prediction), dice, loc)

    def finish(best: BestIterate, points, labels):
        return best.probability, best.feedback, best.iou, best.biou

    return ClickAttempt(objective=objective, q0=setup.q0, to_click=lambda q: reported_click(q, ctx.transform),
                        finish=finish)


def predictor_attempt(view, params, features, ctx: ClickInstance, config, state: ClickState,
                      setup: ClickSetup) -> ClickAttempt:
    """``q`` in the crop of the predictor's zoom-in (`PredictorView`; the module docstring).

    ``state.points`` are image pixels (x, y) (click-map models: scale 1);
    ``state.feedback`` is the predictor's state (`IsegmState`).
    """
    original_hw = ctx.transform.original_hw
    frame = ctx.region.shape
    points0 = jnp.where(setup.current, setup.q0[None, :], state.points)
    crop = view.crop(features, original_hw, points0, setup.labels, ctx.target_float, state.feedback)
    grid = jnp.asarray(crop.prev.shape, jnp.int32)
    distance = None
    if config.optimises:
        errors = location_error_region(crop.target > 0.5, crop.prev, setup.is_positive,
                                       jnp.ones(crop.prev.shape, bool), config.location_threshold)
        distance = location_distance_map(errors, grid)

    def objective(q):
        points = jnp.where(setup.current, q[None, :], crop.points)
        halves, prob, new_state = view.predict(params, crop, points, setup.labels, original_hw, frame)
        dice = dice_loss(halves, jnp.broadcast_to(crop.target, halves.shape))
        if config.optimises:
            loc = location_loss(q, distance, grid, grid, config.radius, coverage=config.coverage,
                                samples_per_axis=config.samples_per_axis)
        else:
            loc = jnp.float32(0.0)
        loss = loc + ctx.sign * jnp.float32(config.dice_weight) * dice
        return loss, (prob, new_state, dice, loc)

    def finish(best: BestIterate, points, labels):
        prob, new_state = view.refine(params, features, original_hw, points, labels, setup.index + 1,
                                      best.probability, best.feedback)
        if not view.refines:
            return prob, new_state, best.iou, best.biou
        scores = packed_scores((prob > config.thr) & ctx.region, ctx.packed, ctx.width)
        return prob, new_state, scores.iou, scores.biou

    return ClickAttempt(objective=objective, q0=crop.points[setup.index], to_click=lambda q: view.to_image(crop, q),
                        finish=finish)


__all__ = ["ClickAttempt", "decode_attempt", "predictor_attempt"]
