"""The flag groups every `jaxseg-robust` command shares, and their argparse types.

Flags accept both spellings where RITM/BREPS users type underscores
(``--batch-size`` / ``--batch_size``, `add_flag`). Groups:

  model     --model NAME_OR_DIR, --random-weights [SEED] (alias --random-init), --compute-dtype,
            --precision (`add_precision_flag`)
  data      --datasets A,B,... (names or folders), --data-root DIR, --folder IMAGES MASKS (repeatable),
            --mask-rule, --mask-ignore, --on-bad-pair, --tetris-max-side, --limit N, --max-side PX
  run       --out RUN_DIR, --batch-size, --frame, --progress, --retry-failed,
            --allow-manifest-mismatch, --abort-after
  processes --distributed, --process-index I --process-count N
  global    --compile-cache DIR|off (`add_compile_cache_flag`, before the sub-command)
  attack    --mode (`add_mode_flag`), --n-opt-steps S, --lr-mult (`add_attack_step_flags`)

Bad values raise argparse errors (exit 2) or `CommandError` (printed as
``jaxseg-robust COMMAND: error: ...``, exit 2) before anything is loaded.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Sequence

from jaxseg_robust.data.masks_io import DEFAULT_RULE
from jaxseg_robust.data.size_guard import DEFAULT_MAX_SIDE

FRAME_HELP = ("padded frame of each batch: 'exact' (one compile per image size), 'round:N' (H and W "
              "rounded up to a multiple of N; fewer compiles, same numbers: SAM's post-processing runs "
              "on each image's own size inside the frame) or 'fixed:HxW' (default %(default)s)")
MAX_SIDE_HELP = ("size guard: images whose longest side exceeds PX are downsized on load, aspect kept (Pillow "
                 "bilinear; masks nearest), for every data source; memory grows ~550 bytes per pixel (a 4000x3000 "
                 "image: 7.8 GB unguarded, 3.0 GB peak with the default %(default)s, 1.7 GB with 1024). "
                 "A resized instance is said on stderr (one line: its name, both sizes), counted at the end "
                 "of the run and in summary.md, and its record says so: "
                 "\"resized\": original_size [H0, W0], size [h, w], scale; results are in the resized frame "
                 "(x0 = (x + 0.5) * W0 / w - 0.5, masks resized back nearest). 0 = no guard. TETRIS: applied "
                 "after the protocol's own cap (--tetris-max-side)")
PROGRESS_CHOICES = ("auto", "tqdm", "plain", "none")
ON_BAD_PAIR_CHOICES = ("fail", "skip", "error")


class CommandError(Exception):
    """A problem the user must fix (bad flag value, missing data or model); printed without traceback."""


DEVICE_EPILOG = """\
device: JAX picks the accelerator if one is installed; choose with the environment variable
JAX_PLATFORMS=cpu|cuda|tpu (e.g. JAX_PLATFORMS=cpu jaxseg-robust ...); a batch is sharded over
all local devices of that platform."""


def add_compile_cache_flag(parser) -> None:
    """The global ``--compile-cache DIR|off`` of `jaxseg-robust` (before the sub-command;
    `jaxseg_robust.runner.compile_cache`)."""
    from jaxseg_robust.runner.compile_cache import ENV_VAR, JAX_ENV_VAR, OFF  # noqa: PLC0415

    add_flag(parser, "--compile-cache", default=None, metavar=f"DIR|{OFF}",
             help=f"JAX's persistent compilation cache: a second run of a command loads its compiled programs "
                  f"from DIR instead of compiling them again; '{OFF}' disables it (default: ${ENV_VAR}, else "
                  f"${JAX_ENV_VAR}, else $XDG_CACHE_HOME/jaxseg_robust/jax or ~/.cache/jaxseg_robust/jax)")


def flag_spellings(name: str) -> list[str]:
    """``"--n-opt-steps"`` -> ``["--n-opt-steps", "--n_opt_steps"]`` (one entry when there is no dash)."""
    if not name.startswith("--"):
        raise ValueError(f"name must start with '--'; got {name!r}")
    underscored = "--" + name[2:].replace("-", "_")
    return [name] if underscored == name else [name, underscored]


def add_flag(parser, name: str, **kwargs):
    """``parser.add_argument`` under both the dash and the underscore spelling of ``name``."""
    kwargs.setdefault("dest", name[2:].replace("-", "_"))
    return parser.add_argument(*flag_spellings(name), **kwargs)


def _int_at_least(text: str, minimum: int, expected: str) -> int:
    """``int(text)`` if it is >= ``minimum``; else an ArgumentTypeError "expected <expected>, got ..."."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"expected {expected}, got {value}")
    return value


def positive_int(text: str) -> int:
    """argparse type: an int >= 1."""
    return _int_at_least(text, 1, "a positive integer")


def non_negative_int(text: str) -> int:
    """argparse type: an int >= 0."""
    return _int_at_least(text, 0, "a non-negative integer")


def finite_float(text: str) -> float:
    """argparse type: a finite float."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def positive_float(text: str) -> float:
    """argparse type: a finite float > 0."""
    value = finite_float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def add_model_arguments(parser, *, required: bool = True, what: str = "") -> None:
    """--model, --random-weights [SEED] (old spelling --random-init, kept for one release), --compute-dtype.

    Args:
      required: whether --model must be given (``perturb --report-only`` needs none).
      what: extra help text on the models the command takes.
    """
    group = parser.add_argument_group("model")
    group.add_argument("--model", required=required, metavar="NAME_OR_DIR",
                       help="zoo name (e.g. sam_vit_b, mobile_sam, sam2.1_hiera_large, sam_hq_vit_b, "
                            "ritm_hrnet32_cocolvis, simpleclick_vit_b, cfr_icl_vit_h; converted weights in "
                            f"$JAXSEG_ROBUST_MODELS) or a directory made by `python -m ports`{what}"
                            + ("" if required else " (default: none)"))
    group.add_argument(*flag_spellings("--random-weights"), "--random-init", dest="random_weights", nargs="?",
                       type=non_negative_int, const=0, default=None, metavar="SEED",
                       help="use seeded random weights (smoke tests, benchmarks; SEED default %(const)s); automatic "
                            "for test models without official weights (sam_tiny, ...); --random-init is the old "
                            "spelling (default: the converted weights)")
    add_flag(group, "--compute-dtype", choices=("float32", "bfloat16"), default=None,
             help="image-encoder compute dtype (default: the model's, float32)")
    add_precision_flag(group)


def add_precision_flag(group) -> None:
    """--precision highest|high|default: the float32 matrix-product precision of the run's jitted programs
    (`jaxseg_robust.runner.precision`; recorded in the run manifest, a resume at another precision is refused)."""
    from jaxseg_robust.runner.precision import DEFAULT_MATMUL_PRECISION, MATMUL_PRECISIONS  # noqa: PLC0415

    group.add_argument("--precision", choices=MATMUL_PRECISIONS[::-1], default=DEFAULT_MATMUL_PRECISION,
                       help="float32 matrix-product precision of the jitted programs (jax.default_matmul_precision): "
                            "on an NVIDIA GPU 'default' runs TF32-like products (about 3e-4 relative to 'highest', "
                            "several times faster), 'highest' full float32; XLA:CPU computes full float32 at every "
                            "setting; recorded in the run manifest (default %(default)s; see docs/benchmarking.md)")


def add_dataset_arguments(parser) -> None:
    """--datasets, --data-root, --folder, --mask-rule, --mask-ignore, --on-bad-pair, --tetris-max-side,
    --limit, --max-side."""
    group = parser.add_argument_group("data")
    group.add_argument("--datasets", default=None, metavar="A,B,...",
                       help="RITM-style benchmark folders under --data-root: grabcut, berkeley, davis, "
                            "coco_mval, tetris (case and '_'/'-' ignored: GrabCut,COCO_MVal); an entry that "
                            "is an existing folder is read as the benchmark its name says or as images/ + masks/ "
                            "(default: none; give it and/or --folder)")
    add_flag(group, "--data-root", default=None, metavar="DIR",
             help="folder holding the dataset folders (default $JAXSEG_ROBUST_DATA)")
    group.add_argument("--folder", nargs=2, action="append", default=[], metavar=("IMAGES", "MASKS"),
                       help="any folder of images and a folder of masks matched by file stem (repeatable); "
                            "the dataset is named after the images folder's parent (default: none)")
    add_flag(group, "--mask-rule", default=DEFAULT_RULE,
             help="--folder masks: foreground rule on the pixel value ('>N', '>=N', '==N', '!=N'), applied to "
                  "every mask the same way (default %(default)s: 0/255, JPEG and soft masks; 0/1 label masks and "
                  "DAVIS palette ids need '>0'); a mask it leaves empty is a failed instance naming the file")
    add_flag(group, "--mask-ignore", type=int, default=None, metavar="VALUE",
             help="--folder masks: pixel value marking ignored pixels (e.g. 128; default: none, every pixel "
                  "counts)")
    add_flag(group, "--on-bad-pair", choices=ON_BAD_PAIR_CHOICES, default="fail",
             help="an unreadable or unmatched file: record its instance as failed (default), skip it, or stop")
    add_flag(group, "--tetris-max-side", type=non_negative_int, default=None, metavar="PX",
             help="TETRIS dataset only: the protocol's cap of the longest side, applied when listing with "
                  "OpenCV-exact bilinear resizing as the authors' loaders (default 1024 as BREPS, rclicks 2048 "
                  "as RClicks; 0 = original size); --max-side still guards the result")
    group.add_argument("--limit", type=positive_int, default=None, metavar="N",
                       help="only the first N instances of each dataset (default: all)")
    add_flag(group, "--max-side", type=non_negative_int, default=DEFAULT_MAX_SIDE, metavar="PX", help=MAX_SIDE_HELP)


def add_run_arguments(parser, *, default_batch_size: int, default_frame: str | None = "round:64") -> None:
    """--out, --batch-size, --frame (unless ``default_frame`` is None: images at their own size),
    --progress, --retry-failed, --allow-manifest-mismatch, --abort-after, and the process flags."""
    group = parser.add_argument_group("run")
    group.add_argument("--out", required=True, metavar="RUN_DIR",
                       help="run directory (created; rerunning the same command resumes and skips what is done)")
    add_flag(group, "--batch-size", type=positive_int, default=default_batch_size,
             help="instances per jitted call (default %(default)s; rounded up to a multiple of the devices)")
    if default_frame is not None:
        group.add_argument("--frame", default=default_frame, help=FRAME_HELP)
    group.add_argument("--progress", choices=PROGRESS_CHOICES, default="auto",
                       help="progress display (default %(default)s: a tqdm bar when installed)")
    add_flag(group, "--retry-failed", action="store_true",
             help="rerun instances recorded as failed (default: a resumed run keeps their failure)")
    add_flag(group, "--allow-manifest-mismatch", action="store_true",
             help="resume into a run directory made with other settings (differences are logged; default: "
                  "refused)")
    add_flag(group, "--abort-after", type=positive_int, default=32, metavar="N",
             help="stop after N instances in a row fail in the model (a systematic error; default %(default)s)")
    add_process_arguments(parser)


def add_process_arguments(parser) -> None:
    """--distributed, --process-index, --process-count (`jaxseg_robust.runs.execute.start_processes`)."""
    processes = parser.add_argument_group(
        "processes", "split one run over several processes or hosts sharing RUN_DIR (each evaluates the "
                     "instances it owns and appends to its own records.process<I>.jsonl; any rerun resumes)")
    add_flag(processes, "--distributed", action="store_true",
             help="call jax.distributed.initialize() first (multi-host; the cluster is detected from the "
                  "environment, e.g. SLURM or Cloud TPU); the share is this process's jax.process_index() "
                  "(default: one process, or the --process-index share)")
    add_flag(processes, "--process-index", type=non_negative_int, default=None, metavar="I",
             help="without jax.distributed: this job's share I of --process-count independent jobs "
                  "(default: the whole run)")
    add_flag(processes, "--process-count", type=positive_int, default=None, metavar="N",
             help="number of independent jobs splitting the run (with --process-index; default: one job)")


def add_common_arguments(parser, *, default_batch_size: int, default_frame: str = "round:64") -> None:
    """The model, data and run flag groups."""
    add_model_arguments(parser)
    add_dataset_arguments(parser)
    add_run_arguments(parser, default_batch_size=default_batch_size, default_frame=default_frame)


def add_protocol_parser(subparsers, command: str, *, summary: str, description: str, epilog: str,
                        default_batch_size: int, group_title: str, run: Callable):
    """Adds a prompt-protocol sub-command: its parser, the common flag groups and its own (empty) group.

    Args:
      subparsers: argparse sub-parsers of `jaxseg_robust.cli`.
      command: the sub-command name.
      summary: one line for ``jaxseg-robust --help``; description: the ``--help`` description.
      epilog: the ``--help`` examples and exit codes, printed as written.
      default_batch_size: ``--batch-size`` default.
      group_title: title of the protocol's flag group.
      run: ``args -> exit code``, set as the parser's ``func``.

    Returns:
      (parser, group): the sub-command's parser and its protocol flag group.
    """
    parser = subparsers.add_parser(command, help=summary, description=description, epilog=epilog,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_arguments(parser, default_batch_size=default_batch_size)
    parser.set_defaults(func=run)
    return parser, parser.add_argument_group(group_title)


def add_mode_flag(group, modes: Sequence[str]) -> None:
    """--mode of an adversarial prompt attack (TETRIS clicks, BREPS boxes): one of ``modes``, default "minmax"."""
    group.add_argument("--mode", choices=modes, default="minmax", help="protocol (default %(default)s)")


def add_attack_step_flags(group, *, n_opt_steps: int, first_iterate: str, lr_mult: float, lr_scale: str) -> None:
    """--n-opt-steps S and --lr-mult of an adversarial prompt attack's Adam steps (TETRIS clicks, BREPS boxes).

    Args:
      group: the protocol's argparse group.
      n_opt_steps: ``--n-opt-steps`` default: evaluated iterates per attack step
        (``first_iterate`` + S-1 Adam updates).
      first_iterate: what iterate 0 is, e.g. "per click: the baseline click".
      lr_mult, lr_scale: ``--lr-mult`` default and what it multiplies in the Adam
        learning rate (an expression of the image height H and width W in pixels).
    """
    add_flag(group, "--n-opt-steps", type=positive_int, default=n_opt_steps, metavar="S",
             help=f"evaluated iterates {first_iterate} + S-1 Adam updates (default %(default)s)")
    add_flag(group, "--lr-mult", type=finite_float, default=lr_mult,
             help=f"Adam lr = lr_mult * {lr_scale} (default %(default)s)")


# ---- parsing helpers ---------------------------------------------------------------------

def parse_frame_policy(text: str):
    """``'exact'`` | ``'round:N'`` | ``'fixed:HxW'`` -> a `jaxseg_robust.data.buckets` frame policy
    (`jaxseg_robust.runs.spec.parse_frame`).

    Raises:
      CommandError: naming ``--frame``.
    """
    from jaxseg_robust.runs.spec import RunError, parse_frame  # noqa: PLC0415

    try:
        return parse_frame(text)
    except RunError as error:
        raise CommandError(error.render({"frame": "--frame"})) from None
