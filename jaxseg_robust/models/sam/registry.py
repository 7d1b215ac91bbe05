"""Zoo registration of the SAM family and the official ViT-B/L/H configurations.

Registers the family "sam" (`SamSegmenter` + `SamPredictor`; any registered
image-encoder kind, so MobileSAM's TinyViT config can use it) and the names
``sam_vit_b``, ``sam_vit_l``, ``sam_vit_h``, plus ``sam_tiny`` (a tiny
random-weight model for fast tests; ``zoo.init("sam_tiny", key)``). Other SAM-family helpers add
their names with `jaxseg_robust.models.zoo.register_model` (family "sam" for
a new encoder kind; their own family for a different decoder, e.g. SAM-HQ).
"""

from __future__ import annotations

import dataclasses

from jaxseg_robust.models import zoo
from jaxseg_robust.models.sam.config import MaskDecoderConfig, SamConfig
from jaxseg_robust.models.sam.image_encoder import VIT_B, VIT_H, VIT_L, ViTConfig
from jaxseg_robust.models.sam.predictor import SamPredictor
from jaxseg_robust.models.sam.segmenter import SamSegmenter

SAM_CONFIGS = {
    "vit_b": SamConfig(encoder=VIT_B, variant="vit_b"),
    "vit_l": SamConfig(encoder=VIT_L, variant="vit_l"),
    "vit_h": SamConfig(encoder=VIT_H, variant="vit_h"),
}
# A tiny random-weight SAM (128 px input, 8x8 embedding, 32x32 low-res logits) for fast
# tests of code built on the Segmenter protocol. No official weights exist for it.
TINY_CONFIG = SamConfig(
    encoder=ViTConfig(img_size=128, patch_size=16, embed_dim=32, depth=2, num_heads=2,
                      out_chans=32, window_size=3, global_attn_indexes=(1,)),
    variant="tiny", image_size=128, embedding_size=8, prompt_embed_dim=32, mask_in_chans=8,
    decoder=MaskDecoderConfig(transformer_mlp_dim=64, transformer_num_heads=2,
                              iou_head_hidden_dim=32),
)
OFFICIAL_CHECKPOINTS = {
    "vit_b": "sam_vit_b_01ec64.pth",
    "vit_l": "sam_vit_l_0b3195.pth",
    "vit_h": "sam_vit_h_4b8939.pth",
}


def with_compute_dtype(config: SamConfig, compute_dtype: str) -> SamConfig:
    """``config`` with the image encoder computing in ``compute_dtype``."""
    return dataclasses.replace(config, compute_dtype=compute_dtype)


def make_predictor(segmenter: SamSegmenter, params, name: str) -> SamPredictor:
    """The zoo's predictor: the reference's uint8 PIL image path."""
    return SamPredictor(dataclasses.replace(segmenter, image_resize="pil"), params, name)


zoo.register_family(zoo.FamilySpec(
    name="sam",
    config_from_dict=SamConfig.from_dict,
    with_compute_dtype=with_compute_dtype,
    segmenter=SamSegmenter,
    predictor=make_predictor,
))
for _variant, _config in SAM_CONFIGS.items():
    zoo.register_model(f"sam_{_variant}", "sam", _config,
                       checkpoint_hint=OFFICIAL_CHECKPOINTS[_variant],
                       description=f"Segment Anything, {_variant.replace('_', '-').upper()} encoder")
zoo.register_model("sam_tiny", "sam", TINY_CONFIG,
                   checkpoint_hint="<none: random-weight test model, use zoo.init>",
                   description="tiny random-weight SAM for tests (128 px input)")
