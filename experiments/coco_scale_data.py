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
    """Writes ``folder/gt.json`` and ``folder/results.json``; returns their paths and the counts written.

    The results file is written image by image (never held whole), so the
    full scale needs little memory beyond the ground truth.
    """
    folder = pathlib.Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(spec.seed)
    sizes, per_image = image_sizes(rng, spec.images), ground_truths_per_image(rng, spec)
    images, annotations, detections = [], [], 0
    with open(folder / "results.json", "w", encoding="utf-8") as results:
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
    (folder / "gt.json").write_text(json.dumps(document), encoding="utf-8")
    return {"gt": folder / "gt.json", "results": folder / "results.json", "images": len(images),
            "ground_truths": len(annotations), "detections": detections}


def main() -> None:
    """``python experiments/coco_scale_data.py FOLDER [--scale S] [--seed N]``: writes the set, prints the counts."""
    import argparse  # noqa: PLC0415

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("folder")
    parser.add_argument("--scale", type=float, default=1.0, help="1 = 5,000 images (default %(default)s)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    written = write_instance_set(args.folder, scaled_spec(args.scale, args.seed))
    print(", ".join(f"{key} {value}" for key, value in written.items()))


if __name__ == "__main__":
    main()
