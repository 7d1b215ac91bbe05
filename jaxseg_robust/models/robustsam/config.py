"""Static configuration of RobustSAM models (family "robustsam"; docs/models/robustsam.md).

A RobustSAM model is SAM (ViT encoder, SAM's prompt encoder, SAM's mask
decoder) whose mask decoder carries RobustSAM's extra modules: the robust
output tokens (``custom_robust_token``) with their token block (AOTG) and
hypernetwork (``robust_mlp``), and three Fourier feature blocks (AMFG) on the
decoder's mask features, the first global-attention block output of the ViT
and the image embedding (``robust_segment_anything/modeling/mask_decoder.py``).

``decoder_path`` says which output the decoder computes, as the reference's
``MaskDecoder.forward(..., clear=...)`` does:

  * "clear" (the reference default, ``SamPredictor.predict_torch``, which the
    BREPS wrapper calls): SAM's output tokens and mask features; the extra
    modules run but do not reach the masks or the IoU predictions, so they are
    not computed here;
  * "robust" (``clear=False``, the authors' ``Sam.predict`` of ``eval.py``):
    the robust output tokens through the token block and ``robust_mlp``, on the
    mask features fused with the Fourier-filtered encoder features.
"""

from __future__ import annotations

import dataclasses

from jaxseg_robust.models.sam.config import (MaskDecoderConfig, SamConfig, dataclass_from_dict,
                                             early_feature_channels)

DECODER_PATH_CLEAR = "clear"
DECODER_PATH_ROBUST = "robust"
DECODER_PATHS = (DECODER_PATH_CLEAR, DECODER_PATH_ROBUST)
# The Selector of RobustSAM's selective convolutions pools every map to 4 x 4 cells.
SELECTOR_CELLS = 4
# Squeeze ratio of the Selector's and the channel attention's hidden layers.
SQUEEZE_RATIO = 16


@dataclasses.dataclass(frozen=True)
class RobustSamConfig(SamConfig):
    """A RobustSAM model: `SamConfig` (ViT encoder) plus the decoder path (family "robustsam").

    Every shape of the extra modules follows from the encoder width (``vit_dim``),
    ``prompt_embed_dim`` (C) and the number of mask tokens (K):

      * the Fourier blocks on the first global-attention block output (D = ``vit_dim``
        channels), on the image embedding (C) and on the mask features (C / 8);
      * the token block's MLP on C / K features per row.

    Attributes:
      decoder_path: "clear" (SAM's tokens, the reference predictor's default) or
        "robust" (RobustSAM's robust output tokens); see the module docstring.
    """

    family: str = "robustsam"
    decoder_path: str = DECODER_PATH_CLEAR

    def __post_init__(self):
        super().__post_init__()
        if self.decoder_path not in DECODER_PATHS:
            raise ValueError(f"decoder_path must be one of {DECODER_PATHS}; got {self.decoder_path!r}")
        if self.encoder_kind != "vit":
            raise ValueError(f"RobustSAM has a ViT image encoder; got encoder_kind "
                             f"'{self.encoder_kind}'")
        early_feature_channels(self.encoder_kind, self.encoder)  # a global-attention block exists
        check_robust_shapes(self.prompt_embed_dim, self.vit_dim, self.embedding_size,
                            self.decoder.num_multimask_outputs + 1)

    @property
    def vit_dim(self) -> int:
        """Channels D of the first global-attention block output (the reference's ``vit_dim``)."""
        return early_feature_channels(self.encoder_kind, self.encoder)

    @property
    def robust(self) -> bool:
        """Whether the decoder computes RobustSAM's robust output (``clear=False``)."""
        return self.decoder_path == DECODER_PATH_ROBUST

    @classmethod
    def from_dict(cls, data: dict) -> "RobustSamConfig":
        """Inverse of `to_dict` (the encoder config class comes from ``encoder_kind``)."""
        sam = SamConfig.from_dict({k: v for k, v in data.items() if k != "decoder_path"})
        fields = {f.name: getattr(sam, f.name) for f in dataclasses.fields(SamConfig)}
        extra = {k: v for k, v in data.items() if k == "decoder_path"}
        return dataclass_from_dict(cls, {**fields, **extra}, what="RobustSAM config")


def check_robust_shapes(channels: int, vit_dim: int, embedding_size: int, num_mask_tokens: int) -> None:
    """Checks that RobustSAM's extra modules exist for these widths (ValueError otherwise).

    Args:
      channels: C, the decoder's transformer width (``prompt_embed_dim``).
      vit_dim: D, the ViT width.
      embedding_size: E, side of the embedding grid.
      num_mask_tokens: K.

    The channel attentions squeeze 2 x width channels by 16 (width C / 8 at
    least 8), the selectors pool E x E maps to 4 x 4 cells (E a multiple of 4),
    and the token block splits C into K rows.
    """
    smallest = min(channels // 8, vit_dim, channels)
    if channels % 8 or 2 * smallest < SQUEEZE_RATIO:
        raise ValueError(f"RobustSAM's channel attention needs prompt_embed_dim a multiple of 8 "
                         f"and 2 x {smallest} >= {SQUEEZE_RATIO} channels "
                         f"(prompt_embed_dim {channels}, vit_dim {vit_dim})")
    if embedding_size % SELECTOR_CELLS:
        raise ValueError(f"RobustSAM's selectors pool to {SELECTOR_CELLS} x {SELECTOR_CELLS} cells: "
                         f"embedding_size {embedding_size} must be a multiple of {SELECTOR_CELLS}")
    if channels % num_mask_tokens:
        raise ValueError(f"RobustSAM's token block splits prompt_embed_dim {channels} into "
                         f"{num_mask_tokens} rows; it must be a multiple")


__all__ = ["DECODER_PATHS", "DECODER_PATH_CLEAR", "DECODER_PATH_ROBUST", "MaskDecoderConfig",
           "RobustSamConfig", "SELECTOR_CELLS", "SQUEEZE_RATIO", "check_robust_shapes"]
