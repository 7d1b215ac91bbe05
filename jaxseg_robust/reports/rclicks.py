"""RClicks report: the per-dataset NoC table (Markdown + CSV) and a clicking-groups figure (PNG).

Table (docs/protocols/rclicks.md §6.2, `metrics.rclicks_benchmark.dataset_benchmark` per dataset):
NoC20@90 ``Sample mean ± std``, ``Base``, ``ΔSB``, ``ΔGR``, ``ΔHH`` (percent),
NoF20@90 Sample / Base, IoU-AuC20 Sample / Base (×100), NSR@20 (×100) and the
first-round columns (User IoU@1 ± std, Sample IoU@1 ± std, Base IoU@1, NSR@1,
×100) when real clicks were evaluated. The "20" and "90" of the headers are the
benchmarks' click budget and IoU target (``--n-clicks 5 --target-iou 0.85``
gives NoC5@85, NSR@5 and the CSV column ``nsr_at_5``; the CSV also states
``n_clicks`` and ``target_iou``). Markdown uses the paper's formats
(``%.2f±%.2f``, ``%.1f±%.2f`` for NoF; "–" where a quantity was not run, e.g.
the Sample columns with ``--groups 0``); the CSV holds the raw numbers
(fractions for IoU values, NaN where not run).

Figure (paper Fig. 6): every pixel of the first-round clickability map ``M``
(restricted to the object) is coloured by its clicking group G1..G10 — the band
``t_lo <= M <= t_hi`` of `clicksim.groups.band_thresholds` (boundary values belong
to two adjacent groups; the higher group is drawn) — over the dimmed image,
with the object outline. matplotlib with the Agg backend (no display needed).

Per-instance figure (`instance_curves`, `plot_instance_curves`): the IoU per
round of the baseline clicker and of the simulated users (per round the worst,
mean and best clicking group) of the instances ``--plot-instances`` picks;
"worst" ranks by `rclicks_hardness` (the mean IoU over the rounds of the
clicking groups, of the baseline clicker when no group ran).
"""

from __future__ import annotations

import csv
import io
import math
import pathlib
import warnings
from collections.abc import Mapping

import numpy as np

from jaxseg_robust.metrics.rclicks_benchmark import IOU_TARGET, NUM_CLICKS, DatasetBenchmark
from jaxseg_robust.reports.report_files import write_table_files
from jaxseg_robust.reports.tables import markdown_table

__all__ = ["REPORT_STEM", "CSV_COLUMNS", "csv_columns", "budget_labels", "table_rows", "to_markdown", "to_csv",
           "group_index_map", "plot_clicking_groups", "write_tables", "rclicks_hardness", "instance_curves",
           "plot_instance_curves"]

REPORT_STEM = "rclicks"  # the report's table files: rclicks.md / rclicks.csv
CSV_COLUMNS = (
    "dataset", "instances",
    "noc_sample", "noc_sample_std", "noc_base", "noc_delta_sb_pct", "noc_delta_gr_pct", "noc_delta_hh_pct",
    "nof_sample", "nof_sample_std", "nof_base", "nof_delta_sb", "nof_delta_gr", "nof_delta_hh",
    "auc_sample", "auc_sample_std", "auc_base", "auc_delta_sb", "auc_delta_gr", "auc_delta_hh",
    "nsr_at_20", "user_iou_at_1", "user_iou_at_1_std", "sample_iou_at_1", "sample_iou_at_1_std",
    "base_iou_at_1", "user_nsr_at_1", "user_instances", "n_clicks", "target_iou",
)  # for the benchmark's 20 clicks; `csv_columns` names the NSR column after the click budget


def csv_columns(num_clicks: int) -> tuple[str, ...]:
    """`CSV_COLUMNS` with the NSR column named after the click budget (``nsr_at_<num_clicks>``)."""
    return tuple(f"nsr_at_{num_clicks}" if c == "nsr_at_20" else c for c in CSV_COLUMNS)


def budget_labels(benchmarks: Mapping[str, DatasetBenchmark]) -> tuple[int, str]:
    """(click budget, IoU target in percent as text) shared by every dataset: ``(20, "90")`` for the benchmark.

    Raises:
      ValueError: the datasets were aggregated with different budgets or targets.
    """
    budgets = {(int(b.num_clicks), float(b.threshold)) for b in benchmarks.values()}
    if not budgets:
        budgets = {(NUM_CLICKS, IOU_TARGET)}
    if len(budgets) != 1:
        raise ValueError(f"benchmarks must share one click budget and IoU target; got {sorted(budgets)}")
    num_clicks, threshold = budgets.pop()
    return num_clicks, f"{round(100.0 * threshold, 4):g}"


def _row_values(prefix: str, row) -> dict[str, float]:
    names = ("sample", "sample_std", "base", "delta_sb", "delta_gr", "delta_hh")
    suffix = "_pct" if prefix == "noc" else ""
    keys = [f"{prefix}_{n}{suffix if n.startswith('delta') else ''}" for n in names]
    return dict(zip(keys, (math.nan,) * 6 if row is None else tuple(float(v) for v in row)))


def table_rows(benchmarks: Mapping[str, DatasetBenchmark]) -> list[dict]:
    """One dict per dataset with every `CSV_COLUMNS` entry (raw numbers; IoU as fractions).

    The NSR value is under ``nsr_at_20`` whatever the budget (``n_clicks``); `to_csv` renames the column.
    """
    rows = []
    for name, bench in benchmarks.items():
        row = {"dataset": name, "instances": bench.instances}
        row.update(_row_values("noc", bench.noc))
        row.update(_row_values("nof", bench.nof))
        row.update(_row_values("auc", bench.auc))
        row.update(nsr_at_20=bench.nsr_at_20, user_iou_at_1=bench.user.mean, user_iou_at_1_std=bench.user.std,
                   sample_iou_at_1=bench.sample.mean, sample_iou_at_1_std=bench.sample.std,
                   base_iou_at_1=bench.base_iou_at_1, user_nsr_at_1=bench.user.nsr,
                   user_instances=bench.user.instances, n_clicks=int(bench.num_clicks),
                   target_iou=float(bench.threshold))
        rows.append(row)
    return rows


def _fmt(value: float, pattern: str, scale: float = 1.0) -> str:
    return "–" if value is None or not math.isfinite(value) else pattern % (value * scale)


def _pm(mean: float, std: float, pattern: str, std_pattern: str, scale: float = 1.0) -> str:
    """``mean±std``, or "–" when the mean was not run."""
    if mean is None or not math.isfinite(mean):
        return "–"
    return _fmt(mean, pattern, scale) + "±" + _fmt(std, std_pattern, scale)


def to_markdown(benchmarks: Mapping[str, DatasetBenchmark]) -> str:
    """The NoC table (and first-round columns when any dataset has real clicks) as Markdown."""
    rows = table_rows(benchmarks)
    clicks, target = budget_labels(benchmarks)
    with_users = any(r["user_instances"] for r in rows)
    header = ["dataset", "N", f"NoC{clicks}@{target} Sample", "Base", "ΔSB %", "ΔGR %", "ΔHH %",
              f"NoF{clicks}@{target} Sample", "NoF Base", f"IoU-AuC{clicks} Sample", "AuC Base", f"NSR@{clicks}"]
    if with_users:
        header += ["User IoU@1", "Sample IoU@1", "Base IoU@1", "NSR@1"]
    cell_rows = []
    for r in rows:
        cells = [r["dataset"], str(r["instances"]),
                 _pm(r["noc_sample"], r["noc_sample_std"], "%.2f", "%.2f"),
                 _fmt(r["noc_base"], "%.2f"), _fmt(r["noc_delta_sb_pct"], "%.2f"),
                 _fmt(r["noc_delta_gr_pct"], "%.2f"), _fmt(r["noc_delta_hh_pct"], "%.2f"),
                 _pm(r["nof_sample"], r["nof_sample_std"], "%.1f", "%.2f"),
                 _fmt(r["nof_base"], "%d"),
                 _pm(r["auc_sample"], r["auc_sample_std"], "%.2f", "%.2f", 100),
                 _fmt(r["auc_base"], "%.2f", 100), _fmt(r["nsr_at_20"], "%.2f", 100)]
        if with_users:
            cells += [_pm(r["user_iou_at_1"], r["user_iou_at_1_std"], "%.2f", "%.2f", 100),
                      _pm(r["sample_iou_at_1"], r["sample_iou_at_1_std"], "%.2f", "%.2f", 100),
                      _fmt(r["base_iou_at_1"], "%.2f", 100), _fmt(r["user_nsr_at_1"], "%.2f", 100)]
        cell_rows.append(cells)
    return markdown_table(header, cell_rows, align_numbers=False)


def to_csv(benchmarks: Mapping[str, DatasetBenchmark]) -> str:
    """Every `CSV_COLUMNS` value per dataset (NaN for quantities that were not run; `csv_columns` names)."""
    clicks, _ = budget_labels(benchmarks)
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=csv_columns(clicks), lineterminator="\n")
    writer.writeheader()
    for row in table_rows(benchmarks):
        row[f"nsr_at_{clicks}"] = row.pop("nsr_at_20")
        writer.writerow(row)
    return out.getvalue()


def write_tables(benchmarks: Mapping[str, DatasetBenchmark], out_dir, stem: str = REPORT_STEM) -> list[pathlib.Path]:
    """Writes ``<stem>.md`` and ``<stem>.csv`` into ``out_dir`` (the report's ``rclicks.md`` / ``.csv``; the
    command writes the same table as the run directory's ``summary.md`` / ``.csv``); returns their paths."""
    out_dir = pathlib.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    return list(write_table_files(out_dir, stem, to_markdown(benchmarks), to_csv(benchmarks)).values())


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
      gt: bool[H, W] object mask (outlined thin and white, `figures.draw_gt_outline`).
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

    from jaxseg_robust.reports.figures import draw_gt_outline  # noqa: PLC0415

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
    draw_gt_outline(ax, gt)
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


def _curves_of(payload: Mapping) -> tuple[np.ndarray | None, np.ndarray | None]:
    """(base f64[R] or None, groups f64[G, R] or None) IoU per round of an RClicks payload (JSON null -> NaN)."""
    def array(value, ndim):
        if value is None:
            return None
        values = np.array([[math.nan if v is None else v for v in row] for row in value] if ndim == 2
                          else [math.nan if v is None else v for v in value], np.float64)
        return values if values.size else None

    return array(payload.get("base_iou"), 1), array(payload.get("group_iou"), 2)


def rclicks_hardness(record: Mapping) -> float:
    """A record's score for ``--plot-instances worst`` (lower = harder): the mean IoU over the rounds of the
    clicking groups (the sample's IoU-AuC), or of the baseline clicker when no group ran; NaN when neither."""
    base, groups = _curves_of(record.get("payload") or {})
    values = groups if groups is not None else base
    if values is None or not np.isfinite(values).any():
        return math.nan
    return float(np.nanmean(values))


def instance_curves(payload: Mapping) -> dict[str, np.ndarray]:
    """label -> f64[R] IoU per round: ``baseline`` and, with groups, ``worst group`` / ``mean of groups`` /
    ``best group`` (per round the min / mean / max over the clicking groups, NaN skipped)."""
    base, groups = _curves_of(payload)
    curves = {} if base is None else {"baseline": base}
    if groups is not None:
        with np.errstate(invalid="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # a round where every group is NaN stays NaN
            curves.update({"worst group": np.nanmin(groups, axis=0), "mean of groups": np.nanmean(groups, axis=0),
                           "best group": np.nanmax(groups, axis=0)})
    return curves


def plot_instance_curves(record: Mapping, path) -> pathlib.Path | None:
    """Saves the IoU-per-round figure of one RClicks record (`instance_curves`); None when it has no curve."""
    from jaxseg_robust.reports.figures import plot_curves  # noqa: PLC0415

    curves = instance_curves(record.get("payload") or {})
    if not curves:
        return None
    groups = len((record["payload"].get("group_iou") or []))
    title = f"{record['dataset']}/{record['id']}: IoU per round (baseline clicker; {groups} clicking groups)"
    return plot_curves(curves, path, title=title, ylabel="IoU")
