"""Zoo registration of CDNet (docs/models/cdnet.md).

Family "cdnet" (`CdnetConfig`, `CdnetSegmenter`); names: ``cdnet_resnet34_cocolvis``
(COCO+LVIS, the papers' "C+L" row) and ``cdnet_resnet34_sbd`` (SBD), converted with
``python -m ports cdnet``; ``cdnet_tiny``, a random-weight model for tests. Every
name loads a `ClickMapPredictor` (``predict(image, point_coords=, point_labels=)``).
"""

from __future__ import annotations

from jaxseg_robust.models import zoo
from jaxseg_robust.models.cdnet import config as cdnet_config
from jaxseg_robust.models.cdnet.segmenter import CdnetSegmenter
from jaxseg_robust.models.clickmap.predictor import ClickMapPredictor
from jaxseg_robust.models.clickmap.segmenter import with_compute_dtype


def make_predictor(segmenter: CdnetSegmenter, params, name: str) -> ClickMapPredictor:
    """The zoo's predictor for a CDNet model."""
    return ClickMapPredictor(segmenter, params, name)


zoo.register_family(zoo.FamilySpec(
    name=cdnet_config.FAMILY, config_from_dict=cdnet_config.CdnetConfig.from_dict,
    with_compute_dtype=with_compute_dtype, segmenter=CdnetSegmenter, predictor=make_predictor,
    port_command="python -m ports cdnet --checkpoint {checkpoint} --out {out}"))

for _name, (_config, _file) in cdnet_config.RELEASED.items():
    _data = "SBD" if _name.endswith("_sbd") else "COCO+LVIS"
    zoo.register_model(_name, cdnet_config.FAMILY, _config, checkpoint_hint=_file,
                       description=f"CDNet (ClickSEG DeepLabV3+ ResNet-34 with FDM and PDM), trained on {_data}")
zoo.register_model("cdnet_tiny", cdnet_config.FAMILY, cdnet_config.TINY,
                   checkpoint_hint="<none: random-weight test model, use zoo.init>",
                   description="tiny random-weight CDNet (ResNet-18 layout at width 8, 64 px) for tests")
