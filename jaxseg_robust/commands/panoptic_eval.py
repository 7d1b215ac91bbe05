"""`jaxseg-robust panoptic-eval`: PQ / SQ / RQ or Boundary PQ of a COCO panoptic prediction.

A drop-in for panopticapi's ``pq_compute`` and the Boundary IoU authors'
variant (docs/protocols/boundary_ap_pq.md): prints panopticapi's table,
optionally writes ``--out FILE.csv`` (``metric,value`` with ``PQ_all``,
``SQ_things``, ...), ``FILE.per_category.csv`` and ``FILE.md``. Exit codes: 0
done, 2 bad arguments or input (one line naming the file, image or segment).
"""

from __future__ import annotations

import argparse
import sys

from jaxseg_robust.commands.flags import DEVICE_EPILOG
from jaxseg_robust.commands.running import report_error, report_warning
from jaxseg_robust.data.coco_instances import CocoFormatError
from jaxseg_robust.exit_codes import EXIT_FAILURE, EXIT_OK
from jaxseg_robust.evaluation.mask_counts import device_summary
from jaxseg_robust.evaluation.panoptic import IOU_TYPES, PanopticEvalConfig, evaluate_panoptic
from jaxseg_robust.metrics.masks import DEFAULT_DILATION_RATIO
from jaxseg_robust.reports.coco_eval import panoptic_text, write_outputs
from jaxseg_robust.runner.progress import PROGRESS_MODES, check_progress_mode
from jaxseg_robust.runner.rundir import check_writable_file

NAME = "panoptic-eval"
PER_CATEGORY_COLUMNS = ("pq", "sq", "rq")

EPILOG = """\
examples:
  jaxseg-robust panoptic-eval --gt-json panoptic_val2017.json --gt-folder panoptic_val2017 \\
      --pred-json pred.json --pred-folder pred --iou-type boundary --out pq.csv

iou types: segm = PQ; boundary = Boundary PQ (matching at > 0.5 and SQ on the min of mask IoU and
Boundary IoU; boundary width = dilation ratio x image diagonal, 0.02 as the official API).
exit codes: 0 done, 2 bad arguments or input.
""" + DEVICE_EPILOG + "\n"


def register(subparsers) -> None:
    """Adds the ``panoptic-eval`` sub-command."""
    parser = subparsers.add_parser(
        NAME, help="PQ / Boundary PQ of a COCO panoptic prediction",
        description="COCO panoptic evaluation (PQ, SQ, RQ for All, Things, Stuff; Boundary PQ), numbers identical "
                    "to panopticapi / the Boundary IoU API; pixel work on the JAX device.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gt-json", required=True, help="ground-truth panoptic JSON")
    parser.add_argument("--gt-folder", help="folder of ground-truth PNGs (default: the JSON path without .json)")
    parser.add_argument("--pred-json", required=True, help="predicted panoptic JSON")
    parser.add_argument("--pred-folder", help="folder of predicted PNGs (default: the JSON path without .json)")
    parser.add_argument("--iou-type", choices=IOU_TYPES, default="segm", help="segm or boundary (default %(default)s)")
    parser.add_argument("--dilation-ratio", type=float, default=DEFAULT_DILATION_RATIO,
                        help="boundary width as a fraction of the image diagonal (default %(default)s)")
    parser.add_argument("--out", metavar="FILE.csv",
                        help="write metric,value rows here (+ .per_category.csv, .md; default: printed only)")
    parser.add_argument("--progress", choices=PROGRESS_MODES, default="auto",
                        help="progress display on stderr (default %(default)s)")
    parser.set_defaults(func=run)


def _error(message: str) -> int:
    return report_error(NAME, message)


def _warn(message: str) -> None:
    report_warning(NAME, message)


def _default_folder(json_path: str, folder: str | None) -> str:
    return folder if folder else json_path.replace(".json", "")


def run(args) -> int:
    """Runs the evaluation; returns the exit code."""
    try:
        config = PanopticEvalConfig(iou_type=args.iou_type, dilation_ratio=args.dilation_ratio,
                                    progress=args.progress)
        check_progress_mode(args.progress)
        if args.out:
            check_writable_file(args.out, "--out file")
    except ValueError as error:
        return _error(str(error))
    print(f"jaxseg-robust {NAME}: {args.iou_type} evaluation on {device_summary()}", file=sys.stderr, flush=True)
    try:
        result = evaluate_panoptic(args.gt_json, _default_folder(args.gt_json, args.gt_folder), args.pred_json,
                                   _default_folder(args.pred_json, args.pred_folder), config, warn=_warn)
    except CocoFormatError as error:
        return _error(str(error))
    print(panoptic_text(result.groups))
    if args.out:
        title = "Boundary PQ" if args.iou_type == "boundary" else "PQ"
        paths = write_outputs(args.out, title, result.summary, result.per_category, PER_CATEGORY_COLUMNS)
        print(f"wrote {', '.join(map(str, paths))}", file=sys.stderr)
    return EXIT_OK
