"""PSPNet and DeepLabv3 of the ``semseg`` code base (DDC-AT / SAT / PGD-AT checkpoints), Flax.

The models attacked in the ECCV'24 battery's Table 1 (docs/models/semseg.md):
hszhao/semseg's PSPNet and the DeepLabv3 that the DDC-AT code adds beside it,
with the DDC-AT checkpoints' extra branches. Inference mode throughout
(BatchNorm running statistics, dropout off).

Backbone (semseg ``model/resnet.py``, ``deep_base=True``), NHWC:
  * deep stem ``layer0``: three 3x3 convs 3->64 (stride 2) -> 64 -> 128, each
    with BN + ReLU, then a 3x3/2 max pool (padding 1);
  * ResNet-50 Bottlenecks (stride on the 3x3 conv), layer1..4 with 64..512
    planes; dilated for output stride 8: *every* 3x3 conv of layer3 has
    dilation 2 and of layer4 dilation 4 (padding = dilation, stride 1; the
    first block included, unlike torchvision), the downsample 1x1 convs of
    layer3/4 stride 1.
Heads on layer4 (2048 channels, stride 8):
  * ``psp``: pyramid pooling over ``bins`` (1, 2, 3, 6): adaptive average pool,
    1x1 conv to 2048/len(bins), BN, ReLU, bilinear ``align_corners=True`` back
    to the feature size, concatenated with the input (4096 channels); classifier
    ``cls`` = 3x3 conv 512 + BN + ReLU + 1x1 conv (bias) to C;
  * ``aspp`` (DDC-AT's DeepLabv3): 1x1 branch, three 3x3 branches at
    ``atrous_rates`` (6, 12, 18), an image-pooling branch (global mean, 1x1
    conv, BN, ReLU, broadcast), each 256 channels, concatenated (1280);
    classifier ``cls`` = 1x1 conv 256 + BN + ReLU + 1x1 conv (bias) to C.
  * auxiliary head on layer3 (1024 channels; present in every training
    checkpoint, unused at evaluation): PSP 3x3 conv 256, ASPP 1x1 conv 256,
    + BN + ReLU + 1x1 conv to C;
  * DDC-AT (``ddcat=True``): the classifier is duplicated as ``cls1`` (the
    normal branch) and ``cls2`` (the adversarial branch), plus ``mask1`` (the
    same layout with 2 outputs: the branch selector) and ``aux_cls1``. The
    authors evaluate with ``cls1`` alone; so does `SemsegDense.apply`.
Output: the stride-8 logits, bilinear ``align_corners=True`` to
``((H - 1) / 8 * 8 + 1, (W - 1) / 8 * 8 + 1) = (H, W)`` (semseg's size rule
for zoom factor 8). semseg asserts ``(H - 1) % 8 == 0``; the paper's sizes
(e.g. 512 x 682, 512 x 1024) violate it, so the assertion is dropped and the
``ceil(H / 8)`` feature rows are stretched corner to corner onto H rows.
Input normalisation: ImageNet mean/std on [0, 1] RGB (semseg applies the x255
versions to 0..255 pixels; equal up to float rounding).

Variables ``{"params", "batch_stats"}``; the checkpoint key table is
``ports.semseg.semseg_rules``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import flax.linen as nn
import jax.numpy as jnp

from jaxseg_robust.models.config_json import config_to_dict, dataclass_from_dict
from jaxseg_robust.models.dense.base import (IMAGENET_MEAN, IMAGENET_STD, ConfiguredDense, Params,
                                             check_images, network_variable_shapes, normalise)
from jaxseg_robust.models.dense.deeplabv3 import EXPANSION, Bottleneck
from jaxseg_robust.models.dense.layers import (adaptive_avg_pool, atrous_branches, batch_norm, conv2d,
                                               conv_bn_relu, upsample_bilinear_aligned)

FAMILY = "semseg"
HEADS = ("psp", "aspp")
ZOOM_FACTOR = 8
# Which classifier `SemsegDense.apply` returns: the plain models' only one, DDC-AT's normal branch.
EVAL_BRANCH = {False: "cls", True: "cls1"}


@dataclasses.dataclass(frozen=True)
class SemsegConfig:
    """Static configuration (defaults: PSPNet-ResNet50, PASCAL VOC's 21 classes).

    Attributes:
      head: "psp" (PSPNet) or "aspp" (DeepLabv3 of the DDC-AT code).
      num_classes: C (21 PASCAL VOC, 19 Cityscapes).
      blocks: Bottleneck counts of layer1..4 ((3, 4, 6, 3): ResNet-50).
      width: planes of layer1 (64); the stem is width, width, 2 * width
        channels and layer i has ``width * 2**(i-1)`` planes (4x as outputs).
        Smaller widths only for tests.
      head_channels: hidden width of the classifiers (None: 512 PSP, 256 ASPP;
        also the ASPP branch width).
      aux_channels: hidden width of the auxiliary head (256).
      bins: PSP pyramid bins (pool sizes; not recorded in the weights).
      atrous_rates: the three ASPP dilations (not recorded in the weights).
      aux: the checkpoint's auxiliary head on layer3 (unused by `apply`).
      ddcat: the DDC-AT branches (cls1 / cls2 / mask1 / aux_cls1).
      bn_eps: BatchNorm epsilon (torch default 1e-5).
      remat_blocks: rematerialise each Bottleneck under ``grad`` (same values, less memory).
      pixel_mean, pixel_std: input normalisation on a 0..1 scale (ImageNet).
      background_class: 0 for PASCAL VOC, None for Cityscapes.
    """

    head: str = "psp"
    num_classes: int = 21
    blocks: tuple[int, int, int, int] = (3, 4, 6, 3)
    width: int = 64
    head_channels: int | None = None
    aux_channels: int = 256
    bins: tuple[int, ...] = (1, 2, 3, 6)
    atrous_rates: tuple[int, int, int] = (6, 12, 18)
    aux: bool = True
    ddcat: bool = False
    bn_eps: float = 1e-5
    remat_blocks: bool = False
    pixel_mean: tuple[float, float, float] = IMAGENET_MEAN
    pixel_std: tuple[float, float, float] = IMAGENET_STD
    background_class: int | None = 0

    def __post_init__(self):
        if self.head not in HEADS:
            raise ValueError(f"head must be one of {HEADS}; got {self.head!r}")
        if self.num_classes < 2:
            raise ValueError(f"num_classes must be >= 2; got {self.num_classes}")
        if len(self.blocks) != 4 or min(self.blocks) <= 0:
            raise ValueError(f"blocks must be 4 positive counts; got {self.blocks}")
        if self.width <= 0 or self.aux_channels <= 0 or (self.head_channels or 1) <= 0:
            raise ValueError(f"width, head_channels and aux_channels must be positive; got "
                             f"{self.width}, {self.head_channels}, {self.aux_channels}")
        if not self.bins or min(self.bins) <= 0 or (32 * self.width) % len(self.bins):
            raise ValueError(f"bins must be positive pool sizes whose count divides "
                             f"{32 * self.width}; got {self.bins}")
        if len(self.atrous_rates) != 3 or min(self.atrous_rates) <= 0:
            raise ValueError(f"atrous_rates must be 3 positive dilations; got {self.atrous_rates}")
        if self.background_class is not None and not 0 <= self.background_class < self.num_classes:
            raise ValueError(f"background_class must be None or in [0, {self.num_classes}); "
                             f"got {self.background_class}")

    @property
    def variant(self) -> str:
        """E.g. "pspnet50", "deeplabv3_50_ddcat"."""
        depth = {(3, 4, 6, 3): "50", (3, 4, 23, 3): "101", (3, 8, 36, 3): "152"}.get(
            tuple(self.blocks), "-".join(map(str, self.blocks)))
        name = ("pspnet" if self.head == "psp" else "deeplabv3_") + depth
        name += "" if self.width == 64 else f"_w{self.width}"
        return name + ("_ddcat" if self.ddcat else "")

    @property
    def hidden_channels(self) -> int:
        """Hidden width of the main classifiers (and of each ASPP branch)."""
        return self.head_channels or (512 if self.head == "psp" else 256)

    def to_dict(self) -> dict:
        """JSON-representable dict."""
        return config_to_dict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "SemsegConfig":
        """Inverse of `to_dict`; unknown keys raise ValueError."""
        return dataclass_from_dict(cls, d, what="semseg config")


def output_size(size: int, zoom_factor: int = ZOOM_FACTOR) -> int:
    """semseg's output size ``int((size - 1) / 8 * zoom + 1)``; equals ``size`` for zoom 8."""
    return int((size - 1) / 8 * zoom_factor + 1)


class SemsegResNet(nn.Module):
    """Deep-stem dilated ResNet; returns (layer3 f32[B, h, w, 16 width], layer4 f32[B, h, w, 32 width]).

    h = ceil(ceil(ceil(H / 2) / 2) / 2) (stride 8), likewise w.
    """

    config: SemsegConfig

    @nn.compact
    def __call__(self, x: jnp.ndarray) -> tuple[jnp.ndarray, jnp.ndarray]:
        """f32[B, H, W, 3] normalised -> (layer3, layer4) features."""
        cfg = self.config
        eps = cfg.bn_eps
        w = cfg.width
        for i, (features, stride) in enumerate(((w, 2), (w, 1), (2 * w, 1)), start=1):
            x = conv2d(features, 3, stride=stride, use_bias=False, name=f"stem_conv{i}")(x)
            x = nn.relu(batch_norm(eps, f"stem_bn{i}")(x))
        x = nn.max_pool(x, (3, 3), strides=(2, 2), padding=((1, 1), (1, 1)))
        block_cls = nn.remat(Bottleneck) if cfg.remat_blocks else Bottleneck
        in_channels, outputs = 2 * w, []
        for stage, n_blocks in enumerate(cfg.blocks):
            planes = w * 2 ** stage
            stride = 2 if stage == 1 else 1  # layer3/4 keep stride 1 (dilated instead)
            dilation = {2: 2, 3: 4}.get(stage, 1)
            for j in range(n_blocks):
                first = j == 0
                x = block_cls(planes, stride if first else 1, dilation,
                              first and (stride != 1 or in_channels != planes * EXPANSION), eps,
                              name=f"layer{stage + 1}_{j}")(x)
            in_channels = planes * EXPANSION
            outputs.append(x)
        return outputs[2], outputs[3]


class PyramidPooling(nn.Module):
    """semseg ``PPM``: f32[B, h, w, C] -> f32[B, h, w, 2C] (input + one C/len(bins) map per bin)."""

    bins: tuple[int, ...]
    bn_eps: float

    @nn.compact
    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        """Pool, 1x1 conv + BN + ReLU, upsample (align_corners=True), concatenate."""
        reduction = x.shape[-1] // len(self.bins)
        out = [x]
        for b, size in enumerate(self.bins):
            y = conv_bn_relu(adaptive_avg_pool(x, size), reduction, 1, self.bn_eps, prefix=f"bin{b}_")
            out.append(upsample_bilinear_aligned(y, x.shape[-3:-1]))
        return jnp.concatenate(out, axis=-1)


class AtrousPyramid(nn.Module):
    """DDC-AT ``ASPP``: f32[B, h, w, 2048] -> f32[B, h, w, 5 * channels]."""

    channels: int
    rates: tuple[int, int, int]
    bn_eps: float

    @nn.compact
    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        """1x1, three dilated 3x3 and an image-pooling branch, each conv + BN + ReLU."""
        eps, c = self.bn_eps, self.channels
        out = atrous_branches(x, c, self.rates, eps)
        pooled = conv_bn_relu(adaptive_avg_pool(x, 1), c, 1, eps, prefix="pooling_")
        out.append(upsample_bilinear_aligned(pooled, x.shape[-3:-1]))
        return jnp.concatenate(out, axis=-1)


class Classifier(nn.Module):
    """conv (k x k, no bias) + BN + ReLU (+ dropout, off) + 1x1 conv with bias: -> f32[..., out]."""

    hidden: int
    kernel: int
    out: int
    bn_eps: float

    @nn.compact
    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        """f32[B, h, w, in] -> f32[B, h, w, out]."""
        x = conv_bn_relu(x, self.hidden, self.kernel, self.bn_eps, prefix="")
        return conv2d(self.out, 1, name="classifier")(x)


def head_names(config: SemsegConfig) -> tuple[str, ...]:
    """The classifier heads a config builds, evaluation branch first."""
    main = ("cls1", "cls2", "mask1") if config.ddcat else ("cls",)
    aux = (("aux_cls1",) if config.ddcat else ("aux",)) if config.aux else ()
    return main + aux


class Semseg(nn.Module):
    """Backbone + context module + heads: normalised images -> dict of stride-8 logits per head."""

    config: SemsegConfig

    @nn.compact
    def __call__(self, x: jnp.ndarray, heads: tuple[str, ...] | None = None) -> dict:
        """f32[B, H, W, 3] normalised -> {head: f32[B, h, w, C or 2]} for ``heads`` (default: all)."""
        cfg = self.config
        mid, top = SemsegResNet(cfg, name="backbone")(x)
        if cfg.head == "psp":
            context = PyramidPooling(tuple(cfg.bins), cfg.bn_eps, name="ppm")(top)
            kernel = aux_kernel = 3
        else:
            context = AtrousPyramid(cfg.hidden_channels, tuple(cfg.atrous_rates), cfg.bn_eps,
                                    name="aspp")(top)
            kernel = aux_kernel = 1
        hidden = cfg.hidden_channels
        wanted = head_names(cfg) if heads is None else heads
        out = {}
        for name in head_names(cfg):
            is_aux = name.startswith("aux")
            module = Classifier(cfg.aux_channels if is_aux else hidden, aux_kernel if is_aux else kernel,
                                2 if name == "mask1" else cfg.num_classes, cfg.bn_eps, name=name)
            if name in wanted or self.is_initializing():
                out[name] = module(mid if is_aux else context)
        return {k: v for k, v in out.items() if k in wanted}


@dataclasses.dataclass(frozen=True)
class SemsegDense(ConfiguredDense):
    """A semseg PSPNet / DeepLabv3 as a `DenseModel` (images in [0, 1] -> logits at input size).

    ``apply`` returns the evaluation branch (``cls``; DDC-AT: the normal branch
    ``cls1``); `apply_heads` returns every head.
    """

    config: SemsegConfig = SemsegConfig()

    @property
    def network(self) -> Semseg:
        """The bare `Semseg` module."""
        return Semseg(self.config)

    def apply(self, params: Params, images: jnp.ndarray) -> jnp.ndarray:
        """f32[B, H, W, 3] in [0, 1] -> f32[B, H, W, C] logits of the evaluation branch."""
        branch = EVAL_BRANCH[self.config.ddcat]
        return self.apply_heads(params, images, heads=(branch,))[branch]

    def apply_heads(self, params: Params, images: jnp.ndarray, *,
                    heads: tuple[str, ...] | None = None) -> dict:
        """{head: f32[B, H, W, C]} upsampled logits of ``heads`` (default: every head, `head_names`)."""
        check_images(images)
        heads = head_names(self.config) if heads is None else tuple(heads)
        unknown = sorted(set(heads) - set(head_names(self.config)))
        if unknown:
            raise ValueError(f"{self.config.variant} has no head(s) {unknown}; it has "
                             f"{list(head_names(self.config))}")
        x = normalise(images, self.config.pixel_mean, self.config.pixel_std)
        logits = self.network.apply(params, x, heads)
        hw = (output_size(images.shape[1]), output_size(images.shape[2]))
        return {k: upsample_bilinear_aligned(v, hw) for k, v in logits.items()}

    def variable_shapes(self) -> dict:
        """ShapeDtypeStruct tree of the variables (every head of the config)."""
        return network_variable_shapes(Semseg, self.config, (33, 33))
