"""Zoo registration of the SAM 2 family (see docs/models/sam2.md).

Family "sam2" (`Sam2Segmenter` + `Sam2Predictor`) and its names:
  * ``sam2_hiera_{tiny,small,base_plus,large}``: SAM 2 (checkpoints
    ``sam2_hiera_<size>.pt``);
  * ``sam2.1_hiera_{tiny,small,base_plus,large}``: SAM 2.1 (checkpoints
    ``sam2.1_hiera_<size>.pt``); same image-path architecture as SAM 2;
  * ``sam2_test``: a tiny random-weight model for fast tests (128 px input;
    no official weights, use ``zoo.init``).
Converted with ``python -m ports sam2 --checkpoint FILE --out DIR``.
"""

from __future__ import annotations

from jaxseg_robust.models import zoo
from jaxseg_robust.models.sam2.config import (TEST_CONFIG, TRUNKS, Sam2Config, official_config,
                                              with_compute_dtype)
from jaxseg_robust.models.sam2.predictor import Sam2Predictor
from jaxseg_robust.models.sam2.segmenter import Sam2Segmenter

FAMILY = "sam2"
TEST_MODEL_NAME = "sam2_test"
SIZE_NAMES = {"hiera_tiny": "Hiera-T", "hiera_small": "Hiera-S", "hiera_base_plus": "Hiera-B+",
              "hiera_large": "Hiera-L"}


def model_name(variant: str, version: str) -> str:
    """Zoo name of an official checkpoint: ``sam2_hiera_tiny``, ``sam2.1_hiera_large``, ..."""
    return f"sam{version}_{variant}"


def make_predictor(segmenter: Sam2Segmenter, params, name: str) -> Sam2Predictor:
    """The zoo's predictor."""
    return Sam2Predictor(segmenter, params, name)


OFFICIAL_MODELS: dict[str, Sam2Config] = {
    model_name(variant, version): official_config(variant, version)
    for version in ("2", "2.1") for variant in TRUNKS
}

zoo.register_family(zoo.FamilySpec(
    name=FAMILY,
    config_from_dict=Sam2Config.from_dict,
    with_compute_dtype=with_compute_dtype,
    segmenter=Sam2Segmenter,
    predictor=make_predictor,
))
for _name, _config in OFFICIAL_MODELS.items():
    zoo.register_model(_name, FAMILY, _config, checkpoint_hint=f"{_name}.pt",
                       description=f"SAM {_config.version}, {SIZE_NAMES[_config.variant]} "
                                   f"image encoder (single-image predictor)")
zoo.register_model(TEST_MODEL_NAME, FAMILY, TEST_CONFIG,
                   checkpoint_hint="<none: random-weight test model, use zoo.init>",
                   description="tiny random-weight SAM 2 for tests (128 px input)")
