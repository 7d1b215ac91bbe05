"""Small dense-model configurations shared by the tests (same code paths, fast to compile)."""

from __future__ import annotations

from jaxseg_robust.models.dense.deeplabv3 import DeepLabV3Config
from jaxseg_robust.models.dense.u2net import RSUSpec, U2NetConfig


def _rsu(height: int, dilated: bool, cin: int, mid: int, cout: int) -> RSUSpec:
    return RSUSpec(height, dilated, cin, mid, cout)


# A narrow, shallow U²-Net (heights 2..4, pooled and dilated blocks).
TINY_U2NET = U2NetConfig(
    stages=(_rsu(3, False, 3, 4, 8), _rsu(3, False, 8, 4, 8), _rsu(2, False, 8, 4, 8),
            _rsu(2, False, 8, 4, 8), _rsu(4, True, 8, 4, 8), _rsu(4, True, 8, 4, 8),
            _rsu(4, True, 16, 4, 8), _rsu(2, False, 16, 4, 8), _rsu(2, False, 16, 4, 8),
            _rsu(3, False, 16, 4, 8), _rsu(3, False, 16, 4, 8)),
    input_hw=(24, 40), variant="tiny")

# One Bottleneck per stage, narrow widths, small atrous rates: the R50 code paths.
TINY_DEEPLAB = DeepLabV3Config(num_classes=5, blocks=(1, 1, 1, 1), width=4, aspp_channels=8,
                               atrous_rates=(2, 4, 6), aux_classifier=True)
