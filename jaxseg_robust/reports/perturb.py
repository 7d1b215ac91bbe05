"""Report of a ``jaxseg-robust perturb`` run directory: tables, win counts, histogram, examples.

    python -m jaxseg_robust.reports.perturb RUN_DIR [--out DIR]

Reads the run's manifest (candidate names, classes) and its records (one per
instance: the per-candidate confusion matrices of §5/§6 of
docs/protocols/perturbation.md) and writes, into ``RUN_DIR/report``
by default:

  * ``table.md`` / ``table.csv``: Acc (pooled), CmIoU, NmIoU (image-wise) per
    candidate (clean first), plus the per-image worst case over all
    candidates ("aggregated", selected by accuracy for Acc and by per-image
    mIoU for CmIoU/NmIoU), with background and, when the model has a
    background class, without it;
  * ``wins.csv``: per attack, how many images it was the per-image worst
    case for (selection by per-image mIoU and by accuracy; ties go to the
    earlier candidate in C-R order, so the clean image wins where no attack
    lowered the score);
  * ``miou_hist.png``: histogram of the image-wise mIoU, clean vs aggregated;
  * ``examples.png``: the example instances the run saved (clean image,
    adversarial image of the per-image worst attack, amplified
    perturbation, GT, clean and adversarial predictions);
  * ``report.md``: all of the above in one page.
Plots use matplotlib's Agg canvas (no display needed).
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import io
import math
import pathlib
import sys
from typing import Any, Mapping, Sequence

import numpy as np

from jaxseg_robust.attacks.perturb.ensemble import CANDIDATE_LABELS
from jaxseg_robust.reports.perturb_scores import aggregate, battery_table
from jaxseg_robust.reports.perturb_tables import write_paper_tables
from jaxseg_robust.attacks.perturb.common import per_image_scores
from jaxseg_robust.reports import tables
from jaxseg_robust.reports.report_files import report_folder
from jaxseg_robust.runner.records import STATUS_OK, latest_records, read_run_records
from jaxseg_robust.runner.rundir import read_manifest

PROTOCOL = "perturb"
EXAMPLES_DIR = "examples"
METRIC_COLUMNS = ("accuracy", "cmiou", "nmiou")


@dataclasses.dataclass(frozen=True)
class PerturbRun:
    """The statistics of a perturb run, loaded from its directory.

    Attributes:
      run_dir: the run directory.
      config: the manifest's config section.
      names: candidate names (C-R order, "clean" first when included).
      num_classes: C; background_class: index or None.
      keys: (dataset, id) of every ok instance, in record order.
      confusions: int64[K, N, C, C] per-candidate per-image confusion matrices.
      forwards, backwards: int64[K, N] attack cost per instance.
      failed: (dataset, id, error) of the failed instances.
      clean: int64[N, C, C] confusion matrices of the clean predictions (the
        record's ``clean_confusion``, or the clean candidate's for older runs;
        None when neither exists).
    """

    run_dir: pathlib.Path
    config: Mapping[str, Any]
    names: tuple[str, ...]
    num_classes: int
    background_class: int | None
    keys: tuple[tuple[str, str], ...]
    confusions: np.ndarray
    forwards: np.ndarray
    backwards: np.ndarray
    failed: tuple[tuple[str, str, str], ...]
    clean: np.ndarray | None = None


def load_run(run_dir) -> PerturbRun:
    """Reads a perturb run directory (every records file, latest record per instance).

    Raises:
      FileNotFoundError: no manifest.
      ValueError: the directory is not a perturb run, or a record does not fit its config.
    """
    run_dir = pathlib.Path(run_dir)
    config = read_manifest(run_dir).get("config") or {}
    if config.get("protocol") != PROTOCOL:
        raise ValueError(f"{run_dir} is not a perturb run (manifest protocol {config.get('protocol')!r})")
    names = tuple(config["candidates"])
    num_classes = int(config["num_classes"])
    background = config.get("background_class")
    keys, confusions, forwards, backwards, failed, clean = [], [], [], [], [], []
    for key, record in sorted(latest_records(read_run_records(run_dir)).items()):
        if record["status"] != STATUS_OK:
            failed.append((key[0], key[1], record.get("error") or ""))
            continue
        payload = record["payload"]
        confusion = np.asarray(payload["confusions"], np.int64)
        if confusion.shape != (len(names), num_classes, num_classes):
            raise ValueError(f"{run_dir}: record {key} has confusions of shape {confusion.shape}; expected "
                             f"{(len(names), num_classes, num_classes)}")
        keys.append(key)
        confusions.append(confusion)
        if "clean_confusion" in payload:
            clean.append(np.asarray(payload["clean_confusion"], np.int64))
        elif "clean" in names:
            clean.append(confusion[names.index("clean")])
        forwards.append(np.asarray(payload["forwards"], np.int64))
        backwards.append(np.asarray(payload["backwards"], np.int64))
    k, c = len(names), num_classes
    stack = (lambda arrays, shape: np.stack(arrays, axis=1) if arrays else np.zeros(shape, np.int64))
    return PerturbRun(run_dir=run_dir, config=config, names=names, num_classes=num_classes,
                      background_class=None if background is None else int(background), keys=tuple(keys),
                      confusions=stack(confusions, (k, 0, c, c)), forwards=stack(forwards, (k, 0)),
                      backwards=stack(backwards, (k, 0)), failed=tuple(failed),
                      clean=(np.stack(clean) if clean else np.zeros((0, c, c), np.int64))
                      if len(clean) == len(keys) else None)


def _modes(run: PerturbRun) -> list[tuple[str, bool]]:
    modes = [("with background", True)]
    if run.background_class is not None:
        modes.append(("without background", False))
    return modes


def label(name: str) -> str:
    """Display label of a candidate name (``"padam_cos"`` -> ``"PAdam-Cos"``)."""
    return CANDIDATE_LABELS.get(name, name)


def metric_rows(run: PerturbRun) -> list[dict]:
    """Acc / CmIoU / NmIoU per candidate and aggregated, per background mode (fractions; NaN if undefined).

    Returns:
      dicts with ``mode``, ``attack`` (display label), ``accuracy``, ``cmiou``, ``nmiou``, ``images``.
    """
    rows = []
    if run.confusions.shape[1] == 0:
        return rows
    for mode, with_background in _modes(run):
        table = battery_table(run.names, run.confusions, with_background=with_background,
                              background_class=run.background_class or 0,
                              select_with_background=run.config.get("select_with_background"))
        for name, values in table.items():
            rows.append({"mode": mode, "attack": "aggregated" if name == "aggregated" else label(name),
                         **{k: values[k] for k in METRIC_COLUMNS}, "images": run.confusions.shape[1]})
    return rows


def win_counts(run: PerturbRun) -> list[dict]:
    """Per candidate: images for which it is the per-image worst case (with background).

    Returns:
      dicts with ``attack``, ``wins_miou`` (selection by per-image mIoU), ``wins_accuracy``.
    """
    counts = {}
    for metric in ("miou", "accuracy"):
        index, _ = aggregate(run.confusions, metric=metric, with_background=True,
                             background_class=run.background_class or 0)
        counts[metric] = np.bincount(index, minlength=len(run.names)) if index.size else np.zeros(len(run.names), int)
    return [{"attack": label(name), "wins_miou": int(counts["miou"][k]), "wins_accuracy": int(counts["accuracy"][k])}
            for k, name in enumerate(run.names)]


def image_mious(run: PerturbRun) -> tuple[np.ndarray, np.ndarray]:
    """(clean, aggregated) per-image mIoU with background, f64[N] each (NaN for images without pixels).

    "clean" is the clean candidate when the run has one, else the first candidate.
    """
    import jax.numpy as jnp  # noqa: PLC0415

    if run.confusions.shape[1] == 0:
        return np.zeros(0), np.zeros(0)
    bg = run.background_class or 0
    scores = np.asarray(per_image_scores(jnp.asarray(run.confusions, jnp.float32), metric="miou",
                                         background_class=bg), np.float64)
    index, _ = aggregate(run.confusions, metric="miou", background_class=bg)
    if run.clean is not None:
        clean = np.asarray(per_image_scores(jnp.asarray(run.clean, jnp.float32), metric="miou",
                                            background_class=bg), np.float64)
    else:
        clean = scores[0]
    return clean, scores[index, np.arange(scores.shape[1])]


def _format(value) -> str:
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{100 * value:.2f}"
    return str(value)


def markdown_table(rows: Sequence[Mapping], columns: Sequence[str], headers: Sequence[str] | None = None,
                   percent: Sequence[str] = METRIC_COLUMNS) -> str:
    """A Markdown table; ``percent`` columns are shown as percentages with two decimals."""
    cells = ([_format(row[c]) if c in percent else str(row[c]) for c in columns] for row in rows)
    return tables.markdown_table(list(headers or columns), cells, align_numbers=False)


def summary_markdown(run: PerturbRun) -> str:
    """Clean vs robust table (percent) for the terminal and report.md."""
    rows = metric_rows(run)
    if not rows:
        return "(no instance finished)"
    return markdown_table(rows, ("mode", "attack", "accuracy", "cmiou", "nmiou"),
                          ("mode", "attack", "Acc %", "CmIoU %", "NmIoU %"))


def summary_csv(run: PerturbRun) -> str:
    """`metric_rows` as CSV text (fractions at full precision; the header alone when no instance finished)."""
    rows = metric_rows(run)
    handle = io.StringIO()
    writer = csv.DictWriter(handle, fieldnames=list(rows[0]) if rows else ["mode", "attack"], lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: (repr(v) if isinstance(v, float) else v) for k, v in row.items()})
    return handle.getvalue()


def _write_csv(path: pathlib.Path, rows: Sequence[Mapping]) -> None:
    with path.open("w", newline="") as handle:
        if not rows:
            return
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        for row in rows:
            writer.writerow({k: (repr(v) if isinstance(v, float) else v) for k, v in row.items()})


def plot_histogram(clean: np.ndarray, robust: np.ndarray, path: pathlib.Path, *, bins: int = 20) -> None:
    """Histogram PNG of the image-wise mIoU (fractions in [0, 1]), clean vs aggregated robust."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: PLC0415
    from matplotlib.figure import Figure  # noqa: PLC0415

    figure = Figure(figsize=(6, 4), dpi=100)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot(1, 1, 1)
    edges = np.linspace(0.0, 1.0, bins + 1)
    for values, name, colour in ((clean, "clean", "tab:blue"), (robust, "aggregated attack", "tab:red")):
        finite = values[np.isfinite(values)]
        axes.hist(finite, bins=edges, alpha=0.6, label=f"{name} (mean {np.mean(finite) if finite.size else float('nan'):.3f})",
                  color=colour)
    axes.set_xlabel("image-wise mIoU")
    axes.set_ylabel("images")
    axes.set_xlim(0, 1)
    axes.legend()
    axes.set_title(f"image-wise mIoU, {clean.size} images")
    figure.tight_layout()
    figure.savefig(path)


def example_files(run_dir) -> list[pathlib.Path]:
    """The example ``.npz`` files a run saved, sorted by name."""
    folder = pathlib.Path(run_dir) / EXAMPLES_DIR
    return sorted(folder.glob("*.npz")) if folder.is_dir() else []


def plot_examples(files: Sequence[pathlib.Path], path: pathlib.Path, *, epsilon: float, num_classes: int) -> None:
    """Grid PNG, one row per example: image, adversarial, |δ|/ε, GT, clean and adversarial predictions."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: PLC0415
    from matplotlib.figure import Figure  # noqa: PLC0415

    columns = ("clean image", "adversarial", "|δ| / ε", "ground truth", "clean prediction", "adv. prediction")
    figure = Figure(figsize=(2.4 * len(columns), 2.4 * len(files)), dpi=100)
    FigureCanvasAgg(figure)
    for row, file in enumerate(files):
        data = np.load(file)
        image = data["image"].astype(np.float32) / 255.0
        adversarial = data["adversarial"].astype(np.float32)
        delta = np.abs(adversarial - image).max(axis=-1) / max(epsilon, 1e-12)
        labels = np.where(data["valid"], data["labels"], -1)
        panels = (image, adversarial, delta, labels, data["clean_pred"], data["adv_pred"])
        for col, panel in enumerate(panels):
            axes = figure.add_subplot(len(files), len(columns), row * len(columns) + col + 1)
            if col < 2:
                axes.imshow(np.clip(panel, 0.0, 1.0))
            elif col == 2:
                axes.imshow(panel, cmap="magma", vmin=0.0, vmax=1.0)
            else:
                shown = np.ma.masked_less(panel, 0)
                axes.imshow(shown, cmap="gray" if num_classes == 2 else "tab20", vmin=0, vmax=max(num_classes - 1, 1),
                            interpolation="nearest")
            axes.set_xticks([])
            axes.set_yticks([])
            if row == 0:
                axes.set_title(columns[col], fontsize=9)
            if col == 0:
                axes.set_ylabel(f"{data['name']}\n{data['attack']}", fontsize=7)
            if col == 5:
                axes.set_xlabel(f"mIoU {float(data['miou_clean']):.2f} -> {float(data['miou_adv']):.2f}", fontsize=7)
    figure.tight_layout()
    figure.savefig(path)


def write_report(run_dir, out_dir=None) -> dict[str, pathlib.Path]:
    """Writes every report file (see the module docstring); returns name -> path.

    Args:
      run_dir: a perturb run directory.
      out_dir: where to write (default ``RUN_DIR/report``).
    """
    run = load_run(run_dir)
    out = report_folder(run.run_dir, out_dir)
    paths = {"table_md": out / "table.md", "table_csv": out / "table.csv", "wins_csv": out / "wins.csv",
             "report": out / "report.md"}
    rows = metric_rows(run)
    wins = win_counts(run)
    paths["table_md"].write_text(summary_markdown(run) + "\n")
    paper = {}
    if run.keys and run.clean is not None:
        model_label = pathlib.Path(str(run.config.get("model", "model"))).name
        paper = write_paper_tables(run, out, model_label)
        paths.update(paper)
    _write_csv(paths["table_csv"], rows)
    _write_csv(paths["wins_csv"], wins)
    parts = [f"# Perturbation attacks: {run.config.get('model', '?')}", "",
             f"{len(run.keys)} instances ok, {len(run.failed)} failed; ε = {run.config.get('epsilon_text', '?')}; "
             f"attacks: {', '.join(label(n) for n in run.names)}.", "", "## Clean vs robust", "",
             summary_markdown(run), "", "## Per-image worst case: wins per attack (with background)", "",
             markdown_table(wins, ("attack", "wins_miou", "wins_accuracy"),
                            ("attack", "images (by mIoU)", "images (by accuracy)"), percent=()), ""]
    if paper:
        parts += ["## As in the paper's tables (clean / robust, %)", "", paper["worst_case_md"].read_text(),
                  "## Per attack (paper's order)", "", paper["per_attack_md"].read_text()]
    if run.keys:
        clean, robust = image_mious(run)
        paths["histogram"] = out / "miou_hist.png"
        plot_histogram(clean, robust, paths["histogram"])
        parts += ["## Image-wise mIoU", "", f"![histogram]({paths['histogram'].name})", ""]
    files = example_files(run.run_dir)
    if files:
        paths["examples"] = out / "examples.png"
        plot_examples(files, paths["examples"], epsilon=float(run.config.get("epsilon", 8 / 255)),
                      num_classes=run.num_classes)
        parts += ["## Examples", "", f"![examples]({paths['examples'].name})", ""]
    if run.failed:
        parts += ["## Failed instances", ""] + [f"- {d}/{i}: {e}" for d, i, e in run.failed] + [""]
    paths["report"].write_text("\n".join(parts))
    return paths


def summarize_run(run_dir, *, with_report: bool = True) -> list[str]:
    """Writes ``RUN_DIR/summary.md`` / ``.csv`` (the clean vs robust table with the run's timing, as every
    protocol's summary) and, when ``with_report``, the report (`write_report`); returns the lines the
    command prints: the table, the per-image worst case wins, the report's path.

    Raises:
      FileNotFoundError / ValueError: no run directory, manifest or records.
    """
    from jaxseg_robust.reports.report_files import write_table_files  # noqa: PLC0415
    from jaxseg_robust.reports.timing_summary import add_run_timing  # noqa: PLC0415

    out = pathlib.Path(run_dir)
    run = load_run(out)
    markdown, csv_text = add_run_timing(out, summary_markdown(run), summary_csv(run))
    write_table_files(out, "summary", markdown, csv_text)
    lines = [markdown]
    if run.keys:
        lines.append("per-image worst case (by mIoU): " + ", ".join(f"{w['attack']} {w['wins_miou']}"
                                                                    for w in win_counts(run)))
    if with_report:
        lines.append(f"wrote {write_report(out)['report']}")
    return lines


def main(argv: list[str] | None = None) -> int:
    """``python -m jaxseg_robust.reports.perturb RUN_DIR [--out DIR]``; returns 0, or 2 on a bad directory."""
    parser = argparse.ArgumentParser(prog="python -m jaxseg_robust.reports.perturb",
                                     description="Write the report of a perturb run directory.")
    parser.add_argument("run_dir")
    parser.add_argument("--out", default=None, help="output folder (default RUN_DIR/report)")
    args = parser.parse_args(argv)
    try:
        paths = write_report(args.run_dir, args.out)
    except (FileNotFoundError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(summary_markdown(load_run(args.run_dir)))
    print(f"wrote {paths['report']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
