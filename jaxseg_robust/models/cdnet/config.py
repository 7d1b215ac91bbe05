"""Static configuration of CDNet (ClickSEG ``DeeplabModel``, docs/models/cdnet.md).

`CdnetConfig` holds the constructor arguments of ClickSEG's ``DeeplabModel``
that the released CDNet checkpoints set (``models/cdnet/cdnet_res34_{sbd,
cclvs}.py``: ``backbone='resnet34', deeplab_ch=128, use_leaky_relu=True,
use_disks=True, norm_radius=5, with_prev_mask=False``); the two click radii
(5 for the network input and the pixel diffusion, 24 for the FDM) are fixed in
the model's code. `RELEASED` lists the checkpoints of the papers' rows.
"""

from __future__ import annotations

import dataclasses

from jaxseg_robust.models.config_json import config_to_dict, dataclass_from_dict
from jaxseg_robust.models.isegm_resnet.resnetv1b import BackboneSpec, backbone_spec

FAMILY = "cdnet"
INFER_SIZE = 384  # the predictor's ResizeTrans(384)


@dataclasses.dataclass(frozen=True)
class CdnetConfig:
    """A ClickSEG ``DeeplabModel`` (DeepLabV3+ on an isegm ResNet, with CDNet's FDM and PDM).

    Attributes:
      backbone: the isegm backbone name ("resnet34" in the releases; `resnetv1b.BACKBONES`).
      backbone_width: planes of the backbone's layer1 (64 in isegm; smaller only for tests).
      deeplab_ch: ASPP / decoder width (128); the output head is half as wide.
      norm_radius: the network's click disk radius in input pixels (``DistMaps(norm_radius=5)``).
      fdm_radius: the FDM's click disk radius (``fdm_dist_maps``, 24).
      use_leaky_relu: LeakyReLU(0.2) in the maps transform (True in the releases).
      infer_size: the square side the predictor resizes every image to (``ResizeTrans(384)``).
      variant: a label ("resnet34", "tiny").
      dtype: compute dtype of the network ("float32" or "bfloat16").
    """

    backbone: str = "resnet34"
    backbone_width: int = 64
    deeplab_ch: int = 128
    norm_radius: float = 5.0
    fdm_radius: float = 24.0
    use_leaky_relu: bool = True
    infer_size: int = INFER_SIZE
    variant: str = "resnet34"
    dtype: str = "float32"
    family: str = dataclasses.field(default=FAMILY, init=False)

    def __post_init__(self):
        backbone_spec(self.backbone)
        if self.deeplab_ch < 2 or self.deeplab_ch % 2:
            raise ValueError(f"deeplab_ch must be a positive even width; got {self.deeplab_ch}")
        if self.infer_size < 8:
            raise ValueError(f"infer_size must be at least 8; got {self.infer_size}")

    @property
    def predictor_family(self) -> str:
        """The family whose authors' predictor runs these weights: "cdnet"."""
        return FAMILY

    @property
    def backbone_spec(self) -> BackboneSpec:
        """The isegm ResNet of ``backbone`` with ``backbone_width``."""
        return dataclasses.replace(backbone_spec(self.backbone), width=self.backbone_width)

    @property
    def with_prev_mask(self) -> bool:
        """CDNet reads no previous mask (``with_prev_mask=False`` in every release)."""
        return False

    @property
    def coord_channels(self) -> int:
        """Click-map channels the network reads: [pos, neg] disks of ``norm_radius``, then of ``fdm_radius``."""
        return 4

    def to_dict(self) -> dict:
        """JSON form (``config.json`` of a converted model)."""
        return config_to_dict(self)

    @classmethod
    def from_dict(cls, data: dict) -> CdnetConfig:
        """Inverse of `to_dict`; unknown keys are an error naming them."""
        return dataclass_from_dict(cls, data, what="CDNet config")


RESNET34 = CdnetConfig()
# A tiny random-weight CDNet for fast tests (no official weights): ResNet-18 layout at width 8, 64 px.
TINY = CdnetConfig(backbone="resnet18", backbone_width=8, deeplab_ch=16, infer_size=64, variant="tiny")

# zoo name -> (config, official checkpoint file); ClickSEG's README: SBD and COCO+LVIS ("C+L").
RELEASED = {
    "cdnet_resnet34_cocolvis": (RESNET34, "cdnet_res34_cclvs.pth"),
    "cdnet_resnet34_sbd": (RESNET34, "cdnet_res34_sbd.pth"),
}
