"""TinyViT, the image encoder of MobileSAM, as a Flax linen module (inference only).

Behaviour follows MobileSAM's ``mobile_sam/modeling/tiny_vit_sam.py`` with the
configuration of ``build_sam_vit_t``; this is an independent implementation.

Layout: channels-last throughout. The encoder maps SAM-preprocessed images
``f32[B, H, W, 3]`` (normalised with SAM's pixel mean/std, zero-padded to
1024x1024) to image embeddings ``f32[B, H/16, W/16, 256]``.

Architecture (MobileSAM defaults in brackets):
  * patch embedding: two 3x3 stride-2 Conv+BatchNorm with exact GELU between
    them (H/4, embed_dims[0] = 64 channels);
  * stage 0: MBConv blocks (1x1 expand, 3x3 depthwise, 1x1 project, each
    Conv+BatchNorm; GELU after the residual sum);
  * stages 1..: TinyViT blocks: windowed multi-head self-attention with a
    pre-LayerNorm and learned relative-position biases (one bias per head and
    per absolute (|dy|, |dx|) offset inside a window), a residual; then a
    depthwise Conv+BatchNorm ("local conv", no residual); then an MLP with a
    pre-LayerNorm, exact GELU and a residual;
  * between stages: patch merging (1x1 Conv+BN, GELU, 3x3 depthwise
    Conv+BN with stride ``merge_strides[i]``, GELU, 1x1 Conv+BN);
  * neck: 1x1 conv, LayerNorm over channels (eps 1e-6), 3x3 conv,
    LayerNorm over channels (eps 1e-6); convolutions without bias.

Compute dtype (``TinyViTEncoder.dtype``, e.g. bfloat16): convolutions and
matmuls run in it; the residual stream, BatchNorm/LayerNorm, GELU and softmax
stay float32; parameters are float32 and the output is float32.

Reference quirks reproduced on purpose (each is documented where it is made):
  * MobileSAM's patch merging uses stride 1 (not 2) whenever its output width
    is 320, 448 or 576, so its last merge (160 -> 320) keeps 64x64; this is
    the ``merge_strides=(2, 2, 1)`` default (see `reference_merge_strides`).
  * Window attention zero-pads the token grid to a multiple of the window
    *before* the attention's own LayerNorm, and the padded tokens are not
    masked: they take part as keys/values (their normalised value is the
    LayerNorm bias). Stages at 128x128 with window 7, and 64x64 with windows
    14 and 7, are padded in MobileSAM.
  * GELU is torch's default ``nn.GELU`` (exact erf form).
  * LayerNorm eps: 1e-5 in attention and MLP, 1e-6 in the neck; BatchNorm eps
    1e-5.

BatchNorm: every Conv2d_BN of the reference is a bias-free convolution followed
by BatchNorm in eval mode. Here the four BatchNorm tensors (weight, bias,
running mean, running variance) are ordinary entries of the ``params`` tree
(names ``scale``, ``bias``, ``mean``, ``var``) and the normalisation is applied
on the convolution output as ``y * s + (bias - mean * s)`` with
``s = scale / sqrt(var + 1e-5)``. Nothing is folded at port time, so a ported
parameter tree holds exactly the checkpoint's numbers; XLA fuses the affine.
There is no training mode and no stochastic depth.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from jaxseg_robust.models.depthwise import DepthwiseConv
from jaxseg_robust.models.sam.config import register_image_encoder

# torch nn.GELU() default is the exact (erf) form.
_gelu = functools.partial(jax.nn.gelu, approximate=False)

_BATCH_NORM_EPS = 1e-5        # torch.nn.BatchNorm2d default
_TOKEN_LAYER_NORM_EPS = 1e-5  # torch.nn.LayerNorm default (attention, MLP)
_NECK_LAYER_NORM_EPS = 1e-6   # MobileSAM's LayerNorm2d in the neck
_STEM_STRIDE = 4              # two stride-2 convolutions in the patch embedding


def reference_merge_strides(embed_dims: tuple[int, ...]) -> tuple[int, ...]:
    """The patch-merging strides MobileSAM's TinyViT would pick for ``embed_dims``.

    MobileSAM's ``PatchMerging`` hard-codes stride 1 for its depthwise conv when
    its output width is 320, 448 or 576 and stride 2 otherwise (so the encoder
    ends at 1/16 of the input instead of 1/32). Merge ``i`` goes from
    ``embed_dims[i]`` to ``embed_dims[i + 1]``.

    Args:
      embed_dims: channel widths of the stages, length n >= 1.

    Returns:
      n - 1 strides, each 1 or 2.
    """
    return tuple(1 if out_dim in (320, 448, 576) else 2 for out_dim in embed_dims[1:])


@dataclasses.dataclass(frozen=True)
class TinyViTConfig:
    """Hyper-parameters of a TinyViT image encoder; defaults are MobileSAM's (``vit_t``).

    Per-stage tuples have one entry per stage. Stage 0 is convolutional, so
    ``num_heads[0]`` and ``window_sizes[0]`` are unused, exactly as in the
    reference constructor (kept so that the tuples read like ``build_sam_vit_t``).

    Attributes:
      embed_dims: channel width of each stage.
      depths: number of blocks in each stage.
      num_heads: attention heads per stage (stage 0 unused).
      window_sizes: square attention window side, in tokens, per stage (stage 0 unused).
      merge_strides: stride of the patch merging after stage i (length stages - 1);
        MobileSAM's quirk gives (2, 2, 1), see `reference_merge_strides`.
      mlp_ratio: MLP hidden width / stage width in attention blocks.
      mbconv_expand_ratio: hidden width / stage width in MBConv blocks.
      local_conv_size: kernel side of the depthwise conv between attention and MLP (odd).
      in_chans: input image channels.
      out_chans: channels of the neck (the image embedding width).

    All fields are JSON-representable (the SAM config stores them); the compute
    dtype is an argument of `TinyViTEncoder`, not part of the architecture.
    """

    embed_dims: tuple[int, ...] = (64, 128, 160, 320)
    depths: tuple[int, ...] = (2, 2, 6, 2)
    num_heads: tuple[int, ...] = (2, 4, 5, 10)
    window_sizes: tuple[int, ...] = (7, 7, 14, 7)
    merge_strides: tuple[int, ...] = (2, 2, 1)
    mlp_ratio: float = 4.0
    mbconv_expand_ratio: float = 4.0
    local_conv_size: int = 3
    in_chans: int = 3
    out_chans: int = 256

    def __post_init__(self):
        n = len(self.embed_dims)
        if n < 1:
            raise ValueError("embed_dims must name at least one stage")
        for name in ("depths", "num_heads", "window_sizes"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"{name} has {len(getattr(self, name))} entries, "
                                 f"embed_dims has {n}; give one per stage")
        if len(self.merge_strides) != n - 1:
            raise ValueError(f"merge_strides must have {n - 1} entries (one per merge), "
                             f"got {len(self.merge_strides)}")
        for name in ("embed_dims", "depths", "in_chans", "out_chans"):
            values = getattr(self, name)
            values = values if isinstance(values, tuple) else (values,)
            if any((not isinstance(v, int)) or v < 1 for v in values):
                raise ValueError(f"{name} must hold positive ints, got {getattr(self, name)!r}")
        if any(s not in (1, 2) for s in self.merge_strides):
            raise ValueError(f"merge_strides must be 1 or 2, got {self.merge_strides!r}")
        if self.embed_dims[0] % 2:
            raise ValueError(f"embed_dims[0] must be even (the stem's first conv has half "
                             f"its width), got {self.embed_dims[0]}")
        for i in range(1, n):
            heads, window = self.num_heads[i], self.window_sizes[i]
            if not isinstance(heads, int) or heads < 1 or self.embed_dims[i] % heads:
                raise ValueError(f"num_heads[{i}]={heads!r} must be a positive divisor of "
                                 f"embed_dims[{i}]={self.embed_dims[i]}")
            if not isinstance(window, int) or window < 1:
                raise ValueError(f"window_sizes[{i}] must be a positive int, got {window!r}")
        if not isinstance(self.local_conv_size, int) or self.local_conv_size < 1 \
                or self.local_conv_size % 2 == 0:
            raise ValueError(f"local_conv_size must be a positive odd int, got {self.local_conv_size!r}")
        if self.mlp_ratio <= 0 or self.mbconv_expand_ratio <= 0:
            raise ValueError("mlp_ratio and mbconv_expand_ratio must be positive")

    @property
    def total_stride(self) -> int:
        """Input pixels per output token along each axis (16 for MobileSAM)."""
        return _STEM_STRIDE * math.prod(self.merge_strides)


def attention_bias_index(window_size: int) -> np.ndarray:
    """Which learned bias each (query, key) pair of a window uses.

    Tokens of a ``window_size`` x ``window_size`` window are numbered row-major.
    The reference numbers the distinct absolute offsets (|dy|, |dx|) in the
    order it first meets them while scanning (query, key) pairs row-major; the
    first query (0, 0) already meets every offset, in row-major order, so the
    number of offset (|dy|, |dx|) is ``|dy| * window_size + |dx|``.

    Args:
      window_size: window side in tokens (>= 1).

    Returns:
      int32[N, N] with N = window_size**2, values in [0, N).
    """
    if not isinstance(window_size, (int, np.integer)) or window_size < 1:
        raise ValueError(f"window_size must be a positive int, got {window_size!r}")
    rows, cols = np.divmod(np.arange(window_size * window_size), window_size)
    d_row = np.abs(rows[:, None] - rows[None, :])
    d_col = np.abs(cols[:, None] - cols[None, :])
    return (d_row * window_size + d_col).astype(np.int32)


def window_partition(x: jax.Array, window_size: int) -> jax.Array:
    """Cuts a token grid into non-overlapping square windows.

    Args:
      x: [B, H, W, C] with H and W multiples of ``window_size``.
      window_size: window side in tokens.

    Returns:
      [B * (H / ws) * (W / ws), ws * ws, C]; windows ordered (batch, window row,
      window column), tokens row-major inside a window.
    """
    b, h, w, c = x.shape
    if h % window_size or w % window_size:
        raise ValueError(f"x spatial shape {(h, w)} is not a multiple of window_size {window_size}")
    x = x.reshape(b, h // window_size, window_size, w // window_size, window_size, c)
    x = x.transpose(0, 1, 3, 2, 4, 5)
    return x.reshape(-1, window_size * window_size, c)


def window_merge(windows: jax.Array, window_size: int, height: int, width: int) -> jax.Array:
    """Inverse of `window_partition`.

    Args:
      windows: [B * (height / ws) * (width / ws), ws * ws, C].
      window_size: window side in tokens.
      height, width: the (padded) grid size, multiples of ``window_size``.

    Returns:
      [B, height, width, C].
    """
    n_rows, n_cols = height // window_size, width // window_size
    c = windows.shape[-1]
    x = windows.reshape(-1, n_rows, n_cols, window_size, window_size, c)
    x = x.transpose(0, 1, 3, 2, 4, 5)
    return x.reshape(-1, height, width, c)


class FrozenBatchNorm(nn.Module):
    """BatchNorm in eval mode, with its running statistics stored as parameters.

    Params: ``scale``, ``bias``, ``mean``, ``var`` (all f32[features]); computes
    ``x * s + (bias - mean * s)`` with ``s = scale / sqrt(var + eps)`` over the
    last axis of ``x`` ([..., features]), in float32; returns float32.
    """

    features: int
    epsilon: float = _BATCH_NORM_EPS

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        shape = (self.features,)
        scale = self.param("scale", nn.initializers.ones, shape, jnp.float32)
        bias = self.param("bias", nn.initializers.zeros, shape, jnp.float32)
        mean = self.param("mean", nn.initializers.zeros, shape, jnp.float32)
        var = self.param("var", nn.initializers.ones, shape, jnp.float32)
        multiplier = scale * jax.lax.rsqrt(var + self.epsilon)
        shift = bias - mean * multiplier
        return x.astype(jnp.float32) * multiplier + shift


class ConvBN(nn.Module):
    """A bias-free square convolution followed by eval-mode BatchNorm (torch ``Conv2d_BN``).

    Padding is ``kernel_size // 2`` on every side, as in every Conv2d_BN of
    TinyViT. Maps [B, H, W, C_in] -> f32[B, ceil(H / stride), ceil(W / stride), features];
    the convolution runs in ``dtype``.
    """

    features: int
    kernel_size: int = 1
    stride: int = 1
    groups: int = 1
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        pad = self.kernel_size // 2
        if self.groups > 1 and self.groups == self.features == x.shape[-1]:
            # depth-wise: shifted sums, much faster than XLA's grouped conv on CPU
            conv = DepthwiseConv(self.features, (self.kernel_size, self.kernel_size),
                                 strides=(self.stride, self.stride), padding=((pad, pad), (pad, pad)),
                                 use_bias=False, dtype=self.dtype, name="conv")
        else:
            conv = nn.Conv(self.features, (self.kernel_size, self.kernel_size),
                           strides=(self.stride, self.stride), padding=((pad, pad), (pad, pad)),
                           feature_group_count=self.groups, use_bias=False, dtype=self.dtype,
                           name="conv")
        x = conv(x.astype(self.dtype))
        return FrozenBatchNorm(self.features, name="bn")(x)


def _layer_norm(name: str, epsilon: float = _TOKEN_LAYER_NORM_EPS) -> nn.LayerNorm:
    """torch-equivalent float32 LayerNorm over the last axis (two-pass variance)."""
    return nn.LayerNorm(epsilon=epsilon, use_fast_variance=False, dtype=jnp.float32, name=name)


class PatchEmbed(nn.Module):
    """Stem: [B, H, W, 3] -> [B, H/4, W/4, embed_dim] (two stride-2 3x3 Conv+BN, GELU between)."""

    embed_dim: int
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        x = ConvBN(self.embed_dim // 2, 3, stride=2, dtype=self.dtype, name="conv_0")(x)
        x = _gelu(x)
        return ConvBN(self.embed_dim, 3, stride=2, dtype=self.dtype, name="conv_1")(x)


class MBConv(nn.Module):
    """Inverted-residual block: [B, H, W, C] -> [B, H, W, C]."""

    expand_ratio: float
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        channels = x.shape[-1]
        hidden = int(channels * self.expand_ratio)
        y = _gelu(ConvBN(hidden, 1, dtype=self.dtype, name="conv1")(x))
        y = _gelu(ConvBN(hidden, 3, groups=hidden, dtype=self.dtype, name="conv2")(y))
        y = ConvBN(channels, 1, dtype=self.dtype, name="conv3")(y)
        return _gelu(y + x)


class PatchMerging(nn.Module):
    """Downsampling between stages: [B, H, W, C] -> [B, ceil(H/s), ceil(W/s), out_dim]."""

    out_dim: int
    stride: int
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        x = _gelu(ConvBN(self.out_dim, 1, dtype=self.dtype, name="conv1")(x))
        x = _gelu(ConvBN(self.out_dim, 3, stride=self.stride, groups=self.out_dim,
                         dtype=self.dtype, name="conv2")(x))
        return ConvBN(self.out_dim, 1, dtype=self.dtype, name="conv3")(x)


class WindowAttention(nn.Module):
    """Multi-head self-attention inside windows, with learned offset biases.

    Pre-LayerNorm, a fused qkv projection laid out per head as
    [head][q | k | v] (each head_dim wide), logits ``q.k * head_dim**-0.5 +
    bias[head, offset(query, key)]``, softmax (float32), output projection.
    Maps windows [B', N, C] -> f32[B', N, C] with N = window_size**2.
    Param ``attention_biases``: f32[num_heads, window_size**2].
    """

    num_heads: int
    window_size: int
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, windows: jax.Array) -> jax.Array:
        n_windows, n_tokens, dim = windows.shape
        head_dim = dim // self.num_heads
        n_offsets = self.window_size * self.window_size
        biases = self.param("attention_biases", nn.initializers.zeros,
                            (self.num_heads, n_offsets), jnp.float32)
        x = _layer_norm("norm")(windows).astype(self.dtype)
        qkv = nn.Dense(3 * dim, dtype=self.dtype, name="qkv")(x)
        qkv = qkv.reshape(n_windows, n_tokens, self.num_heads, 3 * head_dim)
        q, k, v = jnp.split(qkv, 3, axis=-1)
        logits = jnp.einsum("bqhd,bkhd->bhqk", q, k, preferred_element_type=jnp.float32)
        bias = biases[:, attention_bias_index(self.window_size)]  # [heads, N, N]
        logits = logits * (head_dim ** -0.5) + bias[None]
        weights = jax.nn.softmax(logits, axis=-1).astype(self.dtype)
        out = jnp.einsum("bhqk,bkhd->bqhd", weights, v).reshape(n_windows, n_tokens, dim)
        return nn.Dense(dim, dtype=self.dtype, name="proj")(out).astype(jnp.float32)


class Mlp(nn.Module):
    """Pre-LayerNorm MLP: [..., C] -> f32[..., C] (fc1 -> exact GELU -> fc2)."""

    hidden_dim: int
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        dim = x.shape[-1]
        x = _layer_norm("norm")(x).astype(self.dtype)
        x = _gelu(nn.Dense(self.hidden_dim, dtype=self.dtype, name="fc1")(x).astype(jnp.float32))
        return nn.Dense(dim, dtype=self.dtype, name="fc2")(x.astype(self.dtype)).astype(jnp.float32)


class TinyViTBlock(nn.Module):
    """Window attention (+residual), depthwise local conv, MLP (+residual): [B,H,W,C] -> same."""

    num_heads: int
    window_size: int
    mlp_ratio: float
    local_conv_size: int
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        _, height, width, dim = x.shape
        ws = self.window_size
        pad_h, pad_w = (-height) % ws, (-width) % ws
        # The reference pads with zeros *before* the attention's LayerNorm and
        # does not mask the padded tokens (they act as keys and values).
        padded = jnp.pad(x, ((0, 0), (0, pad_h), (0, pad_w), (0, 0)))
        windows = window_partition(padded, ws)
        windows = WindowAttention(self.num_heads, ws, dtype=self.dtype, name="attn")(windows)
        attended = window_merge(windows, ws, height + pad_h, width + pad_w)
        x = x + attended[:, :height, :width]
        x = ConvBN(dim, self.local_conv_size, groups=dim, dtype=self.dtype, name="local_conv")(x)
        return x + Mlp(int(dim * self.mlp_ratio), dtype=self.dtype, name="mlp")(x)


class ConvStage(nn.Module):
    """Stage 0: MBConv blocks, then (optionally) patch merging."""

    depth: int
    expand_ratio: float
    out_dim: int | None
    merge_stride: int
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        for j in range(self.depth):
            x = MBConv(self.expand_ratio, dtype=self.dtype, name=f"blocks_{j}")(x)
        if self.out_dim is not None:
            x = PatchMerging(self.out_dim, self.merge_stride, dtype=self.dtype, name="downsample")(x)
        return x


class AttentionStage(nn.Module):
    """Stages 1..: TinyViT blocks, then (optionally) patch merging."""

    depth: int
    num_heads: int
    window_size: int
    mlp_ratio: float
    local_conv_size: int
    out_dim: int | None
    merge_stride: int
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        for j in range(self.depth):
            x = TinyViTBlock(self.num_heads, self.window_size, self.mlp_ratio,
                             self.local_conv_size, dtype=self.dtype, name=f"blocks_{j}")(x)
        if self.out_dim is not None:
            x = PatchMerging(self.out_dim, self.merge_stride, dtype=self.dtype, name="downsample")(x)
        return x


class Neck(nn.Module):
    """1x1 conv, channel LayerNorm, 3x3 conv, channel LayerNorm (eps 1e-6, no conv bias)."""

    out_chans: int
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        x = nn.Conv(self.out_chans, (1, 1), use_bias=False, dtype=self.dtype,
                    name="conv_0")(x.astype(self.dtype))
        x = _layer_norm("norm_0", _NECK_LAYER_NORM_EPS)(x).astype(self.dtype)
        x = nn.Conv(self.out_chans, (3, 3), padding=((1, 1), (1, 1)), use_bias=False,
                    dtype=self.dtype, name="conv_1")(x)
        return _layer_norm("norm_1", _NECK_LAYER_NORM_EPS)(x)


class TinyViTEncoder(nn.Module):
    """MobileSAM's TinyViT image encoder.

    Call: ``TinyViTEncoder(config, dtype=jnp.float32).apply({'params': params}, images)``;
    ``dtype`` is the compute dtype (see the module docstring).

    Args (of ``__call__``):
      images: f32[B, H, W, in_chans], SAM-normalised and zero-padded
        (1024x1024 for MobileSAM); H and W multiples of ``config.total_stride``.

    Returns:
      f32[B, H / total_stride, W / total_stride, out_chans]
      (f32[B, 64, 64, 256] for MobileSAM at 1024x1024).

    Param tree: ``patch_embed``, ``layers_{i}`` (``blocks_{j}``, ``downsample``),
    ``neck``; see ports/mobile_sam.py for the torch key table.

    Intermediates: the output of stage 1 (after its patch merging,
    f32[B, H / 16, W / 16, embed_dims[2]] for MobileSAM's strides) is sown into
    the ``intermediates`` collection under ``interm_embeddings`` (SAM-HQ's
    TinyViT variant fuses it into its mask features, as the reference's
    ``interm_embeddings``); apply with ``mutable=["intermediates"]`` to get it.
    """

    config: TinyViTConfig = TinyViTConfig()
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, images: jax.Array) -> jax.Array:
        cfg = self.config
        if not jnp.issubdtype(jnp.dtype(self.dtype), jnp.floating):
            raise ValueError(f"dtype must be a floating dtype, got {self.dtype!r}")
        if images.ndim != 4 or images.shape[-1] != cfg.in_chans:
            raise ValueError(f"images must be [B, H, W, {cfg.in_chans}], got shape {images.shape}")
        height, width = images.shape[1:3]
        if height % cfg.total_stride or width % cfg.total_stride or height == 0 or width == 0:
            raise ValueError(f"images height and width must be positive multiples of "
                             f"{cfg.total_stride}, got {(height, width)}")
        x = PatchEmbed(cfg.embed_dims[0], dtype=self.dtype, name="patch_embed")(
            images.astype(jnp.float32))
        n_stages = len(cfg.embed_dims)
        for i in range(n_stages):
            last = i == n_stages - 1
            out_dim = None if last else cfg.embed_dims[i + 1]
            stride = 1 if last else cfg.merge_strides[i]
            if i == 0:
                stage = ConvStage(cfg.depths[0], cfg.mbconv_expand_ratio, out_dim, stride,
                                  dtype=self.dtype, name="layers_0")
            else:
                stage = AttentionStage(cfg.depths[i], cfg.num_heads[i], cfg.window_sizes[i],
                                       cfg.mlp_ratio, cfg.local_conv_size, out_dim, stride,
                                       dtype=self.dtype, name=f"layers_{i}")
            x = stage(x)
            if i == 1:
                # SAM-HQ's early feature: stage 1's output after its merge
                # (apply with mutable=["intermediates"] to read it).
                self.sow("intermediates", "interm_embeddings", x)
        return Neck(cfg.out_chans, dtype=self.dtype, name="neck")(x)


def build_tiny_vit(config: TinyViTConfig, dtype: Any) -> TinyViTEncoder:
    """Image-encoder registry builder for kind "tiny_vit" (``SamConfig.encoder_kind``)."""
    return TinyViTEncoder(config, dtype=dtype)


register_image_encoder("tiny_vit", TinyViTConfig, build_tiny_vit)
