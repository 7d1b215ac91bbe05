"""A SAM-family segmenter with fixed prompts as a binary dense model (perturb the image, score the mask).

The perturbation attacks take ``logits_fn(params, images f32[B, H, W, 3] in
[0, 1]) -> f32[B, H, W, C]``. `PromptedSegmenter` turns any `Segmenter` of the
SAM family (``SamSegmenter``, ``SamHQSegmenter``: MobileSAM, SAM, SAM-HQ)
plus one fixed prompt set per image into such a function:

    model = PromptedSegmenter(segmenter)                 # static, hashable
    params = with_prompts(sam_params, tight_box_prompts(gt, 256))   # prompts ride in params
    logits = model.apply(params, images)                 # f32[B, H, W, 2]

The prompts travel inside the ``params`` pytree (`PromptedParams`), so the
attacks (which differentiate with respect to the images only) treat them as
constants and one compiled attack serves every prompt set of a bucket.

The image path is SAM's *float* path, differentiable end to end and the one
the prompt attacks use (``ResizeLongestSide.apply_image_torch``):
``x * 255`` -> antialiased bilinear resize of the longest side to the model
size (torch ``interpolate(bilinear, antialias=True)``,
`ops.resize.resize_bilinear_antialias`) -> ``(x - pixel_mean) / pixel_std``
-> zero-pad to a square -> ``embed`` -> ``decode`` of the image's prompts ->
SAM's ``postprocess_masks`` to ``H x W``. With uint8 images this is exactly
``segmenter.preprocess`` (float path) + ``embed`` + ``decode``. The mask
logit becomes two classes with `binary_logits` (background, object;
foreground = logit > 0, SAM's mask threshold).

``multimask_output=True`` (default) takes SAM's three candidates and the one
with the highest predicted IoU (as the tight-box baseline of BREPS does);
the choice is re-made on every perturbed image, as the model would.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from jaxseg_robust.models.dense.base import binary_logits, check_images
from jaxseg_robust.models.sam.segmenter import make_transform
from jaxseg_robust.ops.boxes import tight_box
from jaxseg_robust.ops.resize import longest_side_shape, pad_to_square, resize_bilinear_antialias
from jaxseg_robust.prompts.types import Prompts, box_prompts, make_prompts


@flax.struct.dataclass
class PromptedParams:
    """The ``params`` pytree of a `PromptedSegmenter`.

    Attributes:
      model: the segmenter's parameter tree.
      prompts: `Prompts` with a leading batch axis B (one fixed prompt set per
        image, coordinates in pixels of that image).
    """

    model: Any
    prompts: Prompts


def with_prompts(model_params, prompts: Prompts) -> PromptedParams:
    """Bundles segmenter parameters and per-image prompts (leading axis B) into `PromptedParams`."""
    if prompts.points.ndim != 3:
        raise ValueError(f"prompts must carry a leading batch axis (points [B, N, 2]); got points "
                         f"{prompts.points.shape}")
    return PromptedParams(model=model_params, prompts=prompts)


def stack_prompts(prompt_sets) -> Prompts:
    """Stacks unbatched `Prompts` (same slot count and mask shape) along a new leading axis."""
    prompt_sets = list(prompt_sets)
    if not prompt_sets:
        raise ValueError("prompt_sets must not be empty")
    return jax.tree.map(lambda *leaves: jnp.stack(leaves), *prompt_sets)


def tight_box_prompts(gt, low_res_size: int) -> Prompts:
    """One prompt per image: the inclusive tight box of ``gt == 1`` (BREPS §2.4), no clicks.

    Args:
      gt: int[B, H, W] ground truth (1 object, 0 background, -1 ignore) or
        bool[B, H, W] object masks.
      low_res_size: side of the model's feedback map (SAM: 256; ``segmenter.feedback_shape``),
        for the unused mask slot.

    Returns:
      `Prompts` with leading axis B (`jaxseg_robust.prompts.types.box_prompts` of each image): box
      ``(x1, y1, x2, y2)`` in pixels (an empty mask gives ``(0, 0, 1, 1)``), one padding point slot.
    """
    gt = jnp.asarray(gt)
    if gt.ndim != 3:
        raise ValueError(f"gt must have shape [B, H, W]; got {gt.shape}")
    boxes = tight_box(gt == 1 if gt.dtype != jnp.bool_ else gt).astype(jnp.float32)
    return jax.vmap(lambda box: box_prompts(box, (low_res_size, low_res_size)))(boxes)


@dataclasses.dataclass(frozen=True)
class PromptedSegmenter:
    """A SAM-family `Segmenter` with fixed per-image prompts as a binary `DenseModel`.

    Attributes:
      segmenter: a ``SamSegmenter`` / ``SamHQSegmenter`` (static configuration).
      multimask_output: decode SAM's 3 candidates and keep the best by
        predicted IoU (True) or the single-mask output (False).
    """

    segmenter: Any
    multimask_output: bool = True
    num_classes: int = dataclasses.field(default=2, init=False)
    background_class: int | None = dataclasses.field(default=0, init=False)

    @property
    def low_res_size(self) -> int:
        """Side of the segmenter's low-resolution logits (for `tight_box_prompts`)."""
        return int(self.segmenter.config.low_res_size)

    def model_input(self, images: jnp.ndarray) -> jnp.ndarray:
        """f32[B, H, W, 3] in [0, 1] -> f32[B, S, S, 3] SAM input (resize, normalise, zero-pad)."""
        check_images(images)
        cfg = self.segmenter.config
        resized_hw = longest_side_shape(images.shape[1], images.shape[2], cfg.image_size)
        resized = jax.vmap(lambda image: resize_bilinear_antialias(image * 255.0, resized_hw))(images)
        normalised = ((resized - jnp.asarray(cfg.pixel_mean, resized.dtype))
                      / jnp.asarray(cfg.pixel_std, resized.dtype))
        return jax.vmap(lambda x: pad_to_square(x, cfg.image_size))(normalised)

    def mask_logits(self, params: PromptedParams, images: jnp.ndarray) -> jnp.ndarray:
        """The selected mask's logits at the input resolution.

        Args:
          params: `PromptedParams` whose prompts have leading axis B.
          images: f32[B, H, W, 3] RGB in [0, 1].

        Returns:
          f32[B, H, W] mask logits (object where > 0).
        """
        check_images(images)
        batch, height, width = images.shape[:3]
        if params.prompts.points.ndim != 3 or params.prompts.points.shape[0] != batch:
            raise ValueError(f"params.prompts must hold one prompt set per image ({batch}); got points "
                             f"{params.prompts.points.shape}")
        cfg = self.segmenter.config
        transform = make_transform((height, width),
                                   longest_side_shape(height, width, cfg.image_size), (height, width))
        features = self.segmenter.embed(params.model, self.model_input(images))

        def decode(image_features, prompts):
            return self.segmenter.decode(params.model, image_features, prompts, transform,
                                         multimask_output=self.multimask_output).logits

        return jax.vmap(decode)(features, params.prompts)

    def apply(self, params: PromptedParams, images: jnp.ndarray) -> jnp.ndarray:
        """f32[B, H, W, 3] in [0, 1] -> f32[B, H, W, 2] logits (background, object), `binary_logits`."""
        return binary_logits(self.mask_logits(params, images))

    def init(self, key: jax.Array) -> PromptedParams:
        """Random segmenter parameters with one whole-frame box prompt (a batch of one model-size image)."""
        side = float(self.segmenter.config.image_size - 1)
        prompts = make_prompts(box=[0.0, 0.0, side, side], mask_shape=(self.low_res_size,) * 2)
        return with_prompts(self.segmenter.init(key), stack_prompts([prompts]))
