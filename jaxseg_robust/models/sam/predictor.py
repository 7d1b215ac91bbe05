"""`SamPredictor`: a drop-in for ``segment_anything.SamPredictor`` on our functional SAM.

    predictor = zoo.load("sam_vit_b")
    predictor.set_image(image)                          # uint8[H, W, 3] RGB
    masks, scores, low_res = predictor.predict(point_coords=np.array([[x, y]]),
                                               point_labels=np.array([1]))
    masks, scores, low_res = predictor.predict(image, box=np.array([x1, y1, x2, y2]))

Shapes and semantics follow the reference: masks bool[C, H, W] (float logits
with ``return_logits``), scores f32[C], low_res f32[C, 256, 256] (numpy),
C = 3 with ``multimask_output`` else 1; ``mask_input`` is a previous
f32[1, 256, 256]. The image goes through the uint8 PIL resize of
``SamPredictor.set_image`` by default.

This is the convenience layer; batched and differentiable use goes through
``predictor.segmenter`` and ``predictor.params``. Point-slot counts are
rounded up to a power of two, so a few compiled decoders serve every call.

`SamHQPredictor` is the same for SAM-HQ models (``segment_anything_hq``'s
predictor: an extra ``hq_token_only`` argument, one output mask).

Difference from the reference: an explicitly empty ``point_coords`` (shape
[0, 2]) is treated like ``None`` (the reference would still append its
padding token).
"""

from __future__ import annotations

import jax
import numpy as np

from jaxseg_robust.models.image_predictor import ImagePredictor, prompt_slots, rgb_image
from jaxseg_robust.models.sam.segmenter import SamFeatures, SamSegmenter
from jaxseg_robust.prompts.types import make_prompts


class SamPredictor(ImagePredictor):
    """Image-at-a-time SAM predictor (SamPredictor-compatible); ``config`` is a `SamConfig`.

    Attributes:
      segmenter: the `SamSegmenter` (static config).
      params: the parameter pytree.
      name: the model name or directory it was loaded from.
    """

    def __init__(self, segmenter: SamSegmenter, params, name: str = ""):
        super().__init__(segmenter, params, name)
        self._embed = jax.jit(segmenter.embed)
        self._decode = jax.jit(segmenter.decode_low_res)
        self._upsample = jax.jit(segmenter.upsample)

    def reset_image(self) -> None:
        """Forgets the current image."""
        self.is_image_set = False
        self.features: SamFeatures | None = None
        self.transform = None
        self.original_size: tuple[int, int] | None = None
        self.input_size: tuple[int, int] | None = None

    def set_image(self, image: np.ndarray, image_format: str = "RGB") -> None:
        """Computes and caches the embedding of a uint8[H, W, 3] image ("RGB" or "BGR")."""
        image = rgb_image(image, image_format)
        x, transform = self.segmenter.preprocess(image)
        self.reset_image()
        self.features = self._embed(self.params, x)
        self.transform = transform
        self.original_size = (int(image.shape[0]), int(image.shape[1]))
        self.input_size = tuple(int(v) for v in np.asarray(transform.resized_hw))
        self.is_image_set = True

    def get_image_embedding(self) -> np.ndarray:
        """f32[1, C, E, E] (channels-first, as the reference) embedding of the current image."""
        if not self.is_image_set:
            raise RuntimeError("An image must be set with .set_image(...) to get an embedding.")
        return np.asarray(self.features.image_embeddings).transpose(2, 0, 1)[None]

    def _predict(self, point_coords=None, point_labels=None, box=None, mask_input=None,
                 multimask_output: bool = True, return_logits: bool = False, *, image=None):
        """Predicts masks for prompts on the current image (``predict``'s forms are
        `ImagePredictor.predict`'s: a 3-D first argument, or ``image=``, is set first).

        Args:
          point_coords: [N, 2] (x, y) original-image pixels, or None.
          point_labels: [N] 1 foreground / 0 background; required with points.
          box: [4] (x1, y1, x2, y2) original-image pixels, or None.
          mask_input: [1, 256, 256] (or [256, 256]) previous low-res logits, or None.
          multimask_output: 3 candidates if True, else 1.
          return_logits: return float logits instead of boolean masks.
          image: optional uint8[H, W, 3] RGB to set first.

        Returns:
          (masks bool[C, H, W] or f32 logits, scores f32[C], low_res f32[C, 256, 256]).

        Raises:
          RuntimeError: no image set. ValueError: malformed prompts.
        """
        return self._predict_with(point_coords, point_labels, box, mask_input, return_logits,
                                  image, dict(multimask_output=bool(multimask_output)))

    def _predict_with(self, point_coords, point_labels, box, mask_input, return_logits, image,
                      select_options: dict):
        """`predict`; ``select_options`` go to ``segmenter.select``."""
        if image is not None:
            self.set_image(image)
        self._require_image()
        low = self.config.low_res_size
        if point_coords is not None:
            if point_labels is None:
                raise ValueError("point_labels must be supplied if point_coords is supplied.")
            point_coords = np.asarray(point_coords, np.float32)
            point_labels = np.asarray(point_labels)
            if point_coords.ndim != 2 or point_coords.shape[1] != 2:
                raise ValueError(f"point_coords must have shape [N, 2]; got {point_coords.shape}")
        elif point_labels is not None:
            raise ValueError("point_labels given without point_coords")
        if mask_input is not None:
            mask_input = np.asarray(mask_input, np.float32)
            if mask_input.shape not in ((1, low, low), (low, low)):
                raise ValueError(f"mask_input must have shape [1, {low}, {low}]; "
                                 f"got {mask_input.shape}")
            mask_input = mask_input.reshape(low, low)
        n = 0 if point_coords is None else int(point_coords.shape[0])
        prompts = make_prompts(point_coords, point_labels, box, mask_input,
                               num_slots=prompt_slots(n), mask_shape=(low, low))
        low_res, iou = self._decode(self.params, self.features, prompts, self.transform)
        low_res, iou, _ = self.segmenter.select(low_res, iou, **select_options)
        masks = np.asarray(self._upsample(low_res, self.transform))
        if not return_logits:
            masks = masks > 0.0
        return masks, np.asarray(iou), np.asarray(low_res)


class SamHQPredictor(SamPredictor):
    """``segment_anything_hq.SamPredictor``-compatible predictor for SAM-HQ models.

    ``predict`` takes the reference's extra ``hq_token_only`` (default False)
    and, as the reference, always returns one mask (C = 1): the chosen SAM
    candidate plus the HQ mask, or the HQ mask alone (see `hq_select`).
    The cached features hold the early encoder feature too.
    """

    def _predict(self, point_coords=None, point_labels=None, box=None, mask_input=None,
                 multimask_output: bool = True, return_logits: bool = False,
                 hq_token_only: bool = False, *, image=None):
        """`predict` with the reference's parameters (see `SamPredictor._predict`).

        Returns:
          (masks bool[1, H, W] or f32 logits, scores f32[1], low_res f32[1, 256, 256]).
        """
        return self._predict_with(point_coords, point_labels, box, mask_input, return_logits,
                                  image, dict(multimask_output=bool(multimask_output),
                                              hq_token_only=bool(hq_token_only)))
