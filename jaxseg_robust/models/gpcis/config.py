"""Static configuration of GPCIS's ``GpModel`` (docs/models/gpcis.md).

`GpcisConfig` holds what the authors' ``GpModel`` (``isegm/model/is_gp_resnet50.py``)
sets: the isegm ResNet backbone of its DeepLabV3+ (``backbone``), the ASPP /
head width (``deeplab_ch`` 256), the width of the click-maps transform (256),
the feature width of the head (``feature_dim`` 48), the number of random
Fourier features (``num_random_features``, ``L`` = 256), the click-disk radius
(``DistMaps(norm_radius=5)``, fixed in their code) and the previous-mask
channel; the released checkpoint (``GPCIS_Resnet50.pth``, trained on SBD) is
the ResNet-50. `TINY` is a random-weight model for tests.
"""

from __future__ import annotations

import dataclasses

from jaxseg_robust.models.config_json import config_to_dict, dataclass_from_dict
from jaxseg_robust.models.isegm_resnet.resnetv1b import BACKBONES, BackboneSpec, backbone_spec

FAMILY = "gpcis"


@dataclasses.dataclass(frozen=True)
class GpcisConfig:
    """A GPCIS ``GpModel``.

    Attributes:
      backbone: isegm backbone name (`resnetv1b.BACKBONES`: "resnet50" for the release).
      width: planes of the backbone's layer1 (64 in every isegm backbone; smaller
        only for the tiny test config).
      stem_width: the deep stem's width (64 for the ResNet-50 "v1s" stem).
      deeplab_ch: ASPP and head width (``deeplab_ch``, 256).
      side_feature_ch: output channels of ``maps_transform`` (256).
      feature_dim: channels of the head's output, the GP's deep features (48).
      num_random_features: ``L``, the random Fourier features of the GP prior (256).
      norm_radius: click disk radius in network-input pixels (5).
      with_prev_mask: the previous probability map is a click-map channel.
      variant: a label ("resnet50", "tiny").
      dtype: compute dtype of the backbone ("float32" or "bfloat16"; the GP runs in float32).
    """

    backbone: str = "resnet50"
    width: int = 64
    stem_width: int = 64
    deeplab_ch: int = 256
    side_feature_ch: int = 256
    feature_dim: int = 48
    num_random_features: int = 256
    norm_radius: float = 5.0
    with_prev_mask: bool = True
    variant: str = "resnet50"
    dtype: str = "float32"
    family: str = dataclasses.field(default=FAMILY, init=False)

    def __post_init__(self):
        if self.backbone not in BACKBONES:
            raise ValueError(f"GPCIS config: unknown backbone {self.backbone!r}; known: {', '.join(BACKBONES)}")
        if min(self.width, self.stem_width, self.deeplab_ch, self.side_feature_ch, self.feature_dim,
               self.num_random_features) <= 0:
            raise ValueError("GPCIS config: every width must be positive")

    @property
    def predictor_family(self) -> str:
        """The family whose authors' predictor runs these weights: "gpcis"."""
        return FAMILY

    @property
    def backbone_spec(self) -> BackboneSpec:
        """The backbone's `BackboneSpec` (isegm's block layout at this config's widths)."""
        spec = backbone_spec(self.backbone)
        return dataclasses.replace(spec, width=self.width, stem_width=self.stem_width)

    @property
    def coord_channels(self) -> int:
        """Click-map channels: previous mask (optional), positive disks, negative disks."""
        return 3 if self.with_prev_mask else 2

    def to_dict(self) -> dict:
        """JSON form (``config.json`` of a converted model)."""
        return config_to_dict(self)

    @classmethod
    def from_dict(cls, data: dict) -> GpcisConfig:
        """Inverse of `to_dict`; unknown keys are an error naming them."""
        return dataclass_from_dict(cls, data, what="GPCIS config")


RESNET50 = GpcisConfig()
# A tiny random-weight GPCIS for fast tests (no official weights): ResNet-18 layout at width 8.
TINY = GpcisConfig(backbone="resnet18", width=8, stem_width=8, deeplab_ch=16, side_feature_ch=16,
                   feature_dim=8, num_random_features=16, variant="tiny")

# zoo name -> (config, official checkpoint file)
RELEASED = {"gpcis_resnet50_sbd": (RESNET50, "GPCIS_Resnet50.pth")}
