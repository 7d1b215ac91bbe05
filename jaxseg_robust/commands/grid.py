"""`jaxseg-robust grid`: exhaustive prompt grids: TETRIS click heatmaps and BREPS centred (h, w) box heatmaps.

Kinds (``--kind``; docs/protocols/grids.md §5, `jaxseg_robust.attacks.grid`):
  click  one positive click at every ``--stride``-th pixel (first-click grid,
         multimask + argmax), or with ``--prefix baseline`` the second click
         after the fixed baseline first click; ``--region`` restricts the
         positions (image / object / the baseline's error region). Per
         instance: IoU and BIoU heatmaps, their min / max and where, and the
         baseline click's scores.
  box    centred boxes of every (h, w) in 0..2H x 0..2W (step ``--stride``)
         around the tight box's centre, single-mask output: IoU / BIoU heatmaps
         over (h, w), min / max, the tight box's scores and the §5.3 corner
         heatmap (``--no-corner-heatmap`` to skip).

Records: the scalar results per instance (min / max / baseline scores and
positions, grid sizes) and ``heatmaps``: the path (relative to the run
directory) of ``heatmaps/<dataset>/<id>.npz`` holding the heatmaps cropped to
the instance's image (NumPy arrays; a stride-1 heatmap of a large image would
not fit a JSON line). The per-dataset table (`jaxseg_robust.reports.grid`,
with the seconds per instance, device and wall, and the compile total of
``RUN_DIR/timings.jsonl`` / ``compile.jsonl``: `jaxseg_robust.runs.evaluate`) is
printed and written to ``RUN_DIR/summary.md`` / ``summary.csv``.
The protocol itself is `jaxseg_robust.runs.GridSpec`; this module maps the flags onto it.
"""

from __future__ import annotations

from jaxseg_robust.commands.flags import (
    DEVICE_EPILOG,
    add_flag,
    add_protocol_parser,
    finite_float,
    positive_int,
)
from jaxseg_robust.commands.run_specs import FlagNames, run_spec_of
from jaxseg_robust.commands.running import run_spec
from jaxseg_robust.runs.grid import CLICK_PREFIXES, CLICK_REGIONS, KINDS, GridSpec
from jaxseg_robust.runs.spec import RunSpec

COMMAND = GridSpec.command
FLAG_NAMES = FlagNames(corner_heatmap="--no-corner-heatmap")

EPILOG = """\
examples:
  jaxseg-robust grid --model sam_vit_b --kind click --stride 4 --datasets GrabCut,Berkeley \\
      --data-root ~/datasets --out runs/click_grid
      IoU of a single click at every 4th pixel: min / max / baseline-click IoU per dataset
  jaxseg-robust grid --model sam_vit_b --kind click --prefix baseline --region error --datasets DAVIS \\
      --out runs/second_click_grid      the second click over the baseline's error region
  jaxseg-robust grid --model sam_vit_b --kind box --stride 8 --datasets GrabCut --out runs/box_grid
  jaxseg-robust grid --model sam_tiny --kind click --stride 4 --folder my/images my/masks --out runs/smoke

`jaxseg-robust report RUN_DIR` draws the heatmaps.
exit codes: 0 every instance ok, 1 some instances failed (listed), 2 bad
arguments / nothing could be run.
""" + DEVICE_EPILOG + "\n"


def register(subparsers) -> None:
    """Adds the ``grid`` sub-command."""
    _, group = add_protocol_parser(
        subparsers, COMMAND, summary="exhaustive click / box grids: IoU heatmaps over prompt positions and sizes",
        description="Exhaustive prompt grids of a promptable model: the IoU of a click at every grid "
                    "position (TETRIS; SAM, MobileSAM, SAM 2, SAM-HQ, RITM, SimpleClick, CFR-ICL) or of every "
                    "centred box size (BREPS; models that take boxes), with min / max per instance.",
        epilog=EPILOG, default_batch_size=GridSpec.default_batch_size, group_title="grid", run=run)
    group.add_argument("--kind", choices=KINDS, required=True, help="click positions or centred box sizes (required)")
    group.add_argument("--stride", type=positive_int, default=GridSpec.stride,
                       help="grid step in pixels (positions, or box heights / widths; default %(default)s)")
    add_flag(group, "--chunk-size", type=positive_int, default=GridSpec.chunk_size,
             help="prompts decoded together per instance (memory; default %(default)s)")
    group.add_argument("--region", choices=CLICK_REGIONS, default=GridSpec.region,
                       help="click grid: which positions are decoded (default %(default)s)")
    group.add_argument("--prefix", choices=CLICK_PREFIXES, default=GridSpec.prefix,
                       help="click grid: 'none' = first click, 'baseline' = second click after the baseline "
                            "first click (default %(default)s)")
    group.add_argument("--thresh", "--thr", dest="thresh", type=finite_float, default=None,
                       help="click grid: probability threshold of the masks (default: the model family's, 0.5 "
                            "for SAM)")
    output = group.add_mutually_exclusive_group()
    output.add_argument("--multimask", dest="multimask", action="store_true", default=None,
                        help="multimask output + argmax predicted IoU (default for clicks)")
    output.add_argument("--single-mask", dest="multimask", action="store_false",
                        help="single-mask output (default for boxes, as comp_hw.py)")
    add_flag(group, "--no-corner-heatmap", action="store_true",
             help="box grid: skip the corner heatmap (default: drawn)")


# ---- the run spec ----------------------------------------------------------------------------

def spec_of(args) -> RunSpec:
    """The `RunSpec` of the parsed flags (the protocol's: `jaxseg_robust.runs.grid.GridSpec`)."""
    protocol = GridSpec(kind=args.kind, stride=args.stride, chunk_size=args.chunk_size, region=args.region,
                        prefix=args.prefix, thresh=args.thresh, multimask=args.multimask,
                        corner_heatmap=not args.no_corner_heatmap)
    return run_spec_of(args, protocol, frame=args.frame)


def run(args) -> int:
    """Runs the spec of the flags into ``--out`` and prints the table; returns an exit code of
    `jaxseg_robust.exit_codes`."""
    return run_spec(COMMAND, spec_of(args), args.out, FLAG_NAMES)
