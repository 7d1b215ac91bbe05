"""Unit tests of the SAM building blocks (ViT helpers, prompt encoder, two-way transformer)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxseg_robust.models.sam.config import SamConfig
from jaxseg_robust.models.sam.image_encoder import (ImageEncoderViT, ViTConfig, decomposed_rel_pos,
                                                    get_rel_pos, window_partition,
                                                    window_unpartition)
from jaxseg_robust.models.sam.layers import Linear, LowRankDense, PatchConvTranspose
from jaxseg_robust.models.sam.prompt_encoder import PromptEncoder
from jaxseg_robust.models.sam.random_init import random_params
from jaxseg_robust.models.sam.transformer import TwoWayTransformer, masked_softmax

# ---- ViT helpers -------------------------------------------------------------


@settings(max_examples=8)  # every shape compiles anew
@given(st.integers(1, 2), st.integers(1, 11), st.integers(1, 11), st.integers(1, 5))
def test_window_partition_round_trip_with_padding(b, h, w, window):
    x = np.random.default_rng(h * 13 + w).normal(size=(b, h, w, 3)).astype(np.float32)
    windows, padded = window_partition(jnp.asarray(x), window)
    hp, wp = padded
    assert hp % window == 0 and wp % window == 0 and hp - h < window and wp - w < window
    assert windows.shape == (b * (hp // window) * (wp // window), window, window, 3)
    np.testing.assert_array_equal(np.asarray(window_unpartition(windows, window, padded, (h, w))), x)
    # window (r, c) of image 0 holds rows r*window.. of the zero-padded grid
    grid = np.pad(x, ((0, 0), (0, hp - h), (0, wp - w), (0, 0)))
    last = (hp // window) * (wp // window) - 1
    np.testing.assert_array_equal(np.asarray(windows[last]), grid[0, -window:, -window:])


def test_get_rel_pos_indexing_without_interpolation():
    table = jnp.arange(7 * 2, dtype=jnp.float32).reshape(7, 2)
    out = np.asarray(get_rel_pos(4, 4, table))
    for i in range(4):
        for j in range(4):
            np.testing.assert_array_equal(out[i, j], np.asarray(table)[i - j + 3])


def test_get_rel_pos_different_query_and_key_sizes():
    table = jnp.arange(15, dtype=jnp.float32)[:, None]
    out = np.asarray(get_rel_pos(4, 8, table))[..., 0]
    # query coordinates are scaled by k/q = 2: index = 2 i - j + 7
    want = np.array([[2 * i - j + 7 for j in range(8)] for i in range(4)], np.float32)
    np.testing.assert_array_equal(out, want)


def test_get_rel_pos_interpolates_a_table_of_another_length():
    table = jnp.arange(5, dtype=jnp.float32)[:, None] * jnp.ones((1, 3))
    out = np.asarray(get_rel_pos(6, 6, table))  # needs length 11: linear, half-pixel, clamped
    src = np.clip(5 / 11 * (np.arange(11) + 0.5) - 0.5, 0, 4)
    for i in range(6):
        for j in range(6):
            np.testing.assert_allclose(out[i, j], src[i - j + 5], atol=1e-6)
    const = get_rel_pos(6, 6, jnp.full((5, 3), 2.5))
    np.testing.assert_allclose(np.asarray(const), 2.5, atol=1e-6)


def test_decomposed_rel_pos_matches_loop():
    rng = np.random.default_rng(0)
    qh, qw, c = 3, 4, 5
    q = rng.normal(size=(2, qh * qw, c)).astype(np.float32)
    rh = rng.normal(size=(2 * qh - 1, c)).astype(np.float32)
    rw = rng.normal(size=(2 * qw - 1, c)).astype(np.float32)
    got = np.asarray(decomposed_rel_pos(jnp.asarray(q), jnp.asarray(rh), jnp.asarray(rw),
                                        (qh, qw), (qh, qw)))
    want = np.zeros((2, qh * qw, qh * qw), np.float32)
    for b in range(2):
        for y in range(qh):
            for x in range(qw):
                for ky in range(qh):
                    for kx in range(qw):
                        qv = q[b, y * qw + x]
                        want[b, y * qw + x, ky * qw + kx] = (qv @ rh[y - ky + qh - 1]
                                                             + qv @ rw[x - kx + qw - 1])
    np.testing.assert_allclose(got, want, atol=1e-5)


def test_vit_encoder_shapes_intermediates_and_bf16():
    cfg = ViTConfig(img_size=64, embed_dim=16, depth=3, num_heads=2, out_chans=8, window_size=3,
                    global_attn_indexes=(0, 2))
    x = jnp.asarray(np.random.default_rng(0).normal(size=(2, 64, 64, 3)).astype(np.float32))
    enc = ImageEncoderViT(cfg)
    params = random_params(jax.eval_shape(enc.init, jax.random.key(0), x)["params"], 0)

    @jax.jit
    def both(p, v):
        out, state = enc.apply({"params": p}, v, mutable=["intermediates"])
        return out, state, ImageEncoderViT(cfg, dtype=jnp.bfloat16).apply({"params": p}, v)

    out, state, out_bf16 = both(params, x)
    assert out.shape == (2, 4, 4, 8) and out.dtype == jnp.float32
    interm = state["intermediates"]["interm_embeddings"]
    assert len(interm) == 2 and interm[0].shape == (2, 4, 4, 16)
    assert out_bf16.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(out_bf16), np.asarray(out), atol=0.1)
    with pytest.raises(ValueError, match="ViT input"):
        enc.apply({"params": params}, x[:, :32])


@pytest.mark.parametrize("global_attn_indexes", [(2, 5, 8, 11), (0, 4, 5), ()])
def test_vit_scanned_blocks_equal_the_unrolled_blocks(global_attn_indexes):
    """ViT-B's block pattern on a small grid: the loops over stacked parameters give the unrolled
    blocks' output and intermediates (float32 rounding: 1e-5 on values of order 1), hold one windowed
    and one global block in the program, and keep the parameter tree per block."""
    cfg = ViTConfig(img_size=96, embed_dim=32, depth=12, num_heads=2, out_chans=8, window_size=4,
                    global_attn_indexes=global_attn_indexes)
    x = jnp.asarray(np.random.default_rng(1).normal(size=(2, 96, 96, 3)).astype(np.float32))
    scanned, unrolled = ImageEncoderViT(cfg), ImageEncoderViT(cfg, scan_blocks=False)
    params = random_params(jax.eval_shape(scanned.init, jax.random.key(0), x)["params"], 3)
    assert sorted(k for k in params if k.startswith("blocks_")) == sorted(f"blocks_{i}" for i in range(12))

    def run(enc):
        return jax.jit(lambda p, v: enc.apply({"params": p}, v, mutable=["intermediates"]))(params, x)

    (out_s, state_s), (out_u, state_u) = run(scanned), run(unrolled)
    np.testing.assert_allclose(np.asarray(out_s), np.asarray(out_u), rtol=1e-5, atol=1e-5)
    interm_s = state_s.get("intermediates", {}).get("interm_embeddings", ())
    interm_u = state_u.get("intermediates", {}).get("interm_embeddings", ())
    assert len(interm_s) == len(interm_u) == len(global_attn_indexes)
    for a, b in zip(interm_s, interm_u):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)
    if global_attn_indexes == (2, 5, 8, 11):
        def dots(enc):
            lowered = jax.jit(lambda p, v: enc.apply({"params": p}, v)).trace(params, x).lower(
                lowering_platforms=("cuda",))
            return lowered.as_text().count("stablehlo.dot_general")

        unrolled_dots, scanned_dots = dots(unrolled), dots(scanned)
        per_block = (unrolled_dots - scanned_dots) / 10  # twelve blocks' products down to two blocks'
        assert per_block == int(per_block) and per_block > 0


def test_blocked_sequential_attention_equals_vectorised():
    from jaxseg_robust.models.sam.image_encoder import ViTAttention

    x = jnp.asarray(np.random.default_rng(7).normal(size=(2, 4, 6, 8)), jnp.float32)
    fast = ViTAttention(8, 2, input_size=(4, 6))
    blocked = ViTAttention(8, 2, input_size=(4, 6), sequential=True, query_chunk=6)
    params = random_params(jax.eval_shape(fast.init, jax.random.key(0), x)["params"], 6)
    run = jax.jit(lambda p: (fast.apply({"params": p}, x), blocked.apply({"params": p}, x)))
    a, b = run(params)
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5)


def test_vit_config_validation():
    with pytest.raises(ValueError, match="divisible"):
        ViTConfig(embed_dim=10, num_heads=3)
    with pytest.raises(ValueError, match="global_attn_indexes"):
        ViTConfig(depth=2, global_attn_indexes=(5,))


# ---- layers --------------------------------------------------------------------


def test_patch_conv_transpose_matches_definition():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(3, 2, 4)).astype(np.float32)
    mod = PatchConvTranspose(4, 5, 2)
    params = random_params(jax.eval_shape(mod.init, jax.random.key(0), jnp.asarray(x))["params"], 3)
    got = np.asarray(mod.apply({"params": params}, jnp.asarray(x)))
    k, b = np.asarray(params["kernel"]), np.asarray(params["bias"])
    want = np.zeros((6, 4, 5), np.float32)
    for i in range(3):
        for j in range(2):
            for a in range(2):
                for c in range(2):
                    want[2 * i + a, 2 * j + c] = x[i, j] @ k[a, c] + b
    np.testing.assert_allclose(got, want, atol=1e-5)


def test_output_upscaling_patch_layout_equals_the_spatial_chain():
    from jaxseg_robust.models.sam.layers import gelu, layer_norm
    from jaxseg_robust.models.sam.mask_decoder import OutputUpscaling, blocks_to_spatial

    up = OutputUpscaling(16)
    x = jnp.asarray(np.random.default_rng(6).normal(size=(3, 5, 16)), jnp.float32)
    params = random_params(jax.eval_shape(up.init, jax.random.key(0), x)["params"], 5)

    @jax.jit
    def run(p):
        spatial = up.apply({"params": p}, x)
        blocks = up.apply({"params": p}, x, method=OutputUpscaling.blocks)
        c1 = PatchConvTranspose(16, 4, 2).apply({"params": p["upscale1"]}, x)
        c1 = gelu(layer_norm(1e-6).apply({"params": p["norm"]}, c1))
        chain = gelu(PatchConvTranspose(4, 2, 2).apply({"params": p["upscale2"]}, c1))
        return spatial, blocks_to_spatial(blocks), chain

    spatial, from_blocks, chain = run(params)
    assert spatial.shape == (12, 20, 2)
    np.testing.assert_allclose(np.asarray(spatial), np.asarray(chain), atol=1e-5)
    np.testing.assert_array_equal(np.asarray(from_blocks), np.asarray(spatial))


def test_low_rank_dense_linearity():
    rng = np.random.default_rng(2)
    dense = LowRankDense(jnp.asarray(rng.normal(size=(6, 3)), jnp.float32),
                         jnp.asarray(rng.normal(size=(3, 8)), jnp.float32),
                         jnp.asarray(rng.normal(size=(8,)), jnp.float32))
    lin = Linear(8, 4)
    params = random_params(jax.eval_shape(lin.init, jax.random.key(1), jnp.zeros((1, 8)))["params"], 4)
    x = jnp.asarray(rng.normal(size=(6, 8)), jnp.float32)
    got = lin.apply({"params": params}, x, dense)
    want = lin.apply({"params": params}, x + dense.materialize())
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5)


def test_masked_softmax_equals_softmax_over_valid_keys():
    logits = jnp.asarray(np.random.default_rng(3).normal(size=(2, 3, 5)), jnp.float32)
    valid = jnp.asarray([True, False, True, True, False])
    got = np.asarray(masked_softmax(logits, valid))
    want = np.asarray(jax.nn.softmax(logits[..., np.asarray(valid)], axis=-1))
    np.testing.assert_allclose(got[..., np.asarray(valid)], want, atol=1e-6)
    assert (got[..., ~np.asarray(valid)] == 0).all()


# ---- prompt encoder --------------------------------------------------------------

C = 16


@pytest.fixture(scope="module")
def prompt_encoder():
    enc = PromptEncoder(C, (4, 4), (64, 64), 8)
    args = (jnp.zeros((2, 2)), jnp.ones((2,), jnp.int32), jnp.zeros((4,)), False,
            jnp.zeros((16, 16)), False)
    params = random_params(jax.eval_shape(enc.init, jax.random.key(0), *args)["params"], 1)
    return enc, params, jax.jit(lambda p, *a: enc.apply({"params": p}, *a))


@pytest.mark.parametrize("labels, has_box, want_pad, want_box", [
    ([1, -1, -1], False, True, False),   # points only: SAM's padding token
    ([1, 0, -1], True, False, True),     # points + box: no padding token
    ([-1, -1, -1], True, False, True),   # box only
    ([-1, -1, -1], False, False, False),  # nothing (e.g. mask only)
])
def test_prompt_token_validity(prompt_encoder, labels, has_box, want_pad, want_box):
    enc, params, apply = prompt_encoder
    sparse, valid, dense = apply(params, jnp.zeros((3, 2)), jnp.asarray(labels),
                                 jnp.asarray([1.0, 2, 30, 40]), has_box, jnp.zeros((16, 16)), False)
    assert sparse.shape == (6, C)
    want = [lab != -1 for lab in labels] + [want_pad, want_box, want_box]
    np.testing.assert_array_equal(np.asarray(valid), want)
    np.testing.assert_allclose(np.asarray(dense.materialize()),
                               np.broadcast_to(np.asarray(params["no_mask_embed"][0]), (4, 4, C)))


def test_point_and_box_encoding_formula(prompt_encoder):
    enc, params, apply = prompt_encoder
    gauss = np.asarray(params["pe_layer"]["positional_encoding_gaussian_matrix"])

    def pe(xy):
        c = (2 * ((np.asarray(xy) + 0.5) / 64.0) - 1) @ gauss * 2 * np.pi
        return np.concatenate([np.sin(c), np.cos(c)])

    pts = jnp.asarray([[3.0, 10.0], [40.0, 7.5]])
    sparse, _, _ = apply(params, pts, jnp.asarray([1, 0]), jnp.asarray([1.0, 2.0, 30.0, 40.0]),
                         True, jnp.zeros((16, 16)), False)
    sparse = np.asarray(sparse)
    np.testing.assert_allclose(sparse[0], pe([3, 10]) + params["point_embeddings_1"][0], atol=1e-5)
    np.testing.assert_allclose(sparse[1], pe([40, 7.5]) + params["point_embeddings_0"][0], atol=1e-5)
    np.testing.assert_allclose(sparse[3], pe([1, 2]) + params["point_embeddings_2"][0], atol=1e-5)
    np.testing.assert_allclose(sparse[4], pe([30, 40]) + params["point_embeddings_3"][0], atol=1e-5)
    np.testing.assert_allclose(sparse[2], params["not_a_point_embed"][0], atol=1e-6)
    dense_pe = np.asarray(enc.apply({"params": params}, method=PromptEncoder.dense_pe))
    c = (2 * ((np.array([1.5, 2.5])) / 4.0) - 1) @ gauss * 2 * np.pi  # cell (row 2, col 1)
    np.testing.assert_allclose(dense_pe[2, 1], np.concatenate([np.sin(c), np.cos(c)]), atol=1e-5)


def test_mask_input_embedding_and_nonfinite_unused_inputs(prompt_encoder):
    enc, params, apply = prompt_encoder
    mask = jnp.asarray(np.random.default_rng(4).normal(size=(16, 16)), jnp.float32)
    _, _, dense = apply(params, jnp.zeros((2, 2)), jnp.asarray([1, -1]), jnp.zeros((4,)), False,
                        mask, True)
    full = jax.jit(lambda p, m: enc.apply({"params": p}, m,
                                          method=lambda mod, x: mod.mask_downscaling(x)))(params, mask)
    np.testing.assert_allclose(np.asarray(dense.materialize()), np.asarray(full), atol=1e-5)

    def tokens(points, box, mask_in):
        s, _, d = enc.apply({"params": params}, points, jnp.asarray([1, -1]), box, False,
                            mask_in, False)
        return jnp.sum(s) + jnp.sum(d.materialize())

    tokens = jax.jit(tokens)

    nan_pts = jnp.asarray([[1.0, 2.0], [jnp.nan, jnp.inf]])
    nan_box = jnp.full((4,), jnp.nan)
    nan_mask = jnp.full((16, 16), jnp.nan)
    assert np.isfinite(float(tokens(nan_pts, nan_box, nan_mask)))
    g_pts, g_box = jax.jit(jax.grad(tokens, argnums=(0, 1)))(nan_pts, nan_box, nan_mask)
    assert np.isfinite(np.asarray(g_pts)).all() and (np.asarray(g_pts)[1] == 0).all()
    assert (np.asarray(g_box) == 0).all() and np.abs(np.asarray(g_pts)[0]).sum() > 0


# ---- two-way transformer ---------------------------------------------------------


def test_factored_dense_path_equals_adding_dense_to_the_image():
    rng = np.random.default_rng(5)
    tr = TwoWayTransformer(depth=2, embedding_dim=C, num_heads=2, mlp_dim=32)
    img = jnp.asarray(rng.normal(size=(9, C)), jnp.float32)
    pe = jnp.asarray(rng.normal(size=(9, C)), jnp.float32)
    tokens = jnp.asarray(rng.normal(size=(6, C)), jnp.float32)
    valid = jnp.asarray([True, True, True, False, True, False])
    dense = LowRankDense(jnp.asarray(rng.normal(size=(9, 4)), jnp.float32),
                         jnp.asarray(rng.normal(size=(4, C)), jnp.float32),
                         jnp.asarray(rng.normal(size=(C,)), jnp.float32))
    params = random_params(
        jax.eval_shape(tr.init, jax.random.key(0), img, pe, tokens, valid, dense)["params"], 2)
    keep = np.asarray(valid)

    @jax.jit
    def variants(p):
        v = {"params": p}
        return (tr.apply(v, img, pe, tokens, valid, dense),
                tr.apply(v, img + dense.materialize(), pe, tokens, valid, None),
                tr.apply(v, img, pe, tokens[keep], None, dense))

    (q1, k1), (q2, k2), (q3, k3) = variants(params)
    np.testing.assert_allclose(np.asarray(q1), np.asarray(q2), atol=1e-5)
    np.testing.assert_allclose(np.asarray(k1), np.asarray(k2), atol=1e-5)
    # masked tokens: dropping them changes nothing for the valid ones
    np.testing.assert_allclose(np.asarray(q1)[keep], np.asarray(q3), atol=1e-5)
    np.testing.assert_allclose(np.asarray(k1), np.asarray(k3), atol=1e-5)


def test_read_tokens_fold_the_final_attention_without_changing_the_read_tokens():
    """``num_read_tokens`` (SAM 2's decoder) returns the first n tokens of the full run."""
    rng = np.random.default_rng(6)
    full = TwoWayTransformer(depth=2, embedding_dim=C, num_heads=2, mlp_dim=32)
    read = TwoWayTransformer(depth=2, embedding_dim=C, num_heads=2, mlp_dim=32,
                             num_read_tokens=3)
    img = jnp.asarray(rng.normal(size=(9, C)), jnp.float32)
    pe = jnp.asarray(rng.normal(size=(9, C)), jnp.float32)
    tokens = jnp.asarray(rng.normal(size=(6, C)), jnp.float32)
    valid = jnp.asarray([True, True, True, True, False, True])
    params = random_params(
        jax.eval_shape(full.init, jax.random.key(0), img, pe, tokens, valid, None)["params"], 3)
    q_full, k_full = full.apply({"params": params}, img, pe, tokens, valid, None)
    q_read, k_read = read.apply({"params": params}, img, pe, tokens, valid, None)
    assert q_read.shape == (3, C)
    np.testing.assert_allclose(np.asarray(q_read), np.asarray(q_full)[:3], atol=1e-5)
    np.testing.assert_array_equal(np.asarray(k_read), np.asarray(k_full))


def test_sam_config_json_round_trip_and_validation():
    from jaxseg_robust.models.sam.registry import SAM_CONFIGS, TINY_CONFIG

    for cfg in (*SAM_CONFIGS.values(), TINY_CONFIG):
        import json
        assert SamConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    with pytest.raises(ValueError, match="compute_dtype"):
        SamConfig(encoder=ViTConfig(), compute_dtype="float16")
    bad = TINY_CONFIG.to_dict()
    bad["encoder"]["bogus"] = 1
    with pytest.raises(ValueError, match="bogus"):
        SamConfig.from_dict(bad)
    bad = dict(TINY_CONFIG.to_dict(), encoder_kind="no_such_encoder")
    with pytest.raises(ValueError, match="no_such_encoder"):
        SamConfig.from_dict(bad)
