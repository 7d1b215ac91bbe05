"""SAM 3's interactive image model (the SAM-1 task): ViT with RoPE, SAM 2 neck and heads.

See docs/models/sam3.md.
"""

from jaxseg_robust.models.sam3.config import OFFICIAL_CONFIG, TEST_CONFIG, Sam3Config, Sam3VitConfig
from jaxseg_robust.models.sam3.segmenter import Sam3Segmenter

__all__ = ["Sam3Config", "Sam3VitConfig", "Sam3Segmenter", "OFFICIAL_CONFIG", "TEST_CONFIG"]
