"""`ClickabilitySpec`: RClicks' clickability evaluation (the paper's Table 3) as a run spec
(docs/protocols/rclicks.md, "Clickability evaluation").

Click models (UD, DT, the saliency baselines, the RClicks clickability network, any name
`jaxseg_robust.clicksim.click_models.load_click_model` resolves) are compared with real users' clicks of
the clicks CSV, task by task (one ``full_stem``: the first round of an instance, or an fn / fp round with
its previous mask from ``prev_masks``; `jaxseg_robust.clicksim.task_instances`): one compiled program
computes every model's map of a batch of tasks (`jaxseg_robust.clicksim.map_evaluation.ClickMapsProtocol`),
and the finalize scores each map on the host with PL1, KS, WD (bootstrapped), NSS and PDE.

Records: per task ``full_stem``, ``click_type`` (first / fn / fp), ``clicks_xy`` (the real clicks, (x, y)
pixels), ``metrics`` ``{model: {"l1", "ks2d", "wasserstien", "nss", "pde"}}`` and the image ``source``.
A first-round task's key is its instance's; an fn / fp task's is ``(dataset, full_stem)``. The summary
is each metric's mean ± std over the tasks per dataset, click type and model; beside it the authors'
files (`jaxseg_robust.reports.clickability`): ``table3.csv``, ``<dataset>_per_image.csv``,
``<dataset>_mean.csv``, and a figure of every model's map with the real and sampled clicks for the worst
and the best tasks (``clickability_<worst|best>_<dataset>_<id>.png``).
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
      tasks: ``{task key: clicksim.user_clicks.ClickTask}`` of the tasks evaluated.
      members: the runner members of those tasks (`clicksim.task_instances.task_members`).
    """

    names: tuple[str, ...]
    models: tuple
    tasks: Mapping
    members: tuple = ()


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
      plot_instances: figures of the N worst and the N best tasks (mean PL1 over the models; 0: none).
      prev_masks: the folder of the fn / fp rounds' previous masks ``<full_stem>.png`` (the authors'
        ``SUBSEC_MASKS/...``); None: first-round tasks only.
      split_file: image stems, one a line (the authors' ``TETRIS_val.txt``): only these images' tasks; each
        stem must name an image of the instances. None: every instance.
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
    prev_masks: str | None = None
    split_file: str | None = None

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

    def split_instances(self, instances: Sequence) -> list:
        """The instances whose image stem ``split_file`` lists (all of them without a split file).

        Raises:
          RunError: naming ``{split_file}``: unreadable, empty, or a stem without an image among the instances.
        """
        from jaxseg_robust.clicksim.clicks_csv import read_split_file  # noqa: PLC0415
        from jaxseg_robust.data.datasets import split_instance_id  # noqa: PLC0415

        if self.split_file is None:
            return list(instances)
        try:
            stems = read_split_file(self.split_file)
        except (OSError, UnicodeDecodeError) as error:
            raise RunError(f"{{split_file}}: cannot read {self.split_file} ({error})") from None
        if not stems:
            raise RunError(f"{{split_file}} {self.split_file}: no image stem in the file")
        present = {split_instance_id(instance.id)[0] for instance in instances}
        missing = [stem for stem in stems if stem not in present]
        if missing:
            raise RunError(f"{{split_file}} {self.split_file}: {len(missing)} of {len(stems)} stems have no image "
                           f"among the instances of the data flags, the first: {missing[0]!r}")
        chosen = set(stems)
        return [instance for instance in instances if split_instance_id(instance.id)[0] in chosen]

    def click_tasks(self, instances: Sequence, say: Say) -> tuple[list, dict]:
        """The runner members of the evaluated tasks and ``{member key: ClickTask}`` (fn / fp rounds only with
        ``prev_masks``; their previous masks checked from the headers).

        Raises:
          RunError: an unreadable or malformed CSV (naming its line and column), no instance with clicks, a
            ``prev_masks`` that is no folder or a previous mask missing, unreadable or of another size (naming
            the file).
        """
        from jaxseg_robust.clicksim.task_instances import task_members  # noqa: PLC0415
        from jaxseg_robust.clicksim.user_clicks import click_tasks  # noqa: PLC0415

        tasks = matched_first_round(self.clicks_csv, self.split_instances(instances), click_tasks)
        if self.prev_masks is not None and not pathlib.Path(self.prev_masks).is_dir():
            raise RunError(f"{{prev_masks}} {self.prev_masks}: not a folder")
        try:
            members, by_key = task_members(instances, tasks, self.prev_masks)
        except ValueError as error:
            raise RunError(f"{{prev_masks}}: {error}") from None
        later = sum(task.click_type != "first" for one in tasks.values() for task in one)
        if self.prev_masks is None and later:
            say(f"{later} fn / fp tasks are not evaluated: no folder of their previous masks (prev_masks, "
                "--prev-masks)")
        if not members:
            raise RunError(f"{{clicks_csv}} {self.clicks_csv}: no first-round task matches the instances; the fn / fp "
                           "tasks need {prev_masks}")
        return members, by_key

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
        """The tasks and their clicks (checked before any model is loaded), then the click models; ``model``
        (the run spec's segmenter, None from the command line) is not used: this protocol runs no segmenter."""
        members, tasks = self.click_tasks(instances, say)
        counts = {kind: sum(task.click_type == kind for task in tasks.values()) for kind in ("first", "fn", "fp")}
        say(f"{len(tasks)} tasks ({counts['first']} first, {counts['fn']} fn, {counts['fp']} fp) of "
            f"{len(instances)} instances in {self.clicks_csv}")
        say(f"loading click models {', '.join(self.models)} ...")
        return ClickabilityModels(tuple(self.models), self.load_click_models(mesh), tasks, tuple(members))

    def manifest_config(self, models: ClickabilityModels) -> dict:
        """The run configuration recorded in (and compared on resume with) the manifest."""
        return {"protocol": self.command, "models": list(models.names),
                "model_sources": [loaded.source for loaded in models.models],
                "clicks_csv": str(pathlib.Path(self.clicks_csv).resolve()), "num_sets": self.num_sets,
                "ks_alpha": self.ks_alpha, "seed": self.seed,
                "prev_masks": None if self.prev_masks is None else str(pathlib.Path(self.prev_masks).resolve()),
                "split_file": None if self.split_file is None else str(pathlib.Path(self.split_file).resolve())}

    def finalize(self, tasks: Mapping, names: Sequence[str]):
        """The engine's ``finalize``: each model's map scored on the host (`clicksim.map_evaluation.task_metrics`),
        and the image ``source`` (`reports.sources.image_source`, its ``gt`` the task's object)."""
        from jaxseg_robust.clicksim.map_evaluation import MAPS_KEY, task_key, task_metrics  # noqa: PLC0415
        from jaxseg_robust.clicksim.task_instances import task_object  # noqa: PLC0415
        from jaxseg_robust.data.coco_rle import encode_mask  # noqa: PLC0415
        from jaxseg_robust.reports.sources import SOURCE_KEY, image_source  # noqa: PLC0415

        def score(instance, outputs) -> dict:
            task = tasks[instance.key]
            height, width = instance.size
            maps = outputs[MAPS_KEY]
            object_mask = task_object(instance.gt)
            metrics = {name: task_metrics(task_key(self.seed, instance.key, name), maps[index, :height, :width],
                                          task.clicks, object_mask, num_sets=self.num_sets, alpha=self.ks_alpha)
                       for index, name in enumerate(names)}
            source = {**image_source(instance), "gt": encode_mask(object_mask)}  # the object, not the task labels
            return {"full_stem": task.full_stem, "click_type": task.click_type, "clicks_xy": task.clicks.tolist(),
                    "metrics": metrics, SOURCE_KEY: source}

        return score

    def plan(self, model: ClickabilityModels, instances, run_dir, say: Say) -> ClickabilityPlan:
        """The clickability maps' `HostDrivenProgram` over the tasks (``model.members``)."""
        from jaxseg_robust.clicksim.map_evaluation import ClickMapsProtocol  # noqa: PLC0415
        from jaxseg_robust.clicksim.task_instances import require_task_masks  # noqa: PLC0415
        from jaxseg_robust.runner.fingerprints import fingerprint_params  # noqa: PLC0415
        from jaxseg_robust.runner.program import HostDrivenProgram  # noqa: PLC0415

        protocol = ClickMapsProtocol(model.names, model.models)
        fingerprint = fingerprint_params(tuple(loaded.params for loaded in model.models))
        return ClickabilityPlan(list(model.members), HostDrivenProgram(protocol), self.manifest_config(model),
                                fingerprint, finalize=self.finalize(model.tasks, model.names),
                                check=require_task_masks, protocol=protocol, tasks=model.tasks)

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
    """Figures of the ``spec.plot_instances`` worst and best recorded tasks (`reports.clickability.ranked_keys`):
    each model's metric map, the object's outline, the real clicks and as many clicks sampled from the map
    (``clickability_<worst|best>_<dataset>_<id>.png``)."""
    from jaxseg_robust.clicksim.map_evaluation import metric_map, task_key  # noqa: PLC0415
    from jaxseg_robust.clicksim.task_instances import task_object  # noqa: PLC0415
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
        click_type = plan.tasks[key].click_type
        paths.append(plot_clickability(path, instance.image, task_object(instance.gt).astype(np.int8), maps, clicks,
                                       samples, title=f"{kind}: {instance.dataset}/{instance.id} ({click_type}, "
                                                      f"{len(clicks)} real clicks)"))
    return paths
