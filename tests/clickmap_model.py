"""A small click-map test model: the RITM / SimpleClick shape of a family behind the Segmenter contract.

No protocol code is written for it: it only implements the Segmenter
protocol (docs/ARCHITECTURE.md, "The Segmenter seam"). Image in, logits out:

  * ``preprocess``: no resize; the image scaled to [0, 1] and zero-padded
    into the frame (``scale_xy = (1, 1)``, ``resized_hw = original_hw``);
  * ``embed``: two 3x3 convolutions of the image (features f32[Hf, Wf, C]);
  * ``decode``: the clicks rendered as positive / negative disk maps
    (`jaxseg_robust.ops.render.render_soft_click_maps`, differentiable in the
    points) and the previous-mask channel ``sigmoid(mask_logits)`` where
    ``has_mask`` (else 0) are concatenated to the features; two convolutions
    give the logits at the frame (-1e4 outside the image). One candidate;
    ``multimask_output`` has nothing to select. Box prompts are not read.
  * interactive state: ``feedback`` = the previous logits at the frame
    (``feedback_shape(frame) = frame``; ``decode`` reads their sigmoid as the
    previous probability map), ``probability_threshold = 0.49`` (isegm).

Random init (flax's), so the numbers mean nothing; the tests check that every
protocol runs through it and uses its feedback and threshold.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from jaxseg_robust.models.base import Prediction, Transform, image_region
from jaxseg_robust.ops.render import render_soft_click_maps

OUTSIDE_LOGIT = -1e4


class _Encoder(nn.Module):
    channels: int

    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.Conv(self.channels, (3, 3))(x))
        return nn.relu(nn.Conv(self.channels, (3, 3))(x))


class _Head(nn.Module):
    channels: int

    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.Conv(self.channels, (3, 3))(x))
        return nn.Conv(1, (3, 3))(x)[..., 0]


@dataclasses.dataclass(frozen=True)
class ClickMapSegmenter:
    """The click-map test family (static configuration only; see the module docstring)."""

    channels: int = 8
    radius: float = 5.0
    probability_threshold: ClassVar[float] = 0.49

    def init(self, seed: int = 0) -> dict:
        """Random parameters ``{"encoder", "head"}``."""
        key_encoder, key_head = jax.random.split(jax.random.key(seed))
        image = jnp.zeros((1, 8, 8, 3), jnp.float32)
        encoder = _Encoder(self.channels).init(key_encoder, image)["params"]
        head = _Head(self.channels).init(key_head, jnp.zeros((8, 8, self.channels + 3), jnp.float32))["params"]
        return {"encoder": encoder, "head": head}

    def preprocess(self, image, *, frame_hw=None):
        """uint8[H, W, 3] -> (f32[Hf, Wf, 3] in [0, 1], zero-padded; `Transform` with scale 1)."""
        image = np.asarray(image)
        height, width = image.shape[:2]
        frame = (height, width) if frame_hw is None else (int(frame_hw[0]), int(frame_hw[1]))
        padded = np.zeros((*frame, 3), np.float32)
        padded[:height, :width] = image.astype(np.float32) / 255.0
        size = jnp.asarray([height, width], jnp.int32)
        return jnp.asarray(padded), Transform(original_hw=size, resized_hw=size,
                                              scale_xy=jnp.ones((2,), jnp.float32), frame_hw=frame)

    def embed(self, params, model_input):
        """f32[Hf, Wf, 3] (or [B, ...]) -> features f32[Hf, Wf, C] (batched alike)."""
        single = model_input.ndim == 3
        x = model_input[None] if single else model_input
        features = _Encoder(self.channels).apply({"params": params["encoder"]}, x)
        return features[0] if single else features

    def decode(self, params, features, prompts, transform: Transform, *, multimask_output: bool = True) -> Prediction:
        """Click maps + previous-mask channel + features -> logits at the frame (one candidate)."""
        frame = tuple(transform.frame_hw)
        points = prompts.points * jnp.asarray(transform.scale_xy, jnp.float32)
        maps = render_soft_click_maps(points, prompts.labels, frame, self.radius)
        previous = jnp.where(prompts.has_mask, jax.nn.sigmoid(prompts.mask_logits), 0.0)
        x = jnp.concatenate([features, jnp.moveaxis(maps, 0, -1), previous[..., None]], axis=-1)
        logits = _Head(self.channels).apply({"params": params["head"]}, x)
        logits = jnp.where(image_region(transform), logits, OUTSIDE_LOGIT)
        return Prediction(logits=logits, low_res_logits=logits[None], scores=jnp.zeros((1,), jnp.float32),
                          index=jnp.zeros((), jnp.int32))

    def feedback_shape(self, frame_hw):
        """The frame itself: the previous logits at image resolution."""
        return (int(frame_hw[0]), int(frame_hw[1]))

    def feedback(self, prediction: Prediction):
        """The previous logits f32[Hf, Wf]."""
        return prediction.logits
