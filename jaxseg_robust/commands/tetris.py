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

import dataclasses
import pathlib

from jaxseg_robust.commands.flags import (
    DEVICE_EPILOG,
    CommandError,
    add_attack_step_flags,
    add_flag,
    add_mode_flag,
    add_protocol_parser,
    finite_float,
    non_negative_int,
    positive_int,
)
from jaxseg_robust.commands.loading import (
    LoadedModel,
    load_instances,
    load_model_of,
    model_config,
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

COMMAND = "tetris"
MODES = ("minmax", "min", "max", "baseline")
DEFAULT_BATCH_SIZE = 4
DEFAULT_BASELINE_CLICKS = 20  # RITM's NoC@80/85/90 budget

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
        epilog=EPILOG, default_batch_size=DEFAULT_BATCH_SIZE, group_title="TETRIS protocol", run=run)
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


# ---- configuration ---------------------------------------------------------------------------

_FIELD_FLAGS = {"n_clicks": "--n-clicks", "n_opt_steps": "--n_opt_steps", "lr_mult": "--lr_mult", "thr": "--thresh",
                "radius": "--radius", "tolerance": "--tolerance", "dice_weight": "--dice-weight"}


def tetris_configs(args):
    """(attack config or None, baseline config or None) as `jaxseg_robust.attacks.clicks.TetrisConfig`s.

    Raises:
      CommandError: a bad value or combination, naming the flag.
    """
    from jaxseg_robust.attacks.clicks import DEFAULT_THRESHOLD, TetrisConfig  # noqa: PLC0415
    from jaxseg_robust.ops.render import DEFAULT_CLICK_RADIUS  # noqa: PLC0415

    if args.mode == "baseline" and args.baseline_clicks is not None:
        raise CommandError("--baseline-clicks applies to the attack modes; with --mode baseline use --n-clicks")
    if args.n_clicks < 2:
        raise CommandError(f"--n-clicks must be >= 2 (the AuC needs two clicks); got {args.n_clicks}")
    if args.thresh is not None and not 0.0 <= args.thresh < 1.0:
        raise CommandError(f"--thresh must be in [0, 1); got {args.thresh}")
    if args.target_iou is not None and not 0.0 < args.target_iou <= 1.0:
        raise CommandError(f"--target-iou must be in (0, 1]; got {args.target_iou}")
    baseline_clicks = DEFAULT_BASELINE_CLICKS if args.baseline_clicks is None else args.baseline_clicks
    common = {"thr": DEFAULT_THRESHOLD if args.thresh is None else args.thresh, "mask_input": args.mask_input,
              "radius": DEFAULT_CLICK_RADIUS if args.radius is None else args.radius}
    try:
        if args.mode == "baseline":
            return None, TetrisConfig(mode="baseline", n_clicks=args.n_clicks, **common)
        attack = TetrisConfig(mode="min" if args.mode == "minmax" else args.mode, n_clicks=args.n_clicks,
                              n_opt_steps=args.n_opt_steps, lr_mult=args.lr_mult, tolerance=args.tolerance,
                              dice_weight=args.dice_weight, coverage=args.coverage, acceptance=args.acceptance,
                              optimise_first_click=not args.fixed_first_click,
                              record_trajectory=args.record_iterates, **common)
        baseline = TetrisConfig(mode="baseline", n_clicks=baseline_clicks, **common) if baseline_clicks else None
    except ValueError as error:
        text = str(error)
        for field, flag in _FIELD_FLAGS.items():
            text = text.replace(f"{field} ", f"{flag} ").replace(f"{field},", f"{flag},")
        raise CommandError(text) from None
    if baseline is not None and baseline_clicks < 2:
        raise CommandError(f"--baseline-clicks must be 0 or >= 2 (NoC and AuC need clicks); got {baseline_clicks}")
    return attack, baseline


def protocol_config(args, model: LoadedModel, attack, baseline) -> dict:
    """The run configuration recorded in (and compared on resume with) the manifest; ``records_format`` names
    the records' layout (`jaxseg_robust.runner.rundir.check_records_format`)."""
    from jaxseg_robust.attacks.clicks import RECORDS_FORMAT  # noqa: PLC0415
    from jaxseg_robust.runner.rundir import RECORDS_FORMAT_KEY  # noqa: PLC0415

    config = model_config(COMMAND, args, model, mode=args.mode)
    config.update(n_clicks=args.n_clicks, baseline_clicks=0 if baseline is None else baseline.n_clicks)
    config[RECORDS_FORMAT_KEY] = RECORDS_FORMAT
    if args.target_iou is not None:  # a table setting, recorded so that `jaxseg-robust report` shows the same table
        config["target_iou"] = args.target_iou
    if attack is not None:
        config["attack"] = dataclasses.asdict(attack)
    if baseline is not None:
        config["baseline"] = dataclasses.asdict(baseline)
    return config


# ---- the batch function ----------------------------------------------------------------------

def make_batch_function(model: LoadedModel, mode: str, attack, baseline, *, masks: bool = True, announce=None):
    """The engine batch function: the `jaxseg_robust.runner.program.BatchProgram` of a
    `jaxseg_robust.attacks.clicks.ClickProtocol` (``{trajectory: outputs [B, ...]}``), timed.

    Args:
      masks: also output each trajectory's final binary mask (``mask`` [B, Hf, Wf]; `finalize_payload`
        moves it into a side file). An output only: the numbers are the same either way.
      announce: ``text -> None`` told before a bucket's program is compiled (None: silent).
    """
    from jaxseg_robust.attacks.clicks import ClickProtocol  # noqa: PLC0415
    from jaxseg_robust.runner.program import BatchProgram  # noqa: PLC0415

    if masks:
        attack = None if attack is None else dataclasses.replace(attack, return_mask=True)
        baseline = None if baseline is None else dataclasses.replace(baseline, return_mask=True)
    protocol = ClickProtocol(attack=attack, minmax=mode == "minmax", baseline=baseline)
    return BatchProgram(model.segmenter, model.params, protocol, announce=announce, timed=True)


def clicks_per_instance(attack, baseline, mode: str) -> int:
    """Clicks one instance computes over all its trajectories (the divisor of seconds per click)."""
    attacks = 0 if attack is None else (2 if mode == "minmax" else 1) * attack.n_clicks
    return attacks + (0 if baseline is None else baseline.n_clicks)


def finalize_payload(args, batch_fn, clicks: int):
    """The engine ``finalize``: moves masks and timings out of the outputs into side files.

    Each trajectory's ``mask`` (frame-sized) is cropped to the instance's size
    and written as ``RUN_DIR/masks/<dataset>/<id>.<trajectory>.png``; the
    batch timing becomes one line of ``RUN_DIR/timings[.process<k>].jsonl``
    and each compiled bucket one of ``RUN_DIR/compile.jsonl``
    (`jaxseg_robust.reports.artifacts`). The payload is what it was before
    these outputs existed, so records stay comparable across versions and resumes.
    """
    from jaxseg_robust.reports.artifacts import store_masks  # noqa: PLC0415

    def masks(instance, outputs) -> dict:
        return store_masks(args.out, instance, outputs)

    return timed_finalize_of(args, batch_fn, masks, clicks)


def with_attack_predictor(args, model: LoadedModel, instances):
    """(``model`` with the TETRIS authors' predictor for a click-map model, JSON-able options or None):
    the family's "tetris" options by dataset unless ``--isegm off`` (`models.base.with_predictor`);
    SAM-family models unchanged."""
    from jaxseg_robust.commands.isegm_predictor import with_authors_predictor  # noqa: PLC0415

    return with_authors_predictor(args, model, instances, "tetris", command="TETRIS")


def execute(args) -> tuple:
    """Checks, loads, runs into ``args.out``; returns (run summary, table Markdown, table CSV) of the run directory."""
    from jaxseg_robust.reports.report_files import load_run_records  # noqa: PLC0415
    from jaxseg_robust.reports.sources import with_image_source  # noqa: PLC0415
    from jaxseg_robust.reports.artifacts import read_timings  # noqa: PLC0415
    from jaxseg_robust.reports.tetris import (  # noqa: PLC0415
        CLICK_CSV,
        tetris_table,
        to_csv,
        to_markdown,
        write_click_csv,
    )

    attack, baseline = tetris_configs(args)
    instances = load_instances(args)
    startup_line(f"loading {args.model} ...")
    model, isegm = with_attack_predictor(args, load_model_of(args), instances)
    threshold = resolve_threshold(args.thresh, model)  # the family's unless --thresh says otherwise
    attack, baseline = (None if config is None else dataclasses.replace(config, thr=threshold)
                        for config in (attack, baseline))
    batch_fn = make_batch_function(model, args.mode, attack, baseline, announce=startup_line)
    config = protocol_config(args, model, attack, baseline)
    if isegm is not None:
        config["isegm"] = isegm
    finalize = finalize_payload(args, batch_fn, clicks_per_instance(attack, baseline, args.mode))
    summary = run_protocol(args, instances=instances, batch_fn=batch_fn, config=config, model=model,
                           finalize=with_image_source(finalize))
    records = load_run_records(args.out)
    table = tetris_table(records, target_iou=args.target_iou, timings=read_timings(args.out))
    write_click_csv(pathlib.Path(args.out) / CLICK_CSV, records)
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
