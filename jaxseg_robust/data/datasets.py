"""Dataset loaders: RITM-style benchmark folders and any folder of image/mask pairs.

Every loader lists a dataset folder and returns lazy `InstanceRef`s (see
`jaxseg_robust.data.instances`): listing pairs files by stem and reads only
image/mask *headers* (sizes); pixels are decoded in ``ref.load()``. The one
exception is a multi-object kind (``tetris``), whose instance list depends on
the ids present in each mask, so listing decodes the masks (optionally cached
in a JSON index, ``objects_index=``).

Kinds (``KINDS``; docs/protocols/tetris.md §6 and rclicks.md §1.3, which follow
the RITM loaders; "channel c" below means channel c of OpenCV's BGR read):

========== =========================================== =================================================
kind       folders (first pair that exists)            ground truth per instance
========== =========================================== =================================================
grabcut    ``data_GT/ + boundary_GT/`` or              channel 0 (blue): 128 -> ignore (-1); > 128 -> 1;
           ``images/ + masks/``                        1 -> 1 (RITM keeps the value 1, which is its
                                                       object id); anything else -> 0. One object.
berkeley   ``images/ + masks/``                        as grabcut. One object per mask file.
davis      ``img/ + gt/`` or ``images/ + masks/``      max over B, G, R > 0 -> 1, else 0. One object.
coco_mval  ``img/ + gt/`` or ``images/ + masks/``      as davis.
tetris     ``images/ + masks/``                        id = B*65536 + G*256 + R; one instance per
                                                       non-zero id (ascending); image and id map capped
                                                       to longest side ``max_side`` (see below).
folder     ``images/ + masks/`` (configurable)         `masks_io` rule (default ``>128``) and optional
                                                       ignore value. One object per mask.
========== =========================================== =================================================

Decoding follows OpenCV's ``imread(IMREAD_COLOR)`` as the reference loaders do,
computed with Pillow (OpenCV is not a dependency): palette masks are read as
their palette *colours*, grey masks as three equal channels, the alpha channel
is dropped, 16-bit files keep their high byte, and the EXIF orientation of a
file is applied. Pillow gives RGB, so OpenCV's channel 0 (blue) is Pillow's
channel 2 and the packed TETRIS id is ``R + 256*G + 65536*B`` of the Pillow
read. The ``folder`` kind reads masks with `jaxseg_robust.data.masks_io`
(grey value, palette *index*, or max over R, G, B; no EXIF orientation).

Reconciliation with the project's real sample images and masks (checked by
tests/test_data_datasets.py): its MANIFESTs word the rules differently —
GrabCut "fg ==255, ignore ==128", Berkeley "channel 0 > 128" (channel 0 of the
OpenCV read = blue), DAVIS "palette index != 0", COCO-MVal "value > 128" —
and give the same masks as the rules above on every shared file (their
values are {0, 128, 255}, grey or magenta RGB, palette 0..3 with a black
index 0, and {0, 255}). The shared folders all use ``images/ + masks/``.

TETRIS resizing (``max_side``, default `TETRIS_MAX_SIDE` = 1024 as the BREPS
loader; RClicks uses `RCLICKS_TETRIS_MAX_SIDE` = 2048; 0 or None keeps the
original size). The longest side is capped (never enlarged):
``H > W: h' = min(H, m), w' = int(W / H * h' + 0.5)``, else
``w' = min(W, m), h' = int(H / W * w' + 0.5)``. The image is resized with
OpenCV's uint8 ``INTER_LINEAR`` (no antialiasing) and each id's binary mask
likewise, an id kept where the resized uint8 value is non-zero, higher ids
overwriting lower ones; ids that vanish are not instances. `resize_bilinear_uint8`
reproduces OpenCV's fixed-point arithmetic (11-bit weights, the vectorised
rounding of its x86 build) bit for bit (tested against opencv-python 5.0, x86-64).

Instance ids: the image stem for single-object kinds, ``"<stem>#<id>"`` for
multi-object kinds (`split_instance_id`). Instances come sorted by image file
name (the reference order), objects of an image by ascending id.

Problems and where they surface:
  * immediately (`DatasetError`): unknown kind or name, no datasets root,
    missing dataset / image / mask folder, no image in the folder, bad options;
  * at listing, by ``on_bad_pair``: an image without a mask or a mask without
    an image, two files with one stem, an unreadable header, image and mask
    sizes that differ. ``"error"`` (default) raises one `DatasetError`
    listing every problem (each names its file); ``"skip"`` drops those pairs
    with a `DatasetWarning`; ``"fail"`` keeps each affected image as an
    `InstanceRef` whose ``load()`` raises the problem, so a run records it as
    failed (an unreadable image header gets the declared size 1 x 1; a mask
    without an image is only warned about, as it is no instance);
  * at ``load()`` (`InstanceError`, which the runner records as a failed
    instance): pixels that fail to decode (e.g. a truncated file), an empty
    object (unless ``allow_empty=True``; the message gives the rule and the
    values found in the file), a file changed since listing;
  * at ``load()``, as a `DatasetWarning` naming the file (once per file and
    process): a mask that is not close to two-valued (`masks_io.two_valued_warning`;
    a photo or noise passed as a mask; ``davis`` / ``coco_mval`` allow up to
    `masks_io.MAX_LABELS` object colours, ``grabcut`` / ``berkeley`` leave out the
    ignore value 128). A ``folder`` rule is applied to every file the same way:
    a 0/1 label or palette-id mask under the default ``>128`` is an empty
    object, failed at ``load()`` with the values found and the rule ``>0``
    that reads them (`masks_io.empty_mask_hint`);
  * a multi-object mask without any object gives no instance and a
    `DatasetWarning`.

Named datasets (``--datasets GrabCut,Berkeley``, RITM style) are resolved by
`resolve_datasets` against a datasets root (argument, else ``$JAXSEG_ROBUST_DATA``):
``<root>/<folder>`` whose name matches the kind case-insensitively ignoring
``_``/``-`` (``grabcut``, ``GrabCut``, ``COCO_MVal``, ...), or an explicit
mapping ``name -> path`` like RITM's config.yml (``GRABCUT_PATH: ...``).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import os
import pathlib
import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np

from jaxseg_robust.data.instances import (
    InstanceRef,
    instance_name,
)
from jaxseg_robust.data.masks_io import (
    MaskRule,
    parse_rule,
    read_mask_size,
)
from jaxseg_robust.data.dataset_loaders import (  # noqa: F401 - IMAGE_SUFFIXES is part of this module's API
    IMAGE_SUFFIXES,
    _check_headers,
    _failing_loader,
    _index_key,
    _load_packed_object,
    _load_ritm_single,
    _load_rule_single,
    _mask_object_ids,
    _Pair,
    _pair_files,
    _read_index,
    _write_index,
)
from jaxseg_robust.data.image_files import (  # noqa: F401 - re-exported: the decoding API of the datasets
    DatasetError,
    DatasetWarning,
    capped_size,
    decode_davis_gt,
    decode_grabcut_gt,
    packed_ids,
    read_image_rgb,
    read_image_size,
    resize_bilinear_uint8,
    resize_id_map,
    unique_nonzero_ids,
)
from jaxseg_robust.data.size_guard import (  # noqa: F401 - re-exported: the size guard of every command
    DEFAULT_MAX_SIDE,
    MAP_BACK,
    SIZE_GUARD_METHOD,
    TETRIS_CAP_METHOD,
    ResizedInstanceRef,
    _capped_ref,
    guard_size,
)


DATA_ENV_VAR = "JAXSEG_ROBUST_DATA"
OBJECT_ID_SEPARATOR = "#"
TETRIS_MAX_SIDE = 1024
RCLICKS_TETRIS_MAX_SIDE = 2048
ON_BAD_PAIR_MODES = ("error", "skip", "fail")
ON_BAD_PAIR_HINT = "on_bad_pair='skip' or 'fail' to go on"  # the CLI says it with its flag's spelling
UNREADABLE_DECLARED_SIZE = (1, 1)


# ----------------------------------------------------------------------------- the kinds


@dataclasses.dataclass(frozen=True)
class DatasetKind:
    """A registered dataset kind.

    Attributes:
      name: canonical name (lower case), used as the default dataset name.
      layouts: candidate (images folder, masks folder) names, first match wins.
      decoder: ``"grabcut"``, ``"davis"``, ``"rule"`` (masks_io) or ``"packed"`` (RGB-packed ids).
      aliases: other accepted spellings for ``--datasets`` (compared after `normalize_name`).
      description: one line for help texts.
    """

    name: str
    layouts: tuple[tuple[str, str], ...]
    decoder: str
    aliases: tuple[str, ...] = ()
    description: str = ""

    @property
    def multi_object(self) -> bool:
        """True when one mask holds several objects (one instance per object id)."""
        return self.decoder == "packed"


KINDS: dict[str, DatasetKind] = {
    kind.name: kind
    for kind in (
        DatasetKind("grabcut", (("data_GT", "boundary_GT"), ("images", "masks")), "grabcut",
                    description="GrabCut (50): 128 band ignored, > 128 object"),
        DatasetKind("berkeley", (("images", "masks"),), "grabcut",
                    description="Berkeley (96 images / 100 objects): decoded as GrabCut"),
        DatasetKind("davis", (("img", "gt"), ("images", "masks")), "davis",
                    description="DAVIS-345: any non-zero colour is object"),
        DatasetKind("coco_mval", (("img", "gt"), ("images", "masks")), "davis", aliases=("coco", "cocomval"),
                    description="COCO-MVal (800): decoded as DAVIS"),
        DatasetKind("tetris", (("images", "masks"),), "packed",
                    description="TETRIS (2000 images / 2531 objects): RGB-packed ids, longest side capped"),
        DatasetKind("folder", (("images", "masks"),), "rule",
                    description="any images/ + masks/ folder, masks_io rule (default >128) and ignore value"),
    )
}


def normalize_name(name: str) -> str:
    """Lower case without ``_``, ``-``, spaces and a trailing ``_PATH`` (``"COCO_MVAL_PATH"`` -> ``"cocomval"``)."""
    text = str(name).strip()
    if text.upper().endswith("_PATH"):
        text = text[: -len("_PATH")]
    return "".join(ch for ch in text.lower() if ch not in "_- ")


def find_kind(name: str) -> DatasetKind | None:
    """The registered kind called ``name`` (case-insensitive, aliases accepted), or None."""
    wanted = normalize_name(name)
    for kind in KINDS.values():
        if wanted == normalize_name(kind.name) or wanted in {normalize_name(a) for a in kind.aliases}:
            return kind
    return None


def _find_layout(kind: DatasetKind, folder: pathlib.Path, images_dir, masks_dir) -> tuple[pathlib.Path, pathlib.Path]:
    if not folder.is_dir():
        raise DatasetError(f"{kind.name}: dataset folder {folder} does not exist or is not a directory")
    if images_dir is not None or masks_dir is not None:
        default_images, default_masks = kind.layouts[0]
        images = folder / (images_dir if images_dir is not None else default_images)
        masks = folder / (masks_dir if masks_dir is not None else default_masks)
        for label, path in (("images", images), ("masks", masks)):
            if not path.is_dir():
                raise DatasetError(f"{kind.name}: {label} folder {path} does not exist")
        return images, masks
    found = [(folder / i, folder / m) for i, m in kind.layouts if (folder / i).is_dir() and (folder / m).is_dir()]
    tried = ", ".join(f"{i}/ + {m}/" for i, m in kind.layouts)
    if not found:
        raise DatasetError(f"{kind.name}: no image/mask folders in {folder} (looked for {tried})")
    if len(found) > 1:
        raise DatasetError(f"{kind.name}: several image/mask folder pairs in {folder} ({tried}); "
                           "choose one with images_dir= and masks_dir=")
    return found[0]


def _declared_size(image_path: pathlib.Path) -> tuple[int, int]:
    """The header size of an image, or `UNREADABLE_DECLARED_SIZE` when the header cannot be read."""
    try:
        return read_image_size(image_path)
    except DatasetError:
        return UNREADABLE_DECLARED_SIZE


def _handle_problems(dataset: str, folder: pathlib.Path, problems: list[tuple[_Pair, str]], on_bad_pair: str,
                     sizes: Mapping[str, tuple[int, int]]) -> list[InstanceRef]:
    """Raises, warns, or turns listing problems into failing refs (see the module docstring)."""
    if not problems:
        return []
    lines = "\n  ".join(message for _, message in problems)
    if on_bad_pair == "error":
        raise DatasetError(f"{dataset}: {len(problems)} problem(s) listing {folder} "
                           f"({ON_BAD_PAIR_HINT}):\n  {lines}")
    failing, warned = [], []
    for pair, message in problems:
        if on_bad_pair == "fail" and pair.image is not None:
            height, width = sizes.get(pair.stem) or _declared_size(pair.image)
            name = instance_name(dataset, pair.stem)
            sources = tuple(str(p) for p in (pair.image, pair.mask) if p is not None)
            failing.append(InstanceRef(id=pair.stem, height=height, width=width, dataset=dataset,
                                       loader=functools.partial(_failing_loader, name, message),
                                       source_paths=sources))
        else:
            warned.append(message)
    if warned:
        joined = "\n  ".join(warned)
        warnings.warn(f"{dataset}: skipped {len(warned)} file(s) listing {folder}:\n  {joined}",
                      DatasetWarning, stacklevel=4)
    return failing


def split_instance_id(instance_id: str) -> tuple[str, int | None]:
    """(image stem, object id or None) of an instance id made by these loaders (``"stem"`` or ``"stem#id"``)."""
    stem, separator, tail = str(instance_id).rpartition(OBJECT_ID_SEPARATOR)
    if separator and tail.isdigit():
        return stem, int(tail)
    return str(instance_id), None


def _check_choice(name: str, value, choices) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")


def list_dataset_folder(
    kind: str | DatasetKind,
    folder,
    *,
    name: str | None = None,
    images_dir: str | None = None,
    masks_dir: str | None = None,
    on_bad_pair: str = "error",
    allow_empty: bool = False,
    rule: str | MaskRule = ">128",
    ignore_value: int | None = None,
    max_side: int | None | str = "default",
    objects_index=None,
    workers: int | None = None,
) -> list[InstanceRef]:
    """Lists one dataset folder of a given kind as lazy instances.

    Args:
      kind: a registered kind (`KINDS`) or its name.
      folder: the dataset folder (holding the images and masks folders).
      name: dataset name stored in each instance (default: the kind's name,
        for ``folder`` the folder's base name).
      images_dir, masks_dir: override the kind's folder names.
      on_bad_pair: ``"error"``, ``"skip"`` or ``"fail"`` (see the module docstring).
      allow_empty: keep single-object instances whose mask has no object
        pixel (default: their ``load()`` raises).
      rule, ignore_value: ``folder`` kind only: `masks_io` foreground rule and
        the mask value marking ignore pixels (e.g. 128).
      max_side: ``tetris`` only: longest-side cap in pixels (None/0: none;
        ``"default"``: `TETRIS_MAX_SIDE`).
      objects_index: ``tetris`` only: JSON file caching each mask's object
        ids (keyed by mask name, size, mtime and cap); read if present,
        (re)written when entries changed.
      workers: ``tetris`` only: threads decoding masks while listing
        (default min(8, CPUs)).

    Returns:
      `InstanceRef`s sorted by image file name, then object id; declared sizes
      are the evaluation-frame sizes (capped for ``tetris``).

    Raises:
      DatasetError: listing problems (see the module docstring).
      ValueError: bad option values, naming the argument.
    """
    kind_spec = kind if isinstance(kind, DatasetKind) else find_kind(kind)
    if kind_spec is None:
        raise DatasetError(f"unknown dataset kind {kind!r}; known kinds: {', '.join(KINDS)}")
    _check_choice("on_bad_pair", on_bad_pair, ON_BAD_PAIR_MODES)
    rule = parse_rule(rule) if isinstance(rule, str) else rule
    if not isinstance(rule, MaskRule):
        raise ValueError(f"rule must be a mask rule like '>128', got {rule!r}")
    if ignore_value is not None and (isinstance(ignore_value, bool) or not isinstance(ignore_value, (int, np.integer))):
        raise ValueError(f"ignore_value must be an int or None, got {ignore_value!r}")
    if kind_spec.decoder != "rule" and (str(rule) != ">128" or ignore_value is not None):
        raise ValueError(f"rule and ignore_value apply to the 'folder' kind only, not {kind_spec.name!r}")
    if not kind_spec.multi_object and (max_side != "default" or objects_index is not None):
        raise ValueError(f"max_side and objects_index apply to multi-object kinds only, not {kind_spec.name!r}")
    max_side = TETRIS_MAX_SIDE if max_side == "default" else max_side
    capped_size(1, 1, max_side)  # validates max_side
    folder = pathlib.Path(folder)
    dataset = name if name is not None else (folder.resolve().name if kind_spec.name == "folder" else kind_spec.name)
    if not isinstance(dataset, str) or not dataset:
        raise ValueError(f"name must be a non-empty str, got {dataset!r}")
    images_path, masks_path = _find_layout(kind_spec, folder, images_dir, masks_dir)
    pairs, problems = _pair_files(images_path, masks_path)
    if not pairs and not problems:
        raise DatasetError(f"{dataset}: no image files ({', '.join(IMAGE_SUFFIXES)}) in {images_path}")

    mask_size_reader = read_mask_size if kind_spec.decoder == "rule" else read_image_size
    checked: list[tuple[_Pair, tuple[int, int]]] = []
    sizes: dict[str, tuple[int, int]] = {}
    for pair in pairs:
        size, problem = _check_headers(pair, mask_size_reader)
        if size is not None:
            sizes[pair.stem] = size
        if problem is None:
            checked.append((pair, size))
        else:
            problems.append((pair, problem))

    if kind_spec.multi_object:
        refs, object_problems = _list_packed(dataset, checked, max_side, objects_index, workers)
        problems.extend(object_problems)
    else:
        refs = [_single_ref(kind_spec, dataset, pair, size, rule, ignore_value, allow_empty) for pair, size in checked]
    refs.extend(_handle_problems(dataset, folder, problems, on_bad_pair, sizes))
    refs.sort(key=lambda ref: (_image_name_of(ref), split_instance_id(ref.id)[1] or 0))
    return refs


def _image_name_of(ref: InstanceRef) -> str:
    return pathlib.Path(ref.source_paths[0]).name if ref.source_paths else ref.id


def _single_ref(kind: DatasetKind, dataset: str, pair: _Pair, size, rule, ignore_value, allow_empty) -> InstanceRef:
    image_path, mask_path = str(pair.image), str(pair.mask)
    if kind.decoder == "rule":
        loader = functools.partial(_load_rule_single, dataset, pair.stem, image_path, mask_path, rule,
                                   ignore_value, allow_empty)
    else:
        loader = functools.partial(_load_ritm_single, dataset, pair.stem, image_path, mask_path, kind.decoder,
                                   allow_empty)
    return InstanceRef(id=pair.stem, height=size[0], width=size[1], loader=loader, dataset=dataset,
                       source_paths=(image_path, mask_path))


def _list_packed(dataset: str, checked, max_side, objects_index, workers):
    """Refs of a multi-object dataset: decodes the masks (or reads the index) to find the object ids."""
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise ValueError(f"workers must be a positive int or None, got {workers!r}")
    max_side = int(max_side or 0)
    index_path = pathlib.Path(objects_index) if objects_index is not None else None
    keys = {pair.stem: _index_key(pair.mask, size, max_side) for pair, size in checked}
    present = {pair.mask.name for pair, _ in checked}
    stored = _read_index(index_path)
    entries = {mask_name: entry for mask_name, entry in stored.items() if mask_name in present}
    todo = [(pair, size) for pair, size in checked
            if not (pair.mask.name in entries and {k: v for k, v in entries[pair.mask.name].items() if k != "ids"}
                    == keys[pair.stem])]

    def object_ids(item):
        pair, size = item
        try:
            return _mask_object_ids(size, pair.mask, max_side), None
        except DatasetError as error:
            return None, str(error)

    worker_count = workers or min(8, os.cpu_count() or 1)
    if worker_count > 1 and len(todo) > 1:
        with concurrent.futures.ThreadPoolExecutor(worker_count) as pool:
            results = list(pool.map(object_ids, todo))
    else:
        results = [object_ids(item) for item in todo]
    problems = []
    for (pair, _), (ids, problem) in zip(todo, results):
        if problem is not None:
            problems.append((pair, problem))
            entries.pop(pair.mask.name, None)
        else:
            entries[pair.mask.name] = dict(keys[pair.stem], ids=ids)
    if index_path is not None and (todo or len(entries) != len(stored)):
        _write_index(index_path, entries)

    refs, empty = [], []
    failed = {pair.stem for pair, _ in problems}
    for pair, size in checked:
        if pair.stem in failed:
            continue
        object_list = entries[pair.mask.name]["ids"]
        if not object_list:
            empty.append(str(pair.mask))
        height, width = capped_size(size[0], size[1], max_side)
        for object_id in object_list:
            instance_id = f"{pair.stem}{OBJECT_ID_SEPARATOR}{object_id}"
            loader = functools.partial(_load_packed_object, dataset, instance_id, str(pair.image), str(pair.mask),
                                       int(object_id), max_side)
            refs.append(_capped_ref(InstanceRef(id=instance_id, height=height, width=width, loader=loader,
                                                dataset=dataset, source_paths=(str(pair.image), str(pair.mask))),
                                    size, max_side))
    if empty:
        warnings.warn(f"{dataset}: {len(empty)} mask(s) hold no object and give no instance: {', '.join(empty)}",
                      DatasetWarning, stacklevel=4)
    return refs, problems


# ----------------------------------------------------------------------------- names, roots, --datasets


@dataclasses.dataclass(frozen=True)
class DatasetSource:
    """A resolved ``--datasets`` entry: dataset name, kind name and folder."""

    name: str
    kind: str
    path: pathlib.Path


def default_data_root(root=None) -> pathlib.Path:
    """The datasets root: ``root`` if given, else ``$JAXSEG_ROBUST_DATA``.

    Raises:
      DatasetError: neither is set, or the root is not a directory.
    """
    if root is None:
        root = os.environ.get(DATA_ENV_VAR)
        if not root:
            raise DatasetError(f"no datasets root: give --data-root DIR (Python: root=) or set ${DATA_ENV_VAR}")
    path = pathlib.Path(root).expanduser()
    if not path.is_dir():
        raise DatasetError(f"datasets root {path} does not exist or is not a directory")
    return path


def dataset_dir(kind: str | DatasetKind, root=None) -> pathlib.Path:
    """The folder of a registered dataset under a datasets root.

    The sub-folder of ``root`` whose name equals the kind's name ignoring case,
    ``_`` and ``-`` (``grabcut``, ``GrabCut``, ``COCO_MVal``, ``coco-mval``).

    Raises:
      DatasetError: unknown kind, no root, no such sub-folder, or several.
    """
    kind_spec = kind if isinstance(kind, DatasetKind) else find_kind(kind)
    if kind_spec is None:
        raise DatasetError(f"unknown dataset {kind!r}; known: {', '.join(KINDS)}")
    base = default_data_root(root)
    wanted = normalize_name(kind_spec.name)
    found = sorted(p for p in base.iterdir() if p.is_dir() and normalize_name(p.name) == wanted)
    if not found:
        present = sorted(p.name for p in base.iterdir() if p.is_dir())
        listing = ", ".join(present[:8]) + (f" and {len(present) - 8} more" if len(present) > 8 else "")
        raise DatasetError(f"{kind_spec.name}: no folder named like {kind_spec.name!r} in datasets root {base} "
                           f"({'its folders: ' + listing if present else 'it has no folders'})")
    if len(found) > 1:
        raise DatasetError(f"{kind_spec.name}: several folders match in {base}: {', '.join(p.name for p in found)}")
    return found[0]


def load_dataset(kind_or_path, root=None, *, kind: str | None = None, **options) -> list[InstanceRef]:
    """Lists a dataset as lazy instances.

    Args:
      kind_or_path: a registered dataset name (``"grabcut"``, ``"Berkeley"``,
        ``"COCO_MVal"``, ...): its folder is found under ``root`` (default
        ``$JAXSEG_ROBUST_DATA``) by `dataset_dir`; or ``"folder"``, with
        ``root`` the image/mask folder itself; or a path to a dataset folder,
        read as ``kind`` (default ``"folder"``).
      root: datasets root (for a name) or the folder (for ``"folder"``).
      kind: the kind of a folder given by path.
      **options: `list_dataset_folder` options (``name``, ``on_bad_pair``,
        ``rule``, ``ignore_value``, ``max_side``, ...).

    Returns:
      The `InstanceRef`s (see `list_dataset_folder`).

    Raises:
      DatasetError: unknown name, missing folders or listing problems.
    """
    registered = find_kind(str(kind_or_path)) if isinstance(kind_or_path, str) else None
    if registered is not None and kind is None:
        if registered.name == "folder":
            if root is None:
                raise DatasetError("the 'folder' kind needs root= set to the image/mask folder")
            return list_dataset_folder(registered, pathlib.Path(root), **options)
        return list_dataset_folder(registered, dataset_dir(registered, root), **options)
    path = pathlib.Path(kind_or_path)
    if not path.is_dir():
        raise DatasetError(f"{kind_or_path!r} is neither a known dataset ({', '.join(KINDS)}) nor a folder")
    return list_dataset_folder(kind or "folder", path, **options)


def resolve_datasets(names, root=None, *, paths: Mapping[str, Any] | None = None) -> list[DatasetSource]:
    """Resolves a ``--datasets`` value (``"GrabCut,Berkeley"`` or a list of names) to folders.

    A name found in ``paths`` (keys compared by `normalize_name`, so
    ``"GRABCUT_PATH"`` matches ``GrabCut``) uses that folder (relative paths
    are taken under the datasets root); otherwise a registered name is looked
    up under the root by `dataset_dir`. A name that is not registered reads
    its folder from ``paths`` with the ``folder`` kind.

    Returns:
      One `DatasetSource` per name, in the order given; registered datasets
      get their canonical name (``"coco_mval"`` for ``COCO_MVal``).

    Raises:
      DatasetError: empty list, a name listed twice, an unknown name without
        a path, or a missing folder.
    """
    items = [n.strip() for n in names.split(",")] if isinstance(names, str) else [str(n).strip() for n in names]
    items = [n for n in items if n]
    if not items:
        raise DatasetError("no dataset names given")
    path_map = {normalize_name(key): value for key, value in (paths or {}).items()}
    sources, seen = [], set()
    for item in items:
        kind_spec = find_kind(item)
        if kind_spec is not None and kind_spec.name == "folder":
            raise DatasetError("'folder' is a kind, not a dataset name; give the folder's name and path instead")
        dataset = kind_spec.name if kind_spec is not None else item
        if dataset in seen:
            raise DatasetError(f"dataset {item!r} is listed twice")
        seen.add(dataset)
        given = path_map.get(normalize_name(item))
        if given is None and kind_spec is not None:
            given = next((path_map[normalize_name(a)] for a in (kind_spec.name, *kind_spec.aliases)
                          if normalize_name(a) in path_map), None)
        if given is not None:
            path = pathlib.Path(given).expanduser()
            if not path.is_absolute() and (root is not None or os.environ.get(DATA_ENV_VAR)):
                path = default_data_root(root) / path
            if not path.is_dir():
                raise DatasetError(f"{dataset}: folder {path} does not exist")
        elif kind_spec is not None:
            path = dataset_dir(kind_spec, root)
        else:
            raise DatasetError(f"unknown dataset {item!r} and no path given for it; known: "
                               f"{', '.join(k for k in KINDS if k != 'folder')}")
        sources.append(DatasetSource(dataset, kind_spec.name if kind_spec is not None else "folder", path))
    return sources


def load_datasets(names, root=None, *, paths: Mapping[str, Any] | None = None,
                  options: Mapping[str, Mapping[str, Any]] | None = None) -> list[InstanceRef]:
    """Lists every dataset of a ``--datasets`` value, concatenated in the order given.

    Args:
      names: ``"GrabCut,Berkeley"`` or a list of names (see `resolve_datasets`).
      root: datasets root (default ``$JAXSEG_ROBUST_DATA``).
      paths: optional mapping name -> folder (RITM config style).
      options: optional mapping dataset name -> `list_dataset_folder` options
        (e.g. ``{"tetris": {"max_side": 2048}}``); keys compared by `normalize_name`.

    Returns:
      The `InstanceRef`s of all datasets.
    """
    option_map = {normalize_name(k): dict(v) for k, v in (options or {}).items()}
    sources = resolve_datasets(names, root, paths=paths)
    unused = set(option_map) - {normalize_name(s.name) for s in sources}
    if unused:
        raise ValueError(f"options given for datasets not listed: {sorted(unused)}")
    refs: list[InstanceRef] = []
    for source in sources:
        extra = option_map.get(normalize_name(source.name), {})
        extra.setdefault("name", source.name)
        refs.extend(list_dataset_folder(source.kind, source.path, **extra))
    return refs
