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
from jaxseg_robust.metrics.mask_pairs import PairCounts, boundary_ap_ious, pair_ious
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
    """(image, category) -> (ground truths, detections sorted and capped) for blocks with either.

    Blocks in category order (sorted ids), then image order (sorted ids); a
    block's detections by decreasing score, ties in file order (Python's sort
    is stable, as the reference's mergesort).
    """
    category_index = {category_id: k for k, category_id in enumerate(gt.category_ids)}
    image_index = {image_id: i for i, image_id in enumerate(gt.image_ids)}
    keys = sorted(set(gts) | set(dts), key=lambda key: (category_index[key[1]], image_index[key[0]]))
    blocks = {}
    for key in keys:
        ordered = sorted(dts.get(key, []), key=lambda detection: -detection.score)
        blocks[key] = (gts.get(key, []), ordered if limit is None else ordered[:limit])
    return blocks


def _image_work(gt: GroundTruth, blocks: dict) -> tuple[list, np.ndarray]:
    """The mask work per image, and where each block pair's counts land.

    Returns:
      (works, pair_index): one ImageWork per image with pairs (in order of
      first appearance among the blocks); ``pair_index`` int64 [sum D*G]: for
      every (detection, ground truth) pair of the blocks, in block order and
      row-major within a block, its position among the works' pairs laid end
      to end.
    """
    sizes = np.array([(len(dts), len(gts)) for gts, dts in blocks.values()], np.int64).reshape(-1, 2)
    per_image: dict = {}
    for index, ((image_id, _), (block_gts, block_dts)) in enumerate(blocks.items()):
        if block_gts and block_dts:
            per_image.setdefault(image_id, []).append(index)
    order = np.array([index for members in per_image.values() for index in members], np.int64)
    n_dt, n_gt = sizes[order, 0], sizes[order, 1]
    image_of = np.repeat(np.arange(len(per_image)), [len(members) for members in per_image.values()])
    block_masks = n_gt + n_dt
    running = np.cumsum(block_masks) - block_masks
    first_mask = running - running[np.searchsorted(image_of, image_of)]  # of each block, within its image
    block, pair = coco_ap.piece_positions(n_dt * n_gt)
    dt_mask = first_mask[block] + n_gt[block] + pair // n_gt[block]
    gt_mask = first_mask[block] + pair % n_gt[block]
    pair_index = np.zeros(int((sizes[:, 0] * sizes[:, 1]).sum()), np.int64)
    pair_index[coco_ap.piece_starts(sizes[:, 0] * sizes[:, 1])[order][block] + pair] = np.arange(block.size)
    items = list(blocks.values())
    pairs_per_image = np.bincount(image_of[block], minlength=len(per_image))
    splits = np.split(np.stack([dt_mask, gt_mask], axis=1).astype(np.int32), np.cumsum(pairs_per_image)[:-1])
    works = []
    for (image_id, members), pairs in zip(per_image.items(), splits):
        masks = [m.runs for index in members for m in (*items[index][0], *items[index][1])]
        works.append(ImageWork(*gt.images[image_id], masks, pairs))
    return works, pair_index


def _pair_similarity(works: list, counts: list, pair_index: np.ndarray, crowd: np.ndarray,
                     boundary: bool) -> np.ndarray:
    """float64 [sum D*G]: every block pair's similarity (block order) from the counts (pycocotools' arithmetic).

    ``crowd``: bool [sum D*G], the pair's ground truth is a crowd region.
    """
    if not works:
        return np.zeros(0)
    first_mask = coco_ap.piece_starts([len(work.masks) for work in works])
    dt_mask = np.concatenate([work.pairs[:, 0] + first for work, first in zip(works, first_mask)])[pair_index]
    gt_mask = np.concatenate([work.pairs[:, 1] + first for work, first in zip(works, first_mask)])[pair_index]
    every = PairCounts(*(np.concatenate([getattr(c, field) for c in counts]) for field in PairCounts._fields))
    ious = pair_ious(every.intersection[pair_index], every.area[dt_mask], every.area[gt_mask], crowd)
    if boundary:
        boundary_ious = pair_ious(every.boundary_intersection[pair_index], every.boundary_area[dt_mask],
                                  every.boundary_area[gt_mask], False)
        ious = boundary_ap_ious(ious, boundary_ious, crowd)
    return ious


def _block_table(gt: GroundTruth, blocks: dict, config: InstanceEvalConfig) -> coco_ap.Blocks:
    """The blocks as coco_ap.Blocks, similarities left empty (see `_pair_similarity`)."""
    unpenalised = {}
    if config.dataset == "lvis":
        for image in gt.dataset.get("images", []):
            unpenalised[image["id"]] = set(image.get("not_exhaustive_category_ids", []))
    category_index = {category_id: k for k, category_id in enumerate(gt.category_ids)}
    gts = [g for block_gts, _ in blocks.values() for g in block_gts]
    dts = [d for _, block_dts in blocks.values() for d in block_dts]
    return coco_ap.Blocks(
        category=np.array([category_index[category_id] for _, category_id in blocks], np.int64),
        n_dt=np.array([len(block_dts) for _, block_dts in blocks.values()], np.int64),
        n_gt=np.array([len(block_gts) for block_gts, _ in blocks.values()], np.int64),
        ious=np.zeros(0),
        gt_area=np.array([g.area for g in gts], np.float64),
        gt_ignore=np.array([g.ignore for g in gts], bool),
        gt_crowd=np.array([g.crowd for g in gts], bool),
        dt_area=np.array([d.area for d in dts], np.float64),
        dt_score=np.array([d.score for d in dts], np.float64),
        dt_unpenalised=np.array([category_id in unpenalised.get(image_id, ()) for image_id, category_id in blocks],
                                bool),
    )


def _pair_crowd(table: coco_ap.Blocks) -> np.ndarray:
    """bool [sum D*G]: whether each block pair's ground truth is a crowd region (block order, row-major)."""
    block, pair = coco_ap.piece_positions(table.n_dt * table.n_gt)
    return table.gt_crowd[coco_ap.piece_starts(table.n_gt)[block] + pair % table.n_gt[block]]


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


@dataclasses.dataclass
class PreparedInstances:
    """A checked evaluation before its pixel counts (:func:`prepare_instances`).

    Attributes:
      gt: the ground truth; blocks: (image, category) -> (ground truths,
        detections sorted and capped), in block order; works, pair_index: the
        mask work per image and where each block pair's counts land
        (`_image_work`); n_detections: detections read from the results file.
    """

    gt: GroundTruth
    blocks: dict
    works: list
    pair_index: np.ndarray
    n_detections: int


def prepare_instances(ground_truth, results, config: InstanceEvalConfig = InstanceEvalConfig(), *,
                      warn: Callable[[str], None] = default_warn) -> PreparedInstances:
    """Reads and checks both files and lays out the evaluation (the first stage of :func:`evaluate_instances`)."""
    gt = load_ground_truth(ground_truth)
    blocks, n_detections = _select(gt, results, config, warn)
    works, pair_index = _image_work(gt, blocks)
    return PreparedInstances(gt, blocks, works, pair_index, n_detections)


def finish_instances(prepared: PreparedInstances, counts: list,
                     config: InstanceEvalConfig = InstanceEvalConfig()) -> InstanceEvaluation:
    """Similarities, matching, accumulation and summaries from the pair counts (the last stage).

    Args:
      prepared: :func:`prepare_instances`; counts: ``count_pairs(prepared.works, config.count_settings)``.
    """
    gt, blocks = prepared.gt, prepared.blocks
    table = _block_table(gt, blocks, config)
    table = table._replace(ious=_pair_similarity(prepared.works, counts, prepared.pair_index, _pair_crowd(table),
                                                 config.iou_type == "boundary"))
    matches = coco_ap.match_blocks(table, config.params)
    accumulated = coco_ap.accumulate(table, matches, len(gt.category_ids), config.params)
    if config.dataset == "lvis":
        summary = coco_ap.lvis_summary(accumulated, _frequency_groups(gt))
    else:
        summary = coco_ap.coco_summary(accumulated, config.params)
    rows = coco_ap.per_category_ap(accumulated)
    categories = [{"category_id": category_id, "name": str(gt.categories[category_id].get("name", category_id)),
                   **dict(zip(coco_ap.PER_CATEGORY_COLUMNS, map(float, row)))}
                  for category_id, row in zip(gt.category_ids, rows)]
    counts_summary = {"images": len(gt.image_ids),
                      "ground_truths": sum(len(v) for v in gt.annotations.values()),
                      "detections_read": prepared.n_detections,
                      "detections_evaluated": sum(len(d) for _, d in blocks.values())}
    return InstanceEvaluation(summary, categories, accumulated, counts_summary, config)


def evaluate_instances(ground_truth, results, config: InstanceEvalConfig = InstanceEvalConfig(), *,
                       warn: Callable[[str], None] = default_warn) -> InstanceEvaluation:
    """Mask AP or Boundary AP of a results file, as the official COCO / LVIS evaluators compute it.

    Three stages: :func:`prepare_instances` (files, checks, layout),
    `jaxseg_robust.evaluation.mask_counts.count_pairs` (pixel counts, on the
    device or from the run lengths), :func:`finish_instances` (similarities,
    matching, accumulation, summaries).

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
    prepared = prepare_instances(ground_truth, results, config, warn=warn)
    return finish_instances(prepared, count_pairs(prepared.works, config.count_settings), config)


__all__ = ["IOU_TYPES", "DATASETS", "InstanceEvalConfig", "InstanceEvaluation", "PreparedInstances",
           "prepare_instances", "finish_instances", "evaluate_instances"]
