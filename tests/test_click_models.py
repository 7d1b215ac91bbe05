"""Click-map models (RITM, SimpleClick) behind the Segmenter protocol, on tiny random models.

Parity with the authors' code is in test_click_models_parity.py and
test_click_noc_parity.py; here: the contract (shapes, padding, feedback,
threshold), vmap, gradients through the soft click rendering against finite
differences (float64), the predictor, and the NoC loop's compilation.

Compiling is most of the cost on CPU, so the SimpleClick tests share one
program per shape: `compiled_grid_logits` of the tiny model on a 224 x 224
grid with 4 click slots is what ``predict`` runs without options, and the
reference the decode and padding checks compare against.
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
from jaxseg_robust.models.clickmap.predictor import compiled_grid_logits
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


@pytest.fixture(scope="module")
def sc_logits(simpleclick):
    """The tiny SimpleClick's shared ``grid_logits`` program (the one ``predict`` runs)."""
    return compiled_grid_logits(simpleclick.segmenter)


SC_HW = (224, 224)
SLOTS = 4  # click slots of the shared program (predict pads 3 clicks to 4)


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


def test_predictor_without_options_is_one_network_run(simpleclick, sc_logits):
    seg, params = simpleclick.segmenter, simpleclick.params
    image, _ = _image(*SC_HW)
    coords, labels = np.array([[120, 100], [30, 40], [150, 170]]), np.array([1, 0, 1])
    masks, scores, probs = simpleclick.predict(image, point_coords=coords, point_labels=labels)
    assert masks.shape == (1, *SC_HW) and masks.dtype == bool and scores.shape == (1,)
    x, _ = seg.preprocess(image)
    # the padding slot is ignored wherever it lies
    pts = jnp.asarray(np.concatenate([coords, [[77, 5]]]), jnp.float32)
    lab = jnp.asarray(np.concatenate([labels, [-1]]), jnp.int32)
    want = jax.nn.sigmoid(sc_logits(params, x, pts, lab, jnp.zeros(SC_HW)))
    np.testing.assert_allclose(probs[0], np.asarray(want), atol=1e-6)
    np.testing.assert_array_equal(masks[0], probs[0] > 0.49)
    # the previous probability map goes in as mask_input
    _, _, probs2 = simpleclick.predict(point_coords=coords, point_labels=labels,
                                       mask_input=probs)
    want2 = jax.nn.sigmoid(sc_logits(params, x, pts, lab, jnp.asarray(probs[0])))
    np.testing.assert_allclose(probs2[0], np.asarray(want2), atol=1e-6)
    assert not np.allclose(probs2, probs)
    with pytest.raises(ValueError, match="box"):
        simpleclick.predict(box=np.array([1, 2, 3, 4]))
    with pytest.raises(ValueError, match="mask_input"):
        simpleclick.predict(point_coords=coords, point_labels=labels,
                            mask_input=np.zeros((1, 5, 5)))


def test_decode_padding_feedback_and_vmap(simpleclick, sc_logits):
    """decode on a padded frame, vmapped over two prompt sets (without / with a previous
    map), equals the network on the frame one instance at a time, inside the image."""
    seg, params = simpleclick.segmenter, simpleclick.params
    image, _ = _image(210, 200)
    x, tr = seg.preprocess(image, frame_hw=SC_HW)
    feats = seg.embed(params, x)
    prompts = make_prompts([[120, 100], [30, 40]], [1, 0], num_slots=SLOTS, mask_shape=SC_HW)
    prev = jnp.asarray(np.random.default_rng(0).uniform(0, 1, SC_HW), jnp.float32)
    with_mask = prompts.replace(mask_logits=prev, has_mask=jnp.asarray(True))
    batch = jax.tree.map(lambda *a: jnp.stack(a), prompts, with_mask)
    pred = jax.jit(jax.vmap(lambda p: seg.decode(params, feats, p, tr)))(batch)
    assert pred.logits.shape == (2, *SC_HW)
    logits = np.asarray(pred.logits)
    assert np.all(logits[:, 210:] == OUTSIDE_LOGIT)
    assert np.all(logits[:, :, 200:] == OUTSIDE_LOGIT)
    for i, previous in enumerate((jnp.zeros(SC_HW), prev)):
        want = np.asarray(sc_logits(params, x, prompts.points, prompts.labels, previous))
        np.testing.assert_allclose(logits[i, :210, :200], want[:210, :200], atol=1e-5)
    # the previous map changes the prediction; feedback is its probability
    assert not np.allclose(logits[0], logits[1])
    one = jax.tree.map(lambda a: a[1], pred)
    np.testing.assert_allclose(np.asarray(seg.feedback(one)),
                               np.asarray(jax.nn.sigmoid(one.logits)))


def test_hard_disks_follow_isegm_padding_rule():
    maps = click_maps(jnp.asarray([[-2., -2.], [3., -1.]]), jnp.asarray([1, 0]), (8, 8), 2.0)
    assert float(maps[..., 0].sum()) == 0.0  # both coordinates negative: isegm padding
    assert float(maps[..., 1].sum()) > 0.0  # one negative coordinate: drawn (clipped)


def test_soft_click_gradients_match_finite_differences(simpleclick):
    """The soft-rendered model's gradient w.r.t. the clicks against central differences,
    everything in float64 (x64: rendering, network, loss).

    The loss is linear in the logits (a sigmoid of random logits saturates).
    The network has ReLU kinks (head), so differences converge only to first
    order in the step; in float64 the step can be tiny: rounding of the loss
    (|L| ~ 1e3, eps 1e-16) costs ~1e-13 / h. Measured on this model: relative
    L2 error 6.1e-8 at h = 1e-6, asserted <= 1e-6 (docs/models/click_models.md).
    """
    with jax.enable_x64(True):
        seg = ClickMapSegmenter(dataclasses.replace(SC_TINY, dtype="float64"),
                                click_encoding="soft")
        params = jax.tree.map(lambda a: jnp.asarray(a, jnp.float64), simpleclick.params)
        image, _ = _image(*SC_HW)
        x = jnp.asarray(image, jnp.float64) / 255
        weights = jnp.asarray(np.random.default_rng(3).standard_normal(SC_HW))
        labels = jnp.asarray([1, 0])
        prev = jnp.full(SC_HW, 0.3, jnp.float64)

        def loss(params, x, p, weights):
            return jnp.sum(seg.grid_logits(params, x, p, labels, prev) * weights)

        # clicks at fractional positions (no disk edge on a pixel corner within the step)
        pts = np.asarray([[120.3, 94.6], [36.2, 65.1]], np.float64)
        grad = np.asarray(jax.jit(jax.grad(loss, argnums=2))(params, x, jnp.asarray(pts),
                                                             weights))
        f = jax.jit(loss)
        h = 1e-6
        fd = np.zeros_like(grad)
        for index in np.ndindex(*pts.shape):
            e = np.zeros_like(pts)
            e[index] = h
            fd[index] = (float(f(params, x, jnp.asarray(pts + e), weights))
                         - float(f(params, x, jnp.asarray(pts - e), weights))) / (2 * h)
    assert grad.dtype == np.float64 and np.linalg.norm(grad) > 0
    print(f"\nsoft-click gradient vs central differences (h={h}): rel_l2="
          f"{np.linalg.norm(grad - fd) / np.linalg.norm(fd):.3g}")
    assert np.linalg.norm(grad - fd) <= 1e-6 * np.linalg.norm(fd)


def test_simpleclick_sizes_and_options(simpleclick):
    with pytest.raises(ValueError, match="multiples of the patch size"):
        SC_TINY.input_grid((230, 224))
    # with the authors' machinery any image size works (zoom-in to 224 x 224, flip)
    odd, _ = _image(100, 130)
    options = IsegmOptions(zoom_in=ZoomInConfig(target_hw=SC_HW), with_flip=True)
    masks, _, probs = simpleclick.predict(odd, point_coords=np.array([[60, 50]]),
                                          point_labels=np.array([1]), options=options)
    assert masks.shape == (1, 100, 130) and simpleclick.num_clicks == 1
    assert bool(simpleclick.state.has_prev)
    assert np.all((probs >= 0) & (probs <= 1))


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


def test_ritm_tiny_decode_and_soft_gradient(ritm):
    """The RITM network behind decode on a padded frame, and its gradient w.r.t. the clicks
    through the soft rendering (one program: the logits ride along as aux). Parameters and
    image are arguments: closed over, XLA would constant-fold the stem convolutions."""
    seg = dataclasses.replace(ritm.segmenter, click_encoding="soft")
    image, _ = _image(30, 44)
    x, tr = seg.preprocess(image, frame_hw=(32, 48))
    prompts = make_prompts([[20, 15]], [1], num_slots=2, mask_shape=(32, 48))

    def loss(params, x, points):
        pred = seg.decode(params, seg.embed(params, x), prompts.replace(points=points), tr)
        return jnp.mean(pred.logits[:30, :44]), pred.logits

    (_, logits), grad = jax.jit(jax.value_and_grad(loss, argnums=2, has_aux=True))(
        ritm.params, x, prompts.points)
    logits = np.asarray(logits)
    assert np.isfinite(logits).all() and logits[:30, :44].std() > 0
    assert np.all(logits[30:] == OUTSIDE_LOGIT) and np.all(logits[:, 44:] == OUTSIDE_LOGIT)
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


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="fusion boundaries are CPU-only")
def test_hrnet_residual_streams_are_not_recomputed_per_fusion(ritm):
    """Each HRNet block output is a fusion boundary: no fused computation of the click gradient chains
    more than two ReLUs (19 in the tiny RITM without the boundaries, ~40 in HRNet-18)."""
    from compiled_hlo import largest_relu_chain  # noqa: PLC0415

    seg = dataclasses.replace(ritm.segmenter, click_encoding="soft")
    size = 64
    labels, prev = jnp.asarray([1, 0]), jnp.zeros((size, size))
    grad = jax.jit(jax.grad(lambda p, prm, x: jnp.sum(jax.nn.sigmoid(seg.grid_logits(prm, x, p, labels, prev)))))
    text = grad.lower(jnp.asarray([[20.0, 30.0], [40.0, 10.0]]), ritm.params,
                      jnp.zeros((size, size, 3))).compile().as_text()
    assert largest_relu_chain(text) <= 2


def test_simpleclick_vit_scanned_blocks_equal_the_unrolled_blocks():
    """SimpleClick ViT-XT's blocks (windowed, global) x 4 on a 28 x 28 grid of 2 x 2 windows: the loops
    over stacked parameters give the unrolled blocks' tokens (float32 rounding: 1e-5 on values of
    order 1) with one windowed and one global block in the program; parameters stay ``blocks/{i}``."""
    from jaxseg_robust.models.simpleclick.vit import VisionTransformer, window_counts

    cfg = zoo.get("simpleclick_vit_xt").config
    hw = (448, 448)
    grid = cfg.input_grid(hw)
    assert window_counts(cfg, grid) == (2, 2) and cfg.blocks_per_group == 2
    rng = np.random.default_rng(3)
    image = jnp.asarray(rng.normal(size=(1, *hw, 3)).astype(np.float32))
    coords = jnp.asarray(rng.normal(size=(1, grid[0] * grid[1], cfg.embed_dim)).astype(np.float32))
    scanned, unrolled = VisionTransformer(cfg), VisionTransformer(cfg, scan_blocks=False)
    variables = scanned.init(jax.random.key(0), image, coords)
    variables = jax.tree.map(lambda a: a + 0.02 * jax.random.normal(jax.random.key(1), a.shape), variables)
    assert sorted(variables["params"]["blocks"]) == sorted(str(i) for i in range(cfg.depth))
    out_s, out_u = (jax.jit(vit.apply)(variables, image, coords) for vit in (scanned, unrolled))
    np.testing.assert_allclose(np.asarray(out_s), np.asarray(out_u), rtol=1e-5, atol=1e-5)

    def dots(vit):
        lowered = jax.jit(vit.apply).trace(variables, image, coords).lower(lowering_platforms=("cuda",))
        return lowered.as_text().count("stablehlo.dot_general")

    removed = dots(unrolled) - dots(scanned)  # depth blocks' products down to two blocks'
    assert removed > 0 and removed % (cfg.depth - 2) == 0
