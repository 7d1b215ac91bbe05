"""SAM 2 model behaviour on the tiny random-weight test model (no torch, no reference code).

Numeric parity with the official code is in tests/test_sam2_parity.py; these
tests pin what the parity tests cannot see: the official block layout of the
eight configurations, padded prompt slots, one compiled decode per prompt
mix, vmap, gradients, the dynamic fallback rule, the predictor's signature
and the Segmenter contract's interactive state.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxseg_robust.models import store, zoo
from jaxseg_robust.models.sam2.config import (TEST_CONFIG, TRUNKS, HieraConfig, Sam2Config,
                                              official_config)
from jaxseg_robust.models.sam2.hiera import Hiera, bicubic_matrix, max_pool_2x2
from jaxseg_robust.models.sam2.segmenter import Sam2Segmenter, stability_score, upsample_logits
from jaxseg_robust.prompts.types import make_prompts

LOW = TEST_CONFIG.low_res_size


@pytest.fixture(scope="module")
def predictor(tmp_path_factory):
    """The tiny model, saved with the store and loaded through the zoo, its image set."""
    params = zoo.init("sam2_test", jax.random.key(0)).params
    out = store.save(tmp_path_factory.mktemp("sam2") / "m", jax.tree.map(np.asarray, params),
                     family="sam2", variant="test", config=TEST_CONFIG.to_dict())
    loaded = zoo.load(out)
    loaded.set_image(np.random.default_rng(0).integers(0, 256, (50, 70, 3)).astype(np.uint8))
    return loaded


@pytest.fixture(scope="module")
def model(predictor):
    """(segmenter, params, features, transform in a 56 x 72 frame, image)."""
    seg = predictor.segmenter
    image = np.random.default_rng(0).integers(0, 256, (50, 70, 3)).astype(np.uint8)
    _, transform = seg.preprocess(image, frame_hw=(56, 72))
    return seg, predictor.params, predictor.features, transform, image


@pytest.fixture(scope="module")
def decode(model):
    """Jitted single-mask decode (static params and features) with a trace counter."""
    seg, params, features, transform, _ = model
    traces = []

    def run(params, prompts, multimask_output=False):
        traces.append(1)
        return seg.decode(params, features, prompts, transform, multimask_output=multimask_output)

    jitted = jax.jit(run, static_argnames="multimask_output")

    def call(prompts, *, params=params, multimask_output=False):
        return jitted(params, prompts, multimask_output=multimask_output)

    call.traces = traces
    return call


def prompts(points=None, labels=None, box=None, mask=None, slots=4):
    return make_prompts(points, labels, box, mask, num_slots=slots, mask_shape=(LOW, LOW))


# ---- configuration ------------------------------------------------------------------

@pytest.mark.parametrize("variant,channels,depth,windows", [
    ("hiera_tiny", (768, 384, 192, 96), 12, {0: 8, 1: 8, 3: 4, 5: 0, 10: 14, 11: 7}),
    ("hiera_small", (768, 384, 192, 96), 16, {7: 0, 10: 0, 13: 0, 14: 14}),
    ("hiera_base_plus", (896, 448, 224, 112), 24, {2: 8, 5: 4, 12: 0, 21: 14, 23: 7}),
    ("hiera_large", (1152, 576, 288, 144), 48, {2: 8, 8: 4, 23: 0, 44: 16, 47: 8}),
])
def test_official_trunk_layout(variant, channels, depth, windows):
    """Channels, depth and the lagging window sizes of the official constructor."""
    hiera = TRUNKS[variant]
    blocks = hiera.blocks()
    assert hiera.channel_list == channels and len(blocks) == depth
    for i, window in windows.items():
        assert blocks[i].window_size == window, i
    pooled = [i for i, b in enumerate(blocks) if b.q_pool]
    assert pooled == [e + 1 for e in hiera.stage_ends[:-1]]
    assert all(blocks[i].dim_out == 2 * blocks[i].dim for i in pooled)


def test_hiera_scanned_blocks_equal_the_unrolled_blocks():
    """A trunk with repeated blocks (stage 3: windowed runs around two global blocks): the loops over
    stacked parameters give the unrolled trunk's four stage outputs (float32 rounding: 1e-5 on values
    of order 1) with fewer block bodies in the program, and the parameter tree stays per block."""
    cfg = HieraConfig(embed_dim=8, num_heads=1, stages=(2, 2, 9, 2), global_att_blocks=(8, 11),
                      window_pos_embed_bkg_spatial_size=(3, 3), window_spec=(4, 2, 6, 3))
    x = jnp.asarray(np.random.default_rng(2).normal(size=(2, 128, 128, 3)).astype(np.float32))
    scanned, unrolled = Hiera(cfg), Hiera(cfg, scan_blocks=False)
    variables = scanned.init(jax.random.key(0), x)
    variables = jax.tree.map(lambda a: a + 0.05 * jax.random.normal(jax.random.key(1), a.shape), variables)
    assert sorted(k for k in variables["params"] if k.startswith("blocks_")) == \
        sorted(f"blocks_{i}" for i in range(15))
    out_s, out_u = (jax.jit(enc.apply)(variables, x) for enc in (scanned, unrolled))
    assert [o.shape for o in out_s] == [o.shape for o in out_u] == \
        [(2, 32, 32, 8), (2, 16, 16, 16), (2, 8, 8, 32), (2, 4, 4, 64)]
    for a, b in zip(out_s, out_u):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)

    def dots(enc):
        lowered = jax.jit(enc.apply).trace(variables, x).lower(lowering_platforms=("cuda",))
        return lowered.as_text().count("stablehlo.dot_general")

    assert dots(scanned) < 0.8 * dots(unrolled)


def test_config_round_trip_and_validation():
    for version in ("2", "2.1"):
        config = official_config("hiera_large", version)
        assert Sam2Config.from_dict(config.to_dict()) == config
    assert Sam2Config.from_dict(TEST_CONFIG.to_dict()) == TEST_CONFIG
    with pytest.raises(ValueError, match="window must be even"):
        HieraConfig(window_spec=(7, 4, 14, 7))
    with pytest.raises(ValueError, match="version"):
        dataclasses.replace(TEST_CONFIG, version="3")
    with pytest.raises(ValueError, match="unknown field"):
        Sam2Config.from_dict({**TEST_CONFIG.to_dict(), "scalp": 2})


def test_zoo_names():
    names = set(zoo.known_names())
    for size in ("tiny", "small", "base_plus", "large"):
        for version in ("2", "2.1"):
            spec = zoo.get(f"sam{version}_hiera_{size}")
            assert spec.family == "sam2" and spec.config.version == version
            assert spec.checkpoint_hint == f"sam{version}_hiera_{size}.pt"
    assert "sam2_test" in names


# ---- building blocks ------------------------------------------------------------------

def test_bicubic_matrix_rows_sum_to_one_and_identity():
    for n_in, n_out in [(14, 256), (7, 256), (3, 32), (5, 5)]:
        m = bicubic_matrix(n_in, n_out)
        np.testing.assert_allclose(m.sum(axis=1), 1.0, atol=1e-6)
    np.testing.assert_allclose(bicubic_matrix(6, 6), np.eye(6), atol=1e-7)


def test_max_pool_floor_mode():
    x = jnp.arange(2 * 5 * 5 * 1, dtype=jnp.float32).reshape(2, 5, 5, 1)
    out = max_pool_2x2(x)
    assert out.shape == (2, 2, 2, 1)
    assert float(out[0, 1, 1, 0]) == float(x[0, 3, 3, 0])


def test_stability_score_and_fallback_rule():
    seg = Sam2Segmenter(TEST_CONFIG)
    single = jnp.full((LOW, LOW), -1.0).at[:4].set(1.0)  # no pixel within +-0.05: stable
    assert float(stability_score(single, 0.05)) == 1.0
    half = single.at[4:8].set(0.0)  # inside the margin: |>0.05| / |>-0.05| = 4 / 8
    assert float(stability_score(half, 0.05)) == pytest.approx(0.5)
    assert float(stability_score(jnp.full((LOW, LOW), -1.0), 0.05)) == 1.0  # empty union
    others = [jnp.full((LOW, LOW), v) for v in (2.0, 3.0, 4.0)]
    iou = jnp.asarray([0.9, 0.1, 0.7, 0.3])
    for first, want in ((single, 0), (half, 2)):
        low, score, index = seg.select(jnp.stack([first, *others]), iou, multimask_output=False)
        assert low.shape == (1, LOW, LOW) and int(index) == 0
        np.testing.assert_array_equal(low[0], jnp.stack([first, *others])[want])
        assert float(score[0]) == pytest.approx(float(iou[want]))
    off = dataclasses.replace(seg, config=dataclasses.replace(
        seg.config, dynamic_multimask_via_stability=False))
    low, _, _ = off.select(jnp.stack([half, *others]), iou, multimask_output=False)
    np.testing.assert_array_equal(low[0], half)
    low, score, index = seg.select(jnp.stack([half, *others]), iou, multimask_output=True)
    assert low.shape == (3, LOW, LOW) and int(index) == 1


def test_upsample_logits_fills_outside_and_keeps_constants():
    low = jnp.full((2, 8, 8), 3.0)
    out = jax.jit(upsample_logits, static_argnums=2)(low, jnp.asarray([5, 7]), (6, 9))
    assert out.shape == (2, 6, 9)
    np.testing.assert_allclose(out[:, :5, :7], 3.0)
    assert float(out[:, 5:, :].max()) == -1e4 and float(out[:, :, 7:].max()) == -1e4


# ---- the segmenter ---------------------------------------------------------------------

def test_preprocess_resizes_to_square_without_aspect(model):
    seg, _, _, transform, image = model
    x, t = seg.preprocess(image)
    assert x.shape == (128, 128, 3)
    np.testing.assert_array_equal(np.asarray(t.resized_hw), [128, 128])
    np.testing.assert_allclose(np.asarray(t.scale_xy), [128 / 70, 128 / 50], rtol=1e-6)
    assert transform.frame_hw == (56, 72)
    with pytest.raises(ValueError, match="shape"):
        seg.preprocess(image[..., :2])
    traced = jax.jit(seg.traced_model_input)(jnp.asarray(image, jnp.float32))
    np.testing.assert_allclose(traced, x, atol=1e-5)


def test_one_program_for_every_prompt_mix_and_padding_invariance(model, decode, predictor):
    seg, params, features, transform, _ = model
    mask = np.random.default_rng(1).normal(size=(LOW, LOW)).astype(np.float32)
    mixes = {
        "point": prompts([[20, 10]], [1]),
        "points": prompts([[20, 10], [40, 30], [5, 45]], [1, 0, 1]),
        "box": prompts(box=[10, 5, 60, 40]),
        "box_points": prompts([[30, 20]], [0], box=[10, 5, 60, 40]),
        "mask": prompts([[20, 10]], [1], mask=mask),
        "nothing": prompts(),
    }
    before = len(decode.traces)
    out = {k: decode(p) for k, p in mixes.items()}
    assert len(decode.traces) == before + 1
    # padding invariance: the predictor decodes the same prompts with as few slots as fit (1)
    logits, _, _ = predictor.predict(point_coords=np.array([[20.0, 10.0]]),
                                     point_labels=np.array([1]), multimask_output=False,
                                     return_logits=True)
    np.testing.assert_allclose(logits[0], np.asarray(out["point"].logits)[:50, :70], atol=1e-5)
    assert not np.allclose(out["box"].logits, out["box_points"].logits)
    inside = np.asarray(out["point"].logits)[:50, :70]
    assert np.isfinite(inside).all() and (np.asarray(out["point"].logits)[50:] == -1e4).all()


def test_padding_point_rule(model):
    """SAM 2 appends the padding point with points and with a box (SAM 1: only without a box)."""
    seg, params, _, transform, _ = model
    for p, want in ((prompts([[20, 10]], [1]), True), (prompts(box=[1, 2, 30, 40]), True),
                    (prompts([[20, 10]], [1], box=[1, 2, 30, 40]), True), (prompts(), False)):
        _, valid, _ = jax.jit(seg.encode_prompts)(params, p, transform)
        assert bool(valid[p.num_slots]) is want


def test_vmap_over_prompt_sets_and_gradients(model, decode):
    seg, params, features, transform, _ = model
    batch = [prompts([[20 + 5 * i, 10 + 3 * i]], [1], box=[5, 5, 50 + i, 40]) for i in range(3)]
    stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *batch)
    run = jax.jit(jax.vmap(lambda p: seg.decode(params, features, p, transform,
                                                 multimask_output=False).logits))
    got = run(stacked)
    for i, p in enumerate(batch):
        np.testing.assert_allclose(got[i], decode(p).logits, atol=1e-4)

    target = jnp.zeros((56, 72)).at[10:40, 15:60].set(1.0)

    def loss(points, box):
        pred = seg.decode(params, features, batch[0].replace(points=points, box=box), transform,
                          multimask_output=False)
        prob = jax.nn.sigmoid(pred.logits)
        return 1 - 2 * (prob * target).sum() / (prob.sum() + target.sum())

    g_points, g_box = jax.jit(jax.grad(loss, argnums=(0, 1)))(batch[0].points, batch[0].box)
    assert np.isfinite(g_points).all() and np.isfinite(g_box).all()
    assert np.abs(g_points[0]).sum() > 0 and np.abs(g_box).sum() > 0
    np.testing.assert_array_equal(g_points[1:], 0.0)  # padding slots get no gradient


def test_contract_feedback_state(model, decode):
    seg = model[0]
    assert seg.feedback_shape((480, 854)) == (LOW, LOW)
    assert seg.probability_threshold == 0.5
    pred = decode(prompts([[20, 10]], [1]))
    feedback = seg.feedback(pred)
    assert feedback.shape == (LOW, LOW)
    np.testing.assert_array_equal(feedback, pred.low_res_logits[pred.index])
    assert float(jnp.abs(pred.low_res_logits).max()) <= seg.config.low_res_clamp


def test_clamped_low_res_but_unclamped_logits(model, decode):
    params = model[1]
    decoder = dict(params["mask_decoder"])
    for i in range(TEST_CONFIG.num_mask_tokens):  # every candidate far beyond +-32
        hyper = dict(decoder[f"output_hypernetworks_mlps_{i}"])
        hyper["layers_2"] = {k: v * 1e3 for k, v in hyper["layers_2"].items()}
        decoder[f"output_hypernetworks_mlps_{i}"] = hyper
    pred = decode(prompts([[20, 10]], [1]), params={**params, "mask_decoder": decoder})
    assert float(jnp.abs(pred.low_res_logits).max()) == 32.0
    assert float(jnp.abs(pred.logits[:50, :70]).max()) > 32.0


# ---- predictor and store ---------------------------------------------------------------

def test_predictor_signature_and_store_round_trip(predictor):
    assert isinstance(predictor.segmenter, Sam2Segmenter)
    masks, scores, low = predictor.predict(point_coords=np.array([[20.0, 10.0]]),
                                           point_labels=np.array([1]), multimask_output=False)
    assert masks.shape == (1, 50, 70) and masks.dtype == bool and scores.shape == (1,)
    assert low.shape == (1, LOW, LOW) and np.abs(low).max() <= 32.0
    logits, _, _ = predictor.predict(point_coords=np.array([[20.0 / 70, 10.0 / 50]]),
                                     point_labels=np.array([1]), multimask_output=False,
                                     return_logits=True, normalize_coords=False)
    np.testing.assert_array_equal(logits > 0, masks)
    many, scores3, _ = predictor.predict(box=np.array([5, 5, 60, 40]), mask_input=low)
    assert many.shape == (3, 50, 70) and scores3.shape == (3,)
    assert predictor.get_image_embedding().shape == (1, 32, 8, 8)
