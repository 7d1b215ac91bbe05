"""PyTorch-style AMSGrad (``torch.optim.Adam(amsgrad=True)``) as an optax GradientTransformation.

Section numbers (§) refer to docs/protocols/perturbation.md.

PyTorch's update at step t (1-based), per element, no weight decay:

    m     <- m + (1 - β1)·(g - m)                   # lerp, = β1·m + (1-β1)·g
    v     <- β2·v + (1 - β2)·g²
    v_max <- max(v_max, v)                           # max of the RAW second moment
    p     <- p - (lr / (1 - β1^t)) · m / (sqrt(v_max) / sqrt(1 - β2^t) + eps)

(``maximize=True`` negates g first, i.e. ascends.) ``optax.amsgrad`` is a
different algorithm: it keeps the maximum of the *bias-corrected* second
moment, ``v̂_max <- max(v̂_max, v / (1 - β2^t))``, and divides by
``sqrt(v̂_max + eps_root) + eps``. Because ``1/(1 - β2^t)`` decreases with t, the
two maxima differ whenever the raw moment shrinks (PyTorch's denominator
then keeps shrinking with the bias correction while optax's stays at its old
maximum). PAdam (§2.2) is defined by the PyTorch version.

Bias corrections are computed in float32 from the step count here, as
``-expm1(t·ln β)`` (PyTorch computes ``1 - β^t`` as Python doubles): a relative
difference of order 1e-7 in the step size.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax


class TorchAMSGradState(NamedTuple):
    """State: step count (int32 scalar, shared by all leaves) and per-leaf m, v, v_max."""

    count: jnp.ndarray
    mu: optax.Updates
    nu: optax.Updates
    nu_max: optax.Updates


def scale_by_torch_amsgrad(b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8) -> optax.GradientTransformation:
    """Rescales gradients to PyTorch's AMSGrad direction ``m̂ / (sqrt(v_max)/sqrt(1-β2^t) + eps)``.

    The output is the *ascent* direction for the given gradients without the
    learning rate (``m / (1 - β1^t)`` over the denominator); chain with
    ``optax.scale(-lr)`` to descend or ``optax.scale(lr)`` to ascend
    (see :func:`torch_amsgrad`).

    Args:
      b1, b2: moment decay rates in [0, 1).
      eps: added to the denominator after the bias correction (not inside the root).

    Returns:
      An optax GradientTransformation; updates have the gradients' shapes/dtypes.
    """
    for name, value in (("b1", b1), ("b2", b2)):
        if not 0.0 <= float(value) < 1.0:
            raise ValueError(f"{name} must be in [0, 1), got {value}")
    if not float(eps) >= 0.0:
        raise ValueError(f"eps must be >= 0, got {eps}")
    log_b1 = math.log(b1) if b1 > 0 else -math.inf
    log_b2 = math.log(b2) if b2 > 0 else -math.inf

    def init_fn(params):
        zeros = lambda: jax.tree.map(jnp.zeros_like, params)
        return TorchAMSGradState(count=jnp.zeros([], jnp.int32), mu=zeros(), nu=zeros(), nu_max=zeros())

    def update_fn(updates, state, params=None):
        del params
        count = state.count + 1
        mu = jax.tree.map(lambda m, g: m + (1.0 - b1) * (g - m), state.mu, updates)
        nu = jax.tree.map(lambda v, g: b2 * v + (1.0 - b2) * (g * g), state.nu, updates)
        nu_max = jax.tree.map(jnp.maximum, state.nu_max, nu)
        step = count.astype(jnp.float32)
        # 1 - β^t = -expm1(t·ln β), ln β from the host in float64: no cancellation when β^t ≈ 1.
        correction1 = -jnp.expm1(step * jnp.float32(log_b1))
        correction2_sqrt = jnp.sqrt(-jnp.expm1(step * jnp.float32(log_b2)))

        def direction(m, v_max):
            denominator = jnp.sqrt(v_max) / correction2_sqrt.astype(v_max.dtype) + eps
            return (1.0 / correction1).astype(m.dtype) * (m / denominator)

        return jax.tree.map(direction, mu, nu_max), TorchAMSGradState(count=count, mu=mu, nu=nu, nu_max=nu_max)

    return optax.GradientTransformation(init_fn, update_fn)


def torch_amsgrad(learning_rate: float, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8,
                  maximize: bool = False) -> optax.GradientTransformation:
    """``torch.optim.Adam(lr, betas=(b1, b2), eps, amsgrad=True, maximize)`` as optax updates (added to params).

    Args:
      learning_rate: step size lr > 0 (units of the parameters).
      b1, b2, eps: as PyTorch.
      maximize: True ascends the objective (PAdam).
    """
    if not float(learning_rate) > 0:
        raise ValueError(f"learning_rate must be > 0, got {learning_rate}")
    sign = 1.0 if maximize else -1.0
    return optax.chain(scale_by_torch_amsgrad(b1, b2, eps), optax.scale(sign * float(learning_rate)))
