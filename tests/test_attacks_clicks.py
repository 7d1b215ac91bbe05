"""Tests of the click trajectories (RITM baseline, TETRIS min/max) on the tiny random SAM.

Spec: docs/protocols/tetris.md §1, §2.2-2.3, §3, §7, §8. The
independent re-statements below (clicker, location loss, one Adam update, the
baseline loop) use NumPy/SciPy and the model's own ``decode`` as the oracle,
never the module's internals.
"""

from __future__ import annotations

import functools
import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.ndimage as ndi
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxseg_robust.attacks.clicks import (
    TetrisConfig,
    click_trajectory,
    location_distance_map,
    location_error_region,
    location_loss,
    make_click_batch_fn,
    tetris_learning_rate,
)
from jaxseg_robust.reports.tetris_scores import tetris_scores, trajectory_scores
from jaxseg_robust.metrics.masks import boundary_widths
from jaxseg_robust.data.buckets import FixedFrame, pad_batch
from jaxseg_robust.data.instances import make_instance
from jaxseg_robust.metrics.masks import boundary_iou, boundary_width, mask_iou
from jaxseg_robust.models import zoo
from jaxseg_robust.ops.render import disk_center, render_soft_disk
from jaxseg_robust.prompts.types import make_prompts
from jaxseg_robust.runner.engine import run
from jaxseg_robust.runner.sharding import data_mesh, shard_batch
from lowered_loops import lowered_text, while_condition_constants

FRAME = (40, 48)
CLICKS = 3
STEPS = 4
LR_MULT = 4.0  # tiny images: lr ~ 0.55 resized px per step at lr_mult 1


def _instance(index, height, width, seed, kind="ellipse"):
    rng = np.random.default_rng(seed)
    image = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
    yy, xx = np.mgrid[:height, :width]
    cy, cx = rng.uniform(0.4, 0.6) * height, rng.uniform(0.4, 0.6) * width
    radius2 = ((yy - cy) / (0.3 * height)) ** 2 + ((xx - cx) / (0.25 * width)) ** 2
    gt = (radius2 <= 1).astype(np.int8)
    if kind == "two":
        gt[:, : width // 2][(yy[:, : width // 2] % 10) < 3] = 1  # stripes: a second, thin component
    image[gt == 1] = (image[gt == 1] // 2 + 100).astype(np.uint8)
    if kind == "ignore":
        gt[(radius2 > 0.8) & (radius2 <= 1.2)] = -1
    return make_instance(f"im{index}", image, gt, dataset="toy")


INSTANCES = [_instance(0, 40, 48, 0, "ignore"), _instance(1, 33, 45, 1), _instance(2, 36, 30, 2, "two")]
OTHER = [_instance(3, 38, 41, 3), _instance(4, 40, 40, 4, "ignore")]


@pytest.fixture(scope="module")
def model():
    seg = zoo.segmenter("sam_tiny")
    return seg, seg.init(0)


@pytest.fixture(scope="module")
def batch():
    # placed the way the engine places batches, so the engine reuses the compiled program
    return shard_batch(pad_batch(INSTANCES, FRAME, 3), data_mesh())


@pytest.fixture(scope="module")
def attacked(model, batch):
    """MIN and MAX in one compiled program on one embedding per image, default (code) settings."""
    seg, params = model
    fn = make_click_batch_fn(seg, params, mode="minmax", n_clicks=CLICKS, n_opt_steps=STEPS, lr_mult=LR_MULT,
                             record_trajectory=True, return_mask=True)
    return fn, jax.device_get(fn(batch))


@pytest.fixture(scope="module")
def baseline(model, batch):
    seg, params = model
    fn = make_click_batch_fn(seg, params, mode="baseline", n_clicks=CLICKS, return_mask=True)
    return fn, jax.device_get(fn(batch))


# ---- independent re-statements (NumPy / SciPy) ----------------------------------------

def _np_next_click(target, pred, not_clicked, valid):
    """RITM clicker: padded exact EDT, strict '>', first maximum in row-major order."""
    fn = target & ~pred & valid
    fp = ~target & pred & valid
    maps = []
    for error in (fn, fp):
        padded = np.pad(error, 1)
        maps.append(ndi.distance_transform_edt(padded)[1:-1, 1:-1] * not_clicked)
    positive = maps[0].max() > maps[1].max()
    chosen = maps[0] if positive else maps[1]
    flat = int(np.argmax(chosen))
    return bool(positive), flat // target.shape[1], flat % target.shape[1]


def _np_resize_align_corners(image, out_hw):
    """Bilinear, align_corners=True, as torch: src = dst (in - 1) / (out - 1)."""
    rows = np.arange(out_hw[0]) * ((image.shape[0] - 1) / (out_hw[0] - 1) if out_hw[0] > 1 else 0.0)
    cols = np.arange(out_hw[1]) * ((image.shape[1] - 1) / (out_hw[1] - 1) if out_hw[1] > 1 else 0.0)
    grid = np.meshgrid(rows, cols, indexing="ij")
    return ndi.map_coordinates(image.astype(np.float64), grid, order=1, mode="nearest")


def _full_grid_location_loss(point, resized_distance, radius=5.0):
    """Spec §3.2 4a on the whole h' x w' grid: mean(disk * D_resized), disk at clamp(q + 0.5)."""
    shape = resized_distance.shape
    disk = render_soft_disk(disk_center(point, shape), shape, radius)
    return jnp.mean(disk * jnp.asarray(resized_distance, jnp.float32))


def _framed(gt, frame=FRAME):
    out = np.full(frame, -1, np.int8)
    out[:gt.shape[0], :gt.shape[1]] = gt
    return out


def _lexicographic_replay(logs, maximise, tolerance=1.05):
    """The acceptance rule of spec §3.2 f, replayed on logged iterates: (accepted flags, best step)."""
    best, best_loc, best_step, flags = None, math.inf, 0, []
    for step, (iou, biou, loc) in enumerate(zip(logs["selection_iou"], logs["selection_biou"], logs["location"])):
        key = (float(iou), float(biou))
        better = best is None or (key > best if maximise else key < best)
        accept = bool(loc <= tolerance * best_loc) and better
        if accept:
            best, best_loc, best_step = key, float(loc), step
        flags.append(accept)
    return flags, best_step


# ---- pure pieces ------------------------------------------------------------------------

def test_learning_rate_formula():
    assert float(tetris_learning_rate(480, 640)) == pytest.approx(5 * 800 / (400 * 2 ** 0.5), rel=1e-6)
    assert float(tetris_learning_rate(480, 640)) == pytest.approx(7.07, abs=5e-3)
    assert float(tetris_learning_rate(480, 640, lr_mult=0.0)) == 0.0
    batched = jax.jit(jax.vmap(tetris_learning_rate))(jnp.array([480, 1024]), jnp.array([640, 1024]))
    np.testing.assert_allclose(batched, [7.0711, 5 * 1024 / 400], rtol=1e-4)


@pytest.mark.parametrize("kwargs, match", [
    (dict(mode="median"), "mode"), (dict(n_clicks=0), "n_clicks"), (dict(n_opt_steps=1.5), "n_opt_steps"),
    (dict(lr_mult=-1.0), "lr_mult"), (dict(thr=1.0), "thr"), (dict(radius=0.0), "radius"),
    (dict(coverage="disk"), "coverage"), (dict(samples_per_axis=2), "samples_per_axis"),
    (dict(mask_input="never"), "mask_input"), (dict(acceptance="greedy"), "acceptance"),
    (dict(tolerance=float("inf")), "tolerance"),
])
def test_config_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        TetrisConfig(**kwargs)


def test_batch_fn_argument_errors(model):
    seg, params = model
    with pytest.raises(ValueError, match="mode"):
        make_click_batch_fn(seg, params, mode="random")
    with pytest.raises(ValueError, match="unknown options"):
        make_click_batch_fn(seg, params, mode="min", n_steps=3)
    with pytest.raises(ValueError, match="n_clicks"):
        make_click_batch_fn(seg, params, mode="max", n_clicks=0)


_DISTANCE_MAP = jax.jit(lambda e, hw: location_distance_map(e, hw))


@settings(max_examples=25)
@given(st.integers(4, 20), st.integers(4, 24), st.integers(0, 2 ** 16),
       st.sampled_from(["random", "empty", "pixel", "full"]))
def test_location_distance_map_is_the_edt_to_the_region(height, width, seed, kind):
    rng = np.random.default_rng(seed)
    errors = rng.random((height, width)) < 0.15
    if kind == "empty":
        errors[:] = False
    elif kind == "pixel":
        errors[:] = False
        errors[rng.integers(height), rng.integers(width)] = True
    elif kind == "full":
        errors[:] = True
    framed = np.zeros((24, 24), bool)
    framed[:height, :width] = errors
    got = np.asarray(_DISTANCE_MAP(framed, np.int32([height, width])))[:height, :width]
    if errors.any():
        want = ndi.distance_transform_edt(~framed)[:height, :width]
    else:  # no region pixel: the image diagonal everywhere (OpenCV: ~1.8e19)
        want = np.full((height, width), math.hypot(height, width))
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_cuda_lowering_of_a_click_loops_over_no_rows(model):
    # The per-click work of TETRIS on a GPU: the clicks and Adam steps are scans, the clicker's
    # and the location loss's EDTs one column-offset loop each; no loop over the frame's rows.
    seg, params = model
    config = TetrisConfig(mode="min", n_clicks=CLICKS, n_opt_steps=STEPS)
    x, transform = seg.preprocess(INSTANCES[1].image, frame_hw=FRAME)
    features = jax.eval_shape(seg.embed, params, x)
    text = lowered_text(functools.partial(click_trajectory, seg, config=config), params, features, transform,
                        jax.ShapeDtypeStruct(FRAME, jnp.int8), jnp.int32(2), platform="cuda")
    loops = while_condition_constants(text)
    assert not any(bounds & {FRAME[0], FRAME[0] + 2} for bounds in loops)
    assert sum(bool(bounds & {FRAME[1], FRAME[1] + 2}) for bounds in loops) == 2  # the two EDT row passes
    assert len(loops) == 4  # the clicks, the Adam steps and the two EDT row passes: the bands have no loop


def test_location_error_region_sign_and_threshold():
    target = np.zeros((6, 6), bool)
    target[1:4, 1:4] = True
    probability = np.zeros((6, 6), np.float32)
    probability[2:5, 2:5] = 0.5  # not > 0.5
    probability[3:5, 3:5] = 0.9
    region = np.ones((6, 6), bool)
    fn = np.asarray(location_error_region(target, probability, True, region))
    fp = np.asarray(location_error_region(target, probability, False, region))
    prev = probability > 0.5
    np.testing.assert_array_equal(fn, target & ~prev)
    np.testing.assert_array_equal(fp, ~target & prev)


_LOCATION = jax.jit(jax.value_and_grad(location_loss))


_FULL_GRID = jax.jit(jax.value_and_grad(_full_grid_location_loss))  # compiles once per grid shape


@settings(max_examples=20)
@given(st.integers(6, 20), st.integers(6, 20), st.sampled_from([(23, 30), (9, 17)]),
       st.floats(-8.0, 38.0), st.floats(-8.0, 38.0), st.integers(0, 2 ** 16))
def test_windowed_location_loss_equals_the_full_grid(height, width, grid, x, y, seed):
    rows, cols = grid
    rng = np.random.default_rng(seed)
    errors = rng.random((height, width)) < 0.2
    errors[height // 2, width // 2] = True
    distance = ndi.distance_transform_edt(~errors)
    framed = np.zeros((24, 24), np.float32)  # a padded frame: garbage must not be read
    framed[:] = 1e3
    framed[:height, :width] = distance
    point = jnp.array([x, y], jnp.float32)
    value, grad = _LOCATION(point, framed, np.int32([height, width]), np.int32([rows, cols]))
    resized = _np_resize_align_corners(distance, (rows, cols))
    want, want_grad = _FULL_GRID(point, jnp.asarray(resized, jnp.float32))
    np.testing.assert_allclose(value, want, rtol=2e-5, atol=1e-7)
    np.testing.assert_allclose(grad, want_grad, rtol=2e-4, atol=2e-6)


# ---- the attack ----------------------------------------------------------------------------

def test_minmax_brackets_iterate_zero_and_replays_the_acceptance_rule(attacked):
    out = attacked[1]
    for mode, maximise in (("min", False), ("max", True)):
        part = out[mode]
        iterates = part["iterates"]
        assert iterates["loss"].shape == (3, CLICKS, STEPS)
        for slot in range(3):
            for click in range(CLICKS):
                sel = (part["selection_iou"][slot, click], part["selection_biou"][slot, click])
                start = (part["start_selection_iou"][slot, click], part["start_selection_biou"][slot, click])
                # per click, given the same history: MIN <= baseline click <= MAX (lexicographic)
                assert (sel >= start) if maximise else (sel <= start)
                logs = {name: iterates[name][slot, click] for name in iterates}
                flags, best_step = _lexicographic_replay(logs, maximise)
                np.testing.assert_array_equal(logs["accepted"], flags)
                assert part["best_step"][slot, click] == best_step
                assert part["n_accepted"][slot, click] == sum(flags)
                for name, log_name in (("iou", "iou"), ("biou", "biou"), ("location_loss", "location")):
                    np.testing.assert_array_equal(part[name][slot, click], logs[log_name][best_step])
                np.testing.assert_array_equal(part["clicks_xy"][slot, click], logs["click_xy"][best_step])
                # every accepted Lloc is within 5 % of the previously accepted one
                accepted = logs["location"][np.asarray(flags)]
                assert (accepted[1:] <= np.float32(1.05) * accepted[:-1]).all()
                if part["start_location_loss"][slot, click] == 0:
                    assert part["location_loss"][slot, click] == 0
            assert np.isfinite(iterates["loss"][slot]).all()
    # the clicks moved somewhere, and the modes share click 1's start
    assert (out["min"]["best_step"] > 0).any() and (out["max"]["best_step"] > 0).any()
    np.testing.assert_array_equal(out["min"]["baseline_clicks_xy"][:, 0], out["max"]["baseline_clicks_xy"][:, 0])
    np.testing.assert_array_equal(out["min"]["start_iou"][:, 0], out["max"]["start_iou"][:, 0])


def test_clicks_are_valid(attacked, model):
    seg = model[0]
    out = attacked[1]
    for slot, instance in enumerate(INSTANCES):
        height, width = instance.gt.shape
        target = instance.gt == 1
        first = _np_next_click(target, np.zeros_like(target), np.ones_like(target), instance.gt != -1)
        _, transform = seg.preprocess(instance.image)
        sx, sy = np.asarray(transform.scale_xy)
        for part in (out["min"], out["max"]):
            clicks = part["clicks_xy"][slot]  # (x, y)
            assert (clicks[:, 0] >= 0).all() and (clicks[:, 0] <= width - 1).all()
            assert (clicks[:, 1] >= 0).all() and (clicks[:, 1] <= height - 1).all()
            # click 1 starts at the deepest interior point of the GT, positive
            assert part["is_positive"][slot, 0] and first[0]
            np.testing.assert_array_equal(part["baseline_clicks_xy"][slot, 0], [first[2], first[1]])  # (x, y)
            iterates = part["iterates"]
            np.testing.assert_allclose(iterates["point_resized"][slot, 0, 0],
                                       [first[2] * sx, first[1] * sy], rtol=1e-6)
            # the reported click is the resized point mapped back and clipped
            q = iterates["point_resized"][slot]
            want = np.stack([np.clip(q[..., 0] / sx, 0, width - 1), np.clip(q[..., 1] / sy, 0, height - 1)], -1)
            np.testing.assert_allclose(iterates["click_xy"][slot], want, rtol=1e-5, atol=1e-4)
            np.testing.assert_allclose(part["learning_rate"][slot],
                                       LR_MULT * 5 * math.hypot(height, width) / (400 * 2 ** 0.5), rtol=1e-6)
            # mask input: reset while max(#pos, #neg) <= 1 (current click included)
            signs = part["is_positive"][slot]
            for click in range(CLICKS):
                positives = signs[:click + 1].sum()
                negatives = click + 1 - positives
                assert part["has_mask_input"][slot, click] == (click > 0 and max(positives, negatives) > 1)


def test_reported_metrics_of_the_final_mask(attacked):
    out = attacked[1]
    for part in (out["min"], out["max"]):
        for slot, instance in enumerate(INSTANCES):
            height, width = instance.gt.shape
            mask = part["mask"][slot]
            assert not mask[height:].any() and not mask[:, width:].any()
            mask = mask[:height, :width]
            gt = instance.gt
            d = boundary_width(height, width)
            np.testing.assert_allclose(part["iou"][slot, -1], mask_iou(gt == 1, mask, gt != -1), rtol=1e-6)
            np.testing.assert_allclose(part["biou"][slot, -1], boundary_iou(gt == 1, mask, gt != -1, width=d),
                                       rtol=1e-6)
            np.testing.assert_allclose(part["selection_iou"][slot, -1], np.nan_to_num(mask_iou(gt == 1, mask)),
                                       rtol=1e-6)
            curve = part["iou"][slot]
            np.testing.assert_allclose(part[f"auc_iou@{CLICKS}"][slot],
                                       (curve.sum() - 0.5 * (curve[0] + curve[-1])) / (CLICKS - 1), rtol=1e-6)


@pytest.fixture(scope="module")
def single(model, attacked):
    """The one-instance path: `click_trajectory` jitted unbatched, instance 1 padded into the frame."""
    seg, params = model
    config = TetrisConfig(mode="min", n_clicks=CLICKS, n_opt_steps=STEPS, lr_mult=LR_MULT,
                          record_trajectory=True, return_mask=True)
    instance = INSTANCES[1]
    x, transform = seg.preprocess(instance.image, frame_hw=FRAME)
    features = jax.jit(seg.embed)(params, x)
    program = jax.jit(functools.partial(click_trajectory, seg, config=config))
    result = program(params, features, transform, _framed(instance.gt), boundary_widths([instance.gt.shape])[0])
    return instance, features, transform, jax.device_get(result)


@pytest.mark.slow  # shares the `single` program (~20-50 s of compilation on 2 busy cores)
def test_batched_equals_one_instance(single, attacked):
    _, _, _, result = single
    out = attacked[1]["min"]
    np.testing.assert_allclose(result.iterates.point_resized, out["iterates"]["point_resized"][1], atol=1e-3)
    np.testing.assert_allclose(result.iterates.loss, out["iterates"]["loss"][1], atol=1e-5)
    np.testing.assert_allclose(result.clicks[:, ::-1], out["clicks_xy"][1], atol=1e-3)  # (row, col) -> (x, y)
    np.testing.assert_allclose(result.iou, out["iou"][1], atol=2e-3)
    np.testing.assert_array_equal(result.is_positive, out["is_positive"][1])


@pytest.mark.slow  # shares the `single` program; compiles the restated loss's gradient
def test_one_update_equals_the_spec(single, model):
    """Click 1, iterate 0 -> 1 of MIN restated from spec §3.2 (NumPy/SciPy + the model's decode)."""
    seg, params = model
    instance, features, transform, result = single
    height, width = instance.gt.shape
    target = instance.gt == 1
    positive, row, col = _np_next_click(target, np.zeros_like(target), np.ones_like(target), instance.gt != -1)
    assert positive
    sx, sy = (float(v) for v in np.asarray(transform.scale_xy))
    rows, cols = (int(v) for v in np.asarray(transform.resized_hw))
    q0 = jnp.array([col * sx, row * sy], jnp.float32)
    distance = ndi.distance_transform_edt(~target)  # click 1: FN = G+, distance to it
    resized = _np_resize_align_corners(distance, (rows, cols))
    unit = transform.replace(scale_xy=jnp.ones(2, jnp.float32))  # SAM gets raw resized-frame coordinates
    target_frame = jnp.asarray(_framed(instance.gt) == 1, jnp.float32)
    low = seg.config.low_res_size

    def loss_terms(q):
        prompts = make_prompts(points=np.zeros((1, 2)), num_slots=CLICKS, mask_shape=(low, low))
        prompts = prompts.replace(points=prompts.points.at[0].set(q))
        probability = jax.nn.sigmoid(seg.decode(params, features, prompts, unit).logits)
        inter = jnp.sum(probability * target_frame)
        dice = 1.0 - 2.0 * inter / jnp.maximum(jnp.sum(probability) + jnp.sum(target_frame), 1e-7)
        loc = _full_grid_location_loss(q, resized)
        return loc - dice / 1000.0, (dice, loc)  # MIN: s = -1

    (loss, (dice, loc)), grad = jax.jit(jax.value_and_grad(loss_terms, has_aux=True))(q0)
    lr = LR_MULT * 5 * math.hypot(height, width) / (400 * math.sqrt(2))
    g = np.asarray(grad, np.float64)
    q1 = np.asarray(q0) - lr * g / (np.abs(g) + 1e-8)  # Adam's first step (eps 1e-8 outside the root)
    # On this tiny model |dL/dq| is ~1e-9 (Dice / 1000), i.e. below Adam's eps, so the step
    # lr g / (|g| + eps) is sensitive to gradient rounding: allow a gradient error of
    # 1e-10 + 1e-3 |g| (float32 sums over the frame; the full-grid disk adds ~1e-11).
    slack = lr * 1e-8 * (1e-10 + 1e-3 * np.abs(g)) / (np.abs(g) + 1e-8) ** 2 + 1e-4 * lr
    iterates = result.iterates
    np.testing.assert_allclose(iterates.point_resized[0, 0], q0, rtol=1e-6)
    np.testing.assert_allclose(iterates.dice[0, 0], dice, rtol=1e-5)
    np.testing.assert_allclose(iterates.location[0, 0], loc, rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(iterates.loss[0, 0], loss, rtol=1e-4, atol=1e-7)
    assert (np.abs(iterates.point_resized[0, 1] - q1) <= slack).all(), (iterates.point_resized[0, 1], q1, slack)
    assert (np.abs(q1 - np.asarray(q0)) > 10 * slack).any()  # the check is not vacuous


def test_baseline_trajectory_equals_the_restated_loop(baseline, attacked, model):
    seg, params = model
    fn, out = baseline
    assert fn.traces == 1 and out["clicks_xy"].shape == (3, CLICKS, 2)
    embed = jax.jit(seg.embed)
    decode = jax.jit(seg.decode)  # one compile: every image is given in the bucket frame
    low = seg.config.low_res_size
    for slot, instance in enumerate(INSTANCES):
        target, valid = instance.gt == 1, instance.gt != -1
        height, width = target.shape
        x, transform = seg.preprocess(instance.image, frame_hw=FRAME)
        features = embed(params, x)
        pred = np.zeros_like(target)
        not_clicked = np.ones_like(target)
        low_res, points, labels, ious = None, [], [], []
        for click in range(CLICKS):
            positive, row, col = _np_next_click(target, pred, not_clicked, valid)
            not_clicked[row, col] = False
            points.append((col, row))
            labels.append(int(positive))
            has_mask = click > 0 and max(sum(labels), len(labels) - sum(labels)) > 1
            prompts = make_prompts(points, labels, mask_logits=low_res if has_mask else None, num_slots=CLICKS,
                                   mask_shape=(low, low))
            prediction = decode(params, features, prompts, transform)
            low_res = np.asarray(prediction.selected_low_res)
            pred = np.asarray(jax.nn.sigmoid(prediction.logits))[:height, :width] > 0.5
            ious.append(float(mask_iou(target, pred, valid)))
            np.testing.assert_array_equal(out["clicks_xy"][slot, click], [col, row])  # (x, y)
            assert out["is_positive"][slot, click] == positive
            assert out["has_mask_input"][slot, click] == has_mask
        np.testing.assert_allclose(out["iou"][slot], ious, atol=2e-3)
    # click 1 of the attacks starts from the baseline's click 1 with the same score,
    # so MIN <= baseline <= MAX there (same, empty history)
    for part, maximise in ((attacked[1]["min"], False), (attacked[1]["max"], True)):
        np.testing.assert_array_equal(part["baseline_clicks_xy"][:, 0], out["clicks_xy"][:, 0].astype(np.int32))
        np.testing.assert_allclose(part["start_selection_iou"][:, 0], out["selection_iou"][:, 0], atol=2e-3)
        if maximise:
            assert (part["selection_iou"][:, 0] >= out["selection_iou"][:, 0] - 2e-3).all()
        else:
            assert (part["selection_iou"][:, 0] <= out["selection_iou"][:, 0] + 2e-3).all()


def test_one_trace_per_bucket_engine_run_and_resume(attacked, tmp_path):
    fn = attacked[0]
    other = shard_batch(pad_batch(OTHER, FRAME, 3), data_mesh())  # other sizes, a ragged tail, same frame
    out = jax.device_get(fn(other))
    assert fn.traces == 1
    assert np.isfinite(out["max"]["clicks_xy"]).all()
    config = {"protocol": "tetris-minmax", "n_clicks": CLICKS}
    full = run(INSTANCES + OTHER, fn, tmp_path / "full", 3, config=config, frame_policy=FixedFrame(*FRAME),
               progress="none")
    assert full.ok == 5 and full.failed == 0
    # a run killed after its first batch (the second batch's lines never reached the disk),
    # then the same command again: it resumes and reproduces the uninterrupted records
    first = run(INSTANCES + OTHER, fn, tmp_path / "resumed", 3, config=config,
                frame_policy=FixedFrame(*FRAME), progress="none")
    records_path = tmp_path / "resumed" / "records.jsonl"
    lines = records_path.read_text().splitlines(keepends=True)
    records_path.write_text("".join(lines[:3]))
    resumed = run(INSTANCES + OTHER, fn, tmp_path / "resumed", 3, config=config,
                  frame_policy=FixedFrame(*FRAME), progress="none")
    assert first.ok == 5 and resumed.ok == 2 and resumed.skipped == 3
    assert fn.traces == 1  # the engine's placement matches the fixture's: no recompilation

    def records(name):
        lines = (tmp_path / name / "records.jsonl").read_text().splitlines()
        return {json.loads(line)["id"]: json.loads(line)["payload"] for line in lines}

    uninterrupted, resumed_records = records("full"), records("resumed")
    assert uninterrupted.keys() == resumed_records.keys() == {f"im{i}" for i in range(5)}
    for key, payload in uninterrupted.items():
        for mode in ("min", "max"):
            np.testing.assert_allclose(payload[mode]["clicks_xy"], resumed_records[key][mode]["clicks_xy"], atol=1e-4)
            np.testing.assert_allclose(payload[mode]["iou"], resumed_records[key][mode]["iou"], atol=1e-6)
            np.testing.assert_array_equal(payload[mode]["is_positive"], resumed_records[key][mode]["is_positive"])
    scores = tetris_scores(list(uninterrupted.values()), num_clicks=CLICKS)
    assert scores["instances"] == 5
    assert scores["iou_delta"] == pytest.approx(scores["iou_max"] - scores["iou_min"])


# ---- dataset scores -------------------------------------------------------------------------

def test_tetris_scores_by_hand():
    low = [{"iou": [0.2, 0.4, 0.6], "biou": [0.1, 0.2, 0.3]}, {"iou": [0.4, 0.4, 0.4], "biou": [0.3, 0.2, 0.1]}]
    high = [{"iou": [0.8, 0.9, 1.0], "biou": [0.5, 0.5, 0.5]}, {"iou": [0.6, 0.7, 0.8], "biou": [0.5, 0.6, 0.7]}]
    scores = tetris_scores(low, high, num_clicks=3)
    # mean curves: MIN (0.3, 0.4, 0.5) -> (0.15 + 0.4 + 0.25) / 2; MAX (0.7, 0.8, 0.9) -> 0.8
    assert scores["iou_min"] == pytest.approx(0.4, abs=1e-6)
    assert scores["iou_max"] == pytest.approx(0.8, abs=1e-6)
    assert scores["iou_delta"] == pytest.approx(0.4, abs=1e-6)
    assert scores["biou_min"] == pytest.approx(0.2, abs=1e-6)
    combined = tetris_scores([{"min": a, "max": b} for a, b in zip(low, high)], num_clicks=3)
    assert combined == pytest.approx(scores)
    one = trajectory_scores(high, num_clicks=3, noc_thresholds=(0.85,))
    assert one["auc_iou@3"] == pytest.approx(0.8, abs=1e-6) and "auc_iou" not in one
    assert one["noc@85"] == pytest.approx((2 + 3) / 2)
    assert one["nof@85"] == 1
    np.testing.assert_allclose(one["mean_iou"], [0.7, 0.8, 0.9], atol=1e-6)
    with pytest.raises(ValueError, match="min"):
        tetris_scores(low)
    with pytest.raises(ValueError, match="clicks"):
        tetris_scores(low, high, num_clicks=10)
