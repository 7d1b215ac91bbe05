"""`jaxseg_robust.models.clickmap.layers`: GELU in torch's form, the closed-form reverse pass of
LayerNorm and GroupNorm(1, C);
SimpleClick's `FusionConv` against the authors' resize-concatenate-conv."""

from __future__ import annotations

import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
from jax.test_util import check_grads

from jaxseg_robust.models.clickmap.layers import (
    GroupNorm1,
    LayerNorm,
    gelu,
    standardise,
    standardise_last_axis,
)
from jaxseg_robust.models.simpleclick.network import FusionConv, resize_bilinear_nhwc


def _gelu_float64(x: np.ndarray) -> np.ndarray:
    erf = np.vectorize(math.erf)
    return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))


def test_gelu_matches_the_exact_function():
    x = np.linspace(-12.0, 12.0, 20001, dtype=np.float32)
    np.testing.assert_allclose(np.asarray(gelu(jnp.asarray(x))), _gelu_float64(x.astype(np.float64)),
                               rtol=0, atol=2e-6)


def test_gelu_derivative_matches_the_exact_one():
    x = np.linspace(-6.0, 6.0, 1201, dtype=np.float32)
    grad = np.asarray(jax.vmap(jax.grad(gelu))(jnp.asarray(x)))
    x64 = x.astype(np.float64)
    cdf = 0.5 * (1.0 + np.vectorize(math.erf)(x64 / math.sqrt(2.0)))
    want = cdf + x64 * np.exp(-0.5 * x64 ** 2) / math.sqrt(2.0 * math.pi)
    np.testing.assert_allclose(grad, want, rtol=0, atol=2e-6)


def _layer_norm_composed(x, eps):
    mean = jnp.mean(x, axis=-1, keepdims=True)
    return (x - mean) / jnp.sqrt(jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True) + eps)


class StandardiseTest(chex.TestCase):

    @chex.variants(with_jit=True, without_jit=True, with_pmap=False)
    def test_values_and_gradient_match_autodiff_of_the_composition(self):
        x = 3.0 * jax.random.normal(jax.random.key(0), (2, 5, 24)) + 1.5
        weights = jax.random.normal(jax.random.key(1), x.shape)
        fn = self.variant(lambda x: standardise_last_axis(x, 1e-6))
        np.testing.assert_allclose(np.asarray(fn(x)), np.asarray(_layer_norm_composed(x, 1e-6)), rtol=1e-6, atol=1e-6)
        grad = self.variant(jax.grad(lambda x: jnp.sum(jnp.sin(standardise_last_axis(x, 1e-6)) * weights)))(x)
        want = jax.grad(lambda x: jnp.sum(jnp.sin(_layer_norm_composed(x, 1e-6)) * weights))(x)
        np.testing.assert_allclose(np.asarray(grad), np.asarray(want), rtol=1e-5, atol=1e-6)


def test_standardise_reverse_mode_agrees_with_finite_differences_in_float64():
    with jax.enable_x64(True):
        x = jax.random.normal(jax.random.key(2), (3, 7), jnp.float64)
        check_grads(lambda x: standardise_last_axis(x, 1e-5), (x,), order=1, modes=("rev",), atol=1e-7, rtol=1e-7)


def _group_norm_composed(x, eps):
    axes = (-3, -2, -1)
    mean = jnp.mean(x, axis=axes, keepdims=True)
    return (x - mean) / jnp.sqrt(jnp.mean(jnp.square(x - mean), axis=axes, keepdims=True) + eps)


class GroupStandardiseTest(chex.TestCase):
    """``GroupNorm(1, C)``'s statistics over H, W and C, behind a GELU as in SimpleClick's neck."""

    @chex.variants(with_jit=True, without_jit=True, with_pmap=False)
    def test_values_and_gradient_match_autodiff_of_the_composition(self):
        x = 2.0 * jax.random.normal(jax.random.key(4), (3, 6, 5, 8)) - 0.7
        weights = jax.random.normal(jax.random.key(5), x.shape)
        fn = self.variant(lambda x: standardise(x, 1e-5, (-3, -2, -1)))
        np.testing.assert_allclose(np.asarray(fn(x)), np.asarray(_group_norm_composed(x, 1e-5)),
                                   rtol=1e-6, atol=1e-6)
        grad = self.variant(jax.grad(lambda x: jnp.sum(gelu(standardise(x, 1e-5, (-3, -2, -1))) * weights)))(x)
        want = jax.grad(lambda x: jnp.sum(gelu(_group_norm_composed(x, 1e-5)) * weights))(x)
        np.testing.assert_allclose(np.asarray(grad), np.asarray(want), rtol=1e-5, atol=1e-6)

    def test_statistics_stay_per_instance_under_vmap(self):
        """Negative axes: under ``vmap`` each instance is normalised on its own, as torch per sample."""
        x = jax.random.normal(jax.random.key(6), (4, 5, 3, 6)) * jnp.arange(1.0, 5.0)[:, None, None, None]
        weights = jax.random.normal(jax.random.key(7), x.shape)

        def loss(x):
            return jnp.sum(jnp.tanh(standardise(x, 1e-5, (-3, -2, -1))) * weights)

        batched = jax.vmap(jax.grad(lambda xi, wi: jnp.sum(jnp.tanh(standardise(xi, 1e-5, (-3, -2, -1))) * wi)))
        np.testing.assert_allclose(np.asarray(batched(x, weights)), np.asarray(jax.grad(loss)(x)),
                                   rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(np.asarray(jnp.mean(jax.vmap(lambda xi: standardise(xi, 1e-5, (-3, -2, -1)))(x),
                                                        axis=(1, 2, 3))), np.zeros(4), atol=1e-6)


def test_group_norm_reverse_mode_agrees_with_finite_differences_in_float64():
    with jax.enable_x64(True):
        x = jax.random.normal(jax.random.key(8), (2, 3, 4, 5), jnp.float64)
        params = {"weight": jnp.linspace(0.5, 1.5, 5), "bias": jnp.linspace(-0.2, 0.2, 5)}
        check_grads(lambda x: GroupNorm1(5).apply({"params": params}, x), (x,), order=1, modes=("rev",),
                    atol=1e-7, rtol=1e-7)


def test_group_norm_module_is_torch_group_norm_with_one_group():
    """Statistics over H, W and C per instance, then the per-channel affine: ``nn.GroupNorm(1, C)``."""
    rng = np.random.default_rng(9)
    x = rng.standard_normal((2, 4, 3, 6)).astype(np.float32) * 3 - 1
    weight = (1 + 0.1 * rng.standard_normal(6)).astype(np.float32)
    bias = (0.1 * rng.standard_normal(6)).astype(np.float32)
    out = GroupNorm1(6).apply({"params": {"weight": weight, "bias": bias}}, jnp.asarray(x))
    x64 = x.astype(np.float64)
    mean = x64.mean(axis=(1, 2, 3), keepdims=True)
    var = x64.var(axis=(1, 2, 3), keepdims=True)
    np.testing.assert_allclose(np.asarray(out), (x64 - mean) / np.sqrt(var + 1e-5) * weight + bias,
                               rtol=0, atol=3e-6)


def test_layer_norm_module_is_torch_layer_norm():
    """Affine after standardising, biased variance: the float64 formula of ``nn.LayerNorm``."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 16)).astype(np.float32) * 2 + 0.5
    weight = (1 + 0.1 * rng.standard_normal(16)).astype(np.float32)
    bias = (0.1 * rng.standard_normal(16)).astype(np.float32)
    out = LayerNorm(16, 1e-6).apply({"params": {"weight": weight, "bias": bias}}, jnp.asarray(x))
    x64 = x.astype(np.float64)
    want = (x64 - x64.mean(-1, keepdims=True)) / np.sqrt(x64.var(-1, keepdims=True) + 1e-6) * weight + bias
    np.testing.assert_allclose(np.asarray(out), want, rtol=0, atol=3e-6)


def test_fusion_conv_equals_the_conv_on_the_resized_concatenation():
    """SimpleClick's head: the 1x1 fusion conv applied per level before resizing is the authors'
    resize, concatenate, conv (bilinear resize and 1x1 conv commute), to float32 rounding."""
    keys = jax.random.split(jax.random.key(3), 6)
    levels = [jax.random.normal(keys[i], (2, 16 // 2 ** i, 12 // 2 ** i, 5)) for i in range(4)]
    params = {"conv": {"weight": jax.random.normal(keys[4], (1, 1, 20, 7)),
                       "bias": jax.random.normal(keys[5], (7,))}}
    got = FusionConv(20, 7).apply({"params": params}, levels, (16, 12))
    stacked = jnp.concatenate([resize_bilinear_nhwc(x, (16, 12)) for x in levels], axis=-1)
    want = jax.nn.relu(stacked @ params["conv"]["weight"][0, 0] + params["conv"]["bias"])
    assert got.shape == (2, 16, 12, 7)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)
    with np.testing.assert_raises_regex(ValueError, "15 channels, the kernel 20"):
        FusionConv(20, 7).apply({"params": params}, levels[:3], (16, 12))
