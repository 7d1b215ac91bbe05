"""Zoo registration of the SAM 2 family (see docs/models/sam2.md).

Family "sam2" (`Sam2Segmenter` + `Sam2Predictor`) and its names:
  * ``sam2_hiera_{tiny,small,base_plus,large}``: SAM 2 (checkpoints
    ``sam2_hiera_<size>.pt``);
  * ``sam2.1_hiera_{tiny,small,base_plus,large}``: SAM 2.1 (checkpoints
    ``sam2.1_hiera_<size>.pt``); same image-path architecture as SAM 2;
  * ``sam2_test``: a tiny random-weight model for fast tests (128 px input;
    no official weights, use ``zoo.init``).
Converted with ``python -m ports sam2 --checkpoint FILE --out DIR``.

Family "sam2_hq" (`Sam2HQSegmenter` + `Sam2HQPredictor`, docs/models/sam_hq2.md):
  * ``sam2.1_hq_hiera_large``: HQ-SAM 2 (checkpoint ``sam2.1_hq_hiera_large.pt``
    of SysCV/sam-hq), converted with ``python -m ports sam2_hq``;
  * ``sam2_hq_tiny``: a tiny random-weight HQ-SAM 2 for fast tests.
"""

from __future__ import annotations

from jaxseg_robust.models import zoo
from jaxseg_robust.models.sam2.config import (HQ_TEST_CONFIG, HQ_VARIANTS, TEST_CONFIG, TRUNKS,
                                              Sam2Config, Sam2HQConfig, official_config,
                                              official_hq_config, with_compute_dtype)
from jaxseg_robust.models.sam2.hq_segmenter import Sam2HQSegmenter
from jaxseg_robust.models.sam2.predictor import Sam2HQPredictor, Sam2Predictor
from jaxseg_robust.models.sam2.segmenter import Sam2Segmenter

FAMILY = "sam2"
TEST_MODEL_NAME = "sam2_test"
HQ_FAMILY = "sam2_hq"
HQ_TEST_MODEL_NAME = "sam2_hq_tiny"
SIZE_NAMES = {"hiera_tiny": "Hiera-T", "hiera_small": "Hiera-S", "hiera_base_plus": "Hiera-B+",
              "hiera_large": "Hiera-L"}


def model_name(variant: str, version: str) -> str:
    """Zoo name of an official checkpoint: ``sam2_hiera_tiny``, ``sam2.1_hiera_large``, ..."""
    return f"sam{version}_{variant}"


def hq_model_name(variant: str) -> str:
    """Zoo name of an HQ-SAM 2 checkpoint: ``sam2.1_hq_hiera_large``."""
    return f"sam2.1_hq_{variant}"


def make_predictor(segmenter: Sam2Segmenter, params, name: str) -> Sam2Predictor:
    """The zoo's predictor."""
    return Sam2Predictor(segmenter, params, name)


def make_hq_predictor(segmenter: Sam2HQSegmenter, params, name: str) -> Sam2HQPredictor:
    """The zoo's HQ-SAM 2 predictor."""
    return Sam2HQPredictor(segmenter, params, name)


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

zoo.register_family(zoo.FamilySpec(
    name=HQ_FAMILY,
    config_from_dict=Sam2HQConfig.from_dict,
    with_compute_dtype=with_compute_dtype,
    segmenter=Sam2HQSegmenter,
    predictor=make_hq_predictor,
))
for _variant in HQ_VARIANTS:
    _name = hq_model_name(_variant)
    zoo.register_model(_name, HQ_FAMILY, official_hq_config(_variant),
                       checkpoint_hint=f"{_name}.pt",
                       description=f"HQ-SAM 2 (SAM 2.1 with an HQ output token), "
                                   f"{SIZE_NAMES[_variant]} image encoder")
zoo.register_model(HQ_TEST_MODEL_NAME, HQ_FAMILY, HQ_TEST_CONFIG,
                   checkpoint_hint="<none: random-weight test model, use zoo.init>",
                   description="tiny random-weight HQ-SAM 2 for tests (128 px input)")
