"""Compiled memory of the battery's programs (XLA ``memory_analysis``) vs one forward+backward pass.

Lowers and compiles (never runs) each attack family's program
(`attacks.perturb.ensemble.family_attacks`) and the model's plain
value-and-grad for PSPNet (semseg family, random weights) at the given batch
sizes and iteration budgets, and prints XLA's temp / argument / output bytes
and the temp bytes over those of one value-and-grad pass of the same batch.
A program whose temp bytes grow with the iteration budget stacks
per-iteration copies; one far above the single gradient pass holds more than
one pass's activations. ``--variants`` picks the programs compiled (default
both): ``batch`` (the whole batch in one attack pass: what the CPU runs) and
``chunks`` (the accelerator variant, `image_chunks.in_chunks` of ``--chunk``
images, compiled here for the backend in use; skipped where one chunk holds
the whole batch). docs/protocols/perturbation.md ("Accelerator memory"),
docs/models/semseg.md ("Compiled memory").

    python experiments/benchmarks/semseg_battery_memory.py --size 64,86 --batches 1,2 --steps 2,6 [--blocks 3,4,6,3]
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp

from jaxseg_robust.attacks.perturb import instance_keys
from jaxseg_robust.attacks.perturb.ensemble import CANDIDATE_ORDER, PROGRAM_OF, BatteryConfig, family_attacks
from jaxseg_robust.attacks.perturb.image_chunks import chunk_size, in_chunks
from jaxseg_robust.models.dense.semseg import SemsegConfig, SemsegDense

FAMILY_MEMBER = {"padam": "padam_ce", "sea": "sea_mce", "dag": "dag_0.001", "pdpgd": "pdpgd", "alma_prox": "alma_prox"}
VARIANTS = ("batch", "chunks")


def mib(value: int) -> str:
    """Bytes as MiB text."""
    return f"{value / 2**20:.1f}"


def analysis(jitted, *args) -> dict:
    """temp / argument / output bytes of ``jitted`` compiled for ``args``."""
    stats = jitted.lower(*args).compile().memory_analysis()
    return {"temp": stats.temp_size_in_bytes, "args": stats.argument_size_in_bytes,
            "out": stats.output_size_in_bytes}


def battery_config(steps: int) -> BatteryConfig:
    """Every family's budget at ``steps`` iterations (SEA at least 4: its three stages)."""
    return BatteryConfig(num_classes=21, padam_steps=steps, sea_iterations=max(steps, 4), dag_iterations=steps,
                         alma_steps=steps, pdpgd_steps=steps)


def program_arguments(params, batch: int, height: int, width: int, family: str) -> tuple:
    """Zero images / labels, all-valid pixels, keys and the family's first member's traced arguments."""
    member = PROGRAM_OF[FAMILY_MEMBER[family]][1]
    return (params, jnp.zeros((batch, height, width, 3), jnp.float32), jnp.zeros((batch, height, width), jnp.int32),
            jnp.ones((batch, height, width), bool), instance_keys(jax.random.key(0), jnp.arange(batch)),
            jnp.asarray(CANDIDATE_ORDER.index(FAMILY_MEMBER[family]), jnp.uint32),
            jnp.asarray(member, jnp.float32 if isinstance(member, float) else jnp.int32))


def one_pass(model, params, batch: int, height: int, width: int) -> dict:
    """Memory of the model's value-and-grad in its input (params an argument, a logit-dependent cotangent)."""
    # With closed-over params and ``.sum()`` (a constant all-ones cotangent) XLA constant-folds the
    # upsampling's transpose (a scatter-add of constants, seconds of compile time), which no attack has.
    grad = jax.jit(jax.value_and_grad(lambda p, x: jnp.sum(jnp.square(model.apply(p, x))), argnums=1))
    return analysis(grad, params, jnp.zeros((batch, height, width, 3), jnp.float32))


def row(program: str, batch: int, steps: int, stats: dict, reference: dict) -> str:
    """One Markdown row; ``reference`` is the one-pass memory of the same batch."""
    return (f"| {program} | {batch} | {steps} | {mib(stats['temp'])} | {stats['temp'] / reference['temp']:.2f} | "
            f"{mib(stats['args'])} | {mib(stats['out'])} |")


def main(argv=None) -> None:
    """Prints one row per (program, batch, steps)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="64,86")
    parser.add_argument("--batches", default="1,2")
    parser.add_argument("--steps", default="2,6")
    parser.add_argument("--blocks", default="3,4,6,3", help="ResNet blocks per stage (R50: 3,4,6,3)")
    parser.add_argument("--families", default=",".join(FAMILY_MEMBER))
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated subset of {VARIANTS}")
    parser.add_argument("--chunk", type=int, default=1, help="images per attack pass of the chunks variant")
    args = parser.parse_args(argv)
    height, width = (int(v) for v in args.size.split(","))
    variants = args.variants.split(",")
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        parser.error(f"--variants: unknown {unknown}; known: {', '.join(VARIANTS)}")
    model = SemsegDense(SemsegConfig(num_classes=21, blocks=tuple(int(b) for b in args.blocks.split(","))))
    params = jax.device_put(model.init(jax.random.key(0)))
    print(f"jax {jax.__version__} ({jax.default_backend()}), PSPNet blocks {args.blocks}, {height}x{width}")
    print("| program | batch | steps | temp MiB | temp / one pass | args MiB | out MiB |")
    print("|---|---|---|---|---|---|---|")
    for batch in (int(b) for b in args.batches.split(",")):
        reference = one_pass(model, params, batch, height, width)
        print(row("value_and_grad", batch, 1, reference, reference), flush=True)
        for steps in (int(s) for s in args.steps.split(",")):
            attacks = family_attacks(model.apply, battery_config(steps), set(args.families.split(",")))
            for family in args.families.split(","):
                call = program_arguments(params, batch, height, width, family)
                for variant in variants:
                    if variant == "chunks" and chunk_size(batch, args.chunk) == batch:
                        continue  # one chunk holds the whole batch: the batch program itself
                    program = attacks[family] if variant == "batch" else in_chunks(attacks[family], args.chunk)
                    name = family if variant == "batch" else f"{family} (chunks of {args.chunk})"
                    print(row(name, batch, steps, analysis(jax.jit(program), *call), reference), flush=True)


if __name__ == "__main__":
    main()
