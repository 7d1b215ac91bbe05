"""Text, CSV and Markdown of the dataset evaluators' results (Boundary AP / PQ, docs/protocols/boundary_ap_pq.md).

The terminal text is what the official evaluators print (``COCOeval.summarize``
lines, LVIS' ``print_results`` lines, panopticapi's PQ table), so a reader
finds the familiar layout. One unit everywhere else: **fractions in [0, 1]**,
as ``COCOeval.summarize`` prints them (AP 0.412 is 41.2 %). The CSV holds
``metric,value`` rows with the standard names and full-precision fractions,
the per-category CSV one row per category, and the Markdown beside them and
the printed per-category table (`per_category_markdown`) the same fractions to
three decimals (`fraction_text`; ``-`` = undefined, -1 in the CSV as the
references print it). The one exception is panopticapi's table, printed in
percent as panopticapi prints it, with "percent" in its header
(`panoptic_text`).
"""

from __future__ import annotations

import math
import pathlib

from jaxseg_robust.evaluation.cocoeval import summary_lines
from jaxseg_robust.metrics.coco_ap import COCO_PARAMS, APParams
from jaxseg_robust.reports.tables import csv_text, markdown_table

_LVIS_GROUPS = {"APr": "r", "APc": "c", "APf": "f"}


def _line(kind: int, iou, area: str, max_dets: int, value: float, extra: str = "") -> str:
    title, short = ("Average Precision", "(AP)") if kind else ("Average Recall", "(AR)")
    iou_text = "0.50:0.95" if iou is None else f"{iou:0.2f}"
    setting = f"IoU={iou_text:<9} | area={area:>6s} | maxDets={max_dets:>3d}{extra}"
    return f" {title:<18} {short} @[ {setting} ] = {value:0.3f}"


def instance_text(summary: dict, dataset: str, lvis_max_dets: int = 300, params: APParams = COCO_PARAMS) -> str:
    """The official evaluators' summary lines (COCO: 12, with the IoU range and max-dets of ``params``; LVIS: 13)."""
    if dataset != "lvis":
        return "\n".join(summary_lines(list(summary.values()), params.iou_thresholds, params.max_dets))
    lines = []
    for name, value in summary.items():
        kind = 1 if name.startswith("AP") else 0
        iou = {"AP50": 0.5, "AP75": 0.75}.get(name)
        area = {"s": "s", "m": "m", "l": "l"}.get(name[2:3], "all") if name not in _LVIS_GROUPS else "all"
        group = _LVIS_GROUPS.get(name, "all")
        lines.append(_line(kind, iou, area, lvis_max_dets, value, f" catIds={group:>3s}"))
    return "\n".join(lines)


PANOPTIC_TABLE_UNIT = "percent"  # the header cell of panopticapi's table (its values are x100)


def panoptic_text(groups: dict) -> str:
    """panopticapi's table: PQ, SQ, RQ in percent (its header says so) and the number of categories per group."""
    lines = ["{:10s}| {:>5s}  {:>5s}  {:>5s} {:>5s}".format(PANOPTIC_TABLE_UNIT, "PQ", "SQ", "RQ", "N"),
             "-" * (10 + 7 * 4)]
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


FRACTIONS_NOTE = ("Values are fractions in [0, 1], as COCOeval's summarize prints them (0.412 = 41.2 %); "
                  "`-` = undefined (no ground truth in that setting).")


def fraction_text(value: float) -> str:
    """A metric as the summary lines print it: a fraction to three decimals; ``-`` when undefined (< 0)."""
    if isinstance(value, float) and math.isnan(value):
        return "nan"
    return "-" if value < 0 else f"{value:.3f}"


def per_category_markdown(per_category: list[dict], columns: tuple[str, ...]) -> str:
    """The per-category table (``name (id)`` and ``columns``) in `fraction_text` cells: printed and in ``FILE.md``."""
    return markdown_table(("category",) + tuple(columns),
                          ([f"{r['name']} ({r['category_id']})"] + [fraction_text(r[c]) for c in columns]
                           for r in per_category))


def summary_markdown(title: str, summary: dict, per_category: list[dict], columns: tuple[str, ...]) -> str:
    """The Markdown file: the summary and the per-category table, both in fractions (`fraction_text`)."""
    parts = [f"# {title}", "", FRACTIONS_NOTE, "",
             markdown_table(("metric", "value"), ([name, fraction_text(value)] for name, value in summary.items()))]
    if per_category:
        parts += ["", "## Per category", "", per_category_markdown(per_category, columns)]
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


__all__ = ["PANOPTIC_TABLE_UNIT", "FRACTIONS_NOTE", "instance_text", "panoptic_text", "summary_csv",
           "per_category_csv", "fraction_text", "per_category_markdown", "summary_markdown", "write_outputs"]
