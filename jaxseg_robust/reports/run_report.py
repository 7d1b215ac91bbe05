"""The report of any run directory: dispatch on the manifest's protocol.

`write_run_report(run_dir, out_dir)` reads ``RUN_DIR/manifest.json``
(``config.protocol``) and writes that protocol's tables and plots into
``out_dir`` (default ``RUN_DIR/report``):

  tetris   `jaxseg_robust.reports.tetris.write_report` (AuC Min/Max/Δ, baseline
           NoC@80/85/90, seconds per click, mIoU-per-click curves, clicks and
           final predicted masks over the image, ``ious.csv``);
  grid     `jaxseg_robust.reports.grid.write_report` (min/max/baseline table,
           click heatmaps over the image, box-size and corner heatmaps);
  breps    `jaxseg_robust.reports.breps` tables (IoU-Tight/Min/Max/Δ@BBox and
           the other modes) plus, here, the attack's boxes drawn over the image
           (records that carry a ``source``, `jaxseg_robust.reports.sources`):
           the evaluated ``box`` solid, the reference's ``box_clipped`` thin
           and dashed where it differs; and, where the run directory holds
           them, each attack's predicted mask with its box
           (`jaxseg_robust.reports.artifacts`);
  rclicks  `jaxseg_robust.reports.rclicks.write_tables` (``rclicks.md`` / ``.csv``: the NoC20@90 table; the NoC
           target is the benchmark's 0.9: the run does not record ``--target-iou``),
           ``ious.csv`` (IoU and BIoU per instance, clicker (base, G1..) and click)
           and IoU-per-round curves of a few instances;
  perturb  `jaxseg_robust.reports.perturb.write_report` when that module is
           installed (skipped with a note otherwise).

Per-instance figures are drawn for the instances ``plot_instances`` picks
(`jaxseg_robust.reports.plot_selection`: ``worst N`` by each protocol's
hardness score, or ``first N``; default worst 4 per dataset), with the GT
outline where the record holds it (docs/ARCHITECTURE.md, "Figures").

A directory without a manifest whose sub-directories are run directories
(e.g. ``jaxseg-robust demo``'s output) gets one report per sub-run in
``out_dir/<sub-run>/`` and an index ``out_dir/report.md`` that includes them.
"""

from __future__ import annotations

import importlib
import pathlib
from collections.abc import Callable

import numpy as np

from jaxseg_robust.reports.report_files import (
    REPORT_DIR,
    example_records,
    file_stem,
    load_run_records,
    report_folder,
    write_report_page,
    write_table_files,
)

MANIFEST = "manifest.json"


class ReportError(ValueError):
    """The directory is not a run directory (or a folder of them), or its protocol is unknown."""


def protocol_of(run_dir) -> str:
    """The ``config.protocol`` of a run directory's manifest.

    Raises:
      ReportError: no manifest, or no protocol recorded.
    """
    from jaxseg_robust.runner.rundir import read_manifest  # noqa: PLC0415

    path = pathlib.Path(run_dir)
    if not (path / MANIFEST).is_file():
        raise ReportError(f"{path} is not a run directory (no {MANIFEST})")
    protocol = (read_manifest(path).get("config") or {}).get("protocol")
    if not protocol:
        raise ReportError(f"{path / MANIFEST} records no config.protocol")
    return str(protocol)


def sub_runs(directory) -> list[pathlib.Path]:
    """Immediate sub-directories that are run directories, in creation order (manifest ``created``, then name)."""
    from jaxseg_robust.runner.rundir import read_manifest  # noqa: PLC0415

    path = pathlib.Path(directory)
    if not path.is_dir():
        return []
    runs = [p for p in path.iterdir() if p.is_dir() and (p / MANIFEST).is_file()]
    return sorted(runs, key=lambda p: (str(read_manifest(p).get("created", "")), p.name))


# ---- BREPS: tables from reports.breps, boxes drawn here -------------------------------------------

ATTACK_COLOURS = {"min": "tab:red", "max": "tab:green"}
CLIPPED_NOTE = "thin dashed: the reference's clipped copy (box_clipped), not evaluated"
NOT_EVALUATED = "(not evaluated)"  # ends the legend label of a drawn box_clipped


def _attack_parts(payload, mode: str) -> dict:
    """attack -> its part of a BREPS payload ("min" / "max"; minmax records nest them, min / max are flat)."""
    if mode == "minmax":
        return {attack: payload[attack] for attack in ("min", "max") if attack in payload}
    return {mode: payload} if mode in ("min", "max") else {}


def _iou_label(iou) -> str:
    return "" if iou is None else f" (IoU {100 * float(iou):.1f})"


def breps_boxes(payload, mode: str) -> list:
    """The `figures.DrawnBox` es of one BREPS record: the tight box (yellow, dashed), each attack's evaluated
    ``box`` (original-image pixels x1, y1, x2, y2; solid) and, where it differs, its ``box_clipped`` (thin dashed)."""
    from jaxseg_robust.reports.figures import DrawnBox  # noqa: PLC0415

    boxes = []
    if "tight_box" in payload:
        boxes.append(DrawnBox(f"tight{_iou_label(payload.get('tight_iou'))}", payload["tight_box"], "yellow", "--"))
    for attack, part in _attack_parts(payload, mode).items():
        if part.get("box") is None:
            continue
        colour = ATTACK_COLOURS[attack]
        boxes.append(DrawnBox(f"{attack} box{_iou_label(part.get('iou'))}", part["box"], colour))
        clipped = part.get("box_clipped")
        if clipped is not None and not np.allclose(np.asarray(clipped, float), np.asarray(part["box"], float)):
            boxes.append(DrawnBox(f"{attack} box_clipped {NOT_EVALUATED}", clipped, colour, "--", 0.8))
    return boxes


def breps_box_figure(record, image, gt, mode: str):
    """The tight and adversarial boxes of one BREPS record over its image with the GT outline (a figure)."""
    from jaxseg_robust.reports.figures import prompts_figure  # noqa: PLC0415

    boxes = breps_boxes(record["payload"], mode)
    note = f"\n{CLIPPED_NOTE}" if any(b.label.endswith(NOT_EVALUATED) for b in boxes) else ""
    title = f"{record['dataset']}/{record['id']}: tight and adversarial boxes (as evaluated){note}"
    return prompts_figure(image, boxes=boxes, gt=gt, title=title)


def _breps_mask_panels(run_dir, record, image, mode: str) -> list:
    """One `MaskPanel` per attack whose best-box mask the run directory holds (with the evaluated box)."""
    from jaxseg_robust.reports.artifacts import read_mask  # noqa: PLC0415
    from jaxseg_robust.reports.mask_plots import MaskPanel  # noqa: PLC0415

    panels = []
    for attack, part in _attack_parts(record["payload"], mode).items():
        mask = read_mask(run_dir, (record["dataset"], record["id"]), attack, image.shape[:2])
        if mask is not None:
            panels.append(MaskPanel(f"{attack}{_iou_label(part.get('iou'))}", mask, attack, box=part.get("box")))
    return panels


def breps_hardness(record, mode: str) -> float:
    """A record's score for ``--plot-instances worst``: the MIN attack's IoU, the tight box's without MIN."""
    from jaxseg_robust.reports.tables import number  # noqa: PLC0415

    payload = record.get("payload") or {}
    parts = _attack_parts(payload, mode)
    return number(parts["min"].get("iou") if "min" in parts else payload.get("tight_iou"))


def _breps_instance_figures(run_dir, record, image, mode: str, out: pathlib.Path) -> dict[str, pathlib.Path]:
    from jaxseg_robust.reports.figures import save_figure  # noqa: PLC0415
    from jaxseg_robust.reports.mask_plots import plot_mask_panels  # noqa: PLC0415
    from jaxseg_robust.reports.sources import load_source_gt  # noqa: PLC0415

    gt = load_source_gt(record["payload"])
    stem = file_stem(record["dataset"], record["id"])
    paths = {f"boxes_{stem}": save_figure(breps_box_figure(record, image, gt, mode), out / f"boxes_{stem}.png")}
    panels = _breps_mask_panels(run_dir, record, image, mode)
    if panels:
        paths[f"masks_{stem}"] = plot_mask_panels(
            image, panels, out / f"masks_{stem}.png", gt=gt,
            title=f"{record['dataset']}/{record['id']}: predicted mask of each attack's box")
    return paths


def write_breps_report(run_dir, out_dir, *, plot_instances=None) -> dict[str, pathlib.Path]:
    """BREPS tables (`reports.breps`) and, for the attack modes, adversarial boxes and their masks over the image
    for the instances ``plot_instances`` picks (default the worst 4 per dataset by `breps_hardness`)."""
    from jaxseg_robust.reports import breps  # noqa: PLC0415
    from jaxseg_robust.reports.figures import figure_links  # noqa: PLC0415
    from jaxseg_robust.reports.plot_selection import DEFAULT_PLOT_INSTANCES, instances_to_plot  # noqa: PLC0415
    from jaxseg_robust.reports.sources import load_source_image  # noqa: PLC0415
    from jaxseg_robust.runner.rundir import read_manifest  # noqa: PLC0415

    choice = plot_instances or DEFAULT_PLOT_INSTANCES
    mode = read_manifest(run_dir)["config"]["mode"]
    records = load_run_records(run_dir)
    out = report_folder(run_dir, out_dir)
    table = breps.breps_table(records, mode)
    markdown = breps.to_markdown(table)
    paths = write_table_files(out, "breps", markdown, breps.to_csv(table))
    parts = ["# BREPS box robustness", "", markdown, ""]
    if mode in ("min", "max", "minmax"):
        order = "the lowest IoU of MIN first" if "min" in mode else "the lowest tight-box IoU first"
        parts += [f"Instances drawn per dataset: {choice} ({order if choice.mode == 'worst' else 'record order'}).", ""]
        unrecorded: list[str] = []
        ordered = instances_to_plot(records, choice, lambda r: breps_hardness(r, mode))
        for record, image in example_records(ordered, choice.count, lambda r: load_source_image(r["payload"]),
                                             unrecorded):
            figures = _breps_instance_figures(run_dir, record, image, mode, out)
            paths.update(figures)
            parts += figure_links(record["id"], figures)
        if unrecorded:
            parts += [f"{len(unrecorded)} instance(s) without a recorded image source: no box plot.", ""]
    return write_report_page(out, parts, records, paths)


# ---- RClicks and perturb: their own modules --------------------------------------------------------

RCLICKS_CLICK_CSV = "ious.csv"


def rclicks_click_rows(records):
    """``(dataset, id, clicker, click, x, y, label, iou, biou)`` per ok RClicks record: ``base`` and groups
    ``G1``..; ``x, y, label`` from ``base_clicks`` / ``group_clicks`` (``""`` when not recorded); BIoU
    ``""`` (an empty cell) for records written before RClicks recorded ``base_biou`` / ``group_biou``.
    """
    for record in records:
        if record.get("status") != "ok":
            continue
        payload = record.get("payload") or {}
        curves = []
        if payload.get("base_iou") is not None:
            curves.append(("base", payload["base_iou"], payload.get("base_biou"), payload.get("base_clicks")))
        group_ious = payload.get("group_iou") or []
        group_bious = payload.get("group_biou") or [None] * len(group_ious)
        group_clicks = payload.get("group_clicks") or []
        curves += [(f"G{index}", curve, bious, group_clicks[index - 1] if index <= len(group_clicks) else None)
                   for index, (curve, bious) in enumerate(zip(group_ious, group_bious), start=1)]
        for clicker, curve, bious, clicks in curves:
            for click, (iou, biou) in enumerate(zip(curve, bious or [""] * len(curve)), start=1):
                x, y, label = clicks[click - 1] if clicks is not None else ("", "", "")
                yield record["dataset"], record["id"], clicker, click, x, y, label, iou, biou


def _curves_key(record) -> str:
    return f"curves_{file_stem(record['dataset'], record['id'])}"


def write_rclicks_report(run_dir, out_dir, *, plot_instances=None) -> dict[str, pathlib.Path]:
    """RClicks NoC table (`reports.rclicks.write_tables`), the per-click ``ious.csv`` over the run's ok records
    and the IoU-per-round figure of the instances ``plot_instances`` picks (default the worst 4 per dataset by
    `reports.rclicks.rclicks_hardness`)."""
    from jaxseg_robust.metrics.rclicks_benchmark import benchmark_by_dataset  # noqa: PLC0415
    from jaxseg_robust.reports import rclicks  # noqa: PLC0415
    from jaxseg_robust.reports.plot_selection import DEFAULT_PLOT_INSTANCES, instances_to_plot  # noqa: PLC0415
    from jaxseg_robust.reports.tables import click_csv_text  # noqa: PLC0415
    from jaxseg_robust.runner.rundir import read_manifest  # noqa: PLC0415

    choice = plot_instances or DEFAULT_PLOT_INSTANCES
    settings = read_manifest(run_dir)["config"].get("settings") or {}
    records = load_run_records(run_dir)
    out = report_folder(run_dir, out_dir)
    options = {"num_clicks": int(settings["num_rounds"])} if settings.get("num_rounds") else {}
    benchmarks = benchmark_by_dataset(records, **options)
    paths = {"ious_csv": out / RCLICKS_CLICK_CSV}
    paths["ious_csv"].write_text(click_csv_text(rclicks_click_rows(records)), encoding="utf-8")
    parts = ["# RClicks", ""]
    if benchmarks:
        markdown_path, csv_path = rclicks.write_tables(benchmarks, out)
        paths.update(rclicks_md=markdown_path, rclicks_csv=csv_path)  # rclicks.md / rclicks.csv
        parts += [rclicks.to_markdown(benchmarks), ""]
    else:
        parts += ["(no instance evaluated)", ""]
    order = "the lowest mean IoU of the simulated users first" if choice.mode == "worst" else "record order"
    figures = [f"IoU per round of the instances drawn per dataset: {choice} ({order}).", ""]
    undrawn: list[str] = []  # instances without recorded rounds: no figure, the next one is drawn
    for record, path in example_records(instances_to_plot(records, choice, rclicks.rclicks_hardness), choice.count,
                                        lambda r: rclicks.plot_instance_curves(r, out / f"{_curves_key(r)}.png"),
                                        undrawn):
        paths[_curves_key(record)] = path
        figures += [f"![{record['id']}]({path.name})", ""]
    if len(figures) > 2:
        parts += figures
    return write_report_page(out, parts, records, paths)


def write_perturb_report(run_dir, out_dir) -> dict[str, pathlib.Path]:
    """`jaxseg_robust.reports.perturb.write_report`, or a note when that module is not installed."""
    try:
        module = importlib.import_module("jaxseg_robust.reports.perturb")
    except ModuleNotFoundError as error:
        if error.name != "jaxseg_robust.reports.perturb":
            raise
        path = report_folder(run_dir, out_dir) / "report.md"
        path.write_text("# Perturbation attacks\n\nThe perturb report module is not installed; no report.\n",
                        encoding="utf-8")
        return {"report": path}
    return dict(module.write_report(run_dir, out_dir))


def _tetris(run_dir, out_dir, *, plot_instances=None):
    from jaxseg_robust.reports.tetris import write_report  # noqa: PLC0415

    return write_report(run_dir, out_dir, plot_instances=plot_instances)


def _grid(run_dir, out_dir, *, plot_instances=None):
    from jaxseg_robust.reports.grid import write_report  # noqa: PLC0415

    return write_report(run_dir, out_dir, plot_instances=plot_instances)


def _perturb(run_dir, out_dir, *, plot_instances=None):
    del plot_instances  # the battery's report draws no per-instance figure
    return write_perturb_report(run_dir, out_dir)


def _clickability(run_dir, out_dir, plot_instances=None) -> dict[str, pathlib.Path]:
    from jaxseg_robust.reports.clickability import write_clickability_report  # noqa: PLC0415

    return write_clickability_report(run_dir, out_dir, plot_instances=plot_instances)


REPORTERS: dict[str, Callable] = {"tetris": _tetris, "grid": _grid, "breps": write_breps_report,
                                  "rclicks": write_rclicks_report, "clickability": _clickability,
                                  "perturb": _perturb}


def expected_records_format(config) -> str | None:
    """The records layout this version reads for a manifest's ``config`` (None: not named for the protocol)."""
    if config.get("protocol") == "tetris":
        from jaxseg_robust.attacks.clicks import RECORDS_FORMAT  # noqa: PLC0415

        return RECORDS_FORMAT
    if config.get("protocol") == "grid" and config.get("kind") == "click":
        from jaxseg_robust.attacks.grid.clicks import RECORDS_FORMAT  # noqa: PLC0415

        return RECORDS_FORMAT
    return None


def check_report_format(run_dir) -> None:
    """Raises `ReportError` (one line) when the run's records are in another layout than this version reads."""
    from jaxseg_robust.runner.rundir import RECORDS_FORMAT_KEY, read_manifest  # noqa: PLC0415

    config = read_manifest(run_dir).get("config") or {}
    wanted, found = expected_records_format(config), config.get(RECORDS_FORMAT_KEY)
    if wanted is not None and found != wanted:
        was = "an older layout" if found is None else f"layout {found!r}"
        raise ReportError(f"{run_dir}: its records are in {was}; this version reads {wanted!r} (report it with "
                          "the version that wrote it, or run it again)")


def write_run_report(run_dir, out_dir=None, *, plot_instances=None) -> dict[str, pathlib.Path]:
    """Writes the report of a run directory, or of every sub-run of a folder of runs; returns name -> path.

    Args:
      run_dir: a run directory, or a folder whose sub-directories are run directories.
      out_dir: output folder (default ``RUN_DIR/report``).
      plot_instances: `jaxseg_robust.reports.plot_selection.PlotInstances`, the instances whose
        figures each protocol draws (default ``worst 4``: the hardest 4 per dataset).

    Raises:
      ReportError: not a run directory (nor a folder of them), an unknown protocol, or records in another
        layout than this version reads (`check_report_format`).
    """
    path = pathlib.Path(run_dir)
    out = pathlib.Path(out_dir) if out_dir is not None else path / REPORT_DIR
    if (path / MANIFEST).is_file():
        protocol = protocol_of(path)
        if protocol not in REPORTERS:
            raise ReportError(f"{path}: no report for protocol {protocol!r} (known: {', '.join(REPORTERS)})")
        check_report_format(path)
        return dict(REPORTERS[protocol](path, out, plot_instances=plot_instances))
    runs = sub_runs(path)
    if not runs:
        raise ReportError(f"{path} is neither a run directory (no {MANIFEST}) nor a folder of run directories")
    paths: dict[str, pathlib.Path] = {}
    index = [f"# Report of {path.name}", ""]
    for run in runs:
        protocol = protocol_of(run)
        if protocol not in REPORTERS:
            index += [f"## {run.name}", "", f"(no report for protocol {protocol!r})", ""]
            continue
        check_report_format(run)
        written = REPORTERS[protocol](run, out / run.name, plot_instances=plot_instances)
        paths.update({f"{run.name}/{name}": p for name, p in written.items()})
        body = written["report"].read_text(encoding="utf-8")
        # the sub-report's images live in its own folder: point the index's links there
        body = body.replace("](", f"]({run.name}/")
        body = "\n".join("##" + line if line.startswith("#") else line for line in body.splitlines())
        index += [f"## {run.name} ({protocol})", "", body, ""]
    out.mkdir(parents=True, exist_ok=True)
    paths["report"] = out / "report.md"
    paths["report"].write_text("\n".join(index), encoding="utf-8")
    return paths


__all__ = ["ReportError", "REPORTERS", "protocol_of", "expected_records_format", "check_report_format", "sub_runs",
           "write_breps_report", "rclicks_click_rows", "write_rclicks_report", "write_perturb_report",
           "write_run_report"]
