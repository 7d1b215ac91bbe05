"""Static configuration of RITM's HRNet + OCR click-map models (docs/models/click_models.md).

`RitmConfig` holds exactly the constructor arguments of isegm's ``HRNetModel``
that the released checkpoints set (``models/iter_mask/hrnet*_itermask_3p.py``
of the RITM code); everything the released models leave at isegm's defaults
(RGB conv off, no click groups, non-binary previous mask) is fixed here and
checked by the port. `RELEASED` lists the released checkpoints.
"""

from __future__ import annotations

import dataclasses

from jaxseg_robust.models.config_json import config_to_dict, dataclass_from_dict

FAMILY = "ritm"


@dataclasses.dataclass(frozen=True)
class RitmConfig:
    """An isegm ``HRNetModel`` (HRNet-W``width`` backbone, OCR head of width ``ocr_width``).

    Attributes:
      width: HRNet base width (18 or 32 in the releases); branch widths
        width, 2 width, 4 width, 8 width.
      ocr_width: OCR key width (mid channels 2 ocr_width); 0 = no OCR (a conv head).
      small: HRNet "small" (2 blocks per branch, 3 + 2 modules in stages 3 and 4).
      norm_radius: click disk radius in input pixels (``DistMaps(norm_radius)``).
      use_disks: binary disks (True in every release) instead of tanh distance maps.
      with_prev_mask: a third click-map channel carries the previous probability map.
      use_leaky_relu: LeakyReLU(0.2) in the maps transform (else ReLU).
      variant: a label ("hrnet18", "hrnet18s", "hrnet32", ...).
      dtype: compute dtype of the network ("float32" or "bfloat16").
    """

    width: int = 18
    ocr_width: int = 64
    small: bool = False
    norm_radius: float = 5.0
    use_disks: bool = True
    with_prev_mask: bool = True
    use_leaky_relu: bool = True
    variant: str = "hrnet18"
    dtype: str = "float32"
    family: str = dataclasses.field(default=FAMILY, init=False)

    @property
    def predictor_family(self) -> str:
        """The family whose authors' predictor runs these weights: "ritm"."""
        return FAMILY

    @property
    def num_blocks(self) -> int:
        """Blocks per HRNet branch (2 small, 4 otherwise)."""
        return 2 if self.small else 4

    @property
    def stage_modules(self) -> tuple[int, int, int]:
        """HighResolutionModules in stages 2, 3 and 4."""
        return (1, 3, 2) if self.small else (1, 4, 3)

    @property
    def coord_channels(self) -> int:
        """Click-map channels: previous mask (optional), positive disks, negative disks."""
        return 3 if self.with_prev_mask else 2

    def to_dict(self) -> dict:
        """JSON form (``config.json`` of a converted model)."""
        return config_to_dict(self)

    @classmethod
    def from_dict(cls, data: dict) -> RitmConfig:
        """Inverse of `to_dict`; unknown keys are an error naming them."""
        return dataclass_from_dict(cls, data, what="RITM config")


HRNET18 = RitmConfig(width=18, ocr_width=64, variant="hrnet18")
HRNET18S = RitmConfig(width=18, ocr_width=48, small=True, variant="hrnet18s")
HRNET32 = RitmConfig(width=32, ocr_width=128, variant="hrnet32")
# RITM's non-iterative baseline (models/noniterative_baselines/hrnet18_ocr64_cocolvis.py): no previous-mask channel.
HRNET18_BASELINE = RitmConfig(width=18, ocr_width=64, with_prev_mask=False, variant="hrnet18")
# A tiny random-weight RITM for fast tests (no official weights).
TINY = RitmConfig(width=4, ocr_width=4, small=True, variant="tiny")

# zoo name -> (config, official checkpoint file)
RELEASED = {
    "ritm_hrnet18_cocolvis": (HRNET18, "coco_lvis_h18_itermask.pth"),
    "ritm_hrnet18s_cocolvis": (HRNET18S, "coco_lvis_h18s_itermask.pth"),
    "ritm_hrnet32_cocolvis": (HRNET32, "coco_lvis_h32_itermask.pth"),
    "ritm_hrnet18_sbd": (HRNET18, "sbd_h18_itermask.pth"),
    "ritm_hrnet18_cocolvis_baseline": (HRNET18_BASELINE, "coco_lvis_h18_baseline.pth"),
}
