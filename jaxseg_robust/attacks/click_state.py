"""Results and interactive state of click trajectories (`jaxseg_robust.attacks.clicks`; docs/protocols/tetris.md).

Every piece of state a trajectory carries is a ``flax.struct`` dataclass:
`ClickInstance` (constants of one instance), `ClickState` (carried from click
to click: the clicks so far, the previous accepted probability map and the
model's feedback map), `ClickSetup` (one click before its optimisation) and
`BestIterate` (the acceptance state within one click); `ClickIterates` and
`ClickTrajectory` are the results.
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp

from jaxseg_robust.metrics.packed import PackedTarget
from jaxseg_robust.models.base import Transform


# ---- results --------------------------------------------------------------------------

@flax.struct.dataclass
class ClickIterates:
    """Per-iterate log (one click: [S, ...]; a trajectory: [K, S, ...]; S = evaluated iterates).

    Attributes:
      point_resized: f32[..., 2] the variable q (x, y) the model saw (model frame).
      click: f32[..., 2] reported (row, col), evaluation frame, clipped.
      loss, dice, location: f32[...] L, Dice loss, Lloc.
      selection_iou, selection_biou, iou, biou: f32[...].
      accepted: bool[...].
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
      has_mask_input: bool[K] whether the model got its feedback map.
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


@flax.struct.dataclass
class ClickInstance:
    """Constants of one instance's trajectory (built once by `click_instance`).

    Attributes:
      transform: the instance's `Transform`; region, target, labelled: bool[Hf, Wf]
        (image pixels, G+ in the image, non-ignore image pixels); target_float: f32 G+.
      packed: the packed ground truth (`metrics.packed.pack_target`); width: i32[] band width.
      scale: f32[2] (sx, sy); learning_rate: f32[].
      maximise: bool[] MAX; sign: f32[] s; start: f32[] the unbeatable first best.
    """

    transform: Transform
    region: jnp.ndarray
    target: jnp.ndarray
    labelled: jnp.ndarray
    target_float: jnp.ndarray
    packed: PackedTarget
    width: jnp.ndarray
    scale: jnp.ndarray
    learning_rate: jnp.ndarray
    maximise: jnp.ndarray
    sign: jnp.ndarray
    start: jnp.ndarray


@flax.struct.dataclass
class ClickState:
    """What a trajectory carries from one click to the next.

    Attributes:
      points: f32[K, 2] the reported clicks so far in the model frame (x, y); labels: i32[K] (-1 unused).
      not_clicked: bool[Hf, Wf] pixels the clicker may still choose.
      probability: f32[Hf, Wf] the accepted probability map of the previous click.
      feedback: f32[h, w] the model's feedback map of that prediction (``Segmenter.feedback``).
    """

    points: jnp.ndarray
    labels: jnp.ndarray
    not_clicked: jnp.ndarray
    probability: jnp.ndarray
    feedback: jnp.ndarray


@flax.struct.dataclass
class ClickSetup:
    """One click before its optimisation: the baseline clicker's choice and its prompt history.

    Attributes:
      index: i32[] click index k - 1; current: bool[K, 1] its slot.
      is_positive: bool[]; row, col: i32[] the baseline click.
      labels: i32[K] the labels with this click's; has_mask: bool[] feed the feedback map.
      errors: bool[Hf, Wf] the click's error region; distance: f32[Hf, Wf] its distance map
        (None for the baseline); q0: f32[2] iterate 0 (model frame, x, y).
    """

    index: jnp.ndarray
    current: jnp.ndarray
    is_positive: jnp.ndarray
    row: jnp.ndarray
    col: jnp.ndarray
    labels: jnp.ndarray
    has_mask: jnp.ndarray
    errors: jnp.ndarray
    distance: object
    q0: jnp.ndarray


@flax.struct.dataclass
class BestIterate:
    """The accepted iterate of the click so far (the reference's acceptance state).

    Attributes:
      selection_iou, selection_biou, iou, biou: its scores.
      loc: its Lloc; reference_loc: the Lloc the tolerance is relative to.
      probability: f32[Hf, Wf]; feedback: f32[h, w] its prediction and feedback map.
      point: f32[2] the iterate (model frame); step: i32[] its index; accepted: i32[] acceptances.
    """

    selection_iou: jnp.ndarray
    selection_biou: jnp.ndarray
    iou: jnp.ndarray
    biou: jnp.ndarray
    loc: jnp.ndarray
    reference_loc: jnp.ndarray
    probability: jnp.ndarray
    feedback: jnp.ndarray
    point: jnp.ndarray
    step: jnp.ndarray
    accepted: jnp.ndarray


def batched_like_instance(carry, ctx: ClickInstance):
    """``carry`` (a pytree of arrays), unchanged in value, made a function of the instance and of MIN/MAX.

    A loop's initial carry of constants is unbatched under ``vmap`` while the carry its body returns
    is batched; ``lax.scan``'s batching rule then batches the whole body (the decoder, and the loops
    inside) once more for each such discovery, per vmap (over MIN/MAX, then over instances). A carry
    that depends on ``ctx.sign`` and ``ctx.learning_rate`` from the start is batched at once: the
    TETRIS program traces in about 40 % less time (issue 30; docs/benchmarking.md). Exact: the
    carries gain ``+ 0.0`` (floats: +0.0 plus any value but -0.0 is that value; no carry starts at
    -0.0), ``+ 0`` (integers) or ``& True`` (booleans).
    """
    zero = jnp.float32(0.0) * jnp.abs(ctx.sign * ctx.learning_rate)  # +0.0, batched like the instance

    def anchored(leaf):
        leaf = jnp.asarray(leaf)
        if leaf.dtype == jnp.bool_:
            return leaf & (zero == 0.0)
        return leaf + zero.astype(leaf.dtype)

    return jax.tree.map(anchored, carry)


__all__ = ["ClickIterates", "ClickTrajectory", "ClickInstance", "ClickState", "ClickSetup", "BestIterate",
           "batched_like_instance"]
