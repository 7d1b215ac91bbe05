"""APGD core with checkpoints, momentum and restarts from the best point; multi-stage radius schedules.

Section numbers (§) refer to docs/protocols/perturbation.md.

Spec §3.1-§3.5 (C-R ``rse/_sea.py`` / C-S1 ``apgd_train`` + ``apgd_largereps``).
One *stage* is one APGD run ``APGD(r, n, x0, L_opt, L_trk)``; a schedule is a
sequence of stages ((2ε, 90), (1.5ε, 90), (ε, 120) for SEA's progressive
radius; ((ε, 300),) for C-R's single run). Stage 1 starts at a uniform random
point of its own ball, stage s > 1 at ``Π_{r_s}`` of stage s-1's
lowest-accuracy iterate; the result is the last stage's lowest-accuracy iterate.

Implementation: every stage is unrolled into a static table of *events*
(one model evaluation each: the stage's start point, then its n iterations)
and the whole schedule runs as one ``lax.while_loop`` whose body evaluates the
model once (``value_and_grad`` with the logits as aux). Step sizes, the
checkpoint schedule (iterations and windows), momentum weights and SegPGD's
λ_t are static tables; the step-halving / restart decision and the
best-iterate trackers are per-image ``where``s. With ``early_stop`` an image is
frozen inside a stage once its best accuracy is 0 (after the stage's first
iteration, as the reference loop always runs it); when every image is frozen
the loop jumps to the next stage's start (the reference's batch-level break).

Accuracy used for selecting the returned iterate (§3.5): with
``reference_quirks=True`` the start point's accuracy counts void pixels (m = 0)
as wrong, ``#correct/N``, and later iterates count them as correct,
``(#correct + #void)/N``; with ``False`` both are ``#correct/#valid``.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxseg_robust.attacks.perturb import losses
from jaxseg_robust.attacks.perturb.common import (
    AttackResult,
    LogitsFn,
    batch_view,
    check_attack_inputs,
    check_positive,
    check_steps,
    correct_pixels,
    count_pixels,
    project_linf,
    uniform_start,
)

OPTIMIZED_LOSSES = ("balanced_ce", "masked_ce", "jsd", "masked_spherical", "ce")
TRACKED_LOSSES = ("ce", "masked_spherical", "spherical")
OSCILLATION_THRESHOLD = 0.75
MOMENTUM = 0.75
STEP_SIZE_FACTOR = 2.0  # α: initial step 2·r


def checkpoint_schedule(num_iterations: int) -> list[tuple[int, int]]:
    """APGD checkpoints ``(i, k)`` of an n-iteration run (0-based iteration i, window k), §3.1.

    ``k0 = max(⌊0.22n⌋, 1)``, ``k_min = max(⌊0.06n⌋, 1)``, ``k_dec = max(⌊0.03n⌋, 1)``;
    a checkpoint falls where the step counter reaches k, then
    ``k <- max(k - k_dec, k_min)``.

    Returns:
      List of (iteration, window) pairs, increasing.
    """
    n = check_steps(num_iterations, "num_iterations")
    k = max(int(0.22 * n), 1)
    k_min = max(int(0.06 * n), 1)
    k_dec = max(int(0.03 * n), 1)
    checkpoints, counter = [], 0
    for i in range(n):
        counter += 1
        if counter == k:
            checkpoints.append((i, k))
            counter = 0
            k = max(k - k_dec, k_min)
    return checkpoints


@dataclasses.dataclass(frozen=True)
class Stage:
    """One APGD run of a schedule: radius ``scale·ε`` for ``num_iterations`` iterations."""

    scale: float
    num_iterations: int


class _Events(NamedTuple):
    """Static per-event tables (NumPy), one entry per model evaluation of the schedule."""

    is_start: np.ndarray       # bool: the stage's start point (initial gradient)
    stage: np.ndarray          # int: stage index
    local: np.ndarray          # int: iteration inside the stage (-1 at the start)
    radius: np.ndarray         # f32: r_s
    momentum: np.ndarray       # f32: a (1 at iteration 0, 0.75 after)
    segpgd_weight: np.ndarray  # f32: λ_t = t / (2 n_s), t = local + 1 (0 at the start)
    checkpoint: np.ndarray     # bool
    window: np.ndarray         # int: k at a checkpoint (0 elsewhere)
    needs_grad: np.ndarray     # bool: gradient used later (not the stage's last iteration)
    next_start: np.ndarray     # int: event index of the next stage's start (or the event count)


def _event_tables(stages: Sequence[Stage], epsilon: float) -> _Events:
    rows = {name: [] for name in _Events._fields}
    for stage_index, stage in enumerate(stages):
        n = stage.num_iterations
        radius = stage.scale * epsilon
        checkpoints = dict(checkpoint_schedule(n))
        first = len(rows["stage"])
        for local in range(-1, n):
            rows["is_start"].append(local < 0)
            rows["stage"].append(stage_index)
            rows["local"].append(local)
            rows["radius"].append(radius)
            rows["momentum"].append(1.0 if local <= 0 else MOMENTUM)
            rows["segpgd_weight"].append((local + 1) / 2 / n)
            rows["checkpoint"].append(local in checkpoints)
            rows["window"].append(checkpoints.get(local, 0))
            rows["needs_grad"].append(local < n - 1)
            rows["next_start"].append(first + n + 1)
    dtypes = dict(is_start=bool, stage=np.int32, local=np.int32, radius=np.float32, momentum=np.float32,
                  segpgd_weight=np.float32, checkpoint=bool, window=np.int32, needs_grad=bool,
                  next_start=np.int32)
    return _Events(**{name: np.asarray(rows[name], np.float64 if dtypes[name] is np.float32 else None)
                      .astype(dtypes[name]) for name in _Events._fields})


def optimized_pixel_loss(name: str, logits, labels, mask, segpgd_weight) -> jnp.ndarray:
    """Per-pixel optimised loss f32[B, H, W] (§3.4), zero outside ``mask`` after :func:`losses.image_mean`."""
    if name == "balanced_ce":
        return losses.balanced_cross_entropy(logits, labels, mask, segpgd_weight)
    if name == "masked_ce":
        return losses.masked_cross_entropy(logits, labels, mask)
    if name == "jsd":
        return losses.jensen_shannon_one_hot(logits, labels)
    if name == "masked_spherical":
        return losses.spherical(logits, labels, mask, masked=True)
    if name == "ce":
        return losses.cross_entropy(logits, labels)
    raise ValueError(f"loss must be one of {OPTIMIZED_LOSSES}, got {name!r}")


def tracked_pixel_loss(name: str, logits, labels, mask) -> jnp.ndarray:
    """Per-pixel tracked loss f32[B, H, W] (step-size control and restart point)."""
    if name == "ce":
        return losses.cross_entropy(logits, labels)
    if name == "masked_spherical":
        return losses.spherical(logits, labels, mask, masked=True)
    if name == "spherical":
        return losses.spherical(logits, labels, mask, masked=False)
    raise ValueError(f"track_loss must be one of {TRACKED_LOSSES}, got {name!r}")


def select_loss(pixel_loss, names, loss_index, *args) -> jnp.ndarray:
    """``pixel_loss(name, *args)`` for one static name, or ``lax.switch`` over a tuple of names by ``loss_index``.

    One compiled program then serves several battery members (§5, compile
    once): only the loss differs between the branches, the model's forward and
    backward pass are shared.
    """
    if isinstance(names, str):
        return pixel_loss(names, *args)
    return lax.switch(loss_index, [functools.partial(pixel_loss, name) for name in names], *args)


def _check_names(names, known, what: str) -> None:
    for name in (names,) if isinstance(names, str) else tuple(names):
        if name not in known:
            raise ValueError(f"{what} must be one of {known} (or a tuple of them), got {name!r}")


class _State(NamedTuple):
    event: jnp.ndarray           # int32 scalar
    xa: jnp.ndarray              # current iterate
    xa_prev: jnp.ndarray         # iterate at the start of the previous iteration (momentum)
    grad: jnp.ndarray
    x_best: jnp.ndarray          # best tracked loss (restart point)
    grad_best: jnp.ndarray
    x_best_adv: jnp.ndarray      # lowest accuracy (returned)
    loss_best: jnp.ndarray       # f32[B]
    loss_best_last_check: jnp.ndarray
    reduced_last_check: jnp.ndarray  # bool[B]
    step_size: jnp.ndarray       # f32[B] η
    acc_best: jnp.ndarray        # f32[B]
    correct_best: jnp.ndarray    # int32[B] correct attacked pixels at x_best_adv
    history: jnp.ndarray         # f32[n_max, B] tracked loss per iteration of the stage
    forwards: jnp.ndarray        # int32[B]
    backwards: jnp.ndarray       # int32[B]


@functools.partial(jax.jit, static_argnames=("logits_fn", "loss", "track_loss", "epsilon", "stages", "early_stop",
                                             "accept_if_improved", "reference_quirks"))
def apgd(logits_fn: LogitsFn, params, images, labels, mask, keys, *, loss: str | tuple[str, ...],
         track_loss: str | tuple[str, ...], epsilon: float, stages: tuple[Stage, ...], early_stop: bool,
         accept_if_improved: bool = False, reference_quirks: bool = True, loss_index=None,
         region=None) -> AttackResult:
    """APGD over a radius schedule (§3.1-§3.2), maximising a masked per-pixel loss.

    Args:
      logits_fn: ``(params, f32[B,H,W,3]) -> f32[B,H,W,C]`` (static).
      params: model parameter pytree.
      images: f32[B, H, W, 3] clean images in [0, 1].
      labels: int[B, H, W] attack labels in [0, C).
      mask: bool[B, H, W] attack mask m (False = void, never attacked or counted correct).
      keys: typed PRNG key array [B] (uniform start of the first stage).
      loss: optimised loss, one of ``OPTIMIZED_LOSSES``.
      track_loss: tracked loss, one of ``TRACKED_LOSSES``.
      epsilon: ε; stage s uses radius ``stages[s].scale · ε``.
      stages: tuple of :class:`Stage` (static).
      early_stop: freeze an image inside a stage once its best accuracy is 0.
      accept_if_improved: C-R's single-run wrapper: return the result only if
        its accuracy (void counted correct) is < 1, else the clean image.
      reference_quirks: the start point's accuracy counts void as wrong (§3.5).
      loss_index: with tuples of names for ``loss`` and ``track_loss`` (equal
        lengths), the traced int32 index of the pair to use (one program for
        several SEA members).
      region: bool[B, H, W] the image's own pixels in a spatially padded frame
        (§10.6), or None: the §3.5 accuracies count the pixels of the region
        only (padding is neither void nor counted).

    Returns:
      AttackResult: images = the last stage's lowest-accuracy iterate (or the
      clean image, see ``accept_if_improved``); info: ``accuracy`` f32[B]
      (best tracked accuracy of the last stage, in the §3.5 definition in
      use), ``correct`` int32[B] (correct attacked pixels at that iterate),
      ``accepted`` bool[B] (False where the clean image was returned; all True
      without ``accept_if_improved``), ``loss_best`` f32[B] (best tracked loss
      of the last stage), ``step_size`` f32[B] (final η).
    """
    check_attack_inputs(images, labels, mask)
    _check_names(loss, OPTIMIZED_LOSSES, "loss")
    _check_names(track_loss, TRACKED_LOSSES, "track_loss")
    if not isinstance(loss, str) or not isinstance(track_loss, str):
        if isinstance(loss, str) or isinstance(track_loss, str) or len(loss) != len(track_loss) or loss_index is None:
            raise ValueError("loss and track_loss tuples need equal lengths and a loss_index")
    epsilon = check_positive(epsilon, "epsilon")
    if not stages or not all(isinstance(stage, Stage) for stage in stages):
        raise ValueError(f"stages must be a non-empty tuple of Stage, got {stages!r}")
    for stage in stages:
        check_positive(stage.scale, "stage scale")
        check_steps(stage.num_iterations, "stage num_iterations")

    images = images.astype(jnp.float32)
    batch, height, width = labels.shape
    events = _event_tables(stages, epsilon)
    valid_count = count_pixels(mask)
    pixels = height * width if region is None else count_pixels(region)

    def objective(points, segpgd_weight):
        logits = logits_fn(params, points)
        per_pixel = select_loss(optimized_pixel_loss, loss, loss_index, logits, labels, mask, segpgd_weight)
        per_image = losses.image_mean(per_pixel, mask)
        return jnp.sum(per_image), logits

    ctx = _Context(images=images, labels=labels, mask=mask, tables=jax.tree.map(jnp.asarray, events),
                   num_events=len(events.stage), history_length=max(stage.num_iterations for stage in stages),
                   valid_count=valid_count, void_count=pixels - valid_count, num_pixels=pixels,
                   random_start=uniform_start(keys, images, stages[0].scale * epsilon),
                   value_and_grad=jax.value_and_grad(objective, has_aux=True), track_loss=track_loss,
                   loss_index=loss_index,
                   early_stop=early_stop, reference_quirks=reference_quirks)
    zeros_image = jnp.zeros_like(images)
    zeros_batch = jnp.zeros(batch, jnp.float32)
    initial = _State(
        event=jnp.zeros([], jnp.int32), xa=zeros_image, xa_prev=zeros_image, grad=zeros_image, x_best=zeros_image,
        grad_best=zeros_image, x_best_adv=images, loss_best=zeros_batch, loss_best_last_check=zeros_batch,
        reduced_last_check=jnp.ones(batch, bool), step_size=zeros_batch, acc_best=jnp.ones(batch, jnp.float32),
        correct_best=jnp.zeros(batch, jnp.int32), history=jnp.zeros((ctx.history_length, batch), jnp.float32),
        forwards=jnp.zeros(batch, jnp.int32), backwards=jnp.zeros(batch, jnp.int32))
    final = lax.while_loop(lambda state: state.event < ctx.num_events, functools.partial(_apgd_event, ctx), initial)

    adversarial = final.x_best_adv
    accepted = jnp.ones(batch, bool)
    if accept_if_improved:
        accepted = final.correct_best < valid_count
        adversarial = jnp.where(batch_view(accepted, 4), adversarial, images)
    info = {"accuracy": final.acc_best, "correct": final.correct_best, "accepted": accepted,
            "loss_best": final.loss_best, "step_size": final.step_size}
    return AttackResult(images=adversarial, forwards=final.forwards, backwards=final.backwards, info=info)


class _Context(NamedTuple):
    """Constants of one `apgd` call, closed over by its loop (`_apgd_event`)."""

    images: jnp.ndarray
    labels: jnp.ndarray
    mask: jnp.ndarray
    tables: _Events
    num_events: int
    history_length: int
    valid_count: jnp.ndarray
    void_count: jnp.ndarray
    num_pixels: int | jnp.ndarray
    random_start: jnp.ndarray
    value_and_grad: object
    track_loss: str | tuple[str, ...]
    loss_index: jnp.ndarray | None
    early_stop: bool
    reference_quirks: bool


def _accuracy(ctx: _Context, correct, at_start):
    """Accuracy of a point in the §3.5 definition in use (void counted wrong at the start with the quirks)."""
    if ctx.reference_quirks:
        counted = jnp.where(at_start, correct, correct + ctx.void_count)
        return counted.astype(jnp.float32) / ctx.num_pixels
    return correct.astype(jnp.float32) / jnp.maximum(ctx.valid_count, 1).astype(jnp.float32)


def _apgd_iterated(ctx: _Context, state: _State, row, point, grad, tracked, correct, acc) -> _State:
    """The state after an APGD iteration at ``point`` (best points, loss history, checkpoint halving)."""
    view = lambda values: batch_view(values, 4)  # noqa: E731
    local = row.local
    improved_acc = acc <= state.acc_best
    x_best_adv = jnp.where(view(improved_acc), point, state.x_best_adv)
    correct_best = jnp.where(improved_acc, correct, state.correct_best)
    acc_best = jnp.minimum(state.acc_best, acc)
    history = state.history.at[jnp.maximum(local, 0)].set(tracked)
    better = tracked > state.loss_best
    x_best = jnp.where(view(better), point, state.x_best)
    new_grad = jnp.where(row.needs_grad, grad, state.grad)
    grad_best = jnp.where(view(better), new_grad, state.grad_best)
    loss_best = jnp.where(better, tracked, state.loss_best)

    # Checkpoint: oscillation / stall test, halve the step and restart from the best point.
    batch = history.shape[1]
    index = jnp.arange(ctx.history_length)[:, None]
    previous = jnp.concatenate([jnp.zeros((1, batch), history.dtype), history[:-1]], axis=0)
    in_window = (index >= local - row.window + 1) & (index <= local)
    increases = jnp.sum(in_window & (history > previous), axis=0)
    oscillating = increases.astype(jnp.float32) <= row.window.astype(jnp.float32) * OSCILLATION_THRESHOLD
    stalled = ~state.reduced_last_check & (state.loss_best_last_check >= loss_best)
    flag = row.checkpoint & (oscillating | stalled)
    return _State(
        event=state.event, xa=jnp.where(view(flag), x_best, point), xa_prev=state.xa,
        grad=jnp.where(view(flag), grad_best, new_grad), x_best=x_best, grad_best=grad_best,
        x_best_adv=x_best_adv, loss_best=loss_best,
        loss_best_last_check=jnp.where(row.checkpoint, loss_best, state.loss_best_last_check),
        reduced_last_check=jnp.where(row.checkpoint, flag, state.reduced_last_check),
        step_size=jnp.where(flag, state.step_size / 2.0, state.step_size), acc_best=acc_best,
        correct_best=correct_best, history=history, forwards=state.forwards, backwards=state.backwards)


def _apgd_event(ctx: _Context, state: _State) -> _State:
    """One event of the schedule: a stage's start point or one APGD iteration (§3.1)."""
    e = state.event
    tables = ctx.tables
    row = jax.tree.map(lambda column: column[e], tables)
    is_start, local, radius = row.is_start, row.local, row.radius
    view = lambda values: batch_view(values, 4)  # noqa: E731

    # Candidate point: the stage's start, or one APGD step from the current iterate.
    start_point = jnp.where(row.stage == 0, ctx.random_start, project_linf(state.x_best_adv, ctx.images, radius))
    u = project_linf(state.xa + view(state.step_size) * jnp.sign(state.grad), ctx.images, radius)
    stepped = project_linf(state.xa + (u - state.xa) * row.momentum + (state.xa - state.xa_prev)
                           * (1.0 - row.momentum), ctx.images, radius)
    point = jnp.where(is_start, start_point, stepped)

    (_, logits), grad = ctx.value_and_grad(point, row.segpgd_weight)
    tracked = losses.image_mean(select_loss(tracked_pixel_loss, ctx.track_loss, ctx.loss_index, logits, ctx.labels,
                                            ctx.mask), ctx.mask)
    correct = count_pixels(correct_pixels(logits, ctx.labels, ctx.mask))
    acc = _accuracy(ctx, correct, is_start)

    frozen = ctx.early_stop & (state.acc_best <= 0.0)
    active = is_start | (local == 0) | ~frozen
    iterated = _apgd_iterated(ctx, state, row, point, grad, tracked, correct, acc)
    started = _State(
        event=e, xa=point, xa_prev=point, grad=grad, x_best=point, grad_best=grad, x_best_adv=point,
        loss_best=tracked, loss_best_last_check=tracked, reduced_last_check=jnp.ones_like(iterated.reduced_last_check),
        step_size=jnp.full_like(state.step_size, STEP_SIZE_FACTOR) * radius, acc_best=acc,
        correct_best=correct, history=jnp.zeros_like(iterated.history), forwards=state.forwards,
        backwards=state.backwards)

    fields = {}
    for name in _State._fields[1:-2]:
        new_leaf = jnp.where(is_start, getattr(started, name), getattr(iterated, name))
        # Per-image leaves have the batch first; the loss history is [n_max, B].
        take = active[None, :] if name == "history" else batch_view(active, new_leaf.ndim)
        fields[name] = jnp.where(take, new_leaf, getattr(state, name))
    forwards = state.forwards + active.astype(jnp.int32)
    backwards = state.backwards + (active & row.needs_grad).astype(jnp.int32)

    # Next event; jump to the next stage's start when every image is frozen (reference batch break).
    following = e + 1
    following_clipped = jnp.minimum(following, ctx.num_events - 1)
    next_row_start = tables.is_start[following_clipped] | (tables.local[following_clipped] == 0)
    all_frozen = ctx.early_stop & jnp.all(fields["acc_best"] <= 0.0)
    jump = (following < ctx.num_events) & ~next_row_start & all_frozen
    next_event = jnp.where(jump, tables.next_start[following_clipped], following)
    return _State(event=next_event, forwards=forwards, backwards=backwards, **fields)


def progressive_stages(total_iterations: int = 300) -> tuple[Stage, ...]:
    """SEA's progressive radius schedule (2ε, ⌊0.3N⌋), (1.5ε, ⌊0.3N⌋), (ε, N - 2⌊0.3N⌋) (§3.2)."""
    total = check_steps(total_iterations, "total_iterations", minimum=3)
    first = int(0.3 * total)
    if first < 1:
        raise ValueError(f"total_iterations too small for three stages: {total}")
    return (Stage(2.0, first), Stage(1.5, first), Stage(1.0, total - 2 * first))


def single_stage(total_iterations: int = 300) -> tuple[Stage, ...]:
    """C-R's single APGD run at ε for ``total_iterations`` iterations."""
    return (Stage(1.0, check_steps(total_iterations, "total_iterations")),)
