"""RITM's interactive network (isegm ``HRNetModel``): maps transform, HRNet, OCR head.

``RitmNet(image, coord_features) -> logits`` mirrors ``ISModel.forward`` of the
RITM code for the released configuration (``use_rgb_conv=False``,
``conv_extend=False``, no click groups):

1. the image in [0, 1] is normalised with ImageNet mean/std;
2. ``maps_transform``: the click maps [prev, pos, neg] through a 1x1 conv
   (-> 16), LeakyReLU(0.2), a 3x3 stride-2 conv (-> 64) and ``ScaleLayer``
   (multiplication by ``|scale|``);
3. HRNet (`HighResolutionNet`) with the transformed maps added after the first
   stem conv;
4. OCR (``ocr_width > 0``): ``aux_head`` (soft object regions), ``conv3x3_ocr``,
   the spatial gather (softmax over all pixels of the aux logits), the object
   attention block and ``conv_bn_dropout``, then ``cls_head`` (1x1 conv);
   without OCR a 3x3 conv + BN + ReLU + 1x1 conv head;
5. the logits (1/4 resolution) are upsampled to the input size with bilinear
   ``align_corners=True``.

Module names follow the torch attribute paths (``feature_extractor/...``,
``maps_transform/0``); parameters are torch-named (`layers`). The aux output
(``instances_aux``) is computed because OCR needs it, but only ``instances``
is returned (what the predictor uses).
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxseg_robust.models.clickmap.layers import BatchNorm2d, Conv2d, imagenet_normalize, leaky_relu
from jaxseg_robust.models.ritm.config import RitmConfig
from jaxseg_robust.models.ritm.hrnet import hrnet_features, resize_to


class ConvBNReLU1x1(nn.Module):
    """``Sequential(Conv2d(1x1, bias=False), Sequential(BatchNorm2d, ReLU))``: children "0", "1/0"."""

    in_channels: int
    out_channels: int

    @nn.compact
    def __call__(self, x):
        x = Conv2d(self.in_channels, self.out_channels, 1, bias=False, name="0")(x)
        return jax.nn.relu(_Wrapped(self.out_channels, name="1")(x))


class _Wrapped(nn.Module):
    """``Sequential(BatchNorm2d, ReLU)``'s BatchNorm, named "0"."""

    channels: int

    @nn.compact
    def __call__(self, x):
        return BatchNorm2d(self.channels, name="0")(x)


class KeyProjection(nn.Module):
    """``f_pixel`` / ``f_object``: two 1x1 conv + BN + ReLU (children "0", "1/0", "2", "3/0")."""

    in_channels: int
    key_channels: int

    @nn.compact
    def __call__(self, x):
        k = self.key_channels
        x = Conv2d(self.in_channels, k, 1, bias=False, name="0")(x)
        x = jax.nn.relu(_Wrapped(k, name="1")(x))
        x = Conv2d(k, k, 1, bias=False, name="2")(x)
        return jax.nn.relu(_Wrapped(k, name="3")(x))


class ObjectAttentionBlock(nn.Module):
    """``ObjectAttentionBlock2D`` with scale 1: pixels attend to the object contexts.

    x: f32[B, H, W, C] pixel features; proxy: f32[B, K, 1, C] object contexts
    (K = 1 class). Returns f32[B, H, W, C].
    """

    in_channels: int
    key_channels: int

    @nn.compact
    def __call__(self, x, proxy):
        b, h, w, _ = x.shape
        k = self.key_channels
        query = KeyProjection(self.in_channels, k, name="f_pixel")(x).reshape(b, h * w, k)
        key = KeyProjection(self.in_channels, k, name="f_object")(proxy).reshape(b, -1, k)
        value = ConvBNReLU1x1(self.in_channels, k, name="f_down")(proxy).reshape(b, -1, k)
        sim = jnp.einsum("bpk,bok->bpo", query, key) * (k ** -0.5)
        sim = jax.nn.softmax(sim, axis=-1)
        context = jnp.einsum("bpo,bok->bpk", sim, value).reshape(b, h, w, k)
        return ConvBNReLU1x1(k, self.in_channels, name="f_up")(context)


class SpatialOCR(nn.Module):
    """``SpatialOCR_Module``: object attention, then 1x1 conv + BN + ReLU of [context, feats]
    (``conv_bn_dropout``; the Dropout2d is the identity at inference)."""

    in_channels: int
    key_channels: int
    out_channels: int

    @nn.compact
    def __call__(self, feats, proxy):
        context = ObjectAttentionBlock(self.in_channels, self.key_channels,
                                       name="object_context_block")(feats, proxy)
        x = jnp.concatenate([context, feats], axis=-1)
        return ConvBNReLU1x1(2 * self.in_channels, self.out_channels, name="conv_bn_dropout")(x)


def spatial_gather(feats: jnp.ndarray, probs: jnp.ndarray) -> jnp.ndarray:
    """``SpatialGather_Module`` (scale 1): softmax-weighted feature means per class.

    Args:
      feats: f32[B, H, W, C].
      probs: f32[B, H, W, K] class logits (softmax over the H W pixels).

    Returns:
      f32[B, K, 1, C] object contexts.
    """
    b, h, w, k = probs.shape
    weights = jax.nn.softmax(probs.reshape(b, h * w, k), axis=1)
    context = jnp.einsum("bpk,bpc->bkc", weights, feats.reshape(b, h * w, -1))
    return context[:, :, None, :]


class AuxHead(nn.Module):
    """``aux_head``: 1x1 conv (bias) + BN + ReLU + 1x1 conv (bias) -> 1 channel (children 0, 1, 3)."""

    channels: int

    @nn.compact
    def __call__(self, x):
        c = self.channels
        x = jax.nn.relu(BatchNorm2d(c, name="1")(Conv2d(c, c, 1, name="0")(x)))
        return Conv2d(c, 1, 1, name="3")(x)


class Conv3x3BNReLU(nn.Module):
    """``conv3x3_ocr`` / the no-OCR head's first part: 3x3 conv (bias) + BN + ReLU (children 0, 1)."""

    in_channels: int
    out_channels: int

    @nn.compact
    def __call__(self, x):
        return jax.nn.relu(BatchNorm2d(self.out_channels, name="1")(
            Conv2d(self.in_channels, self.out_channels, 3, 1, 1, name="0")(x)))


class FeatureExtractor(nn.Module):
    """``feature_extractor``: `HighResolutionNet` + OCR head -> f32[B, H/4, W/4, 1] logits."""

    config: RitmConfig

    @nn.compact
    def __call__(self, x, additional_features):
        cfg = self.config
        feats = hrnet_features(cfg, x, additional_features)
        last = feats.shape[-1]
        if cfg.ocr_width <= 0:
            return PlainHead(last, name="cls_head")(feats)
        mid, key = 2 * cfg.ocr_width, cfg.ocr_width
        out_aux = AuxHead(last, name="aux_head")(feats)
        feats = Conv3x3BNReLU(last, mid, name="conv3x3_ocr")(feats)
        context = spatial_gather(feats, out_aux)
        feats = SpatialOCR(mid, key, mid, name="ocr_distri_head")(feats, context)
        return Conv2d(mid, 1, 1, name="cls_head")(feats)


class PlainHead(nn.Module):
    """The head without OCR: 3x3 conv + BN + ReLU + 1x1 conv -> 1 (children 0, 1, 3)."""

    channels: int

    @nn.compact
    def __call__(self, x):
        c = self.channels
        x = jax.nn.relu(BatchNorm2d(c, name="1")(Conv2d(c, c, 3, 1, 1, name="0")(x)))
        return Conv2d(c, 1, 1, name="3")(x)


class MapsTransform(nn.Module):
    """``maps_transform``: 1x1 conv -> 16, LeakyReLU(0.2) or ReLU, 3x3 stride-2 conv -> 64, ``|scale|``."""

    in_channels: int
    leaky: bool = True

    @nn.compact
    def __call__(self, maps):
        x = Conv2d(self.in_channels, 16, 1, name="0")(maps)
        x = leaky_relu(x, 0.2) if self.leaky else jax.nn.relu(x)
        x = Conv2d(16, 64, 3, 2, 1, name="2")(x)
        return x * jnp.abs(_Scale(name="3")())


class _Scale(nn.Module):
    """RITM's ``ScaleLayer`` parameter (``scale`` f32[1], lr_mult 1)."""

    @nn.compact
    def __call__(self):
        return self.param("scale", lambda key, shape: jnp.full(shape, 0.05, jnp.float32), (1,))


class RitmNet(nn.Module):
    """The full RITM network: image f32[B, H, W, 3] in [0, 1], click maps f32[B, H, W, C]
    ([prev, pos, neg] or [pos, neg]) -> logits f32[B, H, W] at the input resolution."""

    config: RitmConfig

    @nn.compact
    def __call__(self, image, coord_features):
        cfg = self.config
        dtype = jnp.dtype(cfg.dtype)
        x = imagenet_normalize(image).astype(dtype)
        maps = MapsTransform(cfg.coord_channels, cfg.use_leaky_relu,
                             name="maps_transform")(coord_features.astype(dtype))
        logits = FeatureExtractor(cfg, name="feature_extractor")(x, maps)
        out_dtype = jnp.promote_types(dtype, jnp.float32)  # bfloat16 -> float32; float64 kept
        logits = resize_to(logits.astype(out_dtype), image.shape[-3:-1])
        return logits[..., 0]
