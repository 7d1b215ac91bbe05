"""COCO-format instance and panoptic test sets made from the real masks, and the official evaluators' loader.

Used by the Boundary AP / PQ parity tests (tests/test_coco_eval_parity.py) and
by experiments/benchmarks/bench_coco_eval.py; see docs/protocols/boundary_ap_pq.md.

Ground truth: every object mask of the shared real-data folders
(GrabCut, Berkeley, DAVIS with one instance per palette id, COCO-MVal), one
image per photo (Berkeley's ``<id>a``/``<id>b`` masks share their photo),
plus masks borrowed from other photos (placed at a random offset) so that
images hold several instances of one category. Some annotations are
polygons (OpenCV contours, COCO-style polygon ``area``), some RLE, a few
crowd regions.

Detections: perturbed copies of the ground-truth masks (shifts, erosions,
dilations and their combinations), dropped instances, spurious masks
borrowed from other photos, wrong categories, an occasional empty mask, and
random scores rounded to two decimals (so that ties occur and stable sorting
matters).

Panoptic: the same photos as COCO panoptic PNG + JSON: things are the
instance masks, stuff is the background split into bands, a VOID band
separates some segments, a few things are crowd; predictions perturb every
segment and repaint the stuff.

The official code (bowenc0221/boundary-iou-api) is loaded from a local
checkout (``JAXSEG_BOUNDARY_IOU_API_REPO``) with two shims: ``np.float``
(removed in NumPy 1.24) and ``panopticapi.utils`` (``rgb2id`` and
``get_traceback``; panopticapi is not on the package index).
"""

from __future__ import annotations

import csv
import importlib
import json
import os
import pathlib
import sys
import types
import zlib

import cv2
import numpy as np
from PIL import Image

REFERENCE_ENV = "JAXSEG_BOUNDARY_IOU_API_REPO"
DATASETS = ("grabcut", "berkeley", "davis", "coco_mval")


# ---- the real masks --------------------------------------------------------------------------------

def _object_masks(dataset: str, path: pathlib.Path) -> list[np.ndarray]:
    """The object masks (bool [H, W]) one mask file holds."""
    data = np.array(Image.open(path))
    if data.ndim == 3:
        data = data[..., 0]
    if dataset == "grabcut":
        return [data == 255]
    if dataset == "davis":
        return [data == value for value in np.unique(data) if value not in (0, 255)]
    return [data > 128]


def real_images(root) -> list[dict]:
    """One entry per photo: ``{"key", "height", "width", "objects": [(mask, category name)]}`` (sorted keys)."""
    root = pathlib.Path(root)
    photos: dict = {}
    for dataset in DATASETS:
        index = root / dataset / "index.csv"
        if not index.is_file():
            continue
        with open(index, newline="", encoding="utf-8") as handle:
            for row in csv.DictReader(handle):
                stem = pathlib.Path(row["image"]).stem
                if dataset == "berkeley" and stem[-1:] in ("a", "b"):
                    stem = stem[:-1]
                category = row.get("category") or dataset
                for mask in _object_masks(dataset, root / dataset / row["mask"]):
                    if not mask.any():
                        continue
                    entry = photos.setdefault(f"{dataset}/{stem}", {"height": mask.shape[0], "width": mask.shape[1],
                                                                    "objects": []})
                    entry["objects"].append((mask, category))
    return [{"key": key, **photos[key]} for key in sorted(photos)]


# ---- mask helpers ----------------------------------------------------------------------------------

def encode(mask: np.ndarray) -> dict:
    """Compressed RLE with string counts (as a results file holds it)."""
    import pycocotools.mask as mask_utils  # noqa: PLC0415

    rle = mask_utils.encode(np.asfortranarray(mask.astype(np.uint8)))
    return {"size": [int(v) for v in rle["size"]], "counts": rle["counts"].decode("ascii")}


def polygons(mask: np.ndarray) -> tuple[list, float]:
    """(COCO polygons of the mask's outer contours, their shoelace area) or ([], 0) when none has 3 points."""
    contours, _ = cv2.findContours(mask.astype(np.uint8), cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_SIMPLE)
    out, area = [], 0.0
    for contour in contours:
        points = contour.reshape(-1, 2).astype(np.float64)
        if len(points) < 3:
            continue
        out.append([float(v) for v in points.reshape(-1)])
        x, y = points[:, 0], points[:, 1]
        area += 0.5 * abs(float(np.dot(x, np.roll(y, 1)) - np.dot(y, np.roll(x, 1))))
    return out, area


def shifted(mask: np.ndarray, dy: int, dx: int) -> np.ndarray:
    """The mask moved by (dy, dx) pixels; what leaves the image is lost."""
    out = np.zeros_like(mask)
    h, w = mask.shape
    ys, yd = (slice(0, h - dy), slice(dy, h)) if dy >= 0 else (slice(-dy, h), slice(0, h + dy))
    xs, xd = (slice(0, w - dx), slice(dx, w)) if dx >= 0 else (slice(-dx, w), slice(0, w + dx))
    out[yd, xd] = mask[ys, xs]
    return out


def morphed(mask: np.ndarray, radius: int) -> np.ndarray:
    """Dilated (radius > 0) or eroded (radius < 0) by a square."""
    if radius == 0:
        return mask.copy()
    kernel = np.ones((2 * abs(radius) + 1,) * 2, np.uint8)
    op = cv2.dilate if radius > 0 else cv2.erode
    return op(mask.astype(np.uint8), kernel, borderType=cv2.BORDER_CONSTANT, borderValue=0).astype(bool)


def perturbed(mask: np.ndarray, rng) -> np.ndarray:
    """A random shift, erosion / dilation, or both."""
    kind = rng.integers(0, 3)
    out = mask
    if kind in (0, 2):
        out = shifted(out, int(rng.integers(-10, 11)), int(rng.integers(-10, 11)))
    if kind in (1, 2):
        out = morphed(out, int(rng.choice([-6, -4, -2, -1, 1, 2, 4, 6])))
    return out


def borrowed(mask: np.ndarray, height: int, width: int, rng) -> np.ndarray:
    """Another photo's mask placed at a random offset in a ``height x width`` image."""
    out = np.zeros((height, width), bool)
    h, w = min(mask.shape[0], height), min(mask.shape[1], width)
    y0, x0 = int(rng.integers(0, height - h + 1)), int(rng.integers(0, width - w + 1))
    out[y0:y0 + h, x0:x0 + w] = mask[:h, :w]
    return out


# ---- instance segmentation -------------------------------------------------------------------------

def _ground_truth(photos, rng, extra_objects: int):
    images, annotations, category_ids, objects = [], [], {}, []
    pool = [mask for photo in photos for mask, _ in photo["objects"]]
    for image_id, photo in enumerate(photos, start=1):
        h, w = photo["height"], photo["width"]
        images.append({"id": image_id, "height": h, "width": w, "file_name": photo["key"] + ".png"})
        items = list(photo["objects"])
        for _ in range(int(rng.integers(0, extra_objects + 1))):
            items.append((borrowed(pool[int(rng.integers(len(pool)))], h, w, rng), items[0][1]))
        for mask, category in items:
            category_id = category_ids.setdefault(category, len(category_ids) + 1)
            ann = {"id": len(annotations) + 1, "image_id": image_id, "category_id": category_id,
                   "iscrowd": int(rng.random() < 0.05)}
            polygon, polygon_area = polygons(mask)
            if not ann["iscrowd"] and polygon and rng.random() < 0.5:
                ann.update(segmentation=polygon, area=polygon_area)
            else:
                ann.update(segmentation=encode(mask), area=float(mask.sum()))
            annotations.append(ann)
            objects.append((image_id, category_id, mask))
    categories = [{"id": cid, "name": name, "supercategory": "object"} for name, cid in category_ids.items()]
    return {"images": images, "annotations": annotations, "categories": categories}, objects, pool


def instance_dataset(root, seed: int = 0, copies: int = 2, extra_objects: int = 2, spurious: int = 3,
                     max_images: int | None = None) -> tuple[dict, list]:
    """(COCO ground-truth dict, results list) built from the real masks.

    Args:
      root: the real-data folder; seed: random seed.
      copies: up to this many perturbed detections per ground truth (0..copies; 15% of objects get none).
      extra_objects: up to this many borrowed objects per photo.
      spurious: up to this many spurious detections per image.
      max_images: keep the first N photos (None = all).
    """
    rng = np.random.default_rng(seed)
    photos = real_images(root)[:max_images]
    gt, objects, pool = _ground_truth(photos, rng, extra_objects)
    n_categories = len(gt["categories"])
    results = []

    def add(image_id, category_id, mask):
        results.append({"image_id": image_id, "category_id": category_id, "segmentation": encode(mask),
                        "score": round(float(rng.random()), 2)})

    for image_id, category_id, mask in objects:
        if rng.random() < 0.15:
            continue
        for _ in range(int(rng.integers(1, copies + 1))):
            wrong = rng.random() < 0.05
            add(image_id, int(rng.integers(1, n_categories + 1)) if wrong else category_id, perturbed(mask, rng))
    for image in gt["images"]:
        h, w = image["height"], image["width"]
        for _ in range(int(rng.integers(0, spurious + 1))):
            add(image["id"], int(rng.integers(1, n_categories + 1)), borrowed(pool[int(rng.integers(len(pool)))],
                                                                             h, w, rng))
        if rng.random() < 0.02:
            add(image["id"], int(rng.integers(1, n_categories + 1)), np.zeros((h, w), bool))
    order = rng.permutation(len(results))
    return gt, [results[i] for i in order]


# ---- panoptic --------------------------------------------------------------------------------------

def id2rgb(ids: np.ndarray) -> np.ndarray:
    """uint8 [H, W, 3] with ``id = R + 256 G + 256^2 B`` (the COCO panoptic PNG code)."""
    ids = ids.astype(np.uint32)
    return np.stack([ids % 256, ids // 256 % 256, ids // 65536 % 256], axis=-1).astype(np.uint8)


def _stuff_bands(h: int, w: int, count: int, rng) -> np.ndarray:
    """int [H, W] band index 0..count-1 along a random direction with wavy borders."""
    yy, xx = np.mgrid[:h, :w].astype(np.float64)
    angle = rng.uniform(0, np.pi)
    t = np.cos(angle) * xx + np.sin(angle) * yy
    t = t + 12 * np.sin(yy / rng.uniform(15, 40)) + 12 * np.cos(xx / rng.uniform(15, 40))
    edges = np.quantile(t, np.linspace(0, 1, count + 1)[1:-1])
    return np.searchsorted(edges, t)


def _panoptic_pair(photo, rng, things: list, stuff_ids: list, pool: list):
    """(gt ids, gt segments, pred ids, pred segments) of one photo."""
    h, w = photo["height"], photo["width"]
    stuff = _stuff_bands(h, w, int(rng.integers(2, 5)), rng)
    gt_ids, pred_ids = np.zeros((h, w), np.int64), np.zeros((h, w), np.int64)
    gt_segments, pred_segments = [], []
    pred_stuff = shifted(stuff + 1, int(rng.integers(-6, 7)), int(rng.integers(-6, 7))) - 1
    for band in range(stuff.max() + 1):
        category = stuff_ids[int(rng.integers(len(stuff_ids)))]
        segment_id = int(rng.integers(1, 2**24))
        gt_ids[stuff == band] = segment_id
        gt_segments.append({"id": segment_id, "category_id": category, "iscrowd": 0})
        pred_id = int(rng.integers(1, 2**24))
        pred_ids[pred_stuff == band] = pred_id
        pred_segments.append({"id": pred_id, "category_id": category if rng.random() > 0.1 else
                              stuff_ids[int(rng.integers(len(stuff_ids)))]})
    objects = list(photo["objects"]) + [(borrowed(pool[int(rng.integers(len(pool)))], h, w, rng), None)
                                        for _ in range(int(rng.integers(0, 3)))]
    for mask, name in objects:
        if name is None:
            category = things[int(rng.integers(len(things)))]
        else:
            category = things[zlib.crc32(name.encode()) % len(things)]
        segment_id = int(rng.integers(1, 2**24))
        gt_ids[mask] = segment_id
        gt_segments.append({"id": segment_id, "category_id": category, "iscrowd": int(rng.random() < 0.08)})
        if rng.random() < 0.12:
            continue
        pred_id = int(rng.integers(1, 2**24))
        pred_ids[perturbed(mask, rng)] = pred_id
        pred_segments.append({"id": pred_id, "category_id": category if rng.random() > 0.05 else
                              things[int(rng.integers(len(things)))]})
    if rng.random() < 0.5:  # a VOID band between ground-truth segments
        edges = cv2.morphologyEx(gt_ids.astype(np.float32), cv2.MORPH_GRADIENT, np.ones((5, 5), np.uint8)) > 0
        gt_ids[edges] = 0
    if rng.random() < 0.3:  # unlabelled prediction pixels
        pred_ids[:, : int(rng.integers(1, w // 6))] = 0
    return gt_ids, gt_segments, pred_ids, pred_segments


def _finish_segments(ids: np.ndarray, segments: list, with_area: bool) -> list:
    """The segments still present in the map, with area and bbox for the ground truth."""
    values, counts = np.unique(ids, return_counts=True)
    present = dict(zip(values.tolist(), counts.tolist()))
    out = []
    for segment in segments:
        if segment["id"] not in present:
            continue
        segment = dict(segment)
        if with_area:
            ys, xs = np.nonzero(ids == segment["id"])
            segment["area"] = int(present[segment["id"]])
            segment["bbox"] = [int(xs.min()), int(ys.min()), int(xs.max() - xs.min() + 1), int(ys.max() - ys.min() + 1)]
        out.append(segment)
    return out


def panoptic_dataset(root, out_dir, seed: int = 0, max_images: int | None = None) -> dict:
    """Writes a COCO panoptic ground truth and prediction (PNG folders + JSON) under ``out_dir``.

    Returns:
      {"gt_json", "gt_folder", "pred_json", "pred_folder"} paths as strings.
    """
    rng = np.random.default_rng(seed)
    out_dir = pathlib.Path(out_dir)
    photos = real_images(root)[:max_images]
    pool = [mask for photo in photos for mask, _ in photo["objects"]]
    categories = ([{"id": i, "name": f"thing{i}", "isthing": 1} for i in range(1, 9)]
                  + [{"id": 100 + i, "name": f"stuff{i}", "isthing": 0} for i in range(1, 7)])
    things = [c["id"] for c in categories if c["isthing"]]
    stuff_ids = [c["id"] for c in categories if not c["isthing"]]
    paths = {name: out_dir / name for name in ("gt", "pred")}
    for path in paths.values():
        path.mkdir(parents=True, exist_ok=True)
    documents = {name: {"images": [], "annotations": [], "categories": categories} for name in paths}
    for image_id, photo in enumerate(photos, start=1):
        gt_ids, gt_segments, pred_ids, pred_segments = _panoptic_pair(photo, rng, things, stuff_ids, pool)
        file_name = f"{image_id:06d}.png"
        for name, ids, segments in (("gt", gt_ids, gt_segments), ("pred", pred_ids, pred_segments)):
            Image.fromarray(id2rgb(ids)).save(paths[name] / file_name)
            documents[name]["images"].append({"id": image_id, "height": photo["height"], "width": photo["width"],
                                              "file_name": file_name.replace(".png", ".jpg")})
            documents[name]["annotations"].append({"image_id": image_id, "file_name": file_name,
                                                   "segments_info": _finish_segments(ids, segments, name == "gt")})
    for name in paths:
        (out_dir / f"{name}.json").write_text(json.dumps(documents[name]), encoding="utf-8")
    return {"gt_json": str(out_dir / "gt.json"), "gt_folder": str(paths["gt"]),
            "pred_json": str(out_dir / "pred.json"), "pred_folder": str(paths["pred"])}


# ---- the official evaluators -------------------------------------------------------------------------

def reference_repo() -> pathlib.Path | None:
    """The checkout named by ``$JAXSEG_BOUNDARY_IOU_API_REPO`` when it holds the package, else None."""
    value = os.environ.get(REFERENCE_ENV)
    if not value:
        return None
    path = pathlib.Path(value)
    return path if (path / "boundary_iou" / "utils" / "boundary_utils.py").is_file() else None


def _rgb2id(color):
    if isinstance(color, np.ndarray) and len(color.shape) == 3:
        if color.dtype == np.uint8:
            color = color.astype(np.int32)
        return color[:, :, 0] + 256 * color[:, :, 1] + 256 * 256 * color[:, :, 2]
    return int(color[0] + 256 * color[1] + 256 * 256 * color[2])


def _get_traceback(function):
    def wrapper(*args, **kwargs):
        return function(*args, **kwargs)

    wrapper.__name__ = function.__name__
    wrapper.__qualname__ = function.__qualname__
    wrapper.__module__ = function.__module__
    return wrapper


def load_reference(repo) -> types.SimpleNamespace:
    """Imports the official modules from ``repo`` (with the NumPy and panopticapi shims)."""
    if not hasattr(np, "float"):
        np.float = float  # removed in NumPy 1.24; the official accumulate() still uses it
    if "panopticapi.utils" not in sys.modules:
        package = types.ModuleType("panopticapi")
        utils = types.ModuleType("panopticapi.utils")
        utils.rgb2id, utils.get_traceback = _rgb2id, _get_traceback
        package.utils = utils
        sys.modules["panopticapi"], sys.modules["panopticapi.utils"] = package, utils
    if str(repo) not in sys.path:
        sys.path.insert(0, str(repo))
    names = {"coco": "boundary_iou.coco_instance_api.coco", "cocoeval": "boundary_iou.coco_instance_api.cocoeval",
             "lvis": "boundary_iou.lvis_instance_api.lvis", "lvis_eval": "boundary_iou.lvis_instance_api.eval",
             "panoptic": "boundary_iou.coco_panoptic_api.evaluation", "utils": "boundary_iou.utils.boundary_utils"}
    return types.SimpleNamespace(**{key: importlib.import_module(name) for key, name in names.items()})
