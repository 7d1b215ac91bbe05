"""The command-line arguments every ``python -m ports <family>`` shares, and its closing line.

A family module's ``add_arguments`` is `add_checkpoint_arguments` (plus its
own flags); its ``run`` converts and ends with `report_converted`.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence


def add_output_arguments(parser: argparse.ArgumentParser) -> None:
    """``--out DIR`` (required) and ``--overwrite``."""
    parser.add_argument("--out", required=True, help="output directory for the converted model")
    parser.add_argument("--overwrite", action="store_true", help="replace a converted model already in --out")


def add_checkpoint_arguments(parser: argparse.ArgumentParser, checkpoint_help: str,
                             variants: Sequence[str] | None = None) -> None:
    """``--checkpoint FILE`` (required), the output arguments and, given ``variants``, ``--variant``.

    Args:
      parser: the family's sub-parser.
      checkpoint_help: what the checkpoint is (e.g. "official SAM .pth checkpoint").
      variants: the family's variant names; ``--variant`` then defaults to "auto"
        (inferred from tensor shapes).
    """
    parser.add_argument("--checkpoint", required=True, help=checkpoint_help)
    add_output_arguments(parser)
    if variants is not None:
        parser.add_argument("--variant", default="auto", choices=("auto", *variants),
                            help="model variant; 'auto' infers it from tensor shapes")


def report_converted(source, out) -> int:
    """Prints ``converted SOURCE -> OUT``; returns exit code 0."""
    print(f"converted {source} -> {out}")
    return 0


__all__ = ["add_output_arguments", "add_checkpoint_arguments", "report_converted"]
