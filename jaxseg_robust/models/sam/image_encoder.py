"""SAM's ViT image encoder (ViTDet-style backbone) in Flax linen, channels-last.

Behaviour matched to ``segment_anything.modeling.image_encoder``:
  * 16x16 patch embedding (conv, stride 16) + learned absolute position
    embedding f32[1, E, E, D];
  * pre-norm blocks (LayerNorm eps 1e-6), windowed attention (window 14, the
    grid zero-padded after ``norm1`` to a multiple of the window; padded
    tokens take part in attention exactly as in the reference) or global
    attention at ``global_attn_indexes``;
  * decomposed relative position terms ``q . R_h`` and ``q . R_w`` (unscaled
    ``q``) added to the scaled attention logits, with the reference's
    interpolation of a table whose length differs from ``2 * max(q, k) - 1``;
  * exact (erf) GELU in the MLP;
  * neck: conv1x1 (no bias) -> LayerNorm2d(1e-6) -> conv3x3 pad 1 (no bias)
    -> LayerNorm2d(1e-6); LayerNorm2d over channels = LayerNorm on the last
    axis in channels-last layout.

The outputs of global-attention blocks are sown into the ``intermediates``
collection under ``interm_embeddings`` (SAM-HQ reads the first one); apply
with ``mutable=["intermediates"]`` to get them.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from jaxseg_robust.models.block_scan import run_blocks
from jaxseg_robust.models.sam.config import register_image_encoder
from jaxseg_robust.models.sam.layers import layer_norm
from jaxseg_robust.ops.resize import apply_taps, linear_taps


@dataclasses.dataclass(frozen=True)
class ViTConfig:
    """Shape of a SAM ViT image encoder (defaults: ViT-B)."""

    img_size: int = 1024
    patch_size: int = 16
    in_chans: int = 3
    embed_dim: int = 768
    depth: int = 12
    num_heads: int = 12
    mlp_ratio: float = 4.0
    out_chans: int = 256
    qkv_bias: bool = True
    use_abs_pos: bool = True
    use_rel_pos: bool = True
    window_size: int = 14
    global_attn_indexes: tuple[int, ...] = (2, 5, 8, 11)
    norm_eps: float = 1e-6
    neck_eps: float = 1e-6

    def __post_init__(self):
        if self.embed_dim % self.num_heads:
            raise ValueError(f"embed_dim {self.embed_dim} is not divisible by num_heads {self.num_heads}")
        if self.img_size % self.patch_size:
            raise ValueError(f"img_size {self.img_size} is not a multiple of patch_size {self.patch_size}")
        bad = [i for i in self.global_attn_indexes if not 0 <= i < self.depth]
        if bad:
            raise ValueError(f"global_attn_indexes {bad} outside [0, depth={self.depth})")

    @property
    def grid_size(self) -> int:
        """Side of the patch grid (img_size / patch_size)."""
        return self.img_size // self.patch_size


VIT_B = ViTConfig(embed_dim=768, depth=12, num_heads=12, global_attn_indexes=(2, 5, 8, 11))
VIT_L = ViTConfig(embed_dim=1024, depth=24, num_heads=16, global_attn_indexes=(5, 11, 17, 23))
VIT_H = ViTConfig(embed_dim=1280, depth=32, num_heads=16, global_attn_indexes=(7, 15, 23, 31))


# ---- pure helpers ------------------------------------------------------------

def window_partition(x: jnp.ndarray, window: int) -> tuple[jnp.ndarray, tuple[int, int]]:
    """Splits f32[B, H, W, C] into non-overlapping windows, zero-padding H and W.

    Returns:
      (windows f32[B * nH * nW, window, window, C] in row-major window order,
       (Hp, Wp) the padded size).
    """
    b, h, w, c = x.shape
    pad_h, pad_w = (-h) % window, (-w) % window
    if pad_h or pad_w:
        x = jnp.pad(x, ((0, 0), (0, pad_h), (0, pad_w), (0, 0)))
    hp, wp = h + pad_h, w + pad_w
    x = x.reshape(b, hp // window, window, wp // window, window, c)
    return x.transpose(0, 1, 3, 2, 4, 5).reshape(-1, window, window, c), (hp, wp)


def window_unpartition(windows: jnp.ndarray, window: int, padded_hw: tuple[int, int],
                       hw: tuple[int, int]) -> jnp.ndarray:
    """Inverse of `window_partition`: f32[B * nW, w, w, C] -> f32[B, H, W, C] (padding cut)."""
    hp, wp = padded_hw
    h, w = hw
    b = windows.shape[0] // ((hp // window) * (wp // window))
    x = windows.reshape(b, hp // window, wp // window, window, window, -1)
    x = x.transpose(0, 1, 3, 2, 4, 5).reshape(b, hp, wp, -1)
    return x[:, :h, :w, :]


def get_rel_pos(q_size: int, k_size: int, rel_pos: jnp.ndarray) -> jnp.ndarray:
    """Relative-position embeddings for every (query, key) pair along one axis.

    If the table length differs from ``2 * max(q_size, k_size) - 1`` it is
    first resampled to that length with linear interpolation (half-pixel,
    ``align_corners=False``, as the reference's ``F.interpolate(mode="linear")``).
    With different query/key sizes the shorter side's coordinates are scaled
    up, as in the reference (float32 coordinates, truncated to integers).

    Args:
      q_size, k_size: static axis lengths.
      rel_pos: f32[L, C] the learned table.

    Returns:
      f32[q_size, k_size, C].
    """
    max_rel_dist = int(2 * max(q_size, k_size) - 1)
    if rel_pos.shape[0] != max_rel_dist:
        rel_pos = apply_taps(rel_pos, linear_taps(rel_pos.shape[0], max_rel_dist), axis=0)
    f32 = np.float32
    q_coords = np.arange(q_size, dtype=f32)[:, None] * f32(max(k_size / q_size, 1.0))
    k_coords = np.arange(k_size, dtype=f32)[None, :] * f32(max(q_size / k_size, 1.0))
    relative = (q_coords - k_coords) + f32((k_size - 1) * max(q_size / k_size, 1.0))
    index = relative.astype(np.int64)  # truncation, as torch's .long()
    return jnp.take(rel_pos, jnp.asarray(index), axis=0)


def rel_pos_terms(q: jnp.ndarray, rel_pos_h: jnp.ndarray, rel_pos_w: jnp.ndarray,
                  q_hw: tuple[int, int], k_hw: tuple[int, int]) -> tuple[jnp.ndarray, jnp.ndarray]:
    """The two factors of the decomposed relative-position term.

    Args:
      q: f32[..., q_h * q_w, C] unscaled queries (row-major grid).
      rel_pos_h, rel_pos_w: f32[Lh, C], f32[Lw, C] tables.
      q_hw, k_hw: static query and key grid sizes.

    Returns:
      (rel_h f32[..., q_h * q_w, k_h], rel_w f32[..., q_h * q_w, k_w]) with
      ``rel_h[q, ky] = q . R_h[qy, ky]`` and ``rel_w[q, kx] = q . R_w[qx, kx]``.
    """
    (qh, qw), (kh, kw) = q_hw, k_hw
    r_h = get_rel_pos(qh, kh, rel_pos_h).astype(q.dtype)
    r_w = get_rel_pos(qw, kw, rel_pos_w).astype(q.dtype)
    lead = q.shape[:-2]
    grid = q.reshape(*lead, qh, qw, q.shape[-1])
    rel_h = jnp.einsum("...hwc,hkc->...hwk", grid, r_h).reshape(*lead, qh * qw, kh)
    rel_w = jnp.einsum("...hwc,wkc->...hwk", grid, r_w).reshape(*lead, qh * qw, kw)
    return rel_h, rel_w


def decomposed_rel_pos(q: jnp.ndarray, rel_pos_h: jnp.ndarray, rel_pos_w: jnp.ndarray,
                       q_hw: tuple[int, int], k_hw: tuple[int, int]) -> jnp.ndarray:
    """The additive relative-position term of the attention logits.

    Args: as `rel_pos_terms`.

    Returns:
      f32[..., q_h * q_w, k_h * k_w]: ``q . R_h[qy, ky] + q . R_w[qx, kx]``.
    """
    (kh, kw) = k_hw
    rel_h, rel_w = rel_pos_terms(q, rel_pos_h, rel_pos_w, q_hw, k_hw)
    total = rel_h[..., :, None] + rel_w[..., None, :]
    return total.reshape(*total.shape[:-2], kh * kw)


def attend(q, k, v, scale: float, rel=None, k_hw: tuple[int, int] | None = None):
    """Softmax attention of one head, optionally with decomposed relative positions.

    Args:
      q: [B, Nq, C] unscaled queries; k, v: [B, Nk, C].
      scale: multiplies ``q`` before the product (head_dim ** -0.5).
      rel: optional (rel_h [B, Nq, k_h], rel_w [B, Nq, k_w]) from `rel_pos_terms`.
      k_hw: the key grid (k_h, k_w), with ``rel``.

    Returns:
      [B, Nq, C]; the softmax is computed in float32.
    """
    logits = jnp.einsum("bqc,bkc->bqk", q * jnp.asarray(scale, q.dtype), k).astype(jnp.float32)
    if rel is not None:
        b, n_q = logits.shape[:2]
        grid = logits.reshape(b, n_q, k_hw[0], k_hw[1])
        grid = grid + rel[0].astype(jnp.float32)[..., :, None] + \
            rel[1].astype(jnp.float32)[..., None, :]
        weights = jax.nn.softmax(grid, axis=(-2, -1)).reshape(logits.shape)
    else:
        weights = jax.nn.softmax(logits, axis=-1)
    return jnp.einsum("bqk,bkc->bqc", weights.astype(v.dtype), v)


# ---- modules -----------------------------------------------------------------

class ViTAttention(nn.Module):
    """Multi-head self-attention on a token grid with decomposed relative positions.

    Attributes:
      dim: channels; num_heads: heads; qkv_bias: bias of the fused qkv layer.
      use_rel_pos: add the decomposed relative-position term.
      input_size: static grid (h, w) the relative tables are sized for.
      sequential: evaluate heads one after another and queries in blocks of
        ``query_chunk`` (global attention: bounds memory to one
        [B, query_chunk, N] logit block and keeps it in cache, which on CPU
        is faster than materialising every head's [N, N] map); otherwise all
        heads at once (windowed attention: many small windows).
      query_chunk: queries per block when ``sequential`` (must divide h * w,
        else no blocking).
      dtype: compute dtype (softmax is always float32).
    """

    dim: int
    num_heads: int
    qkv_bias: bool = True
    use_rel_pos: bool = True
    input_size: tuple[int, int] = (14, 14)
    sequential: bool = False
    query_chunk: int = 1024
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        """f32[B, H, W, dim] -> f32[B, H, W, dim]."""
        b, h, w, _ = x.shape
        n = h * w
        head_dim = self.dim // self.num_heads
        qkv = nn.Dense(3 * self.dim, use_bias=self.qkv_bias, dtype=self.dtype, name="qkv")(x)
        qkv = qkv.reshape(b, n, 3, self.num_heads, head_dim).transpose(2, 3, 0, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]  # [heads, B, N, hd]
        tables = None
        if self.use_rel_pos:
            init = nn.initializers.normal(0.02)
            tables = (self.param("rel_pos_h", init, (2 * self.input_size[0] - 1, head_dim)),
                      self.param("rel_pos_w", init, (2 * self.input_size[1] - 1, head_dim)))
        scale = head_dim ** -0.5
        chunk = self.query_chunk if self.sequential and 0 < self.query_chunk < n \
            and n % self.query_chunk == 0 else n

        def one_head(args):
            qh, kh, vh = args  # [B, N, hd]
            rel = None if tables is None else rel_pos_terms(qh, *tables, (h, w), (h, w))
            if chunk == n:
                return attend(qh, kh, vh, scale, rel, (h, w))

            def split(t):  # [B, N, c] -> [N / chunk, B, chunk, c]
                return jnp.moveaxis(t.reshape(b, n // chunk, chunk, t.shape[-1]), 1, 0)

            def one_block(block):
                qb, rel_b = block[0], (None if rel is None else block[1:])
                return attend(qb, kh, vh, scale, rel_b, (h, w))

            pieces = (split(qh),) + (() if rel is None else (split(rel[0]), split(rel[1])))
            out = jax.lax.map(one_block, pieces)  # [N / chunk, B, chunk, hd]
            return jnp.moveaxis(out, 0, 1).reshape(b, n, head_dim)

        if self.sequential:
            out = jax.lax.map(one_head, (q, k, v))
        else:
            out = jax.vmap(one_head)((q, k, v))
        out = out.transpose(1, 2, 0, 3).reshape(b, h, w, self.dim)
        return nn.Dense(self.dim, dtype=self.dtype, name="proj")(out)


class GeluMLP(nn.Module):
    """Linear -> exact GELU -> Linear in ``dtype``: torch ``MLPBlock`` with ``nn.GELU`` (SAM's ViT,
    params ``lin1``, ``lin2``), or ``MLP(num_layers=2, activation=nn.GELU)`` (SAM 2's Hiera,
    ``layer_names=("layers_0", "layers_1")``)."""

    dim: int
    hidden_dim: int
    dtype: Any = jnp.float32
    layer_names: tuple[str, str] = ("lin1", "lin2")

    @nn.compact
    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        """f32[..., dim] -> f32[..., dim]."""
        x = nn.Dense(self.hidden_dim, dtype=self.dtype, name=self.layer_names[0])(x)
        x = nn.gelu(x, approximate=False)
        return nn.Dense(self.dim, dtype=self.dtype, name=self.layer_names[1])(x)


class ViTBlock(nn.Module):
    """Pre-norm transformer block with windowed (window_size > 0) or global attention."""

    dim: int
    num_heads: int
    mlp_ratio: float = 4.0
    qkv_bias: bool = True
    use_rel_pos: bool = True
    window_size: int = 0
    grid_size: tuple[int, int] = (64, 64)
    norm_eps: float = 1e-6
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        """f32[B, H, W, dim] -> f32[B, H, W, dim]."""
        shortcut = x
        y = layer_norm(self.norm_eps, name="norm1")(x).astype(self.dtype)
        windowed = self.window_size > 0
        size = (self.window_size, self.window_size) if windowed else tuple(self.grid_size)
        attention = ViTAttention(self.dim, self.num_heads, qkv_bias=self.qkv_bias,
                                 use_rel_pos=self.use_rel_pos, input_size=size,
                                 sequential=not windowed, dtype=self.dtype, name="attn")
        if windowed:
            h, w = y.shape[1], y.shape[2]
            windows, padded = window_partition(y, self.window_size)
            y = window_unpartition(attention(windows), self.window_size, padded, (h, w))
        else:
            y = attention(y)
        x = shortcut + y.astype(shortcut.dtype)
        y = layer_norm(self.norm_eps, name="norm2")(x).astype(self.dtype)
        y = GeluMLP(self.dim, int(self.dim * self.mlp_ratio), dtype=self.dtype, name="mlp")(y)
        return x + y.astype(x.dtype)


class PatchEmbed(nn.Module):
    """Non-overlapping patch projection: f32[B, S, S, 3] -> f32[B, S/p, S/p, D]."""

    patch_size: int
    embed_dim: int
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        p = self.patch_size
        return nn.Conv(self.embed_dim, (p, p), strides=(p, p), padding="VALID",
                       dtype=self.dtype, name="proj")(x)


class Neck(nn.Module):
    """conv1x1 (no bias) -> LN2d -> conv3x3 pad 1 (no bias) -> LN2d, channels-last."""

    out_chans: int
    eps: float = 1e-6
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        """f32[B, E, E, D] -> f32[B, E, E, out_chans]."""
        x = nn.Conv(self.out_chans, (1, 1), use_bias=False, dtype=self.dtype, name="conv1")(x)
        x = layer_norm(self.eps, name="norm1")(x).astype(self.dtype)
        x = nn.Conv(self.out_chans, (3, 3), padding=((1, 1), (1, 1)), use_bias=False,
                    dtype=self.dtype, name="conv2")(x)
        return layer_norm(self.eps, name="norm2")(x)


def vit_block(cfg: ViTConfig, is_global: bool, dtype: Any, **module_args) -> ViTBlock:
    """The `ViTBlock` of ``cfg`` with global (``is_global``) or windowed attention."""
    return ViTBlock(cfg.embed_dim, cfg.num_heads, mlp_ratio=cfg.mlp_ratio, qkv_bias=cfg.qkv_bias,
                    use_rel_pos=cfg.use_rel_pos, window_size=0 if is_global else cfg.window_size,
                    grid_size=(cfg.grid_size, cfg.grid_size), norm_eps=cfg.norm_eps, dtype=dtype,
                    **module_args)


class ImageEncoderViT(nn.Module):
    """SAM's ViT image encoder: f32[B, S, S, 3] -> f32[B, S/16, S/16, out_chans].

    Param tree: ``patch_embed/proj``, ``pos_embed``, ``blocks_{i}/{norm1,attn,
    norm2,mlp}``, ``neck/{conv1,norm1,conv2,norm2}``.

    ``scan_blocks`` (the default) runs the blocks as loops over their parameters stacked at trace
    time (`models.block_scan.run_blocks`: ViT-B's ``(windowed, windowed, global)`` x 4 holds one
    windowed and one global block), so the program holds each kind of block once; the parameter
    tree stays per block. ``False`` unrolls the blocks (the reference the tests compare with;
    initialisation always unrolls, to create ``blocks_{i}``). docs/benchmarking.md, "Compile time
    of the image encoders".
    """

    config: ViTConfig
    dtype: Any = jnp.float32
    scan_blocks: bool = True

    @nn.compact
    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        cfg = self.config
        if x.ndim != 4 or x.shape[1:] != (cfg.img_size, cfg.img_size, cfg.in_chans):
            raise ValueError(f"ViT input must be [B, {cfg.img_size}, {cfg.img_size}, "
                             f"{cfg.in_chans}]; got {x.shape}")
        x = PatchEmbed(cfg.patch_size, cfg.embed_dim, dtype=self.dtype,
                       name="patch_embed")(x.astype(self.dtype)).astype(jnp.float32)
        grid = cfg.grid_size
        if cfg.use_abs_pos:
            pos = self.param("pos_embed", nn.initializers.normal(0.02),
                             (1, grid, grid, cfg.embed_dim))
            x = x + pos
        is_global = tuple(i in cfg.global_attn_indexes for i in range(cfg.depth))
        if self.scan_blocks and not self.is_initializing():
            params = self.variables["params"]

            def apply_block(global_attention, block_params, y):
                block = vit_block(cfg, global_attention, self.dtype, parent=None)
                return block.apply({"params": block_params}, y)

            x, interm = run_blocks(apply_block, [params[f"blocks_{i}"] for i in range(cfg.depth)],
                                   is_global, x, emits=bool)
        else:
            interm = []
            for i in range(cfg.depth):
                x = vit_block(cfg, is_global[i], self.dtype, name=f"blocks_{i}")(x)
                if is_global[i]:
                    interm.append(x)
        for y in interm:
            self.sow("intermediates", "interm_embeddings", y)
        return Neck(cfg.out_chans, eps=cfg.neck_eps, dtype=self.dtype, name="neck")(x).astype(
            jnp.float32)


def build_vit(config: ViTConfig, dtype: Any) -> ImageEncoderViT:
    """Encoder-registry builder for kind "vit"."""
    return ImageEncoderViT(config, dtype=dtype)


register_image_encoder("vit", ViTConfig, build_vit)
