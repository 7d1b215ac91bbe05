"""`Sam2Predictor`: a drop-in for ``sam2.sam2_image_predictor.SAM2ImagePredictor`` (one image).

    predictor = zoo.load("sam2.1_hiera_large")
    predictor.set_image(image)                          # uint8[H, W, 3] RGB
    masks, scores, low_res = predictor.predict(point_coords=np.array([[x, y]]),
                                               point_labels=np.array([1]),
                                               multimask_output=False)

The call signature is SamPredictor's (``point_coords``, ``point_labels``,
``box``, ``mask_input``, ``multimask_output``, ``return_logits``; also
``predict(image, ...)``) plus the official ``normalize_coords`` (False:
coordinates are already relative to the image, in [0, 1]). Outputs follow
the official predictor: masks bool[C, H, W] (float logits with
``return_logits``), scores f32[C] (sigmoid IoU predictions), low_res
f32[C, 256, 256] clamped to [-32, 32]; C = 3 with ``multimask_output``, else
1 with the dynamic stability fallback. See docs/models/sam2.md.

Not covered: the official batched forms (several boxes or point sets per
call, ``set_image_batch``); use ``predictor.segmenter`` with ``jax.vmap``.
"""

from __future__ import annotations

import numpy as np

from jaxseg_robust.models.sam.predictor import SamPredictor


class Sam2Predictor(SamPredictor):
    """Image-at-a-time SAM 2 predictor (``SAM2ImagePredictor.predict``-compatible)."""

    def _predict(self, point_coords=None, point_labels=None, box=None, mask_input=None,
                 multimask_output: bool = True, return_logits: bool = False,
                 normalize_coords: bool = True, *, image=None):
        """`predict` with the official parameters (see `SamPredictor._predict`).

        Returns:
          (masks bool[C, H, W] or f32 logits, scores f32[C], low_res f32[C, 256, 256]
          clamped to [-32, 32]).
        """
        return self._predict_sam2(point_coords, point_labels, box, mask_input, return_logits,
                                  normalize_coords, image,
                                  dict(multimask_output=bool(multimask_output)))

    def _predict_sam2(self, point_coords, point_labels, box, mask_input, return_logits,
                      normalize_coords, image, select_options: dict):
        """`predict` of SAM 2's predictors; ``select_options`` go to ``segmenter.select``."""
        if image is not None:
            self.set_image(image)
        if not normalize_coords and self.is_image_set:
            h, w = self.original_size
            if point_coords is not None:
                point_coords = np.asarray(point_coords, np.float32) * np.float32([w, h])
            if box is not None:
                box = (np.asarray(box, np.float32).reshape(-1, 2) * np.float32([w, h])).reshape(-1)
        masks, scores, low_res = self._predict_with(
            point_coords, point_labels, box, mask_input, return_logits, None, select_options)
        return masks, scores, np.asarray(self.segmenter.clamp_low_res(low_res))


class Sam2HQPredictor(Sam2Predictor):
    """HQ-SAM 2's ``SAM2ImagePredictor`` (SysCV/sam-hq ``sam-hq2``): ``predict`` takes its
    ``hq_token_only`` (default False).

    Outputs as `Sam2Predictor`, each mask being the selected SAM candidate plus
    the HQ mask (C = 3 with ``multimask_output``, else 1); with
    ``hq_token_only`` one mask, the HQ mask alone, and the selected SAM
    candidate's score (the official code returns the C SAM scores beside it).
    """

    def _predict(self, point_coords=None, point_labels=None, box=None, mask_input=None,
                 multimask_output: bool = True, hq_token_only: bool = False,
                 return_logits: bool = False, normalize_coords: bool = True, *, image=None):
        """`predict` with the official parameters (see `Sam2Predictor`)."""
        return self._predict_sam2(point_coords, point_labels, box, mask_input, return_logits,
                                  normalize_coords, image,
                                  dict(multimask_output=bool(multimask_output),
                                       hq_token_only=bool(hq_token_only)))


__all__ = ["Sam2Predictor", "Sam2HQPredictor"]
