"""TinyViT (MobileSAM image encoder) in Flax and its strict port; no torch needed.

Numeric parity with MobileSAM's own code is in test_tiny_vit_parity.py.
"""

from __future__ import annotations

import dataclasses
import json
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import traverse_util
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxseg_robust.models.config_json import dataclass_from_dict
from jaxseg_robust.models.sam.config import build_image_encoder
from jaxseg_robust.models.sam.tiny_vit import (
    TinyViTConfig,
    TinyViTEncoder,
    WindowAttention,
    attention_bias_index,
    reference_merge_strides,
    window_merge,
    window_partition,
)
from ports.keytable import PortError, convert
from ports.mobile_sam import (
    convert_tiny_vit,
    prepare_tiny_vit_state_dict,
    tiny_vit_param_shapes,
    tiny_vit_rules,
)

MOBILE_SAM = TinyViTConfig()
# A small configuration with the code paths of MobileSAM's (stage-0 MBConv, padded
# windows, a stride-2 and a stride-1 merge, the neck), for quick tests; stride 8.
SMALL = TinyViTConfig(embed_dims=(4, 8, 12), depths=(1, 1, 1), num_heads=(1, 2, 3),
                      window_sizes=(1, 4, 3), merge_strides=(2, 1), out_chans=8)


# ---------------------------------------------------------------- config --

def test_defaults_are_build_sam_vit_t():
    cfg = MOBILE_SAM
    assert cfg.embed_dims == (64, 128, 160, 320)
    assert cfg.depths == (2, 2, 6, 2)
    assert cfg.num_heads == (2, 4, 5, 10)
    assert cfg.window_sizes == (7, 7, 14, 7)
    assert (cfg.mlp_ratio, cfg.mbconv_expand_ratio, cfg.local_conv_size) == (4.0, 4.0, 3)
    assert (cfg.in_chans, cfg.out_chans) == (3, 256)
    assert cfg.merge_strides == reference_merge_strides(cfg.embed_dims) == (2, 2, 1)
    assert cfg.total_stride == 16


def test_reference_merge_strides_rule():
    # stride 1 exactly when the merge's output width is 320, 448 or 576.
    assert reference_merge_strides((64, 128, 256, 448)) == (2, 2, 1)
    assert reference_merge_strides((96, 192, 384, 576)) == (2, 2, 1)
    assert reference_merge_strides((96, 192, 384, 768)) == (2, 2, 2)
    assert reference_merge_strides((64,)) == ()


@pytest.mark.parametrize("field, value", [
    ("depths", (2, 2, 6)),
    ("num_heads", (2, 4, 5)),
    ("window_sizes", (7, 7, 14)),
    ("merge_strides", (2, 2)),
    ("merge_strides", (2, 3, 1)),
    ("embed_dims", (64, 128, 160, 0)),
    ("embed_dims", (63, 128, 160, 320)),
    ("num_heads", (2, 4, 7, 10)),
    ("window_sizes", (7, 0, 14, 7)),
    ("local_conv_size", 4),
    ("mlp_ratio", 0.0),
])
def test_config_rejects_bad_values_naming_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        dataclasses.replace(MOBILE_SAM, **{field: value})


# ------------------------------------------------- attention bias indices --

@given(st.integers(1, 16))
def test_attention_bias_index_is_the_offset_numbering(window_size):
    idx = attention_bias_index(window_size)
    n = window_size * window_size
    assert idx.shape == (n, n) and idx.dtype == np.int32
    rows, cols = np.divmod(np.arange(n), window_size)
    for q in range(0, n, max(1, n // 7)):
        for k in range(0, n, max(1, n // 5)):
            offset = (abs(rows[q] - rows[k]), abs(cols[q] - cols[k]))
            # the first query meets every offset in row-major order
            assert idx[q, k] == idx[0, offset[0] * window_size + offset[1]]
    np.testing.assert_array_equal(idx[0], np.arange(n))
    np.testing.assert_array_equal(idx, idx.T)
    np.testing.assert_array_equal(np.diag(idx), 0)
    assert len(np.unique(idx)) == n


@pytest.mark.parametrize("bad", [0, -3, 2.5, "7"])
def test_attention_bias_index_rejects_bad_window(bad):
    with pytest.raises(ValueError, match="window_size"):
        attention_bias_index(bad)


# ---------------------------------------------------------------- windows --

@settings(max_examples=15)
@given(batch=st.integers(1, 3), n_rows=st.integers(1, 4), n_cols=st.integers(1, 4),
       window=st.integers(1, 5), channels=st.integers(1, 3))
def test_window_partition_round_trip_and_layout(batch, n_rows, n_cols, window, channels):
    h, w = n_rows * window, n_cols * window
    x = np.arange(batch * h * w * channels, dtype=np.float32).reshape(batch, h, w, channels)
    windows = window_partition(jnp.asarray(x), window)
    assert windows.shape == (batch * n_rows * n_cols, window * window, channels)
    # window (b, r, c) holds rows r*ws.., cols c*ws.. row-major
    b, r, c = batch - 1, n_rows - 1, n_cols // 2
    flat_index = (b * n_rows + r) * n_cols + c
    block = x[b, r * window:(r + 1) * window, c * window:(c + 1) * window]
    np.testing.assert_array_equal(np.asarray(windows[flat_index]), block.reshape(-1, channels))
    np.testing.assert_array_equal(np.asarray(window_merge(windows, window, h, w)), x)


def test_window_partition_rejects_ragged_grid():
    with pytest.raises(ValueError, match="window_size"):
        window_partition(jnp.zeros((1, 7, 8, 2)), 4)


def _numpy_window_attention(params, windows, num_heads, window_size):
    """Oracle: per-head attention written out with explicit loops over heads."""
    x = windows.astype(np.float64)
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    x = (x - mu) / np.sqrt(var + 1e-5) * params["norm"]["scale"] + params["norm"]["bias"]
    qkv = x @ params["qkv"]["kernel"] + params["qkv"]["bias"]
    dim = windows.shape[-1]
    head_dim = dim // num_heads
    idx = attention_bias_index(window_size)
    heads = []
    for h in range(num_heads):
        chunk = qkv[..., h * 3 * head_dim:(h + 1) * 3 * head_dim]
        q, k, v = chunk[..., :head_dim], chunk[..., head_dim:2 * head_dim], chunk[..., 2 * head_dim:]
        logits = q @ np.swapaxes(k, -1, -2) / np.sqrt(head_dim) + params["attention_biases"][h][idx]
        weights = np.exp(logits - logits.max(-1, keepdims=True))
        weights /= weights.sum(-1, keepdims=True)
        heads.append(weights @ v)
    out = np.concatenate(heads, axis=-1)
    return out @ params["proj"]["kernel"] + params["proj"]["bias"]


def test_window_attention_matches_numpy_oracle():
    num_heads, window_size, dim = 3, 4, 12
    module = WindowAttention(num_heads, window_size)
    rng = np.random.default_rng(0)
    windows = rng.standard_normal((5, window_size * window_size, dim)).astype(np.float32)
    shapes = jax.eval_shape(module.init, jax.random.key(1), windows)["params"]
    params = jax.tree.map(lambda a: rng.standard_normal(a.shape).astype(np.float32), shapes)
    got = jax.jit(module.apply)({"params": params}, windows)
    want = _numpy_window_attention(jax.tree.map(np.asarray, params), np.asarray(windows),
                                   num_heads, window_size)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------- forward --

def _random_params(config, seed=0):
    """Random params of sensible scale (BatchNorm variances positive)."""
    rng = np.random.default_rng(seed)
    flat = traverse_util.flatten_dict(tiny_vit_param_shapes(config), sep="/")
    out = {}
    for path, shape_dtype in flat.items():
        shape = shape_dtype.shape
        if path.endswith("bn/var"):
            out[path] = rng.uniform(0.5, 1.5, shape)
        elif path.endswith("scale"):
            out[path] = 1.0 + 0.2 * rng.standard_normal(shape)
        elif path.endswith("kernel"):
            fan_in = int(np.prod(shape[:-1]))
            out[path] = rng.standard_normal(shape) / np.sqrt(fan_in)
        elif path.endswith("attention_biases"):
            out[path] = rng.standard_normal(shape)
        else:
            out[path] = 0.1 * rng.standard_normal(shape)
        out[path] = out[path].astype(np.float32)
    return traverse_util.unflatten_dict(out, sep="/")


def _normal_images(shape, seed):
    """Standard-normal stand-in for SAM-normalised images (float32 numpy)."""
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


@pytest.fixture(scope="module")
def mobile_sam_params():
    return _random_params(MOBILE_SAM)


@pytest.fixture(scope="module")
def small_params():
    return _random_params(SMALL, seed=1)


# One jitted apply per configuration, shared by the tests (compiles once per input shape).
_apply_small = jax.jit(TinyViTEncoder(SMALL).apply)


def test_init_declares_float32_params_in_the_documented_layout():
    variables = jax.eval_shape(TinyViTEncoder(SMALL).init, jax.random.key(0),
                               jnp.zeros((1, 32, 32, 3)))
    assert set(variables) == {"params"}
    assert set(variables["params"]) == {"patch_embed", "layers_0", "layers_1", "layers_2", "neck"}
    assert set(variables["params"]["layers_1"]) == {"blocks_0", "downsample"}
    assert set(variables["params"]["layers_2"]) == {"blocks_0"}
    assert all(a.dtype == jnp.float32 for a in jax.tree.leaves(variables))
    bn = variables["params"]["layers_1"]["blocks_0"]["local_conv"]["bn"]
    assert {k: v.shape for k, v in bn.items()} == {k: (8,) for k in ("scale", "bias", "mean", "var")}
    assert variables["params"]["layers_2"]["blocks_0"]["attn"]["attention_biases"].shape == (3, 9)


def test_mobile_sam_config_runs_under_jit(mobile_sam_params):
    # MobileSAM's config at 256x256: same code path as at 1024x1024 (the
    # window attention of every stage pads, the last merge has stride 1).
    images = _normal_images((2, 256, 256, 3), seed=0)
    out = jax.jit(TinyViTEncoder(MOBILE_SAM).apply)({"params": mobile_sam_params}, images)
    assert out.shape == (2, 16, 16, 256) and out.dtype == jnp.float32
    assert np.isfinite(np.asarray(out)).all()
    # the neck ends in a LayerNorm over channels: unit-ish spread per position
    assert 0.3 < float(np.std(np.asarray(out))) < 3.0
    assert not np.allclose(np.asarray(out[0]), np.asarray(out[1]))


def test_batch_matches_vmap_over_single_images(small_params):
    images = _normal_images((3, 64, 64, 3), seed=1)
    batched = _apply_small({"params": small_params}, images)
    single = jax.jit(jax.vmap(lambda im: TinyViTEncoder(SMALL).apply(
        {"params": small_params}, im[None])[0]))(images)
    np.testing.assert_allclose(np.asarray(single), np.asarray(batched), rtol=1e-5, atol=1e-5)


def test_gradient_reaches_every_input_region(small_params):
    encoder = TinyViTEncoder(SMALL)
    images = _normal_images((1, 48, 80, 3), seed=3)  # -> 6x10 tokens of 8x8 pixels

    def loss(x):
        return jnp.sum(encoder.apply({"params": small_params}, x) ** 2)

    grad = jax.jit(jax.grad(loss))(images)
    assert grad.shape == images.shape
    assert np.isfinite(np.asarray(grad)).all()
    # every 8x8 cell of the input (one output token each) gets gradient
    cells = np.abs(np.asarray(grad)).reshape(1, 6, 8, 10, 8, 3).sum(axis=(0, 2, 4, 5))
    assert (cells > 0).all()


def test_bfloat16_compute_is_close_to_float32(small_params):
    images = _normal_images((3, 64, 64, 3), seed=1)
    ref = _apply_small({"params": small_params}, images)
    low = jax.jit(TinyViTEncoder(SMALL, dtype=jnp.bfloat16).apply)({"params": small_params}, images)
    assert low.dtype == jnp.float32
    # bf16 keeps ~3 significant digits. Measured here: mean |err| 0.009 for an
    # output std of ~1, max |err| 6% of max |out| (narrow 8-channel LayerNorms
    # amplify it; MobileSAM at 1024x1024 gives 1.3%).
    low, ref = np.asarray(low), np.asarray(ref)
    assert np.abs(low - ref).mean() < 0.03 * ref.std()
    assert np.abs(low - ref).max() < 0.2 * np.abs(ref).max()


def test_integer_compute_dtype_is_rejected(small_params):
    with pytest.raises(ValueError, match="dtype"):
        jax.eval_shape(TinyViTEncoder(SMALL, dtype=jnp.int32).apply, {"params": small_params},
                       jnp.zeros((1, 64, 64, 3)))


def test_registered_as_sam_image_encoder_kind():
    encoder = build_image_encoder("tiny_vit", MOBILE_SAM, jnp.bfloat16)
    assert isinstance(encoder, TinyViTEncoder)
    assert encoder.config == MOBILE_SAM and encoder.dtype == jnp.bfloat16
    # the config survives the JSON round trip of converted-model directories
    data = json.loads(json.dumps(dataclasses.asdict(MOBILE_SAM)))
    assert dataclass_from_dict(TinyViTConfig, data, what="test") == MOBILE_SAM


@pytest.mark.parametrize("shape", [(1, 64, 64, 4), (64, 64, 3), (1, 68, 64, 3), (1, 64, 36, 3)])
def test_bad_image_shape_is_rejected(small_params, shape):
    with pytest.raises(ValueError, match="images"):
        jax.eval_shape(TinyViTEncoder(SMALL).apply, {"params": small_params}, jnp.zeros(shape))


@pytest.mark.slow
def test_mobile_sam_full_size_init_and_forward(mobile_sam_params):
    encoder = TinyViTEncoder(MOBILE_SAM)
    images = _normal_images((1, 1024, 1024, 3), seed=0)
    variables = jax.jit(encoder.init)(jax.random.key(0), images)
    assert jax.tree.map(lambda a: a.shape, variables["params"]) == \
        jax.tree.map(lambda a: a.shape, mobile_sam_params)
    apply = jax.jit(encoder.apply)
    for params in (variables["params"], mobile_sam_params):
        out = apply({"params": params}, images)
        assert out.shape == (1, 64, 64, 256) and out.dtype == jnp.float32
        assert np.isfinite(np.asarray(out)).all()


# ------------------------------------------------------------------- port --

def _torch_key(flax_path: str) -> str:
    """Hand-written inverse of the key table: Flax path -> MobileSAM state-dict key."""
    key = flax_path
    key = re.sub(r"^patch_embed/conv_(\d)", lambda m: f"patch_embed/seq/{2 * int(m.group(1))}", key)
    key = re.sub(r"^neck/conv_(\d)", lambda m: f"neck/{2 * int(m.group(1))}", key)
    key = re.sub(r"^neck/norm_(\d)", lambda m: f"neck/{2 * int(m.group(1)) + 1}", key)
    key = re.sub(r"(layers|blocks)_(\d+)", r"\1/\2", key)
    key = key.replace("conv/kernel", "c/weight").replace("bn/mean", "bn/running_mean")
    key = key.replace("bn/var", "bn/running_var").replace("/scale", "/weight")
    key = key.replace("/kernel", "/weight")
    return key.replace("/", ".")


def _to_torch_layout(flax_path: str, value: np.ndarray) -> np.ndarray:
    if flax_path.endswith("kernel") and value.ndim == 4:
        return np.transpose(value, (3, 2, 0, 1))
    if flax_path.endswith("kernel") and value.ndim == 2:
        return value.T
    return value


def _mobile_sam_state_dict(params, prefix="image_encoder.", config=MOBILE_SAM):
    """A MobileSAM-like state dict (torch layout, counters and classifier head included)."""
    state = {}
    for path, value in traverse_util.flatten_dict(params, sep="/").items():
        state[prefix + _torch_key(path)] = np.ascontiguousarray(_to_torch_layout(path, np.asarray(value)))
        if path.endswith("bn/var"):
            state[prefix + _torch_key(path).replace("running_var", "num_batches_tracked")] = \
                np.array(0, np.int64)
    state[prefix + "norm_head.weight"] = np.ones(config.embed_dims[-1], np.float32)
    state[prefix + "norm_head.bias"] = np.zeros(config.embed_dims[-1], np.float32)
    state[prefix + "head.weight"] = np.zeros((1000, config.embed_dims[-1]), np.float32)
    state[prefix + "head.bias"] = np.zeros(1000, np.float32)
    return state


@pytest.fixture(scope="module")
def state_dict(mobile_sam_params):
    return _mobile_sam_state_dict(mobile_sam_params)


def test_synthetic_state_dict_has_mobile_sam_keys(state_dict):
    # MobileSAM's TinyViT state_dict has 302 entries (271 params/statistics,
    # 27 BatchNorm counters, 4 classifier-head tensors).
    assert len(state_dict) == 302
    for key in ("image_encoder.patch_embed.seq.2.bn.running_var",
                "image_encoder.layers.0.downsample.conv2.c.weight",
                "image_encoder.layers.2.blocks.5.attn.attention_biases",
                "image_encoder.layers.3.blocks.1.local_conv.bn.num_batches_tracked",
                "image_encoder.layers.1.blocks.0.mlp.fc2.weight",
                "image_encoder.neck.3.bias"):
        assert key in state_dict
    assert state_dict["image_encoder.layers.2.blocks.0.attn.attention_biases"].shape == (5, 196)
    assert state_dict["image_encoder.layers.1.downsample.conv2.c.weight"].shape == (160, 1, 3, 3)


def test_round_trip_is_exact(state_dict, mobile_sam_params):
    params = convert_tiny_vit(state_dict)
    jax.tree.map(np.testing.assert_array_equal, params, mobile_sam_params)


def test_rules_with_model_prefix(state_dict, mobile_sam_params):
    kept = prepare_tiny_vit_state_dict(state_dict)
    tree = convert(kept, tiny_vit_rules(), {"image_encoder": tiny_vit_param_shapes()})
    assert set(tree) == {"image_encoder"}
    jax.tree.map(np.testing.assert_array_equal, tree["image_encoder"], mobile_sam_params)


def test_bare_encoder_prefix(mobile_sam_params):
    params = convert_tiny_vit(_mobile_sam_state_dict(mobile_sam_params, prefix=""), torch_prefix="")
    jax.tree.map(np.testing.assert_array_equal, params, mobile_sam_params)


def test_prepare_removes_only_the_named_non_parameters(state_dict):
    kept = prepare_tiny_vit_state_dict({**state_dict, "prompt_encoder.pe.weight": np.zeros(3)})
    removed = set(state_dict) - set(kept)
    assert len(removed) == 31
    assert all(k.endswith("num_batches_tracked") or ".head." in k or "norm_head" in k
               for k in removed)
    assert "prompt_encoder.pe.weight" in kept  # other families are left to their own port


QKV = "image_encoder.layers.1.blocks.0.attn.qkv.weight"


def test_missing_key_names_the_parameter(state_dict):
    broken = dict(state_dict)
    del broken[QKV]
    with pytest.raises(PortError, match="layers_1/blocks_0/attn/qkv/kernel"):
        convert_tiny_vit(broken)


@pytest.mark.parametrize("extra", ["image_encoder.layers.1.blocks.0.attn.extra",
                                   "image_encoder.layers.0.blocks.0.attn.qkv.weight",
                                   "image_encoder.layers.2.blocks.6.mlp.fc1.bias",
                                   "image_encoder.layers.1.blocks.0.attn.ab",
                                   "prompt_encoder.pe_layer.positional_encoding_gaussian_matrix"])
def test_extra_key_is_named(state_dict, extra):
    with pytest.raises(PortError, match=re.escape(extra)):
        convert_tiny_vit({**state_dict, extra: np.zeros(4, np.float32)})


def test_mis_shaped_key_is_named(state_dict):
    broken = {**state_dict, QKV: np.zeros((384, 129), np.float32)}
    with pytest.raises(PortError, match=re.escape(QKV)):
        convert_tiny_vit(broken)


@pytest.mark.parametrize("key", [QKV, "image_encoder.layers.2.blocks.3.attn.attention_biases",
                                 "image_encoder.patch_embed.seq.0.bn.running_mean"])
def test_non_float_key_is_named(state_dict, key):
    broken = {**state_dict, key: state_dict[key].astype(np.int64)}
    with pytest.raises(PortError, match=re.escape(key)):
        convert_tiny_vit(broken)


def test_float_batch_norm_counter_is_rejected(state_dict):
    key = "image_encoder.layers.0.blocks.1.conv2.bn.num_batches_tracked"
    with pytest.raises(PortError, match=re.escape(key)):
        convert_tiny_vit({**state_dict, key: np.array(3.0, np.float32)})


def test_batch_norm_counter_without_its_batch_norm_is_rejected(state_dict):
    key = "image_encoder.layers.0.blocks.2.conv1.bn.num_batches_tracked"  # no block 2
    with pytest.raises(PortError, match=re.escape(key)):
        convert_tiny_vit({**state_dict, key: np.array(0, np.int64)})


def test_negative_running_variance_is_rejected(state_dict):
    key = "image_encoder.layers.3.blocks.0.local_conv.bn.running_var"
    value = state_dict[key].copy()
    value[7] = -0.5
    with pytest.raises(PortError, match=re.escape(key)):
        convert_tiny_vit({**state_dict, key: value})


def test_attention_bias_index_buffer_is_verified(state_dict, mobile_sam_params):
    with_index = dict(state_dict)
    for stage, depth in enumerate(MOBILE_SAM.depths):
        for block in range(depth if stage else 0):
            key = f"image_encoder.layers.{stage}.blocks.{block}.attn.attention_bias_idxs"
            with_index[key] = attention_bias_index(MOBILE_SAM.window_sizes[stage]).astype(np.int64)
    params = convert_tiny_vit(with_index)
    jax.tree.map(np.testing.assert_array_equal, params, mobile_sam_params)

    key = "image_encoder.layers.2.blocks.4.attn.attention_bias_idxs"
    wrong = with_index[key].copy()
    wrong[3, 5] += 1
    with pytest.raises(PortError, match=re.escape(key)):
        convert_tiny_vit({**with_index, key: wrong})
    with pytest.raises(PortError, match=re.escape(key)):  # table of another window size
        convert_tiny_vit({**with_index, key: attention_bias_index(7).astype(np.int64)})
    with pytest.raises(PortError, match=re.escape(key)):
        convert_tiny_vit({**with_index, key: with_index[key].astype(np.float32)})
    for absent in ("image_encoder.layers.0.blocks.0.attn.attention_bias_idxs",
                   "image_encoder.layers.3.blocks.2.attn.attention_bias_idxs",
                   "image_encoder.layers.4.blocks.0.attn.attention_bias_idxs"):
        with pytest.raises(PortError, match=re.escape(absent)):
            convert_tiny_vit({**with_index, absent: attention_bias_index(7).astype(np.int64)})
