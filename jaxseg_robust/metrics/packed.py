"""Packed mask scores of many predictions against one ground truth: the protocols' IoU / Boundary IoU.

Every iterate of a TETRIS or BREPS attack, every prompt of a grid and every
fixed box is scored against the same ground truth, so its pieces are packed
once per instance (`pack_target`, bit-packed rows of
`jaxseg_robust.ops.morphology`) and reused (`packed_scores`). One prediction
gets five numbers (docs/protocols/boundary_iou.md §2, docs/protocols/tetris.md
§3.5):

  * ``selection_iou``, ``selection_biou``: ignore pixels counted as
    background, every image pixel counts, 0 on an empty union (the reference's
    acceptance metrics);
  * ``iou``, ``biou``: ignore pixels excluded, NaN on an empty union (the
    reported metrics; equal to `metrics.masks.mask_iou` / ``boundary_iou`` of
    the image crop with ``valid = gt != -1``);
  * ``iou_reference``: ``|P & G+| / (|P | G+| + 1e-6)`` over the image, ignore
    pixels counted as background (the BREPS box-grid script's IoU).

Boundary bands are ``width`` 3x3 erosions with a zero outside (`boundary_band`);
``width`` may be traced (per-instance data inside a bucket). Pure, jit- and
vmap-safe; callers use the fields they need (XLA drops the others).
"""

from __future__ import annotations

import math

import flax.struct
import jax.numpy as jnp
from jax import lax

from jaxseg_robust.ops.labels import IGNORE_LABEL
from jaxseg_robust.ops.morphology import count_packed, erode_packed, pack_rows

REFERENCE_IOU_EPS = 1e-6  # comp_hw.py and the jitter / user scripts: inter / (union + 1e-6)


def ratio(numerator, denominator, empty_value) -> jnp.ndarray:
    """``numerator / denominator`` as float32, ``empty_value`` where the denominator is 0."""
    numerator = numerator.astype(jnp.float32)
    denominator = denominator.astype(jnp.float32)
    safe = jnp.where(denominator > 0, denominator, 1.0)
    return jnp.where(denominator > 0, numerator / safe, jnp.asarray(empty_value, jnp.float32))


def boundary_band(words, width, height: int) -> jnp.ndarray:
    """Packed inner boundary band ``words & ~erode^width(words)`` (3x3 square, outside = background).

    Args:
      words: uint32[..., ceil(H/32), W] packed masks (`pack_rows`).
      width: band width d: a static Python int (one erosion of radius d) or
        a traced i32[] (d iterated erosions of radius 1; the same pixels).
      height: static H.
    """
    if isinstance(width, int):
        return words & ~erode_packed(words, width, height, shape="square", border_value=False)
    eroded = lax.fori_loop(0, width, lambda _, w: erode_packed(w, 1, height), words)
    return words & ~eroded


@flax.struct.dataclass
class PackedTarget:
    """The packed ground-truth pieces of one instance, reused by every prediction.

    Attributes:
      target: G+ (``gt == 1``) within the image.
      target_band: its Boundary IoU band (width d).
      region: the image's pixels of the frame.
      labelled: image pixels with ``gt != -1``.
    """

    target: jnp.ndarray
    target_band: jnp.ndarray
    region: jnp.ndarray
    labelled: jnp.ndarray


def pack_target(gt, region, width) -> PackedTarget:
    """Packs the ground truth of one instance for `packed_scores`.

    Args:
      gt: int [Hf, Wf] 1 object / 0 background / -1 ignore.
      region: bool[Hf, Wf] the image's pixels in the frame.
      width: i32[] Boundary IoU band width d (may be traced).

    Returns:
      `PackedTarget`.
    """
    gt = jnp.asarray(gt)
    region = jnp.asarray(region, bool)
    if gt.ndim != 2 or region.shape != gt.shape:
        raise ValueError(f"gt and region must be equal [H, W]; got {gt.shape}, {region.shape}")
    height = gt.shape[-2]
    target = pack_rows((gt == 1) & region)
    return PackedTarget(target=target, target_band=boundary_band(target, width, height),
                        region=pack_rows(region), labelled=pack_rows(region & (gt != IGNORE_LABEL)))


@flax.struct.dataclass
class PackedScores:
    """Scores of one binary prediction (each f32[]; see the module docstring)."""

    selection_iou: jnp.ndarray
    selection_biou: jnp.ndarray
    iou: jnp.ndarray
    biou: jnp.ndarray
    iou_reference: jnp.ndarray


def packed_scores(pred, target: PackedTarget, width) -> PackedScores:
    """`PackedScores` of a bool[Hf, Wf] prediction (pixels outside the image are ignored).

    Args:
      pred: bool[Hf, Wf] predicted mask.
      target: `pack_target` of the instance.
      width: the band width ``target`` was packed with.
    """
    pred = jnp.asarray(pred, bool)
    height = pred.shape[-2]
    words = pack_rows(pred) & target.region
    band = boundary_band(words, width, height)

    def counts(a, b, within):
        return count_packed(a & b & within), count_packed((a | b) & within)

    reference_inter = count_packed(words & target.target).astype(jnp.float32)
    reference_union = count_packed(words | target.target).astype(jnp.float32)
    return PackedScores(
        selection_iou=ratio(*counts(words, target.target, target.region), 0.0),
        selection_biou=ratio(*counts(band, target.target_band, target.region), 0.0),
        iou=ratio(*counts(words, target.target, target.labelled), math.nan),
        biou=ratio(*counts(band, target.target_band, target.labelled), math.nan),
        iou_reference=reference_inter / (reference_union + jnp.float32(REFERENCE_IOU_EPS)))


__all__ = ["REFERENCE_IOU_EPS", "ratio", "boundary_band", "PackedTarget", "pack_target", "PackedScores",
           "packed_scores"]
