"""Panoptic evaluation: PQ / SQ / RQ and Boundary PQ of a COCO panoptic prediction.

Follows docs/protocols/boundary_ap_pq.md. ``evaluate_panoptic`` is a drop-in
for panopticapi's ``pq_compute`` and the Boundary IoU authors' variant of it
(``iou_type="boundary"``): the same matching, crowd and VOID rules and the
same All / Things / Stuff averages. The PNG pixels go to the JAX device one
image per call for the pixel histogram (every image padded into one canvas,
or a few, so one compiled program serves the file); the host reads the next
PNG while the device works, then does the per-segment bookkeeping. Boundary
PQ's bands are counted on tight crops of the candidate pairs' segments,
many images per device call (`jaxseg_robust.evaluation.panoptic_bands`),
about ``crop_counts.RUNS_PER_BATCH`` run lengths at a time.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from jaxseg_robust.data.coco_instances import default_warn
from jaxseg_robust.data.coco_panoptic import PanopticFormatError, PanopticPair, load_pairs, read_png_rgb
from jaxseg_robust.evaluation.crop_counts import RUNS_PER_BATCH, count_pairs_on_crops
from jaxseg_robust.evaluation.mask_counts import ImageWork, canvas_classes
from jaxseg_robust.evaluation.panoptic_bands import band_work, boundary_ious
from jaxseg_robust.metrics import panoptic as pq
from jaxseg_robust.metrics.masks import DEFAULT_DILATION_RATIO
from jaxseg_robust.runner.progress import make_progress

IOU_TYPES = ("segm", "boundary")
GROUPS = (("All", None), ("Things", True), ("Stuff", False))
MIN_SEGMENT_TABLE = 64


@dataclasses.dataclass(frozen=True)
class PanopticEvalConfig:
    """Settings of :func:`evaluate_panoptic` (``iou_type`` segm = PQ, boundary = Boundary PQ)."""

    iou_type: str = "segm"
    dilation_ratio: float = DEFAULT_DILATION_RATIO
    progress: str = "auto"

    def __post_init__(self):
        if self.iou_type not in IOU_TYPES:
            raise ValueError(f"iou_type must be one of {IOU_TYPES}, got {self.iou_type!r}")
        if not self.dilation_ratio > 0:
            raise ValueError(f"dilation_ratio must be > 0, got {self.dilation_ratio!r}")


@dataclasses.dataclass
class PanopticEvaluation:
    """What :func:`evaluate_panoptic` returns.

    Attributes:
      groups: ``{"All" | "Things" | "Stuff": {"pq", "sq", "rq", "n"}}`` (fractions; NaN when ``n`` is 0).
      per_category: one dict per ground-truth category (``category_id``, ``name``, ``isthing``, pq, sq, rq).
      summary: flat ``PQ_all``, ``SQ_all``, ``RQ_all``, ``PQ_things``, ... by name.
      images: images evaluated; config: the settings.
    """

    groups: dict
    per_category: list
    summary: dict
    images: int
    config: PanopticEvalConfig


def _table_size(pairs: list[PanopticPair]) -> int:
    largest = max([max(p.gt.ids.size, p.pred.ids.size) for p in pairs] + [1])
    return max(MIN_SEGMENT_TABLE, 1 << (largest - 1).bit_length())


def _padded(rgb: np.ndarray, canvas: tuple[int, int]) -> np.ndarray:
    out = np.zeros(canvas + (3,), np.uint8)
    out[: rgb.shape[0], : rgb.shape[1]] = rgb
    return out


def _id_table(ids: np.ndarray, size: int) -> np.ndarray:
    table = np.full(size, pq.SENTINEL_ID, np.int32)
    table[: ids.size] = ids
    return table


def _read(pair: PanopticPair) -> tuple[np.ndarray, np.ndarray]:
    gt = read_png_rgb(pair.gt_png, f"image {pair.image_id!r}: ground-truth PNG")
    pred = read_png_rgb(pair.pred_png, f"image {pair.image_id!r}: prediction PNG")
    if gt.shape != pred.shape:
        raise PanopticFormatError(f"image {pair.image_id!r}: ground-truth PNG {gt.shape[:2]} and prediction PNG "
                                  f"{pred.shape[:2]} differ in size")
    return gt, pred


def _dispatch(pair: PanopticPair, canvas, size: int):
    gt_rgb, pred_rgb = _read(pair)
    height, width = gt_rgb.shape[:2]
    masks = pq.panoptic_confusion(
        _padded(gt_rgb, canvas), _padded(pred_rgb, canvas), _id_table(pair.gt.ids, size), np.int32(pair.gt.ids.size),
        _id_table(pair.pred.ids, size), np.int32(pair.pred.ids.size), np.int32(height), np.int32(width))
    return masks, gt_rgb, pred_rgb


def _host_labels(rgb: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """int64 [H, W] compact labels of a PNG: listed ``0..n-1``, VOID (id 0) = n, unlisted ids = n + 1."""
    raw = rgb.astype(np.int64)
    raw = raw[..., 0] + 256 * raw[..., 1] + 65536 * raw[..., 2]
    position = np.minimum(np.searchsorted(ids, raw), max(ids.size - 1, 0))
    listed = (ids[position] == raw) if ids.size else np.zeros(raw.shape, bool)
    return np.where(listed, position, np.where(raw == 0, ids.size, ids.size + 1))


def _check_prediction(pair: PanopticPair, masks: np.ndarray, pred_rgb: np.ndarray) -> None:
    """The reference's checks: every PNG segment is listed, every listed segment is in the PNG."""
    size = masks.shape[0] - 2
    if masks[:, size + 1].any():
        raw = pred_rgb.astype(np.int64)
        ids = np.unique(raw[..., 0] + 256 * raw[..., 1] + 65536 * raw[..., 2])
        unlisted = sorted(set(ids.tolist()) - set(pair.pred.ids.tolist()) - {0})
        raise PanopticFormatError(f"image {pair.image_id!r}: prediction segment id(s) {unlisted[:5]} are in the PNG "
                                  "and not in the JSON")
    area = masks[:, : pair.pred.ids.size].sum(axis=0)
    if (area == 0).any():
        missing = pair.pred.ids[area == 0].tolist()
        raise PanopticFormatError(f"image {pair.image_id!r}: prediction segment id(s) {missing[:5]} are in the JSON "
                                  "and not in the PNG")


def _accumulate(pairs: list[PanopticPair], config: PanopticEvalConfig) -> pq.CategoryStats:
    """Runs every image (one device call each, the next one started before the last is read back)."""
    stats = pq.new_stats()
    if not pairs:
        return stats
    sizes = [_read_size(p) for p in pairs]
    canvases = canvas_classes(sizes)
    size = _table_size(pairs)
    progress = make_progress(len(pairs), config.progress, desc="panoptic images")
    pending, deferred = None, []
    try:
        for pair, canvas in zip(pairs, canvases):
            started = (pair, *_dispatch(pair, canvas, size))
            if pending is not None:
                _finish(pending, config, stats, deferred)
                progress.update(1, 0)
            pending = started
        _finish(pending, config, stats, deferred)
        _flush(deferred, config, stats)
        progress.update(1, 0)
    finally:
        progress.close()
    return stats


def _read_size(pair: PanopticPair) -> tuple[int, int]:
    from PIL import Image  # noqa: PLC0415 - header only

    try:
        with Image.open(pair.gt_png) as image:
            width, height = image.size
    except (OSError, ValueError) as error:
        raise PanopticFormatError(f"image {pair.image_id!r}: ground-truth PNG {pair.gt_png} is not readable: "
                                  f"{error}") from None
    return height, width


class _BandImage(NamedTuple):
    """A Boundary PQ image waiting for its band counts: the histogram, candidate pairs, crop work, run count."""

    pair: PanopticPair
    masks: np.ndarray
    candidates: tuple
    work: ImageWork
    runs: int


def _finish(pending, config: PanopticEvalConfig, stats: pq.CategoryStats, deferred: list) -> None:
    """PQ: the image's stats. Boundary PQ: its band work joins ``deferred`` (counted once it holds
    ``RUNS_PER_BATCH`` run lengths)."""
    pair, masks, gt_rgb, pred_rgb = pending
    masks = np.asarray(masks).astype(np.int64)
    _check_prediction(pair, masks, pred_rgb)
    if config.iou_type != "boundary":
        pq.image_stats(masks, pair.gt, pair.pred, stats)
        return
    candidates = pq.candidate_pairs(masks, pair.gt, pair.pred)
    work = band_work(_host_labels(gt_rgb, pair.gt.ids), _host_labels(pred_rgb, pair.pred.ids), pair.gt.ids.size,
                     pair.pred.ids.size, candidates)
    deferred.append(_BandImage(pair, masks, candidates, work, sum(len(runs) for runs in work.masks)))
    if sum(image.runs for image in deferred) >= RUNS_PER_BATCH:
        _flush(deferred, config, stats)


def _flush(deferred: list, config: PanopticEvalConfig, stats: pq.CategoryStats) -> None:
    """Counts the bands of the deferred images (batched crops) and adds their stats in image order."""
    if not deferred:
        return
    counts = count_pairs_on_crops([image.work for image in deferred], config.dilation_ratio)
    for image, image_counts in zip(deferred, counts):
        gt_count = image.pair.gt.ids.size
        ious = np.zeros(0) if image_counts is None else boundary_ious(image_counts, gt_count, image.candidates)
        pq.image_stats(image.masks, image.pair.gt, image.pair.pred, stats, ious)
    deferred.clear()


def evaluate_panoptic(gt_json, gt_folder, pred_json, pred_folder,
                      config: PanopticEvalConfig = PanopticEvalConfig(), *,
                      warn: Callable[[str], None] = default_warn) -> PanopticEvaluation:
    """PQ / SQ / RQ (``iou_type="segm"``) or Boundary PQ (``"boundary"``) for All, Things and Stuff.

    Args:
      gt_json, pred_json: COCO panoptic JSON paths (or loaded dicts).
      gt_folder, pred_folder: folders of the id-coded PNGs.
      config: IoU type, dilation ratio, progress display.
      warn: receives a message for what the reference skips silently.

    Raises:
      PanopticFormatError: naming the image and segment at fault.
    """
    categories, pairs = load_pairs(gt_json, gt_folder, pred_json, pred_folder, warn=warn)
    stats = _accumulate(pairs, config)
    groups, per_category = {}, []
    for name, isthing in GROUPS:
        groups[name], per_class = pq.pq_average(stats, categories, isthing)
        if name == "All":
            per_category = [{"category_id": cid, "name": str(categories[cid].get("name", cid)),
                             "isthing": int(categories[cid].get("isthing", 0)), **values}
                            for cid, values in per_class.items()]
    summary = {f"{metric.upper()}_{name.lower()}": groups[name][metric] for name, _ in GROUPS
               for metric in ("pq", "sq", "rq")}
    return PanopticEvaluation(groups, per_category, summary, len(pairs), config)


__all__ = ["IOU_TYPES", "PanopticEvalConfig", "PanopticEvaluation", "evaluate_panoptic"]
