"""PyTorch-style AMSGrad (jaxseg_robust.attacks.perturb.amsgrad) against a NumPy statement of torch's update.

The NumPy reference follows ``torch.optim.Adam(amsgrad=True)`` step by step in
float32 with the Python-double scalars PyTorch uses (``lr / (1 - β1^t)``,
``sqrt(1 - β2^t)``); tolerance: rtol 2e-6 plus 2e-7·lr per step taken (our
float32 bias corrections; the parameter accumulates one rounding per step).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxseg_robust.attacks.perturb.amsgrad import scale_by_torch_amsgrad, torch_amsgrad


def torch_amsgrad_numpy(gradients, lr, b1=0.9, b2=0.999, eps=1e-8, maximize=False):
    """Parameters after each step, starting from 0 (float32 tensors, double scalars, as torch)."""
    f32 = np.float32
    param = np.zeros_like(gradients[0], f32)
    m = np.zeros_like(param)
    v = np.zeros_like(param)
    v_max = np.zeros_like(param)
    history = []
    for step, grad in enumerate(gradients, start=1):
        grad = (-grad if maximize else grad).astype(f32)
        m = m + f32(1 - b1) * (grad - m)
        v = v * f32(b2) + f32(1 - b2) * grad * grad
        v_max = np.maximum(v_max, v)
        step_size = lr / (1 - b1 ** step)
        denominator = np.sqrt(v_max) / f32((1 - b2 ** step) ** 0.5) + f32(eps)
        param = param + f32(-step_size) * (m / denominator)
        history.append(param.copy())
    return history


def gradient_sequence(seed, steps=60, shape=(3, 4)):
    """Gradients whose magnitude grows then shrinks (so the raw-moment maximum matters) with sign flips."""
    rng = np.random.default_rng(seed)
    envelope = np.concatenate([np.linspace(0.1, 3.0, steps // 3), np.linspace(3.0, 1e-3, steps - steps // 3)])
    return [(rng.normal(size=shape) * scale).astype(np.float32) for scale in envelope]


def run_optax(transform, gradients):
    params = jnp.zeros_like(gradients[0])
    state = transform.init(params)
    update = jax.jit(transform.update)
    history = []
    for grad in gradients:
        updates, state = update(jnp.asarray(grad), state)
        params = optax.apply_updates(params, updates)
        history.append(np.asarray(params))
    return history


@settings(max_examples=10)
@given(st.integers(0, 2**31 - 1), st.sampled_from([2 / 255, 1e-3, 0.1]), st.booleans())
def test_matches_torch_formula_step_by_step(seed, lr, maximize):
    gradients = gradient_sequence(seed)
    ours = run_optax(torch_amsgrad(lr, maximize=maximize), gradients)
    reference = torch_amsgrad_numpy(gradients, lr, maximize=maximize)
    for step, (a, b) in enumerate(zip(ours, reference)):
        # Each update is ~lr·sign-like with a relative error ~1e-7; errors add up over steps.
        np.testing.assert_allclose(a, b, rtol=2e-6, atol=2e-7 * lr * (step + 1), err_msg=f"step {step + 1}")


def test_first_step_is_sign_like():
    gradient = np.array([[1e-3, -5.0, 2.0]], np.float32)
    updates, _ = torch_amsgrad(0.5, maximize=True).update(jnp.asarray(gradient),
                                                         torch_amsgrad(0.5).init(jnp.zeros((1, 3))))
    np.testing.assert_allclose(np.asarray(updates), 0.5 * np.sign(gradient), rtol=1e-4)


def test_differs_from_optax_amsgrad_when_the_second_moment_shrinks():
    gradients = gradient_sequence(0)
    ours = run_optax(torch_amsgrad(0.01), gradients)
    theirs = run_optax(optax.amsgrad(0.01, eps=1e-8), gradients)
    relative = np.abs(ours[-1] - theirs[-1]).max() / np.abs(theirs[-1]).max()
    assert relative > 1e-3


def test_state_is_per_element_and_jittable_under_vmap():
    gradients = np.stack(gradient_sequence(1, steps=5, shape=(2, 3)))  # [T, 2, 3]
    transform = scale_by_torch_amsgrad()

    def run_one(sequence):
        state = transform.init(sequence[0])

        def body(state, grad):
            updates, state = transform.update(grad, state)
            return state, updates

        return jax.lax.scan(body, state, sequence)[1]

    batched = jax.jit(jax.vmap(run_one, in_axes=1, out_axes=1))(jnp.asarray(gradients))
    single = run_one(jnp.asarray(gradients[:, :1]))
    np.testing.assert_allclose(np.asarray(batched[:, :1]), np.asarray(single), rtol=1e-6)


@pytest.mark.parametrize("kwargs, match", [(dict(b1=1.0), "b1"), (dict(b2=-0.1), "b2"), (dict(eps=-1.0), "eps")])
def test_rejects_bad_hyperparameters(kwargs, match):
    with pytest.raises(ValueError, match=match):
        scale_by_torch_amsgrad(**kwargs)
    with pytest.raises(ValueError, match="learning_rate"):
        torch_amsgrad(0.0)
