"""The Segmenter protocol: the seam every attack, grid and simulated user plugs into.

A promptable model is split in three pure functions so that the expensive
image encoder runs once per image and every prompt attack runs on cached
features:

  preprocess(image uint8[H, W, 3]) -> (model_input, Transform)
  embed(params, model_input) -> Features            (once per image)
  decode(params, features, prompts, transform) -> Prediction
                                                    (cheap, differentiable
                                                     w.r.t. prompt coordinates)

Parameters are explicit pytrees handed to these functions; a model object
carries only its static configuration, so it can be closed over by `jit`
without baking weights in as constants.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import flax.struct
import jax.numpy as jnp

from jaxseg_robust.prompts.types import Prompts

Params = Any
Features = Any


@flax.struct.dataclass
class Transform:
    """Geometry that maps the original (evaluation) frame to the model frame.

    All fields are arrays (not static), so instances of different sizes that
    were padded into one bucket share one compiled function.

    Attributes:
      original_hw: i32[2] (H, W) of the original image inside its padded frame.
      resized_hw: i32[2] (h', w') of the image inside the model input after
        resizing (before the model's own padding).
      scale_xy: f32[2] (sx, sy) = (w' / W, h' / H), the per-axis factors that
        map original-frame coordinates to the model frame.
      frame_hw: static (Hf, Wf) >= (H, W), the frame full-resolution outputs
        are produced in (the image's own size, or the bucket it was padded
        into). Not a pytree leaf: part of the tree structure, so one compiled
        function serves every Transform with the same frame; None when a
        model needs no full-resolution frame.
    """

    original_hw: jnp.ndarray
    resized_hw: jnp.ndarray
    scale_xy: jnp.ndarray
    frame_hw: tuple[int, int] | None = flax.struct.field(pytree_node=False, default=None)


@flax.struct.dataclass
class Prediction:
    """What `decode` returns for one prompt set.

    Attributes:
      logits: f32[Hp, Wp] logits of the selected mask, bilinearly upsampled
        to the original frame (padded to the frame the image was given in;
        pixels outside ``Transform.original_hw`` hold -inf-like values).
      low_res_logits: f32[C, h, w] logits of every candidate mask at the
        model's low resolution (SAM: C = 1 or 3, h = w = 256).
      scores: f32[C] the model's predicted quality (SAM: predicted IoU).
      index: i32[] index in [0, C) of the selected candidate.
    """

    logits: jnp.ndarray
    low_res_logits: jnp.ndarray
    scores: jnp.ndarray
    index: jnp.ndarray

    @property
    def selected_low_res(self) -> jnp.ndarray:
        """f32[h, w] low-resolution logits of the selected candidate."""
        return jnp.take(self.low_res_logits, self.index, axis=-3)


@runtime_checkable
class Segmenter(Protocol):
    """A promptable segmentation model, used functionally.

    Implementations keep static configuration only; weights travel as the
    explicit ``params`` pytree.
    """

    def preprocess(self, image) -> tuple[jnp.ndarray, Transform]:
        """uint8[H, W, 3] image -> (model input, Transform)."""

    def embed(self, params: Params, model_input: jnp.ndarray) -> Features:
        """Runs the image encoder once; returns a cacheable feature pytree."""

    def decode(
        self,
        params: Params,
        features: Features,
        prompts: Prompts,
        transform: Transform,
        *,
        multimask_output: bool = True,
    ) -> Prediction:
        """Decodes one prompt set on cached features; differentiable in prompts."""
