"""The perturbation battery's tables laid out like the paper's Tables 1-3 (docs/protocols/perturbation.md §9).

* `worst_case_rows`: the layout of Tables 1 and 2 — one row per metric and
  background mode (Acc, Acc fg, CmIoU, CmIoU fg, NmIoU, NmIoU fg; the "fg"
  rows only for models with a background class), one column per run (model),
  each cell ``clean / robust`` in percent, robust = the per-image worst case
  over the battery (§5).
* `per_attack_rows`: the layout of Table 3 — one row per attack in the
  paper's order (clean, PAdam-CE, PAdam-Cos, SEA-JSD, SEA-MCE, SEA-MSL,
  SEA-BCE, ALMAProx, DAG-0.001, DAG-0.003, PDPGD, aggregated), columns Acc,
  CmIoU, NmIoU, one column group per run.

Both are pure functions of loaded runs (`jaxseg_robust.reports.perturb.PerturbRun`);
`write_paper_tables` writes them as Markdown and CSV.
"""

from __future__ import annotations

import math
import pathlib
from collections.abc import Mapping, Sequence

from jaxseg_robust.attacks.perturb.ensemble import CANDIDATE_LABELS
from jaxseg_robust.reports import tables
from jaxseg_robust.reports.perturb_scores import battery_table, dataset_metrics

PAPER_ATTACK_ORDER = ("clean", "padam_ce", "padam_cos", "sea_jsd", "sea_mce", "sea_msl", "sea_bce", "alma_prox",
                      "dag_0.001", "dag_0.003", "pdpgd")
METRICS = (("accuracy", "Acc"), ("cmiou", "CmIoU"), ("nmiou", "NmIoU"))
AGGREGATED = "aggregated"


def percent(value: float) -> str:
    """A fraction as a percentage with two decimals (``"nan"`` when undefined)."""
    return "nan" if value is None or math.isnan(value) else f"{100 * value:.2f}"


def _modes(run) -> list[bool]:
    return [True] if run.background_class is None else [True, False]


def run_columns(run, with_background: bool) -> dict[str, dict[str, float]]:
    """{row name: {metric: fraction}} of one run and background mode: ``clean``, every attack, ``aggregated``.

    ``clean`` comes from the clean predictions the run recorded (also when the
    clean image was not a candidate); ``aggregated`` follows the run's
    ``select_with_background`` setting.
    """
    background = run.background_class or 0
    rows = battery_table(run.names, run.confusions, with_background=with_background, background_class=background,
                         select_with_background=run.config.get("select_with_background"))
    clean = dataset_metrics(run.clean, with_background=with_background, background_class=background)
    rows["clean"] = {key: clean[key] for key, _ in METRICS}
    return rows


def worst_case_rows(runs: Sequence, labels: Sequence[str]) -> list[dict[str, str]]:
    """Tables 1-2: rows ``metric`` x background mode, one ``clean / robust`` column per run (percent).

    Args:
      runs: loaded perturb runs (one per model); labels: their column names.

    Returns:
      dicts with ``metric``, ``setting`` ("" or "fg") and one entry per label.
    """
    if len(runs) != len(labels):
        raise ValueError(f"{len(runs)} runs for {len(labels)} labels")
    columns = [{mode: run_columns(run, mode) for mode in _modes(run)} if run.keys else {} for run in runs]
    any_fg = any(run.background_class is not None for run in runs)
    rows = []
    for key, name in METRICS:
        for with_background in ((True, False) if any_fg else (True,)):
            row = {"metric": name, "setting": "" if with_background else "fg"}
            for label, column in zip(labels, columns):
                values = column.get(with_background)
                row[label] = "—" if values is None else \
                    f"{percent(values['clean'][key])} / {percent(values[AGGREGATED][key])}"
            rows.append(row)
    return rows


def per_attack_rows(run, with_background: bool = True) -> list[dict]:
    """Table 3 for one run: rows in the paper's attack order plus ``aggregated``; Acc / CmIoU / NmIoU (fractions).

    Returns:
      dicts with ``attack`` (display label) and ``accuracy``, ``cmiou``, ``nmiou``; attacks the run did not
      include are left out.
    """
    if not run.keys:
        return []
    columns = run_columns(run, with_background)
    order = [name for name in PAPER_ATTACK_ORDER if name in columns] + [AGGREGATED]
    return [{"attack": CANDIDATE_LABELS.get(name, name), **{key: columns[name][key] for key, _ in METRICS}}
            for name in order]


def worst_case_markdown(runs: Sequence, labels: Sequence[str]) -> str:
    """`worst_case_rows` as a Markdown table."""
    rows = worst_case_rows(runs, labels)
    header = ["metric", "setting", *labels]
    return tables.markdown_table(header, [[row[c] for c in header] for row in rows], align_numbers=False)


def per_attack_markdown(run, with_background: bool = True) -> str:
    """`per_attack_rows` as a Markdown table (percent)."""
    rows = per_attack_rows(run, with_background)
    cells = [[row["attack"], *(percent(row[key]) for key, _ in METRICS)] for row in rows]
    return tables.markdown_table(["attack", *(name + " %" for _, name in METRICS)], cells, align_numbers=False)


def _csv(path: pathlib.Path, rows: Sequence[Mapping]) -> None:
    lines = []
    if rows:
        header = list(rows[0])
        lines.append(",".join(header))
        lines += [",".join(str(row[c]) for c in header) for row in rows]
    path.write_text("\n".join(lines) + "\n")


def write_paper_tables(run, out: pathlib.Path, label: str) -> dict[str, pathlib.Path]:
    """Writes ``worst_case.md/.csv`` and ``per_attack.md/.csv`` (both background modes) into ``out``."""
    paths = {"worst_case_md": out / "worst_case.md", "worst_case_csv": out / "worst_case.csv",
             "per_attack_md": out / "per_attack.md", "per_attack_csv": out / "per_attack.csv"}
    paths["worst_case_md"].write_text(worst_case_markdown([run], [label]) + "\n")
    _csv(paths["worst_case_csv"], worst_case_rows([run], [label]))
    parts, rows = [], []
    for with_background in _modes(run):
        mode = "with background" if with_background else "without background"
        parts += [f"### {mode}", "", per_attack_markdown(run, with_background), ""]
        rows += [{"mode": mode, **row} for row in per_attack_rows(run, with_background)]
    paths["per_attack_md"].write_text("\n".join(parts))
    _csv(paths["per_attack_csv"], [{k: (repr(v) if isinstance(v, float) else v) for k, v in r.items()} for r in rows])
    return paths
