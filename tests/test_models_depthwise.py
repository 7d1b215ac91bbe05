"""Depth-wise convolution as shifted sums equals XLA's grouped convolution."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxseg_robust.models.depthwise import DepthwiseConv, depthwise_conv2d


def grouped_conv(x, kernel, strides, padding):
    return jax.lax.conv_general_dilated(x, kernel, strides, padding,
                                        dimension_numbers=("NHWC", "HWIO", "NHWC"),
                                        feature_group_count=x.shape[-1])


@settings(max_examples=25, deadline=None)
@given(h=st.integers(1, 13), w=st.integers(1, 13), c=st.integers(1, 5), kh=st.integers(1, 7),
       kw=st.integers(1, 7), sy=st.integers(1, 3), sx=st.integers(1, 3),
       pads=st.tuples(*[st.integers(0, 3)] * 4), seed=st.integers(0, 2**16))
def test_equals_grouped_convolution(h, w, c, kh, kw, sy, sx, pads, seed):
    padding = ((pads[0], pads[1]), (pads[2], pads[3]))
    if h + pads[0] + pads[1] < kh or w + pads[2] + pads[3] < kw:
        with pytest.raises(ValueError, match="does not fit"):
            depthwise_conv2d(jnp.zeros((1, h, w, c)), jnp.zeros((kh, kw, 1, c)), (sy, sx), padding)
        return
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.normal(size=(2, h, w, c)), jnp.float32)
    kernel = jnp.asarray(rng.normal(size=(kh, kw, 1, c)), jnp.float32)
    want = grouped_conv(x, kernel, (sy, sx), padding)
    got = jax.jit(depthwise_conv2d, static_argnums=(2, 3))(x, kernel, (sy, sx), padding)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, atol=2e-5 * kh * kw, rtol=1e-5)


def test_module_is_a_drop_in_for_nn_conv_with_gradients():
    x = jax.random.normal(jax.random.key(0), (3, 9, 11, 6))
    ref = nn.Conv(6, (3, 5), strides=(2, 1), padding=((1, 1), (2, 2)), feature_group_count=6)
    ours = DepthwiseConv(6, (3, 5), strides=(2, 1), padding=((1, 1), (2, 2)))
    params = ref.init(jax.random.key(1), x)
    assert jax.tree.map(jnp.shape, params) == jax.tree.map(jnp.shape, ours.init(jax.random.key(1), x))
    np.testing.assert_allclose(ours.apply(params, x), ref.apply(params, x), atol=1e-5)
    g_ours = jax.grad(lambda p, v: jnp.sum(jnp.sin(ours.apply(p, v))), argnums=(0, 1))(params, x)
    g_ref = jax.grad(lambda p, v: jnp.sum(jnp.sin(ref.apply(p, v))), argnums=(0, 1))(params, x)
    for a, b in zip(jax.tree.leaves(g_ours), jax.tree.leaves(g_ref)):
        np.testing.assert_allclose(a, b, atol=1e-4)
    batched = jax.vmap(lambda v: ours.apply(params, v[None])[0])(x)
    np.testing.assert_allclose(batched, ours.apply(params, x), atol=1e-6)


def test_bad_input_is_named():
    with pytest.raises(ValueError, match=r"kernel must be"):
        depthwise_conv2d(jnp.zeros((1, 4, 4, 3)), jnp.zeros((3, 3, 1, 2)))
    with pytest.raises(ValueError, match=r"x must be"):
        depthwise_conv2d(jnp.zeros((4, 4, 3)), jnp.zeros((3, 3, 1, 3)))
    with pytest.raises(ValueError, match=r"expected 4"):
        DepthwiseConv(4, (3, 3)).init(jax.random.key(0), jnp.zeros((1, 5, 5, 3)))
