"""COCO / LVIS average precision from per-(image, category) IoU matrices: matching, accumulation, summaries.

Follows docs/protocols/boundary_ap_pq.md (the algorithm of pycocotools'
``COCOeval`` and of the LVIS API's ``LVISEval``, which the Boundary IoU
authors' evaluators reuse unchanged apart from the IoU). Host-side NumPy,
vectorised over blocks, area ranges and IoU thresholds; the only Python loop
runs over the detection rank inside a block (at most ``max_dets``).

A *block* is the evaluation unit of those evaluators: one image and one
category, with its ground truths (file order) and its detections (sorted by
decreasing score with a stable sort, ties in file order). Every number here
reproduces the reference's arithmetic operation by operation (float64
cumulative sums, ``tp / (tp + fp + eps)``, the right-to-left precision
envelope, ``searchsorted(..., side="left")``), so results agree to the last bit
up to the order of a final mean.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import numpy as np

# Exactly the reference's expressions (np.arange drifts; the summaries compare thresholds with ==).
IOU_THRESHOLDS = np.linspace(0.5, 0.95, int(np.round((0.95 - 0.5) / 0.05)) + 1, endpoint=True)
RECALL_THRESHOLDS = np.linspace(0.0, 1.00, int(np.round((1.00 - 0.0) / 0.01)) + 1, endpoint=True)
AREA_RANGES = ((0**2, 1e5**2), (0**2, 32**2), (32**2, 96**2), (96**2, 1e5**2))
AREA_LABELS = ("all", "small", "medium", "large")
COCO_SUMMARY_NAMES = ("AP", "AP50", "AP75", "APs", "APm", "APl", "AR1", "AR10", "AR100", "ARs", "ARm", "ARl")
LVIS_SUMMARY_NAMES = ("AP", "AP50", "AP75", "APs", "APm", "APl", "APr", "APc", "APf", "AR", "ARs", "ARm", "ARl")
FREQUENCY_GROUPS = ("r", "c", "f")


@dataclasses.dataclass(frozen=True)
class APParams:
    """Evaluation settings (the references' defaults).

    Attributes:
      max_dets: detections per block considered for each recall column (COCO
        1, 10, 100); ``(None,)`` = every detection of the block (LVIS, which
        caps detections per *image* when it loads the results).
      upper_inclusive: an area equal to a range's upper bound is inside it (COCO:
        out of range iff ``area < lo or area > hi``); False for LVIS (``area >= hi``).
    """

    max_dets: tuple = (1, 10, 100)
    upper_inclusive: bool = True

    @property
    def block_limit(self) -> int | None:
        """Detections kept per block (the largest max_dets), None = all."""
        return self.max_dets[-1]


COCO_PARAMS = APParams()
LVIS_PARAMS = APParams(max_dets=(None,), upper_inclusive=False)


class Block(NamedTuple):
    """One (image, category) of the evaluation (host arrays).

    Attributes:
      ious: float64 [D, G] detection x ground-truth similarity (rows in detection order).
      gt_area: float64 [G] the annotations' ``area`` field.
      gt_ignore: bool [G] ``ignore`` or ``iscrowd`` set.
      gt_crowd: bool [G] ``iscrowd`` set (crowd regions can match several detections).
      dt_area: float64 [D]; dt_score: float64 [D] (non-increasing).
      dt_unpenalised: bool, unmatched detections are ignored (LVIS: the category
        is in the image's ``not_exhaustive_category_ids``).
    """

    ious: np.ndarray
    gt_area: np.ndarray
    gt_ignore: np.ndarray
    gt_crowd: np.ndarray
    dt_area: np.ndarray
    dt_score: np.ndarray
    dt_unpenalised: bool = False


class BlockMatches(NamedTuple):
    """Matching of one block: ``dt_matched``/``dt_ignore`` bool [A, T, D], ``gt_ignore`` bool [A, G]."""

    dt_matched: np.ndarray
    dt_ignore: np.ndarray
    gt_ignore: np.ndarray


def out_of_range(area, params: APParams) -> np.ndarray:
    """bool [A, n]: ``area`` [n] outside each area range (the reference's comparisons)."""
    area = np.asarray(area, np.float64)[None, :]
    low = np.array([r[0] for r in AREA_RANGES], np.float64)[:, None]
    high = np.array([r[1] for r in AREA_RANGES], np.float64)[:, None]
    return (area < low) | ((area > high) if params.upper_inclusive else (area >= high))


def _last_best(scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(index of the last maximum along the last axis, whether that maximum is finite)."""
    best = scores.max(axis=-1, keepdims=True)
    size = scores.shape[-1]
    index = size - 1 - np.argmax((scores == best)[..., ::-1], axis=-1)
    return index, np.isfinite(best[..., 0])


def _match_group(ious: np.ndarray, crowd: np.ndarray, ignore: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Greedy matching of a group of padded blocks, all area ranges and thresholds at once.

    For each detection in rank order and each (area range, threshold): among
    the ground truths not yet taken (crowd regions are never taken) whose IoU
    reaches the threshold, the non-ignored ones win over the ignored ones, and
    within a kind the highest IoU wins, ties going to the later ground truth
    (the reference's scan with ``>=``, non-ignored ground truths first).

    Args:
      ious: float64 [B, D, G], ``-inf`` for padding.
      crowd: bool [B, G]; ignore: bool [B, A, G] (area range or ignore flag).

    Returns:
      (matched bool [B, A, T, D], matched to an ignored ground truth bool [B, A, T, D]).
    """
    batch, n_dt, n_gt = ious.shape
    n_area, n_thr = ignore.shape[1], IOU_THRESHOLDS.size
    threshold = np.minimum(IOU_THRESHOLDS, 1 - 1e-10)[None, None, :, None]
    taken = np.zeros((batch, n_area, n_thr, n_gt), bool)
    matched = np.zeros((batch, n_area, n_thr, n_dt), bool)
    on_ignored = np.zeros_like(matched)
    ignore4 = ignore[:, :, None, :]
    free_crowd = crowd[:, None, None, :]
    flat = np.arange(batch * n_area * n_thr)
    for d in range(n_dt):
        iou = ious[:, d, :][:, None, None, :]
        candidate = (~taken | free_crowd) & (iou >= threshold)
        regular, regular_ok = _last_best(np.where(candidate & ~ignore4, iou, -np.inf))
        ignored, ignored_ok = _last_best(np.where(candidate & ignore4, iou, -np.inf))
        pick = np.where(regular_ok, regular, ignored)
        found = regular_ok | ignored_ok
        matched[..., d] = found
        on_ignored[..., d] = found & ~regular_ok
        taken.reshape(-1, n_gt)[flat, pick.reshape(-1)] |= found.reshape(-1)
    return matched, on_ignored


def _pad_to(size: int) -> int:
    return 1 << max(int(size) - 1, 0).bit_length()


def match_blocks(blocks: list[Block], params: APParams) -> list[BlockMatches]:
    """The reference's ``evaluateImg`` for every block and area range (vectorised over blocks).

    Returns:
      one BlockMatches per block, in order.
    """
    n_thr = IOU_THRESHOLDS.size
    results: list[BlockMatches | None] = [None] * len(blocks)
    groups: dict[tuple[int, int], list[int]] = {}
    for index, block in enumerate(blocks):
        n_dt, n_gt = block.ious.shape if block.ious.size else (block.dt_score.size, block.gt_area.size)
        groups.setdefault((_pad_to(n_dt) if n_gt and n_dt else 0, _pad_to(n_gt) if n_gt and n_dt else 0),
                          []).append(index)
    for (n_dt, n_gt), members in groups.items():
        if n_dt and n_gt:
            ious = np.full((len(members), n_dt, n_gt), -np.inf)
            crowd = np.zeros((len(members), n_gt), bool)
            ignore = np.ones((len(members), len(AREA_RANGES), n_gt), bool)
            for row, index in enumerate(members):
                block = blocks[index]
                d, g = block.ious.shape
                ious[row, :d, :g] = block.ious
                crowd[row, :g] = block.gt_crowd
                ignore[row, :, :g] = block.gt_ignore[None, :] | out_of_range(block.gt_area, params)
            matched, on_ignored = _match_group(ious, crowd, ignore)
        for row, index in enumerate(members):
            block = blocks[index]
            n_block_dt = block.dt_score.size
            gt_ignore = block.gt_ignore[None, :] | out_of_range(block.gt_area, params)
            if n_dt and n_gt:
                dt_matched = matched[row, :, :, :n_block_dt]
                dt_ignore = on_ignored[row, :, :, :n_block_dt]
            else:
                dt_matched = np.zeros((len(AREA_RANGES), n_thr, n_block_dt), bool)
                dt_ignore = dt_matched.copy()
            unmatched_ignored = out_of_range(block.dt_area, params) | block.dt_unpenalised
            dt_ignore = dt_ignore | (~dt_matched & unmatched_ignored[:, None, :])
            results[index] = BlockMatches(dt_matched, dt_ignore, gt_ignore)
    return results


class Accumulated(NamedTuple):
    """``precision`` float64 [T, R, K, A, M] and ``recall`` [T, K, A, M]; -1 where a setting has no ground truth."""

    precision: np.ndarray
    recall: np.ndarray


def _precision_at_recalls(tp_sum: np.ndarray, fp_sum: np.ndarray, n_gt: int) -> tuple[np.ndarray, np.ndarray]:
    """(precision [T, R], final recall [T]) from cumulative TP/FP counts [T, n] (the reference's steps)."""
    n = tp_sum.shape[1]
    recall = tp_sum / n_gt
    precision = tp_sum / (fp_sum + tp_sum + np.spacing(1))
    envelope = np.maximum.accumulate(precision[:, ::-1], axis=1)[:, ::-1]
    out = np.zeros((tp_sum.shape[0], RECALL_THRESHOLDS.size))
    for t in range(tp_sum.shape[0]):
        index = np.searchsorted(recall[t], RECALL_THRESHOLDS, side="left")
        inside = index < n
        out[t, inside] = envelope[t, index[inside]]
    final = recall[:, -1] if n else np.zeros(tp_sum.shape[0])
    return out, final


def _category_arrays(blocks: list[Block], matches: list[BlockMatches]):
    """Concatenation over a category's blocks (image order): scores, rank in block, matched, ignore, gt ignore."""
    scores = np.concatenate([b.dt_score for b in blocks]) if blocks else np.zeros(0)
    ranks = np.concatenate([np.arange(b.dt_score.size) for b in blocks]) if blocks else np.zeros(0, int)
    matched = np.concatenate([m.dt_matched for m in matches], axis=2)
    ignore = np.concatenate([m.dt_ignore for m in matches], axis=2)
    gt_ignore = np.concatenate([m.gt_ignore for m in matches], axis=1)
    return scores, ranks, matched, ignore, gt_ignore


def accumulate(blocks_by_category: list[list[Block]], matches_by_category: list[list[BlockMatches]],
               params: APParams) -> Accumulated:
    """The reference's ``accumulate``: precision at 101 recall points and final recall per setting.

    Args:
      blocks_by_category: for each evaluated category (K, sorted ids), its
        non-empty blocks in increasing image id order.
      matches_by_category: the :func:`match_blocks` results, same structure.

    Returns:
      Accumulated arrays.
    """
    n_thr, n_rec, n_area = IOU_THRESHOLDS.size, RECALL_THRESHOLDS.size, len(AREA_RANGES)
    n_cat, n_max = len(blocks_by_category), len(params.max_dets)
    precision = -np.ones((n_thr, n_rec, n_cat, n_area, n_max))
    recall = -np.ones((n_thr, n_cat, n_area, n_max))
    for k, (blocks, matches) in enumerate(zip(blocks_by_category, matches_by_category)):
        if not blocks:
            continue
        scores, ranks, matched, ignore, gt_ignore = _category_arrays(blocks, matches)
        order = np.argsort(-scores, kind="mergesort")
        for a in range(n_area):
            n_gt = int(np.count_nonzero(~gt_ignore[a]))
            if n_gt == 0:
                continue
            for m, max_det in enumerate(params.max_dets):
                keep = order if max_det is None else order[ranks[order] < max_det]
                tps = matched[a][:, keep] & ~ignore[a][:, keep]
                fps = ~matched[a][:, keep] & ~ignore[a][:, keep]
                tp_sum = np.cumsum(tps, axis=1).astype(np.float64)
                fp_sum = np.cumsum(fps, axis=1).astype(np.float64)
                precision[:, :, k, a, m], recall[:, k, a, m] = _precision_at_recalls(tp_sum, fp_sum, n_gt)
    return Accumulated(precision, recall)


def _mean_defined(values: np.ndarray) -> float:
    defined = values[values > -1]
    return float(np.mean(defined)) if defined.size else -1.0


def summary_value(acc: Accumulated, kind: str, *, iou: float | None = None, area: str = "all",
                  max_det_index: int = -1, categories=None) -> float:
    """One summary number: the mean of the defined entries of a slice (-1 when none), as the references.

    Args:
      acc: accumulated arrays; kind: ``"ap"`` (precision) or ``"ar"`` (recall).
      iou: one IoU threshold (matched with ``==`` as the reference does) or None for all.
      area: area-range label; max_det_index: index into ``params.max_dets``.
      categories: optional list of category indices (LVIS frequency groups).
    """
    area_index = AREA_LABELS.index(area)
    values = acc.precision if kind == "ap" else acc.recall
    if iou is not None:
        values = values[np.where(iou == IOU_THRESHOLDS)[0]]
    cat_axis = 2 if kind == "ap" else 1
    if categories is not None:
        values = np.take(values, np.asarray(categories, int), axis=cat_axis)
    values = np.take(values, [area_index], axis=cat_axis + 1)
    return _mean_defined(np.take(values, [max_det_index], axis=cat_axis + 2))


def coco_summary(acc: Accumulated, params: APParams = COCO_PARAMS) -> dict[str, float]:
    """The 12 numbers of ``COCOeval.summarize`` (segm / boundary), by their usual names."""
    last = len(params.max_dets) - 1
    values = [
        summary_value(acc, "ap", max_det_index=last),
        summary_value(acc, "ap", iou=0.5, max_det_index=last),
        summary_value(acc, "ap", iou=0.75, max_det_index=last),
        *(summary_value(acc, "ap", area=a, max_det_index=last) for a in ("small", "medium", "large")),
        *(summary_value(acc, "ar", max_det_index=m) for m in range(3)),
        *(summary_value(acc, "ar", area=a, max_det_index=last) for a in ("small", "medium", "large")),
    ]
    return dict(zip(COCO_SUMMARY_NAMES, values))


def lvis_summary(acc: Accumulated, frequency_groups: list[list[int]]) -> dict[str, float]:
    """The 13 numbers of ``LVISEval.summarize`` (AR at the per-image cap, 300 by default)."""
    values = [
        summary_value(acc, "ap"),
        summary_value(acc, "ap", iou=0.5),
        summary_value(acc, "ap", iou=0.75),
        *(summary_value(acc, "ap", area=a) for a in ("small", "medium", "large")),
        *(summary_value(acc, "ap", categories=group) for group in frequency_groups),
        summary_value(acc, "ar"),
        *(summary_value(acc, "ar", area=a) for a in ("small", "medium", "large")),
    ]
    return dict(zip(LVIS_SUMMARY_NAMES, values))


def per_category_ap(acc: Accumulated) -> np.ndarray:
    """float64 [K, 6]: AP, AP50, AP75, APs, APm, APl of each category at the largest max_dets (-1 = undefined)."""
    rows = []
    for k in range(acc.precision.shape[2]):
        single = Accumulated(acc.precision[:, :, k:k + 1], acc.recall[:, k:k + 1])
        rows.append([
            summary_value(single, "ap"),
            summary_value(single, "ap", iou=0.5),
            summary_value(single, "ap", iou=0.75),
            *(summary_value(single, "ap", area=a) for a in ("small", "medium", "large")),
        ])
    return np.array(rows, np.float64).reshape(-1, 6)


PER_CATEGORY_COLUMNS = ("AP", "AP50", "AP75", "APs", "APm", "APl")

__all__ = ["IOU_THRESHOLDS", "RECALL_THRESHOLDS", "AREA_RANGES", "AREA_LABELS", "COCO_SUMMARY_NAMES",
           "LVIS_SUMMARY_NAMES", "FREQUENCY_GROUPS", "PER_CATEGORY_COLUMNS", "APParams", "COCO_PARAMS",
           "LVIS_PARAMS", "Block", "BlockMatches", "Accumulated", "out_of_range", "match_blocks", "accumulate",
           "summary_value", "coco_summary", "lvis_summary", "per_category_ap"]
