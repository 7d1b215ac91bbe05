"""isegm's ResNetV1b and DeepLabV3+ pieces (models/isegm_resnet) without torch: shapes, strides,
dilations, parameter paths and the coordinate features' channel rule."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import traverse_util

from jaxseg_robust.models.clickmap.layers import random_params
from jaxseg_robust.models.isegm_resnet.deeplab_plus import DeepLabV3Plus, SepConvHead
from jaxseg_robust.models.isegm_resnet.resnetv1b import (BACKBONES, BackboneSpec, ResNetV1b,
                                                         backbone_spec, block_dilations, match_channels)

TINY_BASIC = BackboneSpec("basic", (1, 2, 1, 1), deep_stem=False, width=8)
TINY_BOTTLENECK = BackboneSpec("bottleneck", (1, 1, 2, 1), deep_stem=True, stem_width=4, width=4)


def _shapes(module, *args):
    variables = jax.eval_shape(module.init, jax.random.PRNGKey(0), *args)
    return {"/".join(k): v.shape for k, v in traverse_util.flatten_dict(variables["params"]).items()}


def test_block_dilations_follow_isegm_make_layer():
    assert block_dilations(1, 0) == (1, 1)
    assert block_dilations(2, 0) == (1, 2) and block_dilations(2, 3) == (2, 2)
    assert block_dilations(4, 0) == (2, 4) and block_dilations(4, 1) == (4, 4)
    with pytest.raises(ValueError, match="unknown dilation size: 8"):
        block_dilations(8, 0)


def test_match_channels_pads_with_zeros_or_crops_like_torch_pad():
    x = jnp.arange(2 * 3 * 5, dtype=jnp.float32).reshape(1, 2, 3, 5)
    padded = match_channels(x, 8)
    assert padded.shape == (1, 2, 3, 8)
    np.testing.assert_array_equal(padded[..., :5], x)
    np.testing.assert_array_equal(padded[..., 5:], 0.0)
    np.testing.assert_array_equal(match_channels(x, 3), x[..., :3])


def test_named_backbones_are_isegms():
    assert backbone_spec("resnet34").stage_channels == (64, 128, 256, 512)
    assert backbone_spec("resnet34").stem_channels == 64
    assert backbone_spec("resnet50").stage_channels == (256, 512, 1024, 2048)
    assert backbone_spec("resnet50").stem_channels == 128
    assert set(BACKBONES) == {"resnet18", "resnet34", "resnet50", "resnet101", "resnet152"}
    with pytest.raises(ValueError, match="unknown isegm backbone 'resnet35'"):
        backbone_spec("resnet35")


def test_resnet34_parameter_paths_are_torch_keys():
    shapes = _shapes(ResNetV1b(backbone_spec("resnet34")), jnp.zeros((1, 32, 32, 3)))
    assert shapes["conv1/weight"] == (7, 7, 3, 64)
    assert shapes["layer2/0/downsample/0/weight"] == (1, 1, 64, 128)
    assert shapes["layer4/2/bn2/running_var"] == (512,)
    assert "layer1/0/downsample/0/weight" not in shapes  # 64 -> 64, stride 1: identity shortcut
    n_convs = sum(k.endswith("weight") and len(v) == 4 for k, v in shapes.items())
    assert n_convs == 1 + 2 * 16 + 3  # stem, two per block, three projections


def test_resnet50_deep_stem_paths():
    shapes = _shapes(ResNetV1b(backbone_spec("resnet50")), jnp.zeros((1, 32, 32, 3)))
    assert shapes["conv1/0/weight"] == (3, 3, 3, 64)
    assert shapes["conv1/6/weight"] == (3, 3, 64, 128)
    assert shapes["bn1/weight"] == (128,)
    assert shapes["layer1/0/downsample/0/weight"] == (1, 1, 128, 256)
    assert shapes["layer4/0/conv3/weight"] == (1, 1, 512, 2048)


@pytest.mark.parametrize("spec", [TINY_BASIC, TINY_BOTTLENECK], ids=["basic", "bottleneck"])
def test_output_strides_and_odd_sizes(spec):
    model = ResNetV1b(spec)
    image = jnp.zeros((2, 37, 50, 3))
    coord = jnp.ones((2, 19, 25, 3))
    params = random_params(_param_tree(model, image, coord), 0)
    c1, c2, c3, c4 = model.apply({"params": params}, image, coord)
    e = spec.expansion
    assert c1.shape == (2, 10, 13, spec.width * e)
    assert c2.shape == (2, 5, 7, 2 * spec.width * e)
    assert c3.shape == (2, 5, 7, 4 * spec.width * e)
    assert c4.shape == (2, 5, 7, 8 * spec.width * e)


def _param_tree(model, *args):
    return jax.eval_shape(model.init, jax.random.PRNGKey(0), *args)["params"]


def test_coordinate_features_change_the_output_only_through_the_stem_channels():
    model = ResNetV1b(TINY_BASIC)
    image = jax.random.uniform(jax.random.PRNGKey(1), (1, 32, 32, 3))
    params = random_params(_param_tree(model, image, None), 0)
    plain = model.apply({"params": params}, image, None)[3]
    zeros = model.apply({"params": params}, image, jnp.zeros((1, 16, 16, 3)))[3]
    np.testing.assert_array_equal(plain, zeros)
    wide = jax.random.normal(jax.random.PRNGKey(2), (1, 16, 16, 12))
    # Channels past the stem's 8 are cut, as torch's negative F.pad does.
    cut = model.apply({"params": params}, image, wide)[3]
    cut_first = model.apply({"params": params}, image, wide[..., :8])[3]
    np.testing.assert_array_equal(cut, cut_first)
    assert float(jnp.max(jnp.abs(cut - plain))) > 1e-3


def test_deeplab_plus_shapes_and_paths():
    model = DeepLabV3Plus(TINY_BASIC, ch=16, head_channels=16)
    image = jnp.zeros((1, 40, 48, 3))
    coord = jnp.zeros((1, 20, 24, 8))
    shapes = _shapes(model, image, coord)
    assert shapes["aspp/concurent/0/0/weight"] == (1, 1, 64, 16)
    assert shapes["aspp/concurent/3/0/weight"] == (3, 3, 64, 16)
    assert shapes["aspp/concurent/4/gap/1/weight"] == (1, 1, 64, 16)
    assert shapes["aspp/project/0/weight"] == (1, 1, 80, 16)
    assert shapes["skip_project/skip_project/0/weight"] == (1, 1, 8, 32)
    assert shapes["head/block/0/body/0/weight"] == (3, 3, 1, 48)
    assert shapes["head/block/1/body/2/running_mean"] == (16,)
    assert shapes["head/block/2/bias"] == (16,)
    params = random_params(_param_tree(model, image, coord), 3)
    out = model.apply({"params": params}, image, coord)
    assert out.shape == (1, 10, 12, 16)
    skip, context = model.apply({"params": params}, image, coord, method=DeepLabV3Plus.features)
    assert skip.shape == (1, 10, 12, 32) and context.shape == (1, 5, 6, 16)


def test_sep_conv_head_paths():
    head = SepConvHead(1, in_channels=16, mid_channels=8, num_layers=2)
    shapes = _shapes(head, jnp.zeros((1, 4, 4, 16)))
    assert shapes["layers/0/body/0/weight"] == (3, 3, 1, 16)
    assert shapes["layers/1/body/1/weight"] == (1, 1, 8, 8)
    assert shapes["layers/2/weight"] == (1, 1, 8, 1)
