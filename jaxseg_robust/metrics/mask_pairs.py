"""Pixel counts of mask pairs for the dataset evaluators (mask AP, Boundary AP), batched on the device.

Follows docs/protocols/boundary_ap_pq.md. The COCO / LVIS evaluators compare a
detection with a ground truth through two numbers: the mask IoU and, for
Boundary AP, the Boundary IoU of their inner boundary bands (the official
API's band of width ``d = max(1, round(ratio * image diagonal))``,
docs/protocols/boundary_iou.md §1). Both follow from integer counts: each
mask's area and boundary area, and each pair's intersections. This module
computes those counts for a *chunk*: masks of one or more images padded into
one canvas, the pairs given as indices into the chunk. The chunk's images
share the band width ``d``, which is a traced scalar, so one compiled program
per canvas serves every image size that fits it.

Masks arrive bit-packed in the layout ``pycocotools.mask.decode`` makes cheap
on the host (:func:`pack_decoded_masks`): the decoder returns a Fortran-ordered
``[H, W, N]`` array, i.e. ``N`` column-major images, so packing the 32 rows
of each column into a ``uint32`` word is one ``np.packbits`` along the
contiguous axis. Padding (rows below ``H``, columns right of ``W``, masks
beyond the chunk's count) is 0, which is background exactly like the outside
of the image, so every count equals that of the unpadded image.

The ratios are formed on the host in float64 from the integer counts
(:func:`pair_ious`), with the same operations as pycocotools' ``rleIou``, so
they are bit-identical to it.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxseg_robust.ops.morphology import WORD_BITS, count_packed, erode_square_packed_traced


class PairCounts(NamedTuple):
    """Counts of one chunk (integers: int32 from the device, int64 from the run-length path; host or device arrays).

    Attributes:
      area: [N] pixels of each mask.
      boundary_area: [N] pixels of each mask's boundary band.
      intersection: [P] pixels of ``mask[a] AND mask[b]`` for each pair ``(a, b)``.
      boundary_intersection: [P] pixels of ``band[a] AND band[b]``.
    """

    area: np.ndarray
    boundary_area: np.ndarray
    intersection: np.ndarray
    boundary_intersection: np.ndarray


def packed_words(height: int) -> int:
    """uint32 words per image column of ``height`` rows: ``ceil(height / 32)``."""
    return -(-int(height) // WORD_BITS)


def pack_decoded_masks(decoded: np.ndarray, out: np.ndarray, start: int) -> None:
    """Packs masks decoded by pycocotools into rows ``start:start+N`` of a chunk buffer (host).

    Args:
      decoded: uint8 [H, W, N] (0/1), as ``pycocotools.mask.decode`` returns it
        (Fortran order, so ``decoded.transpose(2, 1, 0)`` is a C-contiguous
        ``[N, W, H]`` view and no pixel is copied before packing).
      out: uint8 [N_chunk, W_canvas, 4 * h_canvas] zero-initialised buffer;
        its ``uint32`` view (little-endian) is the ``[N, W, h]`` input of
        :func:`chunk_pair_counts`. ``H <= 32 h_canvas`` and ``W <= W_canvas``.
      start: first row of ``out`` to fill.
    """
    if decoded.ndim != 3:
        raise ValueError(f"decoded masks must be [H, W, N], got shape {decoded.shape}")
    height, width, count = decoded.shape
    if start + count > out.shape[0] or width > out.shape[1] or -(-height // 8) > out.shape[2]:
        raise ValueError(f"{count} masks of {height}x{width} do not fit the chunk buffer {out.shape} at {start}")
    columns = decoded.transpose(2, 1, 0)  # [N, W, H]
    bits = np.packbits(columns, axis=-1, bitorder="little")  # [N, W, ceil(H/8)]
    out[start:start + count, :width, :bits.shape[-1]] = bits


def chunk_buffer(count: int, canvas_height: int, canvas_width: int) -> np.ndarray:
    """A zero uint8 [count, canvas_width, 4 * ceil(canvas_height / 32)] buffer for :func:`pack_decoded_masks`."""
    return np.zeros((count, canvas_width, 4 * packed_words(canvas_height)), np.uint8)


def buffer_words(buffer: np.ndarray) -> np.ndarray:
    """uint32 [N, h, W] packed rows (the ops' layout) from a :func:`chunk_buffer` (a small host transpose).

    Bit ``j`` of word ``[k, x]`` is pixel ``(32 k + j, x)``. Transposing on the
    device instead made XLA keep a column-major layout that slowed the erosion
    (docs/benchmarking.md, "Measurements behind design choices").
    """
    return np.ascontiguousarray(buffer.view("<u4").astype(np.uint32, copy=False).transpose(0, 2, 1))


def _pair_intersections(rows, band, pairs) -> tuple[jnp.ndarray, jnp.ndarray]:
    """int32 [P] intersections of masks and of bands, one pair per step of a scan.

    A gather of whole masks (``rows[pairs[:, 0]]``) ran slower on CPU than
    this scan of dynamic slices (docs/benchmarking.md, "Measurements behind
    design choices").
    """
    def step(carry, pair):
        first = lax.dynamic_index_in_dim(rows, pair[0], keepdims=False)
        second = lax.dynamic_index_in_dim(rows, pair[1], keepdims=False)
        band_first = lax.dynamic_index_in_dim(band, pair[0], keepdims=False)
        band_second = lax.dynamic_index_in_dim(band, pair[1], keepdims=False)
        return carry, (count_packed(first & second), count_packed(band_first & band_second))

    return lax.scan(step, None, pairs)[1]


@functools.partial(jax.jit, static_argnames=("max_radius", "with_boundary"))
def chunk_pair_counts(words, radius, pairs, *, max_radius: int, with_boundary: bool = True) -> PairCounts:
    """Areas, boundary areas and pair intersections of a chunk of packed masks.

    Args:
      words: uint32 [N, h, W] packed masks (:func:`buffer_words`), zero outside each image.
      radius: int32 scalar, the boundary band width d of every image of the chunk (traced).
      pairs: int32 [P, 2] mask indices ``(a, b)``; padding pairs may repeat any index.
      max_radius: static bound on ``radius`` (the band width of the canvas' own diagonal).
      with_boundary: static; False skips the bands (mask AP), whose counts are then 0.

    Returns:
      PairCounts of int32 [N], [N], [P], [P] (device arrays).
    """
    rows = jnp.asarray(words, jnp.uint32)
    if with_boundary:
        band = lax.optimization_barrier(rows & ~erode_square_packed_traced(rows, radius, max_radius))
    else:
        band = jnp.zeros_like(rows)
    intersection, boundary_intersection = _pair_intersections(rows, band, pairs)
    return PairCounts(area=count_packed(rows), boundary_area=count_packed(band), intersection=intersection,
                      boundary_intersection=boundary_intersection)


@functools.partial(jax.jit, static_argnames=("max_radius",))
def crop_bands(words, radius, *, max_radius: int) -> tuple[jnp.ndarray, jnp.ndarray]:
    """Inner boundary bands of masks cut to tight crops, and their pixel counts.

    A crop holds every foreground pixel of its mask; pixels outside it are
    background, as is the outside of the image, so the erosion of the crop
    (outside = background) equals that of the whole mask inside the crop
    (docs/protocols/boundary_ap_pq.md, "Crops").

    Args:
      words: uint32 [N, h, W] packed crops (bit ``j`` of word ``[n, k, x]`` = crop pixel ``(32 k + j, x)``).
      radius: int32 scalar, the band width d of every crop (traced).
      max_radius: static bound on ``radius`` (clipped to it).

    Returns:
      (band words uint32 [N, h, W], band pixels int32 [N]) (device arrays).
    """
    rows = jnp.asarray(words, jnp.uint32)
    band = rows & ~erode_square_packed_traced(rows, radius, max_radius)
    return band, count_packed(band)


def pair_ious(intersection, area_a, area_b, crowd) -> np.ndarray:
    """pycocotools' mask IoU from counts (host, float64), ``a`` = detection, ``b`` = ground truth.

    ``i / (a + b - i)``, or ``i / a`` against a crowd ground truth; 0 whenever
    ``i == 0`` (pycocotools' rule: it also covers two empty masks).

    Args:
      intersection, area_a, area_b: integer arrays of one shape.
      crowd: bool array broadcastable to it (True = the ground truth is a crowd region).

    Returns:
      float64 array of that shape.
    """
    intersection = np.asarray(intersection, np.int64)
    area_a = np.asarray(area_a, np.int64)
    union = np.where(crowd, area_a, area_a + np.asarray(area_b, np.int64) - intersection)
    union = np.where(intersection > 0, union, 1)
    return np.where(intersection > 0, intersection.astype(np.float64) / union.astype(np.float64), 0.0)


def boundary_ap_ious(mask_iou, boundary_iou, crowd) -> np.ndarray:
    """The Boundary AP similarity: ``min(mask IoU, boundary IoU)``, plain mask IoU against crowd regions."""
    return np.where(crowd, mask_iou, np.minimum(mask_iou, boundary_iou))


__all__ = ["PairCounts", "packed_words", "pack_decoded_masks", "chunk_buffer", "buffer_words",
           "chunk_pair_counts", "crop_bands", "pair_ious", "boundary_ap_ious"]
