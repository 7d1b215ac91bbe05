"""A click-map family (tests/clickmap_model.py) runs through the protocols with no protocol code written for it.

The Segmenter contract (``feedback_shape`` / ``feedback`` /
``probability_threshold``) is all the protocols use: the baseline clicker and
TETRIS feed the model its previous logits at the frame, RClicks does the same
round by round, the click grid appends its click to the feedback of the
baseline first click, and every default threshold is the family's 0.49.
The baseline trajectory is checked against a loop restated with NumPy / SciPy
and the model's own ``decode``.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
import scipy.ndimage as ndi

from clickmap_model import ClickMapSegmenter
from jaxseg_robust.attacks.clicks import make_click_batch_fn
from jaxseg_robust.attacks.fixed_boxes import make_box_batch_fn
from jaxseg_robust.attacks.grid import make_click_grid_batch_fn
from jaxseg_robust.clicksim.click_models import DistanceTransformClickModel
from jaxseg_robust.clicksim.evaluation import RClicksConfig, make_rclicks_batch_fn
from jaxseg_robust.data.buckets import pad_batch
from jaxseg_robust.data.instances import make_instance
from jaxseg_robust.metrics.masks import mask_iou
from jaxseg_robust.prompts.types import make_prompts

FRAME = (24, 28)
CLICKS = 3


def _instance(index, height, width, seed):
    rng = np.random.default_rng(seed)
    image = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
    yy, xx = np.mgrid[:height, :width]
    gt = ((((yy - 0.5 * height) / (0.3 * height)) ** 2 + ((xx - 0.45 * width) / (0.3 * width)) ** 2) <= 1)
    image[gt] = (image[gt] // 2 + 100).astype(np.uint8)
    return make_instance(f"im{index}", image, gt.astype(np.int8), dataset="toy")


INSTANCES = [_instance(0, 24, 28, 0), _instance(1, 20, 25, 1)]


@pytest.fixture(scope="module")
def model():
    seg = ClickMapSegmenter()
    return seg, seg.init(0)


@pytest.fixture(scope="module")
def batch():
    return pad_batch(INSTANCES, FRAME, 2)


def _np_next_click(target, pred, not_clicked, valid):
    """RITM clicker: padded exact EDT, strict '>', first maximum in row-major order."""
    maps = []
    for error in (target & ~pred & valid, ~target & pred & valid):
        maps.append(ndi.distance_transform_edt(np.pad(error, 1))[1:-1, 1:-1] * not_clicked)
    positive = maps[0].max() > maps[1].max()
    flat = int(np.argmax(maps[0] if positive else maps[1]))
    return bool(positive), flat // target.shape[1], flat % target.shape[1]


def test_baseline_feeds_the_models_own_logits_back(model, batch):
    seg, params = model
    fn = make_click_batch_fn(seg, params, mode="baseline", n_clicks=CLICKS, mask_input="always")
    assert fn.config.thr == 0.49  # the family's threshold is the protocol's default
    out = jax.device_get(fn(batch))
    embed, decode = jax.jit(seg.embed), jax.jit(seg.decode)
    for slot, instance in enumerate(INSTANCES):
        target = instance.gt == 1
        height, width = target.shape
        x, transform = seg.preprocess(instance.image, frame_hw=FRAME)
        features = embed(params, x)
        pred, not_clicked = np.zeros_like(target), np.ones_like(target)
        feedback, points, labels, ious = None, [], [], []
        for click in range(CLICKS):
            positive, row, col = _np_next_click(target, pred, not_clicked, np.ones_like(target))
            not_clicked[row, col] = False
            points.append((col, row))
            labels.append(int(positive))
            prompts = make_prompts(points, labels, mask_logits=feedback if click else None, num_slots=CLICKS,
                                   mask_shape=FRAME)
            logits = np.asarray(decode(params, features, prompts, transform).logits)
            feedback = logits  # the model's own logits at the frame, as the contract says
            pred = (1 / (1 + np.exp(-logits)))[:height, :width] > 0.49
            ious.append(float(mask_iou(target, pred)))
            np.testing.assert_array_equal(out["clicks_xy"][slot, click], [col, row])  # (x, y)
        assert out["has_mask_input"][slot].tolist() == [False, True, True]
        np.testing.assert_allclose(out["iou"][slot], ious, atol=1e-6)


def test_feedback_changes_the_prediction(model):
    seg, params = model
    instance = INSTANCES[0]
    x, transform = seg.preprocess(instance.image, frame_hw=FRAME)
    features = seg.embed(params, x)
    prompts = make_prompts([(10, 12)], [1], mask_logits=np.full(FRAME, 3.0, np.float32), mask_shape=FRAME)
    with_mask = seg.decode(params, features, prompts, transform).logits
    without = seg.decode(params, features, prompts.replace(has_mask=np.asarray(False)), transform).logits
    assert np.abs(np.asarray(with_mask) - np.asarray(without)).max() > 1e-4


def test_tetris_attack_runs_and_brackets_iterate_zero(model, batch):
    seg, params = model
    fn = make_click_batch_fn(seg, params, mode="minmax", n_clicks=CLICKS, n_opt_steps=3, lr_mult=2.0)
    out = jax.device_get(fn(batch))
    assert fn.traces >= 1 and set(out) == {"min", "max"}
    for name, maximise in (("min", False), ("max", True)):
        part = out[name]
        assert part["iou"].shape == (2, CLICKS) and np.isfinite(part["location_loss"]).all()
        chosen, start = part["selection_iou"], part["start_selection_iou"]
        assert ((chosen >= start - 1e-6) if maximise else (chosen <= start + 1e-6)).all()
        clicks = part["clicks_xy"]  # (x, y)
        assert (clicks >= 0).all() and (clicks[..., 0] < FRAME[1]).all() and (clicks[..., 1] < FRAME[0]).all()
    # click 1 of both attacks starts from the baseline click on the empty history
    np.testing.assert_array_equal(out["min"]["baseline_clicks_xy"][:, 0], out["max"]["baseline_clicks_xy"][:, 0])


def test_click_grid_with_the_baseline_prefix(model, batch):
    seg, params = model
    fn = make_click_grid_batch_fn(seg, params, stride=4, prefix="baseline", chunk_size=8)
    assert fn.config.thr == 0.49
    out = jax.device_get(fn(batch))
    assert out["iou"].shape == (2, 6, 7)
    for slot, instance in enumerate(INSTANCES):
        height, width = instance.gt.shape
        inside = out["evaluated"][slot]
        assert inside.sum() == -(-height // 4) * -(-width // 4)
        assert np.isfinite(out["iou"][slot][inside]).all() and np.isnan(out["iou"][slot][~inside]).all()
        assert 0.0 <= out["baseline_iou"][slot] <= 1.0


def test_rclicks_rounds_use_the_family(model, batch):
    seg, params = model
    config = RClicksConfig(num_rounds=CLICKS, num_groups=2, threshold=seg.probability_threshold)
    fn = make_rclicks_batch_fn(seg, params, DistanceTransformClickModel(), config=config)
    out = jax.device_get(fn(batch))
    assert out["base_iou"].shape == (2, CLICKS) and out["group_iou"].shape == (2, 2, CLICKS)
    assert ((out["base_iou"] >= 0) & (out["base_iou"] <= 1)).all()
    for slot, instance in enumerate(INSTANCES):  # round 1 clicks lie on the object
        clicks = np.concatenate([out["base_clicks"][slot][None], out["group_clicks"][slot]])
        assert (instance.gt[clicks[:, 0, 1], clicks[:, 0, 0]] == 1).all()


def test_box_protocols_without_a_resized_frame_are_refused_clearly(model):
    seg, params = model
    with pytest.raises(ValueError, match="no resized frame"):
        make_box_batch_fn(seg, params, mode="jitter", box_frame="resized")
    with pytest.raises(ValueError, match="no resized frame"):
        make_box_batch_fn(seg, params, mode="tight", reference_iou=True)
    assert not make_box_batch_fn(seg, params, mode="tight").protocol.reference_iou
