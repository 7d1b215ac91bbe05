"""Tiny segmentation models and synthetic data for the perturbation-attack tests.

* ``logits_fn(params, images f32[B,H,W,3]) -> f32[B,H,W,C]``: three 'SAME'
  convolutions (3x3, 3x3, 1x1) with ReLU, NHWC / HWIO, pure ``lax``.
* ``synthetic_batch``: grey images (random level per image, pixel noise) with
  discs and rectangles whose colour is shifted along a class-specific
  colour-opponent direction by ``contrast`` (0.06): classes are separable by a
  local colour test, and an L∞ perturbation of 8/255 (two channels moving in
  opposite directions) can cross the decision boundary - a "normally trained"
  model that the strong attacks should break.
* ``trained_params``: a few hundred Adam steps on such data (cached per process).
* ``torch_module``: the same network in PyTorch with the same weights (parity tests).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import lax

NUM_CLASSES = 4
COLOR_DIRECTIONS = np.array([[0.0, 0.0, 0.0], [1.0, -1.0, 0.0], [0.0, 1.0, -1.0], [-1.0, 0.0, 1.0]], np.float32)


def init_params(key, num_classes: int = NUM_CLASSES, width: int = 16) -> dict:
    """He-initialised conv weights (HWIO) and biases of the toy net."""
    shapes = [(3, 3, 3, width), (3, 3, width, width), (1, 1, width, num_classes)]
    params = {}
    for index, shape in enumerate(shapes):
        key, sub = jax.random.split(key)
        fan_in = shape[0] * shape[1] * shape[2]
        params[f"w{index}"] = jax.random.normal(sub, shape, jnp.float32) * np.sqrt(2.0 / fan_in)
        params[f"b{index}"] = jnp.zeros(shape[-1], jnp.float32)
    return params


def _plain_conv(x, w):
    return lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"),
                                    precision=lax.Precision.HIGHEST)


@jax.custom_vjp
def _conv_same(x, w):
    """Stride-1 'SAME' conv whose input gradient is a plain conv with an explicitly flipped, transposed kernel.

    Same values and gradients as ``_plain_conv``. Reason: XLA:CPU lowers JAX's
    input-gradient conv inside a while loop with an ``01oi`` kernel layout that
    it cannot re-layout there, which runs ~10x slower than the ``01io`` form it
    uses outside loops; writing the transposed kernel explicitly keeps the fast
    form (see the perturbation benchmark).
    """
    return _plain_conv(x, w)


def _conv_same_fwd(x, w):
    return _plain_conv(x, w), (x, w)


def _conv_same_bwd(residuals, grad):
    x, w = residuals
    flipped = jnp.transpose(jnp.flip(w, (0, 1)), (0, 1, 3, 2))
    grad_x = _plain_conv(grad, flipped)
    grad_w = jax.vjp(lambda kernel: _plain_conv(x, kernel), w)[1](grad)[0]
    return grad_x, grad_w


_conv_same.defvjp(_conv_same_fwd, _conv_same_bwd)


def _conv(x, w, b, fast_input_grad: bool = True):
    return (_conv_same(x, w) if fast_input_grad else _plain_conv(x, w)) + b


def logits_fn(params, images, fast_input_grad: bool = True):
    """Toy model: f32[B,H,W,3] in [0,1] -> logits f32[B,H,W,C] (images centred at 0.5).

    ``fast_input_grad=False`` uses JAX's own conv transpose rule (slow inside loops on CPU).
    """
    x = images - 0.5
    x = jax.nn.relu(_conv(x, params["w0"], params["b0"], fast_input_grad))
    x = jax.nn.relu(_conv(x, params["w1"], params["b1"], fast_input_grad))
    return _conv(x, params["w2"], params["b2"], fast_input_grad)


def plain_logits_fn(params, images):
    """``logits_fn`` with JAX's default conv gradients."""
    return logits_fn(params, images, fast_input_grad=False)


def synthetic_batch(seed: int, batch: int, height: int = 32, width: int = 32, contrast: float = 0.035,
                    noise: float = 0.01, num_classes: int = NUM_CLASSES):
    """(images f32[B,H,W,3] in [0,1], labels int32[B,H,W]) of grey scenes with coloured shapes."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[:height, :width]
    images = np.empty((batch, height, width, 3), np.float32)
    labels = np.zeros((batch, height, width), np.int32)
    for b in range(batch):
        level = rng.uniform(0.3, 0.7)
        label = np.zeros((height, width), np.int32)
        for _ in range(rng.integers(2, 5)):
            cls = int(rng.integers(1, num_classes))
            cy, cx = rng.uniform(0.15, 0.85) * height, rng.uniform(0.15, 0.85) * width
            ry, rx = rng.uniform(0.12, 0.3) * height, rng.uniform(0.12, 0.3) * width
            if rng.random() < 0.5:
                shape = ((yy - cy) / ry) ** 2 + ((xx - cx) / rx) ** 2 <= 1.0
            else:
                shape = (np.abs(yy - cy) <= ry) & (np.abs(xx - cx) <= rx)
            label[shape] = cls
        directions = COLOR_DIRECTIONS[np.minimum(label, len(COLOR_DIRECTIONS) - 1)]
        image = level + contrast * directions + rng.normal(0.0, noise, (height, width, 3))
        images[b] = np.clip(image, 0.0, 1.0)
        labels[b] = label
    return jnp.asarray(images), jnp.asarray(labels)


@functools.lru_cache(maxsize=None)
def trained_params(steps: int = 150, seed: int = 0) -> dict:
    """Toy net trained with Adam (lr 1e-2, batch 16 of fresh 32x32 scenes) for ``steps`` steps."""
    params = init_params(jax.random.key(seed))
    optimizer = optax.adam(1e-2)
    state = optimizer.init(params)

    @jax.jit
    def update(params, state, images, labels):
        def loss_fn(p):
            logits = logits_fn(p, images)
            return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, labels))

        grads = jax.grad(loss_fn)(params)
        updates, state = optimizer.update(grads, state)
        return optax.apply_updates(params, updates), state

    for step in range(steps):
        images, labels = synthetic_batch(10_000 + step, 16)
        params, state = update(params, state, images, labels)
    return jax.tree.map(np.asarray, params)


def accuracy(params, images, labels) -> float:
    """Pooled pixel accuracy of the toy model."""
    return float(jnp.mean(jnp.argmax(logits_fn(params, images), -1) == labels))


def torch_module(params):
    """The toy net as a torch ``nn.Module`` on NCHW inputs (imports torch; parity tests only)."""
    import torch
    from torch import nn

    class Toy(nn.Module):
        def __init__(self):
            super().__init__()
            convs = []
            for index in range(3):
                w = np.asarray(params[f"w{index}"])
                conv = nn.Conv2d(w.shape[2], w.shape[3], w.shape[0], padding=w.shape[0] // 2)
                conv.weight.data = torch.from_numpy(np.ascontiguousarray(w.transpose(3, 2, 0, 1)))
                conv.bias.data = torch.from_numpy(np.asarray(params[f"b{index}"]).copy())
                convs.append(conv)
            self.convs = nn.ModuleList(convs)

        def forward(self, x):
            x = x - 0.5
            x = torch.relu(self.convs[0](x))
            x = torch.relu(self.convs[1](x))
            return self.convs[2](x)

    return Toy().eval()
