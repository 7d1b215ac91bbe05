"""`SamHQSegmenter`: SAM-HQ behind the Segmenter protocol.

Differences from `SamSegmenter` (everything else is inherited):
  * ``embed`` also keeps the encoder's early feature (ViT: the output of the
    first global-attention block; TinyViT: stage 1's output), as
    ``SamFeatures.interm_embeddings = (f32[E, E, D],)``; SAM's features stay
    without it;
  * the mask decoder is `MaskDecoderHQ`; ``decode_low_res`` returns the K SAM
    candidates followed by the HQ mask, f32[K + 1, 4E, 4E], with the K IoU
    predictions;
  * ``decode`` applies SAM-HQ's selection (`hq_select`, as
    ``segment_anything_hq``'s ``SamPredictor.predict``): one output mask, the
    best SAM candidate (``multimask_output``) or the single-mask output, plus
    the HQ mask, or the HQ mask alone with ``hq_token_only``.

``hq_token_only`` defaults to the reference's False; set it per segmenter
(``dataclasses.replace(seg, hq_token_only=True)``, so code written for any
Segmenter gets it) or per call (``decode(..., hq_token_only=True)``).
``decode`` stays pure, differentiable w.r.t. prompt coordinates and
vmappable; under ``vmap`` over prompt sets with unbatched features the
prompt-independent HQ features are computed once.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from jaxseg_robust.models.base import Prediction, Transform
from jaxseg_robust.models.sam.config import SamHQConfig
from jaxseg_robust.models.sam.mask_decoder_hq import MaskDecoderHQ, hq_select
from jaxseg_robust.models.sam.segmenter import SamFeatures, SamSegmenter, _check_frame, check_image_embeddings
from jaxseg_robust.prompts.types import Prompts


@dataclasses.dataclass(frozen=True)
class SamHQSegmenter(SamSegmenter):
    """SAM-HQ segmenter (static configuration; weights are passed as ``params``).

    Attributes:
      config: a `SamHQConfig`.
      image_resize: as `SamSegmenter`.
      hq_token_only: default output of `decode`: the HQ mask alone (True) or
        SAM's selected mask + the HQ mask (False, the reference default).
    """

    config: SamHQConfig
    image_resize: str = "float"
    hq_token_only: bool = False

    def __post_init__(self):
        super().__post_init__()
        if not isinstance(self.config, SamHQConfig):
            raise ValueError(f"SamHQSegmenter needs a SamHQConfig; got {type(self.config).__name__}")

    @property
    def mask_decoder(self) -> MaskDecoderHQ:
        """The linen HQ mask decoder."""
        return MaskDecoderHQ(self.config.prompt_embed_dim, self.config.decoder,
                             vit_dim=self.config.vit_dim)

    def _decoder_extra_inputs(self) -> tuple:
        e = self.config.embedding_size
        return (jnp.zeros((e, e, self.config.vit_dim)),)

    def embed(self, params, model_input: jnp.ndarray) -> SamFeatures:
        """f32[S, S, 3] (or [B, S, S, 3]) -> `SamFeatures` with the early feature.

        Returns:
          SamFeatures(image_embeddings f32[(B,) E, E, C],
          interm_embeddings=(f32[(B,) E, E, D],)).
        """
        x, single = self._batched_input(model_input)
        emb, interm = self.encode_image(params, x, collect_interm=True)
        if not interm:
            raise ValueError(f"the {self.config.encoder_kind} image encoder sowed no "
                             f"interm_embeddings; SAM-HQ needs its early feature")
        early = interm[0]
        if single:
            emb, early = emb[0], early[0]
        return SamFeatures(image_embeddings=emb, interm_embeddings=(early,))

    def _check_early_feature(self, features: SamFeatures) -> jnp.ndarray:
        cfg = self.config
        want = (cfg.embedding_size, cfg.embedding_size, cfg.vit_dim)
        interm = features.interm_embeddings
        if not interm or tuple(interm[0].shape) != want:
            got = [tuple(a.shape) for a in interm] if interm else "nothing"
            raise ValueError(f"features.interm_embeddings must start with the early encoder "
                             f"feature {list(want)} of one image (make features with "
                             f"SamHQSegmenter.embed; vmap over batches); got {got}")
        return interm[0]

    def decode_low_res(self, params, features: SamFeatures, prompts: Prompts,
                       transform: Transform):
        """Every SAM candidate and the HQ mask at low resolution, for one prompt set.

        Args: as `SamSegmenter.decode_low_res`; ``features`` from `embed`.

        Returns:
          (low_res f32[K + 1, 4E, 4E] logits: candidates 0..K-1 as SAM's, the
          HQ mask last; iou f32[K] predicted IoU of the SAM candidates).
        """
        emb = check_image_embeddings(features.image_embeddings, self.config)
        early = self._check_early_feature(features)
        sparse, valid, dense = self.encode_prompts(params, prompts, transform)
        return self.mask_decoder.apply({"params": params["mask_decoder"]}, emb,
                                       self.dense_pe(params), sparse, valid, dense, early)

    def select(self, low_res: jnp.ndarray, iou: jnp.ndarray, *, multimask_output: bool,
               hq_token_only: bool | None = None):
        """SAM-HQ's output selection (`hq_select`); ``hq_token_only`` None -> the field.

        Returns:
          (low_res f32[1, h, w], scores f32[1], index i32[] = 0).
        """
        only = self.hq_token_only if hq_token_only is None else bool(hq_token_only)
        return hq_select(low_res, iou, multimask_output=multimask_output, hq_token_only=only)

    def decode(self, params, features: SamFeatures, prompts: Prompts, transform: Transform, *,
               multimask_output: bool = True, hq_token_only: bool | None = None) -> Prediction:
        """Decodes one prompt set into a `Prediction` (SAM-HQ's single output mask).

        Args:
          params, features, prompts, transform: as `decode_low_res`.
          multimask_output: static; which SAM candidate joins the HQ mask
            (best of 3 by predicted IoU, or the single-mask output).
          hq_token_only: static; None -> ``self.hq_token_only``.

        Returns:
          Prediction(logits f32[Hf, Wf], low_res_logits f32[1, 4E, 4E],
          scores f32[1] (the chosen SAM candidate's predicted IoU), index 0).
        """
        _check_frame(transform)
        low_res, iou = self.decode_low_res(params, features, prompts, transform)
        low_res, iou, index = self.select(low_res, iou, multimask_output=multimask_output,
                                          hq_token_only=hq_token_only)
        return Prediction(logits=self.upsample(low_res[0], transform), low_res_logits=low_res,
                          scores=iou, index=index)
