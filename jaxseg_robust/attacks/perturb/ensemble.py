"""The ten-attack battery, per-image worst-case selection and its dataset metrics (§5, §6, §8).

Section numbers (§) refer to docs/protocols/perturbation.md.

Candidates in C-R order (the order breaks ties): clean, PAdam-CE, PAdam-Cos,
SEA-MCE, SEA-BCE, SEA-JSD, SEA-MSL, DAG-0.001, DAG-0.003, PDPGD, ALMA prox.
Per image and per reported metric the aggregate keeps the candidate with the
lowest per-image score (pixel accuracy for Accuracy; per-image mIoU for CmIoU
and NmIoU), strict ``<`` so the earlier candidate wins ties, NaN scores never
selected (all NaN -> the first candidate, the clean image when included).

What is kept per (candidate, image) is the confusion matrix of the prediction
(`common.image_confusions`, int32[C, C]); every selection rule and dataset
metric is computed from these without storing adversarial images.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Mapping, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxseg_robust.attacks.perturb.alma_prox import alma_prox
from jaxseg_robust.attacks.perturb.common import (
    DEFAULT_EPSILON,
    MAX_DAMAGE,
    MIN_NORM,
    VOID_AS_BACKGROUND,
    VOID_POLICIES,
    AttackResult,
    LogitsFn,
    attack_targets,
    batch_view,
    check_positive,
    check_steps,
    image_confusions,
    member_keys,
    per_image_scores,
)
from jaxseg_robust.attacks.perturb.dag import dag
from jaxseg_robust.attacks.perturb.image_chunks import DEFAULT_ACCELERATOR_CHUNK, per_platform
from jaxseg_robust.attacks.perturb.padam import padam
from jaxseg_robust.attacks.perturb.pdpgd import pdpgd
from jaxseg_robust.attacks.perturb.programs import compile_summary, compiled_program
from jaxseg_robust.runner.program import CompiledFunction
from jaxseg_robust.attacks.perturb.sea import MSL_TRACKS, SEA_SCHEDULES, sea

CANDIDATE_ORDER = ("clean", "padam_ce", "padam_cos", "sea_mce", "sea_bce", "sea_jsd", "sea_msl", "dag_0.001",
                   "dag_0.003", "pdpgd", "alma_prox")
CANDIDATE_LABELS = {"clean": "clean", "padam_ce": "PAdam-CE", "padam_cos": "PAdam-Cos", "sea_mce": "SEA-MCE",
                    "sea_bce": "SEA-BCE", "sea_jsd": "SEA-JSD", "sea_msl": "SEA-MSL", "dag_0.001": "DAG-0.001",
                    "dag_0.003": "DAG-0.003", "pdpgd": "PDPGD", "alma_prox": "ALMAProx"}

# The attack names and groups a user types (``--attacks``), each -> battery candidate names.
ATTACK_GROUPS = {
    "padam-ce": ("padam_ce",), "padam-cos": ("padam_cos",), "padam": ("padam_ce", "padam_cos"),
    "sea": ("sea_mce", "sea_bce", "sea_jsd", "sea_msl"), "sea-mce": ("sea_mce",), "sea-bce": ("sea_bce",),
    "sea-jsd": ("sea_jsd",), "sea-msl": ("sea_msl",), "dag": ("dag_0.001", "dag_0.003"),
    "dag-0.001": ("dag_0.001",), "dag-0.003": ("dag_0.003",), "alma-prox": ("alma_prox",), "pdpgd": ("pdpgd",),
}


def attack_names(text: str) -> tuple[str, ...]:
    """Comma list of `ATTACK_GROUPS` keys or ``all`` (case and ``_``/``-`` free) -> candidate names in C-R
    order, no duplicates; ValueError for an empty list or an unknown name (listing the known ones)."""
    items = [item.strip().lower().replace("_", "-") for item in str(text).split(",") if item.strip()]
    if not items:
        raise ValueError("the attack list is empty")
    wanted = set()
    for item in items:
        if item == "all":
            wanted.update(name for group in ATTACK_GROUPS.values() for name in group)
        elif item in ATTACK_GROUPS:
            wanted.update(ATTACK_GROUPS[item])
        else:
            raise ValueError(f"unknown attack {item!r}; known: {', '.join(ATTACK_GROUPS)}, all")
    return tuple(name for name in CANDIDATE_ORDER if name in wanted)


@dataclasses.dataclass(frozen=True)
class BatteryConfig:
    """Battery settings; defaults are the project defaults of §8.1/§8.2.

    Attributes:
      num_classes: C.
      epsilon: L∞ radius ε (8/255).
      void_policy: max-damage void handling (§8.2 #8 ``voc_void_policy``):
        ``"as_background"`` (PASCAL VOC) or ``"ignore"`` (Cityscapes).
      background_class: class void becomes under ``as_background`` and the
        class dropped by the without-background metrics (0).
      sea_schedule: ``"progressive"`` (#1 default) or ``"single"`` (C-R).
      msl_track: ``"masked"``, ``"unmasked"`` or None = follow the schedule (#2).
      alma_lr_init: ALMA prox initial step (#3: 1e-4, C-R; C-P uses 1e-3).
      reference_quirks: SEA start-accuracy quirk (#9), ALMA derivative (#10).
      include_clean: the clean image as first candidate (#14).
      select_with_background: None (default) selects each metric variant with
        its own score; True / False forces the with- / without-background
        score for every variant (§5).
      attacks: subset of ``CANDIDATE_ORDER`` names to run (order is always C-R's).
      padam_steps, sea_iterations, dag_iterations, alma_steps, pdpgd_steps:
        budgets (200, 300, 200, 500, 500); lower only for smoke runs.
      accelerator_chunk: most images one attack pass holds on an accelerator
        (GPU): the batch is attacked in chunks of this many images in
        sequence inside one program, bounding its memory (`image_chunks`;
        perturbation.md, "Accelerator memory"); the CPU always attacks the
        whole batch. Results do not depend on it.
    """

    num_classes: int
    epsilon: float = DEFAULT_EPSILON
    void_policy: str = VOID_AS_BACKGROUND
    background_class: int = 0
    sea_schedule: str = "progressive"
    msl_track: str | None = None
    alma_lr_init: float = 1e-4
    reference_quirks: bool = True
    include_clean: bool = True
    select_with_background: bool | None = None
    attacks: tuple[str, ...] | None = None
    padam_steps: int = 200
    sea_iterations: int = 300
    dag_iterations: int = 200
    alma_steps: int = 500
    pdpgd_steps: int = 500
    accelerator_chunk: int = DEFAULT_ACCELERATOR_CHUNK

    def __post_init__(self):
        check_steps(self.num_classes, "num_classes")
        check_positive(self.epsilon, "epsilon")
        if self.void_policy not in VOID_POLICIES:
            raise ValueError(f"void_policy must be one of {VOID_POLICIES}, got {self.void_policy!r}")
        if self.sea_schedule not in SEA_SCHEDULES:
            raise ValueError(f"sea_schedule must be one of {SEA_SCHEDULES}, got {self.sea_schedule!r}")
        if self.msl_track is not None and self.msl_track not in MSL_TRACKS:
            raise ValueError(f"msl_track must be one of {MSL_TRACKS} or None, got {self.msl_track!r}")
        check_positive(self.alma_lr_init, "alma_lr_init")
        if self.attacks is not None:
            unknown = [name for name in self.attacks if name not in CANDIDATE_ORDER]
            if unknown:
                raise ValueError(f"attacks contains unknown names {unknown}; known: {CANDIDATE_ORDER}")
        for name in ("padam_steps", "sea_iterations", "dag_iterations", "alma_steps", "pdpgd_steps",
                     "accelerator_chunk"):
            check_steps(getattr(self, name), name)

    def candidate_names(self) -> tuple[str, ...]:
        """Names of the candidates to run, in C-R order."""
        wanted = CANDIDATE_ORDER if self.attacks is None else self.attacks
        names = [name for name in CANDIDATE_ORDER if name in wanted and name != "clean"]
        return (("clean",) if self.include_clean else ()) + tuple(names)


# A candidate maps (params, images f32[B,H,W,3], labels int[B,H,W], valid bool[B,H,W], keys [B],
# region bool[B,H,W] | None = None) -> AttackResult.
CandidateFn = Callable[..., AttackResult]
# Which shared program runs each member, and the member's traced argument (loss index or DAG γ).
PROGRAM_OF = {"padam_ce": ("padam", 0), "padam_cos": ("padam", 1), "sea_mce": ("sea", 0), "sea_bce": ("sea", 1),
              "sea_jsd": ("sea", 2), "sea_msl": ("sea", 3), "dag_0.001": ("dag", 0.001),
              "dag_0.003": ("dag", 0.003), "pdpgd": ("pdpgd", 0), "alma_prox": ("alma_prox", 0)}
PADAM_MEMBER_LOSSES = ("ce", "cos")
SEA_MEMBER_LOSSES = ("mce", "bce", "jsd", "msl")


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One battery member: ``name`` (see ``CANDIDATE_ORDER``), attack ``family``, its ``run`` and shared ``program``.

    ``program`` (a `runner.program.CompiledFunction`, None for the clean image) is
    shared by the members of one attack family; ``run`` calls it with the
    member's own key fold and loss index / step.
    """

    name: str
    family: str
    run: CandidateFn
    program: CompiledFunction | None = None


def _clean(params, images, labels, valid, keys, region=None) -> AttackResult:
    del params, labels, valid, keys, region
    zeros = jnp.zeros(images.shape[0], jnp.int32)
    return AttackResult(images=images, forwards=zeros, backwards=zeros, info={})


def region_model(logits_fn: LogitsFn, images, region) -> LogitsFn:
    """The model an attack sees in a spatially padded frame (§10.6): padding always shows the clean frame.

    ``logits_fn(params, where(region, points, images))``: a change outside
    ``region`` (bool[B, H, W]) never reaches the model, so its gradient there
    is exactly zero and the perturbation that counts is the one inside the image.
    """
    inside = region[..., None]
    return lambda params, points: logits_fn(params, jnp.where(inside, points, images))


def _in_region(result: AttackResult, images, region) -> AttackResult:
    """``result`` with the clean frame restored outside ``region`` (the perturbation is zero there)."""
    return result._replace(images=jnp.where(region[..., None], result.images, images))


def family_attacks(logits_fn: LogitsFn, config: BatteryConfig, wanted: set[str] | None = None) -> dict[str, Callable]:
    """Each attack family's whole-batch program (uncompiled), for the families in ``wanted`` (default: all five).

    A program maps ``(params, images, labels, valid, keys, attack_index,
    member[, region])`` to an `AttackResult`; the families are padam, sea,
    dag, pdpgd and alma_prox (``PROGRAM_OF``).

    Without ``region`` the attacks run on the model as it is; with it
    (spatially padded frames, §10.6) on `region_model`, with padding excluded
    from the attack mask and the perturbation set to zero outside the region.
    `build_battery` compiles each through `image_chunks.per_platform`.
    """
    c = config
    epsilon = float(c.epsilon)

    def targets(labels, valid, family, region):
        return attack_targets(labels, valid, num_classes=c.num_classes, family=family, void_policy=c.void_policy,
                              background_class=c.background_class, region=region)

    def padam_attack(model, params, images, labels, valid, keys, attack_index, member, region):
        y, m = targets(labels, valid, MAX_DAMAGE, region)
        return padam(model, params, images, y, m, member_keys(keys, attack_index), loss=PADAM_MEMBER_LOSSES,
                     loss_index=member, epsilon=epsilon, num_steps=c.padam_steps)

    def sea_attack(model, params, images, labels, valid, keys, attack_index, member, region):
        y, m = targets(labels, valid, MAX_DAMAGE, region)
        return sea(model, params, images, y, m, member_keys(keys, attack_index), loss=SEA_MEMBER_LOSSES,
                   loss_index=member, epsilon=epsilon, schedule=c.sea_schedule, total_iterations=c.sea_iterations,
                   msl_track=c.msl_track, reference_quirks=c.reference_quirks, region=region)

    def min_norm(attack, **kwargs):
        def run(model, params, images, labels, valid, keys, attack_index, member, region):
            del keys, attack_index, member
            y, m = targets(labels, valid, MIN_NORM, region)
            return attack(model, params, images, y, m, epsilon=epsilon, **kwargs)
        return run

    def dag_attack(model, params, images, labels, valid, keys, attack_index, member, region):
        del keys, attack_index
        y, m = targets(labels, valid, MIN_NORM, region)
        return dag(model, params, images, y, m, gamma=member, max_iterations=c.dag_iterations, epsilon=epsilon)

    def program_of(attack):
        def program(params, images, labels, valid, keys, attack_index, member, region=None):
            if region is None:
                return attack(logits_fn, params, images, labels, valid, keys, attack_index, member, None)
            model = region_model(logits_fn, images, region)
            result = attack(model, params, images, labels, valid, keys, attack_index, member, region)
            return _in_region(result, images, region)
        return program

    makers = {"padam": lambda: padam_attack, "sea": lambda: sea_attack, "dag": lambda: dag_attack,
              "pdpgd": lambda: min_norm(pdpgd, num_steps=c.pdpgd_steps),
              "alma_prox": lambda: min_norm(alma_prox, num_steps=c.alma_steps, lr_init=c.alma_lr_init,
                                            reference_quirks=c.reference_quirks)}
    return {name: program_of(makers[name]()) for name in makers if wanted is None or name in wanted}


def _family_programs(logits_fn: LogitsFn, config: BatteryConfig, wanted: set[str]) -> dict[str, CompiledFunction]:
    """`family_attacks` compiled once per bucket: the whole batch on the CPU, `image_chunks.in_chunks` elsewhere."""
    return {name: compiled_program(name, per_platform(attack, config.accelerator_chunk))
            for name, attack in family_attacks(logits_fn, config, wanted).items()}


def build_battery(logits_fn: LogitsFn, config: BatteryConfig) -> tuple[Candidate, ...]:
    """The battery's candidates for one model; members of a family share one program compiled once per bucket.

    Args:
      logits_fn: ``(params, f32[B,H,W,3]) -> f32[B,H,W,C]`` with C = ``config.num_classes``.
      config: :class:`BatteryConfig`.

    Returns:
      Tuple of :class:`Candidate` in C-R order. ``run(params, images, labels,
      valid, keys)`` takes dataset labels (void = any value outside [0, C) or
      ``valid`` False) and applies the family's void policy (§1.2) itself;
      every member folds its index in ``CANDIDATE_ORDER`` into the image keys
      (its own random start).
    """
    names = config.candidate_names()
    programs = _family_programs(logits_fn, config, {PROGRAM_OF[name][0] for name in names if name != "clean"})

    def member_run(program, attack_index, member):
        dtype = jnp.float32 if isinstance(member, float) else jnp.int32

        def run(params, images, labels, valid, keys, region=None):
            args = (params, images, labels, valid, keys, jnp.asarray(attack_index, jnp.uint32),
                    jnp.asarray(member, dtype))
            return program(*args) if region is None else program(*args, region)
        return run

    candidates = []
    for name in names:
        if name == "clean":
            candidates.append(Candidate(name=name, family=MAX_DAMAGE, run=_clean))
            continue
        family_name, member = PROGRAM_OF[name]
        program = programs[family_name]
        family = MAX_DAMAGE if family_name in ("padam", "sea") else MIN_NORM
        candidates.append(Candidate(name=name, family=family, program=program,
                                    run=member_run(program, CANDIDATE_ORDER.index(name), member)))
    return tuple(candidates)


@functools.lru_cache(maxsize=32)
def score_program(logits_fn: LogitsFn, num_classes: int) -> CompiledFunction:
    """The scoring program ``(params, images, labels, valid) -> int32[B, C, C]`` of a model (one per process)."""
    def score(params, images, labels, valid):
        return image_confusions(logits_fn(params, images), labels, valid, num_classes=num_classes)
    return compiled_program("score", score)


def battery_compile_summary(candidates: Sequence[Candidate], logits_fn: LogitsFn, num_classes: int) -> dict:
    """`programs.compile_summary` over the candidates' programs and the model's scoring program."""
    programs = [c.program for c in candidates if c.program is not None]
    return compile_summary([*programs, score_program(logits_fn, num_classes)])


@functools.partial(jax.jit, static_argnames=("logits_fn", "num_classes"))
def prediction_confusions(logits_fn: LogitsFn, params, images, labels, valid, *, num_classes: int) -> jnp.ndarray:
    """One forward pass and the per-image confusion matrices of its argmax: int32[B, C, C] (§6.1).

    Args:
      labels: integer [B, H, W] dataset labels; outside [0, C) = void.
      valid: bool [B, H, W]; False pixels are not counted.
    """
    return image_confusions(logits_fn(params, images), labels, valid, num_classes=num_classes)


def update_worst(best_index, best_score, index, score) -> tuple[jnp.ndarray, jnp.ndarray]:
    """One streaming step of the §5 selection: replace where ``score < best_score`` (strict; NaN never).

    Args:
      best_index: int32[B] current selection; best_score: f32[B] (start at +inf).
      index: candidate index (int); score: f32[B] its per-image scores.

    Returns:
      (best_index, best_score).
    """
    replace = score < best_score
    return jnp.where(replace, index, best_index), jnp.where(replace, score, best_score)


def select_worst(scores) -> tuple[jnp.ndarray, jnp.ndarray]:
    """Per-image worst case over candidates in order (strict <, NaN never; all NaN -> index 0, score NaN).

    Args:
      scores: f32[K, B] per-candidate per-image scores (lower = more successful).

    Returns:
      (index int32[B], score f32[B]).
    """
    scores = jnp.asarray(scores, jnp.float32)
    if scores.ndim != 2 or scores.shape[0] < 1:
        raise ValueError(f"scores must have shape [K >= 1, B], got {scores.shape}")
    index = jnp.zeros(scores.shape[1], jnp.int32)
    best = jnp.full(scores.shape[1], jnp.inf, jnp.float32)
    for k in range(scores.shape[0]):
        index, best = update_worst(index, best, k, scores[k])
    return index, jnp.where(jnp.isinf(best) & (best > 0), jnp.nan, best)


class BatteryResult(NamedTuple):
    """Per-candidate statistics of one batch (NumPy arrays).

    Attributes:
      names: candidate names, length K, C-R order.
      confusions: int32[K, B, C, C] confusion matrices of each candidate's prediction.
      forwards, backwards: int32[K, B] attack cost per instance.
      info: per-candidate dict of the attack's per-image diagnostics.
      worst_images: {(metric, with_background): f32[B, H, W, 3]} selected
        images for the selection rules asked for in ``keep_worst``.
    """

    names: tuple[str, ...]
    confusions: np.ndarray
    forwards: np.ndarray
    backwards: np.ndarray
    info: tuple[Mapping[str, np.ndarray], ...]
    worst_images: Mapping[tuple[str, bool], np.ndarray]


def run_battery(candidates: Sequence[Candidate], logits_fn: LogitsFn, params, images, labels, valid, keys, *,
                num_classes: int, background_class: int = 0,
                keep_worst: Sequence[tuple[str, bool]] = (), region=None) -> BatteryResult:
    """Runs every candidate on one batch and scores it (streaming; only statistics are kept).

    Args:
      candidates: from :func:`build_battery`.
      logits_fn, params: the model.
      images: f32[B, H, W, 3] in [0, 1]; labels: int[B, H, W] dataset labels
        (void outside [0, C)); valid: bool[B, H, W]; keys: typed key array [B]
        (e.g. :func:`common.instance_keys` of the dataset indices).
      num_classes: C.
      background_class: for the without-background scores of ``keep_worst``.
      keep_worst: selection rules ``(metric, with_background)`` whose selected
        images should be kept (one image buffer each).
      region: bool[B, H, W] each image's own pixels when the batch is padded
        spatially into one frame (§10.6), else None. Pixels outside it are
        never attacked (perturbation zero, outside every attack mask) and
        must be False in ``valid`` (not counted).

    Returns:
      :class:`BatteryResult`.
    """
    confusions, forwards, backwards, infos = [], [], [], []
    trackers = {rule: (jnp.zeros(images.shape[0], jnp.int32), jnp.full(images.shape[0], jnp.inf, jnp.float32),
                       images) for rule in keep_worst}
    for index, candidate in enumerate(candidates):
        arguments = (params, images, labels, valid, keys) + (() if region is None else (region,))
        result = candidate.run(*arguments)
        confusion = score_program(logits_fn, num_classes)(params, result.images, labels, valid)
        for rule, (best_index, best_score, best_images) in trackers.items():
            score = per_image_scores(confusion, metric=rule[0], with_background=rule[1],
                                     background_class=background_class)
            replace = score < best_score
            best_index, best_score = update_worst(best_index, best_score, index, score)
            trackers[rule] = (best_index, best_score, jnp.where(batch_view(replace, 4), result.images, best_images))
        confusions.append(np.asarray(confusion))
        forwards.append(np.asarray(result.forwards))
        backwards.append(np.asarray(result.backwards))
        infos.append({key: np.asarray(value) for key, value in result.info.items()})
    return BatteryResult(names=tuple(candidate.name for candidate in candidates), confusions=np.stack(confusions),
                         forwards=np.stack(forwards), backwards=np.stack(backwards), info=tuple(infos),
                         worst_images={rule: np.asarray(tracker[2]) for rule, tracker in trackers.items()})


