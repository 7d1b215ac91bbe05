"""UPerNet with a ConvNeXt backbone and convolutional stem (the SEA-AT models), Flax.

The models of the ECCV'24 battery's Table 2: Croce et al.'s adversarially
trained UPerNet-ConvNeXt-T/S ("CvSt": convolutional stem) for PASCAL VOC
(docs/models/semseg.md). Inference mode (BatchNorm running statistics,
stochastic depth and dropout off). NHWC throughout.

Backbone (``ConvNeXt`` of the Robust-Segmentation code):
  * stem: ``conv`` (CvSt): 3x3/2 conv 3->48 (bias), channels LayerNorm, GELU,
    3x3/2 conv 48->96, LayerNorm, GELU (stride 4); or ``patch``: a 4x4/4 conv
    and a LayerNorm (the plain ConvNeXt);
  * stages 1..4 with ``depths`` blocks of ``dims`` channels; stages 2..4 open
    with LayerNorm + 2x2/2 conv; a block is 7x7 depthwise conv, LayerNorm,
    Linear 4x, GELU (exact erf), Linear, layer scale ``gamma``, residual;
  * each stage output goes through its own LayerNorm (``norm0..3``). Every
    LayerNorm has eps 1e-6 and normalises over channels with the two-pass
    variance (as the reference's manual channels-first LayerNorm).
Head (``UperNetHead``, 512 channels, BatchNorm eps 1e-5, ReLU):
  * PSP module on the stage-4 features: adaptive average pools over
    ``pool_scales`` (1, 2, 3, 6), 1x1 conv + BN + ReLU each, bilinear
    (``align_corners=False``) back, concatenated with the input, 3x3
    ``bottleneck`` conv + BN + ReLU;
  * FPN: 1x1 lateral convs on stages 1..3, top-down sum with bilinear
    upsampling, 3x3 ``fpn_convs``, every level upsampled to stage 1,
    concatenated, 3x3 ``fpn_bottleneck``, 1x1 classifier (bias);
  * auxiliary FCN head on stage 3 (3x3 conv 256 + BN + ReLU + 1x1 conv):
    in every checkpoint, unused at evaluation.
Output: bilinear (``align_corners=False``) to the input size.
Input: plain [0, 1] RGB, no normalisation (``pixel_mean``/``pixel_std`` None),
as the Robust-Segmentation code trains and evaluates; a checkpoint saved with a
normalising wrapper carries its mean/std and the port records them.

Variables ``{"params", "batch_stats"}``; key table ``ports.upernet.upernet_rules``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxseg_robust.models.config_json import config_to_dict, dataclass_from_dict
from jaxseg_robust.models.dense.base import (ConfiguredDense, Params, check_images,
                                             network_variable_shapes, normalise)
from jaxseg_robust.models.dense.layers import adaptive_avg_pool, conv2d, conv_bn_relu, upsample_bilinear
from jaxseg_robust.ops.conv import conv_general_dilated

FAMILY = "upernet"
STEMS = ("conv", "patch")
LN_EPS = 1e-6
_VARIANTS = {(3, 3, 9, 3): "t", (3, 3, 27, 3): "s"}


@dataclasses.dataclass(frozen=True)
class UperNetConfig:
    """Static configuration (defaults: UPerNet-ConvNeXt-T with the conv stem, 21 classes).

    Attributes:
      num_classes: C.
      depths: ConvNeXt blocks per stage ((3, 3, 9, 3) tiny, (3, 3, 27, 3) small).
      dims: channels per stage ((96, 192, 384, 768) for both).
      stem: "conv" (CvSt) or "patch" (4x4 patchify).
      stem_width: first conv width of the conv stem (48; the second is ``dims[0]``).
      channels: UPerNet head width (512).
      pool_scales: PSP pools (1, 2, 3, 6).
      aux: the auxiliary FCN head on stage 3 (in the checkpoints; unused by `apply`).
      aux_channels: its hidden width (256).
      bn_eps: BatchNorm epsilon of the head (1e-5).
      remat_blocks: rematerialise each ConvNeXt block under ``grad``.
      pixel_mean, pixel_std: input normalisation on a 0..1 scale, or None (plain [0, 1]).
      background_class: 0 (PASCAL VOC) or None.
    """

    num_classes: int = 21
    depths: tuple[int, int, int, int] = (3, 3, 9, 3)
    dims: tuple[int, int, int, int] = (96, 192, 384, 768)
    stem: str = "conv"
    stem_width: int = 48
    channels: int = 512
    pool_scales: tuple[int, ...] = (1, 2, 3, 6)
    aux: bool = True
    aux_channels: int = 256
    bn_eps: float = 1e-5
    remat_blocks: bool = False
    pixel_mean: tuple[float, float, float] | None = None
    pixel_std: tuple[float, float, float] | None = None
    background_class: int | None = 0

    def __post_init__(self):
        if self.num_classes < 2:
            raise ValueError(f"num_classes must be >= 2; got {self.num_classes}")
        if len(self.depths) != 4 or min(self.depths) <= 0 or len(self.dims) != 4 or min(self.dims) <= 0:
            raise ValueError(f"depths and dims must be 4 positive ints; got {self.depths}, {self.dims}")
        if self.stem not in STEMS:
            raise ValueError(f"stem must be one of {STEMS}; got {self.stem!r}")
        if min(self.stem_width, self.channels, self.aux_channels) <= 0 or not self.pool_scales:
            raise ValueError("stem_width, channels, aux_channels and pool_scales must be positive")
        if (self.pixel_mean is None) != (self.pixel_std is None):
            raise ValueError("give both pixel_mean and pixel_std, or neither")
        if self.background_class is not None and not 0 <= self.background_class < self.num_classes:
            raise ValueError(f"background_class must be None or in [0, {self.num_classes}); "
                             f"got {self.background_class}")

    @property
    def variant(self) -> str:
        """E.g. "upernet_convnext_t_cvst"."""
        size = _VARIANTS.get(tuple(self.depths), "-".join(map(str, self.depths)))
        name = f"upernet_convnext_{size}" + ("_cvst" if self.stem == "conv" else "")
        return name if tuple(self.dims) == (96, 192, 384, 768) else f"{name}_d{self.dims[0]}"

    def to_dict(self) -> dict:
        """JSON-representable dict."""
        return config_to_dict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "UperNetConfig":
        """Inverse of `to_dict`; unknown keys raise ValueError."""
        return dataclass_from_dict(cls, d, what="UPerNet config")


def _layer_norm(name: str) -> nn.LayerNorm:
    return nn.LayerNorm(epsilon=LN_EPS, use_fast_variance=False, name=name)


def _gelu(x: jnp.ndarray) -> jnp.ndarray:
    return jax.nn.gelu(x, approximate=False)


class ConvNeXtBlock(nn.Module):
    """7x7 depthwise conv, LayerNorm, MLP (4x, GELU), layer scale, residual: f32[B, h, w, dim]."""

    dim: int

    @nn.compact
    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        """Same shape out."""
        y = nn.Conv(self.dim, (7, 7), padding=((3, 3), (3, 3)), feature_group_count=self.dim,
                    name="dwconv")(x)
        y = nn.Dense(4 * self.dim, name="pwconv1")(_layer_norm("norm")(y))
        y = nn.Dense(self.dim, name="pwconv2")(_gelu(y))
        gamma = self.param("scale", nn.initializers.ones, (self.dim,))  # the layer scale gamma
        return x + gamma * y


class ConvNeXt(nn.Module):
    """ConvNeXt backbone: normalised images -> four LayerNormed stage outputs (strides 4..32)."""

    config: UperNetConfig

    @nn.compact
    def __call__(self, x: jnp.ndarray) -> list[jnp.ndarray]:
        """f32[B, H, W, 3] -> [f32[B, H/4, W/4, dims[0]], ..., f32[B, H/32, W/32, dims[3]]]."""
        cfg = self.config
        if cfg.stem == "conv":
            x = conv2d(cfg.stem_width, 3, stride=2, name="stem_conv1")(x)
            x = _gelu(_layer_norm("stem_norm1")(x))
            x = conv2d(cfg.dims[0], 3, stride=2, name="stem_conv2")(x)
            x = _gelu(_layer_norm("stem_norm2")(x))
        else:
            x = nn.Conv(cfg.dims[0], (4, 4), strides=(4, 4), padding="VALID", name="stem_conv",
                        conv_general_dilated=conv_general_dilated)(x)
            x = _layer_norm("stem_norm")(x)
        block_cls = nn.remat(ConvNeXtBlock) if cfg.remat_blocks else ConvNeXtBlock
        outs = []
        for i, (depth, dim) in enumerate(zip(cfg.depths, cfg.dims)):
            if i > 0:
                x = _layer_norm(f"downsample{i}_norm")(x)
                x = nn.Conv(dim, (2, 2), strides=(2, 2), padding="VALID",
                            name=f"downsample{i}_conv", conv_general_dilated=conv_general_dilated)(x)
            for j in range(depth):
                x = block_cls(dim, name=f"stage{i}_{j}")(x)
            outs.append(_layer_norm(f"norm{i}")(x))
        return outs


class ConvBNReLU(nn.Module):
    """``UperNetConvModule``: conv (no bias) + BatchNorm + ReLU."""

    features: int
    kernel: int
    bn_eps: float

    @nn.compact
    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        """f32[B, h, w, in] -> f32[B, h, w, features]."""
        return conv_bn_relu(x, self.features, self.kernel, self.bn_eps, prefix="")


class UperNetHead(nn.Module):
    """PSP on the last level + FPN over all levels -> f32[B, H/4, W/4, C] logits."""

    config: UperNetConfig

    @nn.compact
    def __call__(self, features: list[jnp.ndarray]) -> jnp.ndarray:
        """Four stage outputs -> stride-4 logits."""
        cfg = self.config
        c, eps = cfg.channels, cfg.bn_eps
        top = features[-1]
        psp = [top]
        for k, scale in enumerate(cfg.pool_scales):
            y = ConvBNReLU(c, 1, eps, name=f"psp{k}")(adaptive_avg_pool(top, scale))
            psp.append(upsample_bilinear(y, top.shape[-3:-1]))
        laterals = [ConvBNReLU(c, 1, eps, name=f"lateral{i}")(f) for i, f in enumerate(features[:-1])]
        laterals.append(ConvBNReLU(c, 3, eps, name="bottleneck")(jnp.concatenate(psp, axis=-1)))
        for i in range(len(laterals) - 1, 0, -1):
            laterals[i - 1] = laterals[i - 1] + upsample_bilinear(laterals[i], laterals[i - 1].shape[-3:-1])
        outs = [ConvBNReLU(c, 3, eps, name=f"fpn{i}")(laterals[i]) for i in range(len(laterals) - 1)]
        outs.append(laterals[-1])
        hw = outs[0].shape[-3:-1]
        outs = [outs[0]] + [upsample_bilinear(o, hw) for o in outs[1:]]
        y = ConvBNReLU(c, 3, eps, name="fpn_bottleneck")(jnp.concatenate(outs, axis=-1))
        return conv2d(cfg.num_classes, 1, name="classifier")(y)


class AuxHead(nn.Module):
    """``UperNetFCNHead`` on stage 3: 3x3 conv + BN + ReLU, 1x1 classifier -> f32[B, H/16, W/16, C]."""

    config: UperNetConfig

    @nn.compact
    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        """Stage-3 features -> stride-16 logits."""
        cfg = self.config
        x = ConvBNReLU(cfg.aux_channels, 3, cfg.bn_eps, name="conv")(x)
        return conv2d(cfg.num_classes, 1, name="classifier")(x)


class UperNet(nn.Module):
    """Backbone + heads: normalised images -> (stride-4 logits, stride-16 aux logits or None)."""

    config: UperNetConfig

    @nn.compact
    def __call__(self, x: jnp.ndarray, with_aux: bool = False):
        """Returns (f32[B, h4, w4, C], f32[B, h16, w16, C] or None)."""
        features = ConvNeXt(self.config, name="backbone")(x)
        logits = UperNetHead(self.config, name="decode_head")(features)
        aux = None
        if self.config.aux and (with_aux or self.is_initializing()):
            aux = AuxHead(self.config, name="auxiliary_head")(features[2])
        return logits, (aux if with_aux else None)


@dataclasses.dataclass(frozen=True)
class UperNetDense(ConfiguredDense):
    """UPerNet-ConvNeXt as a `DenseModel`: images in [0, 1] -> logits at the input resolution."""

    config: UperNetConfig = UperNetConfig()

    @property
    def network(self) -> UperNet:
        """The bare `UperNet` module."""
        return UperNet(self.config)

    def _input(self, images: jnp.ndarray) -> jnp.ndarray:
        check_images(images)
        if self.config.pixel_mean is None:
            return images
        return normalise(images, self.config.pixel_mean, self.config.pixel_std)

    def apply(self, params: Params, images: jnp.ndarray) -> jnp.ndarray:
        """f32[B, H, W, 3] in [0, 1] -> f32[B, H, W, C] logits (decode head, upsampled)."""
        logits, _ = self.network.apply(params, self._input(images))
        return upsample_bilinear(logits, images.shape[1:3])

    def apply_with_aux(self, params: Params, images: jnp.ndarray):
        """(main, aux) logits f32[B, H, W, C], both upsampled (align_corners=False)."""
        if not self.config.aux:
            raise ValueError("apply_with_aux needs a config with aux=True")
        logits, aux = self.network.apply(params, self._input(images), True)
        hw = images.shape[1:3]
        return upsample_bilinear(logits, hw), upsample_bilinear(aux, hw)

    def variable_shapes(self) -> dict:
        """ShapeDtypeStruct tree of the variables (auxiliary head included if configured)."""
        return network_variable_shapes(UperNet, self.config, (64, 64))
