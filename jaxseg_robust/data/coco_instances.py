"""COCO / LVIS instance-segmentation files: ground truth and detection results, checked and indexed.

Follows docs/protocols/boundary_ap_pq.md ("Input files"). Ground truth is a
COCO-format JSON (``images`` with ``height``/``width``, ``annotations`` with
polygon, uncompressed-RLE or compressed-RLE ``segmentation``, ``area`` and
``iscrowd``, ``categories``); results are a JSON list of ``{image_id,
category_id, score, segmentation}``. Every mask is kept as its checked run
lengths (`jaxseg_robust.data.coco_rle`); polygons are rasterised by
pycocotools' ``frPyObjects`` (the optional extra ``coco``) exactly as the
official evaluators do, so every mask is bit-identical to theirs.

Every problem the official evaluators would fail on, or silently mishandle,
raises :class:`CocoFormatError` naming the image, the annotation id or the
result's position in the file; what they silently skip (detections of unknown
categories) is reported through ``warn``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import json
import math
import pathlib
import warnings
from collections.abc import Callable, Mapping

import numpy as np

from jaxseg_robust.data.coco_rle import foreground_pixels, string_runs, strings_runs_flat

COCO_EXTRA_HINT = "pip install 'jaxseg_robust[coco]' (or: pip install pycocotools)"


class CocoFormatError(ValueError):
    """A ground-truth or results file the evaluators cannot use (the message names the item)."""


class CocoEvalWarning(UserWarning):
    """Something the official evaluators skip silently (e.g. detections of unknown categories)."""


def mask_api():
    """``pycocotools.mask``; ImportError naming the ``coco`` extra when it is missing."""
    try:
        import pycocotools.mask as mask_utils  # noqa: PLC0415 - optional dependency
    except ImportError:
        raise ImportError(f"COCO-format masks need pycocotools: {COCO_EXTRA_HINT}") from None
    return mask_utils


def default_warn(message: str) -> None:
    """Emits a :class:`CocoEvalWarning`."""
    warnings.warn(message, CocoEvalWarning, stacklevel=3)


@dataclasses.dataclass(slots=True)
class Mask:
    """One annotation's or detection's mask as compressed RLE plus what the evaluators read from it.

    Attributes:
      runs: int [m] run lengths (column-major, background first), covering the image (int32 when
        read from compressed strings, as every COCO image has fewer than 2^31 pixels; else int64).
      area: the ``area`` the evaluator uses (ground truth: the file's field;
        detections: the mask's pixel count, or the box area, see docs).
      category_id: category.
    """

    runs: np.ndarray
    area: float
    category_id: object


@dataclasses.dataclass(slots=True)
class GroundTruthMask(Mask):
    """A ground-truth annotation (``ann_id``; ``crowd`` = iscrowd; ``ignore`` = ignore or iscrowd;
    ``label``: what an error message calls it)."""

    label: str = ""
    ann_id: object = None
    crowd: bool = False
    ignore: bool = False


@dataclasses.dataclass(slots=True)
class Detection(Mask):
    """A detection (``index``: 0-based position in the results list; ``score``; ``image_id``)."""

    index: int = 0
    score: float = 0.0
    image_id: object = None

    @property
    def label(self) -> str:
        """What an error message calls the detection: ``results[i] (image ...)``."""
        return _result_label(self.index, self.image_id)


@dataclasses.dataclass
class GroundTruth:
    """An indexed ground-truth file.

    Attributes:
      images: image id -> (height, width); image_ids: sorted ids.
      categories: category id -> category dict; category_ids: sorted ids.
      annotations: image id -> ground-truth masks in file order.
      dataset: the raw JSON dict (LVIS fields are read from it).
    """

    images: dict
    image_ids: list
    categories: dict
    category_ids: list
    annotations: dict
    dataset: dict


# ---- file reading ------------------------------------------------------------------------------

@contextlib.contextmanager
def collection_paused():
    """Pauses Python's cyclic garbage collector (restored on exit, as it was).

    Reading a results file makes millions of small objects and no cycles;
    each automatic collection would walk all of them again.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def read_json(source, what: str):
    """A JSON document from a path, or ``source`` itself when it is already a dict / list."""
    if isinstance(source, (dict, list)):
        return source
    path = pathlib.Path(source)
    if not path.is_file():
        raise CocoFormatError(f"{what} {path} does not exist")
    try:
        with open(path, encoding="utf-8") as handle, collection_paused():
            return json.load(handle)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CocoFormatError(f"{what} {path} is not readable JSON: {error}") from None


# ---- RLE checks ----------------------------------------------------------------------------------

def checked_runs(rle: Mapping, height: int, width: int) -> np.ndarray:
    """The run lengths of an RLE dict, checked against an ``height x width`` image.

    Raises:
      ValueError: wrong ``size``, unreadable counts, a negative run, or runs
        that do not cover the image exactly.
    """
    _check_size(rle, height, width)
    counts = rle.get("counts")
    if isinstance(counts, (str, bytes)):
        runs = string_runs(counts)
    elif isinstance(counts, list) and all(isinstance(c, int) and not isinstance(c, bool) for c in counts):
        runs = np.asarray(counts, np.int64)
    else:
        raise ValueError(f"RLE counts must be a string or a list of ints, got {type(counts).__name__}")
    if runs.size and runs.min() < 0:
        raise ValueError("RLE holds a negative run length")
    if int(runs.sum()) != height * width:
        raise ValueError(f"RLE runs cover {int(runs.sum())} pixels, the image has {height * width}")
    return runs


def _check_size(rle: Mapping, height: int, width: int) -> None:
    size = rle.get("size")
    if not isinstance(size, (list, tuple)) or len(size) != 2 or [int(v) for v in size] != [height, width]:
        raise ValueError(f"RLE size {size!r} differs from the image's [{height}, {width}]")


def _polygon_string(segmentation, height: int, width: int) -> bytes:
    """The compressed RLE string of polygons, rasterised and merged by pycocotools as the official ``annToRLE``."""
    if not segmentation or not all(isinstance(p, list) and len(p) >= 4 for p in segmentation):
        raise ValueError("polygons must be a non-empty list of coordinate lists")
    mask_utils = mask_api()
    try:
        return mask_utils.merge(mask_utils.frPyObjects(segmentation, height, width))["counts"]
    except Exception as error:  # noqa: BLE001 - pycocotools raises bare Exceptions on bad polygons
        raise ValueError(f"polygons unusable: {error}") from None


def to_runs(segmentation, height: int, width: int) -> np.ndarray:
    """A segmentation (polygons, uncompressed or compressed RLE) as checked run lengths (int64).

    Polygons are rasterised and merged by pycocotools as the official
    ``annToRLE`` does (the only use of pycocotools). Raises ValueError on
    anything unusable.
    """
    if isinstance(segmentation, list):
        return string_runs(_polygon_string(segmentation, height, width))
    if not isinstance(segmentation, Mapping):
        raise ValueError(f"segmentation must be polygons or an RLE dict, got {type(segmentation).__name__}")
    return checked_runs(segmentation, height, width)


def _string_counts(segmentation, height: int, width: int):
    """The compressed string of an RLE dict of the right size (checked), or None for any other segmentation."""
    if type(segmentation) is dict:  # the common case, without the ABC check of Mapping
        counts = segmentation.get("counts")
        if type(counts) is str or type(counts) is bytes:
            if segmentation.get("size") != [height, width]:
                _check_size(segmentation, height, width)
            return counts
        return None
    if isinstance(segmentation, Mapping) and isinstance(segmentation.get("counts"), (str, bytes)):
        _check_size(segmentation, height, width)
        return segmentation["counts"]
    return None


def _parity_sums(flat: np.ndarray, first: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """int64 [n] sums of each piece's runs (all, and those at odd positions within the piece: its foreground).

    Two cumulative sums over the even and the odd positions of the whole
    array (half its length each) give both; no per-run temporary.
    """
    even = np.concatenate([[0], np.cumsum(flat[0::2])])
    odd = np.concatenate([[0], np.cumsum(flat[1::2])])
    end = first + counts
    even_sum = even[(end + 1) // 2] - even[(first + 1) // 2]
    odd_sum = odd[end // 2] - odd[first // 2]
    return even_sum + odd_sum, np.where(first & 1, even_sum, odd_sum)


def _runs_at_once(items: list) -> tuple[list, np.ndarray]:
    """:func:`segmentations_runs` for valid input; any problem raises a ValueError that may not name the item."""
    strings, string_items, pixels = [], [], []
    runs: list = [None] * len(items)
    foreground = np.zeros(len(items), np.int64)
    for index, (segmentation, height, width) in enumerate(items):
        counts = _string_counts(segmentation, height, width)
        if counts is None and isinstance(segmentation, list):
            counts = _polygon_string(segmentation, height, width)
        if counts is None:
            runs[index] = to_runs(segmentation, height, width)
            foreground[index] = foreground_pixels(runs[index])
            continue
        strings.append(counts)
        string_items.append(index)
        pixels.append(height * width)
    for start in range(0, len(strings), STRINGS_PER_PASS):
        block = slice(start, start + STRINGS_PER_PASS)
        block_runs, foreground[string_items[block]] = _strings_block(strings[block], pixels[block])
        for index, one in zip(string_items[block], block_runs):
            runs[index] = one
    return runs, foreground


STRINGS_PER_PASS = 1 << 15  # compressed strings read per pass (bounds the temporaries of a large file)


def _strings_block(strings: list, pixels: list) -> tuple[list, np.ndarray]:
    """The checked runs of compressed strings (each covering its ``pixels``) and their foreground pixels."""
    flat, counts = strings_runs_flat(strings)
    if flat.size and flat.min() < 0:
        raise ValueError("a negative run length")
    first = np.cumsum(counts) - counts
    covered, foreground = _parity_sums(flat, first, counts)
    if not np.array_equal(covered, np.asarray(pixels, np.int64)):
        raise ValueError("runs that do not cover the image")
    if flat.size and int(flat.max()) <= np.iinfo(np.int32).max:
        flat = flat.astype(np.int32)  # half the memory of every mask held until its pairs are counted
    bounds = np.append(first, flat.size).tolist()
    return [flat[bounds[k]:bounds[k + 1]] for k in range(len(strings))], foreground


class SegmentationError(ValueError):
    """An unusable segmentation among many: ``index`` = its position (None if no single item fails), ``reason``."""

    def __init__(self, index: int | None, reason: str):
        super().__init__(f"item {index}: {reason}")
        self.index, self.reason = index, reason


def segmentations_runs(items: list) -> tuple[list, np.ndarray]:
    """Checked run lengths of many segmentations at once, and their foreground pixel counts.

    Compressed strings (and the strings pycocotools makes of polygons) are
    read in one vectorised pass and checked together; only when that finds a
    problem are the items gone through one by one, to name the first bad one.

    Args:
      items: list of ``(segmentation, height, width)`` (polygons, uncompressed or compressed RLE).

    Returns:
      (list of run-length arrays (int32 from strings, see `Mask`), int64 [n] foreground pixels).

    Raises:
      SegmentationError: for the first unusable item.
    """
    try:
        return _runs_at_once(items)
    except ValueError as error:
        for index, (segmentation, height, width) in enumerate(items):
            try:
                to_runs(segmentation, height, width)
            except ValueError as item_error:
                raise SegmentationError(index, str(item_error)) from None
        raise SegmentationError(None, str(error)) from None


def _named_runs(items: list, labels: list) -> tuple[list, np.ndarray]:
    """:func:`segmentations_runs`, its error as a CocoFormatError naming the item by ``labels[i]``."""
    try:
        return segmentations_runs(items)
    except SegmentationError as error:
        where = labels[error.index] if error.index is not None else "a segmentation"
        raise CocoFormatError(f"{where}: {error.reason}") from None


# ---- ground truth ----------------------------------------------------------------------------------

def _number(value, what: str) -> float:
    numeric = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))
    if not numeric or not math.isfinite(value):
        raise CocoFormatError(f"{what} must be a finite number, got {value!r}")
    return float(value)


def _index_images(dataset: Mapping) -> dict:
    images = {}
    for position, image in enumerate(dataset.get("images") or []):
        if not isinstance(image, Mapping) or "id" not in image:
            raise CocoFormatError(f"ground truth: images[{position}] has no 'id'")
        label = f"ground truth: image {image['id']!r}"
        if image["id"] in images:
            raise CocoFormatError(f"{label} is listed twice")
        try:
            height, width = int(image["height"]), int(image["width"])
        except (KeyError, TypeError, ValueError):
            raise CocoFormatError(f"{label} needs integer 'height' and 'width'") from None
        if height <= 0 or width <= 0:
            raise CocoFormatError(f"{label} has size {height}x{width}")
        images[image["id"]] = (height, width)
    if not images:
        raise CocoFormatError("ground truth: no images")
    return images


def _index_categories(dataset: Mapping) -> dict:
    categories = {}
    for position, category in enumerate(dataset.get("categories") or []):
        if not isinstance(category, Mapping) or "id" not in category:
            raise CocoFormatError(f"ground truth: categories[{position}] has no 'id'")
        if category["id"] in categories:
            raise CocoFormatError(f"ground truth: category {category['id']!r} is listed twice")
        categories[category["id"]] = dict(category)
    if not categories:
        raise CocoFormatError("ground truth: no categories")
    return categories


def _ground_truth_fields(ann: Mapping, images: dict, categories: dict) -> dict:
    """The checked fields of a ground-truth annotation, all but its runs (:class:`GroundTruthMask` keywords)."""
    label = f"ground truth: annotation {ann.get('id')!r} (image {ann.get('image_id')!r})"
    if ann.get("image_id") not in images:
        raise CocoFormatError(f"{label}: the image is not in 'images'")
    if ann.get("category_id") not in categories:
        raise CocoFormatError(f"{label}: unknown category_id {ann.get('category_id')!r}")
    if "area" not in ann:
        raise CocoFormatError(f"{label} has no 'area' (the evaluators read it for the area ranges)")
    if "segmentation" not in ann:
        raise CocoFormatError(f"{label} has no 'segmentation'")
    crowd = bool(ann.get("iscrowd", 0))
    return {"area": _number(ann["area"], f"{label} 'area'"), "category_id": ann["category_id"], "label": label,
            "ann_id": ann["id"], "crowd": crowd, "ignore": bool(ann.get("ignore", 0)) or crowd}


def load_ground_truth(source) -> GroundTruth:
    """Reads and checks a COCO / LVIS ground-truth file (path or dict; a loaded GroundTruth is returned as is).

    Raises:
      CocoFormatError: naming the image, category or annotation at fault.
      ImportError: polygons without pycocotools (names the ``coco`` extra).
    """
    if isinstance(source, GroundTruth):
        return source
    dataset = read_json(source, "ground-truth file")
    if not isinstance(dataset, Mapping):
        raise CocoFormatError(f"ground truth must be a JSON object, got {type(dataset).__name__}")
    images, categories = _index_images(dataset), _index_categories(dataset)
    seen, fields, items = set(), [], []
    for position, ann in enumerate(dataset.get("annotations") or []):
        if not isinstance(ann, Mapping) or "id" not in ann:
            raise CocoFormatError(f"ground truth: annotations[{position}] has no 'id'")
        if ann["id"] in seen:
            raise CocoFormatError(f"ground truth: annotation id {ann['id']!r} is used twice")
        seen.add(ann["id"])
        fields.append(_ground_truth_fields(ann, images, categories))
        items.append((ann["segmentation"], *images[ann["image_id"]]))
    runs, _ = _named_runs(items, [f["label"] for f in fields])
    annotations: dict = {image_id: [] for image_id in images}
    for ann, ann_fields, ann_runs in zip(dataset.get("annotations") or [], fields, runs):
        annotations[ann["image_id"]].append(GroundTruthMask(runs=ann_runs, **ann_fields))
    try:
        image_ids, category_ids = sorted(images), sorted(categories)
    except TypeError:
        raise CocoFormatError("ground truth: image and category ids must be of one sortable type") from None
    return GroundTruth(images, image_ids, categories, category_ids, annotations, dict(dataset))


# ---- results ---------------------------------------------------------------------------------------

def _result_label(index: int, image_id) -> str:
    return f"results[{index}] (image {image_id!r})"


class _ResultLabels:
    """``results[i] (image ...)`` of every result, formed only when an error names one (a sequence)."""

    def __init__(self, results: list):
        self._results = results

    def __getitem__(self, index: int) -> str:
        return _result_label(index, self._results[index]["image_id"])

    def __len__(self) -> int:
        return len(self._results)


_NUMBER_TYPES = (int, float)


def _numbers(values: list, labels, what: str) -> np.ndarray:
    """float64 [n] of finite numbers (plain ints / floats checked at once; otherwise one by one, naming the item)."""
    if all(type(value) in _NUMBER_TYPES for value in values):
        array = np.array(values, np.float64)
        if np.isfinite(array).all():
            return array
    return np.array([_number(value, f"{labels[index]} {what}") for index, value in enumerate(values)], np.float64)


def _box_areas(results: list, labels) -> np.ndarray:
    """float64 [n]: every result's ``bbox`` w * h (the official loader's area when the first result has a box)."""
    boxes = [result.get("bbox") for result in results]
    for index, box in enumerate(boxes):
        if not isinstance(box, (list, tuple)) or len(box) != 4:
            _box_area(results[index], labels[index])  # raises, naming the result
    widths = _numbers([box[2] for box in boxes], labels, "bbox width")
    heights = _numbers([box[3] for box in boxes], labels, "bbox height")
    return widths * heights

def _box_area(result: Mapping, label: str) -> float:
    box = result.get("bbox")
    if not isinstance(box, (list, tuple)) or len(box) != 4:
        raise CocoFormatError(f"{label}: the first result has a 'bbox', so every result needs one "
                              "(its area is the box area, as the official loader does)")
    return _number(box[2], f"{label} bbox width") * _number(box[3], f"{label} bbox height")


def _check_result_ids(results: list, gt: GroundTruth) -> None:
    missing = {}
    for index, result in enumerate(results):
        if not isinstance(result, Mapping):
            raise CocoFormatError(f"results[{index}] is not an object")
        for key in ("image_id", "category_id", "score", "segmentation"):
            if key not in result:
                raise CocoFormatError(f"results[{index}] has no {key!r}")
        if result["image_id"] not in gt.images:
            missing.setdefault(result["image_id"], index)
    if missing:
        shown = ", ".join(f"{image!r} (results[{index}])" for image, index in list(missing.items())[:5])
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        raise CocoFormatError(f"results hold {len(missing)} image id(s) that are not in the ground truth: "
                              f"{shown}{more}")


def load_detections(source, gt: GroundTruth, *, box_area: bool | None = None, area_field: bool = False,
                    warn: Callable[[str], None] = default_warn) -> tuple[dict, list[Detection]]:
    """Reads and checks a results file against the ground truth.

    Args:
      source: path or list of result dicts.
      gt: the loaded ground truth.
      box_area: use ``bbox`` w*h as each detection's area (the official loaders
        do so when the first result has a ``bbox``); None = decide as they do
        (COCO: a non-empty ``bbox``; the caller passes LVIS' rule explicitly).
      area_field: each result carries the area to use in its ``area`` field (results that
        pycocotools' ``loadRes`` has already completed); overrides ``box_area``.
      warn: receives one message per silently skipped group (unknown categories).

    Returns:
      (image id -> detections of known categories in file order, every detection in file order).

    Raises:
      CocoFormatError: naming the result by its position (``results[i]``) and its image.
    """
    with collection_paused():
        return _load_detections(source, gt, box_area, area_field, warn)


def _load_detections(source, gt: GroundTruth, box_area, area_field: bool, warn) -> tuple[dict, list[Detection]]:
    results = read_json(source, "results file")
    if not isinstance(results, list):
        raise CocoFormatError(f"results must be a JSON list of detections, got {type(results).__name__}")
    _check_result_ids(results, gt)
    if box_area is None and not area_field:
        box_area = bool(results) and bool(results[0].get("bbox"))
    by_image: dict = {image_id: [] for image_id in gt.images}
    every, unknown = [], {}
    labels = _ResultLabels(results)
    runs, foreground = _named_runs([(r["segmentation"], *gt.images[r["image_id"]]) for r in results], labels)
    scores = _numbers([result["score"] for result in results], labels, "'score'")
    if area_field:
        areas = _numbers([result.get("area") for result in results], labels, "'area'")
    else:
        areas = _box_areas(results, labels) if box_area else foreground.astype(np.float64)
    categories = gt.categories
    for index, (result, mask_runs, area, score) in enumerate(zip(results, runs, areas.tolist(), scores.tolist())):
        category_id, image_id = result["category_id"], result["image_id"]
        detection = Detection(mask_runs, area, category_id, index, score, image_id)
        every.append(detection)
        if category_id in categories:
            by_image[image_id].append(detection)
        else:
            unknown.setdefault(category_id, []).append(index)
    if unknown:
        shown = ", ".join(f"{cat!r} ({len(ix)}, first results[{ix[0]}])" for cat, ix in list(unknown.items())[:5])
        warn(f"{sum(map(len, unknown.values()))} detection(s) have category ids not in the ground truth and are "
             f"not evaluated (the official evaluators skip them silently): {shown}")
    if not results:
        warn("the results file holds no detections: every AP and AR is 0")
    return by_image, every


__all__ = ["COCO_EXTRA_HINT", "CocoFormatError", "CocoEvalWarning", "mask_api", "default_warn", "collection_paused",
           "Mask",
           "GroundTruthMask", "Detection", "GroundTruth", "read_json", "checked_runs", "to_runs",
           "SegmentationError", "segmentations_runs", "load_ground_truth", "load_detections"]
