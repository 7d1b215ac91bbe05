"""Tests for jaxseg_robust.ops.render (hard disk maps, soft differentiable disks).

Reference quantities are restated in numpy float64 inside this file:
  * hard disks: an explicit per-pixel loop over clicks;
  * the ramp surrogate: its defining formula;
  * exact per-pixel disk area: a 1-D midpoint quadrature of the clipped
    vertical chord length over each pixel column (error ~1e-5 per pixel).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, strategies as st

from jaxseg_robust.ops import render
from lowered_loops import while_loops

RADIUS = 5.0

# Jitted entry points (static grid configuration): eager dispatch of the many
# small ops would recompile per shape and dominate the test time.
soft_disk = jax.jit(render.render_soft_disk, static_argnames=("shape", "coverage", "samples_per_axis"))
hard_maps = jax.jit(render.hard_disk_click_maps, static_argnames=("shape",))
soft_maps = jax.jit(render.render_soft_click_maps, static_argnames=("shape", "coverage", "samples_per_axis"))
click_disk = jax.jit(render.render_click_disk, static_argnames=("shape",))


# ----------------------------------------------------------------------------- references


def numpy_hard_disks(points, labels, rows, cols, radius):
    out = np.zeros((2, rows, cols), np.float32)
    r2 = np.float32(radius) ** 2
    for (x, y), label in zip(np.asarray(points, np.float32), np.asarray(labels)):
        if label < 0:
            continue
        channel = 0 if label == 1 else 1
        for r in range(rows):
            for c in range(cols):
                if (np.float32(r) - y) ** 2 + (np.float32(c) - x) ** 2 <= r2:
                    out[channel, r, c] = 1.0
    return out


def numpy_ramp(center, rows, cols, radius, n=1):
    cov = np.zeros((rows, cols))
    for a in range(n):
        for b in range(n):
            sx = np.arange(cols)[None, :] + (a + 0.5) / n
            sy = np.arange(rows)[:, None] + (b + 0.5) / n
            d = np.hypot(sx - center[0], sy - center[1])
            cov += np.clip(n * (radius - d) + 0.5, 0, 1)
    return cov / n**2


def numpy_exact_area(center, rows, cols, radius, samples_per_pixel=2000):
    """Area of disk ∩ pixel via midpoint quadrature of the clipped vertical chord."""
    cx, cy = float(center[0]), float(center[1])
    u = (np.arange(cols * samples_per_pixel) + 0.5) / samples_per_pixel  # abscissae
    half = np.sqrt(np.maximum(radius**2 - (u - cx) ** 2, 0.0))
    low, high = cy - half, cy + half  # chord [low, high] at each u
    y0 = np.arange(rows)[:, None]
    length = np.clip(np.minimum(y0 + 1, high[None, :]) - np.maximum(y0, low[None, :]), 0, None)
    return length.reshape(rows, cols, samples_per_pixel).mean(axis=-1)


# ----------------------------------------------------------------------------- hard disks


@given(
    grid=st.sampled_from([(1, 1), (1, 9), (7, 1), (5, 3), (9, 14), (14, 14)]),
    data=st.data(),
    radius=st.sampled_from([0.5, 1.0, 2.5, 5.0]),
)
def test_hard_disks_match_numpy_loop(grid, data, radius):
    rows, cols = grid
    n = 5  # fixed slot count; unused slots get label -1 (padding)
    quarter = st.integers(-12, 4 * 16).map(lambda v: v / 4)
    points = np.array([[data.draw(quarter), data.draw(quarter)] for _ in range(n)], np.float32)
    labels = np.array(data.draw(st.lists(st.sampled_from([-1, 0, 1]), min_size=n, max_size=n)), np.int32)
    got = hard_maps(points, labels, (rows, cols), radius)
    np.testing.assert_array_equal(np.asarray(got), numpy_hard_disks(points, labels, rows, cols, radius))


def test_hard_disks_ignore_padding_and_split_signs():
    points = np.array([[3, 4], [10, 2], [-1, -1], [3, 4]], np.float32)
    labels = np.array([1, 0, -1, -1], np.int32)
    maps = np.asarray(render.hard_disk_click_maps(points, labels, (9, 13), 2.0))
    assert maps.shape == (2, 9, 13) and maps.dtype == np.float32
    assert maps[0, 4, 3] == 1 and maps[1, 4, 3] == 0
    assert maps[1, 2, 10] == 1 and maps[0, 2, 10] == 0
    # radius 2 disk on the integer lattice: 13 pixels, fully inside the grid.
    assert maps[0].sum() == 13 and maps[1].sum() == 13
    assert maps[0, 0, 0] == 0  # the padding click at (-1, -1) draws nothing


def test_hard_disks_under_jit_and_vmap():
    rng = np.random.default_rng(0)
    points = rng.integers(-2, 20, size=(3, 4, 2)).astype(np.float32)
    labels = rng.integers(-1, 2, size=(3, 4)).astype(np.int32)
    fn = jax.jit(jax.vmap(lambda p, l: render.hard_disk_click_maps(p, l, (11, 17), RADIUS)))
    got = np.asarray(fn(points, labels))
    for b in range(3):
        np.testing.assert_array_equal(got[b], numpy_hard_disks(points[b], labels[b], 11, 17, RADIUS))


def test_hard_disks_reject_bad_input():
    with pytest.raises(ValueError, match="points"):
        render.hard_disk_click_maps(np.zeros((3,)), np.zeros((3,)), (4, 4))
    with pytest.raises(ValueError, match="labels"):
        render.hard_disk_click_maps(np.zeros((3, 2)), np.zeros((2,)), (4, 4))
    with pytest.raises(ValueError, match="shape"):
        render.hard_disk_click_maps(np.zeros((3, 2)), np.zeros((3,)), (0, 4))


# ----------------------------------------------------------------------------- soft disks: values


centres = st.tuples(st.floats(-4.0, 22.0), st.floats(-4.0, 17.0))


@given(center=centres, n=st.sampled_from([1, 2, 3]), radius=st.sampled_from([1.0, 2.5, 5.0]))
def test_ramp_matches_its_formula(center, n, radius):
    got = soft_disk(jnp.array(center, jnp.float32), (13, 18), radius, coverage="ramp", samples_per_axis=n)
    np.testing.assert_allclose(np.asarray(got), numpy_ramp(center, 13, 18, radius, n), atol=2e-5)


@given(center=centres, radius=st.sampled_from([0.7, 1.5, 3.0, 5.0, 6.3]))
def test_area_matches_quadrature(center, radius):
    # Tolerance: f32 inclusion-exclusion of quadrant areas of size <= pi R^2
    # (~1e-5 rounding) plus the quadrature error of the reference (~1e-5).
    got = soft_disk(jnp.array(center, jnp.float32), (13, 18), radius, coverage="area")
    np.testing.assert_allclose(np.asarray(got), numpy_exact_area(center, 13, 18, radius), atol=1e-4)


@pytest.mark.parametrize("center", [(9.0, 8.0), (9.5, 8.5), (10.31, 7.77), (8.123, 9.9)])
def test_area_mass_is_pi_r_squared_inside_the_canvas(center):
    disk = soft_disk(jnp.array(center), (17, 20), RADIUS)
    assert float(disk.sum()) == pytest.approx(math.pi * RADIUS**2, rel=1e-5)
    assert float(disk.min()) >= 0.0 and float(disk.max()) <= 1.0


def test_coverage_is_one_inside_and_zero_outside():
    for coverage in ("area", "ramp"):
        # "area" carries f32 inclusion-exclusion rounding (measured <= 8e-6).
        disk = np.asarray(soft_disk(jnp.array([10.0, 10.0]), (21, 21), RADIUS, coverage=coverage))
        jj, ii = np.meshgrid(np.arange(21) + 0.5, np.arange(21) + 0.5)
        d = np.hypot(jj - 10, ii - 10)
        assert np.all(np.abs(disk[d < RADIUS - 1.0] - 1.0) < 3e-5), coverage
        assert np.all(np.abs(disk[d > RADIUS + 1.0]) < 3e-5), coverage
        assert np.all(disk[(np.abs(jj - 10) > RADIUS + 1) | (np.abs(ii - 10) > RADIUS + 1)] == 0.0), coverage


def test_ramp_at_half_threshold_equals_hard_disk_for_integer_clicks():
    # Centre (x + 0.5, y + 0.5) vs pixel centres (c + 0.5, r + 0.5): cov >= 0.5 iff d <= R.
    rows, cols = 15, 19
    # x <= cols - 2 and y <= rows - 2 (no clamping); same-sign disks do not touch.
    points = np.array([[4, 6], [16, 3], [15, 12], [3, 13]], np.float32)
    labels = np.array([1, 0, 1, 0], np.int32)
    soft = soft_maps(points, labels, (rows, cols), RADIUS, coverage="ramp")
    hard = hard_maps(points, labels, (rows, cols), RADIUS)
    np.testing.assert_array_equal(np.asarray(soft) >= 0.5, np.asarray(hard) > 0)


# ----------------------------------------------------------------------------- soft disks: gradients


@functools.partial(jax.jit, static_argnames=("coverage", "n"))
def _weighted_sum_grad_jit(center, weight, coverage, n):
    fn = lambda c: jnp.sum(render.render_soft_disk(c, weight.shape, RADIUS, coverage=coverage, samples_per_axis=n)
                           * weight)
    return jax.grad(fn)(center)


def _weighted_sum_grad(center, weight, coverage, n=1):
    return np.asarray(_weighted_sum_grad_jit(jnp.asarray(center, jnp.float32), jnp.asarray(weight), coverage, n))


def _smooth_weight(rng, shape=(24, 30)):
    jj, ii = np.meshgrid(np.arange(shape[1]) + 0.5, np.arange(shape[0]) + 0.5)
    a = rng.normal(size=3)
    return (1 + 0.1 * (a[0] * jj + a[1] * ii) + 0.003 * a[2] * (jj - 15) ** 2).astype(np.float32)


def test_area_gradient_matches_finite_differences_of_exact_area():
    # Reference: central differences (h = 0.05) of sum(area * f) with the
    # float64 quadrature area (truncation O(h^2), quadrature noise / h).
    # Measured relative error 0.006 %..0.04 %; tolerance 0.2 %.
    rng = np.random.default_rng(1)
    for _ in range(4):
        center = np.array([rng.uniform(8, 22), rng.uniform(7, 17)])
        weight = _smooth_weight(rng)
        h = 0.05
        fd = np.array([
            ((numpy_exact_area(center + h * e, 24, 30, RADIUS) - numpy_exact_area(center - h * e, 24, 30, RADIUS))
             * weight).sum() / (2 * h)
            for e in np.eye(2)
        ])
        got = _weighted_sum_grad(center, weight, "area")
        assert np.linalg.norm(got - fd) <= 2e-3 * np.linalg.norm(fd), (got, fd)


def test_ramp_gradient_has_the_sign_and_rough_scale_of_the_area_gradient():
    # The ramp surrogate is aliased (module docstring): per position its
    # gradient of a smooth weighted sum deviates from the exact-area gradient
    # by up to 55 % (these seeds: relative error 2..55 %, cosine >= 0.915,
    # norm ratio 0.87..1.29), yet it points the same way. Bounds: cosine >=
    # 0.85 and norm ratio in [0.7, 1.5].
    rng = np.random.default_rng(2)
    for _ in range(6):
        center = np.array([rng.uniform(8, 22), rng.uniform(7, 17)])
        weight = _smooth_weight(rng)
        exact = _weighted_sum_grad(center, weight, "area")
        for n in (1, 2):
            ramp = _weighted_sum_grad(center, weight, "ramp", n)
            cosine = ramp @ exact / (np.linalg.norm(ramp) * np.linalg.norm(exact))
            assert cosine >= 0.85, (n, ramp, exact)
            assert 0.7 <= np.linalg.norm(ramp) / np.linalg.norm(exact) <= 1.5, (n, ramp, exact)


def test_linear_ramp_weight_gives_the_analytic_gradient():
    # For f(p) = a px + b py and a disk inside the canvas, d/dc sum(cov f) =
    # (a, b) * mass in the continuum (mass = pi R^2 for "area",
    # ~pi (R^2 + 1/(12 n^2)) for "ramp"). On the pixel grid f is sampled at
    # pixel centres, which aliases the gradient per position; averaged over an
    # 8x8 grid of sub-pixel centre positions the aliasing cancels. Measured
    # mean deviation: area -0.15 %, ramp n=1 +0.5 %; tolerance 1 %.
    # Per position (area): within 4 % (measured 3.3 %).
    shape = (24, 30)
    jj, ii = np.meshgrid(np.arange(shape[1]) + 0.5, np.arange(shape[0]) + 0.5)
    a, b = 0.7, -0.4
    weight = jnp.asarray(a * jj + b * ii, jnp.float32)
    offsets = jnp.array([(14 + i / 8, 12 + j / 8) for i in range(8) for j in range(8)], jnp.float32)
    for coverage, n, mass in [("area", 1, math.pi * RADIUS**2),
                              ("ramp", 1, math.pi * (RADIUS**2 + 1 / 12)),
                              ("ramp", 2, math.pi * (RADIUS**2 + 1 / 48))]:
        grad_fn = jax.jit(jax.vmap(jax.grad(
            lambda c: jnp.sum(render.render_soft_disk(c, shape, RADIUS, coverage=coverage, samples_per_axis=n)
                              * weight))))
        grads = np.asarray(grad_fn(offsets))
        np.testing.assert_allclose(grads.mean(axis=0), [a * mass, b * mass], rtol=1e-2)
        if coverage == "area":
            np.testing.assert_allclose(grads, np.broadcast_to([a * mass, b * mass], grads.shape), rtol=4e-2)


def test_area_gradient_of_a_constant_weight_vanishes_inside_the_canvas():
    got = _weighted_sum_grad(np.array([13.37, 11.2]), np.ones((24, 30), np.float32), "area")
    np.testing.assert_allclose(got, 0.0, atol=2e-4)


def test_area_gradient_matches_its_own_finite_differences():
    # Autodiff through the custom JVP (chord lengths) vs central differences of
    # the same f32 function; f32 rounding of the values (~1e-5) / h dominates.
    rng = np.random.default_rng(3)
    weight = jnp.asarray(rng.normal(size=(24, 30)), jnp.float32)
    fn = jax.jit(lambda c: jnp.sum(render.render_soft_disk(c, (24, 30), RADIUS) * weight))
    center = jnp.array([12.3, 10.6], jnp.float32)
    got = np.asarray(jax.jit(jax.grad(fn))(center))
    h = 1e-2
    fd = np.array([(fn(center + h * e) - fn(center - h * e)) / (2 * h) for e in jnp.eye(2)])
    np.testing.assert_allclose(got, fd, rtol=1e-2, atol=2e-2)


@pytest.mark.parametrize("coverage", ["area", "ramp"])
def test_gradient_is_nonzero_exactly_near_the_boundary(coverage):
    center = jnp.array([10.3, 9.6], jnp.float32)
    jacobian_fn = jax.jit(jax.jacfwd(lambda c: render.render_soft_disk(c, (20, 21), RADIUS, coverage=coverage)))
    jac = np.asarray(jacobian_fn(center))
    magnitude = np.linalg.norm(jac, axis=-1)
    jj, ii = np.meshgrid(np.arange(21) + 0.5, np.arange(20) + 0.5)
    d = np.hypot(jj - 10.3, ii - 9.6)
    # Pixels whose centre is within 0.25 px of the circle are cut by it (area)
    # and lie inside the ramp band (ramp): their gradient is non-zero.
    assert np.all(magnitude[np.abs(d - RADIUS) < 0.25] > 0.05)
    # Pixels farther than a half diagonal from the circle are untouched.
    assert np.all(magnitude[np.abs(d - RADIUS) > 0.75] < 1e-4)
    assert np.isfinite(jac).all()


@pytest.mark.parametrize("center", [(10.5, 7.5), (10.0, 7.0), (5.0, 0.0), (0.0, 0.0)])
@pytest.mark.parametrize("coverage,n", [("area", 1), ("ramp", 1), ("ramp", 2)])
def test_gradients_finite_at_pixel_centres_and_corners(center, coverage, n):
    # A centre on a pixel centre (ramp, n = 1) or a stratum centre makes
    # |p - c| = 0, where sqrt has an infinite derivative; corners touch the
    # clamps of the quadrant-area function.
    fn = lambda c: jnp.sum(render.render_soft_disk(c, (15, 21), RADIUS, coverage=coverage, samples_per_axis=n) ** 2)
    assert np.isfinite(np.asarray(jax.jit(jax.grad(fn))(jnp.array(center, jnp.float32)))).all()


# ----------------------------------------------------------------------------- centre conventions


def test_tetris_disk_center_and_clamp_gradients():
    shape = (12, 20)
    points = jnp.array([[3.0, 4.0], [-3.0, 5.0], [19.0, 30.0], [18.5, 10.5]], jnp.float32)
    centers = render.disk_center(points, shape)
    np.testing.assert_array_equal(np.asarray(centers), [[3.5, 4.5], [0.0, 5.5], [19.0, 11.0], [19.0, 11.0]])
    jac = jax.vmap(jax.jacfwd(lambda p: render.disk_center(p, shape)))(points)
    np.testing.assert_array_equal(np.asarray(jac[0]), np.eye(2))
    np.testing.assert_array_equal(np.asarray(jac[1]), [[0, 0], [0, 1]])  # x clamped at 0
    np.testing.assert_array_equal(np.asarray(jac[2]), np.zeros((2, 2)))  # both clamped at the high bound
    np.testing.assert_array_equal(np.asarray(jac[3]), np.eye(2))  # exactly on the bound: torch.clamp passes


def test_disk_center_variants():
    point = jnp.array([1.0, 2.0])
    np.testing.assert_array_equal(
        np.asarray(render.disk_center(point, (30, 40), clamp_inset=render.BREPS_SAM_CLAMP_INSET)), [5.0, 5.0])
    np.testing.assert_array_equal(
        np.asarray(render.disk_center(jnp.array([-7.0, 99.0]), (30, 40), clamp_inset=None)), [-6.5, 99.5])
    np.testing.assert_array_equal(
        np.asarray(render.disk_center(point, (30, 40), center_offset=0.0)), [1.0, 2.0])


def test_clamped_click_has_zero_gradient():
    grad = jax.jit(jax.grad(lambda p: jnp.sum(render.render_click_disk(p, (16, 16), RADIUS) * jnp.arange(16.0))))
    assert np.all(np.asarray(grad(jnp.array([-4.0, -4.0]))) == 0.0)
    assert np.all(np.asarray(grad(jnp.array([7.2, 6.9]))) != 0.0)


# ----------------------------------------------------------------------------- click maps


def test_soft_click_maps_sum_per_sign_ignore_padding_and_clamp():
    shape = (18, 22)
    points = jnp.array([[5.0, 5.0], [7.0, 5.0], [15.0, 12.0], [2.0, 2.0]], jnp.float32)
    labels = jnp.array([1, 1, 0, -1], jnp.int32)
    maps = np.asarray(soft_maps(points, labels, shape))
    disks = [np.asarray(click_disk(p, shape)) for p in points]
    np.testing.assert_allclose(maps[0], np.clip(disks[0] + disks[1], 0, 1), atol=1e-5)
    np.testing.assert_allclose(maps[1], disks[2], atol=1e-5)
    assert maps.max() <= 1.0


def test_soft_click_maps_gradient_flows_only_to_unstopped_points():
    shape = (18, 22)
    fixed = jnp.array([[5.0, 5.0], [15.0, 12.0]], jnp.float32)
    labels = jnp.array([1, 0, 1], jnp.int32)
    weight = jnp.asarray(np.random.default_rng(0).normal(size=(2, *shape)), jnp.float32)

    def loss(all_points):
        points = jnp.concatenate([jax.lax.stop_gradient(all_points[:2]), all_points[2:]])
        return jnp.sum(render.render_soft_click_maps(points, labels, shape) * weight)

    grad = np.asarray(jax.jit(jax.grad(loss))(jnp.concatenate([fixed, jnp.array([[10.3, 8.7]])])))
    assert np.all(grad[:2] == 0.0) and np.all(grad[2] != 0.0)


def test_soft_rendering_under_jit_and_vmap():
    rng = np.random.default_rng(4)
    centres_ = jnp.asarray(rng.uniform(-2, 20, size=(5, 2)), jnp.float32)
    batched = jax.jit(jax.vmap(lambda c: render.render_soft_disk(c, (14, 19), 3.0)))(centres_)
    for k in range(5):  # XLA fuses differently with and without vmap: f32 rounding only
        np.testing.assert_allclose(np.asarray(batched[k]), np.asarray(soft_disk(centres_[k], (14, 19), 3.0)), atol=1e-5)
    points = jnp.asarray(rng.uniform(0, 14, size=(3, 4, 2)), jnp.float32)
    labels = jnp.asarray(rng.integers(-1, 2, size=(3, 4)), jnp.int32)
    maps_fn = jax.jit(jax.vmap(lambda p, l: render.render_soft_click_maps(p, l, (14, 19), coverage="ramp",
                                                                          samples_per_axis=2)))
    maps = maps_fn(points, labels)
    assert maps.shape == (3, 2, 14, 19)
    np.testing.assert_allclose(
        np.asarray(maps[1]),
        np.asarray(soft_maps(points[1], labels[1], (14, 19), coverage="ramp", samples_per_axis=2)), atol=1e-5)
    # a traced radius is accepted (soft_disk traces it)
    np.testing.assert_allclose(np.asarray(soft_disk(jnp.array([7.0, 7.0]), (14, 19), jnp.float32(3.0))),
                               np.asarray(soft_disk(jnp.array([7.0, 7.0]), (14, 19), 3.0)))


def test_renderers_lower_without_loops_for_cuda():
    # Closed forms per pixel: the same loop-free program on accelerators, gradient included.
    points = jnp.zeros((3, 4, 2), jnp.float32)
    labels = jnp.zeros((3, 4), jnp.int32)

    def soft(coverage, n):
        def loss(p, lab):
            return jnp.sum(render.render_soft_click_maps(p, lab, (64, 48), coverage=coverage, samples_per_axis=n))
        return jax.vmap(jax.value_and_grad(loss))

    functions = {"hard": jax.vmap(lambda p, lab: render.hard_disk_click_maps(p, lab, (64, 48))),
                 "area": soft("area", 1), "ramp": soft("ramp", 2)}
    for name, fn in functions.items():
        assert while_loops(fn, points, labels, platform="cuda") == 0, name


def test_soft_rendering_rejects_bad_input():
    with pytest.raises(ValueError, match="coverage"):
        render.render_soft_disk(jnp.zeros(2), (4, 4), coverage="exact")
    with pytest.raises(ValueError, match="samples_per_axis"):
        render.render_soft_disk(jnp.zeros(2), (4, 4), coverage="area", samples_per_axis=2)
    with pytest.raises(ValueError, match="samples_per_axis"):
        render.render_soft_disk(jnp.zeros(2), (4, 4), coverage="ramp", samples_per_axis=0)
    with pytest.raises(ValueError, match="radius"):
        render.render_soft_disk(jnp.zeros(2), (4, 4), radius=0.0)
    with pytest.raises(ValueError, match="center"):
        render.render_soft_disk(jnp.zeros((3, 2)), (4, 4))
    with pytest.raises(ValueError, match="shape"):
        render.render_soft_disk(jnp.zeros(2), (4,))
    with pytest.raises(ValueError, match="points"):
        render.disk_center(jnp.zeros(3), (4, 4))
