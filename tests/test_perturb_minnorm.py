"""Building blocks of ALMA prox and PDPGD (spec §4.2-§4.3) against NumPy statements and brute force."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from jaxseg_robust.attacks.perturb.alma_prox import (
    decay_counts,
    kth_largest_mask,
    penalty,
    penalty_derivative,
    prox_linf_box,
)
from jaxseg_robust.attacks.perturb.pdpgd import project_l1_ball, prox_linf, softmax_plus_one

PROX = jax.jit(prox_linf_box)
L1_PROJECTIONS = {method: jax.jit(functools.partial(project_l1_ball, method=method)) for method in ("threshold", "sort")}


@given(st.integers(0, 2**31 - 1), st.floats(1e-5, 0.5), st.booleans())
def test_ternary_prox_reaches_the_brute_force_minimum(seed, step, uniform_metric):
    rng = np.random.default_rng(seed)
    x = rng.random((2, 3, 4, 3)).astype(np.float32)
    delta = (rng.normal(size=x.shape) * 0.2).astype(np.float32)
    metric = np.ones_like(x) if uniform_metric else rng.uniform(0.1, 3.0, x.shape).astype(np.float32)
    steps = np.array([step, step / 3], np.float32)
    result = np.asarray(PROX(delta, -x, 1 - x, metric, steps))
    projected = np.clip(delta, -x, 1 - x).astype(np.float64)
    for b in range(2):
        def phi(t):  # t: [T] -> [T]
            clipped = np.clip(projected[b].ravel()[None], -t[:, None], t[:, None])
            return np.sum(metric[b].ravel() * (clipped - delta[b].ravel()) ** 2, axis=1) + 2 * steps[b] * t
        best = phi(np.linspace(0.0, np.abs(projected[b]).max(), 20001)).min()
        t_ours = np.abs(result[b]).max()
        assert phi(np.array([t_ours]))[0] <= best + 1e-6 * (1 + abs(best))
        assert np.all(result[b] >= -x[b] - 1e-7) and np.all(result[b] <= 1 - x[b] + 1e-7)


def test_penalty_derivative_quirk_and_analytic_form():
    y = jnp.linspace(-3.0, 3.0, 61)
    rho = jnp.full_like(y, 0.7)
    mu = jnp.full_like(y, 0.4)
    analytic = jax.vmap(jax.grad(penalty))(y, rho, mu)
    np.testing.assert_allclose(np.asarray(penalty_derivative(y, rho, mu, reference_quirks=False)),
                               np.asarray(analytic), rtol=1e-5, atol=1e-6)
    quirky = np.asarray(penalty_derivative(y, rho, mu, reference_quirks=True))
    upper = np.asarray(y) >= 0
    np.testing.assert_allclose(quirky[upper], np.asarray(analytic)[upper] + 0.4 * (np.asarray(y)[upper] - 1.0),
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(quirky[~upper], np.asarray(analytic)[~upper], rtol=1e-5)
    assert float(penalty_derivative(0.0, 0.7, 0.4)) == 0.0  # adv-lib: zero gradient at y = 0+


@given(st.integers(0, 2**31 - 1), st.integers(0, 6))
def test_kth_largest_mask_drops_the_k_minus_one_largest(seed, k):
    rng = np.random.default_rng(seed)
    constraints = rng.normal(size=(1, 4, 5)).astype(np.float32)
    mask = rng.random((1, 4, 5)) < 0.8
    k = min(k, int(mask.sum()))
    result = np.asarray(kth_largest_mask(jnp.asarray(constraints), jnp.asarray(mask), jnp.array([k]), 7))
    if k == 0:
        np.testing.assert_array_equal(result, mask)
        return
    values = np.sort(constraints[mask])[::-1]
    np.testing.assert_array_equal(result, mask & (constraints <= values[k - 1]))
    assert result.sum() == mask.sum() - (k - 1)


def test_decay_counts_follow_the_float32_schedule():
    counts = np.asarray(decay_counts(jnp.array([1000, 50]), 11, 0.01))
    expected = np.floor(np.float32(0.01) * np.array([1000, 50], np.float32)[None]
                        * np.array([i / 10 for i in range(11)], np.float32)[:, None])
    np.testing.assert_array_equal(counts, expected)
    assert counts[-1, 0] == 10 and counts[0, 0] == 0


def numpy_l1_projection(u):
    """Duchi et al.'s sort-based projection onto the unit ℓ1 ball, float64."""
    if np.abs(u).sum() <= 1:
        return u
    a = np.sort(np.abs(u))[::-1]
    cumulative = np.cumsum(a)
    index = np.nonzero(a * np.arange(1, len(a) + 1) > cumulative - 1)[0][-1]
    theta = (cumulative[index] - 1) / (index + 1)
    return np.sign(u) * np.maximum(np.abs(u) - theta, 0)


@given(st.integers(0, 2**31 - 1), st.sampled_from([1e-3, 0.05, 1.0, 30.0]))
def test_l1_projection_methods_match_numpy(seed, scale):
    rng = np.random.default_rng(seed)
    u = (rng.normal(size=(3, 2, 5, 3)) * scale).astype(np.float32)
    u[1] *= 1e-3  # inside the ball: unchanged
    expected = np.stack([numpy_l1_projection(v.astype(np.float64).ravel()).reshape(v.shape) for v in u])
    for method in ("threshold", "sort"):
        result = np.asarray(L1_PROJECTIONS[method](u))
        # θ comes from float32 sums of |u|: rounding of order 1e-7·Σ|u|.
        np.testing.assert_allclose(result, expected, atol=3e-7 * (1 + np.abs(u).reshape(3, -1).sum(1).max()),
                                   err_msg=method)
        assert np.abs(result).reshape(3, -1).sum(1).max() <= 1 + 1e-5


def test_prox_linf_is_the_moreau_complement():
    rng = np.random.default_rng(0)
    u = rng.normal(size=(2, 3, 3, 3)).astype(np.float32)
    weight = np.array([0.5, 100.0], np.float32)
    result = np.asarray(prox_linf(jnp.asarray(u), jnp.asarray(weight)))
    for b in range(2):
        expected = u[b] - weight[b] * numpy_l1_projection(u[b].astype(np.float64).ravel() / weight[b]).reshape(u[b].shape)
        np.testing.assert_allclose(result[b], expected, atol=1e-5)
    # The prox of ν‖·‖∞ clips to a common level t: |result| <= t with equality on the clipped entries.
    assert np.abs(result[1]).max() < 1e-5  # ν > ‖u‖₁: everything shrinks to zero
    np.testing.assert_array_equal(np.asarray(prox_linf(jnp.asarray(u), jnp.array([0.0, np.inf]))), u)


def test_softmax_plus_one_has_an_extra_zero_logit():
    logits = np.array([[[0.0, -np.inf], [1.0, 2.0]]], np.float32)
    weights = np.asarray(softmax_plus_one(jnp.asarray(logits))).ravel()
    numerators = np.array([1.0, 0.0, np.e, np.e ** 2])
    np.testing.assert_allclose(weights, numerators / (1.0 + numerators.sum()), rtol=1e-6)
    assert weights.sum() < 1
