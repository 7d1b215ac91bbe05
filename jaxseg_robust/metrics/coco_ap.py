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
COCO_AP_MAX_DETS = 100  # the max-dets value COCOeval's summary reads its first AP at, whatever params say


@dataclasses.dataclass(frozen=True)
class APParams:
    """Evaluation settings (the references' defaults).

    Attributes:
      max_dets: detections per block considered for each recall column (COCO
        1, 10, 100); ``(None,)`` = every detection of the block (LVIS, which
        caps detections per *image* when it loads the results).
      upper_inclusive: an area equal to a range's upper bound is inside it (COCO:
        out of range iff ``area < lo or area > hi``); False for LVIS (``area >= hi``).
      iou_thresholds: the T IoU thresholds (COCOeval's ``iouThrs``).
      recall_thresholds: the R recall points precision is read at (``recThrs``), increasing.
      area_ranges: the A ``(low, high)`` object-area ranges in pixels (``areaRng``);
        area_labels: their names (``areaRngLbl``; the summaries look "all", "small",
        "medium" and "large" up by name, -1 when absent, as the references do).
    """

    max_dets: tuple = (1, 10, 100)
    upper_inclusive: bool = True
    iou_thresholds: tuple = tuple(IOU_THRESHOLDS.tolist())
    recall_thresholds: tuple = tuple(RECALL_THRESHOLDS.tolist())
    area_ranges: tuple = AREA_RANGES
    area_labels: tuple = AREA_LABELS

    def __post_init__(self):
        if not self.max_dets or not self.iou_thresholds or not self.recall_thresholds or not self.area_ranges:
            raise ValueError("max_dets, iou_thresholds, recall_thresholds and area_ranges must not be empty")
        if len(self.area_labels) != len(self.area_ranges):
            raise ValueError(f"{len(self.area_ranges)} area ranges but {len(self.area_labels)} area labels")
        if any(m is not None and m < 1 for m in self.max_dets):
            raise ValueError(f"max_dets must be >= 1, got {self.max_dets}")
        if np.any(np.diff(self.recall_thresholds) < 0):
            raise ValueError(f"recall_thresholds must be increasing, got {self.recall_thresholds}")

    @property
    def ious(self) -> np.ndarray:
        """float64 [T] the IoU thresholds."""
        return np.asarray(self.iou_thresholds, np.float64)

    @property
    def recalls(self) -> np.ndarray:
        """float64 [R] the recall thresholds."""
        return np.asarray(self.recall_thresholds, np.float64)

    @property
    def block_limit(self) -> int | None:
        """Detections kept per block (the largest max_dets), None = all."""
        return self.max_dets[-1]


COCO_PARAMS = APParams()
LVIS_PARAMS = APParams(max_dets=(None,), upper_inclusive=False)


class Blocks(NamedTuple):
    """The blocks of an evaluation, one (image, category) each, stored column-wise (host arrays).

    Within a block, ground truths are in file order and detections in
    decreasing score (stable) order, capped as the reference caps them; the
    blocks of one category are in increasing image id order.

    Attributes:
      category: int [B] category index (0 .. K-1) of each block.
      n_dt, n_gt: int [B] detections and ground truths of each block.
      ious: float64 [sum n_dt * n_gt]: each block's [n_dt, n_gt] similarity matrix, row-major, block after block.
      gt_area: float64 [sum n_gt] the annotations' ``area`` field; gt_ignore: bool, ``ignore`` or
        ``iscrowd`` set; gt_crowd: bool, ``iscrowd`` set (crowd regions can match several detections).
      dt_area, dt_score: float64 [sum n_dt].
      dt_unpenalised: bool [B], unmatched detections of the block are ignored (LVIS: the category
        is in the image's ``not_exhaustive_category_ids``).
    """

    category: np.ndarray
    n_dt: np.ndarray
    n_gt: np.ndarray
    ious: np.ndarray
    gt_area: np.ndarray
    gt_ignore: np.ndarray
    gt_crowd: np.ndarray
    dt_area: np.ndarray
    dt_score: np.ndarray
    dt_unpenalised: np.ndarray


class Matches(NamedTuple):
    """The matching of every block, block after block: ``dt_matched``/``dt_ignore`` bool [A, T, sum n_dt],
    ``gt_ignore`` bool [A, sum n_gt]; ``dt_partner`` int32 [A, T, sum n_dt] (only when asked for): the
    index within its block (file order) of the ground truth each detection matched, -1 for none."""

    dt_matched: np.ndarray
    dt_ignore: np.ndarray
    gt_ignore: np.ndarray
    dt_partner: np.ndarray | None = None


def piece_starts(counts: np.ndarray) -> np.ndarray:
    """int64 [B]: where each of B consecutive pieces of the given sizes starts."""
    counts = np.asarray(counts, np.int64)
    return np.cumsum(counts) - counts


def piece_positions(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(piece of each element, index of the element within its piece) for consecutive pieces of these sizes."""
    counts = np.asarray(counts, np.int64)
    piece = np.repeat(np.arange(counts.size), counts)
    return piece, np.arange(piece.size) - piece_starts(counts)[piece]


def piece_elements(counts: np.ndarray, order: np.ndarray) -> np.ndarray:
    """int64 [sum counts[order]]: the elements of pieces of these sizes, taken piece by piece in ``order``."""
    counts = np.asarray(counts, np.int64)
    piece, within = piece_positions(counts[order])
    return piece_starts(counts)[order][piece] + within


def take_blocks(blocks: Blocks, order) -> Blocks:
    """The blocks ``order`` (int [B'] block indices) of ``blocks``, in that order, with their elements."""
    order = np.asarray(order, np.int64)
    gt, dt = piece_elements(blocks.n_gt, order), piece_elements(blocks.n_dt, order)
    pairs = piece_elements(blocks.n_dt * blocks.n_gt, order)
    return Blocks(category=blocks.category[order], n_dt=blocks.n_dt[order], n_gt=blocks.n_gt[order],
                  ious=blocks.ious[pairs], gt_area=blocks.gt_area[gt], gt_ignore=blocks.gt_ignore[gt],
                  gt_crowd=blocks.gt_crowd[gt], dt_area=blocks.dt_area[dt], dt_score=blocks.dt_score[dt],
                  dt_unpenalised=blocks.dt_unpenalised[order])


def concatenate_blocks(tables: list) -> Blocks:
    """The blocks of several tables one after the other (every field is in block order)."""
    return Blocks(*(np.concatenate([getattr(table, field) for table in tables]) for field in Blocks._fields))


def out_of_range(area, params: APParams) -> np.ndarray:
    """bool [A, n]: ``area`` [n] outside each area range (the reference's comparisons)."""
    area = np.asarray(area, np.float64)[None, :]
    low = np.array([r[0] for r in params.area_ranges], np.float64)[:, None]
    high = np.array([r[1] for r in params.area_ranges], np.float64)[:, None]
    return (area < low) | ((area > high) if params.upper_inclusive else (area >= high))


def _last_best(scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(index of the last maximum along the last axis, whether that maximum is finite)."""
    best = scores.max(axis=-1, keepdims=True)
    size = scores.shape[-1]
    index = size - 1 - np.argmax((scores == best)[..., ::-1], axis=-1)
    return index, np.isfinite(best[..., 0])


def _match_group(ious: np.ndarray, crowd: np.ndarray, ignore: np.ndarray, thresholds: np.ndarray,
                 with_partners: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Greedy matching of a group of padded blocks, all area ranges and thresholds at once.

    For each detection in rank order and each (area range, threshold): among
    the ground truths not yet taken (crowd regions are never taken) whose IoU
    reaches the threshold, the non-ignored ones win over the ignored ones, and
    within a kind the highest IoU wins, ties going to the later ground truth
    (the reference's scan with ``>=``, non-ignored ground truths first).

    Args:
      ious: float64 [B, D, G], ``-inf`` for padding.
      crowd: bool [B, G]; ignore: bool [B, A, G] (area range or ignore flag).
      thresholds: float64 [T] the IoU thresholds; with_partners: also record the partners.

    Returns:
      (matched bool [B, A, T, D], matched to an ignored ground truth bool [B, A, T, D],
      the matched ground truth's index int32 [B, A, T, D], -1 for none, or None without ``with_partners``).
    """
    batch, n_dt, n_gt = ious.shape
    n_area, n_thr = ignore.shape[1], thresholds.size
    threshold = np.minimum(thresholds, 1 - 1e-10)[None, None, :, None]
    taken = np.zeros((batch, n_area, n_thr, n_gt), bool)
    matched = np.zeros((batch, n_area, n_thr, n_dt), bool)
    on_ignored = np.zeros_like(matched)
    partner = np.full(matched.shape, -1, np.int32) if with_partners else None
    ignore4 = ignore[:, :, None, :]
    free_crowd = crowd[:, None, None, :]
    flat = np.arange(batch * n_area * n_thr)
    for d in range(n_dt):
        iou = ious[:, d, :][:, None, None, :]
        candidate = (~taken | free_crowd) & (iou >= threshold)
        regular_ok = (candidate & ~ignore4).any(axis=-1)
        kind = np.where(regular_ok[..., None], ~ignore4, ignore4)  # regular ground truths if any is a candidate
        pick, found = _last_best(np.where(candidate & kind, iou, -np.inf))
        matched[..., d] = found
        on_ignored[..., d] = found & ~regular_ok
        if with_partners:
            partner[..., d] = np.where(found, pick, -1)
        taken.reshape(-1, n_gt)[flat, pick.reshape(-1)] |= found.reshape(-1)
    return matched, on_ignored, partner


def _pad_to(size: int) -> int:
    return 1 << max(int(size) - 1, 0).bit_length()


def _match_padded(blocks: Blocks, members: np.ndarray, shape: tuple[int, int], gt_ignore: np.ndarray,
                  thresholds: np.ndarray, out: tuple) -> None:
    """Matches the blocks ``members`` (all with detections and ground truths) padded to ``shape`` = (D, G).

    Writes their detections' columns of ``out`` = (matched, on ignored, partner or None) [A, T, sum n_dt].
    """
    n_dt, n_gt = blocks.n_dt[members], blocks.n_gt[members]
    gt_first, dt_first = piece_starts(blocks.n_gt)[members], piece_starts(blocks.n_dt)[members]
    iou_first = piece_starts(blocks.n_dt * blocks.n_gt)[members]
    ious = np.full((members.size,) + shape, -np.inf)
    row, pair = piece_positions(n_dt * n_gt)
    ious[row, pair // n_gt[row], pair % n_gt[row]] = blocks.ious[iou_first[row] + pair]
    crowd = np.zeros((members.size, shape[1]), bool)
    ignore = np.ones((members.size, gt_ignore.shape[0], shape[1]), bool)
    row, g = piece_positions(n_gt)
    crowd[row, g] = blocks.gt_crowd[gt_first[row] + g]
    ignore[row, :, g] = gt_ignore[:, gt_first[row] + g].T
    row, d = piece_positions(n_dt)
    for target, values in zip(out, _match_group(ious, crowd, ignore, thresholds, out[2] is not None)):
        if target is not None:
            target[:, :, dt_first[row] + d] = values[row, :, :, d].transpose(1, 2, 0)


def match_blocks(blocks: Blocks, params: APParams, *, with_partners: bool = False) -> Matches:
    """The reference's ``evaluateImg`` for every block and area range.

    Blocks are grouped by their size rounded up to powers of two and each
    group is matched at once (`_match_group`), whatever its categories.
    ``with_partners`` also records which ground truth each detection matched
    (``Matches.dt_partner``, what ``COCOeval.evalImgs`` lists).
    """
    gt_ignore = blocks.gt_ignore[None, :] | out_of_range(blocks.gt_area, params)
    shape = (len(params.area_ranges), len(params.iou_thresholds), blocks.dt_score.size)
    matched, on_ignored = np.zeros(shape, bool), np.zeros(shape, bool)
    partner = np.full(shape, -1, np.int32) if with_partners else None
    both = np.flatnonzero((blocks.n_dt > 0) & (blocks.n_gt > 0))
    padded = np.array([[_pad_to(d), _pad_to(g)] for d, g in zip(blocks.n_dt[both], blocks.n_gt[both])],
                      np.int64).reshape(-1, 2)
    for size in np.unique(padded, axis=0):
        members = both[(padded == size).all(axis=1)]
        _match_padded(blocks, members, (int(size[0]), int(size[1])), gt_ignore, params.ious,
                      (matched, on_ignored, partner))
    unmatched_ignored = out_of_range(blocks.dt_area, params) | np.repeat(blocks.dt_unpenalised, blocks.n_dt)
    return Matches(matched, on_ignored | (~matched & unmatched_ignored[:, None, :]), gt_ignore, partner)


class Accumulated(NamedTuple):
    """``precision`` float64 [T, R, K, A, M] and ``recall`` [T, K, A, M]; -1 where a setting has no ground truth.

    ``scores`` float64 [T, R, K, A, M] (only when asked for): the score of the detection each precision
    was read at (0 past the last detection), COCOeval's ``eval["scores"]``.
    """

    precision: np.ndarray
    recall: np.ndarray
    scores: np.ndarray | None = None


ACCUMULATE_ELEMENTS = 1 << 21  # (setting, detection) elements per vectorised accumulation step


def _recall_steps(n_gt: np.ndarray, thresholds: np.ndarray) -> np.ndarray:
    """int64 [..., R]: for each ground-truth count (> 0), the fewest true positives whose recall reaches each threshold.

    ``k`` true positives give the reference's recall ``k / n_gt`` (float64);
    its ``searchsorted(recall, r, "left")`` finds the first detection where
    that reaches ``r``, i.e. where the TP count first reaches this ``k``.
    Counts of 0 get ``k = 0`` (their settings are undefined). ``thresholds``: float64 [R].
    """
    n_gt = np.asarray(n_gt, np.int64)
    steps = np.zeros(n_gt.shape + thresholds.shape, np.int64)
    for count in np.unique(n_gt[n_gt > 0]):
        steps[n_gt == count] = np.searchsorted(np.arange(count + 1) / int(count), thresholds, side="left")
    return steps


def _segments_precision(tps: np.ndarray, fps: np.ndarray, lengths: np.ndarray,
                        steps: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Precision at the recall thresholds of several categories' detections laid end to end, every setting at once.

    The reference's steps for each setting row and category: cumulative TP /
    FP counts, precision ``tp / (tp + fp + eps)`` made non-increasing from the
    right, read at the first detection whose recall reaches each threshold
    (0 past the last detection). Here counts restart at each category, the
    first detection with ``k`` TPs is read off the TP positions, and the
    right-to-left maximum from there is the maximum over the stretches
    between consecutive read positions (``maximum.reduceat`` over the
    precisions with a 0 after each category, which is what a threshold past
    the last detection reads) accumulated from the right, all exact.

    Args:
      tps, fps: bool [rows, N]: detections (score order within each category)
        counted as true / false positives in each setting row.
      lengths: int [S] detections of each category (> 0), ``sum = N``.
      steps: int [S, rows, R] TP count at which each recall threshold is reached (:func:`_recall_steps`).

    Returns:
      (precision float64 [R, rows, S], TP count at the last detection int64 [rows, S], the detection
      each threshold reads int64 [rows, S, R]: index within its category, its length when none).
    """
    n_rows, n = tps.shape
    first = piece_starts(lengths)
    segment = np.repeat(np.arange(lengths.size), lengths)
    tp_count, fp_count = np.cumsum(tps, axis=1), np.cumsum(fps, axis=1)
    tp_count -= np.concatenate([np.zeros((n_rows, 1), np.int64), tp_count], axis=1)[:, first][:, segment]
    fp_count -= np.concatenate([np.zeros((n_rows, 1), np.int64), fp_count], axis=1)[:, first][:, segment]
    tp_sum = tp_count.astype(np.float64)
    separated = np.zeros((n_rows, n + lengths.size))  # each category's precisions, then a 0
    separated[:, np.arange(n) + segment] = tp_sum / (fp_count.astype(np.float64) + tp_sum + np.spacing(1))
    # reached[row, segment, k]: local index of the first detection with k TPs (its length when none), flattened.
    width = lengths + 2
    table_first = piece_starts(width)
    row_width = int(width.sum())
    reached = np.tile(np.repeat(lengths, width), n_rows)
    reached[(np.arange(n_rows)[:, None] * row_width + table_first[None, :]).reshape(-1)] = 0
    row, column = np.nonzero(tps)
    owner = segment[column]
    reached[row * row_width + table_first[owner] + tp_count[row, column]] = column - first[owner]
    wanted = np.minimum(steps, (lengths + 1)[:, None, None]).transpose(1, 0, 2)  # [rows, S, R]
    index = reached[(np.arange(n_rows) * row_width)[:, None, None] + table_first[None, :, None] + wanted]
    position = index + ((np.arange(n_rows) * separated.shape[1])[:, None, None] + (first + np.arange(lengths.size)
                                                                                     )[None, :, None])
    stretches = np.maximum.reduceat(separated.reshape(-1), position.reshape(-1)).reshape(-1, steps.shape[-1])
    envelope = np.maximum.accumulate(np.ascontiguousarray(stretches.T[::-1]), axis=0)[::-1]
    return envelope.reshape(-1, n_rows, lengths.size), tp_count[:, first + lengths - 1], index


def _read_scores(index: np.ndarray, wanted: np.ndarray, kept: np.ndarray, scores: np.ndarray,
                 lengths: np.ndarray) -> np.ndarray:
    """float64 [A, M, T, S, R]: the score of the detection each recall threshold reads (0 when none).

    The reference reads the detection list of each max-dets setting with the
    detections beyond the cap left out, so a threshold reached with 0 TPs
    reads that list's first detection: the first *kept* one here (a
    threshold reached with k > 0 TPs reads a TP, which is kept).

    Args:
      index: int [A, M, T, S, R] from :func:`_segments_precision`; wanted: int [A, M, T, S, R] the TP
        count each threshold is reached at; kept: bool [M, N]; scores: float64 [N] (score order within
        each category); lengths: int [S] (> 0).
    """
    first = piece_starts(lengths)
    local = np.arange(scores.size) - np.repeat(first, lengths)
    first_kept = np.minimum.reduceat(np.where(kept, local, np.repeat(lengths, lengths)[None]), first, axis=1)
    index = np.where(wanted == 0, first_kept[None, :, None, :, None], index)
    found = index < lengths[:, None]
    return np.where(found, scores[np.where(found, index + first[:, None], 0)], 0.0)


def _category_chunks(lengths: np.ndarray, per_chunk: int) -> list[np.ndarray]:
    """Indices of consecutive categories in chunks of at most ``per_chunk`` detections (or of one category)."""
    chunks, current, size = [], [], 0
    for index, length in enumerate(lengths):
        if current and size + length > per_chunk:
            chunks.append(np.array(current))
            current, size = [], 0
        current.append(index)
        size += int(length)
    return chunks + [np.array(current)] if current else chunks


def accumulate(blocks: Blocks, matches: Matches, n_categories: int, params: APParams, *,
               with_scores: bool = False) -> Accumulated:
    """The reference's ``accumulate``: precision at the recall points and final recall per setting.

    Vectorised over categories, area ranges, max-dets and thresholds
    (:func:`_segments_precision`): a detection beyond a block's ``max_dets``
    counts as neither TP nor FP instead of being left out. That only repeats
    the counts of the detection before it (or leaves zeros before the first
    one), which changes no precision envelope value read and no first index
    where a recall is reached, so every number equals the reference's.

    Args:
      blocks: every block (:class:`Blocks`); matches: their :func:`match_blocks`.
      n_categories: K, the evaluated categories (indices in ``blocks.category``).
      with_scores: also the score each precision is read at (``Accumulated.scores``).

    Returns:
      Accumulated arrays.
    """
    n_thr, n_area, n_max = len(params.iou_thresholds), len(params.area_ranges), len(params.max_dets)
    gt_category = np.repeat(blocks.category, blocks.n_gt)
    n_gt = np.stack([np.bincount(gt_category, ~ignored, minlength=n_categories) for ignored in matches.gt_ignore],
                    axis=1).astype(np.int64)  # [K, A]
    precision = np.zeros((n_thr, len(params.recall_thresholds), n_categories, n_area, n_max))
    scores = np.zeros_like(precision) if with_scores else None
    tp_final = np.zeros((n_thr, n_categories, n_area, n_max), np.int64)
    dt_category = np.repeat(blocks.category, blocks.n_dt)
    _, ranks = piece_positions(blocks.n_dt)
    order = np.lexsort((-blocks.dt_score, dt_category))  # stable: within a category, ties keep block order
    lengths = np.bincount(dt_category, minlength=n_categories)
    first = piece_starts(lengths)
    scored = np.flatnonzero(n_gt.any(axis=1) & (lengths > 0))  # categories with something to accumulate
    steps = _recall_steps(n_gt, params.recalls)  # [K, A, R]
    n_rows = n_area * n_max * n_thr
    for chunk in _category_chunks(lengths[scored], max(1, ACCUMULATE_ELEMENTS // n_rows)):
        categories = scored[chunk]
        chosen = order[np.concatenate([np.arange(first[k], first[k] + lengths[k]) for k in categories])]
        kept = np.stack([np.ones(chosen.size, bool) if max_det is None else ranks[chosen] < max_det
                         for max_det in params.max_dets])  # [M, n]
        counted = ~matches.dt_ignore[:, None][..., chosen] & kept[None, :, None, :]  # [A, M, T, n]
        hit = matches.dt_matched[:, None][..., chosen]
        wanted = np.broadcast_to(steps[categories][:, :, None, None],
                                 (len(categories), n_area, n_max, n_thr, steps.shape[-1]))
        values, final, index = _segments_precision((hit & counted).reshape(n_rows, -1),
                                                   (~hit & counted).reshape(n_rows, -1), lengths[categories],
                                                   wanted.reshape(len(categories), n_rows, -1))
        # values [R, rows = (A, M, T), S], final [rows, S] -> [T, R, K, A, M], [T, K, A, M]
        precision[:, :, categories] = values.reshape(-1, n_area, n_max, n_thr, len(categories)).transpose(3, 0, 4, 1, 2)
        tp_final[:, categories] = final.reshape(n_area, n_max, n_thr, -1).transpose(2, 3, 0, 1)
        if with_scores:  # [A, M, T, S, R] -> [T, R, S, A, M]
            read = _read_scores(index.reshape(n_area, n_max, n_thr, len(categories), -1),
                                np.moveaxis(wanted, 0, 3), kept, blocks.dt_score[chosen], lengths[categories])
            scores[:, :, categories] = read.transpose(2, 4, 3, 0, 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        recall = tp_final / n_gt[None, :, :, None]  # the reference's tp / n_gt, float64
    undefined = (n_gt == 0)[:, :, None]
    precision[:, :, undefined.repeat(n_max, axis=2)] = -1.0
    recall[:, undefined.repeat(n_max, axis=2)] = -1.0
    if with_scores:
        scores[:, :, undefined.repeat(n_max, axis=2)] = -1.0
    return Accumulated(precision, recall, scores)


def _mean_defined(values: np.ndarray) -> float:
    defined = values[values > -1]
    return float(np.mean(defined)) if defined.size else -1.0


def summary_value(acc: Accumulated, kind: str, *, iou: float | None = None, area: str = "all",
                  max_det_index: int = -1, categories=None, params: APParams = COCO_PARAMS) -> float:
    """One summary number: the mean of the defined entries of a slice (-1 when none), as the references.

    Args:
      acc: accumulated arrays; kind: ``"ap"`` (precision) or ``"ar"`` (recall).
      iou: one IoU threshold (matched with ``==`` as the reference does) or None for all.
      area: area-range label; max_det_index: index into ``params.max_dets``.
      categories: optional list of category indices (LVIS frequency groups).
      params: the settings ``acc`` was accumulated with (its thresholds and area labels; an IoU or
        area label they lack gives -1, as the references).
    """
    area_index = [i for i, label in enumerate(params.area_labels) if label == area]
    values = acc.precision if kind == "ap" else acc.recall
    if iou is not None:
        values = values[np.where(iou == params.ious)[0]]
    cat_axis = 2 if kind == "ap" else 1
    if categories is not None:
        values = np.take(values, np.asarray(categories, int), axis=cat_axis)
    values = np.take(values, area_index, axis=cat_axis + 1)
    return _mean_defined(np.take(values, [max_det_index], axis=cat_axis + 2))


def coco_summary(acc: Accumulated, params: APParams = COCO_PARAMS) -> dict[str, float]:
    """The 12 numbers of ``COCOeval.summarize`` (segm / boundary), by their usual names.

    As the reference: the first AP is read at the max-dets setting of value
    100 (-1 without one: ``_summarize``'s default argument), the other APs and
    the area-range ARs at the third setting, AR1 / AR10 / AR100 at the first
    three (whatever their values), so ``params.max_dets`` needs three entries.
    """
    if len(params.max_dets) < 3:
        raise ValueError(f"the COCO summary reads three max-dets settings, got {params.max_dets}")
    third = 2
    at_100 = [i for i, max_det in enumerate(params.max_dets) if max_det == COCO_AP_MAX_DETS]
    values = [
        summary_value(acc, "ap", max_det_index=at_100[0], params=params) if at_100 else -1.0,
        summary_value(acc, "ap", iou=0.5, max_det_index=third, params=params),
        summary_value(acc, "ap", iou=0.75, max_det_index=third, params=params),
        *(summary_value(acc, "ap", area=a, max_det_index=third, params=params) for a in ("small", "medium", "large")),
        *(summary_value(acc, "ar", max_det_index=m, params=params) for m in range(3)),
        *(summary_value(acc, "ar", area=a, max_det_index=third, params=params) for a in ("small", "medium", "large")),
    ]
    return dict(zip(COCO_SUMMARY_NAMES, values))


def lvis_summary(acc: Accumulated, frequency_groups: list[list[int]],
                 params: APParams = LVIS_PARAMS) -> dict[str, float]:
    """The 13 numbers of ``LVISEval.summarize`` (AR at the per-image cap, 300 by default)."""
    values = [
        summary_value(acc, "ap", params=params),
        summary_value(acc, "ap", iou=0.5, params=params),
        summary_value(acc, "ap", iou=0.75, params=params),
        *(summary_value(acc, "ap", area=a, params=params) for a in ("small", "medium", "large")),
        *(summary_value(acc, "ap", categories=group, params=params) for group in frequency_groups),
        summary_value(acc, "ar", params=params),
        *(summary_value(acc, "ar", area=a, params=params) for a in ("small", "medium", "large")),
    ]
    return dict(zip(LVIS_SUMMARY_NAMES, values))


def _row_means(values: np.ndarray) -> np.ndarray:
    """float64 [K]: :func:`_mean_defined` of each row of ``values`` [K, n].

    A row that is wholly defined (as every (category, area, max-dets) setting
    is: accumulate fills it at once) is averaged along the contiguous axis,
    which sums it in the same pairwise order as the 1-D mean of the row;
    other rows go through :func:`_mean_defined`.
    """
    values = np.ascontiguousarray(values)
    defined = values > -1
    out = np.where(defined.all(axis=1), values.mean(axis=1) if values.shape[1] else -1.0, -1.0)
    for k in np.flatnonzero(defined.any(axis=1) & ~defined.all(axis=1)):
        out[k] = _mean_defined(values[k])
    return out


def per_category_ap(acc: Accumulated, params: APParams = COCO_PARAMS) -> np.ndarray:
    """float64 [K, 6]: AP, AP50, AP75, APs, APm, APl of each category at the largest max_dets (-1 = undefined).

    Each number is :func:`summary_value` of the category alone, computed for all categories at once
    (``params``: the thresholds and area labels ``acc`` was accumulated with).
    """
    precision = np.moveaxis(acc.precision[..., -1], 2, 0)  # [K, T, R, A]
    n_cat = precision.shape[0]
    areas = {label: [i for i, name in enumerate(params.area_labels) if name == label]
             for label in ("all", "small", "medium", "large")}
    columns = [precision[:, :, :, areas["all"]].reshape(n_cat, -1)]
    for iou in (0.5, 0.75):
        columns.append(precision[:, np.where(iou == params.ious)[0]][..., areas["all"]].reshape(n_cat, -1))
    columns += [precision[:, :, :, areas[a]].reshape(n_cat, -1) for a in ("small", "medium", "large")]
    return np.stack([_row_means(values) for values in columns], axis=1).reshape(-1, 6)


PER_CATEGORY_COLUMNS = ("AP", "AP50", "AP75", "APs", "APm", "APl")

__all__ = ["IOU_THRESHOLDS", "RECALL_THRESHOLDS", "AREA_RANGES", "AREA_LABELS", "COCO_SUMMARY_NAMES",
           "LVIS_SUMMARY_NAMES", "FREQUENCY_GROUPS", "COCO_AP_MAX_DETS", "PER_CATEGORY_COLUMNS", "APParams", "COCO_PARAMS",
           "LVIS_PARAMS", "Blocks", "Matches", "Accumulated", "out_of_range", "take_blocks", "concatenate_blocks",
           "match_blocks", "accumulate",
           "summary_value", "coco_summary", "lvis_summary", "per_category_ap", "piece_starts", "piece_positions",
           "piece_elements"]
