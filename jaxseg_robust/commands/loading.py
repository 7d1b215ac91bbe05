"""Loading what a command evaluates: the model (`load_model`) and the dataset instances (`load_instances`).

Models: a converted directory (``python -m ports ...``) or a zoo name whose
weights were converted into ``$JAXSEG_ROBUST_MODELS``; zoo test models that
have no official weights (``sam_tiny``, ``mobile_sam_tiny``, ``sam_hq_tiny``)
and any name given with ``--random-weights`` get seeded random weights (the
run's model fingerprint records exactly which).

Datasets: each listing problem (image without mask, unreadable header, image
and mask sizes that differ) becomes an instance that the run records as
failed with an error naming the file (``--on-bad-pair fail``, the default), so
the run goes on and the exit code says "partial" (1).
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import sys
import warnings
from collections.abc import Sequence

from jaxseg_robust.commands.flags import CommandError
from jaxseg_robust.data.size_guard import DEFAULT_MAX_SIDE

RANDOM_ONLY_HINT = "<none"  # zoo checkpoint hints of test models without official weights

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
    except (KeyError, TypeError) as error:  # a config.json that does not describe its family
        raise CommandError(f"--model {name_or_dir}: {type(error).__name__}: {error}") from None


def load_model_of(args, mesh=None) -> LoadedModel:
    """`load_model` of the parsed ``--model``, ``--random-weights`` and ``--compute-dtype``."""
    return load_model(args.model, random_seed=args.random_weights, compute_dtype=args.compute_dtype, mesh=mesh)


def refuse_click_only(model: LoadedModel, what: str) -> None:
    """CommandError (exit 2) naming the model and the reason when ``what`` needs box prompts and the
    model's family takes clicks only (`jaxseg_robust.models.base.FamilyRules.accepts_boxes`)."""
    from jaxseg_robust.models.base import family_rules  # noqa: PLC0415

    rules = family_rules(model.segmenter)
    if not rules.accepts_boxes:
        family = rules.family
        raise CommandError(f"--model {model.name}: {what} needs box prompts, and the {family} family takes "
                           "clicks only (click-map models have no box input); use tetris, grid --kind click "
                           "or rclicks")


def resolve_threshold(value: float | None, model: LoadedModel) -> float:
    """A threshold flag's value, or the model family's ``probability_threshold`` when the flag was not given."""
    return float(model.segmenter.probability_threshold) if value is None else float(value)


def model_config(protocol: str, args, model: LoadedModel, **variant) -> dict:
    """The manifest config entries every prompt protocol records, in this order.

    ``{"protocol", **variant (e.g. mode=... or kind=...), "model", "model_source",
    "image_resize", "compute_dtype"}``; the command adds its protocol
    settings. The weights themselves are pinned by the manifest's model
    fingerprint: a converted model's path is recorded as "converted" (not the
    path), so a moved models folder still resumes; random weights as "random:<seed>".
    """
    from jaxseg_robust.models.base import family_segmenter  # noqa: PLC0415

    source = model.source if model.source.startswith("random:") else "converted"
    return {"protocol": protocol, **variant, "model": model.name, "model_source": source,
            "image_resize": family_segmenter(model.segmenter).image_resize_path(), "compute_dtype": args.compute_dtype}


# ---- instances ---------------------------------------------------------------------------

def _folder_name(images: pathlib.Path) -> str:
    parent = images.resolve().parent
    return parent.name or images.resolve().name


def _dataset_items(args) -> tuple[list[str], list[pathlib.Path]]:
    """(names, folders) of ``--datasets``: an entry that is an existing folder is a folder, else a name."""
    items = [item.strip() for item in str(args.datasets or "").split(",") if item.strip()]
    folders = [pathlib.Path(os.path.expanduser(item)) for item in items if os.path.isdir(os.path.expanduser(item))]
    names = [item for item in items if not os.path.isdir(os.path.expanduser(item))]
    return names, folders


def _refuse_folder_flags_without_folder(args, folders: Sequence[pathlib.Path]) -> None:
    """--mask-rule / --mask-ignore read plain folders' masks; with benchmarks alone they would do nothing: refused."""
    from jaxseg_robust.data.datasets import find_kind  # noqa: PLC0415
    from jaxseg_robust.data.masks_io import is_default_rule  # noqa: PLC0415

    if args.folder or any(find_kind(folder.name) is None for folder in folders):
        return
    try:
        changed = not is_default_rule(args.mask_rule)
    except ValueError as error:
        raise CommandError(f"--mask-rule: {error}") from None
    for flag, given in (("--mask-rule", changed), ("--mask-ignore", args.mask_ignore is not None)):
        if given:
            raise CommandError(f"{flag} applies to --folder masks (plain image/mask folders); the --datasets "
                               "benchmarks decode their masks by their own rule (give the masks as --folder "
                               "IMAGES MASKS to choose one)")


def _named_groups(args, names: Sequence[str], on_bad_pair: str) -> list[tuple[str, list]]:
    """(dataset name, refs) of the benchmark names of ``--datasets`` under ``--data-root``."""
    from jaxseg_robust.data.datasets import list_dataset_folder, resolve_datasets  # noqa: PLC0415

    sources = resolve_datasets(",".join(names), args.data_root) if names else []
    tetris_cap = getattr(args, "tetris_max_side", None)
    if (tetris_cap is not None and tetris_cap != getattr(args, "tetris_max_side_default", None)
            and not any(source.kind == "tetris" for source in sources)):
        raise CommandError("--tetris-max-side is the TETRIS dataset's protocol cap and no TETRIS dataset "
                           "is listed; the size guard of every image is --max-side")
    groups = []
    for source in sources:
        options = {"name": source.name, "on_bad_pair": on_bad_pair}
        if source.kind == "tetris" and tetris_cap is not None:
            options["max_side"] = tetris_cap
        groups.append((source.name, list_dataset_folder(source.kind, source.path, **options)))
    return groups


def _folder_groups(args, folders: Sequence[pathlib.Path], on_bad_pair: str) -> list[tuple[str, list]]:
    """(dataset name, refs) of the folders in ``--datasets`` and of every ``--folder IMAGES MASKS``."""
    from jaxseg_robust.data.datasets import find_kind, list_dataset_folder  # noqa: PLC0415

    groups = []
    for folder in folders:  # a benchmark folder by its name, else images/ + masks/ with --mask-rule
        kind = find_kind(folder.name)
        options = {"rule": args.mask_rule, "ignore_value": args.mask_ignore} if kind is None else {}
        groups.append((folder.name, list_dataset_folder("folder" if kind is None else kind.name, folder,
                                                        name=folder.name, on_bad_pair=on_bad_pair, **options)))
    for images_text, masks_text in getattr(args, "folder", None) or []:
        images, masks = pathlib.Path(images_text), pathlib.Path(masks_text)
        for label, path in (("IMAGES", images), ("MASKS", masks)):
            if not path.is_dir():
                raise CommandError(f"--folder {label} {path} is not a directory")
        name = _folder_name(images)
        groups.append((name, list_dataset_folder("folder", images.resolve().parent, name=name,
                                                 images_dir=str(images.resolve()), masks_dir=str(masks.resolve()),
                                                 on_bad_pair=on_bad_pair, rule=args.mask_rule,
                                                 ignore_value=args.mask_ignore)))
    return groups


def load_instances(args) -> list:
    """Lists every instance of ``--datasets`` and ``--folder`` (lazy `InstanceRef`s, ``--limit`` and the
    ``--max-side`` size guard applied: `jaxseg_robust.data.size_guard.guard_size`).

    ``--datasets`` entries are benchmark names under ``--data-root``, or
    existing folders (read as the benchmark their name says, else as
    ``images/ + masks/`` with ``--mask-rule``). Listing problems follow
    ``--on-bad-pair`` (default "fail": failing instances, each naming its file,
    recorded as failed by the run).

    Raises:
      CommandError: no dataset given, unknown names, missing folders, a dataset
        listed twice, bad mask rules.
    """
    from jaxseg_robust.data.datasets import ON_BAD_PAIR_HINT, DatasetWarning, guard_size  # noqa: PLC0415

    if not args.datasets and not getattr(args, "folder", None):
        raise CommandError("give --datasets NAMES and/or --folder IMAGES MASKS")
    names, folders = _dataset_items(args)
    _refuse_folder_flags_without_folder(args, folders)
    on_bad_pair = getattr(args, "on_bad_pair", "fail")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always", DatasetWarning)
            groups = _named_groups(args, names, on_bad_pair) + _folder_groups(args, folders, on_bad_pair)
    except CommandError:
        raise
    except ValueError as error:  # DatasetError is a ValueError
        raise CommandError(str(error).replace(ON_BAD_PAIR_HINT, "--on-bad-pair skip or fail to go on")) from None
    listed = [name for name, _ in groups]
    duplicated = sorted({name for name in listed if listed.count(name) > 1})
    if duplicated:
        raise CommandError(f"dataset name(s) {duplicated} given twice (a --folder is named after the "
                           "parent of its IMAGES folder)")
    instances = []
    for _, refs in groups:
        instances.extend(refs if args.limit is None else refs[:args.limit])
    instances = guard_size(instances, getattr(args, "max_side", DEFAULT_MAX_SIDE))
    if not instances:
        raise CommandError("the datasets hold no instances")
    for line in resize_lines(instances):
        print(line, file=sys.stderr)
    return instances


def resize_lines(instances: Sequence) -> list[str]:
    """One console line per instance the size guard or the TETRIS cap downsizes, naming it and both sizes.

    E.g. ``resized DAVIS/bear: 2160x3840 -> 1152x2048 (--max-side 2048)``; the record's ``"resized"``
    field says the same (`jaxseg_robust.data.size_guard.ResizedInstanceRef`).
    """
    from jaxseg_robust.data.instances import instance_name  # noqa: PLC0415
    from jaxseg_robust.data.size_guard import TETRIS_CAP_METHOD, ResizedInstanceRef  # noqa: PLC0415

    lines = []
    for ref in instances:
        if isinstance(ref, ResizedInstanceRef):
            flag = "--tetris-max-side" if ref.method == TETRIS_CAP_METHOD else "--max-side"
            lines.append(f"resized {instance_name(ref.dataset, ref.id)}: {ref.original_height}x{ref.original_width}"
                         f" -> {ref.height}x{ref.width} ({flag} {ref.max_side})")
    return lines


def dataset_names(instances: Sequence) -> list[str]:
    """Dataset names in first-seen order."""
    return list(dict.fromkeys(instance.dataset for instance in instances))


