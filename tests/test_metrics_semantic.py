"""Tests for jaxseg_robust.metrics.semantic against a plain NumPy re-statement of
perturbation-attacks.md §6 (computed from pixels, not from confusion matrices)."""

from __future__ import annotations

import functools
import math

import jax
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from jaxseg_robust.metrics import semantic as S

C = 5
VOID = 255
N_IMAGES, HEIGHT, WIDTH = 6, 13, 17
# Built once so hypothesis examples reuse one compilation.
BATCHED_CONFUSION_WITH_IGNORE = jax.jit(jax.vmap(functools.partial(S.confusion_matrix, num_classes=C, ignore_index=-1)))


def numpy_image_stats(labels, preds, num_classes, with_background, ignore_index=None, valid=None):
    """Per-class (I_c, U_c) and |V| of one image, straight from spec §6.1."""
    counted = (labels >= 0) & (labels < num_classes) & (preds >= 0) & (preds < num_classes)
    if ignore_index is not None:
        counted &= labels != ignore_index
    if valid is not None:
        counted &= valid
    if not with_background:
        counted &= labels != 0
    classes = range(num_classes) if with_background else range(1, num_classes)
    inter = {c: int(np.sum(counted & (labels == c) & (preds == c))) for c in classes}
    union = {c: int(np.sum(counted & ((labels == c) | (preds == c)))) for c in classes}
    return inter, union, int(counted.sum())


def numpy_miou(inter, union):
    ious = [inter[c] / union[c] for c in inter if union[c] > 0]
    return float(np.mean(ious)) if ious else math.nan


def numpy_dataset(labels, preds, num_classes, with_background, **kwargs):
    stats = [numpy_image_stats(l, p, num_classes, with_background, **kwargs) for l, p in zip(labels, preds)]
    total_inter = {c: sum(s[0][c] for s in stats) for c in stats[0][0]}
    total_union = {c: sum(s[1][c] for s in stats) for c in stats[0][0]}
    per_image = [numpy_miou(s[0], s[1]) for s in stats]
    defined = [v for v in per_image if not math.isnan(v)]
    accuracies = [sum(s[0].values()) / s[2] for s in stats if s[2]]
    pixels = sum(s[2] for s in stats)
    return {
        "cmiou": numpy_miou(total_inter, total_union),
        "nmiou": float(np.mean(defined)) if defined else math.nan,
        "per_image": per_image,
        "accuracy": sum(sum(s[0].values()) for s in stats) / pixels if pixels else math.nan,
        "mean_accuracy": float(np.mean(accuracies)) if accuracies else math.nan,
    }


@st.composite
def label_maps(draw):
    rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
    num_used = draw(st.integers(1, C))  # some classes may be absent everywhere
    labels = rng.integers(0, num_used, size=(N_IMAGES, HEIGHT, WIDTH))
    preds = np.where(rng.random(labels.shape) < draw(st.sampled_from([0.0, 0.3, 0.8])),
                     rng.integers(0, C, size=labels.shape), labels)
    labels = np.where(rng.random(labels.shape) < draw(st.sampled_from([0.0, 0.1, 0.5])), VOID, labels)
    if draw(st.booleans()):
        labels[0] = VOID  # an image with no counted pixel
    if draw(st.booleans()):
        labels[1] = 0  # background only
    return labels.astype(np.int32), preds.astype(np.int32)


def close(actual, expected):
    actual = float(actual)
    if math.isnan(expected):
        return math.isnan(actual)
    return actual == pytest.approx(expected, rel=1e-5, abs=1e-7)


@given(label_maps())
def test_dataset_metrics_match_numpy(maps):
    labels, preds = maps
    confusions = jax.vmap(functools.partial(S.confusion_matrix, num_classes=C))(labels, preds)
    for with_background in (True, False):
        expected = numpy_dataset(labels, preds, C, with_background)
        kwargs = {"with_background": with_background}
        assert close(S.cmiou(confusions, **kwargs), expected["cmiou"]), with_background
        assert close(S.nmiou(confusions, **kwargs), expected["nmiou"]), with_background
        assert close(S.dataset_pixel_accuracy(confusions, **kwargs), expected["accuracy"]), with_background
        assert close(S.mean_image_pixel_accuracy(confusions, **kwargs), expected["mean_accuracy"]), with_background
        per_image = S.mean_iou(confusions, **kwargs)
        for i, value in enumerate(expected["per_image"]):
            assert close(per_image[i], value), (with_background, i)


@given(label_maps())
def test_confusion_matrix_matches_numpy(maps):
    labels, preds = maps
    rng = np.random.default_rng(0)
    valid = rng.random(labels.shape) < 0.8
    labels = np.where(rng.random(labels.shape) < 0.1, -1, labels)
    confusions = BATCHED_CONFUSION_WITH_IGNORE(labels, preds, valid)
    for i in range(N_IMAGES):
        counted = (labels[i] >= 0) & (labels[i] < C) & valid[i]
        expected = np.zeros((C, C), np.int64)
        np.add.at(expected, (labels[i][counted], preds[i][counted]), 1)
        np.testing.assert_array_equal(confusions[i], expected)


def test_ignore_index_and_valid_mask_agree():
    labels = np.array([[0, 1, 2], [-1, 1, 2]], np.int32)
    preds = np.array([[0, 1, 1], [2, 1, 2]], np.int32)
    by_index = S.confusion_matrix(labels, preds, num_classes=3, ignore_index=-1)
    by_mask = S.confusion_matrix(np.maximum(labels, 0), preds, labels != -1, num_classes=3)
    np.testing.assert_array_equal(by_index, by_mask)
    assert int(by_index.sum()) == 5


def test_hand_example_with_and_without_background():
    # 2 classes + background; one foreground pixel predicted as background.
    labels = np.array([[0, 0, 1, 1], [0, 2, 2, VOID]], np.int32)
    preds = np.array([[0, 1, 1, 0], [0, 2, 0, 2]], np.int32)
    confusion = S.confusion_matrix(labels, preds, num_classes=3)
    np.testing.assert_array_equal(confusion, [[2, 1, 0], [1, 1, 0], [1, 0, 1]])
    # with background: IoU_0 = 2/5, IoU_1 = 1/3, IoU_2 = 1/2
    np.testing.assert_allclose(S.class_iou(confusion), [2 / 5, 1 / 3, 1 / 2], rtol=1e-6)
    assert float(S.pixel_accuracy(confusion)) == pytest.approx(4 / 7)
    # without background: row 0 dropped -> IoU_1 = 1/2, IoU_2 = 1/2; background not averaged.
    iou = np.asarray(S.class_iou(confusion, with_background=False))
    assert math.isnan(iou[0])
    np.testing.assert_allclose(iou[1:], [1 / 2, 1 / 2], rtol=1e-6)
    assert float(S.mean_iou(confusion, with_background=False)) == pytest.approx(0.5)
    assert float(S.pixel_accuracy(confusion, with_background=False)) == pytest.approx(2 / 4)


def test_nmiou_is_not_the_reference_micro_jaccard():
    # Spec §6.2: the reference "NmIoU" is a pooled Jaccard = acc / (2 - acc); ours is image-wise.
    labels = np.array([[[0, 0, 0, 1]], [[1, 1, 2, 2]]], np.int32)
    preds = np.array([[[0, 0, 0, 0]], [[1, 1, 2, 1]]], np.int32)
    confusions = jax.vmap(functools.partial(S.confusion_matrix, num_classes=3))(labels, preds)
    accuracy = float(S.dataset_pixel_accuracy(confusions))
    expected = np.mean([np.mean([3 / 4, 0.0]), np.mean([2 / 3, 1 / 2])])
    assert float(S.nmiou(confusions)) == pytest.approx(expected)
    assert float(S.nmiou(confusions)) != pytest.approx(accuracy / (2 - accuracy))


def test_empty_image_is_nan_and_skipped():
    labels = np.full((2, 3, 3), VOID, np.int32)
    labels[1] = 1
    preds = np.ones((2, 3, 3), np.int32)
    confusions = jax.vmap(functools.partial(S.confusion_matrix, num_classes=3))(labels, preds)
    per_image = S.mean_iou(confusions)
    assert math.isnan(float(per_image[0])) and float(per_image[1]) == 1.0
    assert float(S.nmiou(confusions)) == 1.0
    assert math.isnan(float(S.pixel_accuracy(confusions[0])))


def test_out_of_range_predictions_are_not_counted():
    labels = np.array([[0, 1, 1]], np.int32)
    preds = np.array([[0, 1, 7]], np.int32)
    np.testing.assert_array_equal(S.confusion_matrix(labels, preds, num_classes=2), [[1, 0], [0, 1]])


def test_vmap_over_leading_axes_of_dataset_functions():
    rng = np.random.default_rng(5)
    confusions = rng.integers(0, 50, size=(3, 4, C, C)).astype(np.int32)  # 3 attacks x 4 images
    mapped = jax.vmap(S.cmiou)(confusions)
    batched = S.cmiou(confusions)
    for k in range(3):
        assert float(mapped[k]) == pytest.approx(float(S.mean_iou(confusions[k].sum(axis=0))), rel=1e-6)
    np.testing.assert_allclose(mapped, batched, rtol=1e-6)


def test_errors():
    labels = np.zeros((3, 3), np.int32)
    with pytest.raises(ValueError, match="num_classes"):
        S.confusion_matrix(labels, labels, num_classes=0)
    with pytest.raises(ValueError, match="preds must be an integer"):
        S.confusion_matrix(labels, labels.astype(np.float32), num_classes=3)
    with pytest.raises(ValueError, match="same shape"):
        S.confusion_matrix(labels, labels[:2], num_classes=3)
    with pytest.raises(ValueError, match="confusion must have shape"):
        S.mean_iou(np.zeros((3, 4)))
    with pytest.raises(ValueError, match="background_class"):
        S.mean_iou(np.zeros((3, 3)), with_background=False, background_class=5)
    with pytest.raises(ValueError, match="at least 3-D"):
        S.cmiou(np.zeros((3, 3)))
