"""Tests of SamSegmenter: preprocess, embed, decode (fixed-shape prompts, jit/vmap/grad)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxseg_robust.models import zoo
from jaxseg_robust.models.base import Prediction, Segmenter
from jaxseg_robust.models.sam.segmenter import OUTSIDE_LOGIT, SamSegmenter, make_transform
from jaxseg_robust.prompts.types import Prompts, make_prompts

LOW = 32  # low-res logits of the tiny model (128 px input)


@pytest.fixture(scope="module")
def model():
    seg = zoo.segmenter("sam_tiny")
    params = seg.init(0)
    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, (45, 70, 3), dtype=np.uint8)
    x, transform = seg.preprocess(image)
    embed = jax.jit(seg.embed)
    features = embed(params, x)
    decode = jax.jit(seg.decode, static_argnames="multimask_output")
    return seg, params, image, transform, features, decode, embed


def prompts(points=None, labels=None, box=None, mask=None, slots=4):
    return make_prompts(points, labels, box, mask, num_slots=slots, mask_shape=(LOW, LOW))


def test_is_a_segmenter_and_preprocess(model):
    seg, _, image, transform, _, _, _ = model
    assert isinstance(seg, Segmenter)
    x, t = seg.preprocess(image)
    assert x.shape == (128, 128, 3) and x.dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(t.original_hw), [45, 70])
    np.testing.assert_array_equal(np.asarray(t.resized_hw), [82, 128])  # int(45*128/70 + .5)
    np.testing.assert_allclose(np.asarray(t.scale_xy), [128 / 70, 82 / 45], rtol=1e-6)
    assert t.frame_hw == (45, 70)
    assert (np.asarray(x)[82:] == 0).all()  # normalised, then zero-padded
    mean, std = np.array(seg.config.pixel_mean), np.array(seg.config.pixel_std)
    np.testing.assert_allclose(np.asarray(x)[:82].max(), ((255 - mean) / std).max(), atol=0.05)
    # both image paths agree closely (PIL rounds to uint8)
    x_pil, _ = dataclasses.replace(seg, image_resize="pil").preprocess(image)
    assert np.abs(np.asarray(x_pil) - np.asarray(x)).max() < 0.05
    _, framed = seg.preprocess(image, frame_hw=(64, 80))
    assert framed.frame_hw == (64, 80)


@pytest.mark.parametrize("bad, match", [
    (np.zeros((4, 5), np.uint8), "shape"),
    (np.zeros((4, 5, 4), np.uint8), "shape"),
    (np.zeros((1, 3000, 3), np.uint8), "elongated"),
    (np.zeros((4, 5, 3), np.int64), "uint8 or float"),
])
def test_preprocess_rejects_bad_images(model, bad, match):
    seg = model[0]
    with pytest.raises(ValueError, match=match):
        seg.preprocess(bad)
    with pytest.raises(ValueError, match="frame_hw"):
        seg.preprocess(np.zeros((10, 10, 3), np.uint8), frame_hw=(5, 20))
    with pytest.raises(ValueError, match="uint8"):
        dataclasses.replace(seg, image_resize="pil").preprocess(np.zeros((4, 5, 3), np.float32))
    with pytest.raises(ValueError, match="image_resize"):
        SamSegmenter(seg.config, image_resize="bicubic")


def test_decode_outputs_and_selection(model):
    seg, params, _, transform, features, decode, _ = model
    p = prompts([[20.0, 10.0]], [1])
    multi = decode(params, features, p, transform, multimask_output=True)
    single = decode(params, features, p, transform, multimask_output=False)
    assert isinstance(multi, Prediction)
    assert multi.logits.shape == (45, 70) and multi.low_res_logits.shape == (3, LOW, LOW)
    assert multi.scores.shape == (3,) and int(multi.index) == int(np.argmax(multi.scores))
    assert single.low_res_logits.shape == (1, LOW, LOW) and int(single.index) == 0
    # logits = SAM's postprocess of the selected low-res candidate (float64 reference)
    from test_ops_resize import ref_postprocess
    want = ref_postprocess(np.asarray(multi.selected_low_res), (82, 128), (45, 70), 128)
    np.testing.assert_allclose(np.asarray(multi.logits), want, atol=1e-4)


def test_one_trace_serves_every_prompt_mix(model):
    seg, params, _, transform, features, _, _ = model
    traces = []

    def counted(p):
        traces.append(1)
        return seg.decode(params, features, p, transform)

    fn = jax.jit(counted)
    mask = np.random.default_rng(1).normal(size=(LOW, LOW))
    mixes = [
        prompts([[20.0, 10.0]], [1]),                                     # one point
        prompts([[20.0, 10.0], [50, 30], [5, 40]], [1, 0, 1]),           # several points
        prompts(box=[5.0, 4, 60, 40]),                                    # box only
        prompts([[20.0, 10.0]], [0], box=[5.0, 4, 60, 40]),              # box + points
        prompts([[20.0, 10.0]], [1], mask=mask),                          # points + mask input
        prompts(box=[5.0, 4, 60, 40], mask=mask),                         # box + mask input
        prompts(mask=mask),                                               # mask only
    ]
    outs = [fn(p) for p in mixes]
    assert len(traces) == 1
    assert all(np.isfinite(np.asarray(o.logits)).all() for o in outs)
    # the mixes really differ
    assert np.abs(np.asarray(outs[0].logits) - np.asarray(outs[2].logits)).max() > 1e-3


def test_padding_slots_and_slot_order_do_not_change_the_result(model):
    seg, params, _, transform, features, decode, _ = model
    pts, labels = [[20.0, 10.0], [50.0, 30.0]], [1, 0]
    exact = decode(params, features, prompts(pts, labels, slots=2), transform)
    padded = decode(params, features, prompts(pts, labels, slots=4), transform)  # compiled
    shuffled = Prompts(points=jnp.asarray([[0, 0], [50.0, 30.0], [0, 0], [20.0, 10.0]]),
                       labels=jnp.asarray([-1, 0, -1, 1]), box=jnp.zeros(4),
                       has_box=jnp.asarray(False), mask_logits=jnp.zeros((LOW, LOW)),
                       has_mask=jnp.asarray(False))
    reordered = decode(params, features, shuffled, transform)
    for other in (padded, reordered):
        np.testing.assert_allclose(np.asarray(other.low_res_logits),
                                   np.asarray(exact.low_res_logits), atol=1e-4)
        np.testing.assert_allclose(np.asarray(other.scores), np.asarray(exact.scores), atol=1e-5)


def test_vmap_over_prompt_sets_and_over_instances(model):
    seg, params, image, transform, features, _, _ = model
    sets = [prompts([[20.0, 10.0]], [1]), prompts(box=[5.0, 4, 60, 40]),
            prompts([[30.0, 20.0], [3, 3]], [1, 0])]
    batch = jax.tree.map(lambda *xs: jnp.stack(xs), *sets)
    fn = jax.jit(jax.vmap(lambda p: seg.decode(params, features, p, transform)))
    batched = fn(batch)
    decode = model[5]
    for i, p in enumerate(sets):
        one = decode(params, features, p, transform)
        np.testing.assert_allclose(np.asarray(batched.logits[i]), np.asarray(one.logits), atol=1e-4)

    # instances of different sizes padded into one frame, batched features
    embed = model[6]
    other = np.random.default_rng(2).integers(0, 256, (60, 33, 3), dtype=np.uint8)
    frame = (64, 72)
    xs, ts = zip(*(seg.preprocess(im, frame_hw=frame) for im in (image, other)))
    feats = [embed(params, x) for x in xs]
    stacked = jax.tree.map(lambda *v: jnp.stack(v), *feats)
    trans = jax.tree.map(lambda *v: jnp.stack(v), *ts)
    chosen = (sets[0], sets[2])
    p2 = jax.tree.map(lambda *xs: jnp.stack(xs), *chosen)
    out = jax.jit(jax.vmap(lambda f, p, t: seg.decode(params, f, p, t)))(stacked, p2, trans)
    assert out.logits.shape == (2, 64, 72)
    for i, im in enumerate((image, other)):
        single = decode(params, feats[i], chosen[i], ts[i])  # one compile: same frame
        h, w = im.shape[:2]
        np.testing.assert_allclose(np.asarray(out.logits[i]), np.asarray(single.logits),
                                   atol=1e-4)
        assert (np.asarray(out.logits[i, h:]) == OUTSIDE_LOGIT).all()
        assert (np.asarray(out.logits[i, :, w:]) == OUTSIDE_LOGIT).all()
    # the bucket frame only pads: inside, the image's own frame gives the same logits
    own = decode(params, features, sets[0], transform)
    np.testing.assert_allclose(np.asarray(out.logits[0, :45, :70]), np.asarray(own.logits),
                               atol=1e-4)


def test_decode_is_differentiable_in_points_and_box(model):
    seg, params, _, transform, features, _, _ = model
    target = jnp.asarray(np.random.default_rng(3).random((45, 70)) > 0.5, jnp.float32)

    def dice(points, box):
        p = prompts([[20.0, 10.0], [50.0, 30.0]], [1, 0], box=[5.0, 4, 60, 40])
        p = p.replace(points=points, box=box)
        pred = seg.decode(params, features, p, transform, multimask_output=False)
        prob = jax.nn.sigmoid(pred.logits)
        return 1 - 2 * jnp.sum(prob * target) / jnp.maximum(prob.sum() + target.sum(), 1e-7)

    base = prompts([[20.0, 10.0], [50.0, 30.0]], [1, 0], box=[5.0, 4, 60, 40])
    value_and_grad = jax.jit(jax.value_and_grad(dice, argnums=(0, 1)))
    _, (g_pts, g_box) = value_and_grad(base.points, base.box)
    g_pts, g_box = np.asarray(g_pts), np.asarray(g_box)
    assert np.isfinite(g_pts).all() and np.isfinite(g_box).all()
    assert np.abs(g_pts[:2]).sum() > 0 and np.abs(g_box).sum() > 0
    assert (g_pts[2:] == 0).all()  # unused slots
    # central finite difference along the gradient direction (pixels; smooth at this scale)
    def f(points, box):
        return value_and_grad(points, box)[0]

    eps = 0.5
    d_pts = g_pts / (np.linalg.norm(g_pts) + np.linalg.norm(g_box))
    d_box = g_box / (np.linalg.norm(g_pts) + np.linalg.norm(g_box))
    fd = (f(base.points + eps * d_pts, base.box + eps * d_box)
          - f(base.points - eps * d_pts, base.box - eps * d_box)) / (2 * eps)
    analytic = float(np.sum(g_pts * d_pts) + np.sum(g_box * d_box))
    np.testing.assert_allclose(float(fd), analytic, rtol=0.1)


def test_make_transform_and_missing_frame(model):
    seg, params, _, transform, features, _, _ = model
    t = make_transform((45, 70), (82, 128), (50, 80))
    assert t.frame_hw == (50, 80)
    with pytest.raises(ValueError, match="frame_hw"):
        make_transform((45, 70), (82, 128), (40, 80))
    no_frame = transform.replace(frame_hw=None)
    with pytest.raises(ValueError, match="frame_hw"):
        seg.decode(params, features, prompts([[1.0, 1.0]], [1]), no_frame)
    with pytest.raises(ValueError, match="one prompt set"):
        seg.decode(params, features, make_prompts([[1.0, 1.0]], [1]), transform)  # 256x256 mask
    with pytest.raises(ValueError, match="image_embeddings"):
        seg.decode(params, features.replace(image_embeddings=features.image_embeddings[None]),
                   prompts([[1.0, 1.0]], [1]), transform)
