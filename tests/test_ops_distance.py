"""Exact EDT vs scipy.ndimage.distance_transform_edt (test-only oracle).

Tolerances: the int32 squared distance must equal scipy's float64 distance squared
and rounded to the nearest integer (exact); the float32 distance must equal
``float32(sqrt(that integer))`` exactly and scipy's float64 value to 1 ulp of float32
(``rtol=2**-23``). Both execution paths of the CPU row pass are exercised explicitly:
``window=0`` forces Meijster's envelope, a tiny window mixes windowed rows and
envelope rows, the default settings mostly take the windowed path on small masks.
The accelerator algorithm (what ``squared_distance_transform`` runs on a GPU) is called
directly on the CPU and checked against the same oracle, with the default offset block
(one row-pass iteration on these masks) and a block of 3 (many iterations, early stop);
the StableHLO lowered for CUDA and for the CPU shows which algorithm each platform gets.
"""

from __future__ import annotations

import functools
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.ndimage as ndi
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxseg_robust.ops.distance import (distance_transform_edt, no_zero_squared_distance,
                                        squared_distance_transform, squared_distance_transform_accelerator,
                                        squared_distance_transform_cpu)
from lowered_loops import lowered_text, while_condition_constants
from mask_patterns import PATTERNS, make_mask, mask_strategy

SHAPE = (19, 26)
# (window, row_group, envelope_group): default, envelope only, mixed.
CONFIGS = ((None, None, None), (0, 8, 3), (2, 5, 4))
DEFAULT, MIXED = CONFIGS[0], CONFIGS[2]
# Accelerator offset blocks: the default (one iteration here) and 3 (several iterations).
BLOCKS = (None, 3)


@functools.lru_cache(maxsize=None)
def _jitted(window, row_group, envelope_group, pad_border):
    kwargs = {k: v for k, v in (("window", window), ("row_group", row_group),
                                ("envelope_group", envelope_group)) if v is not None}
    return jax.jit(functools.partial(squared_distance_transform, pad_border=pad_border, **kwargs))


@functools.lru_cache(maxsize=None)
def _jitted_accelerator(offset_block, pad_border):
    kwargs = {} if offset_block is None else {"offset_block": offset_block}
    return jax.jit(functools.partial(squared_distance_transform_accelerator, pad_border=pad_border, **kwargs))


@functools.lru_cache(maxsize=None)
def _jitted_float(**kwargs):
    return jax.jit(functools.partial(distance_transform_edt, **kwargs))


def reference_squared(mask: np.ndarray, pad_border: bool = False) -> np.ndarray:
    """scipy oracle, with this module's documented value for masks without a zero."""
    mask = np.asarray(mask) != 0
    if pad_border:
        return np.rint(ndi.distance_transform_edt(np.pad(mask, 1)) ** 2).astype(np.int64)[1:-1, 1:-1]
    if mask.all():
        return np.full(mask.shape, no_zero_squared_distance(*mask.shape))
    return np.rint(ndi.distance_transform_edt(mask) ** 2).astype(np.int64)


@given(mask_strategy(SHAPE), st.sampled_from(CONFIGS + ((None, None, None, True),)))
def test_squared_matches_scipy(mask, config):
    window, row_group, envelope_group, *pad = config
    pad_border = bool(pad and pad[0])
    got = np.asarray(_jitted(window, row_group, envelope_group, pad_border)(mask))
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, reference_squared(mask, pad_border))


@pytest.mark.parametrize("pattern", PATTERNS)
def test_every_pattern_every_path(pattern):
    for seed, density in ((7, 0.4), (8, 0.9)):
        mask = make_mask(pattern, SHAPE, density, seed)
        for config in CONFIGS:
            np.testing.assert_array_equal(np.asarray(_jitted(*config, False)(mask)), reference_squared(mask))
        np.testing.assert_array_equal(np.asarray(_jitted(*DEFAULT, True)(mask)), reference_squared(mask, True))


@pytest.mark.parametrize("shape", [(1, 13), (13, 1)])
def test_single_row_and_column(shape):
    rng = np.random.default_rng(3)
    fn = _jitted(*MIXED, False)
    for mask in (rng.random(shape) < 0.5, rng.random(shape) < 0.9, np.zeros(shape, bool), np.ones(shape, bool)):
        np.testing.assert_array_equal(np.asarray(fn(mask)), reference_squared(mask))


def test_far_region_needs_envelope_with_default_settings():
    # Distances up to ~90 px: the windowed search (64 offsets) cannot finish, the
    # fallback must produce the exact result.
    mask = np.ones((40, 90), bool)
    mask[2, 3] = False
    got = np.asarray(_jitted(*DEFAULT, False)(mask))
    np.testing.assert_array_equal(got, reference_squared(mask))
    assert got.max() > 64 ** 2


def test_empty_full_and_cap():
    h, w = SHAPE
    assert np.all(np.asarray(_jitted(*DEFAULT, False)(np.zeros(SHAPE, bool))) == 0)
    full = np.ones(SHAPE, bool)
    np.testing.assert_array_equal(np.asarray(_jitted(*DEFAULT, False)(full)), h * h + w * w)
    np.testing.assert_allclose(np.asarray(_jitted_float()(full)), np.sqrt(h * h + w * w), rtol=1e-7)
    inf_fill = _jitted_float(no_zero_value=float("inf"))
    assert np.all(np.isinf(np.asarray(inf_fill(full))))
    # no_zero_value only applies when the mask has no zero pixel.
    some = full.copy()
    some[4, 5] = False
    np.testing.assert_array_equal(np.asarray(inf_fill(some)),
                                  np.sqrt(reference_squared(some)).astype(np.float32))
    # With border padding there is always a zero: distance to the nearest border.
    rows, cols = np.indices(SHAPE)
    to_border = np.minimum(np.minimum(rows + 1, h - rows), np.minimum(cols + 1, w - cols))
    np.testing.assert_array_equal(np.asarray(_jitted(*DEFAULT, True)(full)), to_border ** 2)


def test_float_distance_matches_scipy_to_float32():
    mask = make_mask("blobs", SHAPE, 0.6, 11)
    got = np.asarray(_jitted_float()(mask))
    assert got.dtype == np.float32
    ref = ndi.distance_transform_edt(mask)
    np.testing.assert_allclose(got, ref, rtol=2.0 ** -23, atol=0)
    np.testing.assert_array_equal(got, np.sqrt(np.rint(ref ** 2)).astype(np.float32))


def test_non_bool_input_non_zero_is_foreground():
    mask = make_mask("noise", SHAPE, 0.5, 2)
    coded = mask.astype(np.float32) * np.where(np.arange(SHAPE[1]) % 2 == 0, 0.25, -3.0)
    np.testing.assert_array_equal(np.asarray(_jitted(*DEFAULT, False)(coded)), reference_squared(mask))


def test_vmap_and_nested_vmap_match_per_mask():
    # MIXED runs both row-pass paths, so both are checked under (nested) vmap; the
    # vmap rule folds the batch axes into the rows of one transform.
    masks = np.stack([make_mask(p, SHAPE, 0.5, i)
                      for i, p in enumerate(("blobs", "one_zero", "lines", "rects", "full", "empty"))])
    fn = jax.jit(jax.vmap(jax.vmap(_jitted(*MIXED, False).__wrapped__)))
    got = np.asarray(fn(masks.reshape(2, 3, *SHAPE))).reshape(masks.shape)
    np.testing.assert_array_equal(got, np.stack([reference_squared(m) for m in masks]))


@pytest.mark.slow
def test_vmap_over_other_operand_only():
    mask = make_mask("blobs", SHAPE, 0.5, 3)
    scaled = jax.vmap(lambda s: s * _jitted(*MIXED, False).__wrapped__(mask))(jnp.arange(3))
    np.testing.assert_array_equal(np.asarray(scaled)[2], 2 * reference_squared(mask))


def test_usable_inside_differentiated_code():
    # The location loss multiplies a rendered disk by a distance map of a thresholded
    # prediction: the map is a constant, gradients flow through the other factor.
    x = jnp.asarray(np.random.default_rng(0).standard_normal(SHAPE), jnp.float32)
    grad = jax.grad(lambda p: jnp.sum(_jitted_float()(p > 0) * p))(x)
    np.testing.assert_allclose(np.asarray(grad), np.sqrt(reference_squared(np.asarray(x) > 0)), rtol=1e-6)


def test_jit_does_not_retrace_for_new_values():
    fn = _jitted(*DEFAULT, False)
    fn(np.zeros(SHAPE, bool))
    size = fn._cache_size()
    fn(np.ones(SHAPE, bool))
    fn(make_mask("noise", SHAPE, 0.5, 1))
    assert fn._cache_size() == size


def test_bad_input_raises():
    with pytest.raises(ValueError, match="mask"):
        squared_distance_transform(np.zeros((2, 3, 4)))
    with pytest.raises(ValueError, match="mask"):
        squared_distance_transform(np.zeros((0, 3)))
    with pytest.raises(ValueError, match="window"):
        squared_distance_transform(np.zeros((3, 3)), window=-1)
    with pytest.raises(ValueError, match="row_group"):
        squared_distance_transform(np.zeros((3, 3)), row_group=0)
    with pytest.raises(ValueError, match="exact int32 range"):
        jax.eval_shape(squared_distance_transform, jax.ShapeDtypeStruct((20001, 4), jnp.bool_))


@pytest.mark.slow
@settings(max_examples=100)
@given(st.sampled_from([(33, 7), (8, 41), (1, 1), (2, 3)]).flatmap(mask_strategy),
       st.sampled_from(CONFIGS), st.booleans())
def test_more_shapes_slow(mask, config, pad_border):
    got = np.asarray(_jitted(*config, pad_border)(mask))
    np.testing.assert_array_equal(got, reference_squared(mask, pad_border))


def _davis_masks(real_data_dir: pathlib.Path, count: int) -> list[np.ndarray]:
    cv2 = pytest.importorskip("cv2")
    paths = sorted((real_data_dir / "davis" / "masks").glob("*.png"))[:count]
    if not paths:
        pytest.skip("no DAVIS masks in the real data folder")
    masks = []
    for path in paths:
        raw = cv2.imread(str(path), cv2.IMREAD_UNCHANGED)
        masks.append(raw.reshape(raw.shape[0], raw.shape[1], -1).any(axis=-1))  # rule: != 0
    return masks


def test_real_masks_match_scipy(real_data_dir):
    fn = _jitted(*DEFAULT, False)
    for mask in _davis_masks(real_data_dir, 3):
        np.testing.assert_array_equal(np.asarray(fn(mask)), reference_squared(mask))
        # The "distance to the object" map of the location loss (large distances).
        np.testing.assert_array_equal(np.asarray(fn(~mask)), reference_squared(~mask))


# ---- the accelerator algorithm, run on the CPU ---------------------------------------------

@given(mask_strategy(SHAPE), st.sampled_from(BLOCKS), st.booleans())
def test_accelerator_matches_scipy(mask, offset_block, pad_border):
    got = np.asarray(_jitted_accelerator(offset_block, pad_border)(mask))
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, reference_squared(mask, pad_border))


@pytest.mark.parametrize("pattern", PATTERNS)
def test_accelerator_every_pattern(pattern):
    for seed, density in ((7, 0.4), (8, 0.9)):
        mask = make_mask(pattern, SHAPE, density, seed)
        for offset_block in BLOCKS:
            np.testing.assert_array_equal(np.asarray(_jitted_accelerator(offset_block, False)(mask)),
                                          reference_squared(mask))
        np.testing.assert_array_equal(np.asarray(_jitted_accelerator(None, True)(mask)),
                                      reference_squared(mask, True))


@pytest.mark.parametrize("shape", [(1, 13), (13, 1), (1, 1)])
def test_accelerator_single_row_and_column(shape):
    rng = np.random.default_rng(3)
    for mask in (rng.random(shape) < 0.5, rng.random(shape) < 0.9, np.zeros(shape, bool), np.ones(shape, bool)):
        for offset_block, pad_border in ((3, False), (None, True)):
            np.testing.assert_array_equal(np.asarray(_jitted_accelerator(offset_block, pad_border)(mask)),
                                          reference_squared(mask, pad_border))


def test_accelerator_far_region_and_block_of_one():
    # Distances up to ~90 px: the row pass runs until no column is left (block 1: 89 iterations).
    mask = np.ones((40, 90), bool)
    mask[2, 3] = False
    for offset_block in (1, 3, None):
        got = np.asarray(_jitted_accelerator(offset_block, False)(mask))
        np.testing.assert_array_equal(got, reference_squared(mask))
    assert got.max() > 64 ** 2


def test_accelerator_empty_full_and_cap():
    h, w = SHAPE
    fn = _jitted_accelerator(3, False)
    assert np.all(np.asarray(fn(np.zeros(SHAPE, bool))) == 0)
    np.testing.assert_array_equal(np.asarray(fn(np.ones(SHAPE, bool))), h * h + w * w)
    rows, cols = np.indices(SHAPE)
    to_border = np.minimum(np.minimum(rows + 1, h - rows), np.minimum(cols + 1, w - cols))
    np.testing.assert_array_equal(np.asarray(_jitted_accelerator(3, True)(np.ones(SHAPE, bool))), to_border ** 2)


def test_accelerator_vmap_and_nested_vmap_match_per_mask():
    # The batch is folded into one stack: the row pass stops on the largest distance of
    # all six masks (the "one_zero" mask), the others must still be exact.
    masks = np.stack([make_mask(p, SHAPE, 0.5, i)
                      for i, p in enumerate(("blobs", "one_zero", "lines", "rects", "full", "empty"))])
    fn = jax.jit(jax.vmap(jax.vmap(_jitted_accelerator(3, False).__wrapped__)))
    got = np.asarray(fn(masks.reshape(2, 3, *SHAPE))).reshape(masks.shape)
    np.testing.assert_array_equal(got, np.stack([reference_squared(m) for m in masks]))
    padded = jax.jit(jax.vmap(_jitted_accelerator(3, True).__wrapped__))(masks)
    np.testing.assert_array_equal(np.asarray(padded), np.stack([reference_squared(m, True) for m in masks]))


def test_accelerator_real_masks_match_scipy(real_data_dir):
    fn = _jitted_accelerator(None, False)
    for mask in _davis_masks(real_data_dir, 1):
        np.testing.assert_array_equal(np.asarray(fn(mask)), reference_squared(mask))
        np.testing.assert_array_equal(np.asarray(fn(~mask)), reference_squared(~mask))


@pytest.mark.slow
@settings(max_examples=100)
@given(st.sampled_from([(33, 7), (8, 41), (1, 1), (2, 3)]).flatmap(mask_strategy),
       st.sampled_from(BLOCKS + (1,)), st.booleans())
def test_accelerator_more_shapes_slow(mask, offset_block, pad_border):
    got = np.asarray(_jitted_accelerator(offset_block, pad_border)(mask))
    np.testing.assert_array_equal(got, reference_squared(mask, pad_border))


def test_accelerator_bad_offset_block_raises():
    for offset_block in (0, 1025):
        with pytest.raises(ValueError, match="offset_block"):
            squared_distance_transform_accelerator(np.zeros((3, 3)), offset_block=offset_block)


# ---- which algorithm each platform gets ----------------------------------------------------

TALL = jax.ShapeDtypeStruct((37, 53), jnp.bool_)  # height 37 (39 padded) appears nowhere else


@pytest.mark.parametrize("pad_border", [False, True])
def test_cuda_lowering_has_one_loop_and_no_loop_over_rows(pad_border):
    edt = functools.partial(squared_distance_transform, pad_border=pad_border)
    batched = jax.ShapeDtypeStruct((4,) + TALL.shape, jnp.bool_)
    for fn, arg in ((edt, TALL), (jax.vmap(edt), batched)):
        loops = while_condition_constants(lowered_text(fn, arg, platform="cuda"))
        assert len(loops) == 1  # the row pass; the column pass is a prefix scan
        assert not loops[0] & {37, 39}
        assert 53 in loops[0] or 55 in loops[0]  # it stops when no column is left


def test_cpu_lowering_is_the_cpu_algorithm():
    cpu = lowered_text(squared_distance_transform_cpu, TALL, platform="cpu")
    dispatched = lowered_text(squared_distance_transform, TALL, platform="cpu")
    loops = while_condition_constants(dispatched)
    assert loops == while_condition_constants(cpu)
    assert sum(37 in bounds for bounds in loops) == 2  # the two row-by-row column sweeps
    assert len(loops) > 1


def test_per_platform_algorithms_agree_with_each_other():
    masks = [make_mask(p, SHAPE, 0.7, 5) for p in ("blobs", "one_zero", "spiral")]
    for mask in masks:
        cpu = np.asarray(jax.jit(squared_distance_transform_cpu)(mask))
        np.testing.assert_array_equal(np.asarray(jax.jit(squared_distance_transform)(mask)), cpu)
        np.testing.assert_array_equal(np.asarray(_jitted_accelerator(None, False)(mask)), cpu)
