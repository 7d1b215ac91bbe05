"""Image and mask files as the RITM loaders read them: OpenCV-exact decoding and resizing, computed with Pillow.

Decoding follows OpenCV's ``imread(IMREAD_COLOR)`` (docs/protocols/tetris.md §6):
palette masks are read as their palette *colours*, grey masks as three equal
channels, the alpha channel is dropped, 16-bit files keep their high byte, and
the EXIF orientation of a file is applied. `resize_bilinear_uint8` reproduces
OpenCV's uint8 ``INTER_LINEAR`` fixed-point arithmetic (11-bit weights, the
vectorised rounding of its x86 build) bit for bit; `resize_id_map` resizes a
packed id map object by object as the TETRIS loader does. The dataset listing
is `jaxseg_robust.data.datasets`.
"""

from __future__ import annotations

import pathlib

import numpy as np
from PIL import Image, UnidentifiedImageError

from jaxseg_robust.data.instances import (
    IGNORE_LABEL,
)


# What Pillow raises on a file it cannot decode (image and mask readers alike).
DECODE_ERRORS = (OSError, UnidentifiedImageError, ValueError, SyntaxError, Image.DecompressionBombError)
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
    except DECODE_ERRORS as error:
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
    except DECODE_ERRORS as error:
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
