"""The battery on spatially padded frames (opt-in ``--pad-to-multiple``, docs/protocols/perturbation.md §10.6).

Two toy images of different sizes padded into one frame: every member of
every attack family leaves the padding exactly clean (zero perturbation),
attacks stay inside the ε-ball in the image, the confusions count image
pixels only, and APGD's accuracies count the region's pixels only.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import perturb_toy as toy

from jaxseg_robust.attacks.perturb import BatteryConfig, build_battery, instance_keys, run_battery
from jaxseg_robust.attacks.perturb.common import attack_targets
from jaxseg_robust.attacks.perturb.ensemble import region_model

EPSILON = 8 / 255
FRAME = (12, 16)
SIZES = ((12, 10), (8, 16))


def padded_toy_batch():
    """Images, labels (void -1 in the padding), region, keys of two toy scenes padded into ``FRAME``."""
    images = np.zeros((2, *FRAME, 3), np.float32)
    labels = np.full((2, *FRAME), -1, np.int32)
    region = np.zeros((2, *FRAME), bool)
    for slot, (height, width) in enumerate(SIZES):
        image, label = toy.synthetic_batch(slot, 1, height, width)
        images[slot, :height, :width], labels[slot, :height, :width] = image[0], label[0]
        region[slot, :height, :width] = True
    labels[0, 0, :4] = -1  # some void inside the first image
    return (jnp.asarray(images), jnp.asarray(labels), jnp.asarray(region),
            instance_keys(jax.random.key(0), np.arange(2)))


@pytest.mark.parametrize("attacks", [
    ("clean", "padam_ce", "dag_0.001"),
    pytest.param(("sea_mce", "pdpgd", "alma_prox"), marks=pytest.mark.slow),  # three heavier programs
])
def test_padding_is_never_perturbed_nor_counted(attacks):
    params = toy.init_params(jax.random.key(3), width=4)
    images, labels, region, keys = padded_toy_batch()
    valid = region & (labels >= 0)
    config = BatteryConfig(num_classes=4, void_policy="as_background", padam_steps=2, sea_iterations=4,
                           dag_iterations=2, alma_steps=2, pdpgd_steps=2, attacks=attacks)
    outside = ~np.asarray(region)
    for candidate in build_battery(toy.logits_fn, config):
        result = candidate.run(params, images, labels, valid, keys, region)
        adversarial = np.asarray(result.images)
        np.testing.assert_array_equal(adversarial[outside], np.asarray(images)[outside], err_msg=candidate.name)
        assert np.abs(adversarial - np.asarray(images)).max() <= EPSILON + 1e-6, candidate.name
        if candidate.name in ("padam_ce", "sea_mce"):
            assert np.abs(adversarial - np.asarray(images))[~outside].max() > EPSILON / 2, candidate.name
        if candidate.name == "sea_mce":  # §3.5 accuracies over the region (as_background: no void inside)
            correct = np.asarray(result.info["correct"], np.float64)
            np.testing.assert_allclose(result.info["accuracy"], correct / np.asarray(region).sum(axis=(1, 2)))
    battery = run_battery(build_battery(toy.logits_fn, config), toy.logits_fn, params, images, labels, valid, keys,
                          num_classes=4, region=region)
    np.testing.assert_array_equal(battery.confusions.sum(axis=(2, 3)),
                                  np.broadcast_to(np.asarray(valid).sum(axis=(1, 2)), battery.confusions.shape[:2]))


def test_region_targets_and_model():
    images, labels, region, _ = padded_toy_batch()
    y, m = attack_targets(labels, region, num_classes=4, family="max_damage", void_policy="as_background",
                          region=region)
    np.testing.assert_array_equal(m, region)  # void inside the image attacked as background, padding not at all
    assert int(y[0, 0, 0]) == 0
    params = toy.init_params(jax.random.key(3), width=4)
    noise = jax.random.uniform(jax.random.key(1), images.shape)
    model = region_model(toy.logits_fn, images, region)
    moved_outside = jnp.where(region[..., None], images, noise)
    np.testing.assert_array_equal(model(params, moved_outside), toy.logits_fn(params, images))
    gradient = jax.grad(lambda x: model(params, x).sum())(images)
    assert float(jnp.abs(jnp.where(region[..., None], 0.0, gradient)).max()) == 0.0
