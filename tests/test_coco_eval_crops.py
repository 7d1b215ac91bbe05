"""Boundary AP counts on tight crops (jaxseg_robust/evaluation/crop_counts.py, docs/protocols/boundary_ap_pq.md).

Oracle: the whole masks decoded to pixels, their bands by scipy's binary
erosion with a (2d+1)^2 square and zero outside the image (the Boundary IoU
API's band, docs/protocols/boundary_iou.md), counts by NumPy sums. The masks
reach every edge case of a crop: the image's borders, runs that wrap from the
bottom of a column to the top of the next, image heights on and off a
multiple of 32, empty and full masks, bands wider than the crop.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import ndimage

from jaxseg_robust.data import coco_rle
from jaxseg_robust.evaluation import crop_counts
from jaxseg_robust.evaluation.mask_counts import CountSettings, ImageWork, count_pairs
from jaxseg_robust.metrics.masks import boundary_width
from jaxseg_robust.metrics.run_pairs import run_table

SIZES = ((5, 7), (64, 40), (70, 33), (33, 100), (96, 130))


def _masks(height: int, width: int, rng) -> list[np.ndarray]:
    yy, xx = np.mgrid[:height, :width]
    masks = [np.zeros((height, width), bool), np.ones((height, width), bool), rng.random((height, width)) < 0.6]
    for _ in range(4):  # ellipses anywhere, some cut by the image's borders
        cy, cx = rng.uniform(-5, height + 5), rng.uniform(-5, width + 5)
        ry, rx = rng.uniform(1, height), rng.uniform(1, width)
        masks.append(((yy - cy) / ry) ** 2 + ((xx - cx) / rx) ** 2 <= 1)
    wrap = np.zeros((height, width), bool)  # runs from the bottom of a column into the next one
    wrap[height // 2:, 1] = wrap[: height // 3 + 1, 2] = True
    corner = np.zeros((height, width), bool)
    corner[-1, -1] = corner[0, 0] = True
    bottom = np.zeros((height, width), bool)  # on the last rows only
    bottom[-min(height, 3):, width // 3:] = True
    return masks + [wrap, corner, bottom]


def _works(seed: int = 0) -> tuple[list, list]:
    rng = np.random.default_rng(seed)
    works, pixels = [], []
    for height, width in SIZES:
        masks = _masks(height, width, rng)
        runs = [coco_rle.string_runs(coco_rle.encode_mask(mask)) for mask in masks]
        pairs = np.array([(a, b) for a in range(len(masks)) for b in range(len(masks))], np.int32)
        works.append(ImageWork(height, width, runs, pairs))
        pixels.append(masks)
    works.append(ImageWork(20, 20, [np.array([400])], np.zeros((0, 2), np.int32)))  # no pairs: no counts
    pixels.append(None)
    return works, pixels


def _band(mask: np.ndarray, radius: int) -> np.ndarray:
    square = np.ones((2 * radius + 1, 2 * radius + 1), bool)
    return mask & ~ndimage.binary_erosion(mask, structure=square, border_value=0)


@pytest.mark.parametrize("ratio", [0.02, 0.3])  # bands of 1 to 3 pixels; bands wider than most crops
def test_crop_counts_equal_those_of_the_whole_masks(monkeypatch, ratio):
    monkeypatch.setattr(crop_counts, "RUNS_PER_BATCH", 200)  # several batches of images
    monkeypatch.setattr(crop_counts, "GATHER_WORDS", 5)  # several passes over the pairs' overlaps
    works, pixels = _works()
    counts = crop_counts.count_pairs_on_crops(works, ratio, chunk_masks=1)  # chunks of 4,096 words
    assert counts[-1] is None
    for work, masks, count in zip(works[:-1], pixels, counts):
        radius = boundary_width(work.height, work.width, ratio)
        bands = [_band(mask, radius) for mask in masks]
        a, b = work.pairs.T
        np.testing.assert_array_equal(count.area, [mask.sum() for mask in masks])
        np.testing.assert_array_equal(count.boundary_area, [band.sum() for band in bands])
        np.testing.assert_array_equal(count.intersection, [(masks[i] & masks[j]).sum() for i, j in zip(a, b)])
        np.testing.assert_array_equal(count.boundary_intersection,
                                      [(bands[i] & bands[j]).sum() for i, j in zip(a, b)])


def test_solid_masks_count_as_their_own_band(monkeypatch):
    """A work's ``solid`` masks (Boundary PQ's VOID region) have the whole mask as band; the others are eroded."""
    monkeypatch.setattr(crop_counts, "RUNS_PER_BATCH", 200)  # solid indices offset within later batches
    works, pixels = _works(3)
    solid = [np.array([2, 5]) for _ in works[:-1]] + [np.zeros(0, np.int64)]
    works = [work._replace(solid=chosen) for work, chosen in zip(works, solid)]
    counts = crop_counts.count_pairs_on_crops(works, 0.1)
    for work, masks, count in zip(works[:-1], pixels, counts):
        radius = boundary_width(work.height, work.width, 0.1)
        bands = [mask if index in (2, 5) else _band(mask, radius) for index, mask in enumerate(masks)]
        a, b = work.pairs.T
        np.testing.assert_array_equal(count.boundary_area, [band.sum() for band in bands])
        np.testing.assert_array_equal(count.boundary_intersection,
                                      [(bands[i] & bands[j]).sum() for i, j in zip(a, b)])
    eroded = [count.boundary_area[index] != _band(masks[index], boundary_width(work.height, work.width, 0.1)).sum()
              for work, masks, count in zip(works[:-1], pixels, counts) for index in (2, 5)]
    assert any(eroded)  # the solid masks' bands differ from their eroded bands somewhere


def test_boundary_counts_take_the_crops():
    works, _ = _works(1)
    settings = CountSettings(dilation_ratio=0.05, progress="none")
    through_count_pairs = count_pairs(works, settings)
    direct = crop_counts.count_pairs_on_crops(works, 0.05)
    for one, other in zip(through_count_pairs, direct):
        assert (one is None) == (other is None)
        if one is not None:
            for field in one._fields:
                np.testing.assert_array_equal(getattr(one, field), getattr(other, field))


def test_crops_are_tight_and_decode_to_the_mask():
    works, pixels = _works(2)
    work, masks = works[4], pixels[4]  # 96 x 130
    table = run_table(work.masks)
    heights = np.full(len(masks), work.height, np.int64)
    crops = crop_counts.mask_crops(table, heights)
    shape = (int(crops.words.max()), int(crops.columns.max()))
    chunk = crop_counts.decode_crops(table, np.arange(len(masks)), heights, crops, shape, len(masks) + 1)
    assert chunk.shape == (len(masks) + 1, *shape) and not chunk[-1].any()
    for index, mask in enumerate(masks):
        if not mask.any():
            assert crops.words[index] == crops.columns[index] == 0
            continue
        rows, columns = np.flatnonzero(mask.any(axis=1)), np.flatnonzero(mask.any(axis=0))
        assert crops.word0[index] == rows[0] // 32 and crops.words[index] == rows[-1] // 32 + 1 - rows[0] // 32
        assert crops.column0[index] == columns[0] and crops.columns[index] == columns[-1] + 1 - columns[0]
        bits = np.unpackbits(chunk[index].view(np.uint8).reshape(shape[0], shape[1], 4), axis=2, bitorder="little")
        decoded = bits.transpose(0, 2, 1).reshape(32 * shape[0], shape[1]).astype(bool)  # [rows, columns]
        top, left = 32 * int(crops.word0[index]), int(crops.column0[index])
        expected = np.zeros_like(decoded)
        window = mask[top:top + decoded.shape[0], left:left + decoded.shape[1]]
        expected[:window.shape[0], :window.shape[1]] = window
        np.testing.assert_array_equal(decoded, expected)


def test_crop_classes_merge_only_when_a_program_costs_more(monkeypatch):
    classes = crop_counts.crop_classes(np.array([1, 2, 3, 9]), np.array([10, 64, 65, 700]))
    np.testing.assert_array_equal(classes, [[2, 64], [2, 64], [3, 96], [12, 768]])
    monkeypatch.setattr(crop_counts, "COMPILE_SECONDS", 1.0)
    monkeypatch.setattr(crop_counts, "WORD_SECONDS", 5e-4)  # a program costs as much as 2,000 words
    few_small = np.array([[2, 64]] * 3 + [[4, 128]] * 50)  # 3 * (512 - 128) words < 2,000: merged
    np.testing.assert_array_equal(crop_counts.merged_classes(few_small), [[4, 128]] * 53)
    many_small = np.array([[2, 64]] * 30 + [[4, 128]] * 50)  # 30 * 384 words: a program of their own
    np.testing.assert_array_equal(crop_counts.merged_classes(many_small), many_small)
    compiled = frozenset({(2, 64)})  # a class already compiled costs nothing more
    np.testing.assert_array_equal(crop_counts.merged_classes(few_small, compiled), few_small)
    no_holder = np.array([[2, 512]] * 3 + [[4, 128]] * 50)  # neither holds the other
    np.testing.assert_array_equal(crop_counts.merged_classes(no_holder), no_holder)


def test_crop_groups_hold_each_key_once_in_order_with_masks_in_their_order():
    rng = np.random.default_rng(3)
    masks = np.sort(rng.choice(10_000, 600, replace=False)).astype(np.int64)
    classes = np.stack([rng.choice([2, 4, 8], masks.size), rng.choice([64, 128], masks.size)], axis=1)
    radius = rng.choice([-1, 3, 5], masks.size)
    expected = {}
    for mask, (words, columns), width in zip(masks.tolist(), classes.tolist(), radius.tolist()):
        expected.setdefault((words, columns, width), []).append(mask)
    groups = crop_counts._crop_groups(masks, classes, radius)
    assert [key for key, _ in groups] == sorted(expected)
    assert all(members.tolist() == expected[key] for key, members in groups)
    assert crop_counts._crop_groups(masks[:0], classes[:0], radius[:0]) == []


def test_crop_classes_are_merged_over_all_batches_at_once(monkeypatch):
    monkeypatch.setattr(crop_counts, "COMPILE_SECONDS", 1.0)
    monkeypatch.setattr(crop_counts, "WORD_SECONDS", 5e-4)  # a program costs as much as 2,000 words

    def crops(words, columns):
        sizes = np.asarray(words, np.int64)
        return crop_counts.Crops(np.zeros_like(sizes), np.zeros_like(sizes), sizes, np.asarray(columns, np.int64),
                                 32 * sizes)

    # 3 small crops per batch: 3 * 384 words < 2,000 would join the large class in the first batch alone,
    # but the 6 of both batches (and the empty mask) keep a program of their own.
    first = crops([2] * 3 + [4] * 50 + [0], [64] * 3 + [128] * 50 + [0])
    second = crops([2] * 3, [64] * 3)
    one, two = crop_counts._global_classes([first, second])
    np.testing.assert_array_equal(one, [[2, 64]] * 3 + [[4, 128]] * 50 + [[0, 0]])
    np.testing.assert_array_equal(two, [[2, 64]] * 3)
    np.testing.assert_array_equal(crop_counts.merged_classes(one[:53]), [[4, 128]] * 53)  # the first batch alone
    assert crop_counts._global_classes([]) == []
