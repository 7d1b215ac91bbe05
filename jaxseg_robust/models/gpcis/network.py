"""GPCIS's ``GpModel.forward`` in Flax (docs/models/gpcis.md).

image f32[B, H, W, 3] in [0, 1], click maps f32[B, H, W, C] ([prev, pos,
neg]: isegm's hard disks of radius 5, or soft disks for gradients), clicks
(x, y) f32[B, N, 2] in network-input pixels and labels i32[B, N] -> logits
f32[B, H, W]:

1. ``maps_transform``: 3x3/2 conv -> 16, LeakyReLU(0.2), 3x3 conv -> 256, ``|scale|``;
2. ``model``: isegm's DeepLabV3+ on the ImageNet-normalised image with the
   transformed maps added after the backbone's stem
   (`jaxseg_robust.models.isegm_resnet.deeplab_plus.DeepLabV3Plus`, head width 48);
3. the features are L2-normalised per pixel (``F.normalize``, eps 1e-12),
   resized to H x W (bilinear, ``align_corners=True``) and the normalised image
   is appended (D = 48 + 3 channels);
4. the Gaussian-process head (`jaxseg_robust.models.gpcis.gp.gp_logits`) reads
   the clicks as feature-pixel indices (no gradient through them).

Parameter paths mirror the torch keys (``maps_transform/0/weight``,
``model/backbone/layer1/0/conv1/weight``, ``theta/weight``, ``omega``,
``logsigma2``, ``u_mlp/0/weight``, ``weights``).
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxseg_robust.models.clickmap.layers import Conv2d, imagenet_normalize, leaky_relu
from jaxseg_robust.models.dense.layers import upsample_bilinear_aligned
from jaxseg_robust.models.gpcis.config import GpcisConfig
from jaxseg_robust.models.gpcis.gp import RGB_CHANNELS, gp_logits
from jaxseg_robust.models.isegm_resnet.deeplab_plus import DeepLabV3Plus

NORMALIZE_EPS = 1e-12


def _zeros(key, shape, dtype=jnp.float32):
    return jnp.zeros(shape, dtype)


class MapsTransform(nn.Module):
    """GPCIS's ``maps_transform``: f32[B, H, W, C] -> f32[B, H/2, W/2, out_channels] (children 0, 2, 3)."""

    in_channels: int
    out_channels: int

    @nn.compact
    def __call__(self, maps: jnp.ndarray) -> jnp.ndarray:
        x = leaky_relu(Conv2d(self.in_channels, 16, 3, 2, 1, name="0")(maps), 0.2)
        x = Conv2d(16, self.out_channels, 3, 1, 1, name="2")(x)
        return x * jnp.abs(_Scale(name="3")())


class _Scale(nn.Module):
    """isegm's ``ScaleLayer`` parameter (``scale`` f32[1], init 0.05)."""

    @nn.compact
    def __call__(self):
        return self.param("scale", lambda key, shape: jnp.full(shape, 0.05, jnp.float32), (1,))


class LinearParams(nn.Module):
    """The parameters of a torch ``nn.Linear`` as a dict (``weight`` f32[in, out], ``bias`` f32[out])."""

    in_features: int
    out_features: int

    @nn.compact
    def __call__(self) -> dict:
        return {"weight": self.param("weight", _zeros, (self.in_features, self.out_features)),
                "bias": self.param("bias", _zeros, (self.out_features,))}


U_MLP_HIDDEN = 96  # GpModel's ``u_mlp = Sequential(Linear(feature_dim + 3, 96), ReLU, Linear(96, 1))``


class UMlpParams(nn.Module):
    """``u_mlp``'s two linear layers (children "0" and "2")."""

    in_features: int

    @nn.compact
    def __call__(self) -> dict:
        return {"0": LinearParams(self.in_features, U_MLP_HIDDEN, name="0")(),
                "2": LinearParams(U_MLP_HIDDEN, 1, name="2")()}


class GpcisNet(nn.Module):
    """The full GPCIS network (see the module docstring for inputs and output)."""

    config: GpcisConfig

    @nn.compact
    def __call__(self, image: jnp.ndarray, coord_features: jnp.ndarray, points: jnp.ndarray,
                 labels: jnp.ndarray) -> jnp.ndarray:
        cfg = self.config
        dtype = jnp.dtype(cfg.dtype)
        x = imagenet_normalize(image)
        maps = MapsTransform(cfg.coord_channels, cfg.side_feature_ch,
                             name="maps_transform")(coord_features.astype(dtype))
        feat = DeepLabV3Plus(cfg.backbone_spec, ch=cfg.deeplab_ch, head_channels=cfg.feature_dim,
                             name="model")(x.astype(dtype), maps)
        feat = feat.astype(jnp.float32)
        norm = jnp.sqrt(jnp.sum(feat * feat, axis=-1, keepdims=True))
        feat = feat / jnp.maximum(norm, NORMALIZE_EPS)
        feat = upsample_bilinear_aligned(feat, image.shape[-3:-1])
        feature = jnp.concatenate([feat, x.astype(jnp.float32)], axis=-1)
        head = self.head_parameters()
        return jax.vmap(gp_logits, in_axes=(None, 0, 0, 0))(head, feature, points, labels)

    def head_parameters(self) -> dict:
        """The GP head's torch-named parameters (top-level in torch: ``theta``, ``omega``,
        ``logsigma2``, ``u_mlp``, ``weights``) as the dict `gp.gp_logits` reads."""
        cfg = self.config
        width = cfg.feature_dim + RGB_CHANNELS
        return {"theta": LinearParams(width, cfg.num_random_features, name="theta")(),
                "omega": self.param("omega", _zeros, (cfg.num_random_features, 1)),
                "logsigma2": self.param("logsigma2", lambda key, shape: jnp.ones(shape, jnp.float32),
                                        (cfg.feature_dim,)),
                "u_mlp": UMlpParams(width, name="u_mlp")(),
                "weights": self.param("weights", _zeros, (1,))}
