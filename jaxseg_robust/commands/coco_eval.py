"""`jaxseg-robust coco-eval`: mask AP or Boundary AP of a COCO / LVIS results file.

A drop-in for the Boundary IoU authors' COCO / LVIS evaluators
(docs/protocols/boundary_ap_pq.md): prints the familiar summary lines,
optionally writes ``--out FILE.csv`` (``metric,value``), ``FILE.per_category.csv``
and ``FILE.md``; every number, printed or written, is a fraction in [0, 1] as
the summary lines print it (`jaxseg_robust.reports.coco_eval`). COCOeval's
settings are flags (image / category subsets, class-agnostic, max-dets, IoU
thresholds, area ranges); ``--images-of K/N --save-partial P`` evaluates a share
of the images and ``--merge P1 P2 ...`` gives the whole evaluation
(`jaxseg_robust.evaluation.partials`). Exit codes: 0 done, 2 bad arguments or
input (one line naming the file, image, annotation or result).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import sys

from jaxseg_robust.commands.flags import DEVICE_EPILOG
from jaxseg_robust.commands.running import report_error, report_warning
from jaxseg_robust.data.coco_instances import COCO_EXTRA_HINT, CocoFormatError
from jaxseg_robust.exit_codes import EXIT_FAILURE, EXIT_OK
from jaxseg_robust.evaluation.cocoeval import eval_images_json
from jaxseg_robust.evaluation.instances import DATASETS, IOU_TYPES, InstanceEvalConfig, evaluate_instances
from jaxseg_robust.evaluation.mask_counts import MASK_PATHS, device_summary, uses_runs
from jaxseg_robust.evaluation.partials import evaluate_partials, save_partial
from jaxseg_robust.hashing import file_sha256
from jaxseg_robust.metrics.coco_ap import COCO_PARAMS, LVIS_PARAMS, PER_CATEGORY_COLUMNS
from jaxseg_robust.metrics.masks import DEFAULT_DILATION_RATIO
from jaxseg_robust.reports.coco_eval import instance_text, per_category_markdown, write_outputs
from jaxseg_robust.runner.progress import PROGRESS_MODES, check_progress_mode
from jaxseg_robust.runner.rundir import check_writable_file

NAME = "coco-eval"

EPILOG = f"""\
examples:
  jaxseg-robust coco-eval --gt instances_val2017.json --results segm.json --iou-type boundary
  jaxseg-robust coco-eval --gt lvis_v1_val.json --results segm.json --dataset lvis --iou-type boundary --out ap.csv
  jaxseg-robust coco-eval --gt val.json --results segm.json --category-ids 1 3 --max-dets 1 10 300 --class-agnostic
  # three processes or hosts, then one merge (exactly the single-process numbers):
  jaxseg-robust coco-eval --gt val.json --results segm.json --images-of 2/3 --save-partial part2.npz
  jaxseg-robust coco-eval --merge part1.npz part2.npz part3.npz --out ap.csv

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
    parser.add_argument("--gt", metavar="ANN.json", help="COCO / LVIS ground-truth annotations (default: none; required unless --merge)")
    parser.add_argument("--results", metavar="RES.json",
                        help="detection results (RLE masks, scores; default: none; required unless --merge)")
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
    _add_setting_flags(parser)
    parser.set_defaults(func=run)


def _add_setting_flags(parser) -> None:
    """COCOeval's params as flags, and the split / merge of an evaluation."""
    group = parser.add_argument_group("evaluation settings (COCOeval's params)")
    group.add_argument("--image-ids", type=int, nargs="+", metavar="ID", help="evaluate only these images (imgIds; default: every image of the ground truth)")
    group.add_argument("--category-ids", type=int, nargs="+", metavar="ID",
                       help="evaluate only these categories (catIds; default: every category of the ground truth)")
    group.add_argument("--class-agnostic", action="store_true",
                       help="match detections to ground truths of any category (useCats=0; coco only; default: off, "
                            "per category)")
    group.add_argument("--max-dets", type=int, nargs=3, metavar="N",
                       help="detections per image and category for AR1/AR10/AR100 (maxDets; default 1 10 100; "
                            "coco only: LVIS caps per image)")
    group.add_argument("--iou-thresholds", type=float, nargs="+", metavar="T",
                       help="IoU thresholds (iouThrs; default 0.50:0.05:0.95)")
    group.add_argument("--area-ranges", nargs="+", metavar="LABEL:LOW:HIGH",
                       help="object-area ranges in pixels (areaRng / areaRngLbl; default all:0:1e10 small:0:1024 "
                            "medium:1024:9216 large:9216:1e10)")
    group.add_argument("--eval-images", metavar="FILE.json",
                       help="write COCOeval's evalImgs (per image, category and area range; the non-empty ones) "
                            "as JSON (coco only; default: none)")
    split = parser.add_argument_group("several processes")
    split.add_argument("--images-of", metavar="K/N", help="evaluate the K-th of N interleaved shares of the images "
                       "(sorted ids, every N-th from the K-th); needs --save-partial (default: all the images)")
    split.add_argument("--save-partial", metavar="FILE.npz", help="save this share's evaluation for --merge (default: none, nothing saved)")
    split.add_argument("--merge", nargs="+", metavar="FILE.npz",
                       help="merge the partial files of every share into the whole evaluation (no --gt/--results; "
                            "default: none, evaluate --gt and --results)")


def parse_share(text: str) -> tuple[int, int]:
    """``"K/N"`` -> (K, N) with 1 <= K <= N (ValueError naming the flag otherwise)."""
    try:
        share, shares = (int(part) for part in text.split("/"))
    except ValueError:
        raise ValueError(f"--images-of must be K/N (e.g. 2/3), got {text!r}") from None
    if not 1 <= share <= shares:
        raise ValueError(f"--images-of K/N needs 1 <= K <= N, got {text!r}")
    return share, shares


def parse_area_ranges(items: list[str]) -> tuple[tuple, tuple]:
    """``LABEL:LOW:HIGH`` items -> (ranges, labels) (ValueError naming the item)."""
    ranges, labels = [], []
    for item in items:
        parts = item.split(":")
        try:
            low, high = float(parts[1]), float(parts[2])
            if len(parts) != 3 or not parts[0] or not low <= high:
                raise ValueError
        except (ValueError, IndexError):
            raise ValueError(f"--area-ranges: {item!r} is not LABEL:LOW:HIGH with LOW <= HIGH") from None
        ranges.append((low, high))
        labels.append(parts[0])
    return tuple(ranges), tuple(labels)


def _ap_params(args):
    """The AP settings of the flags (None = the dataset's defaults)."""
    if args.max_dets and args.dataset == "lvis":
        raise ValueError("--max-dets is a COCO setting (LVIS caps detections per image)")
    changes = {}
    if args.max_dets:
        changes["max_dets"] = tuple(sorted(args.max_dets))  # COCOeval.evaluate sorts them
    if args.iou_thresholds:
        changes["iou_thresholds"] = tuple(args.iou_thresholds)
    if args.area_ranges:
        changes["area_ranges"], changes["area_labels"] = parse_area_ranges(args.area_ranges)
    if not changes:
        return None
    return dataclasses.replace(LVIS_PARAMS if args.dataset == "lvis" else COCO_PARAMS, **changes)


def _config(args) -> InstanceEvalConfig:
    """The evaluation settings of the flags (ValueError naming the flag)."""
    if args.images_of and not args.save_partial:
        raise ValueError("--images-of evaluates a share of the images: add --save-partial FILE.npz to merge it later")
    return InstanceEvalConfig(
        iou_type=args.iou_type, dataset=args.dataset, dilation_ratio=args.dilation_ratio, chunk_masks=args.batch_size,
        progress=args.progress, mask_path=args.mask_path, ap_params=_ap_params(args),
        image_ids=tuple(args.image_ids) if args.image_ids else None,
        category_ids=tuple(args.category_ids) if args.category_ids else None, use_cats=not args.class_agnostic,
        images_of=parse_share(args.images_of) if args.images_of else None)


def _error(message: str) -> int:
    return report_error(NAME, message)


def _warn(message: str) -> None:
    report_warning(NAME, message)


def _check_inputs(args) -> None:
    """ValueError naming the flag when the inputs and the mode (evaluate, share, merge) do not fit."""
    if args.merge and (args.gt or args.results or args.save_partial or args.images_of):
        raise ValueError("--merge reads only the partial files: drop --gt, --results, --save-partial and --images-of")
    if not args.merge and not (args.gt and args.results):
        raise ValueError("the following arguments are required: --gt, --results (or --merge FILE.npz ...)")
    if args.images_of and args.out:
        raise ValueError("--out with --images-of: a share's numbers are not the evaluation's; write --out with --merge")
    if args.save_partial:
        check_writable_file(args.save_partial, "--save-partial file")
    if args.out:
        check_writable_file(args.out, "--out file")
    if args.eval_images:
        if args.images_of:
            raise ValueError("--eval-images with --images-of: write the evalImgs with --merge")
        if args.dataset == "lvis":
            raise ValueError("--eval-images writes COCOeval's evalImgs; an lvis evaluation has none")
        check_writable_file(args.eval_images, "--eval-images file")


def _evaluate(args, config: InstanceEvalConfig):
    """The evaluation the flags ask for (merged partials, or the files); a share is also saved."""
    if args.merge:
        return evaluate_partials(args.merge)
    where = "the run lengths on the host" if uses_runs(config.count_settings) else device_summary()
    print(f"jaxseg-robust {NAME}: {args.dataset} {args.iou_type} evaluation, pixel counts on {where}",
          file=sys.stderr, flush=True)
    result = evaluate_instances(args.gt, args.results, config, warn=_warn)
    if args.save_partial:
        path = save_partial(args.save_partial, result.blocks, config, {"ground_truth": file_sha256(args.gt)})
        print(f"wrote the evaluation of {result.counts['images']} image(s) to {path}; merge every share with "
              f"--merge", file=sys.stderr)
    return result


def run(args) -> int:
    """Runs the evaluation; returns the exit code."""
    try:
        _check_inputs(args)
        config = _config(args)
        check_progress_mode(args.progress)
    except ValueError as error:
        return _error(str(error))
    try:
        result = _evaluate(args, config)
    except (CocoFormatError, ImportError) as error:
        return _error(str(error))
    if args.images_of:
        return EXIT_OK  # a share's numbers are not the evaluation's: merge the shares
    dataset, iou_type = result.config.dataset, result.config.iou_type
    print(instance_text(result.summary, dataset, params=result.config.params))
    if args.per_category:  # fractions, like the summary lines above (reports.coco_eval)
        print(per_category_markdown(result.per_category, PER_CATEGORY_COLUMNS))
    if args.out:
        title = f"{'Boundary AP' if iou_type == 'boundary' else 'Mask AP'} ({dataset})"
        paths = write_outputs(args.out, title, result.summary, result.per_category, PER_CATEGORY_COLUMNS)
        print(f"wrote {', '.join(map(str, paths))}", file=sys.stderr)
    return _write_eval_images(args.eval_images, result) if args.eval_images else EXIT_OK


def _write_eval_images(path, result) -> int:
    """Writes the evaluation's evalImgs as JSON to ``path``; returns the exit code."""
    try:
        entries = eval_images_json(result)
    except ValueError as error:
        return _error(f"--eval-images: {error}")
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(entries), encoding="utf-8")
    print(f"wrote {len(entries)} evalImgs entries to {path}", file=sys.stderr)
    return EXIT_OK
