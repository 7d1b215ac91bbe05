"""Zoo registration of the SAM family: SAM, MobileSAM and SAM-HQ.

Families and names:
  * "sam" (`SamSegmenter` + `SamPredictor`, any registered image-encoder
    kind): ``sam_vit_b``, ``sam_vit_l``, ``sam_vit_h``; ``mobile_sam``
    (MobileSAM: TinyViT encoder, SAM's prompt encoder and decoder with
    ``build_sam_vit_t``'s settings, which are SAM's defaults; converted by
    ``python -m ports mobile_sam``);
  * "sam_hq" (`SamHQSegmenter` + `SamHQPredictor`): ``sam_hq_vit_b``,
    ``sam_hq_vit_l``, ``sam_hq_vit_h``, ``sam_hq_vit_tiny`` (SAM-HQ's
    TinyViT variant, ``build_sam_vit_t`` of ``segment_anything_hq``);
  * ``sam_demo`` (`zoo.DEFAULT_MODEL`): the embedded demonstration model
    (`jaxseg_robust.models.sam.demo`), trained on synthetic shapes by
    ``experiments/train_default_model.py``; weights ship as package data;
  * tiny random-weight models for fast tests (no official weights; use
    ``zoo.init(name, key)``): ``sam_tiny``, ``mobile_sam_tiny``, ``sam_hq_tiny``.
Other SAM-family helpers add their names with
`jaxseg_robust.models.zoo.register_model`.
"""

from __future__ import annotations

import dataclasses

from jaxseg_robust.models import zoo
from jaxseg_robust.models.sam.config import MaskDecoderConfig, SamConfig, SamHQConfig
from jaxseg_robust.models.sam.demo import DEMO_CONFIG, DEMO_MODEL_NAME
from jaxseg_robust.models.sam.hq_segmenter import SamHQSegmenter
from jaxseg_robust.models.sam.image_encoder import VIT_B, VIT_H, VIT_L, ViTConfig
from jaxseg_robust.models.sam.predictor import SamHQPredictor, SamPredictor
from jaxseg_robust.models.sam.segmenter import SamSegmenter
from jaxseg_robust.models.sam.tiny_vit import TinyViTConfig

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
# MobileSAM (``mobile_sam.build_sam_vit_t``): TinyViT defaults, SAM's prompt encoder
# (256 channels, 64x64 grid, 1024 input, mask_in_chans 16) and decoder (depth 2, MLP
# 2048, 8 heads, 3 multimask outputs, IoU head 3 x 256): all SamConfig defaults.
MOBILE_SAM_CONFIG = SamConfig(encoder=TinyViTConfig(), encoder_kind="tiny_vit",
                              variant="mobile_sam")
# A tiny random-weight MobileSAM (TinyViT with every code path of MobileSAM's: MBConv
# stage, padded windows, stride-2 and stride-1 merges; 128 px -> 8x8 embedding).
TINY_TINY_VIT = TinyViTConfig(embed_dims=(8, 16, 24, 32), depths=(1, 1, 1, 1),
                              num_heads=(1, 2, 2, 2), window_sizes=(1, 3, 5, 3),
                              merge_strides=(2, 2, 1), out_chans=32)
MOBILE_SAM_TINY_CONFIG = dataclasses.replace(TINY_CONFIG, encoder=TINY_TINY_VIT,
                                             encoder_kind="tiny_vit", variant="mobile_sam_tiny")

# SAM-HQ (``segment_anything_hq.build_sam``): SAM's configurations with the HQ decoder
# (vit_dim = the encoder width; TinyViT: 160, stage 1's output).
SAM_HQ_CONFIGS = {
    "vit_b": SamHQConfig(encoder=VIT_B, variant="vit_b"),
    "vit_l": SamHQConfig(encoder=VIT_L, variant="vit_l"),
    "vit_h": SamHQConfig(encoder=VIT_H, variant="vit_h"),
    "vit_tiny": SamHQConfig(encoder=TinyViTConfig(), encoder_kind="tiny_vit", variant="vit_tiny"),
}
SAM_HQ_TINY_CONFIG = SamHQConfig(**{f.name: getattr(TINY_CONFIG, f.name)
                                    for f in dataclasses.fields(SamConfig) if f.name != "family"})

OFFICIAL_CHECKPOINTS = {
    "vit_b": "sam_vit_b_01ec64.pth",
    "vit_l": "sam_vit_l_0b3195.pth",
    "vit_h": "sam_vit_h_4b8939.pth",
}


def with_compute_dtype(config: SamConfig, compute_dtype: str) -> SamConfig:
    """``config`` with the image encoder computing in ``compute_dtype``."""
    return dataclasses.replace(config, compute_dtype=compute_dtype)


HQ_OFFICIAL_CHECKPOINTS = {v: f"sam_hq_{v}.pth" for v in SAM_HQ_CONFIGS}


def make_predictor(segmenter: SamSegmenter, params, name: str) -> SamPredictor:
    """The zoo's predictor: the reference's uint8 PIL image path."""
    return SamPredictor(dataclasses.replace(segmenter, image_resize="pil"), params, name)


def make_hq_predictor(segmenter: SamHQSegmenter, params, name: str) -> SamHQPredictor:
    """The zoo's SAM-HQ predictor: the reference's uint8 PIL image path."""
    return SamHQPredictor(dataclasses.replace(segmenter, image_resize="pil"), params, name)


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
zoo.register_model("mobile_sam", "sam", MOBILE_SAM_CONFIG, checkpoint_hint="mobile_sam.pt",
                   description="MobileSAM: TinyViT encoder with SAM's prompt encoder and decoder",
                   port_command="python -m ports mobile_sam --checkpoint {checkpoint} --out {out}")
zoo.register_model("mobile_sam_tiny", "sam", MOBILE_SAM_TINY_CONFIG,
                   checkpoint_hint="<none: random-weight test model, use zoo.init>",
                   description="tiny random-weight MobileSAM (TinyViT) for tests (128 px input)")

zoo.register_family(zoo.FamilySpec(
    name="sam_hq",
    config_from_dict=SamHQConfig.from_dict,
    with_compute_dtype=with_compute_dtype,
    segmenter=SamHQSegmenter,
    predictor=make_hq_predictor,
))
for _variant, _config in SAM_HQ_CONFIGS.items():
    _encoder = "TinyViT" if _variant == "vit_tiny" else _variant.replace("_", "-").upper()
    zoo.register_model(f"sam_hq_{_variant}", "sam_hq", _config,
                       checkpoint_hint=HQ_OFFICIAL_CHECKPOINTS[_variant],
                       description=f"SAM-HQ (HQ output token and features), {_encoder} encoder")
zoo.register_model("sam_hq_tiny", "sam_hq", SAM_HQ_TINY_CONFIG,
                   checkpoint_hint="<none: random-weight test model, use zoo.init>",
                   description="tiny random-weight SAM-HQ (ViT) for tests (128 px input)")
zoo.register_model(DEMO_MODEL_NAME, "sam", DEMO_CONFIG,
                   checkpoint_hint="<shipped as package data: jaxseg_robust/models/weights/sam_demo; "
                                   "retrain with experiments/train_default_model.py>",
                   description="demonstration SAM (ViT 96x4, 256 px input) trained on synthetic shapes; "
                               "not for real evaluations")
