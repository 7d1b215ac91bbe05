"""Text, CSV and Markdown of the dataset evaluators' results (Boundary AP / PQ, docs/protocols/boundary_ap_pq.md).

The terminal text is what the official evaluators print (``COCOeval.summarize``
lines, LVIS' ``print_results`` lines, panopticapi's PQ table), so a reader
finds the familiar layout. The CSV holds ``metric,value`` rows with the
standard names and full-precision fractions; the Markdown beside it shows the
same numbers as percentages plus the per-category table.
"""

from __future__ import annotations

import math
import pathlib

from jaxseg_robust.reports.tables import csv_text, markdown_table

_COCO_LINES = (  # name -> (AP or AR, IoU label, area, maxDets index)
    ("AP", 1, None, "all", 2), ("AP50", 1, 0.5, "all", 2), ("AP75", 1, 0.75, "all", 2),
    ("APs", 1, None, "small", 2), ("APm", 1, None, "medium", 2), ("APl", 1, None, "large", 2),
    ("AR1", 0, None, "all", 0), ("AR10", 0, None, "all", 1), ("AR100", 0, None, "all", 2),
    ("ARs", 0, None, "small", 2), ("ARm", 0, None, "medium", 2), ("ARl", 0, None, "large", 2),
)
_LVIS_GROUPS = {"APr": "r", "APc": "c", "APf": "f"}


def _line(kind: int, iou, area: str, max_dets: int, value: float, extra: str = "") -> str:
    title, short = ("Average Precision", "(AP)") if kind else ("Average Recall", "(AR)")
    iou_text = "0.50:0.95" if iou is None else f"{iou:0.2f}"
    setting = f"IoU={iou_text:<9} | area={area:>6s} | maxDets={max_dets:>3d}{extra}"
    return f" {title:<18} {short} @[ {setting} ] = {value:0.3f}"


def instance_text(summary: dict, dataset: str, lvis_max_dets: int = 300) -> str:
    """The official evaluators' summary lines (COCO: 12, LVIS: 13)."""
    if dataset != "lvis":
        return "\n".join(_line(kind, iou, area, (1, 10, 100)[m], summary[name])
                         for name, kind, iou, area, m in _COCO_LINES)
    lines = []
    for name, value in summary.items():
        kind = 1 if name.startswith("AP") else 0
        iou = {"AP50": 0.5, "AP75": 0.75}.get(name)
        area = {"s": "s", "m": "m", "l": "l"}.get(name[2:3], "all") if name not in _LVIS_GROUPS else "all"
        group = _LVIS_GROUPS.get(name, "all")
        lines.append(_line(kind, iou, area, lvis_max_dets, value, f" catIds={group:>3s}"))
    return "\n".join(lines)


def panoptic_text(groups: dict) -> str:
    """panopticapi's table: PQ, SQ, RQ (percent) and the number of categories per group."""
    lines = ["{:10s}| {:>5s}  {:>5s}  {:>5s} {:>5s}".format("", "PQ", "SQ", "RQ", "N"), "-" * (10 + 7 * 4)]
    for name, values in groups.items():
        lines.append("{:10s}| {:5.1f}  {:5.1f}  {:5.1f} {:5d}".format(
            name, 100 * values["pq"], 100 * values["sq"], 100 * values["rq"], values["n"]))
    return "\n".join(lines)


def summary_csv(summary: dict) -> str:
    """``metric,value`` rows, fractions at full precision (-1 = undefined, as the references print)."""
    return csv_text(("metric", "value"), ([name, repr(float(value))] for name, value in summary.items()))


def per_category_csv(rows: list[dict]) -> str:
    """One row per category with every key of the dicts (fractions at full precision)."""
    if not rows:
        return csv_text(("category_id",), [])
    header = list(rows[0])
    return csv_text(header, ([repr(float(r[k])) if isinstance(r[k], float) else r[k] for k in header] for r in rows))


def _percent(value: float) -> str:
    if isinstance(value, float) and math.isnan(value):
        return "nan"
    return "-" if value < 0 else f"{100 * value:.2f}"


def summary_markdown(title: str, summary: dict, per_category: list[dict], columns: tuple[str, ...]) -> str:
    """The Markdown file: the summary (percent) and the per-category table."""
    parts = [f"# {title}", "", "Values in percent; `-` = undefined (no ground truth in that setting).", "",
             markdown_table(("metric", "value"), ([name, _percent(value)] for name, value in summary.items()))]
    if per_category:
        parts += ["", "## Per category", "",
                  markdown_table(("category",) + columns,
                                 ([f"{r['name']} ({r['category_id']})"] + [_percent(r[c]) for c in columns]
                                  for r in per_category))]
    return "\n".join(parts) + "\n"


def write_outputs(out_csv, title: str, summary: dict, per_category: list[dict],
                  columns: tuple[str, ...]) -> list[pathlib.Path]:
    """Writes ``FILE.csv`` (summary), ``FILE.per_category.csv`` and ``FILE.md`` beside it; returns the paths."""
    out_csv = pathlib.Path(out_csv)
    out_csv.parent.mkdir(parents=True, exist_ok=True)
    stem = out_csv.with_suffix("")
    paths = [out_csv, stem.with_name(stem.name + ".per_category.csv"), stem.with_suffix(".md")]
    paths[0].write_text(summary_csv(summary), encoding="utf-8")
    paths[1].write_text(per_category_csv(per_category), encoding="utf-8")
    paths[2].write_text(summary_markdown(title, summary, per_category, columns), encoding="utf-8")
    return paths


__all__ = ["instance_text", "panoptic_text", "summary_csv", "per_category_csv", "summary_markdown", "write_outputs"]
