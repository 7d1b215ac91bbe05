"""The RClicks clickability network (SegNeXt-B "SegNeXtSaliency"), Flax linen, NHWC.

    net = ClickabilityNet(ClickabilityConfig())
    variables = net.init_variables(jax.random.key(0))       # or ports.clickability
    out = net.apply(variables, image, aux)                   # eval mode
    out.raw        # f32[B, S/4, S/4]  head output y (unbounded)
    out.normalized # f32[B, S, S]      y upsampled (align_corners=True), min-max per sample
    benchmark_map(net, variables, image, aux, (H, W))   # f32[B, H, W], the two wrappers
    metric_map(net, variables, image, aux, (H, W))      # of §3.6

Inputs are letterboxed canvases (`letterbox.prepare_inputs`): ``image``
f32[B, S, S, 3] ImageNet-normalised and ``aux`` f32[B, S, S, 2] = [G, E].

Variables (docs/protocols/rclicks.md §3.8; the torch side is in ports/clickability.py):
  ``params``       trainable weights (conv kernels [kh, kw, in/groups, out],
                   BN/LN/GN ``scale``/``bias``, ``layer_scale_*``, the mask
                   encoder's ``scale`` f32[1]);
  ``batch_stats``  BatchNorm running ``mean``/``var`` (updated in train mode,
                   pass ``mutable=["batch_stats"]``);
  ``buffers``      the fixed NMF ``bases`` f32[1, D, R] (never trained).
Train mode (``train=True``) = torch ``model.train()``: batch statistics,
stochastic depth, Dropout2d (both need an RNG named "dropout") and 6 NMF steps;
eval mode uses running statistics and 7 NMF steps.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Mapping

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp

from jaxseg_robust.models.config_json import config_to_dict, dataclass_from_dict
from jaxseg_robust.models.clickability.ham_head import LightHamHead
from jaxseg_robust.models.clickability.layers import conv2d
from jaxseg_robust.models.clickability.letterbox import (IMAGENET_MEAN, IMAGENET_STD,
                                                         minmax_per_sample, unletterbox)
from jaxseg_robust.models.clickability.mscan import MSCAN
from jaxseg_robust.models.clickability.resize import upsample_align_corners

FAMILY = "clickability"
COLLECTIONS = ("params", "batch_stats", "buffers")


@dataclasses.dataclass(frozen=True)
class ClickabilityConfig:
    """Everything static about a clickability network (defaults: the released model).

    Attributes:
      embed_dims, depths, mlp_ratios: MSCAN stage widths, block counts, MLP factors.
      drop_path_rate: maximal stochastic-depth rate (0.1).
      aux_channels: channels of the auxiliary input (2: G, E).
      mask_hidden: hidden width of the mask encoder (16).
      mask_scale_init: initial value of the mask encoder's scale (0.05).
      head_channels, ham_channels: decode-head widths (512, 512).
      gn_groups: GroupNorm groups in the head (32).
      nmf_rank, nmf_train_steps, nmf_eval_steps, nmf_inv_t: NMF settings (16, 6, 7, 1).
      dropout_ratio: head Dropout2d rate (0.1).
      num_classes: head output channels (1).
      input_size: side of the letterboxed canvas (416).
      pixel_mean, pixel_std: ImageNet normalisation on a 0..1 scale.
      variant: name stored with converted weights.
    """

    embed_dims: tuple[int, ...] = (64, 128, 320, 512)
    depths: tuple[int, ...] = (3, 3, 12, 3)
    mlp_ratios: tuple[float, ...] = (8, 8, 4, 4)
    drop_path_rate: float = 0.1
    aux_channels: int = 2
    mask_hidden: int = 16
    mask_scale_init: float = 0.05
    head_channels: int = 512
    ham_channels: int = 512
    gn_groups: int = 32
    nmf_rank: int = 16
    nmf_train_steps: int = 6
    nmf_eval_steps: int = 7
    nmf_inv_t: float = 1.0
    dropout_ratio: float = 0.1
    num_classes: int = 1
    input_size: int = 416
    pixel_mean: tuple[float, float, float] = IMAGENET_MEAN
    pixel_std: tuple[float, float, float] = IMAGENET_STD
    variant: str = "segnext_b"

    def __post_init__(self):
        if not (len(self.embed_dims) == len(self.depths) == len(self.mlp_ratios) == 4):
            raise ValueError("embed_dims, depths and mlp_ratios must each have 4 entries; got "
                             f"{self.embed_dims}, {self.depths}, {self.mlp_ratios}")
        if self.input_size <= 0 or self.input_size % 32:
            raise ValueError(f"input_size must be a positive multiple of 32; got {self.input_size}")
        for name in ("head_channels", "ham_channels"):
            if getattr(self, name) % self.gn_groups:
                raise ValueError(f"{name}={getattr(self, name)} is not divisible by "
                                 f"gn_groups={self.gn_groups}")
        if self.embed_dims[0] % 2:
            raise ValueError(f"embed_dims[0] must be even (the stem halves it); "
                             f"got {self.embed_dims[0]}")

    @property
    def feature_size(self) -> int:
        """Side of the stride-4 grid of the head output (104 for 416)."""
        return self.input_size // 4

    def to_dict(self) -> dict:
        """JSON-representable dict."""
        return config_to_dict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "ClickabilityConfig":
        """Inverse of `to_dict`; unknown keys raise ValueError."""
        return dataclass_from_dict(cls, d, what="clickability config")


SEGNEXT_B = ClickabilityConfig()


@flax.struct.dataclass
class ClickabilityOutput:
    """Network outputs.

    Attributes:
      raw: f32[B, S/4, S/4] head output y (class 0), unbounded.
      normalized: f32[B, S, S] y upsampled with align_corners=True and min-max
        normalised per sample over the whole canvas (the torch ``'instances'``).
    """

    raw: jnp.ndarray
    normalized: jnp.ndarray


class MaskEncoder(nn.Module):
    """``maps_transform``: 1x1 (2->16) ReLU 3x3 s2 (16->16) ReLU 3x3 s2 (16->C1), · |s|."""

    in_channels: int = 2
    hidden: int = 16
    out_channels: int = 64
    scale_init: float = 0.05

    @nn.compact
    def __call__(self, aux: jnp.ndarray) -> jnp.ndarray:
        """aux f32[B, S, S, 2] -> f32[B, S/4, S/4, C1]."""
        x = conv2d(self.hidden, self.in_channels, (1, 1), name="conv_0")(aux)
        x = jax.nn.relu(x)
        x = conv2d(self.hidden, self.hidden, (3, 3), stride=2, padding=(1, 1), name="conv_2")(x)
        x = jax.nn.relu(x)
        x = conv2d(self.out_channels, self.hidden, (3, 3), stride=2, padding=(1, 1),
                   name="conv_4")(x)
        scale = self.param("scale", nn.initializers.constant(self.scale_init), (1,))
        return x * jnp.abs(scale)


class ClickabilityNet(nn.Module):
    """SegNeXtSaliency: mask encoder + MSCAN + LightHamHead + upsample + min-max."""

    config: ClickabilityConfig = SEGNEXT_B

    @nn.compact
    def __call__(self, image: jnp.ndarray, aux: jnp.ndarray, train: bool = False,
                 minmax_eps: float = 1e-9) -> ClickabilityOutput:
        """Runs the network.

        Args:
          image: f32[B, S, S, 3] normalised, letterboxed image.
          aux: f32[B, S, S, 2] letterboxed [G, E] masks.
          train: torch train mode (batch statistics, stochastic depth, dropout, 6 NMF steps).
          minmax_eps: eps of the output min-max (1e-9 model forward, 1e-8 benchmark wrapper).

        Returns:
          `ClickabilityOutput`.
        """
        cfg = self.config
        s = cfg.input_size
        if image.ndim != 4 or image.shape[1:] != (s, s, 3):
            raise ValueError(f"image must have shape [B, {s}, {s}, 3]; got {image.shape}")
        if aux.shape != image.shape[:3] + (cfg.aux_channels,):
            raise ValueError(f"aux must have shape {image.shape[:3] + (cfg.aux_channels,)}; "
                             f"got {aux.shape}")
        feats = MaskEncoder(cfg.aux_channels, cfg.mask_hidden, cfg.embed_dims[0],
                            cfg.mask_scale_init, name="maps_transform")(aux)
        stages = MSCAN(cfg.embed_dims, cfg.depths, cfg.mlp_ratios, cfg.drop_path_rate,
                       name="backbone")(image, feats, train)
        y = LightHamHead(cfg.embed_dims, cfg.head_channels, cfg.ham_channels, cfg.num_classes,
                         cfg.gn_groups, cfg.nmf_rank, cfg.nmf_train_steps, cfg.nmf_eval_steps,
                         cfg.nmf_inv_t, cfg.dropout_ratio, name="decode_head")(stages, train)
        raw = y[..., 0]
        up = upsample_align_corners(raw, (s, s))
        return ClickabilityOutput(raw=raw, normalized=minmax_per_sample(up, minmax_eps))

    def init_variables(self, key: jax.Array, batch: int = 1) -> dict:
        """Random variables {"params", "batch_stats", "buffers"} (torch default init).

        Runs `init` under ``jit`` on zero inputs of the configured size.
        """
        s = self.config.input_size
        image = jnp.zeros((batch, s, s, 3), jnp.float32)
        aux = jnp.zeros((batch, s, s, self.config.aux_channels), jnp.float32)
        variables = jax.jit(lambda k: self.init({"params": k}, image, aux))(key)
        return dict(variables)

    def variable_shapes(self) -> dict:
        """ShapeDtypeStruct tree of all variables, without computing anything."""
        s = self.config.input_size
        image = jax.ShapeDtypeStruct((1, s, s, 3), jnp.float32)
        aux = jax.ShapeDtypeStruct((1, s, s, self.config.aux_channels), jnp.float32)
        return dict(jax.eval_shape(lambda i, a: self.init({"params": jax.random.key(0)}, i, a),
                                   image, aux))


def benchmark_map(net: ClickabilityNet, variables: dict, image: jnp.ndarray, aux: jnp.ndarray,
                  original_hw: tuple[int, int]) -> jnp.ndarray:
    """``SegNeXtSaliencyApply.apply`` (benchmark clicker): min-max over the canvas with
    eps 1e-8, then un-letterbox; no second normalisation (§3.6).

    Args:
      net, variables: the network and its variables (eval mode).
      image: f32[B, S, S, 3]; aux: f32[B, S, S, 2] (`letterbox.prepare_inputs`).
      original_hw: static (H, W) shared by the batch.

    Returns:
      f32[B, H, W] in [0, 1] (the crop need not reach 0 or 1).
    """
    out = net.apply(variables, image, aux, train=False, minmax_eps=1e-8)
    return unletterbox(out.normalized, original_hw)


def metric_map(net: ClickabilityNet, variables: dict, image: jnp.ndarray, aux: jnp.ndarray,
               original_hw: tuple[int, int]) -> jnp.ndarray:
    """``ClickabilityModel.__call__`` (click-distribution metrics): model output (min-max
    over the canvas, eps 1e-9), un-letterbox, min-max again over the H x W crop without
    eps (a constant crop gives NaN, as in the reference) (§3.6).

    Args and returns as `benchmark_map`; the result spans exactly [0, 1] per sample.
    """
    out = net.apply(variables, image, aux, train=False)
    return minmax_per_sample(unletterbox(out.normalized, original_hw), 0.0)


def load_converted(model_dir: str | os.PathLike) -> tuple[ClickabilityConfig, dict]:
    """Loads a directory written by ``ports.clickability.port_clickability``.

    Returns:
      (config, variables {"params", "batch_stats", "buffers"} of numpy float32 arrays).

    Raises:
      jaxseg_robust.models.store.StoreError: missing/damaged directory, another family, or
        variables that do not match the config's model.
    """
    from jaxseg_robust.models import store  # noqa: PLC0415

    variables, meta = store.load(model_dir)
    if meta["family"] != FAMILY:
        raise store.StoreError(f"{model_dir} holds a '{meta['family']}' model, not {FAMILY}")
    config = ClickabilityConfig.from_dict(meta["config"])
    store.check_tree(variables, ClickabilityNet(config).variable_shapes(),
                     what=os.fspath(model_dir))
    return config, variables
