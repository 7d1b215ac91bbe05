"""The acceptance rule of the prompt attacks: which iterate is the best so far.

Every iterate of a TETRIS or BREPS attack is scored with
`jaxseg_robust.metrics.packed.packed_scores` (selection and reported IoU /
Boundary IoU against the packed ground truth); the reference accepts an
iterate when its *selection* ``(IoU, BIoU)`` is lexicographically better than
the best so far (``>`` for MAX, ``<`` for MIN; docs/protocols/tetris.md §3.2,
docs/protocols/breps.md §4.5), starting from an unbeatable pair.
"""

from __future__ import annotations

import jax.numpy as jnp

from jaxseg_robust.metrics.packed import PackedScores, pack_target, packed_scores

# The reference's initial best (selection IoU, BIoU) of a MAX / MIN attack: any first iterate beats it.
START_MAX = -2.0
START_MIN = 2.0


def is_better(new: PackedScores, best_iou, best_biou, maximise):
    """Lexicographic (IoU, BIoU) comparison as Python's list ``>`` (maximise) / ``<``; maximise may be traced."""
    greater = (new.selection_iou > best_iou) | ((new.selection_iou == best_iou) & (new.selection_biou > best_biou))
    less = (new.selection_iou < best_iou) | ((new.selection_iou == best_iou) & (new.selection_biou < best_biou))
    return jnp.where(maximise, greater, less)


def box_attack_scores(pred, gt, region, width) -> PackedScores:
    """Selection and reported IoU / Boundary IoU of one binary prediction (one-off form of `packed_scores`).

    Args:
      pred: bool[H, W] predicted mask (pixels outside ``region`` are ignored).
      gt: int [H, W] 1 object / 0 background / -1 ignore.
      region: bool[H, W] pixels of the image (a padded frame's padding false).
      width: i32[] boundary band width d (may be traced).
    """
    gt = jnp.asarray(gt)
    pred = jnp.asarray(pred, bool)
    if pred.shape != gt.shape or jnp.shape(region) != gt.shape or gt.ndim != 2:
        raise ValueError(f"pred {pred.shape}, gt {gt.shape} and region {jnp.shape(region)} must be equal [H, W]")
    width = jnp.asarray(width, jnp.int32)
    return packed_scores(pred, pack_target(gt, region, width), width)


__all__ = ["START_MAX", "START_MIN", "is_better", "box_attack_scores"]
