"""Boundary PQ's band counts on batched crops (jaxseg_robust/evaluation/panoptic_bands.py,
docs/protocols/boundary_ap_pq.md "Panoptic").

Oracle: each segment's pixels, its band by scipy's binary erosion with a (2d+1)^2 square and zero outside
the image (the Boundary IoU API's band), the Boundary IoU of a pair as the authors' ``pq_compute`` forms it.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import ndimage

from jaxseg_robust.data import coco_rle
from jaxseg_robust.evaluation.crop_counts import count_pairs_on_crops
from jaxseg_robust.evaluation.panoptic_bands import band_work, boundary_ious, label_runs
from jaxseg_robust.metrics.masks import boundary_width

RATIO = 0.02


def _labels(height: int, width: int, count: int, rng) -> np.ndarray:
    """Blocky label maps with labels 0..count+1 (some absent), so segments touch and wrap columns."""
    coarse = rng.integers(0, count + 2, size=(-(-height // 7), -(-width // 5)))
    labels = np.kron(coarse, np.ones((7, 5), np.int64))[:height, :width]
    labels[rng.random((height, width)) < 0.05] = count + 1
    labels[labels == 2] = count + 1  # label 2 absent from the map
    return labels


def _band(mask: np.ndarray, radius: int) -> np.ndarray:
    square = np.ones((2 * radius + 1, 2 * radius + 1), bool)
    return mask & ~ndimage.binary_erosion(mask, structure=square, border_value=0)


@pytest.mark.parametrize("shape", [(1, 1), (33, 20), (64, 47), (90, 130)])
def test_label_runs_equal_the_coco_runs_of_each_label(shape):
    labels = _labels(*shape, count=5, rng=np.random.default_rng(shape[0]))
    runs = label_runs(labels, 5)
    assert len(runs) == 5
    for label, mine in enumerate(runs):
        coco = coco_rle.string_runs(coco_rle.encode_mask(labels == label))
        assert np.array_equal(coco[:mine.size], mine), label  # the same runs, less the trailing background
        assert coco.size - mine.size <= 1
        assert mine[1::2].sum() == (labels == label).sum()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_boundary_ious_of_candidates_equal_the_band_oracle(seed):
    rng = np.random.default_rng(seed)
    images, works = [], []
    for height, width in ((40, 31), (70, 96), (130, 64)):
        n_gt, n_pred = 6, 5
        gt, pred = _labels(height, width, n_gt, rng), _labels(height, width, n_pred, rng)
        gt[gt == n_gt + 1] = rng.choice([n_gt, n_gt + 1])  # VOID (n_gt) or unlisted pixels
        pairs = np.array([(g, p) for g in range(n_gt) for p in range(n_pred)
                          if ((gt == g) & (pred == p)).any()]).T
        images.append((gt, pred, n_gt, n_pred, (pairs[0], pairs[1])))
        works.append(band_work(gt, pred, n_gt, n_pred, (pairs[0], pairs[1])))
    counts = count_pairs_on_crops(works, RATIO)
    for (gt, pred, n_gt, n_pred, candidates), image_counts in zip(images, counts):
        radius = boundary_width(*gt.shape, RATIO)
        got = boundary_ious(image_counts, n_gt, candidates)
        for k, (g, p) in enumerate(zip(*candidates)):
            band_g, band_p = _band(gt == g, radius), _band(pred == p, radius)
            bi = int((band_g & band_p).sum())
            union = int(band_p.sum()) + int(band_g.sum()) - bi - int((band_p & (gt == n_gt)).sum())
            assert got[k] == bi / union, (gt.shape, g, p)
        assert np.array_equal(image_counts.boundary_area[-1], (gt == n_gt).sum())  # VOID's band is VOID
