"""`jaxseg-robust breps`: BREPS box robustness of a model that takes boxes (SAM, MobileSAM, SAM 2, SAM-HQ).

Protocols (``--mode``; docs/protocols/breps.md §4, defaults = the reference code):
  minmax  (default) the MIN and the MAX box attacks on one embedding per image:
          IoU-Tight/Min/Max/Δ@BBox per dataset;
  min, max  one attack (with IoU-Tight@BBox);
  tight   the tight GT box with single-mask output (the jitter/user scripts' baseline);
  jitter  the 10 jittered tight boxes of §4.8 (seed ``--seed``, shift ``--jitter-pow``);
  user    real user boxes (§4.9) from ``--user-boxes CSV`` (``image_id,x1,y1,x2,y2[,user]``,
          evaluation-frame pixels, image_id = the instance id or ``dataset/id``) or
          ``--user-box-masks DIR`` (BREPS layout: one PNG per box, ``<stem>_1_<user>.png``).

Records (``RUN_DIR/records.jsonl``, one JSON line per instance): the batch
function's outputs (`jaxseg_robust.attacks.boxes.make_box_batch_fn`), with
the per-iterate trajectory (boxes, losses, IoU/BIoU per step) unless
``--no-trajectory``; user mode: per user box its IoU, BIoU, resized-frame
IoU, box and user id. The per-dataset summary (`jaxseg_robust.reports.breps`,
with the seconds per instance, device and wall, and the compile total of
``RUN_DIR/timings.jsonl`` / ``compile.jsonl``: `commands.running.finish`) is
printed and written to ``RUN_DIR/summary.md`` and ``RUN_DIR/summary.csv``.
"""

from __future__ import annotations

import dataclasses
import sys

import numpy as np

from jaxseg_robust.commands.flags import (
    DEVICE_EPILOG,
    CommandError,
    add_attack_step_flags,
    add_flag,
    add_mode_flag,
    add_protocol_parser,
    finite_float,
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

COMMAND = "breps"
MODES = ("minmax", "min", "max", "tight", "jitter", "user")
DEFAULT_BATCH_SIZE = 4
USER_SLOT_MULTIPLE = 16

EPILOG = """\
examples:
  jaxseg-robust breps --model sam_vit_b --datasets GrabCut,Berkeley,DAVIS,COCO_MVal \\
      --data-root ~/datasets --out runs/breps_sam_vit_b
      MIN and MAX attacks (50 Adam steps, lr_mult 9, lambda 0.1), IoU-Tight/Min/Max/Δ@BBox
  jaxseg-robust breps --model sam_tiny --folder my/images my/masks --mask-ignore 128 \\
      --n_opt_steps 10 --limit 5 --out runs/smoke
      a quick smoke run on any image/mask folder with a random-weight test model
  jaxseg-robust breps --model sam_vit_b --datasets DAVIS --mode user --user-boxes boxes.csv --out runs/user
  jaxseg-robust breps --model sam_vit_b --datasets GrabCut --mode jitter --box-frame resized --out runs/jit

Rerunning the same command resumes: finished instances are skipped, the table
is printed again. Failed instances (unreadable files, mismatched mask sizes,
empty masks) are recorded with their error and counted in the table.
Beside the records: RUN_DIR/masks/ (the attacks' predicted masks of the best box; drawn
by `jaxseg-robust report RUN_DIR`).
exit codes: 0 every instance ok, 1 some instances failed (listed), 2 bad
arguments / nothing could be run.
""" + DEVICE_EPILOG + "\n"


def register(subparsers) -> None:
    """Adds the ``breps`` sub-command."""
    _, group = add_protocol_parser(
        subparsers, COMMAND, summary="BREPS adversarial / tight / jittered / user boxes for box-prompted models",
        description="BREPS box-prompt robustness (adversarial MIN/MAX boxes, tight, jittered and real user "
                    "boxes) of a model that takes box prompts (SAM, MobileSAM, SAM 2, SAM-HQ; click-map "
                    "models such as RITM take clicks only) on RITM-style datasets or any image/mask folder.",
        epilog=EPILOG, default_batch_size=DEFAULT_BATCH_SIZE, group_title="BREPS protocol", run=run)
    add_mode_flag(group, MODES)
    add_attack_step_flags(group, n_opt_steps=50, first_iterate="per attack: the tight box", lr_mult=9.0,
                          lr_scale="sqrt(H^2 + W^2) / (1024 sqrt 2)")
    add_flag(group, "--lambda-mult", type=finite_float, default=0.1,
             help="weight of the Gamma realism term over CIoU (default %(default)s)")
    group.add_argument("--thresh", "--thr", dest="thresh", type=finite_float, default=None,
                       help="probability threshold of the attack's masks (default: the model family's, 0.5 for SAM)")
    add_flag(group, "--clip-and-order", action="store_true",
             help="the paper's variant: order and clip the box to the image after every update "
                  "(default: the code's raw box)")
    add_flag(group, "--no-trajectory", action="store_true",
             help="do not store the per-step boxes, losses and IoUs in the records (default: stored)")
    add_flag(group, "--box-frame", choices=("evaluation", "resized"), default="evaluation",
             help="tight/jitter/user-box-masks: draw boxes in the image frame or, as the reference "
                  "scripts, in SAM's 1024-resized frame (default %(default)s)")
    add_flag(group, "--float-boxes", action="store_true",
             help="tight/jitter: keep fractional box coordinates (default: truncate to int as the reference)")
    add_flag(group, "--jitter-pow", type=finite_float, default=0.3,
             help="jitter: largest shift as a fraction of the box size (default %(default)s)")
    group.add_argument("--seed", type=int, default=42,
                       help="jitter: Python random seed, reset for every image as the reference (default %(default)s)")
    add_flag(group, "--user-boxes", default=None, metavar="CSV",
             help="user mode: CSV image_id,x1,y1,x2,y2[,user] in image pixels (default: none; user mode needs "
                  "it or --user-box-masks)")
    add_flag(group, "--user-box-masks", default=None, metavar="DIR",
             help="user mode: folder of BREPS prompt PNGs <image stem>_1_<user>.png (default: none)")


# ---- validation and configuration ---------------------------------------------------------

def check_protocol_arguments(args) -> None:
    """Checks flag combinations and values before anything is loaded.

    Raises:
      CommandError: naming the flag.
    """
    from jaxseg_robust.attacks.boxes import BrepsConfig  # noqa: PLC0415

    try:
        BrepsConfig(mode="min", n_steps=args.n_opt_steps, lr_mult=args.lr_mult, lam=args.lambda_mult,
                    thr=0.5 if args.thresh is None else args.thresh)
    except ValueError as error:
        text = (str(error).replace("n_steps", "--n_opt_steps").replace("lr_mult", "--lr_mult")
                .replace("lam ", "--lambda_mult ").replace("thr ", "--thresh "))
        raise CommandError(text) from None
    user_sources = [flag for flag, value in (("--user-boxes", args.user_boxes),
                                             ("--user-box-masks", args.user_box_masks)) if value]
    if args.mode == "user":
        if len(user_sources) != 1:
            raise CommandError("--mode user needs exactly one of --user-boxes CSV or --user-box-masks DIR")
        if args.user_boxes and args.box_frame == "resized":
            raise CommandError("--user-boxes CSV boxes are in image pixels; --box-frame resized applies to "
                               "--user-box-masks only")
    elif user_sources:
        raise CommandError(f"{user_sources[0]} needs --mode user (got --mode {args.mode})")
    if not 0.0 < args.jitter_pow:
        raise CommandError(f"--jitter-pow must be > 0; got {args.jitter_pow}")


def protocol_config(args, model: LoadedModel, user_fingerprint: str | None = None) -> dict:
    """The run configuration recorded in (and compared on resume with) the manifest: only settings of the mode."""
    config = model_config(COMMAND, args, model, mode=args.mode)
    if args.mode in ("min", "max", "minmax"):
        config.update(n_opt_steps=args.n_opt_steps, lr_mult=args.lr_mult, lambda_mult=args.lambda_mult,
                      thresh=args.thresh, clip_and_order=args.clip_and_order,
                      record_trajectory=not args.no_trajectory)
    else:
        config.update(box_frame=args.box_frame)
        if args.mode in ("tight", "jitter"):
            config.update(integer_boxes=not args.float_boxes)
        if args.mode == "jitter":
            config.update(jitter_pow=args.jitter_pow, seed=args.seed)
        if args.mode == "user":
            config.update(user_boxes=user_fingerprint)
    return config


# ---- user boxes ----------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class InstanceBoxes:
    """The user boxes of one instance: boxes f32[n, 4] (in ``box_frame``), user ids, sources."""

    boxes: np.ndarray
    users: tuple[str, ...]


def read_user_boxes(args, instances, long_side: int = 1024) -> tuple[dict, str, list[str]]:
    """Reads ``--user-boxes`` / ``--user-box-masks`` and assigns the boxes to instances.

    ``long_side`` is the model's input side: prompt masks' resized-frame boxes
    (``--box-frame resized``) are taken from the mask resized to it, as the reference does.

    Returns:
      (instance key -> `InstanceBoxes`, fingerprint of the box source,
      warnings: boxes of images that are not instances).

    Raises:
      CommandError: malformed files, ambiguous image ids, no instance with boxes.
    """
    from jaxseg_robust.data.user_boxes import UserBoxError, read_user_box_masks, read_user_boxes_csv  # noqa: PLC0415
    from jaxseg_robust.runner.fingerprints import file_sha256, fingerprint_path  # noqa: PLC0415

    by_id: dict[str, list] = {}
    for instance in instances:
        by_id.setdefault(instance.id, []).append(instance.key)
        by_id.setdefault(f"{instance.dataset}/{instance.id}", []).append(instance.key)
    try:
        if args.user_boxes:
            boxes = read_user_boxes_csv(args.user_boxes)
            fingerprint = file_sha256(args.user_boxes)
        else:
            boxes = read_user_box_masks(args.user_box_masks, resized_long_side=long_side)
            fingerprint = fingerprint_path(args.user_box_masks)
    except (UserBoxError, OSError) as error:
        raise CommandError(str(error)) from None
    grouped: dict[tuple, list] = {}
    unknown: dict[str, int] = {}
    for box in boxes:
        keys = by_id.get(box.image_id, [])
        if len(keys) > 1:
            raise CommandError(f"{box.source}: image id {box.image_id!r} names {len(keys)} instances "
                               f"({', '.join('/'.join(k) for k in keys)}); write it as dataset/id")
        if not keys:
            unknown[box.image_id] = unknown.get(box.image_id, 0) + 1
            continue
        value = box.box_resized if args.box_frame == "resized" else box.box
        grouped.setdefault(keys[0], []).append((value, box.user))
    if not grouped:
        raise CommandError("no user box belongs to an instance of the datasets (image_id = instance id, "
                           "or dataset/id)")
    notes = []
    if unknown:
        shown = ", ".join(sorted(unknown)[:5]) + (" ..." if len(unknown) > 5 else "")
        notes.append(f"{sum(unknown.values())} user box(es) of {len(unknown)} image id(s) that are not "
                     f"instances were ignored: {shown}")
    assigned = {key: InstanceBoxes(np.asarray([v for v, _ in items], np.float32),
                                   tuple(u for _, u in items)) for key, items in grouped.items()}
    return assigned, fingerprint, notes


def user_box_finalize(boxes_by_key: dict, box_frame: str):
    """The user mode's ``finalize``: the instance's own boxes only (trimmed from the padded slots), with user ids."""

    def finalize(instance, outputs) -> dict:
        entry = boxes_by_key[instance.key]
        n = len(entry.boxes)
        payload = {name: np.asarray(outputs[name])[:n] for name in ("iou", "biou", "iou_resized", "boxes")}
        payload["users"] = list(entry.users)
        payload["box_frame"] = box_frame
        return payload

    return finalize


# ---- the command ---------------------------------------------------------------------------

def make_batch_function(args, model: LoadedModel, user_boxes: dict | None = None):
    """(batch_fn, finalize) of the chosen mode: a `jaxseg_robust.runner.program.BatchProgram` of the
    BREPS attack (`jaxseg_robust.attacks.boxes`) or of the fixed boxes (`jaxseg_robust.attacks.fixed_boxes`)."""
    from jaxseg_robust.attacks.fixed_boxes import fixed_box_protocol, make_box_batch_fn  # noqa: PLC0415
    from jaxseg_robust.data.buckets import instance_seed  # noqa: PLC0415
    from jaxseg_robust.runner.program import BatchProgram  # noqa: PLC0415

    try:
        if args.mode == "user":
            by_seed = {}
            for key, boxes in user_boxes.items():
                seed = instance_seed(key)
                if seed in by_seed:
                    raise CommandError(f"instance seed collision for {'/'.join(key)}; rename one instance")
                by_seed[seed] = boxes.boxes
            most = max(len(b.boxes) for b in user_boxes.values())
            protocol = fixed_box_protocol(model.segmenter, "user", box_frame=args.box_frame, user_boxes=by_seed,
                                          slots=-(-most // USER_SLOT_MULTIPLE) * USER_SLOT_MULTIPLE)
            function = BatchProgram(model.segmenter, model.params, protocol, announce=startup_line)
            return function, user_box_finalize(user_boxes, args.box_frame)
        options = {"max_shift_frac": args.jitter_pow, "seed": args.seed} if args.mode == "jitter" else None
        attack = args.mode in ("min", "max", "minmax")
        function = make_box_batch_fn(
            model.segmenter, model.params, mode=args.mode, n_steps=args.n_opt_steps, lr_mult=args.lr_mult,
            lam=args.lambda_mult, thr=args.thresh, clip_and_order=args.clip_and_order,
            record_trajectory=not args.no_trajectory, box_frame=args.box_frame,
            integer_boxes=not args.float_boxes, jitter_options=options, return_mask=attack, announce=startup_line)
    except ValueError as error:
        raise CommandError(str(error)) from None
    return function, (store_masks_finalize(args.out, args.mode) if attack else None)


def store_masks_finalize(run_dir, mode: str):
    """The attack modes' ``finalize``: each attack's best-box mask into ``RUN_DIR/masks/<dataset>/<id>.<attack>.png``.

    The payload is what it was without the masks (`jaxseg_robust.reports.artifacts.store_masks`);
    the masks are an extra output of the same program, so the recorded numbers do not change.
    """
    from jaxseg_robust.reports.artifacts import store_masks  # noqa: PLC0415

    def finalize(instance, outputs) -> dict:
        return store_masks(run_dir, instance, outputs, top_level=None if mode == "minmax" else mode)

    return finalize


def execute(args) -> tuple:
    """Checks, loads, runs into ``args.out``; returns (run summary, table Markdown, table CSV) of the run directory."""
    from jaxseg_robust.reports.breps import breps_table, load_run_records, to_csv, to_markdown  # noqa: PLC0415
    from jaxseg_robust.reports.sources import with_image_source  # noqa: PLC0415

    check_protocol_arguments(args)
    instances = load_instances(args)
    startup_line(f"loading {args.model} ...")
    model = load_model_of(args)
    refuse_click_only(model, f"breps --mode {args.mode}")
    args.thresh = resolve_threshold(args.thresh, model)  # the family's unless --thresh says otherwise
    user_boxes, user_fingerprint = None, None
    if args.mode == "user":
        from jaxseg_robust.attacks.fixed_boxes import has_resized_frame  # noqa: PLC0415

        # the model's resized frame (SAM family) gives the prompt masks' resized-frame boxes;
        # other families take boxes in the evaluation frame only (the resized ones are then unused)
        long_side = int(model.segmenter.config.image_size) if has_resized_frame(model.segmenter) else 1024
        user_boxes, user_fingerprint, notes = read_user_boxes(args, instances, long_side)
        for note in notes:
            print(f"warning: {note}", file=sys.stderr)
        without = len(instances) - len(user_boxes)
        if without:
            print(f"note: {without} instance(s) have no user box and are not evaluated", file=sys.stderr)
        instances = [instance for instance in instances if instance.key in user_boxes]
    batch_fn, finalize = make_batch_function(args, model, user_boxes)
    batch_fn = batch_fn.with_timing()
    finalize = timed_finalize_of(args, batch_fn, finalize)  # seconds into timings.jsonl, compiles into compile.jsonl
    config = protocol_config(args, model, user_fingerprint)
    summary = run_protocol(args, instances=instances, batch_fn=batch_fn, config=config, model=model,
                           finalize=with_image_source(finalize))  # records where the image lives, for plots
    table = breps_table(load_run_records(args.out), args.mode)
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
