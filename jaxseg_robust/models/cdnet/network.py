"""CDNet's network (ClickSEG ``DeeplabModel`` + ``DeepLabV3Plus`` with ``FDM_v3``), inference mode.

``CdnetNet(image, maps) -> logits`` mirrors ``DeeplabModel.forward`` of
ClickSEG (``isegm/model/is_deeplab_model.py``, ``modeling/deeplab_v3.py``,
``modeling/cdnet/FDM.py``) for the released configuration
(docs/models/cdnet.md):

1. the image in [0, 1] is normalised with ImageNet mean/std;
2. the click maps: channels 0-1 are the [pos, neg] disks of radius 5 (isegm
   ``dist_maps``), channels 2-3 the disks of radius 24 (``fdm_dist_maps``),
   both on the image grid; the radius-24 maps are resized to
   ``ceil(h/8) x ceil(w/8)`` (bilinear, align_corners=True) for the FDM;
3. ``maps_transform`` (1x1 conv -> 16, LeakyReLU(0.2), 3x3/2 conv -> 64,
   ``|scale|``) of the radius-5 maps, added after the ResNet stem
   (`jaxseg_robust.models.isegm_resnet`);
4. the DeepLabV3+ features: ASPP of c4, then the FDM (`Fdm`), then the
   resize to c1's size, concatenation with the skip projection, the head;
5. ``head`` (`SepConvHead`, 2 layers, 1 output) and the bilinear
   (align_corners=True) resize of its stride-4 logits to the input size.

The FDM's click weights and gate are detached in the authors' code
(``.clone().detach()``), so no gradient reaches the clicks through them
(`jax.lax.stop_gradient` here); the radius-5 maps carry the gradient.
The training-only outputs (``fdm_instances``, ``latent_head``) are not
computed. Parameters are torch-named and torch-pathed.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxseg_robust.models.cdnet.config import CdnetConfig
from jaxseg_robust.models.clickmap.layers import BatchNorm2d, Conv2d, imagenet_normalize
from jaxseg_robust.models.isegm_resnet.deeplab_plus import DeepLabV3Plus, SepConvHead
from jaxseg_robust.models.ritm.hrnet import resize_to
from jaxseg_robust.models.ritm.network import MapsTransform

GATE_THRESHOLD = 0.8  # FDM_v3: pixels whose gate exceeds it weigh as clicked


def fdm_size(hw: tuple[int, int]) -> tuple[int, int]:
    """The FDM grid of an input (h, w): (ceil(h / 8), ceil(w / 8)) (isegm ``get_coord_features``)."""
    return (-(-int(hw[0]) // 8), -(-int(hw[1]) // 8))


def gated_attention(att: jnp.ndarray, weights: jnp.ndarray, gate: jnp.ndarray, values: jnp.ndarray) -> jnp.ndarray:
    """One FDM branch: ``gate_i * softmax_j(att_ij w_j) @ values``.

    att f32[B, N, N] (query i, key j), weights f32[B, N] (per key), gate
    f32[B, N] (per query), values f32[B, N, c] -> f32[B, N, c].
    """
    probs = jax.nn.softmax(att * weights[:, None, :], axis=-1) * gate[:, :, None]
    return jnp.einsum("bij,bjc->bic", probs, values)


class Fdm(nn.Module):
    """ClickSEG ``FDM_v3(ch, ch)``: click-conditioned non-local attention.

    x f32[B, h, w, C] (the ASPP output), clicks f32[B, h, w, 2] (the resized
    radius-24 [pos, neg] disks) -> f32[B, h, w, C]. Children: ``gate_head_pos``
    (`SepConvHead` 1 layer, 1 output), ``t``, ``p``, ``g``, ``z``, ``z2`` (1x1,
    no bias), ``bn``, ``bn2``.
    """

    channels: int

    @nn.compact
    def __call__(self, x: jnp.ndarray, clicks: jnp.ndarray) -> jnp.ndarray:
        c = self.channels
        b, h, w = x.shape[0], x.shape[1], x.shape[2]
        flat = lambda v: v.reshape(b, h * w, v.shape[-1])  # noqa: E731
        t = flat(Conv2d(c, c, 1, bias=False, name="t")(x))
        p = flat(Conv2d(c, c, 1, bias=False, name="p")(x))
        g = flat(Conv2d(c, c, 1, bias=False, name="g")(x))
        gate_pos = jax.lax.stop_gradient(jax.nn.sigmoid(SepConvHead(1, c, c, 1, name="gate_head_pos")(x)))
        gate_pos = gate_pos.reshape(b, h * w)
        gate_neg = 1.0 - gate_pos
        clicks = jax.lax.stop_gradient(clicks).reshape(b, h * w, 2)
        weight_pos = clicks[..., 0] + (gate_pos > GATE_THRESHOLD).astype(x.dtype)
        weight_neg = clicks[..., 1] + (gate_neg > GATE_THRESHOLD).astype(x.dtype)
        att = jnp.einsum("bic,bjc->bij", t, p)
        x_pos = gated_attention(att, weight_pos, gate_pos, g).reshape(b, h, w, c)
        x_neg = gated_attention(att, weight_neg, gate_neg, g).reshape(b, h, w, c)
        x_pos = BatchNorm2d(c, name="bn")(Conv2d(c, c, 1, bias=False, name="z")(x_pos))
        x_neg = BatchNorm2d(c, name="bn2")(Conv2d(c, c, 1, bias=False, name="z2")(x_neg))
        return x_pos + x + x_neg


class CdnetFeatureExtractor(DeepLabV3Plus):
    """ClickSEG's ``DeepLabV3Plus``: the shared feature extractor with the FDM between the ASPP and the
    resize (child ``FDM``). ``__call__(image, coord_features, fdm_clicks)`` -> f32[B, h/4, w/4, ch]."""

    def setup(self):
        super().setup()
        self.FDM = Fdm(self.ch)

    def __call__(self, image, coord_features, fdm_clicks):
        skip, context = self.features(image, coord_features)
        return self.fuse(self.FDM(context, fdm_clicks), skip)


class CdnetNet(nn.Module):
    """The CDNet network: image f32[B, H, W, 3] in [0, 1], click maps f32[B, H, W, 4] (radius-5 [pos,
    neg], radius-24 [pos, neg]) -> logits f32[B, H, W] at the input resolution (before the PDM)."""

    config: CdnetConfig

    @nn.compact
    def __call__(self, image, maps):
        cfg = self.config
        dtype = jnp.dtype(cfg.dtype)
        x = imagenet_normalize(image).astype(dtype)
        maps = maps.astype(dtype)
        coord = MapsTransform(2, cfg.use_leaky_relu, name="maps_transform")(maps[..., :2])
        fdm_clicks = resize_to(maps[..., 2:], fdm_size(image.shape[-3:-1]))
        features = CdnetFeatureExtractor(cfg.backbone_spec, ch=cfg.deeplab_ch, head_channels=cfg.deeplab_ch,
                                         name="feature_extractor")(x, coord, fdm_clicks)
        logits = SepConvHead(1, cfg.deeplab_ch, cfg.deeplab_ch // 2, 2, name="head")(features)
        out_dtype = jnp.promote_types(dtype, jnp.float32)
        return resize_to(logits.astype(out_dtype), image.shape[-3:-1])[..., 0]
