"""Tests for jaxseg_robust.metrics.interactive on hand-built trajectories."""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from jaxseg_robust.metrics import interactive as I

# Five 5-click trajectories.
CURVES = np.array(
    [
        [0.95, 0.96, 0.97, 0.98, 0.99],  # reaches 0.9 at click 1
        [0.50, 0.70, 0.90, 0.92, 0.95],  # exactly 0.9 at click 3 (>= counts)
        [0.10, 0.20, 0.30, 0.40, 0.91],  # reaches at the last click
        [0.10, 0.20, 0.30, 0.40, 0.50],  # never reaches
        [0.80, np.nan, 0.95, 0.95, 0.95],  # a NaN click, reaches at click 3
    ],
    np.float32,
)


def numpy_noc(curve, threshold, max_clicks):
    for k, value in enumerate(curve[:max_clicks], start=1):
        if value >= threshold:
            return k
    return max_clicks


def test_noc_hand_built():
    np.testing.assert_array_equal(I.number_of_clicks(CURVES, 0.9), [1, 3, 5, 5, 3])
    np.testing.assert_array_equal(I.number_of_clicks(CURVES, 0.85), [1, 3, 5, 5, 3])
    np.testing.assert_array_equal(I.number_of_clicks(CURVES, 0.9, max_clicks=3), [1, 3, 3, 3, 3])
    np.testing.assert_array_equal(I.number_of_clicks(CURVES, 0.96), [2, 5, 5, 5, 5])
    assert I.number_of_clicks(CURVES, 0.9).dtype == jnp.int32


def test_nof_reference_and_strict_conventions():
    # Reference (RITM / RClicks): NoC == max_clicks, so reaching t at the last click is a failure.
    np.testing.assert_array_equal(I.failed_instances(CURVES, 0.9), [False, False, True, True, False])
    np.testing.assert_array_equal(I.failed_instances(CURVES, 0.9, strict=True), [False, False, False, True, False])
    assert int(I.number_of_failures(CURVES, 0.9)) == 2
    assert int(I.number_of_failures(CURVES, 0.9, strict=True)) == 1
    assert int(I.number_of_failures(CURVES, 0.9, max_clicks=3)) == 4  # NoC = [1, 3, 3, 3, 3]
    # Leading axes (e.g. clicking groups) are kept.
    groups = np.stack([CURVES, CURVES[::-1] * 0.5])
    np.testing.assert_array_equal(I.number_of_failures(groups, 0.9), [2, 5])


def test_nan_never_reaches_the_threshold():
    curve = np.array([[np.nan, np.nan, 0.95]], np.float32)
    assert int(I.number_of_clicks(curve, 0.9)[0]) == 3
    assert bool(I.failed_instances(np.full((1, 4), np.nan, np.float32), 0.9, strict=True)[0])


def test_normalized_auc_trapezoid():
    # (0.95/2 + 0.96 + 0.97 + 0.98 + 0.99/2) / 4
    assert float(I.normalized_auc(CURVES[0])) == pytest.approx((0.475 + 0.96 + 0.97 + 0.98 + 0.495) / 4)
    assert float(I.normalized_auc(np.ones(20))) == pytest.approx(1.0)
    assert float(I.normalized_auc(np.zeros(7))) == 0.0
    assert float(I.normalized_auc(CURVES[1], num_clicks=2)) == pytest.approx(0.6)
    np.testing.assert_allclose(I.normalized_auc(CURVES[:4]), np.trapezoid(CURVES[:4], axis=-1) / 4, rtol=1e-6)
    assert math.isnan(float(I.normalized_auc(CURVES[4])))


def test_rclicks_auc_is_per_instance_over_20_rounds():
    rng = np.random.default_rng(0)
    curves = rng.random((6, 25)).astype(np.float32)
    np.testing.assert_allclose(I.rclicks_auc(curves), np.trapezoid(curves[:, :20], axis=-1) / 19, rtol=1e-5)
    with pytest.raises(ValueError, match="num_clicks"):
        I.rclicks_auc(curves[:, :10])


def test_tetris_auc_is_auc_of_mean_curve():
    rng = np.random.default_rng(1)
    curves = rng.random((8, 10)).astype(np.float32)
    expected = np.trapezoid(curves.mean(axis=0)) / 9
    assert float(I.tetris_auc(curves)) == pytest.approx(expected, rel=1e-5)
    # Without NaN this equals the mean of per-instance AuCs (linearity).
    assert float(I.tetris_auc(curves)) == pytest.approx(float(jnp.mean(I.normalized_auc(curves))), rel=1e-5)


def test_nan_propagates_or_is_skipped():
    curves = np.array([[0.2, 0.4, 0.6], [np.nan, 0.5, 0.5], [0.4, 0.6, 0.8]], np.float32)
    assert math.isnan(float(I.tetris_auc(curves, num_clicks=3)))
    kept = curves[[0, 2]]
    assert float(I.tetris_auc(curves, num_clicks=3, skip_nan=True)) == pytest.approx(
        np.trapezoid(kept.mean(axis=0)) / 2)
    assert math.isnan(float(I.tetris_auc(np.full((2, 3), np.nan, np.float32), num_clicks=3, skip_nan=True)))
    # A NaN after the clicks used does not matter.
    late_nan = np.array([[0.2, 0.4, np.nan]], np.float32)
    assert float(I.tetris_auc(late_nan, num_clicks=2)) == pytest.approx(0.3)


def test_tetris_min_max_delta():
    low = np.tile(np.linspace(0.3, 0.75, 10, dtype=np.float32), (4, 1))
    high = np.tile(np.linspace(0.6, 0.96, 10, dtype=np.float32), (4, 1))
    result = I.tetris_min_max_delta(low, high)
    assert float(result.min) == pytest.approx(np.trapezoid(low[0]) / 9, rel=1e-6)
    assert float(result.max) == pytest.approx(np.trapezoid(high[0]) / 9, rel=1e-6)
    assert float(result.delta) == pytest.approx(float(result.max) - float(result.min))


def test_breps_min_max_delta():
    result = I.breps_min_max_delta(np.array([0.5, 0.7, np.nan]), np.array([0.9, 0.8, 0.7]))
    assert math.isnan(float(result.min))
    result = I.breps_min_max_delta(np.array([0.5, 0.7, np.nan]), np.array([0.9, 0.8, 0.7]), skip_nan=True)
    assert float(result.min) == pytest.approx(0.6)
    assert float(result.max) == pytest.approx(0.8)
    assert float(result.delta) == pytest.approx(0.2)


@given(hnp.arrays(np.float32, (6, 8), elements=st.floats(0, 1, width=32)), st.floats(0.05, 0.99),
       st.integers(1, 8))
def test_noc_matches_numpy(curves, threshold, max_clicks):
    expected = [numpy_noc(curve, np.float32(threshold), max_clicks) for curve in curves]
    np.testing.assert_array_equal(I.number_of_clicks(curves, threshold, max_clicks), expected)


def test_jit_and_vmap():
    groups = np.stack([CURVES, np.clip(CURVES + 0.05, 0, 1)])
    noc = jax.jit(jax.vmap(functools.partial(I.number_of_clicks, threshold=0.9)))(groups)
    np.testing.assert_array_equal(noc[0], I.number_of_clicks(CURVES, 0.9))
    nof = jax.jit(jax.vmap(functools.partial(I.number_of_failures, threshold=0.9)))(groups)
    np.testing.assert_array_equal(nof, I.number_of_failures(groups, 0.9))
    auc = jax.jit(jax.vmap(functools.partial(I.tetris_auc, num_clicks=5, skip_nan=True)))(groups)
    assert float(auc[0]) == pytest.approx(float(I.tetris_auc(CURVES, 5, skip_nan=True)))
    threshold_traced = jax.jit(I.number_of_clicks)(CURVES, jnp.float32(0.9))
    np.testing.assert_array_equal(threshold_traced, [1, 3, 5, 5, 3])


def test_errors():
    with pytest.raises(ValueError, match="max_clicks"):
        I.number_of_clicks(CURVES, 0.9, max_clicks=6)
    with pytest.raises(ValueError, match="max_clicks"):
        I.number_of_clicks(CURVES, 0.9, max_clicks=0)
    with pytest.raises(ValueError, match="num_clicks must be >= 2"):
        I.normalized_auc(CURVES, num_clicks=1)
    with pytest.raises(ValueError, match="at least 2"):
        I.number_of_failures(CURVES[0], 0.9)
