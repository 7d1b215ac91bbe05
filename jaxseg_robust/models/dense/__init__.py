"""Dense models attacked by the image-perturbation battery (images -> per-pixel logits).

    from jaxseg_robust.models import dense
    model, params = dense.load_converted("/models/u2netp")      # made by python -m ports dense
    logits = jax.jit(model.apply)(params, images)                # f32[B, H, W, C]

* `DenseModel` protocol, `binary_logits`, `MaskLogitModel` (base.py);
* `U2NetDense` / `U2NETP`: U²-Net-p salient-object model, 2 classes (u2net.py);
* `DeepLabV3Dense` / `DeepLabV3Config`: torchvision DeepLabV3-ResNet (deeplabv3.py);
* `SemsegDense` / `SemsegConfig`: semseg / DDC-AT PSPNet and DeepLabv3 (semseg.py);
* `UperNetDense` / `UperNetConfig`: UPerNet-ConvNeXt of the SEA-AT models (upernet.py).
"""

from __future__ import annotations

import os

from jaxseg_robust.models.dense.base import (IMAGENET_MEAN, IMAGENET_STD, DenseModel,
                                             MaskLogitModel, binary_logits, check_images)
from jaxseg_robust.models.dense.deeplabv3 import DeepLabV3Config, DeepLabV3Dense
from jaxseg_robust.models.dense.semseg import SemsegConfig, SemsegDense
from jaxseg_robust.models.dense.upernet import UperNetConfig, UperNetDense
from jaxseg_robust.models.dense.u2net import U2NETP, U2NetConfig, U2NetDense

__all__ = ["IMAGENET_MEAN", "IMAGENET_STD", "DenseModel", "MaskLogitModel", "binary_logits",
           "check_images", "DeepLabV3Config", "DeepLabV3Dense", "SemsegConfig", "SemsegDense",
           "UperNetConfig", "UperNetDense", "U2NETP", "U2NetConfig",
           "U2NetDense", "load_converted"]


def load_converted(model_dir: str | os.PathLike):
    """Loads a converted dense model directory: `jaxseg_robust.models.zoo.load_dense` (the one loader).

    Returns:
      (model: DenseModel, variables: nested dict of numpy float32 arrays).
    """
    from jaxseg_robust.models import zoo  # noqa: PLC0415

    return zoo.load_dense(model_dir)
