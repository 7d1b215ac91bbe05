"""SAM 2 and SAM 2.1 (Hiera image encoder) as Flax modules; see docs/models/sam2.md.

`Sam2Segmenter` implements the Segmenter protocol; `Sam2Predictor` mirrors
the official ``SAM2ImagePredictor``; the zoo names are registered by
`jaxseg_robust.models.sam2.registry`.
"""

from jaxseg_robust.models.sam2.config import HieraConfig, Sam2Config
from jaxseg_robust.models.sam2.predictor import Sam2Predictor
from jaxseg_robust.models.sam2.segmenter import Sam2Features, Sam2Segmenter

__all__ = ["HieraConfig", "Sam2Config", "Sam2Features", "Sam2Predictor", "Sam2Segmenter"]
