"""Boundary AP counts on tight crops: bands on the device, every count of a pair on the host.

Follows docs/protocols/boundary_ap_pq.md ("How it runs", "Crops"). A mask's
boundary band lies inside the mask, so it only needs the mask's bounding box:
each mask is cut to the crop of its box (whole 32-row words by whole columns),
crops are grouped by size class (a ladder for each side; which classes merge
into larger ones is decided once over the crops of every batch, a first pass
over the batches reading only the crops) and boundary width, and the device erodes chunks of crops of many images at once
(`jaxseg_robust.metrics.mask_pairs.crop_bands`). Outside the crop every pixel is
background, as is the outside of the image, so every band equals the band of
the whole mask. The host then reads, per (detection, ground truth) pair, the
band intersection from the words where the two boxes overlap (pairs whose boxes
do not meet cost nothing), and the mask intersection from the run lengths
(`jaxseg_robust.metrics.run_pairs`). Images are taken in order of boundary
width and in batches of about ``RUNS_PER_BATCH`` run lengths, so the host
holds the run tables and bands of one batch at a time.
"""

from __future__ import annotations

import itertools
from typing import NamedTuple

import numpy as np

from jaxseg_robust.metrics.mask_pairs import PairCounts, crop_bands
from jaxseg_robust.metrics.masks import boundary_width
from jaxseg_robust.metrics.run_pairs import RunTable, pair_intersections, piece_starts, run_table

WORD_BITS = 32
CLASS_WORDS = (2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128)  # crop classes: 32-row words (64 rows at least)
CLASS_COLUMNS = (64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096)  # and columns
COMPILE_SECONDS = 1.5  # one band program, XLA on the 2-core CPU
WORD_SECONDS = 2e-8  # host decoding and device erosion per packed crop word, same CPU
CHUNK_WORDS_PER_MASK = 4096  # crop words per device call for each mask of ``chunk_masks`` (64 masks: 1 MiB,
# where the erosion's passes stay in the CPU caches; 4x as much ran 10x slower per word)
GATHER_WORDS = 1 << 22  # overlap words of pairs read per host pass
_ALL = np.uint64(0xFFFFFFFF)


class Crops(NamedTuple):
    """Tight crops of ``N`` masks (int64 [N] each): rows in whole 32-row words, columns exact.

    Attributes:
      word0, column0: first word row and first column of the crop in the image.
      words, columns: size of the crop (0 for an empty mask).
      rows: pixel rows of the mask's bounding box (0 for an empty mask).
    """

    word0: np.ndarray
    column0: np.ndarray
    words: np.ndarray
    columns: np.ndarray
    rows: np.ndarray


def mask_crops(table: RunTable, heights: np.ndarray) -> Crops:
    """The tight crop of every mask of a run table (``heights``: int64 [N], each mask's image height).

    A foreground interval of the column-major order that spans several columns
    covers every row (it wraps from the bottom of one column to the top of the next).
    """
    owner = np.repeat(np.arange(heights.size), np.diff(table.first))
    kept = table.ends > table.starts
    owner, starts, ends = owner[kept], table.starts[kept], table.ends[kept]
    height = heights[owner]
    first_column, last_column = starts // height, (ends - 1) // height
    single = first_column == last_column
    top = np.where(single, starts % height, 0)
    bottom = np.where(single, (ends - 1) % height, height - 1)
    crops = Crops(*(np.zeros(heights.size, np.int64) for _ in Crops._fields))
    if owner.size:
        group = np.flatnonzero(np.concatenate([[True], owner[1:] != owner[:-1]]))
        masks = owner[group]
        first_row, last_row = np.minimum.reduceat(top, group), np.maximum.reduceat(bottom, group)
        word0 = first_row // WORD_BITS
        crops.word0[masks] = word0
        crops.words[masks] = last_row // WORD_BITS + 1 - word0
        crops.rows[masks] = last_row + 1 - first_row
        crops.column0[masks] = first_column[group]
        crops.columns[masks] = last_column[np.append(group[1:], owner.size) - 1] + 1 - first_column[group]
    return crops


def _on_ladder(values: np.ndarray, ladder: tuple) -> np.ndarray:
    """int64: the smallest ladder value >= each value (beyond the ladder: multiples of its top)."""
    steps = np.asarray(ladder, np.int64)
    top = steps[-1]
    return np.where(values <= top, steps[np.minimum(np.searchsorted(steps, values), steps.size - 1)],
                    -(-values // top) * top)


def crop_classes(words: np.ndarray, columns: np.ndarray) -> np.ndarray:
    """int64 [N, 2]: the (word rows, columns) class of each crop, each side on its ladder."""
    return np.stack([_on_ladder(words, CLASS_WORDS), _on_ladder(columns, CLASS_COLUMNS)], axis=1)


def merged_classes(classes: np.ndarray, compiled: frozenset = frozenset()) -> np.ndarray:
    """Crop classes after merging classes into larger ones where that is cheaper.

    Classes are taken from the fewest crops up; a class not yet ``compiled``
    joins the smallest class holding it (both sides at least as large) when
    the words its crops gain there cost less than a program
    (``WORD_SECONDS`` per word against ``COMPILE_SECONDS``).
    """
    kinds, inverse, counts = np.unique(classes, axis=0, return_inverse=True, return_counts=True)
    target = list(range(len(kinds)))
    size = kinds[:, 0] * kinds[:, 1]
    for kind in np.argsort(counts, kind="stable"):
        if tuple(kinds[kind]) in compiled:
            continue
        holders = [other for other in range(len(kinds)) if other != kind and target[other] == other
                   and (kinds[other] >= kinds[kind]).all()]
        if not holders:
            continue
        best = min(holders, key=lambda other: size[other])
        if counts[kind] * (size[best] - size[kind]) * WORD_SECONDS < COMPILE_SECONDS:
            counts[best] += counts[kind]
            target = [best if value == kind else value for value in target]
    return kinds[np.asarray(target)[inverse.reshape(-1)]]


def decode_crops(table: RunTable, masks: np.ndarray, heights: np.ndarray, crops: Crops, shape: tuple,
                 slots: int) -> np.ndarray:
    """uint32 [slots, *shape]: the given masks of ``table`` in crops of ``shape`` = (word rows, columns),
    packed rows (then empty slots).

    Every foreground interval flips the bits from its start and from its end
    (one past its last pixel, counted in its last pixel's column) to the end of
    their words in a column-major buffer with one spare word per column (where
    an interval ending at the bottom of a column flips); the state entering
    each word is the parity of the flips before it. Rows below the image are
    cleared (an interval wrapping into the next column leaves them set).
    """
    n, (words_per_column, side) = masks.size, shape
    stride = WORD_BITS * (words_per_column + 1)
    out = np.zeros((slots, words_per_column, side), np.uint32)
    counts = np.diff(table.first)[masks]
    interval = np.repeat(table.first[masks], counts) + np.arange(counts.sum()) - np.repeat(piece_starts(counts), counts)
    slot = np.repeat(np.arange(n), counts)
    keep = table.ends[interval] > table.starts[interval]
    interval, slot = interval[keep], slot[keep]
    if not interval.size:
        return out
    height = heights[masks][slot]
    origin = slot * (side * stride) - crops.column0[masks][slot] * stride - WORD_BITS * crops.word0[masks][slot]
    starts, last = table.starts[interval], table.ends[interval] - 1
    position = np.empty(2 * interval.size, np.int64)
    position[0::2] = origin + (starts // height) * stride + starts % height
    position[1::2] = origin + (last // height) * stride + last % height + 1
    total = n * side * (words_per_column + 1)
    word = position >> 5
    flips = (_ALL << (position & 31).astype(np.uint64)) & _ALL
    first = np.flatnonzero(np.concatenate([[True], word[1:] != word[:-1]]))
    parity = (np.cumsum(np.diff(np.append(first, word.size))) & 1).astype(bool)
    levels = np.where(np.concatenate([[False], parity]), np.uint32(0xFFFFFFFF), np.uint32(0))
    words = np.repeat(levels, np.diff(np.concatenate([[0], word[first] + 1, [total]])))
    words[word[first]] ^= np.bitwise_xor.reduceat(flips, first).astype(np.uint32)
    columns = words.reshape(n, side, words_per_column + 1)[:, :, :words_per_column]
    rows_in_image = heights[masks] - WORD_BITS * crops.word0[masks]  # [n]
    bits = np.clip(rows_in_image[:, None] - WORD_BITS * np.arange(words_per_column), 0, WORD_BITS)
    valid = ((np.uint64(1) << bits.astype(np.uint64)) - np.uint64(1)).astype(np.uint32)  # [n, h]
    np.bitwise_and(columns.transpose(0, 2, 1), valid[:, :, None], out=out[:n])
    return out


class BandPool(NamedTuple):
    """The bands of a batch of masks, each cut to its tight crop and laid end to end (host).

    Attributes:
      words: uint32 [T] the crops' band words, row by row (a row = the crop's columns).
      base: int64 [N] where each mask's crop starts in ``words``.
      area: int64 [N] band pixels of each mask.
    """

    words: np.ndarray
    base: np.ndarray
    area: np.ndarray


def _segments(counts: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For pieces of ``counts[i]`` segments of ``lengths[i]`` elements: (piece, index within it, first element)
    of every segment (int64 each), elements numbered consecutively from 0."""
    piece = np.repeat(np.arange(counts.size), counts)
    index = np.arange(piece.size) - np.repeat(piece_starts(counts), counts)
    return piece, index, piece_starts(lengths[piece])


def band_intersections(pool: BandPool, crops: Crops, pairs: np.ndarray) -> np.ndarray:
    """int64 [P]: band pixels common to both masks of each pair, read where their crops overlap.

    Args:
      pool: the bands; crops: the masks' crops; pairs: int [P, 2] mask indices.
    """
    a, b = np.asarray(pairs, np.int64).reshape(-1, 2).T
    low_word = np.maximum(crops.word0[a], crops.word0[b])
    high_word = np.minimum(crops.word0[a] + crops.words[a], crops.word0[b] + crops.words[b])
    low_column = np.maximum(crops.column0[a], crops.column0[b])
    high_column = np.minimum(crops.column0[a] + crops.columns[a], crops.column0[b] + crops.columns[b])
    rows, columns = np.maximum(high_word - low_word, 0), np.maximum(high_column - low_column, 0)
    sizes = rows * columns
    out = np.zeros(a.size, np.int64)
    ends = np.cumsum(sizes)
    cuts = np.searchsorted(ends, np.arange(GATHER_WORDS, int(ends[-1]) if ends.size else 0, GATHER_WORDS))
    for first, last in zip(np.concatenate([[0], cuts]), np.append(cuts, a.size)):
        part = np.arange(first, last)[sizes[first:last] > 0]
        if not part.size:
            continue
        piece, row, start = _segments(rows[part], columns[part])
        pair = part[piece]
        length = columns[pair]

        def words_of(mask):  # the mask's overlap words, segment by segment
            shift = (pool.base[mask] + (low_word[pair] - crops.word0[mask] + row) * crops.columns[mask]
                     + low_column[pair] - crops.column0[mask] - start)
            return pool.words[np.repeat(shift, length) + np.arange(int(length.sum()))]

        common = np.bitwise_count(words_of(a[pair]) & words_of(b[pair]))
        out[part] = np.add.reduceat(common, piece_starts(sizes[part]), dtype=np.int64)
    return out


RUNS_PER_BATCH = 1 << 21  # run lengths of the masks of one batch of images


def _batches(works: list, radii: list) -> list[list[int]]:
    """Indices of the images with pairs, by boundary width, in batches of at most ``RUNS_PER_BATCH`` runs."""
    order = sorted((index for index, work in enumerate(works) if work.pairs.size), key=lambda index: radii[index])
    batches, current, runs = [], [], 0
    for index in order:
        size = sum(len(r) for r in works[index].masks)
        if current and runs + size > RUNS_PER_BATCH:
            batches.append(current)
            current, runs = [], 0
        current.append(index)
        runs += size
    return batches + [current] if current else batches


def _crop_groups(masks: np.ndarray, classes: np.ndarray, radius: np.ndarray) -> list:
    """[((word rows, columns, radius), int64 masks)]: the masks grouped by class and radius (-1: decoded on
    the host), groups in ascending order of their key, masks in their given order within a group.

    Args:
      masks: int64 [M]; classes: int64 [M, 2] (word rows, columns); radius: int64 [M].
    """
    if not masks.size:
        return []
    keys = np.stack([classes[:, 0], classes[:, 1], radius], axis=1).astype(np.int64)
    order = np.lexsort(keys.T[::-1])  # stable: masks keep their order within a key
    keys, masks = keys[order], masks[order]
    first = np.flatnonzero(np.concatenate([[True], (keys[1:] != keys[:-1]).any(axis=1)]))
    ends = np.append(first[1:], masks.size)
    return [(tuple(int(value) for value in keys[start]), masks[start:end]) for start, end in zip(first, ends)]


class _BandJob(NamedTuple):
    masks: np.ndarray  # batch mask indices in the chunk's slots
    result: tuple  # device arrays (bands, band areas)


def _band_jobs(table: RunTable, heights, crops: Crops, classes: np.ndarray, radius_of: np.ndarray, max_radius: int,
               chunk_words: int):
    """Starts the device band programs of a batch, chunk by chunk (yields each job as it is dispatched).

    ``classes``: int64 [N, 2] the (merged) crop class of each mask (any row for an empty mask).
    A mask whose box is narrower or lower than the ``2 d + 1`` square has no
    eroded pixel: its band is the mask, decoded on the host without a device call.
    """
    present = np.flatnonzero(crops.words > 0)
    whole = np.minimum(crops.rows, crops.columns)[present] < 2 * radius_of[present] + 1
    radius_key = np.where(whole, -1, radius_of[present])
    for (words, columns, radius), members in _crop_groups(present, classes[present], radius_key):
        slots = max(1, chunk_words // (words * columns))
        program_radius = min(max_radius, max(WORD_BITS * words, columns))  # wider bands erode a crop away
        for start in range(0, len(members), slots):
            masks = np.asarray(members[start:start + slots], np.int64)
            chunk = decode_crops(table, masks, heights, crops, (words, columns), slots if radius >= 0 else masks.size)
            if radius < 0:
                yield _BandJob(masks, (chunk, table.area[masks]))
            else:
                yield _BandJob(masks, crop_bands(chunk, np.int32(radius), max_radius=program_radius))


def _tight_words(bands: np.ndarray, masks: np.ndarray, crops: Crops) -> np.ndarray:
    """uint32: the tight crop of each slot's band (row by row), slots in order, from a chunk [S, h, side]."""
    _, words_per_column, side = bands.shape
    piece, row, start = _segments(crops.words[masks], crops.columns[masks])
    length = crops.columns[masks][piece]
    shift = piece * (words_per_column * side) + row * side - start
    return bands.reshape(-1)[np.repeat(shift, length) + np.arange(int(length.sum()))]


def _band_pool(table: RunTable, heights, crops: Crops, classes, radius_of, max_radius: int,
               chunk_words: int, progress) -> BandPool:
    """The bands of a batch's masks (device work of the next chunk overlaps the host's copy of the last)."""
    n = heights.size
    tight = crops.words * crops.columns
    base, area = piece_starts(tight), np.zeros(n, np.int64)
    words = np.zeros(max(int(tight.sum()), 1), np.uint32)
    pending = []
    jobs = _band_jobs(table, heights, crops, classes, radius_of, max_radius, chunk_words)
    for job in itertools.chain(jobs, [None]):
        pending.append(job)  # the job just dispatched runs while the one before is copied back
        if len(pending) < 2:
            continue
        job = pending.pop(0)
        bands, band_area = (np.asarray(result) for result in job.result)
        count = job.masks.size
        area[job.masks] = band_area[:count]
        sizes = tight[job.masks]
        destination = np.repeat(base[job.masks] - piece_starts(sizes), sizes) + np.arange(int(sizes.sum()))
        words[destination] = _tight_words(bands, job.masks, crops)
        if progress is not None:
            progress.update(int(count), 0)
    return BandPool(words, base, area)


def _batch_masks(works: list, batch: list) -> list:
    """The run lengths of every mask of a batch's images, image by image."""
    return [runs for index in batch for runs in works[index].masks]


def _batch_heights(works: list, batch: list) -> np.ndarray:
    """int64 [N]: the image height of every mask of a batch."""
    return np.repeat([works[index].height for index in batch], [len(works[index].masks) for index in batch]).astype(
        np.int64)


def _global_classes(crops_of: list) -> list:
    """int64 [N_b, 2] per batch: every mask's crop class, merged over all the batches at once (empty masks: 0).

    Deciding the merges over every batch together weighs a program against the
    words of all the crops it would take; batch by batch, each batch's few
    crops made the larger classes compiled by earlier batches look free, and
    the padded words grew about eightfold on the COCO-scale set
    (docs/protocols/boundary_ap_pq.md, "Crops").
    """
    present = [np.flatnonzero(crops.words > 0) for crops in crops_of]
    every = [crop_classes(crops.words[kept], crops.columns[kept]) for crops, kept in zip(crops_of, present)]
    every = np.concatenate(every) if every else np.zeros((0, 2), np.int64)
    merged = merged_classes(every) if len(every) else every
    out = []
    for crops, kept, first in zip(crops_of, present, piece_starts([len(kept) for kept in present])):
        classes = np.zeros((crops.words.size, 2), np.int64)
        classes[kept] = merged[first:first + kept.size]
        out.append(classes)
    return out


def _mask_radii(works: list, batch: list, radii: list, first_mask: np.ndarray) -> np.ndarray:
    """int64 [N]: the band width of every mask of a batch; -1 for a ``solid`` mask (its band is the mask)."""
    radius_of = np.repeat([radii[index] for index in batch], [len(works[index].masks) for index in batch])
    for index, first in zip(batch, first_mask):
        radius_of[first + np.asarray(works[index].solid, np.int64)] = -1
    return radius_of.astype(np.int64)


def count_pairs_on_crops(works: list, dilation_ratio: float, chunk_masks: int = 64, progress=None) -> list:
    """Areas, boundary areas and pair intersections of every image's masks (None for images without pairs).

    Args:
      works: ``mask_counts.ImageWork`` per image; dilation_ratio: boundary width relative to the
        image diagonal; chunk_masks: device calls hold ``chunk_masks * CHUNK_WORDS_PER_MASK`` crop
        words; progress: optional display updated per chunk (masks).

    Returns:
      one ``PairCounts`` (int64 host arrays) per image with pairs, else None. The band of a mask listed
      in its work's ``solid`` is the whole mask (its boundary area is its area).
    """
    out: list = [None] * len(works)
    radii = [boundary_width(work.height, work.width, dilation_ratio) for work in works]
    max_radius = max(radii, default=1)
    batches = _batches(works, radii)
    crops_of = [mask_crops(run_table(_batch_masks(works, batch)), _batch_heights(works, batch)) for batch in batches]
    for batch, crops, classes in zip(batches, crops_of, _global_classes(crops_of)):
        masks, heights = _batch_masks(works, batch), _batch_heights(works, batch)
        per_image = [len(works[index].masks) for index in batch]
        first_mask = piece_starts(per_image)
        radius_of = _mask_radii(works, batch, radii, first_mask)
        table = run_table(masks)
        pool = _band_pool(table, heights, crops, classes, radius_of, max_radius,
                          chunk_masks * CHUNK_WORDS_PER_MASK, progress)
        pairs = np.concatenate([works[index].pairs + first for index, first in zip(batch, first_mask)])
        intersection = pair_intersections(table, pairs)
        band_intersection = band_intersections(pool, crops, pairs)
        first_pair = np.append(piece_starts([len(works[index].pairs) for index in batch]), len(pairs))
        for position, index in enumerate(batch):
            masks_of = slice(first_mask[position], first_mask[position] + per_image[position])
            pairs_of = slice(first_pair[position], first_pair[position + 1])
            out[index] = PairCounts(table.area[masks_of], pool.area[masks_of], intersection[pairs_of],
                                    band_intersection[pairs_of])
    return out


__all__ = ["Crops", "BandPool", "mask_crops", "crop_classes", "merged_classes", "decode_crops", "band_intersections",
           "count_pairs_on_crops", "CLASS_WORDS", "CLASS_COLUMNS", "CHUNK_WORDS_PER_MASK", "GATHER_WORDS",
           "RUNS_PER_BATCH"]
