"""Instance-segmentation evaluation: mask AP and Boundary AP of a COCO / LVIS results file.

Follows docs/protocols/boundary_ap_pq.md. ``evaluate_instances`` is a
drop-in for the Boundary IoU authors' ``COCOeval`` / ``LVISEval`` with
``iouType`` ``"segm"`` or ``"boundary"``: same blocks, same detection
selection, same matching and accumulation, the same 12 (COCO) or 13 (LVIS)
summary numbers. The pixel work (areas, boundary bands, intersections) runs
batched on the JAX device (`jaxseg_robust.evaluation.mask_counts`); the
matching and accumulation are vectorised NumPy (`jaxseg_robust.metrics.coco_ap`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from jaxseg_robust.data.coco_instances import (
    CocoFormatError,
    GroundTruth,
    default_warn,
    load_detections,
    load_ground_truth,
    read_json,
)
from jaxseg_robust.evaluation.mask_counts import MASK_PATHS, CountSettings, ImageWork, count_pairs
from jaxseg_robust.metrics import coco_ap
from jaxseg_robust.metrics.mask_pairs import boundary_ap_ious, pair_ious
from jaxseg_robust.metrics.masks import DEFAULT_DILATION_RATIO

IOU_TYPES = ("segm", "boundary")
DATASETS = ("coco", "lvis")


@dataclasses.dataclass(frozen=True)
class InstanceEvalConfig:
    """Settings of :func:`evaluate_instances`.

    Attributes:
      iou_type: ``"segm"`` (mask AP) or ``"boundary"`` (Boundary AP: min of mask
        and boundary IoU, plain mask IoU against crowd regions).
      dataset: ``"coco"`` (COCOeval) or ``"lvis"`` (LVISEval: federated
        categories, detections capped per image, APr/APc/APf).
      dilation_ratio: boundary width relative to the image diagonal (0.02).
      lvis_max_dets: LVIS detections kept per image (300).
      chunk_masks: masks per device call.
      progress: progress display on stderr (``auto``, ``tqdm``, ``plain``, ``none``).
      mask_path: where mask AP counts are taken (``auto``, ``runs``, ``device``;
        `jaxseg_robust.evaluation.mask_counts.CountSettings`); Boundary AP always uses the device.
    """

    iou_type: str = "segm"
    dataset: str = "coco"
    dilation_ratio: float = DEFAULT_DILATION_RATIO
    lvis_max_dets: int = 300
    chunk_masks: int = 64
    progress: str = "auto"
    mask_path: str = "auto"

    def __post_init__(self):
        if self.iou_type not in IOU_TYPES:
            raise ValueError(f"iou_type must be one of {IOU_TYPES}, got {self.iou_type!r}")
        if self.dataset not in DATASETS:
            raise ValueError(f"dataset must be one of {DATASETS}, got {self.dataset!r}")
        if not self.dilation_ratio > 0:
            raise ValueError(f"dilation_ratio must be > 0, got {self.dilation_ratio!r}")
        if self.chunk_masks < 1 or self.lvis_max_dets < 1:
            raise ValueError("chunk_masks and lvis_max_dets must be >= 1")
        if self.mask_path not in MASK_PATHS:
            raise ValueError(f"mask_path must be one of {MASK_PATHS}, got {self.mask_path!r}")

    @property
    def count_settings(self) -> CountSettings:
        """The settings of the pair counts (`jaxseg_robust.evaluation.mask_counts`)."""
        return CountSettings(dilation_ratio=self.dilation_ratio, with_boundary=self.iou_type == "boundary",
                             chunk_masks=self.chunk_masks, progress=self.progress, mask_path=self.mask_path)

    @property
    def params(self) -> coco_ap.APParams:
        return coco_ap.LVIS_PARAMS if self.dataset == "lvis" else coco_ap.COCO_PARAMS


@dataclasses.dataclass
class InstanceEvaluation:
    """What :func:`evaluate_instances` returns.

    Attributes:
      summary: the summary numbers by their usual names (COCO: AP, AP50, AP75,
        APs, APm, APl, AR1, AR10, AR100, ARs, ARm, ARl; LVIS: AP ... APl, APr,
        APc, APf, AR, ARs, ARm, ARl); fractions in [0, 1], -1 where undefined.
      per_category: one dict per category (``category_id``, ``name``, AP, AP50,
        AP75, APs, APm, APl).
      accumulated: precision [T, R, K, A, M] and recall [T, K, A, M].
      counts: images, ground truths and detections evaluated.
      config: the settings.
    """

    summary: dict
    per_category: list
    accumulated: coco_ap.Accumulated
    counts: dict
    config: InstanceEvalConfig


def _stable_by_score(detections: list) -> list:
    order = np.argsort([-d.score for d in detections], kind="mergesort")
    return [detections[i] for i in order]


def _lvis_blocks(gt: GroundTruth, every: list, images_of: list, limit: int) -> tuple[dict, dict]:
    """LVIS: (ground truths, detections) per (image, category) after its per-image cap and filters.

    Detections: the ``limit`` best of each image (stable), of a known category,
    with ``0 < area``, of a category the image has ground truth of or lists in
    ``neg_category_ids``. Ground truths: ``0 < area``.
    """
    image_info = {image["id"]: image for image in gt.dataset.get("images", [])}
    federated = "neg_category_ids" in image_info[gt.image_ids[0]]
    gts: dict = {}
    for image_id in gt.image_ids:
        for ann in gt.annotations[image_id]:
            if 0 < ann.area < float("inf"):
                gts.setdefault((image_id, ann.category_id), []).append(ann)
    present: dict = {}
    for image_id, category_id in gts:
        present.setdefault(image_id, set()).add(category_id)
    per_image: dict = {}
    for detection, image_id in zip(every, images_of):
        per_image.setdefault(image_id, []).append(detection)
    dts: dict = {}
    for image_id, detections in per_image.items():
        if len(detections) > limit:
            detections = _stable_by_score(detections)[:limit]
        negative = set(image_info[image_id].get("neg_category_ids", []))
        for detection in detections:
            category_id = detection.category_id
            if category_id not in gt.categories or not 0 < detection.area < float("inf"):
                continue
            if federated and category_id not in negative and category_id not in present.get(image_id, ()):
                continue
            dts.setdefault((image_id, category_id), []).append(detection)
    return gts, dts


def _coco_blocks(gt: GroundTruth, by_image: dict) -> tuple[dict, dict]:
    """COCO: (ground truths, detections) per (image, category), all of them."""
    gts: dict = {}
    for image_id in gt.image_ids:
        for ann in gt.annotations[image_id]:
            gts.setdefault((image_id, ann.category_id), []).append(ann)
    dts: dict = {}
    for image_id in gt.image_ids:
        for detection in by_image[image_id]:
            dts.setdefault((image_id, detection.category_id), []).append(detection)
    return gts, dts


def _block_lists(gt: GroundTruth, gts: dict, dts: dict, limit: int | None) -> dict:
    """(image, category) -> (ground truths, detections sorted and capped), for blocks with either."""
    blocks = {}
    for category_id in gt.category_ids:
        for image_id in gt.image_ids:
            key = (image_id, category_id)
            block_gts, block_dts = gts.get(key, []), dts.get(key, [])
            if block_gts or block_dts:
                ordered = _stable_by_score(block_dts)
                blocks[key] = (block_gts, ordered if limit is None else ordered[:limit])
    return blocks


def _image_work(gt: GroundTruth, blocks: dict) -> tuple[list, dict]:
    """The mask work per image and, per block, where its pairs are: image index and pair offset."""
    works, where, per_image = [], {}, {}
    for (image_id, category_id), (block_gts, block_dts) in blocks.items():
        if not (block_gts and block_dts):
            continue
        per_image.setdefault(image_id, []).append(((image_id, category_id), block_gts, block_dts))
    for image_id, entries in per_image.items():
        height, width = gt.images[image_id]
        masks, pairs = [], []
        for key, block_gts, block_dts in entries:
            first_gt = len(masks)
            masks.extend(g.runs for g in block_gts)
            first_dt = len(masks)
            masks.extend(d.runs for d in block_dts)
            dt_index, gt_index = np.meshgrid(np.arange(len(block_dts)), np.arange(len(block_gts)), indexing="ij")
            where[key] = (len(works), sum(len(p) for p in pairs), len(block_dts), len(block_gts))
            pairs.append(np.stack([first_dt + dt_index.reshape(-1), first_gt + gt_index.reshape(-1)], axis=1))
        works.append(ImageWork(height, width, masks, np.concatenate(pairs).astype(np.int32)))
    return works, where


def _block_ious(work: ImageWork, counts, place: tuple, crowd: np.ndarray, boundary: bool) -> np.ndarray:
    """float64 [D, G] similarity of one block from its image's counts (pycocotools' arithmetic)."""
    _, offset, n_dt, n_gt = place
    rows = slice(offset, offset + n_dt * n_gt)
    dt_mask, gt_mask = work.pairs[rows, 0], work.pairs[rows, 1]
    crowd_pairs = np.tile(crowd, n_dt)
    ious = pair_ious(counts.intersection[rows], counts.area[dt_mask], counts.area[gt_mask], crowd_pairs)
    if boundary:
        boundary_ious = pair_ious(counts.boundary_intersection[rows], counts.boundary_area[dt_mask],
                                  counts.boundary_area[gt_mask], False)
        ious = boundary_ap_ious(ious, boundary_ious, crowd_pairs)
    return ious.reshape(n_dt, n_gt)


def _make_blocks(gt: GroundTruth, blocks: dict, works: list, counts: list, where: dict,
                 config: InstanceEvalConfig) -> list[list[coco_ap.Block]]:
    """coco_ap.Block lists per category (sorted ids), images in increasing id order."""
    unpenalised = {}
    if config.dataset == "lvis":
        for image in gt.dataset.get("images", []):
            unpenalised[image["id"]] = set(image.get("not_exhaustive_category_ids", []))
    by_category = {category_id: [] for category_id in gt.category_ids}
    for (image_id, category_id), (block_gts, block_dts) in blocks.items():
        crowd = np.array([g.crowd for g in block_gts], bool)
        if block_gts and block_dts:
            place = where[(image_id, category_id)]
            ious = _block_ious(works[place[0]], counts[place[0]], place, crowd, config.iou_type == "boundary")
        else:
            ious = np.zeros((len(block_dts), len(block_gts)))
        by_category[category_id].append(coco_ap.Block(
            ious=ious,
            gt_area=np.array([g.area for g in block_gts], np.float64),
            gt_ignore=np.array([g.ignore for g in block_gts], bool),
            gt_crowd=crowd,
            dt_area=np.array([d.area for d in block_dts], np.float64),
            dt_score=np.array([d.score for d in block_dts], np.float64),
            dt_unpenalised=category_id in unpenalised.get(image_id, ()),
        ))
    return [by_category[category_id] for category_id in gt.category_ids]


def _frequency_groups(gt: GroundTruth) -> list[list[int]]:
    """LVIS: category indices of the rare, common and frequent groups (empty without ``frequency``)."""
    groups = [[] for _ in coco_ap.FREQUENCY_GROUPS]
    first = gt.categories[gt.category_ids[0]]
    if "frequency" not in first:
        return groups
    for index, category_id in enumerate(gt.category_ids):
        frequency = gt.categories[category_id].get("frequency")
        if frequency not in coco_ap.FREQUENCY_GROUPS:
            raise CocoFormatError(f"ground truth: category {category_id!r} has frequency {frequency!r}, "
                                  f"expected one of {coco_ap.FREQUENCY_GROUPS}")
        groups[coco_ap.FREQUENCY_GROUPS.index(frequency)].append(index)
    return groups


def _select(gt: GroundTruth, results, config: InstanceEvalConfig, warn) -> tuple[dict, int]:
    """The evaluated blocks (see `_block_lists`) and the number of detections read."""
    raw = read_json(results, "results file")
    if config.dataset == "lvis":
        box_area = isinstance(raw, list) and bool(raw) and isinstance(raw[0], dict) and "bbox" in raw[0]
        _, every = load_detections(raw, gt, box_area=box_area, warn=warn)
        images_of = [raw[d.index]["image_id"] for d in every]
        gts, dts = _lvis_blocks(gt, every, images_of, config.lvis_max_dets)
    else:
        by_image, every = load_detections(raw, gt, warn=warn)
        gts, dts = _coco_blocks(gt, by_image)
    return _block_lists(gt, gts, dts, config.params.block_limit), len(every)


def evaluate_instances(ground_truth, results, config: InstanceEvalConfig = InstanceEvalConfig(), *,
                       warn: Callable[[str], None] = default_warn) -> InstanceEvaluation:
    """Mask AP or Boundary AP of a results file, as the official COCO / LVIS evaluators compute it.

    Args:
      ground_truth: path of a COCO / LVIS ground-truth JSON, or the loaded dict.
      results: path of a results JSON (list of ``{image_id, category_id, score,
        segmentation}``), or the loaded list.
      config: settings (IoU type, dataset flavour, dilation ratio, batching).
      warn: receives a message for each problem the official evaluators skip silently.

    Returns:
      InstanceEvaluation (summary numbers, per-category AP, the accumulated arrays).

    Raises:
      CocoFormatError: a bad file, naming the image, annotation or result at fault.
      ImportError: polygon annotations without pycocotools (names the ``coco`` extra).
    """
    gt = load_ground_truth(ground_truth)
    blocks, n_detections = _select(gt, results, config, warn)
    works, where = _image_work(gt, blocks)
    counts = count_pairs(works, config.count_settings)
    per_category = _make_blocks(gt, blocks, works, counts, where, config)
    matches = [coco_ap.match_blocks(category_blocks, config.params) for category_blocks in per_category]
    accumulated = coco_ap.accumulate(per_category, matches, config.params)
    if config.dataset == "lvis":
        summary = coco_ap.lvis_summary(accumulated, _frequency_groups(gt))
    else:
        summary = coco_ap.coco_summary(accumulated, config.params)
    table = coco_ap.per_category_ap(accumulated)
    categories = [{"category_id": category_id, "name": str(gt.categories[category_id].get("name", category_id)),
                   **dict(zip(coco_ap.PER_CATEGORY_COLUMNS, map(float, row)))}
                  for category_id, row in zip(gt.category_ids, table)]
    counts_summary = {"images": len(gt.image_ids),
                      "ground_truths": sum(len(v) for v in gt.annotations.values()),
                      "detections_read": n_detections,
                      "detections_evaluated": sum(len(d) for _, d in blocks.values())}
    return InstanceEvaluation(summary, categories, accumulated, counts_summary, config)


__all__ = ["IOU_TYPES", "DATASETS", "InstanceEvalConfig", "InstanceEvaluation", "evaluate_instances"]
