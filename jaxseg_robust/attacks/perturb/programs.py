"""The battery's compiled programs: compiled once per input signature, traces counted, compile time apart.

Section numbers (§) refer to docs/protocols/perturbation.md (§10.1, "compile once").

A `CompiledProgram` wraps a pure function of arrays. On its first call with a
new input signature (the shapes, dtypes and placements of every argument, i.e.
one bucket of images) it traces, lowers and compiles the function ahead of
time and times that; every later call with the same signature runs the cached
executable. ``traces`` counts how often the Python function was traced (a
second trace for a known signature would be a retrace bug), ``compiles`` the
executables built, ``compile_seconds`` and ``run_seconds`` the time spent
compiling and running (each call waits for its outputs).

Members of one attack family share one program (`ensemble.build_battery`):
PAdam-CE / PAdam-Cos (the loss chosen by a traced index), the four SEA losses
(ditto), DAG-0.001 / DAG-0.003 (γ traced); PDPGD and ALMA prox have one each,
and the scoring forward pass one more, so a bucket compiles at most six
programs instead of eleven.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable

import jax


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


@dataclasses.dataclass(eq=False)
class CompiledProgram:
    """``fn(*arrays) -> pytree`` jitted and compiled ahead of time once per input signature.

    Attributes:
      name: for messages and summaries.
      fn: a pure function of array arguments (no Python scalars: pass ``jnp.asarray`` values).
      traces, compiles: counters; compile_seconds, run_seconds: accumulated wall time.
    """

    name: str
    fn: Callable
    traces: int = 0
    compiles: int = 0
    compile_seconds: float = 0.0
    run_seconds: float = 0.0
    _executables: dict = dataclasses.field(default_factory=dict, repr=False)

    def __post_init__(self):
        self._jitted = jax.jit(self._traced)

    def _traced(self, *args):
        self.traces += 1
        return self.fn(*args)

    def executable(self, *args):
        """The compiled executable for these arguments' signature and the matmul precision traced under
        (`jaxseg_robust.runner.precision`), compiling and timing it the first time."""
        key = (jax.config.jax_default_matmul_precision, signature(args))
        if key not in self._executables:
            start = time.perf_counter()
            self._executables[key] = self._jitted.lower(*args).compile()
            self.compile_seconds += time.perf_counter() - start
            self.compiles += 1
        return self._executables[key]

    def __call__(self, *args):
        executable = self.executable(*args)
        start = time.perf_counter()
        args = jax.device_put(args, executable.input_shardings[0])  # equivalent placements -> the compiled one
        outputs = jax.block_until_ready(executable(*args))
        self.run_seconds += time.perf_counter() - start
        return outputs


def compile_summary(programs: Iterable[CompiledProgram]) -> dict:
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
