"""Tests of the BREPS jitter baseline (spec prompt-attacks §4.8): exact draw sequence, kept boxes."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from jaxseg_robust.prompts.jitter import box_iou_float32, jitter_boxes, pad_boxes


def _iou32(a, b):
    """torchvision box_iou re-stated in float32 (one pair)."""
    a, b = np.float32(a), np.float32(b)
    lt = np.maximum(a[:2], b[:2])
    rb = np.minimum(a[2:], b[2:])
    wh = np.clip(rb - lt, np.float32(0), None)
    inter = wh[0] * wh[1]
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    with np.errstate(invalid="ignore", divide="ignore"):
        return inter / union


def _spec_jitter(tight, height, width):
    """§4.8 step 2 transcribed: global random reseeded with 42, 75 draws, 15 kept, first 10 used."""
    state = random.getstate()
    try:
        random.seed(42)
        x1, y1, x2, y2 = (float(v) for v in np.float32(tight))
        w, h = x2 - x1, y2 - y1
        kept = []
        for _ in range(15 * 5):
            dx = random.uniform(-0.3, 0.3) * w
            dy = random.uniform(-0.3, 0.3) * h
            box = np.array([x1 + dx, y1 + dy, x2 + dx, y2 + dy], np.float32)
            box[[0, 2]] = np.minimum(np.maximum(box[[0, 2]], np.float32(0)), np.float32(width - 1))
            box[[1, 3]] = np.minimum(np.maximum(box[[1, 3]], np.float32(0)), np.float32(height - 1))
            if _iou32(box, tight) > 0.5:
                kept.append(box)
            if len(kept) >= 15:
                break
        return np.array(kept[:10] if kept else [np.float32(tight)], np.float32)
    finally:
        random.setstate(state)


@st.composite
def boxes_in_images(draw):
    height = draw(st.integers(2, 700))
    width = draw(st.integers(2, 700))
    x1 = draw(st.integers(0, width - 1))
    x2 = draw(st.integers(x1, width - 1))
    y1 = draw(st.integers(0, height - 1))
    y2 = draw(st.integers(y1, height - 1))
    return np.array([x1, y1, x2, y2], np.float32), (height, width)


@given(boxes_in_images())
def test_sequence_equals_the_spec_restatement(case):
    tight, hw = case
    got = jitter_boxes(tight, hw)
    want = _spec_jitter(tight, *hw)
    np.testing.assert_array_equal(got, want)


@given(boxes_in_images())
def test_kept_boxes_overlap_the_tight_box_and_stay_inside(case):
    tight, (height, width) = case
    boxes = jitter_boxes(tight, (height, width))
    assert boxes.dtype == np.float32 and 1 <= boxes.shape[0] <= 10 and boxes.shape[1] == 4
    if boxes.shape[0] == 1 and np.array_equal(boxes[0], tight):
        return  # fallback (e.g. zero-area boxes: IoU is 0/0)
    for box in boxes:
        assert _iou32(box, tight) > 0.5
        # float64 check of the same property (float32 decides only at the 1e-6 level)
        a, b = box.astype(np.float64), tight.astype(np.float64)
        inter = max(0, min(a[2], b[2]) - max(a[0], b[0])) * max(0, min(a[3], b[3]) - max(a[1], b[1]))
        union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
        assert inter / union > 0.5 - 1e-5
        assert 0 <= box[0] <= box[2] <= width - 1 and 0 <= box[1] <= box[3] <= height - 1


def test_same_draws_for_every_image_and_call():
    tight = np.array([100, 80, 300, 240], np.float32)
    first = jitter_boxes(tight, (480, 640))
    random.seed(7)  # global state is irrelevant
    np.testing.assert_array_equal(jitter_boxes(tight, (480, 640)), first)
    assert first.shape == (10, 4)
    # relative shifts are shared by every image: a scaled box gets scaled shifts (no clamping here)
    doubled = jitter_boxes(tight * 2, (960, 1280))
    np.testing.assert_allclose(doubled, first * 2, rtol=1e-6)
    # translations only: width and height unchanged away from the border
    np.testing.assert_allclose(first[:, 2] - first[:, 0], 200, atol=1e-3)
    np.testing.assert_allclose(first[:, 3] - first[:, 1], 160, atol=1e-3)
    # a different seed gives different boxes
    assert not np.array_equal(jitter_boxes(tight, (480, 640), seed=0), first)


def test_fallback_and_counts():
    point = np.array([5, 5, 5, 5], np.float32)  # zero-area: IoU is NaN, nothing kept
    np.testing.assert_array_equal(jitter_boxes(point, (10, 10)), point[None])
    few = jitter_boxes(np.array([0, 0, 9, 9], np.float32), (10, 10), n_used=3)
    assert few.shape == (3, 4)
    # a stricter IoU keeps fewer boxes than the draws allow
    strict = jitter_boxes(np.array([10, 10, 50, 50], np.float32), (100, 100), min_iou=0.95)
    assert strict.shape[0] < 10


def test_box_iou_float32():
    assert box_iou_float32([0, 0, 2, 2], [1, 1, 3, 3]) == np.float32(1 / 7)
    assert box_iou_float32([0, 0, 1, 1], [2, 2, 3, 3]) == 0
    assert np.isnan(box_iou_float32([1, 1, 1, 1], [1, 1, 1, 1]))


@pytest.mark.parity
def test_box_iou_matches_torchvision():
    torch = pytest.importorskip("torch")
    ops = pytest.importorskip("torchvision.ops")
    rng = np.random.default_rng(0)
    a = np.sort(rng.uniform(0, 100, (200, 2, 2)), axis=1).transpose(0, 2, 1).reshape(200, 4)[:, [0, 2, 1, 3]]
    b = np.sort(rng.uniform(0, 100, (200, 2, 2)), axis=1).transpose(0, 2, 1).reshape(200, 4)[:, [0, 2, 1, 3]]
    a, b = a.astype(np.float32), b.astype(np.float32)
    want = ops.box_iou(torch.from_numpy(a), torch.from_numpy(b)).diagonal().numpy()
    got = np.array([box_iou_float32(x, y) for x, y in zip(a, b)])
    np.testing.assert_array_equal(got, want)


def test_pad_boxes_and_errors():
    boxes, valid = pad_boxes(np.array([[1, 2, 3, 4], [5, 6, 7, 8]]), 4)
    assert boxes.shape == (4, 4) and boxes.dtype == np.float32
    np.testing.assert_array_equal(valid, [True, True, False, False])
    np.testing.assert_array_equal(boxes[2:], [[1, 2, 3, 4]] * 2)
    with pytest.raises(ValueError, match="boxes"):
        pad_boxes(np.zeros((5, 4)), 4)
    with pytest.raises(ValueError, match="tight_box"):
        jitter_boxes([0, 0, 1], (4, 4))
    with pytest.raises(ValueError, match="tight_box"):
        jitter_boxes([0, 0, np.nan, 1], (4, 4))
    with pytest.raises(ValueError, match="image_hw"):
        jitter_boxes([0, 0, 1, 1], (0, 4))
    with pytest.raises(ValueError, match="n_used"):
        jitter_boxes([0, 0, 1, 1], (4, 4), n_used=0)
