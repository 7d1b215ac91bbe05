"""A stack of transformer blocks run as loops over stacked parameters, so a program holds each block once.

An encoder of ``n`` blocks, unrolled, puts ``n`` copies of the block into its program; XLA's compile
time grows with them (docs/benchmarking.md, "Compile time of the image encoders"). Blocks of one
*kind* (same shapes, same code: e.g. SAM's windowed blocks, or its global-attention blocks) can run
as one ``lax.scan`` over their parameters stacked on a leading axis. The block sequence is cut into
segments, each a unit of blocks repeated ``reps`` times (SAM ViT-B: ``(windowed, windowed, global)``
four times; `segments_of`), and run as

    outer scan over the reps:  for each run of equal kinds in the unit: inner scan over the run

so ViT-B's program holds one windowed and one global block instead of twelve blocks.

The caller keeps its per-block parameter trees (checkpoints, ports and key tables see ``blocks_{i}``);
`run_blocks` stacks them inside the traced function (a copy of the blocks' weights per call).
Results equal the unrolled blocks up to float32 rounding (XLA may fuse a loop body differently).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class Run:
    """``length`` consecutive blocks of one ``kind``, starting ``offset`` blocks into a unit."""

    kind: Hashable
    offset: int
    length: int


@dataclasses.dataclass(frozen=True)
class Segment:
    """Blocks ``start .. start + reps * period - 1``: a unit of ``period`` blocks (its ``runs``) repeated."""

    start: int
    period: int
    reps: int
    runs: tuple[Run, ...]


def runs_of(kinds: Sequence[Hashable]) -> tuple[Run, ...]:
    """Maximal runs of equal consecutive kinds, in order."""
    runs: list[Run] = []
    for index, kind in enumerate(kinds):
        if runs and runs[-1].kind == kind:
            runs[-1] = Run(kind, runs[-1].offset, runs[-1].length + 1)
        else:
            runs.append(Run(kind, index, 1))
    return tuple(runs)


def _repeats(kinds: Sequence[Hashable], start: int, period: int) -> int:
    """How many times ``kinds[start:start + period]`` repeats back to back from ``start``."""
    unit = tuple(kinds[start:start + period])
    reps = 1
    while tuple(kinds[start + reps * period:start + (reps + 1) * period]) == unit:
        reps += 1
    return reps


def segments_of(kinds: Sequence[Hashable]) -> tuple[Segment, ...]:
    """Cuts a block sequence into repeated units so that the program holds the fewest block bodies.

    A segment's unit of ``period`` blocks repeated ``reps`` times holds one body per run of equal
    kinds in the unit; among the cuts with the fewest bodies in all, the one with the fewest segments
    (dynamic programming over the start of the remaining blocks; kinds are a few dozen).

    Args:
      kinds: one hashable kind per block; equal kinds must mean identical parameter shapes and code.

    Returns:
      segments covering ``0 .. len(kinds) - 1`` in order.
    """
    n = len(kinds)
    best: list[tuple[int, int, Segment | None]] = [(0, 0, None)] * (n + 1)  # (bodies, segments, first)
    for start in range(n - 1, -1, -1):
        options = []
        for period in range(1, n - start + 1):
            runs = runs_of(kinds[start:start + period])
            for reps in range(1, _repeats(kinds, start, period) + 1):
                bodies, count, _ = best[start + period * reps]
                options.append((bodies + len(runs), count + 1, Segment(start, period, reps, runs)))
        best[start] = min(options, key=lambda option: option[:2])
    segments, start = [], 0
    while start < n:
        segment = best[start][2]
        segments.append(segment)
        start += segment.period * segment.reps
    return tuple(segments)


def stack_trees(trees: Sequence[Any]) -> Any:
    """Pytrees of equal structure and shapes -> one pytree with a new leading axis of ``len(trees)``."""
    return jax.tree.map(lambda *leaves: jnp.stack(leaves), *trees)


def _segment_params(segment: Segment, block_params: Sequence[Any]) -> tuple[Any, ...]:
    """Per run of the unit, its blocks' parameters stacked as [reps, run length, ...]."""
    stacked = []
    for run in segment.runs:
        per_rep = [stack_trees([block_params[segment.start + rep * segment.period + run.offset + j]
                                for j in range(run.length)]) for rep in range(segment.reps)]
        stacked.append(stack_trees(per_rep))
    return tuple(stacked)


ApplyBlock = Callable[[Hashable, Any, jnp.ndarray], jnp.ndarray]


def _run_unit(apply_block: ApplyBlock, emits: Callable[[Hashable], bool], runs: tuple[Run, ...],
              x: jnp.ndarray, unit_params: tuple[Any, ...]):
    """One pass over a unit's runs: (x, per emitting run its outputs stacked [run length, ...])."""
    emitted = []
    for run, params in zip(runs, unit_params):
        if run.length == 1:
            x = apply_block(run.kind, jax.tree.map(lambda leaf: leaf[0], params), x)
            outputs = x[None]
        else:
            def step(carry, block, kind=run.kind):
                out = apply_block(kind, block, carry)
                return out, (out if emits(kind) else None)

            x, outputs = jax.lax.scan(step, x, params)
        if emits(run.kind):
            emitted.append(outputs)
    return x, tuple(emitted)


def run_blocks(apply_block: ApplyBlock, block_params: Sequence[Any], kinds: Sequence[Hashable],
               x: jnp.ndarray, emits: Callable[[Hashable], bool] = lambda kind: False):
    """Applies ``len(kinds)`` blocks in order, each block's code once per segment unit.

    Args:
      apply_block: ``(kind, params, x) -> x``, one block of ``kind`` with its parameter tree (a pure
        function: no state besides its arguments); its output has the shape of its input whenever
        the block is followed by one of the same kind.
      block_params: the per-block parameter trees, in block order.
      kinds: the blocks' kinds (`segments_of`).
      x: the input of the first block.
      emits: which kinds' outputs the caller needs (e.g. the global-attention blocks' outputs).

    Returns:
      (the last block's output, the outputs of the emitting blocks in block order).
    """
    if len(block_params) != len(kinds):
        raise ValueError(f"{len(block_params)} parameter trees for {len(kinds)} block kinds")
    emitted: list[jnp.ndarray] = []
    for segment in segments_of(kinds):
        params = _segment_params(segment, block_params)
        emitting = [run for run in segment.runs if emits(run.kind)]
        if segment.reps == 1:
            x, outputs = _run_unit(apply_block, emits, segment.runs, x,
                                   jax.tree.map(lambda leaf: leaf[0], params))
            outputs = tuple(out[None] for out in outputs)
        else:
            x, outputs = jax.lax.scan(
                lambda carry, unit: _run_unit(apply_block, emits, segment.runs, carry, unit), x, params)
        for rep in range(segment.reps):  # block order: rep, then run offset, then position in the run
            for run, stacked in zip(emitting, outputs):
                emitted.extend(stacked[rep, j] for j in range(run.length))
    return x, emitted
