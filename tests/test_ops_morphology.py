"""Tests for jaxseg_robust.ops.morphology (oracles: scipy.ndimage and OpenCV)."""

from __future__ import annotations

import functools

import cv2
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.ndimage as ndi
from hypothesis import given
from hypothesis import strategies as st

from jaxseg_robust.ops import morphology as morph
from lowered_loops import while_loops

# One canvas for the property tests (non-square, odd, crosses a 32-row word
# boundary), so each (radius, op) compiles once per session.
BATCH, HEIGHT, WIDTH = 4, 37, 70
SQUARE_RADII = (0, 1, 3, 33)
DISK_RADII = (1, 4)


@st.composite
def mask_batches(draw, batch=BATCH, height=HEIGHT, width=WIDTH):
    """bool[batch, height, width]: random fill mixed with empty, full, one-pixel and thin masks."""
    masks = []
    for _ in range(batch):
        kind = draw(st.sampled_from(["random", "empty", "full", "pixel", "hline", "vline", "blobs"]))
        mask = np.zeros((height, width), bool)
        if kind == "random":
            density = draw(st.sampled_from([0.1, 0.5, 0.9]))
            seed = draw(st.integers(0, 2**31 - 1))
            mask = np.random.default_rng(seed).random((height, width)) < density
        elif kind == "full":
            mask[:] = True
        elif kind == "pixel":
            mask[draw(st.integers(0, height - 1)), draw(st.integers(0, width - 1))] = True
        elif kind == "hline":
            mask[draw(st.integers(0, height - 1)), draw(st.integers(0, width - 1)):] = True
        elif kind == "vline":
            mask[draw(st.integers(0, height - 1)):, draw(st.integers(0, width - 1))] = True
        elif kind == "blobs":
            for _ in range(draw(st.integers(1, 3))):
                y0, x0 = draw(st.integers(0, height - 1)), draw(st.integers(0, width - 1))
                mask[y0: y0 + draw(st.integers(1, 20)), x0: x0 + draw(st.integers(1, 30))] = True
        masks.append(mask)
    return np.stack(masks)


def _cv2_square(mask: np.ndarray, radius: int, op) -> np.ndarray:
    kernel = np.ones((2 * radius + 1, 2 * radius + 1), np.uint8)
    out = op(mask.astype(np.uint8), kernel, borderType=cv2.BORDER_CONSTANT, borderValue=0)
    return out.astype(bool)


# ---- structuring elements ------------------------------------------------------

def test_disk_footprint_is_closed_euclidean_ball():
    assert morph.disk_footprint(0).tolist() == [[True]]
    assert morph.disk_footprint(1).astype(int).tolist() == [[0, 1, 0], [1, 1, 1], [0, 1, 0]]
    two = morph.disk_footprint(2).astype(int)
    assert two.tolist() == [
        [0, 0, 1, 0, 0],
        [0, 1, 1, 1, 0],
        [1, 1, 1, 1, 1],
        [0, 1, 1, 1, 0],
        [0, 0, 1, 0, 0],
    ]
    # (dy, dx) = (3, 4) lies exactly on the radius-5 circle and is included.
    assert morph.disk_footprint(5)[5 + 3, 5 + 4]


@pytest.mark.parametrize("radius", range(0, 70))
def test_disk_rectangles_union_is_the_disk(radius):
    union = np.zeros((2 * radius + 1, 2 * radius + 1), bool)
    for half_height, half_width in morph.disk_rectangles(radius):
        union[radius - half_height: radius + half_height + 1, radius - half_width: radius + half_width + 1] = True
    np.testing.assert_array_equal(union, morph.disk_footprint(radius))


def test_square_footprint():
    assert morph.square_footprint(2).shape == (5, 5) and morph.square_footprint(2).all()


# ---- hand-made cases -------------------------------------------------------------

def test_erosion_of_a_square_and_the_border_rule():
    mask = np.zeros((7, 7), bool)
    mask[1:6, 1:6] = True
    expected = np.zeros((7, 7), bool)
    expected[2:5, 2:5] = True
    np.testing.assert_array_equal(morph.erode(mask, 1), expected)
    full = np.ones((4, 5), bool)
    interior = np.zeros((4, 5), bool)
    interior[1:-1, 1:-1] = True
    np.testing.assert_array_equal(morph.erode(full, 1), interior)  # outside = background
    np.testing.assert_array_equal(morph.erode(full, 1, border_value=True), full)
    np.testing.assert_array_equal(morph.erode(mask, 0), mask)


def test_dilation_of_a_pixel_gives_the_structuring_element():
    mask = np.zeros((11, 11), bool)
    mask[5, 5] = True
    np.testing.assert_array_equal(morph.dilate(mask, 3, shape="disk")[2:9, 2:9], morph.disk_footprint(3))
    np.testing.assert_array_equal(morph.dilate(mask, 3)[2:9, 2:9], morph.square_footprint(3))
    assert int(morph.dilate(mask, 3).sum()) == 49


def test_integer_masks_are_nonzero_foreground():
    mask = np.zeros((6, 6), np.uint8)
    mask[1:5, 1:5] = 255
    np.testing.assert_array_equal(morph.erode(mask, 1), morph.erode(mask > 0, 1))


# ---- property tests against scipy / OpenCV -------------------------------------------

@given(mask_batches())
def test_square_matches_scipy_and_opencv(masks):
    # Oracles: scipy's separable min/max filters with a constant border (fast at
    # any radius), scipy's binary morphology at small radii, and OpenCV.
    for radius in SQUARE_RADII:
        size = 2 * radius + 1
        for border_value in (False, True):
            eroded = np.asarray(morph.erode(masks, radius, border_value=border_value))
            dilated = np.asarray(morph.dilate(masks, radius, border_value=border_value))
            for i, mask in enumerate(masks):
                message = f"radius={radius} border_value={border_value} mask={i}"
                np.testing.assert_array_equal(
                    eroded[i], ndi.minimum_filter(mask, size, mode="constant", cval=border_value), err_msg=message)
                np.testing.assert_array_equal(
                    dilated[i], ndi.maximum_filter(mask, size, mode="constant", cval=border_value), err_msg=message)
                if radius <= 3:
                    footprint = morph.square_footprint(radius)
                    np.testing.assert_array_equal(
                        eroded[i], ndi.binary_erosion(mask, footprint, border_value=border_value), err_msg=message)
                    np.testing.assert_array_equal(
                        dilated[i], ndi.binary_dilation(mask, footprint, border_value=border_value), err_msg=message)
                if not border_value:
                    np.testing.assert_array_equal(eroded[i], _cv2_square(mask, radius, cv2.erode), err_msg=message)
                    np.testing.assert_array_equal(dilated[i], _cv2_square(mask, radius, cv2.dilate), err_msg=message)


@given(mask_batches())
def test_disk_matches_scipy(masks):
    for radius in DISK_RADII:
        footprint = morph.disk_footprint(radius)
        eroded = np.asarray(morph.erode(masks, radius, shape="disk"))
        dilated = np.asarray(morph.dilate(masks, radius, shape="disk"))
        for i, mask in enumerate(masks):
            np.testing.assert_array_equal(eroded[i], ndi.binary_erosion(mask, footprint), err_msg=f"r={radius}")
            np.testing.assert_array_equal(dilated[i], ndi.binary_dilation(mask, footprint), err_msg=f"r={radius}")


@pytest.mark.parametrize("shape", [(1, 1), (1, 9), (9, 1)])
def test_degenerate_images(shape):
    rng = np.random.default_rng(0)
    mask = rng.random(shape) < 0.7
    mask.flat[0] = True
    footprint = morph.square_footprint(2)
    np.testing.assert_array_equal(morph.erode(mask, 2), ndi.binary_erosion(mask, footprint))
    np.testing.assert_array_equal(morph.dilate(mask, 2), ndi.binary_dilation(mask, footprint))


# ---- packing ----------------------------------------------------------------------

@pytest.mark.parametrize("height", [1, 32, 33])
def test_pack_round_trip_and_count(height):
    rng = np.random.default_rng(height)
    mask = rng.random((2, height, 5)) < 0.5
    words = morph.pack_rows(mask)
    assert words.dtype == jnp.uint32 and words.shape == (2, morph.packed_rows(height), 5)
    np.testing.assert_array_equal(morph.unpack_rows(words, height), mask)
    np.testing.assert_array_equal(morph.count_packed(words), mask.sum(axis=(1, 2)))
    # Padding bits stay zero after an operation that grows the mask.
    dilated = morph.dilate_packed(words, 2, height)
    np.testing.assert_array_equal(morph.count_packed(dilated), morph.dilate(mask, 2).sum(axis=(1, 2)))


def test_packed_bit_layout():
    mask = np.zeros((40, 2), bool)
    mask[0, 0] = mask[33, 1] = True
    words = np.asarray(morph.pack_rows(mask))
    assert words.tolist() == [[1, 0], [0, 2]]


# ---- transformations -----------------------------------------------------------------

def test_jit_and_vmap():
    rng = np.random.default_rng(3)
    masks = rng.random((3, 20, 24)) < 0.6
    batched = morph.erode(masks, 2, shape="disk")
    mapped = jax.vmap(functools.partial(morph.erode, radius=2, shape="disk"))(masks)
    nested = jax.jit(lambda m: morph.dilate(morph.erode(m, 2, shape="disk"), 2, shape="disk"))(masks)
    np.testing.assert_array_equal(batched, mapped)
    for i in range(3):
        np.testing.assert_array_equal(batched[i], ndi.binary_erosion(masks[i], morph.disk_footprint(2)))
        opened = ndi.binary_dilation(ndi.binary_erosion(masks[i], morph.disk_footprint(2)), morph.disk_footprint(2))
        np.testing.assert_array_equal(nested[i], opened)


def test_no_recompilation_for_same_shape():
    rng = np.random.default_rng(4)
    before = morph.erode._cache_size()
    for _ in range(3):
        morph.erode(rng.random((2, 21, 23)) < 0.5, 3)
    assert morph.erode._cache_size() == before + 1


def test_every_erosion_lowers_without_loops_for_cuda():
    # Accelerators run the same program: no scan or loop whose trip count grows with the
    # image or the radius (module docstring), for static and traced radii, batched.
    masks = np.zeros((3, 40, 70), bool)
    radii = np.array([1, 5, 17], np.int32)
    functions = {
        "erode square": (lambda m: morph.erode(m, 9), masks),
        "dilate disk": (lambda m: morph.dilate(m, 9, shape="disk"), masks),
        "traced erosion": (jax.vmap(lambda w, r: morph.erode_square_packed_traced(w, r, 33)),
                           morph.pack_rows(masks), radii),
        "uniform window": (jax.vmap(lambda lab, r: morph.uniform_window_traced(lab, r, 33)),
                           masks.astype(np.int32), radii),
    }
    for name, (fn, *args) in functions.items():
        assert while_loops(fn, *args, platform="cuda") == 0, name


# ---- errors ----------------------------------------------------------------------------

@pytest.mark.parametrize("radius", [-1, 1.5, 2.0, True, "3", None])
def test_bad_radius(radius):
    with pytest.raises((ValueError, TypeError), match="radius"):
        morph.erode(np.ones((4, 4), bool), radius)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="shape must be one of"):
        morph.dilate(np.ones((4, 4), bool), 1, shape="diamond")
    with pytest.raises(ValueError, match="threshold probabilities"):
        morph.erode(np.ones((4, 4), np.float32), 1)
    with pytest.raises(ValueError, match="at least 2 dimensions"):
        morph.erode(np.ones(4, bool), 1)
    with pytest.raises(ValueError, match="uint32"):
        morph.erode_packed(np.ones((1, 4), np.int32), 1, 4)
    with pytest.raises(ValueError, match="height"):
        morph.erode_packed(morph.pack_rows(np.ones((4, 4), bool)), 1, 40)
