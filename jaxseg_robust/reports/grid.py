"""Grid report: per-dataset min / max / baseline of the click or box grids, and heatmap plots.

Records (``jaxseg-robust grid``): per instance the grid's scalars and
``heatmaps`` (an npz file in the run directory, `jaxseg_robust.runs.grid`).

Columns, each the mean over a dataset's ok instances of a per-instance value
(NaN skipped; an instance whose heatmap has no finite cell has NaN extremes):
  click  iou_min / iou_max: the worst / best single click of the grid;
         iou_base: the baseline click (the RITM clicker's click at the grid
         click's place, scored whatever the stride); biou_*: Boundary IoU.
  box    iou_min / iou_max: the worst / best centred box size; iou_tight: the
         tight box; biou_*: Boundary IoU.
The tight-box columns name how the run decoded its boxes (single mask by
default, multimask + the model's selection with ``--multimask``): Markdown
``IoU Tight box (single mask)``, CSV ``iou_tight_single``; BREPS's tight box
(`jaxseg_robust.reports.breps`) is a multimask decode, so the two differ.
Values are fractions in rows / CSV and x100 in Markdown; a ``mean`` row
averages the dataset rows when there are several.

`write_report` writes ``grid.md`` / ``grid.csv`` and, for the instances
``--plot-instances`` picks per dataset (default the worst 4 by ``iou_min``):
click grids -> the IoU heatmap over the image with the GT outline
(``heatmap_<dataset>_<id>.png``, baseline click, min and max marked); box
grids -> the IoU heatmap over (w, h) (``boxgrid_<dataset>_<id>.png``, tight
box size, min and max marked) and the corner heatmap over the image
(``corners_<dataset>_<id>.png``, pixels without a corner unpainted) when
recorded; plus ``report.md``. Colours span the finite data of each heatmap
(docs/ARCHITECTURE.md, "Figures").
"""

from __future__ import annotations

import dataclasses
import pathlib
from collections.abc import Iterable, Mapping

import numpy as np

from jaxseg_robust.reports.report_files import (
    example_records,
    file_stem,
    load_run_records,
    report_folder,
    write_report_page,
    write_table_files,
)
from jaxseg_robust.reports.tables import (
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

PROTOCOL = "grid"
KINDS = ("click", "box")
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


GridRow = DatasetRow  # one dataset's line: name, ok / failed counts, column -> mean value (fraction)


@dataclasses.dataclass(frozen=True)
class GridTable:
    """The table of one grid run: its kind, rows (datasets, then ``mean`` with several) and how its prompts
    were decoded (``decoding``: "multimask" = multimask output + the model's selection, "single" = the
    single-mask output; `jaxseg_robust.reports.tables.TIGHT_DECODINGS`)."""

    kind: str
    rows: tuple[GridRow, ...]
    decoding: str = "single"

    @property
    def columns(self) -> tuple[str, ...]:
        """Value columns of the kind (CSV order)."""
        return COLUMNS[self.kind]


def default_multimask(kind: str) -> bool:
    """The ``grid`` command's decoding default: multimask for clicks, single mask for boxes (grids.md §5)."""
    return kind == "click"


def grid_table(records: Iterable[Mapping], kind: str, multimask: bool | None = None) -> GridTable:
    """The per-dataset table of a grid run (pure).

    Args:
      records: latest record per instance.
      kind: "click" or "box".
      multimask: how the run decoded its prompts (the manifest's ``multimask_output``; None: the
        command's default for the kind, `default_multimask`); the tight-box column is labelled with it.

    Raises:
      ValueError: unknown kind, or an ok record without a field of the kind (naming it).
    """
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}; got {kind!r}")
    multimask = default_multimask(kind) if multimask is None else bool(multimask)

    def scalars(payload: Mapping) -> dict[str, float]:
        return {c: number(payload[_PAYLOAD_FIELDS[c]]) for c in COLUMNS[kind]}

    ok, failed = group_by_dataset(records, scalars, f"{kind} grid")
    rows = [GridRow(name, len(ok[name]), failed[name], {c: nanmean([v[c] for v in ok[name]]) for c in COLUMNS[kind]})
            for name in ok]
    return GridTable(kind, with_mean_row(rows, COLUMNS[kind]), "multimask" if multimask else "single")


def to_markdown(table: GridTable) -> str:
    """Markdown table: dataset, ok, failed, the kind's columns x100."""
    headers = ["dataset", "ok", "failed"] + [tight_header(HEADERS[c], table.decoding) if "tight" in c else HEADERS[c]
                                             for c in table.columns]
    cells = ([row.dataset, str(row.ok), str(row.failed)] + [percent(row.values[c]) for c in table.columns]
             for row in table.rows)
    what = "single clicks over the grid" if table.kind == "click" else "centred boxes over (h, w)"
    note = f"\n\nIoU x100, {table.kind} grid: per-instance min / max over {what}, dataset means"
    return markdown_table(headers, cells) + note


def to_csv(table: GridTable) -> str:
    """CSV: dataset, ok, failed, the kind's columns (fractions, repr precision); the tight-box columns name the
    decoding (``iou_tight_single`` / ``iou_tight_multimask``, `jaxseg_robust.reports.tables.tight_column`)."""
    return csv_text(["dataset", "ok", "failed", *(tight_column(c, table.decoding) for c in table.columns)],
                    ([row.dataset, row.ok, row.failed, *exact_values(row, table.columns)] for row in table.rows))


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


def _click_markers(payload: Mapping) -> dict[str, tuple]:
    """label -> (x, y) of the baseline, min and max clicks (`figures.record_point_xy`; absent ones skipped)."""
    from jaxseg_robust.reports.figures import record_point_xy  # noqa: PLC0415

    fields = (("baseline click", "baseline_click_xy"), ("min", "iou_argmin_xy"), ("max", "iou_argmax_xy"))
    points = {label: record_point_xy(payload, field) for label, field in fields}
    return {label: point for label, point in points.items() if point is not None}


def _size_markers(payload: Mapping) -> dict[str, tuple]:
    """label -> (w, h) plot position of the tight, min and max box sizes (recorded (h, w); absent ones skipped)."""
    fields = (("tight box", "tight_hw"), ("min", "iou_argmin_hw"), ("max", "iou_argmax_hw"))
    return {label: (float(payload[field][1]), float(payload[field][0])) for label, field in fields
            if payload.get(field) is not None and min(payload[field]) >= 0}


def click_grid_figure(record: Mapping, maps: Mapping, image=None, gt=None):
    """IoU heatmap of a click grid (over the image and GT outline when given), baseline / min / max clicks marked."""
    from jaxseg_robust.reports.figures import heatmap_figure  # noqa: PLC0415

    payload = record["payload"]
    title = (f"{record['dataset']}/{record['id']}\nIoU of one click: min {percent(number(payload['iou_min']))}, "
             f"max {percent(number(payload['iou_max']))}, baseline {percent(number(payload['baseline_iou']))}")
    return heatmap_figure(maps["iou"], x_coords=maps["cols"], y_coords=maps["rows"], title=title,
                          xlabel="click x (px)", ylabel="click y (px)", colour_label="IoU", image=image, gt=gt,
                          markers=_click_markers(payload), anchor="start")


def box_grid_figure(record: Mapping, maps: Mapping):
    """IoU heatmap over centred box sizes (w, h) with the tight size, min and max marked."""
    from jaxseg_robust.reports.figures import heatmap_figure  # noqa: PLC0415

    payload = record["payload"]
    title = (f"{record['dataset']}/{record['id']}\nIoU of centred boxes: min {percent(number(payload['iou_min']))}, "
             f"max {percent(number(payload['iou_max']))}, tight {percent(number(payload['tight_iou']))}")
    return heatmap_figure(maps["iou"], x_coords=maps["widths"], y_coords=maps["heights"], title=title,
                          xlabel="box width w (px)", ylabel="box height h (px)", colour_label="IoU",
                          markers=_size_markers(payload))


def _axis_ends(centre: int, sizes, side: int) -> tuple[np.ndarray, np.ndarray]:
    """(lo, hi) of the centred intervals of ``sizes`` along one axis (attacks.grid.boxes.centred_axis's rule)."""
    sizes = np.asarray(sizes, np.int64)
    return np.clip(centre - sizes // 2, 0, side - 1), np.clip(centre + (sizes + 1) // 2, 0, side - 1)


def sampled_corners(payload: Mapping, maps: Mapping, shape: tuple[int, int]) -> np.ndarray:
    """bool[H, W]: the pixels where a scored box of the grid has a corner (the corner heatmap's data).

    A box of sizes (heights[a], widths[b]) centred on the recorded ``centre``
    (cx, cy) counts when its size is ``valid``, its ``iou_reference`` is a
    number and it is not flat (x2 > x1 and y2 > y1), as
    `jaxseg_robust.attacks.grid.boxes.corner_heatmap` counts it; every other
    pixel has no data (docs/protocols/grids.md §5.3).
    """
    height, width = (int(v) for v in shape)
    centre_x, centre_y = (int(v) for v in payload["centre"])
    y1, y2 = _axis_ends(centre_y, maps["heights"], height)
    x1, x2 = _axis_ends(centre_x, maps["widths"], width)
    scored = np.asarray(maps["valid"], bool) & np.isfinite(np.asarray(maps["iou_reference"], np.float64))
    scored &= (y2 > y1)[:, None] & (x2 > x1)[None, :]
    rows, cols = np.nonzero(scored)
    sampled = np.zeros((height, width), bool)
    for ys, xs in ((y1, x1), (y1, x2), (y2, x1), (y2, x2)):
        sampled[ys[rows], xs[cols]] = True
    return sampled


def corner_figure(record: Mapping, maps: Mapping, image=None, gt=None):
    """The §5.3 corner heatmap (mean IoU of the boxes with a corner at each pixel) over the image and GT outline.

    Pixels where no scored box has a corner (`sampled_corners`) are masked: not painted.
    """
    from jaxseg_robust.reports.figures import heatmap_figure  # noqa: PLC0415

    heat = np.asarray(maps["corner_heatmap"], np.float64)
    shown = np.ma.masked_array(heat, mask=~sampled_corners(record["payload"], maps, heat.shape))
    height, width = heat.shape
    return heatmap_figure(shown, x_coords=np.arange(width), y_coords=np.arange(height), image=image, gt=gt,
                          title=f"{record['dataset']}/{record['id']}\nmean IoU of the boxes with a corner at the "
                                "pixel (unpainted: no corner)", colour_label="mean IoU (reference)")


def grid_hardness(record: Mapping) -> float:
    """A record's score for ``--plot-instances worst``: its ``iou_min`` (`jaxseg_robust.reports.plot_selection`)."""
    return number((record.get("payload") or {}).get("iou_min"))


def _instance_figures(record: Mapping, maps: Mapping, kind: str, out: pathlib.Path) -> dict[str, pathlib.Path]:
    """name -> path of the heatmap figures of one instance."""
    from jaxseg_robust.reports.figures import save_figure  # noqa: PLC0415
    from jaxseg_robust.reports.sources import load_source_gt, load_source_image  # noqa: PLC0415

    name = file_stem(record["dataset"], record["id"])
    image = load_source_image(record["payload"])
    gt = load_source_gt(record["payload"]) if image is not None else None
    if kind == "click":
        return {f"heatmap_{name}": save_figure(click_grid_figure(record, maps, image, gt), out / f"heatmap_{name}.png")}
    paths = {f"boxgrid_{name}": save_figure(box_grid_figure(record, maps), out / f"boxgrid_{name}.png")}
    if "corner_heatmap" in maps:
        paths[f"corners_{name}"] = save_figure(corner_figure(record, maps, image, gt), out / f"corners_{name}.png")
    return paths


def write_report(run_dir, out_dir=None, *, plot_instances=None, kind: str | None = None) -> dict[str, pathlib.Path]:
    """Writes the grid report of a run directory; returns name -> path.

    Args:
      run_dir: a ``jaxseg-robust grid`` run directory.
      out_dir: output folder (default ``RUN_DIR/report``).
      plot_instances: `jaxseg_robust.reports.plot_selection.PlotInstances`: the instances per dataset
        whose heatmaps are drawn (default the worst 4 by `grid_hardness`).
      kind: "click" / "box" (default: the manifest's).
    """
    from jaxseg_robust.reports.figures import figure_links  # noqa: PLC0415
    from jaxseg_robust.reports.plot_selection import DEFAULT_PLOT_INSTANCES, instances_to_plot  # noqa: PLC0415
    from jaxseg_robust.runner.rundir import read_manifest  # noqa: PLC0415

    config = read_manifest(run_dir)["config"]
    choice = plot_instances or DEFAULT_PLOT_INSTANCES
    kind = config["kind"] if kind is None else kind
    records = load_run_records(run_dir)
    out = report_folder(run_dir, out_dir)
    table = grid_table(records, kind, config.get("multimask_output"))
    markdown = to_markdown(table)
    paths = write_table_files(out, "grid", markdown, to_csv(table))
    order = "the lowest IoU Min first" if choice.mode == "worst" else "record order"
    parts = [f"# {kind.capitalize()} grid", "", markdown, "", f"Instances drawn per dataset: {choice} ({order}).", ""]
    missing: list[str] = []
    for record, maps in example_records(instances_to_plot(records, choice, grid_hardness), choice.count,
                                        lambda r: load_heatmaps(run_dir, r["payload"]), missing):
        figures = _instance_figures(record, maps, kind, out)
        paths.update(figures)
        parts += figure_links(record["id"], figures)
    if missing:
        parts += ["Heatmap files missing for: " + ", ".join(missing), ""]
    return write_report_page(out, parts, records, paths)


__all__ = ["PROTOCOL", "KINDS", "COLUMNS", "GridRow", "GridTable", "default_multimask", "grid_table", "to_markdown",
           "to_csv", "load_heatmaps", "click_grid_figure", "box_grid_figure", "sampled_corners", "corner_figure",
           "grid_hardness", "write_report"]
