"""Tests for jaxseg_robust.attacks.perturb.losses against NumPy statements of spec §2.1, §3.4, §4."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from jaxseg_robust.attacks.perturb import losses

C = 5


def random_case(seed, scale=3.0, shape=(2, 4, 5)):
    rng = np.random.default_rng(seed)
    logits = (rng.normal(size=shape + (C,)) * scale).astype(np.float32)
    labels = rng.integers(0, C, size=shape).astype(np.int32)
    mask = rng.random(shape) < 0.7
    return logits, labels, mask


def numpy_log_softmax(z):
    z = z.astype(np.float64)
    shifted = z - z.max(-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))


def take(values, labels):
    return np.take_along_axis(values, labels[..., None], -1)[..., 0]


@given(st.integers(0, 2**31 - 1), st.floats(0.1, 20.0))
def test_jsd_closed_form_equals_the_two_kl_form(seed, scale):
    logits, labels, _ = random_case(seed, scale)
    closed = np.asarray(losses.jensen_shannon_one_hot(logits, labels))
    kl_form = np.asarray(losses.jensen_shannon_kl_form(logits, labels))
    finite = np.isfinite(kl_form)
    np.testing.assert_allclose(closed[finite], kl_form[finite], atol=2e-6)
    # Independent float64 statement of the general JS divergence to the one-hot target.
    p = np.exp(numpy_log_softmax(logits))
    e = np.eye(C)[labels]
    mid = (p + e) / 2
    def kl(a):
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(a > 0, a * (np.log(a) - np.log(mid)), 0.0).sum(-1)

    np.testing.assert_allclose(closed, 0.5 * (kl(p) + kl(e)), atol=2e-6)
    assert np.all(closed >= -1e-7) and np.all(closed <= np.log(2) + 1e-6)


def test_jsd_closed_form_is_finite_where_the_kl_form_is_nan():
    logits = jnp.array([[[[0.0, 200.0, -200.0]]]], jnp.float32)
    labels = jnp.array([[[0]]], jnp.int32)
    assert np.isnan(np.asarray(losses.jensen_shannon_kl_form(logits, labels))).all()
    value = np.asarray(losses.jensen_shannon_one_hot(logits, labels))
    np.testing.assert_allclose(value, np.log(2.0), rtol=1e-6)
    grad = jax.grad(lambda z: jnp.sum(losses.jensen_shannon_one_hot(z, labels)))(logits)
    assert np.isfinite(np.asarray(grad)).all()


@given(st.integers(0, 2**31 - 1))
def test_pixel_losses_match_numpy(seed):
    logits, labels, mask = random_case(seed)
    log_p = numpy_log_softmax(logits)
    ce = -take(log_p, labels)
    correct = (logits.argmax(-1) == labels) & mask
    np.testing.assert_allclose(np.asarray(losses.cross_entropy(logits, labels)), ce, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(losses.masked_cross_entropy(logits, labels, mask)), correct * ce,
                               rtol=1e-5, atol=1e-6)
    weight = 0.3
    balanced = ((1 - weight) * correct + weight * (mask & ~correct)) * ce
    np.testing.assert_allclose(np.asarray(losses.balanced_cross_entropy(logits, labels, mask, weight)), balanced,
                               rtol=1e-5, atol=1e-6)
    norm = np.sqrt((logits.astype(np.float64) ** 2).sum(-1))
    normalized = take(logits, labels) / norm
    np.testing.assert_allclose(np.asarray(losses.spherical(logits, labels, mask, masked=True)),
                               -(correct * normalized), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(losses.spherical(logits, labels, mask, masked=False)),
                               -(mask * normalized), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(losses.cosine_loss(logits, labels)), 1 - normalized, rtol=1e-5, atol=1e-6)
    others = np.where(np.eye(C, dtype=bool)[labels], -np.inf, logits)
    margin = take(logits, labels) - others.max(-1)
    np.testing.assert_allclose(np.asarray(losses.logit_margin(logits, labels)), margin, rtol=1e-5, atol=1e-5)
    top = np.sort(logits, -1)[..., ::-1]
    dlr = (margin + 1e-4) / (top[..., 0] - top[..., 2] + 1e-8)
    np.testing.assert_allclose(np.asarray(losses.difference_of_logits_ratio(logits, labels, 1e-4)), dlr,
                               rtol=1e-4, atol=1e-5)
    per_image = np.asarray(losses.image_mean(jnp.asarray(ce, jnp.float32), mask))
    np.testing.assert_allclose(per_image, (mask * ce).reshape(2, -1).sum(1) / ce[0].size, rtol=1e-5)


def test_correctness_mask_carries_no_gradient():
    logits, labels, mask = random_case(3)
    grad = jax.grad(lambda z: jnp.sum(losses.masked_cross_entropy(z, labels, mask)))(logits)
    correct = (logits.argmax(-1) == labels) & mask
    p = np.exp(numpy_log_softmax(logits))
    expected = correct[..., None] * (p - np.eye(C)[labels])
    np.testing.assert_allclose(np.asarray(grad), expected, atol=1e-6)


def test_segpgd_weight_zero_is_masked_ce_and_half_is_half_ce():
    logits, labels, mask = random_case(5)
    np.testing.assert_allclose(np.asarray(losses.balanced_cross_entropy(logits, labels, mask, 0.0)),
                               np.asarray(losses.masked_cross_entropy(logits, labels, mask)))
    np.testing.assert_allclose(np.asarray(losses.balanced_cross_entropy(logits, labels, mask, 0.5)),
                               0.5 * mask * np.asarray(losses.cross_entropy(logits, labels)), rtol=1e-6)


def test_spherical_norm_floor_keeps_zero_logits_finite():
    logits = jnp.zeros((1, 1, 1, 3))
    labels = jnp.zeros((1, 1, 1), jnp.int32)
    mask = jnp.ones((1, 1, 1), bool)
    value, grad = jax.value_and_grad(lambda z: jnp.sum(losses.spherical(z, labels, mask, masked=False)))(logits)
    assert float(value) == 0.0 and np.isfinite(np.asarray(grad)).all()


def test_dlr_needs_three_classes():
    with pytest.raises(ValueError, match="3 classes"):
        losses.difference_of_logits_ratio(jnp.zeros((1, 2, 2, 2)), jnp.zeros((1, 2, 2), jnp.int32), 1e-4)


BATCHED_LOSSES = jax.jit(jax.vmap(lambda z, y, m: jnp.stack([
    losses.jensen_shannon_one_hot(z[None], y[None])[0],
    losses.balanced_cross_entropy(z[None], y[None], m[None], 0.25)[0],
    losses.spherical(z[None], y[None], m[None], masked=True)[0],
    losses.difference_of_logits_ratio(z[None], y[None], 1e-4)[0]])))


@given(hnp.arrays(np.float32, (1, 2, 3, C), elements=st.floats(-30, 30, width=32)),
       hnp.arrays(np.int32, (1, 2, 3), elements=st.integers(0, C - 1)))
def test_losses_are_jit_and_vmap_safe(logits, labels):
    mask = np.ones((1, 2, 3), bool)
    batched = np.asarray(BATCHED_LOSSES(logits, labels, mask))[0]
    expected = [losses.jensen_shannon_one_hot(logits, labels),
                losses.balanced_cross_entropy(logits, labels, mask, 0.25),
                losses.spherical(logits, labels, mask, masked=True),
                losses.difference_of_logits_ratio(logits, labels, 1e-4)]
    for row, value in zip(batched, expected):
        np.testing.assert_allclose(row, np.asarray(value)[0], rtol=1e-6, atol=1e-6)
