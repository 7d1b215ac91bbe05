"""DAG (spec §4.1): clean image when the 99 % threshold is unreachable; first successful iterate otherwise."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

import perturb_toy as toy
from jaxseg_robust.attacks.perturb import dag, losses

EPSILON = 8 / 255


def test_dag_returns_the_clean_image_when_unreachable():
    params = toy.trained_params()
    images, labels = toy.synthetic_batch(31, 2)
    mask = jnp.ones(labels.shape, bool)
    result = dag(toy.logits_fn, params, images, labels, mask, gamma=1e-6, max_iterations=12, epsilon=EPSILON)
    np.testing.assert_array_equal(np.asarray(result.images), np.asarray(images))
    assert not np.asarray(result.info["success"]).any()
    np.testing.assert_array_equal(np.asarray(result.info["success_step"]), [-1, -1])
    np.testing.assert_array_equal(np.asarray(result.forwards), [12, 12])
    np.testing.assert_array_equal(np.asarray(result.backwards), [12, 12])
    assert np.all(np.asarray(result.info["perturbation_linf"]) > 0)  # it did move, it just never succeeded


def test_dag_returns_its_first_successful_iterate():
    params = toy.trained_params()
    images, labels = toy.synthetic_batch(32, 2)
    mask = np.ones(labels.shape, bool)
    mask[:, :2] = False
    result = dag(toy.logits_fn, params, images, labels, jnp.asarray(mask), gamma=0.003, max_iterations=200)
    success_step = np.asarray(result.info["success_step"])
    assert np.asarray(result.info["success"]).all()
    margin = np.asarray(losses.logit_margin(toy.logits_fn(params, result.images), labels))
    fraction = ((margin < 0) & mask).reshape(2, -1).sum(1) / mask.reshape(2, -1).sum(1)
    assert np.all(fraction >= 0.99)
    np.testing.assert_array_equal(np.asarray(result.forwards), success_step + 1)
    np.testing.assert_array_equal(np.asarray(result.backwards), success_step)
    # Steps are γ·G/‖G‖∞: after s steps ‖r‖∞ <= s·γ.
    assert np.all(np.abs(np.asarray(result.images) - np.asarray(images)).reshape(2, -1).max(1)
                  <= success_step * 0.003 + 1e-6)
