"""Tests of HQ-SAM 2 (tiny random model ``sam2_hq_tiny``): the HQ decoder, the selection, the
segmenter's rules and zoo names, the predictor. Parity with the official code is in
tests/test_sam2_hq_parity.py."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxseg_robust.models import zoo
from jaxseg_robust.models.base import evaluation_multimask, family_rules, takes_boxes
from jaxseg_robust.models.sam2.config import (HQ_TEST_CONFIG, TEST_CONFIG, Sam2Config, Sam2HQConfig,
                                              official_config)
from jaxseg_robust.models.sam.mask_decoder import blocks_to_spatial
from jaxseg_robust.models.sam2.hq_mask_decoder import Sam2MaskDecoderHQ
from jaxseg_robust.models.sam2.mask_decoder import Sam2MaskDecoder
from jaxseg_robust.models.sam2.hq_segmenter import Sam2HQSegmenter, hq2_select
from jaxseg_robust.models.sam2.segmenter import Sam2Segmenter, stability_score
from jaxseg_robust.prompts.types import make_prompts

H, W = 40, 48


@pytest.fixture(scope="module")
def model():
    predictor = zoo.init("sam2_hq_tiny", jax.random.key(0))
    image = np.random.default_rng(0).integers(0, 256, (H, W, 3), dtype=np.uint8)
    segmenter, params = predictor.segmenter, predictor.params
    model_input, transform = segmenter.preprocess(image)
    features = jax.jit(segmenter.embed)(params, model_input)
    return predictor, image, features, transform


def _prompts(segmenter, box=None, points=None, labels=None):
    low = segmenter.config.low_res_size
    return make_prompts(points, labels, box, num_slots=2, mask_shape=(low, low))


def test_zoo_names_and_rules():
    spec = zoo.get("sam2.1_hq_hiera_large")
    assert spec.family == "sam2_hq" and spec.checkpoint_hint == "sam2.1_hq_hiera_large.pt"
    assert spec.config.encoder == official_config("hiera_large", "2.1").encoder
    assert spec.config.version == "2.1" and isinstance(spec.config, Sam2HQConfig)
    assert zoo.get("sam2_hq_tiny").checkpoint_hint.startswith("<none")
    segmenter = zoo.segmenter("sam2_hq_tiny")
    assert isinstance(segmenter, Sam2HQSegmenter)
    rules = family_rules(segmenter)
    assert rules.family == "sam2_hq" and not rules.resized_frame
    assert evaluation_multimask(segmenter) is False and takes_boxes(segmenter)
    assert segmenter.probability_threshold == 0.5


def test_config_round_trip_and_refused_plain_config():
    assert Sam2HQConfig.from_dict(HQ_TEST_CONFIG.to_dict()) == HQ_TEST_CONFIG
    assert HQ_TEST_CONFIG.to_dict()["family"] == "sam2_hq"
    with pytest.raises(ValueError, match="Sam2HQConfig"):
        Sam2HQSegmenter(TEST_CONFIG)
    assert not isinstance(TEST_CONFIG, Sam2HQConfig) and isinstance(HQ_TEST_CONFIG, Sam2Config)


def test_param_tree_is_sam2s_plus_the_hq_token(model):
    predictor = model[0]
    hq = predictor.params["mask_decoder"]
    plain = Sam2Segmenter(TEST_CONFIG).param_shapes()["mask_decoder"]
    assert set(hq) - set(plain) == {"hf_token", "hf_mlp", "embedding_maskfeature"}
    assert hq["hf_token"].shape == (1, 32) and hq["hf_mlp"]["layers_2"]["kernel"].shape == (32, 4)
    assert set(hq["embedding_maskfeature"]) == {"conv1", "norm", "conv2"}
    assert "compress_vit_feat" not in hq and "embedding_encoder" not in hq


def test_hq_mask_is_the_hq_token_mlp_on_the_mask_feature(model):
    """The contracted HQ mask equals MLP(hf token) . embedding_maskfeature(upscaled) computed in full."""
    predictor, _, features, transform = model
    segmenter, params = predictor.segmenter, predictor.params
    prompts = _prompts(segmenter, box=np.array([5.0, 6.0, 30.0, 33.0], np.float32))
    sparse, valid, dense = segmenter.encode_prompts(params, prompts, transform)
    decoder = segmenter.mask_decoder

    def reference(module):
        hs, src = module.run_transformer(features.image_embeddings, segmenter.dense_pe(params), sparse,
                                         valid, dense)
        s, k = module.num_leading_tokens, module.num_mask_tokens
        upscaled = module.upscaled_blocks(src, features.high_res_feats)
        feature = module.embedding_maskfeature(blocks_to_spatial(upscaled))  # [4E, 4E, C/8]
        return jnp.einsum("hwc,c->hw", feature, module.hf_mlp(hs[s + 1 + k]))

    want = decoder.apply({"params": params["mask_decoder"]}, method=reference)
    masks, iou, _ = segmenter.decode_heads(params, features, prompts, transform)
    assert masks.shape == (5, 32, 32) and iou.shape == (4,)
    np.testing.assert_allclose(masks[-1], want, atol=1e-5 * float(jnp.abs(want).max()))


def test_selection_adds_the_hq_mask_to_sam2s_choice():
    rng = np.random.default_rng(1)
    sam = jnp.asarray(rng.normal(size=(4, 8, 8)), jnp.float32)
    hq = jnp.asarray(rng.normal(size=(8, 8)), jnp.float32)
    masks = jnp.concatenate([sam, hq[None]])
    iou = jnp.asarray([0.9, 0.2, 0.7, 0.4], jnp.float32)
    segmenter = Sam2HQSegmenter(HQ_TEST_CONFIG)
    low, scores, index = segmenter.select(masks, iou, multimask_output=True)
    np.testing.assert_allclose(low, sam[1:] + hq)
    np.testing.assert_allclose(scores, iou[1:])
    assert int(index) == 1  # candidate 2 (IoU 0.7), the best of 1..3
    # single mask: candidate 0 when stable, else the best multimask candidate (stability of SAM's own mask)
    stable = jnp.concatenate([jnp.full((1, 8, 8), 5.0), sam[1:], hq[None]])
    low, scores, index = segmenter.select(stable, iou, multimask_output=False)
    np.testing.assert_allclose(low, (5.0 + hq)[None])
    assert float(scores[0]) == pytest.approx(0.9) and int(index) == 0
    assert float(stability_score(sam[0], 0.05)) < 0.98
    low, scores, _ = segmenter.select(masks, iou, multimask_output=False)
    np.testing.assert_allclose(low, (sam[2] + hq)[None])
    assert float(scores[0]) == pytest.approx(0.7)
    # hq_token_only: the HQ mask alone with the selected candidate's score
    low, scores, index = segmenter.select(masks, iou, multimask_output=True, hq_token_only=True)
    np.testing.assert_allclose(low, hq[None])
    assert float(scores[0]) == pytest.approx(0.7) and int(index) == 0
    only = dataclasses.replace(segmenter, hq_token_only=True)
    np.testing.assert_allclose(only.select(masks, iou, multimask_output=False)[0], hq[None])
    low, _, _ = hq2_select((sam[1:], iou[1:], jnp.int32(1)), hq, hq_token_only=False)
    np.testing.assert_allclose(low, sam[1:] + hq)


def test_decode_and_predictor_agree_and_are_differentiable_in_the_box(model):
    predictor, image, features, transform = model
    segmenter, params = predictor.segmenter, predictor.params
    box = np.array([6.0, 5.0, 33.0, 30.0], np.float32)
    prompts = _prompts(segmenter, box=box)
    prediction = segmenter.decode(params, features, prompts, transform, multimask_output=True)
    masks, scores, low_res = predictor.predict(image, box=box, multimask_output=True, return_logits=True)
    assert masks.shape == (3, H, W) and low_res.shape == (3, 32, 32)
    np.testing.assert_allclose(prediction.logits, masks[int(prediction.index)], atol=1e-4)
    np.testing.assert_allclose(prediction.scores, scores, atol=1e-6)
    only, only_scores, _ = predictor.predict(box=box, multimask_output=True, hq_token_only=True,
                                             return_logits=True)
    assert only.shape == (1, H, W) and only_scores.shape == (1,)
    np.testing.assert_allclose(
        segmenter.decode(params, features, prompts, transform, hq_token_only=True).logits, only[0], atol=1e-4)

    def soft_area(b):
        pred = segmenter.decode(params, features, prompts.replace(box=b), transform, multimask_output=True)
        return jnp.sum(jax.nn.sigmoid(pred.logits))

    grad = jax.grad(soft_area)(jnp.asarray(box))
    assert np.all(np.isfinite(grad)) and float(jnp.abs(grad).max()) > 0


def test_decoder_reads_one_more_token_than_sam2s():
    hq = Sam2MaskDecoderHQ(32, HQ_TEST_CONFIG.decoder)
    plain = Sam2MaskDecoder(32, TEST_CONFIG.decoder)
    assert hq.num_read_tokens == plain.num_read_tokens + 1 == 1 + 1 + 4 + 1
