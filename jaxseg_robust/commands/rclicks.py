"""`jaxseg-robust rclicks`: the RClicks benchmark (realistic simulated users) on a promptable model.

Per instance, one jitted program runs the Base clicker and the clicking groups
G1..G10 for ``--n-clicks`` rounds each (``jaxseg_robust.clicksim.evaluation``),
with the click model chosen by ``--clickability``: the converted clickability
network (a directory or the zoo name ``rclicks_clickability``) or the ``dt`` /
``ud`` baselines. With ``--clicks-csv`` it also evaluates every real first-round
click (User) and as many sampled first-round clicks (SamplingUsersCount).
Records go to the run directory (append-only, resumable: rerun the same command
to continue); at the end the per-dataset table (NoC20@90, NoF20@90,
IoU-AuC20, NSR, first-round columns; docs/protocols/rclicks.md §6; the headers name
``--n-clicks`` and ``--target-iou``, e.g. NoC5@85) is printed and written to
``RUN_DIR/summary.md`` / ``summary.csv`` like every prompt protocol's
(`commands.running.finish`), with a clicking-groups figure per plotted instance
(``groups_<dataset>_<id>.png``). The records hold IoU and Boundary IoU per round
(``base_iou`` / ``base_biou``, ``group_iou`` / ``group_biou``).

Exit codes: 0 every instance evaluated; 1 some instances failed (listed, and in
the records); 2 bad arguments, nothing could be run, or every instance failed.
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib

import numpy as np

from jaxseg_robust.commands import flags, loading, running
from jaxseg_robust.commands.flags import CommandError
from jaxseg_robust.commands.isegm_predictor import with_authors_predictor

COMMAND = "rclicks"
DEFAULT_BATCH_SIZE = 4
EPILOG = """\
examples:
  jaxseg-robust rclicks --model sam_vit_b --clickability rclicks_clickability \\
      --datasets GrabCut,Berkeley,DAVIS --clicks-csv clicks.csv --out runs/sam_b_rclicks
  jaxseg-robust rclicks --model sam_tiny --clickability dt --folder toy/images toy/masks \\
      --n-clicks 5 --out runs/smoke        (random-weight test model, distance-transform users)

--clickability: a directory made by `python -m ports clickability --checkpoint
clickability_model.pth --out DIR`, the zoo name rclicks_clickability (weights in
$JAXSEG_ROBUST_MODELS), or the baselines dt (distance transform) / ud (uniform).
Rerunning the same command resumes; --retry-failed reruns failed instances.
exit codes: 0 all instances evaluated, 1 some failed, 2 bad arguments / nothing evaluated.
""" + flags.DEVICE_EPILOG + "\n"


def register(subparsers) -> None:
    """Adds the ``rclicks`` sub-command."""
    parser = subparsers.add_parser(
        COMMAND, help="RClicks benchmark: simulated users in clicking groups G1..G10 (NoC/NoF/AuC, ΔSB/ΔGR/ΔHH)",
        description="Evaluate a promptable model with realistic simulated users (RClicks): the baseline "
                    "clicker and ten clicking groups sampled from a clickability map, 20 rounds each; "
                    "optionally real first-round user clicks from the RClicks clicks CSV.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    flags.add_common_arguments(parser, default_batch_size=DEFAULT_BATCH_SIZE)
    group = parser.add_argument_group("rclicks")
    group.add_argument("--clickability", required=True, metavar="DIR|dt|ud|NAME",
                       help="click model: converted clickability directory, zoo name rclicks_clickability, "
                            "or the baselines dt / ud")
    flags.add_flag(group, "--clickability-random-weights", type=flags.non_negative_int, default=None,
                    metavar="SEED", help="seeded random clickability weights for a zoo name (smoke tests; default: "
                                         "the converted weights)")
    flags.add_flag(group, "--clicks-csv", default=None, metavar="CSV",
                    help="RClicks clicks.csv: also evaluate real first-round clicks (User) and as many "
                         "sampled ones (SamplingUsersCount) (default: none, simulated clicks only)")
    flags.add_flag(group, "--n-clicks", type=flags.positive_int, default=20,
                    help="rounds per trajectory (default %(default)s)")
    flags.add_flag(group, "--groups", type=flags.non_negative_int, default=10,
                    help="clicking groups (equal-mass bands; even, as ΔHH pairs group j with j+G/2; "
                         "0 = no groups; default %(default)s)")
    flags.add_flag(group, "--no-base", action="store_true",
                   help="skip the Base (baseline clicker) trajectory (default: run it)")
    group.add_argument("--thr", "--thresh", dest="thr", type=flags.finite_float, default=None,
                       help="probability threshold of the model (default: the model family's; 0.5 SAM-type, "
                            "0.49 RITM-type)")
    flags.add_flag(group, "--target-iou", type=flags.finite_float, default=0.9,
                    help="IoU target of NoC/NoF in the table, in (0, 1] (default %(default)s)")
    flags.add_flag(group, "--mask-feedback", choices=("reference", "always", "never"), default="reference",
                    help="previous low-res mask input: 'reference' (reset at round 2 after a negative click, "
                         "as the RClicks SAM wrapper), 'always' or 'never' (default %(default)s)")
    group.add_argument("--seed", type=int, default=42, help="run seed (default %(default)s)")
    flags.add_flag(group, "--isegm", choices=("authors", "off"), default="authors",
                    help="click-map models (RITM, SimpleClick, CFR-ICL): 'authors' runs the RClicks authors' "
                         "predictor (zoom-in, flip, CFR-ICL's cascade; docs/protocols/rclicks.md §5.5), 'off' "
                         "the network once on the whole image per round (default %(default)s)")
    flags.add_flag(group, "--plot-groups", type=flags.non_negative_int, default=1, metavar="N",
                    help="clicking-groups figures for the first N instances of each dataset (default %(default)s)")
    parser.set_defaults(func=run, tetris_max_side_default=2048)


def _load_click_model(args):
    from jaxseg_robust.clicksim.click_models import load_click_model  # noqa: PLC0415

    try:
        return load_click_model(args.clickability, random_seed=args.clickability_random_weights)
    except (ValueError, FileNotFoundError, OSError) as error:
        raise CommandError(f"--clickability {args.clickability}: {error}") from None
    except (KeyError, TypeError) as error:  # a config.json that does not describe its family
        raise CommandError(f"--clickability {args.clickability}: {type(error).__name__}: {error}") from None


def _user_clicks(args, instances):
    if args.clicks_csv is None:
        return None
    from jaxseg_robust.clicksim.clicks_csv import read_clicks_csv  # noqa: PLC0415
    from jaxseg_robust.clicksim.user_clicks import first_round_clicks  # noqa: PLC0415

    try:
        table = read_clicks_csv(args.clicks_csv)
    except (ValueError, OSError) as error:
        raise CommandError(f"--clicks-csv: {error}") from None
    clicks = first_round_clicks(table, instances)
    if not clicks:
        raise CommandError(f"--clicks-csv {args.clicks_csv}: no first-round clicks match the instances "
                                  "(dataset names GrabCut/Berkeley/DAVIS/COCO/TETRIS, image stems, object codes)")
    return clicks


def _plot_groups(instances, loaded, config, out_dir: pathlib.Path, per_dataset: int) -> list[pathlib.Path]:
    """Fig. 6-style figures of the first-round groups for the first instances of each dataset."""
    from jaxseg_robust.clicksim.click_models import first_round_program  # noqa: PLC0415
    from jaxseg_robust.reports.rclicks import group_index_map, plot_clicking_groups  # noqa: PLC0415
    from jaxseg_robust.reports.report_files import file_stem  # noqa: PLC0415

    paths, seen = [], {}
    for member in instances:
        if seen.get(member.dataset, 0) >= per_dataset or config.num_groups == 0:
            continue
        try:
            instance = member.load()
        except Exception:  # noqa: BLE001 - the run already recorded this instance as failed
            continue
        seen[member.dataset] = seen.get(member.dataset, 0) + 1
        obj = instance.gt == 1
        region = obj & (instance.gt != -1)
        prepared = loaded.model.prepare(instance.image, obj, obj.shape)
        clickability = np.asarray(first_round_program(loaded.model)(loaded.params, prepared, region))
        name = file_stem(instance.dataset, instance.id)
        paths.append(plot_clicking_groups(
            instance.image, obj, group_index_map(clickability, config.num_groups),
            out_dir / f"groups_{name}.png",
            title=f"{instance.dataset}/{instance.id}: first-round clicking groups ({loaded.model.name})"))
    return paths


def check_flags(args) -> None:
    """Refuses flag values that cannot give a table, before anything is loaded.

    Raises:
      CommandError: naming the flag and why (``--n-clicks`` < 2, ``--thr`` outside
        (0, 1), ``--target-iou`` outside (0, 1], an odd ``--groups``, or
        ``--no-base --groups 0`` without ``--clicks-csv``: nothing to evaluate).
    """
    if args.n_clicks < 2:
        raise CommandError(f"--n-clicks must be >= 2 (IoU-AuC needs two rounds); got {args.n_clicks}")
    if args.thr is not None and not 0.0 < args.thr < 1.0:
        raise CommandError(f"--thr must be in (0, 1); got {args.thr}")
    if not 0.0 < args.target_iou <= 1.0:
        raise CommandError(f"--target-iou must be an IoU in (0, 1]; got {args.target_iou}")
    if args.groups % 2:
        raise CommandError(f"--groups must be even (ΔHH pairs group j with group j+G/2; the benchmark "
                                  f"uses 10) or 0 for no groups; got {args.groups}")
    if args.no_base and args.groups == 0 and args.clicks_csv is None:
        raise CommandError("--no-base with --groups 0 leaves nothing to evaluate; drop one of them or "
                                  "add --clicks-csv (real first-round clicks)")


def run(args) -> int:
    """Checks the flags, loads, runs into ``args.out`` and prints the table; returns an exit code of
    `jaxseg_robust.exit_codes`."""
    try:
        check_flags(args)
        running.start_processes(args)
        return _run(args)
    except CommandError as error:
        return running.report_error(COMMAND, str(error))


def _run(args) -> int:
    from jaxseg_robust.clicksim.evaluation import (  # noqa: PLC0415
        RClicksConfig,
        finalize_record,
        make_rclicks_batch_fn,
        user_slot_count,
    )
    from jaxseg_robust.metrics.rclicks_benchmark import benchmark_by_dataset  # noqa: PLC0415
    from jaxseg_robust.reports.rclicks import to_csv, to_markdown  # noqa: PLC0415
    from jaxseg_robust.runner.records import read_run_records  # noqa: PLC0415
    from jaxseg_robust.runner.sharding import data_mesh, replicate  # noqa: PLC0415

    if args.tetris_max_side is None:
        args.tetris_max_side = args.tetris_max_side_default  # RClicks caps TETRIS at 2048 px (§1.3)
    instances = loading.load_instances(args)  # data and clicks first: their errors come before any model load
    user_clicks = _user_clicks(args, instances)
    mesh = data_mesh()
    model, isegm = with_authors_predictor(args, loading.load_model_of(args, mesh=mesh), instances, options_of="rclicks")
    loaded = _load_click_model(args)
    try:
        slots = user_slot_count(len(c) for c in user_clicks.values()) if user_clicks else 0
        config = RClicksConfig(num_rounds=args.n_clicks, num_groups=args.groups, run_base=not args.no_base,
                               threshold=loading.resolve_threshold(args.thr, model),
                               mask_feedback=args.mask_feedback, seed=args.seed, user_slots=slots)
        batch_fn = make_rclicks_batch_fn(
            model.segmenter, model.params, loaded.model,
            None if loaded.params is None else replicate(loaded.params, mesh),
            config=config, user_clicks=user_clicks, announce=running.startup_line).with_timing()
    except ValueError as error:
        raise CommandError(str(error)) from None
    run_config = {"protocol": COMMAND, "model": args.model, "model_source": model.source,
                  "clickability": str(args.clickability), "clickability_source": loaded.source,
                  "clicks_csv": None if args.clicks_csv is None else str(pathlib.Path(args.clicks_csv).resolve()),
                  "settings": dataclasses.asdict(batch_fn.config)}
    if isegm is not None:
        run_config["isegm"] = isegm
    summary = running.run_protocol(args, instances=instances, batch_fn=batch_fn, config=run_config, model=model,
                                  finalize=running.timed_finalize_of(args, batch_fn, finalize_record), mesh=mesh)
    records = [r for r in read_run_records(args.out) if r["dataset"] in {i.dataset for i in instances}]
    benchmarks = benchmark_by_dataset(records, threshold=args.target_iou, num_clicks=args.n_clicks)
    figures = []
    try:
        figures = _plot_groups(instances, loaded, config, pathlib.Path(args.out), args.plot_groups)
    except Exception as error:  # noqa: BLE001 - a figure must not hide the run's results
        print(f"jaxseg-robust {COMMAND}: warning: clicking-groups figure failed: {type(error).__name__}: {error}")
    code = running.finish(COMMAND, args, summary, to_markdown(benchmarks), to_csv(benchmarks))
    for path in figures:
        print(f"wrote {path}")
    return code
