"""Tests for jaxseg_robust.metrics.clicks (RClicks spec §7 golden values and reference statements)."""

from __future__ import annotations

import itertools

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from jaxseg_robust.clicksim import clickability as C
from jaxseg_robust.metrics import clicks as M

stats = pytest.importorskip("scipy.stats")

# Spec §7 golden samples.
KS_S1 = np.array([(1, 2), (2, 1), (3, 4), (4, 3), (5, 6), (6, 5), (7, 8), (8, 7), (9, 10), (10, 9)], np.float32)
KS_S2 = np.stack([KS_S1[:, 0] + 3, np.array([9, 10, 7, 8, 5, 6, 3, 4, 1, 2], np.float32)], axis=1)


def golden_nss_map() -> np.ndarray:
    click_map = np.zeros((4, 5), np.float32)
    click_map[1, 1], click_map[2, 3], click_map[0, 4] = 3.0, 1.0, 0.5
    return click_map


# ---- reference statements (brute force, float64) ---------------------------------------------

def brute_ks2d(xy1: np.ndarray, xy2: np.ndarray) -> tuple[float, float]:
    """Loop statement of ndtest.ks2d2s (spec §7): statistic and analytic p-value."""

    def fractions(ox, oy, points):
        left, below = points[:, 0] <= ox, points[:, 1] <= oy
        n = len(points)
        a, b, c = np.sum(left & below) / n, np.sum(left & ~below) / n, np.sum(~left & below) / n
        return np.array([a, b, c, 1 - a - b - c])

    def maxdist(p1, p2):
        rows = np.array([fractions(x, y, p1) - fractions(x, y, p2) for x, y in p1])
        rows[:, 0] -= 1 / len(p1)
        return max(-rows.min(), rows.max() + 1 / len(p1))

    statistic = (maxdist(xy1, xy2) + maxdist(xy2, xy1)) / 2
    n1, n2 = len(xy1), len(xy2)
    root_ne = np.sqrt(n1 * n2 / (n1 + n2))

    def pearson(points):
        if np.ptp(points[:, 0]) == 0 or np.ptp(points[:, 1]) == 0:
            return np.nan
        return stats.pearsonr(points[:, 0], points[:, 1])[0]

    r = np.sqrt(1 - 0.5 * (pearson(xy1) ** 2 + pearson(xy2) ** 2))
    d = statistic * root_ne / (1 + r * (0.25 - 0.75 / root_ne))
    return statistic, stats.kstwobign.sf(d)


def brute_pl1(gt, sample, height, width) -> float:
    return float(np.mean([abs(g[0] - s[0]) / width + abs(g[1] - s[1]) / height
                          for g, s in itertools.product(gt, sample)]))


# ---- golden values ---------------------------------------------------------------------------

def test_golden_ks2d():
    result = M.ks2d_test(KS_S1, KS_S2)
    assert float(result.statistic) == pytest.approx(0.55, abs=1e-6)
    assert float(result.pvalue) == pytest.approx(0.080688, abs=2e-6)
    same = M.ks2d_test(KS_S1, KS_S1)
    assert float(same.statistic) == pytest.approx(0.1, abs=1e-7) and float(same.pvalue) == 1.0
    constant = M.ks2d_test(np.array([(5, 1), (5, 2), (5, 3), (5, 4)]), np.array([(5, 1), (6, 2), (7, 3), (8, 4)]))
    assert float(constant.statistic) == pytest.approx(1.0) and np.isnan(float(constant.pvalue))
    # Axis order is irrelevant.
    swapped = M.ks2d_test(KS_S1[:, ::-1], KS_S2[:, ::-1])
    assert float(swapped.pvalue) == pytest.approx(float(result.pvalue), abs=1e-7)


def test_golden_wd_pl1_nss_pde():
    a, b = [(0, 0), (0, 1), (1, 0)], [(0, 0), (0, 2), (2, 0)]
    assert M.wasserstein_distance(a, b) == pytest.approx(2 / 3, abs=1e-12)
    gt, sample = np.array([(10, 10), (20, 10)]), np.array([(10, 20), (30, 10)])
    assert float(M.pl1(gt, sample, 20, 40)) == pytest.approx(0.5, abs=1e-7)
    clicks = np.array([(1, 1), (3, 2)])
    assert float(M.nss(golden_nss_map(), clicks)) == pytest.approx(2.6117772, rel=3e-7)
    assert float(M.pde(golden_nss_map(), clicks)) == pytest.approx(0.4444444, rel=3e-7)


def test_kolmogorov_survival_matches_scipy():
    d = np.concatenate([np.linspace(0, 4, 801), [0.999999, 1.0, 1.000001, 1e-6, 10.0]])
    np.testing.assert_allclose(M.kolmogorov_survival(d), stats.kstwobign.sf(d), atol=3e-7)
    assert np.isnan(float(M.kolmogorov_survival(np.nan))) and float(M.kolmogorov_survival(-1.0)) == 1.0


# ---- reference statements --------------------------------------------------------------------

@settings(max_examples=40)
@given(xy1=hnp.arrays(np.int32, (7, 2), elements=st.integers(0, 5)),
       xy2=hnp.arrays(np.int32, (11, 2), elements=st.integers(0, 5)))
def test_ks2d_matches_brute_force(xy1, xy2):
    # Small integer grid: many ties on both axes, sometimes constant coordinates (NaN p-value).
    statistic, pvalue = brute_ks2d(xy1.astype(np.float64), xy2.astype(np.float64))
    ours = M.ks2d_test(xy1, xy2)
    assert float(ours.statistic) == pytest.approx(statistic, abs=1e-6)
    if np.isnan(pvalue):
        assert np.isnan(float(ours.pvalue))
    else:
        assert float(ours.pvalue) == pytest.approx(pvalue, abs=2e-5)


@settings(max_examples=25)
@given(gt=hnp.arrays(np.int32, (5, 2), elements=st.integers(0, 30)),
       sample=hnp.arrays(np.int32, (5, 2), elements=st.integers(0, 30)),
       box=st.tuples(st.integers(1, 40), st.integers(1, 40)))
def test_pl1_and_wd_match_statements_and_are_symmetric(gt, sample, box):
    height, width = box
    assert float(M.pl1(gt, sample, height, width)) == pytest.approx(brute_pl1(gt, sample, height, width), rel=1e-5)
    assert float(M.pl1(gt, sample, height, width)) == pytest.approx(float(M.pl1(sample, gt, height, width)),
                                                                      rel=1e-6)
    assert float(M.pl1(gt, gt, height, width)) >= 0.0
    forward, backward = M.wasserstein_distance(gt, sample), M.wasserstein_distance(sample, gt)
    assert forward == pytest.approx(backward, abs=1e-9)
    assert M.wasserstein_distance(gt, gt) == pytest.approx(0.0, abs=1e-12)
    # The assignment solver equals scipy's LP-based EMD (the reference's function).
    if hasattr(stats, "wasserstein_distance_nd"):
        assert forward == pytest.approx(stats.wasserstein_distance_nd(gt, sample), abs=1e-7)


def test_wasserstein_unequal_sizes_weights_and_solvers():
    a = np.array([(0.0, 0.0), (4.0, 0.0)])
    b = np.array([(0.0, 3.0)])
    # Every unit of mass moves to the single point: (3 + 5) / 2.
    assert M.wasserstein_distance(a, b) == pytest.approx(4.0, abs=1e-8)
    assert M.wasserstein_distance(a, b, weights_a=[3, 1]) == pytest.approx(0.75 * 3 + 0.25 * 5, abs=1e-8)
    # On a line the EMD equals the 1-D Wasserstein distance.
    line_a, line_b = np.array([[0, 0], [1, 0], [5, 0]]), np.array([[2, 0], [2, 0], [9, 0]])
    assert M.wasserstein_distance(line_a, line_b) == pytest.approx(
        stats.wasserstein_distance(line_a[:, 0], line_b[:, 0]), abs=1e-9)
    with pytest.raises(ValueError, match="solver"):
        M.wasserstein_distance(a, b, solver="sinkhorn")
    with pytest.raises(ValueError, match="weights_a"):
        M.wasserstein_distance(a, b, weights_a=[1, -1])


def test_wasserstein_pot_solver_agrees():
    pytest.importorskip("ot")
    rng = np.random.default_rng(0)
    for size_a, size_b in ((6, 6), (5, 9)):
        a, b = rng.integers(0, 50, (size_a, 2)), rng.integers(0, 50, (size_b, 2))
        assert M.wasserstein_distance(a, b, solver="pot") == pytest.approx(M.wasserstein_distance(a, b), abs=1e-7)


@settings(max_examples=20)
@given(click_map=hnp.arrays(np.float32, (6, 7), elements=st.sampled_from([0.0, 0.0, 0.1, 1.0, 4.0])),
       clicks=hnp.arrays(np.int32, (4, 2), elements=st.integers(-2, 8)))
def test_nss_pde_match_numpy_statement(click_map, clicks):
    eps = 1e-9
    probability = click_map.astype(np.float64) / (click_map.sum() + eps)
    standardised = (probability - probability.mean()) / (probability.std() + eps)
    xs, ys = np.clip(clicks[:, 0], 0, 6), np.clip(clicks[:, 1], 0, 5)
    assert float(M.nss(click_map, clicks)) == pytest.approx(standardised[ys, xs].mean(), rel=1e-4, abs=1e-4)
    assert float(M.pde(click_map, clicks)) == pytest.approx(probability[ys, xs].mean(), rel=1e-5, abs=1e-9)


# ---- padding, jit / vmap -------------------------------------------------------------------

def test_valid_masks_equal_unpadded_inputs():
    rng = np.random.default_rng(2)
    gt, sample = rng.integers(0, 20, (6, 2)), rng.integers(0, 20, (6, 2))
    gt_pad = np.concatenate([gt, rng.integers(0, 20, (4, 2))])
    sample_pad = np.concatenate([sample, np.full((4, 2), 99)])
    valid = np.arange(10) < 6
    assert float(M.pl1(gt_pad, sample_pad, 9, 13, valid, valid)) == pytest.approx(float(M.pl1(gt, sample, 9, 13)))
    padded, plain = M.ks2d_test(gt_pad, sample_pad, valid, valid), M.ks2d_test(gt, sample)
    assert float(padded.statistic) == pytest.approx(float(plain.statistic))
    assert float(padded.pvalue) == pytest.approx(float(plain.pvalue), abs=1e-7)
    click_map = rng.random((20, 20)).astype(np.float32)
    assert float(M.nss(click_map, gt_pad, valid)) == pytest.approx(float(M.nss(click_map, gt)), rel=1e-6)
    assert float(M.pde(click_map, gt_pad, valid)) == pytest.approx(float(M.pde(click_map, gt)), rel=1e-6)
    assert np.isnan(float(M.pde(click_map, gt, np.zeros(6, bool))))


def test_vmap_over_sets_and_tasks():
    rng = np.random.default_rng(3)
    gt = rng.integers(0, 30, (8, 2))
    sets = rng.integers(0, 30, (5, 8, 2))
    statistics = jax.vmap(lambda s: M.ks2d_test(gt, s).statistic)(sets)
    for b in range(5):
        assert float(statistics[b]) == pytest.approx(brute_ks2d(gt.astype(float), sets[b].astype(float))[0], abs=1e-6)
    assert float(M.pl1_bootstrap(gt, sets, 10, 20)) == pytest.approx(
        np.mean([brute_pl1(gt, s, 10, 20) for s in sets]), rel=1e-5)
    maps = rng.random((3, 12, 9)).astype(np.float32)
    batched = jax.jit(jax.vmap(M.nss, in_axes=(0, None)))(maps, gt % 9)
    np.testing.assert_allclose(batched, [float(M.nss(m, gt % 9)) for m in maps], rtol=1e-6)


def test_object_box_size():
    mask = np.zeros((10, 12), bool)
    assert tuple(int(v) for v in M.object_box_size(mask)) == (0, 0)
    mask[2:5, 3:10] = True
    mask[7, 4] = True
    assert tuple(int(v) for v in M.object_box_size(mask)) == (6, 7)
    assert tuple(int(v) for v in M.object_box_size(mask.astype(np.float32) * 2)) == (0, 0)  # uses G == 1


# ---- bootstrap and the per-task driver ---------------------------------------------------

def test_bootstrap_sets_follow_the_map():
    click_map = np.zeros((4, 6), np.float32)
    click_map[1, 2], click_map[3, 5] = 1.0, 3.0
    sets = np.asarray(M.bootstrap_click_sets(jax.random.PRNGKey(0), click_map, 50, 40))
    assert sets.shape == (40, 50, 2) and sets.dtype == np.int32
    hits = click_map[sets[..., 1], sets[..., 0]]
    assert (hits > 0).all()
    assert np.mean(hits == 3.0) == pytest.approx(0.75, abs=0.02)  # 2000 draws, 4.5 sigma


def test_evaluate_click_map_separates_good_and_bad_maps():
    # Synthetic task: GT clicks drawn from a Gaussian-like "true" map inside an object.
    shape = (48, 64)
    gt_mask = np.zeros(shape, bool)
    gt_mask[8:40, 10:58] = True
    yy, xx = np.mgrid[: shape[0], : shape[1]]
    true_map = np.exp(-((yy - 20.0) ** 2 + (xx - 30.0) ** 2) / (2 * 4.0 ** 2)) * gt_mask
    clicks = np.asarray(M.bootstrap_click_sets(jax.random.PRNGKey(11), true_map, 30, 1))[0]
    key = jax.random.PRNGKey(5)
    good = M.evaluate_click_map(key, true_map, clicks[:, 0], clicks[:, 1], gt_mask, num_sets=20)
    uniform = M.evaluate_click_map(key, np.asarray(C.uniform_map(gt_mask)), clicks[:, 0], clicks[:, 1],
                                   gt_mask, num_sets=20)
    assert good.ks >= 0.8 and uniform.ks <= 0.2
    assert good.pl1 < uniform.pl1 and good.wd < uniform.wd
    assert good.nss > uniform.nss and good.pde > uniform.pde
    assert all(np.isfinite(v) for v in good)
    # Deterministic for a fixed key; the paper-wording WD normalisation is also available.
    assert M.evaluate_click_map(key, true_map, clicks[:, 0], clicks[:, 1], gt_mask, num_sets=20) == good
    axes = M.evaluate_click_map(key, true_map, clicks[:, 0], clicks[:, 1], gt_mask, num_sets=20,
                                wd_normalization="axes")
    assert axes.pl1 == good.pl1 and axes.wd > 0
    with pytest.raises(ValueError, match="gt_mask"):
        M.evaluate_click_map(key, true_map, clicks[:, 0], clicks[:, 1], np.zeros(shape, bool))
    with pytest.raises(ValueError, match="click_map"):
        M.evaluate_click_map(key, np.zeros(shape), clicks[:, 0], clicks[:, 1], gt_mask)
    with pytest.raises(ValueError, match="gt_xs"):
        M.evaluate_click_map(key, true_map, [], [], gt_mask)


def test_mean_click_metrics_skips_nan_like_pandas():
    tasks = [M.ClickMetrics(0.5, 1.0, 0.1, 2.0, 1e-4), M.ClickMetrics(0.3, 0.0, float("nan"), 4.0, 3e-4)]
    mean = M.mean_click_metrics(tasks)
    assert mean == pytest.approx(M.ClickMetrics(0.4, 0.5, 0.1, 3.0, 2e-4))
    assert np.isnan(M.mean_click_metrics(tasks, skip_nan=False).wd)
    with pytest.raises(ValueError, match="per_task"):
        M.mean_click_metrics([])
