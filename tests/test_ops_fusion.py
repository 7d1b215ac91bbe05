"""`jaxseg_robust.ops.fusion.fusion_boundary`: the value unchanged, a conditional on the CPU, chains cut."""

from __future__ import annotations

import re

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from compiled_hlo import largest_relu_chain

from jaxseg_robust.ops.fusion import fusion_boundary

CPU_ONLY = pytest.mark.skipif(jax.default_backend() != "cpu", reason="the boundary is a conditional on the CPU only")


class _Chain(nn.Module):
    """``blocks`` residual blocks ``x <- relu(x + a x + b)``, a boundary after each one when asked."""

    blocks: int
    boundary: bool

    @nn.compact
    def __call__(self, x):
        for i in range(self.blocks):
            scale = self.param(f"scale{i}", nn.initializers.constant(0.5), (x.shape[-1],))
            shift = self.param(f"shift{i}", nn.initializers.constant(0.1), (x.shape[-1],))
            x = jax.nn.relu(x + x * scale + shift)
            x = nn.Conv(x.shape[-1], (3, 3), padding="SAME", name=f"conv{i}")(x) + x
            if self.boundary:
                x = fusion_boundary(x, scale)
        return x


class FusionBoundaryTest(chex.TestCase):

    @chex.variants(with_jit=True, without_jit=True)
    def test_value_and_gradient_unchanged(self):
        x = jax.random.normal(jax.random.key(0), (3, 4, 5))
        anchor = jnp.asarray([0.25, 1.0])
        out = self.variant(fusion_boundary)(x, anchor)
        np.testing.assert_array_equal(np.asarray(out), np.asarray(x))
        grad = self.variant(jax.grad(lambda v: jnp.sum(jnp.sin(fusion_boundary(v, anchor)))))(x)
        np.testing.assert_array_equal(np.asarray(grad), np.asarray(jnp.cos(x)))

    @chex.variants(with_jit=True, without_jit=True)
    def test_under_vmap_with_an_unbatched_anchor(self):
        x = jax.random.normal(jax.random.key(1), (4, 6))
        anchor = jnp.asarray([2.0])
        out = self.variant(jax.vmap(fusion_boundary, in_axes=(0, None)))(x, anchor)
        np.testing.assert_array_equal(np.asarray(out), np.asarray(x))

    def test_a_non_finite_anchor_still_returns_the_value(self):
        x = jnp.asarray([-1.5, 0.0, 2.0])
        out = jax.jit(fusion_boundary)(x, jnp.asarray([jnp.nan]))
        np.testing.assert_array_equal(np.asarray(out), np.asarray(x))


@CPU_ONLY
def test_cpu_program_keeps_a_conditional_also_under_vmap():
    """A parameter anchor (a jit argument, unbatched) leaves one conditional per boundary in the program."""
    def apply(x, anchor):
        return jnp.tanh(fusion_boundary(jnp.sin(x), anchor)) * 2

    for fn in (apply, jax.vmap(apply, in_axes=(0, None))):
        text = jax.jit(fn).lower(jnp.ones((2, 8)), jnp.ones((3,))).compile().as_text()
        assert len(re.findall(r"= \S+ conditional\(", text)) == 1, text[-2000:]


@CPU_ONLY
def test_boundaries_cut_the_recomputed_residual_chain():
    """Without boundaries XLA:CPU recomputes the whole residual stream in one fusion; with them, one block."""
    x = jax.random.normal(jax.random.key(2), (1, 16, 16, 4))
    sizes, grads = {}, {}
    for boundary in (False, True):
        model = _Chain(blocks=8, boundary=boundary)
        params = model.init(jax.random.key(3), x)

        def loss(v, p, model=model):
            return jnp.sum(jnp.sin(model.apply(p, v)))

        grad = jax.jit(jax.grad(loss))
        sizes[boundary] = largest_relu_chain(grad.lower(x, params).compile().as_text())
        grads[boundary] = np.asarray(grad(x, params))
    np.testing.assert_array_equal(grads[True], grads[False])
    assert sizes[True] <= 2, sizes
    assert sizes[False] > sizes[True], sizes
