"""RClicks multi-round simulation (spec rclicks.md §5): rules replayed in numpy on a toy segmenter,
and the full program on the tiny random SAM (batch function, engine run, resume, user modes)."""

from __future__ import annotations

import dataclasses
import json

import cv2
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.ndimage import binary_erosion, distance_transform_edt

from jaxseg_robust.clicksim import evaluation as E
from jaxseg_robust.clicksim.click_models import DistanceTransformClickModel, UniformClickModel
from jaxseg_robust.data.buckets import FixedFrame, instance_seed, pad_batch
from jaxseg_robust.data.instances import make_instance
from jaxseg_robust.metrics.masks import boundary_widths
from jaxseg_robust.models import zoo
from jaxseg_robust.models.base import Prediction
from jaxseg_robust.models.sam.segmenter import make_transform
from jaxseg_robust.runner.engine import run
from jaxseg_robust.runner.sharding import data_mesh, shard_batch

FRAME = (36, 44)


# ---- a replayable toy segmenter -----------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class DiskSegmenter:
    """Prediction = union of radius-5 disks at positive clicks minus radius-3 disks at negative ones.

    Ignores features and the previous mask; replayable in numpy (`disk_prediction`). Its feedback map
    (the Segmenter contract) is an 8 x 8 map of the selected candidate.
    """

    probability_threshold = 0.5

    def feedback_shape(self, frame_hw):
        return (8, 8)

    def feedback(self, prediction):
        return prediction.selected_low_res

    def decode(self, params, features, prompts, transform, *, multimask_output=True):
        frame_h, frame_w = transform.frame_hw
        yy, xx = jnp.mgrid[:frame_h, :frame_w]
        dist2 = (yy[None] - prompts.points[:, 1, None, None]) ** 2 + (xx[None] - prompts.points[:, 0, None, None]) ** 2
        positive = jnp.any((prompts.labels[:, None, None] == 1) & (dist2 <= 25), axis=0)
        negative = jnp.any((prompts.labels[:, None, None] == 0) & (dist2 <= 9), axis=0)
        logits = jnp.where(positive & ~negative, 10.0, -10.0)
        low = jnp.zeros((3, 8, 8)) + prompts.has_mask  # uses has_mask so the feedback flag is exercised
        return Prediction(logits=logits, low_res_logits=low, scores=jnp.zeros(3), index=jnp.zeros((), jnp.int32))


def disk_prediction(clicks, shape):
    yy, xx = np.mgrid[:shape[0], :shape[1]]
    positive = np.zeros(shape, bool)
    negative = np.zeros(shape, bool)
    for x, y, is_positive in clicks:
        d2 = (yy - y) ** 2 + (xx - x) ** 2
        if is_positive:
            positive |= d2 <= 25
        else:
            negative |= d2 <= 9
    return positive & ~negative


def toy_gt(seed: int, shape=FRAME, size=None):
    rng = np.random.default_rng(seed)
    height, width = size or shape
    yy, xx = np.mgrid[:height, :width]
    cy, cx = rng.uniform(0.35, 0.65) * height, rng.uniform(0.35, 0.65) * width
    inside = ((yy - cy) / (0.33 * height)) ** 2 + ((xx - cx) / (0.3 * width)) ** 2 <= 1
    blob = ((yy - rng.uniform(0, height)) ** 2 + (xx - rng.uniform(0, width)) ** 2) <= rng.uniform(9, 30)
    gt = np.full(shape, -1, np.int8)
    gt[:height, :width] = (inside | blob).astype(np.int8)
    return gt


def padded_dt(region):
    """Exact Euclidean distance to the nearest pixel outside ``region`` (the frame border counts as outside).

    Exact (scipy, float64) rather than OpenCV's precise transform: the clicker's choice among tied
    maxima is part of the rule, and OpenCV's float32 values carry ~5e-7 of rounding noise that
    breaks exact ties in an order that changed between OpenCV releases.
    """
    return distance_transform_edt(np.pad(region, 1))[1:-1, 1:-1]


def reference_band(values, q_low, q_high):
    ordered = np.sort(values.ravel().astype(np.float32))
    cumulative = np.cumsum(ordered.astype(np.float64))
    total = cumulative[-1]
    low = ordered[min(np.searchsorted(cumulative, q_low * total, side="left"), ordered.size - 1)]
    high = ordered[min(np.searchsorted(cumulative, q_high * total, side="right"), ordered.size - 1)]
    return low, high


def boundary_band(mask, width):
    """The inner band ``mask & ~erode^width(mask)`` (3 x 3 square, background outside), numpy/scipy."""
    return mask & ~binary_erosion(mask, np.ones((3, 3), bool), iterations=width, border_value=0)


def replay(gt, size, trajectory, click_model, q_low, q_high, is_base, band_width):
    """Replays a trajectory with numpy: checks polarity, Base click, in-band clicks, IoU and BIoU per round."""
    height, width = size
    inside = np.zeros(gt.shape, bool)
    inside[:height, :width] = True
    obj, valid = (gt == 1) & inside, (gt != -1) & inside
    pred = np.zeros(gt.shape, bool)
    not_clicked = np.ones(gt.shape, bool)
    clicks = []
    for r in range(trajectory.iou.shape[0]):
        fn, fp = obj & ~pred & valid, ~obj & pred & valid
        fn_dt, fp_dt = padded_dt(fn) * not_clicked, padded_dt(fp) * not_clicked
        positive = fn_dt.max() > fp_dt.max()
        x, y, label = (int(v) for v in trajectory.clicks[r])
        assert label == int(positive), f"round {r}: polarity"
        chosen = fn_dt if positive else fp_dt
        base_row, base_col = np.unravel_index(np.argmax(chosen), chosen.shape)
        region = fn if positive else fp
        if is_base or trajectory.used_fallback[r]:
            assert (y, x) == (base_row, base_col), f"round {r}: baseline click"
        else:
            if isinstance(click_model, UniformClickModel):
                values = region.astype(np.float32)
            else:
                foreground = region | ~inside
                dt = cv2.distanceTransform(np.pad(foreground, 1, constant_values=1).astype(np.uint8),
                                           cv2.DIST_L2, 0)[1:-1, 1:-1] * region
                values = (dt / dt.max()) if dt.max() > 0 else dt
            masked = values * region * not_clicked
            low, high = reference_band(masked, q_low, q_high)
            assert masked[y, x] > 0, f"round {r}: clicked a zero-probability pixel"
            assert low * (1 - 1e-5) <= masked[y, x] <= high * (1 + 1e-5), f"round {r}: click outside its band"
        clicks.append((x, y, positive))
        not_clicked[y, x] = False
        pred = disk_prediction(clicks, gt.shape) & inside
        inter, union = np.sum(obj & pred & valid), np.sum((obj | pred) & valid)
        np.testing.assert_allclose(trajectory.iou[r], inter / union, rtol=1e-6)
        crop = (slice(0, height), slice(0, width))
        band_gt, band_pred = boundary_band(obj[crop], band_width), boundary_band(pred[crop], band_width)
        inter = np.sum(band_gt & band_pred & valid[crop])
        union = np.sum((band_gt | band_pred) & valid[crop])
        np.testing.assert_allclose(trajectory.biou[r], inter / union, rtol=1e-6)


@pytest.fixture(scope="module")
def toy_run():
    """Base + 4 groups, 6 rounds, on two instances in one padded frame (dt and ud click models)."""
    config = E.RClicksConfig(num_rounds=6, num_groups=4)
    sizes = [(36, 44), (30, 41)]
    gts = np.stack([toy_gt(3, size=sizes[0]), toy_gt(4, size=sizes[1])])
    transforms = jax.tree.map(lambda *x: jnp.stack(x), *[make_transform(s, s, FRAME) for s in sizes])
    seg = DiskSegmenter()

    widths = boundary_widths(np.array(sizes))  # the batch program's per-instance band widths (ratio 0.02)

    def program(model, gts, transforms, seeds):
        keys = jax.vmap(lambda s: E.instance_key(config.seed, s))(seeds)
        one = lambda g, t, k, w: E.simulate_instance(seg, None, None, t, g, model, None, {}, k,  # noqa: E731
                                                     config=config, width=w)
        return jax.vmap(one)(gts, transforms, keys, widths)

    results = {}
    for model in (DistanceTransformClickModel(), UniformClickModel()):
        fn = jax.jit(lambda g, t, s, model=model: program(model, g, t, s))
        results[model.name] = (fn, jax.device_get(fn(gts, transforms, np.array([11, 12], np.uint32))))
    return config, sizes, gts, transforms, results, widths


def _slot(tree, index):
    return jax.tree.map(lambda leaf: np.asarray(leaf)[index], tree)


@pytest.mark.parametrize("model", [DistanceTransformClickModel(), UniformClickModel()], ids=lambda m: m.name)
def test_rounds_follow_the_reference_rules(toy_run, model):
    """FN/FP choice, Base = RITM clicker, group clicks inside their band (weighted), IoU and BIoU per round."""
    config, sizes, gts, _, results, widths = toy_run
    result = results[model.name][1]
    q_low, q_high, _ = E.trajectory_plan(config)
    for index, size in enumerate(sizes):
        instance = _slot(result, index)
        replay(gts[index], size, instance.base, model, 0.0, 1.0, is_base=True, band_width=int(widths[index]))
        for group in range(config.num_groups):
            replay(gts[index], size, _slot(instance.groups, group), model, q_low[1 + group], q_high[1 + group],
                   is_base=False, band_width=int(widths[index]))
        assert instance.base.clicks[0, 2] == 1  # round 1 is positive


def test_batched_equals_single_and_seed_determinism(toy_run):
    config, sizes, gts, transforms, results, widths = toy_run
    fn, batched = results["dt"]
    seg, model = DiskSegmenter(), DistanceTransformClickModel()
    single = jax.jit(lambda g, t, k, w: E.simulate_instance(seg, None, None, t, g, model, None, {}, k, config=config,
                                                            width=w))
    alone = jax.device_get(single(gts[1], _slot(transforms, 1), E.instance_key(config.seed, 12), widths[1]))
    jax.tree.map(np.testing.assert_array_equal, alone, _slot(batched, 1))
    swapped = jax.device_get(fn(gts[::-1], jax.tree.map(lambda x: x[::-1], transforms), np.array([12, 11], np.uint32)))
    jax.tree.map(np.testing.assert_array_equal, _slot(swapped, 0), _slot(batched, 1))
    other_seed = jax.device_get(fn(gts, transforms, np.array([13, 14], np.uint32)))
    np.testing.assert_array_equal(other_seed.base.clicks, batched.base.clicks)  # Base is deterministic
    assert not np.array_equal(other_seed.groups.clicks, batched.groups.clicks)
    np.testing.assert_array_equal(jax.random.key_data(E.instance_key(42, 7)),
                                  jax.random.key_data(E.instance_key(42, np.uint32(7))))


def test_feedback_rule_and_config_validation():
    rule = jax.jit(E.feedback_enabled, static_argnums=0)
    assert [bool(rule("reference", r, p)) for r, p in ((0, True), (1, True), (1, False), (2, False))] == \
        [False, True, False, True]
    assert [bool(rule("always", r, False)) for r in (0, 1)] == [False, True]
    assert not bool(rule("never", 5, True))
    for kwargs, match in (({"num_rounds": 0}, "num_rounds"), ({"threshold": 1.0}, "threshold"),
                          ({"mask_feedback": "x"}, "mask_feedback"),
                          ({"run_base": False, "num_groups": 0}, "nothing to evaluate")):
        with pytest.raises(ValueError, match=match):
            E.RClicksConfig(**kwargs)
    q_low, q_high, is_base = E.trajectory_plan(E.RClicksConfig(num_groups=10))
    assert is_base.tolist() == [True] + [False] * 10
    np.testing.assert_allclose(q_low[1:], np.arange(10) / 10, atol=1e-7)
    np.testing.assert_allclose(q_high[1:], np.arange(1, 11) / 10, atol=1e-7)
    assert E.user_slot_count([3, 9, 1]) == 16 and E.user_slot_count([]) == 0


# ---- the full program on the tiny SAM --------------------------------------------------------

def _instance(index, height, width, seed, ignore=False):
    rng = np.random.default_rng(seed)
    image = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
    gt = toy_gt(seed, (height, width))
    if ignore:
        band = cv2.dilate(gt.astype(np.uint8), np.ones((3, 3), np.uint8)) - cv2.erode(gt.astype(np.uint8),
                                                                                      np.ones((3, 3), np.uint8))
        gt[band == 1] = -1
    image[gt == 1] = (image[gt == 1] // 2 + 100).astype(np.uint8)
    return make_instance(f"im{index}", image, gt, dataset="toy")


INSTANCES = [_instance(0, 36, 44, 0, ignore=True), _instance(1, 30, 41, 1), _instance(2, 33, 30, 2)]
SAM_CONFIG = E.RClicksConfig(num_rounds=4, num_groups=4)
USER_CLICKS = {("toy", "im0"): np.array([[20, 18], [22, 16], [500, -3]]), ("toy", "im2"): np.array([[15, 16]])}


@pytest.fixture(scope="module")
def sam_run():
    seg = zoo.segmenter("sam_tiny")
    params = seg.init(0)
    fn = E.make_rclicks_batch_fn(seg, params, DistanceTransformClickModel(), config=SAM_CONFIG,
                                 user_clicks=USER_CLICKS)
    batch = shard_batch(pad_batch(INSTANCES, FRAME, 3), data_mesh())
    return seg, params, fn, jax.device_get(fn(batch))


def test_batch_outputs(sam_run):
    _, _, fn, out = sam_run
    assert fn.config.user_slots == 8
    assert out["base_iou"].shape == (3, 4) and out["base_clicks"].shape == (3, 4, 3)
    assert out["group_iou"].shape == (3, 4, 4) and out["group_fallback"].shape == (3, 4, 4)
    assert out["user_valid"].sum(axis=1).tolist() == [3, 0, 1]
    for name in ("base_iou", "group_iou", "user_iou", "sample_iou"):
        assert np.all((out[name] >= 0) & (out[name] <= 1)), name
    # clicks lie inside each instance's own image, and round 1 is positive inside the object
    for slot, instance in enumerate(INSTANCES):
        height, width = instance.gt.shape
        clicks = np.concatenate([out["base_clicks"][slot][None], out["group_clicks"][slot]])
        assert np.all((clicks[..., 0] < width) & (clicks[..., 1] < height))
        assert np.all(clicks[:, 0, 2] == 1)
        assert np.all(instance.gt[clicks[:, 0, 1], clicks[:, 0, 0]] == 1)
        sampled = out["sample_clicks"][slot]
        assert np.all(instance.gt[sampled[:, 1], sampled[:, 0]] == 1)  # drawn where the first-round map lives
    # dt click model: round-1 click values are ordered across groups two apart (§5.2 band rule)
    for slot, instance in enumerate(INSTANCES):
        obj = instance.gt == 1
        dt = cv2.distanceTransform(obj.astype(np.uint8), cv2.DIST_L2, 0)
        values = dt[out["group_clicks"][slot, :, 0, 1], out["group_clicks"][slot, :, 0, 0]]
        assert np.all(values[:-2] <= values[2:] + 1e-6), values


def test_one_trace_per_bucket_engine_run_and_resume(sam_run, tmp_path):
    seg, params, fn, out = sam_run
    before = fn.traces
    other = [_instance(3, 34, 40, 3), _instance(4, 36, 44, 4, ignore=True)]
    summary = run(INSTANCES + other, fn, tmp_path / "run", 3, config={"protocol": "rclicks"},
                  frame_policy=FixedFrame(*FRAME), progress="none", finalize=E.finalize_record)
    assert summary.ok == 5 and summary.failed == 0
    assert fn.traces == before  # same bucket, same placement: no new trace
    records = {r["id"]: r for r in map(json.loads, (tmp_path / "run" / "records.jsonl").read_text().splitlines())}
    np.testing.assert_allclose(records["im1"]["payload"]["group_iou"], out["group_iou"][1], rtol=1e-6)
    np.testing.assert_allclose(records["im0"]["payload"]["user_iou"], out["user_iou"][0][:3], rtol=1e-6)
    assert records["im1"]["payload"]["n_user_clicks"] == 0 and records["im1"]["payload"]["user_iou"] == []
    # a kill after the first batch loses the second: a rerun (a new batch function with the same
    # settings shares the compiled program) evaluates only the missing instances
    lines = (tmp_path / "run" / "records.jsonl").read_text().splitlines(keepends=True)
    (tmp_path / "run" / "records.jsonl").write_text("".join(lines[:3]))
    again = E.make_rclicks_batch_fn(seg, params, DistanceTransformClickModel(), config=SAM_CONFIG,
                                    user_clicks=USER_CLICKS)
    resumed = run(INSTANCES + other, again, tmp_path / "run", 3, config={"protocol": "rclicks"},
                  frame_policy=FixedFrame(*FRAME), progress="none", finalize=E.finalize_record)
    assert (resumed.ok, resumed.skipped) == (2, 3)
    assert again.traces == before
    redone = {r["id"]: r for r in map(json.loads, (tmp_path / "run" / "records.jsonl").read_text().splitlines())}
    assert redone["im4"]["payload"] == records["im4"]["payload"]


def test_batch_fn_argument_errors(sam_run):
    seg, params, _, _ = sam_run
    with pytest.raises(ValueError, match="user_slots"):
        E.make_rclicks_batch_fn(seg, params, DistanceTransformClickModel(),
                                config=dataclasses.replace(SAM_CONFIG, user_slots=2), user_clicks=USER_CLICKS)
    with pytest.raises(ValueError, match="needs user_clicks"):
        E.make_rclicks_batch_fn(seg, params, DistanceTransformClickModel(),
                                config=dataclasses.replace(SAM_CONFIG, user_slots=8))
    with pytest.raises(ValueError, match=r"\[n, 2\]"):
        E.make_rclicks_batch_fn(seg, params, DistanceTransformClickModel(), user_clicks={("a", "b"): np.zeros(3)})
    with pytest.raises(ValueError, match="lacks preprocess, embed, decode, feedback_shape"):
        E.make_rclicks_batch_fn(object(), params, DistanceTransformClickModel())
    assert instance_seed(("toy", "im0")) != instance_seed(("toy", "im2"))
