"""`jaxseg-robust perturb`: the L∞ image-perturbation battery on a dense or prompted model, resumable.

The attacks, models, labels, padding and records are those of docs/protocols/perturbation.md. This
module maps the flags to the battery's settings (`attacks.perturb.ensemble.BatteryConfig`), loads the
model (`attacks.perturb.target.load_target`: a converted dense directory, or a SAM-family zoo name /
directory with one tight GT box per image) and the instances, and runs the battery as a protocol of
the one batch program (`attacks.perturb.battery_program`) through `jaxseg_robust.runner.engine.run`:
one append-only record per instance (`reports.perturb_records`), so a killed run resumes where it
stopped. At the end it prints the clean vs robust table and writes the report of
`jaxseg_robust.reports.perturb` into ``RUN_DIR/report``.
"""

from __future__ import annotations

import argparse
import fractions
import os
import pathlib

from jaxseg_robust.exit_codes import EXIT_OK
from jaxseg_robust.commands.flags import (DEVICE_EPILOG, CommandError, add_dataset_arguments, add_flag,
                                          add_model_arguments, add_run_arguments, non_negative_int, positive_float,
                                          positive_int)
from jaxseg_robust.commands.loading import load_instances
from jaxseg_robust.commands.running import (report_error, resized_line, run_protocol, start_processes,
                                            timed_finalize_of)
from jaxseg_robust.attacks.perturb.battery_program import LABEL_MODES
from jaxseg_robust.attacks.perturb.target import Target, load_target
from jaxseg_robust.runner.engine import recorded_counts

DEFAULT_ATTACKS = "padam-ce,padam-cos,sea,dag,alma-prox,pdpgd"
SEMANTIC_DATASETS = ("voc", "cityscapes")
SELECTION_CHOICES = ("auto", "with-background", "without-background")
SELECTION_VALUES = {"auto": None, "with-background": True, "without-background": False}
COMMAND = "perturb"

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
    add_run_arguments(parser, default_batch_size=1, default_frame=None)  # images are attacked at their own size
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
    add_flag(group, "--void-policy", choices=("ignore", "as_background"), default=None,
             help="max-damage attacks on void pixels (default: as_background for --dataset voc, else ignore)")
    add_flag(group, "--sea-schedule", choices=("progressive", "single"), default="progressive",
             help="SEA's loss schedule: progressive (the paper's three phases) or single (default %(default)s)")
    add_flag(group, "--msl-track", choices=("masked", "unmasked"), default=None,
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
    """``"8/255"`` or ``"0.031"`` -> float in (0, 1]; ValueError naming --eps otherwise."""
    try:
        value = float(fractions.Fraction(str(text).strip()))
    except (ValueError, ZeroDivisionError):
        raise ValueError(f"--eps must be a number or a fraction like 8/255, got {text!r}") from None
    if not 0 < value <= 1:
        raise ValueError(f"--eps must be in (0, 1] (image units), got {text!r} = {value}")
    return value


def parse_attacks(text: str) -> tuple[str, ...]:
    """``--attacks``: comma list of attack names/groups -> battery candidate names (`ensemble.attack_names`)."""
    from jaxseg_robust.attacks.perturb.ensemble import attack_names  # noqa: PLC0415

    try:
        return attack_names(text)
    except ValueError as error:
        raise ValueError(f"--attacks: {error}") from None


def check_schedule(args) -> None:
    """The progressive SEA schedule needs three stages (ValueError naming --sea-iterations)."""
    if args.sea_schedule == "progressive" and int(0.3 * args.sea_iterations) < 1:
        raise ValueError(f"--sea-iterations must be >= 4 with the progressive schedule (three stages of "
                         f"⌊0.3N⌋, ⌊0.3N⌋ and the rest), got {args.sea_iterations}")


# ---------------------------------------------------------------------------- the command

def _report(out: pathlib.Path, write: bool) -> None:
    from jaxseg_robust.reports.perturb import summarize_run  # noqa: PLC0415

    print("\n".join(summarize_run(out, with_report=write)))


def run(args) -> int:
    """Runs the command; returns an exit code of `jaxseg_robust.exit_codes`."""
    out = pathlib.Path(args.out)
    if args.report_only:
        try:
            _report(out, write=True)
        except (FileNotFoundError, ValueError) as error:
            return report_error(COMMAND, str(error))
        return EXIT_OK
    try:
        start_processes(args)
        target, instances, battery = prepare(args)
        summary, compiled = run_battery_into(args, target, instances, battery)
    except (CommandError, ValueError, OSError) as error:  # StoreError and DatasetError are ValueErrors
        return report_error(COMMAND, str(error) if isinstance(error, (CommandError, ValueError))
                            else f"{type(error).__name__}: {error}")
    print(summary.format())
    from jaxseg_robust.attacks.perturb.programs import format_compile_summary  # noqa: PLC0415

    print(f"perturb: {format_compile_summary(compiled)}")
    _report(out, write=not args.no_report)
    resized = resized_line(out)
    if resized is not None:
        print(resized)
    if recorded_counts(out)["ok"] == 0:
        return report_error(COMMAND, "no instance could be processed")
    return summary.exit_code


def prepare(args):
    """Checks the flags, loads the model and lists the instances: (`Target`, instances, `BatteryConfig`).

    Raises:
      ValueError / CommandError: naming the flag (nothing is computed before).
    """
    from jaxseg_robust.attacks.perturb.ensemble import BatteryConfig  # noqa: PLC0415

    if args.dataset and (args.datasets or args.folder):
        raise CommandError("give either --dataset (voc, cityscapes) or --datasets / --folder, not both")
    if not args.model or not (args.datasets or args.folder or args.dataset):
        raise CommandError("give --model and --dataset or --datasets (or --report-only)")
    if args.resize is not None and not args.dataset:
        raise CommandError("--resize applies to --dataset voc|cityscapes (use --max-side with --datasets)")
    check_schedule(args)
    epsilon = parse_epsilon(args.eps)
    attacks = parse_attacks(args.attacks)
    target = load_target(args.model, random_seed=args.random_weights, multimask_output=not args.single_mask,
                         compute_dtype=args.compute_dtype)
    num_classes = int(target.model.num_classes)
    if args.dataset:
        from jaxseg_robust.data.semantic import CLASS_COUNTS  # noqa: PLC0415

        expected = CLASS_COUNTS[args.dataset]
        if num_classes != expected:
            raise ValueError(f"--dataset {args.dataset} has {expected} classes but {args.model} predicts "
                             f"{num_classes}")
    elif args.labels == "gt" and num_classes != 2:
        raise ValueError(f"--labels gt scores binary masks but {args.model} has {num_classes} classes; "
                         f"use --labels prediction")
    if "alma_prox" in attacks and num_classes < 3:
        raise ValueError(f"alma-prox needs a model with >= 3 classes (its DLR constraint uses the top-3 "
                         f"logits); {args.model} has {num_classes}: drop it from --attacks")
    instances = load_semantic_instances(args, num_classes) if args.dataset else load_instances(args)
    background = target.model.background_class
    battery = BatteryConfig(num_classes=num_classes, epsilon=epsilon, void_policy=void_policy_of(args),
                            background_class=0 if background is None else int(background),
                            sea_schedule=args.sea_schedule, msl_track=args.msl_track,
                            alma_lr_init=args.alma_lr_init, reference_quirks=args.reference_quirks,
                            include_clean=args.include_clean,
                            select_with_background=SELECTION_VALUES[args.select_with_background],
                            attacks=attacks, padam_steps=args.padam_steps, sea_iterations=args.sea_iterations,
                            dag_iterations=args.dag_iterations, alma_steps=args.alma_steps,
                            pdpgd_steps=args.pdpgd_steps)
    return target, instances, battery


def void_policy_of(args) -> str:
    """``--void-policy``, or its default: ``as_background`` for PASCAL VOC (§1.2), else ``ignore``."""
    if args.void_policy is not None:
        return args.void_policy
    return "as_background" if args.dataset == "voc" else "ignore"


def resize_rule_of(args):
    """The `ResizeRule` of ``--resize`` or the paper's protocol of ``--dataset`` (`data.semantic.resize_rule`)."""
    from jaxseg_robust.data.semantic import resize_rule  # noqa: PLC0415

    return resize_rule(args.dataset, args.resize)


def load_semantic_instances(args, num_classes: int) -> list:
    """Lazy multi-class instances of ``--dataset`` under ``--data-root`` (``--split``, ``--resize``, ``--limit``).

    Raises:
      CommandError: no data root, or a listing error (it names the missing folder or file).
    """
    from jaxseg_robust.data import semantic  # noqa: PLC0415

    root = args.data_root or os.environ.get("JAXSEG_ROBUST_DATA")
    if not root:
        raise CommandError("--dataset needs --data-root DIR (or $JAXSEG_ROBUST_DATA)")
    try:
        refs = semantic.list_semantic_dataset(args.dataset, root, split=args.split, resize=resize_rule_of(args))
    except ValueError as error:  # SemanticDatasetError, a bad --resize
        raise CommandError(str(error)) from None
    return semantic.instance_refs(refs if args.limit is None else refs[:args.limit], num_classes)


def run_battery_into(args, target: Target, instances, battery):
    """Runs the battery over the instances into ``args.out`` (`jaxseg_robust.runner.engine.run`).

    Returns:
      (the engine's `RunSummary`, the battery's compile summary: programs,
      traces, compiles, compile_seconds, run_seconds; also appended to
      ``RUN_DIR/compile.jsonl``).
    """
    from jaxseg_robust.attacks.perturb.battery_program import make_battery_batch_fn, manifest_config  # noqa: PLC0415
    from jaxseg_robust.attacks.perturb.ensemble import battery_compile_summary, build_battery  # noqa: PLC0415
    from jaxseg_robust.reports.artifacts import append_compile_summary  # noqa: PLC0415
    from jaxseg_robust.reports.perturb_records import ExampleSaver, make_finalize  # noqa: PLC0415

    candidates = build_battery(target.model.apply, battery)
    names = tuple(c.name for c in candidates)
    config = manifest_config(target, names, battery, epsilon_text=args.eps, labels_mode=args.labels,
                             seed=args.seed, max_side=args.max_side)
    if args.dataset:
        from jaxseg_robust.data.semantic import rule_text  # noqa: PLC0415

        config.update(dataset=args.dataset, split=args.split, resize=rule_text(resize_rule_of(args)))
        del config["max_side"]
    padded = args.pad_to_multiple > 0
    if padded:
        config["pad_to_multiple"] = args.pad_to_multiple
        args = argparse.Namespace(**{**vars(args), "frame": f"round:{args.pad_to_multiple}"})
    saver = ExampleSaver(pathlib.Path(args.out) / "examples", args.examples, names)
    attacked = ", ".join(name for name in names if name != "clean")
    print(f"perturb: {len(instances)} instances, attacks {attacked}, ε = {args.eps}, "
          f"model {target.description['model']} ({target.description['kind']})", flush=True)
    batch_fn = make_battery_batch_fn(target, candidates, battery, args.labels, args.seed, padded)
    summary = run_protocol(args, instances=instances, config=config, model=target, check=None, batch_fn=batch_fn,
                           finalize=timed_finalize_of(args, batch_fn, make_finalize(saver, battery.background_class)))
    compiled = battery_compile_summary(candidates, target.model.apply, battery.num_classes)
    append_compile_summary(args.out, compiled)
    return summary, compiled
