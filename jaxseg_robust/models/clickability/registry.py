"""Zoo registration of the RClicks clickability family (docs/protocols/rclicks.md §3.6).

Family ``"clickability"`` (`ClickabilityConfig`) and the name
``rclicks_clickability`` (SegNeXt-B saliency, converted by
``python -m ports clickability``). A loaded name is a `LoadedClickModel`
around the `NetworkClickModel` click model; `jaxseg_robust.clicksim.click_models`
resolves the simulator's ``--clickability`` choices through the zoo.
"""

from __future__ import annotations

from jaxseg_robust.models import zoo
from jaxseg_robust.models.clickability.click_model import LoadedClickModel, NetworkClickModel
from jaxseg_robust.models.clickability.model import FAMILY, SEGNEXT_B, ClickabilityConfig

__all__ = ["ZOO_NAME"]

ZOO_NAME = "rclicks_clickability"


def _with_compute_dtype(config: ClickabilityConfig, compute_dtype: str) -> ClickabilityConfig:
    if compute_dtype != "float32":
        raise ValueError(f"the clickability model computes in float32 only; got compute_dtype={compute_dtype!r}")
    return config


def _predictor(model: NetworkClickModel, params, name: str) -> LoadedClickModel:
    return LoadedClickModel(model, params, name)


zoo.register_family(zoo.FamilySpec(
    name=FAMILY,
    config_from_dict=ClickabilityConfig.from_dict,
    with_compute_dtype=_with_compute_dtype,
    segmenter=NetworkClickModel,
    predictor=_predictor,
))
zoo.register_model(ZOO_NAME, FAMILY, SEGNEXT_B, checkpoint_hint="clickability_model.pth",
                   description="RClicks clickability model (SegNeXt-B saliency, CM_5), benchmark click model")
