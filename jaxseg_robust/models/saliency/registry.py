"""Zoo registration of the TranSalNet saliency family (docs/models/transalnet.md).

Family ``"transalnet"`` (`TranSalNetConfig`), the name ``transalnet_res`` (the released
TranSalNet_Res, converted by ``python -m ports transalnet``; RClicks' SM baseline) and
``transalnet_tiny`` (random weights only, for tests). A loaded name is a
`LoadedClickModel` around the `SaliencyClickModel`; `jaxseg_robust.clicksim.click_models`
resolves the simulator's click-model choices through the zoo: the `VARIANTS` ``"saliency"`` (SM,
the grey-masked crop) and ``"saliency_image"`` (SI, the raw crop) are `ZOO_NAME`'s weights behind
the construction of each (`saliency_variant`).
"""

from __future__ import annotations

import dataclasses

from jaxseg_robust.models import zoo
from jaxseg_robust.models.clickability.click_model import LoadedClickModel
from jaxseg_robust.models.saliency.click_model import SaliencyClickModel
from jaxseg_robust.models.saliency.config import FAMILY, TINY, TRANSALNET_RES, TranSalNetConfig

__all__ = ["ALIAS", "IMAGE_ALIAS", "TINY_NAME", "VARIANTS", "ZOO_NAME", "saliency_variant"]

ZOO_NAME = "transalnet_res"
TINY_NAME = "transalnet_tiny"
ALIAS = "saliency"  # the click-model name of RClicks' SM baseline
IMAGE_ALIAS = "saliency_image"  # the click-model name of RClicks' SI baseline (Table 6)
VARIANTS = {ALIAS: True, IMAGE_ALIAS: False}  # click-model name -> SaliencyClickModel.grey_outside


def saliency_variant(model: SaliencyClickModel, name: str) -> SaliencyClickModel:
    """``model`` (a loaded TranSalNet click model) as the variant ``name`` of `VARIANTS` (SM or SI)."""
    return dataclasses.replace(model, name=name, grey_outside=VARIANTS[name])


def _with_compute_dtype(config: TranSalNetConfig, compute_dtype: str) -> TranSalNetConfig:
    if compute_dtype != "float32":
        raise ValueError(f"TranSalNet computes in float32 only; got compute_dtype={compute_dtype!r}")
    return config


def _predictor(model: SaliencyClickModel, params, name: str) -> LoadedClickModel:
    return LoadedClickModel(model, params, name)


zoo.register_family(zoo.FamilySpec(
    name=FAMILY,
    config_from_dict=TranSalNetConfig.from_dict,
    with_compute_dtype=_with_compute_dtype,
    segmenter=SaliencyClickModel,
    predictor=_predictor,
))
zoo.register_model(ZOO_NAME, FAMILY, TRANSALNET_RES, checkpoint_hint="TranSalNet_Res.pth",
                   description="TranSalNet_Res saliency (ResNet-50), RClicks' SM click-model baseline")
zoo.register_model(TINY_NAME, FAMILY, TINY, checkpoint_hint="<none: random-weight test model, use zoo.init>",
                   description="tiny random-weight TranSalNet (tests)")
