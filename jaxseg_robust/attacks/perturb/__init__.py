"""L∞ image-perturbation attack battery of Halmosi et al. (ECCV'24), jitted and batched.

Reference: docs/protocols/perturbation.md. Every attack takes a plain model
``logits_fn(params, images f32[B,H,W,3] in [0,1]) -> logits f32[B,H,W,C]`` and
returns an :class:`AttackResult` (adversarial images, per-instance forward /
backward counts, per-instance diagnostics).

Modules: ``common`` (result type, void policy, projection, per-image
statistics), ``losses``, ``amsgrad`` (PyTorch-style AMSGrad for optax),
``padam`` (PAdam-CE/Cos), ``apgd`` (APGD core, radius schedules), ``sea``
(SEA-BCE/MCE/JSD/MSL), ``dag``, ``alma_prox``, ``pdpgd``, ``ensemble``
(battery, per-image worst case), ``programs`` (compiled once per bucket, `runner.program.CompiledFunction`s; the
dataset scores of its records are in `jaxseg_robust.reports.perturb_scores`), ``image_chunks`` (on an accelerator
the batch attacked a chunk at a time), ``target`` (the attacked model: a dense directory or a prompted SAM-family
model), ``battery_program`` (one batch of the battery, a `runner.program.HostDrivenProtocol`).
"""

from jaxseg_robust.attacks.perturb.alma_prox import alma_prox
from jaxseg_robust.attacks.perturb.amsgrad import scale_by_torch_amsgrad, torch_amsgrad
from jaxseg_robust.attacks.perturb.apgd import Stage, apgd, checkpoint_schedule, progressive_stages, single_stage
from jaxseg_robust.attacks.perturb.common import (
    DEFAULT_EPSILON,
    AttackResult,
    attack_targets,
    image_confusions,
    instance_keys,
    per_image_scores,
    project_linf,
)
from jaxseg_robust.attacks.perturb.dag import dag
from jaxseg_robust.attacks.perturb.ensemble import (
    CANDIDATE_LABELS,
    CANDIDATE_ORDER,
    BatteryConfig,
    BatteryResult,
    Candidate,
    battery_compile_summary,
    build_battery,
    prediction_confusions,
    run_battery,
    score_program,
    select_worst,
    update_worst,
)
from jaxseg_robust.attacks.perturb.programs import compile_summary, compiled_program
from jaxseg_robust.attacks.perturb.padam import padam
from jaxseg_robust.attacks.perturb.pdpgd import pdpgd
from jaxseg_robust.attacks.perturb.sea import sea

__all__ = [
    "CANDIDATE_LABELS",
    "CANDIDATE_ORDER",
    "DEFAULT_EPSILON",
    "AttackResult",
    "BatteryConfig",
    "BatteryResult",
    "Candidate",
    "Stage",
    "alma_prox",
    "apgd",
    "attack_targets",
    "battery_compile_summary",
    "build_battery",
    "checkpoint_schedule",
    "compile_summary",
    "compiled_program",
    "dag",
    "image_confusions",
    "instance_keys",
    "padam",
    "pdpgd",
    "per_image_scores",
    "prediction_confusions",
    "progressive_stages",
    "project_linf",
    "run_battery",
    "score_program",
    "scale_by_torch_amsgrad",
    "sea",
    "select_worst",
    "single_stage",
    "torch_amsgrad",
    "update_worst",
]
