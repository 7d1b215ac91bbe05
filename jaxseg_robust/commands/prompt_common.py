"""Shared shell of the prompt-protocol commands (`breps`, `tetris`, `grid`).

Each prompt-protocol command is: parse flags -> load a promptable model ->
list dataset instances -> make a batch function -> `jaxseg_robust.runner.engine.run`
into a run directory (manifest, append-only records, resume) -> print a
per-dataset summary table. Everything but "make a batch function" and "the
table" lives here, so a command module only adds its protocol flags, its
batch function and its report.

Flags added here (both spellings accepted where RITM/BREPS users type
underscores, e.g. ``--batch-size`` / ``--batch_size``):

  model     --model NAME_OR_DIR, --random-weights [SEED], --compute-dtype
  data      --datasets A,B,..., --data-root DIR, --folder IMAGES MASKS (repeatable),
            --mask-rule, --mask-ignore, --tetris-max-side, --limit N, --max-side PX (size guard)
  run       --out RUN_DIR, --batch-size, --frame, --progress, --retry-failed,
            --allow-manifest-mismatch, --abort-after
  processes --distributed, --process-index I --process-count N (`start_processes`)
  attack    --mode (`add_mode_flag`), --n-opt-steps S, --lr-mult (`add_attack_step_flags`):
            TETRIS and BREPS

A command's ``register`` is `add_protocol_parser` (parser, these groups, its
own group) plus its protocol flags; its ``run`` is `run_prompt_command` over a
function that checks the flags, loads the instances and the model
(`load_instances`, `load_model_of`), records `model_config` plus its settings
in the manifest, runs (`run_protocol`) and renders the table.

Models: a converted directory (``python -m ports ...``) or a zoo name whose
weights were converted into ``$JAXSEG_ROBUST_MODELS``; zoo test models that
have no official weights (``sam_tiny``, ``mobile_sam_tiny``, ``sam_hq_tiny``)
and any name given with ``--random-weights`` get seeded random weights (the
run's model fingerprint records exactly which).

Datasets: each listing problem (image without mask, unreadable header, image
and mask sizes that differ) becomes an instance that the run records as
failed with an error naming the file, so the run goes on and the exit code
says "partial" (1). Exit codes: `jaxseg_robust.cli` (0 ok, 1 some instances
failed, 2 bad arguments / nothing could be run / every instance failed).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import pathlib
import re
import sys
import warnings
from collections.abc import Callable, Mapping, Sequence

from jaxseg_robust.cli import EXIT_FAILURE, EXIT_OK, EXIT_PARTIAL
from jaxseg_robust.data.datasets import DEFAULT_MAX_SIDE

FRAME_HELP = ("padded frame of each batch: 'exact' (one compile per image size), 'round:N' (H and W "
              "rounded up to a multiple of N; fewer compiles, same numbers: SAM's post-processing runs "
              "on each image's own size inside the frame) or 'fixed:HxW' (default %(default)s)")
MAX_SIDE_HELP = ("size guard: images whose longest side exceeds PX are downsized on load, aspect kept (Pillow "
                 "bilinear; masks nearest), for every data source; memory grows ~550 bytes per pixel (a 4000x3000 "
                 "image: 7.8 GB unguarded, 3.0 GB peak with the default %(default)s, 1.7 GB with 1024). "
                 "A resized instance's record says so: "
                 "\"resized\": original_size [H0, W0], size [h, w], scale; results are in the resized frame "
                 "(x0 = (x + 0.5) * W0 / w - 0.5, masks resized back nearest). 0 = no guard. TETRIS: applied "
                 "after the protocol's own cap (--tetris-max-side)")
RANDOM_ONLY_HINT = "<none"  # zoo checkpoint hints of test models without official weights
PROGRESS_CHOICES = ("auto", "tqdm", "plain", "none")


class CommandError(Exception):
    """A problem the user must fix (bad flag value, missing data or model); printed without traceback."""


DEVICE_EPILOG = """\
device: JAX picks the accelerator if one is installed; choose with the environment variable
JAX_PLATFORMS=cpu|cuda|tpu (e.g. JAX_PLATFORMS=cpu jaxseg-robust ...); a batch is sharded over
all local devices of that platform."""


def startup_line(text: str, stream=None) -> None:
    """Prints a start-up step (``loading sam_vit_b ...``, ``compiling ...``) to stderr, flushed."""
    print(text, file=sys.stderr if stream is None else stream, flush=True)


class AnnouncedBatchFunction:
    """A batch function that says (`startup_line`) before the first batch of each bucket: that call compiles.

    Attributes of the wrapped function (``traces``, ``finalize``, ...) are reachable through the wrapper.
    """

    def __init__(self, batch_fn: Callable, program: str):
        self.batch_fn, self.program, self._seen = batch_fn, program, set()

    def __call__(self, batch):
        shape = tuple(int(v) for v in getattr(batch.gt, "shape", ()))
        if shape not in self._seen and len(shape) == 3:
            self._seen.add(shape)
            startup_line(f"compiling the {self.program} for bucket {shape[1]}x{shape[2]}, batch {shape[0]} "
                         "(first batch) ...")
        return self.batch_fn(batch)

    def __getattr__(self, name: str):
        return getattr(self.__dict__["batch_fn"], name)


# ---- flags -------------------------------------------------------------------------------

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


def add_model_arguments(parser) -> None:
    """--model, --random-weights, --compute-dtype."""
    group = parser.add_argument_group("model")
    group.add_argument("--model", required=True, metavar="NAME_OR_DIR",
                       help="zoo name (e.g. sam_vit_b, mobile_sam, sam_hq_vit_b; converted weights in "
                            "$JAXSEG_ROBUST_MODELS) or a directory made by `python -m ports`")
    add_flag(group, "--random-weights", nargs="?", type=non_negative_int, const=0, default=None,
             metavar="SEED", help="use seeded random weights (smoke tests, benchmarks); automatic for "
                                  "test models without official weights (sam_tiny, ...)")
    add_flag(group, "--compute-dtype", choices=("float32", "bfloat16"), default=None,
             help="image-encoder compute dtype (default: the model's, float32)")


def add_dataset_arguments(parser) -> None:
    """--datasets, --data-root, --folder, --mask-rule, --mask-ignore, --tetris-max-side, --limit, --max-side."""
    group = parser.add_argument_group("data")
    group.add_argument("--datasets", default=None, metavar="A,B,...",
                       help="RITM-style benchmark folders under --data-root: grabcut, berkeley, davis, "
                            "coco_mval, tetris (case and '_'/'-' ignored: GrabCut,COCO_MVal)")
    add_flag(group, "--data-root", default=None, metavar="DIR",
             help="folder holding the dataset folders (default $JAXSEG_ROBUST_DATA)")
    group.add_argument("--folder", nargs=2, action="append", default=[], metavar=("IMAGES", "MASKS"),
                       help="any folder of images and a folder of masks matched by file stem (repeatable); "
                            "the dataset is named after the images folder's parent")
    add_flag(group, "--mask-rule", default=">128",
             help="--folder masks: foreground rule on the pixel value ('>N', '>=N', '==N', '!=N'; "
                  "default %(default)s)")
    add_flag(group, "--mask-ignore", type=int, default=None, metavar="VALUE",
             help="--folder masks: pixel value marking ignored pixels (e.g. 128)")
    add_flag(group, "--tetris-max-side", type=non_negative_int, default=None, metavar="PX",
             help="TETRIS dataset only: the protocol's cap of the longest side, applied when listing with "
                  "OpenCV-exact bilinear resizing as the authors' loaders (default 1024 as BREPS, rclicks 2048 "
                  "as RClicks; 0 = original size); --max-side still guards the result")
    group.add_argument("--limit", type=positive_int, default=None, metavar="N",
                       help="only the first N instances of each dataset")
    add_flag(group, "--max-side", type=non_negative_int, default=DEFAULT_MAX_SIDE, metavar="PX", help=MAX_SIDE_HELP)


def add_run_arguments(parser, *, default_batch_size: int, default_frame: str = "round:64") -> None:
    """--out, --batch-size, --frame, --progress, --retry-failed, --allow-manifest-mismatch, --abort-after."""
    group = parser.add_argument_group("run")
    group.add_argument("--out", required=True, metavar="RUN_DIR",
                       help="run directory (created; rerunning the same command resumes and skips what is done)")
    add_flag(group, "--batch-size", type=positive_int, default=default_batch_size,
             help="instances per jitted call (default %(default)s; rounded up to a multiple of the devices)")
    group.add_argument("--frame", default=default_frame, help=FRAME_HELP)
    group.add_argument("--progress", choices=PROGRESS_CHOICES, default="auto",
                       help="progress display (default %(default)s: a tqdm bar when installed)")
    add_flag(group, "--retry-failed", action="store_true", help="rerun instances recorded as failed")
    add_flag(group, "--allow-manifest-mismatch", action="store_true",
             help="resume into a run directory made with other settings (differences are logged)")
    add_flag(group, "--abort-after", type=positive_int, default=32, metavar="N",
             help="stop after N instances in a row fail in the model (a systematic error; default %(default)s)")
    add_process_arguments(parser)


def add_process_arguments(parser) -> None:
    """--distributed, --process-index, --process-count (see `start_processes`)."""
    processes = parser.add_argument_group(
        "processes", "split one run over several processes or hosts sharing RUN_DIR (each evaluates the "
                     "instances it owns and appends to its own records.process<I>.jsonl; any rerun resumes)")
    add_flag(processes, "--distributed", action="store_true",
             help="call jax.distributed.initialize() first (multi-host; the cluster is detected from the "
                  "environment, e.g. SLURM or Cloud TPU); the share is this process's jax.process_index()")
    add_flag(processes, "--process-index", type=non_negative_int, default=None, metavar="I",
             help="without jax.distributed: this job's share I of --process-count independent jobs")
    add_flag(processes, "--process-count", type=positive_int, default=None, metavar="N",
             help="number of independent jobs splitting the run (with --process-index)")


def check_outputs(args) -> None:
    """Checks ``--out`` is a writable run directory (or can be created as one) and ``--progress`` can be shown.

    Runs before any model is loaded or anything computed; creates nothing.

    Raises:
      CommandError: naming the flag (an unwritable --out, --progress tqdm without tqdm).
    """
    from jaxseg_robust.runner.progress import check_progress_mode  # noqa: PLC0415
    from jaxseg_robust.runner.rundir import check_writable_dir  # noqa: PLC0415

    try:
        if getattr(args, "out", None) is not None:
            check_writable_dir(args.out, "--out")
        if getattr(args, "progress", None) is not None:
            check_progress_mode(args.progress)
    except ValueError as error:
        raise CommandError(str(error)) from None


def start_processes(args) -> tuple[int | None, int | None]:
    """Checks the process flags and starts ``jax.distributed`` when asked; call before anything uses JAX.

    Also checks ``--out`` and ``--progress`` (`check_outputs`), so every run
    command refuses an unwritable run directory before it computes anything.

    Args:
      args: parsed flags with ``distributed``, ``process_index``, ``process_count``.

    Returns:
      ``(process_index, process_count)`` for the engine: both None (one
      process, or ``--distributed``: the engine asks JAX) or the given share.

    Raises:
      CommandError: naming the flag (one of the pair missing, I >= N, a
        share given together with --distributed, or no cluster to join).
    """
    index, count = getattr(args, "process_index", None), getattr(args, "process_count", None)
    if (index is None) != (count is None):
        raise CommandError("--process-index and --process-count go together")
    if index is not None and index >= count:
        raise CommandError(f"--process-index must be < --process-count ({count}); got {index}")
    if getattr(args, "distributed", False):
        if index is not None:
            raise CommandError("--distributed takes the share from jax.process_index(); drop --process-index")
        import jax  # noqa: PLC0415

        try:
            jax.distributed.initialize()
        except (RuntimeError, ValueError) as error:
            raise CommandError(f"--distributed: jax.distributed.initialize() failed: {error}") from None
    check_outputs(args)
    return index, count


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
    """``'exact'`` | ``'round:N'`` | ``'fixed:HxW'`` -> a `jaxseg_robust.data.buckets` frame policy.

    Raises:
      CommandError: naming ``--frame``.
    """
    from jaxseg_robust.data.buckets import ExactFrame, FixedFrame, RoundUpFrame  # noqa: PLC0415

    value = str(text).strip().lower()
    if value == "exact":
        return ExactFrame()
    match = re.fullmatch(r"round:(\d+)", value)
    if match and int(match.group(1)) >= 1:
        return RoundUpFrame(int(match.group(1)))
    match = re.fullmatch(r"fixed:(\d+)x(\d+)", value)
    if match and min(int(match.group(1)), int(match.group(2))) >= 1:
        return FixedFrame(int(match.group(1)), int(match.group(2)))
    raise CommandError(f"--frame must be 'exact', 'round:N' or 'fixed:HxW' with positive numbers; got {text!r}")


# ---- model -------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class LoadedModel:
    """A promptable model ready for a batch function.

    Attributes:
      name: what ``--model`` said.
      segmenter: the Segmenter (static).
      params: parameter pytree (replicated over the data mesh).
      fingerprint: ``sha256:...`` of the weights (converted directory files or random params).
      source: ``"random:<seed>"`` or the converted directory.
    """

    name: str
    segmenter: object
    params: object
    fingerprint: str
    source: str


def _random_only(name: str) -> bool:
    from jaxseg_robust.models import zoo  # noqa: PLC0415

    try:
        return zoo.get(name).checkpoint_hint.startswith(RANDOM_ONLY_HINT)
    except ValueError:
        return False


def load_model(name_or_dir: str, *, random_seed: int | None = None, compute_dtype: str | None = None,
               mesh=None) -> LoadedModel:
    """Loads ``--model``: converted weights, or seeded random weights (see the module docstring).

    Raises:
      CommandError: unknown name, weights not converted, damaged directory.
    """
    from jaxseg_robust.models import zoo  # noqa: PLC0415
    from jaxseg_robust.runner.fingerprints import fingerprint_params, fingerprint_path  # noqa: PLC0415
    from jaxseg_robust.runner.sharding import data_mesh, replicate  # noqa: PLC0415

    mesh = data_mesh() if mesh is None else mesh
    is_dir = pathlib.Path(name_or_dir).expanduser().is_dir()
    try:
        if not is_dir and (random_seed is not None or _random_only(name_or_dir)):
            seed = 0 if random_seed is None else int(random_seed)
            segmenter = zoo.segmenter(name_or_dir, compute_dtype=compute_dtype)
            params = segmenter.init(seed)
            return LoadedModel(name_or_dir, segmenter, replicate(params, mesh), fingerprint_params(params),
                               f"random:{seed}")
        if random_seed is not None:
            raise CommandError("--random-weights takes a zoo name, not a converted directory")
        segmenter, params, _ = zoo.load_params(name_or_dir, compute_dtype=compute_dtype)
        path = zoo.resolve(name_or_dir)
        return LoadedModel(name_or_dir, segmenter, replicate(params, mesh), fingerprint_path(path), str(path))
    except CommandError:
        raise
    except (ValueError, FileNotFoundError, OSError) as error:
        raise CommandError(f"--model {name_or_dir}: {error}") from None
    except Exception as error:  # noqa: BLE001 - e.g. jaxseg_robust.models.store.StoreError on a damaged directory
        raise CommandError(f"--model {name_or_dir}: {type(error).__name__}: {error}") from None


def load_model_of(args, mesh=None) -> LoadedModel:
    """`load_model` of the parsed ``--model``, ``--random-weights`` and ``--compute-dtype``."""
    return load_model(args.model, random_seed=args.random_weights, compute_dtype=args.compute_dtype, mesh=mesh)


def model_config(protocol: str, args, model: LoadedModel, **variant) -> dict:
    """The manifest config entries every prompt protocol records, in this order.

    ``{"protocol", **variant (e.g. mode=... or kind=...), "model", "model_source",
    "image_resize", "compute_dtype"}``; the command adds its protocol
    settings. The weights themselves are pinned by the manifest's model
    fingerprint: a converted model's path is recorded as "converted" (not the
    path), so a moved models folder still resumes; random weights as "random:<seed>".
    """
    source = model.source if model.source.startswith("random:") else "converted"
    return {"protocol": protocol, **variant, "model": model.name, "model_source": source,
            "image_resize": getattr(model.segmenter, "image_resize", None), "compute_dtype": args.compute_dtype}


# ---- instances ---------------------------------------------------------------------------

def _folder_name(images: pathlib.Path) -> str:
    parent = images.resolve().parent
    return parent.name or images.resolve().name


def _refuse_folder_flags_without_folder(args) -> None:
    """--mask-rule / --mask-ignore read --folder masks; with --datasets alone they would do nothing: refused."""
    from jaxseg_robust.data.masks_io import is_default_rule  # noqa: PLC0415

    if args.folder:
        return
    try:
        changed = not is_default_rule(args.mask_rule)
    except ValueError as error:
        raise CommandError(f"--mask-rule: {error}") from None
    for flag, given in (("--mask-rule", changed), ("--mask-ignore", args.mask_ignore is not None)):
        if given:
            raise CommandError(f"{flag} applies to --folder masks; the --datasets benchmarks decode their masks by "
                               "their own rule (give the masks as --folder IMAGES MASKS to choose one)")


def load_instances(args) -> list:
    """Lists every instance of ``--datasets`` and ``--folder`` (lazy `InstanceRef`s, ``--limit`` and the
    ``--max-side`` size guard applied: `jaxseg_robust.data.datasets.guard_size`).

    Listing problems become failing instances (``on_bad_pair="fail"``), each
    naming its file; they are recorded as failed by the run.

    Raises:
      CommandError: no dataset given, unknown names, missing folders, a dataset
        listed twice, bad mask rules.
    """
    from jaxseg_robust.data.datasets import (  # noqa: PLC0415
        DatasetWarning,
        guard_size,
        list_dataset_folder,
        resolve_datasets,
    )

    if not args.datasets and not args.folder:
        raise CommandError("give --datasets NAMES and/or --folder IMAGES MASKS")
    _refuse_folder_flags_without_folder(args)
    groups: list[tuple[str, list]] = []
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always", DatasetWarning)
            sources = resolve_datasets(args.datasets, args.data_root) if args.datasets else []
            tetris_cap = getattr(args, "tetris_max_side", None)
            if (tetris_cap is not None and tetris_cap != getattr(args, "tetris_max_side_default", None)
                    and not any(source.kind == "tetris" for source in sources)):
                raise CommandError("--tetris-max-side is the TETRIS dataset's protocol cap and no TETRIS dataset "
                                   "is listed; the size guard of every image is --max-side")
            if args.datasets:
                for source in sources:
                    options = {"name": source.name, "on_bad_pair": "fail"}
                    if source.kind == "tetris" and args.tetris_max_side is not None:
                        options["max_side"] = args.tetris_max_side
                    groups.append((source.name, list_dataset_folder(source.kind, source.path, **options)))
            for images_text, masks_text in args.folder:
                images, masks = pathlib.Path(images_text), pathlib.Path(masks_text)
                for label, path in (("IMAGES", images), ("MASKS", masks)):
                    if not path.is_dir():
                        raise CommandError(f"--folder {label} {path} is not a directory")
                name = _folder_name(images)
                refs = list_dataset_folder("folder", images.resolve().parent, name=name,
                                           images_dir=str(images.resolve()), masks_dir=str(masks.resolve()),
                                           on_bad_pair="fail", rule=args.mask_rule, ignore_value=args.mask_ignore)
                groups.append((name, refs))
    except CommandError:
        raise
    except ValueError as error:  # DatasetError is a ValueError
        raise CommandError(str(error)) from None
    names = [name for name, _ in groups]
    duplicated = sorted({name for name in names if names.count(name) > 1})
    if duplicated:
        raise CommandError(f"dataset name(s) {duplicated} given twice (a --folder is named after the "
                           "parent of its IMAGES folder)")
    instances = []
    for _, refs in groups:
        instances.extend(refs if args.limit is None else refs[:args.limit])
    instances = guard_size(instances, getattr(args, "max_side", DEFAULT_MAX_SIDE))
    if not instances:
        raise CommandError("the datasets hold no instances")
    return instances


def dataset_names(instances: Sequence) -> list[str]:
    """Dataset names in first-seen order."""
    return list(dict.fromkeys(instance.dataset for instance in instances))


# ---- running -----------------------------------------------------------------------------

def run_protocol(args, *, instances: Sequence, batch_fn: Callable, config: Mapping, model: LoadedModel,
                 finalize: Callable | None = None, mesh=None):
    """Runs ``batch_fn`` over ``instances`` into ``args.out`` with the engine (resume, records, progress).

    Returns:
      The engine's `RunSummary`.

    Raises:
      CommandError: manifest mismatch, busy run directory, aborted run, bad run directory.
    """
    from jaxseg_robust.data.instances import require_object  # noqa: PLC0415
    from jaxseg_robust.runner.engine import RunAbortedError, run  # noqa: PLC0415
    from jaxseg_robust.runner.rundir import ManifestMismatchError, RunDirectoryBusyError  # noqa: PLC0415

    policy = parse_frame_policy(args.frame)
    process_index, process_count = getattr(args, "process_index", None), getattr(args, "process_count", None)
    try:
        return run(instances, batch_fn, args.out, args.batch_size, config=config,
                   model_fingerprint=model.fingerprint, frame_policy=policy, finalize=finalize,
                   process_index=process_index, process_count=process_count, check=require_object, mesh=mesh, allow_manifest_mismatch=args.allow_manifest_mismatch,
                   retry_failed=args.retry_failed, abort_after_consecutive_failures=args.abort_after,
                   progress=args.progress)
    except ManifestMismatchError as error:
        raise CommandError(f"{error}".replace("allow_mismatch=True (CLI: --allow-manifest-mismatch)",
                                              "--allow-manifest-mismatch")) from None
    except (RunDirectoryBusyError, RunAbortedError) as error:
        raise CommandError(str(error)) from None
    except (ValueError, OSError) as error:
        raise CommandError(f"{type(error).__name__}: {error}") from None


def exit_code(summary, recorded_ok: int) -> int:
    """CLI exit code of a finished run: 2 if nothing is recorded as ok, 1 if some instance failed, else 0."""
    if recorded_ok == 0:
        return EXIT_FAILURE
    return EXIT_PARTIAL if summary.exit_code != EXIT_OK else EXIT_OK


def report_error(command: str, message: str, stream=None) -> int:
    """Prints ``jaxseg-robust COMMAND: error: MESSAGE`` to stderr; returns EXIT_FAILURE."""
    print(f"jaxseg-robust {command}: error: {message}", file=sys.stderr if stream is None else stream)
    return EXIT_FAILURE


def print_outcome(summary, table: str, files: Sequence[pathlib.Path], stream=None) -> None:
    """Prints the run summary (counts, failures), the table and where the files are."""
    out = sys.stdout if stream is None else stream
    print(summary.format(), file=out)
    print("", file=out)
    print(table, file=out)
    for path in files:
        print(f"wrote {path}", file=out)


def write_tables(run_dir, markdown: str, csv_text: str, stem: str = "summary") -> list[pathlib.Path]:
    """Writes ``<stem>.md`` and ``<stem>.csv`` into the run directory; returns their paths."""
    from jaxseg_robust.reports.report_files import write_table_files  # noqa: PLC0415

    return list(write_table_files(run_dir, stem, markdown, csv_text).values())


def finish(command: str, args, summary, markdown: str, csv_text: str) -> int:
    """The common end of a prompt-protocol command: write and print the tables, return the exit code.

    Args:
      command: the sub-command name (for messages).
      args: parsed flags (``args.out`` is the run directory).
      summary: the engine's `RunSummary` of this call.
      markdown, csv_text: the per-dataset table of every record in the run directory.

    Returns:
      `exit_code` over everything recorded in the run directory.
    """
    from jaxseg_robust.runner.engine import recorded_counts  # noqa: PLC0415

    files = write_tables(args.out, markdown, csv_text)
    print_outcome(summary, markdown, files)
    code = exit_code(summary, recorded_counts(args.out)["ok"])
    if code == EXIT_FAILURE:
        report_error(command, f"no instance succeeded (see the failures above and {args.out}/records*.jsonl)")
    return code


def run_prompt_command(command: str, args, execute: Callable) -> int:
    """The ``run`` of a prompt-protocol command: ``execute``, then `finish`; errors exit 2.

    Args:
      command: the sub-command name (for messages).
      args: parsed flags.
      execute: ``args -> (summary, markdown, csv_text)``: checks the flags,
        loads data and model, runs (`run_protocol`) and renders the
        per-dataset table of the run directory. A `CommandError` or
        ValueError (bad data files, records of another protocol) it raises is
        printed as ``jaxseg-robust COMMAND: error: ...``.

    Returns:
      An exit code of `jaxseg_robust.cli`.
    """
    try:
        start_processes(args)
        summary, markdown, csv_text = execute(args)
    except (CommandError, ValueError) as error:
        return report_error(command, str(error))
    return finish(command, args, summary, markdown, csv_text)
