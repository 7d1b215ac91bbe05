"""Static configuration of SimpleClick's plain-ViT click-map models (docs/models/click_models.md).

`SimpleClickConfig` holds the arguments of SimpleClick's ``PlainVitModel`` that
the released checkpoints set (``models/iter_mask/plainvit_*448_*_itermask.py``
of the SimpleClick code; CFR-ICL's ViT-H uses the same architecture). The
backbone is a plain ViT trained on ``train_size`` inputs; at inference the
position embedding is re-interpolated (bicubic) to the input's patch grid,
as the authors' evaluation does for its 448 (672 for DAVIS) zoom-in size.
"""

from __future__ import annotations

import dataclasses

from jaxseg_robust.models.config_json import config_to_dict, dataclass_from_dict

FAMILY = "simpleclick"
CFR_ICL = "cfr_icl"  # the authors' predictor family of CFR-ICL weights
# The authors' ViT windows: 224 / patch tokens per window side at the pre-training size.
PRETRAIN_WINDOW_PIXELS = 224


@dataclasses.dataclass(frozen=True)
class SimpleClickConfig:
    """A SimpleClick ``PlainVitModel`` (ViT backbone, SimpleFPN neck, segmentation head).

    Attributes:
      patch_size: ViT patch side (16; 14 for ViT-H).
      embed_dim, depth, num_heads, mlp_ratio: ViT width, blocks, heads, MLP ratio.
      train_size: (h, w) the checkpoint was trained at (its position-embedding grid).
      neck_out_dims: SimpleFPN output widths at strides 4, 8, 16, 32.
      head_channels: the head's channel width (``channels`` with ``upsample='x1'``).
      norm_radius: click disk radius in input pixels.
      with_prev_mask: the click embedding has a previous-mask channel.
      variant: a label ("vit_xt", "vit_b", "vit_l", "vit_h").
      dtype: compute dtype ("float32" or "bfloat16").
      cfr_icl: the weights are CFR-ICL's (the same network trained with the iterative click loss):
        the authors' predictor adds its cascade-forward refinement. The port records it in the
        converted model's config.json (``python -m ports simpleclick --cfr-icl``); a config.json
        without the key is refused (docs/models/click_models.md, "CFR-ICL").
    """

    patch_size: int = 16
    embed_dim: int = 768
    depth: int = 12
    num_heads: int = 12
    mlp_ratio: float = 4.0
    train_size: tuple[int, int] = (448, 448)
    neck_out_dims: tuple[int, int, int, int] = (128, 256, 512, 1024)
    head_channels: int = 256
    norm_radius: float = 5.0
    with_prev_mask: bool = True
    variant: str = "vit_b"
    dtype: str = "float32"
    cfr_icl: bool = False
    family: str = dataclasses.field(default=FAMILY, init=False)

    def __post_init__(self):
        object.__setattr__(self, "train_size", tuple(int(v) for v in self.train_size))
        object.__setattr__(self, "neck_out_dims", tuple(int(v) for v in self.neck_out_dims))
        if self.depth % 4:
            raise ValueError(f"SimpleClick's ViT needs a depth divisible by 4; got {self.depth}")
        if not isinstance(self.cfr_icl, bool):
            raise ValueError(f"cfr_icl must be true or false; got {self.cfr_icl!r}")

    @property
    def predictor_family(self) -> str:
        """The family whose authors' predictor runs these weights: "cfr_icl" or "simpleclick"."""
        return CFR_ICL if self.cfr_icl else FAMILY

    @property
    def train_grid(self) -> tuple[int, int]:
        """Patch grid of the trained position embedding."""
        return (self.train_size[0] // self.patch_size, self.train_size[1] // self.patch_size)

    @property
    def window_grid(self) -> int:
        """Tokens per window side at the pre-training size (224 // patch)."""
        return PRETRAIN_WINDOW_PIXELS // self.patch_size

    @property
    def blocks_per_group(self) -> int:
        """Every ``blocks_per_group``-th block attends globally (6 for depth 12, else depth / 4)."""
        return 6 if self.depth == 12 else self.depth // 4

    @property
    def coord_channels(self) -> int:
        """Click-map channels: previous mask (optional), positive disks, negative disks."""
        return 3 if self.with_prev_mask else 2

    def input_grid(self, hw: tuple[int, int]) -> tuple[int, int]:
        """Patch grid of an (h, w) input; ValueError if it does not fit the windowed ViT.

        The input sides must be multiples of the patch size, and each grid side
        must split into equal windows (``grid // (grid // window_grid)`` tokens):
        the authors' ``patchify`` reshapes the token grid that way.
        """
        h, w = int(hw[0]), int(hw[1])
        p = self.patch_size
        if h % p or w % p or h < p or w < p:
            raise ValueError(f"SimpleClick ({self.variant}) needs input sides that are positive "
                             f"multiples of the patch size {p}; got {h}x{w} (use the zoom-in, "
                             f"which resizes to a fixed size such as 448x448)")
        grid = (h // p, w // p)
        for side in grid:
            windows = max(side // self.window_grid, 1)
            if side % windows:
                raise ValueError(f"SimpleClick ({self.variant}): a {side}-token side does not "
                                 f"split into {windows} equal windows (input {h}x{w})")
        return grid

    def to_dict(self) -> dict:
        """JSON form (``config.json`` of a converted model)."""
        return config_to_dict(self)

    @classmethod
    def from_dict(cls, data: dict) -> SimpleClickConfig:
        """Inverse of `to_dict`; no ``cfr_icl`` (a conversion older than the key), or unknown keys,
        are an error naming them."""
        if "cfr_icl" not in data:
            raise ValueError("the SimpleClick config.json has no 'cfr_icl' key (converted before the port recorded "
                             "CFR-ICL weights): convert the checkpoint again with python -m ports simpleclick "
                             "(with --cfr-icl for CFR-ICL weights)")
        return dataclass_from_dict(cls, data, what="SimpleClick config")


VIT_XT = SimpleClickConfig(embed_dim=160, depth=8, num_heads=4, neck_out_dims=(96, 192, 288, 384),
                           head_channels=128, variant="vit_xt")
VIT_B = SimpleClickConfig(variant="vit_b")
VIT_L = SimpleClickConfig(embed_dim=1024, depth=24, num_heads=16,
                          neck_out_dims=(192, 384, 768, 1536), variant="vit_l")
VIT_H = SimpleClickConfig(patch_size=14, embed_dim=1280, depth=32, num_heads=16,
                          neck_out_dims=(240, 480, 960, 1920), variant="vit_h")
# A tiny random-weight SimpleClick for fast tests (no official weights): 4 blocks of width 32,
# 16-px patches, trained grid 14x14 (224 px, one attention window).
TINY = SimpleClickConfig(embed_dim=32, depth=4, num_heads=2, train_size=(224, 224),
                         neck_out_dims=(8, 16, 24, 32), head_channels=16, variant="tiny")

# CFR-ICL's released ViT-H: SimpleClick's ViT-H network with CFR-ICL weights.
CFR_ICL_VIT_H = dataclasses.replace(VIT_H, cfr_icl=True)

BY_VARIANT = {c.variant: c for c in (VIT_XT, VIT_B, VIT_L, VIT_H, TINY)}
