"""`Sam3Segmenter`: SAM 3's interactive image path behind the Segmenter protocol.

The SAM-1 task of SAM 3 (``Sam3Processor.set_image`` then
``Sam3Image.predict_inst``; docs/models/sam3.md)::

    seg = Sam3Segmenter(config)                 # static configuration only
    x, transform = seg.preprocess(image)        # uint8[H, W, 3] -> f32[1008, 1008, 3]
    features = jax.jit(seg.embed)(params, x)    # once per image
    pred = jax.jit(seg.decode, static_argnames="multimask_output")(
        params, features, prompts, transform, multimask_output=True)

Differences from `Sam2Segmenter` (everything else is inherited: SAM 2's
prompt encoder with the padding-point rule, the mask decoder with the
object-score token and the high-resolution features, ``no_mem_embed`` on the
stride-1 level, the output selection with the dynamic stability fallback,
the clamped low-res feedback):

* the image encoder is `Sam3ImageEncoder` (ViT with RoPE + the SAM 2 neck);
* preprocessing is ``Sam3Processor``'s on a GPU: the uint8 image resized to
  S x S without keeping the aspect ratio by torchvision's ``v2.Resize``, which
  on CUDA resizes in float32 (antialiased bilinear) and rounds back to uint8
  (half to even), then scaled to [0, 1] and normalised with mean and std 0.5
  (on the CPU torchvision runs its uint8 kernel instead, one level apart on
  some pixels; docs/models/sam3.md);
* the full-resolution logits are ``SAM3InteractiveImagePredictor``'s: holes
  of the low-res mask (8-connected components of logits <= 0 of at most
  ``max_hole_area`` pixels) are set to logit 10 before the bilinear resize
  to (H, W) (`fill_small_holes`); the low-res logits and feedback are not
  filled, as in the official predictor.

``decode`` is pure, vmappable over prompt sets and instances, and
differentiable w.r.t. ``prompts.points`` and ``prompts.box`` (the hole
filling only replaces values, so gradients flow through every pixel it keeps).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from jaxseg_robust.models.base import FamilyRules, Transform
from jaxseg_robust.models.sam.random_init import random_params
from jaxseg_robust.models.sam.segmenter import make_transform
from jaxseg_robust.models.sam2.segmenter import PROBABILITY_THRESHOLD, Sam2Segmenter
from jaxseg_robust.models.sam3.config import Sam3Config
from jaxseg_robust.models.sam3.image_encoder import Sam3ImageEncoder
from jaxseg_robust.ops.components import component_sizes, label_components
from jaxseg_robust.ops.resize import resize_bilinear_antialias, resize_bilinear_antialias_host

HOLE_LOGIT = 10.0  # SAM2Transforms.postprocess_masks: mask_threshold + 10.0 inside a filled hole


def fill_small_holes(low_res: jnp.ndarray, max_area: float) -> jnp.ndarray:
    """``SAM2Transforms.postprocess_masks``'s hole filling on one low-res map.

    Args:
      low_res: f32[h, w] logits.
      max_area: static; components of the background (logits <= 0), 8-connected
        as skimage's ``label``, with at most this many pixels get `HOLE_LOGIT`.

    Returns:
      f32[h, w] (``low_res`` itself when ``max_area`` is 0).
    """
    if max_area <= 0:
        return low_res
    labels, _ = label_components(low_res <= 0.0, connectivity=8)
    sizes = component_sizes(labels)
    hole = (labels > 0) & (jnp.take(sizes, labels) <= max_area)
    return jnp.where(hole, jnp.asarray(HOLE_LOGIT, low_res.dtype), low_res)


def quantised_resize_host(image: np.ndarray, size: int) -> np.ndarray:
    """torchvision ``v2.Resize((S, S))`` of a uint8 CUDA image: float32 antialiased bilinear, rounded.

    Args:
      image: [H, W, 3] on the 0..255 scale.
      size: S.

    Returns:
      f32[S, S, 3] integer values in [0, 255] (``round_()``: half to even).
    """
    resized = resize_bilinear_antialias_host(np.asarray(image, np.float32), (size, size))
    return np.clip(np.rint(resized), 0, 255).astype(np.float32)


@dataclasses.dataclass(frozen=True)
class Sam3Segmenter(Sam2Segmenter):
    """SAM 3 interactive segmenter (static configuration; weights are passed as ``params``).

    Param tree: ``{"image_encoder": {"trunk", "neck_sam2_convs_{0,1,2}"},
    "prompt_encoder": ..., "mask_decoder": ..., "no_mem_embed": f32[C]}``.
    """

    config: Sam3Config
    probability_threshold: float = PROBABILITY_THRESHOLD
    # The predictor is SAM2ImagePredictor's (sam1_task_predictor.py), so RClicks decodes it as
    # SAM 2: a single mask with the dynamic fallback (models.base.FamilyRules.evaluation_multimask)
    rules: ClassVar[FamilyRules] = FamilyRules(family="sam3", evaluation_multimask=False)

    def __post_init__(self):
        if not isinstance(self.config, Sam3Config):
            raise ValueError(f"Sam3Segmenter needs a Sam3Config; got {type(self.config).__name__}")

    @property
    def image_encoder(self) -> Sam3ImageEncoder:
        """The linen image encoder (f32[B, S, S, 3] -> three neck levels)."""
        return Sam3ImageEncoder(self.config, dtype=self.config.dtype)

    def init(self, key) -> dict:
        """Random parameters of sensible scale (see `random_init.random_params`).

        ``no_mem_embed`` gets N(0, 0.02^2), the official initialiser's scale
        (the position table already does). Drawn on the host, deterministic in ``key``.
        """
        params = random_params(self.param_shapes(), key)
        params["no_mem_embed"] = 0.02 * params["no_mem_embed"]
        return params

    def preprocess(self, image, *, frame_hw: tuple[int, int] | None = None):
        """``Sam3Processor.set_image``: S x S resize rounded to uint8, [0, 1] scaling, normalisation.

        Args:
          image: uint8[H, W, 3] RGB (float values on the 0..255 scale are accepted).
          frame_hw: static output frame (Hf, Wf) >= (H, W) for `decode`'s
            full-resolution logits; default (H, W).

        Returns:
          (f32[S, S, 3] model input, `Transform` with ``resized_hw = (S, S)``).

        Raises:
          ValueError: wrong shape or dtype, or a frame smaller than the image.
        """
        image = np.asarray(image)
        if image.ndim != 3 or image.shape[2] != 3 or min(image.shape[:2]) < 1:
            raise ValueError(f"image must have shape [H, W, 3]; got {image.shape}")
        if not (image.dtype == np.uint8 or np.issubdtype(image.dtype, np.floating)):
            raise ValueError(f"image must be uint8 or float; got {image.dtype}")
        cfg = self.config
        size = cfg.image_size
        scaled = quantised_resize_host(image, size) / np.float32(255.0)
        x = (scaled - np.asarray(cfg.pixel_mean, np.float32)) / np.asarray(cfg.pixel_std, np.float32)
        h, w = int(image.shape[0]), int(image.shape[1])
        return jnp.asarray(x), make_transform((h, w), (size, size), frame_hw)

    def traced_model_input(self, image: jnp.ndarray) -> jnp.ndarray:
        """`preprocess`'s model input as a jittable function of the pixels.

        The rounding to uint8 passes gradients straight through (its own
        derivative is zero almost everywhere).

        Args:
          image: f32[H, W, 3] on the 0..255 scale (static size).

        Returns:
          f32[S, S, 3] (the same numbers as `preprocess`, to float32 rounding).
        """
        cfg = self.config
        size = cfg.image_size
        resized = resize_bilinear_antialias(image, (size, size))
        rounded = jnp.clip(jnp.round(resized), 0.0, 255.0)
        resized = resized + jax.lax.stop_gradient(rounded - resized)
        return ((resized / 255.0 - jnp.asarray(cfg.pixel_mean, resized.dtype))
                / jnp.asarray(cfg.pixel_std, resized.dtype))

    def upsample(self, low_res: jnp.ndarray, transform: Transform) -> jnp.ndarray:
        """f32[..., 4E, 4E] -> f32[..., Hf, Wf]: `fill_small_holes`, then SAM 2's bilinear resize."""
        area = float(self.config.max_hole_area)
        filled = low_res
        if area > 0:
            flat = low_res.reshape(-1, *low_res.shape[-2:])
            filled = jax.vmap(lambda m: fill_small_holes(m, area))(flat).reshape(low_res.shape)
        return super().upsample(filled, transform)


__all__ = ["Sam3Segmenter", "fill_small_holes", "quantised_resize_host", "HOLE_LOGIT"]
