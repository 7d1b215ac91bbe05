"""Tests of the SamPredictor-compatible convenience layer (tiny random model)."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from jaxseg_robust.models import zoo
from jaxseg_robust.prompts.types import make_prompts

LOW = 32


@pytest.fixture(scope="module")
def predictor():
    pred = zoo.init("sam_tiny", jax.random.key(0))
    image = np.random.default_rng(0).integers(0, 256, (50, 37, 3), dtype=np.uint8)
    pred.set_image(image)
    return pred, image


def test_shapes_and_semantics(predictor):
    pred, image = predictor
    assert pred.segmenter.image_resize == "pil"  # SamPredictor.set_image path
    assert pred.get_image_embedding().shape == (1, 32, 8, 8)
    pts, labels = np.array([[10.0, 20.0], [30.0, 5.0]]), np.array([1, 0])
    masks, scores, low = pred.predict(pts, labels)
    assert masks.shape == (3, 50, 37) and masks.dtype == bool
    assert scores.shape == (3,) and low.shape == (3, LOW, LOW)
    logits, scores2, low2 = pred.predict(pts, labels, return_logits=True)
    np.testing.assert_array_equal(masks, logits > 0)
    np.testing.assert_allclose(scores, scores2)
    single, s1, l1 = pred.predict(box=np.array([2.0, 3, 30, 40]), multimask_output=False)
    assert single.shape == (1, 50, 37) and s1.shape == (1,) and l1.shape == (1, LOW, LOW)
    best = low[np.argmax(scores)][None]
    again, _, _ = pred.predict(pts, labels, mask_input=best)
    assert again.shape == (3, 50, 37)


def test_matches_segmenter_decode(predictor):
    pred, _ = predictor
    pts, labels = np.array([[10.0, 20.0]]), np.array([1])
    logits, scores, low = pred.predict(pts, labels, return_logits=True)
    p = make_prompts(pts, labels, mask_shape=(LOW, LOW))
    out = jax.jit(pred.segmenter.decode)(pred.params, pred.features, p, pred.transform)
    np.testing.assert_allclose(np.asarray(out.scores), scores, atol=1e-5)
    np.testing.assert_allclose(np.asarray(out.logits), logits[int(out.index)], atol=1e-4)


def test_one_call_form_bgr_and_compile_reuse(predictor):
    pred, image = predictor
    kwargs = dict(point_coords=np.array([[10.0, 20.0]]), point_labels=np.array([1]))
    want = pred.predict(**kwargs, return_logits=True)
    for got in (pred.predict(image, **kwargs, return_logits=True),
                pred(image, **kwargs, return_logits=True)):
        for a, b in zip(got, want):
            np.testing.assert_allclose(a, b, atol=1e-5)
    pred.set_image(np.ascontiguousarray(image[..., ::-1]), image_format="BGR")
    for a, b in zip(pred.predict(**kwargs, return_logits=True), want):
        np.testing.assert_allclose(a, b, atol=1e-5)
    before = pred._decode._cache_size()
    for n in (3, 4):  # both round up to 4 point slots: one compile
        pred.predict(np.ones((n, 2)) * 5, np.ones(n))
    assert pred._decode._cache_size() == before + 1


def test_errors(predictor):
    pred, image = predictor
    fresh = zoo.init("sam_tiny", jax.random.key(1))
    with pytest.raises(RuntimeError, match="set_image"):
        fresh.predict(point_coords=np.array([[1.0, 1.0]]), point_labels=np.array([1]))
    with pytest.raises(RuntimeError, match="set_image"):
        fresh.get_image_embedding()
    with pytest.raises(ValueError, match="point_labels"):
        pred.predict(point_coords=np.array([[1.0, 1.0]]))
    with pytest.raises(ValueError, match="point_coords"):
        pred.predict(point_labels=np.array([1]))
    with pytest.raises(ValueError, match="mask_input"):
        pred.predict(box=np.array([1.0, 1, 5, 5]), mask_input=np.zeros((1, 16, 16)))
    with pytest.raises(ValueError, match="labels"):
        pred.predict(point_coords=np.array([[1.0, 1.0]]), point_labels=np.array([2]))
    with pytest.raises(ValueError, match="image_format"):
        pred.set_image(image, image_format="HSV")
