"""Connected components vs scipy.ndimage.label (test-only oracle): exact label maps
(same numbering) and component counts, 4- and 8-connectivity, adversarial shapes, for
both variants (the CPU row sweeps and the accelerator's whole-array rounds, each called
directly here), and the per-platform choice seen in the CPU and CUDA lowerings."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.ndimage as ndi
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxseg_robust.ops.components import (
    ACCELERATOR_JUMPS_PER_ROUND,
    accelerator_rounds,
    component_sizes,
    label_components,
    label_components_accelerator,
    label_components_cpu,
    largest_component,
)
from lowered_loops import while_loops
from mask_patterns import PATTERNS, make_mask, mask_strategy, snake, spiral

SHAPE = (21, 30)
STRUCTURES = {4: ndi.generate_binary_structure(2, 1), 8: np.ones((3, 3), bool)}
VARIANTS = {"per_platform": label_components, "cpu": label_components_cpu,
            "accelerator": label_components_accelerator}
BOTH = ("cpu", "accelerator")


@functools.lru_cache(maxsize=None)
def _labeller(connectivity, variant="per_platform"):
    return jax.jit(functools.partial(VARIANTS[variant], connectivity=connectivity))


@functools.lru_cache(maxsize=None)
def _largest(connectivity):
    return jax.jit(functools.partial(largest_component, connectivity=connectivity))


def check_against_scipy(mask, connectivity, variant="per_platform"):
    ref, num = ndi.label(np.asarray(mask) != 0, STRUCTURES[connectivity])
    labels, got_num = _labeller(connectivity, variant)(mask)
    assert labels.dtype == jnp.int32 and got_num.dtype == jnp.int32 and got_num.shape == ()
    np.testing.assert_array_equal(np.asarray(labels), ref)
    assert int(got_num) == num


def reference_largest(mask, connectivity):
    ref, num = ndi.label(np.asarray(mask) != 0, STRUCTURES[connectivity])
    if num == 0:
        return np.zeros(ref.shape, bool)
    sizes = np.bincount(ref.ravel())[1:]
    return ref == 1 + int(np.argmax(sizes))  # first maximum = lowest label


@pytest.mark.parametrize("variant", BOTH)
@given(mask=mask_strategy(SHAPE), connectivity=st.sampled_from((4, 8)))
def test_labels_match_scipy(variant, mask, connectivity):
    check_against_scipy(mask, connectivity, variant)


@pytest.mark.parametrize("variant", BOTH)
@pytest.mark.parametrize("connectivity", (4, 8))
@pytest.mark.parametrize("pattern", PATTERNS)
def test_every_pattern(pattern, connectivity, variant):
    for seed, density in ((1, 0.3), (2, 0.7)):
        check_against_scipy(make_mask(pattern, SHAPE, density, seed), connectivity, variant)


@pytest.mark.parametrize("variant", BOTH)
@pytest.mark.parametrize("connectivity", (4, 8))
def test_adversarial_paths_converge_exactly(connectivity, variant):
    # One long spiral / snake: labels must travel the whole path (hundreds of turns
    # would need hundreds of sweep rounds without pointer jumping).
    for mask in (spiral(*SHAPE), snake(*SHAPE), snake(SHAPE[1], SHAPE[0]).T.copy()):
        check_against_scipy(mask, connectivity, variant)
    # Diagonal staircase: one component for 8-connectivity, single pixels for 4.
    stairs = np.eye(*SHAPE, dtype=bool) | np.eye(*SHAPE, k=5, dtype=bool)
    check_against_scipy(stairs, connectivity, variant)


def _hard_masks(size):
    """Masks whose labels travel far: spiral, snakes both ways, noise near the percolation
    threshold, diagonal staircases (4- and 8-connected) and a comb."""
    rng = np.random.default_rng(3)
    staircase = np.zeros((size, size), bool)
    staircase[np.arange(size - 1), np.arange(size - 1)] = True
    staircase[np.arange(size - 1), np.arange(1, size)] = True
    diagonals = np.zeros((size, size), bool)
    for k in range(-size // 2, size // 2, 4):
        diagonals |= np.eye(size, k=k, dtype=bool)
    comb = np.zeros((size, size), bool)
    comb[:, ::2] = True
    comb[-1] = True
    return {"spiral": spiral(size, size), "snake": snake(size, size), "snake_t": snake(size, size).T.copy(),
            "noise50": rng.random((size, size)) < 0.5, "noise60": rng.random((size, size)) < 0.6,
            "staircase": staircase, "diagonals": diagonals, "comb": comb}


@pytest.mark.parametrize("connectivity", (4, 8))
def test_accelerator_rounds_stay_few_on_hard_masks(connectivity):
    # Each round is one host-synchronised loop iteration on a GPU: the run minima, the
    # hooking and the pointer jumps must keep the count small where labels travel the
    # whole image (a spiral of 256 x 256 has 128 turns and 32 000 pixels of path).
    assert ACCELERATOR_JUMPS_PER_ROUND >= 1
    rounds = {}
    for name, mask in _hard_masks(256).items():
        check_against_scipy(mask, connectivity, "accelerator")
        rounds[name] = int(jax.jit(functools.partial(accelerator_rounds, connectivity=connectivity))(mask))
    assert max(rounds.values()) <= 6, rounds
    assert int(accelerator_rounds(np.zeros((8, 8), bool), connectivity)) == 0
    assert int(accelerator_rounds(np.ones((8, 8), bool), connectivity)) == 1


@pytest.mark.parametrize("connectivity", (4, 8))
@pytest.mark.parametrize("batched", (False, True))
def test_the_platform_chooses_the_variant_in_the_lowering(connectivity, batched):
    x = np.zeros((3, 40, 24) if batched else (40, 24), bool)

    def lowered_loops(fn, platform):
        fn = functools.partial(fn, connectivity=connectivity)
        return while_loops(jax.vmap(fn) if batched else fn, x, platform=platform)

    # CUDA: only the rounds loop; no scan over rows or columns.
    assert lowered_loops(label_components, "cuda") == lowered_loops(label_components_accelerator, "cuda") == 1
    # CPU: the row sweeps and column scans of the CPU variant, as before.
    cpu_loops = lowered_loops(label_components_cpu, "cpu")
    assert cpu_loops > 1
    assert lowered_loops(label_components, "cpu") == cpu_loops


def test_numbering_is_raster_order_of_first_pixel():
    mask = np.zeros(SHAPE, bool)
    mask[5, 20:25] = True        # first pixel (5, 20)
    mask[2:9, 3] = True          # first pixel (2, 3) -> label 1
    mask[5:7, 10:12] = True      # first pixel (5, 10) -> label 2
    labels, num = _labeller(4)(mask)
    labels = np.asarray(labels)
    assert int(num) == 3
    assert labels[2, 3] == 1 and labels[5, 10] == 2 and labels[5, 20] == 3


@pytest.mark.parametrize("connectivity", (4, 8))
def test_largest_component_and_tie_break(connectivity):
    mask = np.zeros(SHAPE, bool)
    mask[10:12, 0:3] = True       # 6 px, first pixel later in raster order
    mask[1:3, 20:23] = True       # 6 px, first pixel (1, 20): wins the tie
    mask[15, 5:8] = True          # 3 px
    got = np.asarray(_largest(connectivity)(mask))
    expected = np.zeros(SHAPE, bool)
    expected[1:3, 20:23] = True
    np.testing.assert_array_equal(got, expected)
    np.testing.assert_array_equal(got, reference_largest(mask, connectivity))
    assert not np.asarray(_largest(connectivity)(np.zeros(SHAPE, bool))).any()


@given(mask_strategy(SHAPE))
@settings(max_examples=20)
def test_largest_matches_reference(mask):
    np.testing.assert_array_equal(np.asarray(_largest(8)(mask)), reference_largest(mask, 8))


def test_component_sizes():
    mask = make_mask("blobs", SHAPE, 0.3, 5)
    labels, num = _labeller(4)(mask)
    ref_labels, ref_num = ndi.label(mask)
    sizes = np.asarray(jax.jit(component_sizes)(labels))
    assert sizes.shape == (SHAPE[0] * SHAPE[1] + 1,)
    np.testing.assert_array_equal(sizes[: ref_num + 1], np.bincount(ref_labels.ravel(), minlength=ref_num + 1))
    assert not sizes[ref_num + 1:].any()
    short = np.asarray(component_sizes(labels, num_labels=2))
    np.testing.assert_array_equal(short, sizes[:3])


@pytest.mark.parametrize("variant", ("per_platform",) + BOTH)
def test_vmap_and_trace_count(variant):
    masks = np.stack([make_mask(p, SHAPE, 0.5, i) for i, p in enumerate(("blobs", "spiral", "empty", "full", "checker"))])
    fn = jax.jit(jax.vmap(functools.partial(VARIANTS[variant], connectivity=8)))
    labels, nums = fn(masks)
    for mask, lab, num in zip(masks, np.asarray(labels), np.asarray(nums)):
        ref, ref_num = ndi.label(mask, STRUCTURES[8])
        np.testing.assert_array_equal(lab, ref)
        assert num == ref_num
    fn(masks[::-1])
    assert fn._cache_size() == 1


@pytest.mark.parametrize("variant", BOTH)
@pytest.mark.parametrize("shape", [(1, 17), (17, 1), (1, 1)])
def test_single_row_and_column(shape, variant):
    rng = np.random.default_rng(0)
    for connectivity in (4, 8):
        for mask in (rng.random(shape) < 0.5, np.ones(shape, bool), np.zeros(shape, bool)):
            check_against_scipy(mask, connectivity, variant)


def test_bad_input_raises():
    with pytest.raises(ValueError, match="connectivity"):
        label_components(np.zeros((3, 3)), connectivity=6)
    with pytest.raises(ValueError, match="mask"):
        label_components(np.zeros((3, 3, 3)))
    with pytest.raises(ValueError, match="labels"):
        component_sizes(np.zeros((3,), np.int32))
    for variant in VARIANTS.values():
        with pytest.raises(ValueError, match="connectivity"):
            variant(np.zeros((3, 3)), connectivity=6)
    with pytest.raises(ValueError, match="mask"):
        accelerator_rounds(np.zeros((3,)))


@pytest.mark.parametrize("variant", BOTH)
def test_real_masks_match_scipy(real_data_dir, variant):
    cv2 = pytest.importorskip("cv2")
    paths = sorted((real_data_dir / "davis" / "masks").glob("*.png"))[:2]
    if not paths:
        pytest.skip("no DAVIS masks in the real data folder")
    for path in paths:
        raw = cv2.imread(str(path), cv2.IMREAD_UNCHANGED)
        mask = raw.reshape(raw.shape[0], raw.shape[1], -1).any(axis=-1)  # rule: != 0
        for connectivity in (4, 8):
            check_against_scipy(mask, connectivity, variant)
            check_against_scipy(~mask, connectivity, variant)


@pytest.mark.slow
@pytest.mark.parametrize("variant", BOTH)
@settings(max_examples=100)
@given(mask=st.sampled_from([(9, 40), (40, 9), (2, 2)]).flatmap(mask_strategy), connectivity=st.sampled_from((4, 8)))
def test_more_shapes_slow(variant, mask, connectivity):
    check_against_scipy(mask, connectivity, variant)


@pytest.mark.slow
@pytest.mark.parametrize("connectivity", (4, 8))
def test_accelerator_variant_on_large_hard_masks_slow(connectivity):
    for name, mask in _hard_masks(1024).items():
        check_against_scipy(mask, connectivity, "accelerator")
        assert int(accelerator_rounds(mask, connectivity)) <= 6, name
