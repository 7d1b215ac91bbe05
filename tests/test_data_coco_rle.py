"""`data.coco_rle.encode_mask` / `decode_mask`: a mask's compressed COCO RLE string and back (pycocotools as oracle)."""

from __future__ import annotations

import numpy as np
import pytest

from jaxseg_robust.data.coco_rle import decode_mask, encode_mask


def test_masks_round_trip_through_their_rle_string():
    rng = np.random.default_rng(0)
    for mask in (rng.random((17, 23)) > 0.5, np.ones((4, 5), bool), np.zeros((3, 2), bool), np.zeros((0, 4), bool)):
        np.testing.assert_array_equal(decode_mask(encode_mask(mask), mask.shape), mask)


def test_the_string_is_pycocotools_encoding():
    coco = pytest.importorskip("pycocotools.mask")
    rng = np.random.default_rng(1)
    for mask in (rng.random((31, 19)) > 0.7, np.ones((6, 2), bool)):
        assert encode_mask(mask) == coco.encode(np.asfortranarray(mask.astype(np.uint8)))["counts"].decode()


def test_a_string_of_another_size_is_refused():
    mask = np.random.default_rng(2).random((31, 19)) > 0.7
    with pytest.raises(ValueError, match="pixels"):
        decode_mask(encode_mask(mask), (30, 19))
