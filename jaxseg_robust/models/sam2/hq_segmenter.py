"""`Sam2HQSegmenter`: HQ-SAM 2 behind the Segmenter protocol (see docs/models/sam_hq2.md).

HQ-SAM 2 (SysCV/sam-hq, folder ``sam-hq2``) is SAM 2.1 with SAM-HQ's output
token. Differences from `Sam2Segmenter` (everything else is inherited:
preprocessing, the Hiera encoder, features, prompts, upsampling, feedback):
  * the mask decoder is `Sam2MaskDecoderHQ`; ``decode_low_res`` /
    ``decode_heads`` return the K SAM candidates followed by the HQ mask,
    f32[K + 1, 4E, 4E], with the K IoU predictions;
  * ``select`` is `hq2_select`: SAM 2's selection over the SAM candidates
    (multimask: candidates 1..K-1; single: candidate 0 with the dynamic
    stability fallback, the stability taken on the SAM candidate alone), then
    the HQ mask added to every selected candidate, as the official
    ``MaskDecoderHQ.forward`` (``masks_hq + masks_sam``); with
    ``hq_token_only`` the HQ mask alone.

So ``decode(multimask_output=True)`` returns three candidates ``sam_i + hq``
(i = 1..3) with their predicted IoUs and selects the best, which is what the
BREPS wrapper does with ``SAM2ImagePredictor.predict(box=..., multimask_output=True)``.
``decode`` stays pure, vmappable and differentiable w.r.t. prompt coordinates.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax.numpy as jnp

from jaxseg_robust.models.base import FamilyRules, Prediction, Transform
from jaxseg_robust.models.sam2.config import Sam2HQConfig
from jaxseg_robust.models.sam2.hq_mask_decoder import Sam2MaskDecoderHQ
from jaxseg_robust.models.sam2.segmenter import PROBABILITY_THRESHOLD, Sam2Features, Sam2Segmenter
from jaxseg_robust.prompts.types import Prompts


def hq2_select(sam_selection, hq: jnp.ndarray, *, hq_token_only: bool):
    """HQ-SAM 2's output from SAM 2's selection of the SAM candidates and the HQ mask.

    Args:
      sam_selection: (low_res f32[C, h, w], scores f32[C], index i32[]) from
        `Sam2Segmenter.select` on the K SAM candidates (C = K - 1 or 1).
      hq: f32[h, w] the HQ mask's logits.
      hq_token_only: static; True -> the HQ mask alone.

    Returns:
      (low_res f32[C, h, w] = candidates + hq, scores f32[C], index i32[]); with
      ``hq_token_only`` (hq f32[1, h, w], the selected candidate's score f32[1], 0).
    """
    low_res, scores, index = sam_selection
    if hq_token_only:
        return hq[None], jnp.take(scores, index)[None], jnp.zeros((), jnp.int32)
    return low_res + hq, scores, index


@dataclasses.dataclass(frozen=True)
class Sam2HQSegmenter(Sam2Segmenter):
    """HQ-SAM 2 segmenter (static configuration; weights are passed as ``params``).

    Param tree: `Sam2Segmenter`'s, whose ``mask_decoder`` adds ``hf_token``,
    ``hf_mlp`` and ``embedding_maskfeature``.

    Attributes:
      config: a `Sam2HQConfig`.
      hq_token_only: default output of `decode`: the HQ mask alone (True) or
        each selected SAM candidate + the HQ mask (False, the official default).
    """

    config: Sam2HQConfig
    probability_threshold: float = PROBABILITY_THRESHOLD
    hq_token_only: bool = False
    # The official SAM2ImagePredictor as SAM 2's: RClicks' decoding mode is the single mask with
    # the dynamic fallback (models.base.FamilyRules.evaluation_multimask; docs/models/sam_hq2.md)
    rules: ClassVar[FamilyRules] = FamilyRules(family="sam2_hq", evaluation_multimask=False)

    def __post_init__(self):
        if not isinstance(self.config, Sam2HQConfig):
            raise ValueError(f"Sam2HQSegmenter needs a Sam2HQConfig; got {type(self.config).__name__}")

    @property
    def mask_decoder(self) -> Sam2MaskDecoderHQ:
        """The linen HQ mask decoder."""
        cfg = self.config
        return Sam2MaskDecoderHQ(cfg.prompt_embed_dim, cfg.decoder,
                                 use_high_res_features=cfg.use_high_res_features,
                                 pred_obj_scores=cfg.pred_obj_scores,
                                 pred_obj_scores_mlp=cfg.pred_obj_scores_mlp,
                                 iou_prediction_use_sigmoid=cfg.iou_prediction_use_sigmoid)

    def select(self, low_res: jnp.ndarray, iou: jnp.ndarray, *, multimask_output: bool,
               hq_token_only: bool | None = None):
        """The official output selection from every candidate of `decode_low_res`.

        Args:
          low_res: f32[K + 1, h, w] unclamped logits (the K SAM candidates, the HQ mask last).
          iou: f32[K].
          multimask_output: static; as `Sam2Segmenter.select` on the SAM candidates.
          hq_token_only: static; None -> ``self.hq_token_only``.

        Returns:
          (low_res f32[C, h, w], scores f32[C], index i32[]), see `hq2_select`.
        """
        only = self.hq_token_only if hq_token_only is None else bool(hq_token_only)
        sam = super().select(low_res[:-1], iou, multimask_output=multimask_output)
        return hq2_select(sam, low_res[-1], hq_token_only=only)

    def decode(self, params, features: Sam2Features, prompts: Prompts, transform: Transform, *,
               multimask_output: bool = True, hq_token_only: bool | None = None) -> Prediction:
        """`Sam2Segmenter.decode` with HQ-SAM 2's selection.

        Args:
          params, features, prompts, transform, multimask_output: as `Sam2Segmenter.decode`.
          hq_token_only: static; None -> ``self.hq_token_only``.

        Returns:
          Prediction(logits f32[Hf, Wf] of the selected output, low_res_logits
          f32[C, 4E, 4E] clamped to [-32, 32], scores f32[C], index i32[]); C = 3
          (multimask) or 1.
        """
        segmenter = self if hq_token_only is None else dataclasses.replace(
            self, hq_token_only=bool(hq_token_only))
        return Sam2Segmenter.decode(segmenter, params, features, prompts, transform,
                                    multimask_output=multimask_output)


__all__ = ["Sam2HQSegmenter", "hq2_select"]
