"""Tests for jaxseg_robust.data.synthetic: exact masks, family contracts, determinism, I/O, preview.

Oracles: hand counts of pixel centres for simple shapes; scipy.ndimage
(label, binary_fill_holes, distance_transform_edt, binary_dilation /
binary_erosion) and scipy.spatial.ConvexHull for topology and shape claims;
`jaxseg_robust.ops.boxes.tight_box` for the NumPy box; the datasets ``folder``
loader for the written folder.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import ndimage
from scipy.spatial import ConvexHull

from jaxseg_robust.data import synthetic as syn
from jaxseg_robust.data.datasets import load_dataset
from jaxseg_robust.data.instances import validate_instance
from jaxseg_robust.data.synthetic import families as fam
from jaxseg_robust.data.synthetic import geometry as geo
from jaxseg_robust.data.synthetic import topology as topo
from jaxseg_robust.data.synthetic.scenes import DISTRACTOR_GAP, sample_streams
from jaxseg_robust.ops.boxes import tight_box

EIGHT = np.ones((3, 3), bool)
SMALL_SIZES = [(32, 32), (48, 64), (64, 64), (64, 48), (96, 128), (33, 47)]


def _components(mask, connectivity=8):
    structure = EIGHT if connectivity == 8 else ndimage.generate_binary_structure(2, 1)
    return ndimage.label(mask, structure=structure)[1]


def _holes(mask):
    return ndimage.label(ndimage.binary_fill_holes(mask) & ~mask)[1]


def _hull_fill_ratio(mask):
    """Pixel count over the area of the convex hull of the pixel squares (corners)."""
    rows, cols = np.nonzero(mask)
    corners = np.concatenate([np.stack([cols + dx, rows + dy], 1) for dx in (0, 1) for dy in (0, 1)])
    return mask.sum() / ConvexHull(corners).volume


def _geometry(family, seed, index, size):
    return fam.draw_object(sample_streams(seed, index)[0], family, *size)


# ----------------------------------------------------------------------------- exact masks of simple shapes


@pytest.mark.parametrize("radius", [0.6, 1.0, 2.5, 5.0, 7.3, 12.0])
@pytest.mark.parametrize("centre", [(16.0, 16.0), (16.5, 15.5), (15.25, 17.75)])
def test_disc_mask_is_the_pixel_centres_inside(radius, centre):
    cx, cy = centre
    mask = geo.shape_mask(geo.Disc(cx, cy, radius), 32, 32)
    expected = sum(1 for r in range(32) for c in range(32) if (c + 0.5 - cx) ** 2 + (r + 0.5 - cy) ** 2 <= radius**2)
    assert mask.sum() == expected
    assert mask[int(cy), int(cx)] == ((int(cx) + 0.5 - cx) ** 2 + (int(cy) + 0.5 - cy) ** 2 <= radius**2)


def test_disc_of_radius_5_at_a_pixel_corner_has_80_pixels():
    # centres (k + 1/2) around an integer centre: odd a, b with a^2 + b^2 <= 100 -> 80 lattice points, no ties.
    assert geo.shape_mask(geo.Disc(16.0, 16.0, 5.0), 32, 32).sum() == 80


def test_axis_aligned_rectangle_with_integer_sides_counts_exactly():
    mask = geo.shape_mask(geo.RoundedRectangle(20.0, 12.0, 7.0, 3.0), 24, 40)
    assert mask.sum() == 14 * 6
    rows, cols = np.nonzero(mask)
    assert (rows.min(), rows.max(), cols.min(), cols.max()) == (9, 14, 13, 26)
    rotated = geo.shape_mask(geo.RoundedRectangle(20.0, 12.0, 3.0, 7.0, angle=math.pi / 2), 24, 40)
    np.testing.assert_array_equal(rotated, mask)


def test_bar_of_width_4_covers_4_rows():
    mask = geo.shape_mask(geo.RoundedRectangle(32.0, 20.0, 15.0, 2.0), 40, 64)
    assert mask.sum() == 4 * 30
    np.testing.assert_array_equal(np.nonzero(mask.any(1))[0], [18, 19, 20, 21])


def test_stroke_with_round_caps_counts_by_hand():
    # |dy| in {0.5, 1.5} along the 30 px body (4 x 30); each round cap adds x = 9.5 (4 px) and x = 8.5 (2 px).
    mask = geo.shape_mask(geo.Stroke(((10.0, 20.0), (40.0, 20.0)), 2.0), 40, 64)
    assert mask.sum() == 4 * 30 + 2 * (4 + 2)


def test_triangle_polygon_counts_by_hand_in_either_orientation():
    # pixel centres with x + y <= 10.5 and x, y > 0: c + r <= 9, i.e. 55 pixels.
    for vertices in [((0, 0), (10.5, 0), (0, 10.5)), ((0, 0), (0, 10.5), (10.5, 0))]:
        mask = geo.shape_mask(geo.Polygon(vertices).moved(5.0, 7.0), 24, 24)
        assert mask.sum() == 55
        rows, cols = np.nonzero(mask)
        assert rows.min() == 7 and cols.min() == 5 and (rows - 7 + cols - 5).max() == 9


def test_annulus_is_inner_to_outer_radius_inclusive():
    mask = geo.shape_mask(geo.annulus(20.0, 20.0, 4.0, 9.0), 40, 40)
    expected = sum(1 for r in range(40) for c in range(40)
                   if 16 <= (c + 0.5 - 20) ** 2 + (r + 0.5 - 20) ** 2 <= 81)
    assert mask.sum() == expected
    assert _components(mask) == 1 and _holes(mask) == 1


def test_axis_aligned_ellipse_counts_pixel_centres():
    a, b = 10, 6
    mask = geo.shape_mask(geo.Ellipse(32.0, 32.0, a, b), 64, 64)
    lattice = [(2 * c + 1 - 64, 2 * r + 1 - 64) for r in range(64) for c in range(64)]
    values = [(u * b) ** 2 + (v * a) ** 2 for u, v in lattice]  # doubled coordinates, integers
    assert 4 * (a * b) ** 2 not in values  # no pixel centre on the boundary: the count is unambiguous
    assert mask.sum() == sum(1 for value in values if value <= 4 * (a * b) ** 2)


def test_star_and_union_and_difference():
    star = geo.regular_star(32.0, 32.0, 20.0, 9.0, 5)
    mask = geo.shape_mask(star, 64, 64)
    assert _components(mask) == 1 and _hull_fill_ratio(mask) < 0.8
    discs = geo.Union((geo.Disc(10.0, 10.0, 4.0), geo.Disc(40.0, 12.0, 5.0), geo.Disc(25.0, 40.0, 3.0)))
    union = geo.shape_mask(discs, 50, 50)
    separate = sum(geo.shape_mask(d, 50, 50).sum() for d in discs.parts)
    assert union.sum() == separate and _components(union) == 3
    bitten = geo.Difference(geo.Disc(25.0, 25.0, 10.0), geo.Disc(35.0, 25.0, 6.0))
    expected = geo.shape_mask(geo.Disc(25.0, 25.0, 10.0), 50, 50) & ~(
        geo.shape_mask(geo.Disc(35.0, 25.0, 6.0), 50, 50) & ~np.isclose(
            np.hypot(np.arange(50)[None, :] + 0.5 - 35, np.arange(50)[:, None] + 0.5 - 25), 6.0))
    np.testing.assert_array_equal(geo.shape_mask(bitten, 50, 50), expected)


def _random_shape(draw):
    kind = draw(st.sampled_from(["disc", "ellipse", "rect", "star", "stroke", "ring"]))
    cx, cy = draw(st.floats(-5, 45)), draw(st.floats(-5, 45))
    radius = draw(st.floats(0.3, 20))
    angle = draw(st.floats(0, math.pi))
    if kind == "disc":
        return geo.Disc(cx, cy, radius)
    if kind == "ellipse":
        return geo.Ellipse(cx, cy, radius, radius * draw(st.floats(0.2, 1.0)), angle)
    if kind == "rect":
        return geo.RoundedRectangle(cx, cy, radius, radius * 0.5, radius * 0.2, angle)
    if kind == "star":
        return geo.regular_star(cx, cy, radius, radius * 0.5, draw(st.integers(3, 8)), angle)
    if kind == "stroke":
        return geo.Stroke(((cx, cy), (cx + radius, cy + 3.0), (cx - 2.0, cy + radius)), draw(st.floats(0.5, 3)))
    return geo.annulus(cx, cy, radius / 2 + 0.1, radius + 0.5)


@settings(max_examples=60)
@given(st.data(), st.integers(1, 48), st.integers(1, 48))
def test_coverage_thresholded_at_one_half_is_the_mask(data, height, width):
    shape = _random_shape(data.draw)
    mask, coverage = geo.rasterize(shape, height, width)
    assert mask.dtype == bool and coverage.dtype == np.float32
    np.testing.assert_array_equal(coverage >= 0.5, mask)
    x, y = geo.pixel_centres(height, width)
    distance = np.broadcast_to(shape.signed_distance(x, y), (height, width))
    np.testing.assert_array_equal(mask, distance <= 0)  # the window never cuts the mask
    np.testing.assert_array_equal(coverage[distance <= -0.5], 1.0)
    np.testing.assert_array_equal(coverage[distance >= 0.5], 0.0)


# ----------------------------------------------------------------------------- host topology helpers


@st.composite
def _masks(draw, max_side=24):
    height, width = draw(st.integers(1, max_side)), draw(st.integers(1, max_side))
    kind = draw(st.sampled_from(["random", "empty", "full", "pixel", "sparse"]))
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    if kind == "empty":
        return np.zeros((height, width), bool)
    if kind == "full":
        return np.ones((height, width), bool)
    if kind == "pixel":
        mask = np.zeros((height, width), bool)
        mask[rng.integers(height), rng.integers(width)] = True
        return mask
    return rng.random((height, width)) < (0.5 if kind == "random" else 0.15)


@given(_masks())
def test_count_components_and_holes_match_scipy(mask):
    assert topo.count_components(mask, 8) == _components(mask, 8)
    assert topo.count_components(mask, 4) == _components(mask, 4)
    padded = np.pad(mask, 1)
    background = ndimage.label(~padded)[0]
    touching = set(np.unique(np.concatenate([background[0], background[-1], background[:, 0], background[:, -1]])))
    assert topo.count_holes(mask) == len(set(np.unique(background)) - touching - {0})


@given(_masks(), st.integers(0, 4))
def test_dilate_boundary_and_border_match_scipy(mask, radius):
    expected = ndimage.binary_dilation(mask, np.ones((2 * radius + 1,) * 2, bool)) if radius else mask
    np.testing.assert_array_equal(topo.dilate(mask, radius), expected)
    np.testing.assert_array_equal(topo.inner_boundary(mask), mask & ~ndimage.binary_erosion(mask, border_value=0))
    frame = np.ones_like(mask)
    frame[1:-1, 1:-1] = False
    assert topo.touches_border(mask) == bool((mask & frame).any())


# ----------------------------------------------------------------------------- family contracts


@pytest.mark.parametrize("family", fam.FAMILIES)
def test_every_shape_kind_of_every_family_is_drawn(family):
    kinds = {_geometry(family, 0, i, (64, 64)).kind for i in range(40)}
    assert kinds == set(fam.FAMILY_SHAPES[family])
    if family == "multi_part":
        parts = {_geometry(family, 0, i, (64, 64)).num_parts for i in range(40)}
        assert parts == {2, 3, 4}


def _check_contract(geometry, family, size):
    mask = geometry.mask
    height, width = size
    assert mask.shape == size and mask.dtype == bool
    area = mask.sum()
    assert area >= fam.MIN_OBJECT_PIXELS
    assert _components(mask) == geometry.num_parts
    assert geometry.num_parts == (geometry.num_parts if family == "multi_part" else 1)
    assert _holes(mask) == (1 if family == "ring" else 0)
    on_border = bool(mask[0].any() or mask[-1].any() or mask[:, 0].any() or mask[:, -1].any())
    if family == "border":
        assert on_border
    else:
        assert not mask[:2].any() and not mask[-2:].any() and not mask[:, :2].any() and not mask[:, -2:].any()
    if family == "small":
        assert area < 0.02 * height * width
    elif family != "thin":
        assert area >= 0.02 * height * width
    if family == "thin":
        assert 2.0 <= geometry.stroke_width <= 6.0
        # the widest inscribed disc is at most half the stroke width (+1 px of pixel-centre sampling)
        assert ndimage.distance_transform_edt(np.pad(mask, 1)).max() <= geometry.stroke_width / 2 + 1.0
        rows, cols = np.nonzero(mask)
        assert max(np.ptp(rows), np.ptp(cols)) + 1 >= 2.5 * geometry.stroke_width
    if family == "multi_part":
        assert 2 <= geometry.num_parts <= 4
        labels, count = ndimage.label(mask, EIGHT)
        for k in range(1, count + 1):  # parts keep a Chebyshev gap of PART_GAP px
            grown = ndimage.binary_dilation(labels == k, np.ones((2 * fam.PART_GAP + 1,) * 2, bool))
            assert not (grown & (labels > 0) & (labels != k)).any()
    if family == "convex" and min(size) >= 64:
        # pixel staircases along slanted edges cost about a pixel per boundary step, so small
        # rotated shapes fill less of their corner hull (0.83 at ~100 px observed)
        assert _hull_fill_ratio(mask) > min(0.9, 1.0 - 3.0 / np.sqrt(area))
    if family == "non_convex" and min(size) >= 64:
        assert _hull_fill_ratio(mask) < 0.85


@settings(max_examples=30)
@given(st.sampled_from(fam.FAMILIES), st.integers(0, 2**32), st.integers(0, 10**6), st.sampled_from(SMALL_SIZES))
def test_family_contracts_hold_for_any_seed_index_and_size(family, seed, index, size):
    _check_contract(_geometry(family, seed, index, size), family, size)


@pytest.mark.parametrize("family", fam.FAMILIES)
def test_family_contracts_on_a_fixed_sweep(family):
    for index in range(12):
        size = [(64, 64), (96, 128), (128, 96), (256, 256)][index % 4]
        _check_contract(_geometry(family, 7, index, size), family, size)


def test_contract_violation_names_the_broken_rule():
    ring = geo.shape_mask(geo.annulus(32.0, 32.0, 6.0, 12.0), 64, 64)
    assert fam.contract_violation("ring", ring) is None
    assert "holes" in fam.contract_violation("convex", ring)
    assert "components" in fam.contract_violation("multi_part", ring, num_parts=2)
    assert "touch the border" in fam.contract_violation("border", ring)
    assert ">=" in fam.contract_violation("small", ring)
    assert "area" in fam.contract_violation("convex", np.zeros((64, 64), bool))


def test_draw_object_rejects_unknown_family_and_reports_impossible_sizes():
    with pytest.raises(ValueError, match="family"):
        fam.draw_object(np.random.default_rng(0), "blob", 64, 64)
    for family in ("convex", "thin", "ring", "non_convex", "small"):
        with pytest.raises(fam.GenerationError, match=family):
            fam.draw_object(np.random.default_rng(0), family, 5, 5)


# ----------------------------------------------------------------------------- samples: determinism, plan


def test_same_seed_and_index_give_identical_bytes():
    first = syn.synthetic_sample(5, seed=3, sizes=syn.DEMO_SIZES)
    again = syn.synthetic_sample(5, seed=3, sizes=syn.DEMO_SIZES)
    assert first.image.tobytes() == again.image.tobytes()
    assert first.mask.tobytes() == again.mask.tobytes()
    assert first.distractor_mask.tobytes() == again.distractor_mask.tobytes()
    assert syn.sample_record(first) == syn.sample_record(again)


def test_a_sample_does_not_depend_on_the_batch_it_is_drawn_in():
    batch = syn.synthetic_samples(4, seed=1, sizes=syn.DEMO_SIZES, start=9)
    for offset, sample in enumerate(batch):
        alone = syn.synthetic_sample(9 + offset, seed=1, sizes=syn.DEMO_SIZES)
        assert sample.index == 9 + offset
        assert alone.image.tobytes() == sample.image.tobytes() and alone.mask.tobytes() == sample.mask.tobytes()


def test_different_index_or_seed_gives_different_samples():
    images = {syn.render_sample(0, i, "convex", "easy", 64).image.tobytes() for i in range(6)}
    assert len(images) == 6
    masks = {syn.render_sample(s, 0, "convex", "easy", 64).mask.tobytes() for s in range(6)}
    assert len(masks) == 6


def test_geometry_is_matched_across_difficulties():
    ladder = [syn.render_sample(2, 11, "non_convex", level, (96, 128)) for level in syn.DIFFICULTIES]
    for sample in ladder[1:]:
        np.testing.assert_array_equal(sample.mask, ladder[0].mask)
    assert len({s.image.tobytes() for s in ladder}) == 3


def test_plan_cycles_families_then_difficulties():
    config = syn.SyntheticConfig(seed=0, sizes=syn.TRAIN_SIZES)
    count = len(syn.FAMILIES) * len(syn.DIFFICULTIES)
    pairs = [config.plan(i)[:2] for i in range(count)]
    assert len(set(pairs)) == count
    assert [p[0] for p in pairs[:len(syn.FAMILIES)]] == list(syn.FAMILIES)
    assert {config.plan(i)[2] for i in range(200)} == set(syn.TRAIN_SIZES)
    assert config.plan(40) == syn.SyntheticConfig(seed=0).plan(40)


@settings(max_examples=25)
@given(st.integers(0, 2**32), st.integers(0, 10**7), st.sampled_from(SMALL_SIZES + [(128, 96)]))
def test_any_sample_is_well_formed_and_reproducible(seed, index, size):
    config = syn.SyntheticConfig(seed, [size])
    sample = config.sample(index)
    family, difficulty, planned = config.plan(index)
    assert (sample.family, sample.difficulty, sample.size) == (family, difficulty, size)
    assert sample.image.dtype == np.uint8 and sample.image.shape == (*size, 3)
    assert sample.mask.dtype == bool and sample.mask.shape == size
    assert sample.kind in fam.FAMILY_SHAPES[family]
    assert _components(sample.mask) == sample.num_parts
    assert not (ndimage.binary_dilation(sample.mask, EIGHT, iterations=DISTRACTOR_GAP) & sample.distractor_mask).any()
    assert sample.image.tobytes() == syn.render_sample(seed, index, family, difficulty, size).image.tobytes()


def test_distractors_keep_off_the_mask_and_follow_the_level():
    samples = syn.synthetic_samples(42, seed=4, sizes=[(64, 64), (96, 128)])
    by_level = {level: [s for s in samples if s.difficulty == level] for level in syn.DIFFICULTIES}
    assert all(s.num_distractors == 0 and not s.distractor_mask.any() for s in by_level["easy"])
    assert sum(s.num_distractors > 0 for s in by_level["hard"]) >= 0.8 * len(by_level["hard"])
    for sample in samples:
        # the object's mask and its 1-px anti-aliased fringe are untouched by distractor paint
        grown = ndimage.binary_dilation(sample.mask, EIGHT, iterations=DISTRACTOR_GAP)
        assert not (grown & sample.distractor_mask).any()
        assert sample.num_distractors <= syn.LEVELS[sample.difficulty].distractors[1]


def test_easy_object_pixels_are_painted_exactly_from_the_mask():
    # easy + flat background + flat object: pixels are the background or object colour except on the 1-px fringe
    sample = next(s for s in (syn.render_sample(0, i, "convex", "easy", 64) for i in range(40))
                  if s.background == "flat")
    image = sample.image.reshape(-1, 3)
    fringe = ndimage.binary_dilation(sample.mask, EIGHT) & ~ndimage.binary_erosion(sample.mask, EIGHT)
    inside = sample.mask.ravel() & ~fringe.ravel()
    outside = ~sample.mask.ravel() & ~fringe.ravel()
    assert len(np.unique(image[inside], axis=0)) == 1 and len(np.unique(image[outside], axis=0)) == 1
    assert abs(syn.measured_contrast(sample) - sample.contrast) < 0.01


def test_contrast_is_graded_by_difficulty():
    medians = {}
    for level in syn.DIFFICULTIES:
        samples = [syn.render_sample(5, i, family, level, (64, 64)) for i in range(3) for family in ("convex", "ring")]
        low, high = syn.LEVELS[level].contrast
        assert all(low <= s.contrast <= high for s in samples)
        medians[level] = np.median([syn.measured_contrast(s) for s in samples])
    assert medians["easy"] > medians["medium"] > medians["hard"] > 0.02


def test_contrast_can_be_pinned():
    for target in (0.05, 0.2, 0.6):
        sample = syn.render_sample(3, 1, "convex", "easy", 64, contrast=target)
        assert sample.contrast == target
        assert abs(syn.measured_contrast(sample) - target) < 0.06  # easy: gradient swing <= 0.05
    pinned = syn.render_sample(3, 1, "ring", "hard", 64, contrast=0.3)
    free = syn.render_sample(3, 1, "ring", "hard", 64)
    assert pinned.background == free.background and pinned.num_distractors == free.num_distractors
    with pytest.raises(ValueError, match="contrast"):
        syn.render_sample(3, 1, "ring", "hard", 64, contrast=1.5)


def test_backgrounds_and_appearances_of_each_level_all_occur():
    seen = {level: (set(), set()) for level in syn.DIFFICULTIES}
    for i in range(60):
        for level in syn.DIFFICULTIES:
            sample = syn.render_sample(1, i, "small", level, 32)
            seen[level][0].add(sample.background)
            seen[level][1].add(sample.appearance)
    for level, (backgrounds, appearances) in seen.items():
        assert backgrounds == set(syn.LEVELS[level].backgrounds)
        assert appearances == set(syn.LEVELS[level].appearances)


# ----------------------------------------------------------------------------- instances, refs, folder, box


def test_instances_and_refs_agree_and_validate():
    instances = syn.synthetic_instances(9, seed=2, sizes=syn.DEMO_SIZES, start=3, dataset="syn")
    refs = syn.synthetic_instance_refs(9, seed=2, sizes=syn.DEMO_SIZES, start=3, dataset="syn")
    assert len({i.key for i in instances}) == 9
    assert {f for f in syn.FAMILIES} <= {i.id.split("_", 1)[1].rsplit("_", 1)[0] for i in instances}
    for instance, ref in zip(instances, refs):
        validate_instance(instance)
        assert set(np.unique(instance.gt)) <= {0, 1} and instance.gt.dtype == np.int8 and instance.gt.any()
        loaded = ref.load()
        assert ref.key == instance.key and ref.size == instance.size
        assert loaded.image.tobytes() == instance.image.tobytes() and loaded.gt.tobytes() == instance.gt.tobytes()
    assert len({r.fingerprint for r in refs}) == 9


def test_written_folder_reads_back_through_the_folder_kind(tmp_path):
    root = syn.write_synthetic_folder(tmp_path / "syn", 8, seed=6, sizes=syn.DEMO_SIZES)
    expected = {i.id: i for i in syn.synthetic_instances(8, seed=6, sizes=syn.DEMO_SIZES)}
    refs = load_dataset("folder", root=root)
    assert sorted(r.id for r in refs) == sorted(expected)
    for ref in refs:
        loaded = ref.load()
        np.testing.assert_array_equal(loaded.image, expected[ref.id].image)
        np.testing.assert_array_equal(loaded.gt, expected[ref.id].gt)
    manifest = json.loads((root / "synthetic.json").read_text())
    assert manifest["num"] == 8 and manifest["version"] == syn.GENERATOR_VERSION
    assert [r["id"] for r in manifest["samples"]] == sorted(expected)
    before = {p.name: p.read_bytes() for p in (root / "images").iterdir()}
    syn.write_synthetic_folder(root, 8, seed=6, sizes=syn.DEMO_SIZES)
    assert before == {p.name: p.read_bytes() for p in (root / "images").iterdir()}
    with pytest.raises(ValueError, match="other file"):
        syn.write_synthetic_folder(root, 3, seed=6, sizes=syn.DEMO_SIZES)


@pytest.mark.parametrize("shape", [(16, 16), (7, 13), (1, 5)])
def test_gt_tight_box_equals_the_jax_tight_box(shape):
    rng = np.random.default_rng(sum(shape))
    masks = [np.zeros(shape, bool), np.ones(shape, bool)]
    for density in (0.02, 0.1, 0.5):
        masks += list(rng.random((8, *shape)) < density)
    for _ in range(6):
        one = np.zeros(shape, bool)
        one[rng.integers(shape[0]), rng.integers(shape[1])] = True
        masks.append(one)
    batch = np.stack(masks)
    expected = np.asarray(tight_box(batch))  # one call over the batch: one compilation
    for mask, box in zip(masks, expected):
        np.testing.assert_array_equal(syn.gt_tight_box(mask), box)
        np.testing.assert_array_equal(syn.gt_tight_box(mask.astype(np.int8) - (~mask)), box)


def test_sample_box_is_the_tight_box_of_its_mask():
    for sample in syn.synthetic_samples(7, seed=0, sizes=[(48, 64)]):
        x1, y1, x2, y2 = sample.box
        rows, cols = np.nonzero(sample.mask)
        assert (x1, y1, x2, y2) == (cols.min(), rows.min(), cols.max(), rows.max())
        assert sample.box.dtype == np.int32
    assert tuple(syn.gt_tight_box(np.zeros((4, 5), bool))) == (0, 0, 1, 1)


# ----------------------------------------------------------------------------- preview, errors


def test_preview_grid_tiles_images_and_outlines():
    samples = syn.synthetic_samples(5, seed=0, sizes=[(48, 64), (64, 64)])
    sheet = syn.preview_grid(samples, columns=3, pad=2)
    assert sheet.dtype == np.uint8 and sheet.shape == (2 * (64 + 2) + 2, 3 * (64 + 2) + 2, 3)
    first = samples[0]
    tile = sheet[2:2 + first.size[0], 2:2 + first.size[1]]
    outline = first.mask & ~ndimage.binary_erosion(first.mask, border_value=0)
    assert (tile[outline] == syn.preview.MASK_OUTLINE_RGB).all()
    plain = ~outline & ~first.distractor_mask
    np.testing.assert_array_equal(tile[plain], first.image[plain])
    instance = first.to_instance()
    from_instance = syn.preview_grid([instance, (first.image, first.mask)], columns=2, distractor_rgb=None)
    assert from_instance.shape == (first.size[0] + 4, 2 * (first.size[1] + 2) + 2, 3)


@pytest.mark.parametrize("call, match", [
    (lambda: syn.render_sample(0, 0, "blob", "easy", 64), "family"),
    (lambda: syn.render_sample(0, 0, "convex", "extreme", 64), "difficulty"),
    (lambda: syn.render_sample(0, 0, "convex", "easy", 16), "size"),
    (lambda: syn.render_sample(0, 0, "convex", "easy", (64, 64, 3)), "size"),
    (lambda: syn.render_sample(-1, 0, "convex", "easy", 64), "seed"),
    (lambda: syn.render_sample(0, -2, "convex", "easy", 64), "index"),
    (lambda: syn.synthetic_samples(2, families=()), "families"),
    (lambda: syn.synthetic_samples(2, difficulties=["easy", "easy"]), "difficulties"),
    (lambda: syn.synthetic_samples(2, sizes=[]), "sizes"),
    (lambda: syn.synthetic_samples(-1), "num"),
    (lambda: syn.SyntheticConfig(seed=0).plan(-1), "index"),
    (lambda: syn.preview_grid([]), "items"),
    (lambda: syn.preview_grid([np.zeros((4, 4))]), "items"),
    (lambda: syn.preview_grid(syn.synthetic_samples(1, sizes=[32]), columns=0), "columns"),
])
def test_bad_arguments_raise_value_errors_naming_them(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_int_sizes_are_squares():
    config = syn.SyntheticConfig(sizes=(64, 32))
    assert config.sizes == ((64, 64), (32, 32))
    assert syn.SyntheticConfig(sizes=48).sizes == ((48, 48),)
