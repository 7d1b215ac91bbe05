"""Zoo registration of SAM 3's interactive image model (family "sam3"; docs/models/sam3.md).

Names:
  * ``sam3``: the released checkpoint ``sam3.pt`` (facebook/sam3, gated),
    converted by ``python -m ports sam3``: its SAM-1 task path
    (``Sam3Image.predict_inst``);
  * ``sam3_tiny``: a tiny random-weight model for tests (112 px input; no
    official weights, use ``zoo.init``).
The predictor is `Sam2Predictor` (``SAM3InteractiveImagePredictor`` is
SAM 2's ``SAM2ImagePredictor`` with SAM 3's features and hole filling).
"""

from __future__ import annotations

from jaxseg_robust.models import zoo
from jaxseg_robust.models.sam2.predictor import Sam2Predictor
from jaxseg_robust.models.sam3.config import OFFICIAL_CONFIG, TEST_CONFIG, Sam3Config, with_compute_dtype
from jaxseg_robust.models.sam3.segmenter import Sam3Segmenter

FAMILY = "sam3"
MODEL_NAME = "sam3"
TEST_MODEL_NAME = "sam3_tiny"


def make_predictor(segmenter: Sam3Segmenter, params, name: str) -> Sam2Predictor:
    """The zoo's predictor (``predict_inst``'s calling convention is SAM2ImagePredictor.predict's)."""
    return Sam2Predictor(segmenter, params, name)


zoo.register_family(zoo.FamilySpec(
    name=FAMILY,
    config_from_dict=Sam3Config.from_dict,
    with_compute_dtype=with_compute_dtype,
    segmenter=Sam3Segmenter,
    predictor=make_predictor,
))
zoo.register_model(MODEL_NAME, FAMILY, OFFICIAL_CONFIG, checkpoint_hint="sam3.pt",
                   description="SAM 3 interactive image model (SAM-1 task: ViT of width 1024, "
                               "32 blocks, patch 14, RoPE, 1008 px; SAM 2 heads)")
zoo.register_model(TEST_MODEL_NAME, FAMILY, TEST_CONFIG,
                   checkpoint_hint="<none: random-weight test model, use zoo.init>",
                   description="tiny random-weight SAM 3 for tests (112 px input)")

__all__ = ["FAMILY", "MODEL_NAME", "TEST_MODEL_NAME", "make_predictor"]
