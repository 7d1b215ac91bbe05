"""U²-Net(-p) Flax module and its dense wrapper: shapes, jit, batching, gradients, config."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import traverse_util

from jaxseg_robust.models.dense.base import DenseModel
from jaxseg_robust.models.dense.u2net import (STAGE_NAMES, U2NETP, RSUSpec, U2NetConfig,
                                              U2NetDense, resize_like_pil)
from ports.dense import u2net_conv_plan

from dense_configs import TINY_U2NET as TINY


@pytest.fixture(scope="module")
def tiny():
    model = U2NetDense(TINY)
    return model, model.init(jax.random.key(0))


def test_u2netp_variables_follow_the_conv_plan():
    """Every conv of the architecture (as the port expects it) is a Flax parameter."""
    flat = traverse_util.flatten_dict(U2NetDense(U2NETP).variable_shapes(), sep="/")
    plan = u2net_conv_plan(U2NETP)
    assert len(plan) == 119 and len(flat) == 2 * len(plan)  # the ONNX file: 238 initializers
    for conv in plan:
        path = "params/" + conv.name.replace(".", "/")
        assert flat[path + "/kernel"].shape == (conv.kernel, conv.kernel, conv.in_channels,
                                                conv.out_channels)
        assert flat[path + "/bias"].shape == (conv.out_channels,)
    assert sum(int(np.prod(v.shape)) for v in flat.values()) == sum(
        c.out_channels * (c.in_channels * c.kernel ** 2 + 1) for c in plan)


def test_dense_wrapper_shapes_jit_batch_consistency_and_gradient(tiny):
    model, params = tiny
    assert isinstance(model, DenseModel)
    assert model.num_classes == 2 and model.background_class == 0
    images = jax.random.uniform(jax.random.key(1), (3, 19, 33, 3))

    def foreground_ce(image):  # one image, with the logits as auxiliary output
        logits = model.apply(params, image[None])[0]
        return -jnp.mean(jax.nn.log_softmax(logits)[..., 1]), logits

    # vmapped value-and-grad: per-image logits and gradients in one compilation.
    grad, per_image = jax.jit(jax.vmap(jax.grad(foreground_ce, has_aux=True)))(images)
    logits = jax.jit(model.apply)(params, images)
    assert logits.shape == (3, 19, 33, 2) and logits.dtype == jnp.float32
    assert bool(jnp.all(jnp.isfinite(logits)))
    np.testing.assert_allclose(logits, per_image, rtol=1e-5, atol=1e-5)
    assert not np.allclose(logits[0], logits[1])  # images are not mixed up or broadcast
    assert grad.shape == images.shape and bool(jnp.all(jnp.isfinite(grad)))
    assert float(jnp.min(jnp.abs(grad).sum(axis=(1, 2, 3)))) > 0  # every image gets a gradient


def test_side_logits_at_native_resolution_with_odd_sizes(tiny):
    model, params = tiny
    native = U2NetDense(dataclasses.replace(TINY, input_hw=None))
    images = jax.random.uniform(jax.random.key(2), (2, 13, 21, 3))
    sides, logits = jax.jit(lambda p, x: (native.side_logits(p, x), native.apply(p, x)))(
        params, images)
    assert sides.shape == (2, 13, 21, 7)
    assert bool(jnp.all(jnp.isfinite(sides)))
    # The fused map is outconv of the six side maps: it must depend on all of them.
    kernel = params["params"]["outconv"]["kernel"][0, 0, :, 0]
    fused = sides[..., 1:] @ kernel + params["params"]["outconv"]["bias"][0]
    np.testing.assert_allclose(sides[..., 0], fused, rtol=1e-5, atol=1e-5)
    # Without a resize, the dense logits are exactly [log sigmoid(-d0), log sigmoid(d0)].
    np.testing.assert_allclose(logits[..., 1] - logits[..., 0], sides[..., 0], rtol=1e-4,
                               atol=1e-4)


def test_scale_by_max_makes_the_model_invariant_to_image_scale(tiny):
    _, params = tiny
    model = U2NetDense(dataclasses.replace(TINY, input_hw=None, scale_by_max=True))
    images = jax.random.uniform(jax.random.key(4), (1, 12, 12, 3), minval=0.1, maxval=1.0)
    apply = jax.jit(model.apply)
    np.testing.assert_allclose(apply(params, images), apply(params, 0.5 * images), rtol=1e-4,
                               atol=1e-5)


@pytest.mark.slow
def test_full_u2netp_runs_at_an_odd_native_size():
    model = U2NetDense(dataclasses.replace(U2NETP, input_hw=None))
    params = model.init(jax.random.key(0))
    logits = jax.jit(model.apply)(params, jax.random.uniform(jax.random.key(1), (1, 33, 47, 3)))
    assert logits.shape == (1, 33, 47, 2)
    assert bool(jnp.all(jnp.isfinite(logits)))


def test_resize_like_pil_axis_order_clipping_and_identity():
    x = jax.random.uniform(jax.random.key(5), (2, 30, 20, 3))
    np.testing.assert_array_equal(resize_like_pil(x, (30, 20)), x)
    out = resize_like_pil(x, (10, 16))
    assert out.shape == (2, 10, 16, 3)
    assert float(out.min()) >= 0.0 and float(out.max()) <= 1.0
    # Height shrinks more (30/10 > 20/16): it goes first, then width.
    first = jnp.clip(jax.image.resize(x, (2, 10, 20, 3), "lanczos3", antialias=True), 0, 1)
    expected = jnp.clip(jax.image.resize(first, (2, 10, 16, 3), "lanczos3", antialias=True), 0, 1)
    np.testing.assert_allclose(out, expected, rtol=1e-6, atol=1e-6)


def test_config_validation_and_round_trip():
    assert U2NetConfig.from_dict(U2NETP.to_dict()) == U2NETP
    assert U2NetConfig.from_dict(TINY.to_dict()) == TINY
    with pytest.raises(ValueError, match="unknown"):
        U2NetConfig.from_dict({**U2NETP.to_dict(), "bogus": 1})
    with pytest.raises(ValueError, match="stages"):
        U2NetConfig(stages=U2NETP.stages[:10])
    bad_chain = list(U2NETP.stages)
    bad_chain[7] = RSUSpec(4, False, 64, 16, 64)  # stage4d must take 64 + 64 channels
    with pytest.raises(ValueError, match=STAGE_NAMES[7]):
        U2NetConfig(stages=tuple(bad_chain))
    with pytest.raises(ValueError, match="resize_method"):
        U2NetConfig(resize_method="bogus")
    with pytest.raises(ValueError, match="input_hw"):
        U2NetConfig(input_hw=(0, 320))
    with pytest.raises(ValueError, match="height"):
        RSUSpec(5, True, 3, 4, 8)


def test_apply_rejects_bad_images(tiny):
    model, params = tiny
    with pytest.raises(ValueError, match="images"):
        model.apply(params, jnp.zeros((8, 8, 3)))
