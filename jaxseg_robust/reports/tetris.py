"""TETRIS report: per-dataset IoU/BIoU-AuC Min/Max/Δ, baseline AuC and NoC, curves and click plots.

Records (``jaxseg-robust tetris``): one per instance, payload ``{trajectory:
{...}}`` for each trajectory the run computed (``"min"``, ``"max"``,
``"baseline"``; `jaxseg_robust.attacks.clicks.trajectory_outputs` fields:
per-click ``iou``, ``biou``, ``clicks_xy`` (x, y), ``is_positive``, ...) plus
``source`` (`jaxseg_robust.reports.sources`).

Columns (docs/protocols/tetris.md §3.5; `reports.tetris_scores.trajectory_scores`), per dataset:
  iou_min / iou_max / iou_delta   IoU-AuC@K of the mean curve of the MIN / MAX
                                  run and MAX - MIN (TETRIS Table: K = 10);
  biou_*                          the same for Boundary IoU;
  iou_base / biou_base            AuC@K of the baseline clicker's mean curve;
  noc80 / noc85 / noc90,          RITM's NoC@80/85/90 (mean clicks to reach the IoU,
  nof85 / nof90                   max = the baseline's clicks, 20 by default) and
                                  NoF (the ">=20@85/90" column: instances whose
                                  NoC equals the maximum), from the baseline;
                                  a ``target_iou`` T (``--target-iou``) not among
                                  them adds noc<T> / nof<T> (e.g. noc95, nof95);
  sec_instance / sec_click        device seconds of the jitted protocol per
                                  instance and per click (RITM's SPC: total seconds
                                  / total clicks of all trajectories): the batch's
                                  device time until its outputs are ready, divided
                                  over its instances (the timings' ``seconds``,
                                  `jaxseg_robust.reports.artifacts`; host
                                  preparation and compile time excluded: the
                                  wall time is in the seconds table every
                                  protocol's summary adds); only when recorded.
K = min(10, clicks of the run). NaN (an empty union outside the ignore band)
propagates into the AuC as in the reference (``np.mean``). With several
datasets a ``mean`` row averages the dataset rows (counts summed). Values
are fractions in the rows / CSV, x100 in Markdown (NoC/NoF/seconds as they are).
The Markdown headers say ``AuC@K`` and the CSV names the AuC columns with
their K (``iou_min@10``, `csv_column`), so they never share a name with a
record's per-instance ``auc_iou@K`` over a trajectory's own clicks.

`write_report` writes ``tetris.md`` / ``tetris.csv``, ``ious.csv`` (IoU and
BIoU per instance, trajectory and click: `click_rows`), one mIoU-per-click
plot per dataset (``curves_<dataset>.png``: min / baseline / max), the clicks
of the instances ``--plot-instances`` picks (default the worst 4 per dataset
by `tetris_hardness`) drawn over their image with the GT outline
(``clicks_<dataset>_<id>.png``), their final predicted masks when the run
directory holds them (``masks_<dataset>_<id>.png``: one panel per trajectory)
and ``report.md`` (tables, plots, failed instances).
"""

from __future__ import annotations

import dataclasses
import math
import pathlib
from collections.abc import Iterable, Iterator, Mapping, Sequence

import numpy as np

from jaxseg_robust.reports.report_files import (
    failed_lines,
    file_stem,
    load_run_records,
    report_folder,
    safe_name,
    write_report_page,
    write_table_files,
)
from jaxseg_robust.reports.tables import (
    DatasetRow,
    click_csv_text,
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
NOC_THRESHOLDS = (0.8, 0.85, 0.9)  # RITM's NoC@80/85/90
NOF_THRESHOLDS = (0.85, 0.9)  # RITM's >=20@85/90
CLICK_CSV = "ious.csv"
ATTACK_COLUMNS = ("iou_min", "iou_max", "iou_delta", "biou_min", "biou_max", "biou_delta")
BASE_COLUMNS = ("iou_base", "biou_base")
TIMING_COLUMNS = ("sec_instance", "sec_click")
HEADERS = {"iou_min": "IoU-AuC Min", "iou_max": "IoU-AuC Max", "iou_delta": "IoU-AuC Δ",
           "biou_min": "BIoU-AuC Min", "biou_max": "BIoU-AuC Max", "biou_delta": "BIoU-AuC Δ",
           "iou_base": "IoU-AuC Base", "biou_base": "BIoU-AuC Base", "sec_instance": "device s/instance",
           "sec_click": "device s/click"}


def threshold_label(threshold: float) -> str:
    """``0.85 -> "85"``, ``0.925 -> "92.5"`` (percent, no trailing zeros)."""
    return f"{100.0 * float(threshold):.4f}".rstrip("0").rstrip(".")


def _column_label(threshold: float) -> str:
    return threshold_label(threshold).replace(".", "_")


def _header_of(column: str) -> str:
    if column in HEADERS:
        return HEADERS[column]
    kind, label = column[:3], column[3:].replace("_", ".")
    return f"NoC@{label}" if kind == "noc" else f">=K@{label}"


def _unscaled(column: str) -> bool:
    return column.startswith(("noc", "nof", "sec_"))


TetrisRow = DatasetRow  # one dataset's line: name, ok / failed counts, column -> value (fractions; NoC in clicks)


@dataclasses.dataclass(frozen=True)
class TetrisTable:
    """The table of one run.

    Attributes:
      trajectories: which trajectories the records hold (subset of "min", "baseline", "max").
      auc_clicks: K of the AuC columns; noc_clicks: max clicks of NoC/NoF (0 without baseline).
      rows: per dataset, then ``mean`` with several datasets.
      noc_thresholds / nof_thresholds: IoU targets of the NoC / NoF columns (80/85/90 and 85/90,
        plus ``target_iou`` when given and not among them).
      timed: the seconds columns are present (some ok record has a timing).
    """

    trajectories: tuple[str, ...]
    auc_clicks: int
    noc_clicks: int
    rows: tuple[TetrisRow, ...]
    noc_thresholds: tuple[float, ...] = NOC_THRESHOLDS
    nof_thresholds: tuple[float, ...] = NOF_THRESHOLDS
    timed: bool = False

    @property
    def columns(self) -> tuple[str, ...]:
        """The value columns present (CSV order)."""
        columns = []
        for name in ATTACK_COLUMNS:
            part = name.split("_")[1]
            if part in self.trajectories or (part == "delta" and {"min", "max"} <= set(self.trajectories)):
                columns.append(name)
        if "baseline" in self.trajectories:
            columns += BASE_COLUMNS
            columns += [f"noc{_column_label(t)}" for t in self.noc_thresholds]
            columns += [f"nof{_column_label(t)}" for t in self.nof_thresholds]
        if self.timed:
            columns += TIMING_COLUMNS
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
                    noc_clicks: int, noc_thresholds: Sequence[float] = NOC_THRESHOLDS,
                    nof_thresholds: Sequence[float] = NOF_THRESHOLDS) -> dict[str, float]:
    from jaxseg_robust.reports.tetris_scores import trajectory_scores  # noqa: PLC0415

    values: dict[str, float] = {}
    if not payloads:
        return {}
    for trajectory in trajectories:
        parts = _nan_curves(payloads, trajectory)
        scores = trajectory_scores(parts, num_clicks=auc_clicks, noc_thresholds=())
        suffix = "base" if trajectory == "baseline" else trajectory
        values[f"iou_{suffix}"] = scores[f"auc_iou@{auc_clicks}"]
        values[f"biou_{suffix}"] = scores[f"auc_biou@{auc_clicks}"]
        if trajectory == "baseline":
            for threshold in dict.fromkeys((*noc_thresholds, *nof_thresholds)):
                noc = trajectory_scores(parts, num_clicks=noc_clicks, noc_thresholds=(threshold,))
                label, key = _column_label(threshold), f"{round(100 * threshold)}"
                if threshold in noc_thresholds:
                    values[f"noc{label}"] = noc[f"noc@{key}"]
                if threshold in nof_thresholds:
                    values[f"nof{label}"] = float(noc[f"nof@{key}"])
    if "min" in trajectories and "max" in trajectories:
        for metric in ("iou", "biou"):
            values[f"{metric}_delta"] = values[f"{metric}_max"] - values[f"{metric}_min"]
    return values


def table_thresholds(target_iou: float | None) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(NoC thresholds, NoF thresholds): RITM's 80/85/90 and 85/90, plus ``target_iou`` when not among them."""
    if target_iou is not None and not 0.0 < target_iou <= 1.0:
        raise ValueError(f"target_iou must be in (0, 1]; got {target_iou}")
    if target_iou is None or threshold_label(target_iou) in {threshold_label(t) for t in NOC_THRESHOLDS}:
        return NOC_THRESHOLDS, NOF_THRESHOLDS
    return (*NOC_THRESHOLDS, float(target_iou)), (*NOF_THRESHOLDS, float(target_iou))


def _timing_values(records: Sequence[Mapping], timings: Mapping) -> dict[str, float]:
    """sec_instance (mean device seconds of the timed ok records) and sec_click (their seconds / their clicks)."""
    entries = [timings[(r["dataset"], r["id"])] for r in records if (r["dataset"], r["id"]) in timings]
    if not entries:
        return {"sec_instance": math.nan, "sec_click": math.nan}
    seconds = sum(float(e["seconds"]) for e in entries)
    clicks = sum(int(e.get("clicks", 0)) for e in entries)
    return {"sec_instance": seconds / len(entries), "sec_click": seconds / clicks if clicks else math.nan}


def tetris_table(records: Iterable[Mapping], *, target_iou: float | None = None,
                 timings: Mapping | None = None) -> TetrisTable:
    """The per-dataset table of a TETRIS run (pure).

    Args:
      records: latest record per instance (``dataset``, ``id``, ``status``, ``payload``).
      target_iou: RITM's ``--target-iou``: adds NoC / NoF at that IoU (None: 80/85/90 only).
      timings: (dataset, id) -> timing entry (`jaxseg_robust.reports.artifacts.read_timings`);
        the seconds columns appear when any ok record has one.

    Returns:
      `TetrisTable` (columns of the trajectories every ok record holds).

    Raises:
      ValueError: ok records without any trajectory, or with fewer than 2 clicks; a target outside (0, 1].
    """
    records = list(records)
    timings = timings or {}
    noc_thresholds, nof_thresholds = table_thresholds(target_iou)
    ok_records: dict[str, list] = {}
    for record in records:
        if record.get("status") == "ok":
            ok_records.setdefault(str(record.get("dataset", "")), []).append(record)
    timed = any((r["dataset"], r["id"]) in timings for rs in ok_records.values() for r in rs)
    ok, failed = group_by_dataset(records)
    every = [p for payloads in ok.values() for p in payloads]
    trajectories = _trajectories(every)
    clicks = {name: min(_clicks_of(p, name) for p in every) for name in trajectories}
    if clicks and min(clicks.values()) < 2:
        raise ValueError(f"an AuC needs >= 2 clicks; the records hold {min(clicks.values())}")
    auc_clicks = min([AUC_CLICKS, *clicks.values()]) if clicks else AUC_CLICKS
    noc_clicks = clicks.get("baseline", 0)
    table = TetrisTable(trajectories, auc_clicks, noc_clicks, (), noc_thresholds, nof_thresholds, timed)
    rows = []
    for dataset in ok:
        values = _dataset_values(ok[dataset], trajectories, auc_clicks, noc_clicks, noc_thresholds, nof_thresholds)
        if timed:
            values.update(_timing_values(ok_records.get(dataset, []), timings))
        rows.append(TetrisRow(dataset, len(ok[dataset]), failed[dataset],
                              {c: values.get(c, math.nan) for c in table.columns}))
    return dataclasses.replace(table, rows=with_mean_row(rows, table.columns, skip_nan=False))


def _cell(column: str, value: float) -> str:
    if math.isnan(value):
        return "nan"
    if column.startswith("sec_"):
        return f"{value:.3g}"
    return f"{value:.2f}" if _unscaled(column) else f"{100.0 * value:.2f}"


def _header(column: str, table: TetrisTable) -> str:
    header = _header_of(column).replace("AuC", f"AuC@{table.auc_clicks}")
    return header.replace(">=K", f">={table.noc_clicks}")


def to_markdown(table: TetrisTable) -> str:
    """Markdown table: dataset, ok, failed, the columns (AuC x100; NoC, NoF as numbers)."""
    headers = ["dataset", "ok", "failed"] + [_header(c, table) for c in table.columns]
    cells = ([row.dataset, str(row.ok), str(row.failed)] + [_cell(c, row.values[c]) for c in table.columns]
             for row in table.rows)
    note = f"\n\nAuC@{table.auc_clicks} x100 (AuC of the mean per-click curve)"
    if "baseline" in table.trajectories:
        note += f"; NoC / NoF over {table.noc_clicks} baseline clicks (no early stop)"
    if table.timed:
        note += ("; device seconds of the jitted protocol per instance and per click (all trajectories' clicks), "
                 "host preparation and compile time excluded")
    return markdown_table(headers, cells) + note


def csv_column(column: str, table: TetrisTable) -> str:
    """The CSV name of a table column: the AuC columns name their K (``iou_min@10``, ``biou_base@10``)."""
    return f"{column}@{table.auc_clicks}" if column in (*ATTACK_COLUMNS, *BASE_COLUMNS) else column


def to_csv(table: TetrisTable) -> str:
    """CSV: dataset, ok, failed, auc_clicks, noc_clicks, every column (`csv_column`; fractions; repr precision)."""
    return csv_text(["dataset", "ok", "failed", "auc_clicks", "noc_clicks",
                     *(csv_column(c, table) for c in table.columns)],
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


def click_rows(records: Iterable[Mapping]) -> Iterator[tuple]:
    """``(dataset, id, trajectory, click, x, y, label, iou, biou)`` per ok record, trajectory (min, baseline,
    max) and click.

    Clicks are numbered from 1; ``x, y`` from ``clicks_xy`` (original-image pixels), ``label`` 1 / 0 from
    ``is_positive``; IoU / BIoU as recorded (None: undefined).
    """
    for record in records:
        if record.get("status") != "ok":
            continue
        payload = record.get("payload") or {}
        for trajectory in TRAJECTORIES:
            part = payload.get(trajectory)
            if not isinstance(part, Mapping) or "iou" not in part:
                continue
            bious = part.get("biou") or [None] * len(part["iou"])
            clicks = zip(part["clicks_xy"], part["is_positive"])
            for click, (iou, biou, ((x, y), positive)) in enumerate(zip(part["iou"], bious, clicks), start=1):
                yield record["dataset"], record["id"], trajectory, click, x, y, int(bool(positive)), iou, biou


def write_click_csv(path, records: Iterable[Mapping]) -> pathlib.Path:
    """Writes `click_rows` as CSV (`jaxseg_robust.reports.tables.click_csv_text`); returns the path."""
    path = pathlib.Path(path)
    path.write_text(click_csv_text(click_rows(records)), encoding="utf-8")
    return path


def _final_label(part: Mapping, trajectory: str) -> str:
    final = part["iou"][-1] if part.get("iou") else None
    return f"{trajectory} (final IoU {100 * final:.1f})" if final is not None else trajectory


def _mask_plot(run_dir, record: Mapping, image, gt, trajectories: Sequence[str], path: pathlib.Path):
    """One panel per trajectory: its final predicted mask, its clicks and the GT outline; None without masks."""
    from jaxseg_robust.reports.artifacts import read_mask  # noqa: PLC0415
    from jaxseg_robust.reports.figures import record_clicks_xy  # noqa: PLC0415
    from jaxseg_robust.reports.mask_plots import MaskPanel, plot_mask_panels  # noqa: PLC0415

    key = (record["dataset"], record["id"])
    panels = []
    for trajectory in trajectories:
        mask = read_mask(run_dir, key, trajectory, image.shape[:2])
        if mask is None:
            continue
        part = record["payload"][trajectory]
        panels.append(MaskPanel(_final_label(part, trajectory), mask, trajectory, *record_clicks_xy(part)))
    if not panels:
        return None
    title = f"{record['dataset']}/{record['id']}: predicted mask after the last click"
    return plot_mask_panels(image, panels, path, gt=gt, title=title)


def click_figure(record: Mapping, trajectories: Sequence[str], image, gt=None):
    """The clicks of each trajectory (numbered, `figures.record_clicks_xy`) over the image with the GT outline."""
    from jaxseg_robust.reports.figures import prompts_figure, record_clicks_xy  # noqa: PLC0415

    clicks = {_final_label(record["payload"][t], t): record_clicks_xy(record["payload"][t]) for t in trajectories}
    title = f"{record['dataset']}/{record['id']}\nclicks of each trajectory (numbered)"
    return prompts_figure(image, clicks=clicks, gt=gt, title=title)


def tetris_hardness(record: Mapping, auc_clicks: int = AUC_CLICKS) -> float:
    """A record's score for ``--plot-instances worst``: IoU-AuC@K of its MIN trajectory (lower = worse).

    Without MIN, the first recorded trajectory of baseline / max; NaN when none
    (`jaxseg_robust.reports.plot_selection`).
    """
    from jaxseg_robust.reports.tetris_scores import trajectory_scores  # noqa: PLC0415

    payload = record.get("payload") or {}
    for trajectory in ("min", "baseline", "max"):
        if isinstance(payload.get(trajectory), Mapping) and payload[trajectory].get("iou"):
            curves = _nan_curves([payload], trajectory)
            clicks = min(auc_clicks, len(curves[0]["iou"]))
            return float(trajectory_scores(curves, num_clicks=clicks, noc_thresholds=())[f"auc_iou@{clicks}"])
    return math.nan


def recorded_target_iou(run_dir) -> float | None:
    """The ``--target-iou`` recorded in a run directory's manifest (None when not given)."""
    from jaxseg_robust.runner.rundir import read_manifest  # noqa: PLC0415

    try:
        value = (read_manifest(run_dir).get("config") or {}).get("target_iou")
    except (OSError, ValueError):
        return None
    return None if value is None else float(value)


def _instance_figures(run_dir, record: Mapping, trajectories: Sequence[str], out: pathlib.Path) -> dict:
    """name -> path of one instance's click figure and mask figure; {} when its image is gone."""
    from jaxseg_robust.reports.figures import save_figure  # noqa: PLC0415
    from jaxseg_robust.reports.sources import load_source_gt, load_source_image  # noqa: PLC0415

    image = load_source_image(record["payload"])
    if image is None:
        return {}
    gt = load_source_gt(record["payload"])
    stem = file_stem(record["dataset"], record["id"])
    paths = {f"clicks_{stem}": save_figure(click_figure(record, trajectories, image, gt), out / f"clicks_{stem}.png")}
    masks = _mask_plot(run_dir, record, image, gt, trajectories, out / f"masks_{stem}.png")
    if masks is not None:
        paths[f"masks_{stem}"] = masks
    return paths


def write_report(run_dir, out_dir=None, *, plot_instances=None) -> dict[str, pathlib.Path]:
    """Writes the TETRIS report of a run directory; returns name -> path.

    Args:
      run_dir: a ``jaxseg-robust tetris`` run directory.
      out_dir: output folder (default ``RUN_DIR/report``).
      plot_instances: `jaxseg_robust.reports.plot_selection.PlotInstances`: the instances per dataset
        whose clicks and masks are drawn (default worst 4 by `tetris_hardness`).
    """
    from jaxseg_robust.reports.artifacts import read_timings  # noqa: PLC0415
    from jaxseg_robust.reports.figures import figure_links, plot_curves  # noqa: PLC0415
    from jaxseg_robust.reports.plot_selection import DEFAULT_PLOT_INSTANCES, instances_to_plot  # noqa: PLC0415

    choice = plot_instances or DEFAULT_PLOT_INSTANCES
    records = load_run_records(run_dir)
    out = report_folder(run_dir, out_dir)
    table = tetris_table(records, target_iou=recorded_target_iou(run_dir), timings=read_timings(run_dir))
    markdown = to_markdown(table)
    paths = write_table_files(out, "tetris", markdown, to_csv(table))
    paths["ious_csv"] = write_click_csv(out / CLICK_CSV, records)
    parts = ["# TETRIS click robustness", "", markdown, ""]
    by_dataset: dict[str, list] = {r["dataset"]: [] for r in records if r.get("status") == "ok"}  # record order
    for record in instances_to_plot(records, choice, lambda r: tetris_hardness(r, table.auc_clicks)):
        by_dataset[record["dataset"]].append(record)
    for dataset, ok in by_dataset.items():
        key = f"curves_{safe_name(dataset)}"
        curves = mean_curves([r["payload"] for r in ok], table.trajectories)
        paths[key] = plot_curves(curves, out / f"{key}.png", title=f"{dataset}: mIoU per click ({len(ok)} instances)")
        parts += [f"## {dataset}", "", f"![mIoU per click]({paths[key].name})", "",
                  f"Instances drawn: {choice} (TETRIS: the lowest IoU-AuC@{table.auc_clicks} of MIN first)"
                  if choice.mode == "worst" else f"Instances drawn: {choice} (record order)", ""]
        drawn = 0
        for record in ok:
            if drawn >= choice.count:
                break
            figures = _instance_figures(run_dir, record, table.trajectories, out)  # {}: image file gone
            if figures:
                drawn += 1
                paths.update(figures)
                parts += figure_links(record["id"], figures)
    parts += [f"Per-instance, per-click IoU and BIoU: [{CLICK_CSV}]({CLICK_CSV}).", ""]
    return write_report_page(out, parts, records, paths)


__all__ = ["PROTOCOL", "TRAJECTORIES", "NOC_THRESHOLDS", "NOF_THRESHOLDS", "CLICK_CSV", "TetrisRow", "TetrisTable",
           "threshold_label", "table_thresholds", "tetris_table", "to_markdown", "csv_column", "to_csv", "mean_curves",
           "click_rows", "write_click_csv", "click_figure", "tetris_hardness", "recorded_target_iou", "safe_name",
           "failed_lines", "write_report"]
