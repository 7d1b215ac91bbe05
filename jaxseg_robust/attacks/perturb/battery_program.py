"""The perturbation battery as a protocol of the one batch program (`runner.program.HostDrivenProtocol`).

docs/protocols/perturbation.md (§10.1 "compile once", §10.6 padded frames). One batch: the clean
prediction, every candidate of the battery (`ensemble.run_battery`: its programs one after another,
the per-image worst case kept on the host between them), the clean confusions and the prediction on
the per-image worst image. Every program is a `runner.program.CompiledFunction`;
`runner.program.HostDrivenProgram` times the batch and logs its compiles.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxseg_robust.attacks.perturb.common import instance_keys
from jaxseg_robust.attacks.perturb.ensemble import BatteryConfig, Candidate, run_battery, score_program
from jaxseg_robust.attacks.perturb.programs import compiled_program
from jaxseg_robust.attacks.perturb.target import Target
from jaxseg_robust.models.dense.prompted import tight_box_prompts, with_prompts
from jaxseg_robust.runner.program import CompiledFunction, HostDrivenProgram

LABEL_MODES = ("gt", "prediction")
WORST_RULE = ("miou", True)  # the worst image kept per instance: lowest per-image mIoU with background


def prediction_program(logits_fn) -> CompiledFunction:
    """``(params, images f32[B, H, W, 3]) -> int32[B, H, W]``: the argmax class of every pixel."""
    return compiled_program("predict", lambda params, images: jnp.argmax(logits_fn(params, images),
                                                                         axis=-1).astype(jnp.int32))


class BatteryProtocol:
    """The battery on one batch (a `runner.program.HostDrivenProtocol`).

    Args:
      target: the attacked model (`target.Target`).
      candidates: `ensemble.build_battery` of ``target.model.apply``.
      config: the `ensemble.BatteryConfig`.
      labels_mode: "gt" (score against the batch's masks) or "prediction" (against the clean prediction).
      seed: base PRNG seed of the random starts (each instance folds in its own seed).
      padded: the frames are padded spatially (``--pad-to-multiple``, §10.6): ``batch.valid`` is then the
        attack region (nothing outside it is attacked, perturbed or counted).
    """

    name = "perturbation battery"

    def __init__(self, target: Target, candidates: Sequence[Candidate], config: BatteryConfig,
                 labels_mode: str = "gt", seed: int = 0, padded: bool = False):
        if labels_mode not in LABEL_MODES:
            raise ValueError(f"labels_mode must be one of {LABEL_MODES}, got {labels_mode!r}")
        self.target, self.candidates, self.config = target, tuple(candidates), config
        self.labels_mode, self.padded = labels_mode, padded
        self.base_key = jax.random.key(seed)
        self.predict = prediction_program(target.model.apply)
        self.score = score_program(target.model.apply, config.num_classes)

    def functions(self) -> list[CompiledFunction]:
        """The battery's family programs, the scoring program and the prediction program."""
        return [*(c.program for c in self.candidates if c.program is not None), self.score, self.predict]

    def _params(self, gt):
        if not self.target.prompted:
            return self.target.params
        return with_prompts(self.target.params, tight_box_prompts(gt, self.target.model.low_res_size))

    def run_batch(self, batch) -> dict:
        """Outputs [B, ...]: ``confusions`` [B, K, C, C], ``clean_confusion`` [B, C, C], ``forwards`` /
        ``backwards`` [B, K], the ``image``, the worst ``adversarial`` image (float16), ``labels``, ``valid``,
        ``clean_pred`` and ``adv_pred`` (int16, the prediction on the worst image)."""
        images = jnp.asarray(batch.image).astype(jnp.float32) / 255.0
        gt = jnp.asarray(batch.gt).astype(jnp.int32)
        params = self._params(gt)
        clean_pred = self.predict(params, images)
        if self.labels_mode == "gt":
            labels, valid = gt, jnp.asarray(batch.valid) & (gt >= 0)
        else:
            labels, valid = clean_pred, jnp.asarray(batch.valid)
        keys = instance_keys(self.base_key, jnp.asarray(batch.seed))
        region = jnp.asarray(batch.valid) if self.padded else None
        result = run_battery(self.candidates, self.target.model.apply, params, images, labels, valid, keys,
                             num_classes=self.config.num_classes, background_class=self.config.background_class,
                             keep_worst=(WORST_RULE,), region=region)
        worst = result.worst_images[WORST_RULE]
        if "clean" in result.names:
            clean_confusions = result.confusions[result.names.index("clean")]
        else:
            clean_confusions = np.asarray(self.score(params, images, labels, valid))
        return {"confusions": np.swapaxes(result.confusions, 0, 1), "clean_confusion": clean_confusions,
                "forwards": result.forwards.T, "backwards": result.backwards.T, "image": np.asarray(batch.image),
                "adversarial": worst.astype(np.float16), "labels": np.asarray(labels, np.int16),
                "valid": np.asarray(valid), "clean_pred": np.asarray(clean_pred, np.int16),
                "adv_pred": np.asarray(self.predict(params, jnp.asarray(worst)), np.int16)}


def make_battery_batch_fn(target: Target, candidates: Sequence[Candidate], config: BatteryConfig,
                          labels_mode: str = "gt", seed: int = 0, padded: bool = False) -> HostDrivenProgram:
    """``PaddedBatch -> outputs [B, ...]`` for `jaxseg_robust.runner.engine.run`: the `BatteryProtocol`
    (same arguments) as a timed `runner.program.HostDrivenProgram` (``TIMING_KEY`` outputs, ``compile_log``)."""
    return HostDrivenProgram(BatteryProtocol(target, candidates, config, labels_mode, seed, padded))


def manifest_config(target: Target, names: Sequence[str], config: BatteryConfig, *, epsilon_text: str,
                    labels_mode: str, seed: int, max_side: int | None) -> dict:
    """The run manifest's settings of a battery run (a changed value refuses a resume).

    Args:
      target: the attacked model (its description and the model's own background class, None: none).
      names: the candidates' names; config: the `BatteryConfig`; epsilon_text: ε as the user wrote it.
      labels_mode, seed: as for `BatteryProtocol`; max_side: the size guard (``--max-side``).
    """
    c = config
    return {"protocol": "perturb", **target.description, "candidates": list(names), "num_classes": c.num_classes,
            "background_class": target.model.background_class,
            "epsilon": c.epsilon, "epsilon_text": epsilon_text, "labels": labels_mode,
            "void_policy": c.void_policy, "sea_schedule": c.sea_schedule, "msl_track": c.msl_track,
            "alma_lr_init": c.alma_lr_init, "include_clean": c.include_clean,
            "select_with_background": c.select_with_background,
            "budgets": {"padam_steps": c.padam_steps, "sea_iterations": c.sea_iterations,
                        "dag_iterations": c.dag_iterations, "alma_steps": c.alma_steps, "pdpgd_steps": c.pdpgd_steps},
            "reference_quirks": c.reference_quirks, "max_side": max_side, "seed": seed}
