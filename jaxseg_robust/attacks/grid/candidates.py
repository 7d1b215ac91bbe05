"""Chunked evaluation of compacted prompt candidates and heat-map extremes (docs/protocols/grids.md §5.1).

`evaluate_candidates` compacts the true indices of a candidate mask
(``jnp.nonzero`` with a static size) and evaluates them ``chunk_size`` at a
time (``vmap``) inside a ``fori_loop`` whose trip count is the instance's own
number of candidates, so memory is bounded by ``chunk_size`` decodes and
restricted grids cost only their candidates. Results do not depend on
``chunk_size`` beyond float reassociation inside XLA's batched kernels.
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

DEFAULT_STRIDE = 1
DEFAULT_CHUNK_SIZE = 64


def check_positive_int(name: str, value) -> None:
    """ValueError naming ``name`` unless ``value`` is an int >= 1."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive int; got {value!r}")


def check_stride(stride) -> None:
    """ValueError unless ``stride`` is a positive int."""
    check_positive_int("stride", stride)


def evaluate_candidates(evaluate, candidates, chunk_size: int):
    """Evaluates ``evaluate(i)`` at every flat index i where ``candidates`` is true, ``chunk_size`` at a time.

    The true indices are compacted (row-major order) and evaluated in chunks
    of ``chunk_size`` (``vmap``) inside a ``fori_loop`` that runs
    ``ceil(count / chunk_size)`` times (a traced count: restricted grids cost
    only their candidates; under ``vmap`` the loop runs to the batch's
    largest count). Pure and jit/vmap-safe.

    Args:
      evaluate: ``i32[] -> pytree of f32[...]`` (closed over everything else).
      candidates: bool[...] which flat indices to evaluate (P = its size).
      chunk_size: static positive int, evaluations per chunk.

    Returns:
      The pytree of ``evaluate`` with a leading axis P; NaN at non-candidates.
    """
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive int; got {chunk_size!r}")
    candidates = jnp.asarray(candidates, bool).reshape(-1)
    total = candidates.shape[0]
    slots = -(-total // chunk_size) * chunk_size
    (order,) = jnp.nonzero(candidates, size=slots, fill_value=total)
    order = order.astype(jnp.int32)
    count = jnp.sum(candidates, dtype=jnp.int32)
    n_chunks = (count + chunk_size - 1) // chunk_size
    shapes = jax.eval_shape(evaluate, jnp.zeros((), jnp.int32))
    init = jax.tree.map(lambda s: jnp.full((total,) + s.shape, jnp.nan, s.dtype), shapes)

    def body(chunk, out):
        index = lax.dynamic_slice(order, (chunk * chunk_size,), (chunk_size,))
        values = jax.vmap(evaluate)(jnp.minimum(index, total - 1))
        return jax.tree.map(lambda o, v: o.at[index].set(v, mode="drop"), out, values)

    return lax.fori_loop(0, n_chunks, body, init)


@flax.struct.dataclass
class Extremes:
    """Minimum and maximum of a heatmap over its finite cells (each field f32[] or i32[]).

    Attributes:
      min, max: NaN when no cell is finite.
      argmin, argmax: flat index of the first minimum / maximum in row-major
        order (-1 when no cell is finite).
    """

    min: jnp.ndarray
    max: jnp.ndarray
    argmin: jnp.ndarray
    argmax: jnp.ndarray


def heatmap_extremes(heatmap) -> Extremes:
    """Row-major-first extremes of a heatmap ignoring NaN (pure; jit/vmap-safe).

    Args:
      heatmap: f32[...] (NaN = not evaluated / undefined).

    Returns:
      `Extremes` with flat indices into ``heatmap``.
    """
    flat = jnp.asarray(heatmap, jnp.float32).reshape(-1)
    finite = ~jnp.isnan(flat)
    any_finite = jnp.any(finite)
    argmin = jnp.argmin(jnp.where(finite, flat, jnp.inf)).astype(jnp.int32)
    argmax = jnp.argmax(jnp.where(finite, flat, -jnp.inf)).astype(jnp.int32)
    return Extremes(min=jnp.where(any_finite, flat[argmin], jnp.nan),
                    max=jnp.where(any_finite, flat[argmax], jnp.nan),
                    argmin=jnp.where(any_finite, argmin, -1), argmax=jnp.where(any_finite, argmax, -1))


def grid_axis(frame_size: int, stride: int) -> np.ndarray:
    """int32[ceil(frame_size / stride)]: pixel indices 0, stride, 2 stride, ... < frame_size (host, static)."""
    check_stride(stride)
    return np.arange(0, int(frame_size), stride, dtype=np.int32)


def flat_to_click(flat_index, rows, cols):
    """i32[2] (row, col) pixel of a flat grid index (-1 -> (-1, -1)).

    Args:
      flat_index: i32[] index into the [len(rows), len(cols)] grid.
      rows, cols: the grid's pixel coordinates.
    """
    n_cols = cols.shape[-1]
    i = jnp.maximum(flat_index, 0)
    click = jnp.stack([rows[i // n_cols], cols[i % n_cols]]).astype(jnp.int32)
    return jnp.where(flat_index >= 0, click, -1)


__all__ = ["DEFAULT_STRIDE", "DEFAULT_CHUNK_SIZE", "check_positive_int", "check_stride", "evaluate_candidates",
           "Extremes", "heatmap_extremes", "grid_axis", "flat_to_click"]
