"""HQ-SAM 2's mask decoder: SAM 2's decoder plus an HQ output token (see docs/models/sam_hq2.md).

Behaviour matched to ``sam2.modeling.sam.mask_hq_decoder.MaskDecoderHQ`` of
SysCV/sam-hq (folder ``sam-hq2``). Differences from SAM 2's decoder
(`Sam2MaskDecoder`, which this module extends):
  * output tokens are ``[object-score token, IoU token, K mask tokens, hf_token]``,
    then the prompt tokens; the HQ token takes part in attention and is read
    after the transformer;
  * the HQ mask is ``hf_mlp(hf_token_out) . embedding_maskfeature(upscaled)``,
    where ``upscaled`` f32[4E, 4E, C/8] is SAM 2's upscaled image embedding
    (high-resolution skips included) and ``embedding_maskfeature`` is
    Conv3x3 (C/8 -> C/4) -> LayerNorm2d(1e-6) -> GELU -> Conv3x3 (C/4 -> C/8),
    SAM-HQ's `MaskFeature`;
  * unlike SAM-HQ (``models/sam/mask_decoder_hq.py``) there is no fused early
    encoder feature: no ``compress_vit_feat``, no ``embedding_encoder``.
The K SAM candidates, the IoU head (K outputs) and the object score are SAM
2's. The selection (which SAM candidate joins the HQ mask) happens in the
segmenter (`hq2_select`).
"""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp

from jaxseg_robust.models.sam.layers import MLP, LowRankDense
from jaxseg_robust.models.sam.mask_decoder import blocks_to_spatial
from jaxseg_robust.models.sam.mask_decoder_hq import MaskFeature
from jaxseg_robust.models.sam2.mask_decoder import Sam2MaskDecoder


class Sam2MaskDecoderHQ(Sam2MaskDecoder):
    """HQ-SAM 2's decoder. Params: `Sam2MaskDecoder`'s plus ``hf_token`` f32[1, C],
    ``hf_mlp/layers_{0,1,2}`` (C -> C -> C -> C/8) and
    ``embedding_maskfeature/{conv1, norm, conv2}``."""

    def setup(self):
        super().setup()
        c = self.transformer_dim
        self.hf_token = self.param("hf_token", nn.initializers.normal(1.0), (1, c))
        self.hf_mlp = MLP(c, c, c // 8, 3)
        self.embedding_maskfeature = MaskFeature(c // 8, c // 4)

    @property
    def num_read_tokens(self) -> int:
        """SAM 2's output tokens plus the HQ token."""
        return super().num_read_tokens + 1

    def output_tokens(self) -> jnp.ndarray:
        """f32[s + 1 + K + 1, C]: [object-score token,] IoU token, K mask tokens, HQ token."""
        return jnp.concatenate([super().output_tokens(), self.hf_token], axis=0)

    def __call__(self, image_embeddings, image_pe, sparse, token_valid, dense: LowRankDense,
                 high_res: tuple[jnp.ndarray, jnp.ndarray] | None = None):
        """Predicts every SAM candidate and the HQ mask for one prompt set.

        Args: as `Sam2MaskDecoder.__call__`.

        Returns:
          (masks f32[K + 1, 4E, 4E] low-res logits: the K SAM candidates, then
          the HQ mask; iou f32[K] predicted IoU of the SAM candidates;
          object_score_logit f32[1]).
        """
        if self.use_high_res_features and self.is_initializing():
            self.project_high_res(image_embeddings, image_embeddings)  # creates conv_s0/conv_s1
        hs, src = self.run_transformer(image_embeddings, image_pe, sparse, token_valid, dense)
        s, k = self.num_leading_tokens, self.num_mask_tokens
        blocks = self.upscaled_blocks(src, high_res)
        sam = self.sam_masks(hs[s + 1:s + 1 + k], blocks)
        hq_weights = self.hf_mlp(hs[s + 1 + k])  # [C/8]
        hq = self.embedding_maskfeature.project(blocks_to_spatial(blocks), hq_weights)
        iou, object_score = self.quality_heads(hs)
        return jnp.concatenate([sam, hq[None]], axis=0), iou, object_score


__all__ = ["Sam2MaskDecoderHQ"]
