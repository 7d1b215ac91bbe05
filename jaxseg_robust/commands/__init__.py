"""Sub-commands of the `jaxseg-robust` CLI, one module per command, and the parser that lists them.

Each module defines ``register(subparsers)``, which adds its parser and sets
``func`` to a callable ``(args) -> int`` returning one of the exit codes of
`jaxseg_robust.exit_codes`. `build_parser` registers them all (the CLI and the
``demo`` command, which runs the other commands, use it).
"""

from __future__ import annotations

import argparse
import importlib

# Sub-command modules under jaxseg_robust.commands, in the order --help lists them.
COMMAND_MODULES = ("score", "breps", "tetris", "grid", "rclicks", "clickability", "perturb", "report", "demo", "coco_eval",
                   "panoptic_eval")


def build_parser() -> argparse.ArgumentParser:
    """Returns the top-level parser with every sub-command registered."""
    from jaxseg_robust import __version__  # noqa: PLC0415
    from jaxseg_robust.commands.flags import add_compile_cache_flag  # noqa: PLC0415

    parser = argparse.ArgumentParser(prog="jaxseg-robust",
                                     description="Measure how robust segmentation models are to their inputs.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    add_compile_cache_flag(parser)
    parser.set_defaults(func=None)  # each sub-command sets its own
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(f"jaxseg_robust.commands.{name}").register(subparsers)
    return parser


__all__ = ["COMMAND_MODULES", "build_parser"]
