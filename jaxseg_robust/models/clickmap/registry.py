"""Zoo registration of the click-map families: RITM, SimpleClick and CFR-ICL.

Families (config.json "family") and names (docs/models/click_models.md):
  * "ritm" (`RitmConfig`): ``ritm_hrnet18_cocolvis``, ``ritm_hrnet18s_cocolvis``,
    ``ritm_hrnet32_cocolvis``, ``ritm_hrnet18_sbd`` (``python -m ports ritm``);
  * "simpleclick" (`SimpleClickConfig`): ``simpleclick_vit_xt``,
    ``simpleclick_vit_b``, ``simpleclick_vit_l``, ``simpleclick_vit_h`` (COCO+LVIS)
    and ``simpleclick_vit_{xt,b,l,h}_sbd`` (``python -m ports simpleclick``);
    ``cfr_icl_vit_h``: CFR-ICL's ViT-H checkpoint, the same network with
    ``cfr_icl`` set in its config (recorded by ``python -m ports simpleclick
    --cfr-icl``): the authors' predictor adds its cascade-forward refinement
    (`jaxseg_robust.models.clickmap.isegm.IsegmOptions.cascade`);
  * tiny random-weight models for tests: ``ritm_tiny``, ``simpleclick_tiny``.
Every name loads a `ClickMapPredictor` (``predict(image, point_coords=,
point_labels=, mask_input=)``).
"""

from __future__ import annotations

from jaxseg_robust.models import zoo
from jaxseg_robust.models.clickmap.predictor import ClickMapPredictor
from jaxseg_robust.models.clickmap.segmenter import (
    ClickMapSegmenter,
    with_compute_dtype,
)
from jaxseg_robust.models.ritm import config as ritm_config
from jaxseg_robust.models.simpleclick import config as sc_config

SIMPLECLICK_RELEASED = {
    "simpleclick_vit_xt": (sc_config.VIT_XT, "cocolvis_vit_xtiny.pth"),
    "simpleclick_vit_b": (sc_config.VIT_B, "cocolvis_vit_base.pth"),
    "simpleclick_vit_l": (sc_config.VIT_L, "cocolvis_vit_large.pth"),
    "simpleclick_vit_h": (sc_config.VIT_H, "cocolvis_vit_huge.pth"),
    "simpleclick_vit_xt_sbd": (sc_config.VIT_XT, "sbd_vit_xtiny.pth"),
    "simpleclick_vit_b_sbd": (sc_config.VIT_B, "sbd_vit_base.pth"),
    "simpleclick_vit_l_sbd": (sc_config.VIT_L, "sbd_vit_large.pth"),
    "simpleclick_vit_h_sbd": (sc_config.VIT_H, "sbd_vit_huge.pth"),
}
CFR_ICL_RELEASED = {"cfr_icl_vit_h": (sc_config.CFR_ICL_VIT_H, "cocolvis_icl_vit_huge.pth")}


def make_predictor(segmenter: ClickMapSegmenter, params, name: str) -> ClickMapPredictor:
    """The zoo's predictor for a click-map model."""
    return ClickMapPredictor(segmenter, params, name)


zoo.register_family(zoo.FamilySpec(
    name=ritm_config.FAMILY, config_from_dict=ritm_config.RitmConfig.from_dict,
    with_compute_dtype=with_compute_dtype, segmenter=ClickMapSegmenter,
    predictor=make_predictor))
zoo.register_family(zoo.FamilySpec(
    name=sc_config.FAMILY, config_from_dict=sc_config.SimpleClickConfig.from_dict,
    with_compute_dtype=with_compute_dtype, segmenter=ClickMapSegmenter,
    predictor=make_predictor))

for _name, (_config, _file) in ritm_config.RELEASED.items():
    _data = "SBD" if _name.endswith("_sbd") else "COCO+LVIS"
    zoo.register_model(_name, ritm_config.FAMILY, _config, checkpoint_hint=_file,
                       description=f"RITM {_config.variant.upper()} + OCR, previous-mask "
                                   f"input, trained on {_data}")
for _name, (_config, _file) in SIMPLECLICK_RELEASED.items():
    _data = "SBD" if _name.endswith("_sbd") else "COCO+LVIS"
    zoo.register_model(_name, sc_config.FAMILY, _config, checkpoint_hint=_file,
                       description=f"SimpleClick plain {_config.variant.replace('_', '-').upper()}"
                                   f", trained on {_data}")
for _name, (_config, _file) in CFR_ICL_RELEASED.items():
    zoo.register_model(_name, sc_config.FAMILY, _config, checkpoint_hint=_file,
                       description="CFR-ICL (SimpleClick ViT-H trained with the iterative click "
                                   "loss); cascade-forward refinement is an inference option",
                       port_command="python -m ports simpleclick --cfr-icl --checkpoint {checkpoint} "
                                    "--out {out}")
zoo.register_model("ritm_tiny", ritm_config.FAMILY, ritm_config.TINY,
                   checkpoint_hint="<none: random-weight test model, use zoo.init>",
                   description="tiny random-weight RITM (HRNet width 4) for tests")
zoo.register_model("simpleclick_tiny", sc_config.FAMILY, sc_config.TINY,
                   checkpoint_hint="<none: random-weight test model, use zoo.init>",
                   description="tiny random-weight SimpleClick (ViT width 32, 224 px) for tests")
