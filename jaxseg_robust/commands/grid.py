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
``RUN_DIR/timings.jsonl`` / ``compile.jsonl``: `commands.running.finish`) is
printed and written to ``RUN_DIR/summary.md`` / ``summary.csv``.
"""

from __future__ import annotations

import math
import os
import pathlib
import sys

import numpy as np

from jaxseg_robust.commands.flags import (
    DEVICE_EPILOG,
    CommandError,
    add_flag,
    add_protocol_parser,
    finite_float,
    positive_int,
)
from jaxseg_robust.commands.loading import (
    LoadedModel,
    load_instances,
    load_model_of,
    model_config,
    refuse_click_only,
    resolve_threshold,
)
from jaxseg_robust.commands.running import (
    finish,
    report_error,
    run_protocol,
    start_processes,
    startup_line,
    timed_finalize_of,
)

COMMAND = "grid"
KINDS = ("click", "box")
DEFAULT_BATCH_SIZE = 1  # memory ~ batch size x chunk size decodes
HEATMAPS_DIR = "heatmaps"
CLICK_MAPS = ("iou", "biou", "evaluated", "rows", "cols")
BOX_MAPS = ("iou", "biou", "iou_reference", "valid", "heights", "widths", "corner_heatmap")

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
    from jaxseg_robust.attacks import grid  # noqa: PLC0415

    _, group = add_protocol_parser(
        subparsers, COMMAND, summary="exhaustive click / box grids: IoU heatmaps over prompt positions and sizes",
        description="Exhaustive prompt grids of a promptable model: the IoU of a click at every grid "
                    "position (TETRIS; SAM, MobileSAM, SAM 2, SAM-HQ, RITM, SimpleClick, CFR-ICL) or of every "
                    "centred box size (BREPS; models that take boxes), with min / max per instance.",
        epilog=EPILOG, default_batch_size=DEFAULT_BATCH_SIZE, group_title="grid", run=run)
    group.add_argument("--kind", choices=KINDS, required=True, help="click positions or centred box sizes (required)")
    group.add_argument("--stride", type=positive_int, default=grid.DEFAULT_STRIDE,
                       help="grid step in pixels (positions, or box heights / widths; default %(default)s)")
    add_flag(group, "--chunk-size", type=positive_int, default=grid.DEFAULT_CHUNK_SIZE,
             help="prompts decoded together per instance (memory; default %(default)s)")
    group.add_argument("--region", choices=grid.CLICK_REGIONS, default="image",
                       help="click grid: which positions are decoded (default %(default)s)")
    group.add_argument("--prefix", choices=grid.CLICK_PREFIXES, default="none",
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


def check_arguments(args) -> bool:
    """Checks flag combinations; returns the multimask setting.

    Raises:
      CommandError: naming the flag.
    """
    if args.kind == "box":
        for flag, value, default in (("--region", args.region, "image"), ("--prefix", args.prefix, "none")):
            if value != default:
                raise CommandError(f"{flag} applies to --kind click")
    elif args.no_corner_heatmap:
        raise CommandError("--no-corner-heatmap applies to --kind box")
    if args.thresh is not None and not 0.0 <= args.thresh < 1.0:
        raise CommandError(f"--thresh must be in [0, 1); got {args.thresh}")
    return (args.kind == "click") if args.multimask is None else bool(args.multimask)


def prompt_count(kind: str, stride: int, height: int, width: int) -> int:
    """Prompts in one instance's grid: click positions ``ceil(H/s) ceil(W/s)`` on the image, or centred
    box sizes ``(2H//s + 1) (2W//s + 1)`` (heights and widths 0, s, ... <= 2H, 2W)."""
    if kind == "click":
        return -(-height // stride) * -(-width // stride)
    return (2 * height // stride + 1) * (2 * width // stride + 1)


def check_stride(args, instances) -> None:
    """Refuses a ``--stride`` that leaves one prompt per instance everywhere (min = max = that prompt).

    When only some instances are that small, says so on stderr (naming up to three) and goes on.

    Raises:
      CommandError: naming ``--stride``, the largest image and the largest stride that still gives a grid.
    """
    single = [ref for ref in instances if prompt_count(args.kind, args.stride, *ref.size) <= 1]
    what = "click position" if args.kind == "click" else "box size (0 x 0)"
    if single and len(single) == len(instances):
        height, width = max((ref.size for ref in instances), key=lambda size: max(size))
        limit = max(height, width) - 1 if args.kind == "click" else 2 * max(height, width)
        raise CommandError(f"--stride {args.stride} leaves a single {what} in every image (the largest is "
                           f"{height}x{width}): min and max would be that one prompt; use --stride {limit} or less")
    if single:
        names = ", ".join(f"{ref.name} ({ref.size[0]}x{ref.size[1]})" for ref in single[:3])
        more = f" and {len(single) - 3} more" if len(single) > 3 else ""
        print(f"jaxseg-robust {COMMAND}: warning: --stride {args.stride} leaves a single {what} in {names}{more}",
              file=sys.stderr)


def protocol_config(args, model: LoadedModel, multimask: bool) -> dict:
    """The run configuration recorded in (and compared on resume with) the manifest; a click grid's
    ``records_format`` names its records' layout (`jaxseg_robust.runner.rundir.check_records_format`)."""
    from jaxseg_robust.attacks.grid.clicks import RECORDS_FORMAT  # noqa: PLC0415
    from jaxseg_robust.runner.rundir import RECORDS_FORMAT_KEY  # noqa: PLC0415

    config = model_config(COMMAND, args, model, kind=args.kind)
    config.update(stride=args.stride, multimask_output=multimask)
    if args.kind == "click":
        config.update(region=args.region, prefix=args.prefix, thresh=args.thresh)
        config[RECORDS_FORMAT_KEY] = RECORDS_FORMAT
    else:
        config.update(corner_heatmap=not args.no_corner_heatmap)
    return config


def make_batch_function(args, model: LoadedModel, multimask: bool):
    """The `jaxseg_robust.attacks.grid` batch function (a `jaxseg_robust.runner.program.BatchProgram`) of ``--kind``."""
    from jaxseg_robust.attacks.grid import make_box_grid_batch_fn, make_click_grid_batch_fn  # noqa: PLC0415

    try:
        if args.kind == "click":
            return make_click_grid_batch_fn(model.segmenter, model.params, stride=args.stride,
                                            chunk_size=args.chunk_size, region=args.region, prefix=args.prefix,
                                            thr=args.thresh, multimask_output=multimask, announce=startup_line)
        return make_box_grid_batch_fn(model.segmenter, model.params, stride=args.stride, chunk_size=args.chunk_size,
                                      multimask_output=multimask, corner_heatmap=not args.no_corner_heatmap,
                                      announce=startup_line)
    except ValueError as error:
        raise CommandError(str(error)) from None


# ---- records ---------------------------------------------------------------------------------

def heatmap_path(dataset: str, instance_id: str) -> pathlib.Path:
    """``heatmaps/<dataset>/<id>.npz`` relative to the run directory (names that are not file-name-safe
    are made safe and get a short hash of the original, `jaxseg_robust.hashing.file_stem`, so two
    instances never share a file)."""
    from jaxseg_robust.hashing import file_stem  # noqa: PLC0415

    return pathlib.Path(HEATMAPS_DIR) / file_stem(dataset) / f"{file_stem(instance_id)}.npz"


def _nan_extreme(values: np.ndarray, which) -> float:
    finite = values[np.isfinite(values)]
    return float(which(finite)) if finite.size else math.nan


def crop_outputs(kind: str, outputs: dict, size: tuple[int, int], stride: int) -> tuple[dict, dict]:
    """Splits one instance's grid outputs into (scalars for the record, heatmaps cropped to the image).

    Args:
      kind: "click" or "box".
      outputs: the instance's batch outputs (NumPy; frame-sized grids).
      size: (H, W) of the image.
      stride: the grid stride.

    Returns:
      (payload dict, arrays dict). Click heatmaps keep the ``ceil(H / s) x
      ceil(W / s)`` positions inside the image; box heatmaps the sizes ``0..2H``
      x ``0..2W``; the corner heatmap the image's pixels.
    """
    height, width = size
    maps = CLICK_MAPS if kind == "click" else BOX_MAPS
    if kind == "click":
        rows, cols = -(-height // stride), -(-width // stride)
        crop = {"iou": (rows, cols), "biou": (rows, cols), "evaluated": (rows, cols), "rows": (rows,),
                "cols": (cols,)}
    else:
        rows, cols = 2 * height // stride + 1, 2 * width // stride + 1
        crop = {"iou": (rows, cols), "biou": (rows, cols), "iou_reference": (rows, cols), "valid": (rows, cols),
                "heights": (rows,), "widths": (cols,), "corner_heatmap": (height, width)}
    arrays = {}
    for name in maps:
        if name in outputs:
            value = np.asarray(outputs[name])
            arrays[name] = value[tuple(slice(0, n) for n in crop[name])]
    payload = {name: value for name, value in outputs.items() if name not in maps}
    if kind == "box":
        payload["biou_min"] = _nan_extreme(arrays["biou"], np.min)
        payload["biou_max"] = _nan_extreme(arrays["biou"], np.max)
    payload["grid_shape"] = list(arrays["iou"].shape)
    return payload, arrays


def write_heatmaps(run_dir, relative: pathlib.Path, arrays: dict) -> None:
    """Writes ``arrays`` to ``run_dir / relative`` (compressed npz; atomic replace)."""
    target = pathlib.Path(run_dir) / relative
    target.parent.mkdir(parents=True, exist_ok=True)
    temporary = target.with_name(target.name + ".tmp.npz")
    np.savez_compressed(temporary, **arrays)
    os.replace(temporary, target)


def make_finalize(run_dir, kind: str, stride: int):
    """The engine's ``finalize``: crop, write the heatmaps file, return the payload (with ``source``)."""
    from jaxseg_robust.reports.sources import with_image_source  # noqa: PLC0415

    def finalize(instance, outputs) -> dict:
        payload, arrays = crop_outputs(kind, outputs, instance.size, stride)
        relative = heatmap_path(instance.dataset, instance.id)
        write_heatmaps(run_dir, relative, arrays)
        payload["heatmaps"] = relative.as_posix()
        return payload

    return with_image_source(finalize)


def execute(args) -> tuple:
    """Checks, loads, runs into ``args.out``; returns (run summary, table Markdown, table CSV) of the run directory."""
    from jaxseg_robust.reports.grid import grid_table, to_csv, to_markdown  # noqa: PLC0415
    from jaxseg_robust.reports.report_files import load_run_records  # noqa: PLC0415

    multimask = check_arguments(args)
    instances = load_instances(args)
    check_stride(args, instances)
    startup_line(f"loading {args.model} ...")
    model = load_model_of(args)
    if args.kind == "box":
        refuse_click_only(model, "grid --kind box")
    args.thresh = resolve_threshold(args.thresh, model)  # the family's unless --thresh says otherwise
    batch_fn = make_batch_function(args, model, multimask).with_timing()
    config = protocol_config(args, model, multimask)
    summary = run_protocol(args, instances=instances, batch_fn=batch_fn, config=config, model=model,
                           finalize=timed_finalize_of(args, batch_fn, make_finalize(args.out, args.kind, args.stride)))
    table = grid_table(load_run_records(args.out), args.kind, multimask)
    return summary, to_markdown(table), to_csv(table)


def run(args) -> int:
    """Checks the flags, loads, runs into ``args.out`` and prints the table; returns an exit code of
    `jaxseg_robust.exit_codes`."""
    try:
        start_processes(args)
        summary, markdown, csv_text = execute(args)
    except (CommandError, ValueError) as error:
        return report_error(COMMAND, str(error))
    return finish(COMMAND, args, summary, markdown, csv_text)
