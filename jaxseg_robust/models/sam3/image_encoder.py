"""SAM 3's image encoder for the interactive path: the ViT trunk and the SAM 2 neck.

Behaviour matched to ``sam3.model.vitdet.ViT`` and ``sam3.model.necks.Sam3DualViTDetNeck``
(``sam2_convs``; docs/models/sam3.md), channels-last:

* patch embedding: conv ``patch x patch``, stride ``patch``, no bias;
* absolute positions: the pre-training table (class-token row dropped) tiled
  over the grid, not interpolated (``tile_abs_pos``), then ``ln_pre``;
* blocks: pre-norm (LayerNorm eps 1e-5), windowed attention (the grid
  zero-padded after ``norm1`` to a multiple of the window; padded tokens take
  part in attention as in the reference) or global attention; 2-D axial RoPE
  on queries and keys (`axial_rope_angles`: x frequencies then y frequencies,
  on interleaved channel pairs), positions within the window for windowed
  blocks and scaled by window / grid for global ones (``use_interp_rope``);
  exact (erf) GELU MLP; no layer scale;
* neck (scales 4, 2, 1; the 0.5 level is dropped by ``scalp = 1`` and not
  computed): 2x2 stride-2 transposed convolutions (GELU between the two of
  scale 4), a 1x1 and a 3x3 (padding 1) convolution to ``d_model`` channels.
  The neck's sine position encodings feed only the video memory and are not
  computed.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

from jaxseg_robust.models.sam.image_encoder import GeluMLP, window_partition, window_unpartition
from jaxseg_robust.models.sam.layers import PatchConvTranspose, layer_norm
from jaxseg_robust.models.sam3.config import NECK_SCALES, Sam3Config, Sam3VitConfig
from jaxseg_robust.ops.attention import softmax_attention


def axial_rope_angles(head_dim: int, side: int, scale: float, theta: float) -> np.ndarray:
    """``compute_axial_cis``'s angles for a ``side x side`` grid, float32 as the reference.

    Args:
      head_dim: channels per head (a multiple of 4).
      side: grid side (the window, or the whole grid for global blocks).
      scale: position scale (``rope_pt_size / input_size``).
      theta: RoPE base.

    Returns:
      f32[side * side, head_dim / 2]: token ``t = y * side + x`` (row-major) gets
      ``[x * scale * f, y * scale * f]`` with ``f_i = theta^(-4 i / head_dim)``.
    """
    f32 = np.float32
    exponents = np.arange(0, head_dim, 4, dtype=np.int64)[: head_dim // 4].astype(f32) / f32(head_dim)
    freqs = f32(1.0) / np.power(f32(theta), exponents, dtype=f32)
    t = np.arange(side * side, dtype=f32)
    t_x = (t % f32(side)) * f32(scale)
    t_y = np.floor(t / f32(side)) * f32(scale)
    return np.concatenate([np.outer(t_x, freqs), np.outer(t_y, freqs)], axis=-1).astype(f32)


def apply_rope(x: jnp.ndarray, angles: np.ndarray) -> jnp.ndarray:
    """``apply_rotary_enc`` on one tensor: channel pairs (2j, 2j+1) rotated by ``angles[:, j]``.

    Args:
      x: f32[..., N, D] queries or keys.
      angles: f32[N, D / 2].

    Returns:
      f32[..., N, D] (computed in float32, cast back to ``x.dtype``).
    """
    pairs = x.astype(jnp.float32).reshape(*x.shape[:-1], x.shape[-1] // 2, 2)
    cos, sin = jnp.asarray(np.cos(angles)), jnp.asarray(np.sin(angles))
    real = pairs[..., 0] * cos - pairs[..., 1] * sin
    imag = pairs[..., 0] * sin + pairs[..., 1] * cos
    return jnp.stack([real, imag], axis=-1).reshape(x.shape).astype(x.dtype)


def tiled_position_table(table: jnp.ndarray, pretrain_grid: int, grid: int) -> jnp.ndarray:
    """``get_abs_pos(..., tiling=True)`` without the class token.

    Args:
      table: f32[1 + P * P, C] the official table (class-token row first).
      pretrain_grid: P.
      grid: G, the side of the patch grid.

    Returns:
      f32[G, G, C]: the P x P table repeated ``G // P + 1`` times per axis, cut to G
      (the table itself when G == P).
    """
    square = table[1:].reshape(pretrain_grid, pretrain_grid, -1)
    if grid == pretrain_grid:
        return square
    reps = grid // pretrain_grid + 1
    return jnp.tile(square, (reps, reps, 1))[:grid, :grid]


class RopeAttention(nn.Module):
    """Multi-head self-attention with 2-D RoPE on a square token grid.

    Attributes:
      dim, num_heads: channels and heads.
      rope_scale: position scale of the RoPE angles.
      rope_theta: RoPE base.
      dtype: compute dtype (the softmax and the rotation are float32).
    """

    dim: int
    num_heads: int
    rope_scale: float = 1.0
    rope_theta: float = 10000.0
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        """f32[B, S, S, dim] -> f32[B, S, S, dim]."""
        b, h, w, _ = x.shape
        head_dim = self.dim // self.num_heads
        qkv = nn.Dense(3 * self.dim, dtype=self.dtype, name="qkv")(x)
        qkv = qkv.reshape(b, h * w, 3, self.num_heads, head_dim).transpose(2, 0, 3, 1, 4)
        angles = axial_rope_angles(head_dim, h, self.rope_scale, self.rope_theta)
        q, k = apply_rope(qkv[0], angles), apply_rope(qkv[1], angles)  # [B, heads, N, hd]
        q = q * jnp.asarray(head_dim ** -0.5, q.dtype)
        out = softmax_attention(q.astype(jnp.float32), k.astype(jnp.float32),
                                qkv[2].astype(jnp.float32)).astype(self.dtype)
        out = out.transpose(0, 2, 1, 3).reshape(b, h, w, self.dim)
        return nn.Dense(self.dim, dtype=self.dtype, name="proj")(out)


class Sam3VitBlock(nn.Module):
    """Pre-norm block, windowed (``window_size > 0``) or global, with RoPE attention."""

    config: Sam3VitConfig
    window_size: int = 0
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        """f32[B, G, G, C] -> f32[B, G, G, C]."""
        cfg = self.config
        windowed = self.window_size > 0
        side = self.window_size if windowed else cfg.grid_size
        attention = RopeAttention(cfg.embed_dim, cfg.num_heads,
                                  rope_scale=cfg.window_size / side, rope_theta=cfg.rope_theta,
                                  dtype=self.dtype, name="attn")
        y = layer_norm(cfg.norm_eps, name="norm1")(x).astype(self.dtype)
        if windowed:
            h, w = y.shape[1], y.shape[2]
            windows, padded = window_partition(y, self.window_size)
            y = window_unpartition(attention(windows), self.window_size, padded, (h, w))
        else:
            y = attention(y)
        x = x + y.astype(x.dtype)
        y = layer_norm(cfg.norm_eps, name="norm2")(x).astype(self.dtype)
        y = GeluMLP(cfg.embed_dim, cfg.mlp_hidden, dtype=self.dtype, layer_names=("fc1", "fc2"),
                    name="mlp")(y)
        return x + y.astype(x.dtype)


class Sam3Vit(nn.Module):
    """SAM 3's ViT: f32[B, S, S, 3] -> f32[B, G, G, C] (the last block's output).

    Param tree: ``patch_embed/kernel`` [p, p, 3, C], ``pos_embed`` f32[1 + P * P, C],
    ``ln_pre``, ``blocks_{i}/{norm1, attn/{qkv, proj}, norm2, mlp/{fc1, fc2}}``.
    """

    config: Sam3VitConfig
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        cfg = self.config
        p = cfg.patch_size
        x = nn.Conv(cfg.embed_dim, (p, p), strides=(p, p), padding="VALID", use_bias=False,
                    dtype=self.dtype, name="patch_embed")(x.astype(self.dtype)).astype(jnp.float32)
        table = self.param("pos_embed", nn.initializers.normal(0.02),
                           (1 + cfg.pretrain_grid ** 2, cfg.embed_dim))
        x = x + tiled_position_table(table, cfg.pretrain_grid, cfg.grid_size)
        x = layer_norm(cfg.norm_eps, name="ln_pre")(x)
        for i in range(cfg.depth):
            window = 0 if i in cfg.global_att_blocks else cfg.window_size
            x = Sam3VitBlock(cfg, window_size=window, dtype=self.dtype, name=f"blocks_{i}")(x)
        return x


class Sam2NeckLevel(nn.Module):
    """One level of ``sam2_convs``: f32[B, G, G, C] -> f32[B, sG, sG, d_model].

    Params (as the official ``nn.Sequential`` names): scale 4 ``dconv_2x2_0``,
    ``dconv_2x2_1``; scale 2 ``dconv_2x2``; every scale ``conv_1x1``, ``conv_3x3``.
    """

    scale: float
    in_dim: int
    d_model: int
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        dim = self.in_dim
        if self.scale == 4.0:
            x = PatchConvTranspose(dim, dim // 2, name="dconv_2x2_0")(x)
            x = nn.gelu(x, approximate=False)
            x = PatchConvTranspose(dim // 2, dim // 4, name="dconv_2x2_1")(x)
        elif self.scale == 2.0:
            x = PatchConvTranspose(dim, dim // 2, name="dconv_2x2")(x)
        elif self.scale != 1.0:
            raise ValueError(f"the SAM 3 neck has no level of scale {self.scale}")
        x = nn.Conv(self.d_model, (1, 1), dtype=self.dtype, name="conv_1x1")(x.astype(self.dtype))
        x = nn.Conv(self.d_model, (3, 3), padding=((1, 1), (1, 1)), dtype=self.dtype,
                    name="conv_3x3")(x)
        return x.astype(jnp.float32)


class Sam3ImageEncoder(nn.Module):
    """f32[B, S, S, 3] (normalised) -> the three neck levels kept (4G, 2G, G).

    Param tree: ``trunk/...`` (`Sam3Vit`), ``neck_sam2_convs_{0,1,2}/...`` (`Sam2NeckLevel`).
    """

    config: Sam3Config
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jnp.ndarray) -> tuple[jnp.ndarray, jnp.ndarray, jnp.ndarray]:
        """Returns (f32[B, 4G, 4G, d], f32[B, 2G, 2G, d], f32[B, G, G, d])."""
        cfg = self.config
        s = cfg.image_size
        if x.ndim != 4 or x.shape[1:] != (s, s, 3):
            raise ValueError(f"SAM 3 image encoder input must be [B, {s}, {s}, 3]; got {x.shape}")
        trunk = Sam3Vit(cfg.encoder, dtype=self.dtype, name="trunk")(x)
        levels = tuple(Sam2NeckLevel(scale, cfg.encoder.embed_dim, cfg.d_model, dtype=self.dtype,
                                     name=f"neck_sam2_convs_{i}")(trunk)
                       for i, scale in enumerate(NECK_SCALES))
        return levels[0], levels[1], levels[2]


__all__ = ["axial_rope_angles", "apply_rope", "tiled_position_table", "RopeAttention",
           "Sam3VitBlock", "Sam3Vit", "Sam2NeckLevel", "Sam3ImageEncoder"]
