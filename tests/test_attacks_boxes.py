"""Tests of the BREPS box protocols on the tiny random SAM (spec prompt-attacks §4, §7.2)."""

from __future__ import annotations

import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxseg_robust.attacks.boxes import BrepsConfig, breps_attack, breps_learning_rate
from jaxseg_robust.attacks.fixed_boxes import (
    evaluate_image_boxes,
    make_box_batch_fn,
    resized_mask,
    resized_reference_gt,
    tight_box_host,
)
from jaxseg_robust.attacks.scoring import box_attack_scores
from jaxseg_robust.metrics.masks import boundary_widths
from jaxseg_robust.models.sam.segmenter import resized_frame_transform
from jaxseg_robust.data.buckets import FixedFrame, pad_batch
from jaxseg_robust.data.instances import make_instance
from jaxseg_robust.metrics.masks import boundary_iou, boundary_width, mask_iou
from jaxseg_robust.models import zoo
from jaxseg_robust.prompts.jitter import jitter_boxes
from jaxseg_robust.prompts.types import make_prompts
from jaxseg_robust.runner.engine import run

FRAME = (40, 48)
STEPS = 8
LR_MULT = 60.0  # the images are tiny: move the box by a few pixels per step


def _instance(index, height, width, seed, ignore=False):
    rng = np.random.default_rng(seed)
    image = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
    yy, xx = np.mgrid[:height, :width]
    cy, cx = rng.uniform(0.35, 0.65) * height, rng.uniform(0.35, 0.65) * width
    gt = (((yy - cy) / (0.3 * height)) ** 2 + ((xx - cx) / (0.25 * width)) ** 2 <= 1).astype(np.int8)
    image[gt == 1] = (image[gt == 1] // 2 + 100).astype(np.uint8)
    if ignore:
        band = (((yy - cy) / (0.3 * height)) ** 2 + ((xx - cx) / (0.25 * width)) ** 2)
        gt[(band > 0.8) & (band <= 1.2)] = -1
    return make_instance(f"im{index}", image, gt, dataset="toy")


INSTANCES = [_instance(0, 40, 48, 0, ignore=True), _instance(1, 33, 45, 1), _instance(2, 36, 30, 2)]
OTHER = [_instance(3, 38, 41, 3), _instance(4, 40, 40, 4, ignore=True), _instance(5, 25, 47, 5)]


@pytest.fixture(scope="module")
def model():
    seg = zoo.segmenter("sam_tiny")
    return seg, seg.init(0)


@pytest.fixture(scope="module")
def batch():
    return pad_batch(INSTANCES, FRAME, 3)


@pytest.fixture(scope="module")
def attacked(model, batch):
    """One compiled program: MIN and MAX on one embedding per image, default (code) settings."""
    seg, params = model
    fn = make_box_batch_fn(seg, params, mode="minmax", n_steps=STEPS, lr_mult=LR_MULT,
                           record_trajectory=True, return_mask=True)
    return fn, jax.device_get(fn(batch))


# ---- pure pieces ----------------------------------------------------------------------

def test_learning_rate_formula():
    assert float(breps_learning_rate(480, 640)) == pytest.approx(9 * 800 / (1024 * 2 ** 0.5), rel=1e-6)
    assert float(breps_learning_rate(480, 640)) == pytest.approx(4.97, abs=5e-3)
    assert float(breps_learning_rate(1024, 1024)) == pytest.approx(9.0, rel=1e-6)
    assert float(breps_learning_rate(1024, 1024, lr_mult=1.0)) == pytest.approx(1.0, rel=1e-6)
    batched = jax.jit(jax.vmap(breps_learning_rate))(jnp.array([480, 1024]), jnp.array([640, 1024]))
    np.testing.assert_allclose(batched, [4.9718, 9.0], rtol=1e-4)


@pytest.mark.parametrize("kwargs, match", [
    (dict(mode="median"), "mode"), (dict(n_steps=0), "n_steps"), (dict(n_steps=2.0), "n_steps"),
    (dict(lr_mult=-1.0), "lr_mult"), (dict(lam=float("nan")), "lam"), (dict(thr=1.0), "thr"),
    (dict(gamma_k=0.0), "gamma_k"),
])
def test_config_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        BrepsConfig(**kwargs)


def test_batch_fn_argument_errors(model):
    seg, params = model
    with pytest.raises(ValueError, match="mode"):
        make_box_batch_fn(seg, params, mode="random")
    with pytest.raises(ValueError, match="box_frame"):
        make_box_batch_fn(seg, params, mode="tight", box_frame="original")
    with pytest.raises(ValueError, match="jitter_options"):
        make_box_batch_fn(seg, params, mode="jitter", jitter_options={"power": 0.3})
    with pytest.raises(ValueError, match="n_steps"):
        make_box_batch_fn(seg, params, mode="max", n_steps=0)


@st.composite
def framed_masks(draw):
    height, width = draw(st.integers(3, 24)), draw(st.integers(3, 30))
    kind = draw(st.sampled_from(["random", "empty", "full", "pixel", "line"]))
    rng = np.random.default_rng(draw(st.integers(0, 2 ** 16)))
    gt = rng.integers(-1, 2, (height, width)).astype(np.int8)
    pred = rng.random((height, width)) < 0.5
    if kind == "empty":
        gt[gt == 1] = 0
        pred[:] = False
    elif kind == "full":
        gt[:] = 1
        pred[:] = True
    elif kind == "pixel":
        gt[:] = 0
        gt[height // 2, width // 2] = 1
    elif kind == "line":
        gt[:] = 0
        gt[:, width // 3] = 1
    return gt, pred


_FRAME_SCORES = jax.jit(box_attack_scores)


@settings(max_examples=30)
@given(framed_masks())
def test_scores_in_a_padded_frame_equal_the_metrics(case):
    gt, pred = case
    height, width = gt.shape
    framed_gt = np.full((24, 30), -1, np.int8)
    framed_gt[:height, :width] = gt
    framed_pred = np.ones((24, 30), bool)  # garbage outside the image must not count
    framed_pred[:height, :width] = pred
    region = np.zeros((24, 30), bool)
    region[:height, :width] = True
    d = boundary_width(height, width)
    scores = _FRAME_SCORES(framed_pred, framed_gt, region, np.int32(d))
    valid = gt != -1
    np.testing.assert_allclose(scores.iou, mask_iou(gt == 1, pred, valid), equal_nan=True)
    np.testing.assert_allclose(scores.biou, boundary_iou(gt == 1, pred, valid, width=d), equal_nan=True)
    # selection metrics: ignore is background, every pixel counts, empty union -> 0
    sel_iou = np.nan_to_num(mask_iou(gt == 1, pred))
    sel_biou = np.nan_to_num(boundary_iou(gt == 1, pred, width=d))
    np.testing.assert_allclose(scores.selection_iou, sel_iou)
    np.testing.assert_allclose(scores.selection_biou, sel_biou)


# ---- the attack -----------------------------------------------------------------------

def _lexicographic_best(sel_iou, sel_biou, maximise):
    best, best_step = None, None
    for step, key in enumerate(zip(sel_iou.tolist(), sel_biou.tolist())):
        if best is None or (key > best if maximise else key < best):
            best, best_step = key, step
    return best_step


def test_min_le_tight_le_max_and_bookkeeping(attacked):
    out = attacked[1]
    low, high = out["min"], out["max"]
    assert (low["selection_iou"] <= out["tight_selection_iou"]).all()
    assert (high["selection_iou"] >= out["tight_selection_iou"]).all()
    for part, maximise in ((low, False), (high, True)):
        traj = part["trajectory"]
        assert traj["loss"].shape == (3, STEPS) and traj["box"].shape == (3, STEPS, 4)
        for slot in range(3):
            step = _lexicographic_best(traj["selection_iou"][slot], traj["selection_biou"][slot], maximise)
            assert part["best_step"][slot] == step
            assert part["n_accepted"][slot] == traj["accepted"][slot].sum() >= 1
            assert traj["accepted"][slot, 0]
            for name in ("selection_iou", "selection_biou", "iou", "biou"):
                np.testing.assert_array_equal(part[name][slot], traj[name][slot, step])
                np.testing.assert_array_equal(out[f"tight_{name}"][slot], traj[name][slot, 0])
            np.testing.assert_array_equal(part["box"][slot], traj["box"][slot, step])
            assert np.isfinite(traj["grad_norm"][slot]).all() and np.isfinite(traj["loss"][slot]).all()
        for name in ("box", "box_clipped", "box_resized"):
            assert np.isfinite(part[name]).all()
        assert np.isfinite(traj["box_resized"]).all()
        # the boxes moved
        assert not np.allclose(traj["box_resized"][:, 1:], traj["box_resized"][:, :1])
    # the two modes optimise in opposite directions from the same start
    np.testing.assert_array_equal(low["trajectory"]["box_resized"][:, 0], high["trajectory"]["box_resized"][:, 0])
    first_low = low["trajectory"]["box_resized"][:, 1] - low["trajectory"]["box_resized"][:, 0]
    first_high = high["trajectory"]["box_resized"][:, 1] - high["trajectory"]["box_resized"][:, 0]
    np.testing.assert_allclose(first_low, -first_high, rtol=1e-4)  # X == 0: Dice only, Adam step = sign


def test_reported_boxes_metrics_and_iterate_zero(attacked, model):
    seg = model[0]
    out = attacked[1]
    for slot, instance in enumerate(INSTANCES):
        height, width = instance.gt.shape
        _, transform = seg.preprocess(instance.image)
        sx, sy = np.asarray(transform.scale_xy)
        rh, rw = np.asarray(transform.resized_hw)
        tight = tight_box_host(instance.gt == 1)
        np.testing.assert_array_equal(out["tight_box"][slot], tight)
        for part in (out["min"], out["max"]):
            traj = part["trajectory"]
            np.testing.assert_allclose(traj["box_resized"][slot, 0], tight * np.float32([sx, sy, sx, sy]))
            assert traj["ciou"][slot, 0] == 0  # X == 0 at the tight box: realism skipped
            assert (traj["ciou"][slot, 1:] > 0).all()
            np.testing.assert_allclose(part["learning_rate"][slot],
                                       LR_MULT * np.hypot(height, width) / (1024 * 2 ** 0.5), rtol=1e-6)
            box = traj["box"][slot]
            np.testing.assert_allclose(box, traj["box_resized"][slot] / np.float32([sx, sy, sx, sy]), rtol=1e-6)
            clipped = box.copy()
            clipped[:, 0::2] = np.clip(clipped[:, 0::2], 1, rw - 1)
            clipped[:, 1::2] = np.clip(clipped[:, 1::2], 1, rh - 1)
            np.testing.assert_allclose(traj["box_clipped"][slot], clipped, rtol=1e-6)
            # reported metrics of the best mask: ignore excluded; selection metrics: ignore as background
            mask = part["mask"][slot, :height, :width]
            assert not part["mask"][slot, height:].any() and not part["mask"][slot, :, width:].any()
            gt = instance.gt
            np.testing.assert_allclose(part["iou"][slot], mask_iou(gt == 1, mask, gt != -1), rtol=1e-6)
            np.testing.assert_allclose(part["selection_iou"][slot], mask_iou(gt == 1, mask), rtol=1e-6)
            d = boundary_width(height, width)
            np.testing.assert_allclose(part["biou"][slot], boundary_iou(gt == 1, mask, gt != -1, width=d),
                                       rtol=1e-6)


def test_batched_equals_one_instance(attacked, model):
    seg, params = model
    out = attacked[1]["min"]
    config = BrepsConfig(mode="min", n_steps=STEPS, lr_mult=LR_MULT, record_trajectory=True)
    single = jax.jit(functools.partial(breps_attack, seg, config=config))
    instance = INSTANCES[1]  # padded into the frame
    x, transform = seg.preprocess(instance.image, frame_hw=FRAME)
    gt = np.full(FRAME, -1, np.int8)
    gt[:instance.gt.shape[0], :instance.gt.shape[1]] = instance.gt
    features = jax.jit(seg.embed)(params, x)
    result = single(params, features, transform, gt, boundary_widths([instance.gt.shape])[0])
    np.testing.assert_allclose(result.trajectory.box_resized, out["trajectory"]["box_resized"][1], atol=1e-3)
    np.testing.assert_allclose(result.trajectory.loss, out["trajectory"]["loss"][1], atol=1e-4)
    np.testing.assert_allclose(result.trajectory.iou, out["trajectory"]["iou"][1], atol=2e-3)
    np.testing.assert_allclose(result.box, out["box"][1], atol=1e-3)


def test_one_trace_per_bucket_and_engine_run(attacked, tmp_path):
    fn = attacked[0]
    other = pad_batch(OTHER[:2], FRAME, 3)  # other sizes, a ragged tail, same frame
    out = jax.device_get(fn(other))
    assert fn.traces == 1
    assert np.isfinite(out["max"]["box"]).all()
    assert (out["max"]["selection_iou"] >= out["tight_selection_iou"]).all()
    before = fn.traces
    summary = run(INSTANCES + OTHER, fn, tmp_path / "run", 3, config={"protocol": "breps-minmax"},
                  frame_policy=FixedFrame(*FRAME), progress="none")
    assert summary.ok == 6 and summary.failed == 0
    # the engine places its inputs on the device mesh (a new sharding, so one new trace);
    # its two batches of this bucket then reuse that program
    assert fn.traces == before + 1
    records = [json.loads(line) for line in (tmp_path / "run" / "records.jsonl").read_text().splitlines()]
    assert {r["id"] for r in records} == {f"im{i}" for i in range(6)}
    for record in records:
        payload = record["payload"]
        assert payload["min"]["selection_iou"] <= payload["tight_selection_iou"] <= payload["max"]["selection_iou"]


def test_clip_and_order_keeps_boxes_ordered_inside(model):
    seg, params = model
    config = BrepsConfig(mode="min", n_steps=STEPS, lr_mult=400.0, clip_and_order=True, record_trajectory=True)
    attack = jax.jit(jax.vmap(functools.partial(breps_attack, seg, config=config), in_axes=(None, 0, 0, 0, 0)))
    batch = pad_batch(INSTANCES, FRAME, 3)
    model_input, transform = zip(*(seg.preprocess(i.image, frame_hw=FRAME) for i in INSTANCES))
    features = jax.jit(seg.embed)(params, jnp.stack(model_input))
    transform = jax.tree.map(lambda *leaves: jnp.stack(leaves), *transform)
    out = jax.device_get(attack(params, features, transform, batch.gt, boundary_widths(batch.size)))
    raw = out.trajectory.box_resized
    for slot, instance in enumerate(INSTANCES):
        height, width = instance.gt.shape
        rh, rw = np.asarray(transform.resized_hw[slot])
        assert (raw[slot, :, 0] <= raw[slot, :, 2]).all() and (raw[slot, :, 1] <= raw[slot, :, 3]).all()
        assert (raw[slot, :, 0::2] >= 0).all() and (raw[slot, :, 0::2] <= rw - 1).all()
        assert (raw[slot, :, 1::2] >= 0).all() and (raw[slot, :, 1::2] <= rh - 1).all()
        box = out.trajectory.box[slot]  # evaluation frame: within the image
        assert (box[:, 0::2] >= 0).all() and (box[:, 0::2] <= width).all()
        assert (box[:, 1::2] >= 0).all() and (box[:, 1::2] <= height).all()
    assert (out.selection_iou <= out.tight_selection_iou).all()
    # the big steps really hit the bounds or flipped the corners somewhere
    assert ((raw[..., 0::2] == 0).any() or (raw[..., 1::2] == 0).any()
            or (raw[..., 2] == raw[..., 0]).any() or (raw[..., 3] == raw[..., 1]).any())


# ---- fixed boxes --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def single_mask(model):
    """Independent path: the predictor-style single-mask decode of one box in a given frame (jitted)."""
    seg, params = model
    embed = jax.jit(seg.embed)
    decode = jax.jit(functools.partial(seg.decode, multimask_output=False))
    low = seg.config.low_res_size

    def logits(image, box, frame_hw=FRAME, transform=None):
        x, own = seg.preprocess(image, frame_hw=frame_hw)
        prompts = make_prompts(box=np.asarray(box, np.float32), mask_shape=(low, low))
        return np.asarray(decode(params, embed(params, x), prompts, own if transform is None else transform(own)).logits)

    return logits


def test_tight_mode(model, batch, single_mask):
    seg, params = model
    fn = make_box_batch_fn(seg, params, mode="tight")
    out = jax.device_get(fn(batch))
    for slot, instance in enumerate(INSTANCES):
        height, width = instance.gt.shape
        tight = tight_box_host(instance.gt == 1)
        np.testing.assert_array_equal(out["box"][slot], tight)
        mask = single_mask(instance.image, tight)[:height, :width] > 0
        want = mask_iou(instance.gt == 1, mask, instance.gt != -1)
        np.testing.assert_allclose(out["iou"][slot], want, atol=1e-6)
        assert 0 <= out["iou_resized"][slot] <= 1
    instance = INSTANCES[2]
    one = evaluate_image_boxes(seg, params, instance.image, instance.gt, out["box"][2:3], frame_hw=FRAME)
    np.testing.assert_allclose(one["iou"], out["iou"][2], atol=1e-6)
    np.testing.assert_allclose(one["iou_resized"], out["iou_resized"][2], atol=1e-6)
    assert fn.traces == 1
    with pytest.raises(ValueError, match="boxes"):
        evaluate_image_boxes(seg, params, instance.image, instance.gt, np.zeros((0, 4)))


def test_jitter_mode_and_reference_iou(model, batch, single_mask):
    seg, params = model
    fn = make_box_batch_fn(seg, params, mode="jitter")
    out = jax.device_get(fn(batch))
    assert out["boxes"].shape == (3, 10, 4) and out["iou"].shape == (3, 10)
    for slot, instance in enumerate(INSTANCES):
        tight = tight_box_host(instance.gt == 1)
        want = np.trunc(jitter_boxes(tight.astype(np.float32), instance.gt.shape))
        n = want.shape[0]
        assert out["n_boxes"][slot] == n and out["box_valid"][slot, :n].all()
        np.testing.assert_array_equal(out["boxes"][slot, :n], want)
        np.testing.assert_allclose(out["mean_iou"][slot], np.nanmean(out["iou"][slot, :n]), rtol=1e-6)
        assert np.isfinite(out["ciou"][slot, :n]).all() and (out["ciou"][slot, :n] >= 0).all()
    # the reference's IoU: 1024-frame (here 128) prediction cropped to (h', w'), GT resized > 0, eps 1e-6
    instance = INSTANCES[1]
    box = out["boxes_resized"][1, 0]
    mask = single_mask(instance.image, box, frame_hw=instance.gt.shape,
                       transform=lambda t: resized_frame_transform(t, 128)) > 0
    ref_gt = resized_reference_gt(instance.gt == 1, 128)
    want_ref = (mask & ref_gt).sum() / ((mask | ref_gt).sum() + 1e-6)
    np.testing.assert_allclose(out["iou_resized"][1, 0], want_ref, rtol=1e-6)


@pytest.mark.slow
def test_jitter_in_the_resized_frame(model, batch):
    seg, params = model
    resized = make_box_batch_fn(seg, params, mode="jitter", box_frame="resized", reference_iou=False)
    out = jax.device_get(resized(batch))
    assert np.isnan(out["iou_resized"]).all() and np.isfinite(out["iou"][out["box_valid"]]).all()
    assert out["boxes"].max() > 48  # boxes live in the 128 px resized frame
    for slot, instance in enumerate(INSTANCES):
        target = instance.gt == 1
        frame_mask = resized_mask(target, 128)
        tight = tight_box_host(frame_mask)
        np.testing.assert_array_equal(out["tight_box"][slot], tight)
        want = np.trunc(jitter_boxes(tight.astype(np.float32), frame_mask.shape))
        np.testing.assert_array_equal(out["boxes"][slot, :want.shape[0]], want)
        np.testing.assert_array_equal(out["boxes_resized"][slot, :want.shape[0]], want)
