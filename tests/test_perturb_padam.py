"""PAdam (spec §2): step-by-step agreement with a NumPy statement of the algorithm, and strength."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

import perturb_toy as toy
from jaxseg_robust.attacks.perturb import instance_keys, losses, padam
from jaxseg_robust.attacks.perturb.common import uniform_start

EPSILON = 8 / 255
STEP = 2 / 255


def numpy_padam(images, labels, mask, start, gradient_fn, steps):
    """Spec §2.2 in NumPy (torch's AMSGrad with maximize=True), gradients from ``gradient_fn``."""
    f32 = np.float32
    x = np.asarray(images, f32)
    delta = np.asarray(start, f32) - x
    m = np.zeros_like(x)
    v = np.zeros_like(x)
    v_max = np.zeros_like(x)
    for t in range(1, steps + 1):
        g = np.asarray(gradient_fn(jnp.asarray(delta)), f32)
        m = m + f32(0.1) * (g - m)
        v = v * f32(0.999) + f32(0.001) * g * g
        v_max = np.maximum(v_max, v)
        denominator = np.sqrt(v_max) / f32((1 - 0.999 ** t) ** 0.5) + f32(1e-8)
        delta = delta + f32(STEP / (1 - 0.9 ** t)) * (m / denominator)
        delta = np.clip(delta, -EPSILON, EPSILON)
        delta = np.clip(x + delta, 0.0, 1.0) - x
    return np.clip(x + delta, 0.0, 1.0)


def test_padam_matches_the_numpy_statement():
    params = toy.init_params(jax.random.key(2), width=8)
    images, labels = toy.synthetic_batch(5, 2, 16, 16)
    mask = np.ones(labels.shape, bool)
    mask[0, :4] = False
    keys = instance_keys(jax.random.key(1), np.array([3, 9]))
    steps = 6
    for loss, pixel_loss in (("cos", losses.cosine_loss),):
        result = padam(toy.logits_fn, params, images, labels, jnp.asarray(mask), keys, loss=loss, num_steps=steps)

        @jax.jit
        def gradient(delta):
            def objective(d):
                logits = toy.logits_fn(params, images + d)
                return jnp.sum(losses.image_mean(pixel_loss(logits, labels), jnp.asarray(mask)))
            return jax.grad(objective)(delta)

        start = uniform_start(keys, images, EPSILON)
        expected = numpy_padam(images, labels, mask, start, gradient, steps)
        np.testing.assert_allclose(np.asarray(result.images), expected, atol=2e-6, err_msg=loss)
        np.testing.assert_array_equal(np.asarray(result.forwards), [steps, steps])


def test_padam_cos_drives_a_trained_model_near_zero_accuracy():
    params = toy.trained_params()
    images, labels = toy.synthetic_batch(21, 4)
    mask = jnp.ones(labels.shape, bool)
    assert toy.accuracy(params, images, labels) > 0.95
    keys = instance_keys(jax.random.key(0), np.arange(4))
    result = padam(toy.logits_fn, params, images, labels, mask, keys, loss="cos")
    assert toy.accuracy(params, result.images, labels) < 0.1
    assert float(jnp.abs(result.images - images).max()) <= EPSILON + 1e-7
