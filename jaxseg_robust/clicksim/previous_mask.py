"""Previous-round masks of the RClicks click dataset (``SUBSEC_MASKS/.../<full_stem>.png``).

Reference: docs/protocols/rclicks.md §1.2 step 5 (C-R ``clickmap.py`` ``Clicks.prev_mask``):
the PNG is read as a 3-channel colour image, the **red** channel is taken and
divided by 255; the result is a soft float mask, not re-binarised.
"""

from __future__ import annotations

import os
import pathlib
from typing import Union

import numpy as np
from PIL import Image, UnidentifiedImageError

from jaxseg_robust.data.masks_io import MaskReadError

__all__ = ["check_previous_mask", "read_previous_mask", "previous_mask_path"]

# Modes whose conversion to RGB matches OpenCV's IMREAD_COLOR for 8-bit images (alpha dropped).
_EIGHT_BIT_MODES = ("1", "L", "P", "RGB", "RGBA", "LA")


def previous_mask_path(folder: Union[str, os.PathLike], full_stem: str) -> pathlib.Path:
    """``<folder>/<full_stem>.png``, the previous mask of a subsequent-round task."""
    return pathlib.Path(folder) / f"{full_stem}.png"


def read_previous_mask(path: Union[str, os.PathLike]) -> np.ndarray:
    """Reads a previous-round mask: red channel / 255.

    Args:
      path: PNG (or other 8-bit image) file.
    Returns:
      float32[H, W] in [0, 1].
    Raises:
      MaskReadError (a ValueError) naming the file when it is missing, cannot be
      decoded, or is not an 8-bit image.
    """
    path = pathlib.Path(path)
    try:
        with Image.open(path) as image:
            if image.mode not in _EIGHT_BIT_MODES:
                raise MaskReadError(f"{path}: unsupported image mode {image.mode!r} for a previous mask "
                                    f"(expected one of {_EIGHT_BIT_MODES})")
            rgb = np.asarray(image.convert("RGB"))
    except MaskReadError:
        raise
    except (OSError, UnidentifiedImageError, ValueError, SyntaxError) as error:
        raise MaskReadError(f"{path}: cannot read previous mask ({error})") from None
    return rgb[:, :, 0].astype(np.float32) / np.float32(255.0)


def check_previous_mask(path: Union[str, os.PathLike], size_hw: tuple[int, int]) -> None:
    """Checks a previous-round mask from its header only (nothing decoded): the file exists, is an 8-bit
    image and has the instance's size.

    Args:
      path: the PNG; size_hw: (H, W) of the instance it belongs to.
    Raises:
      MaskReadError (a ValueError) naming the file: missing, unreadable, another mode or another size.
    """
    path = pathlib.Path(path)
    if not path.is_file():
        raise MaskReadError(f"{path}: previous mask not found")
    try:
        with Image.open(path) as image:
            mode, (width, height) = image.mode, image.size
    except (OSError, UnidentifiedImageError, ValueError, SyntaxError) as error:
        raise MaskReadError(f"{path}: cannot read previous mask ({error})") from None
    if mode not in _EIGHT_BIT_MODES:
        raise MaskReadError(f"{path}: unsupported image mode {mode!r} for a previous mask "
                            f"(expected one of {_EIGHT_BIT_MODES})")
    if (height, width) != tuple(size_hw):
        raise MaskReadError(f"{path}: previous mask is {height}x{width} (HxW), the instance's image is "
                            f"{size_hw[0]}x{size_hw[1]}")
