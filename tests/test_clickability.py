"""Clickability model: shapes, jit, NMF, resizes, letterbox, min-max, port strictness.

Training tests are in test_clickability_train.py; parity against mmseg in
test_clickability_parity.py. Random keys use the 'rbg' implementation: on this
project's CPUs XLA needs seconds to compile each threefry call, which would
dominate the compile time of a model init.
"""

from __future__ import annotations

import re

import cv2
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import traverse_util
from hypothesis import given, strategies as st

from jaxseg_robust.models.clickability import (
    SEGNEXT_B, ClickabilityConfig, ClickabilityNet, benchmark_map, letterbox, letterbox_geometry,
    load_converted, metric_map, minmax_per_sample, normalize_image, prepare_inputs, resize_linear,
    unletterbox)
from jaxseg_robust.models.clickability.ham_head import nmf_bases_init, nmf_reconstruct
from jaxseg_robust.models.clickability.layers import BatchNorm2d
from jaxseg_robust.models.clickability.resize import align_corners_taps, upsample_align_corners
from jaxseg_robust.models import store
from ports.clickability import BASES_KEY, convert_clickability, prepare_state_dict
from ports.keytable import PortError

TINY = ClickabilityConfig(embed_dims=(8, 16, 16, 32), depths=(1, 1, 1, 1),
                          mlp_ratios=(2, 2, 2, 2), head_channels=16, ham_channels=16,
                          gn_groups=4, nmf_rank=4, input_size=64, variant="tiny")


def rbg_key(seed: int) -> jax.Array:
    return jax.random.key(seed, impl="rbg")


@pytest.fixture(scope="module")
def tiny():
    """Tiny network with random variables from a synthetic official state dict (cheaper
    than compiling ``init``; ``init_variables`` is exercised by the training tests)."""
    net = ClickabilityNet(TINY)
    variables = convert_clickability(synthetic_state_dict(TINY, scale=0.3), TINY)
    traces = []

    def forward(v, x, a):
        traces.append(1)
        return net.apply(v, x, a)

    return net, variables, jax.jit(forward), traces


def tiny_inputs(batch: int, seed: int = 1):
    s = TINY.input_size
    k1, k2 = jax.random.split(rbg_key(seed))
    image = jax.random.normal(k1, (batch, s, s, 3))
    aux = (jax.random.uniform(k2, (batch, s, s, 2)) > 0.5).astype(jnp.float32)
    return image, aux


# ---- the network --------------------------------------------------------------------

def test_released_variable_counts_match_the_spec():
    shapes = ClickabilityNet(SEGNEXT_B).variable_shapes()
    flat = {c: traverse_util.flatten_dict(shapes[c], sep="/") for c in shapes}
    assert len(flat["params"]) == 720
    size = {k: int(np.prod(v.shape)) for k, v in flat["params"].items()}
    assert sum(size.values()) == 27_604_290
    assert sum(v for k, v in size.items() if k.startswith("backbone/")) == 26_277_824
    assert sum(v for k, v in size.items() if k.startswith("decode_head/")) == 1_314_817
    assert sum(v for k, v in size.items() if k.startswith("maps_transform/")) == 11_649
    assert len(flat["batch_stats"]) == 2 * 47
    assert flat["buffers"]["decode_head/hamburger/ham/bases"].shape == (1, 512, 16)


def test_config_round_trip_and_validation():
    assert ClickabilityConfig.from_dict(TINY.to_dict()) == TINY
    with pytest.raises(ValueError, match="input_size"):
        ClickabilityConfig(input_size=100)
    with pytest.raises(ValueError, match="gn_groups"):
        ClickabilityConfig(head_channels=48)
    with pytest.raises(ValueError, match="unknown"):
        ClickabilityConfig.from_dict({"nope": 1})


def test_forward_shapes_range_batch_independence_and_single_trace(tiny):
    _, variables, apply, traces = tiny
    image, aux = tiny_inputs(2)
    out = apply(variables, image, aux)
    other = apply(variables, image.at[1].set(image[0] + 1.0), aux.at[1].set(aux[1, ::-1]))
    assert len(traces) == 1
    s = TINY.input_size
    assert out.raw.shape == (2, s // 4, s // 4)
    assert out.normalized.shape == (2, s, s)
    for o in (out, other):
        m = np.asarray(o.normalized)
        assert np.isfinite(m).all()
        np.testing.assert_allclose(m.min(axis=(1, 2)), 0.0, atol=1e-6)
        np.testing.assert_allclose(m.max(axis=(1, 2)), 1.0, atol=1e-6)
    # Eval mode: a sample's output does not depend on the rest of the batch.
    np.testing.assert_array_equal(out.raw[0], other.raw[0])
    assert np.abs(np.asarray(out.raw[1] - other.raw[1])).max() > 0


def test_inference_wrappers(tiny):
    net, variables, _, _ = tiny
    image, aux = tiny_inputs(2)
    hw = (30, 50)                                   # pasted at rows [13, 51) of the 64 canvas
    bench, metric = jax.jit(lambda v, x, a: (benchmark_map(net, v, x, a, hw),
                                             metric_map(net, v, x, a, hw)))(variables, image, aux)
    assert bench.shape == metric.shape == (2, 30, 50)
    np.testing.assert_allclose(metric.min(axis=(1, 2)), 0.0, atol=1e-6)
    np.testing.assert_allclose(metric.max(axis=(1, 2)), 1.0, atol=1e-6)
    assert float(bench.max()) <= 1.0 and float(bench.min()) >= 0.0
    # The wrappers differ only in the canvas eps and the second min-max over the crop.
    np.testing.assert_allclose(metric, minmax_per_sample(bench, 0.0), atol=1e-5)


def test_bad_input_shapes_raise(tiny):
    net, variables, _, _ = tiny
    image, aux = tiny_inputs(1)
    with pytest.raises(ValueError, match="image"):
        net.apply(variables, image[:, :32], aux)
    with pytest.raises(ValueError, match="aux"):
        net.apply(variables, image, aux[..., :1])


def test_mask_encoder_uses_the_absolute_scale(tiny):
    _, variables, apply, _ = tiny
    image, aux = tiny_inputs(2)
    flipped = jax.tree.map(lambda x: x, variables)
    flipped["params"]["maps_transform"]["scale"] = -variables["params"]["maps_transform"]["scale"]
    np.testing.assert_allclose(apply(flipped, image, aux).raw, apply(variables, image, aux).raw,
                               rtol=1e-6, atol=1e-6)


def test_batchnorm_train_mode_follows_torch_statistics():
    bn = BatchNorm2d()
    x = jax.random.normal(rbg_key(3), (2, 5, 3, 4)) * 3.0 + 1.0
    variables = bn.init({"params": rbg_key(0)}, x, False)
    y, mutated = bn.apply(variables, x, True, mutable=["batch_stats"])
    xs = np.asarray(x, np.float64).reshape(-1, 4)
    mean, var = xs.mean(0), xs.var(0)
    np.testing.assert_allclose(np.asarray(y).reshape(-1, 4), (xs - mean) / np.sqrt(var + 1e-5),
                               rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(mutated["batch_stats"]["mean"], 0.1 * mean, rtol=1e-5)
    np.testing.assert_allclose(mutated["batch_stats"]["var"], 0.9 + 0.1 * xs.var(0, ddof=1),
                               rtol=1e-5)


# ---- NMF --------------------------------------------------------------------------------

def nmf_numpy(x_dn: np.ndarray, bases: np.ndarray, steps: int) -> np.ndarray:
    """Spec §3.4 re-stated in float64 on one sample: X [D, N], bases [D, R] -> [D, N]."""
    logits = x_dn.T @ bases
    coef = np.exp(logits - logits.max(1, keepdims=True))
    coef /= coef.sum(1, keepdims=True)
    for _ in range(steps):
        coef = coef * (x_dn.T @ bases) / (coef @ (bases.T @ bases) + 1e-6)
        bases = bases * (x_dn @ coef) / (bases @ (coef.T @ coef) + 1e-6)
    coef = coef * (x_dn.T @ bases) / (coef @ (bases.T @ bases) + 1e-6)
    return bases @ coef.T


@pytest.mark.parametrize("steps", [6, 7])
def test_nmf_matches_numpy_restatement_under_jit_and_vmap(steps):
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 2, (3, 50, 12)).astype(np.float32)          # [B, N, D]
    bases = np.asarray(nmf_bases_init(rbg_key(1), 12, 4))            # [1, D, R]
    batched = jnp.broadcast_to(bases, (3, 12, 4))
    got = jax.jit(nmf_reconstruct, static_argnums=2)(x, batched, steps)
    got_vmap = jax.vmap(lambda xi, bi: nmf_reconstruct(xi[None], bi[None], steps)[0])(x, batched)
    for b in range(3):
        want = nmf_numpy(x[b].T.astype(np.float64), bases[0].astype(np.float64), steps).T
        np.testing.assert_allclose(got[b], want, rtol=2e-4, atol=2e-5)
        np.testing.assert_allclose(got_vmap[b], want, rtol=2e-4, atol=2e-5)


def test_nmf_gradient_flows_through_the_iterations():
    x = jax.random.uniform(rbg_key(2), (1, 30, 8))
    bases = nmf_bases_init(rbg_key(1), 8, 3)
    grad = jax.grad(lambda v: jnp.sum(nmf_reconstruct(v, bases, 6) ** 2))(x)
    assert np.isfinite(grad).all() and np.abs(grad).max() > 0


def test_nmf_bases_init_is_non_negative_with_unit_columns():
    bases = np.asarray(nmf_bases_init(rbg_key(4), 64, 16))
    assert bases.shape == (1, 64, 16) and (bases >= 0).all()
    np.testing.assert_allclose(np.linalg.norm(bases, axis=1), 1.0, rtol=1e-6)


# ---- resizes ------------------------------------------------------------------------------

@given(st.integers(1, 40), st.integers(2, 90))
def test_align_corners_taps_keep_corners_and_linear_ramps(n_in, n_out):
    index, weight = align_corners_taps(n_in, n_out)
    ramp = np.arange(n_in, dtype=np.float32) * 0.5 + 3.0
    out = (ramp[index] * weight).sum(1)
    positions = np.arange(n_out) * ((n_in - 1) / (n_out - 1))
    np.testing.assert_allclose(out, positions * 0.5 + 3.0, rtol=1e-5, atol=1e-5)
    assert out[0] == ramp[0]
    np.testing.assert_allclose(out[-1], ramp[-1], rtol=1e-6)


def test_upsample_align_corners_under_jit_vmap_and_grad():
    x = jax.random.normal(rbg_key(5), (2, 3, 7, 5))
    f = jax.jit(lambda v: upsample_align_corners(v, (13, 9)))
    y = f(x)
    y_vmap = jax.vmap(lambda v: upsample_align_corners(v, (13, 9)))(x)
    np.testing.assert_allclose(y, y_vmap, rtol=1e-6)
    np.testing.assert_allclose(y[..., 0, 0], x[..., 0, 0], rtol=1e-6)
    np.testing.assert_allclose(y[..., -1, -1], x[..., -1, -1], rtol=1e-6)
    g = jax.grad(lambda v: jnp.sum(upsample_align_corners(v, (13, 9))))(x)
    np.testing.assert_allclose(jnp.sum(g), 2 * 3 * 13 * 9, rtol=1e-5)


@given(st.integers(1, 60), st.integers(1, 60), st.integers(1, 70), st.integers(1, 70),
       st.sampled_from([0, 1, 3]), st.integers(0, 2**31 - 1))
def test_resize_linear_matches_opencv(h, w, out_h, out_w, channels, seed):
    rng = np.random.default_rng(seed)
    shape = (h, w) if channels == 0 else (h, w, channels)
    a = rng.normal(size=shape).astype(np.float32)
    want = cv2.resize(a, (out_w, out_h), interpolation=cv2.INTER_LINEAR)
    got = resize_linear(a, out_h, out_w)
    # float32 rounding order differs; one-row/one-column inputs differ most (~1e-5).
    np.testing.assert_allclose(got.reshape(want.shape), want, rtol=1e-5, atol=1.5e-5)


# ---- letterbox --------------------------------------------------------------------------

@pytest.mark.parametrize("hw, resized, start", [
    ((480, 640), (312, 416), (52, 0)), ((321, 481), (277, 416), (69, 0)),
    ((480, 854), (233, 416), (91, 0)), ((1365, 2048), (277, 416), (69, 0)),
    ((500, 300), (416, 249), (0, 83)), ((416, 416), (416, 416), (0, 0))])
def test_letterbox_geometry_spec_examples(hw, resized, start):
    g = letterbox_geometry(*hw)
    assert (g.resized_h, g.resized_w) == resized
    assert (g.top, g.left) == start


def reference_padding(img: np.ndarray, size: int = 416) -> np.ndarray:
    """Spec §3.6 re-stated with OpenCV (the reference letterbox)."""
    h, w = img.shape[:2]
    out = np.zeros((size, size) + img.shape[2:], img.dtype)
    if h / size > w / size:
        nw = (w * size) // h
        left = (size - nw) // 2
        out[:, left:left + nw] = cv2.resize(img, (nw, size))
    else:
        nh = (h * size) // w
        top = (size - nh) // 2
        out[top:top + nh] = cv2.resize(img, (size, nh))
    return out


@given(st.integers(1, 120), st.integers(1, 120), st.integers(0, 2**31 - 1))
def test_letterbox_matches_opencv_restatement(h, w, seed):
    size = 64
    if min(h * size // w, w * size // h) == 0:
        with pytest.raises(ValueError, match="elongated"):
            letterbox_geometry(h, w, size)
        return
    rng = np.random.default_rng(seed)
    img = rng.uniform(0, 1, (h, w, 3)).astype(np.float32)
    mask = (rng.uniform(size=(h, w)) > 0.5).astype(np.float32)
    np.testing.assert_allclose(letterbox(img, size), reference_padding(img, size), atol=2e-6)
    np.testing.assert_allclose(letterbox(mask, size), reference_padding(mask, size), atol=2e-6)


@pytest.mark.parametrize("h, w", [(3, 80), (37, 64), (64, 41), (5, 7), (1, 1)])
def test_letterbox_round_trip(h, w):
    size = 64
    g = letterbox_geometry(h, w, size)
    # A canvas-sized map holding a constant inside the pasted region comes back constant.
    canvas = np.zeros((size, size), np.float32)
    canvas[g.top:g.top + g.resized_h, g.left:g.left + g.resized_w] = 0.7
    back = np.asarray(unletterbox(jnp.asarray(canvas)[None], (h, w)))
    assert back.shape == (1, h, w)
    np.testing.assert_allclose(back, 0.7, rtol=1e-6)
    # And a letterboxed smooth image comes back close to itself (3 -> 2 -> 3 rows for the
    # thin one, hence the loose bound there).
    yy, xx = np.mgrid[:h, :w].astype(np.float32)
    smooth = np.sin(yy / 20.0) + np.cos(xx / 20.0)
    again = np.asarray(unletterbox(jnp.asarray(letterbox(smooth, size))[None], (h, w)))[0]
    np.testing.assert_allclose(again, smooth, atol=0.05)


def test_letterbox_round_trip_is_exact_without_rescaling():
    rng = np.random.default_rng(0)
    img = rng.normal(size=(40, 64)).astype(np.float32)   # fills the width of a 64 canvas
    canvas = letterbox(img, 64)
    np.testing.assert_array_equal(canvas[12:52], img)
    np.testing.assert_array_equal(canvas[:12], 0)
    back = unletterbox(jnp.asarray(canvas)[None, None], (40, 64))
    np.testing.assert_allclose(back[0, 0], img, rtol=0, atol=0)


def test_prepare_inputs_normalises_then_letterboxes():
    rng = np.random.default_rng(1)
    image = rng.integers(0, 256, (30, 50, 3)).astype(np.uint8)
    gt = np.zeros((30, 50), bool)
    gt[5:20, 10:40] = True
    x, aux = prepare_inputs(image, gt, gt & (np.arange(50) < 25), size=64)
    assert x.shape == (64, 64, 3) and aux.shape == (64, 64, 2)
    mean = np.array([0.485, 0.456, 0.406]) / np.array([0.229, 0.224, 0.225])
    np.testing.assert_allclose(x[0, 0], 0.0)                  # fill is 0 after normalisation
    np.testing.assert_allclose(x[32, 32], letterbox(normalize_image(image), 64)[32, 32])
    assert np.all(np.abs(normalize_image(np.zeros((1, 1, 3))) + mean) < 1e-6)
    assert aux[..., 1].sum() < aux[..., 0].sum()
    with pytest.raises(ValueError, match="gt_mask"):
        prepare_inputs(image, gt[:10], gt, size=64)


_minmax_jit = jax.jit(minmax_per_sample)


@given(st.integers(0, 2**31 - 1), st.floats(0.0, 1e-3))
def test_minmax_per_sample(seed, eps):
    x = np.random.default_rng(seed).normal(size=(3, 5, 4)).astype(np.float32)
    x[1] = 2.0 * x[1] + 10.0
    y = np.asarray(_minmax_jit(jnp.asarray(x), eps))
    y_vmap = np.asarray(jax.vmap(lambda v: minmax_per_sample(v[None], eps)[0])(jnp.asarray(x)))
    np.testing.assert_allclose(y, y_vmap, rtol=1e-6)
    for b in range(3):
        r = x[b].max() - x[b].min()
        np.testing.assert_allclose(y[b], (x[b] - x[b].min()) / (r + eps), rtol=1e-5, atol=1e-6)


# ---- port ---------------------------------------------------------------------------------

def official_layout(config: ClickabilityConfig) -> dict[str, tuple[int, ...]]:
    """Key -> torch shape of the official state dict, written from spec §3.8."""
    shapes: dict[str, tuple[int, ...]] = {}
    e, h = "encoder_decoder.backbone.", "encoder_decoder.decode_head.0."

    def bn(prefix, c):
        for s in ("weight", "bias", "running_mean", "running_var"):
            shapes[f"{prefix}.{s}"] = (c,)
        shapes[f"{prefix}.num_batches_tracked"] = ()

    def conv(prefix, o, i, kh, kw, bias=True):
        shapes[f"{prefix}.weight"] = (o, i, kh, kw)
        if bias:
            shapes[f"{prefix}.bias"] = (o,)

    dims = config.embed_dims
    conv(e + "patch_embed1.proj.0", dims[0] // 2, 3, 3, 3)
    bn(e + "patch_embed1.proj.1", dims[0] // 2)
    conv(e + "patch_embed1.proj.3", dims[0], dims[0] // 2, 3, 3)
    bn(e + "patch_embed1.proj.4", dims[0])
    for s in range(4):
        c, rc = dims[s], int(dims[s] * config.mlp_ratios[s])
        if s:
            conv(f"{e}patch_embed{s + 1}.proj", c, dims[s - 1], 3, 3)
            bn(f"{e}patch_embed{s + 1}.norm", c)
        for j in range(config.depths[s]):
            p = f"{e}block{s + 1}.{j}."
            shapes[p + "layer_scale_1"] = shapes[p + "layer_scale_2"] = (c,)
            bn(p + "norm1", c)
            bn(p + "norm2", c)
            conv(p + "attn.proj_1", c, c, 1, 1)
            conv(p + "attn.proj_2", c, c, 1, 1)
            g = p + "attn.spatial_gating_unit."
            conv(g + "conv0", c, 1, 5, 5)
            for i, k in enumerate((7, 11, 21)):
                conv(f"{g}conv{i}_1", c, 1, 1, k)
                conv(f"{g}conv{i}_2", c, 1, k, 1)
            conv(g + "conv3", c, c, 1, 1)
            conv(p + "mlp.fc1", rc, c, 1, 1)
            conv(p + "mlp.dwconv", rc, 1, 3, 3)
            conv(p + "mlp.fc2", c, rc, 1, 1)
        shapes[f"{e}norm{s + 1}.weight"] = shapes[f"{e}norm{s + 1}.bias"] = (c,)
    hc, ham = config.head_channels, config.ham_channels
    conv(h + "conv_seg", config.num_classes, hc, 1, 1)
    conv(h + "squeeze.conv", ham, sum(dims), 1, 1, bias=False)
    shapes[h + "squeeze.gn.weight"] = shapes[h + "squeeze.gn.bias"] = (ham,)
    conv(h + "hamburger.ham_in.conv", ham, ham, 1, 1)
    shapes[h + "hamburger.ham.bases"] = (1, ham, config.nmf_rank)
    conv(h + "hamburger.ham_out.conv", ham, ham, 1, 1, bias=False)
    shapes[h + "hamburger.ham_out.gn.weight"] = shapes[h + "hamburger.ham_out.gn.bias"] = (ham,)
    conv(h + "align.conv", hc, ham, 1, 1, bias=False)
    shapes[h + "align.gn.weight"] = shapes[h + "align.gn.bias"] = (hc,)
    conv("maps_transform.0", config.mask_hidden, config.aux_channels, 1, 1)
    conv("maps_transform.2", config.mask_hidden, config.mask_hidden, 3, 3)
    conv("maps_transform.4", dims[0], config.mask_hidden, 3, 3)
    shapes["maps_transform.5.scale"] = (1,)
    return shapes


def synthetic_state_dict(config: ClickabilityConfig, seed: int = 0,
                         scale: float = 1.0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for key, shape in official_layout(config).items():
        if key.endswith("num_batches_tracked"):
            out[key] = np.array(7, np.int64)
        elif key.endswith("running_var") or key == BASES_KEY:
            out[key] = rng.uniform(0.5, 1.5, shape).astype(np.float32)
        else:
            out[key] = (scale * rng.normal(size=shape)).astype(np.float32)
    return out


def test_released_layout_has_862_keys_and_converts_completely():
    layout = official_layout(SEGNEXT_B)
    assert len(layout) == 862
    assert sum(k.endswith("num_batches_tracked") for k in layout) == 47
    # Zero-stride arrays: the full-size conversion without allocating the inputs.
    sd = {k: np.array(3, np.int64) if k.endswith("num_batches_tracked")
          else np.broadcast_to(np.float32(0.5), s) for k, s in layout.items()}
    variables = convert_clickability(sd, SEGNEXT_B)
    counts = {c: len(traverse_util.flatten_dict(variables[c])) for c in variables}
    assert counts == {"params": 720, "batch_stats": 94, "buffers": 1}


def test_port_places_and_transposes_tensors():
    sd = synthetic_state_dict(TINY)
    v = convert_clickability(sd, TINY)
    e = "encoder_decoder.backbone."
    np.testing.assert_array_equal(
        v["params"]["backbone"]["block3_0"]["attn"]["spatial_gating_unit"]["conv2_1"]["kernel"],
        np.transpose(sd[e + "block3.0.attn.spatial_gating_unit.conv2_1.weight"], (2, 3, 1, 0)))
    np.testing.assert_array_equal(v["batch_stats"]["backbone"]["patch_embed1"]["proj_4"]["var"],
                                  sd[e + "patch_embed1.proj.4.running_var"])
    np.testing.assert_array_equal(v["params"]["backbone"]["norm2"]["scale"], sd[e + "norm2.weight"])
    np.testing.assert_array_equal(v["buffers"]["decode_head"]["hamburger"]["ham"]["bases"],
                                  sd[BASES_KEY])
    np.testing.assert_array_equal(v["params"]["maps_transform"]["scale"],
                                  sd["maps_transform.5.scale"])
    np.testing.assert_array_equal(v["params"]["decode_head"]["squeeze"]["gn"]["bias"],
                                  sd["encoder_decoder.decode_head.0.squeeze.gn.bias"])


def _without(sd, key):
    return {k: v for k, v in sd.items() if k != key}


@pytest.mark.parametrize("mutate, message", [
    (lambda sd: _without(sd, "encoder_decoder.backbone.block2.0.mlp.fc2.bias"),
     "decode|backbone/block2_0/mlp/fc2/bias"),
    (lambda sd: {**sd, "encoder_decoder.backbone.block2.0.extra.weight": np.zeros(3, np.float32)},
     "block2.0.extra.weight"),
    (lambda sd: {**sd, "encoder_decoder.backbone.block1.0.norm1.weight": np.zeros(5, np.float32)},
     "block1.0.norm1.weight"),
    (lambda sd: _without(sd, "encoder_decoder.backbone.norm1.weight"), "backbone/norm1/scale"),
    (lambda sd: _without(sd, "encoder_decoder.backbone.block1.0.norm2.num_batches_tracked"),
     "block1.0.norm2"),
    (lambda sd: {**sd, "encoder_decoder.backbone.norm3.num_batches_tracked": np.array(1)},
     "norm3.num_batches_tracked"),
    (lambda sd: {**sd, "encoder_decoder.backbone.block1.0.norm1.num_batches_tracked":
                 np.array(1.0, np.float32)}, "integer scalar"),
    (lambda sd: _without(sd, BASES_KEY), "hamburger.ham.bases"),
    (lambda sd: {**sd, BASES_KEY: -sd[BASES_KEY]}, "non-negative"),
    (lambda sd: {**sd, BASES_KEY: sd[BASES_KEY][0]}, r"\[1, D, R\]"),
    (lambda sd: {**sd, "encoder_decoder.backbone.block1.0.norm1.running_var":
                 -np.ones(8, np.float32)}, "negative running variances"),
    (lambda sd: {**sd, "maps_transform.5.scale": np.array([1], np.int64)},
     "maps_transform.5.scale"),
])
def test_port_is_strict(mutate, message):
    sd = mutate(synthetic_state_dict(TINY))
    with pytest.raises(PortError, match=message):
        convert_clickability(sd, TINY)


def test_port_rejects_another_configuration():
    with pytest.raises(PortError, match=re.escape("block1.1")):
        bigger = ClickabilityConfig(**{**TINY.__dict__, "depths": (2, 1, 1, 1)})
        convert_clickability(synthetic_state_dict(bigger), TINY)


def test_prepare_only_removes_batchnorm_counters():
    sd = synthetic_state_dict(TINY)
    prepared = prepare_state_dict(sd)
    assert set(sd) - set(prepared) == {k for k in sd if k.endswith("num_batches_tracked")}


def test_converted_model_round_trips_through_the_store(tmp_path, tiny):
    _, _, apply, _ = tiny
    variables = convert_clickability(synthetic_state_dict(TINY), TINY)
    store.save(tmp_path / "m", variables, family="clickability", variant=TINY.variant,
               config=TINY.to_dict())
    config, loaded = load_converted(tmp_path / "m")
    assert config == TINY
    image, aux = tiny_inputs(2)
    np.testing.assert_array_equal(apply(loaded, image, aux).raw, apply(variables, image, aux).raw)
    store.save(tmp_path / "other", variables, family="sam", variant="x", config=TINY.to_dict())
    with pytest.raises(store.StoreError, match="clickability"):
        load_converted(tmp_path / "other")
