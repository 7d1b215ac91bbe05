"""`TetrisSpec`: TETRIS adversarial click trajectories and the RITM baseline clicker as a run spec.

Modes (docs/protocols/tetris.md §1, §3; defaults = the TETRIS code, §7.1):
  minmax    (default) the MIN and the MAX attack on one embedding per image,
            IoU/BIoU-AuC@10 Min / Max / Δ per dataset;
  min, max  one attack;
  baseline  the RITM baseline clicker only (``n_clicks=20`` for NoC@80/85/90).
With an attack the baseline clicker also runs on the same embedding for
``baseline_clicks`` clicks (None: 20, 0: off): the table's baseline IoU/BIoU-AuC
and RITM's NoC@80/85/90 come from it (``target_iou`` adds NoC@T; nothing stops early).

Records: per trajectory (``min``, ``max``, ``baseline``) the per-click outputs
of `jaxseg_robust.attacks.clicks.trajectory_outputs` and ``source`` (the image
file and evaluated size); each trajectory's final mask goes to ``masks/``, the
per-instance per-click IoU/BIoU to ``ious.csv`` (RITM's ``--save-ious``).
"""

from __future__ import annotations

import dataclasses
import pathlib
from typing import ClassVar

from jaxseg_robust.attacks import clicks
from jaxseg_robust.ops.render import DEFAULT_CLICK_RADIUS
from jaxseg_robust.runs.authors_predictor import with_authors_predictor
from jaxseg_robust.runs.loading import LoadedModel, model_config, resolve_threshold
from jaxseg_robust.runs.protocol import ProtocolSpec, RunPlan, RunTables, Say
from jaxseg_robust.runs.spec import RunError, mark_fields

MODES = ("minmax", "min", "max", "baseline")
DEFAULT_BASELINE_CLICKS = 20  # RITM's NoC@80/85/90 budget
CONFIG_FIELDS = {"n_clicks": "n_clicks", "n_opt_steps": "n_opt_steps", "lr_mult": "lr_mult", "thr": "thresh",
                 "radius": "radius", "tolerance": "tolerance", "dice_weight": "dice_weight"}


@dataclasses.dataclass(frozen=True)
class TetrisSpec(ProtocolSpec):
    """The TETRIS protocol's settings (module docstring; docs/protocols/tetris.md).

    Attributes:
      mode: "minmax", "min", "max" or "baseline".
      n_clicks: clicks per trajectory (>= 2).
      n_opt_steps: evaluated iterates per click (the first + n-1 Adam updates).
      lr_mult: Adam lr = lr_mult * 5 sqrt(H^2 + W^2) / (400 sqrt 2), pixels.
      thresh: probability threshold (None: the model family's).
      baseline_clicks: clicks of the baseline clicker beside an attack (None: 20; 0: off).
      tolerance: an iterate is accepted only if Lloc <= tolerance x the accepted Lloc.
      dice_weight: weight of the signed Dice term.
      radius: click disk radius of the location loss, resized-frame pixels (None: 5).
      coverage: disk renderer, "area" (exact) or "ramp" (the spec's anti-aliased ramp).
      mask_input: previous low-res mask input, "code" (the reference's reset quirk) or "always".
      acceptance: "code" (lexicographic IoU, BIoU) or "paper".
      fixed_first_click: click 1 is the baseline click, not optimised (the paper's reading).
      isegm: click-map models: "authors" (the TETRIS authors' predictor) or "off".
      record_iterates: store every iterate's points, losses and IoUs.
      target_iou: adds NoC@T and >=K@T to the table (None: NoC@80/85/90 only).
    """

    command: ClassVar[str] = "tetris"
    default_batch_size: ClassVar[int] = 4

    mode: str = "minmax"
    n_clicks: int = clicks.DEFAULT_N_CLICKS
    n_opt_steps: int = clicks.DEFAULT_N_OPT_STEPS
    lr_mult: float = clicks.DEFAULT_LR_MULT
    thresh: float | None = None
    baseline_clicks: int | None = None
    tolerance: float = clicks.DEFAULT_TOLERANCE
    dice_weight: float = clicks.DEFAULT_DICE_WEIGHT
    radius: float | None = None
    coverage: str = "area"
    mask_input: str = "code"
    acceptance: str = "code"
    fixed_first_click: bool = False
    isegm: str = "authors"
    record_iterates: bool = False
    target_iou: float | None = None

    def check(self) -> None:
        self.configs(None)

    def configs(self, threshold: float | None):
        """(attack config or None, baseline config or None), `jaxseg_robust.attacks.clicks.TetrisConfig`s at
        ``threshold`` (None: ``thresh`` or the SAM default).

        Raises:
          RunError: a bad value or combination, naming the field.
        """
        if self.mode not in MODES:
            raise RunError(f"{{mode}} must be one of {', '.join(MODES)}; got {self.mode!r}")
        if self.mode == "baseline" and self.baseline_clicks is not None:
            raise RunError("{baseline_clicks} applies to the attack modes; with {mode} baseline use {n_clicks}")
        if self.n_clicks < 2:
            raise RunError(f"{{n_clicks}} must be >= 2 (the AuC needs two clicks); got {self.n_clicks}")
        if self.thresh is not None and not 0.0 <= self.thresh < 1.0:
            raise RunError(f"{{thresh}} must be in [0, 1); got {self.thresh}")
        if self.target_iou is not None and not 0.0 < self.target_iou <= 1.0:
            raise RunError(f"{{target_iou}} must be in (0, 1]; got {self.target_iou}")
        baseline_clicks = DEFAULT_BASELINE_CLICKS if self.baseline_clicks is None else self.baseline_clicks
        thr = threshold if threshold is not None else (clicks.DEFAULT_THRESHOLD if self.thresh is None else self.thresh)
        common = {"thr": thr, "mask_input": self.mask_input,
                  "radius": DEFAULT_CLICK_RADIUS if self.radius is None else self.radius}
        try:
            if self.mode == "baseline":
                return None, clicks.TetrisConfig(mode="baseline", n_clicks=self.n_clicks, **common)
            attack = clicks.TetrisConfig(
                mode="min" if self.mode == "minmax" else self.mode, n_clicks=self.n_clicks,
                n_opt_steps=self.n_opt_steps, lr_mult=self.lr_mult, tolerance=self.tolerance,
                dice_weight=self.dice_weight, coverage=self.coverage, acceptance=self.acceptance,
                optimise_first_click=not self.fixed_first_click, record_trajectory=self.record_iterates, **common)
            baseline = (clicks.TetrisConfig(mode="baseline", n_clicks=baseline_clicks, **common)
                        if baseline_clicks else None)
        except ValueError as error:
            text = mark_fields(str(error), CONFIG_FIELDS)
            for field, name in CONFIG_FIELDS.items():
                text = text.replace(f"{{{field}}}", f"{{{name}}}")
            raise RunError(text) from None
        if baseline is not None and baseline_clicks < 2:
            raise RunError(f"{{baseline_clicks}} must be 0 or >= 2 (NoC and AuC need clicks); got {baseline_clicks}")
        return attack, baseline

    def clicks_per_instance(self, attack, baseline) -> int:
        """Clicks one instance computes over all its trajectories (the divisor of seconds per click)."""
        attacks = 0 if attack is None else (2 if self.mode == "minmax" else 1) * attack.n_clicks
        return attacks + (0 if baseline is None else baseline.n_clicks)

    def manifest_config(self, model: LoadedModel, attack, baseline, isegm: dict | None) -> dict:
        """The run configuration recorded in (and compared on resume with) the manifest; ``records_format``
        names the records' layout (`jaxseg_robust.runner.rundir.check_records_format`)."""
        from jaxseg_robust.runner.rundir import RECORDS_FORMAT_KEY  # noqa: PLC0415

        config = model_config(self.command, model, mode=self.mode)
        config.update(n_clicks=self.n_clicks, baseline_clicks=0 if baseline is None else baseline.n_clicks)
        config[RECORDS_FORMAT_KEY] = clicks.RECORDS_FORMAT
        if self.target_iou is not None:  # a table setting, recorded so that `jaxseg-robust report` shows the same
            config["target_iou"] = self.target_iou
        if attack is not None:
            config["attack"] = dataclasses.asdict(attack)
        if baseline is not None:
            config["baseline"] = dataclasses.asdict(baseline)
        if isegm is not None:
            config["isegm"] = isegm
        return config

    def plan(self, model: LoadedModel, instances, run_dir, say: Say) -> RunPlan:
        """The `BatchProgram` of a `jaxseg_robust.attacks.clicks.ClickProtocol` with each trajectory's final
        mask as an extra output (moved to ``masks/`` by the finalize; the numbers are the same either way)."""
        from jaxseg_robust.data.instances import require_object  # noqa: PLC0415
        from jaxseg_robust.reports.artifacts import store_masks  # noqa: PLC0415
        from jaxseg_robust.reports.sources import with_image_source  # noqa: PLC0415
        from jaxseg_robust.runner.program import BatchProgram  # noqa: PLC0415

        model, isegm = with_authors_predictor(model, instances, self.isegm, "tetris", "TETRIS")
        attack, baseline = self.configs(resolve_threshold(self.thresh, model))
        attack, baseline = (None if config is None else dataclasses.replace(config, return_mask=True)
                            for config in (attack, baseline))
        protocol = clicks.ClickProtocol(attack=attack, minmax=self.mode == "minmax", baseline=baseline)
        program = BatchProgram(model.segmenter, model.params, protocol, announce=say, timed=True)

        def masks(instance, outputs) -> dict:
            return store_masks(run_dir, instance, outputs)

        return RunPlan(instances, program, self.manifest_config(model, attack, baseline, isegm), model.fingerprint,
                       finalize=with_image_source(masks), check=require_object,
                       clicks=self.clicks_per_instance(attack, baseline))

    def summarize(self, run_dir, plan: RunPlan, say: Say) -> RunTables:
        """The per-dataset TETRIS table (`jaxseg_robust.reports.tetris`) and ``ious.csv``."""
        from jaxseg_robust.reports.artifacts import read_timings  # noqa: PLC0415
        from jaxseg_robust.reports.report_files import load_run_records  # noqa: PLC0415
        from jaxseg_robust.reports.tetris import CLICK_CSV, tetris_table, to_csv, to_markdown, write_click_csv  # noqa: PLC0415

        records = load_run_records(run_dir)
        table = tetris_table(records, target_iou=self.target_iou, timings=read_timings(run_dir))
        write_click_csv(pathlib.Path(run_dir) / CLICK_CSV, records)
        return RunTables(to_markdown(table), to_csv(table))
