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

One rule for every file (`read_mask_checked`): the rule given (default
``>128``, the rule of RITM's Berkeley and COCO-MVal loaders, which reads 0/255
masks, JPEG masks and soft masks alike) is applied to every file the same way,
whatever values a file holds. A file whose values all fail the rule (a 0/1
label export, DAVIS palette ids 0..3 under ``>128``) reads as an empty mask;
its reader says so (`empty_mask_hint`: ``>0`` reads label and palette-id masks)
and the dataset loaders and ``score`` turn an empty ground truth into a
failure naming the file, never an IoU of 0. Benchmark folders of a known kind
(GrabCut, Berkeley, DAVIS, COCO-MVal, TETRIS) are decoded by that dataset's
own rule instead (`jaxseg_robust.data.datasets`).

A mask that is not (close to) **two-valued** (a photo, noise, a soft or
probability map) is still binarised by the rule, but the reading carries a
warning naming the file (`two_valued_warning`): more than `OFF_VALUE_LIMIT`
(2 %) of its pixels lie farther than a quarter of the gap from both of its
two commonest values (colours for RGB files, compared channel by channel,
so a magenta-on-black mask is two-valued and a photo is not). JPEG ringing
and anti-aliased edges stay within that tolerance. With an ``==N`` or
``!=N`` rule (picking or merging object ids) a label map of up to
`MAX_LABELS` values is clean too.

Every error is a :class:`MaskReadError` whose message starts with the file path.
"""

from __future__ import annotations

import dataclasses
import operator
import pathlib
import re

import numpy as np
from PIL import Image

from jaxseg_robust.data.image_files import DECODE_ERRORS

MASK_SUFFIXES = (".png", ".bmp", ".jpg", ".jpeg", ".tif", ".tiff", ".gif", ".webp")
DEFAULT_RULE = ">128"
OFF_VALUE_LIMIT = 0.02     # fraction of pixels far from the two commonest values that makes a warning
LABEL_SHARE = 0.002        # `off_value_fraction` with several labels: a value of >= 0.2 % of the pixels is a label
MAX_LABELS = 16            # values a label map (object ids) may hold before it is "not a label mask"
_SAMPLE_PIXELS = 1 << 16   # pixels looked at by `off_value_fraction` (an even stride over larger masks)

_OPERATORS = {">": operator.gt, ">=": operator.ge, "==": operator.eq, "!=": operator.ne}
_RULE_PATTERN = re.compile(r"^\s*(>=|>|==|!=)\s*(\d+)\s*$")


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


def decode_mask(path) -> tuple[np.ndarray, np.ndarray]:
    """Decodes a mask file into its values and its channels.

    Args:
      path: file path.

    Returns:
      (values, channels): ``values`` np.ndarray[H, W] of uint8 or int32 as
      `read_mask_values`; ``channels`` [H, W, C] the decoded channels before the
      maximum (C = 3 colours for RGB/RGBA, else C = 1: ``values[..., None]``).

    Raises:
      MaskReadError: unreadable file or unsupported image mode (names the file).
    """
    path = pathlib.Path(path)
    try:
        with Image.open(path) as image:
            image.load()
            mode = image.mode
            if mode == "1":
                values = np.asarray(image, dtype=np.uint8) * np.uint8(255)
            elif mode in ("L", "P"):
                values = np.asarray(image, dtype=np.uint8)
            elif mode.startswith("I"):
                values = np.asarray(image).astype(np.int32)
            elif mode in ("RGB", "RGBA", "LA"):
                colours = 1 if mode == "LA" else 3
                channels = np.asarray(image)[..., :colours]
                return channels.max(axis=-1), channels
            else:
                values = None
    except DECODE_ERRORS as error:
        raise MaskReadError(f"{path}: cannot read image ({error})") from error
    if values is None:
        raise MaskReadError(f"{path}: unsupported image mode {mode!r} for a mask (use a grey, palette or RGB image)")
    return values, values[..., None]


def is_default_rule(rule: MaskRule | str) -> bool:
    """True when ``rule`` is the default ``>128`` (raises ValueError for a malformed rule)."""
    return (parse_rule(rule) if isinstance(rule, str) else rule) == parse_rule(DEFAULT_RULE)


def read_mask_values(path) -> np.ndarray:
    """Decodes a mask file into integer values (see module doc for the modes).

    Args:
      path: file path.

    Returns:
      np.ndarray[H, W] of uint8 or int32.

    Raises:
      MaskReadError: unreadable file or unsupported image mode (names the file).
    """
    return decode_mask(path)[0]


def read_mask_size(path) -> tuple[int, int]:
    """(height, width) of an image file from its header, without decoding the pixels.

    Raises:
      MaskReadError: the file is not a readable image (names the file).
    """
    path = pathlib.Path(path)
    try:
        with Image.open(path) as image:
            width, height = image.size
    except DECODE_ERRORS as error:
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


# ---- inputs people actually have: masks the rule empties, masks that are not two-valued --------

def empty_mask_hint(values, rule: MaskRule | str, valid=None, *, rule_name: str = "rule") -> str:
    """What an empty reading of a file says: the values found and, for small labels, the rule that reads them.

    Args:
      values: int[H, W] decoded values (`read_mask_values`).
      rule: the rule that selected nothing.
      valid: optional bool[H, W]; False pixels (ignore values) are not looked at.
      rule_name: what the message calls the rule (a command names its flag, ``"--gt-rule"``).
    Returns:
      e.g. ``"rule >128; values in the file: 0, 1, 2, 3; label or palette-id masks: rule '>0'"``.
    """
    rule = parse_rule(rule) if isinstance(rule, str) else rule
    values = np.asarray(values)
    looked_at = values if valid is None else values[np.asarray(valid, bool)]
    text = f"{rule_name} {rule}; values in the file: {values_summary(values, valid)}"
    if looked_at.size and 0 < int(looked_at.max()) <= MAX_LABELS and not rule.apply(looked_at).any():
        text += f"; label or palette-id masks: {rule_name} '>0'"
    return text


def _keys(flat: np.ndarray) -> np.ndarray:
    """One int64 per row of non-negative ints < 2**16 (one per channel value combination)."""
    keys = np.zeros(flat.shape[0], np.int64)
    for channel in range(flat.shape[1]):
        keys = (keys << 16) | flat[:, channel]
    return keys


def off_value_fraction(channels, valid=None, *, labels: int = 2) -> tuple[float, list[tuple[int, ...]]]:
    """How far a mask is from being two-valued (or ``labels``-valued).

    The anchors are the two commonest values (colours) of the pixels, plus, for
    ``labels`` > 2, the next commonest ones holding at least `LABEL_SHARE` of
    the pixels (0.2 %), ``labels`` anchors at most. A pixel is off when its largest
    channel difference to every anchor exceeds a quarter of the smallest
    channel gap between two anchors. Masks larger than 2**16 pixels are looked
    at on an even stride.

    Args:
      channels: int[H, W] or int[H, W, C] decoded values (C = 3 for colours).
      valid: optional bool[H, W]; False pixels (ignore values) are not looked at.
      labels: the most values a clean mask may have (2; more for label maps).
    Returns:
      (fraction of off pixels in [0, 1], anchors as tuples of channel values,
      commonest first).
    """
    channels = np.asarray(channels)
    if channels.ndim == 2:
        channels = channels[..., None]
    flat = channels.reshape(-1, channels.shape[-1])
    if valid is not None:
        flat = flat[np.asarray(valid, bool).reshape(-1)]
    if flat.shape[0] == 0:
        return 0.0, []
    flat = np.clip(flat[::-(-flat.shape[0] // _SAMPLE_PIXELS)].astype(np.int64), 0, (1 << 16) - 1)
    _, first, counts = np.unique(_keys(flat), return_index=True, return_counts=True)
    colours = flat[first]
    order = np.argsort(-counts, kind="stable")
    anchors = [int(i) for i in order[:2]]
    anchors += [int(i) for i in order[2:labels] if counts[i] >= LABEL_SHARE * flat.shape[0]]
    if len(anchors) < 2:
        return 0.0, [tuple(int(v) for v in colours[anchors[0]])]
    points = colours[anchors]
    gaps = np.abs(points[:, None, :] - points[None, :, :]).max(axis=-1)
    tolerance = gaps[np.triu_indices(len(anchors), 1)].min() / 4.0
    distance = np.full(colours.shape[0], np.inf)
    for point in points:
        distance = np.minimum(distance, np.abs(colours - point).max(axis=-1))
    off = counts[distance > tolerance].sum() / flat.shape[0]
    return float(off), [tuple(int(v) for v in point) for point in points]


def _value_text(anchor: tuple[int, ...]) -> str:
    return str(anchor[0]) if len(anchor) == 1 else "(" + ", ".join(str(v) for v in anchor) + ")"


def two_valued_warning(channels, path, valid=None, *, labels: int = 2) -> str | None:
    """A one-line warning naming ``path`` when the mask is not close to two-valued, else None.

    Args:
      channels: int[H, W] or int[H, W, C] decoded values (`decode_mask`).
      path: the file, named in the warning.
      valid: optional bool[H, W] (ignore pixels are not looked at).
      labels: values a clean mask may have (`off_value_fraction`).
    """
    fraction, anchors = off_value_fraction(channels, valid, labels=labels)
    if fraction <= OFF_VALUE_LIMIT:
        return None
    what = "colours" if np.ndim(channels) == 3 and np.shape(channels)[-1] > 1 else "values"
    anchor_text = ", ".join(_value_text(a) for a in anchors)
    kind = "two-valued" if labels == 2 else "label"
    return (f"{path}: not a {kind} mask: {100.0 * fraction:.1f}% of its pixels are far from its commonest "
            f"{what} {anchor_text} (a photo, noise or a soft mask?); it was binarised anyway")


def values_summary(values, valid=None) -> str:
    """Short text of a file's values for error messages: ``"only 0"``, ``"0, 3"``, ``"0..255 (187 distinct)"``."""
    values = np.asarray(values)
    if valid is not None:
        values = values[np.asarray(valid, bool)]
    distinct = np.unique(values)
    if distinct.size == 0:
        return "no labelled pixel"
    if distinct.size == 1:
        return f"only {int(distinct[0])}"
    if distinct.size <= 4:
        return ", ".join(str(int(v)) for v in distinct)
    return f"{int(distinct[0])}..{int(distinct[-1])} ({distinct.size} distinct)"


@dataclasses.dataclass(frozen=True)
class MaskReading:
    """A ground-truth mask read by `read_mask_checked`.

    Attributes:
      foreground: bool[H, W] object pixels (False at ignore pixels).
      valid: bool[H, W], False at ignore pixels.
      values: int[H, W] the decoded values.
      rule: the rule applied (the rule given, for every file).
      warning: a line naming the file when the mask is not close to two-valued, else None.
    """

    foreground: np.ndarray
    valid: np.ndarray
    values: np.ndarray
    rule: MaskRule
    warning: str | None


def read_mask_checked(path, rule: MaskRule | str = DEFAULT_RULE, ignore_value: int | None = None) -> MaskReading:
    """Reads a mask like `read_gt_mask` and checks that it is two-valued.

    Args:
      path: mask file.
      rule: foreground rule (default ``>128``), applied whatever values the file holds.
      ignore_value: pixel value marking ignore pixels, or None.

    Returns:
      `MaskReading` (see the module doc for the warning;
      ``==N`` / ``!=N`` rules accept label maps of up to `MAX_LABELS` values).

    Raises:
      MaskReadError: unreadable file (names the file).
    """
    values, channels = decode_mask(path)
    valid = np.ones(values.shape, bool) if ignore_value is None else values != ignore_value
    rule = parse_rule(rule) if isinstance(rule, str) else rule
    foreground = rule.apply(values) & valid
    labels = MAX_LABELS if rule.op in ("==", "!=") else 2  # id rules read label maps
    warning = two_valued_warning(channels, path, valid, labels=labels)
    return MaskReading(foreground, valid, values, rule, warning)


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
