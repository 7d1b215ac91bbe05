"""Click-map models (RITM, SimpleClick) behind the Segmenter protocol, on tiny random models.

Parity with the authors' code is in test_click_models_parity.py and
test_click_noc_parity.py; here: the contract (shapes, padding, feedback,
threshold), vmap, gradients through the soft click rendering against finite
differences, the predictor, and the NoC loop's compilation.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxseg_robust.models import zoo
from jaxseg_robust.models.clickmap.encoding import click_maps
from jaxseg_robust.models.clickmap.isegm import (
    CascadeConfig,
    IsegmOptions,
    authors_options,
)
from jaxseg_robust.models.clickmap.noc import NocConfig, noc_trajectory
from jaxseg_robust.models.clickmap.segmenter import OUTSIDE_LOGIT, ClickMapSegmenter
from jaxseg_robust.models.clickmap.zoom_in import ZoomInConfig
from jaxseg_robust.models.simpleclick.config import TINY as SC_TINY
from jaxseg_robust.prompts.types import make_prompts


@pytest.fixture(scope="module")
def ritm():
    return zoo.init("ritm_tiny", jax.random.key(0))


@pytest.fixture(scope="module")
def simpleclick():
    return zoo.init("simpleclick_tiny", jax.random.key(1))


def _image(h, w, seed=0):
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[:h, :w]
    obj = (yy - h / 2) ** 2 + (xx - w / 2) ** 2 < (min(h, w) / 3) ** 2
    image = (rng.uniform(0, 80, (h, w, 3)) + 150 * obj[..., None]).astype(np.uint8)
    return image, obj


def test_contract_extras(simpleclick):
    seg = simpleclick.segmenter
    assert seg.probability_threshold == pytest.approx(0.49)
    assert seg.frame_policy == "exact"
    assert seg.feedback_shape((37, 50)) == (37, 50)


def test_decode_padding_feedback_and_vmap(simpleclick):
    seg, params = simpleclick.segmenter, simpleclick.params
    image, _ = _image(210, 200)
    x, tr = seg.preprocess(image, frame_hw=(224, 224))
    feats = seg.embed(params, x)
    prompts = make_prompts([[120, 100], [30, 40]], [1, 0], num_slots=4, mask_shape=(224, 224))
    pred = jax.jit(seg.decode)(params, feats, prompts, tr)
    assert pred.logits.shape == (224, 224)
    assert np.all(np.asarray(pred.logits)[210:] == OUTSIDE_LOGIT)
    assert np.all(np.asarray(pred.logits)[:, 200:] == OUTSIDE_LOGIT)
    fb = seg.feedback(pred)
    np.testing.assert_allclose(np.asarray(fb), np.asarray(jax.nn.sigmoid(pred.logits)))
    # the feedback goes back in as the previous-mask channel
    with_mask = prompts.replace(mask_logits=fb, has_mask=jnp.asarray(True))
    pred2 = jax.jit(seg.decode)(params, feats, with_mask, tr)
    assert not np.allclose(np.asarray(pred2.logits), np.asarray(pred.logits))
    # vmap over two instances equals one at a time
    batch = jax.tree.map(lambda *a: jnp.stack(a), prompts, with_mask)
    vm = jax.jit(jax.vmap(lambda p: seg.decode(params, feats, p, tr)))(batch)
    np.testing.assert_allclose(np.asarray(vm.logits[1]), np.asarray(pred2.logits), atol=1e-5)


@pytest.mark.slow
def test_predictor_without_options_is_one_network_run(ritm):
    image, _ = _image(30, 44)
    masks, scores, probs = ritm.predict(image, point_coords=np.array([[20, 15]]),
                                        point_labels=np.array([1]))
    assert masks.shape == (1, 30, 44) and masks.dtype == bool and scores.shape == (1,)
    seg = ritm.segmenter
    x, _ = seg.preprocess(image)
    want = jax.nn.sigmoid(seg.grid_logits(ritm.params, x, jnp.asarray([[20., 15.]]),
                                          jnp.asarray([1]), jnp.zeros((30, 44))))
    np.testing.assert_allclose(probs[0], np.asarray(want), atol=1e-6)
    np.testing.assert_array_equal(masks[0], probs[0] > 0.49)
    masks2, _, probs2 = ritm.predict(point_coords=np.array([[20, 15]]),
                                     point_labels=np.array([1]), mask_input=probs)
    assert probs2.shape == (1, 30, 44)
    with pytest.raises(ValueError, match="box"):
        ritm.predict(box=np.array([1, 2, 3, 4]))
    with pytest.raises(ValueError, match="mask_input"):
        ritm.predict(point_coords=np.array([[1, 1]]), point_labels=np.array([1]),
                     mask_input=np.zeros((1, 5, 5)))


def test_hard_disks_follow_isegm_padding_rule():
    maps = click_maps(jnp.asarray([[-2., -2.], [3., -1.]]), jnp.asarray([1, 0]), (8, 8), 2.0)
    assert float(maps[..., 0].sum()) == 0.0  # both coordinates negative: isegm padding
    assert float(maps[..., 1].sum()) > 0.0  # one negative coordinate: drawn (clipped)


@pytest.mark.slow
def test_soft_click_gradients_match_finite_differences(simpleclick):
    """Central differences in float64 (x64) of the soft-rendered model against its gradient."""
    with jax.enable_x64(True):
        seg = ClickMapSegmenter(dataclasses.replace(SC_TINY, dtype="float64"),
                                click_encoding="soft")
        params = jax.tree.map(lambda a: jnp.asarray(a, jnp.float64), simpleclick.params)
        image, _ = _image(224, 224)
        x = jnp.asarray(image, jnp.float64) / 255
        weights = jnp.asarray(np.random.default_rng(3).standard_normal((224, 224)))
        labels = jnp.asarray([1, 0])
        prev = jnp.full((224, 224), 0.3, jnp.float64)

        def loss(p):
            logits = seg.grid_logits(params, x, p, labels, prev)
            return jnp.sum(jax.nn.sigmoid(logits) * weights)

        pts = jnp.asarray([[120.3, 94.6], [36.2, 65.1]], jnp.float32)
        grad = np.asarray(jax.jit(jax.grad(loss))(pts), np.float64)
        f = jax.jit(loss)
        h = 0.02
        fd = np.zeros_like(grad)
        for i in range(2):
            for j in range(2):
                e = np.zeros((2, 2), np.float32)
                e[i, j] = h
                fd[i, j] = (float(f(pts + e)) - float(f(pts - e))) / (2 * h)
    assert np.linalg.norm(grad) > 0
    assert np.linalg.norm(grad - fd) <= 1e-2 * np.linalg.norm(fd)


def test_simpleclick_sizes_and_position_embedding(simpleclick):
    with pytest.raises(ValueError, match="multiples of the patch size"):
        SC_TINY.input_grid((230, 224))
    image, _ = _image(224, 224)
    masks, _, probs = simpleclick.predict(image, point_coords=np.array([[100, 120]]),
                                          point_labels=np.array([1]))
    assert masks.shape == (1, 224, 224)
    # with the authors' machinery any image size works (zoom-in to 224 x 224, flip)
    odd, _ = _image(100, 130)
    options = IsegmOptions(zoom_in=ZoomInConfig(target_hw=(224, 224)), with_flip=True)
    masks, _, probs = simpleclick.predict(odd, point_coords=np.array([[60, 50]]),
                                          point_labels=np.array([1]), options=options)
    assert masks.shape == (1, 100, 130) and simpleclick.num_clicks == 1
    assert bool(simpleclick.state.has_prev)


def test_bicubic_taps_match_torch():
    torch = pytest.importorskip("torch")
    from jaxseg_robust.models.simpleclick.vit import interpolate_pos_embed

    rng = np.random.default_rng(0)
    for (g0, g1) in (((28, 28), (42, 42)), ((14, 14), (9, 20))):
        pos = rng.standard_normal((g0[0] * g0[1], 6)).astype(np.float32)
        want = torch.nn.functional.interpolate(
            torch.from_numpy(pos).reshape(1, *g0, 6).permute(0, 3, 1, 2), size=g1,
            mode="bicubic", align_corners=False).permute(0, 2, 3, 1)[0].numpy()
        got = np.asarray(interpolate_pos_embed(jnp.asarray(pos), g0, g1))
        np.testing.assert_allclose(got, want, atol=1e-5)


def test_authors_options():
    sc = authors_options("simpleclick", "DAVIS")
    assert sc.zoom_in.target_hw == (672, 672) and sc.with_flip and sc.cascade is None
    assert authors_options("ritm").zoom_in.target_hw == (400, 400)
    cfr = authors_options("cfr_icl")
    assert cfr.cascade == CascadeConfig(steps=5, adaptive=True, clicks=1, max_changed=20)
    with pytest.raises(ValueError, match="skip_clicks"):
        ZoomInConfig(skip_clicks=1)


@pytest.mark.slow
def test_ritm_tiny_decode_and_soft_gradient(ritm):
    """The RITM network (slow: HRNet's many layers take minutes to compile on CPU)."""
    seg = dataclasses.replace(ritm.segmenter, click_encoding="soft")
    image, _ = _image(30, 44)
    x, tr = seg.preprocess(image)
    prompts = make_prompts([[20, 15]], [1], num_slots=2, mask_shape=(30, 44))

    def loss(points):
        pred = seg.decode(ritm.params, seg.embed(ritm.params, x), prompts.replace(points=points),
                          tr)
        return jnp.mean(jax.nn.sigmoid(pred.logits))

    grad = jax.jit(jax.grad(loss))(prompts.points)
    assert np.isfinite(np.asarray(grad)).all() and float(jnp.abs(grad[0]).sum()) > 0
    assert float(jnp.abs(grad[1]).sum()) == 0.0  # the padding slot


def test_noc_loop_on_a_padded_frame(simpleclick):
    """One program for every image size in a frame; the cascade's first click is peeled
    statically and the remaining clicks run in the scan."""
    seg, params = simpleclick.segmenter, simpleclick.params
    options = IsegmOptions(zoom_in=ZoomInConfig(target_hw=(224, 224)), with_flip=False,
                           cascade=CascadeConfig(steps=2))
    config = NocConfig(n_clicks=3, options=options)
    traces = []

    def run(p, img, hw, gt, valid):
        traces.append(1)
        return noc_trajectory(seg, p, img, hw, gt, valid, config)

    run = jax.jit(run)
    outs = []
    for h, w, seed in ((50, 70, 0), (64, 60, 1)):
        image, obj = _image(h, w, seed)
        x, tr = seg.preprocess(image, frame_hw=(64, 72))
        gt = np.zeros((64, 72), bool)
        gt[:h, :w] = obj
        outs.append(run(params, x, tr.original_hw, jnp.asarray(gt), jnp.asarray(gt | True)))
    assert len(traces) == 1  # one program for every image in the frame
    for out in outs:
        assert out["ious"].shape == (3,) and bool(out["positive"][0])
        assert np.all((np.asarray(out["ious"]) >= 0) & (np.asarray(out["ious"]) <= 1))
        assert float(out["prob"][60:, :].max()) <= 1.0
