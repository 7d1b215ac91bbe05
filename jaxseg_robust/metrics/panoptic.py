"""Panoptic quality (PQ, SQ, RQ) and Boundary PQ from COCO panoptic label maps.

Follows docs/protocols/boundary_ap_pq.md ("Panoptic"), i.e. panopticapi's
``pq_compute`` and the Boundary IoU authors' variant of it.

Device part (:func:`panoptic_confusion`): one image's ground-truth and
predicted PNGs (``id = R + 256 G + 256^2 B``) become compact label maps
(listed segments ``0..S-1``, then VOID = id 0, then every unlisted id), and a
histogram counts pixels per (ground-truth label, predicted label).
Everything panopticapi reads from its ``np.unique`` confusion table follows
from it. Boundary PQ's band counts of the candidate pairs
(:func:`candidate_pairs`) come from the batched crops of
`jaxseg_robust.evaluation.panoptic_bands`.

Host part (:func:`image_stats`, :func:`pq_average`): matching at IoU > 0.5
(Boundary PQ: the min of mask IoU and boundary IoU), crowd and VOID rules,
and the per-category averages, in float64 with the reference's operations.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

SENTINEL_ID = 2**30  # pads the sorted id tables (real ids are < 2**24)


def _compact(rgb, ids, count, inside):
    """int32 [H, W] compact labels: listed 0..count-1, VOID = S, unlisted = S + 1, outside the image = -1."""
    size = ids.shape[0]
    rgb = rgb.astype(jnp.int32)
    raw = rgb[..., 0] + 256 * rgb[..., 1] + 65536 * rgb[..., 2]
    position = jnp.clip(jnp.searchsorted(ids, raw), 0, size - 1)
    listed = (ids[position] == raw) & (position < count)
    label = jnp.where(listed, position, jnp.where(raw == 0, size, size + 1))
    return jnp.where(inside, label, -1)


@jax.jit
def panoptic_confusion(gt_rgb, pred_rgb, gt_ids, gt_count, pred_ids, pred_count, height, width):
    """Pixel histogram of one image (device).

    Args:
      gt_rgb, pred_rgb: uint8 [Hc, Wc, 3] PNG pixels padded into the canvas.
      gt_ids, pred_ids: int32 [S] sorted listed segment ids, padded with ``SENTINEL_ID``.
      gt_count, pred_count: int32 scalars, listed segments in each table.
      height, width: int32 scalars, the image size inside the canvas.

    Returns:
      int32 [S + 2, S + 2]: pixels with ground-truth label g and predicted label p
      (listed segments 0..S-1, VOID = S, unlisted ids = S + 1).
    """
    size = gt_ids.shape[0]
    rows = jnp.arange(gt_rgb.shape[0])[:, None] < height
    cols = jnp.arange(gt_rgb.shape[1])[None, :] < width
    inside = rows & cols
    gt = _compact(gt_rgb, gt_ids, gt_count, inside)
    pred = _compact(pred_rgb, pred_ids, pred_count, inside)
    bins = (size + 2) * (size + 2)
    index = jnp.where(inside, gt * (size + 2) + pred, bins)
    return jnp.bincount(index.reshape(-1), length=bins + 1)[:bins].reshape(size + 2, size + 2).astype(jnp.int32)


class Segments(NamedTuple):
    """The listed segments of one side of an image, in sorted-id order (host).

    Attributes:
      ids: int64 [n] sorted segment ids; category: [n] category ids;
      crowd: bool [n]; area: float64 [n] (ground truth: the JSON's ``area``);
      order: int [n] position of each segment in ``segments_info``.
    """

    ids: np.ndarray
    category: np.ndarray
    crowd: np.ndarray
    area: np.ndarray
    order: np.ndarray


class CategoryStats(NamedTuple):
    """Per-category sums: ``iou`` float64, ``tp``, ``fp``, ``fn`` int (dicts category id -> value)."""

    iou: dict
    tp: dict
    fp: dict
    fn: dict


def new_stats() -> CategoryStats:
    """Empty per-category sums."""
    return CategoryStats({}, {}, {}, {})


def _add(table: dict, key, value) -> None:
    table[key] = table.get(key, 0) + value


def candidate_pairs(masks, gt: Segments, pred: Segments) -> tuple[np.ndarray, np.ndarray]:
    """(gt index, pred index) int [K] of the pairs that may match: overlapping, same category, ground truth
    not crowd; row-major (increasing gt id, then pred id: the reference's order)."""
    n_gt, n_pred = gt.ids.size, pred.ids.size
    candidates = (masks[:n_gt, :n_pred] > 0) & ~gt.crowd[:, None] & (gt.category[:, None] == pred.category[None, :])
    return np.nonzero(candidates)


def _match(masks, gt: Segments, pred: Segments, boundary_iou, stats: CategoryStats):
    """True-positive pairs (iou > 0.5 on non-crowd ground truth of the same category); returns matched flags."""
    n_gt, n_pred = gt.ids.size, pred.ids.size
    void = masks.shape[0] - 2
    pred_area = masks[:, :n_pred].sum(axis=0)
    gt_matched, pred_matched = np.zeros(n_gt, bool), np.zeros(n_pred, bool)
    g_index, p_index = candidate_pairs(masks, gt, pred)
    if g_index.size:
        i = masks[g_index, p_index]
        union = pred_area[p_index] + gt.area[g_index] - i - masks[void, p_index]
        iou = i / union
        if boundary_iou is not None:
            iou = np.minimum(iou, boundary_iou)
        hit = iou > 0.5
        for g, value in zip(g_index[hit], iou[hit]):
            _add(stats.tp, gt.category[g], 1)
            _add(stats.iou, gt.category[g], float(value))
        gt_matched[g_index[hit]] = True
        pred_matched[p_index[hit]] = True
    return gt_matched, pred_matched, pred_area


def image_stats(masks: np.ndarray, gt: Segments, pred: Segments, stats: CategoryStats,
                boundary_iou: np.ndarray | None = None) -> None:
    """Adds one image's TP / FP / FN and IoU sums to ``stats`` (panopticapi's rules).

    Args:
      masks: the :func:`panoptic_confusion` histogram (host int array).
      gt, pred: the listed segments in sorted-id order (the histogram's label order).
      boundary_iou: Boundary PQ: float64 [K] boundary IoU of each :func:`candidate_pairs` pair (the
        similarity is then the min of mask and boundary IoU); None for PQ.
    """
    void = masks.shape[0] - 2
    gt_matched, pred_matched, pred_area = _match(masks, gt, pred, boundary_iou, stats)
    crowd_of_category = {}
    for g in np.argsort(gt.order, kind="stable"):  # segments_info order: the last crowd region of a category wins
        if gt_matched[g]:
            continue
        if gt.crowd[g]:
            crowd_of_category[gt.category[g]] = g
            continue
        _add(stats.fn, gt.category[g], 1)
    for p in range(pred.ids.size):
        if pred_matched[p]:
            continue
        ignored = masks[void, p]
        if pred.category[p] in crowd_of_category:
            ignored = ignored + masks[crowd_of_category[pred.category[p]], p]
        if ignored / pred_area[p] > 0.5:
            continue
        _add(stats.fp, pred.category[p], 1)


def merge_stats(total: CategoryStats, part: CategoryStats) -> None:
    """Adds ``part`` into ``total``."""
    for name in CategoryStats._fields:
        for key, value in getattr(part, name).items():
            _add(getattr(total, name), key, value)


def pq_average(stats: CategoryStats, categories: Mapping, isthing: bool | None) -> tuple[dict, dict]:
    """PQ, SQ, RQ averaged over the categories with any TP, FP or FN (panopticapi's ``pq_average``).

    Args:
      stats: the sums over all images.
      categories: category id -> category dict (with ``isthing``), the ground truth's list.
      isthing: True = things only, False = stuff only, None = all.

    Returns:
      ({"pq", "sq", "rq", "n"}, per category id {"pq", "sq", "rq"}); with no
      category counted the averages are NaN (the reference divides by zero).
    """
    pq = sq = rq = 0.0
    n = 0
    per_class = {}
    for label, info in categories.items():
        if isthing is not None and (info.get("isthing") == 1) != isthing:
            continue
        iou, tp = stats.iou.get(label, 0.0), stats.tp.get(label, 0)
        fp, fn = stats.fp.get(label, 0), stats.fn.get(label, 0)
        if tp + fp + fn == 0:
            per_class[label] = {"pq": 0.0, "sq": 0.0, "rq": 0.0}
            continue
        n += 1
        pq_class = iou / (tp + 0.5 * fp + 0.5 * fn)
        sq_class = iou / tp if tp != 0 else 0
        rq_class = tp / (tp + 0.5 * fp + 0.5 * fn)
        per_class[label] = {"pq": pq_class, "sq": sq_class, "rq": rq_class}
        pq, sq, rq = pq + pq_class, sq + sq_class, rq + rq_class
    if n == 0:
        return {"pq": float("nan"), "sq": float("nan"), "rq": float("nan"), "n": 0}, per_class
    return {"pq": pq / n, "sq": sq / n, "rq": rq / n, "n": n}, per_class


__all__ = ["SENTINEL_ID", "panoptic_confusion", "Segments", "candidate_pairs", "CategoryStats", "new_stats", "image_stats",
           "merge_stats", "pq_average"]
