"""Zoo registration of the dense families of the perturbation battery (images -> per-pixel logits).

Families (config.json "family", docs/models/semseg.md): "u2netp" (`U2NetDense`), "deeplabv3"
(torchvision DeepLabV3, `DeepLabV3Dense`), "semseg" (semseg / DDC-AT PSPNet and DeepLabv3,
`SemsegDense`), "upernet" (UPerNet-ConvNeXt, `UperNetDense`). They have no named models: a converted
directory is loaded by `jaxseg_robust.models.zoo.load_dense`, and refused by the prompt protocols.
"""

from __future__ import annotations

from jaxseg_robust.models import zoo
from jaxseg_robust.models.dense import deeplabv3, semseg, u2net, upernet

DENSE_MODELS = {u2net.FAMILY: (u2net.U2NetDense, u2net.U2NetConfig),
                deeplabv3.FAMILY: (deeplabv3.DeepLabV3Dense, deeplabv3.DeepLabV3Config),
                semseg.FAMILY: (semseg.SemsegDense, semseg.SemsegConfig),
                upernet.FAMILY: (upernet.UperNetDense, upernet.UperNetConfig)}


def model_builder(model_class, config_class):
    """``config dict -> model_class(config_class.from_dict(config))``."""
    return lambda config: model_class(config_class.from_dict(config))


for _family, (_model, _config) in DENSE_MODELS.items():
    zoo.register_dense_family(zoo.DenseFamilySpec(_family, model_builder(_model, _config)))
