"""`Sam2Segmenter`: SAM 2 / SAM 2.1 behind the Segmenter protocol (preprocess / embed / decode).

The single-image path of the official ``SAM2ImagePredictor`` (see
docs/models/sam2.md)::

    seg = Sam2Segmenter(config)                 # static configuration only
    x, transform = seg.preprocess(image)        # uint8[H, W, 3] -> f32[1024, 1024, 3]
    features = jax.jit(seg.embed)(params, x)    # once per image
    pred = jax.jit(seg.decode, static_argnames="multimask_output")(
        params, features, prompts, transform, multimask_output=False)

* preprocessing: the image scaled to [0, 1], resized to S x S **without**
  keeping the aspect ratio and without padding (torchvision ``Resize`` on a
  float tensor: antialiased bilinear), normalised with ImageNet statistics;
  clicks are scaled per axis (x * S / W, y * S / H);
* features: the stride-16 FPN level plus ``no_mem_embed`` (the image
  embedding) and the stride-4/8 levels projected by the decoder's
  ``conv_s0``/``conv_s1``;
* prompts: SAM 2 encodes a box as two points with labels 2/3 placed before
  the clicks and appends the padding point whenever points or a box are
  given (SAM appends it only without a box); token order does not change
  the result, so SAM's fixed-shape prompt encoder is reused with that rule;
* outputs: ``multimask_output=True`` gives candidates 1..3 and the best by
  predicted IoU; ``False`` gives candidate 0, or, when its stability score
  (IoU of the masks at logit > delta and logit > -delta) is below the
  threshold, the best multimask candidate (the official dynamic fallback);
  full-resolution logits are the unclamped low-res logits resized bilinearly
  from 256 x 256 straight to (H, W); the returned low-res logits are clamped
  to [-32, 32] as the official predictor returns them.

``decode`` is pure, vmappable over prompt sets and instances, and
differentiable w.r.t. ``prompts.points`` and ``prompts.box``.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from jaxseg_robust.models.base import FamilyRules, Prediction, SegmenterBase, Transform
from jaxseg_robust.models.sam.prompt_encoder import PromptEncoder
from jaxseg_robust.models.sam.random_init import random_params
from jaxseg_robust.models.sam.segmenter import check_image_embeddings, encode_prompt_set, make_transform
from jaxseg_robust.models.sam2.config import Sam2Config
from jaxseg_robust.models.sam2.image_encoder import Sam2ImageEncoder
from jaxseg_robust.models.sam2.mask_decoder import Sam2MaskDecoder
from jaxseg_robust.ops.resize import (apply_taps, resize_bilinear_antialias,
                                      resize_bilinear_antialias_host, traced_linear_taps)
from jaxseg_robust.prompts.types import Prompts

OUTSIDE_LOGIT = -1e4  # logits of frame pixels outside the original image (sigmoid == 0)
PROBABILITY_THRESHOLD = 0.5  # sigmoid(logit) > 0.5, i.e. the official mask_threshold 0.0


@flax.struct.dataclass
class Sam2Features:
    """Cached image features of one image (add a leading axis to batch instances).

    Attributes:
      image_embeddings: f32[E, E, C] stride-16 FPN level + ``no_mem_embed`` (64, 64, 256).
      high_res_feats: (s0 f32[4E, 4E, C/8], s1 f32[2E, 2E, C/4]), the
        stride-4/8 levels after ``conv_s0``/``conv_s1``; empty without
        ``use_high_res_features``.
    """

    image_embeddings: jnp.ndarray
    high_res_feats: tuple = ()


def stability_score(logits: jnp.ndarray, delta: float) -> jnp.ndarray:
    """``MaskDecoder._get_stability_scores``: |logit > delta| / |logit > -delta| (1 if empty).

    Args:
      logits: f32[..., h, w].
      delta: the logit margin.

    Returns:
      f32[...].
    """
    inner = jnp.sum(logits > delta, axis=(-2, -1)).astype(jnp.float32)
    outer = jnp.sum(logits > -delta, axis=(-2, -1)).astype(jnp.float32)
    return jnp.where(outer > 0, inner / jnp.maximum(outer, 1.0), 1.0)


def upsample_logits(low_res: jnp.ndarray, original_hw: jnp.ndarray, frame_hw: tuple[int, int],
                    fill_value: float = OUTSIDE_LOGIT) -> jnp.ndarray:
    """``SAM2Transforms.postprocess_masks``: bilinear (half-pixel) f32[..., h, w] -> (H, W) in a frame.

    Args:
      low_res: f32[..., h, w].
      original_hw: i32[2] traced (H, W) <= frame_hw.
      frame_hw: static (Hf, Wf).
      fill_value: value outside the image.

    Returns:
      f32[..., Hf, Wf].
    """
    original_hw = jnp.asarray(original_hw, jnp.int32)
    h_low, w_low = low_res.shape[-2], low_res.shape[-1]
    cols = traced_linear_taps(frame_hw[1], jnp.asarray(w_low, jnp.int32), original_hw[1])
    rows = traced_linear_taps(frame_hw[0], jnp.asarray(h_low, jnp.int32), original_hw[0])
    x = apply_taps(apply_taps(low_res, cols, axis=-1), rows, axis=-2)
    inside = ((jnp.arange(frame_hw[0]) < original_hw[0])[:, None]
              & (jnp.arange(frame_hw[1]) < original_hw[1])[None, :])
    return jnp.where(inside, x, jnp.asarray(fill_value, x.dtype))


@dataclasses.dataclass(frozen=True)
class Sam2Segmenter(SegmenterBase):
    """SAM 2 segmenter (static configuration; weights are passed as ``params``).

    Param tree: ``{"image_encoder": {"trunk", "neck"}, "prompt_encoder": ...,
    "mask_decoder": ..., "no_mem_embed": f32[C]}``.
    """

    config: Sam2Config
    probability_threshold: float = PROBABILITY_THRESHOLD
    # RClicks evaluates SAM 2 with multimask_output=False and the official dynamic fallback
    # (models.base.FamilyRules.evaluation_multimask; docs/protocols/rclicks.md)
    rules: ClassVar[FamilyRules] = FamilyRules(family="sam2", evaluation_multimask=False)

    # ---- modules ---------------------------------------------------------
    @property
    def image_encoder(self) -> Sam2ImageEncoder:
        """The linen image encoder (f32[B, S, S, 3] -> three FPN levels)."""
        return Sam2ImageEncoder(self.config, dtype=self.config.dtype)

    @property
    def prompt_encoder(self) -> PromptEncoder:
        """SAM's prompt encoder (SAM 2's is the same module)."""
        cfg = self.config
        e = cfg.embedding_size
        return PromptEncoder(cfg.prompt_embed_dim, (e, e), (cfg.image_size, cfg.image_size),
                             cfg.mask_in_chans)

    @property
    def mask_decoder(self) -> Sam2MaskDecoder:
        """The linen mask decoder."""
        cfg = self.config
        return Sam2MaskDecoder(cfg.prompt_embed_dim, cfg.decoder,
                               use_high_res_features=cfg.use_high_res_features,
                               pred_obj_scores=cfg.pred_obj_scores,
                               pred_obj_scores_mlp=cfg.pred_obj_scores_mlp,
                               iou_prediction_use_sigmoid=cfg.iou_prediction_use_sigmoid)

    # ---- parameters ------------------------------------------------------
    def param_shapes(self) -> dict:
        """The parameter pytree as ShapeDtypeStructs (traced only: no compute, no allocation)."""
        cfg = self.config
        key = jax.random.key(0)
        image = jax.ShapeDtypeStruct((1, cfg.image_size, cfg.image_size, 3), jnp.float32)
        img = jax.eval_shape(self.image_encoder.init, key, image)["params"]
        low, e, c = cfg.low_res_size, cfg.embedding_size, cfg.prompt_embed_dim
        prompt_args = (jnp.zeros((1, 2)), jnp.ones((1,), jnp.int32), jnp.zeros((4,)),
                       jnp.asarray(False), jnp.zeros((low, low)), jnp.asarray(False))
        prompt = jax.eval_shape(self.prompt_encoder.init, key, *prompt_args)["params"]

        def decoder_init(prompt_params):
            sparse, valid, dense = self.prompt_encoder.apply({"params": prompt_params},
                                                             *prompt_args)
            grid = jnp.zeros((e, e, c))
            high = (jnp.zeros((4 * e, 4 * e, c // 8)), jnp.zeros((2 * e, 2 * e, c // 4)))
            return self.mask_decoder.init(key, grid, grid, sparse, valid, dense, high)["params"]

        dec = jax.eval_shape(decoder_init, prompt)
        return {"image_encoder": img, "prompt_encoder": prompt, "mask_decoder": dec,
                "no_mem_embed": jax.ShapeDtypeStruct((c,), jnp.float32)}

    def init(self, key) -> dict:
        """Random parameters of sensible scale (see `random_init.random_params`).

        The window position table and ``no_mem_embed`` get N(0, 0.02^2), the
        official initialisers' scale. Drawn on the host, deterministic in ``key``.
        """
        params = random_params(self.param_shapes(), key)
        trunk = dict(params["image_encoder"]["trunk"])
        trunk["pos_embed_window"] = 0.02 * trunk["pos_embed_window"]
        params["image_encoder"] = {**params["image_encoder"], "trunk": trunk}
        params["no_mem_embed"] = 0.02 * params["no_mem_embed"]
        return params

    # ---- protocol --------------------------------------------------------
    def preprocess(self, image, *, frame_hw: tuple[int, int] | None = None):
        """``SAM2Transforms``: [0, 1] scaling, S x S antialiased bilinear resize, normalisation.

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
        scaled = image.astype(np.float32) / np.float32(255.0)
        resized = resize_bilinear_antialias_host(scaled, (size, size))
        x = (resized - np.asarray(cfg.pixel_mean, np.float32)) / np.asarray(cfg.pixel_std,
                                                                           np.float32)
        h, w = int(image.shape[0]), int(image.shape[1])
        return jnp.asarray(x), make_transform((h, w), (size, size), frame_hw)

    def traced_model_input(self, image: jnp.ndarray) -> jnp.ndarray:
        """`preprocess`'s model input as a jittable, differentiable function of the pixels.

        Args:
          image: f32[H, W, 3] on the 0..255 scale (static size).

        Returns:
          f32[S, S, 3] (the same numbers as `preprocess`, to float32 rounding).
        """
        cfg = self.config
        size = cfg.image_size
        resized = resize_bilinear_antialias(image / 255.0, (size, size))
        return ((resized - jnp.asarray(cfg.pixel_mean, resized.dtype))
                / jnp.asarray(cfg.pixel_std, resized.dtype))

    def _batched_input(self, model_input: jnp.ndarray) -> tuple[jnp.ndarray, bool]:
        """Checks a model input; returns (f32[B, S, S, 3], whether it was one image)."""
        s = self.config.image_size
        if model_input.shape[-3:] != (s, s, 3) or model_input.ndim not in (3, 4):
            raise ValueError(f"model_input must be [{s}, {s}, 3] or [B, {s}, {s}, 3]; "
                             f"got {model_input.shape}")
        single = model_input.ndim == 3
        return (model_input[None] if single else model_input), single

    def embed(self, params, model_input: jnp.ndarray) -> Sam2Features:
        """f32[S, S, 3] (or [B, S, S, 3]) model input -> `Sam2Features` (batched alike).

        As ``SAM2ImagePredictor.set_image``: the three FPN levels, ``conv_s0`` /
        ``conv_s1`` on the stride-4/8 levels, ``no_mem_embed`` added to the
        stride-16 level.
        """
        cfg = self.config
        x, single = self._batched_input(model_input)
        level0, level1, level2 = self.image_encoder.apply({"params": params["image_encoder"]}, x)
        high = ()
        if cfg.use_high_res_features:
            high = self.mask_decoder.apply({"params": params["mask_decoder"]}, level0, level1,
                                           method=Sam2MaskDecoder.project_high_res)
        if cfg.directly_add_no_mem_embed:
            level2 = level2 + params["no_mem_embed"]
        if single:
            level2, high = level2[0], tuple(h[0] for h in high)
        return Sam2Features(image_embeddings=level2, high_res_feats=tuple(high))

    def dense_pe(self, params) -> jnp.ndarray:
        """f32[E, E, C] position encoding of the embedding grid."""
        return self.prompt_encoder.apply({"params": params["prompt_encoder"]},
                                         method=PromptEncoder.dense_pe)

    def encode_prompts(self, params, prompts: Prompts, transform: Transform):
        """The prompt encoder on one prompt set, with SAM 2's padding-point rule.

        Args:
          params: the model's param tree.
          prompts: one `Prompts` (original-image pixels; mask_logits f32[4E, 4E]).
          transform: the image's `Transform` (x * sx, y * sy; +0.5 inside).

        Returns:
          (sparse f32[N + 3, C], valid bool[N + 3], dense `LowRankDense` [E, E]):
          N point slots, the padding point (valid when any point or the box is
          given), the two box corners (labels 2 and 3).
        """
        sparse, valid, dense = encode_prompt_set(self.prompt_encoder, params["prompt_encoder"], prompts,
                                                 transform, self.config.low_res_size)
        n = prompts.points.shape[0]
        has_points = jnp.any(prompts.labels != -1)
        valid = valid.at[n].set(has_points | jnp.asarray(prompts.has_box, bool))
        return sparse, valid, dense

    def decode_heads(self, params, features: Sam2Features, prompts: Prompts,
                     transform: Transform):
        """Every candidate of the mask decoder for one prompt set.

        Returns:
          (low_res f32[K, 4E, 4E] unclamped logits (0 = single-mask output),
          iou f32[K], object_score_logit f32[1]).
        """
        emb = check_image_embeddings(features.image_embeddings, self.config)
        sparse, valid, dense = self.encode_prompts(params, prompts, transform)
        high = tuple(features.high_res_feats) if self.config.use_high_res_features else None
        return self.mask_decoder.apply({"params": params["mask_decoder"]}, emb,
                                       self.dense_pe(params), sparse, valid, dense, high)

    def decode_low_res(self, params, features: Sam2Features, prompts: Prompts,
                       transform: Transform):
        """(low_res f32[K, 4E, 4E], iou f32[K]) of every candidate (see `decode_heads`)."""
        low_res, iou, _ = self.decode_heads(params, features, prompts, transform)
        return low_res, iou

    def select(self, low_res: jnp.ndarray, iou: jnp.ndarray, *, multimask_output: bool):
        """The official output selection from every candidate of `decode_low_res`.

        Args:
          low_res: f32[K, h, w] unclamped logits (0 = single-mask output).
          iou: f32[K].
          multimask_output: static; True -> candidates 1..K-1 with
            ``index = argmax(scores)``; False -> candidate 0, or the best
            multimask candidate when candidate 0's `stability_score` is below
            the threshold (with ``dynamic_multimask_via_stability``).

        Returns:
          (low_res f32[C, h, w], scores f32[C], index i32[]); C = K - 1 or 1.
        """
        cfg = self.config
        if multimask_output:
            return low_res[1:], iou[1:], jnp.argmax(iou[1:]).astype(jnp.int32)
        if not cfg.dynamic_multimask_via_stability:
            return low_res[:1], iou[:1], jnp.zeros((), jnp.int32)
        best = 1 + jnp.argmax(iou[1:])
        stable = stability_score(low_res[0], cfg.dynamic_multimask_stability_delta) \
            >= cfg.dynamic_multimask_stability_thresh
        chosen = jnp.where(stable, low_res[0], jnp.take(low_res, best, axis=0))
        score = jnp.where(stable, iou[0], jnp.take(iou, best))
        return chosen[None], score[None], jnp.zeros((), jnp.int32)

    def clamp_low_res(self, low_res: jnp.ndarray) -> jnp.ndarray:
        """The returned low-res logits: clamped to [-32, 32] as the official predictor."""
        bound = self.config.low_res_clamp
        return jnp.clip(low_res, -bound, bound)

    def upsample(self, low_res: jnp.ndarray, transform: Transform) -> jnp.ndarray:
        """f32[..., 4E, 4E] -> f32[..., Hf, Wf] logits in ``transform.frame_hw`` (-1e4 outside)."""
        if transform.frame_hw is None:
            raise ValueError("transform.frame_hw is not set (make the Transform with "
                             "Sam2Segmenter.preprocess or make_transform)")
        return upsample_logits(low_res, transform.original_hw, tuple(transform.frame_hw))

    def decode(self, params, features: Sam2Features, prompts: Prompts, transform: Transform, *,
               multimask_output: bool = True) -> Prediction:
        """Decodes one prompt set into a `Prediction`.

        Returns:
          Prediction(logits f32[Hf, Wf] of the selected candidate (unclamped,
          upsampled as ``postprocess_masks``), low_res_logits f32[C, 4E, 4E]
          clamped to [-32, 32], scores f32[C] predicted IoU, index i32[]), C = 3 or 1.
        """
        low_res, iou = self.decode_low_res(params, features, prompts, transform)
        low_res, iou, index = self.select(low_res, iou, multimask_output=multimask_output)
        selected = jnp.take(low_res, index, axis=0)
        return Prediction(logits=self.upsample(selected, transform),
                          low_res_logits=self.clamp_low_res(low_res), scores=iou, index=index)

    # ---- interactive state (the Segmenter contract) ----------------------
    def feedback_shape(self, frame_hw: tuple[int, int]) -> tuple[int, int]:
        """(4E, 4E) = (256, 256): the model reads its previous low-res logits, whatever the frame."""
        del frame_hw
        low = self.config.low_res_size
        return (low, low)

    def feedback(self, prediction: Prediction) -> jnp.ndarray:
        """f32[4E, 4E]: the selected candidate's clamped low-res logits (the next ``mask_input``)."""
        return prediction.selected_low_res


__all__ = ["Sam2Segmenter", "Sam2Features", "stability_score", "upsample_logits",
           "OUTSIDE_LOGIT", "PROBABILITY_THRESHOLD"]
