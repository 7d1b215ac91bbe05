"""`jaxseg-robust perturb`: the L∞ image-perturbation battery on a dense or prompted model, resumable.

The attacks, models, labels, padding and records are those of docs/protocols/perturbation.md. This
module maps the flags once to a `jaxseg_robust.runs.PerturbSpec` (with the model, data and engine
specs of every command) and runs it with `jaxseg_robust.runs.evaluate`: the attacked model
(`attacks.perturb.target.load_target`: a converted dense directory, or a SAM-family zoo name /
directory with one tight GT box per image), one append-only record per instance
(`reports.perturb_records`), so a killed run resumes where it stopped. At the end it prints the clean
vs robust table and writes the report of `jaxseg_robust.reports.perturb` into ``RUN_DIR/report``;
``--report-only`` rebuilds that report of an existing run directory and runs nothing.
"""

from __future__ import annotations

import argparse
import pathlib

from jaxseg_robust.attacks.perturb.battery_program import LABEL_MODES
from jaxseg_robust.commands.flags import (DEVICE_EPILOG, add_dataset_arguments, add_flag, add_model_arguments,
                                          add_run_arguments, non_negative_int, positive_float, positive_int)
from jaxseg_robust.commands.run_specs import FlagNames, run_spec_of
from jaxseg_robust.commands.running import print_outcome, report_error, startup_line
from jaxseg_robust.exit_codes import EXIT_FAILURE, EXIT_OK
from jaxseg_robust.runs.perturb import (DEFAULT_ATTACKS, MSL_TRACKS, SEA_SCHEDULES, SEMANTIC_DATASETS, VOID_POLICIES,
                                        PerturbSpec, epsilon_of)
from jaxseg_robust.runs.spec import RunError, RunSpec

SELECTION_CHOICES = ("auto", "with-background", "without-background")
SELECTION_VALUES = {"auto": None, "with-background": True, "without-background": False}
COMMAND = PerturbSpec.command
FLAG_NAMES = FlagNames(epsilon="--eps", epsilon_text="--eps", multimask_output="--single-mask",
                       report="--no-report")

EPILOG = """\
examples:
  jaxseg-robust perturb --model ~/models/u2netp --datasets GrabCut,Berkeley \\
      --data-root ~/datasets --attacks padam-ce,padam-cos,sea,dag,pdpgd --eps 8/255 --out runs/u2netp
  jaxseg-robust perturb --model mobile_sam --datasets DAVIS --data-root ~/datasets \\
      --attacks padam-cos,sea --out runs/mobile_sam_box      (tight GT box as the fixed prompt)
  jaxseg-robust perturb --model ~/models/deeplabv3 --labels prediction --datasets my_photos/ \\
      --attacks dag,alma-prox,pdpgd --out runs/deeplab
  jaxseg-robust perturb --out runs/u2netp --report-only      (rebuild tables and plots)

attacks: padam-ce, padam-cos (or padam), sea (= sea-mce, sea-bce, sea-jsd, sea-msl), dag
(= dag-0.001, dag-0.003), alma-prox, pdpgd, or all. The clean image is always a candidate.
--datasets: registered names (GrabCut, Berkeley, DAVIS, COCO_MVal, TETRIS) found under
--data-root / $JAXSEG_ROBUST_DATA, or folders with images/ + masks/ (mask rule --mask-rule).
Rerunning the same command resumes; a changed config is refused unless --allow-manifest-mismatch.
exit codes: 0 every instance ok, 1 some instances failed (listed), 2 bad arguments / nothing ran.
""" + DEVICE_EPILOG + "\n"


def register(subparsers) -> None:
    """Adds the ``perturb`` sub-command (the model, data and run flag groups of every command, plus the battery's)."""
    parser = subparsers.add_parser(
        "perturb", help="L∞ image-perturbation attack battery (ECCV'24) on a dense or prompted model",
        description="Attack a segmentation model with the L∞ image-perturbation battery of Halmosi et al. "
        "(ECCV'24): PAdam, SEA (APGD), DAG, ALMA prox, PDPGD and their per-image worst case; resumable.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_arguments(parser, required=False,
                        what="; or a converted dense model directory (u2netp, deeplabv3, semseg, upernet)")
    add_dataset_arguments(parser)
    semantic = parser.add_argument_group("semantic-segmentation datasets (the paper's protocol)")
    semantic.add_argument("--dataset", choices=SEMANTIC_DATASETS, default=None,
                          help="PASCAL VOC 2012 or Cityscapes under --data-root (instead of --datasets; default: "
                               "none, the --datasets / --folder masks)")
    semantic.add_argument("--split", default="val", help="dataset split (default %(default)s)")
    semantic.add_argument("--resize", default=None, metavar="RULE",
                          help="shorter:N, longer:N, fixed:HxW or none (default: the paper's, VOC shorter:512, "
                               "Cityscapes fixed:512x1024)")
    add_run_arguments(parser, default_batch_size=PerturbSpec.default_batch_size, default_frame=None)  # images are attacked at their own size
    add_flag(semantic, "--pad-to-multiple", type=non_negative_int, default=0, metavar="N",
             help="opt-in: pad image and labels to H, W rounded up to a multiple of N (one compiled program set "
                  "per padded size; padding is void and never perturbed, but the model sees it as context, so "
                  "numbers can differ from the paper's; docs §10.6). Default 0: every image at its own size")
    group = parser.add_argument_group("perturbation battery")
    group.add_argument("--attacks", default=DEFAULT_ATTACKS, help="comma list (default %(default)s; or 'all')")
    group.add_argument("--eps", default="8/255", help="L∞ radius in image units, e.g. 8/255 or 0.03 (default %(default)s)")
    group.add_argument("--labels", choices=LABEL_MODES, default="gt",
                       help="score against the GT masks (binary models) or the model's clean prediction "
                            "(default %(default)s)")
    add_flag(group, "--single-mask", action="store_true",
             help="SAM-family: single-mask output instead of the best of 3 by predicted IoU (default: the best "
                  "of 3)")
    add_flag(group, "--void-policy", choices=VOID_POLICIES, default=None,
             help="max-damage attacks on void pixels (default: as_background for --dataset voc, else ignore)")
    add_flag(group, "--sea-schedule", choices=SEA_SCHEDULES, default="progressive",
             help="SEA's loss schedule: progressive (the paper's three phases) or single (default %(default)s)")
    add_flag(group, "--msl-track", choices=MSL_TRACKS, default=None,
             help="SEA-MSL tracked loss (default: follow --sea-schedule; docs §8.2 #2)")
    add_flag(group, "--alma-lr-init", type=positive_float, default=1e-4,
             help="ALMA prox initial step (default %(default)s, the released code; Rony et al.: 1e-3)")
    add_flag(group, "--include-clean", action=argparse.BooleanOptionalAction, default=True,
             help="the clean image as the first candidate of the worst case (default on)")
    add_flag(group, "--select-with-background", choices=SELECTION_CHOICES, default="auto",
             help="worst-case selection score: each metric variant's own (auto), or always the with- / "
                  "without-background score (default %(default)s)")
    add_flag(group, "--reference-quirks", action=argparse.BooleanOptionalAction, default=True,
             help="reproduce the reference code's SEA start-accuracy and ALMA derivative quirks (default on)")
    for flag, default in (("--padam-steps", 200), ("--sea-iterations", 300), ("--dag-iterations", 200),
                          ("--alma-steps", 500), ("--pdpgd-steps", 500)):
        add_flag(group, flag, type=positive_int, default=default, help="(default %(default)s)")
    add_flag(group, "--accelerator-chunk", type=positive_int, default=PerturbSpec.accelerator_chunk, metavar="N",
             help="on a GPU / TPU, each attack pass holds at most N images of the batch (memory only: the results "
                  "do not depend on it; the CPU attacks the whole batch at once; default %(default)s)")
    group.add_argument("--seed", type=int, default=0, help="base PRNG seed of the random starts (default %(default)s)")
    add_flag(group, "--examples", type=non_negative_int, default=4,
             help="instances whose images are saved for the report (default %(default)s)")
    add_flag(group, "--no-report", action="store_true",
             help="do not write RUN_DIR/report (default: written after the run)")
    add_flag(group, "--report-only", action="store_true",
             help="only rebuild the report of --out (default: run the battery, then report)")
    parser.set_defaults(func=run)


# ---------------------------------------------------------------------------- arguments

def parse_epsilon(text: str) -> float:
    """``"8/255"`` or ``"0.031"`` -> float in (0, 1] (`runs.perturb.epsilon_of`); ValueError naming --eps
    otherwise."""
    try:
        return epsilon_of(text)
    except RunError as error:
        raise ValueError(error.render(FLAG_NAMES)) from None


def parse_attacks(text: str) -> tuple[str, ...]:
    """``--attacks``: comma list of attack names/groups -> battery candidate names (`ensemble.attack_names`)."""
    from jaxseg_robust.attacks.perturb.ensemble import attack_names  # noqa: PLC0415

    try:
        return attack_names(text)
    except ValueError as error:
        raise ValueError(f"--attacks: {error}") from None


# ---------------------------------------------------------------------------- the run spec

def spec_of(args) -> RunSpec:
    """The `RunSpec` of the parsed flags (the protocol's: `jaxseg_robust.runs.PerturbSpec`).

    Raises:
      ValueError: a bad ``--eps`` or ``--attacks``, naming the flag.
    """
    protocol = PerturbSpec(
        attacks=parse_attacks(args.attacks), epsilon=parse_epsilon(args.eps), epsilon_text=args.eps,
        labels=args.labels, multimask_output=not args.single_mask, void_policy=args.void_policy,
        sea_schedule=args.sea_schedule, msl_track=args.msl_track, alma_lr_init=args.alma_lr_init,
        include_clean=args.include_clean, select_with_background=SELECTION_VALUES[args.select_with_background],
        reference_quirks=args.reference_quirks, padam_steps=args.padam_steps, sea_iterations=args.sea_iterations,
        dag_iterations=args.dag_iterations, alma_steps=args.alma_steps, pdpgd_steps=args.pdpgd_steps,
        accelerator_chunk=args.accelerator_chunk, seed=args.seed, examples=args.examples, report=not args.no_report, dataset=args.dataset, split=args.split,
        resize=args.resize, pad_to_multiple=args.pad_to_multiple)
    return run_spec_of(args, protocol, frame=None)  # images are attacked at their own size


# ---------------------------------------------------------------------------- the command

def report_only(run_dir: pathlib.Path) -> int:
    """``--report-only``: rebuilds the summary and the report of an existing run directory and prints them."""
    from jaxseg_robust.reports.perturb import summarize_run  # noqa: PLC0415

    try:
        print("\n".join(summarize_run(run_dir, with_report=True)))
    except (FileNotFoundError, ValueError) as error:
        return report_error(COMMAND, str(error))
    return EXIT_OK


def run(args) -> int:
    """Runs the spec of the flags into ``--out`` (or only the report, ``--report-only``) and prints the
    table; returns an exit code of `jaxseg_robust.exit_codes`."""
    from jaxseg_robust.runs import evaluate  # noqa: PLC0415

    if args.report_only:
        return report_only(pathlib.Path(args.out))
    if not args.model or not (args.datasets or args.folder or args.dataset):
        return report_error(COMMAND, "give --model and --dataset or --datasets (or --report-only)")
    try:
        result = evaluate(spec_of(args), args.out, say=startup_line, field_names=FLAG_NAMES)
    except RunError as error:
        return report_error(COMMAND, error.render(FLAG_NAMES))
    except ValueError as error:  # --eps, --attacks
        return report_error(COMMAND, str(error))
    print_outcome(result.summary, result.tables.markdown, result.files, result.resized)
    if result.exit_code == EXIT_FAILURE:
        report_error(COMMAND, "no instance could be processed")
    return result.exit_code
