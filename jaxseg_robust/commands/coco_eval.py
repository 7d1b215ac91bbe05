"""`jaxseg-robust coco-eval`: mask AP or Boundary AP of a COCO / LVIS results file.

A drop-in for the Boundary IoU authors' COCO / LVIS evaluators
(docs/protocols/boundary_ap_pq.md): prints the familiar summary lines,
optionally writes ``--out FILE.csv`` (``metric,value``), ``FILE.per_category.csv``
and ``FILE.md``; every number, printed or written, is a fraction in [0, 1] as
the summary lines print it (`jaxseg_robust.reports.coco_eval`). Exit codes: 0 done, 2 bad arguments or input (one line
naming the file, image, annotation or result).
"""

from __future__ import annotations

import argparse
import sys

from jaxseg_robust.commands.flags import DEVICE_EPILOG
from jaxseg_robust.commands.running import report_error, report_warning
from jaxseg_robust.data.coco_instances import COCO_EXTRA_HINT, CocoFormatError
from jaxseg_robust.exit_codes import EXIT_FAILURE, EXIT_OK
from jaxseg_robust.evaluation.instances import DATASETS, IOU_TYPES, InstanceEvalConfig, evaluate_instances
from jaxseg_robust.evaluation.mask_counts import MASK_PATHS, device_summary, uses_runs
from jaxseg_robust.metrics.coco_ap import PER_CATEGORY_COLUMNS
from jaxseg_robust.metrics.masks import DEFAULT_DILATION_RATIO
from jaxseg_robust.reports.coco_eval import instance_text, per_category_markdown, write_outputs
from jaxseg_robust.runner.progress import PROGRESS_MODES, check_progress_mode
from jaxseg_robust.runner.rundir import check_writable_file

NAME = "coco-eval"

EPILOG = f"""\
examples:
  jaxseg-robust coco-eval --gt instances_val2017.json --results segm.json --iou-type boundary
  jaxseg-robust coco-eval --gt lvis_v1_val.json --results segm.json --dataset lvis --iou-type boundary --out ap.csv

iou types: segm = mask AP; boundary = Boundary AP (min of mask IoU and Boundary IoU, plain mask IoU
against crowd regions; boundary width = dilation ratio x image diagonal, 0.02 as the official API).
Ground-truth polygons need pycocotools: {COCO_EXTRA_HINT}.
Boundary bands and counts run on JAX's device; segm counts come from the run lengths on the host.
exit codes: 0 done, 2 bad arguments or input.
""" + DEVICE_EPILOG + "\n"


def register(subparsers) -> None:
    """Adds the ``coco-eval`` sub-command."""
    parser = subparsers.add_parser(
        NAME, help="mask AP / Boundary AP of a COCO or LVIS results file",
        description="COCO / LVIS instance-segmentation evaluation (mask AP or Boundary AP), numbers identical "
                    "to the official evaluators; boundary pixel work batched on the JAX device, segm counts "
                    "from the run lengths.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gt", required=True, metavar="ANN.json", help="COCO / LVIS ground-truth annotations")
    parser.add_argument("--results", required=True, metavar="RES.json", help="detection results (RLE masks, scores)")
    parser.add_argument("--iou-type", choices=IOU_TYPES, default="segm", help="segm or boundary (default %(default)s)")
    parser.add_argument("--dataset", choices=DATASETS, default="coco",
                        help="coco (COCOeval) or lvis (LVISEval: federated, 300 per image, APr/APc/APf; "
                             "default %(default)s)")
    parser.add_argument("--dilation-ratio", type=float, default=DEFAULT_DILATION_RATIO,
                        help="boundary width as a fraction of the image diagonal (default %(default)s)")
    parser.add_argument("--out", metavar="FILE.csv",
                        help="write metric,value rows here (+ .per_category.csv, .md; default: printed only)")
    parser.add_argument("--per-category", action="store_true",
                        help="also print the per-category AP table (default: the summary only)")
    parser.add_argument("--batch-size", type=int, default=64, metavar="MASKS",
                        help="masks per device call (default %(default)s)")
    parser.add_argument("--progress", choices=PROGRESS_MODES, default="auto",
                        help="progress display on stderr (default %(default)s)")
    parser.add_argument("--mask-path", choices=MASK_PATHS, default="auto",
                        help="segm pixel counts: from the run lengths on the host (auto, runs) or as packed bits "
                             "on the JAX device (device); boundary always uses the device (default %(default)s)")
    parser.set_defaults(func=run)


def _error(message: str) -> int:
    return report_error(NAME, message)


def _warn(message: str) -> None:
    report_warning(NAME, message)


def run(args) -> int:
    """Runs the evaluation; returns the exit code."""
    try:
        config = InstanceEvalConfig(iou_type=args.iou_type, dataset=args.dataset, dilation_ratio=args.dilation_ratio,
                                    chunk_masks=args.batch_size, progress=args.progress, mask_path=args.mask_path)
        check_progress_mode(args.progress)
        if args.out:
            check_writable_file(args.out, "--out file")
    except ValueError as error:
        return _error(str(error))
    where = "the run lengths on the host" if uses_runs(config.count_settings) else device_summary()
    print(f"jaxseg-robust {NAME}: {args.dataset} {args.iou_type} evaluation, pixel counts on {where}",
          file=sys.stderr, flush=True)
    try:
        result = evaluate_instances(args.gt, args.results, config, warn=_warn)
    except (CocoFormatError, ImportError) as error:
        return _error(str(error))
    print(instance_text(result.summary, args.dataset))
    if args.per_category:  # fractions, like the summary lines above (reports.coco_eval)
        print(per_category_markdown(result.per_category, PER_CATEGORY_COLUMNS))
    if args.out:
        title = f"{'Boundary AP' if args.iou_type == 'boundary' else 'Mask AP'} ({args.dataset})"
        paths = write_outputs(args.out, title, result.summary, result.per_category, PER_CATEGORY_COLUMNS)
        print(f"wrote {', '.join(map(str, paths))}", file=sys.stderr)
    return EXIT_OK
