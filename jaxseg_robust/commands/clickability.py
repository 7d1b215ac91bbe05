"""`jaxseg-robust clickability`: RClicks' clickability evaluation (the paper's Table 3) of click models on real clicks.

Each click model (``ud``, ``dt``, ``saliency`` / ``saliency_image``, ``rclicks_clickability``, a
converted directory, any name `jaxseg_robust.clicksim.click_models.load_click_model`
resolves) predicts the click map of every task of ``--clicks-csv`` that matches
an instance: its first round and, with ``--prev-masks``, its fn / fp rounds
(restricted to the images of ``--split-file``); PL1, KS, WD (bootstrapped), NSS and PDE
compare each map with the real clicks (docs/protocols/rclicks.md,
"Clickability evaluation"; the protocol and its settings:
`jaxseg_robust.runs.clickability.ClickabilitySpec`). Records go to the run
directory (append-only, resumable: rerun the same command to continue); at
the end the table (each metric's mean ± std over the tasks per dataset and
model, all tasks and per click type) is printed and written to ``RUN_DIR/summary.md`` / ``summary.csv``,
with the authors' ``table3.csv``, ``<dataset>_per_image.csv`` and
``<dataset>_mean.csv`` and figures of the worst and best instances.

Exit codes: 0 every instance evaluated; 1 some instances failed (listed, and in
the records); 2 bad arguments, nothing could be run, or every instance failed.
"""

from __future__ import annotations

import argparse

from jaxseg_robust.commands import flags
from jaxseg_robust.commands.run_specs import FlagNames, data_spec_of, engine_spec_of
from jaxseg_robust.commands.running import run_spec
from jaxseg_robust.runs.clickability import ClickabilitySpec
from jaxseg_robust.runs.spec import RunSpec

COMMAND = ClickabilitySpec.command
FLAG_NAMES = FlagNames(models="--click-models", random_weights="--click-model-random-weights")
EPILOG = """\
examples:
  jaxseg-robust clickability --clicks-csv clicks.csv --click-models ud,dt,rclicks_clickability \\
      --datasets GrabCut,Berkeley --data-root DATA --out runs/table3 \\
      --prev-masks DATA/SUBSEC_MASKS/all_benchmark_datasets/fn_fp
  jaxseg-robust clickability --clicks-csv clicks.csv --click-models ud,dt,saliency,rclicks_clickability \\
      --datasets TETRIS --data-root DATA --split-file TETRIS_val.txt --out runs/table3_tetris \\
      --prev-masks DATA/SUBSEC_MASKS/tetris_fn_fp/tetris_fn_fp_masks
  jaxseg-robust clickability --clicks-csv toy_clicks.csv --click-models ud,dt,rclicks_clickability \\
      --click-model-random-weights rclicks_clickability=0 --folder toy/images toy/masks --out runs/smoke

--click-models: a comma list of ud (uniform), dt (distance transform), saliency (SM: TranSalNet
on the grey-masked crop) and saliency_image (SI: on the raw crop; both read the weights converted
by `python -m ports transalnet`), the zoo name rclicks_clickability (weights converted by
`python -m ports clickability` into $JAXSEG_ROBUST_MODELS), a converted directory, or any other
click model name.
--prev-masks: the folder of the previous masks <full_stem>.png of the fn / fp tasks (the authors'
SUBSEC_MASKS/tetris_fn_fp/tetris_fn_fp_masks for TETRIS, SUBSEC_MASKS/all_benchmark_datasets/fn_fp
for the others); without it only the first-round tasks are evaluated.
Rerunning the same command resumes; --retry-failed reruns failed instances.
exit codes: 0 all instances evaluated, 1 some failed, 2 bad arguments / nothing evaluated.
""" + flags.DEVICE_EPILOG + "\n"


def model_seed_pair(text: str) -> tuple[str, int]:
    """argparse type of ``--click-model-random-weights``: ``NAME=SEED`` -> (name, seed)."""
    name, sep, seed = text.rpartition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected NAME=SEED, got {text!r}")
    return name, flags.non_negative_int(seed)


def register(subparsers) -> None:
    """Adds the ``clickability`` sub-command (the data and run flag groups, and its own)."""
    parser = subparsers.add_parser(
        COMMAND, help="RClicks Table 3: click models (UD, DT, clickability network, ...) against real user clicks",
        description="Compare click models with real users' clicks (RClicks clickability evaluation, "
                    "Table 3): PL1, KS, WD, NSS and PDE per model, the authors' per-image and mean CSVs, "
                    "figures of the worst and best instances.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    flags.add_dataset_arguments(parser)
    flags.add_run_arguments(parser, default_batch_size=ClickabilitySpec.default_batch_size)
    parser.set_defaults(func=run)
    group = parser.add_argument_group("clickability")
    flags.add_flag(group, "--clicks-csv", required=True, metavar="CSV",
                   help="RClicks clicks CSV (the authors' datasets/clicks.csv columns)")
    flags.add_flag(group, "--click-models", required=True, metavar="A,B,...",
                   help="comma list of click models: ud, dt, saliency, saliency_image, rclicks_clickability, "
                        "a converted directory, ...")
    flags.add_flag(group, "--click-model-random-weights", type=model_seed_pair, action="append", default=[],
                   metavar="NAME=SEED", help="seeded random weights for a listed model (repeatable; smoke tests; "
                                             "default: the converted weights)")
    flags.add_flag(group, "--prev-masks", metavar="DIR", default=None,
                   help="folder of the fn / fp tasks' previous masks <full_stem>.png (red channel / 255); "
                        "default: first-round tasks only")
    flags.add_flag(group, "--split-file", metavar="TXT", default=None,
                   help="image stems, one a line (the authors' TETRIS_val.txt): evaluate only these images' tasks; "
                        "default: every image of the data flags")
    flags.add_flag(group, "--num-sets", type=flags.positive_int, default=ClickabilitySpec.num_sets,
                   help="bootstrap sets of PL1, KS and WD per task and model (default %(default)s, as the authors)")
    flags.add_flag(group, "--ks-alpha", type=flags.finite_float, default=ClickabilitySpec.ks_alpha,
                   help="level of the 2-D KS test: a set counts as alike when p > alpha (default %(default)s)")
    group.add_argument("--seed", type=int, default=ClickabilitySpec.seed,
                       help="seed of the bootstrap draws (default %(default)s)")
    flags.add_flag(group, "--plot-instances", type=flags.non_negative_int, default=ClickabilitySpec.plot_instances,
                   metavar="N", help="figures of the N worst and N best instances (default %(default)s)")
    flags.add_precision_flag(group)


def spec_of(args) -> RunSpec:
    """The `RunSpec` of the parsed flags (the protocol's: `jaxseg_robust.runs.clickability.ClickabilitySpec`;
    no model spec: the run evaluates click models, no segmenter)."""
    models = tuple(item.strip() for item in str(args.click_models).split(",") if item.strip())
    protocol = ClickabilitySpec(clicks_csv=args.clicks_csv, models=models,
                                random_weights=tuple(args.click_model_random_weights), num_sets=args.num_sets,
                                ks_alpha=args.ks_alpha, seed=args.seed, plot_instances=args.plot_instances,
                                prev_masks=args.prev_masks, split_file=args.split_file)
    return RunSpec(protocol=protocol, data=data_spec_of(args),
                   engine=engine_spec_of(args, frame=args.frame))


def run(args) -> int:
    """Runs the spec of the flags into ``--out`` and prints the table and the files written; returns an exit
    code of `jaxseg_robust.exit_codes`."""
    return run_spec(COMMAND, spec_of(args), args.out, FLAG_NAMES)
