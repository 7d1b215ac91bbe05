"""The loops a platform's compiler would get: ``stablehlo.while`` ops in a jitted function's lowering.

``jax.jit(fn).trace(*args).lower(lowering_platforms=(platform,))`` needs no device of that
platform, so the CPU test machine can pin what a GPU would compile (docs/ARCHITECTURE.md, ops:
per-platform variants). Every ``lax.scan``, ``fori_loop`` and ``while_loop`` lowers to one
``stablehlo.while``.
"""

from __future__ import annotations

import jax


def while_loops(fn, *args, platform: str) -> int:
    """Number of ``stablehlo.while`` ops in the StableHLO of ``jax.jit(fn)(*args)`` lowered for ``platform``."""
    text = jax.jit(fn).trace(*args).lower(lowering_platforms=(platform,)).as_text()
    return text.count("stablehlo.while")
