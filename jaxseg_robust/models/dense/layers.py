"""Small NHWC building blocks shared by the dense models, each matching a torch op.

* `conv2d`: a Flax ``nn.Conv`` with torch's explicit symmetric padding
  (``padding = dilation * (k - 1) / 2`` for odd kernels), never "SAME"
  (which pads asymmetrically for stride 2).
* `upsample_bilinear`: torch ``interpolate(mode="bilinear",
  align_corners=False)`` / ONNX ``Resize(linear, pytorch_half_pixel)``, no
  antialias, on the spatial axes of NHWC arrays (tap tables of
  `jaxseg_robust.ops.resize.linear_taps`, bit-exact source positions).
* `max_pool_ceil`: torch ``MaxPool2d(2, stride=2, ceil_mode=True)``.
"""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp

from jaxseg_robust.ops.resize import apply_taps, linear_taps


def conv2d(features: int, kernel: int, *, stride: int = 1, dilation: int = 1,
           use_bias: bool = True, name: str | None = None) -> nn.Conv:
    """A torch-equivalent ``Conv2d(.., kernel, stride, padding=dilation*(kernel-1)//2, dilation)``.

    Kernel layout [kh, kw, in, out] (convert torch weights with
    `ports.keytable.conv`). ``kernel`` must be odd.
    """
    if kernel % 2 != 1:
        raise ValueError(f"kernel must be odd; got {kernel}")
    pad = dilation * (kernel - 1) // 2
    return nn.Conv(features, (kernel, kernel), strides=(stride, stride),
                   padding=((pad, pad), (pad, pad)), kernel_dilation=(dilation, dilation),
                   use_bias=use_bias, name=name)


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
