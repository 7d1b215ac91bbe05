"""Every attack: feasible outputs (‖x̃ - x‖∞ <= ε + 1e-7, inside [0, 1], finite), per-instance results,
and no recompilation across batches of one bucket (the model is traced once per attack configuration).

Small budgets and a tiny random conv net (16x16, batch 2) keep this fast; the
second batch has void pixels and an image without any attacked pixel.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import perturb_toy as toy
from jaxseg_robust.attacks.perturb import alma_prox, dag, instance_keys, padam, pdpgd, sea

EPSILON = 8 / 255
BATCH, SIZE = 2, 16
PARAMS = toy.init_params(jax.random.key(11), width=8)
TRACES: list = []


def counted_logits(params, images):
    """The toy model, recording each trace (shared by every test here so compilations are reused)."""
    TRACES.append(images.shape)
    return toy.logits_fn(params, images)


def batch_of(seed: int, empty_second: bool):
    images, labels = toy.synthetic_batch(seed, BATCH, SIZE, SIZE)
    mask = np.ones(labels.shape, bool)
    mask[:, :3, :5] = False
    if empty_second:
        mask[1] = False
    return images, labels, jnp.asarray(mask), instance_keys(jax.random.key(0), np.arange(BATCH) + seed)


ATTACKS = {
    "padam_ce": (functools.partial(padam, loss="ce", num_steps=8), True, 8),
    "padam_cos": (functools.partial(padam, loss="cos", num_steps=8), True, 8),
    "sea_bce": (functools.partial(sea, loss="bce", total_iterations=12), True, 15),
    "sea_mce": (functools.partial(sea, loss="mce", total_iterations=12), True, 15),
    "sea_jsd": (functools.partial(sea, loss="jsd", total_iterations=12), True, 15),
    "sea_msl": (functools.partial(sea, loss="msl", total_iterations=12), True, 15),
    "sea_mce_single": (functools.partial(sea, loss="mce", schedule="single", total_iterations=12), True, 13),
    "dag": (functools.partial(dag, gamma=0.003, max_iterations=10, epsilon=EPSILON), False, 10),
    "alma_prox": (functools.partial(alma_prox, num_steps=10, epsilon=EPSILON), False, 10),
    "alma_prox_analytic": (functools.partial(alma_prox, num_steps=10, epsilon=EPSILON, reference_quirks=False),
                           False, 10),
    "pdpgd": (functools.partial(pdpgd, num_steps=10, epsilon=EPSILON), False, 10),
    "pdpgd_masking": (functools.partial(pdpgd, num_steps=10, epsilon=EPSILON, constraint_masking=True,
                                        mask_decay=True), False, 10),
}


# Variants whose code paths the default set already covers (same loop, another switch) run with -m slow.
SLOW_VARIANTS = {"padam_ce", "sea_mce_single", "alma_prox_analytic", "pdpgd_masking"}


@pytest.mark.parametrize("name", [pytest.param(name, marks=pytest.mark.slow) if name in SLOW_VARIANTS else name
                                  for name in ATTACKS])
def test_attack_is_feasible_per_instance_and_compiles_once(name):
    attack, takes_keys, max_forwards = ATTACKS[name]
    for seed, empty_second in ((0, False), (1, True)):
        images, labels, mask, keys = batch_of(seed, empty_second)
        arguments = (counted_logits, PARAMS, images, labels, mask) + ((keys,) if takes_keys else ())
        result = attack(*arguments)
        adversarial = np.asarray(result.images)
        assert adversarial.shape == images.shape and adversarial.dtype == np.float32
        assert np.isfinite(adversarial).all()
        assert adversarial.min() >= 0.0 and adversarial.max() <= 1.0
        assert np.abs(adversarial - np.asarray(images)).max() <= EPSILON + 1e-7
        for counts in (result.forwards, result.backwards):
            counts = np.asarray(counts)
            assert counts.shape == (BATCH,) and counts.dtype == np.int32
            assert np.all((counts >= 0) & (counts <= max_forwards))
        assert np.all(np.asarray(result.backwards) <= np.asarray(result.forwards))
        for key, value in result.info.items():
            assert np.asarray(value).shape[0] == BATCH, key
        traces_after_first = len(TRACES) if seed == 0 else traces_after_first
    assert len(TRACES) == traces_after_first, f"{name} retraced the model for a second batch of the same bucket"


def test_results_do_not_depend_on_batch_composition():
    images, labels, mask, keys = batch_of(3, False)
    attack = ATTACKS["sea_jsd"][0]
    together = attack(counted_logits, PARAMS, images, labels, mask, keys)
    alone = attack(counted_logits, PARAMS, images[1:], labels[1:], mask[1:], keys[1:])
    np.testing.assert_allclose(np.asarray(together.images[1]), np.asarray(alone.images[0]), atol=1e-6)
    np.testing.assert_array_equal(np.asarray(together.forwards[1]), np.asarray(alone.forwards[0]))


def test_min_norm_attacks_return_the_clean_image_without_attacked_pixels():
    images, labels, _, _ = batch_of(4, False)
    mask = jnp.zeros(labels.shape, bool)
    for name in ("dag", "alma_prox", "pdpgd"):
        result = ATTACKS[name][0](counted_logits, PARAMS, images, labels, mask)
        np.testing.assert_array_equal(np.asarray(result.images), np.asarray(images))
        assert not np.asarray(result.info["success"]).any()


@pytest.mark.parametrize("attack, match", [
    (functools.partial(padam, loss="l2"), "loss"),
    (functools.partial(padam, epsilon=0.0), "epsilon"),
    (functools.partial(padam, num_steps=0), "num_steps"),
    (functools.partial(sea, loss="dlr"), "loss"),
    (functools.partial(sea, loss="msl", msl_track="both"), "msl_track"),
    (functools.partial(sea, loss="mce", schedule="cosine"), "schedule"),
])
def test_max_damage_attacks_reject_bad_configuration(attack, match):
    images, labels, mask, keys = batch_of(0, False)
    with pytest.raises(ValueError, match=match):
        attack(toy.logits_fn, PARAMS, images, labels, mask, keys)


def test_min_norm_attacks_reject_bad_configuration():
    images, labels, mask, _ = batch_of(0, False)
    with pytest.raises(ValueError, match="gamma"):
        dag(toy.logits_fn, PARAMS, images, labels, mask, gamma=-1.0)
    with pytest.raises(ValueError, match="num_steps"):
        alma_prox(toy.logits_fn, PARAMS, images, labels, mask, num_steps=0)
    with pytest.raises(ValueError, match="mask"):
        pdpgd(toy.logits_fn, PARAMS, images, labels, mask.astype(jnp.int32))
