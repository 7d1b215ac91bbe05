"""Boundary bands of a traced width (metrics.packed): both erosion variants against scipy's iterated
3x3 erosion, the band of a traced width against the band of the same static width, and the
per-platform choice seen in the CPU and CUDA lowerings of the protocols' packed scores."""

from __future__ import annotations

import functools

import jax
import numpy as np
import pytest
import scipy.ndimage as ndi

from jaxseg_robust.metrics.packed import (
    boundary_band,
    emptying_radius,
    eroded_by_traced_width,
    pack_target,
    packed_scores,
)
from jaxseg_robust.ops.morphology import pack_rows, unpack_rows
from lowered_loops import while_loops
from mask_patterns import make_mask, snake, spiral

VARIANTS = ("cpu", "accelerator")
# Odd shapes: a 32-row word boundary crossed, one row, one column, fewer rows than a word.
SHAPES = ((37, 70), (1, 17), (17, 1), (5, 64), (64, 33))


def _reference_erosion(mask: np.ndarray, width: int) -> np.ndarray:
    """``width`` 3x3 erosions with a background outside (scipy; ``iterations < 1`` would mean 'until stable')."""
    if width <= 0:
        return mask
    return ndi.binary_erosion(mask, np.ones((3, 3), bool), iterations=width, border_value=0)


def _masks(shape) -> np.ndarray:
    h, w = shape
    patterns = [make_mask(p, shape, d, s) for s, (p, d) in enumerate(
        (("full", 0.5), ("blobs", 0.4), ("noise", 0.8), ("rects", 0.6), ("one_zero", 0.5)))]
    return np.stack(patterns + [spiral(h, w), snake(h, w)])


@functools.lru_cache(maxsize=None)
def _batched_erosion(variant: str, height: int):
    return jax.jit(jax.vmap(functools.partial(eroded_by_traced_width, height=height, variant=variant)))


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("shape", SHAPES)
def test_erosion_by_a_traced_width_equals_scipy(variant, shape):
    masks = _masks(shape)
    limit = emptying_radius(*shape)
    for widths in ((-1, 0, 1, 2, 3, 5, 8), (limit - 1, limit, limit + 1, 16, 17, 40, 90)):
        widths = np.resize(np.asarray(widths, np.int32), len(masks))
        got = unpack_rows(_batched_erosion(variant, shape[0])(pack_rows(masks), widths), shape[0])
        for mask, width, out in zip(masks, widths, np.asarray(got)):
            np.testing.assert_array_equal(out, _reference_erosion(mask, int(width)), err_msg=f"width {width}")


@pytest.mark.parametrize("shape", SHAPES)
def test_emptying_radius_is_the_smallest_that_empties_a_full_mask(shape):
    full = np.ones(shape, bool)
    limit = emptying_radius(*shape)
    assert not _reference_erosion(full, limit).any()
    assert _reference_erosion(full, limit - 1).any()


@pytest.mark.parametrize("variant", VARIANTS)
def test_traced_band_equals_the_static_band(variant):
    height = 37
    masks = _masks((height, 70))
    words = pack_rows(masks)
    band = jax.jit(lambda w, d: w & ~eroded_by_traced_width(w, d, height, variant=variant))
    for width in (1, 2, 4, 19):
        static = np.asarray(boundary_band(words, width, height))
        np.testing.assert_array_equal(np.asarray(band(words, np.int32(width))), static)
    # boundary_band with a traced width runs the per-platform choice (the CPU variant here).
    np.testing.assert_array_equal(np.asarray(jax.jit(boundary_band, static_argnums=2)(words, np.int32(4), height)),
                                  np.asarray(boundary_band(words, 4, height)))


def test_unknown_variant_is_named():
    with pytest.raises(ValueError, match="variant must be"):
        eroded_by_traced_width(pack_rows(np.ones((4, 4), bool)), 1, 4, variant="gpu")


def _batched_scores():
    def scores(pred, gt, region, width):
        return packed_scores(pred, pack_target(gt, region, width), width)
    return jax.vmap(scores, in_axes=(0, 0, None, 0))


def test_packed_scores_lower_without_a_width_loop_for_cuda():
    rng = np.random.default_rng(0)
    pred = rng.random((3, 50, 37)) < 0.5
    gt = (rng.random((3, 50, 37)) < 0.5).astype(np.int8)
    region = np.ones((50, 37), bool)
    width = np.array([1, 3, 7], np.int32)
    # The accelerator's erosion is loop-free; the CPU keeps its fori_loop (one per band).
    assert while_loops(_batched_scores(), pred, gt, region, width, platform="cuda") == 0
    assert while_loops(_batched_scores(), pred, gt, region, width, platform="cpu") == 2
    # The scores on this (CPU) platform equal scipy's bands.
    out = jax.jit(_batched_scores())(pred, gt, region, width)
    for k in range(3):
        bands = [m & ~_reference_erosion(m, int(width[k])) for m in (pred[k], gt[k] == 1)]
        expected = (bands[0] & bands[1]).sum() / (bands[0] | bands[1]).sum()
        np.testing.assert_allclose(float(out.biou[k]), expected, rtol=1e-6)
