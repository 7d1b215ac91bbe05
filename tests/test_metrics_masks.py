"""Tests for jaxseg_robust.metrics.masks: spec golden values (boundary-iou.md §6) and
equivalence to an OpenCV re-statement of the official Boundary IoU pipeline."""

from __future__ import annotations

import functools
import math

import cv2
import jax
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from jaxseg_robust.data.masks_io import read_gt_mask
from jaxseg_robust.metrics import masks as M
from lowered_loops import while_loops

# ---- OpenCV / NumPy re-statement of the official API (test-only oracle) -----------------


def cv2_mask_to_boundary(mask: np.ndarray, d: int) -> np.ndarray:
    """Official ``mask_to_boundary``: 1-px zero pad, erode 3x3 ``d`` times, crop, subtract."""
    mask = mask.astype(np.uint8)
    padded = cv2.copyMakeBorder(mask, 1, 1, 1, 1, cv2.BORDER_CONSTANT, value=0)
    eroded = cv2.erode(padded, np.ones((3, 3), np.uint8), iterations=d)[1:-1, 1:-1]
    return mask - eroded


def cv2_width(height: int, width: int, ratio: float = 0.02) -> int:
    return max(int(round(ratio * np.sqrt(height**2 + width**2))), 1)


def _ratio(num, den, empty=math.nan):
    return num / den if den else empty


def reference_scores(gt_labels: np.ndarray, pred: np.ndarray, d: int) -> dict:
    """RITM-wrapper BIoU / IoU (spec §5) plus the trimap / F project convention (spec §3)."""
    valid = gt_labels != -1
    gt = gt_labels == 1
    boundary_gt, boundary_pred = cv2_mask_to_boundary(gt, d) > 0, cv2_mask_to_boundary(pred, d) > 0
    kernel = np.ones((2 * d + 1, 2 * d + 1), np.uint8)
    contour_gt, contour_pred = cv2_mask_to_boundary(gt, 1), cv2_mask_to_boundary(pred, 1)
    band_gt = cv2.dilate(contour_gt, kernel, borderType=cv2.BORDER_CONSTANT, borderValue=0) > 0
    band_pred = cv2.dilate(contour_pred, kernel, borderType=cv2.BORDER_CONSTANT, borderValue=0) > 0
    contour_gt, contour_pred = contour_gt > 0, (contour_pred > 0) & valid
    iou = _ratio((gt & pred & valid).sum(), ((gt | pred) & valid).sum())
    biou = _ratio((boundary_gt & boundary_pred & valid).sum(), ((boundary_gt | boundary_pred) & valid).sum())
    precision = _ratio((contour_pred & band_gt).sum(), contour_pred.sum(), 1.0)
    recall = _ratio((contour_gt & band_pred).sum(), contour_gt.sum(), 1.0)
    return {
        "iou": iou,
        "boundary_iou": biou,
        "min_iou_boundary_iou": min(iou, biou) if not (math.isnan(iou) or math.isnan(biou)) else math.nan,
        "trimap_iou": _ratio((band_gt & gt & pred & valid).sum(), (band_gt & (gt | pred) & valid).sum()),
        "f_measure": 2 * precision * recall / (precision + recall) if precision + recall else 0.0,
        "precision": precision,
        "recall": recall,
    }


def assert_scores_match(actual, expected, message=""):
    for key, value in expected.items():
        got = float(actual[key])
        if math.isnan(value):
            assert math.isnan(got), f"{key}: expected NaN, got {got} {message}"
        else:
            assert got == pytest.approx(value, abs=1e-6), f"{key} {message}"


# ---- masks -----------------------------------------------------------------------------------

def square(size, top, left, side, height=None):
    mask = np.zeros((height or size, size), bool)
    mask[top: top + side, left: left + side] = True
    return mask


A = square(20, 5, 5, 10)  # E1 square
S = square(20, 5, 6, 10)  # shifted right by 1
BIG = square(20, 4, 4, 12)  # A dilated by 1
S3 = square(20, 5, 8, 10)  # shifted right by 3

BATCH, HEIGHT, WIDTH = 4, 37, 70
WIDTHS = (1, 5)  # each width compiles mask_scores once


@st.composite
def masks(draw, height=HEIGHT, width=WIDTH):
    kind = draw(st.sampled_from(["random", "empty", "full", "pixel", "line", "blobs"]))
    mask = np.zeros((height, width), bool)
    if kind == "random":
        rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
        mask = rng.random((height, width)) < draw(st.sampled_from([0.2, 0.6, 0.95]))
    elif kind == "full":
        mask[:] = True
    elif kind == "pixel":
        mask[draw(st.integers(0, height - 1)), draw(st.integers(0, width - 1))] = True
    elif kind == "line":
        mask[draw(st.integers(0, height - 1)), draw(st.integers(0, width - 1)):] = True
    elif kind == "blobs":
        for _ in range(draw(st.integers(1, 3))):
            y0, x0 = draw(st.integers(0, height - 1)), draw(st.integers(0, width - 1))
            mask[y0: y0 + draw(st.integers(1, 25)), x0: x0 + draw(st.integers(1, 40))] = True
    return mask


@st.composite
def labelled_pairs(draw, batch=BATCH):
    """(gt_labels int8[B, H, W] in {-1, 0, 1}, pred bool[B, H, W])."""
    gts, preds = [], []
    for _ in range(batch):
        gt, pred = draw(masks()), draw(masks())
        labels = gt.astype(np.int8)
        if draw(st.booleans()):  # an ignore band around part of the GT
            rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
            labels[rng.random(gt.shape) < 0.15] = -1
        gts.append(labels)
        preds.append(pred)
    return np.stack(gts), np.stack(preds)


# ---- boundary width ----------------------------------------------------------------------------

@pytest.mark.parametrize(
    "height, width, expected",
    [(20, 20, 1), (100, 100, 3), (75, 100, 2), (201, 201, 6), (480, 640, 16), (321, 481, 12),
     (480, 854, 20), (427, 640, 15), (1365, 2048, 49), (1536, 2048, 51), (2048, 2048, 58), (1, 1, 1)],
)
def test_boundary_width_golden(height, width, expected):
    assert M.boundary_width(height, width) == expected


@given(st.integers(1, 3000), st.integers(1, 3000), st.floats(0.0, 0.1))
def test_boundary_width_is_python_round_half_even(height, width, ratio):
    assert M.boundary_width(height, width, ratio) == cv2_width(height, width, ratio)


def test_boundary_width_half_to_even_and_errors():
    assert M.boundary_width(75, 100) == 2  # 2.5 -> 2, floor(x + 0.5) would give 3
    assert M.boundary_width(20, 20, 0.0707) == 2
    with pytest.raises(ValueError, match="dilation_ratio"):
        M.boundary_width(10, 10, -0.1)
    with pytest.raises(ValueError, match="height"):
        M.boundary_width(-1, 10)


# ---- golden values E1-E10 ---------------------------------------------------------------------

def test_e1_e1b_square_boundary_sizes():
    assert int(M.mask_to_boundary(A).sum()) == 36  # default ratio -> d = 1
    sizes = [int(M.mask_to_boundary(A, width=d).sum()) for d in range(1, 7)]
    assert sizes == [36, 64, 84, 96, 100, 100]
    assert int(M.mask_to_boundary(A, dilation_ratio=0.0707).sum()) == 64
    for d in (1, 3):
        np.testing.assert_array_equal(M.mask_to_boundary(A, width=d), cv2_mask_to_boundary(A, d) > 0)


def test_e2_corner_square_uses_the_image_border():
    corner = square(20, 0, 0, 10)
    assert int(M.mask_to_boundary(corner, width=1).sum()) == 36
    assert int(M.mask_to_boundary(corner, width=2).sum()) == 64


def test_e3_full_and_e4_empty():
    full = np.ones((20, 20), bool)
    empty = np.zeros((20, 20), bool)
    assert int(M.mask_to_boundary(full, width=1).sum()) == 76
    assert int(M.mask_to_boundary(full, width=2).sum()) == 144
    assert int(M.mask_to_boundary(empty).sum()) == 0
    assert math.isnan(float(M.boundary_iou(empty, empty)))
    assert float(M.boundary_iou(empty, empty, empty_value=0.0)) == 0.0
    assert float(M.boundary_iou(A, empty)) == 0.0
    assert math.isnan(float(M.mask_iou(empty, empty)))
    assert math.isnan(float(M.min_iou_boundary_iou(empty, empty)))


def test_e5_one_pixel_shift():
    assert float(M.boundary_iou(A, S, width=1)) == pytest.approx(18 / 54)
    assert float(M.mask_iou(A, S)) == pytest.approx(90 / 110)
    assert float(M.min_iou_boundary_iou(A, S, width=1)) == pytest.approx(18 / 54)


def test_e6_e6b_default_ratio_on_100px():
    e6 = square(100, 30, 30, 40)
    shifted = square(100, 30, 32, 40)
    assert int(M.mask_to_boundary(e6).sum()) == 444  # d = 3
    assert float(M.boundary_iou(e6, shifted)) == pytest.approx(296 / 592)
    assert float(M.mask_iou(e6, shifted)) == pytest.approx(1520 / 1680)
    assert float(M.min_iou_boundary_iou(e6, shifted)) == pytest.approx(0.5)


def test_e8_disc_versus_its_ring():
    yy, xx = np.mgrid[:201, :201]
    disc = (yy - 100) ** 2 + (xx - 100) ** 2 <= 60**2
    ring = np.asarray(M.mask_to_boundary(disc))  # d = 6
    assert int(disc.sum()) == 11289 and int(ring.sum()) == 2716
    assert float(M.boundary_iou(disc, ring)) == 1.0
    assert float(M.mask_iou(disc, ring)) == pytest.approx(0.240588, abs=1e-6)
    assert float(M.min_iou_boundary_iou(disc, ring)) == pytest.approx(0.240588, abs=1e-6)


def test_e9_thin_line_is_all_boundary():
    line = np.zeros((5, 20), bool)
    line[2, 2:18] = True
    np.testing.assert_array_equal(M.mask_to_boundary(line, width=1), line)


def test_e10_values_0_255():
    as_255 = A.astype(np.uint8) * 255
    boundary = np.asarray(M.mask_to_boundary(as_255, width=1))
    np.testing.assert_array_equal(boundary, M.mask_to_boundary(A, width=1))
    official = cv2_mask_to_boundary(as_255 // 255 * 255, 1)  # OpenCV keeps {0, 255}
    assert set(np.unique(official)) == {0, 255}
    np.testing.assert_array_equal(boundary, official == 255)


# ---- trimap IoU / F table (spec §3, Chebyshev bands) -----------------------------------------------

TRIMAP_F_TABLE = [
    (A, S, 1, 0.729730, 1.0, 1.0, 1.0),
    (A, S, 2, 0.787234, 1.0, 1.0, 1.0),
    (A, BIG, 1, 0.592593, 1.0, 1.0, 1.0),
    (BIG, A, 1, 0.450000, 1.0, 1.0, 1.0),
    (A, BIG, 2, 0.656250, 1.0, 1.0, 1.0),
    (BIG, A, 2, 0.592593, 1.0, 1.0, 1.0),
    (A, S3, 1, 0.540541, 0.5, 0.5, 0.5),
    (A, S3, 2, 0.519231, 0.611111, None, None),
    (A, S3, 3, 0.523810, 1.0, 1.0, 1.0),
]


@pytest.mark.parametrize("gt, pred, d, trimap, f, precision, recall", TRIMAP_F_TABLE)
def test_trimap_and_f_table(gt, pred, d, trimap, f, precision, recall):
    assert float(M.trimap_iou(gt, pred, width=d)) == pytest.approx(trimap, abs=1e-6)
    result = M.boundary_f_measure(gt, pred, width=d)
    assert float(result.f_measure) == pytest.approx(f, abs=1e-6)
    if precision is not None:
        assert float(result.precision) == pytest.approx(precision)
        assert float(result.recall) == pytest.approx(recall)


def test_band_sizes_of_the_table():
    contour = cv2_mask_to_boundary(A, 1)
    assert contour.sum() == 36
    for d, size in ((1, 108), (2, 180)):
        band = cv2.dilate(contour, np.ones((2 * d + 1, 2 * d + 1), np.uint8))
        assert band.sum() == size


def test_f_measure_empty_contour_conventions():
    empty = np.zeros((20, 20), bool)
    both = M.boundary_f_measure(empty, empty, width=2)
    assert (float(both.precision), float(both.recall), float(both.f_measure)) == (1.0, 1.0, 1.0)
    no_pred = M.boundary_f_measure(A, empty, width=2)
    assert (float(no_pred.precision), float(no_pred.recall), float(no_pred.f_measure)) == (1.0, 0.0, 0.0)
    no_gt = M.boundary_f_measure(empty, A, width=2)
    assert (float(no_gt.precision), float(no_gt.recall), float(no_gt.f_measure)) == (0.0, 1.0, 0.0)


# ---- equivalence to the OpenCV pipeline on random masks ---------------------------------------------

@given(labelled_pairs())
def test_mask_to_boundary_matches_opencv(pairs):
    labels, pred = pairs
    for d in WIDTHS:
        ours = np.asarray(M.mask_to_boundary(pred, width=d))
        for i in range(BATCH):
            np.testing.assert_array_equal(ours[i], cv2_mask_to_boundary(pred[i], d) > 0, err_msg=f"d={d}")


@given(labelled_pairs())
def test_all_scores_match_the_reference_wrappers(pairs):
    labels, pred = pairs
    gt, valid = M.split_ignore_label(labels)
    for d in WIDTHS:
        scores = jax.device_get(M.mask_scores(gt, pred, valid, width=d)._asdict())
        for i in range(BATCH):
            expected = reference_scores(labels[i], pred[i], d)
            assert_scores_match({k: v[i] for k, v in scores.items()}, expected, f"d={d} item={i}")


@pytest.mark.parametrize("shape", [(1, 1), (1, 17), (17, 1), (9, 8)])
def test_degenerate_image_shapes(shape):
    rng = np.random.default_rng(sum(shape))
    gt = rng.random(shape) < 0.6
    pred = rng.random(shape) < 0.6
    d = cv2_width(*shape)
    scores = jax.device_get(M.mask_scores(gt, pred)._asdict())
    assert_scores_match(scores, reference_scores(gt.astype(np.int8), pred, d), str(shape))


@given(labelled_pairs())
def test_zero_padding_with_invalid_padding_changes_nothing(pairs):
    # The CLI pads masks of one boundary width to a common canvas.
    labels, pred = pairs
    gt, valid = (np.asarray(x) for x in M.split_ignore_label(labels))
    pad = ((0, 0), (0, 11), (0, 21))
    plain = M.mask_scores(gt, pred, valid, width=5)
    padded = M.mask_scores(np.pad(gt, pad), np.pad(pred, pad), np.pad(valid, pad), width=5)
    for name in plain._fields:
        np.testing.assert_array_equal(getattr(plain, name), getattr(padded, name), err_msg=name)


# ---- ignore handling, transformations, errors ---------------------------------------------------------

def test_split_ignore_label_and_ignore_semantics():
    labels = np.array([[1, -1, 0], [1, 1, 0]], np.int32)
    gt, valid = M.split_ignore_label(labels)
    np.testing.assert_array_equal(gt, labels == 1)
    np.testing.assert_array_equal(valid, labels != -1)
    # A GT that is True at an ignore pixel is treated as background there.
    gt_with_ignore_set = np.asarray(gt) | ~np.asarray(valid)
    assert float(M.boundary_iou(gt_with_ignore_set, gt, valid)) == float(M.boundary_iou(gt, gt, valid)) == 1.0
    with pytest.raises(ValueError, match="integer"):
        M.split_ignore_label(labels.astype(np.float32))


def test_every_metric_under_jit_and_vmap():
    rng = np.random.default_rng(7)
    labels = rng.integers(-1, 2, size=(3, 24, 40)).astype(np.int8)
    labels[0] = np.where(square(40, 4, 6, 15, height=24), 1, 0)
    pred = rng.random((3, 24, 40)) < 0.5
    pred[0] = square(40, 5, 7, 15, height=24)
    gt, valid = M.split_ignore_label(labels)
    metrics = {
        "iou": M.mask_iou,
        "boundary_iou": functools.partial(M.boundary_iou, width=2),
        "min_iou_boundary_iou": functools.partial(M.min_iou_boundary_iou, width=2),
        "trimap_iou": functools.partial(M.trimap_iou, width=2),
        "f_measure": lambda g, p, v: M.boundary_f_measure(g, p, v, width=2).f_measure,
    }
    for name, metric in metrics.items():
        mapped = np.asarray(jax.jit(jax.vmap(metric))(gt, pred, valid))
        for i in range(3):
            expected = reference_scores(labels[i], pred[i], 2)[name]
            assert float(mapped[i]) == pytest.approx(expected, abs=1e-6, nan_ok=True), name
    boundary = jax.jit(jax.vmap(functools.partial(M.mask_to_boundary, width=2)))(pred)
    for i in range(3):
        np.testing.assert_array_equal(boundary[i], cv2_mask_to_boundary(pred[i], 2) > 0)


def test_mask_scores_lower_without_loops_for_cuda():
    # Static band widths are unrolled doubling erosions: the same loop-free program on accelerators.
    gt = np.zeros((3, 24, 40), bool)
    scores = jax.vmap(lambda g, p, v: M.mask_scores(g, p, v, width=7))
    assert while_loops(scores, gt, gt, ~gt, platform="cuda") == 0


def test_input_errors_are_named():
    with pytest.raises(ValueError, match="same shape"):
        M.mask_iou(A, A[:10])
    with pytest.raises(ValueError, match="pred must be a bool or integer"):
        M.boundary_iou(A, A.astype(np.float32))
    with pytest.raises(ValueError, match="valid must be a bool"):
        M.mask_iou(A, A, A.astype(np.uint8))
    with pytest.raises(ValueError, match="valid must have the shape"):
        M.mask_iou(A, A, A[:5])
    with pytest.raises(ValueError, match="width must be >= 1"):
        M.boundary_iou(A, A, width=0)
    with pytest.raises(ValueError, match="width must be a non-negative"):
        M.boundary_iou(A, A, width=1.5)


# ---- real data -------------------------------------------------------------------------------------------

def _real_gt_files(real_data_dir, dataset, ignore_value, limit):
    """Up to ``limit`` GT masks of the folder's first image size (one compilation)."""
    folder = real_data_dir / dataset / "masks"
    if not folder.is_dir():
        pytest.skip(f"{folder} not present")
    loaded = [(path, *read_gt_mask(path, ">128", ignore_value)) for path in sorted(folder.iterdir())[: 4 * limit]]
    same_size = [item for item in loaded if item[1].shape == loaded[0][1].shape]
    return same_size[:limit]


@pytest.mark.parametrize("dataset, ignore_value", [("grabcut", 128), ("berkeley", None)])
def test_real_masks_match_opencv(real_data_dir, dataset, ignore_value):
    for path, gt, valid in _real_gt_files(real_data_dir, dataset, ignore_value, limit=3):
        labels = np.where(valid, gt.astype(np.int8), -1)
        d = cv2_width(*gt.shape)
        shifted = np.roll(gt, (4, -7), axis=(0, 1))
        eroded = cv2.erode(gt.astype(np.uint8), np.ones((5, 5), np.uint8)).astype(bool)
        for pred in (shifted, eroded):
            expected = reference_scores(labels, pred, d)
            actual = jax.device_get(M.mask_scores(gt, pred, valid)._asdict())
            assert_scores_match(actual, expected, str(path))


@pytest.mark.slow
@pytest.mark.parametrize("dataset, ignore_value", [("grabcut", 128), ("berkeley", None), ("davis", None),
                                                   ("coco_mval", None)])
def test_all_real_masks_match_opencv(real_data_dir, dataset, ignore_value):
    rule = "!=0" if dataset == "davis" else ">128"
    folder = real_data_dir / dataset / "masks"
    for path in sorted(folder.iterdir()):
        gt, valid = read_gt_mask(path, rule, ignore_value)
        labels = np.where(valid, gt.astype(np.int8), -1)
        pred = np.roll(gt, (3, 5), axis=(0, 1))
        actual = jax.device_get(M.mask_scores(gt, pred, valid)._asdict())
        assert_scores_match(actual, reference_scores(labels, pred, cv2_width(*gt.shape)), str(path))
