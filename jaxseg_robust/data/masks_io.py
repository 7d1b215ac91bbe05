"""Reading binary masks from image files (PNG, BMP, JPG, ...) with an explicit rule.

A mask file is decoded with Pillow into one integer value per pixel:
  * modes ``1``, ``L``: the grey value (``1`` -> 0/255);
  * mode ``P`` (palette): the palette **index** (DAVIS stores object ids this way);
  * modes ``I;16*``, ``I``: the integer value;
  * modes ``RGB``, ``RGBA``, ``LA``: the maximum over the colour channels, alpha
    dropped (for grey-coded masks this equals RITM's first-channel read);
  * any other mode (``F``, ``CMYK``, ...) is rejected.

The value is turned into foreground by a rule: ``>N``, ``>=N``, ``==N`` or
``!=N`` (e.g. ``>128`` = RITM Berkeley/COCO-MVal, ``==255`` = GrabCut object,
``!=0`` = DAVIS). A GT may have an ignore value (GrabCut/Berkeley: 128 is the
unlabelled band around the object): those pixels become ``valid = False`` and
background, whatever the rule says (RITM: ``==128 -> -1``).

Every error is a :class:`MaskReadError` whose message starts with the file path.
"""

from __future__ import annotations

import dataclasses
import operator
import pathlib
import re

import numpy as np
from PIL import Image, UnidentifiedImageError

MASK_SUFFIXES = (".png", ".bmp", ".jpg", ".jpeg", ".tif", ".tiff", ".gif", ".webp")

_OPERATORS = {">": operator.gt, ">=": operator.ge, "==": operator.eq, "!=": operator.ne}
_RULE_PATTERN = re.compile(r"^\s*(>=|>|==|!=)\s*(\d+)\s*$")


_DECODE_ERRORS = (OSError, UnidentifiedImageError, ValueError, SyntaxError, Image.DecompressionBombError)


class MaskReadError(ValueError):
    """A mask file could not be read or decoded; the message names the file."""


@dataclasses.dataclass(frozen=True)
class MaskRule:
    """Foreground rule ``value <op> threshold`` (op one of >, >=, ==, !=)."""

    op: str
    threshold: int

    def apply(self, values: np.ndarray) -> np.ndarray:
        """bool[H, W] foreground of integer ``values[H, W]``."""
        return _OPERATORS[self.op](values, self.threshold)

    def __str__(self) -> str:
        return f"{self.op}{self.threshold}"


def parse_rule(text: str) -> MaskRule:
    """Parses ``">128"``, ``">=1"``, ``"==255"``, ``"!=0"`` into a :class:`MaskRule`."""
    match = _RULE_PATTERN.match(str(text))
    if match is None:
        raise ValueError(f"mask rule must look like '>128', '>=1', '==255' or '!=0', got {text!r}")
    return MaskRule(match.group(1), int(match.group(2)))


def read_mask_values(path) -> np.ndarray:
    """Decodes a mask file into integer values (see module doc for the modes).

    Args:
      path: file path.

    Returns:
      np.ndarray[H, W] of uint8 or int32.

    Raises:
      MaskReadError: unreadable file or unsupported image mode (names the file).
    """
    path = pathlib.Path(path)
    try:
        with Image.open(path) as image:
            image.load()
            mode = image.mode
            if mode == "1":
                return np.asarray(image, dtype=np.uint8) * np.uint8(255)
            if mode in ("L", "P"):
                return np.asarray(image, dtype=np.uint8)
            if mode.startswith("I"):
                return np.asarray(image).astype(np.int32)
            if mode in ("RGB", "RGBA", "LA"):
                colours = 1 if mode == "LA" else 3
                return np.asarray(image)[..., :colours].max(axis=-1)
    except _DECODE_ERRORS as error:
        raise MaskReadError(f"{path}: cannot read image ({error})") from error
    raise MaskReadError(f"{path}: unsupported image mode {mode!r} for a mask (use a grey, palette or RGB image)")


def read_mask_size(path) -> tuple[int, int]:
    """(height, width) of an image file from its header, without decoding the pixels.

    Raises:
      MaskReadError: the file is not a readable image (names the file).
    """
    path = pathlib.Path(path)
    try:
        with Image.open(path) as image:
            width, height = image.size
    except _DECODE_ERRORS as error:
        raise MaskReadError(f"{path}: cannot read image ({error})") from error
    return height, width


def read_mask(path, rule: MaskRule | str = ">128") -> np.ndarray:
    """Reads a binary mask.

    Args:
      path: mask file.
      rule: foreground rule (a :class:`MaskRule` or its text, default ``>128``).

    Returns:
      np.ndarray bool[H, W].
    """
    rule = parse_rule(rule) if isinstance(rule, str) else rule
    return rule.apply(read_mask_values(path))


def read_gt_mask(path, rule: MaskRule | str = ">128", ignore_value: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Reads a ground-truth mask with an optional ignore value.

    Args:
      path: mask file.
      rule: foreground rule (default ``>128``).
      ignore_value: pixel value marking ignore pixels (GrabCut/Berkeley: 128), or None.

    Returns:
      (gt bool[H, W], valid bool[H, W]); ignore pixels are ``valid = False`` and
      ``gt = False``.
    """
    rule = parse_rule(rule) if isinstance(rule, str) else rule
    values = read_mask_values(path)
    if ignore_value is None:
        return rule.apply(values), np.ones(values.shape, dtype=bool)
    valid = values != ignore_value
    return rule.apply(values) & valid, valid


def list_mask_files(folder) -> tuple[dict[str, pathlib.Path], dict[str, list[pathlib.Path]]]:
    """Mask files of a folder (non-recursive), keyed by file stem.

    Args:
      folder: directory.

    Returns:
      (unique: stem -> path, ambiguous: stem -> [paths]) for stems that occur once /
      more than once (e.g. ``a.png`` and ``a.jpg``). Files with other suffixes are ignored.

    Raises:
      MaskReadError: ``folder`` is not a directory.
    """
    folder = pathlib.Path(folder)
    if not folder.is_dir():
        raise MaskReadError(f"{folder}: not a directory")
    by_stem: dict[str, list[pathlib.Path]] = {}
    for path in sorted(folder.iterdir()):
        if path.is_file() and path.suffix.lower() in MASK_SUFFIXES:
            by_stem.setdefault(path.stem, []).append(path)
    unique = {stem: paths[0] for stem, paths in by_stem.items() if len(paths) == 1}
    ambiguous = {stem: paths for stem, paths in by_stem.items() if len(paths) > 1}
    return unique, ambiguous
