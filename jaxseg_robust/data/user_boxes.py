"""User-drawn boxes: readers (BREPS PNG layout, simple CSV) and the BREPS aggregation (§4.9).

Section numbers (§) refer to docs/protocols/breps.md.

Two inputs:

* **BREPS layout** (C-B ``evaluate_model_user.py``): a folder of binary PNGs,
  one per user box (the drawn rectangle rasterised as a mask), named
  ``<image stem>_1_<suffix>.png``. The box is the inclusive tight box
  ``(min col, min row, max col, max row)`` of the non-zero pixels. The
  reference takes the image stem as the text before the *first* ``_1_`` and
  then patches the one stem that breaks this rule (``BUID`` -> ``BUID_1``);
  here, when the image stems are given, a prompt belongs to the unique image
  stem ``s`` with ``prompt stem`` starting with ``s + "_1_"`` (which covers
  that case), and without them the first-``_1_`` rule applies. ``user`` is the
  suffix. Pixels count as drawn when any channel is non-zero (the reference
  reads the file as OpenCV grey, ``> 0``; identical for grey and 0/255 masks).
* **CSV**: header ``image_id,x1,y1,x2,y2`` with an optional sixth column
  ``user``; one box per row in evaluation-frame pixels (``x2 >= x1``,
  ``y2 >= y1``, finite numbers).

Boxes are in the frame of the files (the evaluation frame). The reference
evaluates SAM at the 1024-resized resolution and takes each box from the
prompt mask resized there (torch antialiased bilinear, ``> 0``);
``read_user_box_masks(..., resized_long_side=1024)`` also records that box
(``box_resized``).

Aggregation (the BREPS notebook): the tight-box row is not a user box (keep it
out), dataset = the image id's prefix before the first ``_``, per image the
mean and the standard deviation (ddof = 1) of the users' IoUs, and per dataset
``mean over images of the per-image mean ± mean over images of the per-image
std``. NaNs are skipped as pandas does (an image with one user has a NaN std,
which the dataset mean skips).

Every error is a `UserBoxError` naming the file and the row or file name.
"""

from __future__ import annotations

import csv
import dataclasses
import math
import pathlib
from collections.abc import Iterable, Sequence

import numpy as np

from jaxseg_robust.data.masks_io import MaskReadError, read_mask
from jaxseg_robust.ops.resize import longest_side_shape, resize_bilinear_antialias_host

CSV_COLUMNS = ("image_id", "x1", "y1", "x2", "y2")
CSV_USER_COLUMN = "user"
PROMPT_SEPARATOR = "_1_"
PROMPT_SUFFIX = ".png"


class UserBoxError(ValueError):
    """A user-box file is malformed; the message names the file and the row or entry."""


@dataclasses.dataclass(frozen=True)
class UserBox:
    """One user's box on one image.

    Attributes:
      image_id: the image stem / id the box belongs to.
      box: (x1, y1, x2, y2) in evaluation-frame pixels (PNG layout: inclusive
        pixel indices of the drawn mask).
      user: the user id (PNG: the file-name suffix; CSV: the ``user`` column or "").
      source: where it was read from (``file:row N`` or the PNG path).
      box_resized: the reference's box in SAM's resized frame (PNG layout with
        ``resized_long_side``), else None.
    """

    image_id: str
    box: tuple[float, float, float, float]
    user: str
    source: str
    box_resized: tuple[float, float, float, float] | None = None


# ---- CSV ---------------------------------------------------------------------------

def _parse_coordinate(text: str, column: str, where: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise UserBoxError(f"{where}: column {column!r} is not a number: {text!r}") from None
    if not math.isfinite(value):
        raise UserBoxError(f"{where}: column {column!r} is not finite: {text!r}")
    return value


def read_user_boxes_csv(path) -> list[UserBox]:
    """Reads ``image_id,x1,y1,x2,y2[,user]`` boxes.

    Args:
      path: CSV file (UTF-8; blank lines are skipped).

    Returns:
      The boxes in file order.

    Raises:
      UserBoxError: missing file, missing or wrong header, a row with the wrong
        number of fields, an empty image id or user, a coordinate that is not a
        finite number, unordered corners (x2 < x1 or y2 < y1), the same
        (image_id, user) twice, or no boxes at all; the message names the file
        and the row (1-based line number).
    """
    path = pathlib.Path(path)
    if not path.is_file():
        raise UserBoxError(f"{path}: no such file")
    boxes: list[UserBox] = []
    seen: dict[tuple[str, str], int] = {}
    with path.open(newline="", encoding="utf-8") as handle:
        reader = csv.reader(handle)
        header = None
        for fields in reader:
            row = reader.line_num
            if not fields or all(not f.strip() for f in fields):
                continue
            fields = [f.strip() for f in fields]
            if header is None:
                header = tuple(fields)
                if header not in (CSV_COLUMNS, CSV_COLUMNS + (CSV_USER_COLUMN,)):
                    raise UserBoxError(f"{path}: row {row}: header must be {','.join(CSV_COLUMNS)}"
                                       f"[,{CSV_USER_COLUMN}]; got {','.join(fields)}")
                continue
            where = f"{path}: row {row}"
            if len(fields) != len(header):
                raise UserBoxError(f"{where}: expected {len(header)} fields ({','.join(header)}); "
                                   f"got {len(fields)}")
            image_id = fields[0]
            if not image_id:
                raise UserBoxError(f"{where}: empty image_id")
            x1, y1, x2, y2 = (_parse_coordinate(fields[i], CSV_COLUMNS[i], where) for i in range(1, 5))
            if x2 < x1 or y2 < y1:
                raise UserBoxError(f"{where}: corners not ordered (need x1 <= x2 and y1 <= y2); "
                                   f"got {(x1, y1, x2, y2)}")
            user = fields[5] if len(header) == 6 else ""
            if len(header) == 6:
                if not user:
                    raise UserBoxError(f"{where}: empty user")
                if (image_id, user) in seen:
                    raise UserBoxError(f"{where}: user {user!r} already has a box on image {image_id!r} "
                                       f"(row {seen[image_id, user]})")
                seen[image_id, user] = row
            boxes.append(UserBox(image_id, (x1, y1, x2, y2), user, where))
    if header is None:
        raise UserBoxError(f"{path}: empty file (expected the header {','.join(CSV_COLUMNS)}[,user])")
    if not boxes:
        raise UserBoxError(f"{path}: no boxes after the header")
    return boxes


# ---- BREPS PNG layout ----------------------------------------------------------------------

def image_stem_of(prompt_stem: str, image_stems: Iterable[str] | None = None) -> tuple[str, str]:
    """Splits a prompt file stem ``<image stem>_1_<suffix>`` into (image stem, suffix).

    Args:
      prompt_stem: file stem without ``.png``.
      image_stems: known image stems; when given, the unique stem ``s`` with
        ``prompt_stem.startswith(s + "_1_")`` is chosen (else the text before
        the first ``_1_``, the reference's rule).

    Raises:
      UserBoxError: no ``_1_`` in the stem, no image stem matches, or several do.
    """
    if PROMPT_SEPARATOR not in prompt_stem:
        raise UserBoxError(f"{prompt_stem}: prompt file names must look like "
                           f"<image stem>{PROMPT_SEPARATOR}<suffix>{PROMPT_SUFFIX}")
    if image_stems is None:
        cut = prompt_stem.index(PROMPT_SEPARATOR)
        return prompt_stem[:cut], prompt_stem[cut + len(PROMPT_SEPARATOR):]
    matches = sorted(s for s in set(image_stems) if prompt_stem.startswith(s + PROMPT_SEPARATOR))
    if not matches:
        raise UserBoxError(f"{prompt_stem}: no image stem s with name s{PROMPT_SEPARATOR}<suffix>")
    if len(matches) > 1:
        raise UserBoxError(f"{prompt_stem}: ambiguous image stem, candidates {matches}")
    stem = matches[0]
    return stem, prompt_stem[len(stem) + len(PROMPT_SEPARATOR):]


def _inclusive_box(mask: np.ndarray) -> tuple[float, float, float, float] | None:
    rows = np.flatnonzero(mask.any(axis=1))
    cols = np.flatnonzero(mask.any(axis=0))
    if rows.size == 0:
        return None
    return (float(cols[0]), float(rows[0]), float(cols[-1]), float(rows[-1]))


def resized_prompt_box(mask, long_side: int) -> tuple[float, float, float, float] | None:
    """The reference's box of a prompt mask: tight box of the mask resized to SAM's frame, ``> 0``.

    Args:
      mask: bool [H, W] prompt mask.
      long_side: SAM's input side (1024).

    Returns:
      (x1, y1, x2, y2) in the resized frame (inclusive indices), or None if empty.
    """
    mask = np.asarray(mask) > 0
    out_hw = longest_side_shape(mask.shape[0], mask.shape[1], long_side)
    resized = resize_bilinear_antialias_host(mask[..., None].astype(np.float32), out_hw)[..., 0] > 0
    return _inclusive_box(resized)


def read_user_box_masks(prompts_dir, image_stems: Iterable[str] | None = None, *,
                        resized_long_side: int | None = None) -> list[UserBox]:
    """Reads the BREPS layout: one binary PNG per user box, ``<image stem>_1_<suffix>.png``.

    Args:
      prompts_dir: folder of prompt PNGs (other files are ignored).
      image_stems: optional known image stems (see `image_stem_of`); prompts of
        unknown images are then an error.
      resized_long_side: when given (SAM: 1024), also record the reference's
        resized-frame box (`resized_prompt_box`).

    Returns:
      The boxes, sorted by file name.

    Raises:
      UserBoxError: missing folder, no prompt files, a badly named, unreadable
        or empty prompt mask (the message names the file).
    """
    folder = pathlib.Path(prompts_dir)
    if not folder.is_dir():
        raise UserBoxError(f"{folder}: not a directory")
    stems = None if image_stems is None else list(image_stems)
    paths = sorted(p for p in folder.iterdir() if p.is_file() and p.suffix.lower() == PROMPT_SUFFIX)
    if not paths:
        raise UserBoxError(f"{folder}: no {PROMPT_SUFFIX} prompt masks")
    boxes = []
    for path in paths:
        try:
            image_id, user = image_stem_of(path.stem, stems)
        except UserBoxError as error:
            raise UserBoxError(f"{path}: {error}") from None
        try:
            mask = read_mask(path, "!=0")
        except MaskReadError as error:
            raise UserBoxError(str(error)) from None
        box = _inclusive_box(mask)
        if box is None:
            raise UserBoxError(f"{path}: empty prompt mask (no drawn pixel, so no box)")
        resized = None if resized_long_side is None else resized_prompt_box(mask, resized_long_side)
        boxes.append(UserBox(image_id, box, user, str(path), resized))
    return boxes


def boxes_by_image(boxes: Sequence[UserBox], *, resized: bool = False) -> dict[str, np.ndarray]:
    """Groups boxes per image in first-seen order: image_id -> float32[n, 4].

    Args:
      boxes: user boxes.
      resized: take ``box_resized`` (UserBoxError if a box lacks it).
    """
    grouped: dict[str, list] = {}
    for box in boxes:
        value = box.box_resized if resized else box.box
        if value is None:
            raise UserBoxError(f"{box.source}: no resized box (read with resized_long_side)")
        grouped.setdefault(box.image_id, []).append(value)
    return {image_id: np.asarray(values, np.float32) for image_id, values in grouped.items()}


# ---- aggregation ------------------------------------------------------------------------------

def dataset_of(image_id: str) -> str:
    """The dataset of an image id: its prefix before the first ``_`` (BREPS notebook)."""
    return str(image_id).split("_")[0]


@dataclasses.dataclass(frozen=True)
class ImageIouStats:
    """Per-image user statistics: mean and std (ddof = 1) of the non-NaN IoUs, and their count."""

    mean: float
    std: float
    count: int


@dataclasses.dataclass(frozen=True)
class UserIouSummary:
    """Per-dataset user-box result: ``mean ± std`` as the BREPS tables report it.

    Attributes:
      mean: mean over images of the per-image mean IoU.
      std: mean over images of the per-image std (images with one user skipped).
      n_images: images with at least one non-NaN IoU; n_boxes: boxes counted.
    """

    mean: float
    std: float
    n_images: int
    n_boxes: int


def _check_pairs(image_ids, ious) -> tuple[list[str], np.ndarray]:
    image_ids = [str(i) for i in image_ids]
    ious = np.asarray(ious, np.float64).reshape(-1)
    if len(image_ids) != ious.shape[0]:
        raise ValueError(f"image_ids ({len(image_ids)}) and ious ({ious.shape[0]}) must have equal length")
    return image_ids, ious


def per_image_iou_stats(image_ids: Sequence[str], ious) -> dict[str, ImageIouStats]:
    """Mean and std (ddof = 1) of the users' IoUs per image, NaNs skipped (pandas semantics).

    Args:
      image_ids: one id per box (user boxes only, no tight-box rows).
      ious: one IoU per box.

    Returns:
      image_id -> `ImageIouStats` in first-seen order (mean NaN without values,
      std NaN with fewer than two).
    """
    image_ids, ious = _check_pairs(image_ids, ious)
    grouped: dict[str, list[float]] = {}
    for image_id, value in zip(image_ids, ious):
        grouped.setdefault(image_id, []).append(value)
    stats = {}
    for image_id, values in grouped.items():
        values = np.asarray(values)
        values = values[~np.isnan(values)]
        mean = float(values.mean()) if values.size else math.nan
        std = float(values.std(ddof=1)) if values.size >= 2 else math.nan
        stats[image_id] = ImageIouStats(mean, std, int(values.size))
    return stats


def aggregate_user_ious(image_ids: Sequence[str], ious) -> dict[str, UserIouSummary]:
    """Per-dataset ``mean over images of the per-image mean ± mean of the per-image std``.

    Args:
      image_ids: one id per user box (dataset = prefix before the first ``_``).
      ious: one IoU per box.

    Returns:
      dataset -> `UserIouSummary`, datasets in first-seen order.
    """
    stats = per_image_iou_stats(image_ids, ious)
    grouped: dict[str, list[ImageIouStats]] = {}
    for image_id, stat in stats.items():
        grouped.setdefault(dataset_of(image_id), []).append(stat)
    summary = {}
    for dataset, image_stats in grouped.items():
        means = np.array([s.mean for s in image_stats])
        stds = np.array([s.std for s in image_stats])
        means, stds = means[~np.isnan(means)], stds[~np.isnan(stds)]
        summary[dataset] = UserIouSummary(
            mean=float(means.mean()) if means.size else math.nan,
            std=float(stds.mean()) if stds.size else math.nan,
            n_images=int(means.size), n_boxes=int(sum(s.count for s in image_stats)))
    return summary


__all__ = [
    "CSV_COLUMNS", "CSV_USER_COLUMN", "PROMPT_SEPARATOR", "UserBoxError", "UserBox",
    "read_user_boxes_csv", "image_stem_of", "resized_prompt_box", "read_user_box_masks",
    "boxes_by_image", "dataset_of", "ImageIouStats", "UserIouSummary", "per_image_iou_stats",
    "aggregate_user_ious",
]
