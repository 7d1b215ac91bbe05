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
``RUN_DIR/timings.jsonl`` / ``compile.jsonl``: `jaxseg_robust.runs.evaluate`) is
printed and written to ``RUN_DIR/summary.md`` and ``RUN_DIR/summary.csv``.
The protocol itself is `jaxseg_robust.runs.BrepsSpec`; this module maps the flags onto it.
"""

from __future__ import annotations

from jaxseg_robust.commands.flags import (
    DEVICE_EPILOG,
    add_attack_step_flags,
    add_flag,
    add_mode_flag,
    add_protocol_parser,
    finite_float,
)
from jaxseg_robust.commands.run_specs import FlagNames, run_spec_of
from jaxseg_robust.commands.running import run_spec
from jaxseg_robust.runs.breps import BOX_FRAMES, MODES, BrepsSpec
from jaxseg_robust.runs.spec import RunSpec

COMMAND = BrepsSpec.command
FLAG_NAMES = FlagNames(n_opt_steps="--n_opt_steps", lr_mult="--lr_mult", lambda_mult="--lambda_mult",
                       record_trajectory="--no-trajectory", integer_boxes="--float-boxes")

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
        epilog=EPILOG, default_batch_size=BrepsSpec.default_batch_size, group_title="BREPS protocol", run=run)
    add_mode_flag(group, MODES)
    add_attack_step_flags(group, n_opt_steps=BrepsSpec.n_opt_steps, first_iterate="per attack: the tight box",
                          lr_mult=BrepsSpec.lr_mult, lr_scale="sqrt(H^2 + W^2) / (1024 sqrt 2)")
    add_flag(group, "--lambda-mult", type=finite_float, default=BrepsSpec.lambda_mult,
             help="weight of the Gamma realism term over CIoU (default %(default)s)")
    group.add_argument("--thresh", "--thr", dest="thresh", type=finite_float, default=None,
                       help="probability threshold of the attack's masks (default: the model family's, 0.5 for SAM)")
    add_flag(group, "--clip-and-order", action="store_true",
             help="the paper's variant: order and clip the box to the image after every update "
                  "(default: the code's raw box)")
    add_flag(group, "--no-trajectory", action="store_true",
             help="do not store the per-step boxes, losses and IoUs in the records (default: stored)")
    add_flag(group, "--box-frame", choices=BOX_FRAMES, default=BrepsSpec.box_frame,
             help="tight/jitter/user-box-masks: draw boxes in the image frame or, as the reference "
                  "scripts, in SAM's 1024-resized frame (default %(default)s)")
    add_flag(group, "--float-boxes", action="store_true",
             help="tight/jitter: keep fractional box coordinates (default: truncate to int as the reference)")
    add_flag(group, "--jitter-pow", type=finite_float, default=BrepsSpec.jitter_pow,
             help="jitter: largest shift as a fraction of the box size (default %(default)s)")
    group.add_argument("--seed", type=int, default=BrepsSpec.seed,
                       help="jitter: Python random seed, reset for every image as the reference (default %(default)s)")
    add_flag(group, "--user-boxes", default=None, metavar="CSV",
             help="user mode: CSV image_id,x1,y1,x2,y2[,user] in image pixels (default: none; user mode needs "
                  "it or --user-box-masks)")
    add_flag(group, "--user-box-masks", default=None, metavar="DIR",
             help="user mode: folder of BREPS prompt PNGs <image stem>_1_<user>.png (default: none)")


# ---- the run spec ----------------------------------------------------------------------------

def spec_of(args) -> RunSpec:
    """The `RunSpec` of the parsed flags (the protocol's: `jaxseg_robust.runs.breps.BrepsSpec`)."""
    protocol = BrepsSpec(mode=args.mode, n_opt_steps=args.n_opt_steps, lr_mult=args.lr_mult,
                         lambda_mult=args.lambda_mult, thresh=args.thresh, clip_and_order=args.clip_and_order,
                         record_trajectory=not args.no_trajectory, box_frame=args.box_frame,
                         integer_boxes=not args.float_boxes, jitter_pow=args.jitter_pow, seed=args.seed,
                         user_boxes=args.user_boxes, user_box_masks=args.user_box_masks)
    return run_spec_of(args, protocol, frame=args.frame)


def run(args) -> int:
    """Runs the spec of the flags into ``--out`` and prints the table; returns an exit code of
    `jaxseg_robust.exit_codes`."""
    return run_spec(COMMAND, spec_of(args), args.out, FLAG_NAMES)
