"""Battery aggregation (spec §5): per-image worst case, strict < in C-R order, NaN never selected."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import perturb_toy as toy
from jaxseg_robust.attacks.perturb import (
    CANDIDATE_ORDER,
    BatteryConfig,
    build_battery,
    instance_keys,
    per_image_scores,
    run_battery,
    select_worst,
)
from jaxseg_robust.reports.perturb_scores import aggregate, battery_table

SCORES = hnp.arrays(np.float32, st.tuples(st.integers(1, 6), st.integers(1, 8)),
                    elements=st.sampled_from([np.nan, 0.0, 0.25, 0.5, 0.75, 1.0]))
SELECT = jax.jit(select_worst)


@given(SCORES)
def test_selection_is_the_first_strict_minimum_and_never_nan(scores):
    index, best = (np.asarray(v) for v in SELECT(scores))
    for b in range(scores.shape[1]):
        column = scores[:, b]
        finite = ~np.isnan(column)
        if not finite.any():
            assert index[b] == 0 and np.isnan(best[b])
            continue
        first_minimum = int(np.flatnonzero(finite & (column == column[finite].min()))[0])
        assert index[b] == first_minimum
        assert best[b] == column[first_minimum]
        assert np.all(best[b] <= column[finite])


def test_selection_examples():
    scores = np.array([[0.5, np.nan, 0.2], [0.5, 0.3, np.nan], [0.1, 0.3, 0.2]], np.float32)
    index, best = select_worst(scores)
    np.testing.assert_array_equal(np.asarray(index), [2, 1, 0])
    np.testing.assert_allclose(np.asarray(best), [0.1, 0.3, 0.2])
    with pytest.raises(ValueError, match="scores"):
        select_worst(np.zeros(3))


def random_confusions(seed, candidates=4, images=5, classes=3, empty_image=True):
    rng = np.random.default_rng(seed)
    confusions = rng.integers(0, 6, size=(candidates, images, classes, classes)).astype(np.int32)
    # The GT row sums (|V| per class) do not depend on the candidate: rebalance each row onto the same totals.
    totals = rng.integers(0, 12, size=(images, classes))
    for k in range(candidates):
        for i in range(images):
            for c in range(classes):
                confusions[k, i, c] = rng.multinomial(totals[i, c], np.ones(classes) / classes)
    if empty_image:
        confusions[:, 0] = 0
    return confusions


@given(st.integers(0, 2**31 - 1), st.booleans(), st.sampled_from(["accuracy", "miou"]))
def test_aggregated_score_is_at_most_every_candidate(seed, with_background, metric):
    confusions = random_confusions(seed)
    index, selected = aggregate(confusions, metric=metric, with_background=with_background)
    chosen = np.asarray(per_image_scores(jnp.asarray(selected), metric=metric, with_background=with_background))
    every = np.asarray(per_image_scores(jnp.asarray(confusions), metric=metric, with_background=with_background))
    for b in range(confusions.shape[1]):
        finite = ~np.isnan(every[:, b])
        if finite.any():
            assert np.all(chosen[b] <= every[finite, b] + 1e-7)
        else:
            assert index[b] == 0 and np.isnan(chosen[b])
    table = battery_table([f"c{k}" for k in range(confusions.shape[0])], confusions,
                          with_background=with_background)
    for name, row in table.items():
        if name != "aggregated":
            assert table["aggregated"]["accuracy"] <= row["accuracy"] + 1e-6
            assert table["aggregated"]["nmiou"] <= row["nmiou"] + 1e-6


def test_selection_can_be_forced_to_the_with_background_score():
    confusions = np.zeros((2, 1, 2, 2), np.int32)
    confusions[0, 0] = [[0, 10], [0, 5]]   # background all wrong, foreground all right
    confusions[1, 0] = [[10, 0], [5, 0]]   # background right, foreground all wrong
    by_foreground, _ = aggregate(confusions, metric="accuracy", with_background=False)
    by_full, _ = aggregate(confusions, metric="accuracy", with_background=False, select_with_background=True)
    assert by_foreground.tolist() == [1] and by_full.tolist() == [0]


def test_battery_config_validates_and_orders_candidates():
    config = BatteryConfig(num_classes=4, attacks=("alma_prox", "padam_cos", "dag_0.003"))
    assert config.candidate_names() == ("clean", "padam_cos", "dag_0.003", "alma_prox")
    assert BatteryConfig(num_classes=4).candidate_names() == CANDIDATE_ORDER
    assert BatteryConfig(num_classes=4, include_clean=False).candidate_names() == CANDIDATE_ORDER[1:]
    for kwargs, match in ((dict(void_policy="drop"), "void_policy"), (dict(sea_schedule="x"), "sea_schedule"),
                          (dict(attacks=("fgsm",)), "unknown"), (dict(epsilon=0), "epsilon"),
                          (dict(padam_steps=0), "padam_steps"), (dict(msl_track="x"), "msl_track")):
        with pytest.raises(ValueError, match=match):
            BatteryConfig(num_classes=4, **kwargs)


def test_run_battery_streams_statistics_and_worst_images():
    params = toy.init_params(jax.random.key(5), width=8)
    images, labels = toy.synthetic_batch(40, 2, 16, 16)
    labels = np.asarray(labels).copy()
    labels[:, :2] = 255  # void
    valid = np.ones(labels.shape, bool)
    config = BatteryConfig(num_classes=4, attacks=("padam_cos", "dag_0.003"), padam_steps=5, dag_iterations=5)
    candidates = build_battery(toy.logits_fn, config)
    assert [c.name for c in candidates] == ["clean", "padam_cos", "dag_0.003"]
    keys = instance_keys(jax.random.key(0), np.arange(2))
    result = run_battery(candidates, toy.logits_fn, params, images, jnp.asarray(labels), jnp.asarray(valid), keys,
                         num_classes=4, keep_worst=[("accuracy", True)])
    assert result.confusions.shape == (3, 2, 4, 4)
    np.testing.assert_array_equal(result.forwards[0], [0, 0])
    np.testing.assert_array_equal(result.forwards[1], [5, 5])
    counted = (labels < 4).reshape(2, -1).sum(1)
    np.testing.assert_array_equal(result.confusions.sum((2, 3)), np.broadcast_to(counted, (3, 2)))
    index, _ = aggregate(result.confusions, metric="accuracy")
    worst = result.worst_images[("accuracy", True)]
    for b in range(2):
        chosen = candidates[index[b]].run(params, images, jnp.asarray(labels), jnp.asarray(valid), keys)
        np.testing.assert_array_equal(worst[b], np.asarray(chosen.images[b]))
    table = battery_table(result.names, result.confusions)
    assert set(table) == {"clean", "padam_cos", "dag_0.003", "aggregated"}
