"""Dice loss vs a numpy statement of segmentation_models_pytorch's binary DiceLoss."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from jaxseg_robust.attacks.objectives import dice_loss


def numpy_dice(p, t, eps=1e-7):
    p = p.astype(np.float64)
    t = t.astype(np.float64)
    score = 2 * (p * t).sum() / max(p.sum() + t.sum(), eps)
    return (1 - score) * float(t.sum() > 0)


@given(st.integers(1, 12), st.integers(1, 12), st.integers(0, 2**31 - 1), st.floats(0.0, 1.0))
def test_matches_numpy_statement(h, w, seed, density):
    rng = np.random.default_rng(seed)
    p = rng.random((h, w)).astype(np.float32)
    t = rng.random((h, w)) < density
    np.testing.assert_allclose(dice_loss(p, t), numpy_dice(p, t), rtol=1e-5, atol=1e-6)


def test_empty_target_gives_zero_and_zero_gradient():
    p = jnp.full((4, 5), 0.7)
    t = jnp.zeros((4, 5), bool)
    assert float(dice_loss(p, t)) == 0.0
    assert float(jnp.abs(jax.grad(dice_loss)(p, t)).max()) == 0.0


def test_perfect_prediction_is_zero_and_disjoint_is_one():
    t = jnp.zeros((6, 6), bool).at[1:4, 2:5].set(True)
    assert abs(float(dice_loss(t.astype(jnp.float32), t))) < 1e-7
    assert float(dice_loss((~t).astype(jnp.float32), t)) == pytest.approx(1.0)


def test_valid_mask_excludes_pixels_and_gradient_matches_finite_difference():
    rng = np.random.default_rng(0)
    p = jnp.asarray(rng.random((8, 9)), jnp.float32)
    t = jnp.asarray(rng.random((8, 9)) < 0.4)
    valid = jnp.zeros((8, 9), bool).at[:6, :7].set(True)
    np.testing.assert_allclose(dice_loss(p, t, valid), numpy_dice(np.asarray(p)[:6, :7], np.asarray(t)[:6, :7]),
                               rtol=1e-5)
    g = jax.grad(dice_loss)(p, t, valid)
    assert float(jnp.abs(g[6:]).max()) == 0.0
    eps = 1e-3
    bump = jnp.zeros_like(p).at[2, 3].set(eps)
    fd = (dice_loss(p + bump, t, valid) - dice_loss(p - bump, t, valid)) / (2 * eps)
    np.testing.assert_allclose(g[2, 3], fd, rtol=2e-2)


def test_jit_vmap_and_bad_shapes():
    rng = np.random.default_rng(1)
    p = jnp.asarray(rng.random((3, 5, 6)), jnp.float32)
    t = jnp.asarray(rng.random((3, 5, 6)) < 0.5)
    batched = jax.jit(jax.vmap(dice_loss))(p, t)
    np.testing.assert_allclose(batched, [numpy_dice(np.asarray(a), np.asarray(b)) for a, b in zip(p, t)],
                               rtol=1e-5)
    with pytest.raises(ValueError, match="same shape"):
        dice_loss(p[0], t[0, :4])
