"""BREPS per-dataset tables from a run directory's records (Markdown and CSV).

`breps_table(records, mode)` is pure: it takes the records of a run (dicts as
`jaxseg_robust.runner.records` writes them: ``dataset``, ``id``, ``status``,
``payload``) and the protocol mode, and returns one `BrepsRow` per dataset
(first-seen order) plus, with several datasets, a ``mean`` row averaging the
dataset rows (the paper also quotes averages over datasets). `to_markdown` /
`to_csv` render it (`jaxseg_robust.reports.tables`); `load_run_records` (kept importable
here, from `jaxseg_robust.reports.report_files`) reads a run directory.

Columns by mode (docs/protocols/breps.md §4.6, §4.8, §4.9), each a dataset mean of
per-instance values, NaNs skipped (an instance whose IoU is undefined, i.e.
an empty union outside the ignore band, is counted in ``undefined``):

  min / max / minmax  iou_tight (IoU-Tight@BBox: the attack's iterate 0, the tight
                      box with multimask + the model's selection, i.e. argmax of the
                      predicted IoUs for SAM), iou_min / iou_max (the best
                      iterate of the MIN / MAX attack), iou_delta = iou_max - iou_min
                      (minmax only); the same for Boundary IoU (biou_*).
  tight               iou_tight / biou_tight: the tight box with single-mask output
                      (the jitter/user scripts' baseline), iou_tight_resized: the
                      reference scripts' IoU at SAM's resized resolution.
  jitter              iou_jitter / biou_jitter / iou_jitter_resized: per instance the
                      mean over its jittered boxes, then the dataset mean.
  user                iou_user / iou_user_std (and the resized-resolution pair): the
                      BREPS notebook's ``mean over images of the per-image mean over
                      users ± mean over images of the per-image std (ddof 1)``.

Values are fractions in [0, 1] in the rows and the CSV; the Markdown table
shows them x100 (the papers' convention). The two tight boxes differ (a
multimask decode can pick another mask than the single-mask output), so the
Markdown headers and the CSV names of the tight columns say how the box was
decoded (`TIGHT_DECODING`): ``IoU-Tight@BBox (multimask + selection)`` /
``iou_tight_multimask`` for the attacks, ``IoU-Tight@BBox (single mask)`` /
``iou_tight_single`` (``iou_tight_single_resized``) for the ``tight`` mode;
the box grid's tight column says the same (`jaxseg_robust.reports.grid`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping

import numpy as np

from jaxseg_robust.reports.report_files import load_run_records
from jaxseg_robust.reports.tables import (
    MEAN_ROW,
    DatasetRow,
    csv_text,
    exact_values,
    group_by_dataset,
    markdown_table,
    nanmean,
    number,
    percent,
    tight_column,
    tight_header,
    with_mean_row,
)

MODES = ("min", "max", "minmax", "tight", "jitter", "user")
_ATTACK = ("min", "max", "minmax")

# column -> Markdown header, per mode (the CSV has every column of MODE_COLUMNS).
HEADERS = {
    "iou_tight": "IoU-Tight@BBox", "iou_min": "IoU-Min@BBox", "iou_max": "IoU-Max@BBox",
    "iou_delta": "IoU-Δ@BBox", "biou_tight": "BIoU-Tight", "biou_min": "BIoU-Min", "biou_max": "BIoU-Max",
    "biou_delta": "BIoU-Δ", "iou_tight_resized": "IoU-Tight (resized)",
    "iou_jitter": "IoU-Jitter", "biou_jitter": "BIoU-Jitter", "iou_jitter_resized": "IoU-Jitter (resized)",
    "iou_user": "IoU-User", "iou_user_std": "± std", "iou_user_resized": "IoU-User (resized)",
    "iou_user_resized_std": "± std (resized)",
}
MODE_COLUMNS = {
    "min": ("iou_tight", "iou_min", "biou_tight", "biou_min"),
    "max": ("iou_tight", "iou_max", "biou_tight", "biou_max"),
    "minmax": ("iou_tight", "iou_min", "iou_max", "iou_delta", "biou_tight", "biou_min", "biou_max",
               "biou_delta"),
    "tight": ("iou_tight", "biou_tight", "iou_tight_resized"),
    "jitter": ("iou_jitter", "biou_jitter", "iou_jitter_resized"),
    "user": ("iou_user", "iou_user_std", "iou_user_resized", "iou_user_resized_std"),
}
# how each mode decodes its tight box (docs/protocols/breps.md §4.6): the attacks' iterate 0 is a multimask decode
# (the model's selection), the fixed-box baseline the single-mask output; headers and CSV names say which
TIGHT_DECODING = {"min": "multimask", "max": "multimask", "minmax": "multimask", "tight": "single"}
# the columns the terminal / Markdown table shows (IoU only, as the BREPS tables)
MARKDOWN_COLUMNS = {
    "min": ("iou_tight", "iou_min"),
    "max": ("iou_tight", "iou_max"),
    "minmax": ("iou_tight", "iou_min", "iou_max", "iou_delta"),
    "tight": ("iou_tight", "iou_tight_resized"),
    "jitter": ("iou_jitter", "iou_jitter_resized"),
    "user": ("iou_user", "iou_user_std", "iou_user_resized"),
}


BrepsRow = DatasetRow  # one dataset's line; ``undefined`` counts the instances left out of its means


@dataclasses.dataclass(frozen=True)
class BrepsTable:
    """The per-dataset table of one run: its mode and rows (datasets, then ``mean`` if several)."""

    mode: str
    rows: tuple[BrepsRow, ...]

    @property
    def columns(self) -> tuple[str, ...]:
        """Value columns of this mode (CSV order)."""
        return MODE_COLUMNS[self.mode]


def _check_mode(mode: str) -> None:
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}; got {mode!r}")


def _list(value) -> np.ndarray:
    return np.array([number(v) for v in (value or [])], np.float64)


def _user_stats(ious: np.ndarray) -> tuple[float, float]:
    """(mean, std ddof=1) of one image's user IoUs, NaNs skipped (pandas semantics)."""
    ious = ious[~np.isnan(ious)]
    mean = float(ious.mean()) if ious.size else math.nan
    std = float(ious.std(ddof=1)) if ious.size >= 2 else math.nan
    return mean, std


def instance_values(payload: Mapping, mode: str) -> dict[str, float]:
    """The per-instance values behind the table's columns (fractions; NaN where undefined).

    Args:
      payload: an ok record's payload as the ``breps`` command writes it.
      mode: the run's mode.

    Returns:
      column -> value for the mode's columns (``*_delta`` excluded: it is a
      difference of dataset means; ``iou_user_std`` is the image's std over users).

    Raises:
      KeyError: the payload lacks a field of the mode (a record of another protocol).
    """
    _check_mode(mode)
    if mode in _ATTACK:
        values = {"iou_tight": number(payload["tight_iou"]), "biou_tight": number(payload["tight_biou"])}
        for attack in ("min", "max"):
            if mode == "minmax":
                part = payload[attack]
            elif mode == attack:
                part = payload
            else:
                continue
            values[f"iou_{attack}"] = number(part["iou"])
            values[f"biou_{attack}"] = number(part["biou"])
        return values
    if mode == "tight":
        return {"iou_tight": number(payload["iou"]), "biou_tight": number(payload["biou"]),
                "iou_tight_resized": number(payload["iou_resized"])}
    if mode == "jitter":
        return {"iou_jitter": number(payload["mean_iou"]), "biou_jitter": number(payload["mean_biou"]),
                "iou_jitter_resized": number(payload["mean_iou_resized"])}
    mean, std = _user_stats(_list(payload["iou"]))
    mean_resized, std_resized = _user_stats(_list(payload["iou_resized"]))
    return {"iou_user": mean, "iou_user_std": std, "iou_user_resized": mean_resized,
            "iou_user_resized_std": std_resized}


def _dataset_row(dataset: str, per_instance: list[Mapping], failed: int, mode: str) -> BrepsRow:
    """A dataset's row from its ok instances' `instance_values`."""
    columns = [c for c in MODE_COLUMNS[mode] if not c.endswith("_delta")]
    std_columns = {"iou_user_std", "iou_user_resized_std"}  # an image with one user has no std: not undefined
    undefined = sum(any(math.isnan(v[c]) for c in columns if c not in std_columns) for v in per_instance)
    values = {c: nanmean([v[c] for v in per_instance]) for c in columns}
    for metric in ("iou", "biou"):
        if f"{metric}_delta" in MODE_COLUMNS[mode]:
            values[f"{metric}_delta"] = values[f"{metric}_max"] - values[f"{metric}_min"]
    return BrepsRow(dataset, len(per_instance), failed, {c: values[c] for c in MODE_COLUMNS[mode]}, undefined)


def breps_table(records: Iterable[Mapping], mode: str) -> BrepsTable:
    """The per-dataset table of a BREPS run (pure).

    Args:
      records: latest record per instance (dicts with ``dataset``, ``status``
        and, when ok, ``payload``); a later record of the same key should
        already have replaced an earlier one (`runner.records.latest_records`).
      mode: "min", "max", "minmax", "tight", "jitter" or "user".

    Returns:
      `BrepsTable`: one row per dataset in first-seen order, then a ``mean``
      row (mean over the dataset rows of each column, NaNs skipped, counts
      summed) when there are several datasets.

    Raises:
      ValueError: unknown mode, or an ok record whose payload lacks a field
        of the mode (naming the record).
    """
    _check_mode(mode)
    ok, failed = group_by_dataset(records, lambda payload: instance_values(payload, mode), f"BREPS {mode!r} run")
    rows = [_dataset_row(name, ok[name], failed[name], mode) for name in ok]
    return BrepsTable(mode, with_mean_row(rows, MODE_COLUMNS[mode]))


def header(column: str, mode: str) -> str:
    """The Markdown header of a column; a tight-box column names its decoding (`TIGHT_DECODING`)."""
    if "tight" in column:
        return tight_header(HEADERS[column], TIGHT_DECODING[mode])
    return HEADERS[column]


def csv_column(column: str, mode: str) -> str:
    """The CSV name of a column; a tight-box column names its decoding (``iou_tight_multimask``)."""
    return tight_column(column, TIGHT_DECODING[mode]) if "tight" in column else column


def to_markdown(table: BrepsTable) -> str:
    """A Markdown table: dataset, ok, failed, the mode's IoU columns x100 (undefined count if any)."""
    columns = MARKDOWN_COLUMNS[table.mode]
    undefined = any(row.undefined for row in table.rows)
    headers = (["dataset", "ok", "failed"] + [header(c, table.mode) for c in columns]
               + (["undefined"] if undefined else []))
    cells = [[row.dataset, str(row.ok), str(row.failed)] + [percent(row.values[c]) for c in columns]
             + ([str(row.undefined)] if undefined else []) for row in table.rows]
    return markdown_table(headers, cells) + f"\n\nIoU x100, mode {table.mode}" + (
        "; undefined = instances with an empty union (NaN), left out of the means" if undefined else "")


def to_csv(table: BrepsTable) -> str:
    """CSV text: dataset, ok, failed, undefined, every column of the mode (`csv_column`) as a fraction (repr
    precision)."""
    return csv_text(["dataset", "ok", "failed", "undefined", *(csv_column(c, table.mode) for c in table.columns)],
                    ([row.dataset, row.ok, row.failed, row.undefined, *exact_values(row, table.columns)]
                     for row in table.rows))


__all__ = ["MODES", "MEAN_ROW", "HEADERS", "MODE_COLUMNS", "TIGHT_DECODING", "BrepsRow", "BrepsTable",
           "instance_values", "breps_table", "header", "csv_column", "to_markdown", "to_csv", "load_run_records"]
