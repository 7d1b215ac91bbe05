"""`jaxseg_robust.ops.attention.softmax_attention`: the composition's values, its derivative, vmap."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import parameterized
from jax.test_util import check_grads

from jaxseg_robust.ops.attention import softmax_attention


def _composed(q, k, v):
    """The reference: einsum, ``jax.nn.softmax``, einsum; derivative by autodiff."""
    probabilities = jax.nn.softmax(jnp.einsum("...qd,...kd->...qk", q, k), axis=-1)
    return jnp.einsum("...qk,...kd->...qd", probabilities, v)


def _inputs(shape_q, n_keys, width_v, seed=0, dtype=jnp.float32):
    keys = jax.random.split(jax.random.key(seed), 4)
    q = jax.random.normal(keys[0], shape_q, dtype)
    k = jax.random.normal(keys[1], shape_q[:-2] + (n_keys, shape_q[-1]), dtype)
    v = jax.random.normal(keys[2], shape_q[:-2] + (n_keys, width_v), dtype)
    weights = jax.random.normal(keys[3], shape_q[:-1] + (width_v,), dtype)
    return q, k, v, weights


class SoftmaxAttentionTest(chex.TestCase):

    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.parameters(((2, 3, 7, 4), 5, 6), ((7, 4), 7, 4), ((2, 2, 3, 9, 8), 9, 8))
    def test_values_and_gradients_match_the_composition(self, shape_q, n_keys, width_v):
        q, k, v, weights = _inputs(shape_q, n_keys, width_v)

        def loss(attention, q, k, v):
            return jnp.sum(jnp.sin(attention(q, k, v)) * weights)

        out = self.variant(softmax_attention)(q, k, v)
        np.testing.assert_allclose(np.asarray(out), np.asarray(_composed(q, k, v)), rtol=1e-6, atol=1e-6)
        grads = self.variant(jax.grad(lambda *a: loss(softmax_attention, *a), argnums=(0, 1, 2)))(q, k, v)
        grads_ref = jax.grad(lambda *a: loss(_composed, *a), argnums=(0, 1, 2))(q, k, v)
        for got, want in zip(grads, grads_ref):  # the same derivative in another summation order
            np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=2e-5, atol=2e-6)

    @chex.variants(with_jit=True, without_jit=True)
    def test_vmap_over_instances_equals_the_loop(self):
        q, k, v, _ = _inputs((3, 2, 6, 4), 6, 5, seed=1)
        batched = self.variant(jax.vmap(softmax_attention))(q, k, v)
        for i in range(3):
            np.testing.assert_allclose(np.asarray(batched[i]), np.asarray(softmax_attention(q[i], k[i], v[i])),
                                       rtol=1e-6, atol=1e-6)


def test_reverse_mode_agrees_with_finite_differences_in_float64():
    with jax.enable_x64(True):
        q, k, v, _ = _inputs((2, 5, 3), 4, 3, seed=2, dtype=jnp.float64)
        check_grads(softmax_attention, (q, k, v), order=1, modes=("rev",), atol=1e-7, rtol=1e-7)


def test_large_scores_stay_finite():
    """The max-subtracted softmax: scores of 1e4 neither overflow nor give NaN gradients."""
    q, k, v, weights = _inputs((1, 4, 3), 4, 2, seed=3)
    q = q * 3e3
    out, grads = jax.value_and_grad(lambda q: jnp.sum(softmax_attention(q, k, v) * weights))(q)
    assert np.isfinite(float(out)) and np.all(np.isfinite(np.asarray(grads)))


def test_forward_mode_is_refused():
    q, k, v, _ = _inputs((3, 2), 3, 2)
    with pytest.raises(TypeError, match="custom_vjp"):
        jax.jvp(softmax_attention, (q, k, v), (q, k, v))


def test_heads_per_chunk_keeps_small_or_few_heads_whole():
    from jaxseg_robust.ops.attention import heads_per_chunk
    assert heads_per_chunk((16, 12), 196, 196, 4) == 192  # windows: 154 kB a head, never chunked
    assert heads_per_chunk((12,), 784, 784, 4) == 12  # one image's 12 heads: 29.5 MB in all, whole
    assert heads_per_chunk((4, 12), 784, 784, 4) == 2  # four images: 2 heads (4.9 MB) at a time
    assert heads_per_chunk((1, 2, 2, 12), 784, 784, 4) == 2
    assert heads_per_chunk((7, 5), 1024, 1024, 4) == 1  # 4 MB a head: one at a time (35 is not even)


@pytest.fixture
def small_chunks(monkeypatch):
    """Chunk thresholds small enough that test-sized inputs take the chunked CPU path."""
    from jaxseg_robust.ops import attention
    monkeypatch.setattr(attention, "_ROW_BYTES", 16)
    monkeypatch.setattr(attention, "_WHOLE_BYTES", 64)
    monkeypatch.setattr(attention, "_CHUNK_BYTES", 2 * 6 * 6 * 4)  # two heads of 6 x 6
    return attention


@pytest.mark.parametrize("jit", [False, True])
def test_chunked_path_equals_the_composition(small_chunks, jit):
    """Eight heads in chunks of two (``lax.map``): the same values and gradients as the composition."""
    assert small_chunks.heads_per_chunk((2, 4), 6, 6, 4) == 2
    q, k, v, weights = _inputs((2, 4, 6, 3), 6, 5, seed=4)

    def loss(attention, q, k, v):
        return jnp.sum(jnp.sin(attention(q, k, v)) * weights)

    wrap = jax.jit if jit else (lambda f: f)
    out = wrap(softmax_attention)(q, k, v)
    np.testing.assert_allclose(np.asarray(out), np.asarray(_composed(q, k, v)), rtol=1e-6, atol=1e-6)
    grads = wrap(jax.grad(lambda *a: loss(softmax_attention, *a), argnums=(0, 1, 2)))(q, k, v)
    grads_ref = jax.grad(lambda *a: loss(_composed, *a), argnums=(0, 1, 2))(q, k, v)
    for got, want in zip(grads, grads_ref):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=2e-5, atol=2e-6)


def test_vmap_decides_chunks_on_the_batched_shape(small_chunks, monkeypatch):
    """Under ``vmap`` the chunking sees the batch's heads (3 instances x 2 heads), not one instance's."""
    seen = []
    decide = small_chunks.heads_per_chunk
    monkeypatch.setattr(small_chunks, "heads_per_chunk", lambda *a: seen.append(a[0]) or decide(*a))
    q, k, v, weights = _inputs((3, 2, 6, 3), 6, 5, seed=5)
    loss = lambda attention, q: jnp.sum(jax.vmap(attention)(q, k, v) * weights)
    grad = jax.jit(jax.grad(lambda q: loss(softmax_attention, q)))(q)
    assert (3, 2) in seen
    np.testing.assert_allclose(np.asarray(grad), np.asarray(jax.grad(lambda q: loss(_composed, q))(q)),
                               rtol=2e-5, atol=2e-6)
