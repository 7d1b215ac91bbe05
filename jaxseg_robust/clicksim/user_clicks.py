"""Real clicks of benchmark instances, from the clicks CSV: the first round (the ``User`` mode, §5.1) and every
task of an instance (first, fn and fp rounds: `click_tasks`, the clickability evaluation).

Reference: docs/protocols/rclicks.md §1.1-§1.3 (schema, tasks, size cap), §5.1 (``User``:
every real first-round click of the instance, both devices, CSV order), §6.2
(instances without clicks are skipped).

An instance ``(dataset, id)`` of the RITM-style loaders has id ``"<image stem>"``
or ``"<image stem>#<object code>"`` (`data.datasets.split_instance_id`). Its
rows (first-round rows: those with ``click_type == "first"``) have the CSV dataset name
of the instance's dataset, its image stem, and ``object_stem == str(code)``; an
instance without code, or the only instance of its image, also matches rows
with an empty ``object_stem`` (the CSV's object is then the union of the
image's labelled pixels, which is that instance).

Coordinates: ``x <- clip(x, 0, w - 1)``, ``y <- clip(y, 0, h - 1)`` with the row's
CSV size; when the CSV frame differs from the instance's size (e.g. TETRIS
capped at 2048 px) the clicks are rescaled ``x <- floor(x W / w)``,
``y <- floor(y H / h)`` (§1.2 step 3).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from typing import NamedTuple

import numpy as np

from jaxseg_robust.clicksim.clicks_csv import ClicksTable
from jaxseg_robust.data.datasets import normalize_name, split_instance_id

__all__ = ["CSV_DATASET_NAMES", "ClickTask", "FirstRoundTask", "click_tasks", "csv_dataset_name", "first_round_clicks",
           "first_round_tasks"]

# Canonical dataset names of `data.datasets` -> the CSV's ``dataset`` values (§1.1).
CSV_DATASET_NAMES = {"grabcut": "GrabCut", "berkeley": "Berkeley", "davis": "DAVIS", "cocomval": "COCO",
                     "coco": "COCO", "tetris": "TETRIS"}


def csv_dataset_name(dataset: str, table: ClicksTable, overrides: Mapping[str, str] | None = None) -> str | None:
    """The CSV ``dataset`` value of an instance dataset name, or None when the CSV has none.

    Args:
      dataset: instance dataset name (``"grabcut"``, ``"coco_mval"``, a folder name ...).
      table: the clicks table (its ``dataset`` values are searched case-insensitively).
      overrides: optional ``{instance dataset name: CSV dataset value}``.
    """
    if overrides and dataset in overrides:
        return overrides[dataset]
    present = {normalize_name(name): str(name) for name in np.unique(table.dataset)}
    wanted = normalize_name(dataset)
    canonical = CSV_DATASET_NAMES.get(wanted)
    if canonical is not None and normalize_name(canonical) in present:
        return present[normalize_name(canonical)]
    return present.get(wanted)


def _scaled(values: np.ndarray, csv_size: np.ndarray, size: int) -> np.ndarray:
    clipped = np.clip(values, 0, csv_size - 1)
    return np.where(csv_size == size, clipped, np.floor(clipped * size / csv_size)).astype(np.int64)


class FirstRoundTask(NamedTuple):
    """The real first-round clicks of one instance and the CSV task they form (§1.2).

    Attributes:
      full_stem: the CSV's ``full_stem`` of the task (the task key of the authors' per-image CSVs).
      clicks: int64[n, 2] (x, y) pixels in the instance's frame, n >= 1, CSV order.
    """

    full_stem: str
    clicks: np.ndarray


def _matched_rows(table: ClicksTable, instances: Iterable,
                  dataset_names: Mapping[str, str] | None) -> Iterator[tuple[object, np.ndarray]]:
    """``(instance, int rows of table)`` of every instance with rows: the CSV dataset name of its dataset, its
    image stem and ``object_stem == str(code)`` (the only instance of its image also matches ``''``)."""
    instances = list(instances)
    per_image = Counter((i.dataset, split_instance_id(i.id)[0]) for i in instances)
    index: dict[tuple[str, str, str], list] = {}
    for row_index, key in enumerate(zip(table.dataset, table.image_stem, table.object_stem)):
        index.setdefault(tuple(str(k) for k in key), []).append(row_index)
    for instance in instances:
        csv_name = csv_dataset_name(instance.dataset, table, dataset_names)
        if csv_name is None:
            continue
        stem, code = split_instance_id(instance.id)
        rows = list(index.get((csv_name, stem, "" if code is None else str(code)), []))
        if code is not None and not rows and per_image[(instance.dataset, stem)] == 1:
            rows = list(index.get((csv_name, stem, ""), []))
        if rows:
            yield instance, np.asarray(rows)


def _clicks_xy(table: ClicksTable, rows: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """int64[n, 2] (x, y) of ``rows`` clipped to their CSV frame and rescaled to ``size`` (H, W)."""
    height, width = size
    xs = _scaled(table.x[rows], table.w[rows], width)
    ys = _scaled(table.y[rows], table.h[rows], height)
    return np.stack([xs, ys], axis=1)


def first_round_tasks(table: ClicksTable, instances: Iterable, *,
                      dataset_names: Mapping[str, str] | None = None) -> dict[tuple[str, str], FirstRoundTask]:
    """The first-round task of every instance with real clicks (both devices, CSV order).

    Args:
      table: the clicks table (`clicksim.clicks_csv.read_clicks_csv`).
      instances: `Instance`s or `InstanceRef`s (only ``key``, ``dataset``, ``id`` and ``size`` are read).
      dataset_names: optional overrides ``{instance dataset: CSV dataset value}``.
    Returns:
      ``{(dataset, id): FirstRoundTask}`` for every instance with n >= 1 clicks (instances without
      clicks are absent, as the reference skips them).
    """
    first = table.filter(click_type="first")
    return {instance.key: FirstRoundTask(str(first.full_stem[rows[0]]), _clicks_xy(first, rows, instance.size))
            for instance, rows in _matched_rows(first, instances, dataset_names)}


class ClickTask(NamedTuple):
    """One task of the clicks CSV matched to an instance: a round, its previous mask and its real clicks (§1.2).

    Attributes:
      full_stem: the task key (the name of its previous mask ``<full_stem>.png`` for fn / fp tasks).
      click_type: ``"first"``, ``"fn"`` or ``"fp"``.
      clicks: int64[n, 2] (x, y) pixels in the instance's frame, n >= 1, CSV order, both devices.
    """

    full_stem: str
    click_type: str
    clicks: np.ndarray


def click_tasks(table: ClicksTable, instances: Iterable, *,
                dataset_names: Mapping[str, str] | None = None) -> dict[tuple[str, str], tuple[ClickTask, ...]]:
    """Every task of every instance with real clicks: first-round, fn and fp (the authors' evaluation of the
    click models reads every ``full_stem`` of a dataset).

    Args:
      table: the clicks table; instances, dataset_names: as `first_round_tasks`.
    Returns:
      ``{(dataset, id): (ClickTask, ...)}``, an instance's tasks in the CSV's order of first appearance.
    """
    out = {}
    for instance, rows in _matched_rows(table, instances, dataset_names):
        stems = table.full_stem[rows]
        tasks = []
        for stem in dict.fromkeys(stems.tolist()):
            mine = rows[stems == stem]
            tasks.append(ClickTask(str(stem), str(table.click_type[mine[0]]), _clicks_xy(table, mine, instance.size)))
        out[instance.key] = tuple(tasks)
    return out


def first_round_clicks(table: ClicksTable, instances: Iterable, *,
                       dataset_names: Mapping[str, str] | None = None) -> dict[tuple[str, str], np.ndarray]:
    """Real first-round clicks per instance (both devices, CSV order): the clicks of `first_round_tasks`.

    Returns:
      ``{(dataset, id): int64[n, 2] (x, y)}`` for every instance with n >= 1 clicks.
    """
    tasks = first_round_tasks(table, instances, dataset_names=dataset_names)
    return {key: task.clicks for key, task in tasks.items()}
