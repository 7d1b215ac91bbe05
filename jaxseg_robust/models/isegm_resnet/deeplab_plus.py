"""isegm's DeepLabV3+ pieces (``isegm/model/modeling/deeplab_v3.py``, ``basic_blocks.py``), inference mode.

What ClickSEG's ``deeplab_v3.py`` (CDNet) and GPCIS's ``deeplab_v3_gp.py``
share, with torch's module names as parameter paths:

* `SeparableConv2d` (``body.0`` depthwise kxk without bias, ``body.1`` 1x1
  without bias, ``body.2`` BatchNorm, ReLU) and `SepConvHead` (``layers.i``
  separable convs, then a 1x1 conv with bias; isegm's ``dropout_ratio`` is 0
  in every model ported here);
* `ASPP` (``concurent.0`` 1x1, ``concurent.1..3`` 3x3 at rates 12/24/36,
  ``concurent.4.gap`` global mean -> 1x1 -> BN -> ReLU broadcast back, every
  branch conv without bias + BN + ReLU; ``project`` 1x1 + BN + ReLU; the
  dropout is off at inference);
* `SkipProject` (``skip_project.0`` 1x1 without bias, BN, ReLU: layer1 -> 32
  channels) and `DeepLabHead` (``block.0``, ``block.1`` separable convs,
  ``block.2`` 1x1 with bias);
* `DeepLabV3Plus` (``backbone``, ``skip_project``, ``aspp``, ``head``): the
  backbone (`ResNetV1b`), then ``features`` = (skip projection of c1, ASPP of
  c4) and ``fuse`` = the ASPP output resized to c1's size (bilinear,
  align_corners=True), concatenated after it with the skip projection, and the
  head. GPCIS runs ``fuse(*features)`` unchanged (``__call__``); CDNet puts its
  FDM between the two (models/cdnet).

The two authors' files differ only in what sits between ASPP and the resize
(CDNet's FDM), the head's output width (CDNet ``ch``, GPCIS 48; `head_channels`)
and the channel counts ASPP and the skip projection read: GPCIS derives them
from a ResNet-50 (2048, 256), ClickSEG's test ``backbone == 'resnet34' or
'resnet18'`` is always true, so its DeepLabV3Plus reads 512 and 64 (it runs
with ResNet-18/34 only). Here both are derived from the backbone
(`BackboneSpec.stage_channels`), which is the same for every model either
family ships. docs/models/cdnet.md describes the port.
"""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp

from jaxseg_robust.models.clickmap.layers import BatchNorm2d, Conv2d
from jaxseg_robust.models.dense.layers import upsample_bilinear_aligned
from jaxseg_robust.models.isegm_resnet.resnetv1b import BackboneSpec, ResNetV1b

ATROUS_RATES = (12, 24, 36)
SKIP_CHANNELS = 32


class SeparableConv2d(nn.Module):
    """isegm ``SeparableConv2d(activation='relu', norm_layer=BatchNorm2d)``: children "body/0", "body/1",
    "body/2". f32[B, h, w, in] -> f32[B, h, w, out] (stride 1, padding ``kernel // 2``)."""

    in_channels: int
    out_channels: int
    kernel_size: int = 3

    @nn.compact
    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        return _SeparableBody(self.in_channels, self.out_channels, self.kernel_size, name="body")(x)


class _SeparableBody(nn.Module):
    """``body = Sequential(depthwise, pointwise, BatchNorm2d, ReLU)``."""

    in_channels: int
    out_channels: int
    kernel_size: int

    @nn.compact
    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        c, k = self.in_channels, self.kernel_size
        x = Conv2d(c, c, k, padding=k // 2, groups=c, bias=False, name="0")(x)
        x = Conv2d(c, self.out_channels, 1, bias=False, name="1")(x)
        return nn.relu(BatchNorm2d(self.out_channels, name="2")(x))


class SepConvHead(nn.Module):
    """isegm ``SepConvHead(num_outputs, in_channels, mid_channels, num_layers)`` (no dropout).

    f32[B, h, w, in_channels] -> f32[B, h, w, num_outputs]; children
    "layers/0" .. "layers/{num_layers - 1}" (`SeparableConv2d`) and
    "layers/{num_layers}" (1x1 conv with bias).
    """

    num_outputs: int
    in_channels: int
    mid_channels: int
    num_layers: int = 1

    @nn.compact
    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        return _SepConvLayers(self.num_outputs, self.in_channels, self.mid_channels, self.num_layers,
                              name="layers")(x)


class _SepConvLayers(nn.Module):
    num_outputs: int
    in_channels: int
    mid_channels: int
    num_layers: int

    @nn.compact
    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        for i in range(self.num_layers):
            x = SeparableConv2d(self.in_channels if i == 0 else self.mid_channels, self.mid_channels,
                                name=str(i))(x)
        return Conv2d(self.mid_channels, self.num_outputs, 1, name=str(self.num_layers))(x)


class ConvBNReLU(nn.Module):
    """``Sequential(Conv2d(bias=False), BatchNorm2d, ReLU)``: children "0", "1".

    f32[B, h, w, in] -> f32[B, h, w, out]; kernel 1 or 3 (padding = dilation for 3x3).
    """

    in_channels: int
    out_channels: int
    kernel_size: int = 1
    dilation: int = 1

    @nn.compact
    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        pad = self.dilation * (self.kernel_size // 2)
        x = Conv2d(self.in_channels, self.out_channels, self.kernel_size, padding=pad,
                   dilation=self.dilation, bias=False, name="0")(x)
        return nn.relu(BatchNorm2d(self.out_channels, name="1")(x))


class AsppPooling(nn.Module):
    """isegm ``_AsppPooling``: ``gap = Sequential(AdaptiveAvgPool2d(1), Conv2d, BN, ReLU)`` ("gap/1",
    "gap/2"), broadcast back (align_corners resize of a 1x1 map). f32[B, h, w, in] -> f32[B, h, w, out]."""

    in_channels: int
    out_channels: int

    @nn.compact
    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        return _GlobalPoolBranch(self.in_channels, self.out_channels, name="gap")(x)


class _GlobalPoolBranch(nn.Module):
    in_channels: int
    out_channels: int

    @nn.compact
    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        pooled = jnp.mean(x, axis=(-3, -2), keepdims=True)
        pooled = Conv2d(self.in_channels, self.out_channels, 1, bias=False, name="1")(pooled)
        pooled = nn.relu(BatchNorm2d(self.out_channels, name="2")(pooled))
        return jnp.broadcast_to(pooled, x.shape[:-1] + (self.out_channels,))


class ASPP(nn.Module):
    """isegm ``_ASPP``: five branches ("concurent/0" .. "concurent/4"), concatenated, "project" (1x1,
    BN, ReLU; dropout off). f32[B, h, w, in_channels] -> f32[B, h, w, out_channels]."""

    in_channels: int
    out_channels: int
    atrous_rates: tuple[int, int, int] = ATROUS_RATES

    @nn.compact
    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        x = _AsppBranches(self.in_channels, self.out_channels, self.atrous_rates, name="concurent")(x)
        return ConvBNReLU(5 * self.out_channels, self.out_channels, 1, name="project")(x)


class _AsppBranches(nn.Module):
    """``concurent``: the five branches (children "0" .. "4"), concatenated in order (5 * out channels)."""

    in_channels: int
    out_channels: int
    atrous_rates: tuple[int, int, int]

    @nn.compact
    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        c_in, c = self.in_channels, self.out_channels
        branches = [ConvBNReLU(c_in, c, 1, name="0")(x)]
        for i, rate in enumerate(self.atrous_rates, start=1):
            branches.append(ConvBNReLU(c_in, c, 3, dilation=rate, name=str(i))(x))
        branches.append(AsppPooling(c_in, c, name="4")(x))
        return jnp.concatenate(branches, axis=-1)


class SkipProject(nn.Module):
    """isegm ``_SkipProject``: "skip_project/0" (1x1, no bias), "skip_project/1" (BN), ReLU.

    f32[B, h, w, in_channels] -> f32[B, h, w, out_channels].
    """

    in_channels: int
    out_channels: int = SKIP_CHANNELS

    @nn.compact
    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        return ConvBNReLU(self.in_channels, self.out_channels, 1, name="skip_project")(x)


class DeepLabHead(nn.Module):
    """isegm ``_DeepLabHead``: "block/0", "block/1" (`SeparableConv2d` 3x3), "block/2" (1x1 with bias).

    f32[B, h, w, in_channels] -> f32[B, h, w, out_channels].
    """

    out_channels: int
    in_channels: int
    mid_channels: int

    @nn.compact
    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        return _HeadBlock(self.out_channels, self.in_channels, self.mid_channels, name="block")(x)


class _HeadBlock(nn.Module):
    out_channels: int
    in_channels: int
    mid_channels: int

    @nn.compact
    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        x = SeparableConv2d(self.in_channels, self.mid_channels, name="0")(x)
        x = SeparableConv2d(self.mid_channels, self.mid_channels, name="1")(x)
        return Conv2d(self.mid_channels, self.out_channels, 1, name="2")(x)


def resize_to_skip(context: jnp.ndarray, skip: jnp.ndarray) -> jnp.ndarray:
    """The ASPP output f32[B, h8, w8, C] resized to the skip's size (bilinear, align_corners=True) and
    concatenated before it: f32[B, h4, w4, C + skip channels] (isegm ``torch.cat((x, c1))``)."""
    return jnp.concatenate([upsample_bilinear_aligned(context, skip.shape[-3:-1]), skip], axis=-1)


class DeepLabV3Plus(nn.Module):
    """isegm's ``DeepLabV3Plus`` feature extractor on a `ResNetV1b` (children "backbone",
    "skip_project", "aspp", "head"; a subclass adds its own, as CDNet's "FDM").

    Attributes:
      backbone_spec: the backbone (`resnetv1b.BACKBONES`).
      ch: ASPP and head width (isegm ``deeplab_ch``: CDNet 128, GPCIS 256).
      head_channels: the head's output channels (CDNet ``ch``, GPCIS 48).

    ``features(image, coord_features)``: image f32[B, H, W, 3] normalised,
    coord_features f32[B, H/2, W/2, K] (the backbone adds them after its stem)
    -> (skip f32[B, H/4, W/4, 32], context f32[B, H/8, W/8, ch]).
    ``fuse(context, skip)`` -> f32[B, H/4, W/4, head_channels].
    ``__call__`` = ``fuse(context, skip)`` of ``features`` (GPCIS's forward).
    """

    backbone_spec: BackboneSpec
    ch: int = 256
    head_channels: int = 256

    def setup(self):
        c1_channels, _, _, c4_channels = self.backbone_spec.stage_channels
        self.backbone = ResNetV1b(self.backbone_spec)
        self.skip_project = SkipProject(c1_channels, SKIP_CHANNELS)
        self.aspp = ASPP(c4_channels, self.ch)
        self.head = DeepLabHead(self.head_channels, self.ch + SKIP_CHANNELS, self.ch)

    def features(self, image: jnp.ndarray, coord_features: jnp.ndarray | None):
        """(skip projection of c1, ASPP of c4); see the class docstring for shapes."""
        c1, _, _, c4 = self.backbone(image, coord_features)
        return self.skip_project(c1), self.aspp(c4)

    def fuse(self, context: jnp.ndarray, skip: jnp.ndarray) -> jnp.ndarray:
        """The head of the resized context concatenated with the skip projection."""
        return self.head(resize_to_skip(context, skip))

    def __call__(self, image: jnp.ndarray, coord_features: jnp.ndarray | None) -> jnp.ndarray:
        skip, context = self.features(image, coord_features)
        return self.fuse(context, skip)
