"""AdaptiveClick's pixel decoder: Mask2Former's ``MSDeformAttnPixelDecoder`` on SimpleFPN maps, NHWC.

``PixelDecoder(levels) -> (mask_features, multi_scale)`` mirrors
``MSDeformAttnPixelDecoder.forward_features`` of the authors' code
(``isegm/model/modeling/mask2former_helper/msdeformattn.py``, with
``ms_deform_attn_core_pytorch``, the sampling the authors run):

1. the stride-8, 16 and 32 maps (res3..res5) are each projected (1x1 conv +
   GroupNorm(32)) and, coarsest first, flattened into one token sequence, with
   the sine position embedding (`sine_position_embedding`) plus a per-level
   embedding as the query's position;
2. ``encoder_layers`` post-norm deformable encoder layers: every token samples
   ``points`` locations per head and level around its reference point (the
   pixel centre, normalised), bilinearly (``grid_sample``, ``align_corners=False``,
   zeros outside), weighted by a softmax over levels x points;
3. the stride-4 map (res2) joins as one FPN level: a 1x1 lateral conv + GN +
   ReLU, plus the stride-8 output resized bilinearly, then a 3x3 conv + GN + ReLU;
4. ``mask_features``: a 1x1 conv of that stride-4 map.

Returns the mask features f32[B, H/4, W/4, mask_dim] and the decoder's three
levels [stride 32, 16, 8], each f32[B, h, w, conv_dim]. Parameter names follow
the torch module paths (``input_proj/0/0/weight``, ``transformer/encoder/layers/0/
self_attn/sampling_offsets/weight``, ``adapter_1/0/weight``).
"""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from jaxseg_robust.models.adaptiveclick.config import GROUPNORM_GROUPS, AdaptiveClickConfig
from jaxseg_robust.models.clickmap.layers import Conv2d, LayerNorm, Linear, standardise
from jaxseg_robust.models.simpleclick.network import SimpleFPN, resize_bilinear_nhwc

SINE_TEMPERATURE = 10000.0
SINE_EPS = 1e-6


def sine_position_embedding(hw: tuple[int, int], num_feats: int) -> np.ndarray:
    """Mask2Former's ``PositionEmbeddingSine(num_feats, normalize=True)`` of an h x w map (host, float32).

    Returns f32[h, w, 2 num_feats]: the y half then the x half, each
    (sin, cos) pairs of ``2 pi (i + 1) / (n + 1e-6) / 10000^(2 floor(k / 2) / num_feats)``.
    """
    f32 = np.float32
    h, w = int(hw[0]), int(hw[1])
    scale = f32(2 * math.pi)
    y = np.arange(1, h + 1, dtype=f32) / (f32(h) + f32(SINE_EPS)) * scale
    x = np.arange(1, w + 1, dtype=f32) / (f32(w) + f32(SINE_EPS)) * scale
    k = np.arange(num_feats, dtype=f32)
    dim_t = (f32(SINE_TEMPERATURE) ** (f32(2) * np.floor(k / f32(2)) / f32(num_feats))).astype(f32)

    def encode(pos: np.ndarray) -> np.ndarray:
        p = pos[:, None] / dim_t
        return np.stack([np.sin(p[:, 0::2]), np.cos(p[:, 1::2])], axis=2).reshape(len(pos), num_feats)

    py, px = encode(y), encode(x)
    return np.concatenate([np.broadcast_to(py[:, None], (h, w, num_feats)),
                           np.broadcast_to(px[None, :], (h, w, num_feats))], axis=-1).astype(f32)


class GroupNorm(nn.Module):
    """torch ``nn.GroupNorm(groups, C)`` on f32[..., H, W, C]."""

    num_channels: int
    groups: int = GROUPNORM_GROUPS
    eps: float = 1e-5

    @nn.compact
    def __call__(self, x):
        c, g = self.num_channels, self.groups
        y = standardise(x.reshape(x.shape[:-1] + (g, c // g)), self.eps, (-4, -3, -1)).reshape(x.shape)
        return y * self.param("weight", nn.initializers.ones, (c,)) + \
            self.param("bias", nn.initializers.zeros, (c,))


class ConvNorm(nn.Module):
    """``nn.Sequential(Conv2d, GroupNorm(32))`` (children "0", "1"), optionally followed by ReLU."""

    in_channels: int
    out_channels: int
    kernel_size: int = 1
    relu: bool = False

    @nn.compact
    def __call__(self, x):
        pad = self.kernel_size // 2
        y = Conv2d(self.in_channels, self.out_channels, self.kernel_size, padding=pad, name="0")(x)
        y = GroupNorm(self.out_channels, name="1")(y)
        return jax.nn.relu(y) if self.relu else y


def bilinear_sample(value: jnp.ndarray, hw: tuple[int, int], locations: jnp.ndarray) -> jnp.ndarray:
    """torch ``grid_sample(bilinear, zeros, align_corners=False)`` of one level, per head.

    Args:
      value: f32[B, M, h w, D] (heads first, pixels row-major).
      hw: the level's (h, w).
      locations: f32[B, M, S, 2] sampling points (x, y) in [0, 1] of the level (outside: zeros).

    Returns:
      f32[B, M, S, D].
    """
    h, w = hw
    px = locations[..., 0] * w - 0.5
    py = locations[..., 1] * h - 0.5
    x0, y0 = jnp.floor(px), jnp.floor(py)
    fx, fy = px - x0, py - y0
    total = 0.0
    for dy, wy in ((0, 1.0 - fy), (1, fy)):
        for dx, wx in ((0, 1.0 - fx), (1, fx)):
            xi, yi = x0 + dx, y0 + dy
            inside = (xi >= 0) & (xi <= w - 1) & (yi >= 0) & (yi <= h - 1)
            index = (jnp.clip(yi, 0, h - 1) * w + jnp.clip(xi, 0, w - 1)).astype(jnp.int32)
            corner = jnp.take_along_axis(value, index[..., None], axis=2)
            total = total + corner * jnp.where(inside, wx * wy, 0.0)[..., None].astype(value.dtype)
    return total


class MSDeformAttn(nn.Module):
    """Multi-scale deformable attention (``ms_deform_attn_core_pytorch``): f32[B, Lq, C] queries ->
    f32[B, Lq, C], sampling ``value_tokens`` f32[B, sum h w, C] of ``shapes`` around ``reference``
    f32[Lq, 2] ((x, y) in [0, 1], the same for every level)."""

    dim: int
    levels: int
    heads: int
    points: int

    @nn.compact
    def __call__(self, query, reference, value_tokens, shapes: tuple[tuple[int, int], ...]):
        b, lq, _ = query.shape
        m, lv, p = self.heads, self.levels, self.points
        d = self.dim // m
        value = Linear(self.dim, self.dim, name="value_proj")(value_tokens)
        value = value.reshape(b, -1, m, d).transpose(0, 2, 1, 3)  # [B, M, S, D]
        offsets = Linear(self.dim, m * lv * p * 2, name="sampling_offsets")(query).reshape(b, lq, m, lv, p, 2)
        weights = Linear(self.dim, m * lv * p, name="attention_weights")(query).reshape(b, lq, m, lv * p)
        weights = jax.nn.softmax(weights, axis=-1).reshape(b, lq, m, lv, p)
        out, start = 0.0, 0
        for level, (h, w) in enumerate(shapes):
            normalizer = jnp.asarray([w, h], query.dtype)
            loc = reference[None, :, None, None, :] + offsets[:, :, :, level] / normalizer  # [B, Lq, M, P, 2]
            loc = loc.transpose(0, 2, 1, 3, 4).reshape(b, m, lq * p, 2)
            sampled = bilinear_sample(value[:, :, start:start + h * w], (h, w), loc).reshape(b, m, lq, p, d)
            out = out + jnp.einsum("bmqpd,bqmp->bqmd", sampled, weights[:, :, :, level])
            start += h * w
        return Linear(self.dim, self.dim, name="output_proj")(out.reshape(b, lq, self.dim))


class EncoderLayer(nn.Module):
    """``MSDeformAttnTransformerEncoderLayer`` (post-norm; dropout is the identity at inference)."""

    dim: int
    ffn_dim: int
    levels: int
    heads: int
    points: int

    @nn.compact
    def __call__(self, src, pos, reference, shapes):
        attn = MSDeformAttn(self.dim, self.levels, self.heads, self.points, name="self_attn")
        src = LayerNorm(self.dim, name="norm1")(src + attn(src + pos, reference, src, shapes))
        ffn = Linear(self.ffn_dim, self.dim, name="linear2")(
            jax.nn.relu(Linear(self.dim, self.ffn_dim, name="linear1")(src)))
        return LayerNorm(self.dim, name="norm2")(src + ffn)


def reference_points(shapes: tuple[tuple[int, int], ...]) -> np.ndarray:
    """Pixel centres ((x + 0.5) / w, (y + 0.5) / h) of every level, concatenated: f32[sum h w, 2] (host)."""
    out = []
    for h, w in shapes:
        ys = np.linspace(0.5, h - 0.5, h, dtype=np.float32) / np.float32(h)
        xs = np.linspace(0.5, w - 0.5, w, dtype=np.float32) / np.float32(w)
        gy, gx = np.meshgrid(ys, xs, indexing="ij")
        out.append(np.stack([gx.reshape(-1), gy.reshape(-1)], axis=-1))
    return np.concatenate(out, axis=0).astype(np.float32)


class EncoderLayers(nn.Module):
    """``encoder.layers``: the encoder layers (children "0", "1", ...) applied in turn."""

    config: AdaptiveClickConfig
    levels: int

    @nn.compact
    def __call__(self, tokens, pos, reference, shapes):
        cfg = self.config
        for i in range(cfg.encoder_layers):
            layer = EncoderLayer(cfg.conv_dim, cfg.encoder_ffn_dim, self.levels, cfg.num_heads_decoder,
                                 cfg.encoder_points, name=str(i))
            tokens = layer(tokens, pos, reference, shapes)
        return tokens


class Encoder(nn.Module):
    """``encoder`` (``MSDeformAttnTransformerEncoder``): its one child "layers"."""

    config: AdaptiveClickConfig
    levels: int

    @nn.compact
    def __call__(self, tokens, pos, reference, shapes):
        return EncoderLayers(self.config, self.levels, name="layers")(tokens, pos, reference, shapes)


class InputProjections(nn.Module):
    """``input_proj``: 1x1 conv + GroupNorm of res5, res4, res3 (children "0", "1", "2"), coarsest first."""

    config: AdaptiveClickConfig

    @nn.compact
    def __call__(self, maps):
        cfg = self.config
        dims = cfg.neck_out_dims
        return [ConvNorm(dims[3 - i], cfg.conv_dim, name=str(i))(maps[3 - i]) for i in range(3)]


class DeformableEncoder(nn.Module):
    """``transformer`` (``MSDeformAttnTransformerEncoderOnly``): projected levels f32[B, h, w, C]
    (coarsest first) -> the encoded levels, same shapes."""

    config: AdaptiveClickConfig

    @nn.compact
    def __call__(self, srcs):
        cfg = self.config
        shapes = tuple((int(s.shape[-3]), int(s.shape[-2])) for s in srcs)
        level_embed = self.param("level_embed", nn.initializers.zeros, (len(srcs), cfg.conv_dim))
        b = srcs[0].shape[0]
        tokens = jnp.concatenate([s.reshape(b, -1, cfg.conv_dim) for s in srcs], axis=1)
        pos = jnp.concatenate([
            jnp.asarray(sine_position_embedding(hw, cfg.conv_dim // 2)).reshape(-1, cfg.conv_dim) + level_embed[i]
            for i, hw in enumerate(shapes)], axis=0).astype(tokens.dtype)
        reference = jnp.asarray(reference_points(shapes), tokens.dtype)
        tokens = Encoder(cfg, len(srcs), name="encoder")(tokens, pos[None], reference, shapes)
        out, start = [], 0
        for h, w in shapes:
            out.append(tokens[:, start:start + h * w].reshape(b, h, w, cfg.conv_dim))
            start += h * w
        return out


class PixelDecoder(nn.Module):
    """``pixel_decoder`` (``PixelLevelMultiScaleDecoder``): ViT tokens f32[B, gh, gw, C] -> SimpleFPN
    maps [res2, res3, res4, res5] (child "neck") -> (mask features f32[B, h2, w2, mask_dim], levels
    [res5, res4, res3] f32[B, h, w, conv_dim])."""

    config: AdaptiveClickConfig

    @nn.compact
    def __call__(self, tokens):
        cfg = self.config
        maps = SimpleFPN(cfg.embed_dim, cfg.neck_out_dims, name="neck")(tokens)
        srcs = InputProjections(cfg, name="input_proj")(maps)
        levels = DeformableEncoder(cfg, name="transformer")(srcs)
        lateral = ConvNorm(cfg.neck_out_dims[0], cfg.conv_dim, relu=True, name="adapter_1")(maps[0])
        fpn = lateral + resize_bilinear_nhwc(levels[-1], lateral.shape[-3:-1])
        fpn = ConvNorm(cfg.conv_dim, cfg.conv_dim, 3, relu=True, name="layer_1")(fpn)
        mask_features = Conv2d(cfg.conv_dim, cfg.mask_dim, 1, name="mask_features")(fpn)
        return mask_features, levels
