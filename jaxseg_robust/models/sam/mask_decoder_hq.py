"""SAM-HQ's mask decoder: SAM's decoder plus an HQ output token and fused HQ features.

Behaviour matched to ``segment_anything_hq.modeling.mask_decoder_hq.MaskDecoderHQ``:
  * output tokens are ``[iou_token, mask_tokens (K), hf_token]``, then the
    prompt tokens; the transformer, the IoU head (K outputs) and the K SAM
    masks are SAM's (`MaskDecoder`);
  * prompt-independent HQ features f32[4E, 4E, C/8] =
    ``embedding_encoder(image_embeddings) + compress_vit_feat(early_feature)``,
    each ConvT(2, /2) -> LayerNorm2d(1e-6) -> GELU -> ConvT(2, /2)
    (C -> C/4 -> C/8 and D -> C -> C/8; D = ``vit_dim``, the early encoder
    feature's channels; no GELU at the end);
  * the HQ mask feature is ``embedding_maskfeature(upscaled) + hq_features``
    where ``upscaled`` is SAM's upscaled image embedding and
    ``embedding_maskfeature`` is Conv3x3 (pad 1, C/8 -> C/4) -> LayerNorm2d(1e-6)
    -> GELU -> Conv3x3 (pad 1, C/4 -> C/8);
  * the HQ mask is ``hf_mlp(hf_token_out) . HQ mask feature`` (a 3-layer ReLU MLP).

Output: all K SAM masks followed by the HQ mask, f32[K + 1, 4E, 4E], and the
K IoU predictions; SAM-HQ's selection (`hq_select`) happens in the segmenter.

Computation (no change to the result beyond float summation order): the last
3x3 convolution is followed only by the dot product with the HQ hypernetwork
vector, so that vector is contracted into the kernel first
(`Conv3x3.contract`): a 1-output convolution instead of a C/8-output one.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxseg_robust.models.sam.layers import MLP, LowRankDense, PatchConvTranspose, gelu, layer_norm
from jaxseg_robust.models.sam.layers import torch_linear_init
from jaxseg_robust.models.sam.mask_decoder import MaskDecoder, blocks_to_spatial


class FeatureUpscaling(nn.Module):
    """ConvT(2, /2) -> LN2d -> GELU -> ConvT(2, /2): f32[E, E, Cin] -> f32[4E, 4E, Cout].

    Params ``upscale1`` (Cin -> mid), ``norm``, ``upscale2`` (mid -> Cout).
    """

    in_features: int
    mid_features: int
    out_features: int
    eps: float = 1e-6

    def setup(self):
        self.upscale1 = PatchConvTranspose(self.in_features, self.mid_features, 2)
        self.norm = layer_norm(self.eps)
        self.upscale2 = PatchConvTranspose(self.mid_features, self.out_features, 2)

    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        """f32[E, E, Cin] -> f32[4E, 4E, Cout] (spatial layout)."""
        y = gelu(self.norm(self.upscale1.patches(x)))  # [E, E, 2, 2, mid]
        return blocks_to_spatial(self.upscale2.patches(y))  # [4E, 4E, Cout]


class Conv3x3(nn.Module):
    """3x3 convolution, stride 1, zero padding 1, with bias (torch ``Conv2d(k=3, p=1)``).

    Params ``kernel`` f32[3, 3, Cin, F] (torch weight [F, Cin, 3, 3]
    transposed to [3, 3, Cin, F]) and ``bias`` f32[F].
    """

    in_features: int
    features: int

    def setup(self):
        init = torch_linear_init(9 * self.in_features)
        self.kernel = self.param("kernel", init, (3, 3, self.in_features, self.features))
        self.bias = self.param("bias", init, (self.features,))

    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        """f32[H, W, Cin] -> f32[H, W, F] (cross-correlation, as torch)."""
        y = jax.lax.conv_general_dilated(x[None], self.kernel, (1, 1), ((1, 1), (1, 1)),
                                         dimension_numbers=("NHWC", "HWIO", "NHWC"))
        return y[0] + self.bias

    def contract(self, x: jnp.ndarray, weights: jnp.ndarray) -> jnp.ndarray:
        """``self(x) @ weights`` computed as a single-output convolution.

        Args:
          x: f32[H, W, Cin].
          weights: f32[F].

        Returns:
          f32[H, W]: ``sum_f conv(x)[..., f] * weights[f]``.
        """
        h, w = x.shape[0], x.shape[1]
        kernel = self.kernel @ weights  # [3, 3, Cin]
        taps = jnp.einsum("hwc,abc->hwab", x, kernel)  # each pixel's term for every tap
        taps = jnp.pad(taps, ((1, 1), (1, 1), (0, 0), (0, 0)))
        out = sum(taps[a:a + h, b:b + w, a, b] for a in range(3) for b in range(3))
        return out + self.bias @ weights


class MaskFeature(nn.Module):
    """SAM-HQ's ``embedding_maskfeature``: Conv3x3 -> LN2d -> GELU -> Conv3x3.

    Params ``conv1`` (C/8 -> C/4), ``norm``, ``conv2`` (C/4 -> C/8).
    """

    features: int
    hidden_features: int
    eps: float = 1e-6

    def setup(self):
        self.conv1 = Conv3x3(self.features, self.hidden_features)
        self.norm = layer_norm(self.eps)
        self.conv2 = Conv3x3(self.hidden_features, self.features)

    def hidden(self, x: jnp.ndarray) -> jnp.ndarray:
        """f32[H, W, C/8] -> f32[H, W, C/4] (everything before ``conv2``)."""
        return gelu(self.norm(self.conv1(x)))

    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        """f32[H, W, C/8] -> f32[H, W, C/8] (the reference computation)."""
        return self.conv2(self.hidden(x))

    def project(self, x: jnp.ndarray, weights: jnp.ndarray) -> jnp.ndarray:
        """``self(x) @ weights`` for weights f32[C/8] -> f32[H, W]."""
        return self.conv2.contract(self.hidden(x), weights)


class MaskDecoderHQ(MaskDecoder):
    """SAM-HQ's decoder. Params: SAM's (`MaskDecoder`) plus ``hf_token`` f32[1, C],
    ``hf_mlp/layers_{j}``, ``compress_vit_feat/{upscale1,norm,upscale2}``,
    ``embedding_encoder/{upscale1,norm,upscale2}``,
    ``embedding_maskfeature/{conv1,norm,conv2}``.

    Attributes:
      vit_dim: channels D of the early encoder feature.
    """

    vit_dim: int = 1024

    def setup(self):
        super().setup()
        c = self.transformer_dim
        self.hf_token = self.param("hf_token", nn.initializers.normal(1.0), (1, c))
        self.hf_mlp = MLP(c, c, c // 8, 3)
        self.compress_vit_feat = FeatureUpscaling(self.vit_dim, c, c // 8)
        self.embedding_encoder = FeatureUpscaling(c, c // 4, c // 8)
        self.embedding_maskfeature = MaskFeature(c // 8, c // 4)

    def output_tokens(self) -> jnp.ndarray:
        """f32[K + 2, C]: the IoU token, the K mask tokens, the HQ token."""
        return jnp.concatenate([self.iou_token, self.mask_tokens, self.hf_token], axis=0)

    def hq_features(self, image_embeddings: jnp.ndarray,
                    early_feature: jnp.ndarray) -> jnp.ndarray:
        """Prompt-independent HQ features.

        Args:
          image_embeddings: f32[E, E, C].
          early_feature: f32[E, E, D] the early encoder feature.

        Returns:
          f32[4E, 4E, C/8].
        """
        return (self.embedding_encoder(image_embeddings)
                + self.compress_vit_feat(early_feature.astype(jnp.float32)))

    def __call__(self, image_embeddings, image_pe, sparse, token_valid, dense: LowRankDense,
                 early_feature):
        """Predicts every SAM candidate and the HQ mask for one prompt set.

        Args:
          image_embeddings, image_pe, sparse, token_valid, dense: as `MaskDecoder`.
          early_feature: f32[E, E, D] the early encoder feature of the image.

        Returns:
          (masks f32[K + 1, 4E, 4E]: the K SAM candidates, then the HQ mask;
           iou f32[K] predicted IoU of the SAM candidates).
        """
        k = self.num_mask_tokens
        hq_features = self.hq_features(image_embeddings, early_feature)
        hs, src = self.run_transformer(image_embeddings, image_pe, sparse, token_valid, dense)
        blocks = self.output_upscaling.blocks(src)
        sam = self.sam_masks(hs[1:1 + k], blocks)
        hq_weights = self.hf_mlp(hs[1 + k])  # [C/8]
        upscaled = blocks_to_spatial(blocks)  # [4E, 4E, C/8]
        hq = self.embedding_maskfeature.project(upscaled, hq_weights) + hq_features @ hq_weights
        return jnp.concatenate([sam, hq[None]], axis=0), self.iou_prediction_head(hs[0])


def hq_select(masks: jnp.ndarray, iou: jnp.ndarray, *, multimask_output: bool,
              hq_token_only: bool):
    """SAM-HQ's output selection (``MaskDecoderHQ.forward``), for one prompt set.

    With ``multimask_output`` the SAM candidate with the highest predicted IoU
    among candidates 1..K-1 is chosen (score: its IoU), else candidate 0 (its
    IoU). The output mask is the HQ mask alone (``hq_token_only``) or the sum
    of the chosen SAM mask and the HQ mask (the reference default). There is
    always exactly one output mask, with or without ``multimask_output``.

    Args:
      masks: f32[K + 1, h, w] from `MaskDecoderHQ` (K SAM candidates, HQ mask last).
      iou: f32[K].
      multimask_output, hq_token_only: static bools.

    Returns:
      (low_res f32[1, h, w], scores f32[1], index i32[] = 0).
    """
    sam, hq = masks[:-1], masks[-1]
    if multimask_output:
        best = jnp.argmax(iou[1:])
        chosen, score = jnp.take(sam[1:], best, axis=0), jnp.take(iou[1:], best)
    else:
        chosen, score = sam[0], iou[0]
    out = hq if hq_token_only else chosen + hq
    return out[None], score[None], jnp.zeros((), jnp.int32)
