"""COCO panoptic files: a JSON of ``segments_info`` per image plus a folder of id-coded PNGs, checked and paired.

Follows docs/protocols/boundary_ap_pq.md ("Panoptic input"). Each PNG codes a
segment id per pixel as ``R + 256 G + 256^2 B`` (0 = VOID). Every problem
panopticapi's ``pq_compute`` raises on is raised here too, as a
:class:`PanopticFormatError` naming the image and segment; what it skips
silently (predictions for images that are not in the ground truth) goes to
``warn``.
"""

from __future__ import annotations

import dataclasses
import pathlib
from collections.abc import Callable, Mapping

import numpy as np
from PIL import Image

from jaxseg_robust.data.coco_instances import CocoFormatError, read_json
from jaxseg_robust.metrics.panoptic import Segments


class PanopticFormatError(CocoFormatError):
    """A panoptic JSON or PNG the evaluator cannot use (the message names the image and segment)."""


@dataclasses.dataclass(frozen=True)
class PanopticPair:
    """One image to evaluate: its id, both PNG paths and both segment tables (sorted by id)."""

    image_id: object
    gt_png: pathlib.Path
    pred_png: pathlib.Path
    gt: Segments
    pred: Segments


def _segments(annotation: Mapping, side: str, categories: Mapping, with_area: bool) -> Segments:
    """The listed segments of one annotation, sorted by id (with checks)."""
    image = annotation.get("image_id")
    info = annotation.get("segments_info")
    if not isinstance(info, list):
        raise PanopticFormatError(f"{side}: image {image!r} has no 'segments_info' list")
    ids, category, crowd, area = [], [], [], []
    for position, segment in enumerate(info):
        label = f"{side}: image {image!r} segment {segment.get('id') if isinstance(segment, Mapping) else position!r}"
        if not isinstance(segment, Mapping) or not isinstance(segment.get("id"), int):
            raise PanopticFormatError(f"{label}: a segment needs an integer 'id'")
        if not 0 < segment["id"] < 2**24:
            raise PanopticFormatError(f"{label}: segment ids are RGB codes in 1..2^24-1")
        if segment.get("category_id") not in categories:
            raise PanopticFormatError(f"{label} has unknown category_id {segment.get('category_id')!r}")
        if with_area and not isinstance(segment.get("area"), (int, float)):
            raise PanopticFormatError(f"{label} has no numeric 'area' (the evaluator reads it for the IoU union)")
        ids.append(segment["id"])
        category.append(segment["category_id"])
        crowd.append(bool(segment.get("iscrowd", 0)))
        area.append(float(segment.get("area", 0)))
    if len(set(ids)) != len(ids):
        duplicated = sorted({i for i in ids if ids.count(i) > 1})
        raise PanopticFormatError(f"{side}: image {image!r} lists segment id(s) {duplicated} twice")
    order = np.argsort(np.asarray(ids, np.int64), kind="stable")
    return Segments(ids=np.asarray(ids, np.int64)[order], category=np.asarray(category, object)[order],
                    crowd=np.asarray(crowd, bool)[order], area=np.asarray(area, np.float64)[order], order=order)


def load_pairs(gt_json, gt_folder, pred_json, pred_folder, *,
               warn: Callable[[str], None]) -> tuple[dict, list[PanopticPair]]:
    """Reads both JSONs and pairs every ground-truth image with its prediction.

    Returns:
      (categories: id -> dict of the ground truth, pairs in ground-truth order).

    Raises:
      PanopticFormatError: a missing folder or prediction, unknown categories,
        duplicated or malformed segments (naming the image).
    """
    gt_doc, pred_doc = read_json(gt_json, "ground-truth JSON"), read_json(pred_json, "prediction JSON")
    for name, doc in (("ground-truth", gt_doc), ("prediction", pred_doc)):
        if not isinstance(doc, Mapping) or not isinstance(doc.get("annotations"), list):
            raise PanopticFormatError(f"the {name} JSON needs an 'annotations' list")
    categories = {c["id"]: dict(c) for c in gt_doc.get("categories") or [] if isinstance(c, Mapping) and "id" in c}
    if not categories:
        raise PanopticFormatError("the ground-truth JSON has no categories")
    folders = {}
    for name, folder in (("ground-truth", gt_folder), ("prediction", pred_folder)):
        folders[name] = pathlib.Path(folder)
        if not folders[name].is_dir():
            raise PanopticFormatError(f"{name} PNG folder {folder} does not exist")
    predictions = {a.get("image_id"): a for a in pred_doc["annotations"] if isinstance(a, Mapping)}
    gt_images = {a.get("image_id") for a in gt_doc["annotations"] if isinstance(a, Mapping)}
    pairs = []
    for annotation in gt_doc["annotations"]:
        image_id = annotation.get("image_id")
        if image_id not in predictions:
            raise PanopticFormatError(f"no prediction for the image with id {image_id!r}")
        prediction = predictions[image_id]
        for name, doc in (("ground-truth", annotation), ("prediction", prediction)):
            if not isinstance(doc.get("file_name"), str):
                raise PanopticFormatError(f"{name}: image {image_id!r} has no PNG 'file_name'")
        pairs.append(PanopticPair(image_id, folders["ground-truth"] / annotation["file_name"],
                                  folders["prediction"] / prediction["file_name"],
                                  _segments(annotation, "ground truth", categories, with_area=True),
                                  _segments(prediction, "prediction", categories, with_area=False)))
    extra = [i for i in predictions if i not in gt_images]
    if extra:
        warn(f"{len(extra)} prediction(s) are for images that are not in the ground truth and are not evaluated "
             f"(first: {extra[0]!r})")
    return categories, pairs


def read_png_rgb(path: pathlib.Path, what: str) -> np.ndarray:
    """uint8 [H, W, 3] pixels of a panoptic PNG (an alpha channel is dropped, as the reference does)."""
    try:
        with Image.open(path) as image:
            data = np.asarray(image)
    except (OSError, ValueError) as error:
        raise PanopticFormatError(f"{what} {path} is not a readable image: {error}") from None
    if data.ndim != 3 or data.shape[2] < 3 or data.dtype != np.uint8:
        raise PanopticFormatError(f"{what} {path} must be an 8-bit RGB PNG (ids coded as R + 256 G + 256^2 B), "
                                  f"got shape {data.shape} dtype {data.dtype}")
    return data[..., :3]


__all__ = ["PanopticFormatError", "PanopticPair", "load_pairs", "read_png_rgb"]
