"""Instance-segmentation evaluation: mask AP and Boundary AP of a COCO / LVIS results file.

Follows docs/protocols/boundary_ap_pq.md. ``evaluate_instances`` is a
drop-in for the Boundary IoU authors' ``COCOeval`` / ``LVISEval`` with
``iouType`` ``"segm"`` or ``"boundary"``: same blocks, same detection
selection, same matching and accumulation, the same 12 (COCO) or 13 (LVIS)
summary numbers. The pixel work (areas, boundary bands, intersections) runs
batched on the JAX device (`jaxseg_robust.evaluation.mask_counts`); the
matching and accumulation are vectorised NumPy (`jaxseg_robust.metrics.coco_ap`).
COCOeval's settings (image / category subsets, ``useCats=0``, max-dets, IoU
and recall thresholds, area ranges) are ``InstanceEvalConfig`` fields. The
stages: :func:`prepare_instances`, ``count_pairs``, :func:`score_blocks` (the
per-block similarities, what a share of a split evaluation saves:
`jaxseg_robust.evaluation.partials`), :func:`summarise_blocks`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from jaxseg_robust.data.coco_instances import (
    CocoFormatError,
    GroundTruth,
    collection_paused,
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
      ap_params: thresholds, area ranges and max-dets (``coco_ap.APParams``); None = the
        dataset's defaults (COCOeval's or LVISEval's).
      image_ids, category_ids: evaluate only these images / categories (COCOeval's
        ``params.imgIds`` / ``catIds``); None = all of the ground truth.
      use_cats: False = category-agnostic (COCOeval's ``useCats=0``: every ground truth and
        detection of an image in one block; COCO only).
      images_of: ``(k, n)``, 1 <= k <= n: evaluate the k-th of n interleaved shares of the
        (sorted) images, ``image_ids[k-1::n]``, to merge later (`jaxseg_robust.evaluation.partials`).
    """

    iou_type: str = "segm"
    dataset: str = "coco"
    dilation_ratio: float = DEFAULT_DILATION_RATIO
    lvis_max_dets: int = 300
    chunk_masks: int = 64
    progress: str = "auto"
    mask_path: str = "auto"
    ap_params: coco_ap.APParams | None = None
    image_ids: tuple | None = None
    category_ids: tuple | None = None
    use_cats: bool = True
    images_of: tuple | None = None

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
        if not self.use_cats and self.dataset == "lvis":
            raise ValueError("use_cats=False is a COCOeval setting; LVISEval always evaluates per category")
        if self.images_of is not None:
            share, shares = self.images_of
            if not 1 <= share <= shares:
                raise ValueError(f"images_of must be (k, n) with 1 <= k <= n, got {self.images_of!r}")

    @property
    def count_settings(self) -> CountSettings:
        """The settings of the pair counts (`jaxseg_robust.evaluation.mask_counts`)."""
        return CountSettings(dilation_ratio=self.dilation_ratio, with_boundary=self.iou_type == "boundary",
                             chunk_masks=self.chunk_masks, progress=self.progress, mask_path=self.mask_path)

    @property
    def params(self) -> coco_ap.APParams:
        """The AP settings: ``ap_params``, or the dataset's defaults."""
        if self.ap_params is not None:
            return self.ap_params
        return coco_ap.LVIS_PARAMS if self.dataset == "lvis" else coco_ap.COCO_PARAMS


AGNOSTIC_CATEGORY = -1  # the one category of a use_cats=False evaluation, as COCOeval names it


@dataclasses.dataclass(frozen=True)
class Scope:
    """What an evaluation covers (resolved from the ground truth and the config).

    Attributes:
      image_ids: the evaluated images, sorted; selected_images: the images before the
        ``images_of`` share (what the merged shares must cover).
      category_ids: the evaluated categories, sorted (``[-1]`` when category-agnostic);
        member_ids: the ground-truth categories whose annotations and detections are evaluated.
      names: a name per evaluated category; frequency_groups: LVIS' rare / common / frequent
        groups as indices into ``category_ids`` (empty lists otherwise).
    """

    image_ids: list
    selected_images: list
    category_ids: list
    member_ids: list
    names: list
    frequency_groups: list


def _chosen(wanted, known: list, what: str, *, in_given_order: bool = False) -> list:
    """The ``known`` ids that are ``wanted`` (all when None): sorted, or unique in the given order.

    Unknown ones raise CocoFormatError; the ids returned are the ground truth's own objects.
    """
    if wanted is None:
        return list(known)
    known_set = set(known)
    missing = [item for item in wanted if item not in known_set]
    if missing:
        raise CocoFormatError(f"{what}: {missing[0]!r} is not in the ground truth"
                              + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
    own = {item: item for item in known}
    if in_given_order:
        return list(dict.fromkeys(own[item] for item in wanted))
    wanted_set = set(wanted)
    return [item for item in known if item in wanted_set]


def evaluation_scope(gt: GroundTruth, config: InstanceEvalConfig) -> Scope:
    """The images and categories ``config`` evaluates of ``gt`` (CocoFormatError on an unknown id)."""
    selected = _chosen(config.image_ids, gt.image_ids, "image_ids")
    images = selected if config.images_of is None else selected[config.images_of[0] - 1::config.images_of[1]]
    members = _chosen(config.category_ids, gt.category_ids, "category_ids", in_given_order=not config.use_cats)
    if not config.use_cats:  # COCOeval gathers an image's items in the order of its catIds
        return Scope(images, selected, [AGNOSTIC_CATEGORY], members, ["all categories"], [[], [], []])
    names = [str(gt.categories[category_id].get("name", category_id)) for category_id in members]
    return Scope(images, selected, members, members, names, _frequency_groups(gt, members))


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
      blocks: the scored blocks the numbers come from (:class:`ScoredBlocks`).
      matches: the matching with partners (``coco_ap.Matches``) when asked for
        (:func:`summarise_blocks`), else None.
    """

    summary: dict
    per_category: list
    accumulated: coco_ap.Accumulated
    counts: dict
    config: InstanceEvalConfig
    blocks: ScoredBlocks | None = None
    matches: coco_ap.Matches | None = None


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


def _in_scope(blocks: dict, scope: Scope) -> dict:
    """The (image, category) -> items entries of ``scope``'s images and member categories.

    Category-agnostic scopes gather an image's items under ``(image, -1)`` in
    the order of ``scope.member_ids`` (COCOeval's ``catIds`` as given), file order within a category
    (COCOeval's ``useCats=0``).
    """
    images, members = set(scope.image_ids), {category_id: k for k, category_id in enumerate(scope.member_ids)}
    kept = {key: items for key, items in blocks.items() if key[0] in images and key[1] in members}
    if scope.category_ids != [AGNOSTIC_CATEGORY]:
        return kept
    merged: dict = {}
    for key in sorted(kept, key=lambda key: members[key[1]]):  # stable: images keep their order of appearance
        merged.setdefault((key[0], AGNOSTIC_CATEGORY), []).extend(kept[key])
    return merged


def _block_lists(scope: Scope, gts: dict, dts: dict, limit: int | None) -> dict:
    """(image, category) -> (ground truths, detections sorted and capped) for blocks with either.

    Blocks in category order (sorted ids), then image order (sorted ids); a
    block's detections by decreasing score, ties in file order (Python's sort
    is stable, as the reference's mergesort).
    """
    gts, dts = _in_scope(gts, scope), _in_scope(dts, scope)
    category_index = {category_id: k for k, category_id in enumerate(scope.category_ids)}
    image_index = {image_id: i for i, image_id in enumerate(scope.image_ids)}
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


def _block_table(gt: GroundTruth, scope: Scope, blocks: dict, config: InstanceEvalConfig) -> coco_ap.Blocks:
    """The blocks as coco_ap.Blocks, similarities left empty (see `_pair_similarity`)."""
    unpenalised = {}
    if config.dataset == "lvis":
        for image in gt.dataset.get("images", []):
            unpenalised[image["id"]] = set(image.get("not_exhaustive_category_ids", []))
    category_index = {category_id: k for k, category_id in enumerate(scope.category_ids)}
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


def _frequency_groups(gt: GroundTruth, category_ids: list) -> list[list[int]]:
    """LVIS: indices into ``category_ids`` of the rare, common and frequent groups (empty without ``frequency``)."""
    groups = [[] for _ in coco_ap.FREQUENCY_GROUPS]
    first = gt.categories[gt.category_ids[0]]
    if "frequency" not in first:
        return groups
    for index, category_id in enumerate(category_ids):
        frequency = gt.categories[category_id].get("frequency")
        if frequency not in coco_ap.FREQUENCY_GROUPS:
            raise CocoFormatError(f"ground truth: category {category_id!r} has frequency {frequency!r}, "
                                  f"expected one of {coco_ap.FREQUENCY_GROUPS}")
        groups[coco_ap.FREQUENCY_GROUPS.index(frequency)].append(index)
    return groups


def _select(gt: GroundTruth, scope: Scope, results, config: InstanceEvalConfig, warn,
            area_field: bool) -> tuple[dict, int]:
    """The evaluated blocks (see `_block_lists`) and the number of detections read of the evaluated images."""
    raw = read_json(results, "results file")
    if config.dataset == "lvis":
        box_area = isinstance(raw, list) and bool(raw) and isinstance(raw[0], dict) and "bbox" in raw[0]
        _, every = load_detections(raw, gt, box_area=box_area, area_field=area_field, warn=warn)
        images_of = [d.image_id for d in every]
        gts, dts = _lvis_blocks(gt, every, images_of, config.lvis_max_dets)
    else:
        by_image, every = load_detections(raw, gt, area_field=area_field, warn=warn)
        images_of = [d.image_id for d in every]
        gts, dts = _coco_blocks(gt, by_image)
    evaluated = set(scope.image_ids)
    return _block_lists(scope, gts, dts, config.params.block_limit), sum(i in evaluated for i in images_of)


@dataclasses.dataclass
class PreparedInstances:
    """A checked evaluation before its pixel counts (:func:`prepare_instances`).

    Attributes:
      gt: the ground truth; scope: the evaluated images and categories; blocks: (image,
        category) -> (ground truths, detections sorted and capped), in block order; works,
        pair_index: the mask work per image and where each block pair's counts land
        (`_image_work`); n_detections: detections read of the evaluated images.
    """

    gt: GroundTruth
    scope: Scope
    blocks: dict
    works: list
    pair_index: np.ndarray
    n_detections: int


def prepare_instances(ground_truth, results, config: InstanceEvalConfig = InstanceEvalConfig(), *,
                      warn: Callable[[str], None] = default_warn, area_field: bool = False) -> PreparedInstances:
    """Reads and checks both files and lays out the evaluation (the first stage of :func:`evaluate_instances`).

    ``area_field``: each result carries the ``area`` to use (as pycocotools' ``loadRes`` leaves it).
    """
    with collection_paused():
        gt = load_ground_truth(ground_truth)
        scope = evaluation_scope(gt, config)
        blocks, n_detections = _select(gt, scope, results, config, warn, area_field)
        works, pair_index = _image_work(gt, blocks)
    return PreparedInstances(gt, scope, blocks, works, pair_index, n_detections)


@dataclasses.dataclass
class ScoredBlocks:
    """Every evaluated block with its pair similarities: all that matching and accumulation read.

    What one process of a split evaluation saves (`jaxseg_robust.evaluation.partials`).

    Attributes:
      table: the blocks (``coco_ap.Blocks``, similarities filled in).
      keys: (image id, category id) of each block, block order.
      gt_ids: annotation id of each ground truth (block order); dt_ids: id of each detection
        (its 1-based position in the results file, as pycocotools' ``loadRes`` numbers them).
      scope: the evaluated images and categories; counts: images, ground truths and detections.
    """

    table: coco_ap.Blocks
    keys: list
    gt_ids: list
    dt_ids: list
    scope: Scope
    counts: dict


def score_blocks(prepared: PreparedInstances, counts: list,
                 config: InstanceEvalConfig = InstanceEvalConfig()) -> ScoredBlocks:
    """The blocks and their similarities from the pair counts (``count_pairs(prepared.works, ...)``)."""
    gt, blocks, scope = prepared.gt, prepared.blocks, prepared.scope
    table = _block_table(gt, scope, blocks, config)
    table = table._replace(ious=_pair_similarity(prepared.works, counts, prepared.pair_index, _pair_crowd(table),
                                                 config.iou_type == "boundary"))
    members = set(scope.member_ids)
    counts_summary = {"images": len(scope.image_ids),
                      "ground_truths": sum(ann.category_id in members for image_id in scope.image_ids
                                           for ann in gt.annotations[image_id]),
                      "detections_read": prepared.n_detections,
                      "detections_evaluated": sum(len(d) for _, d in blocks.values())}
    return ScoredBlocks(table, list(blocks), [g.ann_id for block_gts, _ in blocks.values() for g in block_gts],
                        [d.index + 1 for _, block_dts in blocks.values() for d in block_dts], scope, counts_summary)


def summarise_blocks(scored: ScoredBlocks, config: InstanceEvalConfig = InstanceEvalConfig(), *,
                     with_matches: bool = False) -> InstanceEvaluation:
    """Matching, accumulation and summaries of scored blocks (the last stage).

    ``with_matches``: keep the matching with each detection's partner and the scores
    (what ``COCOeval.evalImgs`` and ``eval["scores"]`` need).
    """
    table, scope, params = scored.table, scored.scope, config.params
    matches = coco_ap.match_blocks(table, params, with_partners=with_matches)
    accumulated = coco_ap.accumulate(table, matches, len(scope.category_ids), params, with_scores=with_matches)
    if config.dataset == "lvis":
        summary = coco_ap.lvis_summary(accumulated, scope.frequency_groups, params)
    else:
        summary = coco_ap.coco_summary(accumulated, params)
    rows = coco_ap.per_category_ap(accumulated, params)
    categories = [{"category_id": category_id, "name": name, **dict(zip(coco_ap.PER_CATEGORY_COLUMNS, map(float, row)))}
                  for category_id, name, row in zip(scope.category_ids, scope.names, rows)]
    return InstanceEvaluation(summary, categories, accumulated, dict(scored.counts), config, scored,
                              matches if with_matches else None)


def finish_instances(prepared: PreparedInstances, counts: list,
                     config: InstanceEvalConfig = InstanceEvalConfig()) -> InstanceEvaluation:
    """Similarities, matching, accumulation and summaries from the pair counts (the last stages).

    Args:
      prepared: :func:`prepare_instances`; counts: ``count_pairs(prepared.works, config.count_settings)``.
    """
    return summarise_blocks(score_blocks(prepared, counts, config), config)


def evaluate_instances(ground_truth, results, config: InstanceEvalConfig = InstanceEvalConfig(), *,
                       warn: Callable[[str], None] = default_warn) -> InstanceEvaluation:
    """Mask AP or Boundary AP of a results file, as the official COCO / LVIS evaluators compute it.

    Three stages: :func:`prepare_instances` (files, checks, layout),
    `jaxseg_robust.evaluation.mask_counts.count_pairs` (pixel counts, on the
    device or from the run lengths), :func:`finish_instances` (similarities,
    matching, accumulation, summaries).

    Args:
      ground_truth: path of a COCO / LVIS ground-truth JSON, the loaded dict, or a loaded
        ``jaxseg_robust.data.coco_instances.GroundTruth``.
      results: path of a results JSON (list of ``{image_id, category_id, score,
        segmentation}``), or the loaded list.
      config: settings (IoU type, dataset flavour, dilation ratio, batching, subsets).
      warn: receives a message for each problem the official evaluators skip silently.

    Returns:
      InstanceEvaluation (summary numbers, per-category AP, the accumulated arrays).

    Raises:
      CocoFormatError: a bad file, naming the image, annotation or result at fault.
      ImportError: polygon annotations without pycocotools (names the ``coco`` extra).
    """
    with collection_paused():  # the counts and the matching make no cycles; a collection would walk every mask
        prepared = prepare_instances(ground_truth, results, config, warn=warn)
        return finish_instances(prepared, count_pairs(prepared.works, config.count_settings), config)


__all__ = ["IOU_TYPES", "DATASETS", "AGNOSTIC_CATEGORY", "InstanceEvalConfig", "InstanceEvaluation", "Scope",
           "PreparedInstances", "ScoredBlocks", "evaluation_scope", "prepare_instances", "score_blocks",
           "summarise_blocks", "finish_instances", "evaluate_instances"]
