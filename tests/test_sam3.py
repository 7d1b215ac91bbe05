"""Tests of SAM 3's interactive model (tiny random model ``sam3_tiny``): the RoPE angles, the tiled
position table, the hole filling, the preprocessing, the segmenter's rules and zoo names, the
predictor. Parity with the authors' code is in tests/test_sam3_parity.py."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import ndimage

from jaxseg_robust.models import zoo
from jaxseg_robust.models.base import evaluation_multimask, family_rules, takes_boxes
from jaxseg_robust.models.sam2.config import TEST_CONFIG as SAM2_TEST_CONFIG
from jaxseg_robust.models.sam3.config import OFFICIAL_CONFIG, TEST_CONFIG, Sam3Config, Sam3VitConfig
from jaxseg_robust.models.sam3.image_encoder import apply_rope, axial_rope_angles, tiled_position_table
from jaxseg_robust.models.sam3.segmenter import HOLE_LOGIT, Sam3Segmenter, fill_small_holes
from jaxseg_robust.ops.resize import resize_bilinear_antialias_host
from jaxseg_robust.prompts.types import make_prompts

H, W = 40, 52


@pytest.fixture(scope="module")
def model():
    predictor = zoo.init("sam3_tiny", jax.random.key(0))
    image = np.random.default_rng(0).integers(0, 256, (H, W, 3), dtype=np.uint8)
    segmenter, params = predictor.segmenter, predictor.params
    model_input, transform = segmenter.preprocess(image)
    features = jax.jit(segmenter.embed)(params, model_input)
    return predictor, image, features, transform


def test_zoo_names_and_rules():
    spec = zoo.get("sam3")
    assert spec.family == "sam3" and spec.checkpoint_hint == "sam3.pt" and spec.config == OFFICIAL_CONFIG
    vit = spec.config.encoder
    assert (vit.grid_size, vit.pretrain_grid, vit.head_dim, vit.mlp_hidden) == (72, 24, 64, 4736)
    assert (spec.config.embedding_size, spec.config.low_res_size) == (72, 288)
    assert zoo.get("sam3_tiny").checkpoint_hint.startswith("<none")
    segmenter = zoo.segmenter("sam3_tiny")
    assert isinstance(segmenter, Sam3Segmenter)
    rules = family_rules(segmenter)
    assert rules.family == "sam3" and not rules.resized_frame and rules.differentiable_clicks
    assert evaluation_multimask(segmenter) is False and takes_boxes(segmenter)
    assert segmenter.probability_threshold == 0.5


def test_config_round_trip_and_refusals():
    assert Sam3Config.from_dict(TEST_CONFIG.to_dict()) == TEST_CONFIG
    with pytest.raises(ValueError, match="last global block"):
        Sam3VitConfig(depth=32, global_att_blocks=(7, 15, 23))
    with pytest.raises(ValueError, match="multiple of 4"):
        Sam3VitConfig(embed_dim=36, num_heads=6)
    with pytest.raises(ValueError, match="Sam3Config"):
        Sam3Segmenter(SAM2_TEST_CONFIG)


def test_rope_angles_follow_the_axial_definition():
    """Token t = y * side + x: first half x * scale * f_j, second half y * scale * f_j."""
    angles = axial_rope_angles(8, 3, 0.5, 100.0)
    f = 100.0 ** (-np.arange(0, 8, 4) / 8)
    for t in range(9):
        y, x = divmod(t, 3)
        np.testing.assert_allclose(angles[t], np.concatenate([x * 0.5 * f, y * 0.5 * f]), rtol=1e-6)


def test_rope_rotates_interleaved_pairs_and_keeps_norms():
    rng = np.random.default_rng(1)
    q = jnp.asarray(rng.standard_normal((2, 9, 8)), jnp.float32)
    angles = axial_rope_angles(8, 3, 1.0, 10000.0)
    out = np.asarray(apply_rope(q, angles))
    z = np.asarray(q)[..., 0::2] + 1j * np.asarray(q)[..., 1::2]
    want = z * np.exp(1j * angles)
    np.testing.assert_allclose(out[..., 0::2], want.real, atol=1e-6)
    np.testing.assert_allclose(out[..., 1::2], want.imag, atol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(out, axis=-1), np.linalg.norm(np.asarray(q), axis=-1), rtol=1e-6)


def test_position_table_is_tiled_and_cut_without_the_class_token():
    table = jnp.arange(10 * 2, dtype=jnp.float32).reshape(10, 2)  # class token + 3 x 3
    tiled = np.asarray(tiled_position_table(table, 3, 8))
    square = np.asarray(table[1:]).reshape(3, 3, 2)
    assert tiled.shape == (8, 8, 2)
    for y in range(8):
        for x in range(8):
            np.testing.assert_array_equal(tiled[y, x], square[y % 3, x % 3])


def test_fill_small_holes_fills_8_connected_background_up_to_the_area():
    rng = np.random.default_rng(2)
    logits = rng.normal(0.5, 1.0, (24, 24)).astype(np.float32)
    logits[2:8, 2:9] = -3.0  # a 42-pixel background component
    filled = np.asarray(fill_small_holes(jnp.asarray(logits), 20.0))
    labels, _ = ndimage.label(logits <= 0, structure=np.ones((3, 3)))
    sizes = np.bincount(labels.ravel())
    hole = (labels > 0) & (sizes[labels] <= 20)
    assert hole.any() and (~hole & (logits <= 0)).any()
    np.testing.assert_array_equal(filled, np.where(hole, HOLE_LOGIT, logits))
    np.testing.assert_array_equal(np.asarray(fill_small_holes(jnp.asarray(logits), 0.0)), logits)


def test_preprocess_is_the_rounded_float_resize_normalised(model):
    predictor, image, _, transform = model
    segmenter = predictor.segmenter
    x, _ = segmenter.preprocess(image)
    s = TEST_CONFIG.image_size
    want = (np.rint(resize_bilinear_antialias_host(image.astype(np.float32), (s, s))) / 255.0 - 0.5) / 0.5
    np.testing.assert_allclose(np.asarray(x), want, atol=1e-6)
    levels = (np.asarray(x) * 0.5 + 0.5) * 255.0
    np.testing.assert_allclose(levels, np.rint(levels), atol=1e-3)
    traced = np.asarray(jax.jit(segmenter.traced_model_input)(jnp.asarray(image, jnp.float32)))
    assert np.mean(np.abs(traced - np.asarray(x)) > 1e-5) < 0.01
    assert tuple(transform.resized_hw) == (s, s)


def test_decode_fills_holes_of_the_full_resolution_logits_only(model):
    predictor, _, features, transform = model
    segmenter, params = predictor.segmenter, predictor.params
    low = segmenter.config.low_res_size
    prompts = make_prompts(np.array([[20.0, 15.0]], np.float32), np.array([1]), None, num_slots=2,
                           mask_shape=(low, low))
    pred = segmenter.decode(params, features, prompts, transform, multimask_output=True)
    every, iou = segmenter.decode_low_res(params, features, prompts, transform)
    selected = every[1:][int(pred.index)]
    plain = Sam3Segmenter(dataclasses.replace(TEST_CONFIG, max_hole_area=0.0))
    unfilled = plain.upsample(selected, transform)
    filled = segmenter.upsample(selected, transform)
    np.testing.assert_allclose(np.asarray(pred.logits), np.asarray(filled), atol=1e-5)
    np.testing.assert_allclose(np.asarray(pred.low_res_logits),
                               np.clip(np.asarray(every[1:]), -32, 32), atol=1e-5)
    holes = np.asarray(fill_small_holes(selected, segmenter.config.max_hole_area)) != np.asarray(selected)
    assert holes.any() == bool(np.any(np.asarray(filled) != np.asarray(unfilled)))


def test_decode_is_differentiable_in_the_clicks(model):
    predictor, _, features, transform = model
    segmenter, params = predictor.segmenter, predictor.params
    low = segmenter.config.low_res_size
    base = make_prompts(np.array([[20.0, 15.0], [30.0, 25.0]], np.float32), np.array([1, 0]), None,
                        num_slots=3, mask_shape=(low, low))

    def loss(points):
        return jnp.sum(jax.nn.sigmoid(segmenter.decode(params, features, base.replace(points=points),
                                                       transform).logits))

    grad = np.asarray(jax.grad(loss)(base.points))
    assert np.all(np.isfinite(grad)) and np.abs(grad[:2]).sum() > 0 and np.all(grad[2] == 0)


def test_predictor_has_predict_insts_signature(model):
    predictor, image, _, _ = model
    masks, scores, low = predictor.predict(image, point_coords=np.array([[20.0, 15.0]]),
                                           point_labels=np.array([1]), multimask_output=True)
    assert masks.shape == (3, H, W) and masks.dtype == bool and scores.shape == (3,)
    assert low.shape == (3, 32, 32) and np.abs(low).max() <= 32
