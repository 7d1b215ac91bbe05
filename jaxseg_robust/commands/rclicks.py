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
(`jaxseg_robust.runs.evaluate`; the protocol and its settings:
`jaxseg_robust.runs.rclicks.RClicksSpec`), with a clicking-groups figure per
plotted instance (``groups_<dataset>_<id>.png``). The records hold IoU and Boundary IoU per round
(``base_iou`` / ``base_biou``, ``group_iou`` / ``group_biou``).

Exit codes: 0 every instance evaluated; 1 some instances failed (listed, and in
the records); 2 bad arguments, nothing could be run, or every instance failed.
"""

from __future__ import annotations

from jaxseg_robust.commands import flags
from jaxseg_robust.commands.run_specs import FlagNames, run_spec_of
from jaxseg_robust.commands.running import run_spec
from jaxseg_robust.runs.rclicks import RClicksSpec
from jaxseg_robust.runs.spec import RunSpec

COMMAND = RClicksSpec.command
FLAG_NAMES = FlagNames(thresh="--thr", run_base="--no-base", clickability_random_seed="--clickability-random-weights")
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
    _, group = flags.add_protocol_parser(
        subparsers, COMMAND,
        summary="RClicks benchmark: simulated users in clicking groups G1..G10 (NoC/NoF/AuC, ΔSB/ΔGR/ΔHH)",
        description="Evaluate a promptable model with realistic simulated users (RClicks): the baseline "
                    "clicker and ten clicking groups sampled from a clickability map, 20 rounds each; "
                    "optionally real first-round user clicks from the RClicks clicks CSV.",
        epilog=EPILOG, default_batch_size=RClicksSpec.default_batch_size, group_title="rclicks", run=run)
    group.add_argument("--clickability", required=True, metavar="DIR|dt|ud|NAME",
                       help="click model: converted clickability or TranSalNet directory, zoo name "
                            "rclicks_clickability or transalnet_res, saliency (= transalnet_res, the SM "
                            "baseline), or the baselines dt / ud")
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



# ---- the run spec ----------------------------------------------------------------------------

def spec_of(args) -> RunSpec:
    """The `RunSpec` of the parsed flags (the protocol's: `jaxseg_robust.runs.rclicks.RClicksSpec`)."""
    protocol = RClicksSpec(clickability=args.clickability, clickability_random_seed=args.clickability_random_weights,
                           clicks_csv=args.clicks_csv, n_clicks=args.n_clicks, groups=args.groups,
                           run_base=not args.no_base, thresh=args.thr, target_iou=args.target_iou,
                           mask_feedback=args.mask_feedback, seed=args.seed, isegm=args.isegm,
                           plot_groups=args.plot_groups)
    return run_spec_of(args, protocol, frame=args.frame)


def run(args) -> int:
    """Runs the spec of the flags into ``--out`` and prints the table and the figures written; returns an exit
    code of `jaxseg_robust.exit_codes`."""
    return run_spec(COMMAND, spec_of(args), args.out, FLAG_NAMES)
