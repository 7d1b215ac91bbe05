"""Tests of the dense-model protocol helpers (binary logits, MaskLogitModel, layers)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from jaxseg_robust.models.dense.base import (DenseModel, MaskLogitModel, binary_logits,
                                             check_images, normalise)
from jaxseg_robust.models.dense.layers import max_pool_ceil, upsample_bilinear
from jaxseg_robust.ops.resize import resize_bilinear

finite_logits = st.floats(-80.0, 80.0, allow_nan=False, width=32)


@given(st.lists(finite_logits, min_size=16, max_size=16))
def test_binary_logits_softmax_is_the_sigmoid_and_margin_is_z(values):
    z = jnp.asarray(values, jnp.float32)
    logits = binary_logits(z)
    assert logits.shape == (16, 2)
    assert bool(jnp.all(jnp.isfinite(logits)))
    probs = jax.nn.softmax(logits, axis=-1)
    np.testing.assert_allclose(probs[:, 1], jax.nn.sigmoid(z), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(logits[:, 1] - logits[:, 0], z, rtol=1e-5, atol=1e-5)
    # argmax is the 0.5 threshold; for |z| below ~1e-7 both log-probabilities round to
    # -ln 2 (a tie, resolved to background, the first maximum).
    decided = np.abs(np.asarray(z)) > 1e-6
    np.testing.assert_array_equal(np.asarray(jnp.argmax(logits, -1))[decided],
                                  np.asarray(z > 0)[decided])


def test_binary_logits_cross_entropy_is_binary_cross_entropy():
    z = jnp.linspace(-12.0, 12.0, 49)
    y = (jnp.arange(49) % 2).astype(jnp.int32)
    ce = -jnp.take_along_axis(jax.nn.log_softmax(binary_logits(z)), y[:, None], axis=-1)[:, 0]
    bce = -(y * jax.nn.log_sigmoid(z) + (1 - y) * jax.nn.log_sigmoid(-z))
    np.testing.assert_allclose(ce, bce, rtol=1e-5, atol=1e-6)


def test_binary_logits_cosine_loss_is_monotone_and_has_gradient():
    # PAdam-Cos / SEA-MSL use z_y / ||z||: for the foreground class it must rise with z
    # (strictly where float32 resolves it; it saturates like the sigmoid for |z| >~ 8).
    def normalised_true_logit(v):
        lg = binary_logits(v)
        return lg[..., 1] / jnp.linalg.norm(lg, axis=-1)
    wide = normalised_true_logit(jnp.linspace(-20.0, 20.0, 401))
    assert bool(jnp.all(jnp.diff(wide) >= -1e-7))  # float32 rounding at saturation
    assert float(wide[0]) >= -1.0 - 1e-6 and float(wide[-1]) <= 0.0
    z = jnp.linspace(-4.0, 4.0, 81)
    assert bool(jnp.all(jnp.diff(normalised_true_logit(z)) > 0))
    grads = jax.vmap(jax.grad(normalised_true_logit))(z)
    assert bool(jnp.all(grads > 0))


def test_check_images_rejects_bad_shapes_and_dtypes():
    check_images(jnp.zeros((1, 4, 5, 3)))
    with pytest.raises(ValueError, match="images"):
        check_images(jnp.zeros((4, 5, 3)))
    with pytest.raises(ValueError, match="images"):
        check_images(jnp.zeros((1, 4, 5, 1)))
    with pytest.raises(ValueError, match="non-empty"):
        check_images(jnp.zeros((0, 4, 5, 3)))
    with pytest.raises(ValueError, match="float"):
        check_images(jnp.zeros((1, 4, 5, 3), jnp.uint8))


def test_normalise_matches_formula():
    x = jnp.full((1, 2, 2, 3), 0.5)
    out = normalise(x, (0.5, 0.25, 0.0), (0.5, 0.25, 2.0))
    np.testing.assert_allclose(out[0, 0, 0], [0.0, 1.0, 0.25])


def _brightness_logit(params, images):
    """A toy mask-logit function: w * (mean colour - 0.5)."""
    return params["w"] * (jnp.mean(images, axis=-1) - 0.5)


def _toy_init(key):
    return {"w": jax.random.uniform(key, (), minval=1.0, maxval=2.0)}


def test_mask_logit_model_is_a_dense_model_under_jit_and_vmap():
    model = MaskLogitModel(_brightness_logit, _toy_init, name="toy")
    assert isinstance(model, DenseModel)
    assert model.num_classes == 2 and model.background_class == 0
    params = model.init(jax.random.key(0))
    images = jax.random.uniform(jax.random.key(1), (3, 5, 7, 3))
    out = jax.jit(model.apply)(params, images)
    assert out.shape == (3, 5, 7, 2)
    per_image = jax.vmap(lambda im: model.apply(params, im[None])[0])(images)
    np.testing.assert_allclose(per_image, out, rtol=1e-6, atol=1e-6)
    grad = jax.grad(lambda x: model.apply(params, x)[..., 1].sum())(images)
    assert bool(jnp.all(jnp.isfinite(grad))) and float(jnp.abs(grad).sum()) > 0


def test_mask_logit_model_rejects_wrong_logit_shape():
    model = MaskLogitModel(lambda p, x: x[..., 0, :], _toy_init, name="broken")
    with pytest.raises(ValueError, match="broken"):
        model.apply({}, jnp.zeros((1, 4, 4, 3)))


def _max_pool_ceil_reference(x: np.ndarray) -> np.ndarray:
    b, h, w, c = x.shape
    out = np.full((b, -(-h // 2), -(-w // 2), c), -np.inf, x.dtype)
    for i in range(out.shape[1]):
        for j in range(out.shape[2]):
            out[:, i, j] = x[:, 2 * i:2 * i + 2, 2 * j:2 * j + 2].max(axis=(1, 2))
    return out


@given(st.integers(1, 9), st.integers(1, 9), st.integers(0, 2 ** 31 - 1))
def test_max_pool_ceil_matches_torch_ceil_mode_rule(h, w, seed):
    x = np.random.default_rng(seed).normal(size=(2, h, w, 3)).astype(np.float32)
    np.testing.assert_array_equal(np.asarray(max_pool_ceil(jnp.asarray(x))),
                                  _max_pool_ceil_reference(x))


@pytest.mark.parametrize("h,w,out_h,out_w", [(1, 1, 3, 4), (5, 7, 10, 14), (3, 5, 7, 11),
                                             (12, 9, 5, 4)])
def test_upsample_bilinear_channels_last_equals_the_shared_torch_resize(h, w, out_h, out_w):
    x = np.random.default_rng(h * 100 + w).normal(size=(2, h, w, 3)).astype(np.float32)
    ours = upsample_bilinear(jnp.asarray(x), (out_h, out_w))
    channels_first = resize_bilinear(jnp.asarray(x.transpose(0, 3, 1, 2)), (out_h, out_w))
    np.testing.assert_allclose(ours, np.asarray(channels_first).transpose(0, 2, 3, 1),
                               rtol=1e-6, atol=1e-6)


def test_upsample_bilinear_same_size_is_identity_and_constants_stay():
    x = jax.random.normal(jax.random.key(0), (1, 5, 6, 2))
    np.testing.assert_array_equal(upsample_bilinear(x, (5, 6)), x)
    const = jnp.full((1, 3, 4, 1), 2.5)
    np.testing.assert_allclose(upsample_bilinear(const, (11, 7)), 2.5, rtol=1e-6)
