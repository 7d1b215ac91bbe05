"""RobustSAM's mask decoder: SAM's decoder plus the robust output tokens and Fourier feature blocks.

Behaviour matched to ``robust_segment_anything.modeling.mask_decoder.MaskDecoder``
for one prompt set (docs/models/robustsam.md):

  * ``robust=False`` (the reference's ``clear=True``, its predictor's default):
    output tokens ``[iou_token, mask_tokens]``; masks and IoU predictions are
    exactly SAM's (`MaskDecoder`). The reference also runs the feature blocks
    there, but their output never reaches a mask, so they are not computed;
  * ``robust=True`` (``clear=False``): output tokens ``[iou_token,
    custom_robust_token]`` through SAM's two-way transformer; the IoU head as
    SAM's; mask ``i`` is ``robust_mlp(custom_token_block(token_i)) .
    robust_features``, where ``robust_features`` f32[4E, 4E, C/8] is

        fourier_mask_features(upscaled)                       # Degradation(C/8) -> Conv3x3, LN2d, GELU, Conv3x3
      + fourier_first_layer_features(early_feature)          # Degradation(D) -> ConvT, LN2d, GELU, ConvT
      + fourier_last_layer_features(image_embeddings)        # Degradation(C) -> ConvT, LN2d, GELU, ConvT

    with ``upscaled`` SAM's upscaled image tokens (after the last GELU) and the
    early feature the ViT's first global-attention block output (D channels).
    The last two terms do not depend on the prompts (`encoder_features`); the
    segmenter computes them once per image and passes them in.

Params: SAM's decoder (`MaskDecoder`) plus ``custom_robust_token`` f32[K, C],
``robust_mlp/layers_{0,1,2}``, ``custom_token_block/{lin1,lin2}``,
``fourier_mask_features/{degradation,downsample}``,
``fourier_first_layer_features/{degradation,upsample}``,
``fourier_last_layer_features/{degradation,upsample}``.
"""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp

from jaxseg_robust.models.robustsam.modules import DegradationBlock, TokenBlock
from jaxseg_robust.models.sam.layers import MLP, LowRankDense
from jaxseg_robust.models.sam.mask_decoder import MaskDecoder, blocks_to_spatial
from jaxseg_robust.models.sam.mask_decoder_hq import FeatureUpscaling, MaskFeature


class MaskFeatureBlock(nn.Module):
    """The reference's ``MaskFeatureBlock`` with ``clear=False``: f32[4E, 4E, C/8] -> same shape."""

    features: int
    eps: float = 1e-6

    def setup(self):
        self.degradation = DegradationBlock(self.features)
        self.downsample = MaskFeature(self.features, 2 * self.features, self.eps)

    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        return self.downsample(self.degradation(x))


class EncoderFeatureBlock(nn.Module):
    """``FirstLayerFeatureBlock`` / ``LastLayerFeatureBlock`` with ``clear=False``.

    f32[E, E, Cin] -> f32[4E, 4E, Cout]: the degradation block, then
    ConvT(2, /2) -> LN2d(1e-6) -> GELU -> ConvT(2, /2) (Cin -> mid -> Cout).
    """

    in_features: int
    mid_features: int
    out_features: int
    eps: float = 1e-6

    def setup(self):
        self.degradation = DegradationBlock(self.in_features)
        self.upsample = FeatureUpscaling(self.in_features, self.mid_features, self.out_features,
                                         self.eps)

    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        return self.upsample(self.degradation(x))


class RobustMaskDecoder(MaskDecoder):
    """RobustSAM's decoder (see the module docstring).

    Attributes:
      vit_dim: D, channels of the early encoder feature.
      robust: static; the robust output (``clear=False``) or SAM's (``clear=True``).
    """

    vit_dim: int = 768
    robust: bool = False

    def setup(self):
        super().setup()
        c, k = self.transformer_dim, self.num_mask_tokens
        self.custom_robust_token = self.param("custom_robust_token", nn.initializers.normal(1.0),
                                              (k, c))
        self.robust_mlp = MLP(c, c, c // 8, 3)
        self.custom_token_block = TokenBlock(c, k)
        self.fourier_mask_features = MaskFeatureBlock(c // 8)
        self.fourier_first_layer_features = EncoderFeatureBlock(self.vit_dim, c, c // 8)
        self.fourier_last_layer_features = EncoderFeatureBlock(c, c, c // 8)

    def output_tokens(self) -> jnp.ndarray:
        """f32[1 + K, C]: the IoU token, then SAM's mask tokens or the robust output tokens."""
        tokens = self.custom_robust_token if self.robust else self.mask_tokens
        return jnp.concatenate([self.iou_token, tokens], axis=0)

    def encoder_features(self, image_embeddings: jnp.ndarray,
                         early_feature: jnp.ndarray) -> jnp.ndarray:
        """Prompt-independent robust features f32[4E, 4E, C/8] (first + last layer blocks).

        Args:
          image_embeddings: f32[E, E, C].
          early_feature: f32[E, E, D].
        """
        return (self.fourier_first_layer_features(early_feature.astype(jnp.float32))
                + self.fourier_last_layer_features(image_embeddings))

    def robust_masks(self, mask_tokens_out: jnp.ndarray, upscaled: jnp.ndarray,
                     encoder_features: jnp.ndarray) -> jnp.ndarray:
        """The robust masks: f32[K, C] tokens, f32[4E, 4E, C/8] maps -> f32[K, 4E, 4E]."""
        features = self.fourier_mask_features(upscaled) + encoder_features
        weights = self.robust_mlp(self.custom_token_block(mask_tokens_out))  # [K, C/8]
        return jnp.einsum("kd,hwd->khw", weights, features)

    def __call__(self, image_embeddings, image_pe, sparse, token_valid, dense: LowRankDense,
                 robust_features: jnp.ndarray | None = None):
        """Predicts every candidate mask for one prompt set.

        Args:
          image_embeddings, image_pe, sparse, token_valid, dense: as `MaskDecoder`.
          robust_features: f32[4E, 4E, C/8] `encoder_features` of the image
            (needed with ``robust``; unused otherwise).

        Returns:
          (masks f32[K, 4E, 4E] low-res logits, iou f32[K] predicted IoU).
        """
        if not self.robust:
            return super().__call__(image_embeddings, image_pe, sparse, token_valid, dense)
        if robust_features is None:
            raise ValueError("the robust decoder path needs the image's robust encoder features")
        k = self.num_mask_tokens
        hs, src = self.run_transformer(image_embeddings, image_pe, sparse, token_valid, dense)
        upscaled = blocks_to_spatial(self.output_upscaling.blocks(src))
        masks = self.robust_masks(hs[1:1 + k], upscaled, robust_features)
        return masks, self.iou_prediction_head(hs[0])

    def every_output(self, image_embeddings, image_pe, sparse, token_valid, dense: LowRankDense,
                     early_feature: jnp.ndarray):
        """Both paths' masks (touches every parameter; ``init`` calls it to create them all).

        Returns:
          (SAM's masks f32[K, 4E, 4E], robust masks f32[K, 4E, 4E], iou f32[K]); the
          transformer runs once, on whichever output tokens ``robust`` names.
        """
        hs, src = self.run_transformer(image_embeddings, image_pe, sparse, token_valid, dense)
        blocks = self.output_upscaling.blocks(src)
        k = self.num_mask_tokens
        sam = self.sam_masks(hs[1:1 + k], blocks)
        robust = self.robust_masks(hs[1:1 + k], blocks_to_spatial(blocks),
                                   self.encoder_features(image_embeddings, early_feature))
        return sam, robust, self.iou_prediction_head(hs[0])
