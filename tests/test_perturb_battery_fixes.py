"""Battery fixes: every member's own random start (§5) and DAG's torch-clamp gradient (§4.1).

docs/protocols/perturbation.md.
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import perturb_toy as toy
import pytest

from jaxseg_robust.attacks.perturb import (
    BatteryConfig,
    build_battery,
    instance_keys,
    losses,
    padam,
    sea,
)
from jaxseg_robust.attacks.perturb.common import clamp_unit, member_keys, uniform_start
from jaxseg_robust.attacks.perturb.dag import dag_objective
from jaxseg_robust.attacks.perturb.ensemble import CANDIDATE_ORDER

RANDOM_START_MEMBERS = ("padam_ce", "padam_cos", "sea_mce", "sea_bce", "sea_jsd", "sea_msl")
EPSILON = 8 / 255


def test_member_keys_fold_the_candidate_index():
    keys = instance_keys(jax.random.key(3), np.arange(2))
    for name in RANDOM_START_MEMBERS:
        index = CANDIDATE_ORDER.index(name)
        expected = [jax.random.key_data(jax.random.fold_in(keys[b], index)) for b in range(2)]
        np.testing.assert_array_equal(jax.random.key_data(member_keys(keys, index)), np.stack(expected))


def test_every_random_start_member_starts_elsewhere():
    images, _ = toy.synthetic_batch(7, 2, 8, 8)
    keys = instance_keys(jax.random.key(0), np.arange(2))
    starts = {name: np.asarray(uniform_start(member_keys(keys, CANDIDATE_ORDER.index(name)), images, EPSILON))
              for name in RANDOM_START_MEMBERS}
    for first, second in itertools.combinations(RANDOM_START_MEMBERS, 2):
        assert not np.allclose(starts[first], starts[second]), (first, second)


def test_battery_members_run_from_their_own_keys():
    params = toy.init_params(jax.random.key(1), width=4)
    images, labels = toy.synthetic_batch(8, 2, 8, 8)
    valid = jnp.ones(labels.shape, bool)
    keys = instance_keys(jax.random.key(0), np.arange(2))
    config = BatteryConfig(num_classes=4, attacks=("padam_ce", "padam_cos", "sea_jsd"), padam_steps=2,
                           sea_iterations=4, void_policy="ignore")
    runs = {c.name: c.run(params, images, labels, valid, keys) for c in build_battery(toy.logits_fn, config)}
    for name, loss in (("padam_ce", "ce"), ("padam_cos", "cos")):
        own = padam(toy.logits_fn, params, images, labels, valid, member_keys(keys, CANDIDATE_ORDER.index(name)),
                    loss=loss, num_steps=2)
        np.testing.assert_array_equal(np.asarray(runs[name].images), np.asarray(own.images))
    for name, loss in (("sea_jsd", "jsd"),):
        own = sea(toy.logits_fn, params, images, labels, valid, member_keys(keys, CANDIDATE_ORDER.index(name)),
                  loss=loss, total_iterations=4)
        np.testing.assert_array_equal(np.asarray(runs[name].images), np.asarray(own.images))
    shared = padam(toy.logits_fn, params, images, labels, valid, keys, loss="ce", num_steps=2)
    assert not np.array_equal(np.asarray(runs["padam_ce"].images), np.asarray(shared.images))


def _torch_clamp_gradient(values, weights):
    """torch.clamp's backward restated: the gradient passes where ``min <= x <= max`` (bounds included)."""
    return np.where((values >= 0.0) & (values <= 1.0), weights, 0.0)


def test_clamp_unit_has_torch_clamp_gradient_at_the_bounds():
    values = jnp.asarray([-0.25, 0.0, 1e-7, 0.5, 1.0 - 1e-7, 1.0, 1.5], jnp.float32)
    weights = jnp.arange(1.0, 8.0, dtype=jnp.float32)
    grad = jax.grad(lambda v: jnp.sum(weights * clamp_unit(v)))(values)
    np.testing.assert_array_equal(np.asarray(grad), _torch_clamp_gradient(np.asarray(values), np.asarray(weights)))
    np.testing.assert_array_equal(np.asarray(clamp_unit(values)), np.clip(np.asarray(values), 0.0, 1.0))
    plain = jax.grad(lambda v: jnp.sum(weights * jnp.clip(v, 0.0, 1.0)))(values)
    assert not np.array_equal(np.asarray(plain), np.asarray(grad))  # jnp.clip halves the gradient on a bound


def _saturated_batch():
    images, labels = toy.synthetic_batch(9, 2, 12, 12)
    images = np.asarray(images).copy()
    rng = np.random.default_rng(0)
    images[rng.random(images.shape) < 0.2] = 0.0
    images[rng.random(images.shape) < 0.2] = 1.0
    return jnp.asarray(images), labels


def test_dag_gradient_at_saturated_pixels_passes_through_the_clip():
    params = toy.init_params(jax.random.key(2), width=4)
    images, labels = _saturated_batch()
    mask = jnp.ones(labels.shape, bool)
    grad = jax.grad(lambda r: dag_objective(toy.logits_fn, params, images, labels, mask, r)[0])(jnp.zeros_like(images))
    # Restatement: at r = 0 the clip is the identity with gradient 1 everywhere (all pixels are in [0, 1]),
    # so the gradient equals the gradient with respect to the image of the unclipped objective.
    def unclipped(x):
        return jnp.sum(jax.nn.relu(losses.logit_margin(toy.logits_fn(params, x), labels)))

    np.testing.assert_allclose(np.asarray(grad), np.asarray(jax.grad(unclipped)(images)), rtol=1e-6, atol=1e-7)
    saturated = (np.asarray(images) == 0.0) | (np.asarray(images) == 1.0)
    assert np.abs(np.asarray(grad)[saturated]).max() > 0


@pytest.mark.parity
def test_dag_gradient_matches_torch_clamp():
    torch = pytest.importorskip("torch")
    params = toy.init_params(jax.random.key(2), width=4)
    images, labels = _saturated_batch()
    mask = np.ones(labels.shape, bool)
    mask[:, :3] = False
    r0 = np.zeros(images.shape, np.float32)
    r0[:, 3:6] = 0.02  # some pixels pushed past 1 (gradient 0) and some still on a bound
    grad = jax.grad(lambda r: dag_objective(toy.logits_fn, params, images, labels, jnp.asarray(mask), r)[0])(
        jnp.asarray(r0))
    module = toy.torch_module(params)
    x = torch.from_numpy(np.asarray(images).transpose(0, 3, 1, 2).copy())
    r = torch.from_numpy(r0.transpose(0, 3, 1, 2).copy()).requires_grad_(True)
    logits = module((x + r).clamp(0, 1))
    y = torch.from_numpy(np.asarray(labels, np.int64))
    label_logit = logits.gather(1, y[:, None])[:, 0]
    other = logits.scatter(1, y[:, None], float("-inf")).amax(1)
    loss = ((label_logit - other) * torch.from_numpy(mask)).clamp_min(0).sum()
    loss.backward()
    expected = r.grad.numpy().transpose(0, 2, 3, 1)
    scale = np.abs(expected).max()
    np.testing.assert_allclose(np.asarray(grad), expected, atol=1e-5 * scale)
    on_bound = (np.asarray(images) + r0 == 0.0) | (np.asarray(images) + r0 == 1.0)
    assert np.abs(expected[on_bound]).max() > 0
