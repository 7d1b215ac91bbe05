"""A fusion boundary: keep XLA:CPU from recomputing a residual stream in every fusion.

XLA:CPU's instruction fusion duplicates cheap elementwise producers into every
consumer fusion that reads them. In a residual network each block output
``x_k = relu(bn(conv(...)) + x_{k-1})`` is read by the next block's
convolution and by its residual add, so the fusion that materialises ``x_k``
for the convolution pulls in ``x_{k-1}``'s computation, which pulls in
``x_{k-2}``'s, and so on: every block output is recomputed from the start of
its stream, and the backward pass's ReLU masks do it again. In RITM's
HRNet-18 at 400 x 400 that made elementwise fusions of 500-700 operations
(about 40 chained blocks each), and they cost more than every convolution of
the forward + backward pass together (docs/benchmarking.md, "Where XLA:CPU
loses time").

``lax.optimization_barrier`` does not prevent this on the CPU (it is removed
before fusion). A conditional does: its result is a buffer that no fusion can
look into. `fusion_boundary` routes a value through a ``lax.cond`` with a
predicate computed at run time from ``anchor``, so XLA can neither fold the
conditional nor fuse through it. The taken branch (a finite anchor) returns
the value itself, bit-identical; the other returns ``x + 0`` (equal up to the
sign of zeros), which keeps JAX and XLA from merging two identical branches
into no conditional at all. Derivatives pass through unchanged.

The predicate must stay one scalar under ``vmap`` (a batched predicate turns
the conditional into a select, which fuses): pass as ``anchor`` an array that
is not batched, such as one of the module's parameters, and pass the
parameters to ``jit`` as arguments (a constant anchor is folded away with the
conditional). On other platforms the value is returned as is: GPU fusion has
no such chains, and a conditional would cost a device-to-host
synchronisation there.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax


def _through_conditional(x: jnp.ndarray, anchor: jnp.ndarray) -> jnp.ndarray:
    """``x``, produced by a conditional on ``isfinite(anchor[0])`` (taken: ``x``; other: ``x + 0``)."""
    keep = jnp.isfinite(jnp.reshape(anchor, (-1,))[0])
    return lax.cond(keep, lambda v: v, lambda v: v + 0, x)


def _unchanged(x: jnp.ndarray, anchor: jnp.ndarray) -> jnp.ndarray:
    del anchor
    return x


def fusion_boundary(x: jnp.ndarray, anchor: jnp.ndarray) -> jnp.ndarray:
    """Returns ``x`` unchanged, materialised on the CPU so no later fusion recomputes it.

    Args:
      x: any array (a block's output).
      anchor: a non-empty array that is not batched under ``vmap`` and is not
        a compile-time constant (e.g. one of the module's parameters); only
        its first element is read.

    Returns:
      ``x`` (same values, shape and dtype).
    """
    return lax.platform_dependent(x, anchor, cpu=_through_conditional, default=_unchanged)
