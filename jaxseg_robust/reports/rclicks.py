"""RClicks report: the per-dataset NoC table (Markdown + CSV) and a clicking-groups figure (PNG).

Table (docs/protocols/rclicks.md §6.2, `metrics.rclicks_benchmark.dataset_benchmark` per dataset):
NoC20@90 ``Sample mean ± std``, ``Base``, ``ΔSB``, ``ΔGR``, ``ΔHH`` (percent),
NoF20@90 Sample / Base, IoU-AuC20 Sample / Base (×100), NSR@20 (×100) and the
first-round columns (User IoU@1 ± std, Sample IoU@1 ± std, Base IoU@1, NSR@1,
×100) when real clicks were evaluated. Markdown uses the paper's formats
(``%.2f±%.2f``, ``%.1f±%.2f`` for NoF); the CSV holds the raw numbers
(fractions for IoU values).

Figure (paper Fig. 6): every pixel of the first-round clickability map ``M``
(restricted to the object) is coloured by its clicking group G1..G10 — the band
``t_lo <= M <= t_hi`` of `clicksim.groups.band_thresholds` (boundary values belong
to two adjacent groups; the higher group is drawn) — over the dimmed image,
with the object outline. matplotlib with the Agg backend (no display needed).
"""

from __future__ import annotations

import csv
import io
import math
import pathlib
from collections.abc import Mapping

import numpy as np

from jaxseg_robust.metrics.rclicks_benchmark import DatasetBenchmark
from jaxseg_robust.reports.report_files import write_table_files
from jaxseg_robust.reports.tables import markdown_table

__all__ = ["CSV_COLUMNS", "table_rows", "to_markdown", "to_csv", "group_index_map", "plot_clicking_groups",
           "write_tables"]

CSV_COLUMNS = (
    "dataset", "instances",
    "noc_sample", "noc_sample_std", "noc_base", "noc_delta_sb_pct", "noc_delta_gr_pct", "noc_delta_hh_pct",
    "nof_sample", "nof_sample_std", "nof_base", "nof_delta_sb", "nof_delta_gr", "nof_delta_hh",
    "auc_sample", "auc_sample_std", "auc_base", "auc_delta_sb", "auc_delta_gr", "auc_delta_hh",
    "nsr_at_20", "user_iou_at_1", "user_iou_at_1_std", "sample_iou_at_1", "sample_iou_at_1_std",
    "base_iou_at_1", "user_nsr_at_1", "user_instances",
)


def _row_values(prefix: str, row) -> dict[str, float]:
    names = ("sample", "sample_std", "base", "delta_sb", "delta_gr", "delta_hh")
    suffix = "_pct" if prefix == "noc" else ""
    keys = [f"{prefix}_{n}{suffix if n.startswith('delta') else ''}" for n in names]
    return dict(zip(keys, (math.nan,) * 6 if row is None else tuple(float(v) for v in row)))


def table_rows(benchmarks: Mapping[str, DatasetBenchmark]) -> list[dict]:
    """One dict per dataset with every `CSV_COLUMNS` entry (raw numbers; IoU as fractions)."""
    rows = []
    for name, bench in benchmarks.items():
        row = {"dataset": name, "instances": bench.instances}
        row.update(_row_values("noc", bench.noc))
        row.update(_row_values("nof", bench.nof))
        row.update(_row_values("auc", bench.auc))
        row.update(nsr_at_20=bench.nsr_at_20, user_iou_at_1=bench.user.mean, user_iou_at_1_std=bench.user.std,
                   sample_iou_at_1=bench.sample.mean, sample_iou_at_1_std=bench.sample.std,
                   base_iou_at_1=bench.base_iou_at_1, user_nsr_at_1=bench.user.nsr,
                   user_instances=bench.user.instances)
        rows.append(row)
    return rows


def _fmt(value: float, pattern: str, scale: float = 1.0) -> str:
    return "–" if value is None or not math.isfinite(value) else pattern % (value * scale)


def to_markdown(benchmarks: Mapping[str, DatasetBenchmark]) -> str:
    """The NoC table (and first-round columns when any dataset has real clicks) as Markdown."""
    rows = table_rows(benchmarks)
    with_users = any(r["user_instances"] for r in rows)
    header = ["dataset", "N", "NoC20@90 Sample", "Base", "ΔSB %", "ΔGR %", "ΔHH %",
              "NoF20@90 Sample", "NoF Base", "IoU-AuC20 Sample", "AuC Base", "NSR@20"]
    if with_users:
        header += ["User IoU@1", "Sample IoU@1", "Base IoU@1", "NSR@1"]
    cell_rows = []
    for r in rows:
        cells = [r["dataset"], str(r["instances"]),
                 _fmt(r["noc_sample"], "%.2f") + "±" + _fmt(r["noc_sample_std"], "%.2f"),
                 _fmt(r["noc_base"], "%.2f"), _fmt(r["noc_delta_sb_pct"], "%.2f"),
                 _fmt(r["noc_delta_gr_pct"], "%.2f"), _fmt(r["noc_delta_hh_pct"], "%.2f"),
                 _fmt(r["nof_sample"], "%.1f") + "±" + _fmt(r["nof_sample_std"], "%.2f"),
                 _fmt(r["nof_base"], "%d"),
                 _fmt(r["auc_sample"], "%.2f", 100) + "±" + _fmt(r["auc_sample_std"], "%.2f", 100),
                 _fmt(r["auc_base"], "%.2f", 100), _fmt(r["nsr_at_20"], "%.2f", 100)]
        if with_users:
            cells += [_fmt(r["user_iou_at_1"], "%.2f", 100) + "±" + _fmt(r["user_iou_at_1_std"], "%.2f", 100),
                      _fmt(r["sample_iou_at_1"], "%.2f", 100) + "±" + _fmt(r["sample_iou_at_1_std"], "%.2f", 100),
                      _fmt(r["base_iou_at_1"], "%.2f", 100), _fmt(r["user_nsr_at_1"], "%.2f", 100)]
        cell_rows.append(cells)
    return markdown_table(header, cell_rows, align_numbers=False)


def to_csv(benchmarks: Mapping[str, DatasetBenchmark]) -> str:
    """Every `CSV_COLUMNS` value per dataset (NaN for quantities that were not run)."""
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=CSV_COLUMNS, lineterminator="\n")
    writer.writeheader()
    for row in table_rows(benchmarks):
        writer.writerow(row)
    return out.getvalue()


def write_tables(benchmarks: Mapping[str, DatasetBenchmark], out_dir) -> list[pathlib.Path]:
    """Writes ``rclicks_noc.md`` and ``rclicks_noc.csv`` into ``out_dir``; returns their paths."""
    out_dir = pathlib.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    return list(write_table_files(out_dir, "rclicks_noc", to_markdown(benchmarks), to_csv(benchmarks)).values())


def group_index_map(clickability, num_groups: int = 10) -> np.ndarray:
    """Clicking group of every pixel of a (masked) clickability map.

    Args:
      clickability: float[H, W] non-negative map (e.g. ``M * R``).
      num_groups: number of equal-mass groups.
    Returns:
      int32[H, W]: 0-based group index (the highest group whose inclusive band
      holds the value), -1 for pixels with ``M == 0`` (no mass).
    """
    from jaxseg_robust.clicksim.groups import band_thresholds, group_bounds  # noqa: PLC0415

    values = np.asarray(clickability, np.float32)
    if values.ndim != 2:
        raise ValueError(f"clickability must be 2-D [H, W]; got shape {values.shape}")
    bounds = group_bounds(num_groups)
    bands = band_thresholds(values, bounds[:, 0], bounds[:, 1])
    low, high = np.asarray(bands.low), np.asarray(bands.high)
    index = np.full(values.shape, -1, np.int32)
    for group in range(num_groups):
        index[(values >= low[group]) & (values <= high[group]) & (values > 0)] = group
    return index


def plot_clicking_groups(image, gt, group_map, path, *, title: str = "", clicks=None) -> pathlib.Path:
    """Saves a Fig. 6-style PNG: clicking groups coloured over the dimmed image.

    Args:
      image: uint8[H, W, 3] RGB.
      gt: bool[H, W] object mask (outlined).
      group_map: int[H, W] from `group_index_map` (-1 = not coloured).
      path: output PNG path.
      title: figure title.
      clicks: optional int[n, 2] (x, y) points to mark (e.g. the groups' first clicks).
    Returns:
      The written path.
    """
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415
    from matplotlib import colors  # noqa: PLC0415

    image = np.asarray(image)
    group_map = np.asarray(group_map)
    if image.ndim != 3 or group_map.shape != image.shape[:2] or np.shape(gt) != image.shape[:2]:
        raise ValueError(f"image [H, W, 3], gt and group_map [H, W] must agree; got {image.shape}, "
                         f"{np.shape(gt)}, {group_map.shape}")
    num_groups = max(int(group_map.max()) + 1, 1)
    cmap = plt.get_cmap("turbo", max(num_groups, 2))
    fig, ax = plt.subplots(figsize=(6, 6 * image.shape[0] / max(image.shape[1], 1) + 0.6), dpi=100)
    ax.imshow((image.astype(np.float32) * 0.45).astype(np.uint8))
    shown = np.ma.masked_less(group_map, 0)
    norm = colors.BoundaryNorm(np.arange(-0.5, num_groups + 0.5), cmap.N)
    handle = ax.imshow(shown, cmap=cmap, norm=norm, alpha=0.75, interpolation="nearest")
    ax.contour(np.asarray(gt, float), levels=[0.5], colors="white", linewidths=0.8)
    if clicks is not None and len(clicks):
        clicks = np.asarray(clicks)
        ax.scatter(clicks[:, 0], clicks[:, 1], s=18, c="white", edgecolors="black", linewidths=0.6)
    bar = fig.colorbar(handle, ax=ax, ticks=range(num_groups), fraction=0.046, pad=0.04)
    bar.ax.set_yticklabels([f"G{g + 1}" for g in range(num_groups)])
    ax.set_axis_off()
    if title:
        ax.set_title(title, fontsize=9)
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, bbox_inches="tight")
    plt.close(fig)
    return path
