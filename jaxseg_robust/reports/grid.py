"""Grid report: per-dataset min / max / baseline of the click or box grids, and heatmap plots.

Records (``jaxseg-robust grid``): per instance the grid's scalars and
``heatmaps`` (an npz file in the run directory, `jaxseg_robust.commands.grid`).

Columns, each the mean over a dataset's ok instances of a per-instance value
(NaN skipped; an instance whose heatmap has no finite cell has NaN extremes):
  click  iou_min / iou_max: the worst / best single click of the grid;
         iou_base: the baseline click (the RITM clicker's click at the grid
         click's place, scored whatever the stride); biou_*: Boundary IoU.
  box    iou_min / iou_max: the worst / best centred box size; iou_tight: the
         tight box; biou_*: Boundary IoU.
Values are fractions in rows / CSV and x100 in Markdown; a ``mean`` row
averages the dataset rows when there are several.

`write_report` writes ``grid.md`` / ``grid.csv`` and, for up to
``max_examples`` instances per dataset: click grids -> the IoU heatmap over
the image (``heatmap_<dataset>_<id>.png``, baseline click, min and max
marked); box grids -> the IoU heatmap over (w, h) (``boxgrid_<dataset>_<id>.png``,
tight box size, min and max marked) and the corner heatmap over the image
(``corners_<dataset>_<id>.png``) when recorded; plus ``report.md``.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import math
import pathlib
from collections.abc import Iterable, Mapping

import numpy as np

PROTOCOL = "grid"
KINDS = ("click", "box")
MEAN_ROW = "mean"
COLUMNS = {
    "click": ("iou_min", "iou_max", "iou_base", "biou_min", "biou_max", "biou_base"),
    "box": ("iou_min", "iou_max", "iou_tight", "biou_min", "biou_max", "biou_tight"),
}
HEADERS = {"iou_min": "IoU Min", "iou_max": "IoU Max", "iou_base": "IoU Baseline click",
           "iou_tight": "IoU Tight box", "biou_min": "BIoU Min", "biou_max": "BIoU Max",
           "biou_base": "BIoU Baseline click", "biou_tight": "BIoU Tight box"}
_PAYLOAD_FIELDS = {"iou_min": "iou_min", "iou_max": "iou_max", "biou_min": "biou_min", "biou_max": "biou_max",
                   "iou_base": "baseline_iou", "biou_base": "baseline_biou", "iou_tight": "tight_iou",
                   "biou_tight": "tight_biou"}


@dataclasses.dataclass(frozen=True)
class GridRow:
    """One dataset's line: name, ok / failed counts, column -> mean value (fraction)."""

    dataset: str
    ok: int
    failed: int
    values: Mapping[str, float]


@dataclasses.dataclass(frozen=True)
class GridTable:
    """The table of one grid run: its kind and rows (datasets, then ``mean`` with several)."""

    kind: str
    rows: tuple[GridRow, ...]

    @property
    def columns(self) -> tuple[str, ...]:
        """Value columns of the kind (CSV order)."""
        return COLUMNS[self.kind]


def _number(value) -> float:
    return math.nan if value is None else float(value)


def _nanmean(values) -> float:
    array = np.asarray(values, np.float64)
    array = array[~np.isnan(array)]
    return float(array.mean()) if array.size else math.nan


def grid_table(records: Iterable[Mapping], kind: str) -> GridTable:
    """The per-dataset table of a grid run (pure).

    Raises:
      ValueError: unknown kind, or an ok record without a field of the kind (naming it).
    """
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}; got {kind!r}")
    ok: dict[str, list] = {}
    failed: dict[str, int] = {}
    for record in records:
        dataset = str(record.get("dataset", ""))
        ok.setdefault(dataset, [])
        failed.setdefault(dataset, 0)
        if record.get("status") != "ok":
            failed[dataset] += 1
            continue
        payload = record.get("payload") or {}
        try:
            ok[dataset].append({c: _number(payload[_PAYLOAD_FIELDS[c]]) for c in COLUMNS[kind]})
        except KeyError as error:
            raise ValueError(f"record {dataset}/{record.get('id')} has no field {error} of a {kind} grid") from None
    rows = [GridRow(name, len(ok[name]), failed[name], {c: _nanmean([v[c] for v in ok[name]]) for c in COLUMNS[kind]})
            for name in ok]
    if len(rows) > 1:
        rows.append(GridRow(MEAN_ROW, sum(r.ok for r in rows), sum(r.failed for r in rows),
                            {c: _nanmean([r.values[c] for r in rows]) for c in COLUMNS[kind]}))
    return GridTable(kind, tuple(rows))


def _percent(value: float) -> str:
    return "nan" if math.isnan(value) else f"{100.0 * value:.2f}"


def to_markdown(table: GridTable) -> str:
    """Markdown table: dataset, ok, failed, the kind's columns x100."""
    headers = ["dataset", "ok", "failed"] + [HEADERS[c] for c in table.columns]
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join(["---"] + ["---:"] * (len(headers) - 1)) + "|"]
    for row in table.rows:
        lines.append("| " + " | ".join([row.dataset, str(row.ok), str(row.failed)]
                                       + [_percent(row.values[c]) for c in table.columns]) + " |")
    what = "single clicks over the grid" if table.kind == "click" else "centred boxes over (h, w)"
    return "\n".join(lines) + f"\n\nIoU x100, {table.kind} grid: per-instance min / max over {what}, dataset means"


def to_csv(table: GridTable) -> str:
    """CSV: dataset, ok, failed, the kind's columns (fractions, repr precision)."""
    handle = io.StringIO()
    writer = csv.writer(handle, lineterminator="\n")
    writer.writerow(["dataset", "ok", "failed", *table.columns])
    for row in table.rows:
        writer.writerow([row.dataset, row.ok, row.failed, *(repr(float(row.values[c])) for c in table.columns)])
    return handle.getvalue()


def load_heatmaps(run_dir, payload: Mapping) -> dict | None:
    """The npz arrays a record refers to (``payload["heatmaps"]``), or None when missing."""
    relative = payload.get("heatmaps")
    if not relative:
        return None
    path = pathlib.Path(run_dir) / relative
    if not path.is_file():
        return None
    with np.load(path) as data:
        return {name: data[name] for name in data.files}


def _point(value):
    """(row, col) or (h, w) record pair -> None when absent (-1)."""
    if value is None or min(value) < 0:
        return None
    return value


def plot_click_grid(record: Mapping, maps: Mapping, path, image=None) -> pathlib.Path:
    """IoU heatmap of a click grid (over the image when given) with baseline / min / max clicks marked."""
    from jaxseg_robust.reports.figures import plot_heatmap  # noqa: PLC0415

    payload = record["payload"]
    markers = {}
    for label, key in (("baseline click", "baseline_click"), ("min", "iou_argmin"), ("max", "iou_argmax")):
        point = _point(payload.get(key))
        if point is not None:
            markers[label] = (point[1], point[0])  # (x, y) = (col, row)
    title = (f"{record['dataset']}/{record['id']}\nIoU of one click: min {_percent(_number(payload['iou_min']))}, "
             f"max {_percent(_number(payload['iou_max']))}, baseline {_percent(_number(payload['baseline_iou']))}")
    return plot_heatmap(maps["iou"], path, x_coords=maps["cols"], y_coords=maps["rows"], title=title,
                        xlabel="click x (px)", ylabel="click y (px)", colour_label="IoU", image=image, markers=markers,
                        anchor="start")


def plot_box_grid(record: Mapping, maps: Mapping, path) -> pathlib.Path:
    """IoU heatmap over centred box sizes (w, h) with the tight size, min and max marked."""
    from jaxseg_robust.reports.figures import plot_heatmap  # noqa: PLC0415

    payload = record["payload"]
    markers = {}
    for label, key in (("tight box", "tight_hw"), ("min", "iou_argmin_hw"), ("max", "iou_argmax_hw")):
        point = _point(payload.get(key))
        if point is not None:
            markers[label] = (point[1], point[0])  # (x, y) = (w, h)
    title = (f"{record['dataset']}/{record['id']}\nIoU of centred boxes: min {_percent(_number(payload['iou_min']))}, "
             f"max {_percent(_number(payload['iou_max']))}, tight {_percent(_number(payload['tight_iou']))}")
    return plot_heatmap(maps["iou"], path, x_coords=maps["widths"], y_coords=maps["heights"], title=title,
                        xlabel="box width w (px)", ylabel="box height h (px)", colour_label="IoU", markers=markers)


def plot_corner_heatmap(record: Mapping, maps: Mapping, path, image=None) -> pathlib.Path:
    """The §5.3 corner heatmap (mean IoU of the boxes with a corner at each pixel) over the image."""
    from jaxseg_robust.reports.figures import plot_heatmap  # noqa: PLC0415

    heat = np.asarray(maps["corner_heatmap"], np.float64)
    shown = np.where(heat > 0, heat, np.nan)
    height, width = heat.shape
    return plot_heatmap(shown, path, x_coords=np.arange(width), y_coords=np.arange(height),
                        title=f"{record['dataset']}/{record['id']}\nmean IoU of the boxes with a corner at the pixel",
                        colour_label="mean IoU (reference)", image=image)


def write_report(run_dir, out_dir=None, *, max_examples: int = 4, kind: str | None = None) -> dict[str, pathlib.Path]:
    """Writes the grid report of a run directory; returns name -> path.

    Args:
      run_dir: a ``jaxseg-robust grid`` run directory.
      out_dir: output folder (default ``RUN_DIR/report``).
      max_examples: heatmap plots per dataset.
      kind: "click" / "box" (default: the manifest's).
    """
    from jaxseg_robust.reports.breps import load_run_records  # noqa: PLC0415
    from jaxseg_robust.reports.sources import load_source_image  # noqa: PLC0415
    from jaxseg_robust.reports.tetris import failed_lines, safe_name  # noqa: PLC0415
    from jaxseg_robust.runner.rundir import read_manifest  # noqa: PLC0415

    if kind is None:
        kind = read_manifest(run_dir)["config"]["kind"]
    records = load_run_records(run_dir)
    out = pathlib.Path(out_dir) if out_dir is not None else pathlib.Path(run_dir) / "report"
    out.mkdir(parents=True, exist_ok=True)
    table = grid_table(records, kind)
    markdown = to_markdown(table)
    paths = {"grid_md": out / "grid.md", "grid_csv": out / "grid.csv"}
    paths["grid_md"].write_text(markdown + "\n", encoding="utf-8")
    paths["grid_csv"].write_text(to_csv(table), encoding="utf-8")
    parts = [f"# {kind.capitalize()} grid", "", markdown, ""]
    shown: dict[str, int] = {}
    missing = []
    for record in records:
        if record.get("status") != "ok" or shown.get(record["dataset"], 0) >= max_examples:
            continue
        maps = load_heatmaps(run_dir, record["payload"])
        if maps is None:
            missing.append(f"{record['dataset']}/{record['id']}")
            continue
        shown[record["dataset"]] = shown.get(record["dataset"], 0) + 1
        name = f"{safe_name(record['dataset'])}_{safe_name(record['id'])}"
        image = load_source_image(record["payload"])
        if kind == "click":
            paths[f"heatmap_{name}"] = plot_click_grid(record, maps, out / f"heatmap_{name}.png", image)
            parts += [f"![{record['id']}]({paths[f'heatmap_{name}'].name})", ""]
        else:
            paths[f"boxgrid_{name}"] = plot_box_grid(record, maps, out / f"boxgrid_{name}.png")
            parts += [f"![{record['id']}]({paths[f'boxgrid_{name}'].name})", ""]
            if "corner_heatmap" in maps:
                paths[f"corners_{name}"] = plot_corner_heatmap(record, maps, out / f"corners_{name}.png", image)
                parts += [f"![{record['id']} corners]({paths[f'corners_{name}'].name})", ""]
    if missing:
        parts += ["Heatmap files missing for: " + ", ".join(missing), ""]
    failed = failed_lines(records)
    if failed:
        parts += ["## Failed instances", "", *failed, ""]
    paths["report"] = out / "report.md"
    paths["report"].write_text("\n".join(parts), encoding="utf-8")
    return paths


__all__ = ["PROTOCOL", "KINDS", "COLUMNS", "GridRow", "GridTable", "grid_table", "to_markdown", "to_csv",
           "load_heatmaps", "plot_click_grid", "plot_box_grid", "plot_corner_heatmap", "write_report"]
