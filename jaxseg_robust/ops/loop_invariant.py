"""Make a loop-invariant value worth hoisting out of XLA loops.

XLA's loop-invariant code motion moves a computation out of a ``while``
body only if it is "worth it": on its own, a reverse, transpose, reshape or
broadcast is not (they are cheap layout changes), so it stays in the body and
runs on every iteration even when every operand is invariant. The input
gradient of a convolution reads its kernel reversed and with its feature axes
swapped; in an attack loop (``fori_loop`` / ``scan`` over gradient steps)
XLA:CPU therefore re-lays out every convolution kernel of the network on
every step (docs/benchmarking.md, "Where XLA:CPU loses time").

`hoistable` multiplies the value by a run-time one. A multiply is worth
hoisting, and XLA then hoists its invariant operands (the reverse and the
transpose) with it: the re-laid-out kernel is computed once, before the loop.
The value is unchanged bit for bit: the factor is ``1 + 0 * v`` with ``v``
the value's first element when it is finite and ``1 + 0`` otherwise, so it is
exactly one, and ``x * 1 == x`` for every float ``x`` (NaN stays NaN).
XLA cannot fold the factor to a constant (``0 * v`` is not zero for a
non-finite ``v``, so algebraic simplification leaves it), which is what
keeps the multiply in the program. Outside loops it costs one elementwise
pass over the value.
"""

from __future__ import annotations

import jax.numpy as jnp


def hoistable(value: jnp.ndarray) -> jnp.ndarray:
    """``value`` (any shape, float dtype), bit-identical, as a product XLA hoists out of loops.

    Use it on a value computed only from loop-invariant inputs (for example a
    re-laid-out weight) whose producers are cheap layout ops.
    """
    value = jnp.asarray(value)
    first = jnp.reshape(value, (-1,))[0]
    zero = jnp.where(jnp.isfinite(first), 0 * first, jnp.zeros_like(first))
    return value * (1 + zero)
