"""Static configuration of AdaptiveClick's click-map models (docs/models/adaptiveclick.md).

`AdaptiveClickConfig` holds what the authors' ``AdaptiveClickModel(cfg)``
reads from its config (``configs/adaptiveclick_plainvit_base448.yaml`` of
lab206/AdaptiveClick and the ``models/iter_mask/adaptiveclick_*448_*`` scripts):
SimpleClick's plain ViT and SimpleFPN (``MODEL.BACKBONE``,
``MODEL.SIMPLE_FEATURE_PYRAMID``), the deformable-attention pixel decoder
(``MODEL.SEM_SEG_HEAD``) and the click-aware mask-adaptive decoder
(``MODEL.MASK_FORMER``). `vit` is the SimpleClick config the backbone and neck
are built from (`jaxseg_robust.models.simpleclick`).
"""

from __future__ import annotations

import dataclasses
import math

from jaxseg_robust.models.config_json import config_to_dict, dataclass_from_dict
from jaxseg_robust.models.simpleclick.config import SimpleClickConfig

FAMILY = "adaptiveclick"
GROUPNORM_GROUPS = 32  # the pixel decoder's GroupNorm(32, conv_dim)
FEATURE_STRIDES = (4, 8, 16, 32)  # res2..res5 of the SimpleFPN neck


@dataclasses.dataclass(frozen=True)
class AdaptiveClickConfig:
    """An AdaptiveClick model (ViT backbone, SimpleFPN, MSDeformAttn pixel decoder, masked decoder).

    Attributes:
      patch_size, embed_dim, depth, num_heads, mlp_ratio: the ViT (``MODEL.BACKBONE``).
      train_size: (h, w) the checkpoint was trained at (``crop_size``: its position-embedding grid).
      neck_out_dims: SimpleFPN widths at strides 4, 8, 16, 32 (``SIMPLE_FEATURE_PYRAMID.OUT_DIMS``).
      conv_dim: the pixel decoder's width (``SEM_SEG_HEAD.CONVS_DIM``); also the decoder's input width.
      mask_dim: width of the mask features (``SEM_SEG_HEAD.MASK_DIM``).
      encoder_layers: deformable encoder layers (``SEM_SEG_HEAD.TRANSFORMER_ENC_LAYERS``).
      encoder_ffn_dim: their FFN width (the authors pass ``MASK_FORMER.DIM_FEEDFORWARD // 2``).
      encoder_points: sampling points per head and level of MSDeformAttn (4).
      hidden_dim: the decoder's width (``MASK_FORMER.HIDDEN_DIM``).
      num_queries: learnable queries (``MASK_FORMER.NUM_OBJECT_QUERIES``).
      num_heads_decoder: attention heads of the encoder and the decoder (``MASK_FORMER.NHEADS``).
      decoder_ffn_dim: the decoder's FFN width (``MASK_FORMER.DIM_FEEDFORWARD``).
      decoder_layers: masked-attention layers (``MASK_FORMER.DEC_LAYERS - 1``).
      num_classes: classes of the class head (1; the head has ``num_classes + 1`` outputs).
      norm_radius: click disk radius in input pixels.
      with_prev_mask: the click embedding has a previous-mask channel.
      variant: a label ("vit_b", "tiny").
      dtype: compute dtype ("float32" or "bfloat16").
    """

    patch_size: int = 16
    embed_dim: int = 768
    depth: int = 12
    num_heads: int = 12
    mlp_ratio: float = 4.0
    train_size: tuple[int, int] = (448, 448)
    neck_out_dims: tuple[int, int, int, int] = (256, 512, 1024, 2048)
    conv_dim: int = 256
    mask_dim: int = 256
    encoder_layers: int = 4
    encoder_ffn_dim: int = 1024
    encoder_points: int = 4
    hidden_dim: int = 256
    num_queries: int = 10
    num_heads_decoder: int = 8
    decoder_ffn_dim: int = 2048
    decoder_layers: int = 9
    num_classes: int = 1
    norm_radius: float = 5.0
    with_prev_mask: bool = True
    variant: str = "vit_b"
    dtype: str = "float32"
    family: str = dataclasses.field(default=FAMILY, init=False)

    def __post_init__(self):
        object.__setattr__(self, "train_size", tuple(int(v) for v in self.train_size))
        object.__setattr__(self, "neck_out_dims", tuple(int(v) for v in self.neck_out_dims))
        if self.conv_dim != self.hidden_dim or self.mask_dim != self.hidden_dim:
            raise ValueError(f"AdaptiveClick ({self.variant}): conv_dim {self.conv_dim}, mask_dim {self.mask_dim} and "
                             f"hidden_dim {self.hidden_dim} must be equal (the decoder has no input projection)")
        if self.conv_dim % GROUPNORM_GROUPS:
            raise ValueError(f"AdaptiveClick ({self.variant}): conv_dim {self.conv_dim} must be a multiple of "
                             f"{GROUPNORM_GROUPS} (GroupNorm(32, conv_dim))")
        if self.hidden_dim % self.num_heads_decoder:
            raise ValueError(f"AdaptiveClick ({self.variant}): hidden_dim {self.hidden_dim} is not divisible by "
                             f"{self.num_heads_decoder} heads")
        _ = self.vit  # building the backbone's SimpleClickConfig checks its depth (a multiple of 4)

    @property
    def vit(self) -> SimpleClickConfig:
        """The SimpleClick config of the backbone and the neck (its head fields unused)."""
        return SimpleClickConfig(patch_size=self.patch_size, embed_dim=self.embed_dim, depth=self.depth,
                                 num_heads=self.num_heads, mlp_ratio=self.mlp_ratio, train_size=self.train_size,
                                 neck_out_dims=self.neck_out_dims, norm_radius=self.norm_radius,
                                 with_prev_mask=self.with_prev_mask, variant=self.variant, dtype=self.dtype)

    @property
    def predictor_family(self) -> str:
        """The family whose authors' predictor runs these weights ("adaptiveclick")."""
        return FAMILY

    @property
    def coord_channels(self) -> int:
        """Click-map channels: previous mask (optional), positive disks, negative disks."""
        return 3 if self.with_prev_mask else 2

    @property
    def click_aware_channel(self) -> int:
        """The click-map channel the decoder's click-aware mask reads: the authors'
        ``coord_features[:, 1]``, the positive disks when there is a previous-mask channel."""
        return 1

    def input_grid(self, hw: tuple[int, int]) -> tuple[int, int]:
        """Patch grid of an (h, w) input; ValueError unless the sides are multiples of twice the patch (the
        stride-32 level is a 2x2 stride-2 conv of the grid) and the grid splits into the ViT's windows
        (`SimpleClickConfig.input_grid`)."""
        h, w, side = int(hw[0]), int(hw[1]), 2 * self.patch_size
        if h % side or w % side or h < side or w < side:
            raise ValueError(f"AdaptiveClick ({self.variant}) needs input sides that are positive multiples of "
                             f"{side}; got {h}x{w} (use the zoom-in, which resizes to a fixed size such as 448x448)")
        return self.vit.input_grid(hw)

    def to_dict(self) -> dict:
        """JSON form (``config.json`` of a converted model)."""
        return config_to_dict(self)

    @classmethod
    def from_dict(cls, data: dict) -> AdaptiveClickConfig:
        """Inverse of `to_dict`; unknown keys are an error naming them."""
        return dataclass_from_dict(cls, data, what="AdaptiveClick config")


def pooling_steps(input_width: int, level_width: int) -> int:
    """The authors' ``int(math.log(mask_w / level_w, 2))``: 3x3 stride-2 max-pools of the click map."""
    return int(math.log(input_width / level_width, 2))


VIT_B = AdaptiveClickConfig(variant="vit_b")
# A tiny random-weight AdaptiveClick for fast tests (no official weights): ViT width 32, 4 blocks,
# 224 px; decoder width 32 (GroupNorm's 32 groups), 4 heads, 3 queries, one encoder and three decoder
# layers (one per level).
TINY = AdaptiveClickConfig(embed_dim=32, depth=4, num_heads=2, train_size=(224, 224),
                           neck_out_dims=(8, 16, 24, 32), conv_dim=32, mask_dim=32, encoder_layers=1,
                           encoder_ffn_dim=32, hidden_dim=32, num_queries=3, num_heads_decoder=4,
                           decoder_ffn_dim=64, decoder_layers=3, variant="tiny")
