"""RobustSAM (SAM with robust output tokens and Fourier feature blocks); see docs/models/robustsam.md.

`RobustSamSegmenter` implements the Segmenter protocol on SAM's modules plus
`RobustMaskDecoder`; the zoo names are registered by
`jaxseg_robust.models.robustsam.registry`; ``python -m ports robustsam``
converts the official checkpoints.
"""

from jaxseg_robust.models.robustsam.config import RobustSamConfig
from jaxseg_robust.models.robustsam.mask_decoder import RobustMaskDecoder
from jaxseg_robust.models.robustsam.segmenter import RobustSamSegmenter

__all__ = ["RobustMaskDecoder", "RobustSamConfig", "RobustSamSegmenter"]
