"""Tests for jaxseg_robust.ops.boxes (tight boxes, IoU, CIoU, Gamma realism prior).

Oracles: numpy (tight box, IoU, a float64 re-statement of torchvision's CIoU
written below), scipy.stats.gamma, and — marked ``parity`` — torchvision and
torch.distributions themselves.

Tolerances: our ops run in float32, the numpy oracles in float64. Box
coordinates are drawn on a 1/4-pixel lattice in [-8, 40], so areas, unions
and intersections are exact in float32 and the remaining error comes from
the divisions and atan (relative ~1e-7, amplified at most ~10x by the sums):
rtol 1e-5, atol 1e-5.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats
from hypothesis import given, strategies as st
from hypothesis.extra import numpy as hnp

from jaxseg_robust.ops import boxes

K, THETA = boxes.GAMMA_K, boxes.GAMMA_THETA

# Module-level jitted entry points: compiled once per input shape, not per example.
tight_box_jit = jax.jit(boxes.tight_box)
ciou_jit = jax.jit(boxes.complete_box_iou_loss)
breps_ciou_jit = jax.jit(boxes.breps_ciou_loss)
box_iou_jit = jax.jit(boxes.box_iou, static_argnames="eps")
pairwise_box_iou_jit = jax.jit(boxes.pairwise_box_iou, static_argnames="eps")
ciou_grads_jit = jax.jit(jax.grad(lambda a, b: boxes.complete_box_iou_loss(a, b).sum(), argnums=(0, 1)))
ciou_grad_jit = jax.jit(jax.grad(boxes.complete_box_iou_loss))
breps_ciou_grad_jit = jax.jit(jax.grad(lambda a, b: boxes.breps_ciou_loss(a, b).sum()))
realism_of_box_grad_jit = jax.jit(jax.grad(
    lambda a, b: boxes.breps_realism_log_prob(boxes.breps_ciou_loss(a, b)).sum()))
breps_ciou_no_relu_jit = jax.jit(lambda a, b: boxes.breps_ciou_loss(a, b, relu_box=False))
gamma_jit = jax.jit(boxes.gamma_log_prob)
gamma_grad_jit = jax.jit(jax.grad(boxes.gamma_log_prob))
realism_jit = jax.jit(boxes.breps_realism_log_prob)
realism_grad_jit = jax.jit(jax.vmap(jax.grad(boxes.breps_realism_log_prob)))


# ----------------------------------------------------------------------------- oracles


def numpy_tight_box(mask):
    rows, cols = np.nonzero(np.asarray(mask) > 0)
    if rows.size == 0:
        return np.array([0, 0, 1, 1])
    return np.array([cols.min(), rows.min(), cols.max(), rows.max()])


def numpy_ciou_parts(b1, b2, eps=1e-7):
    """torchvision's CIoU pieces in float64: (1 - IoU + rho2/c2, v, alpha)."""
    b1 = np.asarray(b1, np.float64)
    b2 = np.asarray(b2, np.float64)
    x1, y1, x2, y2 = np.moveaxis(b1, -1, 0)
    x1g, y1g, x2g, y2g = np.moveaxis(b2, -1, 0)
    with np.errstate(all="ignore"):
        xk1, yk1 = np.maximum(x1, x1g), np.maximum(y1, y1g)
        xk2, yk2 = np.minimum(x2, x2g), np.minimum(y2, y2g)
        inter = np.where((yk2 > yk1) & (xk2 > xk1), (xk2 - xk1) * (yk2 - yk1), 0.0)
        union = (x2 - x1) * (y2 - y1) + (x2g - x1g) * (y2g - y1g) - inter
        iou = inter / (union + eps)
        c2 = (np.maximum(x2, x2g) - np.minimum(x1, x1g)) ** 2 + (np.maximum(y2, y2g) - np.minimum(y1, y1g)) ** 2 + eps
        rho2 = ((x2 + x1) / 2 - (x1g + x2g) / 2) ** 2 + ((y2 + y1) / 2 - (y1g + y2g) / 2) ** 2
        v = (4 / np.pi**2) * (np.arctan((x2g - x1g) / (y2g - y1g)) - np.arctan((x2 - x1) / (y2 - y1))) ** 2
        alpha = v / (1 - iou + v + eps)
        return 1 - iou + rho2 / c2, v, alpha


def numpy_ciou(b1, b2, eps=1e-7):
    """torchvision.ops.complete_box_iou_loss (reduction='none') restated in float64."""
    diou, v, alpha = numpy_ciou_parts(b1, b2, eps)
    with np.errstate(all="ignore"):
        return diou + alpha * v


def numpy_ciou_gradient(b1, b2, h=1e-4, one_sided=None):
    """Differences of CIoU w.r.t. b1 with alpha frozen at b1 (torch detaches it).

    Central differences, or with ``one_sided`` a per-coordinate sign vector
    (+1 forward, -1 backward) one-sided differences.
    """
    b1 = np.asarray(b1, np.float64)
    alpha0 = numpy_ciou_parts(b1, b2)[2]

    def frozen(b):
        diou, v, _ = numpy_ciou_parts(b, b2)
        return diou + alpha0 * v

    grad = []
    for i, e in enumerate(np.eye(4)):
        if one_sided is not None:
            step = one_sided[i] * h
            grad.append((frozen(b1 + step * e) - frozen(b1)) / step)
        else:
            grad.append((frozen(b1 + h * e) - frozen(b1 - h * e)) / (2 * h))
    return np.array(grad)


def numpy_box_iou(b1, b2, eps=0.0):
    b1, b2 = np.asarray(b1, np.float64), np.asarray(b2, np.float64)
    w = np.clip(np.minimum(b1[..., 2], b2[..., 2]) - np.maximum(b1[..., 0], b2[..., 0]), 0, None)
    h = np.clip(np.minimum(b1[..., 3], b2[..., 3]) - np.maximum(b1[..., 1], b2[..., 1]), 0, None)
    area = lambda b: (b[..., 2] - b[..., 0]) * (b[..., 3] - b[..., 1])
    with np.errstate(all="ignore"):
        return w * h / (area(b1) + area(b2) - w * h + eps)


# ----------------------------------------------------------------------------- strategies

coordinate = st.integers(-32, 160).map(lambda v: v / 4)  # 1/4-pixel lattice in [-8, 40]


@st.composite
def box_pairs(draw, n=6, ordered_only=False):
    """n box pairs incl. identical, zero-width/-height, 0x0 and unordered boxes."""
    def one_box():
        kind = draw(st.sampled_from(["ordered", "ordered", "zero_w", "zero_h", "point", "unordered"]
                                    if not ordered_only else ["ordered", "zero_w", "zero_h"]))
        x1, y1 = draw(coordinate), draw(coordinate)
        w, h = draw(st.integers(1, 80)) / 4, draw(st.integers(1, 80)) / 4
        if kind == "zero_w":
            w = 0.0
        elif kind == "zero_h":
            h = 0.0
        elif kind == "point":
            w = h = 0.0
        elif kind == "unordered":
            w, h = (w if draw(st.booleans()) else -w), -h
        return [x1, y1, x1 + w, y1 + h]

    first = [one_box() for _ in range(n)]
    second = [list(b) if draw(st.integers(0, 4)) == 0 else one_box() for b in first]  # some identical pairs
    return np.array(first, np.float32), np.array(second, np.float32)


@st.composite
def masks(draw):
    """Random masks: empty, full, one-pixel, thin, multi-component, random, odd/non-square sizes."""
    rows, cols = draw(st.sampled_from([(1, 1), (1, 7), (6, 1), (5, 9), (12, 7), (16, 16)]))
    kind = draw(st.sampled_from(["empty", "full", "one_pixel", "thin_row", "thin_col", "rects", "random"]))
    mask = np.zeros((rows, cols), bool)
    if kind == "full":
        mask[:] = True
    elif kind == "one_pixel":
        mask[draw(st.integers(0, rows - 1)), draw(st.integers(0, cols - 1))] = True
    elif kind == "thin_row":
        r = draw(st.integers(0, rows - 1))
        c0 = draw(st.integers(0, cols - 1))
        mask[r, c0:draw(st.integers(c0 + 1, cols))] = True
    elif kind == "thin_col":
        c = draw(st.integers(0, cols - 1))
        r0 = draw(st.integers(0, rows - 1))
        mask[r0:draw(st.integers(r0 + 1, rows)), c] = True
    elif kind == "rects":
        for _ in range(draw(st.integers(1, 3))):
            r0, c0 = draw(st.integers(0, rows - 1)), draw(st.integers(0, cols - 1))
            mask[r0:r0 + draw(st.integers(1, 4)), c0:c0 + draw(st.integers(1, 4))] = True
    elif kind == "random":
        mask = draw(hnp.arrays(bool, (rows, cols)))
    return mask


# ----------------------------------------------------------------------------- tight box


@given(mask=masks())
def test_tight_box_matches_numpy(mask):
    expected = numpy_tight_box(mask)
    got = tight_box_jit(mask)
    assert got.dtype == jnp.int32
    np.testing.assert_array_equal(np.asarray(got), expected)
    # a {-1,0,1} GT: ignore pixels (-1) are excluded
    gt = np.where(mask, 1, -1).astype(np.int32)
    np.testing.assert_array_equal(np.asarray(tight_box_jit(gt)), expected)


def test_tight_box_special_cases():
    mask = np.zeros((5, 8), bool)
    mask[1:3, 2] = True
    # numeric encodings: {0,1} ints and interpolated floats (box of the non-zero support)
    np.testing.assert_array_equal(np.asarray(boxes.tight_box(mask.astype(np.uint8))), [2, 1, 2, 2])
    np.testing.assert_array_equal(np.asarray(boxes.tight_box(mask * np.float32(0.01))), [2, 1, 2, 2])
    mask[:] = False
    np.testing.assert_array_equal(np.asarray(boxes.tight_box(mask)), [0, 0, 1, 1])  # empty
    mask[3, 6] = True
    np.testing.assert_array_equal(np.asarray(boxes.tight_box(mask)), [6, 3, 6, 3])  # inclusive, 0x0 box
    np.testing.assert_array_equal(np.asarray(boxes.tight_box(np.ones((5, 8)))), [0, 0, 7, 4])  # full


def test_tight_box_batched_and_vmapped():
    rng = np.random.default_rng(0)
    batch = rng.random((4, 3, 9, 11)) < 0.05
    batch[0, 0] = False
    expected = np.array([[numpy_tight_box(m) for m in row] for row in batch])
    np.testing.assert_array_equal(np.asarray(tight_box_jit(batch)), expected)
    np.testing.assert_array_equal(np.asarray(jax.jit(jax.vmap(jax.vmap(boxes.tight_box)))(batch)), expected)


def test_tight_box_rejects_bad_rank():
    with pytest.raises(ValueError, match="mask"):
        boxes.tight_box(np.ones(5))


# ----------------------------------------------------------------------------- area / IoU


@given(pairs=box_pairs(n=8), eps=st.sampled_from([0.0, 1e-6, 1e-7]))
def test_box_iou_matches_numpy(pairs, eps):
    b1, b2 = pairs
    got = np.asarray(box_iou_jit(b1, b2, eps=eps))
    np.testing.assert_allclose(got, numpy_box_iou(b1, b2, eps), rtol=1e-5, atol=1e-5, equal_nan=True)
    pairwise = np.asarray(pairwise_box_iou_jit(b1, b2, eps=eps))
    assert pairwise.shape == (8, 8)
    np.testing.assert_allclose(np.diagonal(pairwise), got, rtol=1e-6, equal_nan=True)
    np.testing.assert_allclose(pairwise, numpy_box_iou(b1[:, None], b2[None], eps), rtol=1e-5, atol=1e-5,
                               equal_nan=True)


def test_box_iou_degenerate_and_gradients():
    points = jnp.array([[3.0, 3.0, 3.0, 3.0]])
    assert np.isnan(np.asarray(boxes.box_iou(points, points))).all()  # torchvision: 0/0
    assert float(boxes.box_iou(points, points, eps=1e-6)[0]) == 0.0
    grad = jax.grad(lambda b: boxes.box_iou(b, points).sum())(points)
    assert np.isfinite(np.asarray(grad)).all()
    np.testing.assert_allclose(np.asarray(boxes.box_area(jnp.array([[1, 2, 4, 8], [4, 2, 1, 8]]))), [18, -18])


# ----------------------------------------------------------------------------- CIoU


@given(pairs=box_pairs(n=8))
def test_ciou_matches_numpy_restatement(pairs):
    b1, b2 = pairs
    got = np.asarray(ciou_jit(b1, b2))
    np.testing.assert_allclose(got, numpy_ciou(b1, b2), rtol=1e-5, atol=1e-5, equal_nan=True)
    np.testing.assert_allclose(np.asarray(breps_ciou_jit(b1, b2)),
                               np.nan_to_num(numpy_ciou(np.maximum(b1, 0), b2), nan=0.0,
                                             posinf=np.finfo(np.float32).max, neginf=-np.finfo(np.float32).max),
                               rtol=1e-5, atol=1e-5)


@given(pairs=box_pairs(n=8))
def test_ciou_gradients_are_finite_everywhere(pairs):
    b1, b2 = pairs
    g1, g2 = ciou_grads_jit(b1, b2)
    assert np.isfinite(np.asarray(g1)).all() and np.isfinite(np.asarray(g2)).all()
    g = realism_of_box_grad_jit(b1, b2)
    assert np.isfinite(np.asarray(g)).all()


def test_ciou_gradient_matches_central_differences():
    # Smooth region (ordered, overlapping, distinct boxes); float64 oracle with
    # h = 1e-4 (truncation ~1e-8); float32 autodiff: rtol 1e-3.
    rng = np.random.default_rng(0)
    for _ in range(10):
        b2 = np.concatenate([rng.uniform(0, 20, 2), rng.uniform(25, 45, 2)])
        b1 = b2 + rng.uniform(-6, 6, 4)
        grad = ciou_grad_jit(jnp.asarray(b1, jnp.float32), jnp.asarray(b2, jnp.float32))
        np.testing.assert_allclose(np.asarray(grad), numpy_ciou_gradient(b1, b2), rtol=1e-3, atol=1e-6)


def test_ciou_singular_points():
    tight = jnp.array([10.0, 20.0, 50.0, 60.0])
    # identical boxes: X = 0 exactly in float32, zero gradient (ties split evenly)
    assert float(breps_ciou_jit(tight, tight)) == 0.0
    np.testing.assert_array_equal(np.asarray(breps_ciou_grad_jit(tight, tight)), 0.0)
    # 0x0 GT box (one-pixel mask): torchvision NaN -> 0, zero gradient
    point = jnp.array([7.0, 7.0, 7.0, 7.0])
    assert np.isnan(float(ciou_jit(tight, point)))
    assert float(breps_ciou_jit(tight, point)) == 0.0
    np.testing.assert_array_equal(np.asarray(breps_ciou_grad_jit(tight, point)), 0.0)
    # zero-height optimised box away from the GT: atan(w/0) = pi/2, gradient
    # = the one-sided limit h -> 0+ (torch: NaN)
    flat = jnp.array([60.0, 5.0, 70.0, 5.0])
    grad = np.asarray(ciou_grad_jit(flat, tight))
    assert np.isfinite(grad).all()
    # limit from the side where the height is positive: y1 backward, the rest forward
    one_sided = numpy_ciou_gradient(flat, tight, h=1e-6, one_sided=[1, -1, 1, 1])
    np.testing.assert_allclose(grad, one_sided, rtol=1e-3, atol=1e-6)


def test_ciou_eps_is_used_in_union_diagonal_and_alpha():
    b1 = np.array([[1.0, 1.0, 3.0, 2.0]], np.float32)
    b2 = np.array([[1.5, 0.5, 2.5, 4.0]], np.float32)
    for eps in (1e-7, 1e-3, 0.5):
        np.testing.assert_allclose(np.asarray(boxes.complete_box_iou_loss(b1, b2, eps=eps)),
                                   numpy_ciou(b1, b2, eps), rtol=1e-5)


def test_breps_ciou_relu_flag():
    box = jnp.array([-5.0, -3.0, 10.0, 12.0])
    tight = jnp.array([0.0, 0.0, 10.0, 12.0])
    assert float(breps_ciou_jit(box, tight)) == 0.0  # relu maps box onto tight
    assert float(breps_ciou_no_relu_jit(box, tight)) > 0.0
    grad = np.asarray(breps_ciou_grad_jit(box, tight + 1.0))
    assert grad[0] == 0.0 and grad[1] == 0.0  # clamped coordinates get no gradient


def test_ciou_under_vmap_and_shapes():
    rng = np.random.default_rng(3)
    b1 = rng.uniform(0, 10, (3, 5, 4)).astype(np.float32)
    b2 = rng.uniform(0, 10, (3, 5, 4)).astype(np.float32)
    vmapped = jax.jit(jax.vmap(jax.vmap(boxes.complete_box_iou_loss)))(b1, b2)
    np.testing.assert_allclose(np.asarray(vmapped), np.asarray(boxes.complete_box_iou_loss(b1, b2)), rtol=1e-6,
                               equal_nan=True)
    assert boxes.complete_box_iou_loss(b1[0, 0], b2[0, 0]).shape == ()
    with pytest.raises(ValueError, match="boxes1"):
        boxes.complete_box_iou_loss(np.zeros((3, 3)), np.zeros((3, 4)))


# ----------------------------------------------------------------------------- Gamma prior


def test_gamma_log_prob_matches_scipy():
    # float32 vs float64: the terms are O(1..100); rtol 1e-5 + atol 2e-5.
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.uniform(1e-4, 0.01, 50), rng.uniform(0.01, 3, 200), [0.0955, 0.2166, 7.5]])
    np.testing.assert_allclose(np.asarray(boxes.gamma_log_prob(x.astype(np.float32))),
                               scipy.stats.gamma.logpdf(x, K, scale=THETA), rtol=1e-5, atol=2e-5)
    for k, theta in [(0.7, 2.0), (1.0, 0.5), (3.3, 0.05)]:
        xs = rng.uniform(1e-3, 2, 100)
        np.testing.assert_allclose(np.asarray(boxes.gamma_log_prob(xs.astype(np.float32), k, theta)),
                                   scipy.stats.gamma.logpdf(xs, k, scale=theta), rtol=1e-5, atol=2e-5)


def test_gamma_golden_numbers_from_the_spec():
    # Constant part k ln(1/theta) - lnGamma(k) = 3.8521 (= log p(1) + 1/theta).
    assert float(boxes.gamma_log_prob(1.0)) + 1 / THETA == pytest.approx(3.8521, abs=1e-4)
    # Mode X = (k - 1) theta = 0.0955 with log p = 1.2097; the density's gradient vanishes there.
    grid = np.linspace(0.05, 0.15, 20001, dtype=np.float32)
    mode = float(grid[np.argmax(np.asarray(gamma_jit(grid)))])
    assert mode == pytest.approx(0.0955, abs=1e-4)
    assert float(gamma_jit(np.float32((K - 1) * THETA))) == pytest.approx(1.2097, abs=1e-4)
    assert abs(float(gamma_grad_jit(np.float32((K - 1) * THETA)))) < 1e-3
    # Mean k theta = 0.2166 (numerical integral of x p(x)).
    xs = np.linspace(1e-6, 5.0, 400001)
    density = np.exp(np.asarray(gamma_jit(xs.astype(np.float32)), np.float64))
    assert np.trapezoid(density, xs) == pytest.approx(1.0, abs=1e-3)
    assert np.trapezoid(xs * density, xs) == pytest.approx(0.2166, abs=1e-3)


def test_gamma_log_prob_edges_follow_torch():
    assert float(boxes.gamma_log_prob(0.0)) == -math.inf
    assert math.isnan(float(boxes.gamma_log_prob(-0.1)))
    assert boxes.gamma_log_prob(jnp.array([1, 2])).dtype == jnp.float32


def test_realism_term_skip_rule_and_gradients():
    x = jnp.array([0.0, 1e-6, 0.0955, 0.5, -0.2])
    value = np.asarray(realism_jit(x))
    assert value[0] == 0.0 and value[4] == 0.0
    np.testing.assert_allclose(value[1:4], np.asarray(gamma_jit(x[1:4])), rtol=1e-6)
    grad = np.asarray(realism_grad_jit(x))
    assert np.isfinite(grad).all()
    assert grad[0] == 0.0 and grad[4] == 0.0
    # (k-1)/x - 1/theta cancels at the mode (terms ~8.3): atol = a few f32 ulps of the terms.
    np.testing.assert_allclose(grad[1:4], (K - 1) / np.asarray(x[1:4]) - 1 / THETA, rtol=1e-5, atol=1e-5)


def test_breps_objective_gradient_is_finite_at_singular_points():
    lam = 0.1

    def realism_loss(box, tight):
        return -lam * boxes.breps_realism_log_prob(boxes.breps_ciou_loss(box, tight))

    grad_fn = jax.jit(jax.grad(realism_loss))
    tight = jnp.array([10.0, 20.0, 50.0, 60.0])
    cases = [
        (tight, tight),                                       # iterate 0: X == 0
        (tight + 0.25, tight),                                # X small, large gradient
        (jnp.array([5.0, 5.0, 5.0, 9.0]), tight),             # zero-width box
        (jnp.array([5.0, 5.0, 9.0, 5.0]), tight),             # zero-height box
        (jnp.array([5.0, 5.0, 5.0, 5.0]), tight),             # 0x0 box
        (tight, jnp.array([3.0, 3.0, 3.0, 3.0])),             # one-pixel GT
        (tight, jnp.array([3.0, 3.0, 30.0, 3.0])),            # one-row GT
        (jnp.array([50.0, 60.0, 10.0, 20.0]), tight),         # unordered box
        (jnp.array([-4.0, -4.0, -1.0, -1.0]), tight),         # relu collapses the box to a point
    ]
    for box, gt in cases:
        grad = np.asarray(grad_fn(box, gt))
        assert np.isfinite(grad).all(), (box, gt, grad)
    assert np.all(np.asarray(grad_fn(tight, tight)) == 0.0)


# ----------------------------------------------------------------------------- frames, clip, order


@given(pairs=box_pairs(n=5), sx=st.floats(0.1, 4.0), sy=st.floats(0.1, 4.0))
def test_scale_and_unscale_boxes(pairs, sx, sy):
    b, _ = pairs
    scaled = np.asarray(boxes.scale_boxes(b, sx, sy))
    np.testing.assert_allclose(scaled, b * np.float32([sx, sy, sx, sy]), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(boxes.unscale_boxes(scaled, sx, sy)), b, rtol=1e-5, atol=1e-5)


def test_scale_boxes_per_box_factors_and_ints():
    b = np.array([[0, 0, 10, 20], [2, 4, 6, 8]])
    got = boxes.scale_boxes(b, jnp.array([1.0, 2.0]), jnp.array([0.5, 3.0]))
    np.testing.assert_allclose(np.asarray(got), [[0, 0, 10, 10], [4, 12, 12, 24]])
    assert got.dtype == jnp.float32


@given(pairs=box_pairs(n=6), width=st.integers(1, 50), height=st.integers(1, 50))
def test_clip_and_order_properties(pairs, width, height):
    b, _ = pairs
    out = np.asarray(boxes.clip_and_order_boxes(b, width, height))
    assert np.all(out[:, 0] <= out[:, 2]) and np.all(out[:, 1] <= out[:, 3])
    assert np.all((out[:, 0::2] >= 0) & (out[:, 0::2] <= width - 1))
    assert np.all((out[:, 1::2] >= 0) & (out[:, 1::2] <= height - 1))
    np.testing.assert_array_equal(np.asarray(boxes.clip_and_order_boxes(out, width, height)), out)  # idempotent
    swapped = b[:, [2, 3, 0, 1]]  # corner order does not matter
    np.testing.assert_array_equal(np.asarray(boxes.clip_and_order_boxes(swapped, width, height)), out)
    ordered = np.asarray(boxes.order_box_corners(b))
    np.testing.assert_array_equal(ordered[:, :2], np.minimum(b[:, :2], b[:, 2:]))


def test_clip_boxes_ranges_and_gradients():
    box = jnp.array([-2.0, 0.5, 30.0, 1.0])
    out = boxes.clip_boxes(box, (1.0, 20.0), (1.0, 10.0))
    np.testing.assert_array_equal(np.asarray(out), [1.0, 1.0, 20.0, 1.0])
    jac = np.asarray(jax.jacfwd(lambda b: boxes.clip_boxes(b, (1.0, 20.0), (1.0, 10.0)))(box))
    np.testing.assert_array_equal(np.diagonal(jac), [0.0, 0.0, 0.0, 1.0])  # y2 == bound passes (torch.clamp)
    traced = jax.jit(boxes.clip_and_order_boxes)(box, jnp.int32(8), jnp.int32(6))
    np.testing.assert_array_equal(np.asarray(traced), [0.0, 0.5, 7.0, 1.0])


# ----------------------------------------------------------------------------- parity (torch)


@pytest.mark.parity
@given(pairs=box_pairs(n=8))
def test_ciou_parity_with_torchvision_values_and_gradients(pairs):
    torch = pytest.importorskip("torch")
    torchvision = pytest.importorskip("torchvision")
    b1, b2 = pairs
    expected = torchvision.ops.complete_box_iou_loss(torch.tensor(b1), torch.tensor(b2), reduction="none").numpy()
    np.testing.assert_allclose(np.asarray(ciou_jit(b1, b2)), expected, rtol=1e-5, atol=1e-5, equal_nan=True)

    # BREPS form: nan_to_num(CIoU(relu(b), tight)); gradients w.r.t. the box.
    tb = torch.tensor(b1, requires_grad=True)
    loss = torch.nan_to_num(torchvision.ops.complete_box_iou_loss(torch.relu(tb), torch.tensor(b2)))
    loss.sum().backward()
    torch_grad = tb.grad.numpy()
    ours_value = np.asarray(breps_ciou_jit(b1, b2))
    ours_grad = np.asarray(breps_ciou_grad_jit(b1, b2))
    np.testing.assert_allclose(ours_value, loss.detach().numpy(), rtol=1e-5, atol=1e-5)
    assert np.isfinite(ours_grad).all()
    finite_rows = np.isfinite(torch_grad).all(axis=1)
    np.testing.assert_allclose(ours_grad[finite_rows], torch_grad[finite_rows], rtol=1e-4, atol=1e-5)


@pytest.mark.parity
def test_ciou_parity_at_identical_boxes_and_ties():
    torch = pytest.importorskip("torch")
    torchvision = pytest.importorskip("torchvision")
    b1 = np.array([[10, 20, 50, 60], [10, 20, 50, 60], [10, 20, 40, 60], [0, 0, 8, 8]], np.float32)
    b2 = np.array([[10, 20, 50, 60], [10, 25, 50, 55], [10, 20, 50, 60], [0, 0, 8, 8]], np.float32)
    tb = torch.tensor(b1, requires_grad=True)
    torchvision.ops.complete_box_iou_loss(tb, torch.tensor(b2)).sum().backward()
    ours = jax.grad(lambda b: boxes.complete_box_iou_loss(b, b2).sum())(b1)
    np.testing.assert_allclose(np.asarray(ours), tb.grad.numpy(), rtol=1e-5, atol=1e-7)


@pytest.mark.parity
def test_gamma_log_prob_parity_with_torch():
    torch = pytest.importorskip("torch")
    x = np.array([0.0, 1e-4, 0.01, 0.0955, 0.2166, 1.0, 10.0], np.float32)
    expected = torch.distributions.Gamma(concentration=K, rate=1 / THETA).log_prob(torch.tensor(x)).numpy()
    np.testing.assert_allclose(np.asarray(boxes.gamma_log_prob(x)), expected, rtol=1e-6, atol=1e-6)
    xt = torch.tensor(x[1:], requires_grad=True)
    torch.distributions.Gamma(concentration=K, rate=1 / THETA).log_prob(xt).sum().backward()
    # (k-1)/x - 1/theta cancels near the mode (terms ~8.3): atol = a few f32 ulps of the terms.
    np.testing.assert_allclose(np.asarray(jax.grad(lambda v: boxes.gamma_log_prob(v).sum())(x[1:])),
                               xt.grad.numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("lanes", [1, 3, 8, 16, 64])
def test_ciou_of_a_box_with_itself_is_exactly_zero_in_every_program_width(lanes):
    """X(tight, tight) == 0 whatever the vmap width: the BREPS realism term must stay off at iterate 0.

    Before the fix, XLA's fused multiply-adds and lane-dependent atan gave ~2e-23 for some of these
    boxes (the tight boxes of four GrabCut images in SAM's frame) at 16 lanes and 0 at 1 lane.
    """
    tight = np.array([[15.434511, 13.317757, 224.59875, 159.81308], [45.239086, 48.476635, 251.20998, 170.46729],
                      [8.515593, 31.429905, 185.21414, 149.69157], [26.102802, 6.3866944, 144.89719, 255.46777]],
                     np.float32)
    rng = np.random.default_rng(lanes)
    random = rng.uniform(0, 500, (lanes, 4)).astype(np.float32)
    random[:, 2:] += random[:, :2] + rng.uniform(2, 50, (lanes, 2)).astype(np.float32)
    batch = np.concatenate([np.resize(tight, (lanes, 4)), random])
    loss = jax.jit(jax.vmap(boxes.breps_ciou_loss))(batch, batch)
    np.testing.assert_array_equal(np.asarray(loss), 0.0)
    realism_grad = jax.jit(jax.vmap(jax.grad(
        lambda b, t: boxes.breps_realism_log_prob(boxes.breps_ciou_loss(b, t)))))(batch, batch)
    np.testing.assert_array_equal(np.asarray(realism_grad), 0.0)


def test_self_iou_rounding_rule_matches_float32_addition():
    """`_adding_leaves_unchanged` equals fl(a + eps) == a, evaluated in NumPy (no fused multiply-add)."""
    rng = np.random.default_rng(0)
    values = np.concatenate([rng.uniform(0, 4, 20000), rng.uniform(0, 1e6, 20000),
                             [1.0, 2.0, 2.0 - 2 ** -23, 4.0, 0.5, 1e-8, 0.0]]).astype(np.float32)
    for eps in (1e-7, 2 ** -24, 2 ** -22, 0.5):
        expected = (values + np.float32(eps) == values) & (values > 0)
        got = np.asarray(jax.jit(lambda v: boxes._adding_leaves_unchanged(v, eps))(values))
        np.testing.assert_array_equal(got, expected, err_msg=f"eps={eps}")
