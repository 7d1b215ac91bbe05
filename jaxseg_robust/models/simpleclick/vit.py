"""SimpleClick's plain ViT backbone (``models_vit.VisionTransformer.forward_backbone``), NHWC.

* patch embedding (a p x p stride-p conv) of the normalised image, plus the
  click-map embedding computed by the caller, plus the position embedding
  (without its class-token row), bicubically re-interpolated to the input's
  patch grid exactly as the authors' ``interpolate_pos_embed_inference``
  (torch ``interpolate(mode="bicubic", align_corners=False)``, A = -0.75,
  clamped borders); no interpolation when the grid is the trained one;
* ``depth`` pre-norm blocks (LayerNorm eps 1e-6, multi-head attention with a
  qkv bias, GELU MLP); every ``blocks_per_group``-th block attends over the
  whole grid, the others inside windows of ``grid // (grid // (224 / p))``
  tokens per side (the authors' ``patchify`` / ``unpatchify``).

Parameter names follow the torch module paths (``blocks/3/attn/qkv/weight``).
The class token, ``fc_norm`` and the classification head of the checkpoint
are not used by the interactive model (see ports/simpleclick.py).
"""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

from jaxseg_robust.models.block_scan import run_blocks
from jaxseg_robust.models.clickmap.layers import Conv2d, LayerNorm, Linear, gelu
from jaxseg_robust.models.simpleclick.config import SimpleClickConfig
from jaxseg_robust.ops.attention import softmax_attention
from jaxseg_robust.ops.resize import Taps, apply_taps

VIT_LAYERNORM_EPS = 1e-6
BICUBIC_A = -0.75


def _cubic_near(x: np.ndarray) -> np.ndarray:
    """torch ``cubic_convolution1``: ((A + 2) x - (A + 3)) x^2 + 1, |x| <= 1 (float32)."""
    a = np.float32(BICUBIC_A)
    return ((a + np.float32(2)) * x - (a + np.float32(3))) * x * x + np.float32(1)


def _cubic_far(x: np.ndarray) -> np.ndarray:
    """torch ``cubic_convolution2``: ((A x - 5A) x + 8A) x - 4A, 1 < |x| < 2 (float32)."""
    a = np.float32(BICUBIC_A)
    return ((a * x - np.float32(5) * a) * x + np.float32(8) * a) * x - np.float32(4) * a


def bicubic_taps(in_size: int, out_size: int) -> Taps:
    """Tap table of torch's bicubic resize (``align_corners=False``), one axis (host).

    Source position ``s = (in/out)(o + 0.5) - 0.5`` (not clamped), taps
    ``floor(s) - 1 .. floor(s) + 2`` clamped to the input, weights of the
    cubic convolution kernel with A = -0.75 at ``t = s - floor(s)``.

    Returns:
      (index int32[out_size, 4], weight float32[out_size, 4]).
    """
    f32 = np.float32
    scale = f32(in_size) / f32(out_size)
    centres = (np.arange(out_size) + f32(0.5)).astype(f32).astype(np.float64)
    src = (np.float64(scale) * centres - 0.5).astype(f32)  # one rounding, as torch's FMA
    base = np.floor(src).astype(np.int64)
    t = (src - base.astype(f32)).astype(f32)
    weight = np.stack([_cubic_far(t + f32(1)), _cubic_near(t), _cubic_near(f32(1) - t),
                       _cubic_far(f32(2) - t)], axis=1).astype(f32)
    index = np.clip(base[:, None] + np.arange(-1, 3)[None, :], 0, in_size - 1)
    return index.astype(np.int32), weight


def interpolate_pos_embed(pos: jnp.ndarray, train_grid: tuple[int, int],
                          grid: tuple[int, int]) -> jnp.ndarray:
    """Position embedding f32[gh0 * gw0, C] of the trained grid -> f32[gh, gw, C] for ``grid``.

    Bicubic as torch (width resampled first, then height); the identity
    when the grids are equal (the authors skip the interpolation then).
    """
    x = pos.reshape(train_grid[0], train_grid[1], -1)
    if tuple(grid) == tuple(train_grid):
        return x
    x = apply_taps(x, bicubic_taps(train_grid[1], grid[1]), axis=1)
    return apply_taps(x, bicubic_taps(train_grid[0], grid[0]), axis=0)


class Attention(nn.Module):
    """Multi-head self-attention with a qkv bias: f32[B, N, C] -> f32[B, N, C]."""

    dim: int
    num_heads: int

    @nn.compact
    def __call__(self, x):
        b, n, c = x.shape
        h = self.num_heads
        qkv = Linear(c, 3 * c, name="qkv")(x).reshape(b, n, 3, h, c // h)
        q, k, v = qkv.transpose(2, 0, 3, 1, 4)  # each [B, h, N, d]: heads first, as torch's bmm
        # The authors scale the product q k^T; scaling q (N d values, not N^2 per head) is the same
        # product when the scale is a power of two (head width 64: ViT-B / L) and a rounding apart
        # otherwise. Scaling the product made XLA:CPU materialise an N^2 broadcast of the scale.
        out = softmax_attention(q * jnp.asarray((c // h) ** -0.5, q.dtype), k, v)
        return Linear(c, c, name="proj")(out.transpose(0, 2, 1, 3).reshape(b, n, c))


class Mlp(nn.Module):
    """fc1 -> GELU -> fc2."""

    dim: int
    hidden: int

    @nn.compact
    def __call__(self, x):
        return Linear(self.hidden, self.dim, name="fc2")(gelu(Linear(self.dim, self.hidden,
                                                                     name="fc1")(x)))


class Block(nn.Module):
    """Pre-norm transformer block (LayerNorm eps 1e-6)."""

    dim: int
    num_heads: int
    mlp_ratio: float

    @nn.compact
    def __call__(self, x):
        x = x + Attention(self.dim, self.num_heads, name="attn")(
            LayerNorm(self.dim, VIT_LAYERNORM_EPS, name="norm1")(x))
        hidden = int(self.dim * self.mlp_ratio)
        return x + Mlp(self.dim, hidden, name="mlp")(
            LayerNorm(self.dim, VIT_LAYERNORM_EPS, name="norm2")(x))


def window_counts(config: SimpleClickConfig, grid: tuple[int, int]) -> tuple[int, int]:
    """Windows per side of the authors' ``patchify`` (``grid // (224 / p)``, at least 1)."""
    wg = config.window_grid
    return max(grid[0] // wg, 1), max(grid[1] // wg, 1)


def patchify(x: jnp.ndarray, grid: tuple[int, int], windows: tuple[int, int]) -> jnp.ndarray:
    """f32[B, gh gw, C] -> f32[B wh ww, (gh/wh)(gw/ww), C] (windows in row-major order)."""
    b, _, c = x.shape
    (gh, gw), (wh, ww) = grid, windows
    x = x.reshape(b, wh, gh // wh, ww, gw // ww, c).transpose(0, 1, 3, 2, 4, 5)
    return x.reshape(b * wh * ww, (gh // wh) * (gw // ww), c)


def unpatchify(x: jnp.ndarray, grid: tuple[int, int], windows: tuple[int, int]) -> jnp.ndarray:
    """Inverse of `patchify`."""
    (gh, gw), (wh, ww) = grid, windows
    c = x.shape[-1]
    b = x.shape[0] // (wh * ww)
    x = x.reshape(b, wh, ww, gh // wh, gw // ww, c).transpose(0, 1, 3, 2, 4, 5)
    return x.reshape(b, gh * gw, c)


class Blocks(nn.Module):
    """``blocks``: windowed blocks with a global one every ``blocks_per_group``.

    ``scan_blocks`` (the default) runs them as loops over their parameters stacked at trace time
    (`models.block_scan.run_blocks`; the tokens stay in window order and a global block reads them
    through `unpatchify` / `patchify`, exact reshapes), so the program holds one windowed and one
    global block; the parameter tree stays per block (``blocks/{i}``). ``False`` unrolls them
    (initialisation always does). docs/benchmarking.md, "Compile time of the image encoders".
    """

    config: SimpleClickConfig
    scan_blocks: bool = True

    @nn.compact
    def __call__(self, x, grid: tuple[int, int]):
        """f32[B, gh gw, C] -> f32[B, gh gw, C]."""
        cfg = self.config
        windows = window_counts(cfg, grid)
        is_global = tuple(i % cfg.blocks_per_group == 0 for i in range(1, cfg.depth + 1))
        if self.scan_blocks and not self.is_initializing():
            params = self.variables["params"]

            def apply_block(global_attention, block_params, y):
                block = Block(cfg.embed_dim, cfg.num_heads, cfg.mlp_ratio, parent=None)
                if not global_attention:
                    return block.apply({"params": block_params}, y)
                y = block.apply({"params": block_params}, unpatchify(y, grid, windows))
                return patchify(y, grid, windows)

            x, _ = run_blocks(apply_block, [params[str(i)] for i in range(cfg.depth)], is_global,
                              patchify(x, grid, windows))
            return unpatchify(x, grid, windows)
        windowed = False
        for i, global_attention in enumerate(is_global):
            if not global_attention:
                if not windowed:
                    x = patchify(x, grid, windows)
                    windowed = True
            elif windowed:
                x = unpatchify(x, grid, windows)
                windowed = False
            x = Block(cfg.embed_dim, cfg.num_heads, cfg.mlp_ratio, name=str(i))(x)
        return unpatchify(x, grid, windows) if windowed else x


class PatchEmbed(nn.Module):
    """``PatchEmbed``: p x p stride-p conv, flattened: f32[B, H, W, in] -> f32[B, gh gw, C]."""

    in_chans: int
    embed_dim: int
    patch_size: int

    @nn.compact
    def __call__(self, x):
        y = Conv2d(self.in_chans, self.embed_dim, self.patch_size, self.patch_size,
                   name="proj")(x)
        return y.reshape(y.shape[0], -1, y.shape[-1])


class VisionTransformer(nn.Module):
    """``backbone``: f32[B, H, W, 3] normalised image + f32[B, N, C] click embedding ->
    f32[B, gh, gw, C] tokens on the patch grid (``scan_blocks``: see `Blocks`)."""

    config: SimpleClickConfig
    scan_blocks: bool = True

    @nn.compact
    def __call__(self, image, coord_embedding):
        cfg = self.config
        grid = cfg.input_grid(image.shape[-3:-1])
        x = PatchEmbed(3, cfg.embed_dim, cfg.patch_size, name="patch_embed")(image)
        x = x + coord_embedding
        g0 = cfg.train_grid
        pos = self.param("pos_embed", nn.initializers.zeros,
                         (1, g0[0] * g0[1] + 1, cfg.embed_dim))
        pos = interpolate_pos_embed(pos[0, 1:], g0, grid).astype(x.dtype)
        x = x + pos.reshape(1, grid[0] * grid[1], cfg.embed_dim)
        x = Blocks(cfg, self.scan_blocks, name="blocks")(x, grid)
        return x.reshape(x.shape[0], grid[0], grid[1], cfg.embed_dim)
