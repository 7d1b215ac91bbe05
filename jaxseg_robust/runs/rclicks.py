"""`RClicksSpec`: the RClicks benchmark (realistic simulated users) as a run spec (docs/protocols/rclicks.md).

Per instance, one jitted program runs the Base clicker and the clicking groups
G1..G10 for ``n_clicks`` rounds each (`jaxseg_robust.clicksim.evaluation`),
with the click model named by ``clickability``: the converted clickability
network (a directory or the zoo name ``rclicks_clickability``) or the ``dt`` /
``ud`` baselines. With ``clicks_csv`` it also evaluates every real first-round
click (User) and as many sampled first-round clicks (SamplingUsersCount).
The TETRIS dataset is capped at 2048 pixels (§1.3) unless the data spec says
otherwise.

Records: per instance the payload of `jaxseg_robust.clicksim.evaluation.finalize_record`
(IoU and Boundary IoU per round: ``base_iou`` / ``base_biou``, ``group_iou`` /
``group_biou``, the clicks; with user clicks ``user_iou``, ``sample_iou``).
The table is the per-dataset benchmark of the run's datasets (NoC, NoF,
IoU-AuC, NSR, first-round columns; §6; headers name ``n_clicks`` and
``target_iou``, e.g. NoC5@85), beside it a clicking-groups figure per plotted
instance (``groups_<dataset>_<id>.png``).
"""

from __future__ import annotations

import dataclasses
import pathlib
from collections.abc import Mapping, Sequence
from typing import ClassVar

import numpy as np

from jaxseg_robust.runs.authors_predictor import ISEGM_CHOICES, with_authors_predictor
from jaxseg_robust.runs.loading import LoadedModel, load_model, matched_first_round, resolve_threshold
from jaxseg_robust.runs.protocol import ProtocolSpec, RunPlan, RunTables, Say
from jaxseg_robust.runs.spec import ModelSpec, RunError

MASK_FEEDBACK = ("reference", "always", "never")
RCLICKS_TETRIS_MAX_SIDE = 2048  # pixels, the RClicks cap of the TETRIS dataset (docs/protocols/rclicks.md §1.3)


@dataclasses.dataclass(frozen=True)
class RClicksModels:
    """What an RClicks run loads before its plan (`RClicksSpec.load_model`).

    Attributes:
      model: the segmenter's `LoadedModel` (with the authors' predictor for a click-map model).
      isegm: the authors' predictor options recorded in the manifest (None: none).
      click_model: the `jaxseg_robust.clicksim.click_models.LoadedClickModel` (``params`` as loaded, for the
        figures).
      click_params: its parameters replicated over the data mesh (None: the "dt" / "ud" baselines).
      user_clicks: ``{(dataset, id): int[n, 2] (x, y) pixels}`` real first-round clicks (None: no ``clicks_csv``).
    """

    model: LoadedModel
    isegm: dict | None
    click_model: object
    click_params: object
    user_clicks: Mapping | None


@dataclasses.dataclass(frozen=True)
class RClicksPlan(RunPlan):
    """The `RunPlan` of an RClicks run with what its figures need.

    Attributes:
      click_model: the loaded click model (`RClicksModels.click_model`); None only for a plan made by hand.
      settings: the final `jaxseg_robust.clicksim.evaluation.RClicksConfig` of the batch program.
    """

    click_model: object = None
    settings: object = None


@dataclasses.dataclass(frozen=True)
class RClicksSpec(ProtocolSpec):
    """The RClicks protocol's settings (module docstring; docs/protocols/rclicks.md).

    Attributes:
      clickability: the click model: a converted clickability or TranSalNet directory, the zoo name
        ``rclicks_clickability`` or ``transalnet_res``, ``"saliency"`` (= ``transalnet_res``, the SM
        baseline), or the baselines "dt" (distance transform) / "ud" (uniform).
      clickability_random_seed: seeded random clickability weights for the zoo name (None: the converted ones).
      clicks_csv: the RClicks clicks.csv: also evaluate the real first-round clicks (User) and as many sampled
        ones (SamplingUsersCount) (None: simulated clicks only).
      n_clicks: rounds per trajectory (>= 2).
      groups: clicking groups (equal-mass bands; even, as ΔHH pairs group j with j+G/2; 0: no groups).
      run_base: run the Base (baseline clicker) trajectory.
      thresh: probability threshold of the model, in (0, 1) (None: the model family's, 0.5 SAM-type,
        0.49 RITM-type).
      target_iou: IoU target of NoC/NoF in the table, in (0, 1].
      mask_feedback: previous low-res mask input: "reference" (the RClicks SAM wrapper's reset at round 2
        after a negative click), "always" or "never".
      seed: the run seed of the simulated users.
      isegm: click-map models: "authors" (the RClicks authors' predictor, §5.5) or "off".
      plot_groups: clicking-groups figures for the first N instances of each dataset.
    """

    command: ClassVar[str] = "rclicks"
    default_batch_size: ClassVar[int] = 4
    default_tetris_max_side: ClassVar[int | None] = RCLICKS_TETRIS_MAX_SIDE

    clickability: str
    clickability_random_seed: int | None = None
    clicks_csv: str | None = None
    n_clicks: int = 20
    groups: int = 10
    run_base: bool = True
    thresh: float | None = None
    target_iou: float = 0.9
    mask_feedback: str = "reference"
    seed: int = 42
    isegm: str = "authors"
    plot_groups: int = 1

    def check(self) -> None:
        """Refuses settings that cannot give a table, before anything is loaded.

        Raises:
          RunError: naming the field (``n_clicks`` < 2, ``thresh`` outside (0, 1), ``target_iou`` outside
            (0, 1], an odd ``groups``, no Base, no groups and no ``clicks_csv``: nothing to evaluate).
        """
        if self.n_clicks < 2:
            raise RunError(f"{{n_clicks}} must be >= 2 (IoU-AuC needs two rounds); got {self.n_clicks}")
        if self.thresh is not None and not 0.0 < self.thresh < 1.0:
            raise RunError(f"{{thresh}} must be in (0, 1); got {self.thresh}")
        if not 0.0 < self.target_iou <= 1.0:
            raise RunError(f"{{target_iou}} must be an IoU in (0, 1]; got {self.target_iou}")
        if self.groups < 0 or self.groups % 2:
            raise RunError(f"{{groups}} must be even (ΔHH pairs group j with group j+G/2; the benchmark "
                           f"uses 10) or 0 for no groups; got {self.groups}")
        if not self.run_base and self.groups == 0 and self.clicks_csv is None:
            raise RunError("{run_base} with {groups} 0 leaves nothing to evaluate; drop one of them or "
                           "add {clicks_csv} (real first-round clicks)")
        if self.mask_feedback not in MASK_FEEDBACK:
            raise RunError(f"{{mask_feedback}} must be one of {', '.join(MASK_FEEDBACK)}; got {self.mask_feedback!r}")
        if self.isegm not in ISEGM_CHOICES:
            raise RunError(f"{{isegm}} must be one of {', '.join(ISEGM_CHOICES)}; got {self.isegm!r}")
        if self.plot_groups < 0:
            raise RunError(f"{{plot_groups}} must be >= 0; got {self.plot_groups}")

    def user_clicks(self, instances: Sequence) -> dict | None:
        """The real first-round clicks of ``clicks_csv`` matched to ``instances`` (None without a CSV).

        Raises:
          RunError: an unreadable CSV, or no click matching any instance.
        """
        if self.clicks_csv is None:
            return None
        from jaxseg_robust.clicksim.user_clicks import first_round_clicks  # noqa: PLC0415

        return matched_first_round(self.clicks_csv, instances, first_round_clicks)

    def load_click_model(self):
        """The click model of ``clickability`` (`jaxseg_robust.clicksim.click_models.load_click_model`).

        Raises:
          RunError: an unknown name, weights not converted, a damaged directory (naming ``{clickability}``).
        """
        from jaxseg_robust.clicksim.click_models import load_click_model  # noqa: PLC0415

        try:
            return load_click_model(self.clickability, random_seed=self.clickability_random_seed)
        except (ValueError, FileNotFoundError, OSError) as error:
            raise RunError(f"{{clickability}} {self.clickability}: {error}") from None
        except (KeyError, TypeError) as error:  # a config.json that does not describe its family
            raise RunError(f"{{clickability}} {self.clickability}: {type(error).__name__}: {error}") from None

    def load_model(self, model: ModelSpec, instances: Sequence, mesh, say: Say) -> RClicksModels:
        """The user clicks (checked before any model is loaded), the segmenter (with the authors' predictor of
        a click-map model) and the click model, in this order."""
        from jaxseg_robust.runner.sharding import replicate  # noqa: PLC0415

        user_clicks = self.user_clicks(instances)
        say(f"loading {model.name} ...")
        loaded, isegm = with_authors_predictor(load_model(model, mesh=mesh), instances, self.isegm, "rclicks",
                                               "RClicks")
        click_model = self.load_click_model()
        click_params = None if click_model.params is None else replicate(click_model.params, mesh)
        return RClicksModels(loaded, isegm, click_model, click_params, user_clicks)

    def evaluation_config(self, models: RClicksModels):
        """The `jaxseg_robust.clicksim.evaluation.RClicksConfig` of the spec on ``models`` (threshold resolved,
        user click slots sized to the largest count of an instance)."""
        from jaxseg_robust.clicksim.evaluation import RClicksConfig, user_slot_count  # noqa: PLC0415

        clicks = models.user_clicks
        slots = user_slot_count(len(points) for points in clicks.values()) if clicks else 0
        return RClicksConfig(num_rounds=self.n_clicks, num_groups=self.groups, run_base=self.run_base,
                             threshold=resolve_threshold(self.thresh, models.model), mask_feedback=self.mask_feedback,
                             seed=self.seed, user_slots=slots)

    def manifest_config(self, models: RClicksModels, settings) -> dict:
        """The run configuration recorded in (and compared on resume with) the manifest; ``model_source`` is
        the model's source as loaded (the converted directory or ``random:<seed>``)."""
        config = {"protocol": self.command, "model": models.model.name, "model_source": models.model.source,
                  "clickability": str(self.clickability), "clickability_source": models.click_model.source,
                  "clicks_csv": None if self.clicks_csv is None else str(pathlib.Path(self.clicks_csv).resolve()),
                  "settings": dataclasses.asdict(settings)}
        if models.isegm is not None:
            config["isegm"] = models.isegm
        return config

    def plan(self, model: RClicksModels, instances, run_dir, say: Say) -> RClicksPlan:
        """The timed RClicks `BatchProgram` (`jaxseg_robust.clicksim.evaluation.make_rclicks_batch_fn`).

        Raises:
          RunError: settings the simulation refuses.
        """
        from jaxseg_robust.clicksim.evaluation import finalize_record, make_rclicks_batch_fn  # noqa: PLC0415
        from jaxseg_robust.data.instances import require_object  # noqa: PLC0415

        try:
            program = make_rclicks_batch_fn(model.model.segmenter, model.model.params, model.click_model.model,
                                            model.click_params, config=self.evaluation_config(model),
                                            user_clicks=model.user_clicks, announce=say).with_timing()
        except ValueError as error:
            raise RunError(str(error)) from None
        return RClicksPlan(instances, program, self.manifest_config(model, program.config), model.model.fingerprint,
                           finalize=finalize_record, check=require_object, click_model=model.click_model,
                           settings=program.config)

    def summarize(self, run_dir, plan: RClicksPlan, say: Say) -> RunTables:
        """The per-dataset benchmark of the run's datasets (`jaxseg_robust.metrics.rclicks_benchmark`) and
        the clicking-groups figures; a figure that fails is a warning (``say``), never hides the table."""
        from jaxseg_robust.metrics.rclicks_benchmark import benchmark_by_dataset  # noqa: PLC0415
        from jaxseg_robust.reports.rclicks import to_csv, to_markdown  # noqa: PLC0415
        from jaxseg_robust.runner.records import read_run_records  # noqa: PLC0415

        datasets = {instance.dataset for instance in plan.instances}
        records = [record for record in read_run_records(run_dir) if record["dataset"] in datasets]
        benchmarks = benchmark_by_dataset(records, threshold=self.target_iou, num_clicks=self.n_clicks)
        figures = ()
        try:
            figures = tuple(plot_groups(plan.instances, plan.click_model, plan.settings.num_groups,
                                        pathlib.Path(run_dir), self.plot_groups))
        except Exception as error:  # noqa: BLE001 - a figure must not hide the run's results
            say(f"warning: clicking-groups figure failed: {type(error).__name__}: {error}")
        return RunTables(to_markdown(benchmarks), to_csv(benchmarks), figures)


def plot_groups(instances: Sequence, click_model, num_groups: int, out_dir: pathlib.Path,
                per_dataset: int) -> list[pathlib.Path]:
    """Fig. 6-style figures of the first-round clicking groups for the first ``per_dataset`` instances of each
    dataset (none with ``num_groups`` 0); instances that do not load are passed over (the run recorded them).

    Args:
      click_model: a `jaxseg_robust.clicksim.click_models.LoadedClickModel`.
      out_dir: where ``groups_<dataset>_<id>.png`` go.

    Returns:
      The paths written.
    """
    from jaxseg_robust.clicksim.click_models import first_round_program  # noqa: PLC0415
    from jaxseg_robust.reports.rclicks import group_index_map, plot_clicking_groups  # noqa: PLC0415
    from jaxseg_robust.reports.report_files import file_stem  # noqa: PLC0415

    paths, seen = [], {}
    for member in instances:
        if seen.get(member.dataset, 0) >= per_dataset or num_groups == 0:
            continue
        try:
            instance = member.load()
        except Exception:  # noqa: BLE001 - the run already recorded this instance as failed
            continue
        seen[member.dataset] = seen.get(member.dataset, 0) + 1
        obj = instance.gt == 1
        region = obj & (instance.gt != -1)
        prepared = click_model.model.prepare(instance.image, obj, obj.shape)
        clickability = np.asarray(first_round_program(click_model.model)(click_model.params, prepared, region))
        name = file_stem(instance.dataset, instance.id)
        paths.append(plot_clicking_groups(
            instance.image, obj, group_index_map(clickability, num_groups), out_dir / f"groups_{name}.png",
            title=f"{instance.dataset}/{instance.id}: first-round clicking groups ({click_model.model.name})"))
    return paths
