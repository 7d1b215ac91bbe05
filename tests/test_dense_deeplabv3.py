"""DeepLabV3 (dilated ResNet + ASPP) Flax module and dense wrapper on a tiny configuration."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import flax.linen as nn
from flax import traverse_util

from jaxseg_robust.models.dense.base import DenseModel
from jaxseg_robust.models.dense.deeplabv3 import DeepLabV3, DeepLabV3Config, DeepLabV3Dense

from dense_configs import TINY_DEEPLAB as TINY

@pytest.fixture(scope="module")
def tiny():
    model = DeepLabV3Dense(TINY)
    return model, model.init(jax.random.key(0))


def test_resnet50_variables_have_torchvision_sizes():
    """Stage widths, downsample branches and head sizes of deeplabv3_resnet50 (eval_shape only)."""
    flat = traverse_util.flatten_dict(DeepLabV3Dense(DeepLabV3Config(aux_classifier=True))
                                      .variable_shapes(), sep="/")
    params = {k: v for k, v in flat.items() if k.startswith("params/")}
    stats = {k: v for k, v in flat.items() if k.startswith("batch_stats/")}
    n_params = sum(int(np.prod(v.shape)) for v in params.values())
    # torchvision: 42,004,074 learnable parameters with the auxiliary FCN head.
    assert n_params == 42_004_074
    assert len(stats) == 2 * sum(1 for k in params if k.endswith("/scale"))
    assert flat["params/backbone/layer1_0/downsample_conv/kernel"].shape == (1, 1, 64, 256)
    assert flat["params/backbone/layer4_2/conv3/kernel"].shape == (1, 1, 512, 2048)
    assert "params/backbone/layer2_1/downsample_conv/kernel" not in flat
    assert flat["params/classifier/aspp/project_conv/kernel"].shape == (1, 1, 1280, 256)
    assert flat["params/classifier/classifier/kernel"].shape == (1, 1, 256, 21)
    assert flat["params/aux_classifier/conv/kernel"].shape == (3, 3, 1024, 256)


def test_stride_and_dilation_pattern_of_the_backbone():
    """Output stride 8 (ceil rounding) and dilations 1/2/4 as replace_stride_with_dilation=[F,T,T]."""
    net = DeepLabV3(TINY)
    x = jax.ShapeDtypeStruct((1, 37, 50, 3), jnp.float32)
    variables = DeepLabV3Dense(TINY).variable_shapes()
    logits, aux = jax.eval_shape(lambda v, i: net.apply(v, i, True), variables, x)
    assert logits.shape == (1, 5, 7, 5) and aux.shape == (1, 5, 7, 5)  # ceil(37/8), ceil(50/8)
    convs = {}

    def record(next_fun, args, kwargs, context):
        if context.method_name == "__call__" and context.module.name == "conv2":
            convs[context.module.parent.name] = (context.module.strides,
                                                 context.module.kernel_dilation)
        return next_fun(*args, **kwargs)

    with nn.intercept_methods(record):
        jax.eval_shape(lambda v, i: net.apply(v, i, True), variables, x)
    assert convs == {"layer1_0": ((1, 1), (1, 1)), "layer2_0": ((2, 2), (1, 1)),
                     "layer3_0": ((1, 1), (1, 1)), "layer4_0": ((1, 1), (2, 2))}


def test_dense_wrapper_shapes_jit_batch_consistency_and_gradient(tiny):
    model, params = tiny
    assert isinstance(model, DenseModel)
    assert model.num_classes == 5 and model.background_class == 0
    images = jax.random.uniform(jax.random.key(1), (3, 37, 50, 3))

    def class0_ce(image):
        logits = model.apply(params, image[None])[0]
        return -jnp.mean(jax.nn.log_softmax(logits)[..., 0]), logits

    grad, per_image = jax.jit(jax.vmap(jax.grad(class0_ce, has_aux=True)))(images)
    logits = jax.jit(model.apply)(params, images)
    assert logits.shape == (3, 37, 50, 5) and logits.dtype == jnp.float32
    assert bool(jnp.all(jnp.isfinite(logits)))
    # the batched forward and the vmapped forward-with-gradient are different XLA programs (other conv
    # algorithms, other FMA contraction): float32 rounding reaches ~1.4e-5 on logits of scale ~1
    np.testing.assert_allclose(logits, per_image, rtol=1e-4, atol=1e-4)
    assert not np.allclose(logits[0], logits[1])
    assert grad.shape == images.shape and bool(jnp.all(jnp.isfinite(grad)))
    assert float(jnp.min(jnp.abs(grad).sum(axis=(1, 2, 3)))) > 0


def test_remat_changes_neither_values_nor_gradients(tiny):
    model, params = tiny
    remat = DeepLabV3Dense(dataclasses.replace(TINY, remat_blocks=True))
    assert jax.tree.structure(remat.variable_shapes()) == jax.tree.structure(params)
    images = jax.random.uniform(jax.random.key(2), (1, 24, 24, 3))

    @jax.jit
    def value_and_grad(x):
        return (jax.value_and_grad(lambda v: model.apply(params, v).sum())(x),
                jax.value_and_grad(lambda v: remat.apply(params, v).sum())(x))

    (v0, g0), (v1, g1) = value_and_grad(images)
    np.testing.assert_allclose(v0, v1, rtol=1e-5)
    np.testing.assert_allclose(g0, g1, rtol=1e-4, atol=1e-5 * float(jnp.abs(g0).max()))


def test_aux_head_outputs_and_errors(tiny):
    model, params = tiny
    images = jax.random.uniform(jax.random.key(3), (1, 16, 24, 3))
    main, aux, main_only = jax.jit(lambda x: (*model.apply_with_aux(params, x),
                                              model.apply(params, x)))(images)
    assert main.shape == aux.shape == (1, 16, 24, 5)
    assert not np.allclose(main, aux)
    np.testing.assert_allclose(main, main_only, rtol=1e-5, atol=1e-5)
    no_aux = DeepLabV3Dense(dataclasses.replace(TINY, aux_classifier=False))
    with pytest.raises(ValueError, match="aux_classifier"):
        no_aux.apply_with_aux(params, images)


def test_config_validation_and_round_trip():
    cfg = DeepLabV3Config()
    assert cfg.variant == "resnet50"
    assert DeepLabV3Config(blocks=(3, 4, 23, 3)).variant == "resnet101"
    assert DeepLabV3Config.from_dict(TINY.to_dict()) == TINY
    with pytest.raises(ValueError, match="unknown"):
        DeepLabV3Config.from_dict({"bogus": 1})
    with pytest.raises(ValueError, match="blocks"):
        DeepLabV3Config(blocks=(3, 4, 6))
    with pytest.raises(ValueError, match="atrous_rates"):
        DeepLabV3Config(atrous_rates=(6, 12))
    with pytest.raises(ValueError, match="background_class"):
        DeepLabV3Config(num_classes=3, background_class=3)
    assert DeepLabV3Dense(DeepLabV3Config(num_classes=19, background_class=None)) \
        .background_class is None
