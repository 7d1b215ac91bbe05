"""Static configuration of SAM 3's interactive image model (the SAM-1 task path).

SAM 3 (facebookresearch/sam3, docs/models/sam3.md) answers clicks and boxes
with ``Sam3Image.predict_inst``: the image goes through the detector's ViT
backbone (`Sam3VitConfig`: patch 14 at 1008 px, windowed and global attention
with 2-D RoPE, a tiled absolute position table) and the "SAM 2 neck" of
``Sam3DualViTDetNeck`` (``sam2_convs``: transposed convolutions to strides
3.5 and 7, 1x1 and 3x3 convolutions); the tracker's SAM 2 prompt encoder and
mask decoder (``Sam3TrackerBase._build_sam_heads``) decode the prompts.
`Sam3Config` fixes every shape of that path; it round-trips through JSON
(`Sam3Config.to_dict` / `Sam3Config.from_dict`) for converted-model
directories.

Fixed structure (as in the official builder): the neck makes four levels
(scales 4, 2, 1 and 0.5 of the ViT grid) and the lowest is dropped
(``scalp = 1``), so the decoder sees the grid at 4x, 2x and 1x.
"""

from __future__ import annotations

import dataclasses

from jaxseg_robust.models.config_json import dataclass_from_dict
from jaxseg_robust.models.sam.config import MaskDecoderConfig, named_compute_dtype

# Sam3Processor's v2.Normalize on images scaled to [0, 1].
PIXEL_MEAN = (0.5, 0.5, 0.5)
PIXEL_STD = (0.5, 0.5, 0.5)
NECK_SCALES = (4.0, 2.0, 1.0)  # the sam2_convs levels kept (0.5 is dropped by scalp = 1)


@dataclasses.dataclass(frozen=True)
class Sam3VitConfig:
    """SAM 3's ViT trunk (``sam3.model.vitdet.ViT`` as ``_create_vit_backbone`` builds it).

    Attributes:
      img_size: side of the square input (1008).
      patch_size: patch side (14; no bias in the patch projection).
      embed_dim, depth, num_heads: width, blocks and heads (1024, 32, 16).
      mlp_ratio: MLP hidden width / channels (4.625; hidden = int(dim * ratio)).
      window_size: window of the windowed blocks (24); also the RoPE table's
        pre-training size (``rope_pt_size`` = window), so global blocks'
        positions are scaled by window / grid (``use_interp_rope``).
      global_att_blocks: blocks with global attention; the last must be the
        last block (the trunk's output is taken there).
      pretrain_img_size: the absolute position table covers
        (pretrain_img_size / patch_size)^2 positions plus a class token (336 -> 24 x 24),
        tiled over the grid.
      rope_theta: RoPE base (10000).
      norm_eps: LayerNorm epsilon (1e-5; ``ln_pre`` and the blocks' norms).
    """

    img_size: int = 1008
    patch_size: int = 14
    embed_dim: int = 1024
    depth: int = 32
    num_heads: int = 16
    mlp_ratio: float = 4.625
    window_size: int = 24
    global_att_blocks: tuple[int, ...] = (7, 15, 23, 31)
    pretrain_img_size: int = 336
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5

    def __post_init__(self):
        if self.img_size % self.patch_size:
            raise ValueError(f"img_size {self.img_size} is not a multiple of patch_size {self.patch_size}")
        if self.pretrain_img_size % self.patch_size:
            raise ValueError(f"pretrain_img_size {self.pretrain_img_size} is not a multiple of "
                             f"patch_size {self.patch_size}")
        if self.embed_dim % self.num_heads or (self.embed_dim // self.num_heads) % 4:
            raise ValueError(f"the head width embed_dim / num_heads = {self.embed_dim} / "
                             f"{self.num_heads} must be a multiple of 4 (2-D RoPE)")
        if self.embed_dim % 4:
            raise ValueError(f"embed_dim {self.embed_dim} must be a multiple of 4 (the neck)")
        if not self.global_att_blocks or self.global_att_blocks[-1] != self.depth - 1:
            raise ValueError(f"the last global block must be the last block {self.depth - 1}; got "
                             f"global_att_blocks {self.global_att_blocks}")
        bad = [i for i in self.global_att_blocks if not 0 <= i < self.depth]
        if bad:
            raise ValueError(f"global_att_blocks {bad} outside [0, depth={self.depth})")
        if self.window_size < 1:
            raise ValueError(f"window_size must be >= 1; got {self.window_size}")

    @property
    def grid_size(self) -> int:
        """Side of the patch grid (img_size / patch_size; 72)."""
        return self.img_size // self.patch_size

    @property
    def pretrain_grid(self) -> int:
        """Side of the absolute position table (pretrain_img_size / patch_size; 24)."""
        return self.pretrain_img_size // self.patch_size

    @property
    def head_dim(self) -> int:
        """Channels per head."""
        return self.embed_dim // self.num_heads

    @property
    def mlp_hidden(self) -> int:
        """Hidden width of the blocks' MLP (int(embed_dim * mlp_ratio); 4736)."""
        return int(self.embed_dim * self.mlp_ratio)


@dataclasses.dataclass(frozen=True)
class Sam3Config:
    """Everything static about SAM 3's interactive image model.

    Attributes:
      encoder: the ViT trunk.
      family: model family stored with converted weights ("sam3").
      variant: "sam3" for the released model, "test" for the tiny one.
      d_model: neck channels = prompt embedding channels (256).
      mask_in_chans: hidden channels of the mask-input downscaling (16).
      decoder: the two-way transformer and heads (SAM's `MaskDecoderConfig`;
        the tracker's hard-coded 2 layers, 8 heads, MLP 2048, IoU head 256).
      use_high_res_features, pred_obj_scores, pred_obj_scores_mlp,
      iou_prediction_use_sigmoid, directly_add_no_mem_embed: SAM 2's decoder
        options, all on in ``Sam3TrackerBase`` (see `Sam2Config`).
      dynamic_multimask_via_stability, dynamic_multimask_stability_delta,
      dynamic_multimask_stability_thresh: ``build_tracker``'s
        ``sam_mask_decoder_extra_args`` (True, 0.05, 0.98).
      low_res_clamp: bound of the returned low-resolution logits (32).
      max_hole_area: ``SAM3InteractiveImagePredictor``'s hole filling before
        the upsampling: background components (8-connected, logits <= 0) of at
        most this many low-res pixels get logit 10 (256; 0 switches it off).
      pixel_mean, pixel_std: normalisation of the [0, 1]-scaled image (0.5, 0.5).
      compute_dtype: "float32" or "bfloat16" for the image encoder.
    """

    encoder: Sam3VitConfig
    family: str = "sam3"
    variant: str = ""
    d_model: int = 256
    mask_in_chans: int = 16
    decoder: MaskDecoderConfig = MaskDecoderConfig()
    use_high_res_features: bool = True
    pred_obj_scores: bool = True
    pred_obj_scores_mlp: bool = True
    iou_prediction_use_sigmoid: bool = True
    directly_add_no_mem_embed: bool = True
    dynamic_multimask_via_stability: bool = True
    dynamic_multimask_stability_delta: float = 0.05
    dynamic_multimask_stability_thresh: float = 0.98
    low_res_clamp: float = 32.0
    max_hole_area: float = 256.0
    pixel_mean: tuple[float, float, float] = PIXEL_MEAN
    pixel_std: tuple[float, float, float] = PIXEL_STD
    compute_dtype: str = "float32"

    def __post_init__(self):
        named_compute_dtype(self.compute_dtype)  # refuses an unknown name
        if self.d_model % 8:
            raise ValueError(f"d_model {self.d_model} must be a multiple of 8")
        if self.max_hole_area < 0:
            raise ValueError(f"max_hole_area must be >= 0; got {self.max_hole_area}")

    @property
    def image_size(self) -> int:
        """Side of the square model input (the ViT's img_size; 1008)."""
        return self.encoder.img_size

    @property
    def embedding_size(self) -> int:
        """Side of the image embedding grid (the ViT grid; 72 for 1008)."""
        return self.encoder.grid_size

    @property
    def prompt_embed_dim(self) -> int:
        """Channels of image embeddings and prompt tokens (= ``d_model``)."""
        return self.d_model

    @property
    def low_res_size(self) -> int:
        """Side of the decoder's low-resolution logits (4 x embedding_size; 288)."""
        return 4 * self.embedding_size

    @property
    def num_mask_tokens(self) -> int:
        """K = num_multimask_outputs + 1 candidates (candidate 0: the single-mask output)."""
        return self.decoder.num_multimask_outputs + 1

    @property
    def dtype(self):
        """The jnp dtype named by ``compute_dtype``."""
        return named_compute_dtype(self.compute_dtype)

    def to_dict(self) -> dict:
        """JSON-representable dict (tuples become lists when serialised)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "Sam3Config":
        """Inverse of `to_dict`."""
        data = dict(data)
        encoder = dataclass_from_dict(Sam3VitConfig, dict(data.pop("encoder", {})),
                                      what="SAM 3 ViT config")
        decoder = dataclass_from_dict(MaskDecoderConfig, dict(data.pop("decoder", {})),
                                      what="mask decoder config")
        return dataclass_from_dict(cls, {**data, "encoder": encoder, "decoder": decoder},
                                   what="SAM 3 config")


def with_compute_dtype(config: Sam3Config, compute_dtype: str) -> Sam3Config:
    """``config`` with the image encoder computing in ``compute_dtype``."""
    return dataclasses.replace(config, compute_dtype=compute_dtype)


# The released model (sam3.pt; model_builder._create_vit_backbone / build_tracker).
VIT_RELEASED = Sam3VitConfig()
OFFICIAL_CONFIG = Sam3Config(encoder=VIT_RELEASED, variant="sam3")
# A tiny random-weight SAM 3 (112 px input, 8 x 8 grid, 32 x 32 low-res logits) for fast tests.
# It keeps every code path of the released model and two it does not take: zero-padded windows
# (window 3 over the 8 x 8 grid) and a cropped tile of the position table (3 x 3 tiled 3 times,
# cut to 8). Windowed blocks use RoPE at scale 1, global blocks at 3 / 8. The decoder's shapes
# are the official hard-coded ones at 32 channels.
VIT_TEST = Sam3VitConfig(img_size=112, patch_size=14, embed_dim=32, depth=3, num_heads=2,
                         window_size=3, global_att_blocks=(1, 2), pretrain_img_size=42)
TEST_CONFIG = Sam3Config(encoder=VIT_TEST, variant="test", d_model=32)

__all__ = ["Sam3VitConfig", "Sam3Config", "with_compute_dtype", "OFFICIAL_CONFIG", "TEST_CONFIG",
           "VIT_RELEASED", "VIT_TEST", "PIXEL_MEAN", "PIXEL_STD", "NECK_SCALES"]
