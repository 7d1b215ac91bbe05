"""The `jaxseg-robust` command line: a thin dispatcher over `jaxseg_robust.commands`.

Exit codes (every command):
  0  success: every item was processed;
  1  partial failure: the run finished but some items failed (they are named
     in the output and in the run's records);
  2  failure: bad arguments or nothing could be processed.
"""

from __future__ import annotations

import argparse
import importlib
import sys

EXIT_OK = 0
EXIT_PARTIAL = 1
EXIT_FAILURE = 2

# Sub-command modules under jaxseg_robust.commands, in the order --help lists them.
COMMAND_MODULES = ("score", "breps", "tetris", "grid", "rclicks", "perturb", "report", "demo")


def build_parser() -> argparse.ArgumentParser:
    """Returns the top-level parser with every sub-command registered."""
    parser = argparse.ArgumentParser(
        prog="jaxseg-robust",
        description="Measure how robust segmentation models are to their inputs.",
    )
    from jaxseg_robust import __version__  # noqa: PLC0415

    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(f"jaxseg_robust.commands.{name}").register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parses ``argv`` and runs the chosen sub-command; returns its exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "func", None) is None:
        parser.print_help()
        return EXIT_FAILURE
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
