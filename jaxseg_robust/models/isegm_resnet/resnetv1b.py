"""isegm's ResNetV1b backbone (``isegm/model/modeling/resnetv1b.py`` + ``resnet.py``), inference mode.

The dilated ResNet of the isegm DeepLabV3+ models (CDNet, ClickSEG's
``DeeplabModel``; GPCIS's ``GpModel``), as the authors' ``ResNetBackbone``
builds it for ``DeepLabV3Plus`` (``dilated=True``, no ``avg_down``):

* stem: a 7x7/2 conv (pad 3) to ``width`` channels (ResNet-18/34, "v1b"), or
  the deep stem of the "v1s" models (ResNet-50/101/152): 3x3/2 conv to
  ``stem_width``, BN, ReLU, 3x3 conv, BN, ReLU, 3x3 conv to ``2 * stem_width``
  (torch ``conv1.0`` .. ``conv1.6``); then ``bn1`` and ReLU;
* the coordinate features (isegm's ``maps_transform`` output, stride 2) are
  added here, after the stem's ReLU and before the max pool, zero-padded in
  channels to the stem's width -- or cut to it when wider: torch's
  ``F.pad`` with a negative pad crops (GPCIS adds 256 channels to the
  128-channel deep stem, so only the first 128 count);
* a 3x3/2 max pool (pad 1), then layer1..4 of `BasicBlock` (expansion 1) or
  `Bottleneck` (expansion 4; stride on the 3x3 conv) with ``width * 2**i``
  planes; layer2 has stride 2, layer3 and layer4 stride 1 and dilation 2 and
  4 (output stride 8). The first block of layer3 runs its first 3x3 at
  dilation 1 and of layer4 at dilation 2; a BasicBlock's second 3x3 always
  runs at the layer's dilation (isegm's ``previous_dilation``). A projection
  shortcut (1x1 conv with the block's stride, BN) where the shape changes;
* BatchNorm with running statistics (eps 1e-5), no biases in any conv.

Returns ``(c1, c2, c3, c4)`` NHWC as isegm: c1 at stride 4, c2, c3 and c4 at
stride 8 (f32[B, H/4, W/4, width e], f32[B, H/8, W/8, 2 width e], [.., 4 width
e], [.., 8 width e]; e the block's expansion; sizes rounded up as torch's
convolutions round them).

Parameters are torch-named and torch-pathed (``layer3/0/downsample/1/running_var``,
`jaxseg_robust.models.clickmap.layers`), so a checkpoint's backbone keys map one
to one. Which isegm names build which backbone is declared in `BACKBONES`.
docs/models/cdnet.md describes the port.
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax.numpy as jnp

from jaxseg_robust.models.clickmap.layers import BatchNorm2d, Conv2d

BASIC = "basic"
BOTTLENECK = "bottleneck"
EXPANSION = {BASIC: 1, BOTTLENECK: 4}
LAYER_DILATIONS = (1, 1, 2, 4)
LAYER_STRIDES = (1, 2, 1, 1)


@dataclasses.dataclass(frozen=True)
class BackboneSpec:
    """How isegm builds one named backbone (``resnet34_v1b``, ``resnet50_v1s``, ...).

    Attributes:
      block: `BASIC` (BasicBlockV1b) or `BOTTLENECK` (BottleneckV1b).
      layers: blocks per stage (layer1..4).
      deep_stem: three 3x3 convs instead of the 7x7 conv.
      stem_width: width of the deep stem's first convs (its output is twice that).
      width: planes of layer1 (doubled per stage; 64 in every isegm model,
        smaller only for the tiny random-weight test configs).
    """

    block: str
    layers: tuple[int, int, int, int]
    deep_stem: bool
    stem_width: int = 32
    width: int = 64

    def __post_init__(self):
        if self.block not in EXPANSION:
            raise ValueError(f"block must be one of {sorted(EXPANSION)}; got {self.block!r}")
        if len(self.layers) != 4 or min(self.layers) <= 0:
            raise ValueError(f"layers must be 4 positive block counts; got {self.layers}")
        if self.stem_width <= 0 or self.width <= 0:
            raise ValueError(f"stem_width and width must be positive; got {self.stem_width}, {self.width}")

    @property
    def expansion(self) -> int:
        """Output channels per plane of one block (1 basic, 4 bottleneck)."""
        return EXPANSION[self.block]

    @property
    def stem_channels(self) -> int:
        """Channels after the stem (where the coordinate features are added)."""
        return 2 * self.stem_width if self.deep_stem else self.width

    @property
    def stage_channels(self) -> tuple[int, int, int, int]:
        """Output channels of layer1..4 (c1..c4)."""
        return tuple(self.width * 2 ** i * self.expansion for i in range(4))


# isegm's ``ResNetBackbone(backbone=...)`` names (resnetv1b.py: resnet18/34_v1b, resnet50/101/152_v1s).
BACKBONES = {
    "resnet18": BackboneSpec(BASIC, (2, 2, 2, 2), deep_stem=False),
    "resnet34": BackboneSpec(BASIC, (3, 4, 6, 3), deep_stem=False),
    "resnet50": BackboneSpec(BOTTLENECK, (3, 4, 6, 3), deep_stem=True, stem_width=64),
    "resnet101": BackboneSpec(BOTTLENECK, (3, 4, 23, 3), deep_stem=True, stem_width=64),
    "resnet152": BackboneSpec(BOTTLENECK, (3, 8, 36, 3), deep_stem=True, stem_width=64),
}


def backbone_spec(name: str) -> BackboneSpec:
    """The `BackboneSpec` of an isegm backbone name; ValueError naming the known ones otherwise."""
    if name not in BACKBONES:
        raise ValueError(f"unknown isegm backbone {name!r}; known: {', '.join(BACKBONES)}")
    return BACKBONES[name]


def block_dilations(layer_dilation: int, index: int) -> tuple[int, int]:
    """(first 3x3 dilation, BasicBlock's second 3x3 dilation) of block ``index`` of a stage.

    isegm's ``_make_layer``: the first block of a dilation-2 stage runs at 1,
    of a dilation-4 stage at 2; later blocks at the stage's dilation; the
    BasicBlock's second conv always at the stage's (``previous_dilation``).
    """
    if index > 0:
        return layer_dilation, layer_dilation
    first = {1: 1, 2: 1, 4: 2}.get(layer_dilation)
    if first is None:
        raise ValueError(f"unknown dilation size: {layer_dilation}")
    return first, layer_dilation


class BasicBlock(nn.Module):
    """isegm ``BasicBlockV1b``: f32[B, h, w, in] -> f32[B, h/stride, w/stride, planes]."""

    in_channels: int
    planes: int
    stride: int = 1
    dilation: int = 1
    previous_dilation: int = 1
    downsample: bool = False

    @nn.compact
    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        p, d, pd = self.planes, self.dilation, self.previous_dilation
        out = Conv2d(self.in_channels, p, 3, stride=self.stride, padding=d, dilation=d, bias=False,
                     name="conv1")(x)
        out = nn.relu(BatchNorm2d(p, name="bn1")(out))
        out = Conv2d(p, p, 3, padding=pd, dilation=pd, bias=False, name="conv2")(out)
        out = BatchNorm2d(p, name="bn2")(out)
        residual = Downsample(self.in_channels, p, self.stride, name="downsample")(x) if self.downsample else x
        return nn.relu(out + residual)


class Bottleneck(nn.Module):
    """isegm ``BottleneckV1b`` (stride on the 3x3): f32[B, h, w, in] -> f32[B, h/s, w/s, 4 planes]."""

    in_channels: int
    planes: int
    stride: int = 1
    dilation: int = 1
    previous_dilation: int = 1  # unused by the bottleneck, as in isegm
    downsample: bool = False

    @nn.compact
    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        p, d, out_channels = self.planes, self.dilation, self.planes * EXPANSION[BOTTLENECK]
        out = Conv2d(self.in_channels, p, 1, bias=False, name="conv1")(x)
        out = nn.relu(BatchNorm2d(p, name="bn1")(out))
        out = Conv2d(p, p, 3, stride=self.stride, padding=d, dilation=d, bias=False, name="conv2")(out)
        out = nn.relu(BatchNorm2d(p, name="bn2")(out))
        out = Conv2d(p, out_channels, 1, bias=False, name="conv3")(out)
        out = BatchNorm2d(out_channels, name="bn3")(out)
        residual = (Downsample(self.in_channels, out_channels, self.stride, name="downsample")(x)
                    if self.downsample else x)
        return nn.relu(out + residual)


class Downsample(nn.Module):
    """The projection shortcut ``Sequential(Conv2d(1x1, stride, bias=False), BatchNorm2d)``: "0", "1"."""

    in_channels: int
    out_channels: int
    stride: int

    @nn.compact
    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        x = Conv2d(self.in_channels, self.out_channels, 1, stride=self.stride, bias=False, name="0")(x)
        return BatchNorm2d(self.out_channels, name="1")(x)


class DeepStem(nn.Module):
    """The "v1s" stem ``conv1 = Sequential(conv, BN, ReLU, conv, BN, ReLU, conv)``: children 0, 1, 3, 4, 6.

    f32[B, H, W, 3] -> f32[B, H/2, W/2, 2 * stem_width] (before ``bn1``).
    """

    stem_width: int

    @nn.compact
    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        w = self.stem_width
        x = Conv2d(3, w, 3, stride=2, padding=1, bias=False, name="0")(x)
        x = nn.relu(BatchNorm2d(w, name="1")(x))
        x = Conv2d(w, w, 3, padding=1, bias=False, name="3")(x)
        x = nn.relu(BatchNorm2d(w, name="4")(x))
        return Conv2d(w, 2 * w, 3, padding=1, bias=False, name="6")(x)


def match_channels(features: jnp.ndarray, channels: int) -> jnp.ndarray:
    """torch ``F.pad(features, [0, 0, 0, 0, 0, channels - C])`` on f32[..., C]: zeros appended, or cut to
    the first ``channels`` when C is larger (a negative pad crops)."""
    extra = channels - features.shape[-1]
    if extra <= 0:
        return features[..., :channels]
    pad = [(0, 0)] * (features.ndim - 1) + [(0, extra)]
    return jnp.pad(features, pad)


def max_pool_3x3_s2(x: jnp.ndarray) -> jnp.ndarray:
    """torch ``MaxPool2d(3, stride=2, padding=1)`` of f32[..., H, W, C] (padding never wins: -inf)."""
    lead = x.shape[:-3]
    y = nn.max_pool(x.reshape((-1,) + x.shape[-3:]), (3, 3), strides=(2, 2), padding=((1, 1), (1, 1)))
    return y.reshape(lead + y.shape[1:])


class ResNetV1b(nn.Module):
    """isegm's dilated ``ResNetBackbone`` (output stride 8) of one `BackboneSpec`.

    ``__call__(image, additional_features=None)``: image f32[..., H, W, 3]
    (normalised as isegm does before the backbone), additional_features
    f32[..., ceil(H/2), ceil(W/2), K] or None. Returns (c1, c2, c3, c4), see the
    module docstring. Parameter paths: torch's (``conv1``, ``bn1``,
    ``layer1/0/conv1``, ...).
    """

    spec: BackboneSpec

    @nn.compact
    def __call__(self, image: jnp.ndarray, additional_features: jnp.ndarray | None = None):
        spec = self.spec
        if spec.deep_stem:
            x = DeepStem(spec.stem_width, name="conv1")(image)
        else:
            x = Conv2d(3, spec.width, 7, stride=2, padding=3, bias=False, name="conv1")(image)
        x = nn.relu(BatchNorm2d(spec.stem_channels, name="bn1")(x))
        if additional_features is not None:
            x = x + match_channels(additional_features.astype(x.dtype), spec.stem_channels)
        x = max_pool_3x3_s2(x)
        outputs = []
        in_channels = spec.stem_channels
        for i in range(4):
            x = Stage(spec, i, in_channels, name=f"layer{i + 1}")(x)
            in_channels = spec.stage_channels[i]
            outputs.append(x)
        return tuple(outputs)


class Stage(nn.Module):
    """Stage ``layer{index + 1}`` of a `ResNetV1b`: its blocks, children "0", "1", ...

    f32[B, h, w, in_channels] -> f32[B, h / stride, w / stride, spec.stage_channels[index]].
    """

    spec: BackboneSpec
    index: int
    in_channels: int

    @nn.compact
    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        spec, index = self.spec, self.index
        block = BasicBlock if spec.block == BASIC else Bottleneck
        planes, stride = spec.width * 2 ** index, LAYER_STRIDES[index]
        out_channels = spec.stage_channels[index]
        for j in range(spec.layers[index]):
            first, previous = block_dilations(LAYER_DILATIONS[index], j)
            x = block(self.in_channels if j == 0 else out_channels, planes,
                      stride=stride if j == 0 else 1, dilation=first, previous_dilation=previous,
                      downsample=j == 0 and (stride != 1 or self.in_channels != out_channels),
                      name=str(j))(x)
        return x
