"""The battery's compiled programs: compiled once per input signature, retraces checked, compile time apart.

Section numbers (§) refer to docs/protocols/perturbation.md (§10.1, "compile once").

Each program is a `jaxseg_robust.runner.program.CompiledFunction` (`compiled_program`),
the compile cache and retrace check every protocol's program uses: on its
first call with a new input signature (`signature`: the shapes, dtypes and
placements of every argument, i.e. one bucket of images) it traces, lowers
and compiles the function ahead of time and times that; every later call
with the same signature runs the cached executable; a second trace for one
signature is a `RetraceError`. ``traces``, ``compiles``, ``compile_seconds``
and ``run_seconds`` (each call waits for its outputs) are its counters.

Members of one attack family share one program (`ensemble.build_battery`):
PAdam-CE / PAdam-Cos (the loss chosen by a traced index), the four SEA losses
(ditto), DAG-0.001 / DAG-0.003 (γ traced); PDPGD and ALMA prox have one each,
and the scoring forward pass one more, so a bucket compiles at most six
programs instead of eleven.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import jax

from jaxseg_robust.runner.program import CompiledFunction


def placement(leaf):
    """Where a leaf lives, up to equivalence: the device id for one device, else the sharding (None for host data).

    A single-device array may carry a `SingleDeviceSharding` or a one-device
    `NamedSharding` (a sharded batch on one device); both run the same
    executable, so they must not compile twice.
    """
    sharding = getattr(leaf, "sharding", None)
    if sharding is None:
        return None
    devices = sharding.device_set
    return ("device", next(iter(devices)).id) if len(devices) == 1 else sharding


def signature(args) -> tuple:
    """Hashable input signature of a call: tree structure plus (shape, dtype, placement) per leaf."""
    leaves, treedef = jax.tree_util.tree_flatten(args)
    return (treedef, tuple((tuple(getattr(leaf, "shape", ())), str(getattr(leaf, "dtype", type(leaf))),
                            placement(leaf)) for leaf in leaves))


def compiled_program(name: str, fn: Callable) -> CompiledFunction:
    """``fn(*arrays) -> pytree`` as a `jaxseg_robust.runner.program.CompiledFunction` keyed by `signature`.

    Args:
      name: for messages and summaries.
      fn: a pure function of array arguments (no Python scalars: pass ``jnp.asarray`` values).
    """
    return CompiledFunction(name, fn, signature=signature)


def compile_summary(programs: Iterable[CompiledFunction]) -> dict:
    """Totals over distinct programs: ``programs``, ``traces``, ``compiles``, ``compile_seconds``, ``run_seconds``."""
    unique = list({id(program): program for program in programs}.values())
    return {"programs": len(unique), "traces": sum(p.traces for p in unique),
            "compiles": sum(p.compiles for p in unique),
            "compile_seconds": sum(p.compile_seconds for p in unique),
            "run_seconds": sum(p.run_seconds for p in unique)}


def format_compile_summary(summary: dict) -> str:
    """One line: compile time apart from run time."""
    return (f"compiled {summary['compiles']} programs ({summary['programs']} kinds) in "
            f"{summary['compile_seconds']:.1f} s; attacks and scoring ran {summary['run_seconds']:.1f} s")
