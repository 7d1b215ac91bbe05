"""AdaptiveClick's interactive network (``AdaptiveClickModel.forward``), NHWC.

``AdaptiveClickNet(image, coord_features) -> logits`` mirrors the authors'
forward (lab206/AdaptiveClick, ``isegm/model/is_adaptiveclick_model.py``):

1. the image in [0, 1] is normalised with ImageNet mean/std; the click maps
   [prev, pos, neg] are embedded by ``patch_embed_coords`` and added to the
   image's patch tokens in SimpleClick's ViT (`jaxseg_robust.models.simpleclick.vit`);
2. SimpleClick's SimpleFPN (``pixel_decoder.neck``) gives maps at strides 4..32;
3. the deformable-attention pixel decoder (`pixel_decoder.PixelDecoder`);
4. the click-aware mask-adaptive decoder (`decoder.ClickAwareDecoder`), which
   also reads the positive-click disk map (``coord_features[:, 1]``);
5. ``segment_inference``: the class-weighted sum of the query masks at the
   input size, the values isegm's predictor treats as logits.

Parameter names follow the torch module paths (``backbone/blocks/0/attn/qkv/weight``,
``pixel_decoder/neck/down_4/0/weight``, ``click_aware_decoder/query_feat/weight``).
"""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp

from jaxseg_robust.models.adaptiveclick.config import AdaptiveClickConfig
from jaxseg_robust.models.adaptiveclick.decoder import ClickAwareDecoder, segment_inference
from jaxseg_robust.models.adaptiveclick.pixel_decoder import PixelDecoder
from jaxseg_robust.models.clickmap.layers import imagenet_normalize
from jaxseg_robust.models.simpleclick.vit import PatchEmbed, VisionTransformer


class AdaptiveClickNet(nn.Module):
    """The full AdaptiveClick network: image f32[B, H, W, 3] in [0, 1] and click maps
    f32[B, H, W, C] ([prev, pos, neg]) -> logits f32[B, H, W] at the input resolution.
    H and W must be multiples of twice the patch size (`AdaptiveClickConfig.input_grid`)."""

    config: AdaptiveClickConfig

    @nn.compact
    def __call__(self, image, coord_features):
        cfg = self.config
        cfg.input_grid(image.shape[-3:-1])
        dtype = jnp.dtype(cfg.dtype)
        x = imagenet_normalize(image).astype(dtype)
        maps = coord_features.astype(dtype)
        coords = PatchEmbed(cfg.coord_channels, cfg.embed_dim, cfg.patch_size, name="patch_embed_coords")(maps)
        tokens = VisionTransformer(cfg.vit, name="backbone")(x, coords)
        mask_features, levels = PixelDecoder(cfg, name="pixel_decoder")(tokens)
        positive = maps[..., cfg.click_aware_channel]
        classes, masks = ClickAwareDecoder(cfg, name="click_aware_decoder")(levels, mask_features, positive)
        out_dtype = jnp.promote_types(dtype, jnp.float32)
        return segment_inference(classes.astype(out_dtype), masks.astype(out_dtype), image.shape[-3:-1])
