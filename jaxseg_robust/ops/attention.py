"""Softmax attention with a hand-written reverse pass, heads-first layout.

``softmax_attention(q, k, v) = softmax(q k^T) v`` over the last two axes, the
plain (unscaled) product: callers fold any scale into ``q`` first.

Why not ``einsum`` + ``jax.nn.softmax`` and let autodiff derive the reverse
pass: on XLA:CPU the derived pass of that composition materialises several
extra N x N arrays (the softmax's own JVP residuals, the product of the
cotangent with the probabilities, its row sums) and lays some of the products
out token-major, so it cost about 1.6x the reverse pass of torch's
``bmm``/``softmax`` on the same shapes (ViT-B, 12 heads x 784 tokens x 64: 116
against 66 ms for the forward and reverse together on this project's 2-core
CPU; ``experiments/benchmarks/bench_vit_layers.py``). The pass written here keeps every product in ``[..., heads, tokens,
width]`` layout and uses the identity

    sum_k dP[q, k] P[q, k] = sum_d dO[q, d] O[q, d]

(the row sums of the softmax's Jacobian-vector product, taken over the output
width instead of the N x N probabilities, as FlashAttention's backward does),
so the N x N work left is the four products (dP, dV, dQ, dK) and one fused
elementwise pass. The forward is the same arithmetic as before (one max-subtracted
softmax), so values agree to float32 rounding; the reverse pass is the same
derivative in another summation order (relative differences of order 1e-6
against autodiff of the composition, in float32).

The function supports reverse mode (``grad``, ``vjp``) and ``vmap``; it has
no forward-mode rule (``jvp``, ``jacfwd``), which no caller in this project
needs.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def _forward(q: jnp.ndarray, k: jnp.ndarray, v: jnp.ndarray) -> tuple[jnp.ndarray, jnp.ndarray]:
    """(output f32[..., Nq, D], probabilities f32[..., Nq, Nk])."""
    probabilities = jax.nn.softmax(jnp.einsum("...qd,...kd->...qk", q, k), axis=-1)
    return jnp.einsum("...qk,...kd->...qd", probabilities, v), probabilities


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
    output, probabilities = _forward(q, k, v)
    return output, (q, k, v, probabilities, output)


def _softmax_attention_bwd(residuals, d_output):
    q, k, v, probabilities, output = residuals
    d_probabilities = jnp.einsum("...qd,...kd->...qk", d_output, v)
    d_v = jnp.einsum("...qk,...qd->...kd", probabilities, d_output)
    row_dot = jnp.sum(d_output * output, axis=-1, keepdims=True)  # = sum_k dP P, per query
    d_scores = probabilities * (d_probabilities - row_dot)
    d_q = jnp.einsum("...qk,...kd->...qd", d_scores, k)
    d_k = jnp.einsum("...qk,...qd->...kd", d_scores, q)
    return d_q, d_k, d_v


softmax_attention.defvjp(_softmax_attention_fwd, _softmax_attention_bwd)

__all__ = ["softmax_attention"]
