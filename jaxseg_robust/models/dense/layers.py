"""Small NHWC building blocks shared by the dense models, each matching a torch op.

* `conv2d`: a Flax ``nn.Conv`` with torch's explicit symmetric padding
  (``padding = dilation * (k - 1) / 2`` for odd kernels), never "SAME"
  (which pads asymmetrically for stride 2).
* `upsample_bilinear`: torch ``interpolate(mode="bilinear",
  align_corners=False)`` / ONNX ``Resize(linear, pytorch_half_pixel)``, no
  antialias, on the spatial axes of NHWC arrays (tap tables of
  `jaxseg_robust.ops.resize.linear_taps`, bit-exact source positions).
* `max_pool_ceil`: torch ``MaxPool2d(2, stride=2, ceil_mode=True)``.
* `upsample_bilinear_aligned`: torch ``interpolate(mode="bilinear",
  align_corners=True)`` on NHWC arrays (the semseg / DDC-AT PSPNet and
  DeepLabv3 heads; taps of `jaxseg_robust.models.clickability.resize`).
* `adaptive_avg_pool`: torch ``AdaptiveAvgPool2d(bins)`` (PSP pyramid bins,
  image pooling), as two averaging matrices.
* `batch_norm`, `conv_bn_relu`: torch ``BatchNorm2d`` in eval mode, and the
  ``Conv2d(bias=False)`` + ``BatchNorm2d`` + ``ReLU`` unit of the ResNet heads;
  `atrous_branches`: the 1x1 and dilated 3x3 branches of DeepLabv3's ASPP
  (torchvision's and DDC-AT's alike).
"""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

from jaxseg_robust.models.clickability.resize import upsample_align_corners
from jaxseg_robust.ops.conv import conv_general_dilated
from jaxseg_robust.ops.resize import apply_taps, linear_taps


def conv2d(features: int, kernel: int, *, stride: int = 1, dilation: int = 1,
           use_bias: bool = True, name: str | None = None) -> nn.Conv:
    """A torch-equivalent ``Conv2d(.., kernel, stride, padding=dilation*(kernel-1)//2, dilation)``.

    Kernel layout [kh, kw, in, out] (convert torch weights with
    `ports.keytable.conv`). ``kernel`` must be odd. The input gradient is
    written in XLA:CPU's fast form inside loops (`jaxseg_robust.ops.conv`).
    """
    if kernel % 2 != 1:
        raise ValueError(f"kernel must be odd; got {kernel}")
    pad = dilation * (kernel - 1) // 2
    return nn.Conv(features, (kernel, kernel), strides=(stride, stride),
                   padding=((pad, pad), (pad, pad)), kernel_dilation=(dilation, dilation),
                   use_bias=use_bias, name=name, conv_general_dilated=conv_general_dilated)


def batch_norm(eps: float, name: str) -> nn.BatchNorm:
    """torch ``BatchNorm2d`` in eval mode (running statistics), epsilon ``eps``."""
    return nn.BatchNorm(use_running_average=True, epsilon=eps, name=name)


def conv_bn_relu(x: jnp.ndarray, features: int, kernel: int, eps: float, *, prefix: str,
                 dilation: int = 1) -> jnp.ndarray:
    """ReLU(BN(conv(x))) of f32[B, h, w, in] -> f32[B, h, w, features]: a bias-free `conv2d`
    (params ``{prefix}conv``) and an eval-mode `batch_norm` (``{prefix}bn``); call it inside
    a compact module, whose submodules these become."""
    y = conv2d(features, kernel, dilation=dilation, use_bias=False, name=f"{prefix}conv")(x)
    return nn.relu(batch_norm(eps, f"{prefix}bn")(y))


def atrous_branches(x: jnp.ndarray, channels: int, rates: tuple[int, ...], eps: float) -> list[jnp.ndarray]:
    """ASPP's convolution branches of f32[B, h, w, in]: a 1x1 (params ``branch0_*``) and one
    3x3 of dilation ``rates[i - 1]`` each (``branch{i}_*``), every one `conv_bn_relu` to
    f32[B, h, w, channels]. The pooling branch differs between the ASPPs and is theirs."""
    branches = [conv_bn_relu(x, channels, 1, eps, prefix="branch0_")]
    for i, rate in enumerate(rates, start=1):
        branches.append(conv_bn_relu(x, channels, 3, eps, prefix=f"branch{i}_", dilation=rate))
    return branches


def upsample_bilinear(x: jnp.ndarray, out_hw: tuple[int, int]) -> jnp.ndarray:
    """Bilinear resize of f32[..., h, w, C] to f32[..., H, W, C] (torch align_corners=False).

    Half-pixel centres, source position clamped at 0, right neighbour clamped
    at the last sample, no antialias (also when shrinking). ``out_hw`` static.
    """
    out_h, out_w = int(out_hw[0]), int(out_hw[1])
    if x.shape[-3] != out_h:
        x = apply_taps(x, linear_taps(x.shape[-3], out_h), axis=-3)
    if x.shape[-2] != out_w:
        x = apply_taps(x, linear_taps(x.shape[-2], out_w), axis=-2)
    return x


def max_pool_ceil(x: jnp.ndarray) -> jnp.ndarray:
    """torch ``MaxPool2d(2, stride=2, ceil_mode=True)`` on f32[B, h, w, C].

    Returns f32[B, ceil(h/2), ceil(w/2), C]: an odd trailing row/column forms
    a window of its own (padding with -inf).
    """
    h, w = x.shape[-3], x.shape[-2]
    return nn.max_pool(x, (2, 2), strides=(2, 2), padding=((0, h % 2), (0, w % 2)))


def upsample_bilinear_aligned(x: jnp.ndarray, out_hw: tuple[int, int]) -> jnp.ndarray:
    """Bilinear resize of f32[B, h, w, C] to f32[B, H, W, C] (torch align_corners=True).

    Output sample ``o`` reads source position ``o * (in - 1) / (out - 1)`` (a
    1-sample input is broadcast). ``out_hw`` static; identity when sizes agree.
    """
    return upsample_align_corners(x, out_hw, axes=(-3, -2))


def adaptive_pool_matrix(in_size: int, out_size: int) -> np.ndarray:
    """float32[out_size, in_size] averaging matrix of torch's adaptive average pooling.

    Row ``i`` averages inputs ``[floor(i * in / out), ceil((i + 1) * in / out))``
    (windows overlap when ``out`` does not divide ``in``; an output larger than
    the input repeats samples), as ``AdaptiveAvgPool2d`` does along one axis.
    """
    if in_size <= 0 or out_size <= 0:
        raise ValueError(f"in_size and out_size must be positive; got {in_size}, {out_size}")
    matrix = np.zeros((out_size, in_size), np.float32)
    for i in range(out_size):
        start = (i * in_size) // out_size
        end = -((-(i + 1) * in_size) // out_size)
        matrix[i, start:end] = 1.0 / (end - start)
    return matrix


def adaptive_avg_pool(x: jnp.ndarray, bins: int) -> jnp.ndarray:
    """torch ``AdaptiveAvgPool2d(bins)`` of f32[B, h, w, C] -> f32[B, bins, bins, C].

    The rectangle average of torch is the product of the two per-axis window
    averages (`adaptive_pool_matrix`); ``bins = 1`` is the global mean.
    """
    rows = jnp.asarray(adaptive_pool_matrix(x.shape[-3], bins), x.dtype)
    cols = jnp.asarray(adaptive_pool_matrix(x.shape[-2], bins), x.dtype)
    return jnp.einsum("ih,jw,bhwc->bijc", rows, cols, x, precision="highest")
