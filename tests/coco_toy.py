"""Small self-made COCO instance and panoptic sets for the default suite (no real data needed)."""

from __future__ import annotations

import json
import pathlib

import cv2
import numpy as np
from PIL import Image

import pycocotools.mask as mask_utils

SIZES = ((40, 60), (57, 33), (64, 64), (31, 90))


def blob(height: int, width: int, rng) -> np.ndarray:
    """A random union of 1-3 ellipses (bool [H, W]), never empty."""
    yy, xx = np.mgrid[:height, :width]
    mask = np.zeros((height, width), bool)
    for _ in range(int(rng.integers(1, 4))):
        cy, cx = rng.uniform(0, height), rng.uniform(0, width)
        ry, rx = rng.uniform(1, max(height / 2, 1.5)), rng.uniform(1, max(width / 2, 1.5))
        mask |= ((yy - cy) / ry) ** 2 + ((xx - cx) / rx) ** 2 <= 1
    if not mask.any():
        mask[height // 2, width // 2] = True
    return mask


def encode(mask: np.ndarray) -> dict:
    rle = mask_utils.encode(np.asfortranarray(mask.astype(np.uint8)))
    return {"size": [int(v) for v in rle["size"]], "counts": rle["counts"].decode("ascii")}


def perturb(mask: np.ndarray, rng) -> np.ndarray:
    """Shifted by up to 3 px and eroded / dilated by up to 2 px."""
    dy, dx = (int(v) for v in rng.integers(-3, 4, 2))
    out = np.roll(mask, (dy, dx), axis=(0, 1))
    k = int(rng.integers(-2, 3))
    if k:
        kernel = np.ones((2 * abs(k) + 1,) * 2, np.uint8)
        out = (cv2.dilate if k > 0 else cv2.erode)(out.astype(np.uint8), kernel).astype(bool)
    return out


def instance_set(seed: int = 0, images: int = 8) -> tuple[dict, list]:
    """(ground truth, results): polygons and RLE, crowd regions, ties in scores, wrong categories, spurious masks."""
    rng = np.random.default_rng(seed)
    gt = {"images": [], "annotations": [], "categories": [{"id": c, "name": f"c{c}"} for c in (1, 2, 5)]}
    results = []
    for image_id in range(1, images + 1):
        h, w = SIZES[image_id % len(SIZES)]
        gt["images"].append({"id": image_id, "height": h, "width": w})
        for _ in range(int(rng.integers(0, 5))):
            mask = blob(h, w, rng)
            category = int(rng.choice([1, 2, 5]))
            ann = {"id": len(gt["annotations"]) + 1, "image_id": image_id, "category_id": category,
                   "iscrowd": int(rng.random() < 0.15), "area": float(mask.sum())}
            contours, _ = cv2.findContours(mask.astype(np.uint8), cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_SIMPLE)
            polygon = [c.reshape(-1).astype(float).tolist() for c in contours if len(c) >= 3]
            if not ann["iscrowd"] and polygon and rng.random() < 0.4:
                ann["segmentation"] = polygon
                ann["area"] = float(mask_utils.area(mask_utils.merge(mask_utils.frPyObjects(polygon, h, w))))
            else:
                ann["segmentation"] = encode(mask)
            gt["annotations"].append(ann)
            for _ in range(int(rng.integers(0, 3))):
                results.append({"image_id": image_id, "category_id": category if rng.random() > 0.1 else 2,
                                "segmentation": encode(perturb(mask, rng)), "score": round(float(rng.random()), 1)})
        for _ in range(int(rng.integers(0, 3))):
            results.append({"image_id": image_id, "category_id": int(rng.choice([1, 2, 5])),
                            "segmentation": encode(blob(h, w, rng)), "score": round(float(rng.random()), 1)})
    return gt, results


def id2rgb(ids: np.ndarray) -> np.ndarray:
    ids = ids.astype(np.uint32)
    return np.stack([ids % 256, ids // 256 % 256, ids // 65536 % 256], axis=-1).astype(np.uint8)


def write_panoptic(root: pathlib.Path, images: list[dict], categories: list[dict]) -> dict:
    """Writes a panoptic pair of folders + JSONs; ``images``: dicts with gt/pred id maps and segment lists."""
    paths = {"gt_json": root / "gt.json", "gt_folder": root / "gt", "pred_json": root / "pred.json",
             "pred_folder": root / "pred"}
    docs = {"gt": {"annotations": [], "categories": categories}, "pred": {"annotations": [], "categories": categories}}
    for side in ("gt", "pred"):
        paths[f"{side}_folder"].mkdir(parents=True, exist_ok=True)
        for image in images:
            name = f"{image['id']}.png"
            Image.fromarray(id2rgb(image[f"{side}_ids"])).save(paths[f"{side}_folder"] / name)
            docs[side]["annotations"].append({"image_id": image["id"], "file_name": name,
                                              "segments_info": image[f"{side}_segments"]})
    for side in ("gt", "pred"):
        paths[f"{side}_json"].write_text(json.dumps(docs[side]), encoding="utf-8")
    return {key: str(value) for key, value in paths.items()}
