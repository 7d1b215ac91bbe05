"""Scheduling the mask-pair counts of a whole results file: on tight crops, from the runs, or on whole canvases.

Follows docs/protocols/boundary_ap_pq.md ("How it runs"). Each image brings
the masks that take part in at least one (detection, ground truth) pair of a
category and the pairs themselves (:class:`ImageWork`).

Boundary AP counts come from `jaxseg_robust.evaluation.crop_counts`: the
bands of tight crops of the masks, many images' per device call, and the
intersections on the host. Mask AP needs no boundary band, and its counts
follow from the run lengths alone (`jaxseg_robust.metrics.run_pairs`). That
host path costs less than the host-side decoding into packed bits that the
device path needs before any device work (docs/benchmarking.md,
"Measurements behind design choices", "Mask AP from run lengths"), so
``mask_path="auto"`` takes it whatever the JAX backend. ``mask_path="device"``
pads images into a few canvases (:func:`canvas_classes`), grouped by
boundary width, packs them into chunks of ``chunk_masks`` masks (and at most
``4 * chunk_masks`` pairs), so one compiled program per canvas serves the
whole file, and decodes the next chunk's run lengths into packed bits while
the device works on the previous one. Every path gives the same integers.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import numpy as np

from jaxseg_robust.data.coco_rle import decode_into
from jaxseg_robust.evaluation.crop_counts import count_pairs_on_crops
from jaxseg_robust.metrics.mask_pairs import PairCounts, chunk_pair_counts, packed_words
from jaxseg_robust.metrics.masks import DEFAULT_DILATION_RATIO, boundary_width
from jaxseg_robust.metrics.run_pairs import pair_intersections, run_table
from jaxseg_robust.runner.progress import make_progress

PAIRS_PER_MASK = 4
CANVAS_LADDER = (256, 384, 512, 640, 768, 1024, 1280, 1536, 2048, 2560, 3072, 4096)
COMPILE_SECONDS = 2.5  # one chunk program, XLA on the 2-core CPU
WORD_SECONDS = 4e-8  # device time per packed word of a mask (erosion, counts, pairs), same CPU
MASK_PATHS = ("auto", "runs", "device")
RUNS_PER_BATCH = 1 << 18  # run lengths per host batch of the runs path (temporaries of a few MB, reused)


class ImageWork(NamedTuple):
    """The mask work of one image: ``masks`` = run-length arrays, ``pairs`` int [p, 2] indices into them.

    ``solid``: int [k] indices of masks whose "band" is the whole mask (Boundary PQ's VOID region,
    docs/protocols/boundary_ap_pq.md "Panoptic"); empty by default.
    """

    height: int
    width: int
    masks: list
    pairs: np.ndarray
    solid: np.ndarray = np.zeros(0, np.int64)


@dataclasses.dataclass(frozen=True)
class CountSettings:
    """How the counts are computed.

    Attributes:
      dilation_ratio: boundary width relative to the image diagonal.
      with_boundary: compute the boundary bands (Boundary AP); False for mask AP.
      chunk_masks: masks per device call of the whole-canvas path (pairs per call: 4x this); the
        crops of Boundary AP go in chunks of ``chunk_masks * crop_counts.CHUNK_WORDS_PER_MASK`` words.
      progress: ``auto`` / ``tqdm`` / ``plain`` / ``none`` (`jaxseg_robust.runner.progress`).
      mask_path: how counts without boundaries (mask AP) are computed: ``runs``
        (intersections of the run lengths, host NumPy), ``device`` (packed bits
        on the JAX device), ``auto`` (``runs``; see the module docstring).
        Boundary counts always take the crops (bands on the device).
    """

    dilation_ratio: float = DEFAULT_DILATION_RATIO
    with_boundary: bool = True
    chunk_masks: int = 64
    progress: str = "auto"
    mask_path: str = "auto"

    def __post_init__(self):
        if self.mask_path not in MASK_PATHS:
            raise ValueError(f"mask_path must be one of {MASK_PATHS}, got {self.mask_path!r}")


def _ladder(size: int) -> int:
    for step in CANVAS_LADDER:
        if size <= step:
            return step
    return -(-size // CANVAS_LADDER[-1]) * CANVAS_LADDER[-1]


def _round_up(value: int, step: int) -> int:
    return -(-value // step) * step


def canvas_classes(sizes: list[tuple[int, int]], masks_per_image: list[int] | None = None) -> list[tuple[int, int]]:
    """The canvas ``(height, width)`` each image is padded into.

    Either one canvas (the largest height and width, rounded up to 32: one
    compiled program) or each side rounded up on ``CANVAS_LADDER`` (a few
    programs, less padding), whichever the cost model finds cheaper:
    ``COMPILE_SECONDS`` per program against ``WORD_SECONDS`` per packed word
    of every mask (both measured on the 2-core CPU; on a GPU the single
    canvas wins even more often).
    """
    if not sizes:
        return []
    masks_per_image = masks_per_image or [1] * len(sizes)
    heights, widths = zip(*sizes)
    single = (_round_up(max(heights), 32), _round_up(max(widths), 32))
    ladder = [(_ladder(h), _ladder(w)) for h, w in sizes]

    def cost(canvases):
        words = sum(n * packed_words(h) * w for n, (h, w) in zip(masks_per_image, canvases))
        return COMPILE_SECONDS * len(set(canvases)) + WORD_SECONDS * words

    return [single] * len(sizes) if cost([single] * len(sizes)) <= cost(ladder) else ladder


class _Chunk(NamedTuple):
    canvas: tuple[int, int]
    radius: int
    images: list  # (index into works, first mask slot, first pair row)
    n_masks: int
    n_pairs: int


def _pow2(value: int) -> int:
    return 1 << max(int(value) - 1, 0).bit_length()


def plan_chunks(works: list[ImageWork], settings: CountSettings) -> list[_Chunk]:
    """Chunks of images sharing canvas and boundary width, each within the mask and pair budgets."""
    canvases = canvas_classes([(w.height, w.width) for w in works], [len(w.masks) for w in works])
    groups: dict = {}
    for index, work in enumerate(works):
        if work.pairs.size:
            radius = boundary_width(work.height, work.width, settings.dilation_ratio)
            groups.setdefault((canvases[index], radius), []).append(index)
    chunks = []
    budget_masks, budget_pairs = settings.chunk_masks, PAIRS_PER_MASK * settings.chunk_masks
    for (canvas, radius), members in groups.items():
        current, masks, pairs = [], 0, 0
        for index in members:
            work = works[index]
            n_masks, n_pairs = len(work.masks), len(work.pairs)
            if current and (masks + n_masks > budget_masks or pairs + n_pairs > budget_pairs):
                chunks.append(_Chunk(canvas, radius, current, masks, pairs))
                current, masks, pairs = [], 0, 0
            current.append((index, masks, pairs))
            masks, pairs = masks + n_masks, pairs + n_pairs
        if current:
            chunks.append(_Chunk(canvas, radius, current, masks, pairs))
    return chunks


def _dispatch(chunk: _Chunk, works: list[ImageWork], settings: CountSettings):
    """Decodes a chunk on the host and starts its device program (returns device arrays)."""
    n_slots = max(settings.chunk_masks, _pow2(chunk.n_masks))
    n_pair_rows = max(PAIRS_PER_MASK * settings.chunk_masks, _pow2(chunk.n_pairs))
    height, width = chunk.canvas
    buffer = np.zeros((n_slots, width, packed_words(height)), np.uint32)
    masks = [(runs, works[i].height, works[i].width) for i, _, _ in chunk.images for runs in works[i].masks]
    decode_into(masks, buffer)
    pairs = np.zeros((n_pair_rows, 2), np.int32)
    for index, first_mask, first_pair in chunk.images:
        local = works[index].pairs
        pairs[first_pair:first_pair + len(local)] = local + first_mask
    rows = np.ascontiguousarray(buffer.transpose(0, 2, 1))  # [N, h, W]: the device layout
    max_radius = boundary_width(height, width, settings.dilation_ratio)
    return chunk_pair_counts(rows, np.int32(chunk.radius), pairs, max_radius=max_radius,
                             with_boundary=settings.with_boundary)


def _collect(chunk: _Chunk, result, works: list[ImageWork], out: list) -> None:
    area, boundary_area, intersection, boundary_intersection = (np.asarray(a) for a in result)
    for index, first_mask, first_pair in chunk.images:
        work = works[index]
        masks, pairs = slice(first_mask, first_mask + len(work.masks)), slice(first_pair, first_pair + len(work.pairs))
        out[index] = PairCounts(area[masks], boundary_area[masks], intersection[pairs], boundary_intersection[pairs])


def uses_runs(settings: CountSettings) -> bool:
    """Whether :func:`count_pairs` takes the host run-length path (mask AP, ``mask_path`` ``runs`` or ``auto``)."""
    return not settings.with_boundary and settings.mask_path != "device"


def _run_batches(works: list[ImageWork]) -> list[list[int]]:
    """Indices of the images with pairs, in batches of at most ``RUNS_PER_BATCH`` run lengths (one image at least)."""
    batches, current, runs = [], [], 0
    for index, work in enumerate(works):
        if not work.pairs.size:
            continue
        size = sum(len(r) for r in work.masks)
        if current and runs + size > RUNS_PER_BATCH:
            batches.append(current)
            current, runs = [], 0
        current.append(index)
        runs += size
    return batches + [current] if current else batches


def count_pairs_on_runs(works: list[ImageWork], progress=None) -> list[PairCounts | None]:
    """:func:`count_pairs` without boundaries, from the run lengths on the host (boundary counts are 0).

    Args:
      works: the images' masks and pairs; progress: optional display updated per batch (masks).
    """
    out: list = [None] * len(works)
    for batch in _run_batches(works):
        masks = [runs for index in batch for runs in works[index].masks]
        first_mask = np.cumsum([0] + [len(works[index].masks) for index in batch])
        pairs = np.concatenate([works[index].pairs + first for index, first in zip(batch, first_mask)])
        table = run_table(masks)
        intersection = pair_intersections(table, pairs)
        first_pair = np.cumsum([0] + [len(works[index].pairs) for index in batch])
        for position, index in enumerate(batch):
            area = table.area[first_mask[position]:first_mask[position + 1]]
            local = intersection[first_pair[position]:first_pair[position + 1]]
            out[index] = PairCounts(area, np.zeros_like(area), local, np.zeros_like(local))
        if progress is not None:
            progress.update(len(masks), 0)
    return out


def count_pairs(works: list[ImageWork], settings: CountSettings) -> list[PairCounts | None]:
    """Areas, boundary areas and pair intersections of every image's masks (None for images without pairs).

    Boundary AP counts come from `jaxseg_robust.evaluation.crop_counts` (bands
    of tight crops on the device, intersections on the host); mask AP counts
    from :func:`count_pairs_on_runs` when :func:`uses_runs` says so, else from
    the device (whole canvases, :func:`plan_chunks`). Shows a progress display over the masks
    (``settings.progress``) on stderr.
    """
    if uses_runs(settings) or settings.with_boundary:
        total = sum(len(work.masks) for work in works if work.pairs.size)
        what = "mask and boundary counts (crops)" if settings.with_boundary else "mask counts (runs)"
        progress = make_progress(total, settings.progress, desc=what)
        try:
            if settings.with_boundary:
                return count_pairs_on_crops(works, settings.dilation_ratio, settings.chunk_masks, progress)
            return count_pairs_on_runs(works, progress)
        finally:
            progress.close()
    out: list = [None] * len(works)
    chunks = plan_chunks(works, settings)
    total = sum(chunk.n_masks for chunk in chunks)
    what = "mask and boundary counts" if settings.with_boundary else "mask counts"
    progress = make_progress(total, settings.progress, desc=what)
    in_flight = None
    try:
        for chunk in chunks:
            started = (chunk, _dispatch(chunk, works, settings))
            if in_flight is not None:
                _collect(*in_flight, works, out)
                progress.update(in_flight[0].n_masks, 0)
            in_flight = started
        if in_flight is not None:
            _collect(*in_flight, works, out)
            progress.update(in_flight[0].n_masks, 0)
    finally:
        progress.close()
    return out


def device_summary() -> str:
    """One line naming the JAX backend the counts run on."""
    devices = jax.devices()
    return f"{devices[0].platform} x{len(devices)}"


__all__ = ["ImageWork", "CountSettings", "canvas_classes", "plan_chunks", "uses_runs", "count_pairs_on_runs",
           "count_pairs", "device_summary", "PAIRS_PER_MASK", "CANVAS_LADDER", "COMPILE_SECONDS", "WORD_SECONDS",
           "MASK_PATHS", "RUNS_PER_BATCH"]
