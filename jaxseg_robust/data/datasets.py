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
    ignore value 128); and, once per dataset, ``folder`` masks holding 0/1
    labels under the default rule ``>128``, which are read as object = 1
    (`masks_io.resolve_rule`);
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
import json
import os
import pathlib
import threading
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from PIL import Image, UnidentifiedImageError

from jaxseg_robust.data.instances import (
    IGNORE_LABEL,
    Instance,
    InstanceError,
    InstanceRef,
    instance_name,
    make_instance,
)
from jaxseg_robust.data.masks_io import (
    MAX_LABELS,
    MaskReadError,
    MaskRule,
    parse_rule,
    read_mask_checked,
    read_mask_size,
    two_valued_warning,
    values_summary,
)

DATA_ENV_VAR = "JAXSEG_ROBUST_DATA"
IMAGE_SUFFIXES = (".png", ".bmp", ".jpg", ".jpeg", ".tif", ".tiff", ".gif", ".webp")
OBJECT_ID_SEPARATOR = "#"
TETRIS_MAX_SIDE = 1024
RCLICKS_TETRIS_MAX_SIDE = 2048
ON_BAD_PAIR_MODES = ("error", "skip", "fail")
UNREADABLE_DECLARED_SIZE = (1, 1)

_DECODE_ERRORS = (OSError, UnidentifiedImageError, ValueError, SyntaxError, Image.DecompressionBombError)
_EXIF_ORIENTATION_TAG = 0x0112
# EXIF orientation -> Pillow transpose that shows the image upright (the EXIF standard's table).
_ORIENTATION_TRANSPOSE = {
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_270,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_90,
}
_COEF_BITS = 11  # OpenCV INTER_RESIZE_COEF_BITS
_COEF_SCALE = 1 << _COEF_BITS


class DatasetError(ValueError):
    """A dataset cannot be listed; the message names the folder or files."""


class DatasetWarning(UserWarning):
    """Pairs or images that were skipped while listing a dataset."""


# ----------------------------------------------------------------------------- file decoding


def _orientation(image: Image.Image) -> int:
    """EXIF orientation (1..8) known from the file header, without decoding pixels (1 if none)."""
    try:
        if "exif" in image.info:
            exif = Image.Exif()
            exif.load(image.info["exif"])
            value = exif.get(_EXIF_ORIENTATION_TAG, 1)
        elif image.format in ("TIFF", "MPO", "JPEG"):
            value = image.getexif().get(_EXIF_ORIENTATION_TAG, 1)
        else:
            value = 1
    except Exception:  # noqa: BLE001 - a malformed EXIF block is ignored, like OpenCV does
        return 1
    return int(value) if value in _ORIENTATION_TRANSPOSE else 1


def read_image_size(path) -> tuple[int, int]:
    """(height, width) in pixels of an image file after EXIF orientation, from its header only.

    Raises:
      DatasetError: the file is not a readable image (names the file).
    """
    path = pathlib.Path(path)
    try:
        with Image.open(path) as image:
            width, height = image.size
            orientation = _orientation(image)
    except _DECODE_ERRORS as error:
        raise DatasetError(f"{path}: cannot read image header ({error})") from error
    return (width, height) if orientation in (5, 6, 7, 8) else (height, width)


def read_image_rgb(path) -> np.ndarray:
    """Decodes an image file as OpenCV's ``imread(IMREAD_COLOR)`` would, in RGB order.

    Grey and bilevel images give three equal channels, palette images their
    palette colours, the alpha channel is dropped, 16-bit images keep their
    high byte, and the EXIF orientation is applied.

    Args:
      path: image file (PNG, BMP, JPEG, TIFF, GIF, WebP, ...).

    Returns:
      uint8[H, W, 3] RGB, read-only (Pillow's buffer; copy it to modify).

    Raises:
      DatasetError: unreadable or truncated file, or an unsupported pixel mode
        (32-bit integer or float); the message names the file.
    """
    path = pathlib.Path(path)
    try:
        with Image.open(path) as image:
            orientation = _orientation(image)
            image.load()
            mode = image.mode
            if mode.startswith("I;16"):
                grey = (np.asarray(image).astype(np.uint16) >> 8).astype(np.uint8)
                decoded = Image.fromarray(grey, "L")
            elif mode in ("I", "F"):
                raise DatasetError(f"{path}: unsupported pixel mode {mode!r} (use 8- or 16-bit images)")
            else:
                decoded = image
            if orientation != 1:
                decoded = decoded.transpose(_ORIENTATION_TRANSPOSE[orientation])
            rgb = np.asarray(decoded if decoded.mode == "RGB" else decoded.convert("RGB"), dtype=np.uint8)
    except DatasetError:
        raise
    except _DECODE_ERRORS as error:
        raise DatasetError(f"{path}: cannot decode image ({error})") from error
    return np.ascontiguousarray(rgb)


def decode_grabcut_gt(blue: np.ndarray) -> np.ndarray:
    """RITM GrabCut/Berkeley ground truth from channel 0 (blue) of the OpenCV read.

    Args:
      blue: uint8[H, W] channel values.

    Returns:
      int8[H, W]: -1 where the value is 128 (the unlabelled band), 1 where it
      is > 128 or exactly 1 (RITM leaves other values unchanged and its object
      id is 1), 0 elsewhere.
    """
    blue = np.asarray(blue)
    gt = ((blue > 128) | (blue == 1)).astype(np.int8)
    gt[blue == 128] = IGNORE_LABEL
    return gt


def decode_davis_gt(rgb: np.ndarray) -> np.ndarray:
    """RITM DAVIS/COCO-MVal ground truth: 1 where the maximum over the colour channels is > 0.

    Args:
      rgb: uint8[H, W, 3].

    Returns:
      int8[H, W] in {0, 1}.
    """
    return (np.asarray(rgb).max(axis=-1) > 0).astype(np.int8)


def packed_ids(rgb: np.ndarray) -> np.ndarray:
    """Object ids of an RGB-packed id mask: ``B*65536 + G*256 + R`` (OpenCV's c0*65536 + c1*256 + c2).

    Args:
      rgb: uint8[H, W, 3] in RGB order (a Pillow read).

    Returns:
      int32[H, W] ids, 0 = background.
    """
    rgb = np.asarray(rgb)
    if rgb.dtype != np.uint8 or rgb.ndim != 3 or rgb.shape[2] != 3:
        raise ValueError(f"rgb must be uint8[H, W, 3], got {rgb.dtype}{list(rgb.shape)}")
    # R, G, B, 0 read as one little-endian 32-bit integer is R + 256*G + 65536*B.
    quad = np.zeros(rgb.shape[:2] + (4,), np.uint8)
    quad[..., :3] = rgb
    return quad.view("<i4")[..., 0].astype(np.int32, copy=False)


def unique_nonzero_ids(ids: np.ndarray) -> list[int]:
    """Sorted distinct non-zero values of an id map (int[H, W]); cheap when ids come in runs."""
    flat = np.asarray(ids).ravel()
    if flat.size == 0:
        return []
    starts = np.concatenate([[True], flat[1:] != flat[:-1]])
    values = np.unique(flat[starts])
    return [int(v) for v in values if v != 0]


# ----------------------------------------------------------------------------- resizing (OpenCV INTER_LINEAR)


def capped_size(height: int, width: int, max_side: int | None) -> tuple[int, int]:
    """(h', w') with the longest side capped at ``max_side`` (never enlarged), the RITM/BREPS/RClicks rule.

    ``H > W: h' = min(H, m), w' = int(W / H * h' + 0.5)``; otherwise
    ``w' = min(W, m), h' = int(H / W * w' + 0.5)`` (float64, as the reference).

    Args:
      height, width: image size in pixels (positive ints).
      max_side: the cap in pixels; None or 0 means no cap.

    Raises:
      ValueError: naming the argument, for non-positive sizes or a negative cap.
    """
    for name, value in (("height", height), ("width", width)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if max_side is None or max_side == 0:
        return int(height), int(width)
    if isinstance(max_side, bool) or not isinstance(max_side, (int, np.integer)) or max_side < 0:
        raise ValueError(f"max_side must be a non-negative int or None, got {max_side!r}")
    if height > width:
        new_height = min(int(height), int(max_side))
        return new_height, int(width / height * new_height + 0.5)
    new_width = min(int(width), int(max_side))
    return int(height / width * new_width + 0.5), new_width


def _linear_taps(in_size: int, out_size: int, clamp_weight: bool):
    """OpenCV INTER_LINEAR taps along one axis: (i0, i1 int64[out], w0, w1 int32[out]) in 1/2048 units.

    ``pos = float32((o + 0.5) * (1 / (out / in)) - 0.5)``, ``i0 = floor(pos)``,
    weights ``round(float32(1 - f) * 2048)``, ``round(f * 2048)``. Columns
    (``clamp_weight=True``) clamp the position to the image (weight 0 on the
    missing neighbour); rows keep the fraction and clamp only the row indices.
    """
    scale = 1.0 / (out_size / in_size)
    pos = ((np.arange(out_size, dtype=np.float64) + 0.5) * scale - 0.5).astype(np.float32)
    start = np.floor(pos).astype(np.int64)
    frac = (pos - start.astype(np.float32)).astype(np.float32)
    if clamp_weight:
        low = start < 0
        frac[low], start[low] = 0.0, 0
        high = start >= in_size - 1
        frac[high], start[high] = 0.0, in_size - 1
    i0 = np.clip(start, 0, in_size - 1)
    i1 = np.clip(start + 1, 0, in_size - 1)
    w0 = np.rint((np.float32(1.0) - frac) * np.float32(_COEF_SCALE)).astype(np.int32)
    w1 = np.rint(frac * np.float32(_COEF_SCALE)).astype(np.int32)
    return i0, i1, w0, w1


def _vertical_round(row0: np.ndarray, row1: np.ndarray, beta0: np.ndarray, beta1: np.ndarray) -> np.ndarray:
    """OpenCV's vectorised uint8 vertical pass: ``((r0>>4)*b0>>16) + ((r1>>4)*b1>>16) + 2 >> 2``, saturated."""
    total = (((row0 >> 4) * beta0) >> 16) + (((row1 >> 4) * beta1) >> 16)
    return np.clip((total + 2) >> 2, 0, 255)


def resize_bilinear_uint8(image: np.ndarray, height: int, width: int) -> np.ndarray:
    """``cv2.resize(image, (width, height), interpolation=cv2.INTER_LINEAR)`` for uint8 images, in NumPy.

    Half-pixel centres, no antialiasing, 11-bit fixed-point weights and
    OpenCV's vectorised rounding (bit-exact against opencv-python's x86 build
    in tests/test_data_datasets.py). Only the source rows that are sampled are
    read, so a large downscale is cheap.

    Args:
      image: uint8[H, W] or uint8[H, W, C].
      height, width: output size in pixels (positive ints).

    Returns:
      uint8[height, width] or uint8[height, width, C].

    Raises:
      ValueError: naming the argument, for a non-uint8 or empty image or a bad size.
    """
    image = np.asarray(image)
    if image.dtype != np.uint8 or image.ndim not in (2, 3) or image.shape[0] == 0 or image.shape[1] == 0:
        raise ValueError(f"image must be a non-empty uint8[H, W] or uint8[H, W, C], got {image.dtype}{list(image.shape)}")
    for name, value in (("height", height), ("width", width)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    in_height, in_width = image.shape[:2]
    if (in_height, in_width) == (height, width):
        return image.copy()
    x0, x1, a0, a1 = _linear_taps(in_width, width, clamp_weight=True)
    y0, y1, b0, b1 = _linear_taps(in_height, height, clamp_weight=False)
    rows, inverse = np.unique(np.concatenate([y0, y1]), return_inverse=True)
    channel = (slice(None),) + (None,) * (image.ndim - 2)
    left = image[np.ix_(rows, x0)].astype(np.int32)
    right = image[np.ix_(rows, x1)].astype(np.int32)
    horizontal = left * a0[channel] + right * a1[channel]
    column = (slice(None), None) + (None,) * (image.ndim - 2)
    out = _vertical_round(
        horizontal[inverse[:height]], horizontal[inverse[height:]], b0[column], b1[column]
    )
    return out.astype(np.uint8)


def resize_id_map(ids: np.ndarray, height: int, width: int) -> np.ndarray:
    """Resizes an id map as the TETRIS loaders do: per id, bilinear uint8 resize of its binary mask.

    Every non-zero id's 0/1 mask is resized with `resize_bilinear_uint8`
    (OpenCV INTER_LINEAR); the id is written where the result is non-zero,
    ids in ascending order so a higher id overwrites a lower one. Computed in
    one pass over the four taps of each output pixel (an id can only appear
    where one of its pixels is a tap).

    Args:
      ids: int[H, W] id map (0 = background, ids < 2**31).
      height, width: output size in pixels.

    Returns:
      int32[height, width].
    """
    ids = np.asarray(ids)
    if ids.ndim != 2 or ids.size == 0 or not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"ids must be a non-empty integer [H, W] array, got {ids.dtype}{list(ids.shape)}")
    for name, value in (("height", height), ("width", width)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    ids = ids.astype(np.int32, copy=False)
    if ids.shape == (height, width):
        return ids.copy()
    x0, x1, a0, a1 = _linear_taps(ids.shape[1], width, clamp_weight=True)
    y0, y1, b0, b1 = _linear_taps(ids.shape[0], height, clamp_weight=False)
    top, bottom = ids[y0], ids[y1]
    taps = (top[:, x0], top[:, x1], bottom[:, x0], bottom[:, x1])
    a0, a1, b0, b1 = a0[None, :], a1[None, :], b0[:, None], b1[:, None]
    result = np.zeros((height, width), np.int32)
    for candidate in taps:
        row0 = np.where(taps[0] == candidate, a0, 0) + np.where(taps[1] == candidate, a1, 0)
        row1 = np.where(taps[2] == candidate, a0, 0) + np.where(taps[3] == candidate, a1, 0)
        present = (_vertical_round(row0, row1, b0, b1) > 0) & (candidate != 0)
        result = np.maximum(result, np.where(present, candidate, 0))
    return result


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
    if reading.label_mask:
        _warn_once(("labels", dataset, str(pathlib.Path(mask_path).parent)),
                   f"{dataset}: masks hold 0/1 labels (e.g. {mask_path}): read as object = 1, background = 0 "
                   f"(rule {reading.rule} in place of the default {rule}, which selects nothing in them; "
                   "said once per dataset)")
    if reading.warning is not None:
        _warn_once(("values", str(mask_path)), f"{name}: {reading.warning}")
    gt = np.where(reading.valid, reading.foreground.astype(np.int8), np.int8(IGNORE_LABEL)).astype(np.int8)
    if not allow_empty:
        _require_object(name, gt, mask_path, f"rule {reading.rule}"
                        + ("" if ignore_value is None else f", ignore value {ignore_value}"),
                        reading.values, reading.valid)
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
                           f"(on_bad_pair='skip' or 'fail' to go on):\n  {lines}")
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


# ----------------------------------------------------------------------------- size guard (every command)

DEFAULT_MAX_SIDE = 2048  # memory guard: ~550 bytes per pixel (tetris, 4000x3000 image: 3.0 GB peak, 7.8 unguarded)
SIZE_GUARD_METHOD = "Pillow bilinear (image), nearest neighbour (ground truth)"
MAP_BACK = ("results (clicks, boxes, masks, metrics) are in the resized frame of size [h, w]; a point (x, y) maps "
            "back to x0 = (x + 0.5) * W0 / w - 0.5, y0 = (y + 0.5) * H0 / h - 0.5, a mask by nearest-neighbour "
            "resize to [H0, W0]")


@dataclasses.dataclass(frozen=True, eq=False)
class ResizedInstanceRef(InstanceRef):
    """An `InstanceRef` whose loader returns a downsized image (declared size = the resized size).

    Attributes (beyond `InstanceRef`'s):
      original_height, original_width: the size of the image on disk (H0, W0).
      max_side: the longest-side cap that caused the resize.
      method: how the image and the ground truth were resized.
    """

    original_height: int = 0
    original_width: int = 0
    max_side: int = 0
    method: str = SIZE_GUARD_METHOD

    @property
    def resize_note(self) -> dict:
        """What a run records in the instance's record (``"resized"``): sizes, scale, method, how to map back."""
        return {"original_size": [int(self.original_height), int(self.original_width)],
                "size": [int(self.height), int(self.width)],
                "scale": [self.height / self.original_height, self.width / self.original_width],
                "max_side": int(self.max_side), "method": self.method, "map_back": MAP_BACK}


def _guarded_loader(ref: InstanceRef, height: int, width: int):
    def load() -> Instance:
        instance = ref.load()
        image = np.asarray(Image.fromarray(instance.image).resize((width, height), Image.BILINEAR))
        shifted = Image.fromarray((instance.gt.astype(np.int16) + 1).astype(np.uint8))  # {-1, 0, 1} -> {0, 1, 2}
        gt = np.asarray(shifted.resize((width, height), Image.NEAREST)).astype(np.int8) - 1
        return make_instance(instance.id, image, gt, dataset=instance.dataset, source_paths=instance.source_paths)

    return load


def guard_size(refs, max_side: int | None) -> list:
    """The size guard: instances whose longest side exceeds ``max_side`` are downsized on load.

    The cap follows `capped_size` (aspect kept, never enlarged); images are
    resized with Pillow's bilinear filter, ground truth (including the ignore
    label) with nearest neighbour. Each downsized instance becomes a
    `ResizedInstanceRef`, whose ``resize_note`` the runner stores in its
    record. Nothing is decoded here: the declared sizes decide.

    Args:
      refs: `InstanceRef`s (anything else is passed through unchanged).
      max_side: the cap in pixels; None or 0: no guard.

    Returns:
      The refs, downsized ones replaced.

    Raises:
      ValueError: a negative or non-integer ``max_side``.
    """
    capped_size(1, 1, max_side)  # validates max_side
    if not max_side:
        return list(refs)
    out = []
    for ref in refs:
        if not isinstance(ref, InstanceRef) or max(ref.height, ref.width) <= max_side:
            out.append(ref)
            continue
        height, width = capped_size(ref.height, ref.width, max_side)
        original, method = ref.size, SIZE_GUARD_METHOD
        if isinstance(ref, ResizedInstanceRef):  # resized before (the TETRIS cap): keep the size on disk
            original, method = (ref.original_height, ref.original_width), f"{ref.method}, then {method}"
        out.append(ResizedInstanceRef(ref.id, height, width, _guarded_loader(ref, height, width), ref.dataset,
                                      tuple(ref.source_paths), ref.fingerprint, original_height=original[0],
                                      original_width=original[1], max_side=int(max_side), method=method))
    return out


TETRIS_CAP_METHOD = "OpenCV INTER_LINEAR (image and each object's mask), the TETRIS protocol's cap"


def _capped_ref(ref: InstanceRef, original_size: tuple[int, int], max_side: int) -> InstanceRef:
    """``ref`` as a `ResizedInstanceRef` when the TETRIS cap shrank it (so its record says so), else ``ref``."""
    if ref.size == tuple(original_size):
        return ref
    return ResizedInstanceRef(ref.id, ref.height, ref.width, ref.loader, ref.dataset, ref.source_paths,
                              ref.fingerprint, original_height=int(original_size[0]),
                              original_width=int(original_size[1]), max_side=int(max_side), method=TETRIS_CAP_METHOD)
