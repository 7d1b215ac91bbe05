"""`jaxseg-robust score`: mask IoU, Boundary IoU and friends for folders of GT / predicted masks.

Files of the two folders are matched by stem (``a.png`` <-> ``a.bmp``). Each
matched pair is scored with :func:`jaxseg_robust.metrics.masks.mask_scores`.
Pairs are bucketed by their boundary width d (which depends on the image
size) and zero-padded to the bucket's largest height and width, with the
padding marked invalid; every score is unchanged by such padding (outside the
image counts as background, exactly like a zero pixel, and padded pixels are
never counted), so one jitted, vmapped call serves a whole bucket and each
bucket compiles once.
Unmatched, ambiguous, unreadable and size-mismatched files are reported by
name and skipped. Exit code 0 = every file scored, 1 = some skipped, 2 = bad
arguments or nothing scored.
"""

from __future__ import annotations

import argparse
import csv
import math
import pathlib
import sys
from typing import NamedTuple

import jax
import numpy as np

from jaxseg_robust.commands.flags import DEVICE_EPILOG, add_flag, finite_float
from jaxseg_robust.commands.running import report_error
from jaxseg_robust.exit_codes import EXIT_FAILURE, EXIT_OK, EXIT_PARTIAL
from jaxseg_robust.data.examples import write_example_folders
from jaxseg_robust.data.masks_io import (
    DEFAULT_RULE,
    MaskReadError,
    empty_mask_hint,
    list_mask_files,
    parse_rule,
    read_mask_checked,
    read_mask_size,
)
from jaxseg_robust.metrics.masks import DEFAULT_DILATION_RATIO, batched_mask_scores, boundary_width
from jaxseg_robust.runner.rundir import check_writable_file

DEFAULT_EXAMPLE_DIR = "example_masks"
BATCH_SIZE = 16  # pairs per jitted call ...
BATCH_PIXELS = 2**26  # ... and at most this many canvas pixels per call (memory bound)
SCORE_COLUMNS = ("iou", "boundary_iou", "min_iou_boundary_iou", "trimap_iou", "f_measure")
CSV_COLUMNS = ("name", "height", "width", "boundary_px", "gt_pixels", "pred_pixels", "ignore_pixels") + SCORE_COLUMNS

EPILOG = """\
examples:
  jaxseg-robust score --example
      write example GT/prediction folders to ./example_masks and score them
  jaxseg-robust score data/gt preds/ --out scores.csv
  jaxseg-robust score grabcut/masks preds/ --gt-rule '==255' --gt-ignore 128

mask rules: '>N', '>=N', '==N', '!=N' applied to the pixel value (grey value,
palette index, or max over R,G,B). One rule reads every file of a folder, whatever
values the file holds: the default '>128' reads 0/255, JPEG and soft masks; 0/1
label masks and DAVIS palette ids: '>0'; GrabCut/Berkeley: --gt-rule '>128'
--gt-ignore 128. A GT that its rule leaves empty is skipped and named (never scored
as IoU 0); a mask that is not close to two-valued (a photo, noise) is scored with a
warning naming the file.
exit codes: 0 all scored, 1 some files skipped (listed), 2 nothing scored / bad arguments.
""" + DEVICE_EPILOG + "\n"


class Pair(NamedTuple):
    """A GT file and a prediction file with the same stem ``name``."""

    name: str
    gt_path: pathlib.Path
    pred_path: pathlib.Path


def register(subparsers) -> None:
    """Adds the ``score`` sub-command."""
    parser = subparsers.add_parser(
        "score",
        help="score predicted masks against ground truth (IoU, Boundary IoU, trimap IoU, F)",
        description="Score predicted binary masks against ground-truth masks, matched by file stem: "
        "mask IoU, Boundary IoU (official API), min(IoU, BIoU), trimap IoU and boundary F-measure.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("gt_dir", nargs="?", metavar="GT_DIR", help="folder of ground-truth masks")
    parser.add_argument("pred_dir", nargs="?", metavar="PRED_DIR", help="folder of predicted masks")
    parser.add_argument(
        "--example", nargs="?", const=DEFAULT_EXAMPLE_DIR, default=None, metavar="DIR",
        help=f"write a deterministic example GT/pred folder pair to DIR (default ./{DEFAULT_EXAMPLE_DIR}) and score it",
    )
    add_flag(parser, "--dilation-ratio", type=finite_float, default=DEFAULT_DILATION_RATIO,
             help="boundary width as a fraction of the image diagonal (default %(default)s; d = max(1, round(ratio*diag)))")
    parser.add_argument("--out", metavar="CSV",
                        help="write per-file scores to this CSV (default: printed only; with --example: "
                             "DIR/scores.csv)")
    add_flag(parser, "--gt-rule", default=DEFAULT_RULE,
             help="foreground rule for every GT mask (default %(default)s; 0/1 or palette-id masks: '>0')")
    add_flag(parser, "--pred-rule", default=DEFAULT_RULE,
             help="foreground rule for every predicted mask (default %(default)s; 0/1 masks: '>0')")
    add_flag(parser, "--gt-ignore", type=int, default=None, metavar="VALUE",
             help="GT pixel value to ignore (GrabCut/Berkeley: 128); default: none")
    parser.set_defaults(func=run)


def _error(message: str) -> None:
    report_error("score", message)


def match_files(gt_dir, pred_dir) -> tuple[list[Pair], list[str]]:
    """Pairs the mask files of two folders by stem.

    Returns:
      (pairs sorted by name, problems): one problem line per unmatched or
      ambiguous stem.
    """
    gt_files, gt_ambiguous = list_mask_files(gt_dir)
    pred_files, pred_ambiguous = list_mask_files(pred_dir)
    problems = []
    for label, ambiguous in (("GT", gt_ambiguous), ("prediction", pred_ambiguous)):
        for stem, paths in sorted(ambiguous.items()):
            problems.append(f"{stem}: several {label} files share this stem: {', '.join(p.name for p in paths)}")
    ambiguous_stems = set(gt_ambiguous) | set(pred_ambiguous)
    for stem in sorted(set(gt_files) - set(pred_files) - ambiguous_stems):
        problems.append(f"{gt_files[stem]}: no prediction with this stem")
    for stem in sorted(set(pred_files) - set(gt_files) - ambiguous_stems):
        problems.append(f"{pred_files[stem]}: no GT with this stem")
    pairs = [Pair(stem, gt_files[stem], pred_files[stem]) for stem in sorted(set(gt_files) & set(pred_files))]
    return pairs, problems


class Bucket(NamedTuple):
    """Pairs scored together: same boundary width, padded to one canvas."""

    width: int  # boundary width d in pixels
    canvas: tuple[int, int]  # (height, width) every mask is padded to
    pairs: list[tuple[Pair, tuple[int, int]]]  # (pair, its own (H, W))


def bucket_pairs(pairs: list[Pair], dilation_ratio: float) -> tuple[list[Bucket], list[str]]:
    """Reads each pair's image sizes and buckets the pairs by boundary width.

    Returns:
      (buckets sorted by width, problems): unreadable headers and size
      mismatches are problems (one line each, naming the files).
    """
    by_width: dict[int, list[tuple[Pair, tuple[int, int]]]] = {}
    problems = []
    for pair in pairs:
        try:
            gt_size, pred_size = read_mask_size(pair.gt_path), read_mask_size(pair.pred_path)
        except MaskReadError as error:
            problems.append(str(error))
            continue
        if gt_size != pred_size:
            problems.append(
                f"{pair.name}: size mismatch, GT {pair.gt_path.name} is {gt_size[0]}x{gt_size[1]}, "
                f"prediction {pair.pred_path.name} is {pred_size[0]}x{pred_size[1]} (HxW)"
            )
            continue
        by_width.setdefault(boundary_width(*gt_size, dilation_ratio), []).append((pair, gt_size))
    buckets = []
    for width, members in sorted(by_width.items()):
        canvas = (max(size[0] for _, size in members), max(size[1] for _, size in members))
        buckets.append(Bucket(width, canvas, members))
    return buckets, problems


def _pad(mask: np.ndarray, canvas: tuple[int, int], value: bool) -> np.ndarray:
    return np.pad(mask, ((0, canvas[0] - mask.shape[0]), (0, canvas[1] - mask.shape[1])), constant_values=value)


def _rule_hint(values: np.ndarray, mask: np.ndarray, which: str, rule, path) -> str | None:
    """A warning when a rule turns a non-blank file into an empty mask (likely the wrong rule)."""
    if mask.any() or not values.any():
        return None
    return (f"{path}: {which} mask is empty under rule '{rule}' but the file has values up to "
            f"{int(values.max())}; check --{which}-rule")


def _empty_gt_problem(pair: Pair, reading, gt_ignore) -> str:
    """The line naming a GT file whose object is empty under ``--gt-rule`` (the pair is not scored)."""
    ignore = "" if gt_ignore is None else f"--gt-ignore {gt_ignore}; "
    hint = empty_mask_hint(reading.values, reading.rule, reading.valid, rule_name="--gt-rule")
    return f"{pair.gt_path}: GT mask has no object pixel ({ignore}{hint}); not scored"


def _load_chunk(chunk, gt_rule, pred_rule, gt_ignore):
    """Decodes one chunk; returns (loaded pairs, gt, pred, valid arrays, problems, warnings).

    A GT that the rule leaves empty is a problem naming the file (its IoU would be 0 or undefined, not a score).
    """
    loaded, gts, preds, valids, problems, warnings = [], [], [], [], [], []
    for pair, _ in chunk:
        try:
            gt_read = read_mask_checked(pair.gt_path, gt_rule, gt_ignore)
            pred_read = read_mask_checked(pair.pred_path, pred_rule)
        except MaskReadError as error:
            problems.append(str(error))
            continue
        gt, valid, pred = gt_read.foreground, gt_read.valid, pred_read.foreground
        if pred.shape != gt.shape:
            problems.append(f"{pair.name}: size mismatch after decoding ({gt.shape} vs {pred.shape})")
            continue
        if not gt.any():
            problems.append(_empty_gt_problem(pair, gt_read, gt_ignore))
            continue
        warnings += [reading.warning for reading in (gt_read, pred_read) if reading.warning]
        hint = _rule_hint(pred_read.values, pred, "pred", pred_rule, pair.pred_path)
        if hint:
            warnings.append(hint)
        loaded.append(pair)
        gts.append(gt)
        preds.append(pred)
        valids.append(valid)
    return loaded, gts, preds, valids, problems, warnings


def score_buckets(buckets: list[Bucket], gt_rule, pred_rule, gt_ignore) -> tuple[list[dict], list[str], list[str]]:
    """Scores every pair, one jitted batch (BATCH_SIZE pairs, BATCH_PIXELS pixels at most) at a time.

    Returns:
      (rows: one dict per scored pair with the CSV columns, sorted by name;
      problems; warnings).
    """
    rows, problems, warnings = [], [], []
    for bucket in buckets:
        scores_fn = batched_mask_scores(bucket.width)
        # Fixed per bucket, so each bucket compiles once.
        batch = max(1, min(BATCH_SIZE, len(bucket.pairs), BATCH_PIXELS // (bucket.canvas[0] * bucket.canvas[1])))
        for start in range(0, len(bucket.pairs), batch):
            loaded, gts, preds, valids, bad, notes = _load_chunk(
                bucket.pairs[start: start + batch], gt_rule, pred_rule, gt_ignore
            )
            problems += bad
            for note in notes:  # a warning is said once
                if note not in warnings:
                    warnings.append(note)
            if not loaded:
                continue
            padding = batch - len(loaded)
            empty = np.zeros(bucket.canvas, bool)
            gt = np.stack([_pad(m, bucket.canvas, False) for m in gts] + [empty] * padding)
            pred = np.stack([_pad(m, bucket.canvas, False) for m in preds] + [empty] * padding)
            valid = np.stack([_pad(m, bucket.canvas, False) for m in valids] + [empty] * padding)
            result = jax.device_get(scores_fn(gt, pred, valid))
            for i, pair in enumerate(loaded):
                height, width = gts[i].shape
                row = {
                    "name": pair.name, "height": height, "width": width, "boundary_px": bucket.width,
                    "gt_pixels": int(gts[i].sum()), "pred_pixels": int(preds[i].sum()),
                    "ignore_pixels": int((~valids[i]).sum()),
                }
                for column in SCORE_COLUMNS:
                    row[column] = float(getattr(result, column)[i])
                rows.append(row)
    rows.sort(key=lambda row: row["name"])
    return rows, problems, warnings


def _format(value) -> str:
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.4f}"
    return str(value)


def print_table(rows: list[dict], out=None) -> None:
    """Prints the per-file table (to ``out``, default stdout)."""
    out = sys.stdout if out is None else out
    columns = ("name", "height", "width", "boundary_px") + SCORE_COLUMNS
    headers = ("name", "H", "W", "d", "IoU", "BIoU", "min", "trimap", "F")
    cells = [[_format(row[c]) for c in columns] for row in rows]
    widths = [max([len(h)] + [len(line[i]) for line in cells]) for i, h in enumerate(headers)]
    print("  ".join(h.ljust(w) if i == 0 else h.rjust(w) for i, (h, w) in enumerate(zip(headers, widths))), file=out)
    for line in cells:
        print("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(line, widths))), file=out)


def summary_line(rows: list[dict], skipped: int) -> str:
    """``scored N, skipped K; mean IoU ..., BIoU ..., ...`` (means over defined values)."""
    parts = []
    for column, label in zip(SCORE_COLUMNS, ("IoU", "BIoU", "min", "trimap", "F")):
        values = [row[column] for row in rows if not math.isnan(row[column])]
        mean = f"{sum(values) / len(values):.4f}" if values else "nan"
        undefined = len(rows) - len(values)
        parts.append(f"{label} {mean}" + (f" ({undefined} undefined)" if undefined else ""))
    return f"scored {len(rows)}, skipped {skipped}; mean " + ", ".join(parts)


def write_csv(rows: list[dict], path) -> None:
    """Writes the per-file rows (CSV_COLUMNS); NaN is written as ``nan``."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=CSV_COLUMNS)
        writer.writeheader()
        for row in rows:
            writer.writerow({key: (repr(value) if isinstance(value, float) else value) for key, value in row.items()})


def run(args) -> int:
    """Runs the command; returns an exit code of `jaxseg_robust.exit_codes`."""
    if args.example is not None:
        if args.gt_dir or args.pred_dir:
            _error("--example takes no GT_DIR/PRED_DIR (give the output folder as --example DIR)")
            return EXIT_FAILURE
        root = pathlib.Path(args.example)
        gt_dir, pred_dir = write_example_folders(root)
        print(f"wrote example masks to {gt_dir} and {pred_dir}")
        out = args.out or root / "scores.csv"
    else:
        if not (args.gt_dir and args.pred_dir):
            _error("give GT_DIR and PRED_DIR, or --example [DIR]")
            return EXIT_FAILURE
        gt_dir, pred_dir, out = args.gt_dir, args.pred_dir, args.out
    try:
        gt_rule, pred_rule = parse_rule(args.gt_rule), parse_rule(args.pred_rule)
        boundary_width(1, 1, args.dilation_ratio)
        pairs, problems = match_files(gt_dir, pred_dir)
        if out:
            check_writable_file(out, "--out")  # before scoring: never compute scores that cannot be saved
    except ValueError as error:
        _error(str(error))
        return EXIT_FAILURE
    buckets, size_problems = bucket_pairs(pairs, args.dilation_ratio)
    rows, load_problems, warnings = score_buckets(buckets, gt_rule, pred_rule, args.gt_ignore)
    problems += size_problems + load_problems
    if rows:
        print_table(rows)
    for line in warnings:
        print(f"warning: {line}", file=sys.stderr)
    for line in problems:
        print(f"skipped: {line}", file=sys.stderr)
    print(summary_line(rows, len(problems)))
    if not rows:
        _error(f"nothing scored (no readable, same-size GT/prediction pairs in {gt_dir} and {pred_dir})")
        return EXIT_FAILURE
    if out:
        try:
            write_csv(rows, out)
        except OSError as error:
            _error(f"cannot write --out {out}: {error.strerror or error} (the scores are printed above)")
            return EXIT_FAILURE
        print(f"wrote {out}")
    return EXIT_PARTIAL if problems else EXIT_OK
