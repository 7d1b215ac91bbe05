"""The Hiera trunk of SAM 2 in Flax linen, channels-last.

Behaviour matched to ``sam2.modeling.backbones.hieradet.Hiera`` (see
docs/models/sam2.md):
  * patch embedding: conv 7x7, stride 4, padding 3;
  * position embedding: the background table ``pos_embed`` f32[h0, w0, C]
    resized to the stage-1 grid with torch's bicubic kernel (a = -0.75,
    ``align_corners=False``, border samples clamped; `bicubic_matrix`), plus
    the window table ``pos_embed_window`` f32[w, w, C] tiled over the grid;
  * blocks: LayerNorm (eps 1e-6) -> windowed attention (the normalised grid
    zero-padded to a multiple of the window, padded tokens taking part in
    attention exactly as in the reference) or global attention -> residual ->
    LayerNorm -> MLP with exact (erf) GELU -> residual;
  * at the first block of stages 2-4 the channels and heads double, the
    queries are max-pooled 2x2 inside each window, and the shortcut is
    ``maxpool(proj(norm1(x)))``;
  * the outputs of the four stages are returned (highest resolution first).
"""

from __future__ import annotations

import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from jaxseg_robust.models.block_scan import run_blocks
from jaxseg_robust.models.sam.image_encoder import GeluMLP, window_partition, window_unpartition
from jaxseg_robust.models.sam.layers import layer_norm
from jaxseg_robust.models.sam2.config import (PATCH_KERNEL, PATCH_PADDING, PATCH_STRIDE,
                                              HieraBlockSpec, HieraConfig)

BICUBIC_A = -0.75  # torch's cubic convolution coefficient
NORM_EPS = 1e-6


def _cubic_weights(t: np.ndarray) -> np.ndarray:
    """[n] fractional offsets -> [n, 4] torch cubic-convolution weights of taps -1, 0, 1, 2."""
    a = BICUBIC_A

    def near(x):  # |x| <= 1
        return ((a + 2) * x - (a + 3)) * x * x + 1

    def far(x):  # 1 < |x| < 2
        return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a

    return np.stack([far(t + 1), near(t), near(1 - t), far(2 - t)], axis=-1)


def bicubic_matrix(in_size: int, out_size: int) -> np.ndarray:
    """The linear map of torch's 1-D bicubic resize (host, numpy).

    ``F.interpolate(mode="bicubic", align_corners=False)`` along one axis:
    source position ``s = (in / out) * (o + 0.5) - 0.5`` (not clamped), taps
    ``floor(s) - 1 .. floor(s) + 2`` with indices clamped to ``[0, in - 1]``
    (weights of clamped taps add up).

    Returns:
      f32[out_size, in_size] with ``resized = M @ x``.
    """
    if in_size <= 0 or out_size <= 0:
        raise ValueError(f"sizes must be positive; got {in_size}, {out_size}")
    scale = np.float32(in_size) / np.float32(out_size)
    src = scale * (np.arange(out_size, dtype=np.float32) + np.float32(0.5)) - np.float32(0.5)
    base = np.floor(src)
    weights = _cubic_weights((src - base).astype(np.float64))
    matrix = np.zeros((out_size, in_size), np.float64)
    for k in range(4):
        index = np.clip(base.astype(np.int64) - 1 + k, 0, in_size - 1)
        np.add.at(matrix, (np.arange(out_size), index), weights[:, k])
    return matrix.astype(np.float32)


def hiera_pos_embed(pos_embed: jnp.ndarray, window_embed: jnp.ndarray,
                    grid_hw: tuple[int, int]) -> jnp.ndarray:
    """``Hiera._get_pos_embed``: bicubic background + tiled window table.

    Args:
      pos_embed: f32[h0, w0, C] background table.
      window_embed: f32[w, w, C] window table (tiled; the grid must be a multiple of w).
      grid_hw: static (H, W) of the stage-1 grid.

    Returns:
      f32[H, W, C].
    """
    h, w = grid_hw
    rows = jnp.asarray(bicubic_matrix(pos_embed.shape[0], h))
    cols = jnp.asarray(bicubic_matrix(pos_embed.shape[1], w))
    hp = jax.lax.Precision.HIGHEST
    resized = jnp.einsum("Hh,hwc->Hwc", rows, pos_embed, precision=hp)
    resized = jnp.einsum("Ww,Hwc->HWc", cols, resized, precision=hp)
    reps = (h // window_embed.shape[0], w // window_embed.shape[1], 1)
    return resized + jnp.tile(window_embed, reps)


def max_pool_2x2(x: jnp.ndarray) -> jnp.ndarray:
    """``MaxPool2d(2, 2)`` (floor mode) on f32[B, H, W, C] -> f32[B, H // 2, W // 2, C]."""
    b, h, w, c = x.shape
    x = x[:, :h // 2 * 2, :w // 2 * 2]
    return x.reshape(b, h // 2, 2, w // 2, 2, c).max(axis=(2, 4))


def attention(q: jnp.ndarray, k: jnp.ndarray, v: jnp.ndarray, *, sequential: bool) -> jnp.ndarray:
    """Scaled dot-product attention (torch ``F.scaled_dot_product_attention``).

    Args:
      q: [B, Nq, heads, d]; k, v: [B, Nk, heads, d].
      sequential: evaluate the heads one after another (global attention on
        large grids: bounds memory to one [B, Nq, Nk] map).

    Returns:
      [B, Nq, heads, d]; the softmax is computed in float32.
    """
    scale = jnp.asarray(1.0 / math.sqrt(q.shape[-1]), q.dtype)

    def one_head(args):
        qh, kh, vh = args  # [B, N, d]
        logits = jnp.einsum("bqd,bkd->bqk", qh * scale, kh).astype(jnp.float32)
        weights = jax.nn.softmax(logits, axis=-1).astype(vh.dtype)
        return jnp.einsum("bqk,bkd->bqd", weights, vh)

    heads_first = tuple(jnp.moveaxis(t, 2, 0) for t in (q, k, v))
    out = jax.lax.map(one_head, heads_first) if sequential else jax.vmap(one_head)(heads_first)
    return jnp.moveaxis(out, 0, 2)


class MultiScaleAttention(nn.Module):
    """Hiera attention with optional 2x2 query pooling; params ``qkv``, ``proj``.

    ``global_attention`` evaluates the heads one after another (one [B, N, N]
    logit map at a time on the large global-attention grids).
    """

    dim_out: int
    num_heads: int
    q_pool: bool = False
    global_attention: bool = False
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        """f32[B, H, W, dim] -> f32[B, H', W', dim_out] (H' = H // 2 with query pooling)."""
        b, h, w, _ = x.shape
        heads, d = self.num_heads, self.dim_out // self.num_heads
        qkv = nn.Dense(3 * self.dim_out, dtype=self.dtype, name="qkv")(x)
        qkv = qkv.reshape(b, h * w, 3, heads, d)
        q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
        if self.q_pool:
            q = max_pool_2x2(q.reshape(b, h, w, self.dim_out))
            h, w = q.shape[1], q.shape[2]
            q = q.reshape(b, h * w, heads, d)
        out = attention(q, k, v, sequential=self.global_attention)
        out = out.reshape(b, h, w, self.dim_out)
        return nn.Dense(self.dim_out, dtype=self.dtype, name="proj")(out)


class HieraBlock(nn.Module):
    """``MultiScaleBlock``; params ``norm1``, ``attn``, ``norm2``, ``mlp``, ``proj`` (dim change)."""

    spec: HieraBlockSpec
    mlp_ratio: float = 4.0
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        """f32[B, H, W, dim] -> f32[B, H', W', dim_out]."""
        spec = self.spec
        shortcut = x
        y = layer_norm(NORM_EPS, name="norm1")(x).astype(self.dtype)
        if spec.dim != spec.dim_out:
            shortcut = nn.Dense(spec.dim_out, dtype=self.dtype, name="proj")(y).astype(jnp.float32)
            if spec.q_pool:
                shortcut = max_pool_2x2(shortcut)
        window = spec.window_size
        if window > 0:
            y, _ = window_partition(y, window)
        y = MultiScaleAttention(spec.dim_out, spec.num_heads, spec.q_pool,
                                global_attention=window == 0, dtype=self.dtype, name="attn")(y)
        if window > 0:
            out_window = window // 2 if spec.q_pool else window
            h, w = shortcut.shape[1], shortcut.shape[2]
            padded = (h + (-h) % out_window, w + (-w) % out_window)
            y = window_unpartition(y, out_window, padded, (h, w))
        x = shortcut + y.astype(jnp.float32)
        y = layer_norm(NORM_EPS, name="norm2")(x).astype(self.dtype)
        y = GeluMLP(spec.dim_out, int(spec.dim_out * self.mlp_ratio), dtype=self.dtype,
                    layer_names=("layers_0", "layers_1"), name="mlp")(y)
        return x + y.astype(jnp.float32)


class Hiera(nn.Module):
    """The trunk: f32[B, S, S, 3] -> the four stage outputs (strides 4, 8, 16, 32).

    Param tree: ``patch_embed/proj``, ``pos_embed`` f32[h0, w0, C],
    ``pos_embed_window`` f32[w, w, C], ``blocks_{i}/...``.

    ``scan_blocks`` (the default) runs blocks of one spec as loops over their parameters stacked at
    trace time (`models.block_scan.run_blocks`; a block's kind is its spec and whether it ends a
    stage), so the program holds each kind once; the parameter tree stays per block. ``False``
    unrolls them (initialisation always does). docs/benchmarking.md, "Compile time of the image
    encoders".
    """

    config: HieraConfig
    dtype: Any = jnp.float32
    scan_blocks: bool = True

    @nn.compact
    def __call__(self, x: jnp.ndarray) -> tuple[jnp.ndarray, ...]:
        """Returns (f32[B, S/4, S/4, C], [B, S/8, S/8, 2C], [B, S/16, ..., 4C], [B, S/32, ..., 8C])."""
        cfg = self.config
        pad = PATCH_PADDING
        x = nn.Conv(cfg.embed_dim, (PATCH_KERNEL, PATCH_KERNEL), strides=(PATCH_STRIDE,) * 2,
                    padding=((pad, pad), (pad, pad)), dtype=self.dtype,
                    name="patch_embed_proj")(x.astype(self.dtype)).astype(jnp.float32)
        init = nn.initializers.normal(0.02)
        bkg = self.param("pos_embed", init,
                         (*cfg.window_pos_embed_bkg_spatial_size, cfg.embed_dim))
        w0 = cfg.window_spec[0]
        window_embed = self.param("pos_embed_window", init, (w0, w0, cfg.embed_dim))
        x = x + hiera_pos_embed(bkg, window_embed, (x.shape[1], x.shape[2]))
        kinds = tuple((spec, i in cfg.stage_ends) for i, spec in enumerate(cfg.blocks()))
        if self.scan_blocks and not self.is_initializing():
            params = self.variables["params"]

            def apply_block(kind, block_params, y):
                block = HieraBlock(kind[0], cfg.mlp_ratio, dtype=self.dtype, parent=None)
                return block.apply({"params": block_params}, y)

            _, outputs = run_blocks(apply_block, [params[f"blocks_{i}"] for i in range(len(kinds))],
                                    kinds, x, emits=lambda kind: kind[1])
            return tuple(outputs)
        outputs = []
        for i, (spec, stage_end) in enumerate(kinds):
            x = HieraBlock(spec, cfg.mlp_ratio, dtype=self.dtype, name=f"blocks_{i}")(x)
            if stage_end:
                outputs.append(x)
        return tuple(outputs)


__all__ = ["bicubic_matrix", "hiera_pos_embed", "max_pool_2x2", "attention",
           "MultiScaleAttention", "HieraBlock", "Hiera"]
