"""The loops a platform's compiler would get: ``stablehlo.while`` ops in a jitted function's lowering.

``jax.jit(fn).trace(*args).lower(lowering_platforms=(platform,))`` needs no device of that
platform, so the CPU test machine can pin what a GPU would compile (docs/ARCHITECTURE.md, ops:
per-platform variants), e.g. that the CUDA lowering of an op has no ``while`` whose trip count
is a data size. Every ``lax.scan``, ``fori_loop`` and ``while_loop`` lowers to one
``stablehlo.while``.
"""

from __future__ import annotations

import re

import jax


def lowered_text(fn, *args, platform: str) -> str:
    """The StableHLO text of ``jax.jit(fn)`` lowered for ``platform`` ("cpu", "cuda", ...)."""
    return jax.jit(fn).trace(*args).lower(lowering_platforms=(platform,)).as_text()


def while_loops(fn, *args, platform: str) -> int:
    """Number of ``stablehlo.while`` ops in the StableHLO of ``jax.jit(fn)(*args)`` lowered for ``platform``."""
    return lowered_text(fn, *args, platform=platform).count("stablehlo.while")


def _region(text: str, start: int) -> str:
    """The text of the ``{ ... }`` region whose opening brace is the first one at or after ``start``."""
    open_at = text.index("{", start)
    depth = 0
    for index in range(open_at, len(text)):
        depth += {"{": 1, "}": -1}.get(text[index], 0)
        if depth == 0:
            return text[open_at + 1:index]
    raise ValueError("unbalanced region in the lowered text")


def while_condition_constants(text: str) -> list[set[int]]:
    """For every ``stablehlo.while`` of a lowered module, the integer constants of its ``cond`` region.

    A ``lax.scan`` / ``fori_loop`` over n steps compares its counter against the constant n
    there, so a loop whose trip count is a data size shows that size in its set.
    """
    found = []
    for match in re.finditer(r"stablehlo\.while\(", text):
        cond = _region(text, text.index("cond", match.end()))
        found.append({int(value) for value in re.findall(r"dense<(-?\d+)>", cond)})
    return found
