"""GPCIS's Gaussian-process head (`jaxseg_robust.models.gpcis.gp`) against a float64 NumPy restatement.

The restatement (`dense_gp`) is the authors' formula written out with an
explicit inverse (``prior + K_xz (K_zz + eps I)^-1 (u - prior(z))``); the
tests pin the click index rule, the rule for two clicks on one pixel (one
inducing point, mean target: the eps -> 0 limit of the authors' formula), that
padding and clicks off the grid take no part, and that no gradient reaches the
click coordinates.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxseg_robust.models.gpcis.gp import (
    coincident_click_groups,
    click_indices,
    gp_logits,
)

H, W, DEEP, L = 12, 10, 6, 16


def head_params(seed: int = 0) -> dict:
    """Random head parameters of the layout `gp_logits` reads (small deep width ``DEEP``)."""
    rng = np.random.default_rng(seed)
    d = DEEP + 3

    def f(*shape, scale=0.5):
        return jnp.asarray(rng.normal(0, scale, shape), jnp.float32)

    return {"theta": {"weight": f(d, L), "bias": f(L)}, "omega": f(L, 1), "logsigma2": f(DEEP, scale=0.3),
            "u_mlp": {"0": {"weight": f(d, 8), "bias": f(8)}, "2": {"weight": f(8, 1), "bias": f(1)}},
            "weights": f(1)}


def feature_map(seed: int = 1) -> jnp.ndarray:
    """f32[H, W, DEEP + 3]: unit-norm deep channels, then RGB-like channels."""
    rng = np.random.default_rng(seed)
    deep = rng.normal(size=(H, W, DEEP))
    deep /= np.linalg.norm(deep, axis=-1, keepdims=True)
    rgb = rng.normal(0, 1.0, (H, W, 3))
    return jnp.asarray(np.concatenate([deep, rgb], -1), jnp.float32)


def dense_gp(params, feature, rc, signs, eps=1e-7, targets=None):
    """float64 restatement: clicks at (row, col) pixels ``rc`` with signs +-1 (or explicit residual targets)."""
    p = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
    f = np.asarray(feature, np.float64)

    def phi(x):
        return np.sqrt(2.0 / L) * np.sin(x @ p["theta"]["weight"] + p["theta"]["bias"])

    def k(a, b):
        s = np.exp(p["logsigma2"])
        deep = ((a[..., None, :DEEP] - b[:, :DEEP]) ** 2 * s).sum(-1)
        rgb = ((a[..., None, DEEP:] - b[:, DEEP:]) ** 2).sum(-1)
        return np.exp(-deep / 2) + np.log1p(np.exp(p["weights"][0])) * np.exp(-rgb / 2)

    prior = phi(f) @ p["omega"][:, 0]
    if len(rc) == 0:
        return prior
    z = np.stack([f[r, c] for r, c in rc])
    if targets is None:
        hidden = np.maximum(z @ p["u_mlp"]["0"]["weight"] + p["u_mlp"]["0"]["bias"], 0)
        u = np.log1p(np.exp(hidden @ p["u_mlp"]["2"]["weight"] + p["u_mlp"]["2"]["bias"]))[:, 0] * np.asarray(signs)
        targets = u - phi(z) @ p["omega"][:, 0]
    v = np.linalg.inv(k(z, z) + eps * np.eye(len(rc))) @ targets
    return prior + k(f, z) @ v


def run(params, feature, xy, labels):
    return np.asarray(gp_logits(params, feature, jnp.asarray(xy, jnp.float32), jnp.asarray(labels, jnp.int32)))


def test_distinct_clicks_match_the_dense_formula():
    params, feature = head_params(), feature_map()
    xy = [(2.0, 3.0), (7.0, 9.0), (5.0, 1.0), (-1.0, -1.0)]
    out = run(params, feature, xy, [1, 0, 1, -1])
    ref = dense_gp(params, feature, [(3, 2), (9, 7), (1, 5)], [1, -1, 1])
    np.testing.assert_allclose(out, ref, atol=2e-4 * np.abs(ref).max())


def test_clicks_read_the_floor_of_the_clamped_coordinate():
    rows, cols, valid = click_indices(jnp.asarray([[3.9, 2.2], [9.99, 11.5], [0.0, 0.0], [10.0, 1.0]]),
                                      jnp.asarray([1, 0, 1, 1]), (H, W))
    assert rows.tolist()[:3] == [2, 11, 0] and cols.tolist()[:3] == [3, 9, 0]
    assert valid.tolist() == [True, True, True, False]   # x = 10 is off a 10-wide grid


def test_same_label_clicks_on_one_pixel_count_once():
    params, feature = head_params(), feature_map()
    twice = run(params, feature, [(2.2, 3.7), (6.0, 8.0), (2.9, 3.1)], [1, 0, 1])
    once = run(params, feature, [(2.2, 3.7), (6.0, 8.0), (-1.0, -1.0)], [1, 0, -1])
    np.testing.assert_allclose(twice, once, atol=1e-6)
    assert np.isfinite(twice).all()


def test_opposite_clicks_on_one_pixel_give_one_point_with_the_mean_target():
    params, feature = head_params(), feature_map()
    out = run(params, feature, [(4.0, 5.0), (1.0, 9.0), (4.5, 5.5)], [1, 1, 0])
    # the eps -> 0 limit of the authors' formula with both clicks kept (float64, eps 1e-9)
    limit = dense_gp(params, feature, [(5, 4), (9, 1), (5, 4)], [1, 1, -1], eps=1e-9)
    np.testing.assert_allclose(out, limit, atol=2e-4 * np.abs(limit).max())
    # and explicitly: one inducing point at (5, 4) whose target u is 0 (mean of +m and -m)
    p = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
    f = np.asarray(feature, np.float64)
    prior_at = (np.sqrt(2.0 / L) * np.sin(f @ p["theta"]["weight"] + p["theta"]["bias"])) @ p["omega"][:, 0]
    single = dense_gp(params, feature, [(5, 4), (9, 1)], [1, 1])
    z1 = f[9, 1]
    hidden = np.maximum(z1 @ p["u_mlp"]["0"]["weight"] + p["u_mlp"]["0"]["bias"], 0)
    u1 = np.log1p(np.exp(hidden @ p["u_mlp"]["2"]["weight"] + p["u_mlp"]["2"]["bias"]))[0]
    explicit = dense_gp(params, feature, [(5, 4), (9, 1)], None,
                        targets=np.array([0.0 - prior_at[5, 4], u1 - prior_at[9, 1]]))
    np.testing.assert_allclose(out, explicit, atol=2e-4 * np.abs(explicit).max())
    assert np.abs(out - single).max() > 1e-3   # the negative click does change the result


def test_coincident_groups_mark_the_first_click_of_each_pixel():
    members, rep = coincident_click_groups(jnp.asarray([1, 2, 1, 1]), jnp.asarray([1, 2, 1, 1]),
                                           jnp.asarray([True, True, True, False]))
    assert rep.tolist() == [True, True, False, False]
    assert np.asarray(members).tolist() == [[1, 0, 1, 0], [0, 1, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]]


def test_no_valid_click_gives_the_prior_and_padding_takes_no_part():
    params, feature = head_params(), feature_map()
    none = run(params, feature, [(-1.0, -1.0), (30.0, 2.0)], [-1, 1])
    np.testing.assert_allclose(none, dense_gp(params, feature, [], []), atol=1e-5)
    padded = run(params, feature, [(3.0, 3.0), (-1.0, -1.0), (-1.0, -1.0)], [0, -1, -1])
    np.testing.assert_allclose(padded, run(params, feature, [(3.0, 3.0)], [0]), atol=1e-6)


@pytest.mark.parametrize("label", [1, 0])
def test_no_gradient_reaches_the_click_coordinates(label):
    params, feature = head_params(), feature_map()

    def loss(xy):
        return jnp.sum(jax.nn.sigmoid(gp_logits(params, feature, xy, jnp.asarray([1, label]))))

    grad = jax.grad(loss)(jnp.asarray([[2.3, 4.6], [6.5, 8.1]]))
    assert np.all(np.asarray(grad) == 0.0)
    # the feature map does carry a gradient (through the kernel and the prior)
    gf = jax.grad(lambda f: jnp.sum(gp_logits(params, f, jnp.asarray([[2.3, 4.6]]), jnp.asarray([1]))))(feature)
    assert np.abs(np.asarray(gf)).max() > 0
