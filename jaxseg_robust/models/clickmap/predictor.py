"""`ClickMapPredictor`: ``zoo.load(...).predict(...)`` for RITM / SimpleClick / CFR-ICL.

    predictor = zoo.load("ritm_hrnet18_cocolvis")
    masks, scores, probs = predictor.predict(image, point_coords=np.array([[x, y]]),
                                             point_labels=np.array([1]))
    masks, scores, probs = predictor.predict(point_coords=..., point_labels=...,
                                             mask_input=probs)          # next click

The signature is SAM's (``SamPredictor.predict``). Semantics for this family
(docs/models/click_models.md):

* without ``options`` the network runs once on the full image with the clicks
  and ``mask_input`` (the previous probability map, f32[1, H, W] or [H, W];
  zeros when None): ``sigmoid`` of the returned logits equals the authors'
  ``model(image, points)["instances"]`` for the same clicks and previous mask;
* with ``options`` (`IsegmOptions`, e.g. ``authors_options("simpleclick")``)
  one step of the authors' predictor runs: zoom-in, flip averaging, cascade;
  the predictor then keeps the predictor state (previous map, zoom ROI) until
  the next `set_image`, as isegm's ``BasePredictor`` does, and ``mask_input``
  overrides the kept previous map when given;
* returns ``(masks bool[1, H, W] = prob > 0.49 (or logits f32[1, H, W] with
  return_logits), scores f32[1] (zeros: no quality head), probs f32[1, H, W])``;
  ``probs`` is what to pass back as ``mask_input``;
* boxes and ``multimask_output`` are not supported by these models (a box is
  an error; ``multimask_output`` is ignored).

SimpleClick without options needs image sides that are multiples of the
patch size (the authors' model runs at their zoom-in size); use the options.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from jaxseg_robust.models.clickmap.isegm import IsegmOptions, IsegmState, predict_click
from jaxseg_robust.models.clickmap.segmenter import ClickMapSegmenter
from jaxseg_robust.models.image_predictor import ImagePredictor, prompt_slots, rgb_image


@functools.lru_cache(maxsize=32)
def compiled_grid_logits(segmenter: ClickMapSegmenter):
    """``jax.jit(segmenter.grid_logits)``, one per segmenter: every predictor of a model
    (and any caller) shares its compiled programs."""
    return jax.jit(segmenter.grid_logits)


@functools.lru_cache(maxsize=32)
def compiled_step(segmenter: ClickMapSegmenter, options: IsegmOptions):
    """One jitted `predict_click` step per (segmenter, options), shared like `compiled_grid_logits`."""

    def step(params, image, original_hw, points, labels, num_clicks, state):
        return predict_click(segmenter, params, image, original_hw, points, labels, num_clicks,
                             state, options)

    return jax.jit(step, static_argnums=(5,))


class ClickMapPredictor(ImagePredictor):
    """Image-at-a-time predictor for click-map models.

    Attributes:
      segmenter: the `ClickMapSegmenter` (static config).
      params: the parameter pytree.
      name: the model name or directory it was loaded from.
    """

    def __init__(self, segmenter: ClickMapSegmenter, params, name: str = ""):
        super().__init__(segmenter, params, name)
        self._logits = compiled_grid_logits(segmenter)

    def reset_image(self) -> None:
        """Forgets the image and the predictor state."""
        self.is_image_set = False
        self.image = None
        self.original_size = None
        self.state = None
        self.num_clicks = 0

    def set_image(self, image: np.ndarray, image_format: str = "RGB") -> None:
        """Sets a uint8[H, W, 3] image ("RGB" or "BGR") and resets the predictor state."""
        image = rgb_image(image, image_format)
        x, transform = self.segmenter.preprocess(image)
        self.reset_image()
        self.image, self.transform = x, transform
        self.original_size = (int(image.shape[0]), int(image.shape[1]))
        self.state = IsegmState.initial(self.original_size)
        self.is_image_set = True

    def _predict(self, point_coords=None, point_labels=None, box=None, mask_input=None,
                 multimask_output: bool = True, return_logits: bool = False, *,
                 image=None, options: IsegmOptions | None = None):
        """Predicts one mask (see the module docstring)."""
        if image is not None:
            self.set_image(image)
        self._require_image()
        if box is not None:
            raise ValueError(f"{self.name or 'this model'}: click-map models take clicks only; "
                             f"box prompts are not supported")
        points, labels = self._clicks(point_coords, point_labels)
        prev = self._mask_input(mask_input)
        if options is None:
            prev = np.zeros(self.original_size, np.float32) if prev is None else prev
            logits = self._logits(self.params, self.image, points, labels, jnp.asarray(prev))
            prob = jax.nn.sigmoid(logits)
        else:
            state = self.state if prev is None else self.state.replace(
                prev_prob=jnp.asarray(prev), has_prev=jnp.asarray(True))
            self.num_clicks = int(np.sum(np.asarray(labels) >= 0))
            prob, self.state = compiled_step(self.segmenter, options)(self.params, self.image,
                                                   self.transform.original_hw, points, labels,
                                                   self.num_clicks, state)
            logits = jnp.log(prob) - jnp.log1p(-prob)
        prob = np.asarray(prob)[None]
        out = np.asarray(logits)[None] if return_logits else prob > options_threshold(options)
        return out, np.zeros((1,), np.float32), prob

    def _clicks(self, point_coords, point_labels):
        """Padded clicks: (f32[N, 2] (x, y), i32[N]) with N a power of two."""
        if point_coords is None:
            if point_labels is not None:
                raise ValueError("point_labels given without point_coords")
            point_coords = np.zeros((0, 2), np.float32)
            point_labels = np.zeros((0,), np.int32)
        elif point_labels is None:
            raise ValueError("point_labels must be supplied if point_coords is supplied.")
        coords = np.asarray(point_coords, np.float32)
        labels = np.asarray(point_labels)
        if coords.ndim != 2 or coords.shape[1] != 2:
            raise ValueError(f"point_coords must have shape [N, 2] (x, y); got {coords.shape}")
        if labels.shape != (coords.shape[0],):
            raise ValueError(f"point_labels must have shape [{coords.shape[0]}]; "
                             f"got {labels.shape}")
        if coords.shape[0] and not np.isin(labels, (0, 1)).all():
            raise ValueError(f"point_labels must be 0 or 1; got {np.unique(labels)}")
        n = coords.shape[0]
        slots = prompt_slots(n)
        pts = np.zeros((slots, 2), np.float32)
        pts[:n] = coords
        lab = np.full((slots,), -1, np.int32)
        lab[:n] = labels
        return jnp.asarray(pts), jnp.asarray(lab)

    def _mask_input(self, mask_input):
        if mask_input is None:
            return None
        mask = np.asarray(mask_input, np.float32)
        h, w = self.original_size
        if mask.shape not in ((1, h, w), (h, w)):
            raise ValueError(f"mask_input must be the previous probability map, shape "
                             f"[1, {h}, {w}]; got {mask.shape}")
        return mask.reshape(h, w)


def options_threshold(options: IsegmOptions | None) -> float:
    """The mask threshold of a prediction (0.49 unless the options say otherwise)."""
    return ClickMapSegmenter.probability_threshold if options is None else options.threshold
