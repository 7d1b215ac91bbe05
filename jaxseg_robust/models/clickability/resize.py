"""Bilinear upsampling with ``align_corners=True`` (torch semantics), NHWC or [..., h, w].

torch ``interpolate(mode="bilinear", align_corners=True)`` maps output sample
``o`` to the source position ``s = o · (in − 1)/(out − 1)`` (both factors in
float32), left tap ``floor(s)``, right tap ``floor(s) + 1`` clamped at the last
sample. The tap tables are built on the host in float32 as torch's CPU kernel
does for float tensors (in float64 for float64 inputs, as it does for double)
and applied with `jaxseg_robust.ops.resize.apply_taps` (differentiable w.r.t.
the input).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from jaxseg_robust.ops.resize import Taps, apply_taps


def align_corners_taps(in_size: int, out_size: int, dtype=np.float32) -> Taps:
    """Tap table of torch's linear resize with ``align_corners=True``, one axis (host).

    Args:
      in_size: input samples (> 0).
      out_size: output samples (> 0).
      dtype: the arithmetic of the positions and weights: float32 (torch on
        float tensors) or float64 (torch on double tensors computes them in double).

    Returns:
      (index int32[out_size, 2], weight ``dtype``[out_size, 2]).
    """
    if in_size <= 0 or out_size <= 0:
        raise ValueError(f"in_size and out_size must be positive; got {in_size}, {out_size}")
    f = np.dtype(dtype).type
    scale = f(in_size - 1) / f(out_size - 1) if out_size > 1 else f(0.0)
    src = (f(scale) * np.arange(out_size, dtype=f)).astype(f)
    i0 = np.minimum(np.floor(src).astype(np.int64), in_size - 1)
    lam = np.clip(src - i0.astype(f), 0.0, 1.0).astype(f)
    i1 = np.where(i0 < in_size - 1, i0 + 1, i0)
    index = np.stack([i0, i1], axis=1).astype(np.int32)
    weight = np.stack([f(1.0) - lam, lam], axis=1).astype(f)
    return index, weight


def upsample_align_corners(x: jnp.ndarray, out_hw: tuple[int, int], *,
                           axes: tuple[int, int] = (-2, -1)) -> jnp.ndarray:
    """Bilinear resize with ``align_corners=True`` along two axes (static sizes).

    Args:
      x: float array; ``axes`` name its (height, width) axes ([..., h, w] by default).
      out_hw: static (H, W).
      axes: the (height, width) axes.

    Returns:
      ``x`` resampled to H x W along ``axes``; same dtype.
    """
    ax_h, ax_w = (a % x.ndim for a in axes)
    taps_dtype = np.float64 if x.dtype == jnp.float64 else np.float32  # as torch's kernel
    x = apply_taps(x, align_corners_taps(x.shape[ax_w], int(out_hw[1]), taps_dtype), axis=ax_w)
    return apply_taps(x, align_corners_taps(x.shape[ax_h], int(out_hw[0]), taps_dtype), axis=ax_h)
