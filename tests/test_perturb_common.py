"""Tests for jaxseg_robust.attacks.perturb.common: void policy (spec §1.2), projection, keys, statistics."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from jaxseg_robust.attacks.perturb import common
from jaxseg_robust.metrics import semantic

C = 5
VOID = 255

label_maps = st.tuples(st.integers(1, 9), st.integers(1, 11)).flatmap(
    lambda shape: st.tuples(
        hnp.arrays(np.int32, shape, elements=st.sampled_from([0, 1, 2, 3, 4, VOID, -1])),
        hnp.arrays(np.bool_, shape)))


@given(label_maps, st.sampled_from(common.VOID_POLICIES))
def test_attack_targets_follow_the_void_policy(data, policy):
    labels, valid = data
    labelled = valid & (labels >= 0) & (labels < C)
    y, m = common.attack_targets(labels, valid, num_classes=C, family="max_damage", void_policy=policy)
    y, m = np.asarray(y), np.asarray(m)
    assert y.dtype == np.int32 and m.dtype == np.bool_
    assert np.all((y >= 0) & (y < C))
    np.testing.assert_array_equal(y[labelled], labels[labelled])
    if policy == "as_background":
        assert m.all()
        np.testing.assert_array_equal(y[~labelled], 0)
    else:
        np.testing.assert_array_equal(m, labelled)
    y_min, m_min = common.attack_targets(labels, valid, num_classes=C, family="min_norm", void_policy=policy)
    np.testing.assert_array_equal(np.asarray(m_min), labelled)
    np.testing.assert_array_equal(np.asarray(y_min)[labelled], labels[labelled])


def test_attack_targets_vmaps_and_uses_the_background_class():
    labels = jnp.array([[[0, 3, VOID]], [[VOID, VOID, 1]]], jnp.int32)
    valid = jnp.ones(labels.shape, bool)
    y, m = jax.jit(jax.vmap(lambda l, v: common.attack_targets(l, v, num_classes=C, family="max_damage",
                                                                 background_class=2)))(labels, valid)
    np.testing.assert_array_equal(np.asarray(y), [[[0, 3, 2]], [[2, 2, 1]]])
    assert bool(m.all())


@pytest.mark.parametrize("kwargs, match", [
    (dict(family="other"), "family"),
    (dict(family="max_damage", void_policy="drop"), "void_policy"),
    (dict(family="max_damage", num_classes=0), "num_classes"),
    (dict(family="max_damage", background_class=7), "background_class"),
])
def test_attack_targets_rejects_bad_arguments(kwargs, match):
    arguments = dict(num_classes=C) | kwargs
    with pytest.raises(ValueError, match=match):
        common.attack_targets(np.zeros((2, 2), np.int32), np.ones((2, 2), bool), **arguments)


def test_attack_targets_rejects_a_mismatched_valid_mask():
    with pytest.raises(ValueError, match="valid"):
        common.attack_targets(np.zeros((2, 2), np.int32), np.ones((2, 3), bool), num_classes=C, family="min_norm")


# No subnormal pixel values: XLA's CPU backend flushes them to zero (pixels are
# multiples of 1/255 in practice).
@given(hnp.arrays(np.float32, (2, 3, 4, 3), elements=st.floats(-0.5, 1.5, width=32, allow_subnormal=False)),
       hnp.arrays(np.float32, (2, 3, 4, 3), elements=st.floats(0, 1, width=32, allow_subnormal=False)),
       st.floats(0.0, 0.2, allow_subnormal=False))
def test_project_linf_is_feasible_and_idempotent(points, clean, radius):
    projected = np.asarray(jax.jit(common.project_linf)(points, clean, radius))
    assert projected.min() >= 0.0 and projected.max() <= 1.0
    assert np.abs(projected - clean).max() <= np.float32(radius) + 1e-7
    np.testing.assert_array_equal(np.asarray(common.project_linf(projected, clean, radius)), projected)
    per_image = np.asarray(common.project_linf(points, clean, jnp.array([radius, 0.0], jnp.float32)))
    np.testing.assert_allclose(per_image[1], np.clip(clean[1], 0, 1))


def test_clip_to_ball_keeps_box_points_in_the_box():
    clean = jnp.array([[[[0.0, 0.5, 1.0]]]])
    points = jnp.array([[[[1.0, 0.0, 0.0]]]])
    np.testing.assert_allclose(np.asarray(common.clip_to_ball(points, clean, 0.1)), [[[[0.1, 0.4, 0.9]]]], atol=1e-7)


def test_instance_keys_do_not_depend_on_batch_composition():
    base = jax.random.key(7)
    images = jnp.full((3, 4, 5, 3), 0.5)
    together = common.uniform_start(common.instance_keys(base, jnp.array([10, 11, 12])), images, 0.1)
    alone = common.uniform_start(common.instance_keys(base, jnp.array([11])), images[:1], 0.1)
    np.testing.assert_array_equal(np.asarray(together[1]), np.asarray(alone[0]))
    assert not np.array_equal(np.asarray(together[0]), np.asarray(together[1]))
    assert float(jnp.abs(together - images).max()) <= 0.1 + 1e-7


@given(st.integers(0, 2**31 - 1))
def test_image_confusions_match_the_metric_module(seed):
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(3, 6, 7, C)).astype(np.float32)
    labels = rng.choice([0, 1, 2, 3, 4, VOID], size=(3, 6, 7)).astype(np.int32)
    valid = rng.random((3, 6, 7)) < 0.8
    confusions = np.asarray(common.image_confusions(logits, labels, valid, num_classes=C))
    for b in range(3):
        expected = semantic.confusion_matrix(labels[b], logits[b].argmax(-1), valid[b], num_classes=C)
        np.testing.assert_array_equal(confusions[b], np.asarray(expected))
    accuracy = np.asarray(common.per_image_scores(confusions, metric="accuracy"))
    counted = valid & (labels < C)
    for b in range(3):
        correct = (logits[b].argmax(-1) == labels[b]) & counted[b]
        expected = correct.sum() / counted[b].sum() if counted[b].any() else np.nan
        np.testing.assert_allclose(accuracy[b], expected, rtol=1e-6)
    miou = np.asarray(common.per_image_scores(confusions, metric="miou", with_background=False))
    np.testing.assert_allclose(miou, np.asarray(semantic.mean_iou(confusions, with_background=False)))


def test_per_image_scores_rejects_unknown_metric():
    with pytest.raises(ValueError, match="metric"):
        common.per_image_scores(np.zeros((1, 2, 2), np.int32), metric="dice")


def test_check_attack_inputs_names_the_bad_argument():
    images = np.zeros((2, 4, 4, 3), np.float32)
    with pytest.raises(ValueError, match="images"):
        common.check_attack_inputs(images[..., :2], np.zeros((2, 4, 4), np.int32), np.ones((2, 4, 4), bool))
    with pytest.raises(ValueError, match="labels"):
        common.check_attack_inputs(images, np.zeros((2, 4, 4), np.float32), np.ones((2, 4, 4), bool))
    with pytest.raises(ValueError, match="mask"):
        common.check_attack_inputs(images, np.zeros((2, 4, 4), np.int32), np.ones((2, 4, 4), np.int32))
