"""Tests of SAM-HQ (tiny random model ``sam_hq_tiny``): decoder pieces, selection, segmenter, predictor.

Numeric agreement with ``segment_anything_hq`` is in test_sam_hq_parity.py;
these tests check the pieces against written-out definitions, the fixed-shape
/ jit / vmap / grad contract and the predictor semantics. One compiled
decode (vmapped over prompt sets, with gradients) serves every check here.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxseg_robust.models import zoo
from jaxseg_robust.models.base import Segmenter
from jaxseg_robust.models.sam.config import SamConfig, SamHQConfig
from jaxseg_robust.models.sam.hq_segmenter import SamHQSegmenter
from jaxseg_robust.models.sam.image_encoder import ViTConfig
from jaxseg_robust.models.sam.mask_decoder_hq import Conv3x3, hq_select
from jaxseg_robust.models.sam.random_init import random_params
from jaxseg_robust.models.sam.registry import (SAM_HQ_CONFIGS, SAM_HQ_TINY_CONFIG, TINY_CONFIG,
                                               TINY_TINY_VIT)
from jaxseg_robust.prompts.types import make_prompts

LOW = 32  # low-res logits of the tiny model (128 px input)
H, W = 45, 70


def prompts(points=None, labels=None, box=None, mask=None, slots=4):
    return make_prompts(points, labels, box, mask, num_slots=slots, mask_shape=(LOW, LOW))


# ---- pieces (no model compile) ------------------------------------------------------


def test_conv3x3_matches_definition_and_contraction():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(5, 7, 3)).astype(np.float32)
    conv = Conv3x3(3, 4)
    params = random_params(jax.eval_shape(conv.init, jax.random.key(0), jnp.asarray(x))["params"],
                           1)
    k, b = np.asarray(params["kernel"]), np.asarray(params["bias"])
    padded = np.pad(x, ((1, 1), (1, 1), (0, 0)))
    want = np.zeros((5, 7, 4), np.float32) + b
    for i in range(5):
        for j in range(7):
            want[i, j] += np.einsum("abc,abco->o", padded[i:i + 3, j:j + 3], k)  # torch: x-corr
    got = np.asarray(conv.apply({"params": params}, jnp.asarray(x)))
    np.testing.assert_allclose(got, want, atol=1e-5)
    weights = rng.normal(size=4).astype(np.float32)
    contracted = conv.apply({"params": params}, jnp.asarray(x), jnp.asarray(weights),
                            method=Conv3x3.contract)
    np.testing.assert_allclose(np.asarray(contracted), want @ weights, atol=1e-5)


@pytest.mark.parametrize("multimask", [True, False])
@pytest.mark.parametrize("hq_only", [True, False])
def test_hq_select_is_segment_anything_hq_selection(multimask, hq_only):
    rng = np.random.default_rng(1)
    masks = rng.normal(size=(5, 3, 4)).astype(np.float32)  # 4 SAM candidates + HQ
    iou = np.array([0.9, 0.2, 0.7, 0.4], np.float32)
    low, scores, index = hq_select(jnp.asarray(masks), jnp.asarray(iou),
                                   multimask_output=multimask, hq_token_only=hq_only)
    sam, score = (masks[2], 0.7) if multimask else (masks[0], 0.9)  # best of 1..3 is 2
    want = masks[4] if hq_only else sam + masks[4]
    assert low.shape == (1, 3, 4) and scores.shape == (1,) and int(index) == 0
    np.testing.assert_allclose(np.asarray(low[0]), want, atol=1e-6)
    np.testing.assert_allclose(np.asarray(scores), [score])


def test_config_early_feature_and_json_round_trip():
    assert {v: c.vit_dim for v, c in SAM_HQ_CONFIGS.items()} == \
        {"vit_b": 768, "vit_l": 1024, "vit_h": 1280, "vit_tiny": 160}
    assert SAM_HQ_TINY_CONFIG.family == "sam_hq" and SAM_HQ_TINY_CONFIG.vit_dim == 32
    for config in (SAM_HQ_TINY_CONFIG, SAM_HQ_CONFIGS["vit_tiny"]):
        again = SamHQConfig.from_dict(config.to_dict())
        assert again == config and isinstance(again, SamHQConfig)
    with pytest.raises(ValueError, match="global-attention"):
        SamHQConfig(encoder=ViTConfig(depth=2, global_attn_indexes=()))
    with pytest.raises(ValueError, match="merge_strides"):
        SamHQConfig(encoder=dataclasses.replace(TINY_TINY_VIT, merge_strides=(2, 1, 2)),
                    encoder_kind="tiny_vit")
    with pytest.raises(ValueError, match="SamHQConfig"):
        SamHQSegmenter(TINY_CONFIG)


# ---- the tiny model -------------------------------------------------------------------


@pytest.fixture(scope="module")
def model():
    predictor = zoo.init("sam_hq_tiny", jax.random.key(0))
    image = np.random.default_rng(0).integers(0, 256, (H, W, 3), dtype=np.uint8)
    predictor.set_image(image)
    seg, params = predictor.segmenter, predictor.params
    features, transform = predictor.features, predictor.transform
    target = jnp.asarray(np.random.default_rng(3).random((H, W)) > 0.5, jnp.float32)
    traces = []

    def dice_and_prediction(points, box, p):
        traces.append(1)
        pred = seg.decode(params, features, p.replace(points=points, box=box), transform)
        prob = jax.nn.sigmoid(pred.logits)
        loss = 1 - 2 * jnp.sum(prob * target) / jnp.maximum(prob.sum() + target.sum(), 1e-7)
        return loss, pred

    grad_fn = jax.value_and_grad(dice_and_prediction, argnums=(0, 1), has_aux=True)
    batched = jax.jit(jax.vmap(lambda p: grad_fn(p.points, p.box, p)))
    return predictor, image, batched, traces


def stack(sets):
    return jax.tree.map(lambda *xs: jnp.stack(xs), *sets)


MASK = np.random.default_rng(1).normal(size=(LOW, LOW)).astype(np.float32)
MIXES_A = [
    prompts([[20.0, 10.0]], [1]),                                     # one point
    prompts([[20.0, 10.0], [50, 30], [5, 40]], [1, 0, 1]),           # several points
    prompts(box=[5.0, 4, 60, 40]),                                    # box only
    prompts([[20.0, 10.0]], [0], box=[5.0, 4, 60, 40]),              # box + points
]
MIXES_B = [
    prompts([[20.0, 10.0]], [1], mask=MASK),                          # points + mask input
    prompts(box=[5.0, 4, 60, 40], mask=MASK),                         # box + mask input
    prompts(mask=MASK),                                               # mask only
    prompts([[30.0, 20.0], [3, 3]], [1, 0]),
]


def test_features_carry_the_early_feature_only_for_hq(model):
    predictor = model[0]
    f = predictor.features
    assert isinstance(predictor.segmenter, Segmenter)
    assert f.image_embeddings.shape == (8, 8, 32)
    assert len(f.interm_embeddings) == 1 and f.interm_embeddings[0].shape == (8, 8, 32)
    x, _ = predictor.segmenter.preprocess(model[1])
    sam = zoo.segmenter("sam_tiny")
    sam_features = jax.eval_shape(sam.embed, predictor.params, x)  # same param shapes
    assert sam_features.interm_embeddings == ()
    batched = jax.eval_shape(predictor.segmenter.embed, predictor.params, jnp.stack([x, x]))
    assert batched.interm_embeddings[0].shape == (2, 8, 8, 32)
    # TinyViT (SAM-HQ's vit_tiny) sows its stage-1 output: 24 channels on the 8x8 grid
    hq_tiny_vit = SamHQSegmenter(dataclasses.replace(SAM_HQ_TINY_CONFIG, encoder=TINY_TINY_VIT,
                                                     encoder_kind="tiny_vit"))
    shapes = jax.eval_shape(hq_tiny_vit.embed, hq_tiny_vit.param_shapes(), x)
    assert shapes.interm_embeddings[0].shape == (8, 8, 24)


def test_one_compiled_decode_serves_every_prompt_mix_with_gradients(model):
    predictor, _, batched, traces = model
    (loss_a, pred_a), (g_pts, g_box) = batched(stack(MIXES_A))
    (loss_b, pred_b), _ = batched(stack(MIXES_B))
    assert len(traces) == 1
    assert pred_a.logits.shape == (4, H, W) and pred_a.low_res_logits.shape == (4, 1, LOW, LOW)
    assert pred_a.scores.shape == (4, 1) and (np.asarray(pred_a.index) == 0).all()
    for tree in (pred_a, pred_b, g_pts, g_box, loss_a, loss_b):
        assert all(np.isfinite(np.asarray(leaf)).all() for leaf in jax.tree.leaves(tree))
    g_pts, g_box = np.asarray(g_pts), np.asarray(g_box)
    # gradients reach the used coordinates only
    assert np.abs(g_pts[1, :3]).sum() > 0 and (g_pts[1, 3:] == 0).all()
    assert np.abs(g_box[2]).sum() > 0 and (g_box[:2] == 0).all()
    assert np.abs(np.asarray(pred_a.logits[0] - pred_a.logits[2])).max() > 1e-3


def test_gradient_matches_finite_differences(model):
    _, _, batched, traces = model
    base = stack(MIXES_A)
    _, (g_pts, g_box) = batched(base)
    i = 3  # box + points
    norm = float(jnp.linalg.norm(g_pts[i]) + jnp.linalg.norm(g_box[i]))
    d_pts, d_box = g_pts / norm, g_box / norm
    eps = 0.05  # px; the loss is piecewise smooth (ReLU/GELU), so keep the step small

    def loss_at(sign):
        moved = base.replace(points=base.points + sign * eps * d_pts,
                             box=base.box + sign * eps * d_box)
        return float(batched(moved)[0][0][i])

    fd = (loss_at(1) - loss_at(-1)) / (2 * eps)
    analytic = float(jnp.sum(g_pts[i] * d_pts[i]) + jnp.sum(g_box[i] * d_box[i]))
    np.testing.assert_allclose(fd, analytic, rtol=0.1)
    assert len(traces) == 1


def test_predictor_semantics_and_agreement_with_vmapped_decode(model):
    predictor, image, batched, _ = model
    (_, pred), _ = batched(stack(MIXES_A))
    pts, labels = np.array([[20.0, 10.0]]), np.array([1])
    logits, scores, low = predictor.predict(pts, labels, return_logits=True)
    assert logits.shape == (1, H, W) and scores.shape == (1,) and low.shape == (1, LOW, LOW)
    np.testing.assert_allclose(logits[0], np.asarray(pred.logits[0]), atol=1e-4)
    np.testing.assert_allclose(scores, np.asarray(pred.scores[0]), atol=1e-5)
    masks, _, _ = predictor.predict(pts, labels)
    assert masks.dtype == bool and masks.shape == (1, H, W)
    np.testing.assert_array_equal(masks, logits > 0)
    # the selection options, against SAM-HQ's rule applied to all raw outputs
    raw_low, raw_iou = predictor._decode(predictor.params, predictor.features,
                                         prompts(pts, labels, slots=1), predictor.transform)
    raw_low, raw_iou = np.asarray(raw_low), np.asarray(raw_iou)
    assert raw_low.shape == (5, LOW, LOW) and raw_iou.shape == (4,)
    for multimask in (True, False):
        for hq_only in (True, False):
            _, s, lr = predictor.predict(pts, labels, multimask_output=multimask,
                                         hq_token_only=hq_only)
            j = 1 + int(np.argmax(raw_iou[1:])) if multimask else 0
            want = raw_low[4] if hq_only else raw_low[j] + raw_low[4]
            np.testing.assert_allclose(lr[0], want, atol=1e-5)
            np.testing.assert_allclose(s, [raw_iou[j]], atol=1e-6)
    # the segmenter's default can be switched for code written against any Segmenter
    hq_only = dataclasses.replace(predictor.segmenter, hq_token_only=True)
    low_sel, _, _ = hq_only.select(jnp.asarray(raw_low), jnp.asarray(raw_iou),
                                   multimask_output=True)
    np.testing.assert_allclose(np.asarray(low_sel[0]), raw_low[4])
    again, _, _ = predictor.predict(image, point_coords=pts, point_labels=labels,
                                    return_logits=True)
    np.testing.assert_allclose(again, logits, atol=1e-5)


def test_decode_rejects_features_without_the_early_feature(model):
    predictor = model[0]
    seg, params = predictor.segmenter, predictor.params
    sam_like = predictor.features.replace(interm_embeddings=())
    with pytest.raises(ValueError, match="interm_embeddings"):
        jax.eval_shape(seg.decode, params, sam_like, prompts([[1.0, 1.0]], [1]),
                       predictor.transform)
    wrong = predictor.features.replace(
        interm_embeddings=(jnp.zeros((8, 8, 16)),))
    with pytest.raises(ValueError, match=r"\[8, 8, 32\]"):
        jax.eval_shape(seg.decode_low_res, params, wrong, prompts([[1.0, 1.0]], [1]),
                       predictor.transform)
    assert isinstance(zoo.get("sam_hq_vit_b").config, SamConfig)
