"""The battery's accelerator variant: the batch attacked in chunks inside one program.

docs/protocols/perturbation.md, "Accelerator memory".

The variant a GPU compiles (`image_chunks.in_chunks`) is called here directly
on the CPU and must give every attack family's whole-batch results exactly:
images, forward / backward counts and every diagnostic, with the plain
padding region and without it, for chunks of one and of two images.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import perturb_toy as toy

from jaxseg_robust.attacks.perturb import BatteryConfig, instance_keys
from jaxseg_robust.attacks.perturb.ensemble import PROGRAM_OF, CANDIDATE_ORDER, build_battery, family_attacks
from jaxseg_robust.attacks.perturb.image_chunks import chunk_size, in_chunks, per_platform

CONFIG = BatteryConfig(num_classes=toy.NUM_CLASSES, padam_steps=3, sea_iterations=6, dag_iterations=4,
                       alma_steps=3, pdpgd_steps=3)
MEMBER = {"padam": "padam_cos", "sea": "sea_jsd", "dag": "dag_0.003", "pdpgd": "pdpgd", "alma_prox": "alma_prox"}


def toy_arguments(batch: int = 4, height: int = 12, width: int = 10):
    """Arguments of a family program (without region) for ``batch`` synthetic toy images, some void pixels."""
    images, labels = toy.synthetic_batch(5, batch, height, width)
    labels = np.asarray(labels).copy()
    labels[1, :2, :3] = 255
    valid = jnp.asarray(labels < toy.NUM_CLASSES)
    return (toy.init_params(jax.random.key(1), width=4), jnp.asarray(images), jnp.asarray(labels), valid,
            instance_keys(jax.random.key(2), np.arange(batch)))


def member_arguments(family: str):
    """(attack_index, member) arrays of the family's member in ``MEMBER``."""
    name = MEMBER[family]
    member = PROGRAM_OF[name][1]
    dtype = jnp.float32 if isinstance(member, float) else jnp.int32
    return jnp.asarray(CANDIDATE_ORDER.index(name), jnp.uint32), jnp.asarray(member, dtype)


def assert_same_result(expected, actual, what: str):
    flat_expected, tree_expected = jax.tree.flatten(expected)
    flat_actual, tree_actual = jax.tree.flatten(actual)
    assert tree_expected == tree_actual, what
    for left, right in zip(flat_expected, flat_actual):
        np.testing.assert_array_equal(np.asarray(left), np.asarray(right), err_msg=what)


@pytest.mark.parametrize("family, limit", [("padam", 1), ("sea", 1), ("sea", 2), ("dag", 2), ("pdpgd", 1),
                                           ("alma_prox", 1)])
def test_chunked_program_gives_the_whole_batch_results(family, limit):
    attack = family_attacks(toy.logits_fn, CONFIG, {family})[family]
    arguments = toy_arguments() + member_arguments(family)
    whole = jax.jit(attack)(*arguments)
    chunked = jax.jit(in_chunks(attack, limit))(*arguments)
    assert_same_result(whole, chunked, f"{family}, chunks of {limit}")
    assert np.asarray(chunked.images).shape == np.asarray(arguments[1]).shape


def test_chunked_program_with_a_region_gives_the_whole_batch_results():
    attack = family_attacks(toy.logits_fn, CONFIG, {"sea"})["sea"]
    params, images, labels, valid, keys = toy_arguments()
    region = jnp.ones(labels.shape, bool).at[2, :, 7:].set(False)
    arguments = (params, images, labels, valid & region, keys) + member_arguments("sea") + (region,)
    whole = jax.jit(attack)(*arguments)
    chunked = jax.jit(in_chunks(attack, 1))(*arguments)
    assert_same_result(whole, chunked, "sea with a region")
    np.testing.assert_array_equal(np.asarray(chunked.images)[2, :, 7:], np.asarray(images)[2, :, 7:])


def test_the_cpu_compiles_the_whole_batch_and_other_platforms_the_chunks():
    attack = family_attacks(toy.logits_fn, CONFIG, {"dag"})["dag"]
    arguments = toy_arguments() + member_arguments("dag")
    chosen = jax.jit(per_platform(attack, 1))
    cpu_text = chosen.trace(*arguments).lower(lowering_platforms=("cpu",)).as_text()
    cuda_text = chosen.trace(*arguments).lower(lowering_platforms=("cuda",)).as_text()
    # DAG is one while loop on the whole batch; chunked, a lax.map loop around it over the 4 images.
    assert cpu_text.count("stablehlo.while") == 1
    assert cuda_text.count("stablehlo.while") == 2
    assert "tensor<4x12x10x3xf32>" in cpu_text and "tensor<1x12x10x3xf32>" in cuda_text
    assert "tensor<1x12x10x3xf32>" not in cpu_text
    # On the CPU the battery's compiled program is the whole-batch one, results unchanged.
    battery = {c.name: c for c in build_battery(toy.logits_fn, CONFIG)}
    assert_same_result(jax.jit(attack)(*arguments), battery["dag_0.003"].run(*arguments[:5]), "battery on the CPU")


def test_chunk_size_is_the_largest_divisor_within_the_limit():
    assert [chunk_size(batch, 4) for batch in (1, 2, 3, 4, 5, 6, 8, 12)] == [1, 2, 3, 4, 1, 3, 4, 4]
    assert chunk_size(7, 100) == 7 and chunk_size(8, 1) == 1
    with pytest.raises(ValueError, match="limit"):
        chunk_size(4, 0)


def test_battery_config_validates_the_accelerator_chunk():
    assert BatteryConfig(num_classes=2).accelerator_chunk == 1
    with pytest.raises(ValueError, match="accelerator_chunk"):
        BatteryConfig(num_classes=2, accelerator_chunk=0)
