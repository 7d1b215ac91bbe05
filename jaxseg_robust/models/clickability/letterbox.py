"""Input preparation and output mapping of the clickability model (docs/protocols/rclicks.md §3.6).

Host side (numpy, no OpenCV needed):

* `normalize_image`: ImageNet normalisation of an RGB image in 0..255
  (albumentations ``Normalize(max_pixel_value=1)`` on ``I/255``), float32.
* `letterbox`: RClicks' ``padding``: resize (OpenCV ``INTER_LINEAR``
  semantics, re-implemented in `resize_linear`) so the image fits a
  ``size x size`` canvas with the longer side filling it, paste centred, fill 0.
  Float masks become soft at the edges and are not re-binarised.
* `prepare_inputs`: image, GT mask and error mask -> model inputs.

Device side (JAX, static shapes):

* `unletterbox`: crop the pasted region and resize it back to ``H x W``
  (torchvision ``Resize`` on tensors in 0.16 = bilinear, align_corners=False,
  no antialias).
* `minmax_per_sample`: per-sample min-max over all non-batch axes.
"""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp
import numpy as np

from jaxseg_robust.ops.resize import resize_bilinear

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
MODEL_SIZE = 416


class LetterboxGeometry(NamedTuple):
    """Where an ``height x width`` image lands on the ``canvas_h x canvas_w`` canvas.

    The image is resized to ``resized_h x resized_w`` and pasted at rows
    ``[top, top + resized_h)``, columns ``[left, left + resized_w)``.
    """

    height: int
    width: int
    canvas_h: int
    canvas_w: int
    resized_h: int
    resized_w: int
    top: int
    left: int


def _canvas(size: int | tuple[int, int]) -> tuple[int, int]:
    canvas = (size, size) if np.isscalar(size) else tuple(size)
    if len(canvas) != 2 or min(canvas) <= 0 or any(int(c) != c for c in canvas):
        raise ValueError(f"size must be a positive int or (height, width); got {size!r}")
    return int(canvas[0]), int(canvas[1])


def letterbox_geometry(height: int, width: int,
                       size: int | tuple[int, int] = MODEL_SIZE) -> LetterboxGeometry:
    """The RClicks letterbox rule.

    If ``height/canvas_h > width/canvas_w`` (portrait): width
    ``(width·canvas_h)//height``, full height, centred horizontally at
    ``(canvas_w − w')//2``; otherwise full width, height
    ``(height·canvas_w)//width``, centred vertically.

    Raises:
      ValueError: non-positive sizes, or an image so elongated that the resized
        short side would be 0 pixels.
    """
    if int(height) != height or int(width) != width or height <= 0 or width <= 0:
        raise ValueError(f"height and width must be positive integers; got {height}, {width}")
    canvas_h, canvas_w = _canvas(size)
    height, width = int(height), int(width)
    if height / canvas_h > width / canvas_w:
        resized_h, resized_w = canvas_h, min((width * canvas_h) // height, canvas_w)
    else:
        resized_h, resized_w = min((height * canvas_w) // width, canvas_h), canvas_w
    if resized_h == 0 or resized_w == 0:
        raise ValueError(f"an image of {height}x{width} is too elongated for a "
                         f"{canvas_h}x{canvas_w} letterbox (its short side would vanish)")
    return LetterboxGeometry(height, width, canvas_h, canvas_w, resized_h, resized_w,
                             (canvas_h - resized_h) // 2, (canvas_w - resized_w) // 2)


def _cv2_linear_taps(in_size: int, out_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """OpenCV INTER_LINEAR taps along one axis: (left i64[out], right i64[out], frac f32[out]).

    Source position ``fx = (o + 0.5)·scale − 0.5`` with ``scale = 1/(out/in)``, left
    tap ``floor(fx)`` and fraction ``fx − floor(fx)``, all in float64, the fraction
    then rounded to float32 (checked against OpenCV 4.9 and 5.0); positions left of
    the first or right of the last sample are clamped to it.
    """
    scale = 1.0 / (out_size / in_size)
    pos = (np.arange(out_size, dtype=np.float64) + 0.5) * scale - 0.5
    left = np.floor(pos).astype(np.int64)
    frac = (pos - left).astype(np.float32)
    low = left < 0
    frac = np.where(low, np.float32(0.0), frac)
    left = np.where(low, 0, left)
    high = left >= in_size - 1
    frac = np.where(high, np.float32(0.0), frac)
    left = np.where(high, in_size - 1, left)
    right = np.minimum(left + 1, in_size - 1)
    return left, right, frac.astype(np.float32)


def resize_linear(array: np.ndarray, out_h: int, out_w: int) -> np.ndarray:
    """Bilinear resize with OpenCV ``cv2.resize(..., INTER_LINEAR)`` semantics, float32.

    Half-pixel centres, no antialias (also when shrinking), edge clamping; the
    horizontal pass runs first, both in float32.

    Args:
      array: [H, W] or [H, W, C] numeric array (converted to float32).
      out_h, out_w: output size (> 0).

    Returns:
      f32[out_h, out_w] or f32[out_h, out_w, C].
    """
    a = np.asarray(array, dtype=np.float32)
    if a.ndim not in (2, 3) or a.shape[0] == 0 or a.shape[1] == 0:
        raise ValueError(f"array must have shape [H, W] or [H, W, C] with H, W > 0; "
                         f"got {a.shape}")
    if out_h <= 0 or out_w <= 0:
        raise ValueError(f"output size must be positive; got {out_h}x{out_w}")
    if (out_h, out_w) == a.shape[:2]:
        return a.copy()
    left, right, fx = _cv2_linear_taps(a.shape[1], out_w)
    fx = fx.reshape((1, out_w) + (1,) * (a.ndim - 2))
    rows = a[:, left] * (np.float32(1.0) - fx) + a[:, right] * fx
    top, bottom, fy = _cv2_linear_taps(a.shape[0], out_h)
    fy = fy.reshape((out_h, 1) + (1,) * (a.ndim - 2))
    return (rows[top] * (np.float32(1.0) - fy) + rows[bottom] * fy).astype(np.float32)


def letterbox(array: np.ndarray, size: int | tuple[int, int] = MODEL_SIZE) -> np.ndarray:
    """RClicks ``padding``: resize into the canvas keeping the aspect ratio, paste centred.

    Args:
      array: [H, W] or [H, W, C] (image after `normalize_image`, or a float mask).
      size: canvas side or (height, width).

    Returns:
      f32[canvas_h, canvas_w(, C)], zeros outside the pasted region.
    """
    a = np.asarray(array)
    if a.ndim not in (2, 3):
        raise ValueError(f"array must have shape [H, W] or [H, W, C]; got {a.shape}")
    g = letterbox_geometry(a.shape[0], a.shape[1], size)
    out = np.zeros((g.canvas_h, g.canvas_w) + a.shape[2:], np.float32)
    out[g.top:g.top + g.resized_h, g.left:g.left + g.resized_w] = resize_linear(
        a, g.resized_h, g.resized_w)
    return out


def normalize_image(image: np.ndarray, mean: tuple[float, float, float] = IMAGENET_MEAN,
                    std: tuple[float, float, float] = IMAGENET_STD) -> np.ndarray:
    """ImageNet normalisation ``(I/255 − mean)/std`` in float32.

    Args:
      image: [H, W, 3] RGB, uint8 or float in 0..255.

    Returns:
      f32[H, W, 3].
    """
    img = np.asarray(image)
    if img.ndim != 3 or img.shape[2] != 3:
        raise ValueError(f"image must have shape [H, W, 3]; got {img.shape}")
    x = (img.astype(np.float64) / 255.0).astype(np.float32)
    mean32 = np.asarray(mean, np.float32)
    inv_std = (np.float32(1.0) / np.asarray(std, np.float32)).astype(np.float32)
    return ((x - mean32) * inv_std).astype(np.float32)


def prepare_inputs(image: np.ndarray, gt_mask: np.ndarray, error_mask: np.ndarray,
                   size: int | tuple[int, int] = MODEL_SIZE) -> tuple[np.ndarray, np.ndarray]:
    """Model inputs for one sample (normalise, then letterbox each array).

    Args:
      image: [H, W, 3] RGB in 0..255.
      gt_mask: [H, W] GT object mask G (bool or float in [0, 1]).
      error_mask: [H, W] error mask E (bool or float in [0, 1]).
      size: canvas side (416).

    Returns:
      (image f32[S, S, 3], aux f32[S, S, 2] = [G, E] letterboxed).
    """
    img = np.asarray(image)
    for name, m in (("gt_mask", gt_mask), ("error_mask", error_mask)):
        if np.shape(m) != img.shape[:2]:
            raise ValueError(f"{name} has shape {np.shape(m)}; the image is {img.shape[:2]}")
    x = letterbox(normalize_image(img), size)
    aux = np.stack([letterbox(np.asarray(gt_mask, np.float32), size),
                    letterbox(np.asarray(error_mask, np.float32), size)], axis=-1)
    return x, aux


def unletterbox(maps: jnp.ndarray, original_hw: tuple[int, int]) -> jnp.ndarray:
    """Crops the pasted region of canvas maps and resizes it to the original size.

    Args:
      maps: f32[..., canvas_h, canvas_w].
      original_hw: static (H, W) of the original image.

    Returns:
      f32[..., H, W] (bilinear, align_corners=False, no antialias).
    """
    g = letterbox_geometry(original_hw[0], original_hw[1], maps.shape[-2:])
    crop = maps[..., g.top:g.top + g.resized_h, g.left:g.left + g.resized_w]
    return resize_bilinear(crop, (g.height, g.width))


def minmax_per_sample(x: jnp.ndarray, eps: float = 1e-9) -> jnp.ndarray:
    """``(x − min)/(max − min + eps)`` per sample over all axes but the first.

    Args:
      x: f32[B, ...].
      eps: added to the range (1e-9 in the model's forward, 1e-8 in the benchmark
        wrapper; 0 reproduces the metric wrapper's second normalisation, which is
        NaN for a constant map).

    Returns:
      f32[B, ...] in [0, 1].
    """
    axes = tuple(range(1, x.ndim))
    low = jnp.min(x, axis=axes, keepdims=True)
    high = jnp.max(x, axis=axes, keepdims=True)
    return (x - low) / (high - low + eps)
