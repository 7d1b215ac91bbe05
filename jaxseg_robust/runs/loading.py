"""Loading what a run evaluates: the model of a `ModelSpec` (`load_model`) and the instances of a `DataSpec`
(`load_instances`).

Models: a converted directory (``python -m ports ...``) or a zoo name whose
weights were converted into ``$JAXSEG_ROBUST_MODELS``; zoo test models that
have no official weights (``sam_tiny``, ``mobile_sam_tiny``, ``sam_hq_tiny``)
and any name given a ``random_seed`` get seeded random weights (the run's
model fingerprint records exactly which).

Datasets: each listing problem (image without mask, unreadable header, image
and mask sizes that differ) becomes an instance that the run records as
failed with an error naming the file (``on_bad_pair="fail"``, the default), so
the run goes on and the exit code says "partial" (1).

Errors are `jaxseg_robust.runs.spec.RunError`s naming the spec's fields.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import warnings
from collections.abc import Callable, Sequence

from jaxseg_robust.runs.spec import DataSpec, ModelSpec, RunError

RANDOM_ONLY_HINT = "<none"  # zoo checkpoint hints of test models without official weights


@dataclasses.dataclass(frozen=True)
class LoadedModel:
    """A promptable model ready for a batch program.

    Attributes:
      name: the `ModelSpec` name.
      segmenter: the Segmenter (static).
      params: parameter pytree (replicated over the data mesh).
      fingerprint: ``sha256:...`` of the weights (converted directory files or random params).
      source: ``"random:<seed>"`` or the converted directory.
      compute_dtype: the `ModelSpec`'s compute dtype (None: the model's).
    """

    name: str
    segmenter: object
    params: object
    fingerprint: str
    source: str
    compute_dtype: str | None = None


def _random_only(name: str) -> bool:
    from jaxseg_robust.models import zoo  # noqa: PLC0415

    try:
        return zoo.get(name).checkpoint_hint.startswith(RANDOM_ONLY_HINT)
    except ValueError:
        return False


def load_model(spec: ModelSpec, mesh=None) -> LoadedModel:
    """Loads the model of ``spec``: converted weights, or seeded random weights (see the module docstring).

    Raises:
      RunError: unknown name, weights not converted, damaged directory (naming ``{model}``).
    """
    from jaxseg_robust.models import zoo  # noqa: PLC0415
    from jaxseg_robust.runner.fingerprints import fingerprint_params, fingerprint_path  # noqa: PLC0415
    from jaxseg_robust.runner.sharding import data_mesh, replicate  # noqa: PLC0415

    mesh = data_mesh() if mesh is None else mesh
    name = spec.name
    is_dir = pathlib.Path(name).expanduser().is_dir()
    try:
        if not is_dir and (spec.random_seed is not None or _random_only(name)):
            seed = 0 if spec.random_seed is None else int(spec.random_seed)
            segmenter = zoo.segmenter(name, compute_dtype=spec.compute_dtype)
            params = segmenter.init(seed)
            return LoadedModel(name, segmenter, replicate(params, mesh), fingerprint_params(params), f"random:{seed}",
                               spec.compute_dtype)
        if spec.random_seed is not None:
            raise RunError("{random_seed} takes a zoo name, not a converted directory")
        segmenter, params, _ = zoo.load_params(name, compute_dtype=spec.compute_dtype)
        path = zoo.resolve(name)
        return LoadedModel(name, segmenter, replicate(params, mesh), fingerprint_path(path), str(path),
                           spec.compute_dtype)
    except RunError:
        raise
    except (ValueError, FileNotFoundError, OSError) as error:
        raise RunError(f"{{model}} {name}: {error}") from None
    except (KeyError, TypeError) as error:  # a config.json that does not describe its family
        raise RunError(f"{{model}} {name}: {type(error).__name__}: {error}") from None


def refuse_click_only(model: LoadedModel, what: str) -> None:
    """RunError naming the model and the reason when ``what`` needs box prompts and the model's family
    takes clicks only (`jaxseg_robust.models.base.FamilyRules.accepts_boxes`)."""
    from jaxseg_robust.models.base import family_rules  # noqa: PLC0415

    rules = family_rules(model.segmenter)
    if not rules.accepts_boxes:
        raise RunError(f"{{model}} {model.name}: {what} needs box prompts, and the {rules.family} family takes "
                       "clicks only (click-map models have no box input); use tetris, grid --kind click "
                       "or rclicks")


def resolve_threshold(value: float | None, model: LoadedModel) -> float:
    """A threshold setting, or the model family's ``probability_threshold`` when it is None."""
    return float(model.segmenter.probability_threshold) if value is None else float(value)


def model_config(protocol: str, model: LoadedModel, **variant) -> dict:
    """The manifest config entries every prompt protocol records, in this order.

    ``{"protocol", **variant (e.g. mode=... or kind=...), "model", "model_source",
    "image_resize", "compute_dtype"}``; the protocol adds its settings. The
    weights themselves are pinned by the manifest's model fingerprint: a
    converted model's path is recorded as "converted" (not the path), so a moved
    models folder still resumes; random weights as "random:<seed>".
    """
    from jaxseg_robust.models.base import family_segmenter  # noqa: PLC0415

    source = model.source if model.source.startswith("random:") else "converted"
    return {"protocol": protocol, **variant, "model": model.name, "model_source": source,
            "image_resize": family_segmenter(model.segmenter).image_resize_path(), "compute_dtype": model.compute_dtype}


# ---- instances ---------------------------------------------------------------------------

def _folder_name(images: pathlib.Path) -> str:
    parent = images.resolve().parent
    return parent.name or images.resolve().name


def _dataset_items(data: DataSpec) -> tuple[list[str], list[pathlib.Path]]:
    """(names, folders) of ``datasets``: an entry that is an existing folder is a folder, else a name."""
    items = [item.strip() for item in data.datasets if item.strip()]
    folders = [pathlib.Path(os.path.expanduser(item)) for item in items if os.path.isdir(os.path.expanduser(item))]
    names = [item for item in items if not os.path.isdir(os.path.expanduser(item))]
    return names, folders


def _refuse_folder_rules_without_folder(data: DataSpec, folders: Sequence[pathlib.Path]) -> None:
    """mask_rule / mask_ignore read plain folders' masks; with benchmarks alone they would do nothing: refused."""
    from jaxseg_robust.data.datasets import find_kind  # noqa: PLC0415
    from jaxseg_robust.data.masks_io import is_default_rule  # noqa: PLC0415

    if data.folders or any(find_kind(folder.name) is None for folder in folders):
        return
    try:
        changed = not is_default_rule(data.mask_rule)
    except ValueError as error:
        raise RunError(f"{{mask_rule}}: {error}") from None
    for field, given in (("mask_rule", changed), ("mask_ignore", data.mask_ignore is not None)):
        if given:
            raise RunError(f"{{{field}}} applies to {{folders}} masks (plain image/mask folders); the {{datasets}} "
                           "benchmarks decode their masks by their own rule (give the masks as {folders} "
                           "IMAGES MASKS to choose one)")


def _named_groups(data: DataSpec, names: Sequence[str], tetris_cap: int | None,
                  default_cap: int | None) -> list[tuple[str, list]]:
    """(dataset name, refs) of the benchmark names of ``datasets`` under ``data_root``."""
    from jaxseg_robust.data.datasets import list_dataset_folder, resolve_datasets  # noqa: PLC0415

    sources = resolve_datasets(",".join(names), data.data_root) if names else []
    if (tetris_cap is not None and tetris_cap != default_cap
            and not any(source.kind == "tetris" for source in sources)):
        raise RunError("{tetris_max_side} is the TETRIS dataset's protocol cap and no TETRIS dataset "
                       "is listed; the size guard of every image is {max_side}")
    groups = []
    for source in sources:
        options = {"name": source.name, "on_bad_pair": data.on_bad_pair}
        if source.kind == "tetris" and tetris_cap is not None:
            options["max_side"] = tetris_cap
        groups.append((source.name, list_dataset_folder(source.kind, source.path, **options)))
    return groups


def _folder_groups(data: DataSpec, folders: Sequence[pathlib.Path]) -> list[tuple[str, list]]:
    """(dataset name, refs) of the folders in ``datasets`` and of every ``folders`` pair."""
    from jaxseg_robust.data.datasets import find_kind, list_dataset_folder  # noqa: PLC0415

    groups = []
    for folder in folders:  # a benchmark folder by its name, else images/ + masks/ with mask_rule
        kind = find_kind(folder.name)
        options = {"rule": data.mask_rule, "ignore_value": data.mask_ignore} if kind is None else {}
        groups.append((folder.name, list_dataset_folder("folder" if kind is None else kind.name, folder,
                                                        name=folder.name, on_bad_pair=data.on_bad_pair, **options)))
    for images_text, masks_text in data.folders:
        images, masks = pathlib.Path(images_text), pathlib.Path(masks_text)
        for label, path in (("IMAGES", images), ("MASKS", masks)):
            if not path.is_dir():
                raise RunError(f"{{folders}} {label} {path} is not a directory")
        name = _folder_name(images)
        groups.append((name, list_dataset_folder("folder", images.resolve().parent, name=name,
                                                 images_dir=str(images.resolve()), masks_dir=str(masks.resolve()),
                                                 on_bad_pair=data.on_bad_pair, rule=data.mask_rule,
                                                 ignore_value=data.mask_ignore)))
    return groups


def load_instances(data: DataSpec, *, default_tetris_max_side: int | None = None,
                   say: Callable[[str], None] | None = None) -> list:
    """Lists every instance of ``data`` (lazy `InstanceRef`s, ``limit`` and the ``max_side`` size guard
    applied: `jaxseg_robust.data.size_guard.guard_size`).

    ``datasets`` entries are benchmark names under ``data_root``, or existing
    folders (read as the benchmark their name says, else as ``images/ +
    masks/`` with ``mask_rule``). Listing problems follow ``on_bad_pair``
    (default "fail": failing instances, each naming its file, recorded as
    failed by the run).

    Args:
      data: the data spec.
      default_tetris_max_side: the protocol's TETRIS cap when ``data.tetris_max_side`` is None (RClicks: 2048).
      say: told one line per resized instance (`resize_lines`; None: silent).

    Raises:
      RunError: no dataset given, unknown names, missing folders, a dataset listed twice, bad mask rules.
    """
    from jaxseg_robust.data.datasets import ON_BAD_PAIR_HINT, DatasetWarning, guard_size  # noqa: PLC0415

    if not data.datasets and not data.folders:
        raise RunError("give {datasets} NAMES and/or {folders} IMAGES MASKS")
    names, folders = _dataset_items(data)
    _refuse_folder_rules_without_folder(data, folders)
    cap = default_tetris_max_side if data.tetris_max_side is None else data.tetris_max_side
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always", DatasetWarning)
            groups = _named_groups(data, names, cap, default_tetris_max_side) + _folder_groups(data, folders)
    except RunError:
        raise
    except ValueError as error:  # DatasetError is a ValueError
        raise RunError(str(error).replace(ON_BAD_PAIR_HINT, "{on_bad_pair} skip or fail to go on")) from None
    listed = [name for name, _ in groups]
    duplicated = sorted({name for name in listed if listed.count(name) > 1})
    if duplicated:
        raise RunError(f"dataset name(s) {duplicated} given twice (a {{folders}} entry is named after the "
                       "parent of its IMAGES folder)")
    instances = []
    for _, refs in groups:
        instances.extend(refs if data.limit is None else refs[:data.limit])
    instances = guard_size(instances, data.max_side)
    if not instances:
        raise RunError("the datasets hold no instances")
    for line in resize_lines(instances):
        if say is not None:
            say(line)
    return instances


def resize_lines(instances: Sequence) -> list[str]:
    """One line per instance the size guard or the TETRIS cap downsizes, naming it and both sizes.

    E.g. ``resized DAVIS/bear: 2160x3840 -> 1152x2048 ({max_side} 2048)``; the record's ``"resized"``
    field says the same (`jaxseg_robust.data.size_guard.ResizedInstanceRef`).
    """
    from jaxseg_robust.data.instances import instance_name  # noqa: PLC0415
    from jaxseg_robust.data.size_guard import TETRIS_CAP_METHOD, ResizedInstanceRef  # noqa: PLC0415

    lines = []
    for ref in instances:
        if isinstance(ref, ResizedInstanceRef):
            field = "{tetris_max_side}" if ref.method == TETRIS_CAP_METHOD else "{max_side}"
            lines.append(f"resized {instance_name(ref.dataset, ref.id)}: {ref.original_height}x{ref.original_width}"
                         f" -> {ref.height}x{ref.width} ({field} {ref.max_side})")
    return lines


def matched_first_round(clicks_csv, instances: Sequence, match: Callable):
    """``match(table, instances)`` of the RClicks clicks CSV at ``clicks_csv``
    (`jaxseg_robust.clicksim.user_clicks.first_round_clicks` or ``first_round_tasks``).

    Raises:
      RunError: naming ``{clicks_csv}``: the file cannot be read, or no first-round click matches an instance.
    """
    from jaxseg_robust.clicksim.clicks_csv import read_clicks_csv  # noqa: PLC0415

    try:
        table = read_clicks_csv(clicks_csv)
    except (ValueError, OSError) as error:
        raise RunError(f"{{clicks_csv}}: {error}") from None
    matched = match(table, instances)
    if not matched:
        raise RunError(f"{{clicks_csv}} {clicks_csv}: no first-round clicks match the instances "
                       "(dataset names GrabCut/Berkeley/DAVIS/COCO/TETRIS, image stems, object codes)")
    return matched


def dataset_names(instances: Sequence) -> list[str]:
    """Dataset names in first-seen order."""
    return list(dict.fromkeys(instance.dataset for instance in instances))
