"""SAM-family segmenters with fixed prompts as dense attack targets (models/dense/prompted.py)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxseg_robust.attacks.perturb import attack_targets, padam
from jaxseg_robust.attacks.perturb.common import MAX_DAMAGE, uniform_start
from jaxseg_robust.models import zoo
from jaxseg_robust.models.dense.base import DenseModel
from jaxseg_robust.models.dense.prompted import (PromptedSegmenter, tight_box_prompts, stack_prompts,
                                                 with_prompts)
from jaxseg_robust.prompts.types import make_prompts


@pytest.fixture(scope="module")
def tiny():
    segmenter = zoo.segmenter("sam_tiny")
    return segmenter, segmenter.init(jax.random.key(0))


# One compiled function per (model, shape): the model is a static, hashable argument.
MASK_LOGITS = jax.jit(PromptedSegmenter.mask_logits, static_argnums=0)
APPLY = jax.jit(PromptedSegmenter.apply, static_argnums=0)


def _scene(seed: int, batch: int = 2, height: int = 37, width: int = 53):
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, (batch, height, width, 3), dtype=np.uint8)
    gt = np.zeros((batch, height, width), np.int8)
    for b in range(batch):
        y0, x0 = rng.integers(0, height // 2), rng.integers(0, width // 2)
        gt[b, y0:y0 + rng.integers(3, height // 2), x0:x0 + rng.integers(3, width // 2)] = 1
    gt[:, 0, :] = -1
    return images, gt


def test_is_a_hashable_dense_model(tiny):
    segmenter, _ = tiny
    model = PromptedSegmenter(segmenter)
    assert isinstance(model, DenseModel)
    assert model.num_classes == 2 and model.background_class == 0
    assert hash(model) == hash(PromptedSegmenter(segmenter)) and model == PromptedSegmenter(segmenter)


@pytest.mark.parametrize("multimask", [True, pytest.param(False, marks=pytest.mark.slow)])
def test_matches_preprocess_embed_decode_of_the_segmenter(tiny, multimask):
    segmenter, params = tiny
    images, gt = _scene(0)
    prompts = tight_box_prompts(gt, segmenter.config.low_res_size)
    model = PromptedSegmenter(segmenter, multimask_output=multimask)
    ours = np.asarray(MASK_LOGITS(model, with_prompts(params, prompts), jnp.asarray(images, jnp.float32) / 255.0))
    assert ours.shape == gt.shape
    embed = jax.jit(segmenter.embed)
    decode = jax.jit(lambda f, p, t: segmenter.decode(params, f, p, t, multimask_output=multimask).logits)
    for b in range(images.shape[0]):
        x, transform = segmenter.preprocess(images[b])
        one = jax.tree.map(lambda leaf: leaf[b], prompts)
        want = np.asarray(decode(embed(params, x), one, transform))
        np.testing.assert_allclose(ours[b], want, rtol=1e-4, atol=1e-4 * max(1.0, np.abs(want).max()))


def test_perturbation_attack_gets_gradients_and_stays_feasible(tiny):
    """One PAdam step from the random start moves (almost) every coordinate: the image gradient flows."""
    segmenter, params = tiny
    images, gt = _scene(2)
    model = PromptedSegmenter(segmenter)
    prompted = with_prompts(params, tight_box_prompts(gt, model.low_res_size))
    x = jnp.asarray(images, jnp.float32) / 255.0
    y, m = attack_targets(jnp.asarray(gt), jnp.asarray(gt) >= 0, num_classes=2, family=MAX_DAMAGE)
    keys = jax.random.split(jax.random.key(0), 2)
    result = padam(model.apply, prompted, x, y, m, keys, loss="ce", epsilon=8 / 255, num_steps=1)
    delta = np.asarray(result.images - x)
    assert np.abs(delta).max() <= 8 / 255 + 1e-6
    assert np.asarray(result.images).min() >= 0 and np.asarray(result.images).max() <= 1
    np.testing.assert_array_equal(np.asarray(result.forwards), [1, 1])
    start = np.asarray(uniform_start(keys, x, 8 / 255))
    moved = np.abs(np.asarray(result.images) - start) > 1e-4
    inside = (x > 16 / 255) & (x < 1 - 16 / 255)  # away from the box, so no clipping hides a step
    assert moved[np.asarray(inside)].mean() > 0.5


def test_sam_hq_works_too():
    segmenter = zoo.segmenter("sam_hq_tiny")
    params = segmenter.init(jax.random.key(1))
    images, gt = _scene(3, batch=1)
    model = PromptedSegmenter(segmenter)
    logits = APPLY(model, with_prompts(params, tight_box_prompts(gt, model.low_res_size)),
                   jnp.asarray(images, jnp.float32) / 255.0)
    assert logits.shape == (1, *gt.shape[1:], 2) and np.isfinite(np.asarray(logits)).all()


@settings(max_examples=15)
@given(st.integers(0, 2**31 - 1), st.integers(1, 4), st.integers(1, 4), st.booleans())
def test_tight_box_prompts_are_inclusive_tight_boxes_of_the_object(seed, height, width, empty):
    rng = np.random.default_rng(seed)
    gt = rng.integers(-1, 2, (2, height, width)).astype(np.int8)
    if empty:
        gt[0] = np.minimum(gt[0], 0)
    prompts = tight_box_prompts(gt, 8)
    assert prompts.box.shape == (2, 4) and bool(jnp.all(prompts.has_box))
    assert prompts.mask_logits.shape == (2, 8, 8) and not bool(jnp.any(prompts.has_mask))
    assert np.all(np.asarray(prompts.labels) == -1)
    for b in range(2):
        rows, cols = np.nonzero(gt[b] == 1)
        want = [0, 0, 1, 1] if rows.size == 0 else [cols.min(), rows.min(), cols.max(), rows.max()]
        np.testing.assert_array_equal(np.asarray(prompts.box[b]), np.asarray(want, np.float32))


def test_bad_inputs_name_the_argument(tiny):
    segmenter, params = tiny
    model = PromptedSegmenter(segmenter)
    one = stack_prompts([make_prompts(box=[0, 0, 5, 5], mask_shape=(32, 32))])
    with pytest.raises(ValueError, match="prompts"):
        model.mask_logits(with_prompts(params, one), jnp.zeros((2, 8, 8, 3)))
    with pytest.raises(ValueError, match="prompts"):
        with_prompts(params, make_prompts(box=[0, 0, 5, 5]))
    with pytest.raises(ValueError, match="images"):
        model.apply(with_prompts(params, one), jnp.zeros((1, 8, 8)))
    with pytest.raises(ValueError, match="gt"):
        tight_box_prompts(np.zeros((4, 4)), 32)
    with pytest.raises(ValueError, match="prompt_sets"):
        stack_prompts([])


def test_init_gives_params_for_a_batch_of_one(tiny):
    segmenter, _ = tiny
    model = PromptedSegmenter(segmenter, multimask_output=False)
    params = model.init(jax.random.key(3))
    side = segmenter.config.image_size - 1
    assert params.prompts.points.shape[0] == 1 and bool(params.prompts.has_box[0])
    np.testing.assert_array_equal(np.asarray(params.prompts.box[0]), [0, 0, side, side])
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.shape(a), np.shape(b)), params.model,
                 segmenter.param_shapes())
