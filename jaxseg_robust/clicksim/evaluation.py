"""The RClicks multi-round simulated evaluation on any Segmenter (one jitted program per bucket).

Reference: docs/protocols/rclicks.md §5.1 (modes), §5.2 (one clicking-group
trajectory), §5.3 (randomness, sample counts), §5.4 (SAM-family wrapper).

Modes, all computed for every instance in one compiled call:

  * ``Base``: the RITM baseline clicker (deepest point of the larger error,
    `prompts.clicker`), ``num_rounds`` rounds.
  * Clicking groups G1..G``num_groups`` (equal-mass bands ``[(g-1)/G, g/G]``): one
    trajectory each, ``num_rounds`` rounds, vmapped over the groups.
  * ``User`` (optional): every real first-round click of the instance, each
    evaluated alone (one round, no previous mask).
  * ``SamplingUsersCount`` (optional): as many i.i.d. draws from the full
    first-round clickability map (group bounds 0..1, i.e. weighted by ``M``) as
    the instance has real first-round clicks, each evaluated alone.

One round of a trajectory (§5.2; state: prediction ``pred`` (empty before round
1), ``not_clicked``, the clicks so far, the model's feedback map)::

    FN = gt & ~pred & V,  FP = ~gt & pred & V
    positive iff max EDT(pad(FN)) > max EDT(pad(FP))   (both times not_clicked; strict)
    R = the whole FN (positive) or FP (negative) mask
    Base:   click = first row-major maximum of the chosen EDT map
    Group:  M = click_model(I, gt, R) * R * not_clicked; band of M's mass [q_lo, q_hi]
            (inclusive thresholds, `groups.band_thresholds`); click ~ M inside the band
            (weighted, not uniform); empty band -> the Base click
    decode(all clicks so far, the feedback map) -> pred = sigmoid(logits) > thr; IoU, BIoU

Here ``gt`` is the object (``gt == 1``) and ``V`` the non-ignore pixels of the
image (GrabCut/Berkeley ignore band and the frame padding excluded); the IoU of
a round is ``|gt & pred & V| / |(gt | pred) & V|`` (RITM ``get_iou``) and its
Boundary IoU the same ratio of the two masks' inner bands of width ``d`` (the
instance's band width at dilation ratio 0.02, as the reference's ``BIoU(0.02)``;
`metrics.packed`, docs/protocols/boundary_iou.md). Every 20-round run has
exactly ``num_rounds`` IoUs and BIoUs (no early stop, ``--iou-analysis``).

Model feedback (§5.4): the multimask mode of the family's wrapper in the
reference (``multimask_output=None``, default: `models.base.evaluation_multimask`;
SAM: three masks, the highest predicted IoU; SAM 2: one mask with the official
dynamic fallback), and the model's feedback map
of the prediction (``Segmenter.feedback``; SAM: the selected low-res logits)
is the next round's mask input -- except that the reference resets the
feedback whenever its padded point tensor has exactly two slots, i.e. at round
1 **and at round 2 when the second click is negative** (``mask_feedback=
"reference"``, default, for families whose wrapper resets it,
`models.base.resets_feedback`: the SAM family; click-map models feed their
previous prediction from round 2 on; ``"always"`` feeds back from round 2 on,
``"never"`` never). Each round goes through the Segmenter contract's
`models.base.interactive_step` from `models.base.initial_state` (fresh per
trajectory and per single first-round click): the SAM family's state is that
feedback map; click-map models with ``evaluation`` set run the authors' isegm
predictor (zoom-in, flip, CFR-ICL's cascade; docs/protocols/rclicks.md §5.5)
and carry its state. Clicks ``(row, col)`` become points ``(x, y) = (col, row)`` in image
pixels (the model adds its own offset and resize scale); unused slots are
padding (label -1, masked inside the model).

Randomness (§5.3): the reference re-seeds numpy with 42 at the start of every
image; JAX cannot reproduce that stream. Here every instance has the key
``fold_in(PRNGKey(seed), instance_seed)`` where ``instance_seed`` is the
batch's per-instance seed (a hash of the instance key, `data.buckets`), so a
result does not depend on the batch, slot, device or resume; group ``g`` uses
``fold_in(key, g)`` and round ``r`` ``fold_in(group_key, r)``; the
SamplingUsersCount draws use ``fold_in(key, SAMPLE_USERS_STREAM)``.
Compare with the reference statistically, not draw by draw.

`RClicksProtocol` is the per-instance function of
`jaxseg_robust.runner.program.BatchProgram` (host inputs: the click model's
prepared inputs and the real first-round clicks; device: embed once, ``lax.scan``
over rounds, ``vmap`` over groups and instances); `make_rclicks_batch_fn`
builds the batch function for `jaxseg_robust.runner.engine.run`.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from typing import Any, NamedTuple

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxseg_robust.clicksim.error_region import choose_error_region
from jaxseg_robust.clicksim.groups import first_argmax_xy, group_bounds, masked_clickability, sample_group_click
from jaxseg_robust.data.buckets import instance_seed
from jaxseg_robust.metrics.masks import DEFAULT_DILATION_RATIO, boundary_width, mask_iou
from jaxseg_robust.metrics.packed import pack_target, packed_scores
from jaxseg_robust.models.base import (
    Transform,
    evaluation_multimask,
    image_region,
    initial_state,
    interactive_step,
    resets_feedback,
)
from jaxseg_robust.ops.sampling import sample_pixels
from jaxseg_robust.prompts.clicker import mark_clicked
from jaxseg_robust.prompts.types import NEGATIVE_LABEL, PADDING_LABEL, POSITIVE_LABEL
from jaxseg_robust.runner.program import BatchProgram, InstanceInputs

__all__ = [
    "DEFAULT_NUM_ROUNDS",
    "DEFAULT_SEED",
    "DEFAULT_THRESHOLD",
    "MASK_FEEDBACK_RULES",
    "SAMPLE_USERS_STREAM",
    "RClicksConfig",
    "Trajectory",
    "InstanceResult",
    "instance_key",
    "family_settings",
    "feedback_enabled",
    "band_width_of",
    "simulate_trajectory",
    "trajectory_plan",
    "simulate_trajectories",
    "evaluate_single_clicks",
    "sample_first_round_clicks",
    "simulate_instance",
    "RoundState",
    "RClicksProtocol",
    "make_rclicks_batch_fn",
    "user_slot_count",
    "finalize_record",
]

DEFAULT_NUM_ROUNDS = 20
DEFAULT_SEED = 42
DEFAULT_THRESHOLD = 0.5  # SAM-type models (RITM-type: 0.49), §5.1
MASK_FEEDBACK_RULES = ("reference", "always", "never")
SAMPLE_USERS_STREAM = 1_000_003  # fold_in tag of the SamplingUsersCount draws (distinct from group indices)
_USER_SLOT_MULTIPLE = 8


@dataclasses.dataclass(frozen=True)
class RClicksConfig:
    """Static settings of the simulated evaluation (defaults: the reference benchmark, §8.1).

    Attributes:
      num_rounds: clicks per trajectory (20).
      num_groups: equal-mass clicking groups (10); 0 disables the group trajectories.
      run_base: also run the Base (baseline clicker) trajectory.
      threshold: probability threshold of the segmenter (0.5 SAM-type, 0.49 RITM-type).
      mask_feedback: "reference" (the reference wrapper's rule for the family, §5.4), "always" or "never".
      multimask_output: True (multimask, argmax of the predicted IoU), False (one mask), or None
        (default): the family's mode in the reference (`models.base.evaluation_multimask`).
      seed: run seed (42).
      user_slots: padded number of first-round click slots per instance for the
        User / SamplingUsersCount modes (0 = modes off).
    """

    num_rounds: int = DEFAULT_NUM_ROUNDS
    num_groups: int = 10
    run_base: bool = True
    threshold: float = DEFAULT_THRESHOLD
    mask_feedback: str = "reference"
    multimask_output: bool | None = None
    seed: int = DEFAULT_SEED
    user_slots: int = 0

    def __post_init__(self):
        for name, low in (("num_rounds", 1), ("num_groups", 0), ("user_slots", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an int >= {low}; got {value!r}")
        if not 0.0 < float(self.threshold) < 1.0:
            raise ValueError(f"threshold must be a probability in (0, 1); got {self.threshold!r}")
        if self.mask_feedback not in MASK_FEEDBACK_RULES:
            raise ValueError(f"mask_feedback must be one of {MASK_FEEDBACK_RULES}; got {self.mask_feedback!r}")
        if self.multimask_output not in (None, True, False):
            raise ValueError(f"multimask_output must be True, False or None; got {self.multimask_output!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ValueError(f"seed must be an int; got {self.seed!r}")
        if not self.run_base and self.num_groups == 0 and self.user_slots == 0:
            raise ValueError("nothing to evaluate: run_base is False, num_groups is 0 and user_slots is 0")

    def to_dict(self) -> dict:
        """JSON-able settings (recorded in the run manifest)."""
        return dataclasses.asdict(self)


@flax.struct.dataclass
class RoundState:
    """What a trajectory carries from one round to the next.

    Attributes:
      pred: bool[Hf, Wf] the previous round's prediction (empty before round 1).
      not_clicked: bool[Hf, Wf] pixels not clicked yet.
      points: f32[R, 2] clicks so far (x, y); labels: i32[R] (-1 = not yet).
      feedback: the model's interactive state after the previous prediction
        (`models.base.initial_state` / `interactive_step`; SAM: the feedback map of
        ``Segmenter.feedback``; click-map models with the authors' machinery: `IsegmState`).
    """

    pred: jax.Array
    not_clicked: jax.Array
    points: jax.Array
    labels: jax.Array
    feedback: Any


class Trajectory(NamedTuple):
    """One simulated trajectory (leading axes: groups, instances where batched)."""

    iou: jax.Array           # f32[R] IoU after each round
    clicks: jax.Array        # i32[R, 3] (x, y, is_positive) of each click
    used_fallback: jax.Array  # bool[R] the group band had no mass: the Base click was used
    biou: jax.Array          # f32[R] Boundary IoU after each round (NaN when both bands are empty)


class InstanceResult(NamedTuple):
    """Everything simulated for one instance (fields of disabled modes have a zero-size axis)."""

    base: Trajectory      # leaves [R, ...] (zero rounds when run_base is False)
    groups: Trajectory    # leaves [G, R, ...]
    user_iou: jax.Array   # f32[U] IoU of each real first-round click alone
    sample_iou: jax.Array  # f32[U] IoU of each SamplingUsersCount click alone
    sample_clicks: jax.Array  # i32[U, 2] (x, y) of the SamplingUsersCount clicks


def instance_key(seed: int, instance_seed_value) -> jax.Array:
    """``fold_in(PRNGKey(seed), instance_seed)``: the key of one instance (module docstring).

    Args:
      seed: Python int run seed.
      instance_seed_value: uint32 (may be traced) per-instance seed (`data.buckets.instance_seed`).
    """
    return jax.random.fold_in(jax.random.PRNGKey(seed), jnp.asarray(instance_seed_value).astype(jnp.uint32))


def family_settings(config: RClicksConfig, segmenter) -> tuple[str, bool]:
    """(feedback rule, multimask) of ``config`` for ``segmenter``'s family (§5.4).

    "reference" becomes "always" for a family whose reference wrapper never
    resets the feedback (`models.base.resets_feedback`: click-map models); a
    ``multimask_output`` of None becomes the family's (`models.base.evaluation_multimask`).
    """
    rule = config.mask_feedback
    if rule == "reference" and not resets_feedback(segmenter):
        rule = "always"
    multimask = evaluation_multimask(segmenter) if config.multimask_output is None else config.multimask_output
    return rule, bool(multimask)


def feedback_enabled(rule: str, round_index, is_positive) -> jax.Array:
    """Whether round ``round_index`` (0-based) feeds the previous low-res logits back (§5.4).

    Args:
      rule: static, one of `MASK_FEEDBACK_RULES`.
      round_index: int (traced) 0-based round.
      is_positive: bool (traced) polarity of this round's click.
    Returns:
      bool[]: "reference": ``r >= 1`` unless ``r == 1`` with a negative click;
      "always": ``r >= 1``; "never": False.
    """
    round_index = jnp.asarray(round_index)
    if rule == "never":
        return jnp.zeros((), bool)
    if rule == "always":
        return round_index >= 1
    if rule == "reference":
        return (round_index >= 1) & ~((round_index == 1) & ~jnp.asarray(is_positive, bool))
    raise ValueError(f"rule must be one of {MASK_FEEDBACK_RULES}; got {rule!r}")


def _object_and_valid(gt: jax.Array, transform: Transform) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(object bool, non-ignore image pixels bool, image pixels bool), all [Hf, Wf]."""
    gt = jnp.asarray(gt)
    if gt.shape != tuple(transform.frame_hw):
        raise ValueError(f"gt shape {gt.shape} differs from the transform's frame {transform.frame_hw}")
    inside = image_region(transform)
    return (gt == 1) & inside, (gt != -1) & inside, inside


def _predict(segmenter, params, features, transform, points, labels, state, use_state, num_clicks, threshold,
             multimask_output, inside):
    """(``probability > threshold`` within the image, the model's next interactive state), one round
    through the Segmenter contract (`models.base.interactive_step`)."""
    prob, state = interactive_step(segmenter, params, features, transform, points, labels, state, use_state,
                                   num_clicks, multimask_output=multimask_output)
    return (prob > threshold) & inside, state


def band_width_of(width, frame_hw: tuple[int, int]):
    """The Boundary IoU band width: ``width`` (i32[], the program's per-instance data) or, when None, the
    width of the whole frame at the ratio 0.02 (`metrics.masks.boundary_width`; a frame that is the image)."""
    if width is None:
        return boundary_width(int(frame_hw[0]), int(frame_hw[1]), DEFAULT_DILATION_RATIO)
    return jnp.asarray(width, jnp.int32)


def simulate_trajectory(segmenter, params, features, transform: Transform, gt, click_model, click_params,
                        prepared, key, q_low, q_high, is_base, *, config: RClicksConfig,
                        width=None) -> Trajectory:
    """One ``num_rounds`` trajectory of one instance (§5.2): Base or one clicking group.

    Base and group trajectories share this code (so one compiled round serves
    both, vmapped over trajectories): ``is_base`` selects the baseline click;
    the click model still runs on a Base trajectory (its map is then unused).

    Args:
      segmenter, params: the promptable model (static) and its parameters.
      features: the instance's cached features (`Segmenter.embed`, unbatched).
      transform: its `Transform` (``frame_hw`` = the evaluation frame (Hf, Wf)).
      gt: int8[Hf, Wf] 1 object / 0 background / -1 ignore or outside the image.
      click_model, click_params, prepared: the click model (static), its
        parameters and this instance's `prepare` output.
      key: this trajectory's key (round r uses ``fold_in(key, r)``).
      q_low, q_high: scalar mass bounds of the group (ignored for Base).
      is_base: bool scalar (may be traced): True = Base clicker.
      config: static settings.
      width: i32[] Boundary IoU band width of the image in pixels (`band_width_of`; None: the frame's).
    Returns:
      `Trajectory` with leaves [R, ...].
    """
    obj, valid, inside = _object_and_valid(gt, transform)
    width = band_width_of(width, tuple(obj.shape))
    target = pack_target(gt, inside, width)
    rule, multimask = family_settings(config, segmenter)
    rounds = config.num_rounds
    state = RoundState(pred=jnp.zeros_like(obj), not_clicked=jnp.ones_like(obj),
                       points=jnp.zeros((rounds, 2), jnp.float32), labels=jnp.full((rounds,), PADDING_LABEL, jnp.int32),
                       feedback=initial_state(segmenter, tuple(obj.shape)))
    is_base = jnp.asarray(is_base, bool)

    def one_round(carry: RoundState, round_index):
        pred, not_clicked, points, labels, previous = (carry.pred, carry.not_clicked, carry.points, carry.labels,
                                                       carry.feedback)
        error = choose_error_region(obj, pred, valid, not_clicked)
        clickability = click_model.clickability(click_params, prepared, error.region, inside)
        masked = masked_clickability(clickability, error.region, not_clicked)
        click = sample_group_click(jax.random.fold_in(key, round_index), masked, q_low, q_high, error.distance)
        xy = jnp.where(is_base, first_argmax_xy(error.distance), click.xy)
        used_fallback = click.used_fallback & ~is_base
        label = jnp.where(error.is_positive, POSITIVE_LABEL, NEGATIVE_LABEL).astype(jnp.int32)
        points = points.at[round_index].set(xy.astype(jnp.float32))
        labels = labels.at[round_index].set(label)
        not_clicked = mark_clicked(not_clicked, xy[1], xy[0])
        pred, previous = _predict(segmenter, params, features, transform, points, labels, previous,
                                  feedback_enabled(rule, round_index, error.is_positive), round_index + 1,
                                  config.threshold, multimask, inside)
        iou = mask_iou(obj, pred, valid)
        biou = packed_scores(pred, target, width).biou
        clicks = jnp.concatenate([xy, error.is_positive.astype(jnp.int32)[None]]).astype(jnp.int32)
        new = RoundState(pred=pred, not_clicked=not_clicked, points=points, labels=labels, feedback=previous)
        return new, Trajectory(iou, clicks, used_fallback, biou)

    _, trajectory = lax.scan(one_round, state, jnp.arange(rounds))
    return trajectory


def trajectory_plan(config: RClicksConfig) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The trajectories of one instance: Base first (if enabled), then G1..G``num_groups``.

    Returns:
      (q_low f32[T], q_high f32[T], is_base bool[T]); group g (0-based) has bounds
      ``[g/G, (g+1)/G]``; the Base entry has bounds (0, 1) (unused).
    """
    bounds = group_bounds(config.num_groups) if config.num_groups else np.zeros((0, 2))
    base = np.array([[0.0, 1.0]] if config.run_base else np.zeros((0, 2)))
    both = np.concatenate([base, bounds]).astype(np.float32)
    is_base = np.arange(both.shape[0]) < int(config.run_base)
    return both[:, 0], both[:, 1], is_base


def simulate_trajectories(segmenter, params, features, transform: Transform, gt, click_model, click_params,
                          prepared, key, *, config: RClicksConfig, width=None) -> tuple[Trajectory, Trajectory]:
    """Base and the clicking-group trajectories of one instance, vmapped over trajectories.

    Group ``g`` (0-based: G(g+1)) has key ``fold_in(key, g)``; Base needs no key; ``width`` as
    `simulate_trajectory`.

    Returns:
      (base `Trajectory` with leaves [R, ...] (zero rounds when disabled),
       groups `Trajectory` with leaves [G, R, ...]).
    """
    q_low, q_high, is_base = trajectory_plan(config)
    group_index = np.arange(is_base.shape[0]) - int(config.run_base)
    keys = jax.vmap(lambda g: jax.random.fold_in(key, g))(jnp.asarray(np.maximum(group_index, 0)))
    one = functools.partial(simulate_trajectory, segmenter, params, features, transform, gt, click_model,
                            click_params, prepared, config=config, width=width)
    both = jax.vmap(one)(keys, jnp.asarray(q_low), jnp.asarray(q_high), jnp.asarray(is_base))
    if config.run_base:
        base = jax.tree.map(lambda leaf: leaf[0], both)
    else:
        base = Trajectory(jnp.zeros((0,), jnp.float32), jnp.zeros((0, 3), jnp.int32), jnp.zeros((0,), bool),
                          jnp.zeros((0,), jnp.float32))
    return base, jax.tree.map(lambda leaf: leaf[int(config.run_base):], both)


def evaluate_single_clicks(segmenter, params, features, transform: Transform, gt, points_xy, *,
                           config: RClicksConfig) -> jax.Array:
    """IoU of each click alone as a first-round positive click (User / SamplingUsersCount, §5.1).

    Args:
      features, transform, gt: one instance (as `simulate_trajectory`).
      points_xy: int[U, 2] clicks (x, y) in image pixels.
    Returns:
      f32[U] IoU per click (no previous mask; the prediction thresholded at ``config.threshold``).
    """
    obj, valid, inside = _object_and_valid(gt, transform)
    fresh = initial_state(segmenter, tuple(obj.shape))

    def one(point):
        pred, _ = _predict(segmenter, params, features, transform, point.astype(jnp.float32)[None],
                           jnp.full((1,), POSITIVE_LABEL, jnp.int32), fresh, jnp.zeros((), bool), 1,
                           config.threshold, family_settings(config, segmenter)[1], inside)
        return mask_iou(obj, pred, valid)

    return jax.vmap(one)(jnp.asarray(points_xy))


def sample_first_round_clicks(key, gt, transform: Transform, click_model, click_params, prepared,
                              num: int) -> jax.Array:
    """``num`` i.i.d. clicks from the full first-round clickability map (SamplingUsersCount, §5.1).

    Round 1 has ``R = gt & V`` (positive); the draws are weighted by ``M * R``
    (group bounds 0..1 keep every pixel). An all-zero map falls back to the Base
    click for every draw.

    Returns:
      int32[num, 2] clicks (x, y).
    """
    obj, valid, inside = _object_and_valid(gt, transform)
    error = choose_error_region(obj, jnp.zeros_like(obj), valid)
    masked = masked_clickability(click_model.clickability(click_params, prepared, error.region, inside),
                                 error.region, jnp.ones_like(obj))
    drawn = sample_pixels(key, masked, num)
    fallback = first_argmax_xy(error.distance)
    return jnp.where(jnp.sum(masked) > 0, drawn, fallback[None, :])


def simulate_instance(segmenter, params, features, transform: Transform, gt, click_model, click_params, prepared,
                      key, user_points=None, *, config: RClicksConfig, width=None) -> InstanceResult:
    """Every enabled mode for one instance (pure; vmap it over instances).

    Args:
      features, transform, gt, prepared: one instance (see `simulate_trajectory`).
      key: the instance key (`instance_key`).
      user_points: int[U, 2] real first-round clicks (x, y), U = ``config.user_slots``
        (padding slots are evaluated too; the caller masks them); None when U = 0.
      width: i32[] Boundary IoU band width of the image (None: the frame's; `band_width_of`).
    Returns:
      `InstanceResult`.
    """
    slots = config.user_slots
    base, groups = simulate_trajectories(segmenter, params, features, transform, gt, click_model, click_params,
                                         prepared, key, config=config, width=width)
    if slots:
        if user_points is None or jnp.shape(user_points) != (slots, 2):
            raise ValueError(f"user_points must have shape [{slots}, 2] (config.user_slots); "
                             f"got {None if user_points is None else jnp.shape(user_points)}")
        sampled = sample_first_round_clicks(jax.random.fold_in(key, SAMPLE_USERS_STREAM), gt, transform,
                                            click_model, click_params, prepared, slots)
        both = evaluate_single_clicks(segmenter, params, features, transform, gt,
                                      jnp.concatenate([jnp.asarray(user_points, jnp.int32), sampled]), config=config)
        user_iou, sample_iou = both[:slots], both[slots:]
    else:
        user_iou = sample_iou = jnp.zeros((0,), jnp.float32)
        sampled = jnp.zeros((0, 2), jnp.int32)
    return InstanceResult(base, groups, user_iou, sample_iou, sampled)


# ---- batch function for the engine ----------------------------------------------------------

def user_slot_count(counts, multiple: int = _USER_SLOT_MULTIPLE) -> int:
    """Padded first-round slot count: the largest count rounded up to ``multiple`` (0 when no clicks).

    Args:
      counts: iterable of click counts per instance.
      multiple: rounding granularity.
    """
    largest = max((int(c) for c in counts), default=0)
    return -(-largest // multiple) * multiple


@dataclasses.dataclass(frozen=True)
class RClicksProtocol:
    """The RClicks simulation as one per-instance function (`runner.program.BatchProtocol`).

    Attributes:
      config: the `RClicksConfig`.
      click_model: the `clicksim.click_models` model (static; its parameters are the program's ``aux_params``).
      user_clicks: {instance seed: int[n, 2] (x, y)} real first-round clicks (data, not part of the
        program's identity; `make_rclicks_batch_fn`).
    """

    config: RClicksConfig
    click_model: Any
    user_clicks: Mapping | None = dataclasses.field(default=None, compare=False, hash=False, repr=False)

    name = "RClicks"
    dilation_ratio = DEFAULT_DILATION_RATIO  # the reference's BIoU(0.02) per round

    def _user_slots_of(self, seed: int, height: int, width: int) -> tuple[np.ndarray, np.ndarray]:
        slots = self.config.user_slots
        points = np.zeros((slots, 2), np.int32)
        valid = np.zeros((slots,), bool)
        clicks = (self.user_clicks or {}).get(int(seed))
        if clicks is not None and len(clicks):
            clicks = np.asarray(clicks, np.int64).reshape(-1, 2)
            count = clicks.shape[0]
            points[:count, 0] = np.clip(clicks[:, 0], 0, width - 1)
            points[:count, 1] = np.clip(clicks[:, 1], 0, height - 1)
            valid[:count] = True
        return points, valid

    def host_inputs(self, segmenter, slot) -> dict:
        """The click model's prepared inputs of the slot and its real first-round clicks (padded)."""
        height, width = slot.gt.shape
        points, valid = self._user_slots_of(slot.seed, height, width)
        return {"prepared": self.click_model.prepare(slot.image, slot.gt == 1, slot.frame),
                "user_points": points, "user_valid": valid}

    def instance(self, segmenter, params, aux_params, inputs: InstanceInputs) -> dict:
        """Every enabled mode of one instance (layout: `make_rclicks_batch_fn`)."""
        config = self.config
        key = instance_key(config.seed, inputs.seed)
        result = simulate_instance(segmenter, params, inputs.features, inputs.transform, inputs.gt,
                                   self.click_model, aux_params, inputs.extras["prepared"], key,
                                   inputs.extras["user_points"] if config.user_slots else None, config=config,
                                   width=inputs.width)
        outputs = {}
        if config.run_base:
            outputs.update(base_iou=result.base.iou, base_biou=result.base.biou, base_clicks=result.base.clicks)
        if config.num_groups:
            outputs.update(group_iou=result.groups.iou, group_biou=result.groups.biou,
                           group_clicks=result.groups.clicks, group_fallback=result.groups.used_fallback)
        if config.user_slots:
            outputs.update(user_iou=result.user_iou, sample_iou=result.sample_iou, sample_clicks=result.sample_clicks,
                           user_valid=inputs.extras["user_valid"])
        return outputs


def _clicks_by_seed(user_clicks: Mapping) -> dict[int, np.ndarray]:
    """{instance seed: int64[n, 2]}; ValueError on a bad shape or two instances sharing a seed."""
    by_seed: dict[int, np.ndarray] = {}
    owners: dict[int, tuple[str, str]] = {}
    for key, clicks in user_clicks.items():
        clicks = np.asarray(clicks)
        if clicks.ndim != 2 or clicks.shape[1] != 2:
            raise ValueError(f"user_clicks[{key!r}] must have shape [n, 2] (x, y); got {clicks.shape}")
        seed = instance_seed(tuple(key))
        if seed in owners and owners[seed] != tuple(key):
            raise ValueError(f"user_clicks: instances {owners[seed]!r} and {key!r} share the per-instance seed "
                             f"{seed}; evaluate them in separate runs")
        owners[seed] = tuple(key)
        by_seed[seed] = clicks.astype(np.int64)
    return by_seed


def make_rclicks_batch_fn(segmenter, params, click_model, click_params=None, *,
                          config: RClicksConfig | None = None,
                          user_clicks: Mapping[tuple[str, str], Any] | None = None, announce=None) -> BatchProgram:
    """A batch function for `jaxseg_robust.runner.engine.run` running the RClicks simulation.

    Args:
      segmenter: any Segmenter (its feedback map is fed back between rounds).
      params: its parameters (for several devices: ``replicate(params, mesh)``).
      click_model, click_params: a `clicksim.click_models` model and its variables
        (None for the "dt" / "ud" baselines).
      config: `RClicksConfig` (default: 20 rounds, 10 groups, Base, seed 42, no user modes).
      user_clicks: optional ``{(dataset, id): int[n, 2] (x, y)}`` real first-round
        clicks per instance (`clicksim.user_clicks.first_round_clicks`); enables the
        User and SamplingUsersCount modes with ``user_slots`` = the largest n rounded
        up to a multiple of 8 unless ``config.user_slots`` is set (it must then fit).
      announce: ``text -> None`` told before a bucket's program is compiled.
    Returns:
      A `runner.program.BatchProgram` (its ``config`` is the final `RClicksConfig`; programs with equal
      settings share one compile). Outputs (leading axis B): ``base_iou``, ``base_biou`` f32[R],
      ``base_clicks`` i32[R, 3]; ``group_iou``, ``group_biou`` f32[G, R], ``group_clicks`` i32[G, R, 3]
      (x, y, is_positive), ``group_fallback`` bool[G, R]; with user clicks ``user_iou``, ``sample_iou`` f32[U], ``sample_clicks`` i32[U, 2],
      ``user_valid`` bool[U].
    Raises:
      ValueError: bad settings, more clicks than slots, or two instances whose
        per-instance seeds collide (their clicks could not be told apart).
    """
    config = RClicksConfig() if config is None else config
    by_seed = _clicks_by_seed(user_clicks) if user_clicks else {}
    if by_seed:
        needed = user_slot_count(len(c) for c in by_seed.values())
        if config.user_slots == 0:
            config = dataclasses.replace(config, user_slots=needed)
        elif config.user_slots < max(len(c) for c in by_seed.values()):
            raise ValueError(f"config.user_slots={config.user_slots} is smaller than the largest click count "
                             f"({max(len(c) for c in by_seed.values())})")
    elif config.user_slots:
        raise ValueError("config.user_slots > 0 needs user_clicks")
    config = dataclasses.replace(config, multimask_output=family_settings(config, segmenter)[1])
    protocol = RClicksProtocol(config, click_model, by_seed)
    return BatchProgram(segmenter, params, protocol, aux_params=click_params, announce=announce)


def finalize_record(instance, outputs: Mapping) -> dict:
    """Engine ``finalize``: the per-instance payload, user arrays trimmed to the real clicks.

    Args:
      instance: the loaded `Instance`.
      outputs: its slot of the batch outputs (NumPy).
    Returns:
      payload dict: ``base_iou``, ``base_biou`` [R], ``base_clicks`` [R, 3], ``group_iou``, ``group_biou``
      [G, R], ``group_clicks`` [G, R, 3], ``group_fallback`` [G, R] (those enabled), and with
      user clicks ``user_iou`` [n], ``sample_iou`` [n], ``sample_clicks`` [n, 2],
      ``n_user_clicks`` (n may be 0).
    """
    payload = {name: np.asarray(value) for name, value in outputs.items() if name != "user_valid"}
    if "user_valid" in outputs:
        count = int(np.sum(outputs["user_valid"]))
        for name in ("user_iou", "sample_iou", "sample_clicks"):
            payload[name] = payload[name][:count]
        payload["n_user_clicks"] = count
    return payload
