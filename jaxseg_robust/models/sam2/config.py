"""Static configuration of SAM 2 / SAM 2.1 image models (Hiera trunk, FPN neck, SAM heads).

A `Sam2Config` fixes every shape of the single-image path of the official
``SAM2ImagePredictor`` (see docs/models/sam2.md): the Hiera trunk
(`HieraConfig`), the FPN neck, the prompt encoder and the mask decoder with
SAM 2's options. Configs are frozen dataclasses (hashable, so a segmenter
holding one can be closed over by ``jit``) and round-trip through JSON
(`Sam2Config.to_dict` / `Sam2Config.from_dict`) for converted-model
directories.

Fixed structure (as in every official configuration): four Hiera stages with
a 2x2 query pooling at each of the three stage changes, a stride-4 patch
embedding, an FPN whose lowest-resolution level is dropped after it fed the
top-down path (``scalp = 1``), so the decoder sees three levels at strides
4, 8 and 16 of the input.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from jaxseg_robust.models.config_json import dataclass_from_dict
from jaxseg_robust.models.sam.config import COMPUTE_DTYPES, MaskDecoderConfig, named_compute_dtype

# torchvision ``Normalize`` of SAM2Transforms, on images scaled to [0, 1] (ImageNet statistics).
PIXEL_MEAN = (0.485, 0.456, 0.406)
PIXEL_STD = (0.229, 0.224, 0.225)
VERSIONS = ("2", "2.1")
PATCH_STRIDE = 4  # Hiera's PatchEmbed: conv 7x7, stride 4, padding 3
PATCH_KERNEL = 7
PATCH_PADDING = 3
NUM_STAGES = 4


@dataclasses.dataclass(frozen=True)
class HieraBlockSpec:
    """One Hiera block as the official constructor lays it out (derived, not stored).

    Attributes:
      dim, dim_out: input and output channels (they differ at stage changes).
      num_heads: attention heads (of ``dim_out``).
      window_size: attention window (0 = global attention over the whole map).
      q_pool: whether the block pools its queries (and shortcut) 2x2.
    """

    dim: int
    dim_out: int
    num_heads: int
    window_size: int
    q_pool: bool


@dataclasses.dataclass(frozen=True)
class HieraConfig:
    """The Hiera trunk (``sam2.modeling.backbones.hieradet.Hiera``); defaults: base+.

    Attributes:
      embed_dim: channels of stage 1 (doubled at every stage change, ``dim_mul`` 2).
      num_heads: heads of stage 1 (doubled at every stage change, ``head_mul`` 2).
      stages: blocks per stage (4 stages).
      global_att_blocks: indices of blocks with global attention.
      window_pos_embed_bkg_spatial_size: (h, w) of the background position
        embedding, bicubically resized to the stage-1 grid.
      window_spec: window size per stage (the first block of a stage uses the
        previous stage's size, as the official constructor does).
      mlp_ratio: MLP hidden width / channels.
    """

    embed_dim: int = 112
    num_heads: int = 2
    stages: tuple[int, ...] = (2, 3, 16, 3)
    global_att_blocks: tuple[int, ...] = (12, 16, 20)
    window_pos_embed_bkg_spatial_size: tuple[int, int] = (14, 14)
    window_spec: tuple[int, ...] = (8, 4, 14, 7)
    mlp_ratio: float = 4.0

    def __post_init__(self):
        if len(self.stages) != NUM_STAGES or len(self.window_spec) != NUM_STAGES:
            raise ValueError(f"Hiera needs {NUM_STAGES} stages and window sizes; got stages "
                             f"{self.stages}, window_spec {self.window_spec}")
        if min(self.stages) < 1:
            raise ValueError(f"every Hiera stage needs a block; got stages {self.stages}")
        bad = [i for i in self.global_att_blocks if not 0 <= i < self.depth]
        if bad:
            raise ValueError(f"global_att_blocks {bad} outside [0, depth={self.depth})")
        for i, spec in enumerate(self.blocks()):
            if spec.dim_out % spec.num_heads:
                raise ValueError(f"Hiera block {i}: {spec.dim_out} channels are not divisible "
                                 f"by {spec.num_heads} heads")
            if spec.q_pool and (spec.window_size == 0 or spec.window_size % 2):
                raise ValueError(f"Hiera block {i} pools its queries, so its window must be even "
                                 f"and non-global; got window {spec.window_size}")

    @property
    def depth(self) -> int:
        """Total number of blocks."""
        return sum(self.stages)

    @property
    def stage_ends(self) -> tuple[int, ...]:
        """Index of the last block of each stage."""
        return tuple(sum(self.stages[:i + 1]) - 1 for i in range(NUM_STAGES))

    def blocks(self) -> tuple[HieraBlockSpec, ...]:
        """Every block's shape, exactly as ``Hiera.__init__`` builds them."""
        ends = self.stage_ends
        q_pool_blocks = {e + 1 for e in ends[:-1]}
        dim, heads, stage, out = self.embed_dim, self.num_heads, 1, []
        for i in range(self.depth):
            dim_out = dim
            window = self.window_spec[stage - 1]  # lags by a block at stage changes
            if i in self.global_att_blocks:
                window = 0
            if i - 1 in ends:
                dim_out, heads, stage = dim * 2, heads * 2, stage + 1
            out.append(HieraBlockSpec(dim, dim_out, heads, window, i in q_pool_blocks))
            dim = dim_out
        return tuple(out)

    @property
    def channel_list(self) -> tuple[int, ...]:
        """Channels of the stage outputs, lowest resolution first (the neck's order)."""
        specs = self.blocks()
        return tuple(specs[e].dim_out for e in self.stage_ends[::-1])


@dataclasses.dataclass(frozen=True)
class Sam2Config:
    """Everything static about a SAM 2 image model.

    Attributes:
      encoder: the Hiera trunk.
      family: model family stored with converted weights ("sam2").
      variant: "hiera_tiny", "hiera_small", "hiera_base_plus", "hiera_large", ...
      version: "2" or "2.1" (same image-path architecture, different weights).
      image_size: side of the square model input (1024).
      d_model: FPN channels = prompt embedding channels (256).
      fpn_top_down_levels: FPN levels that receive the top-down path
        (official: (2, 3); nearest-neighbour 2x upsampling, sum fusion).
      mask_in_chans: hidden channels of the mask-input downscaling (16).
      decoder: the two-way transformer and heads (SAM's `MaskDecoderConfig`).
      use_high_res_features: the decoder adds ``conv_s0``/``conv_s1``
        projections of the stride-4/8 features in its upscaling.
      pred_obj_scores: an object-score token takes part in attention.
      pred_obj_scores_mlp: the object-score head is a 3-layer MLP (else Linear).
      iou_prediction_use_sigmoid: sigmoid on the IoU head.
      directly_add_no_mem_embed: ``no_mem_embed`` is added to the stride-16
        features (as the image predictor does).
      dynamic_multimask_via_stability: single-mask output falls back to the
        best multimask candidate when unstable (build_sam2's default).
      dynamic_multimask_stability_delta, dynamic_multimask_stability_thresh:
        the stability score's logit margin and threshold (0.05, 0.98).
      low_res_clamp: bound of the returned low-resolution logits (32).
      pixel_mean, pixel_std: normalisation of the [0, 1]-scaled image.
      compute_dtype: "float32" or "bfloat16" for the image encoder.
    """

    encoder: HieraConfig
    family: str = "sam2"
    variant: str = ""
    version: str = "2.1"
    image_size: int = 1024
    d_model: int = 256
    fpn_top_down_levels: tuple[int, ...] = (2, 3)
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
    pixel_mean: tuple[float, float, float] = PIXEL_MEAN
    pixel_std: tuple[float, float, float] = PIXEL_STD
    compute_dtype: str = "float32"

    def __post_init__(self):
        named_compute_dtype(self.compute_dtype)  # refuses an unknown name
        if self.version not in VERSIONS:
            raise ValueError(f"version must be one of {VERSIONS}; got {self.version!r}")
        stride = PATCH_STRIDE * 2 ** (NUM_STAGES - 1)
        if self.image_size % stride:
            raise ValueError(f"image_size {self.image_size} must be a multiple of {stride}")
        grid = self.image_size // PATCH_STRIDE
        window0 = self.encoder.window_spec[0]
        if grid % window0:
            raise ValueError(f"the stage-1 grid {grid} must be a multiple of the first window "
                             f"{window0} (the window position embedding is tiled over it)")
        bad = [lv for lv in self.fpn_top_down_levels if not 0 <= lv < NUM_STAGES]
        if bad:
            raise ValueError(f"fpn_top_down_levels {bad} outside [0, {NUM_STAGES})")
        if self.d_model % 8:
            raise ValueError(f"d_model {self.d_model} must be a multiple of 8")

    @property
    def embedding_size(self) -> int:
        """Side of the image embedding grid (stride 16: 64 for 1024)."""
        return self.image_size // 16

    @property
    def prompt_embed_dim(self) -> int:
        """Channels of image embeddings and prompt tokens (= ``d_model``)."""
        return self.d_model

    @property
    def low_res_size(self) -> int:
        """Side of the decoder's low-resolution logits (4 x embedding_size; 256)."""
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
    def from_dict(cls, data: dict) -> "Sam2Config":
        """Inverse of `to_dict`."""
        data = dict(data)
        encoder = dataclass_from_dict(HieraConfig, dict(data.pop("encoder", {})),
                                      what="Hiera config")
        decoder = dataclass_from_dict(MaskDecoderConfig, dict(data.pop("decoder", {})),
                                      what="mask decoder config")
        return dataclass_from_dict(cls, {**data, "encoder": encoder, "decoder": decoder},
                                   what="SAM 2 config")


@dataclasses.dataclass(frozen=True)
class Sam2HQConfig(Sam2Config):
    """An HQ-SAM 2 image model: `Sam2Config` with HQ-SAM 2's decoder (family "sam2_hq").

    The HQ mask decoder (``mask_hq_decoder.MaskDecoderHQ`` of SysCV/sam-hq,
    docs/models/sam_hq2.md) adds an HQ output token, its MLP and a mask-feature
    block; every HQ shape follows from ``d_model``, so no field is added.
    """

    family: str = "sam2_hq"


def with_compute_dtype(config: Sam2Config, compute_dtype: str) -> Sam2Config:
    """``config`` with the image encoder computing in ``compute_dtype``."""
    return dataclasses.replace(config, compute_dtype=compute_dtype)


# The four official trunks (sam2/configs/sam2{,.1}/sam2*_hiera_{t,s,b+,l}.yaml; 2 and 2.1
# share them).
HIERA_TINY = HieraConfig(embed_dim=96, num_heads=1, stages=(1, 2, 7, 2),
                         global_att_blocks=(5, 7, 9), window_pos_embed_bkg_spatial_size=(7, 7))
HIERA_SMALL = HieraConfig(embed_dim=96, num_heads=1, stages=(1, 2, 11, 2),
                          global_att_blocks=(7, 10, 13), window_pos_embed_bkg_spatial_size=(7, 7))
HIERA_BASE_PLUS = HieraConfig()
HIERA_LARGE = HieraConfig(embed_dim=144, num_heads=2, stages=(2, 6, 36, 4),
                          global_att_blocks=(23, 33, 43), window_pos_embed_bkg_spatial_size=(7, 7),
                          window_spec=(8, 4, 16, 8))
TRUNKS: dict[str, HieraConfig] = {
    "hiera_tiny": HIERA_TINY, "hiera_small": HIERA_SMALL,
    "hiera_base_plus": HIERA_BASE_PLUS, "hiera_large": HIERA_LARGE,
}
# A tiny random-weight SAM 2 (128 px input, 8x8 embedding, 32x32 low-res logits) for fast
# tests. It keeps every code path of the official models: zero-padded windows (stage 3:
# 8 -> 12, stage 4: 4 -> 6), query pooling inside padded windows (block 5), a global block, the
# bicubic background embedding (3x3 -> 32x32). The decoder's shapes are the official
# hard-coded ones (SAM2Base._build_sam_heads) at 32 channels.
HIERA_TEST = HieraConfig(embed_dim=8, num_heads=1, stages=(1, 1, 3, 2), global_att_blocks=(4,),
                         window_pos_embed_bkg_spatial_size=(3, 3), window_spec=(4, 2, 6, 3))


def official_config(variant: str, version: str) -> Sam2Config:
    """The `Sam2Config` of an official checkpoint (``variant`` a key of `TRUNKS`)."""
    if variant not in TRUNKS:
        raise ValueError(f"unknown SAM 2 variant {variant!r}; known: {sorted(TRUNKS)}")
    return Sam2Config(encoder=TRUNKS[variant], variant=variant, version=version)


TEST_CONFIG = Sam2Config(encoder=HIERA_TEST, variant="test", image_size=128, d_model=32)
# HQ-SAM 2 was released as SAM 2.1 Hiera-L only (sam2.1_hq_hiera_large.pt).
HQ_VARIANTS = ("hiera_large",)
# The tiny test model with HQ-SAM 2's decoder.
HQ_TEST_CONFIG = Sam2HQConfig(encoder=HIERA_TEST, variant="test", image_size=128, d_model=32)


def official_hq_config(variant: str = "hiera_large") -> Sam2HQConfig:
    """The `Sam2HQConfig` of an HQ-SAM 2 checkpoint (SAM 2.1 trunk ``variant``)."""
    base = official_config(variant, "2.1")
    return Sam2HQConfig(**{f.name: getattr(base, f.name)
                           for f in dataclasses.fields(Sam2Config) if f.name != "family"})

__all__ = ["HieraBlockSpec", "HieraConfig", "Sam2Config", "Sam2HQConfig", "with_compute_dtype",
           "official_config", "official_hq_config", "HQ_TEST_CONFIG", "HQ_VARIANTS",
           "TRUNKS", "TEST_CONFIG", "HIERA_TEST", "COMPUTE_DTYPES", "PIXEL_MEAN", "PIXEL_STD",
           "VERSIONS"]
