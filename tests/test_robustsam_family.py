"""RobustSAM behind the Segmenter seam, without torch (docs/models/robustsam.md).

* the "clear" decoder path is SAM's decoder on RobustSAM's weights (the claim
  the family page makes for the BREPS wrapper's predictor call);
* the "robust" path caches its prompt-independent encoder features at ``embed``,
  differs from the clear path, batches under ``vmap`` and is differentiable in the box;
* the family's rules are the SAM family's under RobustSAM's name.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxseg_robust.models import base, zoo
from jaxseg_robust.models.robustsam.registry import TINY_CONFIG, with_decoder_path
from jaxseg_robust.models.robustsam.segmenter import RobustSamSegmenter
from jaxseg_robust.models.sam.config import SamConfig
from jaxseg_robust.models.sam.segmenter import SamFeatures, SamSegmenter
from jaxseg_robust.prompts.types import make_prompts

BOXES = np.array([[8.0, 6.0, 40.0, 33.0], [2.0, 3.0, 20.0, 30.0]], np.float32)


@pytest.fixture(scope="module")
def tiny():
    """(robust segmenter, clear segmenter, params, model input, transform) of robustsam_tiny."""
    robust = RobustSamSegmenter(TINY_CONFIG)
    clear = RobustSamSegmenter(with_decoder_path(TINY_CONFIG, "clear"))
    params = robust.init(3)
    image = np.random.default_rng(0).integers(0, 256, (40, 48, 3), dtype=np.uint8)
    x, transform = robust.preprocess(image)
    return robust, clear, params, x, transform


def box_prompts(box, config=TINY_CONFIG):
    low = (config.low_res_size, config.low_res_size)
    return make_prompts(None, None, box, num_slots=2, mask_shape=low)


def test_clear_path_is_sams_decoder_on_robustsams_weights(tiny):
    _, clear, params, x, transform = tiny
    fields = {f.name: getattr(TINY_CONFIG, f.name) for f in dataclasses.fields(SamConfig)}
    sam = SamSegmenter(SamConfig(**{**fields, "family": "sam"}))
    sam_decoder = sam.param_shapes()["mask_decoder"]
    sam_params = {**params, "mask_decoder": {k: params["mask_decoder"][k] for k in sam_decoder}}
    assert set(params["mask_decoder"]) - set(sam_decoder) == {
        "custom_robust_token", "robust_mlp", "custom_token_block", "fourier_mask_features",
        "fourier_first_layer_features", "fourier_last_layer_features"}
    features = clear.embed(params, x)
    assert features.interm_embeddings == ()
    prompts = box_prompts(BOXES[0])
    for multimask in (True, False):
        ours = clear.decode(params, features, prompts, transform, multimask_output=multimask)
        want = sam.decode(sam_params, sam.embed(sam_params, x), prompts, transform,
                          multimask_output=multimask)
        np.testing.assert_array_equal(ours.low_res_logits, want.low_res_logits)
        np.testing.assert_array_equal(ours.scores, want.scores)


def test_robust_path_caches_its_encoder_features_and_differs_from_clear(tiny):
    robust, clear, params, x, transform = tiny
    features = robust.embed(params, x)
    low, c = TINY_CONFIG.low_res_size, TINY_CONFIG.prompt_embed_dim
    assert [a.shape for a in features.interm_embeddings] == [(low, low, c // 8)]
    batched = robust.embed(params, jnp.stack([x, x]))
    np.testing.assert_allclose(batched.interm_embeddings[0][1], features.interm_embeddings[0],
                               rtol=0, atol=1e-5 * float(np.abs(features.interm_embeddings[0]).max()))
    prompts = box_prompts(BOXES[0])
    low_robust, iou_robust = robust.decode_low_res(params, features, prompts, transform)
    low_clear, iou_clear = clear.decode_low_res(params, clear.embed(params, x), prompts, transform)
    assert low_robust.shape == low_clear.shape and np.all(np.isfinite(low_robust))
    assert np.abs(low_robust - low_clear).max() > 1e-2 * np.abs(low_clear).max()
    # the IoU head reads the IoU token after a transformer run on other output tokens
    assert not np.allclose(iou_robust, iou_clear)
    with pytest.raises(ValueError, match="must hold the robust encoder features"):
        robust.decode(params, SamFeatures(image_embeddings=features.image_embeddings), prompts,
                      transform)


def test_robust_path_batches_under_vmap_and_has_box_gradients(tiny):
    robust, _, params, x, transform = tiny
    features = robust.embed(params, x)
    prompts = jax.tree.map(lambda *a: jnp.stack(a), *[box_prompts(b) for b in BOXES])

    def logits(p):
        return robust.decode(params, features, p, transform).logits

    batched = jax.jit(jax.vmap(logits))(prompts)
    one_set = jax.jit(logits)
    for i, box in enumerate(BOXES):
        one = one_set(box_prompts(box))
        np.testing.assert_allclose(batched[i], one, rtol=0, atol=1e-4 * float(np.abs(one).max()))

    def mean_probability(box):
        return jax.nn.sigmoid(logits(box_prompts(BOXES[0]).replace(box=box))).mean()

    grad = jax.jit(jax.grad(mean_probability))(jnp.asarray(BOXES[0]))
    assert np.all(np.isfinite(grad)) and np.abs(grad).max() > 0


def test_rules_are_the_sam_familys_under_robustsams_name():
    segmenter = RobustSamSegmenter(TINY_CONFIG)
    rules = base.family_rules(segmenter)
    assert rules == dataclasses.replace(base.family_rules(SamSegmenter(SamConfig(
        encoder=TINY_CONFIG.encoder))), family="robustsam")
    assert base.takes_boxes(segmenter) and base.has_resized_frame(segmenter)
    assert segmenter.probability_threshold == 0.5
    assert segmenter.feedback_shape((40, 48)) == (32, 32)


def test_zoo_names_and_hints():
    names = zoo.known_names()
    assert {"robustsam_vit_b", "robustsam_vit_l", "robustsam_vit_h", "robustsam_tiny"} <= set(names)
    tiny = zoo.get("robustsam_tiny")
    assert tiny.family == "robustsam" and tiny.checkpoint_hint.startswith("<none")
    assert zoo.get("robustsam_vit_b").checkpoint_hint == "robustsam_checkpoint_b.pth"
    assert zoo.get("robustsam_vit_l").config.decoder_path == "clear"
