"""Per-iterate mask scores of the prompt attacks and the reference's acceptance comparison.

Every iterate of a TETRIS or BREPS attack (and every prompt of a grid) is scored
twice against the ground truth: the *selection* metrics the reference's
acceptance rule compares (ignore pixels counted as background, every image
pixel counts, 0 on an empty union) and the *reported* metrics (ignore pixels
excluded, NaN on an empty union; they equal `jaxseg_robust.metrics.masks`
``mask_iou`` / ``boundary_iou``). Masks are bit-packed rows
(`jaxseg_robust.ops.morphology`), the GT pieces are packed once per instance
(`gt_words`) and reused by every iterate (`attack_scores`). Boundary bands are
``width`` iterated 3x3 erosions with the per-image width of `boundary_widths`.
"""

from __future__ import annotations

import math

import flax.struct
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxseg_robust.metrics.masks import DEFAULT_DILATION_RATIO, boundary_width
from jaxseg_robust.models.base import Transform
from jaxseg_robust.ops.morphology import count_packed, erode_packed, pack_rows

IGNORE_LABEL = -1
# The reference's initial best (selection IoU, BIoU) of a MAX / MIN attack: any first iterate beats it.
START_MAX = -2.0
START_MIN = 2.0


def boundary_widths(sizes, dilation_ratio: float = DEFAULT_DILATION_RATIO) -> np.ndarray:
    """Per-instance Boundary IoU band widths ``max(1, round(ratio sqrt(H^2 + W^2)))`` (host).

    Args:
      sizes: int [B, 2] (H, W) image sizes.
      dilation_ratio: band ratio (0.02).

    Returns:
      int32[B] widths (Python's round-half-to-even, as the reference).
    """
    sizes = np.asarray(sizes).reshape(-1, 2)
    return np.array([boundary_width(int(h), int(w), dilation_ratio) for h, w in sizes], np.int32)


def image_region(transform: Transform) -> jnp.ndarray:
    """bool[Hf, Wf]: the pixels of the original image inside the transform's static frame."""
    if transform.frame_hw is None:
        raise ValueError("transform.frame_hw must be set")
    frame_h, frame_w = transform.frame_hw
    rows = jnp.arange(frame_h) < transform.original_hw[0]
    cols = jnp.arange(frame_w) < transform.original_hw[1]
    return rows[:, None] & cols[None, :]


def _erode_times(words, times, height: int):
    """``times`` (traced int) iterated 3x3 square erosions (outside = 0) of packed masks."""
    return lax.fori_loop(0, times, lambda _, w: erode_packed(w, 1, height), words)


def _boundary_band(words, width, height: int):
    """Packed inner boundary band of width ``width`` (traced) of packed masks."""
    return words & ~_erode_times(words, width, height)


def _ratio(numerator, denominator, empty_value: float):
    numerator = numerator.astype(jnp.float32)
    denominator = denominator.astype(jnp.float32)
    safe = jnp.where(denominator > 0, denominator, 1.0)
    return jnp.where(denominator > 0, numerator / safe, jnp.float32(empty_value))


@flax.struct.dataclass
class AttackScores:
    """Mask scores of one prediction (each f32[]).

    Attributes:
      selection_iou, selection_biou: ignore pixels counted as background, every
        image pixel counts, 0 on an empty union (the reference's acceptance metrics).
      iou, biou: ignore pixels excluded, NaN on an empty union (the reported metrics).
    """

    selection_iou: jnp.ndarray
    selection_biou: jnp.ndarray
    iou: jnp.ndarray
    biou: jnp.ndarray


@flax.struct.dataclass
class GtWords:
    """Packed GT pieces reused by every iterate."""

    target: jnp.ndarray  # G+ within the image
    target_band: jnp.ndarray
    region: jnp.ndarray  # image pixels
    labelled: jnp.ndarray  # image pixels with gt != -1


def gt_words(gt, region, width) -> GtWords:
    """Packs the GT pieces every iterate's `attack_scores` reuses.

    Args:
      gt: int [H, W] 1 object / 0 background / -1 ignore.
      region: bool[H, W] pixels of the image.
      width: i32[] boundary band width (may be traced).
    """
    height = gt.shape[-2]
    target = pack_rows((gt == 1) & region)
    return GtWords(target=target, target_band=_boundary_band(target, width, height),
                    region=pack_rows(region), labelled=pack_rows(region & (gt != IGNORE_LABEL)))


def attack_scores(pred, packed_gt: GtWords, width) -> AttackScores:
    """`AttackScores` of a bool[H, W] prediction against packed GT pieces (`gt_words`; same ``width``)."""
    height = pred.shape[-2]
    pred_words = pack_rows(pred) & packed_gt.region
    pred_band = _boundary_band(pred_words, width, height)

    def counts(a, b, within):
        return count_packed(a & b & within), count_packed((a | b) & within)

    sel_iou = _ratio(*counts(pred_words, packed_gt.target, packed_gt.region), 0.0)
    sel_biou = _ratio(*counts(pred_band, packed_gt.target_band, packed_gt.region), 0.0)
    iou = _ratio(*counts(pred_words, packed_gt.target, packed_gt.labelled), math.nan)
    biou = _ratio(*counts(pred_band, packed_gt.target_band, packed_gt.labelled), math.nan)
    return AttackScores(sel_iou, sel_biou, iou, biou)


def box_attack_scores(pred, gt, region, width) -> AttackScores:
    """Selection and reported IoU / Boundary IoU of one binary prediction.

    Args:
      pred: bool[H, W] predicted mask (pixels outside ``region`` are ignored).
      gt: int [H, W] 1 object / 0 background / -1 ignore.
      region: bool[H, W] pixels of the image (a padded frame's padding false).
      width: i32[] boundary band width d (may be traced; e.g. `boundary_widths`).

    Returns:
      `AttackScores`; ``iou``/``biou`` equal `metrics.masks.mask_iou` /
      ``boundary_iou`` of the cropped image with ``valid = gt != -1``.
    """
    gt = jnp.asarray(gt)
    pred = jnp.asarray(pred, bool)
    region = jnp.asarray(region, bool)
    if pred.shape != gt.shape or region.shape != gt.shape or gt.ndim != 2:
        raise ValueError(f"pred {pred.shape}, gt {gt.shape} and region {region.shape} must be equal [H, W]")
    width = jnp.asarray(width, jnp.int32)
    return attack_scores(pred, gt_words(gt, region, width), width)


def is_better(new: AttackScores, best_iou, best_biou, maximise):
    """Lexicographic (IoU, BIoU) comparison as Python's list ``>`` (maximise) / ``<``; maximise may be traced."""
    greater = (new.selection_iou > best_iou) | ((new.selection_iou == best_iou) & (new.selection_biou > best_biou))
    less = (new.selection_iou < best_iou) | ((new.selection_iou == best_iou) & (new.selection_biou < best_biou))
    return jnp.where(maximise, greater, less)


__all__ = ["IGNORE_LABEL", "START_MAX", "START_MIN", "boundary_widths", "image_region", "AttackScores", "GtWords",
           "gt_words", "attack_scores", "box_attack_scores", "is_better"]
