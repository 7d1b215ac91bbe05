"""Pixel counts of mask pairs straight from their run-length encodings (host NumPy, no decoding).

Follows docs/protocols/boundary_ap_pq.md ("How it runs"). Mask AP needs, per
(detection, ground truth) pair, only the two areas and the intersection, all
of which follow from the COCO run lengths: a mask is a sorted list of
foreground intervals ``[start, end)`` of the column-major pixel index, and the
intersection of two masks is the sum, over the intervals of one, of the other
mask's foreground pixels inside it. That is what pycocotools' ``rleIou`` does
in C by merging the two run lists; here it is one vectorised pass over every
pair of a batch: the intervals of the mask with fewer intervals (only those
that reach into the other mask's extent) are looked up among the other mask's
interval starts with ``searchsorted``, and the other mask's cumulative
foreground count is read off there. The cost is O(runs · log runs), no pixel
is touched, and every count is an exact integer.

The device path (`jaxseg_robust.metrics.mask_pairs`) decodes into packed bits
and also computes boundary bands; on a CPU, for mask AP, this path is faster
(docs/protocols/boundary_ap_pq.md, "Performance").
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


class RunTable(NamedTuple):
    """The foreground intervals of ``N`` masks, concatenated (int64 host arrays).

    Attributes:
      starts, ends: [I] interval bounds (column-major pixel index, ``end`` exclusive),
        sorted within each mask; an interval may be empty (a zero run in the RLE).
      first: [N + 1] mask ``m`` owns intervals ``first[m]:first[m + 1]``.
      before: [I] foreground pixels of the mask before each interval.
      area: [N] foreground pixels of each mask.
    """

    starts: np.ndarray
    ends: np.ndarray
    first: np.ndarray
    before: np.ndarray
    area: np.ndarray


def run_table(runs: list) -> RunTable:
    """The :class:`RunTable` of masks given by their COCO run lengths (background first), all at once.

    Each mask's runs are padded to an even count (a last empty background
    run), so that background / foreground runs alternate over the whole
    concatenation and the intervals are two strided views of one cumulative sum.

    Args:
      runs: list of N int arrays [m_i] of non-negative run lengths.
    """
    counts = np.fromiter(map(len, runs), np.int64, len(runs))
    pieces = [piece for one, count in zip(runs, counts) for piece in ((one, _EMPTY_RUN) if count & 1 else (one,))]
    position = np.cumsum(np.concatenate(pieces).astype(np.int64, copy=False)) if pieces else np.zeros(0, np.int64)
    intervals = (counts + 1) // 2
    first = np.concatenate([[0], np.cumsum(intervals)])
    owner = np.repeat(np.arange(len(runs)), intervals)
    mask_base = np.concatenate([[0], position[1::2]])[first[:-1]]  # pixels of the masks before each mask
    starts = position[0::2] - mask_base[owner]
    ends = position[1::2] - mask_base[owner]
    total = np.concatenate([[0], np.cumsum(ends - starts)])
    before = total[:-1] - total[first[:-1]][owner]
    return RunTable(starts, ends, first, before, total[first[1:]] - total[first[:-1]])


_EMPTY_RUN = np.zeros(1, np.int64)


def _with_empty_heads(table: RunTable) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.int64]:
    """Look-up arrays with an empty interval at pixel -1 ahead of each mask's intervals.

    Returns (keys, shift, cap, stride): ``keys`` [I + N] = ``mask * stride +
    start`` (sorted); for the interval found at or before a pixel ``p`` of the
    same mask, the foreground pixels before ``p`` are ``min(p + shift, cap)``
    (``shift = before - start``, ``cap = before + length``). The head
    interval makes that 0 for pixels before the mask's first interval, so a
    look-up never leaves its mask.
    """
    n_masks = table.area.size
    stride = np.int64(table.ends.max() if table.ends.size else 0) + 2
    counts = np.diff(table.first) + 1
    slot = np.arange(table.starts.size) + np.repeat(np.arange(1, n_masks + 1), counts - 1)  # past the heads
    head = piece_starts(counts)
    keys = np.empty(counts.sum(), np.int64)
    keys[head] = np.arange(n_masks) * stride - 1
    keys[slot] = np.repeat(np.arange(n_masks) * stride, counts - 1) + table.starts
    shift, cap = np.ones(keys.size, np.int64), np.zeros(keys.size, np.int64)  # head: min(p + 1, 0) = 0
    shift[slot] = table.before - table.starts
    cap[slot] = table.before + (table.ends - table.starts)
    return keys, shift, cap, stride


def piece_starts(counts: np.ndarray) -> np.ndarray:
    """int64: where each of consecutive pieces of the given sizes starts."""
    counts = np.asarray(counts, np.int64)
    return np.cumsum(counts) - counts


def pair_intersections(table: RunTable, pairs: np.ndarray) -> np.ndarray:
    """int64 [P]: pixels of ``mask[a] AND mask[b]`` for each pair ``(a, b)`` of table indices.

    Args:
      table: the masks' :class:`RunTable`; pairs: int [P, 2].
    """
    pairs = np.asarray(pairs, np.int64).reshape(-1, 2)
    if pairs.shape[0] == 0 or table.starts.size == 0:
        return np.zeros(pairs.shape[0], np.int64)
    n_intervals = np.diff(table.first)
    fewer = n_intervals[pairs[:, 0]] <= n_intervals[pairs[:, 1]]
    query = np.where(fewer, pairs[:, 0], pairs[:, 1])  # walk the intervals of the mask with fewer of them
    target = np.where(fewer, pairs[:, 1], pairs[:, 0])
    order = np.lexsort((query, target))  # look-ups of one target next to each other: cache-friendly searches
    query, target = query[order], target[order]
    keys, shift, cap, stride = _with_empty_heads(table)
    interval_owner = np.repeat(np.arange(n_intervals.size), n_intervals)
    both = (n_intervals[query] > 0) & (n_intervals[target] > 0)
    target_first = table.starts[np.where(both, table.first[target], 0)]
    target_last = table.ends[np.where(both, table.first[target + 1] - 1, 0)]
    low = np.searchsorted(interval_owner * stride + table.ends, query * stride + target_first, side="right")
    high = np.searchsorted(interval_owner * stride + table.starts, query * stride + target_last, side="left")
    taken = np.where(both, np.maximum(high - low, 0), 0)  # query intervals reaching into the target's extent
    pair_of = np.repeat(np.arange(pairs.shape[0]), taken)
    offsets = np.cumsum(taken)
    interval = low[pair_of] + np.arange(pair_of.size) - (offsets - taken)[pair_of]
    bounds = np.empty(2 * interval.size, np.int64)  # s0 e0 s1 e1 ...: sorted within a pair
    bounds[0::2], bounds[1::2] = table.starts[interval], table.ends[interval]
    found = np.searchsorted(keys, np.repeat(target[pair_of] * stride, 2) + bounds, side="right") - 1
    up_to = np.minimum(bounds + shift[found], cap[found])  # foreground pixels of the target before each bound
    running = np.concatenate([[0], np.cumsum(up_to[1::2] - up_to[0::2])])
    out = np.empty(pairs.shape[0], np.int64)
    out[order] = running[offsets] - running[offsets - taken]
    return out


__all__ = ["RunTable", "run_table", "pair_intersections"]
