"""Tables and figures of the clickability evaluation (RClicks Table 3; docs/protocols/rclicks.md,
"Clickability evaluation").

A record's payload (`jaxseg_robust.runs.clickability`): ``full_stem``, ``click_type`` (first / fn / fp),
``clicks_xy`` (the real clicks, (x, y) pixels) and ``metrics`` ``{model: {"l1", "ks2d", "wasserstien",
"nss", "pde"}}``. From the records of one dataset:

  per-image CSV   the authors' ``<Dataset>_per_image.csv``: ``full_stem, model_name, click_type, l1, ks2d,
                  wasserstien, nss, pde``, one row per task and model (models in the run's order)
  mean CSV        the authors' ``<Dataset>_mean.csv``: ``model_name`` and the mean of each metric over the
                  tasks (pandas ``groupby(model_name).mean()``: models sorted, NaN skipped)
  Table 3 CSV     the authors' ``eval_cm_tetris.csv`` (one dataset) / ``eval_cm_all.csv`` (a ``Dataset``
                  column first) layout: KS, PL1, WD, NSS to 2 decimals, PDE as ``1.36E-05``
  summary         per dataset, click type and model: the task count and each metric's mean and standard
                  deviation over the tasks (Markdown ``mean ± std``; CSV ``<metric>`` and ``<metric>_std``);
                  click type ``all`` pools the tasks as the authors' tables do, and a dataset whose tasks
                  have several click types gets one row group per type too
"""

from __future__ import annotations

import csv
import io
import math
import os
import pathlib
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

__all__ = ["ALL_TASKS", "METRICS", "MODEL_LABELS", "TABLE3_HEADER", "model_label", "task_rows", "per_image_csv",
           "mean_rows", "click_type_means",
           "mean_csv", "table3_csv", "summary_markdown", "summary_csv", "write_tables", "write_clickability_report",
           "ranked_keys", "clickability_figure",
           "plot_clickability"]

METRICS = ("l1", "ks2d", "wasserstien", "nss", "pde")  # the authors' per-image columns, in their order
CLICK_TYPE_ORDER = ("first", "fn", "fp")  # the clicks CSV's click types, in the summary's order
ALL_TASKS = "all"  # the summary's click type of every task pooled
# Table 3's columns: (metric, header of the authors' eval_cm_*.csv, Markdown header, format)
TABLE3_COLUMNS = (("ks2d", "KS\\,$\\uparrow$", "KS ↑", "{:.2f}"),
                  ("l1", "PL$_1$\\,$\\downarrow$", "PL1 ↓", "{:.2f}"),
                  ("wasserstien", "WD\\,$\\downarrow$", "WD ↓", "{:.2f}"),
                  ("nss", "NSS\\,$\\uparrow$", "NSS ↑", "{:.2f}"),
                  ("pde", "PDE\\,$\\uparrow$", "PDE ↑", "{:.2E}"))
TABLE3_HEADER = ("Model",) + tuple(column[1] for column in TABLE3_COLUMNS)
# The paper's row labels of the models it compares (any other model is labelled by its name).
MODEL_LABELS = {"ud": "UD", "dt": "DT", "saliency_image": "SI", "saliency": "SM", "rclicks_clickability": "Ours"}


def model_label(name: str) -> str:
    """The paper's label of a click model (`MODEL_LABELS`), else its name."""
    return MODEL_LABELS.get(name, name)


def task_rows(records: Iterable[Mapping], models: Sequence[str]) -> list[dict]:
    """The per-image rows of ok records: one per task and model (task order, then ``models``' order)."""
    rows = []
    for record in records:
        payload = record["payload"]
        for name in models:
            values = payload["metrics"][name]
            rows.append({"full_stem": payload["full_stem"], "model_name": name, "click_type": payload["click_type"],
                         **{metric: float(values[metric]) for metric in METRICS}})
    return rows


def _csv_text(header: Sequence[str], rows: Iterable[Sequence]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    return out.getvalue()


def per_image_csv(rows: Sequence[Mapping]) -> str:
    """The authors' ``<Dataset>_per_image.csv`` of `task_rows` (floats as Python's ``repr``)."""
    header = ("full_stem", "model_name", "click_type") + METRICS
    return _csv_text(header, ([row[name] for name in header] for row in rows))


def _nan_mean_std(values: np.ndarray) -> tuple[float, float]:
    finite = values[~np.isnan(values)]
    if finite.size == 0:
        return math.nan, math.nan
    return float(finite.mean()), float(finite.std(ddof=1)) if finite.size > 1 else math.nan


def mean_rows(rows: Sequence[Mapping]) -> dict[str, dict]:
    """``{model: {"tasks": n, metric: mean, metric + "_std": sample std}}`` over the tasks of ``rows``, models
    sorted as pandas' ``groupby`` sorts them; NaN task values are skipped (the std of one value is NaN)."""
    out = {}
    for name in sorted({row["model_name"] for row in rows}):
        mine = [row for row in rows if row["model_name"] == name]
        entry: dict = {"tasks": len(mine)}
        for metric in METRICS:
            entry[metric], entry[f"{metric}_std"] = _nan_mean_std(np.array([row[metric] for row in mine], np.float64))
        out[name] = entry
    return out


def click_type_means(rows: Sequence[Mapping]) -> dict[str, dict]:
    """``{ALL_TASKS: mean_rows(rows)}``, then ``mean_rows`` of each click type's rows (first, fn, fp) when
    ``rows`` hold more than one click type."""
    out = {ALL_TASKS: mean_rows(rows)}
    kinds = {row["click_type"] for row in rows}
    if len(kinds) > 1:
        for kind in sorted(kinds, key=lambda k: (CLICK_TYPE_ORDER + (k,)).index(k)):
            out[kind] = mean_rows([row for row in rows if row["click_type"] == kind])
    return out


def mean_csv(means: Mapping[str, Mapping]) -> str:
    """The authors' ``<Dataset>_mean.csv``: ``model_name`` and the mean of each metric."""
    return _csv_text(("model_name",) + METRICS,
                     ([name] + [means[name][metric] for metric in METRICS] for name in means))


def _table3_cells(means: Mapping, name: str) -> list[str]:
    return [fmt.format(means[name][metric]) for metric, _, _, fmt in TABLE3_COLUMNS]


def table3_csv(by_dataset: Mapping[str, Mapping[str, Mapping]], models: Sequence[str]) -> str:
    """Table 3 in the authors' layout: ``eval_cm_tetris.csv`` for one dataset, ``eval_cm_all.csv`` (a
    ``Dataset`` column first) for several; rows in ``models``' order, labelled by `model_label`.

    Args:
      by_dataset: ``{dataset: mean_rows(...)}``.
    """
    several = len(by_dataset) > 1
    header = (("Dataset",) if several else ()) + TABLE3_HEADER
    rows = []
    for dataset, means in by_dataset.items():
        for name in models:
            if name in means:
                rows.append(([dataset] if several else []) + [model_label(name)] + _table3_cells(means, name))
    return _csv_text(header, rows)


def _spread_cell(entry: Mapping, metric: str, fmt: str) -> str:
    mean, std = entry[metric], entry[f"{metric}_std"]
    return fmt.format(mean) if math.isnan(std) else f"{fmt.format(mean)} ± {fmt.format(std)}"


def _summary_entries(by_dataset: Mapping[str, Mapping[str, Mapping]], models: Sequence[str]):
    """``(dataset, click type, model, its means)`` in the summary's order."""
    for dataset, by_type in by_dataset.items():
        for kind, means in by_type.items():
            for name in models:
                if name in means:
                    yield dataset, kind, name, means[name]


def summary_markdown(by_dataset: Mapping[str, Mapping[str, Mapping]], models: Sequence[str]) -> str:
    """The run's Table 3 per dataset and click type with each metric's spread over the tasks (``mean ± std``).

    Args:
      by_dataset: ``{dataset: click_type_means(...)}``.
    """
    lines = ["| dataset | click type | model | tasks | " + " | ".join(column[2] for column in TABLE3_COLUMNS) + " |",
             "|---|---|---|---:|" + "---:|" * len(TABLE3_COLUMNS)]
    for dataset, kind, name, entry in _summary_entries(by_dataset, models):
        cells = [_spread_cell(entry, metric, fmt) for metric, _, _, fmt in TABLE3_COLUMNS]
        lines.append("| " + " | ".join([dataset, kind, model_label(name), str(entry["tasks"]), *cells]) + " |")
    return "\n".join(lines)


def summary_csv(by_dataset: Mapping[str, Mapping[str, Mapping]], models: Sequence[str]) -> str:
    """``dataset, click_type, model, label, tasks`` and each metric's mean and sample std over the tasks (full
    precision); ``by_dataset`` as `summary_markdown`'s."""
    header = (["dataset", "click_type", "model", "label", "tasks"]
              + [name for metric in METRICS for name in (metric, f"{metric}_std")])
    rows = [[dataset, kind, name, model_label(name), entry["tasks"]]
            + [entry[key] for metric in METRICS for key in (metric, f"{metric}_std")]
            for dataset, kind, name, entry in _summary_entries(by_dataset, models)]
    return _csv_text(header, rows)


def write_tables(records: Sequence[Mapping], models: Sequence[str], out_dir,
                 datasets: Sequence[str] | None = None) -> tuple[dict, list[pathlib.Path]]:
    """The authors' files of ok ``records``: ``<dataset>_per_image.csv`` and ``<dataset>_mean.csv`` per dataset
    (``datasets`` order, default the records'), and ``table3.csv`` (every task pooled, as the authors').

    Returns:
      (``{dataset: click_type_means(...)}``, the paths written).
    """
    from jaxseg_robust.reports.report_files import file_stem  # noqa: PLC0415

    out_dir = pathlib.Path(out_dir)
    ok = [record for record in records if record.get("status") == "ok"]
    if datasets is None:
        datasets = list(dict.fromkeys(record["dataset"] for record in ok))
    by_dataset, paths = {}, []
    for dataset in datasets:
        rows = task_rows([record for record in ok if record["dataset"] == dataset], models)
        if not rows:
            continue
        by_dataset[dataset] = click_type_means(rows)
        for suffix, text in (("per_image", per_image_csv(rows)), ("mean", mean_csv(by_dataset[dataset][ALL_TASKS]))):
            paths.append(out_dir / f"{file_stem(dataset)}_{suffix}.csv")
            paths[-1].write_text(text, encoding="utf-8")
    paths.append(out_dir / "table3.csv")
    pooled = {dataset: by_type[ALL_TASKS] for dataset, by_type in by_dataset.items()}
    paths[-1].write_text(table3_csv(pooled, models), encoding="utf-8")
    return by_dataset, paths


def write_clickability_report(run_dir, out_dir=None, *, plot_instances=None) -> dict[str, pathlib.Path]:
    """``jaxseg-robust report`` of a clickability run: `write_tables` and the table with spreads in
    ``report.md``, with the run's figures of the worst and best instances (drawn by the run, which had the
    models; ``plot_instances`` is not used)."""
    from jaxseg_robust.reports.report_files import load_run_records, report_folder, write_report_page  # noqa: PLC0415
    from jaxseg_robust.runner.rundir import read_manifest  # noqa: PLC0415

    models = tuple(read_manifest(run_dir)["config"]["models"])
    records = load_run_records(run_dir)
    out = report_folder(run_dir, out_dir)
    by_dataset, written = write_tables(records, models, out)
    paths = {path.stem: path for path in written}
    parts = ["# Clickability (RClicks Table 3)", ""]
    parts += [summary_markdown(by_dataset, models), ""] if by_dataset else ["(no instance evaluated)", ""]
    for figure in sorted(pathlib.Path(run_dir).glob("clickability_*.png")):
        parts += [f"![{figure.stem}]({os.path.relpath(figure, out)})", ""]
    return write_report_page(out, parts, records, paths)


def ranked_keys(records: Iterable[Mapping], models: Sequence[str]) -> list[tuple[str, str]]:
    """Task keys of ok records from the worst to the best: by the mean PL1 over ``models`` (high = the
    models' samples far from the real clicks; PL1 is normalised by the object box, so tasks compare)."""
    scored = []
    for record in records:
        values = [record["payload"]["metrics"][name]["l1"] for name in models]
        scored.append((-float(np.nanmean(values)) if not np.all(np.isnan(values)) else math.inf,
                       (record["dataset"], record["id"])))
    return [key for _, key in sorted(scored, key=lambda item: item[0])]


def clickability_figure(image, gt, maps: Mapping[str, np.ndarray], clicks_xy, samples_xy: Mapping[str, np.ndarray],
                        *, title: str = ""):
    """One panel per click model: its map over the dimmed image, the GT outline, the real clicks (green dots,
    label "real clicks") and clicks sampled from the map (magenta crosses, label "sampled").

    Args:
      image: uint8[H, W, 3]; gt: [H, W] (``== 1`` outlined); maps: ``{model: f32[H, W]}`` in panel order;
      clicks_xy: int[n, 2] (x, y) real clicks; samples_xy: ``{model: int[k, 2]}`` (x, y).

    Returns:
      The matplotlib figure (axes titled by `model_label`).
    """
    from jaxseg_robust.reports.figures import _pyplot, draw_gt_outline  # noqa: PLC0415

    image, clicks_xy = np.asarray(image), np.asarray(clicks_xy)
    plt = _pyplot()
    count = len(maps)
    figure, axes = plt.subplots(1, count, figsize=(3.2 * count, 3.6), dpi=100, squeeze=False)
    for axis, (name, click_map) in zip(axes[0], maps.items()):
        click_map = np.asarray(click_map, np.float32)
        if click_map.shape != image.shape[:2]:
            raise ValueError(f"map of {name} has shape {click_map.shape}; the image is {image.shape[:2]}")
        axis.imshow((image.astype(np.float32) * 0.4).astype(np.uint8))
        axis.imshow(np.ma.masked_less_equal(click_map, 0), cmap="magma", alpha=0.7, interpolation="nearest")
        draw_gt_outline(axis, np.asarray(gt) == 1)
        axis.scatter(clicks_xy[:, 0], clicks_xy[:, 1], s=14, c="lime", edgecolors="black", linewidths=0.4,
                     label="real clicks", zorder=3)
        sampled = np.asarray(samples_xy[name])
        axis.scatter(sampled[:, 0], sampled[:, 1], s=14, c="magenta", marker="x", linewidths=0.8,
                     label="sampled", zorder=3)
        axis.set_title(model_label(name), fontsize=9)
        axis.set_axis_off()
    axes[0][0].legend(loc="lower left", fontsize=7, framealpha=0.7)
    if title:
        figure.suptitle(title, fontsize=9)
    return figure


def plot_clickability(path, image, gt, maps, clicks_xy, samples_xy, *, title: str = "") -> pathlib.Path:
    """Saves `clickability_figure` as a PNG (parents created); returns the path."""
    from jaxseg_robust.reports.figures import _pyplot  # noqa: PLC0415

    figure = clickability_figure(image, gt, maps, clicks_xy, samples_xy, title=title)
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, bbox_inches="tight")
    _pyplot().close(figure)
    return path
