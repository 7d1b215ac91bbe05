"""Pairing image and mask files and the lazy loaders of the dataset kinds (`jaxseg_robust.data.datasets`).

Listing pairs files by stem and reads only headers; each instance's pixels are
decoded in ``ref.load()`` by one of the loaders here (single-object RITM rule,
a `masks_io` rule, or one object of a packed id map), which check the sizes,
the values (warning once per file on a mask that is not close to two-valued)
and that the object is not empty. Multi-object kinds keep an optional JSON
index of the ids of each mask.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import pathlib
import threading
import warnings
from collections.abc import Callable

import numpy as np

from jaxseg_robust.data.instances import (
    IGNORE_LABEL,
    Instance,
    InstanceError,
    instance_name,
    make_instance,
)
from jaxseg_robust.data.masks_io import (
    MAX_LABELS,
    MaskReadError,
    MaskRule,
    empty_mask_hint,
    read_mask_checked,
    two_valued_warning,
    values_summary,
)
from jaxseg_robust.data.image_files import (
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

IMAGE_SUFFIXES = (".png", ".bmp", ".jpg", ".jpeg", ".tif", ".tiff", ".gif", ".webp")


# ----------------------------------------------------------------------------- pairing files


@dataclasses.dataclass(frozen=True)
class _Pair:
    stem: str
    image: pathlib.Path | None
    mask: pathlib.Path | None


def _files_by_stem(folder: pathlib.Path) -> tuple[dict[str, pathlib.Path], dict[str, list[pathlib.Path]]]:
    by_stem: dict[str, list[pathlib.Path]] = {}
    for path in sorted(folder.iterdir()):
        if path.name.startswith(".") or not path.is_file() or path.suffix.lower() not in IMAGE_SUFFIXES:
            continue
        by_stem.setdefault(path.stem, []).append(path)
    unique = {stem: paths[0] for stem, paths in by_stem.items() if len(paths) == 1}
    ambiguous = {stem: paths for stem, paths in by_stem.items() if len(paths) > 1}
    return unique, ambiguous


def _pair_files(images_dir: pathlib.Path, masks_dir: pathlib.Path) -> tuple[list[_Pair], list[tuple[_Pair, str]]]:
    """Pairs image and mask files by stem.

    Returns:
      (good pairs sorted by image file name, [(pair, problem)] for unpaired
      or ambiguous stems; a problem pair may lack its image or mask).
    """
    images, images_ambiguous = _files_by_stem(images_dir)
    masks, masks_ambiguous = _files_by_stem(masks_dir)
    problems: list[tuple[_Pair, str]] = []
    for label, ambiguous in (("images", images_ambiguous), ("masks", masks_ambiguous)):
        for stem, paths in ambiguous.items():
            listed = ", ".join(str(p) for p in paths)
            problems.append((_Pair(stem, None, None), f"several {label} share the stem {stem!r}: {listed}"))
    bad_stems = set(images_ambiguous) | set(masks_ambiguous)
    good = []
    for stem, image in images.items():
        if stem in bad_stems:
            continue
        if stem in masks:
            good.append(_Pair(stem, image, masks[stem]))
        else:
            problems.append((_Pair(stem, image, None), f"{image}: no mask with stem {stem!r} in {masks_dir}"))
    for stem, mask in masks.items():
        if stem not in images and stem not in bad_stems:
            problems.append((_Pair(stem, None, mask), f"{mask}: no image with stem {stem!r} in {images_dir}"))
    good.sort(key=lambda pair: pair.image.name)
    problems.sort(key=lambda item: (item[0].stem, item[1]))
    return good, problems


def _check_headers(pair: _Pair, mask_size_reader: Callable) -> tuple[tuple[int, int] | None, str | None]:
    """(image (H, W) or None, problem or None) from the headers of a pair."""
    try:
        size = read_image_size(pair.image)
    except DatasetError as error:
        return None, str(error)
    try:
        mask_size = mask_size_reader(pair.mask)
    except (DatasetError, MaskReadError) as error:
        return size, str(error)
    if mask_size != size:
        return size, (f"{pair.mask}: mask size (H, W) = {mask_size} differs from image {pair.image} size {size}")
    return size, None


# ----------------------------------------------------------------------------- loaders (run in ref.load())


def _failing_loader(name: str, message: str) -> Instance:
    raise InstanceError(f"{name}: {message}")


def _read_pixels(name: str, path: pathlib.Path) -> np.ndarray:
    try:
        return read_image_rgb(path)
    except DatasetError as error:
        raise InstanceError(f"{name}: {error}") from error


def _check_same_size(name: str, image: np.ndarray, image_path, mask: np.ndarray, mask_path) -> None:
    if image.shape[:2] != mask.shape[:2]:
        raise InstanceError(
            f"{name}: mask {mask_path} is {mask.shape[0]}x{mask.shape[1]} but image {image_path} is "
            f"{image.shape[0]}x{image.shape[1]} (H x W)"
        )


def _require_object(name: str, gt: np.ndarray, mask_path, what: str, values, valid=None) -> None:
    if not np.any(gt == 1):
        raise InstanceError(f"{name}: mask {mask_path} has no object pixel ({what}; values in the file: "
                            f"{values_summary(values, valid)})")


_NOTICES: set = set()
_NOTICES_LOCK = threading.Lock()


def _warn_once(key, message: str) -> None:
    """A `DatasetWarning` the first time ``key`` is seen in this process (loaders run once per use of an instance)."""
    with _NOTICES_LOCK:
        if key in _NOTICES:
            return
        _NOTICES.add(key)
    warnings.warn(message, DatasetWarning, stacklevel=3)


def _check_values(name: str, channels, mask_path, valid=None, labels: int = 2) -> None:
    warning = two_valued_warning(channels, mask_path, valid, labels=labels)
    if warning is not None:
        _warn_once(("values", str(mask_path)), f"{name}: {warning}")


def _load_ritm_single(
    dataset: str, instance_id: str, image_path: str, mask_path: str, decoder: str, allow_empty: bool
) -> Instance:
    name = instance_name(dataset, instance_id)
    image = _read_pixels(name, pathlib.Path(image_path))
    mask = _read_pixels(name, pathlib.Path(mask_path))
    _check_same_size(name, image, image_path, mask, mask_path)
    if decoder == "grabcut":
        gt = decode_grabcut_gt(mask[..., 2])
        _check_values(name, mask[..., 2], mask_path, valid=mask[..., 2] != 128)
        what = "grabcut decoding: object = channel 0 > 128 or == 1, 128 = ignore"
    else:
        gt = decode_davis_gt(mask)
        _check_values(name, mask, mask_path, labels=MAX_LABELS)
        what = "davis decoding: object = any colour channel > 0"
    if not allow_empty and not np.any(gt == 1):
        _require_object(name, gt, mask_path, what, mask[..., 2] if decoder == "grabcut" else mask.max(axis=-1))
    return make_instance(instance_id, image, gt, dataset=dataset, source_paths=(image_path, mask_path))


def _load_rule_single(
    dataset: str, instance_id: str, image_path: str, mask_path: str, rule: MaskRule,
    ignore_value: int | None, allow_empty: bool,
) -> Instance:
    name = instance_name(dataset, instance_id)
    image = _read_pixels(name, pathlib.Path(image_path))
    try:
        reading = read_mask_checked(mask_path, rule, ignore_value)
    except MaskReadError as error:
        raise InstanceError(f"{name}: {error}") from error
    _check_same_size(name, image, image_path, reading.foreground, mask_path)
    if reading.warning is not None:
        _warn_once(("values", str(mask_path)), f"{name}: {reading.warning}")
    gt = np.where(reading.valid, reading.foreground.astype(np.int8), np.int8(IGNORE_LABEL)).astype(np.int8)
    if not allow_empty and not np.any(gt == 1):
        ignore = "" if ignore_value is None else f"ignore value {ignore_value}; "
        raise InstanceError(f"{name}: mask {mask_path} has no object pixel ({ignore}"
                            f"{empty_mask_hint(reading.values, reading.rule, reading.valid)})")
    return make_instance(instance_id, image, gt, dataset=dataset, source_paths=(image_path, mask_path))


def _file_state(path: str) -> tuple[int, int]:
    stat = os.stat(path)
    return stat.st_size, stat.st_mtime_ns


@functools.lru_cache(maxsize=2)
def _packed_pair_cached(image_path: str, mask_path: str, max_side: int, image_state, mask_state):
    """(image uint8[h', w', 3], ids int32[h', w']) of a packed pair, read-only; cached for the objects of one image."""
    del image_state, mask_state  # part of the cache key only: a changed file is read again
    image = read_image_rgb(image_path)
    ids = packed_ids(read_image_rgb(mask_path))
    if image.shape[:2] != ids.shape:
        raise DatasetError(
            f"mask {mask_path} is {ids.shape[0]}x{ids.shape[1]} but image {image_path} is "
            f"{image.shape[0]}x{image.shape[1]} (H x W)"
        )
    height, width = capped_size(image.shape[0], image.shape[1], max_side)
    image = resize_bilinear_uint8(image, height, width)
    ids = resize_id_map(ids, height, width)
    image.setflags(write=False)
    ids.setflags(write=False)
    return image, ids


def _read_packed_pair(image_path: str, mask_path: str, max_side: int):
    return _packed_pair_cached(image_path, mask_path, max_side, _file_state(image_path), _file_state(mask_path))


def _load_packed_object(
    dataset: str, instance_id: str, image_path: str, mask_path: str, object_id: int, max_side: int
) -> Instance:
    name = instance_name(dataset, instance_id)
    try:
        image, ids = _read_packed_pair(image_path, mask_path, max_side)
    except (DatasetError, OSError) as error:
        raise InstanceError(f"{name}: {error}") from error
    gt = ids == object_id
    if not gt.any():
        raise InstanceError(f"{name}: object id {object_id} is not in mask {mask_path} (changed since listing?)")
    return make_instance(instance_id, image, gt, dataset=dataset, source_paths=(image_path, mask_path))


# ----------------------------------------------------------------------------- object index (multi-object kinds)


def _mask_object_ids(image_size: tuple[int, int], mask_path: pathlib.Path, max_side: int) -> list[int]:
    """Object ids of a packed mask in the (capped) evaluation frame."""
    ids = packed_ids(read_image_rgb(mask_path))
    if ids.shape != tuple(image_size):
        raise DatasetError(f"{mask_path}: mask size (H, W) = {ids.shape} differs from the image size {image_size}")
    height, width = capped_size(image_size[0], image_size[1], max_side)
    return unique_nonzero_ids(resize_id_map(ids, height, width))


def _index_key(mask_path: pathlib.Path, image_size, max_side: int) -> dict:
    size, mtime_ns = _file_state(str(mask_path))
    return {"size": size, "mtime_ns": mtime_ns, "image_size": list(image_size), "max_side": max_side}


def _read_index(path: pathlib.Path | None) -> dict:
    if path is None or not path.is_file():
        return {}
    try:
        content = json.loads(path.read_text())
        return dict(content["entries"])
    except (OSError, ValueError, KeyError, TypeError) as error:
        warnings.warn(f"{path}: unreadable objects index ignored ({error})", DatasetWarning, stacklevel=3)
        return {}


def _write_index(path: pathlib.Path, entries: dict) -> None:
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(json.dumps({"version": 1, "entries": entries}, sort_keys=True))
    os.replace(temporary, path)
