"""`jaxseg-robust report RUN_DIR [--out DIR]`: tables (Markdown + CSV) and PNG plots of a finished run.

The protocol is read from the run's manifest and dispatched by
`jaxseg_robust.reports.run_report` (tetris, grid, breps, rclicks, perturb); a
folder of run directories (``jaxseg-robust demo``) gets one report per sub-run
and an index. Nothing is recomputed: the report reads the records (and the
grid's heatmap files); image plots re-read each instance's image file and
outline the GT the record holds. ``--plot-instances worst N | first N``
(default worst 4) chooses the instances drawn per dataset (each protocol's
"worst" is in the epilog and docs/ARCHITECTURE.md, "Figures").
Exit codes: 0 written, 2 no such directory / not a run directory / unknown protocol / unreadable records.
"""

from __future__ import annotations

import argparse
import pathlib

from jaxseg_robust.commands.flags import DEVICE_EPILOG
from jaxseg_robust.exit_codes import EXIT_OK
from jaxseg_robust.commands.running import report_error

COMMAND = "report"
EPILOG = """\
examples:
  jaxseg-robust report runs/tetris_sam_vit_b              writes runs/tetris_sam_vit_b/report/
  jaxseg-robust report runs/box_grid --out figures/box_grid
  jaxseg-robust report runs/breps --plot-instances first 10
figures: per dataset, --plot-instances worst N (default worst 4) draws the N hardest instances:
  tetris  the lowest IoU-AuC@K of the MIN trajectory (else of the baseline / max)
  breps   the lowest IoU of the MIN attack (the tight box's IoU when the run has no MIN)
  grid    the lowest iou_min (worst single click, or worst centred box)
  rclicks the lowest mean IoU over the rounds of the simulated users (the baseline clicker's
          when no clicking group ran)
  first N draws the first N in record order; failed instances are never drawn.
exit codes: 0 report written, 2 no such directory, not a run directory (or unknown protocol, unreadable
records).
""" + DEVICE_EPILOG + "\n"


def register(subparsers) -> None:
    """Adds the ``report`` sub-command."""
    parser = subparsers.add_parser(
        COMMAND, help="Markdown/CSV tables and PNG plots of a run directory (any protocol)",
        description="Write the report of a run directory: tables (Markdown and CSV) and plots (PNG) "
                    "chosen by the protocol recorded in its manifest.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a run directory (or a folder of run directories)")
    parser.add_argument("--out", default=None, metavar="DIR", help="output folder (default RUN_DIR/report)")
    add_plot_instances(parser)
    parser.set_defaults(func=run)


class PlotInstancesAction(argparse.Action):
    """``--plot-instances MODE N`` -> `jaxseg_robust.reports.plot_selection.PlotInstances` (a parser error else)."""

    def __call__(self, parser, namespace, values, option_string=None):
        from jaxseg_robust.reports.plot_selection import parse_plot_instances  # noqa: PLC0415

        try:
            setattr(namespace, self.dest, parse_plot_instances(*values))
        except ValueError as error:
            parser.error(f"{option_string} {' '.join(values)}: {error}")


def add_plot_instances(parser) -> None:
    """Adds ``--plot-instances {worst,first} N`` (default worst 4) to a parser (``report``, ``demo``)."""
    from jaxseg_robust.reports.plot_selection import DEFAULT_PLOT_INSTANCES  # noqa: PLC0415

    parser.add_argument("--plot-instances", nargs=2, metavar=("worst|first", "N"), default=DEFAULT_PLOT_INSTANCES,
                        action=PlotInstancesAction,
                        help="which instances get figures, per dataset: 'worst N' (the N hardest by the "
                             "protocol's score, see below) or 'first N' (record order); default worst 4")


def run(args) -> int:
    """Writes the report; prints the written files; returns an exit code of `jaxseg_robust.exit_codes`."""
    from jaxseg_robust.reports.run_report import write_run_report  # noqa: PLC0415

    if not pathlib.Path(args.run_dir).is_dir():
        what = "is not a directory" if pathlib.Path(args.run_dir).exists() else "does not exist"
        return report_error(COMMAND, f"{args.run_dir} {what} (give a run directory or a folder of run directories)")
    try:
        paths = write_run_report(args.run_dir, args.out, plot_instances=args.plot_instances)
    except (ValueError, KeyError, FileNotFoundError) as error:  # ReportError, RecordsError, bad records
        return report_error(COMMAND, f"{args.run_dir}: {type(error).__name__}: {error}"
                            if not isinstance(error, ValueError) else str(error))
    report = paths["report"]
    print(pathlib.Path(report).read_text(encoding="utf-8"))
    for name in sorted(paths):
        print(f"wrote {paths[name]}")
    return EXIT_OK
