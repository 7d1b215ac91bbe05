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

A traced width is eroded per platform, in one place (`eroded_by_traced_width`):
the CPU iterates ``width`` erosions of radius 1 in a ``fori_loop``; on an accelerator
that would be ``width`` sequential loop steps (each a host-synchronised XLA:GPU while
iteration), so there one erosion of radius ``width`` is read from the doubling tables
of `erode_square_packed_traced` (log-depth, static slices and selects, no loop). Both
give the same pixels: a square erosion of radius ``a + b`` is the erosion of radius
``a`` followed by ``b`` when the outside is background, and a radius above
`emptying_radius` leaves nothing in either (docs/ARCHITECTURE.md, ops).
"""

from __future__ import annotations

import functools
import math

import flax.struct
import jax.numpy as jnp
from jax import lax

from jaxseg_robust.ops.labels import IGNORE_LABEL
from jaxseg_robust.ops.morphology import count_packed, erode_packed, erode_square_packed_traced, pack_rows

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
    return words & ~eroded_by_traced_width(words, width, height)


def emptying_radius(height: int, width: int) -> int:
    """Smallest square radius whose erosion (outside = background) empties every ``height x width`` mask.

    A pixel survives radius ``r`` only if ``2 r + 1 <= min(height, width)``.
    """
    return (min(height, width) - 1) // 2 + 1


def _iterated_erosion(words, width, height: int) -> jnp.ndarray:
    """CPU variant: ``width`` erosions of radius 1 (a ``fori_loop``; none for ``width <= 0``)."""
    return lax.fori_loop(0, width, lambda _, w: erode_packed(w, 1, height), words)


def _doubling_erosion(words, width, height: int) -> jnp.ndarray:
    """Accelerator variant: one erosion of radius ``min(width, emptying_radius)`` from doubling tables."""
    max_radius = emptying_radius(height, words.shape[-1])
    return erode_square_packed_traced(words, jnp.clip(width, 0, max_radius), max_radius)


def eroded_by_traced_width(words, width, height: int, *, variant: str = "per_platform") -> jnp.ndarray:
    """``width`` 3x3 erosions (outside = background) of packed masks, the algorithm chosen per platform.

    Args:
      words: uint32[..., ceil(H/32), W] packed masks (`pack_rows`; padding bits 0).
      width: i32[] (may be traced) number of erosions d; ``d <= 0`` erodes nothing.
      height: static H.
      variant: ``"per_platform"`` (``lax.platform_dependent``: the ``fori_loop`` on the
        CPU, the doubling tables elsewhere), ``"cpu"`` or ``"accelerator"`` (one variant on
        any platform; the tests compare them).
    Returns:
      uint32[..., ceil(H/32), W] (padding bits 0).
    """
    cpu = functools.partial(_iterated_erosion, height=height)
    accelerator = functools.partial(_doubling_erosion, height=height)
    if variant == "cpu":
        return cpu(words, width)
    if variant == "accelerator":
        return accelerator(words, width)
    if variant != "per_platform":
        raise ValueError(f"variant must be 'per_platform', 'cpu' or 'accelerator', got {variant!r}")
    return lax.platform_dependent(words, width, cpu=cpu, default=accelerator)


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


__all__ = ["REFERENCE_IOU_EPS", "ratio", "boundary_band", "emptying_radius", "eroded_by_traced_width", "PackedTarget",
           "pack_target", "PackedScores", "packed_scores"]
