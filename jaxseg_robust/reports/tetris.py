"""TETRIS report: per-dataset IoU/BIoU-AuC Min/Max/Δ, baseline AuC and NoC, curves and click plots.

Records (``jaxseg-robust tetris``): one per instance, payload ``{trajectory:
{...}}`` for each trajectory the run computed (``"min"``, ``"max"``,
``"baseline"``; `jaxseg_robust.attacks.clicks.trajectory_outputs` fields:
per-click ``iou``, ``biou``, ``clicks`` (row, col), ``is_positive``, ...) plus
``source`` (`jaxseg_robust.reports.sources`).

Columns (docs/protocols/tetris.md §3.5; `attacks.clicks.trajectory_scores`), per dataset:
  iou_min / iou_max / iou_delta   IoU-AuC@K of the mean curve of the MIN / MAX
                                  run and MAX - MIN (TETRIS Table: K = 10);
  biou_*                          the same for Boundary IoU;
  iou_base / biou_base            AuC@K of the baseline clicker's mean curve;
  noc85 / noc90, nof85 / nof90    RITM's NoC@85/90 (mean clicks to reach the IoU,
                                  max = the baseline's clicks, 20 by default) and
                                  NoF (the ">=20@85/90" column: instances whose
                                  NoC equals the maximum), from the baseline.
K = min(10, clicks of the run). NaN (an empty union outside the ignore band)
propagates into the AuC as in the reference (``np.mean``). With several
datasets a ``mean`` row averages the dataset rows (counts summed). Values
are fractions in the rows / CSV, x100 in Markdown (NoC/NoF as they are).

`write_report` writes ``tetris.md`` / ``tetris.csv``, one mIoU-per-click plot
per dataset (``curves_<dataset>.png``: min / baseline / max), the clicks of
up to ``max_examples`` instances drawn over their image
(``clicks_<dataset>_<id>.png``) and ``report.md`` (tables, plots, failed
instances).
"""

from __future__ import annotations

import dataclasses
import math
import pathlib
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from jaxseg_robust.reports.report_files import (
    failed_lines,
    load_run_records,
    report_folder,
    safe_name,
    write_report_page,
    write_table_files,
)
from jaxseg_robust.reports.tables import (
    DatasetRow,
    csv_text,
    exact_values,
    group_by_dataset,
    markdown_table,
    number,
    with_mean_row,
)

PROTOCOL = "tetris"
TRAJECTORIES = ("min", "baseline", "max")
AUC_CLICKS = 10
NOC_THRESHOLDS = (0.85, 0.9)
ATTACK_COLUMNS = ("iou_min", "iou_max", "iou_delta", "biou_min", "biou_max", "biou_delta")
BASELINE_COLUMNS = ("iou_base", "biou_base", "noc85", "noc90", "nof85", "nof90")
HEADERS = {"iou_min": "IoU-AuC Min", "iou_max": "IoU-AuC Max", "iou_delta": "IoU-AuC Δ",
           "biou_min": "BIoU-AuC Min", "biou_max": "BIoU-AuC Max", "biou_delta": "BIoU-AuC Δ",
           "iou_base": "IoU-AuC Base", "biou_base": "BIoU-AuC Base", "noc85": "NoC@85", "noc90": "NoC@90",
           "nof85": ">=K@85", "nof90": ">=K@90"}
_UNSCALED = {"noc85", "noc90", "nof85", "nof90"}


TetrisRow = DatasetRow  # one dataset's line: name, ok / failed counts, column -> value (fractions; NoC in clicks)


@dataclasses.dataclass(frozen=True)
class TetrisTable:
    """The table of one run.

    Attributes:
      trajectories: which trajectories the records hold (subset of "min", "baseline", "max").
      auc_clicks: K of the AuC columns; noc_clicks: max clicks of NoC/NoF (0 without baseline).
      rows: per dataset, then ``mean`` with several datasets.
    """

    trajectories: tuple[str, ...]
    auc_clicks: int
    noc_clicks: int
    rows: tuple[TetrisRow, ...]

    @property
    def columns(self) -> tuple[str, ...]:
        """The value columns present (CSV order)."""
        columns = []
        for name in ATTACK_COLUMNS:
            part = name.split("_")[1]
            if part in self.trajectories or (part == "delta" and {"min", "max"} <= set(self.trajectories)):
                columns.append(name)
        if "baseline" in self.trajectories:
            columns += BASELINE_COLUMNS
        return tuple(columns)


def _clicks_of(payload: Mapping, trajectory: str) -> int:
    return len(payload[trajectory]["iou"])


def _trajectories(payloads: Sequence[Mapping]) -> tuple[str, ...]:
    if not payloads:
        return ()
    present = [name for name in TRAJECTORIES if all(name in p for p in payloads)]
    if not present:
        raise ValueError("no TETRIS trajectory ('min', 'max', 'baseline') in the ok records")
    return tuple(present)


def _nan_curves(payloads: Sequence[Mapping], trajectory: str) -> list[dict]:
    """The trajectory's ``iou`` / ``biou`` curves with JSON nulls as NaN (`trajectory_scores` input)."""
    return [{metric: [number(v) for v in p[trajectory][metric]] for metric in ("iou", "biou")} for p in payloads]


def _dataset_values(payloads: Sequence[Mapping], trajectories: Sequence[str], auc_clicks: int,
                    noc_clicks: int) -> dict[str, float]:
    from jaxseg_robust.attacks.clicks import trajectory_scores  # noqa: PLC0415

    values: dict[str, float] = {}
    if not payloads:
        return {}
    for trajectory in trajectories:
        parts = _nan_curves(payloads, trajectory)
        scores = trajectory_scores(parts, num_clicks=auc_clicks, noc_thresholds=())
        suffix = "base" if trajectory == "baseline" else trajectory
        values[f"iou_{suffix}"] = scores["iou_auc"]
        values[f"biou_{suffix}"] = scores["biou_auc"]
        if trajectory == "baseline":
            noc = trajectory_scores(parts, num_clicks=noc_clicks, noc_thresholds=NOC_THRESHOLDS)
            for threshold in NOC_THRESHOLDS:
                label = f"{round(100 * threshold)}"
                values[f"noc{label}"] = noc[f"noc@{label}"]
                values[f"nof{label}"] = float(noc[f"nof@{label}"])
    if "min" in trajectories and "max" in trajectories:
        for metric in ("iou", "biou"):
            values[f"{metric}_delta"] = values[f"{metric}_max"] - values[f"{metric}_min"]
    return values


def tetris_table(records: Iterable[Mapping]) -> TetrisTable:
    """The per-dataset table of a TETRIS run (pure).

    Args:
      records: latest record per instance (``dataset``, ``id``, ``status``, ``payload``).

    Returns:
      `TetrisTable` (columns of the trajectories every ok record holds).

    Raises:
      ValueError: ok records without any trajectory, or with fewer than 2 clicks.
    """
    ok, failed = group_by_dataset(records)
    every = [p for payloads in ok.values() for p in payloads]
    trajectories = _trajectories(every)
    clicks = {name: min(_clicks_of(p, name) for p in every) for name in trajectories}
    if clicks and min(clicks.values()) < 2:
        raise ValueError(f"an AuC needs >= 2 clicks; the records hold {min(clicks.values())}")
    auc_clicks = min([AUC_CLICKS, *clicks.values()]) if clicks else AUC_CLICKS
    noc_clicks = clicks.get("baseline", 0)
    table = TetrisTable(trajectories, auc_clicks, noc_clicks, ())
    rows = []
    for dataset in ok:
        values = _dataset_values(ok[dataset], trajectories, auc_clicks, noc_clicks)
        rows.append(TetrisRow(dataset, len(ok[dataset]), failed[dataset],
                              {c: values.get(c, math.nan) for c in table.columns}))
    return dataclasses.replace(table, rows=with_mean_row(rows, table.columns, skip_nan=False))


def _cell(column: str, value: float) -> str:
    if math.isnan(value):
        return "nan"
    return f"{value:.2f}" if column in _UNSCALED else f"{100.0 * value:.2f}"


def _header(column: str, table: TetrisTable) -> str:
    header = HEADERS[column].replace("AuC", f"AuC@{table.auc_clicks}")
    return header.replace(">=K", f">={table.noc_clicks}")


def to_markdown(table: TetrisTable) -> str:
    """Markdown table: dataset, ok, failed, the columns (AuC x100; NoC, NoF as numbers)."""
    headers = ["dataset", "ok", "failed"] + [_header(c, table) for c in table.columns]
    cells = ([row.dataset, str(row.ok), str(row.failed)] + [_cell(c, row.values[c]) for c in table.columns]
             for row in table.rows)
    note = f"\n\nAuC@{table.auc_clicks} x100 (AuC of the mean per-click curve)"
    if "baseline" in table.trajectories:
        note += f"; NoC / NoF over {table.noc_clicks} baseline clicks"
    return markdown_table(headers, cells) + note


def to_csv(table: TetrisTable) -> str:
    """CSV: dataset, ok, failed, auc_clicks, noc_clicks, every column (fractions; repr precision)."""
    return csv_text(["dataset", "ok", "failed", "auc_clicks", "noc_clicks", *table.columns],
                    ([row.dataset, row.ok, row.failed, table.auc_clicks, table.noc_clicks,
                      *exact_values(row, table.columns)] for row in table.rows))


def mean_curves(payloads: Sequence[Mapping], trajectories: Sequence[str], metric: str = "iou") -> dict:
    """trajectory -> float[K] mean per-click curve over the payloads (NaN-skipping per click)."""
    curves = {}
    for trajectory in trajectories:
        rows = [[number(v) for v in p[trajectory][metric]] for p in payloads]
        length = min(len(r) for r in rows)
        stacked = np.array([r[:length] for r in rows], np.float64)
        with np.errstate(invalid="ignore"):
            curves[trajectory] = np.nanmean(stacked, axis=0) if np.isfinite(stacked).any() else stacked[0]
    return curves


def _click_plot(record: Mapping, trajectories: Sequence[str], path: pathlib.Path):
    from jaxseg_robust.reports.figures import plot_prompts  # noqa: PLC0415
    from jaxseg_robust.reports.sources import load_source_image  # noqa: PLC0415

    payload = record["payload"]
    image = load_source_image(payload)
    if image is None:
        return None
    clicks = {}
    for trajectory in trajectories:
        part = payload[trajectory]
        final = part["iou"][-1]
        label = f"{trajectory} (final IoU {100 * final:.1f})" if final is not None else trajectory
        clicks[label] = (np.asarray(part["clicks"], np.float64), np.asarray(part["is_positive"], bool))
    title = f"{record['dataset']}/{record['id']}\nclicks of each trajectory (numbered)"
    return plot_prompts(image, path, clicks=clicks, title=title)


def write_report(run_dir, out_dir=None, *, max_examples: int = 4) -> dict[str, pathlib.Path]:
    """Writes the TETRIS report of a run directory; returns name -> path.

    Args:
      run_dir: a ``jaxseg-robust tetris`` run directory.
      out_dir: output folder (default ``RUN_DIR/report``).
      max_examples: click plots per dataset (instances in record order).
    """
    from jaxseg_robust.reports.figures import plot_curves  # noqa: PLC0415

    records = load_run_records(run_dir)
    out = report_folder(run_dir, out_dir)
    table = tetris_table(records)
    markdown = to_markdown(table)
    paths = write_table_files(out, "tetris", markdown, to_csv(table))
    parts = ["# TETRIS click robustness", "", markdown, ""]
    by_dataset: dict[str, list] = {}
    for record in records:
        if record.get("status") == "ok":
            by_dataset.setdefault(record["dataset"], []).append(record)
    for dataset, ok in by_dataset.items():
        name = safe_name(dataset)
        curves = mean_curves([r["payload"] for r in ok], table.trajectories)
        key = f"curves_{name}"
        paths[key] = plot_curves(curves, out / f"{key}.png", title=f"{dataset}: mIoU per click ({len(ok)} instances)")
        parts += [f"## {dataset}", "", f"![mIoU per click]({paths[key].name})", ""]
        for record in ok[:max_examples]:
            key = f"clicks_{name}_{safe_name(record['id'])}"
            path = _click_plot(record, table.trajectories, out / f"{key}.png")
            if path is not None:
                paths[key] = path
                parts += [f"![{record['id']}]({path.name})", ""]
    return write_report_page(out, parts, records, paths)


__all__ = ["PROTOCOL", "TRAJECTORIES", "TetrisRow", "TetrisTable", "tetris_table", "to_markdown", "to_csv",
           "mean_curves", "safe_name", "failed_lines", "write_report"]
