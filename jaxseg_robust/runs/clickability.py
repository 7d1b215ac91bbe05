"""`ClickabilitySpec`: RClicks' clickability evaluation (the paper's Table 3) as a run spec
(docs/protocols/rclicks.md, "Clickability evaluation").

Click models (UD, DT, the RClicks clickability network, any name
`jaxseg_robust.clicksim.click_models.load_click_model` resolves) are compared
with real users' first-round clicks of the clicks CSV: per instance with
clicks, one compiled program computes every model's first-round map
(`jaxseg_robust.clicksim.map_evaluation.ClickMapsProtocol`), and the finalize
scores each map on the host with PL1, KS, WD (bootstrapped), NSS and PDE.

Records: per instance ``full_stem`` (the CSV task), ``click_type`` ("first"),
``clicks_xy`` (the real clicks, (x, y) pixels), ``metrics`` ``{model: {"l1",
"ks2d", "wasserstien", "nss", "pde"}}`` and the image ``source``. The summary
is each metric's mean ± std over the tasks per dataset and model; beside it
the authors' files (`jaxseg_robust.reports.clickability`): ``table3.csv``,
``<dataset>_per_image.csv``, ``<dataset>_mean.csv``, and a figure of every
model's map with the real and sampled clicks for the worst and the best
instances (``clickability_<worst|best>_<dataset>_<id>.png``).
"""

from __future__ import annotations

import dataclasses
import pathlib
from collections.abc import Mapping, Sequence
from typing import ClassVar

import numpy as np

from jaxseg_robust.runs.loading import matched_first_round
from jaxseg_robust.runs.protocol import ProtocolSpec, RunPlan, RunTables, Say
from jaxseg_robust.runs.spec import ModelSpec, RunError

CLICKABILITY_TETRIS_MAX_SIDE = 2048  # pixels, the RClicks cap of the TETRIS dataset (docs/protocols/rclicks.md §1.3)


@dataclasses.dataclass(frozen=True)
class ClickabilityModels:
    """What a clickability run loads before its plan (`ClickabilitySpec.load_model`).

    Attributes:
      names: the click models' names, in the spec's order.
      models: their `jaxseg_robust.clicksim.click_models.LoadedClickModel`s (parameters replicated).
      tasks: ``{(dataset, id): clicksim.user_clicks.FirstRoundTask}`` of the instances with real clicks.
    """

    names: tuple[str, ...]
    models: tuple
    tasks: Mapping


@dataclasses.dataclass(frozen=True)
class ClickabilityPlan(RunPlan):
    """The `RunPlan` of a clickability run with what its figures need (None only for a plan made by hand)."""

    protocol: object = None
    tasks: Mapping | None = None


@dataclasses.dataclass(frozen=True)
class ClickabilitySpec(ProtocolSpec):
    """The clickability evaluation's settings (module docstring; docs/protocols/rclicks.md).

    Attributes:
      clicks_csv: the RClicks clicks CSV (the authors' ``datasets/clicks.csv`` columns).
      models: the click models to compare: ``"ud"``, ``"dt"``, a converted directory or a zoo name
        (``rclicks_clickability``, ...), anything `load_click_model` resolves; distinct.
      random_weights: ``(model, seed)`` pairs: these models get seeded random weights (tests, smoke runs).
      num_sets: bootstrap sets of PL1, KS and WD per task and model (the authors: 100).
      ks_alpha: the KS test's level; a set counts as alike when its p-value exceeds it (0.05).
      seed: the run seed of the bootstrap draws.
      plot_instances: figures of the N worst and the N best instances (mean PL1 over the models; 0: none).
    """

    command: ClassVar[str] = "clickability"
    default_batch_size: ClassVar[int] = 4
    default_tetris_max_side: ClassVar[int | None] = CLICKABILITY_TETRIS_MAX_SIDE

    clicks_csv: str
    models: tuple[str, ...]
    random_weights: tuple[tuple[str, int], ...] = ()
    num_sets: int = 100
    ks_alpha: float = 0.05
    seed: int = 42
    plot_instances: int = 2

    def check(self) -> None:
        """Refuses settings that cannot give a table, before anything is loaded.

        Raises:
          RunError: naming the field (no model, a model twice, seeds for a model not compared, ``num_sets``
            < 1, ``ks_alpha`` outside (0, 1), ``plot_instances`` < 0).
        """
        if not self.models:
            raise RunError("{models}: name at least one click model (ud, dt, rclicks_clickability, a directory)")
        repeated = sorted({name for name in self.models if self.models.count(name) > 1})
        if repeated:
            raise RunError(f"{{models}} names {', '.join(repeated)} more than once")
        stray = [name for name, _ in self.random_weights if name not in self.models]
        if stray:
            raise RunError(f"{{random_weights}} names {', '.join(stray)}, not one of {{models}} "
                           f"({', '.join(self.models)})")
        if self.num_sets < 1:
            raise RunError(f"{{num_sets}} must be >= 1; got {self.num_sets}")
        if not 0.0 < self.ks_alpha < 1.0:
            raise RunError(f"{{ks_alpha}} must be in (0, 1); got {self.ks_alpha}")
        if self.plot_instances < 0:
            raise RunError(f"{{plot_instances}} must be >= 0; got {self.plot_instances}")

    def first_round_tasks(self, instances: Sequence) -> dict:
        """The first-round task (full stem, real clicks) of every instance with clicks in ``clicks_csv``.

        Raises:
          RunError: an unreadable or malformed CSV (the message names its line and column), or no instance
            with clicks.
        """
        from jaxseg_robust.clicksim.user_clicks import first_round_tasks  # noqa: PLC0415

        return matched_first_round(self.clicks_csv, instances, first_round_tasks)

    def load_click_models(self, mesh) -> tuple:
        """Every model of ``models`` (`load_click_model`), parameters replicated over ``mesh``.

        Raises:
          RunError: an unknown name, weights not converted, a damaged directory (naming the model).
        """
        from jaxseg_robust.clicksim.click_models import LoadedClickModel, load_click_model  # noqa: PLC0415
        from jaxseg_robust.runner.sharding import replicate  # noqa: PLC0415

        seeds = dict(self.random_weights)
        loaded = []
        for name in self.models:
            try:
                model = load_click_model(name, random_seed=seeds.get(name))
            except (ValueError, FileNotFoundError, OSError) as error:
                raise RunError(f"{{models}} {name}: {error}") from None
            except (KeyError, TypeError) as error:  # a config.json that does not describe its family
                raise RunError(f"{{models}} {name}: {type(error).__name__}: {error}") from None
            params = None if model.params is None else replicate(model.params, mesh)
            loaded.append(LoadedClickModel(model.model, params, model.source))
        return tuple(loaded)

    def load_model(self, model: ModelSpec | None, instances: Sequence, mesh, say: Say) -> ClickabilityModels:
        """The real clicks (checked before any model is loaded), then the click models; ``model`` (the run
        spec's segmenter, None from the command line) is not used: this protocol runs no segmenter."""
        tasks = self.first_round_tasks(instances)
        say(f"{len(tasks)} of {len(instances)} instances have first-round clicks in {self.clicks_csv}")
        say(f"loading click models {', '.join(self.models)} ...")
        return ClickabilityModels(tuple(self.models), self.load_click_models(mesh), tasks)

    def manifest_config(self, models: ClickabilityModels) -> dict:
        """The run configuration recorded in (and compared on resume with) the manifest."""
        return {"protocol": self.command, "models": list(models.names),
                "model_sources": [loaded.source for loaded in models.models],
                "clicks_csv": str(pathlib.Path(self.clicks_csv).resolve()), "num_sets": self.num_sets,
                "ks_alpha": self.ks_alpha, "seed": self.seed}

    def finalize(self, tasks: Mapping, names: Sequence[str]):
        """The engine's ``finalize``: each model's map scored on the host (`clicksim.map_evaluation.task_metrics`)."""
        from jaxseg_robust.clicksim.map_evaluation import MAPS_KEY, task_key, task_metrics  # noqa: PLC0415
        from jaxseg_robust.reports.sources import with_image_source  # noqa: PLC0415

        def score(instance, outputs) -> dict:
            task = tasks[instance.key]
            height, width = instance.size
            maps = outputs[MAPS_KEY]
            metrics = {name: task_metrics(task_key(self.seed, instance.key, name), maps[index, :height, :width],
                                          task.clicks, instance.gt, num_sets=self.num_sets, alpha=self.ks_alpha)
                       for index, name in enumerate(names)}
            return {"full_stem": task.full_stem, "click_type": "first", "clicks_xy": task.clicks.tolist(),
                    "metrics": metrics}

        return with_image_source(score)

    def plan(self, model: ClickabilityModels, instances, run_dir, say: Say) -> ClickabilityPlan:
        """The clickability maps' `HostDrivenProgram` over the instances with real clicks."""
        from jaxseg_robust.clicksim.map_evaluation import ClickMapsProtocol  # noqa: PLC0415
        from jaxseg_robust.data.instances import require_object  # noqa: PLC0415
        from jaxseg_robust.runner.fingerprints import fingerprint_params  # noqa: PLC0415
        from jaxseg_robust.runner.program import HostDrivenProgram  # noqa: PLC0415

        protocol = ClickMapsProtocol(model.names, model.models)
        chosen = [instance for instance in instances if instance.key in model.tasks]
        fingerprint = fingerprint_params(tuple(loaded.params for loaded in model.models))
        return ClickabilityPlan(chosen, HostDrivenProgram(protocol), self.manifest_config(model), fingerprint,
                                finalize=self.finalize(model.tasks, model.names), check=require_object,
                                protocol=protocol, tasks=model.tasks)

    def summarize(self, run_dir, plan: ClickabilityPlan, say: Say) -> RunTables:
        """The per-dataset table with spreads and the authors' CSVs; the figures of the worst and best
        instances (a figure that fails is a warning, ``say``, never hides the table)."""
        from jaxseg_robust.reports import clickability as tables  # noqa: PLC0415
        from jaxseg_robust.runner.records import latest_records, read_run_records  # noqa: PLC0415

        keys = {instance.key for instance in plan.instances}
        records = [record for key, record in latest_records(read_run_records(run_dir)).items()
                   if key in keys and record.get("status") == "ok"]
        names = tuple(self.models)
        datasets = list(dict.fromkeys(instance.dataset for instance in plan.instances))
        by_dataset, files = tables.write_tables(records, names, run_dir, datasets)
        try:
            files.extend(plot_extremes(records, plan, self, pathlib.Path(run_dir)))
        except Exception as error:  # noqa: BLE001 - a figure must not hide the run's results
            say(f"warning: clickability figure failed: {type(error).__name__}: {error}")
        return RunTables(tables.summary_markdown(by_dataset, names), tables.summary_csv(by_dataset, names),
                         tuple(files))


def plot_extremes(records: Sequence[Mapping], plan: ClickabilityPlan, spec: ClickabilitySpec,
                  out_dir: pathlib.Path) -> list[pathlib.Path]:
    """Figures of the ``spec.plot_instances`` worst and best recorded instances (`reports.clickability.ranked_keys`):
    each model's metric map, the real clicks and as many clicks sampled from the map
    (``clickability_<worst|best>_<dataset>_<id>.png``)."""
    from jaxseg_robust.clicksim.map_evaluation import metric_map, task_key  # noqa: PLC0415
    from jaxseg_robust.metrics.clicks import bootstrap_click_sets  # noqa: PLC0415
    from jaxseg_robust.reports.clickability import plot_clickability, ranked_keys  # noqa: PLC0415
    from jaxseg_robust.reports.report_files import file_stem  # noqa: PLC0415

    count = spec.plot_instances
    ranked = ranked_keys(records, spec.models)
    if count == 0 or not ranked:
        return []
    chosen = [("worst", key) for key in ranked[:count]]
    chosen += [("best", key) for key in ranked[::-1][:count] if key not in ranked[:count]]
    members = {instance.key: instance for instance in plan.instances}
    loaded = [members[key].load() for _, key in chosen]
    all_maps = plan.protocol.maps_of([one.image for one in loaded], [one.gt for one in loaded])
    paths = []
    for (kind, key), instance, instance_maps in zip(chosen, loaded, all_maps):
        clicks = plan.tasks[key].clicks
        maps = {name: metric_map(one) for name, one in zip(spec.models, instance_maps)}
        samples = {name: np.asarray(bootstrap_click_sets(task_key(spec.seed, key, name), maps[name], len(clicks), 1)[0])
                   for name in spec.models}
        path = out_dir / f"clickability_{kind}_{file_stem(instance.dataset, instance.id)}.png"
        paths.append(plot_clickability(path, instance.image, instance.gt, maps, clicks, samples,
                                       title=f"{kind}: {instance.dataset}/{instance.id} ({len(clicks)} real clicks)"))
    return paths
