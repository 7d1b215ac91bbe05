"""Building blocks with PyTorch semantics for the clickability network (NHWC).

* `conv2d`: an ``nn.Conv`` with torch's explicit symmetric padding and torch's
  default initialisation (``kaiming_uniform(a=sqrt(5))`` = U(-1/sqrt(fan_in),
  1/sqrt(fan_in)) for kernel and bias), or mmcv ``ConvModule``'s
  (kaiming normal, fan_out, ReLU gain; zero bias) with ``init="conv_module"``.
* `BatchNorm2d`: torch ``BatchNorm2d`` (eps 1e-5, momentum 0.1). Eval mode
  normalises with the running statistics; train mode normalises with the
  biased batch variance and updates the running variance with the *unbiased*
  one, as torch does (Flax's ``nn.BatchNorm`` uses the biased one). Affine
  parameters live in ``params`` (``scale``, ``bias``), running statistics in
  the ``batch_stats`` collection (``mean``, ``var``).
* `DropPath`: per-sample stochastic depth (mmcv ``DropPath``): keep with
  probability ``1 - rate`` and divide by it.
"""

from __future__ import annotations

import math
from typing import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxseg_robust.models.depthwise import DepthwiseConv

Padding = tuple[tuple[int, int], tuple[int, int]]


def _torch_default_kernel_init() -> Callable:
    """torch Conv2d default kernel init: U(-1/sqrt(fan_in), 1/sqrt(fan_in))."""
    return nn.initializers.variance_scaling(1.0 / 3.0, "fan_in", "uniform")


def _torch_default_bias_init(fan_in: int) -> Callable:
    """torch Conv2d default bias init: U(-1/sqrt(fan_in), 1/sqrt(fan_in))."""
    bound = 1.0 / math.sqrt(fan_in)

    def init(key, shape, dtype=jnp.float32):
        return jax.random.uniform(key, shape, dtype, -bound, bound)

    return init


def conv2d(features: int, in_features: int, kernel: tuple[int, int], *, name: str,
           stride: int = 1, padding: tuple[int, int] = (0, 0), groups: int = 1,
           use_bias: bool = True, init: str = "torch") -> nn.Conv:
    """A 2-D convolution on NHWC arrays behaving like torch ``nn.Conv2d``.

    Args:
      features: output channels.
      in_features: input channels (only used for the torch fan-in of the init).
      kernel: (kh, kw).
      name: Flax module name (mirrors the torch attribute name).
      stride: stride in both directions.
      padding: (ph, pw) symmetric zero padding, as torch's ``padding=(ph, pw)``.
      groups: ``feature_group_count`` (``in_features`` for depth-wise).
      use_bias: whether the convolution has a bias.
      init: "torch" (``nn.Conv2d`` default) or "conv_module" (mmcv
        ``ConvModule``: kaiming normal, mode fan_out, ReLU gain, zero bias).

    Returns:
      The ``nn.Conv`` (a `DepthwiseConv` with the same params when depth-wise); its kernel has shape [kh, kw, in_features/groups, features].
    """
    fan_in = (in_features // groups) * kernel[0] * kernel[1]
    if init == "torch":
        kernel_init, bias_init = _torch_default_kernel_init(), _torch_default_bias_init(fan_in)
    elif init == "conv_module":
        kernel_init = nn.initializers.variance_scaling(2.0, "fan_out", "normal")
        bias_init = nn.initializers.zeros
    else:
        raise ValueError(f"init must be 'torch' or 'conv_module'; got {init!r}")
    pads: Padding = ((padding[0], padding[0]), (padding[1], padding[1]))
    if groups > 1 and groups == in_features == features:
        # depth-wise: shifted sums (same params), much faster than XLA's grouped conv on CPU
        return DepthwiseConv(features, tuple(kernel), strides=(stride, stride), padding=pads,
                             use_bias=use_bias, kernel_init=kernel_init, bias_init=bias_init,
                             name=name)
    return nn.Conv(features, kernel, strides=(stride, stride), padding=pads,
                   feature_group_count=groups, use_bias=use_bias, kernel_init=kernel_init,
                   bias_init=bias_init, name=name)


class BatchNorm2d(nn.Module):
    """torch ``BatchNorm2d`` on NHWC arrays (normalises the last axis).

    Attributes:
      epsilon: added to the variance (torch default 1e-5).
      momentum: torch convention: ``running = (1 - momentum) * running +
        momentum * batch`` (0.1; Flax's ``nn.BatchNorm`` momentum 0.9 is the same).
    """

    epsilon: float = 1e-5
    momentum: float = 0.1

    @nn.compact
    def __call__(self, x: jnp.ndarray, train: bool) -> jnp.ndarray:
        """Normalises x f32[..., C]; ``train`` selects batch statistics (and updates
        ``batch_stats``, which must then be mutable) or running statistics."""
        channels = x.shape[-1]
        scale = self.param("scale", nn.initializers.ones, (channels,))
        bias = self.param("bias", nn.initializers.zeros, (channels,))
        running_mean = self.variable("batch_stats", "mean", jnp.zeros, (channels,), jnp.float32)
        running_var = self.variable("batch_stats", "var", jnp.ones, (channels,), jnp.float32)
        if train:
            count = x.size // channels
            if count < 2:
                raise ValueError(f"BatchNorm2d in train mode needs more than one value per "
                                 f"channel; got input shape {x.shape}")
            axes = tuple(range(x.ndim - 1))
            mean = jnp.mean(x, axis=axes)
            var = jnp.mean(jnp.square(x - mean), axis=axes)
            if not self.is_initializing():
                m = self.momentum
                running_mean.value = ((1.0 - m) * running_mean.value
                                      + m * jax.lax.stop_gradient(mean))
                running_var.value = ((1.0 - m) * running_var.value
                                     + m * jax.lax.stop_gradient(var) * (count / (count - 1)))
        else:
            mean, var = running_mean.value, running_var.value
        factor = scale * jax.lax.rsqrt(var + self.epsilon)
        return x * factor + (bias - mean * factor)


class DropPath(nn.Module):
    """Stochastic depth per sample (mmcv ``DropPath``); identity when not training.

    Attributes:
      rate: drop probability in [0, 1).
    """

    rate: float

    @nn.compact
    def __call__(self, x: jnp.ndarray, train: bool) -> jnp.ndarray:
        """x f32[B, ...] -> same shape; uses the 'dropout' RNG stream when training."""
        if not train or self.rate == 0.0:
            return x
        keep = 1.0 - self.rate
        shape = (x.shape[0],) + (1,) * (x.ndim - 1)
        kept = jax.random.bernoulli(self.make_rng("dropout"), keep, shape)
        return jnp.where(kept, x / keep, jnp.zeros_like(x))


def gelu(x: jnp.ndarray) -> jnp.ndarray:
    """Exact (erf) GELU, as torch ``nn.GELU()``."""
    return jax.nn.gelu(x, approximate=False)
