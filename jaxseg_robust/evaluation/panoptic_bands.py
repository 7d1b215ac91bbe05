"""Boundary PQ's band counts on the batched crops of Boundary AP.

Follows docs/protocols/boundary_ap_pq.md ("Panoptic", "Crops"). A listed
segment's inner boundary band is the band of its binary mask (outside the image
= background), so the segments of many images go through
`jaxseg_robust.evaluation.crop_counts.count_pairs_on_crops` as run-length masks:
per image the ground-truth segments, the predicted segments and the ground
truth's VOID region (a ``solid`` mask: its "band" is the whole region). The
pairs are the candidate matches of
`jaxseg_robust.metrics.panoptic.candidate_pairs` and, for each, (VOID, predicted
segment), whose band intersection is the predicted band's VOID pixels.
"""

from __future__ import annotations

import numpy as np

from jaxseg_robust.evaluation.mask_counts import ImageWork
from jaxseg_robust.metrics.mask_pairs import PairCounts


def label_runs(labels: np.ndarray, count: int) -> list:
    """COCO run lengths (column-major, background first) of labels ``0..count-1`` of a label map.

    Args:
      labels: int [H, W] label map (other values: any label outside ``0..count-1``).
      count: labels to return.

    Returns:
      ``count`` int64 arrays (an empty array for a label absent from the map).
    """
    flat = np.asarray(labels).T.reshape(-1)
    order = np.argsort(flat, kind="stable")  # pixels grouped by label, in column-major order
    ordered = flat[order]
    bounds = np.searchsorted(ordered, np.arange(count + 1))
    position, label = order[bounds[0]:bounds[-1]].astype(np.int64), ordered[bounds[0]:bounds[-1]]
    if not position.size:
        return [np.zeros(0, np.int64) for _ in range(count)]
    new_run = np.ones(position.size, bool)
    new_run[1:] = (position[1:] != position[:-1] + 1) | (label[1:] != label[:-1])
    first = np.flatnonzero(new_run)
    starts, ends = position[first], position[np.append(first[1:], position.size) - 1] + 1
    run_label = label[first]
    opens_label = np.ones(first.size, bool)
    opens_label[1:] = run_label[1:] != run_label[:-1]
    previous_end = np.where(opens_label, 0, np.concatenate([[0], ends[:-1]]))
    runs = np.empty(2 * first.size, np.int64)
    runs[0::2], runs[1::2] = starts - previous_end, ends - starts
    per_label = np.bincount(run_label, minlength=count)[:count]
    return np.split(runs, 2 * np.cumsum(per_label)[:-1])


def band_work(gt_labels: np.ndarray, pred_labels: np.ndarray, n_gt: int, n_pred: int, candidates) -> ImageWork:
    """The crop work of one image's candidate pairs.

    Args:
      gt_labels, pred_labels: int [H, W] compact labels (listed ``0..n-1``, then VOID = ``n_gt`` on the
        ground-truth side, anything else above).
      candidates: (gt index, pred index) int [K] each.

    Returns:
      ImageWork with masks = gt segments, pred segments, gt VOID (``solid``); pairs = the K candidates, then
      (VOID, pred) for each candidate.
    """
    height, width = gt_labels.shape
    masks = label_runs(gt_labels, n_gt + 1)
    masks = masks[:n_gt] + label_runs(pred_labels, n_pred) + masks[n_gt:]
    g_index, p_index = (np.asarray(side, np.int64) for side in candidates)
    void = np.full_like(g_index, n_gt + n_pred)
    pairs = np.concatenate([np.stack([g_index, n_gt + p_index], 1), np.stack([void, n_gt + p_index], 1)])
    return ImageWork(height, width, masks, pairs.reshape(-1, 2), np.array([n_gt + n_pred], np.int64))


def boundary_ious(counts: PairCounts, n_gt: int, candidates) -> np.ndarray:
    """float64 [K]: the Boundary IoU of each candidate pair, as the Boundary IoU authors' ``pq_compute`` forms it.

    ``bi / (band_pred + band_gt - bi - band_pred_on_void)`` from the counts of :func:`band_work`'s work.
    """
    g_index, p_index = candidates
    k = len(g_index)
    bi, on_void = counts.boundary_intersection[:k], counts.boundary_intersection[k:2 * k]
    union = counts.boundary_area[n_gt + np.asarray(p_index)] + counts.boundary_area[np.asarray(g_index)] - bi - on_void
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.asarray(bi, np.int64) / np.asarray(union, np.int64)


__all__ = ["label_runs", "band_work", "boundary_ious"]
