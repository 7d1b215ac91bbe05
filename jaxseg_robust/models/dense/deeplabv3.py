"""torchvision DeepLabV3 with a dilated ResNet backbone, as Flax modules (inference mode).

Matches ``torchvision.models.segmentation.deeplabv3_resnet50`` (and _resnet101):
  * backbone: torchvision ResNet (v1.5: the stride sits on the 3x3 conv of a
    Bottleneck) with ``replace_stride_with_dilation=[False, True, True]``:
    output stride 8; layer3 runs at dilation 2 (its first block at 1),
    layer4 at dilation 4 (its first block at 2); padding = dilation. Stem:
    7x7/2 conv (pad 3), BN, ReLU, 3x3/2 max pool (pad 1). No biases in the
    backbone convs;
  * head (``DeepLabHead``): ASPP on layer4 (1x1 branch, three 3x3 branches
    at rates 12/24/36, image pooling branch: global mean -> 1x1 conv -> BN ->
    ReLU -> broadcast, i.e. the bilinear resize of a 1x1 map), concat, 1x1
    projection + BN + ReLU (+ Dropout 0.5, off at eval); then 3x3 conv + BN +
    ReLU and a 1x1 classifier with bias;
  * optional auxiliary ``FCNHead`` on layer3 (3x3 conv to in/4 + BN + ReLU,
    1x1 classifier); present in the released COCO checkpoints, unused by the
    attacks (``DeepLabV3Dense.apply`` returns the main head);
  * logits upsampled to the input size with bilinear ``align_corners=False``
    (torchvision's ``F.interpolate``), BatchNorm with running statistics,
    eps 1e-5.
Input normalisation (inside `DeepLabV3Dense`): ImageNet mean/std on [0, 1] RGB,
as torchvision's ``DeepLabV3_ResNet50_Weights`` transforms.

Variables: ``{"params", "batch_stats"}``; see ``ports.dense.deeplabv3_rules``
for the torchvision key mapping.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxseg_robust.models.config_json import config_to_dict, dataclass_from_dict
from jaxseg_robust.models.dense.base import (IMAGENET_MEAN, IMAGENET_STD, ConfiguredDense, Params,
                                             check_images, normalise)
from jaxseg_robust.models.dense.layers import (atrous_branches, batch_norm, conv2d, conv_bn_relu,
                                               upsample_bilinear)

FAMILY = "deeplabv3"
EXPANSION = 4
_VARIANTS = {(3, 4, 6, 3): "resnet50", (3, 4, 23, 3): "resnet101"}


@dataclasses.dataclass(frozen=True)
class DeepLabV3Config:
    """Static configuration (defaults: torchvision ``deeplabv3_resnet50``, 21 classes).

    Attributes:
      num_classes: C (21: the COCO-with-VOC-labels checkpoints).
      blocks: Bottleneck counts of layer1..4 ((3, 4, 6, 3): ResNet-50).
      width: stem width = planes of layer1; layer i has ``width * 2**(i-1)``
        planes and ``4x`` that many output channels (64 -> 2048 at layer4).
      aspp_channels: ASPP / head width (256).
      atrous_rates: dilations of the three 3x3 ASPP branches (12, 24, 36).
      aux_classifier: build the FCN auxiliary head on layer3.
      bn_eps: BatchNorm epsilon (torch default 1e-5).
      remat_blocks: rematerialise each Bottleneck in the backward pass
        (``nn.remat``): same values, less activation memory under ``grad``.
      pixel_mean, pixel_std: input normalisation on a 0..1 scale (ImageNet).
      background_class: index of the background class (0 for VOC labels) or None.
    """

    num_classes: int = 21
    blocks: tuple[int, int, int, int] = (3, 4, 6, 3)
    width: int = 64
    aspp_channels: int = 256
    atrous_rates: tuple[int, int, int] = (12, 24, 36)
    aux_classifier: bool = False
    bn_eps: float = 1e-5
    remat_blocks: bool = False
    pixel_mean: tuple[float, float, float] = IMAGENET_MEAN
    pixel_std: tuple[float, float, float] = IMAGENET_STD
    background_class: int | None = 0

    def __post_init__(self):
        if self.num_classes <= 0:
            raise ValueError(f"num_classes must be positive; got {self.num_classes}")
        if len(self.blocks) != 4 or min(self.blocks) <= 0:
            raise ValueError(f"blocks must be 4 positive counts; got {self.blocks}")
        if self.width <= 0 or self.aspp_channels <= 0:
            raise ValueError(f"width and aspp_channels must be positive; got {self.width}, "
                             f"{self.aspp_channels}")
        if len(self.atrous_rates) != 3 or min(self.atrous_rates) <= 0:
            raise ValueError(f"atrous_rates must be 3 positive dilations; got {self.atrous_rates}")
        if self.background_class is not None and not 0 <= self.background_class < self.num_classes:
            raise ValueError(f"background_class must be None or in [0, {self.num_classes}); "
                             f"got {self.background_class}")

    @property
    def variant(self) -> str:
        """"resnet50", "resnet101", or a description of a custom backbone."""
        name = _VARIANTS.get(tuple(self.blocks), "resnet" + "-".join(map(str, self.blocks)))
        return name if self.width == 64 else f"{name}_w{self.width}"

    def to_dict(self) -> dict:
        """JSON-representable dict."""
        return config_to_dict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "DeepLabV3Config":
        """Inverse of `to_dict`; unknown keys raise ValueError."""
        return dataclass_from_dict(cls, d, what="DeepLabV3 config")


class Bottleneck(nn.Module):
    """torchvision ResNet Bottleneck (stride on the 3x3 conv), eval mode."""

    planes: int
    stride: int
    dilation: int
    downsample: bool
    bn_eps: float

    @nn.compact
    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        """f32[B, h, w, in] -> f32[B, h/stride, w/stride, 4 * planes]."""
        eps = self.bn_eps
        out = nn.relu(batch_norm(eps, "bn1")(
            conv2d(self.planes, 1, use_bias=False, name="conv1")(x)))
        out = nn.relu(batch_norm(eps, "bn2")(
            conv2d(self.planes, 3, stride=self.stride, dilation=self.dilation, use_bias=False,
                   name="conv2")(out)))
        out = batch_norm(eps, "bn3")(
            conv2d(self.planes * EXPANSION, 1, use_bias=False, name="conv3")(out))
        identity = x
        if self.downsample:
            identity = batch_norm(eps, "downsample_bn")(
                conv2d(self.planes * EXPANSION, 1, stride=self.stride, use_bias=False,
                       name="downsample_conv")(x))
        return nn.relu(out + identity)


class DilatedResNet(nn.Module):
    """ResNet backbone with output stride 8; returns (layer3, layer4) features."""

    config: DeepLabV3Config

    @nn.compact
    def __call__(self, x: jnp.ndarray) -> tuple[jnp.ndarray, jnp.ndarray]:
        """f32[B, H, W, 3] normalised -> (f32[B, h, w, 16*width], f32[B, h, w, 32*width]).

        h = ceil(ceil(ceil(H / 2) / 2) / 2) (stride 8), likewise w.
        """
        cfg = self.config
        block_cls = nn.remat(Bottleneck) if cfg.remat_blocks else Bottleneck
        x = conv2d(cfg.width, 7, stride=2, use_bias=False, name="conv1")(x)
        x = nn.relu(batch_norm(cfg.bn_eps, "bn1")(x))
        x = nn.max_pool(x, (3, 3), strides=(2, 2), padding=((1, 1), (1, 1)))
        in_channels, dilation = cfg.width, 1
        outputs = []
        for stage, (n_blocks, dilate) in enumerate(zip(cfg.blocks, (False, False, True, True))):
            planes = cfg.width * 2 ** stage
            stride = 1 if stage == 0 else 2
            previous_dilation = dilation
            if dilate:
                dilation *= stride
                stride = 1
            downsample = stride != 1 or in_channels != planes * EXPANSION
            for j in range(n_blocks):
                x = block_cls(planes, stride if j == 0 else 1,
                              previous_dilation if j == 0 else dilation,
                              downsample and j == 0, cfg.bn_eps,
                              name=f"layer{stage + 1}_{j}")(x)
            in_channels = planes * EXPANSION
            outputs.append(x)
        return outputs[2], outputs[3]


class ASPP(nn.Module):
    """Atrous spatial pyramid pooling (torchvision ``ASPP``), eval mode."""

    channels: int
    rates: tuple[int, int, int]
    bn_eps: float

    @nn.compact
    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        """f32[B, h, w, in] -> f32[B, h, w, channels]."""
        eps, c = self.bn_eps, self.channels
        branches = atrous_branches(x, c, self.rates, eps)
        pooled = conv_bn_relu(jnp.mean(x, axis=(-3, -2), keepdims=True), c, 1, eps, prefix="pooling_")
        branches.append(jnp.broadcast_to(pooled, (*x.shape[:-1], c)))
        y = jnp.concatenate(branches, axis=-1)
        return conv_bn_relu(y, c, 1, eps, prefix="project_")


class DeepLabHead(nn.Module):
    """torchvision ``DeepLabHead``: ASPP, 3x3 conv + BN + ReLU, 1x1 classifier."""

    num_classes: int
    channels: int
    rates: tuple[int, int, int]
    bn_eps: float

    @nn.compact
    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        """f32[B, h, w, in] -> f32[B, h, w, num_classes] logits."""
        x = ASPP(self.channels, self.rates, self.bn_eps, name="aspp")(x)
        x = conv_bn_relu(x, self.channels, 3, self.bn_eps, prefix="")
        return conv2d(self.num_classes, 1, name="classifier")(x)


class FCNHead(nn.Module):
    """torchvision ``FCNHead`` (auxiliary): 3x3 conv to in/4 + BN + ReLU, 1x1 classifier."""

    num_classes: int
    bn_eps: float

    @nn.compact
    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        """f32[B, h, w, in] -> f32[B, h, w, num_classes] logits."""
        x = conv_bn_relu(x, x.shape[-1] // 4, 3, self.bn_eps, prefix="")
        return conv2d(self.num_classes, 1, name="classifier")(x)


class DeepLabV3(nn.Module):
    """Backbone + heads: f32[B, H, W, 3] normalised -> stride-8 logits (main, aux or None)."""

    config: DeepLabV3Config

    @nn.compact
    def __call__(self, x: jnp.ndarray, with_aux: bool = False):
        """Returns (f32[B, h, w, C] main logits, aux logits of the same shape or None)."""
        cfg = self.config
        mid, features = DilatedResNet(cfg, name="backbone")(x)
        logits = DeepLabHead(cfg.num_classes, cfg.aspp_channels, tuple(cfg.atrous_rates),
                             cfg.bn_eps, name="classifier")(features)
        aux = None
        if with_aux:
            if not cfg.aux_classifier:
                raise ValueError("with_aux=True needs a config with aux_classifier=True")
            aux = FCNHead(cfg.num_classes, cfg.bn_eps, name="aux_classifier")(mid)
        return logits, aux


@dataclasses.dataclass(frozen=True)
class DeepLabV3Dense(ConfiguredDense):
    """DeepLabV3 as a `DenseModel`: images in [0, 1] -> logits at the input resolution.

    ``params`` are the Flax variables ``{"params", "batch_stats"}`` of `DeepLabV3`.
    """

    config: DeepLabV3Config = DeepLabV3Config()

    @property
    def network(self) -> DeepLabV3:
        """The bare `DeepLabV3` module."""
        return DeepLabV3(self.config)

    def apply(self, params: Params, images: jnp.ndarray) -> jnp.ndarray:
        """f32[B, H, W, 3] in [0, 1] -> f32[B, H, W, C] logits (main head, upsampled)."""
        return self.apply_with_aux(params, images, with_aux=False)[0]

    def apply_with_aux(self, params: Params, images: jnp.ndarray, *, with_aux: bool = True):
        """(main, aux) logits f32[B, H, W, C] each (aux None unless ``with_aux``)."""
        check_images(images)
        x = normalise(images, self.config.pixel_mean, self.config.pixel_std)
        logits, aux = self.network.apply(params, x, with_aux)
        hw = images.shape[1:3]
        return (upsample_bilinear(logits, hw),
                None if aux is None else upsample_bilinear(aux, hw))

    def _init_args(self):
        return jnp.zeros((1, 32, 32, 3), jnp.float32), self.config.aux_classifier

    def variable_shapes(self) -> dict:
        """ShapeDtypeStruct tree of the variables (auxiliary head included if configured)."""
        x, aux = self._init_args()
        return dict(jax.eval_shape(lambda k, i: self.network.init(k, i, aux),
                                   jax.random.key(0), x))
