"""`jaxseg_robust.ops.loop_invariant.hoistable`: bit-identical values, hoisted out of compiled loops."""

from __future__ import annotations

import re

import chex
import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import parameterized
from compiled_hlo import loop_body_text, outside_loop_text
from jax import lax

from jaxseg_robust.ops.loop_invariant import hoistable


def _with_specials(first: float) -> np.ndarray:
    """f32[3, 4, 5] normal values with ``first`` at [0, 0, 0] and a NaN, an -inf and a -0 elsewhere."""
    x = np.random.default_rng(0).standard_normal((3, 4, 5)).astype(np.float32)
    x[0, 0, 0] = first
    x[1, 2, 3], x[2, 0, 1], x[2, 3, 4] = np.nan, -np.inf, -0.0
    return x


def _reversed_kernel_loop(prepare):
    """A 3-step loop whose body multiplies by ``prepare(reversed, transposed kernel)`` (both invariant)."""
    def run(kernel, x):
        def body(_, v):
            return jnp.tanh(v @ prepare(jnp.flip(kernel, 0).T))
        return lax.fori_loop(0, 3, body, x)
    return run


class HoistableTest(chex.TestCase, parameterized.TestCase):

    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.parameters(0.5, -0.0, np.inf, -np.inf, np.nan)
    def test_values_are_bit_identical(self, first):
        x = _with_specials(first)
        got = np.asarray(self.variant(hoistable)(x))
        np.testing.assert_array_equal(got.view(np.uint32), x.view(np.uint32))

    @chex.variants(with_jit=True, without_jit=True)
    def test_gradient_is_the_identity(self):
        x = jax.random.normal(jax.random.key(0), (4, 6))
        grad = self.variant(jax.grad(lambda v: jnp.sum(jnp.sin(hoistable(v)))))(x)
        np.testing.assert_array_equal(np.asarray(grad), np.asarray(jnp.cos(x)))

    def test_the_reversed_kernel_moves_out_of_the_loop(self):
        kernel = jax.random.normal(jax.random.key(1), (8, 8))
        x = jax.random.normal(jax.random.key(2), (2, 8))
        plain = jax.jit(_reversed_kernel_loop(lambda k: k)).lower(kernel, x).compile().as_text()
        hoisted = jax.jit(_reversed_kernel_loop(hoistable)).lower(kernel, x).compile().as_text()
        reverse = r"= \S+ reverse\("
        assert re.search(reverse, loop_body_text(plain)), "without hoistable the reverse runs in the loop"
        assert not re.search(reverse, loop_body_text(hoisted))
        assert re.search(reverse, outside_loop_text(hoisted))
        # Same values up to the product's summation order (the kernel reaches the dot in another layout).
        np.testing.assert_allclose(np.asarray(jax.jit(_reversed_kernel_loop(hoistable))(kernel, x)),
                                   np.asarray(jax.jit(_reversed_kernel_loop(lambda k: k))(kernel, x)),
                                   rtol=1e-5, atol=1e-6)
