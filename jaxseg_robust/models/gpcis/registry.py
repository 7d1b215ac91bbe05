"""Zoo registration of GPCIS (docs/models/gpcis.md).

Family "gpcis" (`GpcisConfig`, `GpcisSegmenter`); names:
  * ``gpcis_resnet50_sbd``: the authors' ``GPCIS_Resnet50.pth`` (DeepLabV3+
    ResNet-50 with the Gaussian-process head, trained on SBD; ``python -m ports gpcis``), the checkpoint
    both papers ran (RClicks' tables label its row "C+L"; docs/models/gpcis.md says why it is SBD);
  * ``gpcis_tiny``: a tiny random-weight model for tests.
Every name loads a `ClickMapPredictor` (``predict(image, point_coords=, point_labels=, mask_input=)``).
"""

from __future__ import annotations

from jaxseg_robust.models import zoo
from jaxseg_robust.models.clickmap.predictor import ClickMapPredictor
from jaxseg_robust.models.clickmap.segmenter import with_compute_dtype
from jaxseg_robust.models.gpcis import config as gpcis_config
from jaxseg_robust.models.gpcis.segmenter import GpcisSegmenter


def make_predictor(segmenter: GpcisSegmenter, params, name: str) -> ClickMapPredictor:
    """The zoo's predictor for GPCIS (the click-map models' SamPredictor-style wrapper)."""
    return ClickMapPredictor(segmenter, params, name)


zoo.register_family(zoo.FamilySpec(
    name=gpcis_config.FAMILY, config_from_dict=gpcis_config.GpcisConfig.from_dict,
    with_compute_dtype=with_compute_dtype, segmenter=GpcisSegmenter, predictor=make_predictor))

for _name, (_config, _file) in gpcis_config.RELEASED.items():
    zoo.register_model(_name, gpcis_config.FAMILY, _config, checkpoint_hint=_file,
                       description="GPCIS DeepLabV3+ ResNet-50 with a Gaussian-process head, previous-mask "
                                   "input, trained on SBD")
zoo.register_model("gpcis_tiny", gpcis_config.FAMILY, gpcis_config.TINY,
                   checkpoint_hint="<none: random-weight test model, use zoo.init>",
                   description="tiny random-weight GPCIS (ResNet-18 layout, width 8) for tests")
