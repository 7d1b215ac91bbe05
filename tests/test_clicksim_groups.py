"""Tests for clicking groups, weighted sampling and the round's error region (RClicks spec §5.2-5.3)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from jaxseg_robust.clicksim import error_region as R
from jaxseg_robust.clicksim import groups as G
from jaxseg_robust.ops import sampling as S

# Spec §5.2 golden: band rule on a toy value vector (total 58).
TOY_VALUES = np.array([0, 0, 0, 1, 1, 2, 2, 3, 4, 5, 6, 7, 8, 9, 10], np.float32)
TOY_BANDS = [(0, 2), (2, 4), (4, 5), (5, 6), (6, 7), (7, 8), (8, 9), (9, 9), (9, 10), (10, 10)]
BOUNDS = G.group_bounds()
chi2 = pytest.importorskip("scipy.stats").chi2
MAP_SHAPE = (6, 7)


def reference_band(values: np.ndarray, q_low: float, q_high: float) -> tuple[float, float]:
    """Brute-force statement of the reference rule (float64; exact for integer-valued maps)."""
    ordered = np.sort(values.ravel().astype(np.float64))
    cumulative = np.cumsum(ordered)
    total = ordered.sum()
    low = int(np.searchsorted(cumulative, q_low * total, side="left"))
    high = int(np.searchsorted(cumulative, q_high * total, side="right"))
    return ordered[min(low, ordered.size - 1)], ordered[min(high, ordered.size - 1)]


def chi_square(counts: np.ndarray, probabilities: np.ndarray) -> tuple[float, int]:
    expected = probabilities * counts.sum()
    keep = expected > 0
    assert counts[~keep].sum() == 0, "a zero-probability cell was drawn"
    return float(((counts[keep] - expected[keep]) ** 2 / expected[keep]).sum()), int(keep.sum() - 1)


# ---- bounds and bands -----------------------------------------------------------------------

def test_group_bounds():
    np.testing.assert_array_equal(BOUNDS[:, 0], [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9])
    np.testing.assert_array_equal(BOUNDS[:, 1], [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0])
    np.testing.assert_array_equal(G.group_bounds(1), [[0.0, 1.0]])
    with pytest.raises(ValueError, match="num_groups"):
        G.group_bounds(0)


def test_golden_band_table():
    values = np.random.default_rng(0).permutation(TOY_VALUES).reshape(3, 5)  # order must not matter
    band = G.band_thresholds(values, BOUNDS[:, 0], BOUNDS[:, 1])
    np.testing.assert_array_equal(np.stack([band.low, band.high], 1), TOY_BANDS)
    g1 = np.asarray(G.band_mask(values, 0.0, 0.1))
    assert sorted(values[g1].tolist()) == [0, 0, 0, 1, 1, 2, 2]
    assert values[g1].sum() / TOY_VALUES.sum() == pytest.approx(6 / 58)  # 10.3 % of the mass
    np.testing.assert_array_equal(G.band_weights(values, 0.0, 0.1), np.where(g1, values, 0))


integer_maps = hnp.arrays(np.float32, MAP_SHAPE, elements=st.sampled_from([0.0, 0.0, 1.0, 2.0, 3.0, 7.0, 50.0]))


@settings(max_examples=40)
@given(values=integer_maps)
def test_bands_match_reference_rule_and_partition_mass(values):
    band = G.band_thresholds(values, BOUNDS[:, 0], BOUNDS[:, 1])
    low, high = np.asarray(band.low), np.asarray(band.high)
    for g, (q_low, q_high) in enumerate(BOUNDS):
        assert (low[g], high[g]) == reference_band(values, q_low, q_high)
    # Monotone, adjacent groups touch or overlap (inclusive bounds), G1 starts at the minimum and
    # G10 ends at the maximum: every pixel belongs to at least one group.
    assert np.all(np.diff(low) >= 0) and np.all(np.diff(high) >= 0) and np.all(low <= high)
    assert np.all(low[1:] <= high[:-1])
    assert low[0] == values.min() and high[-1] == values.max()
    members = (values[None] >= low[:, None, None]) & (values[None] <= high[:, None, None])
    assert members.any(axis=0).all()
    total = values.sum()
    if total > 0:
        for g, (q_low, q_high) in enumerate(BOUNDS):
            mass = values[members[g]].sum()
            inner = values[(values > low[g]) & (values < high[g])].sum()
            # A band carries at least its nominal mass; its strict interior at most that.
            assert mass >= (q_high - q_low) * total - 1e-4
            assert inner <= (q_high - q_low) * total + 1e-4


def test_band_of_all_zero_map_and_traced_bounds():
    zeros = np.zeros(MAP_SHAPE, np.float32)
    band = G.band_thresholds(zeros, 0.3, 0.4)
    assert float(band.low) == 0.0 and float(band.high) == 0.0
    # Bounds may be traced (vmap over groups).
    values = np.arange(42, dtype=np.float32).reshape(MAP_SHAPE)
    masks = jax.vmap(G.band_mask, in_axes=(None, 0, 0))(values, BOUNDS[:, 0], BOUNDS[:, 1])
    for g in range(10):
        np.testing.assert_array_equal(masks[g], G.band_mask(values, *BOUNDS[g]))


# ---- sampling -------------------------------------------------------------------------------

def test_sampling_frequencies_chi_square():
    # Fixed key -> deterministic; bound = the 0.999 quantile of the chi-square distribution.
    weights = np.zeros((5, 8), np.float32)
    weights.flat[::2] = np.arange(1, 21, dtype=np.float32) / 7.0
    weights[4, 7] = 1e-6  # a tiny but positive cell
    flat = np.asarray(S.sample_flat_indices(jax.random.PRNGKey(0), weights, 40_000))
    counts = np.bincount(flat, minlength=weights.size)
    statistic, dof = chi_square(counts, weights.ravel() / weights.sum())
    assert dof == 20 and statistic < chi2.ppf(0.999, dof)
    points = np.asarray(S.sample_pixels(jax.random.PRNGKey(0), weights, 40_000))
    np.testing.assert_array_equal(points[:, 0] + 8 * points[:, 1], flat)


@settings(max_examples=30)
@given(weights=hnp.arrays(np.float32, (4, 9), elements=st.sampled_from(
    [0.0, 0.0, 0.0, 1e-30, 1e-7, 0.5, 3.0, np.nan, -1.0])), seed=st.integers(0, 2 ** 31 - 1))
def test_sampling_never_draws_zero_weight(weights, seed):
    flat = np.asarray(S.sample_flat_indices(jax.random.PRNGKey(seed), weights, 256))
    positive = np.nan_to_num(weights.ravel(), nan=0.0) > 0
    if positive.any():
        assert positive[flat].all()
    else:
        assert (flat == 0).all()


def test_image_key_is_deterministic_per_image():
    a, b = S.image_key(42, 3), S.image_key(42, 3)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(S.image_key(42, 3), S.image_key(42, 4))
    assert not np.array_equal(S.image_key(42, 3), S.image_key(43, 3))
    np.testing.assert_array_equal(jax.jit(S.image_key, static_argnums=0)(42, jnp.int32(3)), a)


def test_in_band_sampling_is_weighted_by_clickability():
    values = np.arange(42, dtype=np.float32).reshape(MAP_SHAPE) % 9
    fallback = np.zeros(MAP_SHAPE, np.float32)
    keys = jax.random.split(jax.random.PRNGKey(7), 20_000)
    for q_low, q_high in (BOUNDS[9], BOUNDS[4], (0.0, 1.0)):
        clicks = jax.vmap(G.sample_group_click, in_axes=(0, None, None, None, None))(
            keys, values, q_low, q_high, fallback)
        assert not np.asarray(clicks.used_fallback).any()
        xy = np.asarray(clicks.xy)
        counts = np.bincount(xy[:, 1] * MAP_SHAPE[1] + xy[:, 0], minlength=values.size)
        weights = np.asarray(G.band_weights(values, q_low, q_high)).ravel()
        statistic, dof = chi_square(counts, weights / weights.sum())
        assert statistic < chi2.ppf(0.999, dof), (q_low, q_high, statistic, dof)
        if q_high - q_low == 1.0:  # weights 1..8 in the full band: uniform sampling fails the bound
            uniform = np.where(weights > 0, 1.0, 0.0)
            assert chi_square(counts, uniform / uniform.sum())[0] > 10 * chi2.ppf(0.999, dof)


def test_fallback_when_band_has_no_mass():
    fallback = np.zeros(MAP_SHAPE, np.float32)
    fallback[2, 3] = fallback[4, 1] = 5.0  # first row-major maximum: (x=3, y=2)
    click = G.sample_group_click(jax.random.PRNGKey(0), np.zeros(MAP_SHAPE), 0.0, 0.1, fallback)
    assert bool(click.used_fallback)
    np.testing.assert_array_equal(click.xy, [3, 2])
    np.testing.assert_array_equal(G.first_argmax_xy(fallback), [3, 2])
    # NaN in a map counts as zero weight (the reference's NaN check falls back).
    click = G.sample_group_click(jax.random.PRNGKey(0), np.full(MAP_SHAPE, np.nan), 0.9, 1.0, fallback)
    assert bool(click.used_fallback)


def test_all_groups_equal_per_group_calls_and_vmap_over_instances():
    rng = np.random.default_rng(1)
    maps = rng.integers(0, 5, size=(3,) + MAP_SHAPE).astype(np.float32)
    fallbacks = rng.random((3,) + MAP_SHAPE).astype(np.float32)
    keys = jax.random.split(jax.random.PRNGKey(3), 3)
    batched = jax.jit(jax.vmap(G.sample_group_clicks, in_axes=(0, 0, None, 0)))(keys, maps, BOUNDS, fallbacks)
    assert batched.xy.shape == (3, 10, 2) and batched.used_fallback.shape == (3, 10)
    per_group = jax.vmap(G.sample_group_click, in_axes=(0, None, 0, 0, None))
    for i in range(3):
        single = per_group(jax.random.split(keys[i], 10), maps[i], BOUNDS[:, 0], BOUNDS[:, 1], fallbacks[i])
        np.testing.assert_array_equal(batched.xy[i], single.xy)
        np.testing.assert_array_equal(batched.used_fallback[i], single.used_fallback)
        x, y = np.asarray(batched.xy[i]).T
        assert (maps[i][y, x] > 0).all()


def test_masked_clickability_and_no_retrace():
    values = np.linspace(0, 1, 42, dtype=np.float32).reshape(MAP_SHAPE)
    region = np.zeros(MAP_SHAPE, bool)
    region[1:4, 2:6] = True
    not_clicked = np.ones(MAP_SHAPE, bool)
    not_clicked[2, 3] = False
    masked = np.asarray(G.masked_clickability(values, region, not_clicked))
    np.testing.assert_array_equal(masked, np.where(region & not_clicked, values, 0))
    with pytest.raises(ValueError, match="region"):
        G.masked_clickability(values, region[:, :3], not_clicked)
    with pytest.raises(ValueError, match="bounds"):
        G.sample_group_clicks(jax.random.PRNGKey(0), values, BOUNDS[:, :1], values)
    # Same shapes, new values and bounds: no new compilation.
    G.sample_group_click(jax.random.PRNGKey(0), values, 0.1, 0.2, values)
    before = G.sample_group_click._cache_size()
    G.sample_group_click(jax.random.PRNGKey(1), masked, 0.5, 0.6, values * 2)
    assert G.sample_group_click._cache_size() == before


# ---- error region ---------------------------------------------------------------------------

REGION_SHAPE = (8, 10)


def reference_error_region(gt, pred, valid, not_clicked):
    """Statement of the reference clicker rule with OpenCV's exact distance transform."""
    cv2 = pytest.importorskip("cv2")
    fn = gt & ~pred & valid
    fp = ~gt & pred & valid
    fn_dt = cv2.distanceTransform(np.pad(fn, 1).astype(np.uint8), cv2.DIST_L2, 0)[1:-1, 1:-1] * not_clicked
    fp_dt = cv2.distanceTransform(np.pad(fp, 1).astype(np.uint8), cv2.DIST_L2, 0)[1:-1, 1:-1] * not_clicked
    positive = fn_dt.max() > fp_dt.max()
    chosen = fn_dt if positive else fp_dt
    y, x = np.argwhere(chosen == chosen.max())[0]
    return positive, (fn if positive else fp), (x, y)


masks = hnp.arrays(bool, REGION_SHAPE)
mostly_true = hnp.arrays(bool, REGION_SHAPE, elements=st.sampled_from([True, True, True, False]))


@settings(max_examples=20)
@given(gt=st.tuples(masks, masks), pred=st.tuples(masks, masks), valid=st.tuples(mostly_true, mostly_true),
       not_clicked=st.tuples(mostly_true, mostly_true))
def test_error_region_matches_reference_rule_under_vmap(gt, pred, valid, not_clicked):
    ours = jax.vmap(R.choose_error_region)(*(np.stack(pair) for pair in (gt, pred, valid, not_clicked)))
    for i in range(2):
        positive, region, fallback = reference_error_region(gt[i], pred[i], valid[i], not_clicked[i])
        assert bool(ours.is_positive[i]) == positive
        np.testing.assert_array_equal(ours.region[i], region)
        np.testing.assert_array_equal(G.first_argmax_xy(ours.distance[i]), fallback)


def test_error_region_round_one_and_ties():
    choose = jax.vmap(R.choose_error_region)  # batches of 2: the compilation of the test above
    gt = np.zeros(REGION_SHAPE, bool)
    gt[2:6, 3:8] = True
    ones = np.ones(REGION_SHAPE, bool)
    # Round 1 (empty prediction) is positive on the whole object; a perfect prediction has no
    # error, so the tie 0 == 0 gives a negative round with an empty region.
    result = choose(np.stack([gt, gt]), np.stack([np.zeros_like(gt), gt]), np.stack([ones, ones]),
                    np.stack([ones, ones]))
    np.testing.assert_array_equal(result.is_positive, [True, False])
    np.testing.assert_array_equal(result.region[0], gt)
    assert not np.asarray(result.region[1]).any()
    # Equal FN and FP depth -> negative (strict comparison); a clicked pixel no longer counts.
    gt_tie = np.zeros(REGION_SHAPE, bool)
    gt_tie[1, 1] = True
    pred_tie = np.zeros(REGION_SHAPE, bool)
    pred_tie[5, 5] = True
    clicked = ones.copy()
    clicked[5, 5] = False
    result = choose(np.stack([gt_tie, gt_tie]), np.stack([pred_tie, pred_tie]), np.stack([ones, ones]),
                    np.stack([ones, clicked]))
    np.testing.assert_array_equal(result.is_positive, [False, True])
    with pytest.raises(ValueError, match="pred"):
        R.choose_error_region(gt, gt[:, :4])


def test_both_error_maps_share_one_row_pass_loop_on_an_accelerator():
    # The FN and FP distance maps are one stack of the EDT: its CUDA lowering keeps one column-offset loop.
    from lowered_loops import while_loops  # noqa: PLC0415

    mask = jax.ShapeDtypeStruct((2,) + REGION_SHAPE, jnp.bool_)
    assert while_loops(jax.vmap(R.choose_error_region), mask, mask, platform="cuda") == 1
