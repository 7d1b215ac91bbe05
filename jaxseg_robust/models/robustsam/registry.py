"""Zoo registration of RobustSAM (family "robustsam"; docs/models/robustsam.md).

Names:
  * ``robustsam_vit_b``, ``robustsam_vit_l``, ``robustsam_vit_h``: the official
    checkpoints ``robustsam_checkpoint_{b,l,h}.pth`` converted by
    ``python -m ports robustsam``, on the decoder path the BREPS wrapper uses
    (``SamPredictor.predict_torch``'s default, "clear");
  * ``robustsam_tiny``: a tiny random-weight model for tests (no official
    weights; use ``zoo.init``), on the "robust" path so that tests run
    RobustSAM's own modules through the protocols.
"""

from __future__ import annotations

import dataclasses

from jaxseg_robust.models import zoo
from jaxseg_robust.models.robustsam.config import (DECODER_PATH_CLEAR, DECODER_PATH_ROBUST,
                                                   RobustSamConfig)
from jaxseg_robust.models.robustsam.segmenter import RobustSamSegmenter
from jaxseg_robust.models.sam.config import MaskDecoderConfig
from jaxseg_robust.models.sam.image_encoder import VIT_B, VIT_H, VIT_L, ViTConfig
from jaxseg_robust.models.sam.registry import make_predictor, with_compute_dtype

FAMILY = "robustsam"
ROBUSTSAM_CONFIGS = {
    "vit_b": RobustSamConfig(encoder=VIT_B, variant="vit_b", decoder_path=DECODER_PATH_CLEAR),
    "vit_l": RobustSamConfig(encoder=VIT_L, variant="vit_l", decoder_path=DECODER_PATH_CLEAR),
    "vit_h": RobustSamConfig(encoder=VIT_H, variant="vit_h", decoder_path=DECODER_PATH_CLEAR),
}
OFFICIAL_CHECKPOINTS = {"vit_b": "robustsam_checkpoint_b.pth", "vit_l": "robustsam_checkpoint_l.pth",
                        "vit_h": "robustsam_checkpoint_h.pth"}
# A tiny random-weight RobustSAM (128 px input, 8 x 8 embedding, 32 x 32 low-res logits). The
# decoder is 64 wide (SAM's tiny test model: 32) so that every channel attention keeps a hidden
# unit (2 x 64 / 8 >= 16, config.check_robust_shapes).
TINY_CONFIG = RobustSamConfig(
    encoder=ViTConfig(img_size=128, patch_size=16, embed_dim=32, depth=2, num_heads=2,
                      out_chans=64, window_size=3, global_attn_indexes=(1,)),
    variant="tiny", image_size=128, embedding_size=8, prompt_embed_dim=64, mask_in_chans=8,
    decoder=MaskDecoderConfig(transformer_mlp_dim=64, transformer_num_heads=2,
                              iou_head_hidden_dim=32),
    decoder_path=DECODER_PATH_ROBUST,
)


def with_decoder_path(config: RobustSamConfig, decoder_path: str) -> RobustSamConfig:
    """``config`` on another decoder path ("clear" or "robust")."""
    return dataclasses.replace(config, decoder_path=decoder_path)


zoo.register_family(zoo.FamilySpec(
    name=FAMILY,
    config_from_dict=RobustSamConfig.from_dict,
    with_compute_dtype=with_compute_dtype,
    segmenter=RobustSamSegmenter,
    predictor=make_predictor,
))
for _variant, _config in ROBUSTSAM_CONFIGS.items():
    zoo.register_model(f"robustsam_{_variant}", FAMILY, _config,
                       checkpoint_hint=OFFICIAL_CHECKPOINTS[_variant],
                       description=f"RobustSAM, {_variant.replace('_', '-').upper()} encoder "
                                   f"(SAM's output tokens, as the BREPS wrapper)")
zoo.register_model("robustsam_tiny", FAMILY, TINY_CONFIG,
                   checkpoint_hint="<none: random-weight test model, use zoo.init>",
                   description="tiny random-weight RobustSAM (robust output tokens) for tests "
                               "(128 px input)")

__all__ = ["FAMILY", "OFFICIAL_CHECKPOINTS", "ROBUSTSAM_CONFIGS", "TINY_CONFIG", "with_decoder_path"]
