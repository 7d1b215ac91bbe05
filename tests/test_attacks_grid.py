"""Tests of the exhaustive prompt grids (spec prompt-attacks §5.1-5.3) on the tiny random SAM."""

from __future__ import annotations

import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxseg_robust.attacks.fixed_boxes import tight_box_host
from jaxseg_robust.attacks.grid import (
    BoxGridConfig,
    ClickGridConfig,
    centred_boxes,
    click_grid,
    corner_heatmap,
    evaluate_candidates,
    heatmap_extremes,
    make_box_grid_batch_fn,
    make_click_grid_batch_fn,
)
from jaxseg_robust.data.buckets import FixedFrame, pad_batch
from jaxseg_robust.data.instances import make_instance
from jaxseg_robust.metrics.masks import boundary_iou, boundary_width, mask_iou
from jaxseg_robust.models import zoo
from jaxseg_robust.prompts.clicker import next_click
from jaxseg_robust.prompts.types import make_prompts
from jaxseg_robust.runner.engine import run
from jaxseg_robust.runner.sharding import data_mesh, shard_batch

FRAME = (18, 22)


def _instance(index, height, width, seed, kind="ellipse", ignore=False):
    rng = np.random.default_rng(seed)
    image = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
    yy, xx = np.mgrid[:height, :width]
    cy, cx = rng.uniform(0.35, 0.65) * height, rng.uniform(0.35, 0.65) * width
    radius = ((yy - cy) / (0.3 * height)) ** 2 + ((xx - cx) / (0.25 * width)) ** 2
    if kind == "ellipse":
        gt = (radius <= 1).astype(np.int8)
    else:  # two components touching the image border
        gt = np.zeros((height, width), np.int8)
        gt[: height // 3, : width // 3] = 1
        gt[height // 2:, width - 4:] = 1
    image[gt == 1] = (image[gt == 1] // 2 + 100).astype(np.uint8)
    if ignore:
        gt[(radius > 0.8) & (radius <= 1.2)] = -1
    return make_instance(f"im{index}", image, gt, dataset="toy")


INSTANCES = [_instance(0, 16, 19, 0, ignore=True), _instance(1, 18, 22, 1, kind="two"), _instance(2, 13, 20, 2)]


@pytest.fixture(scope="module")
def model():
    seg = zoo.segmenter("sam_tiny")
    return seg, seg.init(0)


@pytest.fixture(scope="module")
def framed(model):
    """Instance 0 padded into FRAME: (features, transform, framed gt, band width)."""
    seg, params = model
    instance = INSTANCES[0]
    x, transform = seg.preprocess(instance.image, frame_hw=FRAME)
    gt = np.full(FRAME, -1, np.int8)
    gt[:instance.gt.shape[0], :instance.gt.shape[1]] = instance.gt
    features = jax.jit(seg.embed)(params, x)
    return features, transform, gt, np.int32(boundary_width(*instance.gt.shape))


@pytest.fixture(scope="module")
def one_at_a_time(model, framed):
    """Independent path: decode_low_res of one prompt set, candidate selection in numpy, upsample."""
    seg, params = model
    features, transform, _, _ = framed
    low = seg.config.low_res_size
    decode = jax.jit(lambda p: seg.decode_low_res(params, features, p, transform))
    upsample = jax.jit(lambda l: seg.upsample(l, transform))

    def logits(prompts, multimask):
        low_res, iou = (np.asarray(v) for v in decode(prompts))
        index = 1 + int(np.argmax(iou[1:])) if multimask else 0
        return np.asarray(upsample(low_res[index]))

    def click(row, col):
        return logits(make_prompts([[col, row]], [1], mask_shape=(low, low)), True)

    def box(b):
        return logits(make_prompts(box=np.asarray(b, np.float32), mask_shape=(low, low)), False)

    return click, box


def _sharded(instances, frame, batch_size):
    """The batch as the engine hands it over (sharded over the data mesh): same compiled program."""
    return shard_batch(pad_batch(instances, frame, batch_size), data_mesh())


@pytest.fixture(scope="module")
def click_batch(model):
    """The click-grid batch function (jit + vmap over instances) on INSTANCES[:2], stride 1."""
    seg, params = model
    fn = make_click_grid_batch_fn(seg, params, chunk_size=16)
    return fn, jax.device_get(fn(_sharded(INSTANCES[:2], FRAME, 2)))


@pytest.fixture(scope="module")
def box_batch(model):
    """The box-grid batch function on INSTANCES[:2], stride 1."""
    seg, params = model
    fn = make_box_grid_batch_fn(seg, params, chunk_size=37)
    return fn, jax.device_get(fn(_sharded(INSTANCES[:2], FRAME, 2)))


def _reference_scores(preds, gt, d):
    """IoU / BIoU of stacked predictions [N, H, W] with the metrics module (ignore excluded)."""
    gt_b = np.broadcast_to(gt == 1, preds.shape)
    valid = np.broadcast_to(gt != -1, preds.shape)
    return np.asarray(mask_iou(gt_b, preds, valid)), np.asarray(boundary_iou(gt_b, preds, valid, width=d))


# ---- click grid ------------------------------------------------------------------------

def test_click_grid_equals_one_click_at_a_time(click_batch, one_at_a_time):
    out = click_batch[1]  # slot 0 = instance 0 padded into FRAME
    iou, biou = out["iou"][0], out["biou"][0]
    gt = INSTANCES[0].gt
    height, width = gt.shape
    d = boundary_width(height, width)
    assert iou.shape == FRAME and out["n_evaluated"][0] == height * width
    np.testing.assert_array_equal(out["rows"][0], np.arange(FRAME[0]))
    np.testing.assert_array_equal(out["cols"][0], np.arange(FRAME[1]))
    # outside the image: not evaluated, NaN
    inside = np.zeros(FRAME, bool)
    inside[:height, :width] = True
    np.testing.assert_array_equal(out["evaluated"][0], inside)
    assert np.isnan(iou[~inside]).all() and np.isnan(biou[~inside]).all()
    click = one_at_a_time[0]
    # P > thr with P = sigmoid(logits) (float32), as the grid and the TETRIS attack score
    preds = np.stack([jax.nn.sigmoid(click(r, c)[:height, :width]) > 0.5
                      for r in range(height) for c in range(width)])
    want_iou, want_biou = _reference_scores(preds, gt, d)
    np.testing.assert_allclose(iou[:height, :width].reshape(-1), want_iou, atol=1e-6)
    np.testing.assert_allclose(biou[:height, :width].reshape(-1), want_biou, atol=1e-6)
    assert np.ptp(want_iou) > 0  # the heatmap is not constant
    # extremes: first in row-major order among the finite cells
    for name, heat in (("iou", iou), ("biou", biou)):
        assert out[f"{name}_min"][0] == np.nanmin(heat) and out[f"{name}_max"][0] == np.nanmax(heat)
        # (x, y) = (col, row) of the extreme
        assert tuple(out[f"{name}_argmin_xy"][0]) == np.unravel_index(np.nanargmin(heat), FRAME)[::-1]
        assert tuple(out[f"{name}_argmax_xy"][0]) == np.unravel_index(np.nanargmax(heat), FRAME)[::-1]


def test_stride_chunk_and_region(model, framed, click_batch):
    stride_one = click_batch[1]
    seg, params = model
    features, transform, gt, width = framed
    target = gt == 1
    grid = jax.jit(functools.partial(click_grid, seg, params, stride=3, chunk_size=5))
    strided = jax.device_get(grid(features, transform, gt, width, region=target))
    np.testing.assert_array_equal(strided.rows, np.arange(0, FRAME[0], 3))
    np.testing.assert_array_equal(strided.cols, np.arange(0, FRAME[1], 3))
    np.testing.assert_array_equal(strided.evaluated, target[::3, ::3])
    assert strided.n_evaluated == target[::3, ::3].sum() > 0
    # the same positions in the stride-1 grid (chunk 16, whole image)
    want = np.where(target[::3, ::3], stride_one["iou"][0, ::3, ::3], np.nan)
    np.testing.assert_allclose(strided.iou, want, atol=1e-6)
    want_b = np.where(target[::3, ::3], stride_one["biou"][0, ::3, ::3], np.nan)
    np.testing.assert_allclose(strided.biou, want_b, atol=1e-6)


@functools.lru_cache(maxsize=None)
def _candidates_program(chunk):
    return jax.jit(lambda c, v: evaluate_candidates(lambda i: (v[i], 2.0 * v[i]), c, chunk))


@settings(max_examples=25)
@given(st.sampled_from([1, 3, 7, 40]), st.sampled_from([0.0, 0.05, 0.3, 1.0]), st.integers(0, 2 ** 16))
def test_evaluate_candidates_any_chunk(chunk, fraction, seed):
    rng = np.random.default_rng(seed)
    candidates = rng.random(40) < fraction
    values = rng.normal(size=40).astype(np.float32)
    out = _candidates_program(chunk)(candidates, values)
    want = np.where(candidates, values, np.nan)
    np.testing.assert_array_equal(out[0], want)
    np.testing.assert_array_equal(out[1], 2 * want)


def test_evaluate_candidates_under_vmap_and_errors():
    candidates = np.array([[True, False, True, True], [False, False, False, False]])
    values = jnp.arange(4.0)
    fn = jax.jit(jax.vmap(lambda c: evaluate_candidates(lambda i: values[i], c, 3)))
    out = np.asarray(fn(candidates))
    np.testing.assert_array_equal(out[0], [0, np.nan, 2, 3])
    assert np.isnan(out[1]).all()
    with pytest.raises(ValueError, match="chunk_size"):
        evaluate_candidates(lambda i: values[i], candidates[0], 0)


def test_heatmap_extremes_nan_and_ties():
    heat = np.array([[np.nan, 0.5, 0.2], [0.2, 0.9, 0.9]], np.float32)
    ext = jax.jit(heatmap_extremes)(heat)
    assert (float(ext.min), float(ext.max), int(ext.argmin), int(ext.argmax)) == (
        pytest.approx(0.2), pytest.approx(0.9), 2, 4)
    empty = heatmap_extremes(np.full((2, 2), np.nan, np.float32))
    assert np.isnan(empty.min) and np.isnan(empty.max) and empty.argmin == -1 and empty.argmax == -1


# ---- box grid ----------------------------------------------------------------------------

def _comp_hw_boxes(mask, stride=1):
    """Independent re-statement of comp_hw.py: {(h, w): clipped box} and the deduplicated box set."""
    height, width = mask.shape
    rows, cols = np.nonzero(mask)
    if rows.size:
        cmin, rmin, cmax, rmax = cols.min(), rows.min(), cols.max(), rows.max()
    else:
        cmin, rmin, cmax, rmax = 0, 0, 1, 1
    cx, cy = (cmax - cmin) // 2 + cmin, (rmax - rmin) // 2 + rmin
    by_size = {}
    for h in range(0, 2 * height + 1, stride):
        for w in range(0, 2 * width + 1, stride):
            x1, x2 = np.clip([cx - w // 2, cx + (w + 1) // 2], 0, width - 1)
            y1, y2 = np.clip([cy - h // 2, cy + (h + 1) // 2], 0, height - 1)
            by_size[(h, w)] = (int(x1), int(y1), int(x2), int(y2))
    return by_size, np.unique(np.array(list(by_size.values())), axis=0), (int(cx), int(cy))


_CENTRED = jax.jit(centred_boxes, static_argnames=("frame_hw", "stride"))
_BOX_FRAME = (16, 17)


@settings(max_examples=30)
@given(st.integers(1, 16), st.integers(1, 17), st.sampled_from([1, 2, 3]),
       st.sampled_from(["random", "empty", "pixel", "full"]), st.integers(0, 2 ** 16))
def test_centred_boxes_match_comp_hw(height, width, stride, kind, seed):
    rng = np.random.default_rng(seed)
    mask = rng.random((height, width)) < 0.2
    if kind == "empty":
        mask[:] = False
    elif kind == "pixel":
        mask[:] = False
        mask[rng.integers(height), rng.integers(width)] = True
    elif kind == "full":
        mask[:] = True
    by_size, unique, centre = _comp_hw_boxes(mask, stride)
    frame = _BOX_FRAME  # one compiled program per stride; the image size is data
    grid = jax.device_get(_CENTRED(tight_box_host(mask), np.array([height, width]), frame_hw=frame, stride=stride))
    boxes, valid = (np.asarray(v) for v in jax.device_get(grid).distinct_boxes())
    assert (int(grid.x.centre), int(grid.y.centre)) == centre
    ours = boxes[valid]
    assert len(ours) == len(unique) == len({tuple(b) for b in ours.tolist()}) == grid.x.count * grid.y.count
    np.testing.assert_array_equal(np.unique(ours, axis=0), unique)
    if stride == 1:
        assert len(unique) == height * width
    np.testing.assert_array_equal(grid.y.sizes, np.arange(0, 2 * frame[0] + 1, stride))
    for a, h in enumerate(grid.y.sizes):
        for b, w in enumerate(grid.x.sizes):
            if h <= 2 * height and w <= 2 * width:
                i, j = grid.y.index[a], grid.x.index[b]
                assert (grid.x.lo[j], grid.y.lo[i], grid.x.hi[j], grid.y.hi[i]) == by_size[(int(h), int(w))]
            else:
                assert not (grid.y.size_valid[a] and grid.x.size_valid[b])


def test_box_grid_equals_one_box_at_a_time(box_batch, one_at_a_time):
    result = {name: value[0] for name, value in box_batch[1].items()}  # instance 0 padded into FRAME
    gt = INSTANCES[0].gt
    height, width = gt.shape
    d = boundary_width(height, width)
    by_size, unique, _ = _comp_hw_boxes(gt == 1)
    assert result["n_boxes"] == len(unique) == height * width
    assert result["iou"].shape == (2 * FRAME[0] + 1, 2 * FRAME[1] + 1)
    np.testing.assert_array_equal(result["valid"], (np.arange(2 * FRAME[0] + 1) <= 2 * height)[:, None]
                                  & (np.arange(2 * FRAME[1] + 1) <= 2 * width)[None, :])
    assert np.isnan(result["iou"][~result["valid"]]).all()
    assert not np.isnan(result["iou_reference"][result["valid"]]).any()
    tight = tight_box_host(gt == 1)
    np.testing.assert_array_equal(result["tight_box"], tight)
    np.testing.assert_array_equal(result["tight_hw"], [tight[3] - tight[1], tight[2] - tight[0]])
    assert by_size[tuple(int(v) for v in result["tight_hw"])] == tuple(tight)
    rng = np.random.default_rng(0)
    sizes = [tuple(int(v) for v in result["tight_hw"]), (0, 0), (2 * height, 2 * width)] + [
        (int(rng.integers(0, 2 * height + 1)), int(rng.integers(0, 2 * width + 1))) for _ in range(25)]
    preds = np.stack([one_at_a_time[1](by_size[s])[:height, :width] > 0 for s in sizes])
    want_iou, want_biou = _reference_scores(preds, gt, d)
    inter = (preds & (gt == 1)).sum(axis=(1, 2))
    union = (preds | (gt == 1)).sum(axis=(1, 2))
    got = [(result["iou"][s], result["biou"][s], result["iou_reference"][s]) for s in sizes]
    np.testing.assert_allclose([g[0] for g in got], want_iou, atol=1e-6)
    np.testing.assert_allclose([g[1] for g in got], want_biou, atol=1e-6)
    np.testing.assert_allclose([g[2] for g in got], inter / (union + 1e-6), rtol=1e-6)
    assert np.nanmax(result["iou"]) > np.nanmin(result["iou"])


_CORNERS = jax.jit(corner_heatmap, static_argnames=("frame_hw",))


@settings(max_examples=30)
@given(st.integers(2, 12), st.integers(2, 12), st.integers(0, 2 ** 16))
def test_corner_heatmap_matches_draw_heatmaps(height, width, seed):
    rng = np.random.default_rng(seed)
    n = 40
    boxes = np.stack([rng.integers(0, width, n), rng.integers(0, height, n),
                      rng.integers(0, width, n), rng.integers(0, height, n)], axis=1).astype(np.int32)
    values = rng.random(n).astype(np.float32)
    valid = rng.random(n) < 0.8
    total = np.zeros((height, width))
    count = np.zeros((height, width))
    for (x1, y1, x2, y2), v, ok in zip(boxes, values, valid):
        if not ok or x2 - x1 <= 0 or y2 - y1 <= 0:
            continue
        for y, x in ((y1, x1), (y1, x2), (y2, x1), (y2, x2)):
            total[y, x] += v
            count[y, x] += 1
    want = np.where(count > 0, total / np.maximum(count, 1), 0)
    heat = _CORNERS(boxes, values, valid, frame_hw=(12, 12))  # one compiled program; boxes inside (H, W)
    np.testing.assert_allclose(heat[:height, :width], want, rtol=1e-5, atol=1e-6)
    assert (np.asarray(heat)[height:] == 0).all() and (np.asarray(heat)[:, width:] == 0).all()


# ---- batch functions and the engine -------------------------------------------------------

def test_config_validation(model):
    seg, params = model
    for kwargs, match in ((dict(stride=0), "stride"), (dict(chunk_size=2.0), "chunk_size"),
                          (dict(region="border"), "region"), (dict(prefix="user"), "prefix"),
                          (dict(thr=1.0), "thr"), (dict(dilation_ratio=-1.0), "dilation_ratio")):
        with pytest.raises(ValueError, match=match):
            ClickGridConfig(**kwargs)
        with pytest.raises(ValueError, match=match):
            make_click_grid_batch_fn(seg, params, **kwargs)
    with pytest.raises(ValueError, match="corner_heatmap"):
        BoxGridConfig(corner_heatmap=1)
    with pytest.raises(ValueError, match="stride"):
        make_box_grid_batch_fn(seg, params, stride=-1)


def _baseline_first_click(gt):
    region = gt != -1
    _, row, col = next_click(gt == 1, np.zeros(gt.shape, bool), np.ones(gt.shape, bool), region)
    return int(row), int(col)


def test_click_grid_batch_fn_and_engine(click_batch, tmp_path):
    fn, out = click_batch
    assert fn.traces == 1
    for slot, instance in enumerate(INSTANCES[:2]):
        height, width = instance.gt.shape
        assert out["n_evaluated"][slot] == height * width
        assert tuple(out["first_click_xy"][slot]) == _baseline_first_click(instance.gt)[::-1]  # (x, y)
        np.testing.assert_array_equal(out["baseline_click_xy"][slot], out["first_click_xy"][slot])
        assert out["grid_click_positive"][slot]  # no prefix: the grid click is a positive first click
        x, y = out["baseline_click_xy"][slot]
        np.testing.assert_allclose(out["baseline_iou"][slot], out["iou"][slot, y, x], atol=1e-6)
        assert out["iou_min"][slot] <= out["baseline_iou"][slot] <= out["iou_max"][slot]
        x, y = out["iou_argmax_xy"][slot]
        assert out["iou"][slot, y, x] == out["iou_max"][slot] == np.nanmax(out["iou"][slot])
        x, y = out["biou_argmin_xy"][slot]
        assert out["biou"][slot, y, x] == out["biou_min"][slot] == np.nanmin(out["biou"][slot])
    # the engine: another batch shape-alike, ragged tail, no recompilation
    summary = run(INSTANCES, fn, tmp_path / "run", 2, config={"protocol": "click-grid"},
                  frame_policy=FixedFrame(*FRAME), progress="none")
    assert summary.ok == 3 and summary.failed == 0
    assert fn.traces == 1
    records = [json.loads(line) for line in (tmp_path / "run" / "records.jsonl").read_text().splitlines()]
    assert {r["id"] for r in records} == {"im0", "im1", "im2"}
    payload = next(r["payload"] for r in records if r["id"] == "im2")
    assert np.asarray(payload["iou"], float).shape == FRAME
    assert payload["n_evaluated"] == 13 * 20


@pytest.mark.slow
def test_second_click_grid_batch_fn(model):
    seg, params = model
    fn = make_click_grid_batch_fn(seg, params, prefix="baseline", region="error", stride=1, chunk_size=32)
    out = jax.device_get(fn(pad_batch(INSTANCES[1:], FRAME, 2)))
    assert fn.traces == 1
    low = seg.config.low_res_size
    decode = jax.jit(lambda f, p, t: seg.decode(params, f, p, t))
    embed = jax.jit(seg.embed)
    for slot, instance in enumerate(INSTANCES[1:]):
        gt = instance.gt
        height, width = gt.shape
        x, transform = seg.preprocess(instance.image, frame_hw=FRAME)
        features = embed(params, x)
        row0, col0 = _baseline_first_click(gt)
        assert tuple(out["first_click_xy"][slot]) == (col0, row0)
        first = decode(features, make_prompts([[col0, row0]], [1], mask_shape=(low, low)), transform)
        pred = np.asarray(jax.nn.sigmoid(first.logits))[:height, :width] > 0.5
        not_clicked = np.ones(gt.shape, bool)
        not_clicked[row0, col0] = False
        positive, row1, col1 = next_click(gt == 1, pred, not_clicked, gt != -1)
        assert bool(out["grid_click_positive"][slot]) == bool(positive)
        assert tuple(out["baseline_click_xy"][slot]) == (int(col1), int(row1))
        error = ((gt == 1) & ~pred) if positive else ((gt == 0) & pred)
        np.testing.assert_array_equal(out["evaluated"][slot, :height, :width], error)
        assert not out["evaluated"][slot, height:].any() and not out["evaluated"][slot, :, width:].any()
        # one grid cell against the independent two-click decode (mask input only for a positive click)
        mask_logits = np.asarray(first.selected_low_res) if positive else None
        rows, cols = np.nonzero(error)
        r, c = int(rows[len(rows) // 2]), int(cols[len(cols) // 2])
        second = decode(features, make_prompts([[col0, row0], [c, r]], [1, int(positive)], mask_logits,
                                               mask_shape=(low, low)), transform)
        pred2 = np.asarray(jax.nn.sigmoid(second.logits))[:height, :width] > 0.5
        want = mask_iou(gt == 1, pred2, gt != -1)
        np.testing.assert_allclose(out["iou"][slot, r, c], want, atol=1e-6)
        if out["evaluated"][slot, row1, col1]:
            assert out["iou_min"][slot] <= out["baseline_iou"][slot] <= out["iou_max"][slot]


def test_box_grid_batch_fn_and_engine(box_batch, tmp_path):
    fn, out = box_batch
    assert fn.traces == 1
    for slot, instance in enumerate(INSTANCES[:2]):
        height, width = instance.gt.shape
        by_size, unique, centre = _comp_hw_boxes(instance.gt == 1)
        assert out["n_boxes"][slot] == len(unique)
        assert tuple(out["centre"][slot]) == centre
        h, w = out["tight_hw"][slot]
        np.testing.assert_allclose(out["tight_iou"][slot], out["iou"][slot, h, w], atol=1e-6)
        assert out["iou_min"][slot] <= out["tight_iou"][slot] <= out["iou_max"][slot]
        for name in ("argmin", "argmax"):
            h, w = out[f"iou_{name}_hw"][slot]
            assert out["iou"][slot, h, w] == out[f"iou_{name[3:]}"][slot]
            assert tuple(out[f"iou_{name}_box"][slot]) == by_size[(int(h), int(w))]
        heat = out["corner_heatmap"][slot]
        assert heat.shape == FRAME and (heat[height:] == 0).all() and (heat[:, width:] == 0).all()
        assert heat.max() > 0
    summary = run(INSTANCES, fn, tmp_path / "run", 2, config={"protocol": "box-grid"},
                  frame_policy=FixedFrame(*FRAME), progress="none")
    assert summary.ok == 3 and summary.failed == 0
    assert fn.traces == 1

