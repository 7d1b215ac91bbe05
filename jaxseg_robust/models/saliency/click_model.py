"""TranSalNet saliency as a click model: RClicks' SM and SI baselines (docs/models/transalnet.md, "The SM
construction").

The authors' ``rclicks.clicksim.SaliencyModel`` (bbox_rsize 1.4; the paper's
Appendix B.2, variant "SM") turns the error region ``R`` of a round into a
click distribution (their ``SaliencyImageModel``, "SI" of Table 6, skips step 2:
the network sees the raw crop):

1. crop the image to the bounding box of ``R`` grown by 1.4: with ``h`` the box
   height, ``d = int((int(1.4·h) − h) / 2)`` rows are added above and below
   (clipped to the image), likewise columns;
2. inside the crop, pixels outside ``R`` become grey (0.5, written to 8 bits as 127);
3. letterbox the crop into the 288 x 384 network input (``preprocess_img``:
   OpenCV ``INTER_LINEAR`` to fit, centred, fill value 1 of 255), scale by 1/255;
4. TranSalNet; its sigmoid map is written to 8 bits by truncation (``ToPILImage``);
5. resize it to cover the crop and centre-crop (``postprocess_img``, ``INTER_LINEAR``);
6. multiply by ``R``, divide by the sum (``R`` itself when the sum is 0), paste into
   a zero map of the image.

Here the crop is not cut out: every resize is a product with interpolation
matrices whose taps are computed on the device from the traced crop box (integer
arithmetic, OpenCV's half-pixel rule and edge clamping), so one compiled function
serves every region of a frame and is vmappable. The 8-bit steps are kept (round
half up after each resize of 8-bit data, truncation of the network output); the
resizes themselves are exact float32 bilinear maps where OpenCV uses 11-bit
fixed-point weights, so a value can differ by one 8-bit level (docs/models/transalnet.md).

    prepared = model.prepare(image uint8[H, W, 3], gt bool[H, W], frame_hw)
    M = model.clickability(params, prepared, region bool[Hf, Wf], inside bool[Hf, Wf])
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable, ClassVar, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxseg_robust.models.clickability.click_model import NetworkBackedClickModel, check_frame
from jaxseg_robust.models.saliency.config import TRANSALNET_RES, TranSalNetConfig
from jaxseg_robust.models.saliency.network import TranSalNet

__all__ = ["CROP_EXPAND", "GREY_LEVEL", "LETTERBOX_FILL", "CropGeometry", "SaliencyClickModel", "crop_geometry",
           "crop_margins", "resize_matrix", "sm_clickability", "sm_distribution", "sm_network_input"]

CROP_EXPAND = 1.4   # SaliencyModel(bbox_rsize=1.4)
GREY_LEVEL = 127.0  # the grey 0.5 of cut_image_from_mask after (x * 255).astype(uint8)
LETTERBOX_FILL = 1.0  # np.ones(..., uint8) canvas of preprocess_img


@functools.lru_cache(maxsize=32)
def crop_margins(max_length: int, expand: float = CROP_EXPAND) -> np.ndarray:
    """int32[max_length + 1]: the margin ``int((int(expand·n) − n) / 2)`` of a box of ``n`` pixels.

    Computed on the host in float64 as the authors' Python does (``int(1.4·n)`` is not
    ``14·n // 10`` for every n: 1.4·45 = 62.99999…).
    """
    return np.asarray([int((int(expand * n) - n) / 2) for n in range(max_length + 1)], np.int32)


def resize_matrix(out_index: jax.Array, out_len: jax.Array, in_len: jax.Array, in_start: jax.Array,
                  in_size: int) -> jax.Array:
    """Interpolation matrix of one axis of an OpenCV ``INTER_LINEAR`` resize with traced lengths.

    Args:
      out_index: int32[M] output sample of each row (rows outside ``[0, out_len)`` are zero).
      out_len: resized length; in_len: source length (both > 0, traced int32 scalars).
      in_start: where the source starts along an axis of ``in_size`` samples.
      in_size: static length of that axis.
    Returns:
      f32[M, in_size]: row ``o`` holds the two taps of source position
      ``(o + 0.5)·in_len/out_len − 0.5`` (clamped to the first / last sample), computed
      as an exact fraction in integers.
    """
    numerator = (2 * out_index + 1) * in_len - out_len
    denominator = 2 * out_len
    left = jnp.floor_divide(numerator, denominator)
    frac = (numerator - left * denominator).astype(jnp.float32) / denominator.astype(jnp.float32)
    clamped = (left < 0) | (left >= in_len - 1)
    left = jnp.clip(left, 0, in_len - 1)
    frac = jnp.where(clamped, 0.0, frac)
    right = jnp.minimum(left + 1, in_len - 1)
    columns = jnp.arange(in_size)[None, :]
    matrix = (jnp.where(columns == (in_start + left)[:, None], 1.0 - frac[:, None], 0.0)
              + jnp.where(columns == (in_start + right)[:, None], frac[:, None], 0.0))
    valid = (out_index >= 0) & (out_index < out_len)
    return jnp.where(valid[:, None], matrix, 0.0)


def _matmul(a, b):
    return jnp.matmul(a, b, precision=lax.Precision.HIGHEST)


def _round_to_level(x: jax.Array) -> jax.Array:
    """OpenCV's rounding of an 8-bit result: half up, clipped to 0..255."""
    return jnp.clip(jnp.floor(x + 0.5), 0.0, 255.0)


def _span(mask_1d: jax.Array, limit: jax.Array, margins: jax.Array) -> tuple[jax.Array, jax.Array]:
    """[start, stop) of the grown bounding span of a bool[N] profile, clipped to ``[0, limit)``."""
    size = mask_1d.shape[0]
    first = jnp.argmax(mask_1d)
    last = size - 1 - jnp.argmax(mask_1d[::-1])
    margin = margins[last - first + 1]
    return jnp.maximum(first - margin, 0), jnp.minimum(last + margin + 1, limit)


def _scaled(length: jax.Array, numerator: int | jax.Array, denominator: int | jax.Array) -> jax.Array:
    """``length · numerator // denominator`` in integers, at least 1 (a letterbox side)."""
    return jnp.maximum((length * numerator) // denominator, 1)


class CropGeometry(NamedTuple):
    """Where the crop of step 1 lies in the frame and how it is letterboxed (traced int32 scalars).

    Rows ``[top, top + height)`` and columns ``[left, left + width)`` of the frame; ``tall``:
    ``height / in_h > width / in_w`` (fit the height into the network input, cover the width
    on the way back).
    """

    top: jax.Array
    left: jax.Array
    height: jax.Array
    width: jax.Array
    tall: jax.Array


def crop_geometry(region: jax.Array, image_hw: jax.Array, input_hw: tuple[int, int]) -> CropGeometry:
    """Step 1: the bounding box of ``region`` bool[Hf, Wf] grown by `CROP_EXPAND`, clipped to the image."""
    frame_h, frame_w = region.shape
    margins = jnp.asarray(crop_margins(max(frame_h, frame_w)))
    top, bottom = _span(jnp.any(region, axis=1), image_hw[0], margins)
    left, right = _span(jnp.any(region, axis=0), image_hw[1], margins)
    height, width = bottom - top, right - left
    return CropGeometry(top, left, height, width, height * input_hw[1] > width * input_hw[0])


def sm_network_input(image: jax.Array, region: jax.Array, crop: CropGeometry,
                     input_hw: tuple[int, int], grey_outside: bool = True) -> jax.Array:
    """Steps 2-3: the grey-outside-``region`` crop letterboxed into f32[in_h, in_w, 3] in [0, 1].

    Args:
      image: f32[Hf, Wf, 3] RGB in 0..255; region: bool[Hf, Wf]; crop: `crop_geometry`'s.
      grey_outside: static; True: step 2 (SM); False: the raw crop (SI).
    """
    frame_h, frame_w = region.shape
    in_h, in_w = input_hw
    fit_h = jnp.where(crop.tall, in_h, _scaled(crop.height, in_w, crop.width))  # preprocess_img: fit inside
    fit_w = jnp.where(crop.tall, _scaled(crop.width, in_h, crop.height), in_w)
    rows = resize_matrix(jnp.arange(in_h) - (in_h - fit_h) // 2, fit_h, crop.height, crop.top, frame_h)
    cols = resize_matrix(jnp.arange(in_w) - (in_w - fit_w) // 2, fit_w, crop.width, crop.left, frame_w)
    composite = jnp.where(region[..., None], image, GREY_LEVEL) if grey_outside else image
    canvas = jnp.einsum("yh,hwc,xw->yxc", rows, composite, cols, precision=lax.Precision.HIGHEST)
    pasted = jnp.any(rows != 0, axis=1)[:, None] & jnp.any(cols != 0, axis=1)[None, :]
    return jnp.where(pasted[..., None], _round_to_level(canvas), LETTERBOX_FILL) / 255.0


def sm_distribution(saliency: jax.Array, region: jax.Array, crop: CropGeometry) -> jax.Array:
    """Steps 4-6: network saliency f32[in_h, in_w] in [0, 1] -> click distribution f32[Hf, Wf].

    Returns the 8-bit saliency resized to cover the crop, times ``region``, divided by its sum
    (sum 1); ``region`` itself where that sum is 0 (the authors' fallback), zeros for an empty region.
    """
    frame_h, frame_w = region.shape
    in_h, in_w = saliency.shape
    levels = jnp.floor(saliency * 255.0)  # ToPILImage: mul(255).byte()
    cover_h = jnp.where(crop.tall, crop.height, _scaled(crop.width, in_h, in_w))  # postprocess_img: cover
    cover_w = jnp.where(crop.tall, _scaled(crop.height, in_w, in_h), crop.width)
    rows = resize_matrix(jnp.arange(frame_h) - crop.top + (cover_h - crop.height) // 2, cover_h, in_h, 0, in_h)
    cols = resize_matrix(jnp.arange(frame_w) - crop.left + (cover_w - crop.width) // 2, cover_w, in_w, 0, in_w)
    resized = _round_to_level(_matmul(_matmul(rows, levels), cols.T))
    mask = region.astype(jnp.float32)
    weighted = resized * mask
    total = jnp.sum(weighted)
    return jnp.where(total > 0, weighted / jnp.where(total > 0, total, 1.0), mask)


def sm_clickability(saliency_fn: Callable[[jax.Array], jax.Array], image: jax.Array, image_hw: jax.Array,
                    region: jax.Array, input_hw: tuple[int, int], grey_outside: bool = True) -> jax.Array:
    """The SM construction (module docstring, steps 1-6; SI without step 2) around any saliency function.

    Args:
      saliency_fn: f32[in_h, in_w, 3] network input in [0, 1] -> f32[in_h, in_w] saliency in [0, 1].
      image: f32[Hf, Wf, 3] RGB in 0..255 (the image at the top left of the frame).
      image_hw: int32[2] the image's (H, W).
      region: bool[Hf, Wf] error region (inside the image).
      input_hw: static network input (in_h, in_w) = (288, 384).
      grey_outside: static; True: SM (grey outside ``region`` in the crop); False: SI (the raw crop).
    Returns:
      f32[Hf, Wf]: the click distribution (see `sm_distribution`).
    """
    crop = crop_geometry(region, image_hw, input_hw)
    canvas = sm_network_input(image, region, crop, input_hw, grey_outside)
    return sm_distribution(saliency_fn(canvas), region, crop)


@dataclasses.dataclass(frozen=True)
class SaliencyClickModel(NetworkBackedClickModel):
    """TranSalNet behind RClicks' SM construction, a `ClickModel` of the simulated user.

    Params are the network's variables ``{"params", "batch_stats"}``
    (`jaxseg_robust.models.saliency.network.load_converted` or ``init``).

    Attributes:
      config: the network's configuration.
      name: the click model's name.
      grey_outside: True: SM (the crop is grey outside the error region); False: SI (the raw crop,
        the authors' ``SaliencyImageModel``). `jaxseg_robust.models.saliency.registry.VARIANTS` names both.
    """

    network_type: ClassVar[type] = TranSalNet
    config: TranSalNetConfig = TRANSALNET_RES
    name: str = "saliency"
    grey_outside: bool = True

    def prepare(self, image, gt, frame_hw) -> dict:
        """The image in the frame and its size (host).

        Args:
          image: uint8[H, W, 3] RGB.
          gt: bool[H, W] GT mask (shape check only: the construction reads the error region).
          frame_hw: (Hf, Wf) evaluation frame.
        Returns:
          {"image" f32[Hf, Wf, 3] in 0..255 (zeros outside the image), "image_hw" int32[2]}.
        """
        height, width, frame_h, frame_w = check_frame(image, gt, frame_hw)
        framed = np.zeros((frame_h, frame_w, 3), np.float32)
        framed[:height, :width] = np.asarray(image, np.float32)
        return {"image": framed, "image_hw": np.asarray([height, width], np.int32)}

    def clickability(self, params, prepared, region, inside) -> jax.Array:
        """The SM (SI) map of ``region``: f32[Hf, Wf], sum 1 on the region (0 elsewhere).

        Args:
          params: network variables.
          prepared: one instance's `prepare` output.
          region: bool[Hf, Wf] error region R of the round.
          inside: bool[Hf, Wf] the image's pixels of the frame (R is restricted to them).
        """
        region = jnp.asarray(region, bool) & jnp.asarray(inside, bool)

        def saliency(canvas):
            return self.net.apply(params, canvas[None])[0]

        return sm_clickability(saliency, jnp.asarray(prepared["image"], jnp.float32),
                               jnp.asarray(prepared["image_hw"], jnp.int32), region, tuple(self.config.input_hw),
                               self.grey_outside)
