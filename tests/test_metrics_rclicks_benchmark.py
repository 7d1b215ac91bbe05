"""RClicks benchmark aggregation (spec rclicks.md §6, §8.2 rows 12-15): hand-computed values and identities."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from jaxseg_robust.metrics import rclicks_benchmark as B
from jaxseg_robust.metrics.interactive import number_of_clicks, rclicks_auc


def test_noc_is_20_when_never_reached_and_auc_trapezoid():
    curves = np.array([[0.5] * 19 + [0.95], [0.2, 0.91] + [0.5] * 18, [0.1] * 20, [np.nan] + [0.95] * 19])
    np.testing.assert_array_equal(B.noc_per_instance(curves), [20, 2, 20, 2])
    u = np.linspace(0.1, 1.0, 20)
    np.testing.assert_allclose(B.auc_per_instance(u), (u[0] / 2 + u[1:19].sum() + u[19] / 2) / 19)
    np.testing.assert_array_equal(B.noc_per_instance(curves), np.asarray(number_of_clicks(curves, 0.9, 20)))
    np.testing.assert_allclose(B.auc_per_instance(curves[:3]), np.asarray(rclicks_auc(curves[:3])), rtol=1e-6)
    with pytest.raises(ValueError, match="num_clicks"):
        B.noc_per_instance(np.zeros((2, 5)))


def test_deltas_are_means_of_per_instance_relative_differences():
    # §8.2 #12: NoC_B = (1, 10), mean_g NoC_g = (2, 10): ΔSB = mean(100 %, 0 %) = 50 %, not 12/11 - 1.
    groups = np.array([[2, 2, 2, 2], [10, 10, 10, 10]])
    row = B.noc_summary(groups, np.array([1, 10]))
    assert row.delta_sb == pytest.approx(50.0)
    assert row.sample_mean == pytest.approx(6.0) and row.base == pytest.approx(5.5)
    # ΔGR = (G1 - G_last)/G_last per instance; ΔHH pairs (G1, G3), (G2, G4); std = mean of per-instance stds
    groups = np.array([[4, 2, 2, 1], [3, 3, 3, 3]])
    row = B.noc_summary(groups, np.array([2, 3]))
    assert row.delta_gr == pytest.approx(100 * np.mean([(4 - 1) / 1, 0.0]))
    assert row.delta_hh == pytest.approx(100 * np.mean([(4 - 2) / 2, (2 - 1) / 1, 0, 0]))
    assert row.sample_std == pytest.approx(np.mean([np.std([4, 2, 2, 1]), 0.0]))
    assert row.delta_sb == pytest.approx(100 * np.mean([(2.25 - 2) / 2, 0.0]))


def test_nof_counts_exact_success_at_the_last_click():
    curves = np.zeros((3, 4, 20))
    curves[0, :, 19] = 0.95            # reaches 90 % exactly at click 20: NoC = 20, counts as a failure
    curves[1, :2, 0] = 0.95             # G1, G2 succeed at click 1
    curves[2, :, 4] = 0.95
    base = np.zeros((3, 20))
    base[:, 0] = 0.95
    noc_g, noc_b = B.noc_per_instance(curves), B.noc_per_instance(base)
    row = B.nof_summary(noc_g, noc_b)
    counts = np.array([1, 1, 2, 2])
    assert (row.sample_mean, row.sample_std, row.base) == (counts.mean(), pytest.approx(counts.std()), 0.0)
    assert (row.delta_sb, row.delta_gr, row.delta_hh) == (1.5, -1.0, -1.0)


@given(hnp.arrays(np.float64, (5, 10, 20), elements=st.floats(0, 1)),
       hnp.arrays(np.float64, (5, 20), elements=st.floats(0, 1)))
def test_auc_identities(group_ious, base_ious):
    auc_g, auc_b = B.auc_per_instance(group_ious), B.auc_per_instance(base_ious)
    row = B.auc_summary(auc_g, auc_b)
    # ΔHH of an absolute quantity = mean of G1..5 minus mean of G6..10 (§6.2)
    assert row.delta_hh == pytest.approx(auc_g[:, :5].mean() - auc_g[:, 5:].mean(), abs=1e-12)
    assert row.delta_sb == pytest.approx(row.sample_mean - row.base, abs=1e-12)
    noc = B.noc_summary(B.noc_per_instance(group_ious), B.noc_per_instance(base_ious))
    nocs = B.noc_per_instance(group_ious)  # [instances, groups]
    # equal-sized groups: the mean of per-instance sample means is the grand mean
    assert noc.sample_mean == pytest.approx(float(np.mean(nocs)), abs=1e-12)
    assert noc.sample_std == pytest.approx(float(np.std(nocs, axis=1).mean()), abs=1e-12)
    # NoC@90 restated click by click: the first 1-based click reaching 0.9, else 20
    for index in np.ndindex(group_ious.shape[:2]):
        curve = group_ious[index]
        expected = next((k + 1 for k in range(20) if curve[k] >= 0.9), 20)
        assert nocs[index] == expected


def test_nsr_and_user_round():
    auc = np.array([[0.8, 0.9, 1.0, 0.9], [0.5, 0.5, 0.5, 0.5]], np.float32)
    np.testing.assert_allclose(B.nsr_at_20(auc), [np.std([0.8, 0.9, 1.0, 0.9]) / 0.9, 0.0], rtol=1e-5)
    summary = B.user_round_summary([[0.2, 0.6], [], [0.5]])
    assert summary.instances == 2
    assert summary.mean == pytest.approx(0.45) and summary.std == pytest.approx(0.1)
    assert summary.nsr == pytest.approx(np.mean([0.2 / (0.4 + 1e-9), 0.0]))
    assert np.isnan(B.user_round_summary([]).mean)


def test_dataset_benchmark_from_payloads():
    rng = np.random.default_rng(0)
    payloads = []
    for i in range(4):
        payloads.append({"base_iou": rng.uniform(0, 1, 20).tolist(), "group_iou": rng.uniform(0, 1, (10, 20)),
                         "user_iou": [] if i == 3 else rng.uniform(0, 1, 3).tolist(),
                         "sample_iou": rng.uniform(0, 1, 0 if i == 3 else 3)})
    bench = B.dataset_benchmark(payloads)
    groups = np.stack([p["group_iou"] for p in payloads])
    base = np.stack([p["base_iou"] for p in payloads])
    assert bench.noc == B.noc_summary(B.noc_per_instance(groups), B.noc_per_instance(base))
    assert bench.base_iou_at_1 == pytest.approx(base[:3, 0].mean())  # instances without real clicks dropped
    assert bench.user.instances == 3 and len(bench.group_noc) == 10
    records = [{"dataset": "a", "status": "ok", "payload": p} for p in payloads] + [
        {"dataset": "a", "status": "failed", "payload": None}]
    assert B.benchmark_by_dataset(records)["a"].instances == 4
    assert B.mean_curve_auc(groups[:, 0]) == pytest.approx(B.auc_per_instance(groups[:, 0]).mean())
    with pytest.raises(ValueError, match="even"):
        B.noc_summary(np.ones((2, 3)), np.ones(2))
    with pytest.raises(ValueError, match="base"):
        B.noc_summary(np.ones((2, 4)), np.ones(3))


def test_dataset_benchmark_fills_what_was_run():
    """Groups only, Base only, odd G: every defined entry is filled (the rows were None: all-NaN tables)."""
    rng = np.random.default_rng(3)
    groups = rng.uniform(0.5, 1.0, (5, 4, 6))
    base = rng.uniform(0.5, 1.0, (5, 6))
    both = B.dataset_benchmark([{"group_iou": g, "base_iou": b} for g, b in zip(groups, base)], num_clicks=6)
    only_groups = B.dataset_benchmark([{"group_iou": g} for g in groups], num_clicks=6)
    only_base = B.dataset_benchmark([{"base_iou": b} for b in base], num_clicks=6, threshold=0.8)
    odd = B.dataset_benchmark([{"group_iou": g[:3], "base_iou": b} for g, b in zip(groups, base)], num_clicks=6)
    for row, full in ((only_groups.noc, both.noc), (only_groups.auc, both.auc), (only_groups.nof, both.nof)):
        assert (row.sample_mean, row.sample_std, row.delta_gr, row.delta_hh) == (
            full.sample_mean, full.sample_std, full.delta_gr, full.delta_hh)
        assert np.isnan(row.base) and np.isnan(row.delta_sb)
    noc_b = B.noc_per_instance(base, 0.8, 6)
    assert only_base.noc.base == noc_b.mean() and np.isnan(only_base.noc.sample_mean)
    assert only_base.nof.base == float((noc_b == 6).sum())
    assert only_base.auc.base == pytest.approx(B.auc_per_instance(base, 6).mean())
    assert (only_base.num_clicks, only_base.threshold) == (6, 0.8)
    assert np.isnan(odd.noc.delta_hh) and np.isfinite(odd.noc.delta_sb) and np.isfinite(odd.noc.delta_gr)
    with pytest.raises(ValueError, match="threshold"):
        B.dataset_benchmark([{"base_iou": base[0]}], threshold=1.5)
