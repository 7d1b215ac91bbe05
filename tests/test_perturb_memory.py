"""Compiled memory of the battery's programs: one forward+backward pass, whatever the budget.

docs/protocols/perturbation.md, "Accelerator memory".

XLA:CPU's ``memory_analysis`` of each attack family's program on a small
PSPNet (one Bottleneck per stage, width 32, 32 x 40 images, batch 4):

* the whole-batch program (what the CPU runs) stays within ``FACTOR`` of one
  value-and-grad pass of the same batch: a program holding a second pass's
  activations (a vmap over members, a loss with its own backward pass) would
  be about 1.5x;
* its temp bytes do not grow with the iteration budget by as much as one
  image (a loop that stacks per-iteration copies of an image, a gradient or
  an activation would; per-step scalar tables such as ALMA prox's decay
  counts, [steps, B], may);
* the accelerator variant (`image_chunks.in_chunks`, one image per pass)
  stays within ``FACTOR`` of one pass of a single image (the whole batch of
  four is 1.7x that).

The experiments/benchmarks/semseg_battery_memory.py script prints the same
figures at any size (docs/models/semseg.md, "Compiled memory"); its last
tests run it on a one-block PSPNet and read its table.
"""

from __future__ import annotations

import functools
import importlib.util
import pathlib

import jax
import jax.numpy as jnp
import pytest

from jaxseg_robust.attacks.perturb import BatteryConfig, instance_keys
from jaxseg_robust.attacks.perturb.ensemble import CANDIDATE_ORDER, PROGRAM_OF, family_attacks
from jaxseg_robust.attacks.perturb.image_chunks import in_chunks
from jaxseg_robust.models.dense.semseg import SemsegConfig, SemsegDense

HEIGHT, WIDTH, BATCH, NUM_CLASSES = 32, 40, 4, 5
FACTOR = 1.25
FAMILY_MEMBER = {"padam": "padam_ce", "sea": "sea_mce", "dag": "dag_0.001", "pdpgd": "pdpgd", "alma_prox": "alma_prox"}


@functools.lru_cache(maxsize=1)
def small_pspnet():
    """(model, params) of a PSPNet with one Bottleneck per stage and width 32 (14 MiB of weights)."""
    model = SemsegDense(SemsegConfig(num_classes=NUM_CLASSES, blocks=(1, 1, 1, 1), width=32, head_channels=32,
                                     aux_channels=8))
    return model, model.init(jax.random.key(0))


def temp_bytes(function, *args) -> int:
    """XLA's temp bytes of ``function`` compiled for ``args`` on the default backend."""
    return jax.jit(function).lower(*args).compile().memory_analysis().temp_size_in_bytes


@functools.lru_cache(maxsize=4)
def one_pass_bytes(batch: int) -> int:
    """Temp bytes of the model's value-and-grad in its input at ``batch`` images."""
    model, params = small_pspnet()
    loss = lambda p, x: jnp.sum(jnp.square(model.apply(p, x)))  # noqa: E731
    return temp_bytes(jax.value_and_grad(loss, argnums=1), params, jnp.zeros((batch, HEIGHT, WIDTH, 3)))


def family_program(family: str, steps: int):
    """The family's whole-batch program at ``steps`` iterations (SEA: at least its three stages)."""
    model, _ = small_pspnet()
    config = BatteryConfig(num_classes=NUM_CLASSES, padam_steps=steps, sea_iterations=max(steps, 4),
                           dag_iterations=steps, alma_steps=steps, pdpgd_steps=steps)
    return family_attacks(model.apply, config, {family})[family]


def program_arguments(family: str) -> tuple:
    """Arguments of the family's program for ``BATCH`` zero images (every pixel labelled 0)."""
    _, params = small_pspnet()
    name = FAMILY_MEMBER[family]
    member = PROGRAM_OF[name][1]
    shape = (BATCH, HEIGHT, WIDTH)
    return (params, jnp.zeros(shape + (3,)), jnp.zeros(shape, jnp.int32), jnp.ones(shape, bool),
            instance_keys(jax.random.key(0), jnp.arange(BATCH)), jnp.asarray(CANDIDATE_ORDER.index(name), jnp.uint32),
            jnp.asarray(member, jnp.float32 if isinstance(member, float) else jnp.int32))


@pytest.mark.parametrize("family", list(FAMILY_MEMBER))
def test_each_family_program_holds_one_pass_and_its_chunks_one_image_pass(family):
    program, arguments = family_program(family, 2), program_arguments(family)
    whole = temp_bytes(program, *arguments)
    assert whole <= FACTOR * one_pass_bytes(BATCH), (family, whole, one_pass_bytes(BATCH))
    chunked = temp_bytes(in_chunks(program, 1), *arguments)
    assert chunked <= FACTOR * one_pass_bytes(1), (family, chunked, one_pass_bytes(1))
    assert chunked < whole


@pytest.mark.parametrize("family", [
    "sea", "alma_prox",
    pytest.param("padam", marks=pytest.mark.slow), pytest.param("dag", marks=pytest.mark.slow),
    pytest.param("pdpgd", marks=pytest.mark.slow),
])
def test_program_memory_does_not_grow_with_the_iteration_budget(family):
    arguments = program_arguments(family)
    growth = temp_bytes(family_program(family, 6), *arguments) - temp_bytes(family_program(family, 2), *arguments)
    assert abs(growth) < HEIGHT * WIDTH * 3 * 4, (family, growth)


def memory_script():
    """experiments/benchmarks/semseg_battery_memory.py as a module."""
    folder = pathlib.Path(__file__).resolve().parents[1] / "experiments" / "benchmarks"
    spec = importlib.util.spec_from_file_location("semseg_battery_memory", folder / "semseg_battery_memory.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_memory_script_prints_each_program_with_its_ratio_to_one_pass(capsys):
    memory_script().main(["--size", "33,41", "--blocks", "1,1,1,1", "--batches", "1,2", "--steps", "2",
                          "--families", "dag"])
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ") and "MiB" not in line]
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines]
    # The chunks row only where a chunk of one image is not the whole batch.
    assert [(row[0], row[1]) for row in rows] == [("value_and_grad", "1"), ("dag", "1"), ("value_and_grad", "2"),
                                                  ("dag", "2"), ("dag (chunks of 1)", "2")]
    temps = {(row[0], row[1]): float(row[3]) for row in rows}
    for row in rows:
        assert float(row[4]) == pytest.approx(float(row[3]) / temps[("value_and_grad", row[1])], abs=0.01)
    assert temps[("dag (chunks of 1)", "2")] < temps[("dag", "2")]


def test_memory_script_names_an_unknown_variant(capsys):
    with pytest.raises(SystemExit) as stop:
        memory_script().main(["--variants", "batch,tiles"])
    assert stop.value.code == 2
    assert "--variants: unknown ['tiles']" in capsys.readouterr().err
