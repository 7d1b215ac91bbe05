"""Zoo registration of AdaptiveClick (docs/models/adaptiveclick.md).

Family "adaptiveclick" (`AdaptiveClickConfig`), run by the click-map segmenter
(`jaxseg_robust.models.clickmap.segmenter.ClickMapSegmenter`) and the authors'
isegm predictor (flip, zoom-in 448, 672 on DAVIS). Names:
  * ``adaptiveclick_vit_base_cocolvis``, ``adaptiveclick_vit_base_sbd``: the
    released ViT-B checkpoints (COCO+LVIS, SBD; ``python -m ports adaptiveclick``);
  * ``adaptiveclick_tiny``: a tiny random-weight model for tests.
Every name loads a `ClickMapPredictor`.
"""

from __future__ import annotations

from jaxseg_robust.models import zoo
from jaxseg_robust.models.adaptiveclick import config as ac_config
from jaxseg_robust.models.clickmap.predictor import ClickMapPredictor
from jaxseg_robust.models.clickmap.segmenter import ClickMapSegmenter, with_compute_dtype

RELEASED = {
    "adaptiveclick_vit_base_cocolvis": (ac_config.VIT_B, "adaptiveclick_base448_cocolvis.pth", "COCO+LVIS"),
    "adaptiveclick_vit_base_sbd": (ac_config.VIT_B, "adaptiveclick_base448_sbd.pth", "SBD"),
}


def make_predictor(segmenter: ClickMapSegmenter, params, name: str) -> ClickMapPredictor:
    """The zoo's predictor for an AdaptiveClick model."""
    return ClickMapPredictor(segmenter, params, name)


zoo.register_family(zoo.FamilySpec(
    name=ac_config.FAMILY, config_from_dict=ac_config.AdaptiveClickConfig.from_dict,
    with_compute_dtype=with_compute_dtype, segmenter=ClickMapSegmenter, predictor=make_predictor))

for _name, (_config, _file, _data) in RELEASED.items():
    zoo.register_model(_name, ac_config.FAMILY, _config, checkpoint_hint=_file,
                       description=f"AdaptiveClick plain ViT-B, click-aware mask-adaptive decoder, trained on {_data}")
zoo.register_model("adaptiveclick_tiny", ac_config.FAMILY, ac_config.TINY,
                   checkpoint_hint="<none: random-weight test model, use zoo.init>",
                   description="tiny random-weight AdaptiveClick (ViT width 32, 224 px) for tests")
