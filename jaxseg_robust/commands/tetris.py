"""`jaxseg-robust tetris`: TETRIS adversarial click trajectories (and the RITM baseline) on benchmark datasets.

Protocols (``--mode``; docs/protocols/tetris.md §1, §3, defaults = the TETRIS code, §7.1):
  minmax    (default) the MIN and the MAX attack on one embedding per image,
            IoU/BIoU-AuC@10 Min / Max / Δ per dataset;
  min, max  one attack;
  baseline  the RITM baseline clicker only (``--n-clicks 20`` for NoC@80/85/90).
With an attack, the baseline clicker also runs on the same embedding for
``--baseline-clicks`` clicks (default 20, 0 = off): the table's baseline
IoU/BIoU-AuC and RITM's NoC@80/85/90 and >=20@85/90 come from it
(``--target-iou T`` adds NoC@T and >=20@T; nothing stops early).

Records (``RUN_DIR/records.jsonl``, one JSON line per instance): per
trajectory (``min``, ``max``, ``baseline``) the per-click outputs of
`jaxseg_robust.attacks.clicks.trajectory_outputs` (``clicks_xy`` (x, y) in
original-image pixels, signs, IoU, BIoU, iterate-0 scores, location losses,
accepted steps, the per-instance ``auc_iou@K`` over the trajectory's K clicks;
``--record-iterates`` adds the per-iterate log) and ``source`` (the
image file and evaluated size, for the report's plots). Beside them
(`jaxseg_robust.reports.artifacts`): each trajectory's final predicted mask
(``RUN_DIR/masks/``) and the seconds of the jitted batch call per instance
(``RUN_DIR/timings.jsonl``: device and wall seconds; compile time excluded: each
bucket's program is compiled before its first timed call, announced on stderr
and timed in ``RUN_DIR/compile.jsonl``). The per-dataset table
(`jaxseg_robust.reports.tetris`, with device seconds per instance and per
click, then every protocol's seconds table: `commands.running.finish`) is
printed and written to ``RUN_DIR/summary.md`` and ``summary.csv``,
the per-instance, per-click IoU/BIoU to ``RUN_DIR/ious.csv`` (RITM's
``--save-ious``); ``jaxseg-robust report RUN_DIR`` adds plots.
"""

from __future__ import annotations

from jaxseg_robust.commands.flags import (
    DEVICE_EPILOG,
    add_attack_step_flags,
    add_flag,
    add_mode_flag,
    add_protocol_parser,
    finite_float,
    non_negative_int,
    positive_int,
)
from jaxseg_robust.commands.run_specs import FlagNames, run_spec_of
from jaxseg_robust.commands.running import run_spec
from jaxseg_robust.runs.tetris import DEFAULT_BASELINE_CLICKS, MODES, TetrisSpec
from jaxseg_robust.runs.spec import RunSpec

COMMAND = TetrisSpec.command
FLAG_NAMES = FlagNames(n_opt_steps="--n_opt_steps", lr_mult="--lr_mult")

EPILOG = """\
examples:
  jaxseg-robust tetris --model sam_vit_b --datasets GrabCut,Berkeley,DAVIS,COCO_MVal,TETRIS \\
      --data-root ~/datasets --out runs/tetris_sam_vit_b
      MIN and MAX attacks (10 clicks, 11 evaluated iterates per click, lr_mult 1) and the
      baseline clicker (20 clicks): IoU/BIoU-AuC@10 Min/Max/Δ, NoC@80/85/90, seconds per click
  jaxseg-robust tetris --model sam_vit_b --datasets GrabCut --mode baseline --n-clicks 20 --out runs/noc
  jaxseg-robust tetris --model sam_tiny --folder my/images my/masks --n_clicks 3 --n_opt_steps 3 \\
      --limit 5 --out runs/smoke      (random-weight test model)

Paper variants (§7.2): --n_opt_steps 10, --fixed-first-click, --acceptance paper.
--target-iou T adds NoC@T / >=K@T to the table (NoC@80/85/90 are always there); every
trajectory runs all its clicks (no early stop: TETRIS runs RITM with target 1.01).
Rerunning the same command resumes: finished instances are skipped, the table
is printed again. Beside the records: RUN_DIR/ious.csv (IoU and BIoU per instance and
click), RUN_DIR/masks/ (final predicted masks), RUN_DIR/timings.jsonl (seconds per
instance, compile excluded). `jaxseg-robust report RUN_DIR` writes the plots.
exit codes: 0 every instance ok, 1 some instances failed (listed), 2 bad
arguments / nothing could be run.
""" + DEVICE_EPILOG + "\n"


def register(subparsers) -> None:
    """Adds the ``tetris`` sub-command."""
    from jaxseg_robust.attacks import clicks  # noqa: PLC0415

    _, group = add_protocol_parser(
        subparsers, COMMAND,
        summary="TETRIS adversarial clicks (MIN/MAX) and the RITM baseline clicker for promptable models",
        description="TETRIS click robustness: adversarial MIN and MAX click trajectories and the RITM "
                    "baseline clicker of a promptable model (SAM, MobileSAM, SAM 2, SAM-HQ, RITM, SimpleClick, "
                    "CFR-ICL) on RITM-style datasets or any image/mask folder.",
        epilog=EPILOG, default_batch_size=TetrisSpec.default_batch_size, group_title="TETRIS protocol", run=run)
    add_mode_flag(group, MODES)
    add_flag(group, "--n-clicks", type=positive_int, default=clicks.DEFAULT_N_CLICKS,
             help="clicks per trajectory (default %(default)s: AuC@10; use 20 with --mode baseline for NoC)")
    add_attack_step_flags(group, n_opt_steps=clicks.DEFAULT_N_OPT_STEPS, first_iterate="per click: the baseline click",
                          lr_mult=clicks.DEFAULT_LR_MULT, lr_scale="5 * sqrt(H^2 + W^2) / (400 sqrt 2)")
    group.add_argument("--thresh", "--thr", dest="thresh", type=finite_float, default=None,
                       help="probability threshold of the masks and the clicker (default: the model family's, "
                            "0.5 for SAM; RITM models use 0.49)")
    add_flag(group, "--baseline-clicks", type=non_negative_int, default=None, metavar="N",
             help=f"attack modes: also run the baseline clicker for N clicks on the same embedding "
                  f"(default {DEFAULT_BASELINE_CLICKS}; 0 = off)")
    group.add_argument("--tolerance", type=finite_float, default=clicks.DEFAULT_TOLERANCE,
                       help="accept an iterate only if Lloc <= tolerance x the accepted Lloc (default %(default)s)")
    add_flag(group, "--dice-weight", type=finite_float, default=clicks.DEFAULT_DICE_WEIGHT,
             help="weight of the signed Dice term (default %(default)s)")
    group.add_argument("--radius", type=finite_float, default=None,
                       help="click disk radius of the location loss, resized-frame pixels (default 5)")
    group.add_argument("--coverage", choices=("area", "ramp"), default="area",
                       help="disk renderer: exact area (default) or the spec's anti-aliased ramp")
    add_flag(group, "--mask-input", choices=("code", "always"), default="code",
             help="feed the previous low-res mask: 'code' (the reference's reset quirk, default) or 'always'")
    group.add_argument("--acceptance", choices=("code", "paper"), default="code",
                       help="iterate acceptance rule: the code's lexicographic (IoU, BIoU) (default) or the paper's")
    add_flag(group, "--fixed-first-click", action="store_true",
             help="the paper's reading: click 1 is the baseline click, not optimised (default: the code's, "
                  "click 1 optimised too)")
    add_flag(group, "--isegm", choices=("authors", "off"), default="authors",
             help="click-map models (RITM, SimpleClick, CFR-ICL): 'authors' attacks through the TETRIS authors' "
                  "predictor (zoom-in crop, flip averaging, CFR-ICL's cascade; docs/protocols/tetris.md "
                  "'Families'), 'off' the network once on the whole image (default %(default)s; recorded in "
                  "the manifest)")
    add_flag(group, "--record-iterates", action="store_true",
             help="store the per-iterate log (points, losses, IoUs of every step) in the records (default: "
                  "only each click's accepted iterate)")
    add_flag(group, "--target-iou", type=finite_float, default=None, metavar="T",
             help="RITM's target IoU: adds NoC@T and >=K@T to the table besides NoC@80/85/90 (the baseline's "
                  "NoC). It stops nothing early: as in TETRIS (RITM run with target 1.01), every trajectory "
                  "runs all its clicks, so the records do not depend on it. Recorded in the manifest for "
                  "`jaxseg-robust report` (resume with the same value). Default: none, NoC@80/85/90 only")


# ---- the run spec ----------------------------------------------------------------------------

def spec_of(args) -> RunSpec:
    """The `RunSpec` of the parsed flags (the protocol's: `jaxseg_robust.runs.TetrisSpec`)."""
    protocol = TetrisSpec(mode=args.mode, n_clicks=args.n_clicks, n_opt_steps=args.n_opt_steps, lr_mult=args.lr_mult,
                          thresh=args.thresh, baseline_clicks=args.baseline_clicks, tolerance=args.tolerance,
                          dice_weight=args.dice_weight, radius=args.radius, coverage=args.coverage,
                          mask_input=args.mask_input, acceptance=args.acceptance,
                          fixed_first_click=args.fixed_first_click, isegm=args.isegm,
                          record_iterates=args.record_iterates, target_iou=args.target_iou)
    return run_spec_of(args, protocol, frame=args.frame)


def run(args) -> int:
    """Runs the spec of the flags into ``--out`` and prints the table; returns an exit code of
    `jaxseg_robust.exit_codes`."""
    return run_spec(COMMAND, spec_of(args), args.out, FLAG_NAMES)
