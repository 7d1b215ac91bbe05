"""`PerturbSpec`: the L∞ image-perturbation battery (PAdam, SEA, DAG, ALMA prox, PDPGD) as a run spec.

docs/protocols/perturbation.md. The attacked model is a `jaxseg_robust.attacks.perturb.target.Target`
(a converted dense directory, or a SAM-family zoo name / directory with one tight GT box per image);
the instances are the binary benchmarks and folders of the `DataSpec`, or a semantic dataset (PASCAL
VOC 2012, Cityscapes) under its ``data_root`` when ``dataset`` is set. Each instance gets one record
(`jaxseg_robust.reports.perturb_records`: per-candidate confusions, the per-image worst case); the
summary is `jaxseg_robust.reports.perturb.summarize_run`'s (``summary.md`` / ``.csv`` and, with
``report``, ``RUN_DIR/report``).

Order of a run: the values are checked, the instances listed (a semantic dataset is listed without
its class count), the model loaded and its class count checked against the labels, the dataset and
the attacks; the plan turns a semantic listing into instances of the model's class count.
"""

from __future__ import annotations

import dataclasses
import fractions
import os
import pathlib
from collections.abc import Sequence
from typing import ClassVar

from jaxseg_robust.attacks.perturb.battery_program import LABEL_MODES
from jaxseg_robust.attacks.perturb.image_chunks import DEFAULT_ACCELERATOR_CHUNK
from jaxseg_robust.attacks.perturb.target import Target, load_target
from jaxseg_robust.runs.loading import load_instances
from jaxseg_robust.runs.protocol import ProtocolSpec, RunPlan, RunTables, Say
from jaxseg_robust.runs.spec import DataSpec, ModelSpec, RunError

DEFAULT_ATTACKS = "padam-ce,padam-cos,sea,dag,alma-prox,pdpgd"
SEMANTIC_DATASETS = ("voc", "cityscapes")
VOID_POLICIES = ("ignore", "as_background")
SEA_SCHEDULES = ("progressive", "single")
MSL_TRACKS = ("masked", "unmasked")
TARGET_FLAGS = {"--random-weights": "{random_seed}", "--compute-dtype": "{compute_dtype}"}  # load_target's words


def default_attacks() -> tuple[str, ...]:
    """The battery's candidate names of `DEFAULT_ATTACKS` (`attacks.perturb.ensemble.attack_names`)."""
    from jaxseg_robust.attacks.perturb.ensemble import attack_names  # noqa: PLC0415

    return attack_names(DEFAULT_ATTACKS)


def epsilon_of(text: str) -> float:
    """``"8/255"`` or ``"0.031"`` -> float in (0, 1] (image units).

    Raises:
      RunError: naming ``{epsilon}``.
    """
    try:
        value = float(fractions.Fraction(str(text).strip()))
    except (ValueError, ZeroDivisionError):
        raise RunError(f"{{epsilon}} must be a number or a fraction like 8/255, got {text!r}") from None
    if not 0 < value <= 1:
        raise RunError(f"{{epsilon}} must be in (0, 1] (image units), got {text!r} = {value}")
    return value


@dataclasses.dataclass(frozen=True)
class BatteryInstances:
    """What `PerturbSpec.load_instances` lists.

    Attributes:
      refs: `InstanceRef`s of the benchmarks and folders, or the `data.semantic.SemanticRef`s of
        ``dataset`` (made instances of the model's class count by `PerturbSpec.plan`).
      max_side: the size guard of the benchmarks and folders, pixels (recorded in the manifest; None with
        a semantic dataset, which is resized by its own rule).
    """

    refs: tuple
    max_side: int | None


@dataclasses.dataclass(frozen=True)
class PerturbSpec(ProtocolSpec):
    """The perturbation battery's settings (module docstring; docs/protocols/perturbation.md).

    Attributes:
      attacks: battery candidate names, `attacks.perturb.ensemble.CANDIDATE_ORDER` but "clean" (the
        command's groups such as "sea" are expanded by `attacks.perturb.ensemble.attack_names`; default:
        every family).
      epsilon: the L∞ radius, image units in (0, 1].
      epsilon_text: ε as written, recorded in the manifest (None: ``repr(epsilon)``).
      labels: "gt" (score against the masks; binary models) or "prediction" (the model's clean prediction).
      multimask_output: SAM-family models: the best of 3 masks by predicted IoU (False: the single-mask output).
      void_policy: max-damage attacks on void pixels, "ignore" or "as_background" (None: as_background for
        ``dataset`` voc, else ignore).
      sea_schedule: SEA's loss schedule, "progressive" (the paper's three phases) or "single".
      msl_track: SEA-MSL tracked loss, "masked" or "unmasked" (None: follow the schedule; docs §8.2 #2).
      alma_lr_init: ALMA prox initial step (the released code's 1e-4; Rony et al.: 1e-3).
      include_clean: the clean image is the first candidate of the worst case.
      select_with_background: worst-case selection score: None each metric variant's own, True / False
        always the with- / without-background score.
      reference_quirks: the reference code's SEA start-accuracy and ALMA derivative quirks.
      padam_steps, sea_iterations, dag_iterations, alma_steps, pdpgd_steps: the attacks' budgets (steps).
      accelerator_chunk: most images one attack pass holds on an accelerator, images (memory only: the
        results do not depend on it, and the CPU attacks the whole batch at once; docs/protocols/perturbation.md,
        "Accelerator memory").
      seed: base PRNG seed of the random starts.
      examples: instances whose images are saved (``RUN_DIR/examples``) for the report.
      report: write ``RUN_DIR/report`` after the run.
      dataset: "voc" or "cityscapes" under the data spec's ``data_root`` (instead of its datasets /
        folders; None: those).
      split: the semantic dataset's split.
      resize: the semantic dataset's resize rule, shorter:N, longer:N, fixed:HxW or none (None: the
        paper's, VOC shorter:512, Cityscapes fixed:512x1024).
      pad_to_multiple: pad image and labels to H, W rounded up to a multiple of this, pixels (padding is
        void and never perturbed; docs §10.6; 0: every image at its own size). It is the battery's frame:
        the engine spec's ``frame`` does not apply.
    """

    command: ClassVar[str] = "perturb"
    default_batch_size: ClassVar[int] = 1

    attacks: tuple[str, ...] = dataclasses.field(default_factory=default_attacks)
    epsilon: float = 8 / 255
    epsilon_text: str | None = None
    labels: str = "gt"
    multimask_output: bool = True
    void_policy: str | None = None
    sea_schedule: str = "progressive"
    msl_track: str | None = None
    alma_lr_init: float = 1e-4
    include_clean: bool = True
    select_with_background: bool | None = None
    reference_quirks: bool = True
    padam_steps: int = 200
    sea_iterations: int = 300
    dag_iterations: int = 200
    alma_steps: int = 500
    pdpgd_steps: int = 500
    accelerator_chunk: int = DEFAULT_ACCELERATOR_CHUNK
    seed: int = 0
    examples: int = 4
    report: bool = True
    dataset: str | None = None
    split: str = "val"
    resize: str | None = None
    pad_to_multiple: int = 0

    # ---- values ------------------------------------------------------------------------------

    def check(self) -> None:
        """Raises `RunError` naming the field of a value the battery cannot run."""
        from jaxseg_robust.attacks.perturb.ensemble import CANDIDATE_ORDER  # noqa: PLC0415

        if not 0 < self.epsilon <= 1:
            raise RunError(f"{{epsilon}} must be in (0, 1] (image units), got {self.epsilon}")
        if self.epsilon_text is not None and epsilon_of(self.epsilon_text) != self.epsilon:
            raise RunError(f"{{epsilon_text}} {self.epsilon_text!r} is not {{epsilon}} {self.epsilon}")
        attackers = CANDIDATE_ORDER[1:]  # "clean" is ``include_clean``
        unknown = [name for name in self.attacks if name not in attackers]
        if unknown or not self.attacks:
            raise RunError(f"{{attacks}} must be candidate names out of {', '.join(attackers)} (e.g. "
                           f"attacks.perturb.ensemble.attack_names('sea,dag')); got {tuple(self.attacks)}")
        for field, value, allowed in (("labels", self.labels, LABEL_MODES),
                                      ("void_policy", self.void_policy, (None, *VOID_POLICIES)),
                                      ("sea_schedule", self.sea_schedule, SEA_SCHEDULES),
                                      ("msl_track", self.msl_track, (None, *MSL_TRACKS)),
                                      ("dataset", self.dataset, (None, *SEMANTIC_DATASETS))):
            if value not in allowed:
                raise RunError(f"{{{field}}} must be one of {', '.join(map(str, allowed))}; got {value!r}")
        counts = (("padam_steps", self.padam_steps, 1), ("sea_iterations", self.sea_iterations, 1),
                  ("dag_iterations", self.dag_iterations, 1), ("alma_steps", self.alma_steps, 1),
                  ("pdpgd_steps", self.pdpgd_steps, 1), ("accelerator_chunk", self.accelerator_chunk, 1),
                  ("examples", self.examples, 0),
                  ("pad_to_multiple", self.pad_to_multiple, 0))
        for field, value, least in counts:
            if value < least:
                raise RunError(f"{{{field}}} must be >= {least}; got {value}")
        if self.sea_schedule == "progressive" and int(0.3 * self.sea_iterations) < 1:
            raise RunError(f"{{sea_iterations}} must be >= 4 with the progressive schedule (three stages of "
                           f"⌊0.3N⌋, ⌊0.3N⌋ and the rest), got {self.sea_iterations}")
        if not self.alma_lr_init > 0:
            raise RunError(f"{{alma_lr_init}} must be > 0; got {self.alma_lr_init}")
        if self.resize is not None and self.dataset is None:
            raise RunError("{resize} applies to {dataset} voc|cityscapes (use {max_side} with {datasets})")
        if self.dataset is not None:
            self.resize_rule()

    def resize_rule(self):
        """The `data.semantic.ResizeRule` of ``resize``, or the paper's protocol of ``dataset``.

        Raises:
          RunError: a bad rule (its text named).
        """
        from jaxseg_robust.data.semantic import resize_rule  # noqa: PLC0415

        try:
            return resize_rule(self.dataset, self.resize)
        except ValueError as error:
            raise RunError(f"{{resize}}: {error}") from None

    def void_policy_used(self) -> str:
        """``void_policy``, or its default: ``as_background`` for PASCAL VOC (§1.2), else ``ignore``."""
        if self.void_policy is not None:
            return self.void_policy
        return "as_background" if self.dataset == "voc" else "ignore"

    def epsilon_label(self) -> str:
        """ε as the manifest records it: ``epsilon_text``, or ``repr(epsilon)`` when None."""
        return repr(self.epsilon) if self.epsilon_text is None else self.epsilon_text

    def battery_config(self, num_classes: int, background_class: int | None):
        """The `attacks.perturb.ensemble.BatteryConfig` of these settings for a model of ``num_classes``
        classes whose background class is ``background_class`` (None: the model has none; the config then
        holds the battery's default, 0)."""
        from jaxseg_robust.attacks.perturb.ensemble import BatteryConfig  # noqa: PLC0415

        return BatteryConfig(num_classes=num_classes, epsilon=self.epsilon, void_policy=self.void_policy_used(),
                             background_class=0 if background_class is None else int(background_class),
                             sea_schedule=self.sea_schedule, msl_track=self.msl_track,
                             alma_lr_init=self.alma_lr_init, reference_quirks=self.reference_quirks,
                             include_clean=self.include_clean, select_with_background=self.select_with_background,
                             attacks=tuple(self.attacks), padam_steps=self.padam_steps,
                             sea_iterations=self.sea_iterations, dag_iterations=self.dag_iterations,
                             alma_steps=self.alma_steps, pdpgd_steps=self.pdpgd_steps,
                             accelerator_chunk=self.accelerator_chunk)

    # ---- instances and model -----------------------------------------------------------------

    def load_instances(self, data: DataSpec, say: Say) -> BatteryInstances:
        """The benchmarks and folders of ``data`` (`runs.loading.load_instances`), or the listing of
        ``dataset`` under ``data.data_root`` (``split``, ``resize``, ``data.limit``).

        Raises:
          RunError: both or neither kind of data, no data root, a listing error naming the folder or file.
        """
        if self.dataset is not None and (data.datasets or data.folders):
            raise RunError("give either {dataset} (voc, cityscapes) or {datasets} / {folders}, not both")
        if self.dataset is None:
            if not (data.datasets or data.folders):
                raise RunError("give {dataset} (voc, cityscapes) or {datasets} / {folders}")
            refs = load_instances(data, default_tetris_max_side=self.default_tetris_max_side, say=say)
            return BatteryInstances(tuple(refs), data.max_side)
        return BatteryInstances(tuple(self.semantic_refs(data)), None)

    def semantic_refs(self, data: DataSpec) -> list:
        """The `data.semantic.SemanticRef`s of ``dataset`` under ``data.data_root`` (or ``$JAXSEG_ROBUST_DATA``),
        the first ``data.limit`` of them."""
        from jaxseg_robust.data import semantic  # noqa: PLC0415

        root = data.data_root or os.environ.get("JAXSEG_ROBUST_DATA")
        if not root:
            raise RunError("{dataset} needs {data_root} DIR (or $JAXSEG_ROBUST_DATA)")
        try:
            refs = semantic.list_semantic_dataset(self.dataset, root, split=self.split, resize=self.resize_rule())
        except ValueError as error:  # SemanticDatasetError
            raise RunError(str(error)) from None
        return refs if data.limit is None else refs[:data.limit]

    def load_model(self, model: ModelSpec, instances: BatteryInstances, mesh, say: Say) -> Target:
        """The attacked `Target` (`attacks.perturb.target.load_target`, which places the weights on the
        default device; ``mesh`` is not used), its class count checked (`check_classes`).

        Raises:
          RunError: no model, unknown name, missing or damaged weights, a class count that does not fit.
        """
        if not model.name:
            raise RunError("give {model}")
        say(f"loading {model.name} ...")
        try:
            target = load_target(model.name, random_seed=model.random_seed, multimask_output=self.multimask_output,
                                 compute_dtype=model.compute_dtype)
        except OSError as error:
            raise RunError(f"{type(error).__name__}: {error}") from None
        except ValueError as error:  # StoreError is a ValueError
            text = str(error)
            for flag, field in TARGET_FLAGS.items():
                text = text.replace(flag, field)
            raise RunError(text) from None
        self.check_classes(int(target.model.num_classes), model.name)
        return target

    def check_classes(self, num_classes: int, model_name: str) -> None:
        """Raises `RunError` when a model of ``num_classes`` classes cannot run these settings: another
        count than ``dataset``'s, ``labels`` gt on a multi-class model, ALMA prox with fewer than 3."""
        from jaxseg_robust.data.semantic import CLASS_COUNTS  # noqa: PLC0415

        if self.dataset is not None:
            expected = CLASS_COUNTS[self.dataset]
            if num_classes != expected:
                raise RunError(f"{{dataset}} {self.dataset} has {expected} classes but {model_name} predicts "
                               f"{num_classes}")
        elif self.labels == "gt" and num_classes != 2:
            raise RunError(f"{{labels}} gt scores binary masks but {model_name} has {num_classes} classes; "
                           "use {labels} prediction")
        if "alma_prox" in self.attacks and num_classes < 3:
            raise RunError(f"alma-prox needs a model with >= 3 classes (its DLR constraint uses the top-3 "
                           f"logits); {model_name} has {num_classes}: drop it from {{attacks}}")

    # ---- plan and summary --------------------------------------------------------------------

    def manifest_config(self, target: Target, names: Sequence[str], battery, max_side: int | None) -> dict:
        """The run configuration recorded in (and compared on resume with) the manifest
        (`attacks.perturb.battery_program.manifest_config`, then the semantic dataset and the padding)."""
        from jaxseg_robust.attacks.perturb.battery_program import manifest_config  # noqa: PLC0415
        from jaxseg_robust.data.semantic import rule_text  # noqa: PLC0415

        config = manifest_config(target, names, battery, epsilon_text=self.epsilon_label(), labels_mode=self.labels,
                                 seed=self.seed, max_side=max_side)
        if self.dataset is not None:
            config.update(dataset=self.dataset, split=self.split, resize=rule_text(self.resize_rule()))
            del config["max_side"]
        if self.pad_to_multiple > 0:
            config["pad_to_multiple"] = self.pad_to_multiple
        return config

    def plan(self, model: Target, instances: BatteryInstances, run_dir, say: Say) -> RunPlan:
        """The battery as a timed `runner.program.HostDrivenProgram` (`attacks.perturb.battery_program`);
        the finalize writes the record payload and saves the first ``examples`` instances' images; with
        ``pad_to_multiple`` the frame is ``round:N``, else every image is attacked in its own frame (the engine
        spec's frame does not apply: a padded frame is only attacked correctly as ``pad_to_multiple``)."""
        from jaxseg_robust.attacks.perturb.battery_program import make_battery_batch_fn  # noqa: PLC0415
        from jaxseg_robust.attacks.perturb.ensemble import build_battery  # noqa: PLC0415
        from jaxseg_robust.data import semantic  # noqa: PLC0415
        from jaxseg_robust.reports.perturb_records import ExampleSaver, make_finalize  # noqa: PLC0415

        num_classes = int(model.model.num_classes)
        battery = self.battery_config(num_classes, model.model.background_class)
        candidates = build_battery(model.model.apply, battery)
        names = tuple(candidate.name for candidate in candidates)
        refs = (semantic.instance_refs(instances.refs, num_classes) if self.dataset is not None
                else list(instances.refs))
        saver = ExampleSaver(pathlib.Path(run_dir) / "examples", self.examples, names)
        attacked = ", ".join(name for name in names if name != "clean")
        say(f"perturb: {len(refs)} instances, attacks {attacked}, ε = {self.epsilon_label()}, "
            f"model {model.description['model']} ({model.description['kind']})")
        padded = self.pad_to_multiple > 0
        batch_fn = make_battery_batch_fn(model, candidates, battery, self.labels, self.seed, padded)
        return RunPlan(refs, batch_fn, self.manifest_config(model, names, battery, instances.max_side),
                       model.fingerprint, finalize=make_finalize(saver, battery.background_class),
                       frame=f"round:{self.pad_to_multiple}" if padded else "exact")

    def summarize(self, run_dir, plan: RunPlan, say: Say) -> RunTables:
        """Appends the battery's compile summary to ``compile.jsonl`` and writes the clean vs robust table
        (`reports.perturb.summarize_run`: ``summary.md`` / ``.csv`` and, with ``report``, the report);
        the Markdown is the lines the command prints (``csv`` None: the summary files are written)."""
        from jaxseg_robust.attacks.perturb.ensemble import battery_compile_summary  # noqa: PLC0415
        from jaxseg_robust.attacks.perturb.programs import format_compile_summary  # noqa: PLC0415
        from jaxseg_robust.reports.artifacts import append_compile_summary  # noqa: PLC0415
        from jaxseg_robust.reports.perturb import summarize_run  # noqa: PLC0415

        battery = plan.batch_fn.protocol  # the `BatteryProtocol` of `plan`
        compiled = battery_compile_summary(battery.candidates, battery.target.model.apply, battery.config.num_classes)
        append_compile_summary(run_dir, compiled)
        lines = [f"perturb: {format_compile_summary(compiled)}", *summarize_run(run_dir, with_report=self.report)]
        return RunTables("\n".join(lines), None)
