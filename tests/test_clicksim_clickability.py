"""Tests for jaxseg_robust.clicksim.clickability (RClicks spec §1.2, §2, §4)."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from jaxseg_robust.clicksim import clickability as C

cv2 = pytest.importorskip("cv2")
ndimage = pytest.importorskip("scipy.ndimage")

# Spec §2 golden toy: 60x80 frame, E = 1 on rows 10-49 / cols 20-69, five clicks, sigma 60.
TOY_SHAPE = (60, 80)
TOY_POINTS = np.array([(30, 20), (31, 20), (45, 30), (60, 40), (60, 12)], np.int32)


def toy_error_mask() -> np.ndarray:
    mask = np.zeros(TOY_SHAPE, np.float32)
    mask[10:50, 20:70] = 1.0
    return mask


def opencv_density(points, height, width, sigma_px) -> np.ndarray:
    """Reference statement: impulses + cv2.GaussianBlur (zero border) + max-normalisation."""
    impulses = np.zeros((height, width), np.float32)
    for x, y in points:
        impulses[y, x] += 255 * 2 * math.pi * sigma_px ** 2 / len(points)
    size = C.opencv_kernel_size(sigma_px)
    blurred = cv2.GaussianBlur(impulses, (size, size), sigmaX=sigma_px, sigmaY=sigma_px,
                               borderType=cv2.BORDER_CONSTANT)
    return blurred / blurred.max()


# ---- golden values -----------------------------------------------------------------------

def test_golden_toy_map_spec_section_2():
    sigma_px = C.scaled_sigma(60.0, *TOY_SHAPE)
    assert sigma_px == pytest.approx(2.7237, abs=1e-4)
    assert C.opencv_kernel_size(sigma_px) == 21
    density = np.asarray(C.click_density(TOY_POINTS, None, height=60, width=80, sigma=60.0))
    assert density.sum() == pytest.approx(120.427895, rel=2e-6)
    assert density[20, 30] == 1.0
    assert density[12, 60] == pytest.approx(0.516844, abs=1e-6)
    soft = np.asarray(C.soft_error_mask(toy_error_mask(), 2.0))
    assert soft[10, 20] == pytest.approx(0.359685, abs=1e-6)  # corner
    assert soft[10, 45] == pytest.approx(0.599737, abs=1e-6)  # edge
    assert soft[8, 45] == pytest.approx(0.224227, abs=1e-6)   # 2 px outside
    assert soft[30, 45] == pytest.approx(1.0, abs=1e-6)
    clickability = np.asarray(C.gt_clickability_map(TOY_POINTS, None, toy_error_mask(), sigma=60.0, soft_sigma=2))
    assert clickability.sum() == pytest.approx(114.689880, rel=2e-6)
    assert clickability[12, 60] == pytest.approx(0.463485, abs=1e-6)


@pytest.mark.parametrize("size, sigma_px, radius", [
    ((640, 480), 1.8158, 5), ((481, 321), 1.3125, 4), ((2048, 1365), 5.5863, 17),
    ((100, 100), None, 1), ((80, 60), None, 0)])
def test_sigma_and_soft_radius_examples(size, sigma_px, radius):
    width, height = size
    if sigma_px is not None:
        assert C.scaled_sigma(5.0, height, width) == pytest.approx(sigma_px, abs=1e-4)
    assert C.soft_mask_sigma(height, width) == radius
    # Paper variant (§8.2 #1): 1 % of the diagonal, not floored (640x480 -> 8.0).
    assert C.soft_mask_sigma(height, width, "paper") == pytest.approx(0.01 * math.hypot(width, height))


def test_kernel_size_rule_and_opencv_kernel():
    assert C.opencv_kernel_size(0.1) == 1 and C.opencv_kernel_size(1 / 7) == 1
    assert C.opencv_kernel_size(0.3) == 3  # ceil(2.1) = 3, odd
    assert C.opencv_kernel_size(1.0) == 7 and C.opencv_kernel_size(1.1) == 9  # ceil(7.7) = 8 -> 9
    for sigma in (0.05, 0.6, 1.8158, 2.7237, 13.0):
        size = C.opencv_kernel_size(sigma)
        expected = cv2.getGaussianKernel(size, sigma, cv2.CV_32F).ravel()
        np.testing.assert_allclose(C.opencv_gaussian_kernel(sigma), expected, rtol=1e-6, atol=1e-8)
    # sigma in pixels of a 1920x1080 screen: the reference frame itself is unscaled.
    assert C.scaled_sigma(5.0, 1080, 1920) == pytest.approx(5.0)
    assert C.scaled_sigma(5.0, 10, 10, "pixels") == 5.0


def test_bad_arguments_raise_value_errors():
    with pytest.raises(ValueError, match="sigma"):
        C.scaled_sigma(0.0, 10, 10)
    with pytest.raises(ValueError, match="sigma_units"):
        C.scaled_sigma(1.0, 10, 10, "inches")
    with pytest.raises(ValueError, match="soft_sigma"):
        C.soft_mask_sigma(10, 10, "wide")
    with pytest.raises(ValueError, match="soft_sigma"):
        C.soft_mask_sigma(10, 10, -1.0)
    with pytest.raises(ValueError, match="points_xy"):
        C.click_density(np.zeros((3,), np.int32), None, height=5, width=5)
    with pytest.raises(ValueError, match="valid"):
        C.click_density(np.zeros((3, 2), np.int32), np.ones(2, bool), height=5, width=5)
    with pytest.raises(ValueError, match="error_mask"):
        C.uniform_map(np.zeros((2, 3, 4)))
    with pytest.raises(ValueError, match="normalization"):
        C.gt_clickability_map(TOY_POINTS, None, toy_error_mask(), normalization="l2")
    with pytest.raises(ValueError, match="click_type"):
        C.click_type_code("second")
    with pytest.raises(ValueError, match="previous_mask"):
        C.error_mask(np.ones((3, 3)), None, "fn")


# ---- oracles: OpenCV blur, scipy gaussian_filter -----------------------------------------

SIZES = [(1, 1), (7, 9), (13, 5), (24, 31)]


@settings(max_examples=30)
@given(data=st.data(), size=st.sampled_from(SIZES),
       sigma=st.sampled_from([0.01, 1.0, 5.0, 60.0, 120.0]))
def test_click_density_matches_opencv(data, size, sigma):
    height, width = size
    count = data.draw(st.integers(1, 6))
    xs = data.draw(hnp.arrays(np.int32, 6, elements=st.integers(0, width - 1)))
    ys = data.draw(hnp.arrays(np.int32, 6, elements=st.integers(0, height - 1)))
    points = np.stack([xs, ys], axis=1)
    valid = np.arange(6) < count  # fixed slot count: one compilation per (size, sigma)
    ours = np.asarray(C.click_density(points, valid, height=height, width=width, sigma=sigma))
    expected = opencv_density(points[:count], height, width, C.scaled_sigma(sigma, height, width))
    np.testing.assert_allclose(ours, expected, atol=2e-6, rtol=1e-5)
    assert ours.max() == pytest.approx(1.0) and ours.min() >= 0.0


@settings(max_examples=30)
@given(data=st.data(), size=st.sampled_from(SIZES), sigma=st.sampled_from([0.0, 0.7, 1.0, 2.0, 3.0, 5.0]))
def test_soft_error_mask_matches_scipy(data, size, sigma):
    # Radii up to 20 on 1..31-pixel axes exercise repeated reflection.
    mask = data.draw(hnp.arrays(np.float32, size, elements=st.sampled_from([0.0, 0.25, 1.0])))
    ours = np.asarray(C.soft_error_mask(mask, sigma))
    np.testing.assert_allclose(ours, ndimage.gaussian_filter(mask.astype(np.float64), sigma=sigma),
                               atol=2e-6)


# ---- properties and variants --------------------------------------------------------------

def test_padding_slots_duplicates_and_order():
    points, valid = np.zeros((8, 2), np.int32), np.zeros(8, bool)
    points[:5], valid[:5] = TOY_POINTS, True
    points[5:] = (79, 59)  # garbage in padding slots must not matter
    plain = C.click_density(TOY_POINTS, None, height=60, width=80, sigma=5.0)
    padded = C.click_density(points, valid, height=60, width=80, sigma=5.0)
    shuffled = C.click_density(TOY_POINTS[::-1], None, height=60, width=80, sigma=5.0)
    np.testing.assert_allclose(padded, plain, atol=1e-7)
    np.testing.assert_allclose(shuffled, plain, atol=1e-7)
    # A duplicated click doubles its impulse: compare with OpenCV's accumulation.
    doubled = np.concatenate([TOY_POINTS, TOY_POINTS[:1]])
    np.testing.assert_allclose(C.click_density(doubled, None, height=60, width=80, sigma=30.0),
                               opencv_density(doubled, 60, 80, C.scaled_sigma(30.0, 60, 80)), atol=2e-6)
    # No valid click: zeros instead of 0 / 0.
    assert float(jnp.max(C.click_density(points, np.zeros(8, bool), height=60, width=80))) == 0.0
    # New points with the same slot count reuse the compilation.
    before = C.click_density._cache_size()
    C.click_density(points[::-1], valid[::-1], height=60, width=80, sigma=5.0)
    assert C.click_density._cache_size() == before
    # Points outside the frame are clipped onto it (as the CSV reader does).
    np.testing.assert_allclose(C.click_density(np.array([[200, -5]]), None, height=60, width=80),
                               C.click_density(np.array([[79, 0]]), None, height=60, width=80))


def test_map_variants():
    error = toy_error_mask()
    code = np.asarray(C.gt_clickability_map(TOY_POINTS, None, error))
    paper = np.asarray(C.gt_clickability_map(TOY_POINTS, None, error, normalization="paper"))
    assert paper.sum() == pytest.approx(1.0, rel=1e-5)
    np.testing.assert_allclose(paper, code / code.sum(), rtol=1e-5, atol=1e-9)
    assert code.min() >= 0 and code.max() <= 1.0
    # soft_sigma="paper" = explicit 1 % diagonal; soft_sigma=0 = hard mask.
    np.testing.assert_allclose(
        C.gt_clickability_map(TOY_POINTS, None, error, soft_sigma="paper"),
        C.gt_clickability_map(TOY_POINTS, None, error, soft_sigma=0.01 * math.hypot(60, 80)), atol=1e-7)
    hard = np.asarray(C.gt_clickability_map(TOY_POINTS, None, error, soft_sigma=0))
    np.testing.assert_allclose(hard, error * np.asarray(C.click_density(TOY_POINTS, None, height=60, width=80)))
    # sigma_units="pixels": sigma taken as image pixels.
    np.testing.assert_allclose(
        C.click_density(TOY_POINTS, None, height=60, width=80, sigma=2.0, sigma_units="pixels"),
        opencv_density(TOY_POINTS, 60, 80, 2.0), atol=2e-6)
    # An all-zero error mask gives an all-zero map in both normalisations.
    assert float(jnp.abs(C.gt_clickability_map(TOY_POINTS, None, np.zeros(TOY_SHAPE),
                                               normalization="paper")).max()) == 0.0


def test_error_masks_by_click_type_and_traced_code():
    gt = np.array([[1, 1, 0], [0, 1, 0]], np.float32)
    prev = np.array([[0.2, 1.0, 0.6], [0.0, 0.0, 1.0]], np.float32)
    np.testing.assert_allclose(C.error_mask(gt, None, "first"), gt)
    np.testing.assert_allclose(C.error_mask(gt, prev, "first"), gt)
    np.testing.assert_allclose(C.error_mask(gt, prev, "fn"), gt * (1 - prev))
    np.testing.assert_allclose(C.error_mask(gt, prev, "fp"), (1 - gt) * prev)
    codes = jnp.array([C.click_type_code(t) for t in C.CLICK_TYPES])
    batch = jax.jit(jax.vmap(C.error_mask, in_axes=(None, None, 0)))(gt, prev, codes)
    np.testing.assert_allclose(batch, np.stack([gt, gt * (1 - prev), (1 - gt) * prev]))
    assert C.error_mask(gt.astype(bool), prev, "fp").dtype == jnp.float32


def test_uniform_map():
    error = np.array([[0.0, 0.5], [0.25, 0.0]], np.float32)
    np.testing.assert_allclose(C.uniform_map(error), error / 0.5)
    assert float(jnp.max(C.uniform_map(np.zeros((3, 4))))) == 0.0


DT_SHAPE = (9, 12)
# Soft values straddle the uint8 cast threshold 1/255 of the reference.
soft_masks = hnp.arrays(np.float32, DT_SHAPE, elements=st.sampled_from([0.0, 0.003, 1 / 255, 0.004, 0.5, 1.0]))


def opencv_dt_map(mask: np.ndarray, pad_border: bool) -> np.ndarray:
    region = (mask * 255).astype(np.uint8)
    if pad_border:
        distance = cv2.distanceTransform(np.pad(region, 1), cv2.DIST_L2, 0)[1:-1, 1:-1]
    else:
        distance = cv2.distanceTransform(region, cv2.DIST_L2, 0)
    return distance / distance.max() if region.any() else np.zeros(mask.shape, np.float32)


@settings(max_examples=20)
@given(first=soft_masks, second=soft_masks)
# Degenerate masks: empty -> zeros; full -> OpenCV's constant (~1.8e19) -> all ones.
@example(first=np.zeros(DT_SHAPE, np.float32), second=np.ones(DT_SHAPE, np.float32))
def test_distance_transform_map_matches_opencv_under_vmap(first, second):
    ours = jax.vmap(C.distance_transform_map)(np.stack([first, second]))
    np.testing.assert_allclose(ours[0], opencv_dt_map(first, False), atol=1e-6)
    np.testing.assert_allclose(ours[1], opencv_dt_map(second, False), atol=1e-6)


@pytest.mark.slow
@settings(max_examples=20)
@given(mask=soft_masks)
def test_distance_transform_map_pad_border_matches_opencv(mask):
    np.testing.assert_allclose(C.distance_transform_map(mask, pad_border=True), opencv_dt_map(mask, True),
                               atol=1e-6)


def test_jit_vmap_over_tasks():
    points = np.stack([TOY_POINTS, TOY_POINTS[::-1] + 3, TOY_POINTS // 2])
    valid = np.array([[1, 1, 1, 1, 1], [1, 1, 0, 0, 1], [1, 0, 0, 0, 0]], bool)
    errors = np.stack([toy_error_mask(), 1 - toy_error_mask(), toy_error_mask()])
    batched = jax.jit(jax.vmap(lambda p, v, e: C.gt_clickability_map(p, v, e)))(points, valid, errors)
    for i in range(3):
        np.testing.assert_allclose(batched[i], C.gt_clickability_map(points[i], valid[i], errors[i]),
                                   atol=1e-6)
