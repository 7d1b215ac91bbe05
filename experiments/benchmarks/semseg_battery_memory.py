"""Compiled memory of the battery's programs (XLA ``memory_analysis``) vs one forward+backward pass.

Lowers and compiles (never runs) each attack family's shared program
(`attacks.perturb.ensemble.build_battery`) and the model's plain value-and-grad
for PSPNet (semseg family, random weights) at the given batch sizes and
iteration budgets, and prints XLA's temp / argument / output bytes. A program
whose temp bytes grow with the iteration budget stacks per-iteration copies;
one far above the single gradient pass holds more than one pass's activations.
docs/protocols/perturbation.md.

    python experiments/benchmarks/semseg_battery_memory.py --size 64,86 --batches 1,2 --steps 2,6 [--blocks 3,4,6,3]
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp

from jaxseg_robust.attacks.perturb import instance_keys
from jaxseg_robust.attacks.perturb.ensemble import BatteryConfig, build_battery
from jaxseg_robust.models.dense.semseg import SemsegConfig, SemsegDense

FAMILY_MEMBER = {"padam": "padam_ce", "sea": "sea_mce", "dag": "dag_0.001", "pdpgd": "pdpgd", "alma_prox": "alma_prox"}


def mib(value: int) -> str:
    """Bytes as MiB text."""
    return f"{value / 2**20:.1f}"


def analysis(jitted, *args) -> dict:
    """temp / argument / output bytes of ``jitted`` compiled for ``args``."""
    stats = jitted.lower(*args).compile().memory_analysis()
    return {"temp": stats.temp_size_in_bytes, "args": stats.argument_size_in_bytes,
            "out": stats.output_size_in_bytes}


def main(argv=None) -> None:
    """Prints one row per (program, batch, steps)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="64,86")
    parser.add_argument("--batches", default="1,2")
    parser.add_argument("--steps", default="2,6")
    parser.add_argument("--blocks", default="3,4,6,3", help="ResNet blocks per stage (R50: 3,4,6,3)")
    parser.add_argument("--families", default=",".join(FAMILY_MEMBER))
    args = parser.parse_args(argv)
    height, width = (int(v) for v in args.size.split(","))
    model = SemsegDense(SemsegConfig(num_classes=21, blocks=tuple(int(b) for b in args.blocks.split(","))))
    params = jax.device_put(model.init(jax.random.key(0)))
    print(f"jax {jax.__version__} ({jax.default_backend()}), PSPNet blocks {args.blocks}, {height}x{width}")
    print("| program | batch | steps | temp MiB | args MiB | out MiB |\n|---|---|---|---|---|---|")
    for batch in (int(b) for b in args.batches.split(",")):
        images = jnp.zeros((batch, height, width, 3), jnp.float32)
        labels = jnp.zeros((batch, height, width), jnp.int32)
        valid = jnp.ones((batch, height, width), bool)
        keys = instance_keys(jax.random.key(0), jnp.arange(batch))
        # params as an argument and a cotangent that depends on the logits: with closed-over params and
        # ``.sum()`` (a constant all-ones cotangent) XLA constant-folds the upsampling's transpose
        # (a scatter-add of constants, seconds of compile time), which no attack program contains.
        grad = jax.jit(jax.value_and_grad(lambda p, x: jnp.sum(jnp.square(model.apply(p, x))), argnums=1))
        row = analysis(grad, params, images)
        print(f"| value_and_grad | {batch} | 1 | {mib(row['temp'])} | {mib(row['args'])} | {mib(row['out'])} |",
              flush=True)
        for steps in (int(s) for s in args.steps.split(",")):
            config = BatteryConfig(num_classes=21, padam_steps=steps, sea_iterations=max(steps, 4),
                                   dag_iterations=steps, alma_steps=steps, pdpgd_steps=steps)
            candidates = {c.name: c for c in build_battery(model.apply, config)}
            for family in args.families.split(","):
                program = candidates[FAMILY_MEMBER[family]].program
                call = (params, images, labels, valid, keys, jnp.asarray(1, jnp.uint32),
                        jnp.asarray(0.001 if family == "dag" else 0, jnp.float32 if family == "dag" else jnp.int32))
                row = analysis(program._jitted, *call)
                print(f"| {family} | {batch} | {steps} | {mib(row['temp'])} | {mib(row['args'])} | "
                      f"{mib(row['out'])} |", flush=True)


if __name__ == "__main__":
    main()
