"""Static configuration of TranSalNet (docs/models/transalnet.md).

`TRANSALNET_RES` is the released ``TranSalNet_Res`` (ResNet-50 backbone, the
variant RClicks runs as its saliency baseline); `TINY` is a small random-weight
configuration for tests.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

FAMILY = "transalnet"
STRIDES = (8, 16, 32)  # backbone outputs read by the decoder: ResNet layer2, layer3, layer4


@dataclasses.dataclass(frozen=True)
class TranSalNetConfig:
    """Everything static about a TranSalNet_Res network (defaults: the released model).

    Attributes:
      input_hw: (H, W) network input in pixels (288, 384); both divisible by 32. The
        transformer position embeddings have (H/s)·(W/s) rows for s = 32, 16, 8.
      resnet_blocks: Bottleneck counts of ResNet layer1..4 ((3, 4, 6, 3): ResNet-50).
      resnet_width: stem width = planes of layer1 (64); layer i outputs
        ``4 · width · 2**(i-1)`` channels.
      hidden_sizes: widths of TransEncoder1..3 (on layer4, layer3, layer2): (768, 768, 512).
        The decoder's conv1 maps hidden_sizes[0] -> hidden_sizes[1], conv2
        hidden_sizes[1] -> hidden_sizes[2] (the products with the encoders' outputs).
      num_heads: attention heads of TransEncoder1..3 (12, 12, 8).
      num_layers: transformer blocks of TransEncoder1..3 (2, 2, 2).
      mlp_ratio: MLP width / hidden width (4).
      decoder_channels: outputs of the decoder's conv3..conv6 (256, 128, 64, 32); conv7 gives 1.
      bn_eps: BatchNorm epsilon (1e-5); ln_eps: LayerNorm epsilon of the transformer (1e-6).
      variant: name stored with converted weights.
    """

    input_hw: tuple[int, int] = (288, 384)
    resnet_blocks: tuple[int, int, int, int] = (3, 4, 6, 3)
    resnet_width: int = 64
    hidden_sizes: tuple[int, int, int] = (768, 768, 512)
    num_heads: tuple[int, int, int] = (12, 12, 8)
    num_layers: tuple[int, int, int] = (2, 2, 2)
    mlp_ratio: int = 4
    decoder_channels: tuple[int, int, int, int] = (256, 128, 64, 32)
    bn_eps: float = 1e-5
    ln_eps: float = 1e-6
    variant: str = "res"

    def __post_init__(self):
        if len(self.input_hw) != 2 or any(v <= 0 or v % 32 for v in self.input_hw):
            raise ValueError(f"input_hw must be two positive multiples of 32; got {self.input_hw}")
        if len(self.resnet_blocks) != 4 or min(self.resnet_blocks) <= 0 or self.resnet_width <= 0:
            raise ValueError(f"resnet_blocks must be 4 positive counts and resnet_width positive; got "
                             f"{self.resnet_blocks}, {self.resnet_width}")
        for name in ("hidden_sizes", "num_heads", "num_layers"):
            values = getattr(self, name)
            if len(values) != 3 or min(values) <= 0:
                raise ValueError(f"{name} must be 3 positive values; got {values}")
        for hidden, heads in zip(self.hidden_sizes, self.num_heads):
            if hidden % heads:
                raise ValueError(f"hidden size {hidden} is not divisible by {heads} heads")
        if len(self.decoder_channels) != 4 or min(self.decoder_channels) <= 0 or self.mlp_ratio <= 0:
            raise ValueError(f"decoder_channels must be 4 positive widths and mlp_ratio positive; got "
                             f"{self.decoder_channels}, {self.mlp_ratio}")

    def grid_hw(self, stride: int) -> tuple[int, int]:
        """Feature grid (h, w) of the backbone output at ``stride`` (8, 16 or 32)."""
        return self.input_hw[0] // stride, self.input_hw[1] // stride

    def to_dict(self) -> dict:
        """JSON-representable dict."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "TranSalNetConfig":
        """Inverse of `to_dict`; unknown keys raise ValueError."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ValueError(f"unknown TranSalNetConfig field(s) {unknown}")
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items()})


TRANSALNET_RES = TranSalNetConfig()
TINY = TranSalNetConfig(input_hw=(64, 96), resnet_blocks=(1, 1, 1, 1), resnet_width=8,
                        hidden_sizes=(32, 32, 16), num_heads=(4, 4, 2), num_layers=(1, 1, 1),
                        mlp_ratio=2, decoder_channels=(16, 8, 8, 8), variant="tiny")
