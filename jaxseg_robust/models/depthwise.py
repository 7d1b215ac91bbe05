"""Depth-wise 2-D convolution as a sum of shifted, scaled copies of the input.

XLA's CPU backend lowers grouped convolutions with one group per channel
(``feature_group_count == channels``) to a slow generic loop, far slower than
the same arithmetic written as kh * kw shifted multiply-adds, which XLA fuses
into one elementwise loop (docs/benchmarking.md, "Measurements behind design
choices", "Depth-wise convolution as shifted sums").
On GPU both forms are fast. The result equals ``lax.conv_general_dilated``
with ``feature_group_count = channels`` up to float rounding (the summation
order differs).

`DepthwiseConv` is a drop-in replacement for ``flax.linen.Conv(features=C,
feature_group_count=C)`` on NHWC inputs: the same parameter names and shapes
(``kernel`` [kh, kw, 1, C], ``bias`` [C]), so checkpoints and ports are unchanged.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

Padding = Sequence[tuple[int, int]]


def _check(x: jax.Array, kernel: jax.Array, strides: tuple[int, int], padding: Padding) -> None:
    if x.ndim != 4:
        raise ValueError(f"x must be [B, H, W, C], got shape {x.shape}")
    if kernel.ndim != 4 or kernel.shape[2] != 1 or kernel.shape[3] != x.shape[-1]:
        raise ValueError(f"kernel must be [kh, kw, 1, C={x.shape[-1]}], got shape {kernel.shape}")
    if len(strides) != 2 or min(strides) < 1:
        raise ValueError(f"strides must be two positive ints, got {strides}")
    if len(padding) != 2 or any(len(p) != 2 or min(p) < 0 for p in padding):
        raise ValueError(f"padding must be ((top, bottom), (left, right)) >= 0, got {padding}")


def depthwise_conv2d(x: jax.Array, kernel: jax.Array, strides: tuple[int, int] = (1, 1),
                     padding: Padding = ((0, 0), (0, 0))) -> jax.Array:
    """Depth-wise cross-correlation of NHWC images (torch ``Conv2d(groups=C)`` semantics).

    Args:
      x: [B, H, W, C] input.
      kernel: [kh, kw, 1, C] per-channel filters (Flax's grouped-conv layout).
      strides: (sy, sx) in pixels.
      padding: ((top, bottom), (left, right)) zero padding in pixels.

    Returns:
      [B, Ho, Wo, C] with Ho = (H + top + bottom - kh) // sy + 1 (likewise Wo),
      in the promoted dtype of ``x`` and ``kernel``.

    Raises:
      ValueError: on wrong ranks, a kernel that does not match the channels,
        non-positive strides, negative padding, or an empty output.
    """
    _check(x, kernel, tuple(strides), padding)
    kh, kw = kernel.shape[:2]
    sy, sx = strides
    xp = jnp.pad(x, ((0, 0), tuple(padding[0]), tuple(padding[1]), (0, 0)))
    height, width = xp.shape[1:3]
    out_h, out_w = (height - kh) // sy + 1, (width - kw) // sx + 1
    if out_h < 1 or out_w < 1:
        raise ValueError(f"kernel {kh}x{kw} does not fit the padded input {height}x{width}")
    out = None
    for i in range(kh):
        for j in range(kw):
            window = jax.lax.slice(xp, (0, i, j, 0),
                                   (xp.shape[0], i + (out_h - 1) * sy + 1, j + (out_w - 1) * sx + 1,
                                    xp.shape[3]), (1, sy, sx, 1))
            term = window * kernel[i, j, 0]
            out = term if out is None else out + term
    return out


class DepthwiseConv(nn.Module):
    """``nn.Conv(features, kernel_size, feature_group_count=features)`` as shifted sums.

    Maps [B, H, W, C] -> [B, Ho, Wo, C] (C = ``features``), see `depthwise_conv2d`.
    Params: ``kernel`` [kh, kw, 1, C] and, with ``use_bias``, ``bias`` [C].

    Attributes:
      features: channels C (in and out).
      kernel_size: (kh, kw).
      strides: (sy, sx).
      padding: ((top, bottom), (left, right)) zero padding.
      use_bias: whether to add a bias.
      dtype: computation dtype (inputs and params are cast to it), or None for
        the inputs' promoted dtype, as ``nn.Conv``.
      param_dtype: parameter storage dtype.
      kernel_init, bias_init: initialisers (the kernel's fan-in is kh * kw).
    """

    features: int
    kernel_size: tuple[int, int]
    strides: tuple[int, int] = (1, 1)
    padding: Padding = ((0, 0), (0, 0))
    use_bias: bool = True
    dtype: Any = None
    param_dtype: Any = jnp.float32
    kernel_init: Callable = nn.initializers.lecun_normal()
    bias_init: Callable = nn.initializers.zeros

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        if x.shape[-1] != self.features:
            raise ValueError(f"DepthwiseConv {self.name}: input has {x.shape[-1]} channels, "
                             f"expected {self.features}")
        kh, kw = self.kernel_size
        kernel = self.param("kernel", self.kernel_init, (kh, kw, 1, self.features), self.param_dtype)
        bias = (self.param("bias", self.bias_init, (self.features,), self.param_dtype)
                if self.use_bias else None)
        dtype = self.dtype or jnp.result_type(x, kernel)
        y = depthwise_conv2d(x.astype(dtype), kernel.astype(dtype), tuple(self.strides),
                             self.padding)
        if bias is not None:
            y = y + bias.astype(dtype)
        return y
