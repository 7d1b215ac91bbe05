"""The authors' isegm predictor as a click attack sees it (docs/protocols/tetris.md, "Families").

The TETRIS authors attack RITM, SimpleClick and CFR-ICL through their isegm
predictor: for each click the predictor's transforms (the zoom-in, then the
horizontal flip) are applied once to the image, to the previous-prediction
channel and to the ground truth, and the click is optimised in the zoomed
crop's frame with that ROI fixed. `PredictorView` gives a click protocol
what it needs for that, as pure functions (`jaxseg_robust.attacks.predictor_clicks`
runs them):

* `PredictorView.crop`: the ROI of the click (the zoom-in's rule, with the
  baseline click among the clicks) and the crops of image, previous
  probability map and G+ (bilinear ``align_corners=True``; G+ binarised at
  0.5), the clicks in crop pixels (`PredictorCrop`). Without a zoom-in the
  "crop" is the frame itself.
* `PredictorView.predict`: the network on the crop and, with the flip, on
  its mirror, whose click maps are the pixel mirror of the first half's (the
  authors mirror the rendered maps); returns the per-half probabilities
  (mirrored back) for the Dice term, and the prediction the predictor returns
  (flip average of the logits, sigmoid, pasted back into the frame).
* `PredictorView.to_image`: a crop-frame click clipped to the crop grid and
  mapped back to image pixels by the zoom-in's inverse.
* CDNet (`IsegmOptions.resize_hw`, ``pixel_diffusion``): the "crop" is
  the whole image resized (``ResizeTrans``), and the Dice term reads the
  pixel-diffused flip average (the TETRIS authors' CDNet loop), not the halves.
* `PredictorView.refine`: CFR-ICL's cascade after the accepted click (the
  remaining passes of `isegm.predict_click`, not optimised).
"""

from __future__ import annotations

import dataclasses

import flax.struct
import jax
import jax.numpy as jnp

from jaxseg_robust.models.clickmap.isegm import (IsegmOptions, IsegmState, cascade_refine, predictor_logits,
                                                 whole_image_roi)
from jaxseg_robust.models.clickmap.zoom_in import crop_clicks, crop_resize, paste_back, update_roi


@flax.struct.dataclass
class PredictorCrop:
    """One click's view through the predictor's transforms (ROI fixed for the click).

    Attributes:
      roi: i32[4] (rmin, rmax, cmin, cmax) inclusive, frame pixels (the frame itself without zoom-in).
      image: f32[h, w, 3] the crop in [0, 1]; prev: f32[h, w] the cropped previous probability map.
      target: f32[h, w] the cropped G+ binarised at 0.5 ({0, 1}).
      points: f32[N, 2] every click (x, y) in crop pixels (the current one at its baseline position).
      state: the `IsegmState` whose ``zoom`` is this click's ROI (``prev_prob`` still the previous map).
    """

    roi: jnp.ndarray
    image: jnp.ndarray
    prev: jnp.ndarray
    target: jnp.ndarray
    points: jnp.ndarray
    state: IsegmState


def _inside(original_hw, frame) -> jnp.ndarray:
    """bool[Hf, Wf] pixels of the image."""
    return (jnp.arange(frame[0])[:, None] < original_hw[0]) & (jnp.arange(frame[1])[None, :] < original_hw[1])


@dataclasses.dataclass(frozen=True)
class PredictorView:
    """A click-map segmenter seen through the authors' predictor (static; see the module docstring).

    Attributes:
      segmenter: the `ClickMapSegmenter` (soft disks for a gradient attack).
      options: its `IsegmOptions` (zoom-in, flip, cascade).
    """

    segmenter: object
    options: IsegmOptions

    def initial_state(self, frame_hw: tuple[int, int]) -> IsegmState:
        """The predictor's state after ``set_input_image`` (zeros, no ROI)."""
        return IsegmState.initial(tuple(frame_hw))

    def grid_hw(self, frame_hw: tuple[int, int]) -> tuple[int, int]:
        """(h, w) of the grid the click lives on: the zoom target, or the frame without zoom-in."""
        target = self.options.target_hw
        return tuple(frame_hw) if target is None else target

    def crop(self, features, original_hw, points, labels, target, state: IsegmState) -> PredictorCrop:
        """The click's crop.

        Args:
          features: the segmenter's `ClickMapFeatures` (image f32[Hf, Wf, 3] in [0, 1]);
          original_hw: i32[2] the image inside the frame.
          points: f32[N, 2] (x, y) image pixels, the current click at its baseline position;
          labels: i32[N] (-1 unused); target: f32[Hf, Wf] G+ in {0, 1}; state: the predictor's state.
        """
        zoom, size = self.options.zoom_in, self.options.target_hw
        image = features.image
        if size is None:
            roi = jnp.stack([0, image.shape[0] - 1, 0, image.shape[1] - 1]).astype(jnp.int32)
            return PredictorCrop(roi=roi, image=image, prev=state.prev_prob, target=(target > 0.5).astype(jnp.float32),
                                 points=points, state=state)
        if zoom is None:  # CDNet's ResizeTrans: the whole image, resized
            zoom_state = state.zoom.replace(roi=whole_image_roi(original_hw))
        else:
            zoom_state = update_roi(state.zoom, state.prev_prob, state.has_prev, points, labels, original_hw, zoom)
        stacked = jnp.concatenate([image, state.prev_prob[..., None], target[..., None]], axis=-1)
        crop = crop_resize(stacked, zoom_state.roi, size)
        return PredictorCrop(roi=zoom_state.roi, image=crop[..., :3], prev=crop[..., 3],
                             target=(crop[..., 4] > 0.5).astype(jnp.float32),
                             points=crop_clicks(points, zoom_state.roi, size),
                             state=state.replace(zoom=zoom_state))

    def predict(self, params, crop: PredictorCrop, points, labels, original_hw, frame_hw):
        """The network on the crop (and its mirror) for clicks ``points`` f32[N, 2] in crop pixels.

        Returns:
          (halves f32[B, h, w]: sigmoid of each batch half's logits, the mirrored half flipped back
          (B = 2 with the flip, else 1); prob f32[Hf, Wf]: the predictor's output, flip average of
          the logits, sigmoid, pasted back, zero outside the image; the `IsegmState` after it).
        """
        seg = self.segmenter
        maps = seg.click_features(points, labels, crop.prev)
        if self.options.with_flip:
            logits = seg.network_logits(params, jnp.stack([crop.image, crop.image[:, ::-1]]),
                                        jnp.stack([maps, maps[:, ::-1]]))
            halves = jnp.stack([logits[0], logits[1][:, ::-1]])
        else:
            halves = seg.grid_logits(params, crop.image, points, labels, crop.prev)[None]
        logits = predictor_logits(self.options, crop.image, jnp.mean(halves, axis=0), maps)
        if self.options.pixel_diffusion:  # the Dice term reads the diffused prediction (adv-clicks' CDNet)
            halves = logits[None]
        prob = jax.nn.sigmoid(logits)
        if self.options.target_hw is not None:
            prob = paste_back(prob, crop.roi, tuple(frame_hw))
        prob = jnp.where(_inside(original_hw, tuple(frame_hw)), prob, 0.0)
        state = crop.state.replace(prev_prob=prob, has_prev=jnp.asarray(True))
        return jax.nn.sigmoid(halves), prob, state

    def to_image(self, crop: PredictorCrop, point) -> jnp.ndarray:
        """f32[2] (row, col) image pixels of a crop-frame click (x, y): clipped to the crop grid
        (``[0, h - 1] x [0, w - 1]``), then ``v (vmax - vmin + 1) / t + vmin`` per axis."""
        h, w = crop.prev.shape
        col = jnp.clip(point[0], 0.0, w - 1.0)
        row = jnp.clip(point[1], 0.0, h - 1.0)
        if self.options.target_hw is None:
            return jnp.stack([row, col])
        roi = crop.roi.astype(jnp.float32)
        return jnp.stack([row * (roi[1] - roi[0] + 1.0) / h + roi[0], col * (roi[3] - roi[2] + 1.0) / w + roi[2]])

    @property
    def refines(self) -> bool:
        """Whether `refine` can change the prediction (CFR-ICL's cascade)."""
        cascade = self.options.cascade
        return cascade is not None and cascade.steps > 1

    def refine(self, params, features, original_hw, points, labels, num_clicks, prob, state: IsegmState):
        """CFR-ICL's cascade after the accepted click: (prob f32[Hf, Wf], `IsegmState`); the identity
        without one. ``points`` are image pixels (x, y) with the accepted click; ``num_clicks`` i32[]."""
        if not self.refines:
            return prob, state
        return cascade_refine(self.segmenter, params, features.image, original_hw, points, labels, num_clicks, prob,
                              state, self.options)
