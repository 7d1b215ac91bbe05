"""Softmax attention with a hand-written reverse pass, heads-first layout.

``softmax_attention(q, k, v) = softmax(q k^T) v`` over the last two axes, the
plain (unscaled) product: callers fold any scale into ``q`` first.

Why not ``einsum`` + ``jax.nn.softmax`` and let autodiff derive the reverse
pass: on XLA:CPU the derived pass of that composition materialises several
extra N x N arrays (the softmax's own JVP residuals, the product of the
cotangent with the probabilities, its row sums) and lays some of the products
out token-major, so it was markedly slower than the reverse pass of torch's
``bmm``/``softmax`` on the same shapes (docs/benchmarking.md, "Measurements
behind design choices", "Attention's reverse pass and chunks of heads"). The
pass written here keeps
every product in ``[..., heads, tokens, width]`` layout and uses the identity

    sum_k dP[q, k] P[q, k] = sum_d dO[q, d] O[q, d]

(the row sums of the softmax's Jacobian-vector product, taken over the output
width instead of the N x N probabilities, as FlashAttention's backward does).
The forward keeps only each query's score maximum and exponential sum; the
reverse pass recomputes the probabilities from them (one extra ``q k^T``), so
no N x N array outlives the function, and the N x N work left is five products
and two fused elementwise passes.

**Chunks on the CPU.** A head's probabilities at 784 tokens are 2.4 MB, more
than a core's L2 cache; several images' worth (the attack's batch of MIN / MAX
trajectories and flips: 4 x 12 heads, 118 MB) no longer fit the last-level
cache either, and XLA:CPU's batched products and softmax then ran at a
fraction of their one-image speed. So when a head's N x N array exceeds
``_ROW_BYTES`` and all heads together exceed ``_WHOLE_BYTES``, the leading
axes are flattened and processed a few heads at a time (``lax.map``;
``_CHUNK_BYTES`` of probabilities per step), the reverse pass too (figures:
the same entry of docs/benchmarking.md). Small windows (196 tokens: 154 kB a
head) stay whole; chunking them only adds loop overhead. Other platforms always
take the whole array (``lax.platform_dependent``). Values are the same
arithmetic either way.

The forward is the authors' arithmetic (one max-subtracted softmax, then the
product with ``v``), so values agree with the composition to float32
rounding; the reverse pass is the same derivative in another summation order
(relative differences of order 1e-6 against autodiff of the composition, in
float32).

The function supports reverse mode (``grad``, ``vjp``) and ``vmap``; it has
no forward-mode rule (``jvp``, ``jacfwd``), which no caller in this project
needs.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax import custom_batching, lax

_ROW_BYTES = 2**20  # one head's N x N probabilities above this: larger than a core's L2 cache
_WHOLE_BYTES = 32 * 2**20  # all heads' probabilities above this: larger than the last-level cache
_CHUNK_BYTES = 6 * 2**20  # probabilities computed per chunk when chunking


def _probabilities(q, k, row_max=None, row_sum=None):
    """(softmax(q k^T) f32[..., Nq, Nk], its row maxima f32[..., Nq, 1], exponential sums f32[..., Nq, 1]).

    Given ``row_max`` and ``row_sum`` (from an earlier call on the same
    ``q, k``) the probabilities are recomputed with them.
    """
    scores = jnp.einsum("...qd,...kd->...qk", q, k)
    if row_max is None:
        row_max = jnp.max(scores, axis=-1, keepdims=True)
        exponentials = jnp.exp(scores - row_max)
        row_sum = jnp.sum(exponentials, axis=-1, keepdims=True)
    else:
        exponentials = jnp.exp(scores - row_max)
    return exponentials / row_sum, row_max, row_sum


def _forward_block(q, k, v):
    """(output f32[..., Nq, Dv], row maxima, exponential sums) of one block of heads."""
    probabilities, row_max, row_sum = _probabilities(q, k)
    return jnp.einsum("...qk,...kd->...qd", probabilities, v), row_max, row_sum


def _reverse_block(q, k, v, output, row_max, row_sum, d_output):
    """(dq, dk, dv) of one block of heads, the probabilities recomputed."""
    probabilities, _, _ = _probabilities(q, k, row_max, row_sum)
    d_probabilities = jnp.einsum("...qd,...kd->...qk", d_output, v)
    d_v = jnp.einsum("...qk,...qd->...kd", probabilities, d_output)
    row_dot = jnp.sum(d_output * output, axis=-1, keepdims=True)  # = sum_k dP P, per query
    d_scores = probabilities * (d_probabilities - row_dot)
    d_q = jnp.einsum("...qk,...kd->...qd", d_scores, k)
    d_k = jnp.einsum("...qk,...qd->...kd", d_scores, q)
    return d_q, d_k, d_v


def heads_per_chunk(leading: tuple[int, ...], n_queries: int, n_keys: int, itemsize: int) -> int:
    """How many heads (rows of the flattened leading axes) the CPU computes at a time.

    All of them (no chunking) unless one head's probabilities exceed
    ``_ROW_BYTES`` and all heads' exceed ``_WHOLE_BYTES``; then the largest
    divisor of the row count whose probabilities fit ``_CHUNK_BYTES`` (at least 1).
    """
    rows = math.prod(leading)
    row_bytes = n_queries * n_keys * itemsize
    if row_bytes <= _ROW_BYTES or rows * row_bytes <= _WHOLE_BYTES:
        return rows
    fitting = max(1, _CHUNK_BYTES // row_bytes)
    return max(c for c in range(1, min(fitting, rows) + 1) if rows % c == 0)


def _in_chunks(block: Callable, *arrays):
    """``block(*arrays)`` computed ``heads_per_chunk`` heads at a time (``lax.map``); the
    leading axes of every array (all ``arrays[0].shape[:-2]``) are flattened and restored."""
    q = arrays[0]
    leading = q.shape[:-2]
    rows = math.prod(leading)
    per_chunk = heads_per_chunk(leading, q.shape[-2], arrays[1].shape[-2], q.dtype.itemsize)
    if per_chunk == rows:
        return block(*arrays)
    chunked = tuple(a.reshape((rows // per_chunk, per_chunk) + a.shape[-2:]) for a in arrays)
    outs = lax.map(lambda chunk: block(*chunk), chunked)
    return jax.tree.map(lambda o: o.reshape(leading + o.shape[-2:]), outs)


def _on_platform(block: Callable, *arrays):
    """``block(*arrays)``: in chunks on the CPU (`_in_chunks`), whole elsewhere."""
    return lax.platform_dependent(*arrays, cpu=lambda *a: _in_chunks(block, *a), default=block)


def _seeing_the_batch(block: Callable) -> Callable:
    """`_on_platform` of ``block``, deciding its chunks on the batched shapes under ``vmap``.

    ``vmap`` of a function traces it on one instance's shapes, so the chunking
    decision would see one instance's heads, not the batch's. This rule moves
    each batch axis to the front (broadcasting unbatched arguments) and calls
    the function again on the whole batch, whose leading axes it flattens.
    """
    batched_block = custom_batching.custom_vmap(lambda *arrays: _on_platform(block, *arrays))

    @batched_block.def_vmap
    def _rule(axis_size, in_batched, *arrays):
        arrays = [a if b else jnp.broadcast_to(a, (axis_size,) + a.shape) for a, b in zip(arrays, in_batched)]
        outs = batched_block(*arrays)
        return outs, jax.tree.map(lambda _: True, outs)

    return batched_block


_forward = _seeing_the_batch(_forward_block)
_reverse = _seeing_the_batch(_reverse_block)


@jax.custom_vjp
def softmax_attention(q: jnp.ndarray, k: jnp.ndarray, v: jnp.ndarray) -> jnp.ndarray:
    """``softmax(q k^T, axis=-1) v``.

    Args:
      q: f32[..., Nq, D] queries (already scaled).
      k: f32[..., Nk, D] keys.
      v: f32[..., Nk, Dv] values.

    Returns:
      f32[..., Nq, Dv]; the leading axes (batch, heads, windows) are shared by
      all three inputs.
    """
    return _forward(q, k, v)[0]


def _softmax_attention_fwd(q, k, v):
    output, row_max, row_sum = _forward(q, k, v)
    return output, (q, k, v, output, row_max, row_sum)


def _softmax_attention_bwd(residuals, d_output):
    return _reverse(*residuals, d_output)


softmax_attention.defvjp(_softmax_attention_fwd, _softmax_attention_bwd)

__all__ = ["heads_per_chunk", "softmax_attention"]
