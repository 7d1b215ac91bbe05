"""`jaxseg-robust report RUN_DIR [--out DIR]`: tables (Markdown + CSV) and PNG plots of a finished run.

The protocol is read from the run's manifest and dispatched by
`jaxseg_robust.reports.run_report` (tetris, grid, breps, rclicks, perturb); a
folder of run directories (``jaxseg-robust demo``) gets one report per sub-run
and an index. Nothing is recomputed: the report reads the records (and the
grid's heatmap files); image plots re-read each instance's image file.
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
exit codes: 0 report written, 2 no such directory, not a run directory (or unknown protocol, unreadable records).
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
    parser.set_defaults(func=run)


def run(args) -> int:
    """Writes the report; prints the written files; returns an exit code of `jaxseg_robust.exit_codes`."""
    from jaxseg_robust.reports.run_report import write_run_report  # noqa: PLC0415

    if not pathlib.Path(args.run_dir).is_dir():
        what = "is not a directory" if pathlib.Path(args.run_dir).exists() else "does not exist"
        return report_error(COMMAND, f"{args.run_dir} {what} (give a run directory or a folder of run directories)")
    try:
        paths = write_run_report(args.run_dir, args.out)
    except (ValueError, KeyError, FileNotFoundError) as error:  # ReportError, RecordsError, bad records
        return report_error(COMMAND, f"{args.run_dir}: {type(error).__name__}: {error}"
                            if not isinstance(error, ValueError) else str(error))
    report = paths["report"]
    print(pathlib.Path(report).read_text(encoding="utf-8"))
    for name in sorted(paths):
        print(f"wrote {paths[name]}")
    return EXIT_OK
