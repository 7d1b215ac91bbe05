"""``python -m ports <family> --checkpoint X.pth --out DIR``: convert an official checkpoint.

Each family is a module ``ports.<family>`` providing ``add_arguments(parser)``
and ``run(args) -> int``; list it in `FAMILY_MODULES` (a listed module without
those two functions gets no sub-command). Exit codes: 0 done,
2 failure (bad arguments, unreadable or mismatched checkpoint; the message
names the offending key).
"""

from __future__ import annotations

import argparse
import importlib
import sys

FAMILY_MODULES = ("sam", "mobile_sam", "sam_hq", "robustsam", "sam2", "sam2_hq", "clickability", "dense", "semseg",
                  "upernet", "ritm", "simpleclick", "transalnet", "sam3", "adaptiveclick",
                  "cdnet", "gpcis")
EXIT_OK, EXIT_FAILURE = 0, 2


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with one sub-command per family."""
    parser = argparse.ArgumentParser(
        prog="python -m ports",
        description="Convert an official PyTorch checkpoint into a jaxseg_robust model directory.")
    sub = parser.add_subparsers(dest="family", metavar="FAMILY")
    for name in FAMILY_MODULES:
        try:
            module = importlib.import_module(f"ports.{name}")
        except Exception as err:  # one broken family must not disable the others
            broken = sub.add_parser(name, help=f"(unavailable: {type(err).__name__})")
            broken.set_defaults(func=_unavailable(name, err), accepts_any=True)
            continue
        if not (hasattr(module, "add_arguments") and hasattr(module, "run")):
            continue  # a family module without a command line (yet)
        family_parser = sub.add_parser(name, help=(module.__doc__ or "").strip().splitlines()[0])
        module.add_arguments(family_parser)
        family_parser.set_defaults(func=module.run)
    return parser


def _unavailable(name: str, err: Exception):
    def run(args) -> int:
        raise ImportError(f"the '{name}' port cannot be loaded: {type(err).__name__}: {err}")

    return run


def main(argv: list[str] | None = None) -> int:
    """Parses ``argv`` and runs the family's port; returns the exit code."""
    from ports.keytable import PortError  # noqa: PLC0415
    from jaxseg_robust.models.store import StoreError  # noqa: PLC0415

    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and not getattr(args, "accepts_any", False):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if getattr(args, "func", None) is None:
        parser.print_help()
        return EXIT_FAILURE
    try:
        return int(args.func(args))
    except (PortError, StoreError, FileNotFoundError, ValueError, ImportError) as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_FAILURE


if __name__ == "__main__":
    sys.exit(main())
