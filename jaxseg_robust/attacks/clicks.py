"""Click trajectories on the Segmenter protocol: the RITM baseline and TETRIS adversarial clicks (min/max).

The protocol, its defaults and every paper/code choice are in
docs/protocols/tetris.md (§1 the baseline clicker, §2.3 the input pipeline,
§3.1-3.3 and §3.5 the attack and its metrics, §7 hyper-parameters and the
paper/code table rows 1-6, §8 pitfalls). In short, for one instance
(`click_trajectory`; vmap it), K greedy clicks, no early stop:

  for k = 1..K:
    c_k = baseline click of ``P_{k-1} > thr`` (RITM clicker; the sign is fixed)
    P_k = the best of S evaluated iterates of c_k (iterate 0 = c_k, then Adam
          updates of q = c_k in the model frame minimising
          ``Lloc + s Dice(P, G+) / 1000``, s = +1 MAX / -1 MIN; the baseline
          evaluates iterate 0 only)
    IoU_k, BIoU_k of ``P_k > thr``; the model's feedback of the accepted
    iterate (``Segmenter.feedback``) is its mask input at click k + 1.

The interactive state is family-agnostic: the previous accepted probability
map (for the clicker and the location loss) and the model's own feedback map
(``Segmenter.feedback`` / ``feedback_shape``; SAM: the selected low-res
logits, reset by the reference's quirk ``mask_input="code"``). Boundary IoU
band widths are per-instance data; frames are padded (bucket frame), and
everything outside the image is masked, so a padded frame gives the unpadded
numbers.

`ClickProtocol` runs MIN, MAX (or both on one embedding) and the baseline as
one per-instance function of `jaxseg_robust.runner.program.BatchProgram`;
`make_click_batch_fn` builds the batch function for
`jaxseg_robust.runner.engine.run`. Dataset scores from records:
`jaxseg_robust.reports.tetris_scores`.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import optax
from jax import lax

from jaxseg_robust.attacks.click_state import (
    BestIterate,
    batched_like_instance,
    ClickInstance,
    ClickIterates,
    ClickSetup,
    ClickState,
    ClickTrajectory,
)
from jaxseg_robust.attacks.location import (
    LOCATION_THRESHOLD,
    location_distance_map,
    location_error_region,
    location_loss,
)
from jaxseg_robust.attacks.predictor_clicks import decode_attempt, predictor_attempt
from jaxseg_robust.attacks.scoring import START_MAX, START_MIN, is_better
from jaxseg_robust.metrics.interactive import TETRIS_NUM_CLICKS, normalized_auc
from jaxseg_robust.metrics.masks import DEFAULT_DILATION_RATIO
from jaxseg_robust.metrics.packed import pack_target, packed_scores
from jaxseg_robust.models.base import (
    Transform,
    click_step_hw,
    differentiable,
    image_region,
    predictor_view,
    with_predictor,
    resets_feedback,
    unit_scale,
)
from jaxseg_robust.ops.labels import IGNORE_LABEL
from jaxseg_robust.ops.render import COVERAGE_AREA, COVERAGE_RAMP, DEFAULT_CLICK_RADIUS
from jaxseg_robust.prompts.clicker import mark_clicked, next_click, xy_of
from jaxseg_robust.prompts.types import NEGATIVE_LABEL, PADDING_LABEL, POSITIVE_LABEL, click_prompts
from jaxseg_robust.runner.program import BatchProgram, ConfigProtocol, InstanceInputs

DEFAULT_N_CLICKS = TETRIS_NUM_CLICKS  # 10 (TETRIS); use 20 for NoC
DEFAULT_N_OPT_STEPS = 11  # evaluated iterates per click: the baseline click + 10 updates (run.sh)
DEFAULT_LR_MULT = 1.0
DEFAULT_THRESHOLD = 0.5  # SAM family (run.sh); the RITM tools default to 0.49 (Segmenter.probability_threshold)
DEFAULT_TOLERANCE = 1.05  # Lloc <= 1.05 * bestLoc
DEFAULT_DICE_WEIGHT = 1e-3  # L = Lloc + s * Dice / 1000
LR_BASE = 5.0
LR_REFERENCE_SIZE = 400  # lr = lr_mult * 5 * sqrt(H^2 + W^2) / (400 sqrt 2)
ATTACK_MODES = ("min", "max")
TRAJECTORY_MODES = ("baseline", "min", "max")
BATCH_MODES = ("baseline", "min", "max", "minmax")
MASK_INPUT_MODES = ("code", "always")
ACCEPTANCE_MODES = ("code", "paper")
PREDICTOR_MODES = ("authors", "off")
# the layout of the records `trajectory_outputs` gives (a run directory's manifest names it; runner.rundir refuses
# to resume one written in another): clicks as (x, y) under *_xy, the per-instance AuC named with its K
RECORDS_FORMAT = "tetris/2: clicks_xy (x, y), auc_iou@K"
_NUMBERS = ("lr_mult", "thr", "radius", "tolerance", "dice_weight", "location_threshold", "dilation_ratio")


# ---- configuration --------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class TetrisConfig:
    """Static settings of a click trajectory (defaults: the TETRIS reference code, docs/protocols/tetris.md §7.1).

    Attributes:
      mode: "baseline" (RITM clicker, no optimisation), "min" (IoU-decreasing,
        s = -1) or "max" (IoU-increasing, s = +1).
      n_clicks: clicks per trajectory K (10 for TETRIS AuC@10, 20 for NoC).
      n_opt_steps: evaluated iterates per click S (baseline click + S - 1 Adam
        updates); ignored (1) in "baseline" mode. Paper: 10, code: 11.
      lr_mult: lr multiplier (lr = lr_mult 5 sqrt(H^2 + W^2) / (400 sqrt 2)).
      thr: probability threshold of the metrics and the clicker (P > thr).
      radius: disk radius of the location loss, model-frame pixels (5).
      tolerance: location-loss acceptance factor (1.05).
      dice_weight: weight of the signed Dice term (1/1000).
      location_threshold: threshold of the previous map for the location-loss
        distance maps (0.5 whatever ``thr`` is).
      coverage, samples_per_axis: disk renderer (`ops.render.render_soft_disk`).
      mask_input: "code" (the reference's reset quirk, §2.3 item 3) or "always".
      optimise_first_click: False = the paper's reading (§7.2 row 2).
      acceptance: "code" (lexicographic (IoU, BIoU), tolerance vs the last
        accepted Lloc) or "paper" (IoU only, tolerance vs iterate 0's Lloc).
      record_trajectory: also return the per-iterate log (`ClickIterates`).
      return_mask: also return the last click's binary mask (frame-sized).
      dilation_ratio: Boundary IoU band ratio of the widths the program passes.
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
        for name in _NUMBERS:
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
        self._check_choices()

    def _check_choices(self) -> None:
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
      f32[...] learning rate in model-frame pixels per step (480 x 640 -> 7.07).
    """
    h = jnp.asarray(height, jnp.float32)
    w = jnp.asarray(width, jnp.float32)
    return jnp.float32(lr_mult * LR_BASE) * jnp.sqrt(h * h + w * w) / jnp.float32(LR_REFERENCE_SIZE * math.sqrt(2.0))


def _check_frame(gt, transform: Transform) -> None:
    if transform.frame_hw is None:
        raise ValueError("transform.frame_hw must be set (Segmenter.preprocess sets it)")
    if gt.ndim != 2 or tuple(gt.shape) != tuple(transform.frame_hw):
        raise ValueError(f"gt must have the transform's frame shape {tuple(transform.frame_hw)}; got {gt.shape}")


def reported_click(point_resized, transform: Transform) -> jnp.ndarray:
    """f32[2] (row, col) of a model-frame point (x, y): ``(y / sy, x / sx)`` clipped to the image."""
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


def click_instance(transform: Transform, gt, width, config: TetrisConfig, maximise=None,
                   step_hw=None) -> ClickInstance:
    """The `ClickInstance` of one instance (``maximise``: optional bool[] overriding ``config.mode``;
    ``step_hw``: i32[2] size whose diagonal scales the step, default ``original_hw``, see
    `jaxseg_robust.models.base.click_step_hw`)."""
    step_hw = transform.original_hw if step_hw is None else step_hw
    region = image_region(transform)
    target = (gt == 1) & region
    maximise = jnp.asarray(config.mode == "max" if maximise is None else maximise, bool)
    return ClickInstance(
        transform=transform, region=region, target=target, labelled=region & (gt != IGNORE_LABEL),
        target_float=target.astype(jnp.float32), packed=pack_target(gt, region, width), width=width,
        scale=jnp.asarray(transform.scale_xy, jnp.float32),
        learning_rate=tetris_learning_rate(step_hw[0], step_hw[1], config.lr_mult),
        maximise=maximise, sign=jnp.where(maximise, jnp.float32(1.0), jnp.float32(-1.0)),
        start=jnp.where(maximise, jnp.float32(START_MAX), jnp.float32(START_MIN)))


# ---- one click ----------------------------------------------------------------------------

def click_setup(ctx: ClickInstance, config: TetrisConfig, state: ClickState, index,
                resets: bool = True, frame_distance: bool = True) -> ClickSetup:
    """The baseline clicker's click ``index`` on the previous accepted map, and its prompt history.

    ``resets``: static, whether the family's wrapper drops the mask input while
    ``max(#positive, #negative) <= 1`` (`jaxseg_robust.models.base.resets_feedback`); applies to
    ``mask_input="code"``. ``frame_distance``: static, compute the location loss's distance map on
    the frame (False where the click is optimised in a predictor's crop, which has its own).
    """
    slots = jnp.arange(config.n_clicks)
    pred = (state.probability > config.thr) & ctx.region
    is_positive, row, col = next_click(ctx.target, pred, state.not_clicked, ctx.labelled)
    label = jnp.where(is_positive, POSITIVE_LABEL, NEGATIVE_LABEL).astype(jnp.int32)
    labels = jnp.where(slots == index, label, state.labels)
    positives = jnp.sum(labels == POSITIVE_LABEL)
    negatives = jnp.sum(labels == NEGATIVE_LABEL)
    if config.mask_input == "code" and resets:
        has_mask = (index > 0) & (jnp.maximum(positives, negatives) > 1)
    else:
        has_mask = index > 0
    errors = location_error_region(ctx.target, state.probability, is_positive, ctx.region,
                                   config.location_threshold)
    distance = location_distance_map(errors, ctx.transform.original_hw) if config.optimises and frame_distance else None
    q0 = jnp.stack([col.astype(jnp.float32) * ctx.scale[0], row.astype(jnp.float32) * ctx.scale[1]])
    return ClickSetup(index=index, current=(slots == index)[:, None], is_positive=is_positive, row=row, col=col,
                      labels=labels, has_mask=has_mask, errors=errors, distance=distance, q0=q0)


def consider_iterate(ctx: ClickInstance, config: TetrisConfig, setup: ClickSetup, best: BestIterate, q, loss, aux,
                     step, to_click=None) -> tuple[BestIterate, ClickIterates]:
    """Scores one iterate and applies the acceptance rule (§3.2 item 5); returns (new best, its log).

    ``to_click``: ``q -> (row, col)`` of the log (default `reported_click` of the model frame)."""
    prob, feedback, dice, loc = aux
    scores = packed_scores((prob > config.thr) & ctx.region, ctx.packed, ctx.width)
    if config.acceptance == "paper":
        better = jnp.where(ctx.maximise, scores.selection_iou > best.selection_iou,
                           scores.selection_iou < best.selection_iou)
    else:
        better = is_better(scores, best.selection_iou, best.selection_biou, ctx.maximise)
    may_accept = jnp.asarray(True) if config.optimise_first_click else setup.index > 0
    within = (best.reference_loc == jnp.inf) | (loc <= jnp.float32(config.tolerance) * best.reference_loc)
    accept = within & better & ((step == 0) | may_accept)
    candidate = BestIterate(selection_iou=scores.selection_iou, selection_biou=scores.selection_biou,
                            iou=scores.iou, biou=scores.biou, loc=loc, reference_loc=loc, probability=prob,
                            feedback=feedback, point=q, step=step, accepted=best.accepted + 1)
    new = jax.tree.map(lambda c, o: jnp.where(accept, c, o), candidate, best)
    if config.acceptance == "paper":  # tolerance relative to iterate 0's Lloc
        new = new.replace(reference_loc=jnp.where(step == 0, loc, best.reference_loc))
    click = reported_click(q, ctx.transform) if to_click is None else to_click(q)
    log = ClickIterates(point_resized=q, click=click, loss=loss, dice=dice, location=loc,
                        selection_iou=scores.selection_iou, selection_biou=scores.selection_biou, iou=scores.iou,
                        biou=scores.biou, accepted=accept)
    return new, log


def optimise_click(objective, ctx: ClickInstance, config: TetrisConfig, state: ClickState,
                   setup: ClickSetup, q0=None, to_click=None) -> tuple[BestIterate, ClickIterates]:
    """The S evaluated iterates of one click (S - 1 Adam steps that matter) from ``q0`` (default ``setup.q0``),
    all in one ``lax.scan`` body (docs/protocols/tetris.md, "The unused last update"); returns (accepted
    iterate, log [S, ...]); ``to_click`` as `consider_iterate`."""
    n_iterates = config.evaluated_iterates
    q0 = setup.q0 if q0 is None else q0
    optimizer = optax.adam(ctx.learning_rate)
    consider = functools.partial(consider_iterate, ctx, config, setup, to_click=to_click)
    best = BestIterate(selection_iou=ctx.start, selection_biou=ctx.start, iou=jnp.float32(jnp.nan),
                       biou=jnp.float32(jnp.nan), loc=jnp.float32(jnp.inf), reference_loc=jnp.float32(jnp.inf),
                       probability=state.probability, feedback=state.feedback, point=q0,
                       step=jnp.int32(0), accepted=jnp.int32(0))
    if n_iterates == 1:  # the baseline: iterate 0 only, no gradient
        loss, aux = objective(q0)
        best, log = consider(best, q0, loss, aux, jnp.int32(0))
        return best, jax.tree.map(lambda leaf: leaf[None], log)

    def step(carry, step_index):
        q, opt_state, best = carry
        (loss, aux), grad = jax.value_and_grad(objective, has_aux=True)(q)
        best, log = consider(best, q, loss, aux, step_index)
        updates, opt_state = optimizer.update(grad, opt_state, q)
        return (optax.apply_updates(q, updates), opt_state, best), log

    # Every iterate in the one loop body, the last too (its gradient and update are never used, as in the
    # reference's loop): one copy of the decoder's forward pass in the program, not a second one after the loop.
    init = batched_like_instance((q0, optimizer.init(q0), best), ctx)
    (_, _, best), logs = lax.scan(step, init, jnp.arange(n_iterates, dtype=jnp.int32))
    return best, logs


def one_click(segmenter, attempt, ctx: ClickInstance, config: TetrisConfig, state: ClickState, index,
              frame_distance: bool = True):
    """Click ``index`` of a trajectory: (the next `ClickState`, its per-click record).

    ``attempt``: ``(state, setup) -> ClickAttempt`` (`jaxseg_robust.attacks.predictor_clicks`: the frame
    the click is optimised in and how an iterate is predicted); ``frame_distance`` as `click_setup`.
    """
    setup = click_setup(ctx, config, state, index, resets_feedback(segmenter), frame_distance)
    how = attempt(state, setup)
    best, logs = optimise_click(how.objective, ctx, config, state, setup, how.q0, how.to_click)
    click = how.to_click(best.point)
    if not config.optimises:  # the baseline's click is the integer pixel itself
        click = jnp.stack([setup.row, setup.col]).astype(jnp.float32)
    point_resized = jnp.stack([click[1] * ctx.scale[0], click[0] * ctx.scale[1]])
    points = jnp.where(setup.current, point_resized[None, :], state.points)
    probability, feedback, iou, biou = how.finish(best, points, setup.labels)
    record = {
        "clicks": click, "is_positive": setup.is_positive, "baseline_clicks": jnp.stack([setup.row, setup.col]),
        "has_mask_input": setup.has_mask, "iou": iou, "biou": biou,
        "selection_iou": best.selection_iou, "selection_biou": best.selection_biou,
        "start_selection_iou": logs.selection_iou[0], "start_selection_biou": logs.selection_biou[0],
        "start_iou": logs.iou[0], "start_biou": logs.biou[0],
        "location_loss": best.loc, "start_location_loss": logs.location[0],
        "in_error_region": _pixel_at(setup.errors, click), "best_step": best.step, "n_accepted": best.accepted,
    }
    if config.record_trajectory:
        record["iterates"] = logs
    new_state = ClickState(points=points, labels=setup.labels,
                           not_clicked=mark_clicked(state.not_clicked, click[0], click[1]),
                           probability=probability, feedback=feedback)
    return new_state, record


# ---- the trajectory -------------------------------------------------------------------

def click_trajectory(segmenter, params, features, transform: Transform, gt, width,
                     config: TetrisConfig = TetrisConfig(), maximise=None) -> ClickTrajectory:
    """A baseline or TETRIS (min/max) click trajectory of one instance (pure; jit, vmap over instances).

    Args:
      segmenter: any Segmenter (static, closed over); its feedback map is its mask input.
      params: its parameter pytree.
      features: the instance's cached image features (one image; no gradient flows to them).
      transform: its `Transform` (``frame_hw`` = the frame of ``gt``).
      gt: int [Hf, Wf] 1 object / 0 background / -1 ignore (anything outside
        the image is ignored via ``transform.original_hw``).
      width: i32[] Boundary IoU band width of the image (`metrics.masks.boundary_widths`).
      config: static `TetrisConfig`.
      maximise: optional bool[] overriding the MIN/MAX choice of
        ``config.mode`` as *data* (True = MAX), so one program runs both
        (`tetris_min_max`). Only for the attack modes.

    Returns:
      `ClickTrajectory` (docs/protocols/tetris.md for the protocol).
    """
    gt = jnp.asarray(gt)
    _check_frame(gt, transform)
    if maximise is not None and not config.optimises:
        raise ValueError("maximise applies to the 'min'/'max' modes only")
    features = jax.tree.map(lax.stop_gradient, features)
    if config.optimises:  # the attack differentiates through the click rendering of click-map models
        segmenter = differentiable(segmenter)
    view = predictor_view(segmenter)  # the step of a predictor's click: the diagonal of its grid
    step_hw = click_step_hw(segmenter, transform) if view is None else jnp.asarray(view.grid_hw(gt.shape), jnp.int32)
    ctx = click_instance(transform, gt, jnp.asarray(width, jnp.int32), config, maximise, step_hw)
    n_clicks = config.n_clicks
    if view is None:  # q in the model frame, decode on the frame
        model_transform = unit_scale(transform)

        def decode(prompts):
            return segmenter.decode(params, features, prompts, model_transform, multimask_output=True)

        def attempt(state, setup):
            return decode_attempt(segmenter, decode, ctx, config, state, setup, reported_click)

        feedback0 = jnp.zeros(segmenter.feedback_shape(tuple(gt.shape)), jnp.float32)
    else:  # q in the crop of the family's predictor
        attempt = functools.partial(predictor_attempt, view, params, features, ctx, config)
        feedback0 = view.initial_state(tuple(gt.shape))
    state0 = ClickState(points=jnp.zeros((n_clicks, 2), jnp.float32),
                        labels=jnp.full((n_clicks,), PADDING_LABEL, jnp.int32), not_clicked=jnp.ones(gt.shape, bool),
                        probability=jnp.zeros(gt.shape, jnp.float32), feedback=feedback0)
    state0 = batched_like_instance(state0, ctx)
    final, records = lax.scan(lambda state, index: one_click(segmenter, attempt, ctx, config, state, index,
                                                             frame_distance=view is None),
                              state0, jnp.arange(n_clicks, dtype=jnp.int32))
    iterates = records.pop("iterates", None)
    mask = ((final.probability > config.thr) & ctx.region) if config.return_mask else None
    return ClickTrajectory(learning_rate=ctx.learning_rate, iterates=iterates, mask=mask, **records)


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


# ---- the protocol ---------------------------------------------------------------------

_PER_CLICK_FIELDS = ("clicks", "is_positive", "baseline_clicks", "has_mask_input", "iou", "biou",
                     "selection_iou", "selection_biou", "start_selection_iou", "start_selection_biou",
                     "start_iou", "start_biou", "location_loss", "start_location_loss", "in_error_region",
                     "best_step", "n_accepted")
_BASELINE_FIELDS = ("clicks", "is_positive", "has_mask_input", "iou", "biou", "selection_iou", "selection_biou",
                    "in_error_region")
_XY_NAMES = {"clicks": "clicks_xy", "baseline_clicks": "baseline_clicks_xy", "click": "click_xy"}


def _with_xy_clicks(fields: dict) -> dict:
    """``fields`` with each (row, col) click field (`_XY_NAMES`) as (x, y) under its ``_xy`` name."""
    return {_XY_NAMES.get(name, name): xy_of(value) if name in _XY_NAMES else value for name, value in fields.items()}


def auc_name(curve: str, n_clicks: int) -> str:
    """The record key of a trajectory's per-instance AuC over its K clicks: ``auc_iou@10``, ``auc_biou@20``."""
    return f"auc_{curve}@{n_clicks}"


def trajectory_outputs(result: ClickTrajectory, config: TetrisConfig) -> dict:
    """A `ClickTrajectory` (any leading axes) as the output dict of the protocol.

    Keys: the per-click fields ([..., K] / [..., K, 2]) with the clicks as (x, y) original-image pixels
    under ``clicks_xy`` / ``baseline_clicks_xy`` (labels: ``is_positive``), ``learning_rate``,
    ``auc_iou@K`` / ``auc_biou@K`` (`auc_name`: per-instance normalised AuC over the trajectory's K
    clicks, NaN for K = 1), and with the options ``iterates`` (dict of [..., K, S, ...]; the reported
    click as ``click_xy``) and ``mask`` [..., Hf, Wf]. The attack-only fields (iterate 0 and location
    losses, steps) are left out for the baseline.
    """
    fields = _PER_CLICK_FIELDS if config.optimises else _BASELINE_FIELDS
    outputs = _with_xy_clicks({name: getattr(result, name) for name in fields})
    outputs["learning_rate"] = result.learning_rate
    for name in ("iou", "biou"):
        curve = getattr(result, name)
        outputs[auc_name(name, config.n_clicks)] = (normalized_auc(curve) if config.n_clicks > 1
                                                    else jnp.full(curve.shape[:-1], jnp.nan, jnp.float32))
    if config.record_trajectory and config.optimises:
        outputs["iterates"] = _with_xy_clicks({field.name: getattr(result.iterates, field.name)
                                               for field in dataclasses.fields(result.iterates)})
    if config.return_mask:
        outputs["mask"] = result.mask
    return outputs


@dataclasses.dataclass(frozen=True)
class ClickProtocol(ConfigProtocol):
    """TETRIS attacks and/or the baseline clicker as one per-instance function (`runner.program.BatchProtocol`).

    Attributes:
      attack: `TetrisConfig` of the attack ("min" or "max"), or None.
      minmax: run MIN and MAX of ``attack`` on one embedding (``attack.mode`` is then ignored).
      baseline: `TetrisConfig` of a baseline trajectory on the same embedding, or None.
      flat: with a single trajectory, output its fields at the top level
        (`make_click_batch_fn`); else ``{"min", "max", "baseline"}`` parts.
    """

    attack: TetrisConfig | None = None
    minmax: bool = False
    baseline: TetrisConfig | None = None
    flat: bool = False

    def __post_init__(self):
        if self.attack is None and self.baseline is None:
            raise ValueError("ClickProtocol needs an attack or a baseline config")
        if self.attack is not None and not self.attack.optimises:
            raise ValueError(f"attack must be a 'min' or 'max' config; got mode {self.attack.mode!r}")
        if self.baseline is not None and self.baseline.optimises:
            raise ValueError(f"baseline must be a 'baseline' config; got mode {self.baseline.mode!r}")
        if self.minmax and self.attack is None:
            raise ValueError("minmax needs an attack config")

    name = "TETRIS"

    @property
    def config(self) -> TetrisConfig:
        """The attack's config, or the baseline's when there is no attack."""
        return self.attack if self.attack is not None else self.baseline

    @property
    def description(self) -> str:
        """What the compile announcement calls the program, e.g. "TETRIS program (minmax + baseline)"."""
        mode = "minmax" if self.minmax else ("baseline" if self.attack is None else self.attack.mode)
        extra = " + baseline" if self.baseline is not None and self.attack is not None else ""
        return f"TETRIS program ({mode}{extra})"

    @property
    def trajectories(self) -> tuple[str, ...]:
        """The trajectories the protocol outputs, in order."""
        attacks = ATTACK_MODES if self.minmax else (() if self.attack is None else (self.attack.mode,))
        return attacks + (() if self.baseline is None else ("baseline",))

    def instance(self, segmenter, params, aux_params, inputs: InstanceInputs) -> dict:
        """Every trajectory of one instance on its features (see the class docstring for the layout).

        With an attack, every trajectory (the baseline too) decodes with the family's
        differentiable click rendering, as the authors' attack code renders every click of such
        a run (`jaxseg_robust.models.base.differentiable`; the identity for the SAM family).
        """
        if self.attack is not None:
            segmenter = differentiable(segmenter)
        args = (segmenter, params, inputs.features, inputs.transform, inputs.gt, inputs.width)
        outputs = {}
        if self.minmax:
            both = tetris_min_max(*args, config=self.attack)
            for index, name in enumerate(ATTACK_MODES):
                outputs[name] = trajectory_outputs(jax.tree.map(lambda leaf, i=index: leaf[i], both), self.attack)
        elif self.attack is not None:
            outputs[self.attack.mode] = trajectory_outputs(click_trajectory(*args, config=self.attack), self.attack)
        if self.baseline is not None:
            outputs["baseline"] = trajectory_outputs(click_trajectory(*args, config=self.baseline), self.baseline)
        if self.flat and len(outputs) == 1:
            return next(iter(outputs.values()))
        return outputs

    def clicks_per_instance(self) -> int:
        """Clicks one instance computes over all its trajectories (the divisor of seconds per click)."""
        attacks = 0 if self.attack is None else (2 if self.minmax else 1) * self.attack.n_clicks
        return attacks + (0 if self.baseline is None else self.baseline.n_clicks)


def make_click_batch_fn(segmenter, params, *, mode: str = "minmax", n_clicks: int = DEFAULT_N_CLICKS,
                        n_opt_steps: int = DEFAULT_N_OPT_STEPS, lr_mult: float = DEFAULT_LR_MULT,
                        thr: float | None = None, predictor: str = "authors", dataset: str | None = None,
                        **options) -> BatchProgram:
    """A batch function for `jaxseg_robust.runner.engine.run` running one click protocol.

    Args:
      segmenter: any Segmenter (static).
      params: its parameters (for several devices: ``replicate(params, mesh)``).
      mode: "baseline" (RITM clicker, the model's feedback map fed back as the
        reference does; 20 clicks for NoC), "min" / "max" (TETRIS attacks),
        "minmax" (both attacks in one compiled program on one embedding per image).
      n_clicks: clicks per trajectory (``--n-clicks``; 10 for TETRIS).
      n_opt_steps: evaluated iterates per click (``--n-opt-steps``; 11 =
        baseline click + 10 Adam updates); ignored by "baseline".
      lr_mult: ``--lr-mult`` (lr = lr_mult 5 sqrt(H^2 + W^2) / (400 sqrt 2)).
      thr: probability threshold (default: ``segmenter.probability_threshold``).
      predictor: "authors" (click-map models attacked through the authors' predictor, zoom-in
        and flip, `jaxseg_robust.models.base.with_predictor`; ``dataset`` "DAVIS" picks its larger
        zoom) or "off" (the network once on the whole frame). No effect on the SAM family.
      dataset: see ``predictor``.
      **options: any other `TetrisConfig` field (radius, tolerance,
        dice_weight, location_threshold, coverage, samples_per_axis,
        mask_input, optimise_first_click, acceptance, record_trajectory,
        return_mask, dilation_ratio).

    Returns:
      A `runner.program.BatchProgram` of a `ClickProtocol`; its outputs
      (leading axis B, K = n_clicks):
        baseline: clicks_xy [B, K, 2] (x, y) original-image pixels, is_positive, has_mask_input,
          iou, biou, selection_iou, selection_biou, in_error_region [B, K],
          learning_rate, auc_iou@K, auc_biou@K [B] [, mask];
        min / max: the above plus baseline_clicks_xy [B, K, 2] (x, y), start_iou,
          start_biou, start_selection_iou, start_selection_biou,
          location_loss, start_location_loss, best_step, n_accepted [B, K]
          [, iterates/*];
        minmax: {"min": ..., "max": ...} with the attack fields.

    Raises:
      ValueError: unknown mode or option, or an invalid setting.
    """
    if mode not in BATCH_MODES:
        raise ValueError(f"mode must be one of {BATCH_MODES}; got {mode!r}")
    if predictor not in PREDICTOR_MODES:
        raise ValueError(f"predictor must be one of {PREDICTOR_MODES}; got {predictor!r}")
    segmenter = with_predictor(segmenter, predictor == "authors", dataset)
    known = {field.name for field in dataclasses.fields(TetrisConfig)} - {"mode", "n_clicks", "n_opt_steps",
                                                                        "lr_mult", "thr"}
    unknown = set(options) - known
    if unknown:
        raise ValueError(f"unknown options {sorted(unknown)}; known: {sorted(known)}")
    thr = float(segmenter.probability_threshold) if thr is None else thr
    config = TetrisConfig(mode="min" if mode == "minmax" else mode, n_clicks=n_clicks, n_opt_steps=n_opt_steps,
                          lr_mult=lr_mult, thr=thr, **options)
    if mode == "baseline":
        protocol = ClickProtocol(baseline=config, flat=True)
    else:
        protocol = ClickProtocol(attack=config, minmax=mode == "minmax", flat=mode != "minmax")
    return BatchProgram(segmenter, params, protocol)


__all__ = ["DEFAULT_N_CLICKS", "DEFAULT_N_OPT_STEPS", "DEFAULT_LR_MULT", "DEFAULT_THRESHOLD", "LOCATION_THRESHOLD",
           "DEFAULT_TOLERANCE", "DEFAULT_DICE_WEIGHT", "ATTACK_MODES", "TRAJECTORY_MODES", "BATCH_MODES",
           "MASK_INPUT_MODES", "ACCEPTANCE_MODES", "RECORDS_FORMAT", "TetrisConfig", "tetris_learning_rate",
           "location_error_region", "location_distance_map", "location_loss", "ClickIterates", "ClickTrajectory",
           "ClickInstance", "ClickState", "ClickSetup", "BestIterate", "click_prompts", "reported_click",
           "click_instance", "click_setup", "consider_iterate", "optimise_click", "one_click", "click_trajectory",
           "tetris_min_max", "auc_name", "trajectory_outputs", "ClickProtocol", "make_click_batch_fn"]
