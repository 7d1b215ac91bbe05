"""SAM's mask decoder: output tokens + two-way transformer + hypernetwork heads.

Behaviour matched to ``segment_anything.modeling.mask_decoder``: tokens are
``[iou_token, mask_tokens (K = num_multimask_outputs + 1), prompt tokens]``;
after the transformer the image tokens are upscaled 4x by
ConvT(2, /2) -> LN2d(1e-6) -> GELU -> ConvT(2, /2) -> GELU (C -> C/4 -> C/8);
mask ``i`` is ``MLP_i(mask_token_i) . upscaled`` (3-layer ReLU MLPs); the IoU
head is a 3-layer ReLU MLP on the IoU token. All K candidates are returned;
``multimask_output`` selection happens in the segmenter.
"""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp

from jaxseg_robust.models.sam.config import MaskDecoderConfig
from jaxseg_robust.models.sam.layers import MLP, LowRankDense, PatchConvTranspose, gelu, layer_norm
from jaxseg_robust.models.sam.transformer import TwoWayTransformer


class OutputUpscaling(nn.Module):
    """f32[E, E, C] -> f32[4E, 4E, C/8]; params ``upscale1``, ``norm``, ``upscale2``.

    Every step after the first transposed conv acts per pixel, so `blocks`
    keeps the output in patch layout f32[E, E, 2, 2, 2, 2, C/8] (row
    ``4i + 2a + a2``, column ``4j + 2b + b2`` for index ``[i, j, a, b, a2, b2]``)
    and the decoder contracts it with the hypernetwork weights before any
    pixel shuffle; ``__call__`` gives the spatial map of the reference.
    """

    transformer_dim: int = 256
    eps: float = 1e-6

    def setup(self):
        c = self.transformer_dim
        self.upscale1 = PatchConvTranspose(c, c // 4, 2)
        self.norm = layer_norm(self.eps)
        self.upscale2 = PatchConvTranspose(c // 4, c // 8, 2)

    def blocks(self, x: jnp.ndarray) -> jnp.ndarray:
        """f32[E, E, C] -> f32[E, E, 2, 2, 2, 2, C/8] (patch layout, see class doc)."""
        y = gelu(self.norm(self.upscale1.patches(x)))  # [E, E, 2, 2, C/4]
        return gelu(self.upscale2.patches(y))  # [E, E, 2, 2, 2, 2, C/8]

    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        """f32[E, E, C] -> f32[4E, 4E, C/8] (spatial layout)."""
        return blocks_to_spatial(self.blocks(x))


def blocks_to_spatial(blocks: jnp.ndarray) -> jnp.ndarray:
    """f32[..., E, E, 2, 2, 2, 2, D] patch layout -> f32[..., 4E, 4E, D]."""
    *lead, e_h, e_w, _, _, _, _, d = blocks.shape
    n = len(lead)
    order = list(range(n)) + [n + i for i in (0, 2, 4, 1, 3, 5)] + [n + 6]
    return blocks.transpose(order).reshape(*lead, 4 * e_h, 4 * e_w, d)


class MaskDecoder(nn.Module):
    """Params: ``iou_token`` f32[1, C], ``mask_tokens`` f32[K, C], ``transformer/...``,
    ``output_upscaling/...``, ``output_hypernetworks_mlps_{i}/layers_{j}``,
    ``iou_prediction_head/layers_{j}``."""

    transformer_dim: int = 256
    config: MaskDecoderConfig = MaskDecoderConfig()

    @property
    def num_mask_tokens(self) -> int:
        """K = num_multimask_outputs + 1."""
        return self.config.num_multimask_outputs + 1

    def setup(self):
        c, cfg = self.transformer_dim, self.config
        normal = nn.initializers.normal(1.0)
        self.iou_token = self.param("iou_token", normal, (1, c))
        self.mask_tokens = self.param("mask_tokens", normal, (self.num_mask_tokens, c))
        self.transformer = TwoWayTransformer(cfg.transformer_depth, c, cfg.transformer_num_heads,
                                             cfg.transformer_mlp_dim, cfg.attention_downsample_rate)
        self.output_upscaling = OutputUpscaling(c)
        self.output_hypernetworks_mlps = [MLP(c, c, c // 8, 3)
                                          for _ in range(self.num_mask_tokens)]
        self.iou_prediction_head = MLP(c, cfg.iou_head_hidden_dim, self.num_mask_tokens,
                                       cfg.iou_head_depth)

    def output_tokens(self) -> jnp.ndarray:
        """f32[1 + K, C]: the IoU token, then the K mask tokens."""
        return jnp.concatenate([self.iou_token, self.mask_tokens], axis=0)

    def run_transformer(self, image_embeddings, image_pe, sparse, token_valid,
                        dense: LowRankDense):
        """The two-way transformer on ``[output tokens, prompt tokens]`` and the image.

        Args: as `__call__`.

        Returns:
          (tokens f32[T_out + T, C] (output tokens first), image f32[E, E, C]).
        """
        e_h, e_w, c = image_embeddings.shape
        output_tokens = self.output_tokens()
        tokens = jnp.concatenate([output_tokens, sparse], axis=0)
        valid = jnp.concatenate([jnp.ones((output_tokens.shape[0],), bool), token_valid])
        hs, src = self.transformer(image_embeddings.reshape(e_h * e_w, c),
                                   image_pe.reshape(e_h * e_w, c), tokens, valid,
                                   dense.flatten_spatial())
        return hs, src.reshape(e_h, e_w, c)

    def sam_masks(self, mask_tokens_out: jnp.ndarray, blocks: jnp.ndarray) -> jnp.ndarray:
        """SAM's K masks: f32[K, C] mask tokens, upscaled ``blocks`` -> f32[K, 4E, 4E]."""
        hyper_in = jnp.stack([mlp(mask_tokens_out[i])
                              for i, mlp in enumerate(self.output_hypernetworks_mlps)])
        masks = jnp.einsum("kd,hwabxyd->khwabxy", hyper_in, blocks)  # [K, E, E, 2, 2, 2, 2]
        return blocks_to_spatial(masks[..., None])[..., 0]  # [K, 4E, 4E]

    def __call__(self, image_embeddings, image_pe, sparse, token_valid, dense: LowRankDense):
        """Predicts every candidate mask for one prompt set.

        Args:
          image_embeddings: f32[E, E, C] (one image; shared across prompt sets).
          image_pe: f32[E, E, C] dense position encoding.
          sparse: f32[T, C] prompt tokens; token_valid: bool[T].
          dense: dense prompt embedding, factors f32[E, E, R].

        Returns:
          (masks f32[K, 4E, 4E] low-res logits, iou f32[K] predicted IoU).
        """
        hs, src = self.run_transformer(image_embeddings, image_pe, sparse, token_valid, dense)
        blocks = self.output_upscaling.blocks(src)
        masks = self.sam_masks(hs[1:1 + self.num_mask_tokens], blocks)
        return masks, self.iou_prediction_head(hs[0])
