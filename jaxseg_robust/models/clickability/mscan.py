"""MSCAN backbone (SegNeXt) with the RClicks mask-feature injection, NHWC.

Behaviour of mmseg 1.2.2 ``mmseg/models/backbones/mscan.py`` as patched by
RClicks (``IsMSCAN``/``IsStemConv``): the stem's output (after its second
BatchNorm) gets the mask-encoder features added before the first stage's
blocks (docs/protocols/rclicks.md §3.3). Module and parameter names mirror the torch
attribute names so the port's key table reads one-to-one; block ``j`` of
stage ``s`` is the module ``block{s}_{j}``.

Shapes for an input f32[B, H, W, 3] (H, W multiples of 32): stage ``s``
outputs f32[B, H/2^(s+1), W/2^(s+1), embed_dims[s-1]].
"""

from __future__ import annotations

from typing import Sequence

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

from jaxseg_robust.models.clickability.layers import BatchNorm2d, DropPath, conv2d, gelu

# (kernel, padding) of the three strip-convolution branches, (1, k) then (k, 1).
STRIP_KERNELS: tuple[int, ...] = (7, 11, 21)


class StemConv(nn.Module):
    """Stage-1 stem: Conv3x3 s2 -> BN -> GELU -> Conv3x3 s2 -> BN (+ extra features).

    Attributes:
      in_channels: input channels (3).
      out_channels: stage-1 width C1 (the first conv has C1 // 2 channels).
    """

    in_channels: int
    out_channels: int

    @nn.compact
    def __call__(self, x: jnp.ndarray, extra: jnp.ndarray | None, train: bool) -> jnp.ndarray:
        """x f32[B, H, W, 3], extra f32[B, H/4, W/4, C1] or None -> f32[B, H/4, W/4, C1]."""
        half = self.out_channels // 2
        x = conv2d(half, self.in_channels, (3, 3), stride=2, padding=(1, 1), name="proj_0")(x)
        x = BatchNorm2d(name="proj_1")(x, train)
        x = gelu(x)
        x = conv2d(self.out_channels, half, (3, 3), stride=2, padding=(1, 1), name="proj_3")(x)
        x = BatchNorm2d(name="proj_4")(x, train)
        if extra is not None:
            if extra.shape != x.shape:
                raise ValueError(f"mask features have shape {extra.shape}; the stem output "
                                 f"has {x.shape}")
            x = x + extra
        return x


class OverlapPatchEmbed(nn.Module):
    """Stages 2-4 down-sampling: Conv3x3 s2 p1 -> BN."""

    in_channels: int
    out_channels: int

    @nn.compact
    def __call__(self, x: jnp.ndarray, train: bool) -> jnp.ndarray:
        """f32[B, H, W, Cin] -> f32[B, ceil(H/2), ceil(W/2), Cout]."""
        x = conv2d(self.out_channels, self.in_channels, (3, 3), stride=2, padding=(1, 1),
                   name="proj")(x)
        return BatchNorm2d(name="norm")(x, train)


class MSCAAttention(nn.Module):
    """Multi-scale convolutional attention: DW5x5, three DW strip branches, 1x1, gate."""

    channels: int

    @nn.compact
    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        """f32[B, H, W, C] -> f32[B, H, W, C]."""
        c = self.channels
        attn = conv2d(c, c, (5, 5), padding=(2, 2), groups=c, name="conv0")(x)
        total = attn
        for i, k in enumerate(STRIP_KERNELS):
            branch = conv2d(c, c, (1, k), padding=(0, k // 2), groups=c, name=f"conv{i}_1")(attn)
            branch = conv2d(c, c, (k, 1), padding=(k // 2, 0), groups=c,
                            name=f"conv{i}_2")(branch)
            total = total + branch
        attn = conv2d(c, c, (1, 1), name="conv3")(total)
        return attn * x


class MSCASpatialAttention(nn.Module):
    """proj_1 -> GELU -> MSCA -> proj_2, plus the shortcut."""

    channels: int

    @nn.compact
    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        """f32[B, H, W, C] -> f32[B, H, W, C]."""
        c = self.channels
        y = conv2d(c, c, (1, 1), name="proj_1")(x)
        y = gelu(y)
        y = MSCAAttention(c, name="spatial_gating_unit")(y)
        y = conv2d(c, c, (1, 1), name="proj_2")(y)
        return y + x


class Mlp(nn.Module):
    """Conv1x1 (C -> rC) -> DW3x3 -> GELU -> Conv1x1 (rC -> C); dropout rate 0."""

    channels: int
    hidden: int

    @nn.compact
    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        """f32[B, H, W, C] -> f32[B, H, W, C]."""
        h = self.hidden
        x = conv2d(h, self.channels, (1, 1), name="fc1")(x)
        x = conv2d(h, h, (3, 3), padding=(1, 1), groups=h, name="dwconv")(x)
        x = gelu(x)
        return conv2d(self.channels, h, (1, 1), name="fc2")(x)


class MSCABlock(nn.Module):
    """x + DropPath(γ1 · Attn(BN1 x)); then + DropPath(γ2 · MLP(BN2 x)).

    Attributes:
      channels: C.
      mlp_ratio: hidden width factor r (hidden = int(C * r)).
      drop_path: stochastic-depth rate of this block.
      layer_scale_init: initial γ (1e-2).
    """

    channels: int
    mlp_ratio: float
    drop_path: float = 0.0
    layer_scale_init: float = 1e-2

    @nn.compact
    def __call__(self, x: jnp.ndarray, train: bool) -> jnp.ndarray:
        """f32[B, H, W, C] -> f32[B, H, W, C]."""
        c = self.channels
        init = nn.initializers.constant(self.layer_scale_init)
        gamma1 = self.param("layer_scale_1", init, (c,))
        gamma2 = self.param("layer_scale_2", init, (c,))
        drop = DropPath(self.drop_path, name="drop_path")
        y = MSCASpatialAttention(c, name="attn")(BatchNorm2d(name="norm1")(x, train))
        x = x + drop(gamma1 * y, train)
        y = Mlp(c, int(c * self.mlp_ratio), name="mlp")(BatchNorm2d(name="norm2")(x, train))
        return x + drop(gamma2 * y, train)


def drop_path_rates(depths: Sequence[int], max_rate: float) -> list[float]:
    """Per-block stochastic-depth rates, linearly spaced 0 -> ``max_rate`` over all blocks
    (torch ``linspace`` in float32, as mmseg)."""
    total = int(sum(depths))
    return [float(r) for r in np.linspace(0.0, max_rate, total, dtype=np.float32)]


class MSCAN(nn.Module):
    """The MSCAN backbone returning the four stage outputs.

    Attributes:
      embed_dims: widths of the 4 stages.
      depths: blocks per stage.
      mlp_ratios: MLP width factors per stage.
      drop_path_rate: maximal stochastic-depth rate (linear over all blocks).
    """

    embed_dims: Sequence[int] = (64, 128, 320, 512)
    depths: Sequence[int] = (3, 3, 12, 3)
    mlp_ratios: Sequence[float] = (8, 8, 4, 4)
    drop_path_rate: float = 0.1

    @nn.compact
    def __call__(self, x: jnp.ndarray, extra: jnp.ndarray | None,
                 train: bool) -> list[jnp.ndarray]:
        """Runs the backbone.

        Args:
          x: f32[B, H, W, 3] normalised image.
          extra: f32[B, H/4, W/4, embed_dims[0]] features added after the stem, or None.
          train: batch statistics / stochastic depth on.

        Returns:
          Four arrays f32[B, H_s, W_s, embed_dims[s]] (strides 4, 8, 16, 32).
        """
        rates = drop_path_rates(self.depths, self.drop_path_rate)
        outs, cursor, in_channels = [], 0, x.shape[-1]
        for s, (dim, depth, ratio) in enumerate(zip(self.embed_dims, self.depths,
                                                    self.mlp_ratios), start=1):
            if s == 1:
                x = StemConv(in_channels, dim, name="patch_embed1")(x, extra, train)
            else:
                x = OverlapPatchEmbed(in_channels, dim, name=f"patch_embed{s}")(x, train)
            for j in range(depth):
                x = MSCABlock(dim, ratio, drop_path=rates[cursor + j],
                              name=f"block{s}_{j}")(x, train)
            cursor += depth
            x = nn.LayerNorm(epsilon=1e-5, use_fast_variance=False, name=f"norm{s}")(x)
            outs.append(x)
            in_channels = dim
        return outs
