"""RClicks clickability model: SegNeXt-B saliency network, pre/post-processing, training.

See `model` for the network and its variables, `letterbox` for the input
canvas and the output mapping, `train` for the KLD training recipe,
`click_model` for the network as the simulated user's click model (the
benchmark wrapper), `registry` for its zoo family and name, and
``ports/clickability.py`` for converting the official checkpoint.
"""

from jaxseg_robust.models.clickability.letterbox import (
    IMAGENET_MEAN, IMAGENET_STD, MODEL_SIZE, LetterboxGeometry, letterbox, letterbox_geometry,
    minmax_per_sample, normalize_image, prepare_inputs, resize_linear, unletterbox)
from jaxseg_robust.models.clickability.model import (
    COLLECTIONS, FAMILY, SEGNEXT_B, ClickabilityConfig, ClickabilityNet, ClickabilityOutput,
    MaskEncoder, benchmark_map, load_converted, metric_map)

__all__ = [
    "IMAGENET_MEAN", "IMAGENET_STD", "MODEL_SIZE", "LetterboxGeometry", "letterbox",
    "letterbox_geometry", "minmax_per_sample", "normalize_image", "prepare_inputs",
    "resize_linear", "unletterbox", "COLLECTIONS", "FAMILY", "SEGNEXT_B", "ClickabilityConfig",
    "ClickabilityNet", "ClickabilityOutput", "MaskEncoder", "benchmark_map", "load_converted",
    "metric_map",
]
