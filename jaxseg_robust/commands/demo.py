"""`jaxseg-robust demo`: every prompt-robustness protocol on a few synthetic instances, one report.

Writes ``OUT/synthetic/{images,masks}`` (`jaxseg_robust.data.synthetic`,
fixed seed) and runs, with the default model (`zoo.DEFAULT_MODEL`, the
embedded demonstration model), one sub-run per protocol:

  OUT/tetris      the baseline clicker and the TETRIS MIN / MAX attacks
  OUT/breps       the BREPS MIN / MAX box attacks (boxes drawn in the report)
  OUT/click_grid  a strided first-click grid (IoU heatmaps over click positions)
  OUT/box_grid    a strided centred box grid (IoU heatmaps over box sizes)
  OUT/report      ``report.md`` with every table and plot (`jaxseg-robust report OUT`)

Each sub-run prints its table with its seconds per instance and compile
seconds; the demo ends with the compile total of all four (`compile_line`,
also in the report's header).

Sizes (``--size``): ``full`` (default; 14 instances, two of each synthetic
family, with the papers' settings: 10 clicks x 11 iterates, 50 box steps;
strides 4; about a minute and a half on 2 CPU cores), ``small`` (7
instances, 5 clicks x 11 iterates, 20 box steps, strides 8) and ``tiny`` (2
instances, 2 clicks x 3 iterates, 5 box steps: the CI smoke test).
Rerunning resumes every sub-run.

Attack step sizes: both papers scale Adam's step with the image diagonal
(TETRIS ``lr_mult 5 sqrt(H^2 + W^2) / (400 sqrt 2)``, BREPS ``lr_mult
sqrt(H^2 + W^2) / (1024 sqrt 2)``, in the model's resized frame), tuned for
~480 x 640 benchmark images in SAM's 1024-px frame: one step there is 0.69 %
(TETRIS, lr_mult 1) and 0.49 % (BREPS, lr_mult 9) of the frame. The demo's
images are 48-64 px in the demonstration model's 256-px frame, where the same
multipliers would move a prompt 0.28 % / 0.19 % of the frame per step, so the
demo sets ``--lr_mult`` to `DEMO_TETRIS_LR_MULT` / `DEMO_BREPS_LR_MULT`, the
multipliers that give the papers' fraction of the frame per step on the
demo's 48 x 64 images (`frame_matched_lr_mult`).

If the demonstration model's weights are not installed, the command stops
and says so; ``--untrained-model`` runs the same pipeline with the random
``sam_tiny`` test model instead (the report is then marked UNTRAINED: its
numbers say nothing about any real model).
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
import sys

from jaxseg_robust.exit_codes import EXIT_FAILURE, EXIT_OK
from jaxseg_robust.commands.flags import DEVICE_EPILOG, CommandError, add_precision_flag
from jaxseg_robust.commands.report import add_plot_instances
from jaxseg_robust.commands.running import report_error

COMMAND = "demo"
UNTRAINED_MODEL = "sam_tiny"
DATA_DIR = "synthetic"
DEMO_SEED = 20250
# Step-size matching (module docstring): the papers' typical image and model frame.
PAPER_IMAGE_HW = (480, 640)
PAPER_MODEL_FRAME = 1024
DEMO_IMAGE_HW = (48, 64)
DEMO_MODEL_FRAME = 256


def frame_matched_lr_mult(paper_lr_mult: float, image_hw=DEMO_IMAGE_HW, model_frame: int = DEMO_MODEL_FRAME,
                          paper_image_hw=PAPER_IMAGE_HW, paper_model_frame: int = PAPER_MODEL_FRAME) -> float:
    """The ``lr_mult`` giving, on ``image_hw`` in a ``model_frame`` px model, the papers' step as a frame fraction.

    Both step rules are ``lr = lr_mult c sqrt(H^2 + W^2)`` resized-frame
    pixels, so the step as a fraction of the model frame is ``lr_mult c
    diag / frame``; equating it with the papers' setting gives ``paper_lr_mult
    (paper_diag / paper_frame) / (diag / frame)``.

    Args:
      paper_lr_mult: the papers' multiplier (TETRIS 1, BREPS 9).
      image_hw, model_frame: the images (px) and model input side (px) of the run.
      paper_image_hw, paper_model_frame: the papers' typical image and SAM's frame.

    Returns:
      The multiplier (float): 2.5 for TETRIS's 1 and 22.5 for BREPS's 9 on 48 x 64 images in a
      256-px frame.
    """
    diag = (image_hw[0] ** 2 + image_hw[1] ** 2) ** 0.5
    paper_diag = (paper_image_hw[0] ** 2 + paper_image_hw[1] ** 2) ** 0.5
    return paper_lr_mult * (paper_diag / paper_model_frame) / (diag / model_frame)


DEMO_TETRIS_LR_MULT = round(frame_matched_lr_mult(1.0), 2)
DEMO_BREPS_LR_MULT = round(frame_matched_lr_mult(9.0), 1)


@dataclasses.dataclass(frozen=True)
class DemoSize:
    """Work of one ``--size``: instances and the per-protocol settings."""

    instances: int
    n_clicks: int
    n_opt_steps: int
    baseline_clicks: int
    box_steps: int
    click_stride: int
    box_stride: int


SIZES = {
    "tiny": DemoSize(instances=2, n_clicks=2, n_opt_steps=3, baseline_clicks=3, box_steps=5, click_stride=16,
                     box_stride=16),
    "small": DemoSize(instances=7, n_clicks=5, n_opt_steps=11, baseline_clicks=10, box_steps=20, click_stride=8,
                      box_stride=8),
    "full": DemoSize(instances=14, n_clicks=10, n_opt_steps=11, baseline_clicks=20, box_steps=50, click_stride=4,
                     box_stride=4),
}

EPILOG = """\
examples:
  jaxseg-robust demo                        runs/demo with the embedded demonstration model
  jaxseg-robust demo --out /tmp/demo --size small   7 instances, shorter attacks
  jaxseg-robust demo --untrained-model      no trained weights installed: random sam_tiny (numbers meaningless)
exit codes: 0 every sub-run ok, 1 some instances failed, 2 bad arguments / a sub-run could not run.
""" + DEVICE_EPILOG + "\n"


def register(subparsers) -> None:
    """Adds the ``demo`` sub-command."""
    parser = subparsers.add_parser(
        COMMAND, help="run baseline, TETRIS, BREPS and click/box grids on synthetic shapes and write a report",
        description="A self-contained demonstration: synthetic instances, the default model, every "
                    "prompt-robustness protocol, one run directory and a Markdown report with tables and plots.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="runs/demo", metavar="DIR", help="output folder (default %(default)s)")
    parser.add_argument("--size", choices=tuple(SIZES), default="full", help="amount of work (default %(default)s)")
    parser.add_argument("--untrained-model", action="store_true",
                        help=f"use the random-weight test model {UNTRAINED_MODEL} instead of the demonstration "
                             "model (when its weights are not installed; the numbers are meaningless; default: "
                             "the demonstration model)")
    add_plot_instances(parser)
    add_precision_flag(parser)
    parser.add_argument("--progress", choices=("auto", "tqdm", "plain", "none"), default="auto",
                        help="progress display of the sub-runs (default %(default)s)")
    parser.set_defaults(func=run)


def demo_model(untrained: bool) -> str:
    """The model name of the demo.

    Raises:
      CommandError: the demonstration model's weights are not installed and ``untrained`` is False.
    """
    from jaxseg_robust.models import zoo  # noqa: PLC0415

    if untrained:
        return UNTRAINED_MODEL
    try:
        zoo.resolve(zoo.DEFAULT_MODEL)
    except (FileNotFoundError, ValueError) as error:
        raise CommandError(f"the demonstration model {zoo.DEFAULT_MODEL!r} is not installed ({error}); pass "
                           f"--untrained-model to run the demo with the random-weight test model "
                           f"{UNTRAINED_MODEL} (its numbers are meaningless)") from None
    return zoo.DEFAULT_MODEL


def write_data(out: pathlib.Path, size: DemoSize) -> pathlib.Path:
    """Writes (once) the synthetic image/mask folder; returns it (reused as is on a rerun, so runs resume)."""
    from jaxseg_robust.data.synthetic.dataset import MANIFEST_NAME, write_synthetic_folder  # noqa: PLC0415

    folder = out / DATA_DIR
    if not (folder / MANIFEST_NAME).is_file():
        write_synthetic_folder(folder, size.instances, seed=DEMO_SEED)
    return folder


def sub_run_argv(protocol: str, model: str, data: pathlib.Path, out: pathlib.Path, size: DemoSize,
                 progress: str, precision: str = "default") -> list[str]:
    """The ``jaxseg-robust`` argv of one sub-run (``precision``: the demo's ``--precision``)."""
    common = ["--model", model, "--folder", str(data / "images"), str(data / "masks"), "--out", str(out),
              "--progress", progress, "--precision", precision]
    if protocol == "tetris":
        return ["tetris", *common, "--n-clicks", str(size.n_clicks), "--n_opt_steps", str(size.n_opt_steps),
                "--baseline-clicks", str(size.baseline_clicks), "--lr_mult", str(DEMO_TETRIS_LR_MULT)]
    if protocol == "breps":
        return ["breps", *common, "--n_opt_steps", str(size.box_steps), "--lr_mult", str(DEMO_BREPS_LR_MULT)]
    if protocol == "click_grid":
        return ["grid", "--kind", "click", *common, "--stride", str(size.click_stride)]
    if protocol == "box_grid":
        return ["grid", "--kind", "box", *common, "--stride", str(size.box_stride)]
    raise ValueError(f"protocol must be tetris, breps, click_grid or box_grid; got {protocol!r}")


PROTOCOLS = ("tetris", "breps", "click_grid", "box_grid")


def compile_line(out: pathlib.Path) -> str:
    """The demo's compile total over its sub-runs' ``compile.jsonl`` (every session of each), e.g.
    ``compile: 41.2 s for 4 bucket program(s), 0 from the cache (tetris 28.0 s, breps 7.1 s, ...)``."""
    from jaxseg_robust.reports.artifacts import read_compile_events  # noqa: PLC0415
    from jaxseg_robust.reports.timing_summary import compile_total  # noqa: PLC0415

    totals = {protocol: compile_total(read_compile_events(out / protocol)) for protocol in PROTOCOLS}
    parts = ", ".join(f"{protocol} {total.seconds:.1f} s" for protocol, total in totals.items())
    return (f"compile: {sum(t.seconds for t in totals.values()):.1f} s for "
            f"{sum(t.programs for t in totals.values())} bucket program(s), "
            f"{sum(t.from_cache for t in totals.values())} from the cache ({parts})")


def _banner(text: str) -> None:
    print(f"\n==== {text} ====", flush=True)


def run(args) -> int:
    """Runs the demo; returns the worst exit code of its sub-runs (2 if the report cannot be written)."""
    from jaxseg_robust.commands import build_parser  # noqa: PLC0415
    from jaxseg_robust.reports.run_report import write_run_report  # noqa: PLC0415

    try:
        model = demo_model(args.untrained_model)
    except CommandError as error:
        return report_error(COMMAND, str(error))
    size = SIZES[args.size]
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    try:
        data = write_data(out, size)
    except (ValueError, OSError) as error:
        return report_error(COMMAND, f"cannot write the synthetic data into {out / DATA_DIR}: {error}")
    parser = build_parser()
    codes = {}
    for protocol in PROTOCOLS:
        _banner(f"{protocol} ({model}{', UNTRAINED' if args.untrained_model else ''})")
        sub_args = parser.parse_args(sub_run_argv(protocol, model, data, out / protocol, size, args.progress,
                                                  args.precision))
        codes[protocol] = int(sub_args.func(sub_args))
    _banner("report")
    try:
        paths = write_run_report(out, out / "report", plot_instances=args.plot_instances)
    except (ValueError, KeyError, OSError) as error:
        return report_error(COMMAND, f"report: {error}")
    report = paths["report"]
    header = [f"Model: `{model}`" + (" — **UNTRAINED random weights: the numbers say nothing about any model**"
                                     if args.untrained_model else " (the embedded demonstration model)"),
              f"Data: {size.instances} synthetic instances in `{data}` (seed {DEMO_SEED}); size `{args.size}`.",
              "Exit codes of the sub-runs: " + ", ".join(f"{p} {c}" for p, c in codes.items()) + ".",
              "Total " + compile_line(out) + ", in no per-instance time.", ""]
    text = report.read_text(encoding="utf-8").split("\n", 2)
    report.write_text("\n".join([text[0], "", *header, *text[2:]]), encoding="utf-8")
    print(compile_line(out))
    print(f"wrote {report} ({len(paths) - 1} tables and plots beside it)")
    worst = max(codes.values())
    if worst == EXIT_FAILURE:
        print(f"jaxseg-robust {COMMAND}: some sub-runs failed: "
              + ", ".join(p for p, c in codes.items() if c == EXIT_FAILURE), file=sys.stderr)
    return worst if worst else EXIT_OK
