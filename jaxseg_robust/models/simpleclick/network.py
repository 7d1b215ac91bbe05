"""SimpleClick's interactive network (``PlainVitModel``): click embedding, ViT, SimpleFPN, head.

``SimpleClickNet(image, coord_features) -> logits`` mirrors ``ISModel.forward``
of the SimpleClick code (CFR-ICL runs the same network):

1. the image in [0, 1] is normalised with ImageNet mean/std;
2. the click maps [prev, pos, neg] are embedded by their own patch embedding
   (``patch_embed_coords``) and added to the image's patch tokens;
3. the ViT backbone (`VisionTransformer`);
4. ``SimpleFPN`` (neck): four maps at strides 4, 8, 16, 32 of the patch grid
   (two / one 2x2 transposed convs, a 1x1 conv, a 2x2 stride-2 conv; GroupNorm(1, C),
   GELU);
5. the head (``SwinTransfomerSegHead`` with ``upsample='x1'``): a 1x1 conv +
   ReLU per level, each resized to the stride-4 map (bilinear,
   ``align_corners=False``), concatenated, a 1x1 fusion conv + ReLU, dropout
   (identity at inference) and the 1x1 ``conv_seg`` (`FusionConv` applies the
   fusion conv level by level before resizing: the same function, less work);
6. the logits upsampled to the input size (bilinear, ``align_corners=True``).

Parameter names follow the torch module paths (``neck/down_4/0/weight``,
``head/convs/2/conv/weight``).
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from jaxseg_robust.models.clickability.resize import upsample_align_corners
from jaxseg_robust.models.clickmap.layers import (
    Conv2d,
    ConvTranspose2d,
    GroupNorm1,
    gelu,
    imagenet_normalize,
)
from jaxseg_robust.models.simpleclick.config import SimpleClickConfig
from jaxseg_robust.models.simpleclick.vit import PatchEmbed, VisionTransformer
from jaxseg_robust.ops.resize import apply_taps, linear_taps


def resize_bilinear_nhwc(x: jnp.ndarray, hw: tuple[int, int]) -> jnp.ndarray:
    """torch bilinear ``align_corners=False`` resize of f32[..., h, w, C] (identity if equal)."""
    if tuple(x.shape[-3:-1]) == tuple(hw):
        return x
    taps_dtype = np.float64 if x.dtype == jnp.float64 else np.float32  # as torch's kernel
    x = apply_taps(x, linear_taps(x.shape[-2], int(hw[1]), taps_dtype), axis=x.ndim - 2)
    return apply_taps(x, linear_taps(x.shape[-3], int(hw[0]), taps_dtype), axis=x.ndim - 3)


class Down4(nn.Module):
    """``down_4``: convT, GN, GELU, convT, GN, 1x1 conv, GN, GELU (children 0, 1, 3, 4, 5, 6)."""

    in_dim: int
    out_dim: int

    @nn.compact
    def __call__(self, x):
        c = max(self.out_dim * 2, self.in_dim // 2)
        x = gelu(GroupNorm1(c, name="1")(ConvTranspose2d(self.in_dim, c, 2, name="0")(x)))
        x = GroupNorm1(c // 2, name="4")(ConvTranspose2d(c, c // 2, 2, name="3")(x))
        return gelu(GroupNorm1(self.out_dim, name="6")(Conv2d(c // 2, self.out_dim, 1,
                                                             name="5")(x)))


class Down8(nn.Module):
    """``down_8``: convT, GN, 1x1 conv, GN, GELU (children 0, 1, 2, 3)."""

    in_dim: int
    out_dim: int

    @nn.compact
    def __call__(self, x):
        c = max(self.out_dim, self.in_dim // 2)
        x = GroupNorm1(c, name="1")(ConvTranspose2d(self.in_dim, c, 2, name="0")(x))
        return gelu(GroupNorm1(self.out_dim, name="3")(Conv2d(c, self.out_dim, 1, name="2")(x)))


class Down16(nn.Module):
    """``down_16``: 1x1 conv, GN, GELU (children 0, 1)."""

    in_dim: int
    out_dim: int

    @nn.compact
    def __call__(self, x):
        return gelu(GroupNorm1(self.out_dim, name="1")(Conv2d(self.in_dim, self.out_dim, 1,
                                                              name="0")(x)))


class Down32(nn.Module):
    """``down_32``: 2x2 stride-2 conv, GN, 1x1 conv, GN, GELU (children 0, 1, 2, 3)."""

    in_dim: int
    out_dim: int

    @nn.compact
    def __call__(self, x):
        c = max(self.out_dim, self.in_dim * 2)
        x = GroupNorm1(c, name="1")(Conv2d(self.in_dim, c, 2, 2, name="0")(x))
        return gelu(GroupNorm1(self.out_dim, name="3")(Conv2d(c, self.out_dim, 1, name="2")(x)))


class SimpleFPN(nn.Module):
    """``neck``: tokens f32[B, gh, gw, C] -> maps at 4x, 2x, 1x and 1/2 of the grid."""

    in_dim: int
    out_dims: tuple[int, int, int, int]

    @nn.compact
    def __call__(self, x):
        d = self.out_dims
        return [Down4(self.in_dim, d[0], name="down_4")(x), Down8(self.in_dim, d[1], name="down_8")(x),
                Down16(self.in_dim, d[2], name="down_16")(x),
                Down32(self.in_dim, d[3], name="down_32")(x)]


class ConvModule(nn.Module):
    """mmcv ``ConvModule`` without norm: a 1x1 conv with bias (child "conv") and ReLU."""

    in_channels: int
    out_channels: int

    @nn.compact
    def __call__(self, x):
        return jax.nn.relu(Conv2d(self.in_channels, self.out_channels, 1, name="conv")(x))


class Convs(nn.Module):
    """``convs``: one `ConvModule` per level, each at its own level's size (`FusionConv` resizes)."""

    in_channels: tuple[int, int, int, int]
    channels: int

    @nn.compact
    def __call__(self, inputs):
        return [ConvModule(c, self.channels, name=str(i))(x)
                for i, (c, x) in enumerate(zip(self.in_channels, inputs))]


class PointwiseWeights(nn.Module):
    """The parameters of a 1x1 `Conv2d` (``weight`` f32[1, 1, in, out], ``bias`` f32[out])."""

    in_channels: int
    out_channels: int

    @nn.compact
    def __call__(self):
        weight = self.param("weight", lambda key, s: jnp.zeros(s), (1, 1, self.in_channels, self.out_channels))
        return weight, self.param("bias", lambda key, s: jnp.zeros(s), (self.out_channels,))


class FusionConv(nn.Module):
    """``fusion_conv``: ReLU of a 1x1 conv (child "conv") on the levels, each resized to ``hw``
    (bilinear, ``align_corners=False``) and concatenated: f32[B, hw, out].

    The authors resize every level to the stride-4 map, concatenate, and apply the
    conv. Resizing acts on the two spatial axes and the conv on the channel axis,
    so they commute: here each level is multiplied by its slice of the kernel
    *before* it is resized, and the four products are summed. The same function,
    with 1/4, 1/16 and 1/64 of the products' work for the coarse levels and no
    1024-channel concatenation (the fusion conv was the head's largest cost,
    docs/models/click_models.md); values differ from the concatenated form only by
    float32 rounding (relative 1e-6).
    """

    in_channels: int
    out_channels: int

    @nn.compact
    def __call__(self, levels, hw: tuple[int, int]):
        weight, bias = PointwiseWeights(self.in_channels, self.out_channels, name="conv")()
        kernel = weight[0, 0].astype(levels[0].dtype)
        total, start = None, 0
        for level in levels:
            width = level.shape[-1]
            part = resize_bilinear_nhwc(level @ kernel[start:start + width], hw)
            total = part if total is None else total + part
            start += width
        if start != self.in_channels:
            raise ValueError(f"fusion_conv: the levels have {start} channels, the kernel {self.in_channels}")
        return jax.nn.relu(total + bias.astype(total.dtype))


class SegHead(nn.Module):
    """``head`` (``SwinTransfomerSegHead``, ``upsample='x1'``): maps -> f32[B, 4gh, 4gw, 1]."""

    in_channels: tuple[int, int, int, int]
    channels: int

    @nn.compact
    def __call__(self, inputs):
        levels = Convs(self.in_channels, self.channels, name="convs")(inputs)
        x = FusionConv(4 * self.channels, self.channels, name="fusion_conv")(levels, inputs[0].shape[-3:-1])
        return Conv2d(self.channels, 1, 1, name="conv_seg")(x)


class SimpleClickNet(nn.Module):
    """The full SimpleClick network: image f32[B, H, W, 3] in [0, 1] and click maps
    f32[B, H, W, C] ([prev, pos, neg]) -> logits f32[B, H, W] at the input resolution.
    H and W must be multiples of the patch size (`SimpleClickConfig.input_grid`)."""

    config: SimpleClickConfig

    @nn.compact
    def __call__(self, image, coord_features):
        cfg = self.config
        dtype = jnp.dtype(cfg.dtype)
        x = imagenet_normalize(image).astype(dtype)
        coords = PatchEmbed(cfg.coord_channels, cfg.embed_dim, cfg.patch_size,
                            name="patch_embed_coords")(coord_features.astype(dtype))
        tokens = VisionTransformer(cfg, name="backbone")(x, coords)
        maps = SimpleFPN(cfg.embed_dim, cfg.neck_out_dims, name="neck")(tokens)
        logits = SegHead(cfg.neck_out_dims, cfg.head_channels, name="head")(maps)
        out_dtype = jnp.promote_types(dtype, jnp.float32)  # bfloat16 -> float32; float64 kept
        logits = upsample_align_corners(logits.astype(out_dtype), image.shape[-3:-1],
                                        axes=(-3, -2))
        return logits[..., 0]
