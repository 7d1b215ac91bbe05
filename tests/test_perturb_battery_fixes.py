"""Battery fixes: every member's own random start (§5) and DAG's torch-clamp gradient (§4.1).

docs/protocols/perturbation.md.
"""

from __future__ import annotations

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import perturb_toy as toy

from jaxseg_robust.attacks.perturb import (
    BatteryConfig,
    battery_compile_summary,
    build_battery,
    dag,
    instance_keys,
    losses,
    padam,
    run_battery,
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


@pytest.mark.slow
def test_sea_members_run_from_their_own_keys():
    params = toy.init_params(jax.random.key(1), width=4)
    images, labels = toy.synthetic_batch(8, 2, 8, 8)
    valid = jnp.ones(labels.shape, bool)
    keys = instance_keys(jax.random.key(0), np.arange(2))
    config = BatteryConfig(num_classes=4, attacks=("sea_jsd", "sea_msl"), sea_iterations=4, void_policy="ignore")
    runs = {c.name: c.run(params, images, labels, valid, keys) for c in build_battery(toy.logits_fn, config)}
    for name, loss in (("sea_jsd", "jsd"), ("sea_msl", "msl")):
        own = sea(toy.logits_fn, params, images, labels, valid, member_keys(keys, CANDIDATE_ORDER.index(name)),
                  loss=loss, total_iterations=4)
        np.testing.assert_allclose(np.asarray(runs[name].images), np.asarray(own.images), atol=1e-6)


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


def test_battery_compiles_each_family_program_once_per_bucket():
    params = toy.init_params(jax.random.key(4), width=4)
    config = BatteryConfig(num_classes=4, attacks=("padam_ce", "padam_cos", "dag_0.001", "dag_0.003"),
                           padam_steps=1, dag_iterations=1, void_policy="ignore")
    logits_fn = functools.partial(toy.logits_fn)  # a model of its own: a fresh scoring program
    candidates = build_battery(logits_fn, config)
    programs = {c.name: c.program for c in candidates}
    assert programs["clean"] is None
    assert programs["padam_ce"] is programs["padam_cos"] and programs["dag_0.001"] is programs["dag_0.003"]

    def batch(seed, height, width):
        images, labels = toy.synthetic_batch(seed, 2, height, width)
        return images, labels, jnp.ones(labels.shape, bool), instance_keys(jax.random.key(0), np.arange(2))

    for seed, size in ((1, (8, 8)), (2, (8, 8)), (3, (8, 12)), (4, (8, 8))):
        images, labels, valid, keys = batch(seed, *size)
        run_battery(candidates, logits_fn, params, images, labels, valid, keys, num_classes=4)
    # Each member runs its own loss / step from its own start (fold_in of its candidate index).
    runs = {c.name: c.run(params, images, labels, valid, keys) for c in candidates}
    for name, loss in (("padam_ce", "ce"), ("padam_cos", "cos")):
        own = padam(logits_fn, params, images, labels, valid, member_keys(keys, CANDIDATE_ORDER.index(name)),
                    loss=loss, num_steps=1)
        np.testing.assert_allclose(np.asarray(runs[name].images), np.asarray(own.images), atol=1e-6)
    shared = padam(logits_fn, params, images, labels, valid, keys, loss="ce", num_steps=1)
    assert not np.allclose(np.asarray(runs["padam_ce"].images), np.asarray(shared.images))
    for name, gamma in (("dag_0.001", 0.001), ("dag_0.003", 0.003)):
        own = dag(logits_fn, params, images, labels, valid, gamma=gamma, max_iterations=1, epsilon=EPSILON)
        np.testing.assert_array_equal(np.asarray(runs[name].info["perturbation_linf"]),
                                      np.asarray(own.info["perturbation_linf"]))
    summary = battery_compile_summary(candidates, logits_fn, 4)
    assert summary["programs"] == 3  # PAdam (both losses), DAG (both steps), scoring
    assert summary["traces"] == summary["compiles"] == 3 * 2  # once per program and bucket shape
    assert programs["padam_ce"].traces == programs["dag_0.001"].traces == 2
    assert summary["compile_seconds"] > 0 and summary["run_seconds"] > 0


def test_a_battery_program_compiles_once_per_matmul_precision():
    """Executables are compiled ahead of time, so the precision is part of their key (runner.precision)."""
    from jaxseg_robust.attacks.perturb.programs import compiled_program
    from jaxseg_robust.runner.precision import matmul_precision

    program = compiled_program("product", lambda a, b: a @ b)
    a = jnp.ones((4, 4), jnp.float32)
    for precision in ("highest", "default", "highest", "default"):
        with matmul_precision(precision):
            np.testing.assert_array_equal(np.asarray(program(a, a)), np.full((4, 4), 4.0, np.float32))
    assert program.compiles == program.traces == 2
