"""A seeded synthetic instance-segmentation set the size of COCO val2017, for timing COCO evaluators.

Used by experiments/benchmarks/bench_coco_eval.py (docs/benchmarking.md,
"COCO evaluators"). At scale 1 (`CocoScaleSpec`): 5,000 images of COCO-like
sizes (the longer side 640 pixels, the other 300-640; 70 % landscape),
36,781 ground truths (val2017's count) over COCO's 80 category ids
(non-contiguous, 1-90, frequencies falling off like COCO's), and 100
detections per image (COCO's largest ``maxDets``): 500,000 compressed-RLE
masks with boxes and scores. ``scaled_spec(scale)`` keeps the per-image
figures and scales the number of images.

Ground truths: star-shaped polygons (8-24 vertices) whose areas follow
COCO's mix of small / medium / large objects (about 41 / 34 / 25 % by
count), a tenth of them in two parts; about 1 % crowd regions, written as
uncompressed RLE (``counts`` a list) as COCO's crowd annotations are.
``area`` is the sum of the parts' shoelace areas (COCO-style), the pixel count for
crowd RLE; ``bbox`` is the polygons' extent, the mask's for crowd.

Detections (the results file, ``loadRes`` format): perturbed copies of the
ground truths (scaled, shifted, vertices jittered; a tenth with a wrong
category) and spurious polygons of the image's or random categories, every
mask rasterised by pycocotools and written as compressed RLE with its box
(``toBbox``) and a score rounded to three decimals (so that ties occur).
Per-image counts of ground truths are a multinomial draw over gamma-weighted
images (heavy-tailed, some images empty), so the totals are exactly the
spec's. One seed gives the same bytes on every run.

Panoptic variant (`write_panoptic_set`, panopticapi's PNG + JSON format):
the same image sizes and per-image thing counts, 2-5 stuff regions per
image (a Voronoi split over COCO panoptic's 53 stuff categories) under the
things, a VOID strip in half the images, about 1 % crowd things; the
prediction moves the stuff, perturbs, drops and relabels things and adds
spurious ones.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib

import numpy as np

COCO_CATEGORY_IDS = (
    1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 27, 28, 31, 32, 33, 34,
    35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63,
    64, 65, 67, 70, 72, 73, 74, 75, 76, 77, 78, 79, 80, 81, 82, 84, 85, 86, 87, 88, 89, 90)
VAL2017_IMAGES = 5_000
VAL2017_GROUND_TRUTHS = 36_781
DETECTIONS_PER_IMAGE = 100
# COCO's object-size classes (areas in pixels²) and their shares of val2017's objects by count
SIZE_AREA_RANGES = ((16.0, 32.0 ** 2), (32.0 ** 2, 96.0 ** 2), (96.0 ** 2, None))
SIZE_SHARES = (0.41, 0.34, 0.25)
# The files of a set's folder: instance ground truth and results, panoptic ground truth and prediction
INSTANCE_FILES = {"gt": "gt.json", "results": "results.json"}
PANOPTIC_FILES = {"gt_json": "panoptic_gt.json", "gt_folder": "panoptic_gt", "pred_json": "panoptic_pred.json",
                  "pred_folder": "panoptic_pred"}


@dataclasses.dataclass(frozen=True)
class CocoScaleSpec:
    """The set's size and seed: ``images`` images, ``ground_truths`` in all, ``detections_per_image`` each."""

    images: int = VAL2017_IMAGES
    ground_truths: int = VAL2017_GROUND_TRUTHS
    detections_per_image: int = DETECTIONS_PER_IMAGE
    crowd_fraction: float = 0.01
    seed: int = 0

    @property
    def detections(self) -> int:
        """Detections in the results file."""
        return self.images * self.detections_per_image


def scaled_spec(scale: float, seed: int = 0) -> CocoScaleSpec:
    """val2017's figures at ``scale`` (1 = 5,000 images): images rounded, the other counts per image kept."""
    if not scale > 0:
        raise ValueError(f"scale must be positive, got {scale}")
    images = max(1, round(VAL2017_IMAGES * scale))
    return CocoScaleSpec(images=images, ground_truths=round(VAL2017_GROUND_TRUTHS * images / VAL2017_IMAGES),
                         seed=seed)


# ---- sampling -----------------------------------------------------------------------------------------

def image_sizes(rng: np.random.Generator, count: int) -> np.ndarray:
    """[count, 2] int (height, width): the longer side 640, the other 300-640, 70 % landscape."""
    short = rng.integers(300, 641, count)
    landscape = rng.random(count) < 0.7
    return np.stack([np.where(landscape, short, 640), np.where(landscape, 640, short)], axis=1)


def category_weights() -> np.ndarray:
    """[80] float: sampling probabilities of COCO_CATEGORY_IDS, falling off like COCO's (id 1 most common)."""
    weights = 1.0 / np.arange(1, len(COCO_CATEGORY_IDS) + 1) ** 0.9
    return weights / weights.sum()


def ground_truths_per_image(rng: np.random.Generator, spec: CocoScaleSpec) -> np.ndarray:
    """[images] int summing to ``spec.ground_truths``: a multinomial over gamma(0.8)-weighted images."""
    weights = rng.gamma(0.8, size=spec.images)
    return rng.multinomial(spec.ground_truths, weights / weights.sum())


def object_areas(rng: np.random.Generator, count: int, height: int, width: int) -> np.ndarray:
    """[count] float target areas (pixels²): a COCO size class, then log-uniform within it (large <= half the image)."""
    classes = rng.choice(len(SIZE_SHARES), size=count, p=SIZE_SHARES)
    low = np.array([r[0] for r in SIZE_AREA_RANGES])[classes]
    high = np.array([r[1] or 0.5 * height * width for r in SIZE_AREA_RANGES])[classes]
    high = np.maximum(high, low * 1.01)
    return np.exp(rng.uniform(np.log(low), np.log(high)))


def star_polygon(rng: np.random.Generator, center: np.ndarray, area: float, height: int, width: int) -> np.ndarray:
    """[V, 2] float (x, y) vertices of a star-shaped polygon of about ``area`` pixels², clipped to the image."""
    vertices = int(rng.integers(8, 25))
    angles = np.sort(rng.uniform(0, 2 * np.pi, vertices))
    radii = np.sqrt(area / np.pi) * rng.uniform(0.7, 1.3, vertices)
    points = center + np.stack([radii * np.cos(angles), radii * np.sin(angles)], axis=1)
    return np.clip(points, 0, [width, height])


def shoelace_area(points: np.ndarray) -> float:
    """Area (pixels²) of a simple polygon [V, 2] (x, y)."""
    x, y = points[:, 0], points[:, 1]
    return float(abs(np.dot(x, np.roll(y, -1)) - np.dot(y, np.roll(x, -1))) / 2)


def object_parts(rng: np.random.Generator, area: float, height: int, width: int) -> list[np.ndarray]:
    """One object's polygon parts ([V, 2] each): one part, or two (a tenth of objects) sharing the area."""
    center = rng.uniform([0, 0], [width, height])
    if rng.random() >= 0.1:
        return [star_polygon(rng, center, area, height, width)]
    offset = rng.normal(0, np.sqrt(area), 2)
    return [star_polygon(rng, center, area / 2, height, width),
            star_polygon(rng, center + offset, area / 2, height, width)]


def perturbed_parts(rng: np.random.Generator, parts: list[np.ndarray], height: int, width: int) -> list[np.ndarray]:
    """A detection's copy of an object's parts: scaled 0.75-1.25 about the centroid, shifted, vertices jittered."""
    points = np.concatenate(parts)
    centroid = points.mean(axis=0)
    size = max(float(np.ptp(points, axis=0).max()), 1.0)
    scale, shift = rng.uniform(0.75, 1.25), rng.normal(0, 0.08 * size, 2)
    return [np.clip(centroid + (part - centroid) * scale + shift + rng.normal(0, 0.03 * size, part.shape),
                    0, [width, height]) for part in parts]


# ---- encoding -------------------------------------------------------------------------------------------

def polygon_list(parts: list[np.ndarray]) -> list[list[float]]:
    """COCO ``segmentation`` polygons: one flat [x0, y0, x1, y1, ...] list per part, two decimals."""
    return [[round(float(v), 2) for v in part.reshape(-1)] for part in parts]


def merged_rles(parts_per_object: list[list[np.ndarray]], height: int, width: int) -> list[dict]:
    """One compressed RLE (pycocotools, ``counts`` bytes) per object: its parts rasterised and merged."""
    import pycocotools.mask as mask_utils  # noqa: PLC0415

    flat = [polygon_list([part])[0] for parts in parts_per_object for part in parts]
    rles = mask_utils.frPyObjects(flat, height, width) if flat else []
    out, start = [], 0
    for parts in parts_per_object:
        pieces = rles[start:start + len(parts)]
        out.append(pieces[0] if len(pieces) == 1 else mask_utils.merge(pieces))
        start += len(parts)
    return out


def uncompressed_counts(rle: dict) -> list[int]:
    """The run lengths of a compressed RLE as the list COCO's crowd annotations hold."""
    import pycocotools.mask as mask_utils  # noqa: PLC0415

    mask = mask_utils.decode(rle).reshape(-1, order="F")
    changes = np.flatnonzero(np.diff(mask)) + 1
    edges = np.concatenate([[0], changes, [mask.size]])
    runs = np.diff(edges).tolist()
    return runs if mask.size == 0 or mask[0] == 0 else [0] + runs


# ---- one image ------------------------------------------------------------------------------------------

def image_objects(rng: np.random.Generator, count: int, height: int, width: int) -> list[tuple[list, int]]:
    """``count`` ground-truth objects: (polygon parts, category id), categories by `category_weights`."""
    areas = object_areas(rng, count, height, width)
    categories = rng.choice(COCO_CATEGORY_IDS, size=count, p=category_weights())
    return [(object_parts(rng, float(area), height, width), int(category))
            for area, category in zip(areas, categories)]


def ground_truth_annotations(rng, objects, image_id: int, first_id: int, height: int, width: int,
                             crowd_fraction: float) -> list[dict]:
    """COCO annotations of one image's objects: polygons, or uncompressed RLE for the crowd ones."""
    import pycocotools.mask as mask_utils  # noqa: PLC0415

    crowd = rng.random(len(objects)) < crowd_fraction
    rles = merged_rles([parts for parts, _ in objects], height, width)
    annotations = []
    for index, ((parts, category), rle) in enumerate(zip(objects, rles)):
        entry = {"id": first_id + index, "image_id": image_id, "category_id": category, "iscrowd": int(crowd[index])}
        if crowd[index]:
            entry["segmentation"] = {"size": [height, width], "counts": uncompressed_counts(rle)}
            entry["area"] = float(mask_utils.area(rle))
            entry["bbox"] = [float(v) for v in mask_utils.toBbox(rle)]
        else:
            points = np.concatenate(parts)
            low, high = points.min(axis=0), points.max(axis=0)
            entry["segmentation"] = polygon_list(parts)
            entry["area"] = round(sum(shoelace_area(part) for part in parts), 2)
            entry["bbox"] = [round(float(v), 2) for v in (*low, *(high - low))]
        annotations.append(entry)
    return annotations


def detection_objects(rng, objects, count: int, height: int, width: int) -> list[tuple[list, int, float]]:
    """``count`` detections (parts, category id, score): 1-4 copies per object, then spurious ones."""
    detections = []
    for parts, category in objects:
        for _ in range(int(rng.integers(1, 5))):
            wrong = rng.random() < 0.1
            label = int(rng.choice(COCO_CATEGORY_IDS)) if wrong else category
            detections.append((perturbed_parts(rng, parts, height, width), label, rng.beta(4, 2)))
    detections = detections[:count]
    present = [category for _, category in objects]
    for area in object_areas(rng, count - len(detections), height, width):
        same = present and rng.random() < 0.5
        label = int(rng.choice(present)) if same else int(rng.choice(COCO_CATEGORY_IDS, p=category_weights()))
        detections.append((object_parts(rng, float(area), height, width), label, rng.beta(2, 4)))
    return detections


def result_entries(detections, image_id: int, height: int, width: int) -> list[dict]:
    """``loadRes`` entries of one image's detections: compressed-RLE masks (``counts`` str), boxes, scores."""
    import pycocotools.mask as mask_utils  # noqa: PLC0415

    rles = merged_rles([parts for parts, _, _ in detections], height, width)
    boxes = mask_utils.toBbox(rles) if rles else np.zeros((0, 4))
    return [{"image_id": image_id, "category_id": category, "score": round(float(score), 3),
             "bbox": [float(v) for v in box],
             "segmentation": {"size": [height, width], "counts": rle["counts"].decode("ascii")}}
            for (_, category, score), rle, box in zip(detections, rles, boxes)]


# ---- the files --------------------------------------------------------------------------------------------

def categories() -> list[dict]:
    """COCO ``categories``: the 80 ids of COCO, named ``category<id>``."""
    return [{"id": cid, "name": f"category{cid}", "supercategory": "object"} for cid in COCO_CATEGORY_IDS]


def write_instance_set(folder, spec: CocoScaleSpec) -> dict:
    """Writes ``folder/gt.json`` and ``folder/results.json``; returns their paths (`INSTANCE_FILES` keys) and counts.

    The results file is written image by image (never held whole), so the
    full scale needs little memory beyond the ground truth.
    """
    folder = pathlib.Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(spec.seed)
    sizes, per_image = image_sizes(rng, spec.images), ground_truths_per_image(rng, spec)
    images, annotations, detections = [], [], 0
    paths = {key: folder / name for key, name in INSTANCE_FILES.items()}
    with open(paths["results"], "w", encoding="utf-8") as results:
        results.write("[")
        for index, ((height, width), count) in enumerate(zip(sizes.tolist(), per_image.tolist())):
            image_id = index + 1
            images.append({"id": image_id, "height": height, "width": width, "file_name": f"{image_id:012d}.jpg"})
            objects = image_objects(rng, count, height, width)
            annotations += ground_truth_annotations(rng, objects, image_id, len(annotations) + 1, height, width,
                                                    spec.crowd_fraction)
            entries = result_entries(detection_objects(rng, objects, spec.detections_per_image, height, width),
                                     image_id, height, width)
            results.write(("," if detections else "") + ",".join(json.dumps(entry) for entry in entries))
            detections += len(entries)
        results.write("]")
    document = {"info": {"description": f"synthetic COCO-scale set, seed {spec.seed}"}, "images": images,
                "annotations": annotations, "categories": categories()}
    paths["gt"].write_text(json.dumps(document), encoding="utf-8")
    return {**paths, "images": len(images), "ground_truths": len(annotations), "detections": detections}



# ---- panoptic ---------------------------------------------------------------------------------------------

# COCO panoptic's 53 stuff categories follow the 80 things; ids here run on from 92 (COCO's first stuff id)
STUFF_CATEGORY_IDS = tuple(range(92, 92 + 53))


def panoptic_categories() -> list[dict]:
    """COCO panoptic ``categories``: the 80 things (``isthing`` 1) and 53 stuff categories (``isthing`` 0)."""
    return ([{"id": cid, "name": f"thing{cid}", "supercategory": "object", "isthing": 1} for cid in COCO_CATEGORY_IDS]
            + [{"id": cid, "name": f"stuff{cid}", "supercategory": "stuff", "isthing": 0}
               for cid in STUFF_CATEGORY_IDS])


def stuff_regions(seeds: np.ndarray, height: int, width: int, block: int = 4) -> np.ndarray:
    """[H, W] int: the index of the seed ([K, 2] (x, y)) nearest to each ``block`` x ``block`` cell's centre.

    A Voronoi split of the image at ``block``-pixel resolution (stuff
    boundaries in steps of ``block`` pixels).
    """
    ys = np.arange(0, height, block, dtype=np.float32) + block / 2
    xs = np.arange(0, width, block, dtype=np.float32) + block / 2
    distances = ((xs[None, None, :] - seeds[:, 0, None, None].astype(np.float32)) ** 2
                 + (ys[None, :, None] - seeds[:, 1, None, None].astype(np.float32)) ** 2)
    cells = np.argmin(distances, axis=0)
    return np.repeat(np.repeat(cells, block, axis=0), block, axis=1)[:height, :width]


def segment_table(ids: np.ndarray) -> dict[int, tuple[int, list[int]]]:
    """{segment id: (pixel count, bbox [x, y, w, h])} of every non-zero id of an id map [H, W]."""
    height, width = ids.shape
    flat = ids.ravel()
    top = int(flat.max()) + 1
    counts = np.bincount(flat, minlength=top)
    rows, cols = np.repeat(np.arange(height), width), np.tile(np.arange(width), height)
    low_y, low_x = np.full(top, height), np.full(top, width)
    high_y, high_x = np.full(top, -1), np.full(top, -1)
    np.minimum.at(low_y, flat, rows)
    np.minimum.at(low_x, flat, cols)
    np.maximum.at(high_y, flat, rows)
    np.maximum.at(high_x, flat, cols)
    return {int(k): (int(counts[k]), [int(low_x[k]), int(low_y[k]), int(high_x[k] - low_x[k] + 1),
                                      int(high_y[k] - low_y[k] + 1)])
            for k in np.flatnonzero(counts) if k > 0}


def object_masks(parts_per_object: list[list[np.ndarray]], height: int, width: int) -> np.ndarray:
    """[N, H, W] bool: the objects' polygons rasterised (pycocotools)."""
    import pycocotools.mask as mask_utils  # noqa: PLC0415

    rles = merged_rles(parts_per_object, height, width)
    if not rles:
        return np.zeros((0, height, width), bool)
    return np.moveaxis(mask_utils.decode(rles), -1, 0).astype(bool)


def painted_segments(stuff_map: np.ndarray, stuff_labels: list[int], things: list[tuple[list, int, int]],
                     void: np.ndarray | None) -> tuple[np.ndarray, list[dict]]:
    """A segment-id map [H, W] (0 = VOID) and its ``segments_info``.

    Stuff region k gets id k + 1 and category ``stuff_labels[k]``; things
    (parts, category, iscrowd) are painted over it in order with the next ids;
    ``void`` pixels are 0. Segments left without pixels are dropped; ``area``
    is the pixel count, ``bbox`` the extent [x, y, w, h].
    """
    height, width = stuff_map.shape
    ids = stuff_map.astype(np.int32) + 1
    labels = {k + 1: (category, 0) for k, category in enumerate(stuff_labels)}
    masks = object_masks([parts for parts, _, _ in things], height, width)
    for index, (mask, (_, category, crowd)) in enumerate(zip(masks, things)):
        segment = len(stuff_labels) + index + 1
        ids[mask] = segment
        labels[segment] = (category, crowd)
    if void is not None:
        ids[void] = 0
    segments = [{"id": segment, "category_id": labels[segment][0], "iscrowd": labels[segment][1], "area": area,
                 "bbox": box} for segment, (area, box) in segment_table(ids).items()]
    return ids, segments


def panoptic_pair(rng: np.random.Generator, count: int, height: int, width: int) -> tuple:
    """One image's ground truth and prediction: (gt ids, gt segments, pred ids, pred segments).

    Ground truth: 2-5 stuff regions (distinct stuff categories), ``count``
    things (a 1 % crowd), a VOID strip in half the images. Prediction: the
    stuff seeds moved and a tenth of the stuff relabelled, every thing kept
    with probability 0.85 as a perturbed copy (a tenth with a wrong
    category), 0-3 spurious things; one segment per stuff category in both.
    """
    seeds = rng.uniform([0, 0], [width, height], (int(rng.integers(2, 6)), 2))
    stuff = [int(c) for c in rng.choice(STUFF_CATEGORY_IDS, len(seeds), replace=False)]
    objects = image_objects(rng, count, height, width)
    crowd = rng.random(count) < 0.01
    void = None
    if rng.random() < 0.5:
        row = int(rng.integers(0, height - 8))
        void = np.zeros((height, width), bool)
        void[row:row + int(rng.integers(2, 9))] = True
    gt_ids, gt_segments = painted_segments(stuff_regions(seeds, height, width), stuff,
                                           [(parts, category, int(c)) for (parts, category), c in zip(objects, crowd)],
                                           void)
    pred_stuff = list(stuff)
    for k in np.flatnonzero(rng.random(len(stuff)) < 0.1):  # relabelled to a stuff category not yet in the image
        pred_stuff[k] = int(rng.choice([c for c in STUFF_CATEGORY_IDS if c not in pred_stuff]))
    pred_things = [(perturbed_parts(rng, parts, height, width),
                    int(rng.choice(COCO_CATEGORY_IDS)) if rng.random() < 0.1 else category, 0)
                   for parts, category in objects if rng.random() < 0.85]
    pred_things += [(parts, category, 0) for parts, category in image_objects(rng, int(rng.integers(0, 4)), height,
                                                                              width)]
    moved = np.clip(seeds + rng.normal(0, 0.05 * width, seeds.shape), 0, [width, height])
    pred_ids, pred_segments = painted_segments(stuff_regions(moved, height, width), pred_stuff, pred_things, None)
    return gt_ids, gt_segments, pred_ids, pred_segments


def id_png(ids: np.ndarray, path: pathlib.Path) -> None:
    """Writes a segment-id map as panopticapi's RGB PNG (id = R + 256 G + 256² B)."""
    from PIL import Image  # noqa: PLC0415

    rgb = np.ascontiguousarray(ids.astype("<u4").view(np.uint8).reshape(*ids.shape, 4)[..., :3])
    Image.fromarray(rgb).save(path, compress_level=1)


def write_panoptic_set(folder, spec: CocoScaleSpec) -> dict:
    """Writes the panoptic variant in panopticapi's format; returns the paths (`PANOPTIC_FILES` keys) and counts.

    ``folder/panoptic_gt.json`` + ``folder/panoptic_gt/*.png`` and
    ``folder/panoptic_pred.json`` + ``folder/panoptic_pred/*.png``: the
    spec's images and sizes, ``spec.ground_truths`` things in all (the same
    per-image draw as the instance set), stuff and predictions as
    `panoptic_pair` makes them.
    """
    paths = {key: pathlib.Path(folder) / name for key, name in PANOPTIC_FILES.items()}
    rng = np.random.default_rng([spec.seed, 1])
    sizes, per_image = image_sizes(rng, spec.images), ground_truths_per_image(rng, spec)
    names = ("gt", "pred")
    for name in names:
        paths[f"{name}_folder"].mkdir(parents=True, exist_ok=True)
    documents = {name: {"images": [], "annotations": [], "categories": panoptic_categories()} for name in names}
    for index, ((height, width), count) in enumerate(zip(sizes.tolist(), per_image.tolist())):
        image_id = index + 1
        gt_ids, gt_segments, pred_ids, pred_segments = panoptic_pair(rng, count, height, width)
        for name, ids, segments in (("gt", gt_ids, gt_segments), ("pred", pred_ids, pred_segments)):
            id_png(ids, paths[f"{name}_folder"] / f"{image_id:012d}.png")
            documents[name]["images"].append({"id": image_id, "height": height, "width": width,
                                              "file_name": f"{image_id:012d}.jpg"})
            documents[name]["annotations"].append({"image_id": image_id, "file_name": f"{image_id:012d}.png",
                                                   "segments_info": segments})
    for name in names:
        paths[f"{name}_json"].write_text(json.dumps(documents[name]), encoding="utf-8")
    return {**paths, "images": spec.images,
            "segments": sum(len(a["segments_info"]) for a in documents["gt"]["annotations"])}


def main() -> None:
    """``python experiments/coco_scale_data.py FOLDER [--scale S] [--seed N] [--panoptic]``: writes, prints counts."""
    import argparse  # noqa: PLC0415

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("folder")
    parser.add_argument("--scale", type=float, default=1.0, help="1 = 5,000 images (default %(default)s)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--panoptic", action="store_true", help="also write the panoptic variant")
    args = parser.parse_args()
    spec = scaled_spec(args.scale, args.seed)
    for write in (write_instance_set, write_panoptic_set) if args.panoptic else (write_instance_set,):
        print(", ".join(f"{key} {value}" for key, value in write(args.folder, spec).items()))


if __name__ == "__main__":
    main()
