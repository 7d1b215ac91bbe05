"""SAM 2's mask decoder: SAM's two-way transformer and hypernetwork heads with SAM 2's additions.

Behaviour matched to ``sam2.modeling.sam.mask_decoder.MaskDecoder`` (see
docs/models/sam2.md). Differences from SAM's decoder (`models/sam/mask_decoder.py`,
which this module extends and whose prompt-independent work sharing it keeps):
  * an object-score token precedes the IoU and mask tokens and takes part in
    attention (``pred_obj_scores``); its output feeds ``pred_obj_score_head``
    (a 3-layer ReLU MLP with ``pred_obj_scores_mlp``, else one Linear);
  * the IoU head ends in a sigmoid (``iou_prediction_use_sigmoid``);
  * with ``use_high_res_features`` the upscaling adds projections of the
    stride-8 and stride-4 image features after each transposed conv:
    ``gelu(LN(dc1(x) + s1))`` then ``gelu(dc2(.) + s0)``, where
    ``s1 = conv_s1(level 1)`` (C/4 channels) and ``s0 = conv_s0(level 0)``
    (C/8) are computed once per image (`project_high_res`), as the official
    ``forward_image`` does.
All K candidates are returned; the selection (multimask, or the single mask
with the dynamic stability fallback) happens in the segmenter.
"""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp

from jaxseg_robust.models.sam.layers import MLP, Linear, LowRankDense, gelu
from jaxseg_robust.models.sam.mask_decoder import MaskDecoder, OutputUpscaling, blocks_to_spatial
from jaxseg_robust.models.sam.transformer import TwoWayTransformer

NO_OBJECT_SCORE_LOGIT = 10.0  # the official constant when pred_obj_scores is off


def to_patches_2(x: jnp.ndarray) -> jnp.ndarray:
    """f32[2E, 2E, D] spatial -> f32[E, E, 2, 2, D] (row ``2i + a``, column ``2j + b``)."""
    h, w, d = x.shape
    return x.reshape(h // 2, 2, w // 2, 2, d).transpose(0, 2, 1, 3, 4)


def to_patches_4(x: jnp.ndarray) -> jnp.ndarray:
    """f32[4E, 4E, D] spatial -> f32[E, E, 2, 2, 2, 2, D] (row ``4i + 2a + a2``, column ``4j + 2b + b2``)."""
    h, w, d = x.shape
    return x.reshape(h // 4, 2, 2, w // 4, 2, 2, d).transpose(0, 3, 1, 4, 2, 5, 6)


class Sam2OutputUpscaling(OutputUpscaling):
    """SAM's upscaling (params ``upscale1``, ``norm``, ``upscale2``) with the high-res skips."""

    def blocks_with_skips(self, x: jnp.ndarray, feat_s1: jnp.ndarray,
                          feat_s0: jnp.ndarray) -> jnp.ndarray:
        """f32[E, E, C], s1 f32[2E, 2E, C/4], s0 f32[4E, 4E, C/8] -> patch layout f32[E, E, 2, 2, 2, 2, C/8]."""
        y = gelu(self.norm(self.upscale1.patches(x) + to_patches_2(feat_s1)))
        return gelu(self.upscale2.patches(y) + to_patches_4(feat_s0))


class Sam2MaskDecoder(MaskDecoder):
    """Params: SAM's (``iou_token``, ``mask_tokens``, ``transformer``, ``output_upscaling``,
    ``output_hypernetworks_mlps_{i}``, ``iou_prediction_head``) plus ``obj_score_token``,
    ``pred_obj_score_head`` and ``conv_s0``/``conv_s1`` (as `Linear`)."""

    use_high_res_features: bool = True
    pred_obj_scores: bool = True
    pred_obj_scores_mlp: bool = True
    iou_prediction_use_sigmoid: bool = True

    def setup(self):
        c, cfg = self.transformer_dim, self.config
        normal = nn.initializers.normal(1.0)
        self.iou_token = self.param("iou_token", normal, (1, c))
        self.mask_tokens = self.param("mask_tokens", normal, (self.num_mask_tokens, c))
        if self.pred_obj_scores:
            self.obj_score_token = self.param("obj_score_token", normal, (1, c))
            self.pred_obj_score_head = (MLP(c, c, 1, 3) if self.pred_obj_scores_mlp
                                        else Linear(c, 1))
        self.transformer = TwoWayTransformer(cfg.transformer_depth, c, cfg.transformer_num_heads,
                                             cfg.transformer_mlp_dim, cfg.attention_downsample_rate,
                                             num_read_tokens=self.num_read_tokens)
        self.output_upscaling = Sam2OutputUpscaling(c)
        if self.use_high_res_features:
            self.conv_s0 = Linear(c, c // 8)
            self.conv_s1 = Linear(c, c // 4)
        self.output_hypernetworks_mlps = [MLP(c, c, c // 8, 3)
                                          for _ in range(self.num_mask_tokens)]
        self.iou_prediction_head = MLP(c, cfg.iou_head_hidden_dim, self.num_mask_tokens,
                                       cfg.iou_head_depth)

    @property
    def num_leading_tokens(self) -> int:
        """Output tokens before the IoU token (1 with the object-score token)."""
        return 1 if self.pred_obj_scores else 0

    @property
    def num_read_tokens(self) -> int:
        """Output tokens read after the transformer: [object-score,] IoU and the K mask tokens."""
        return self.num_leading_tokens + 1 + self.num_mask_tokens

    def output_tokens(self) -> jnp.ndarray:
        """f32[s + 1 + K, C]: [object-score token,] IoU token, K mask tokens."""
        tokens = [self.iou_token, self.mask_tokens]
        if self.pred_obj_scores:
            tokens.insert(0, self.obj_score_token)
        return jnp.concatenate(tokens, axis=0)

    def sam_masks(self, mask_tokens_out: jnp.ndarray, blocks: jnp.ndarray) -> jnp.ndarray:
        """K masks: f32[K, C] mask tokens, upscaled ``blocks`` (patch layout) -> f32[K, 4E, 4E].

        The hypernetwork weights are contracted with the channel axis, which
        is minor in ``blocks`` (XLA then reads ``blocks`` in place instead of
        transposing it); only the K-channel result is moved.
        """
        hyper_in = jnp.stack([mlp(mask_tokens_out[i])
                              for i, mlp in enumerate(self.output_hypernetworks_mlps)])
        masks = jnp.einsum("hwabxyd,kd->hwabxyk", blocks, hyper_in)  # [E, E, 2, 2, 2, 2, K]
        return blocks_to_spatial(jnp.moveaxis(masks, -1, 0)[..., None])[..., 0]

    def project_high_res(self, level0: jnp.ndarray, level1: jnp.ndarray):
        """FPN levels 0/1 f32[..., d] -> (s0 f32[..., C/8], s1 f32[..., C/4]) (once per image)."""
        return self.conv_s0(level0), self.conv_s1(level1)

    def upscaled_blocks(self, src: jnp.ndarray,
                        high_res: tuple[jnp.ndarray, jnp.ndarray] | None) -> jnp.ndarray:
        """Transformer image output f32[E, E, C] -> upscaled patch layout f32[E, E, 2, 2, 2, 2, C/8].

        With ``use_high_res_features`` the projected skips ``high_res = (s0, s1)``
        are added after each transposed conv (required then).
        """
        if not self.use_high_res_features:
            return self.output_upscaling.blocks(src)
        if high_res is None:
            raise ValueError("this SAM 2 decoder needs the high-resolution features")
        return self.output_upscaling.blocks_with_skips(src, high_res[1], high_res[0])

    def quality_heads(self, hs: jnp.ndarray) -> tuple[jnp.ndarray, jnp.ndarray]:
        """Output tokens f32[T, C] -> (iou f32[K] (sigmoid with ``iou_prediction_use_sigmoid``),
        object_score_logit f32[1] (10 without ``pred_obj_scores``))."""
        iou = self.iou_prediction_head(hs[self.num_leading_tokens])
        if self.iou_prediction_use_sigmoid:
            iou = nn.sigmoid(iou)
        if self.pred_obj_scores:
            return iou, self.pred_obj_score_head(hs[0])
        return iou, jnp.full((1,), NO_OBJECT_SCORE_LOGIT, iou.dtype)

    def __call__(self, image_embeddings, image_pe, sparse, token_valid, dense: LowRankDense,
                 high_res: tuple[jnp.ndarray, jnp.ndarray] | None = None):
        """Predicts every candidate mask for one prompt set.

        Args:
          image_embeddings: f32[E, E, C] (stride-16 features + no_mem_embed).
          image_pe: f32[E, E, C] dense position encoding.
          sparse: f32[T, C] prompt tokens; token_valid: bool[T].
          dense: dense prompt embedding, factors f32[E, E, R].
          high_res: (s0 f32[4E, 4E, C/8], s1 f32[2E, 2E, C/4]) projected
            high-resolution features (required with ``use_high_res_features``).

        Returns:
          (masks f32[K, 4E, 4E] low-res logits, iou f32[K], object_score_logit f32[1]).
        """
        if self.use_high_res_features and self.is_initializing():
            self.project_high_res(image_embeddings, image_embeddings)  # creates conv_s0/conv_s1
        hs, src = self.run_transformer(image_embeddings, image_pe, sparse, token_valid, dense)
        s = self.num_leading_tokens
        masks = self.sam_masks(hs[s + 1:s + 1 + self.num_mask_tokens],
                               self.upscaled_blocks(src, high_res))
        iou, object_score = self.quality_heads(hs)
        return masks, iou, object_score


__all__ = ["Sam2MaskDecoder", "Sam2OutputUpscaling", "to_patches_2", "to_patches_4",
           "NO_OBJECT_SCORE_LOGIT"]
