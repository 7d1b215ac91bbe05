"""`SamSegmenter`: the SAM family behind the Segmenter protocol (preprocess / embed / decode).

Section numbers (§) refer to docs/protocols/tetris.md.

Typical use (one image, many prompt sets, one compiled decode)::

    seg = SamSegmenter(config)                  # static configuration only
    x, transform = seg.preprocess(image)        # uint8[H, W, 3] -> f32[1024, 1024, 3]
    features = jax.jit(seg.embed)(params, x)    # once per image
    decode = jax.jit(lambda p: seg.decode(params, features, p, transform))
    pred = decode(prompts)                      # or jax.vmap(...) over prompt sets

``decode`` is pure and differentiable w.r.t. ``prompts.points`` and
``prompts.box`` (coordinates in original-image pixels). It is vmappable over
prompt sets (features and transform unbatched: the prompt-independent image
work of the decoder is then done once) and over instances (features and
transforms with a leading batch axis; ``Transform.frame_hw`` is static and
shared by the batch).

Image paths (``image_resize``):
  * "float" (default): the image as float, antialiased bilinear resize to the
    model frame exactly as torch ``interpolate(bilinear, align_corners=False,
    antialias=True)`` (the attacks' ``apply_image_torch`` path, §2.3.1);
  * "pil": the uint8 PIL bilinear resize of ``SamPredictor.set_image``
    (``ResizeLongestSide.apply_image``), bit-exact with the reference.
Note: the reference ``ResizeLongestSide.apply_image_torch`` computes its
target size from the tensor's batch and channel axes (a reference bug); the
float path here resizes to SAM's ``(h', w')``, which is what the attack code
asks for.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from PIL import Image

from jaxseg_robust.models.base import FamilyRules, Prediction, SegmenterBase, Transform
from jaxseg_robust.models.sam.config import SamConfig, build_image_encoder
from jaxseg_robust.models.sam.mask_decoder import MaskDecoder
from jaxseg_robust.models.sam.prompt_encoder import PromptEncoder
from jaxseg_robust.models.sam.random_init import random_params
from jaxseg_robust.ops.resize import (longest_side_shape, resize_bilinear_antialias_host,
                                      scale_factors, upsample_sam_logits)
from jaxseg_robust.prompts.types import Prompts

IMAGE_RESIZE_PATHS = ("float", "pil")
OUTSIDE_LOGIT = -1e4  # logits of frame pixels outside the original image (sigmoid == 0)


@flax.struct.dataclass
class SamFeatures:
    """Cached image features of one image (add a leading axis to batch instances).

    Attributes:
      image_embeddings: f32[E, E, C] the image encoder output (SAM: 64, 64, 256).
      interm_embeddings: tuple of f32[E, E, D] intermediate encoder features
        (empty for SAM; SAM-HQ stores the global-attention block outputs).
    """

    image_embeddings: jnp.ndarray
    interm_embeddings: tuple = ()


def _model_input(resized: np.ndarray, mean, std, size: int) -> jnp.ndarray:
    """float32[h', w', 3] resized image -> f32[size, size, 3]: normalise, then zero-pad (host)."""
    x = (np.asarray(resized, np.float32) - np.asarray(mean, np.float32)) / np.asarray(
        std, np.float32)
    h, w = x.shape[0], x.shape[1]
    return jnp.asarray(np.pad(x, ((0, size - h), (0, size - w), (0, 0))))


def pil_resize(image: np.ndarray, out_hw: tuple[int, int]) -> np.ndarray:
    """uint8[H, W, 3] -> uint8[h', w', 3] with PIL bilinear (SAM's ``apply_image``)."""
    return np.asarray(Image.fromarray(image).resize((out_hw[1], out_hw[0]), Image.BILINEAR))


@dataclasses.dataclass(frozen=True)
class SamSegmenter(SegmenterBase):
    """SAM-family segmenter (static configuration; weights are passed as ``params``).

    Param tree: ``{"image_encoder": ..., "prompt_encoder": ..., "mask_decoder": ...}``.
    Interactive state (the Segmenter contract): the selected candidate's
    low-res logits (``config.low_res_size`` square) are fed back as the next
    round's mask input; decision threshold 0.5 (``logit > 0``).
    """

    config: SamConfig
    image_resize: str = "float"
    probability_threshold: ClassVar[float] = 0.5
    # the SAM family's rules, and the resized frame of resized_logits (models.base.FamilyRules)
    rules: ClassVar[FamilyRules] = FamilyRules(family="sam", resized_frame=True)

    def __post_init__(self):
        if self.image_resize not in IMAGE_RESIZE_PATHS:
            raise ValueError(f"image_resize must be one of {IMAGE_RESIZE_PATHS}; "
                             f"got {self.image_resize!r}")

    # ---- modules ---------------------------------------------------------
    @property
    def image_encoder(self):
        """The linen image encoder (f32[B, S, S, 3] -> f32[B, E, E, C])."""
        cfg = self.config
        return build_image_encoder(cfg.encoder_kind, cfg.encoder, cfg.dtype)

    @property
    def prompt_encoder(self) -> PromptEncoder:
        """The linen prompt encoder."""
        cfg = self.config
        return PromptEncoder(cfg.prompt_embed_dim, (cfg.embedding_size, cfg.embedding_size),
                             (cfg.image_size, cfg.image_size), cfg.mask_in_chans)

    @property
    def mask_decoder(self) -> MaskDecoder:
        """The linen mask decoder."""
        return MaskDecoder(self.config.prompt_embed_dim, self.config.decoder)

    # ---- parameters ------------------------------------------------------
    def _dummy_prompt_args(self):
        low = self.config.low_res_size
        return (jnp.zeros((1, 2)), jnp.ones((1,), jnp.int32), jnp.zeros((4,)),
                jnp.asarray(False), jnp.zeros((low, low)), jnp.asarray(False))

    def param_shapes(self) -> dict:
        """The parameter pytree as ShapeDtypeStructs (traced only: no compute, no allocation).

        Returns:
          {"image_encoder", "prompt_encoder", "mask_decoder"} -> nested ShapeDtypeStructs.
        """
        cfg = self.config
        key = jax.random.key(0)
        image = jax.ShapeDtypeStruct((1, cfg.image_size, cfg.image_size, 3), jnp.float32)
        img = jax.eval_shape(self.image_encoder.init, key, image)["params"]
        prompt_args = self._dummy_prompt_args()
        prompt = jax.eval_shape(self.prompt_encoder.init, key, *prompt_args)["params"]

        def decoder_init(prompt_params):
            sparse, valid, dense = self.prompt_encoder.apply({"params": prompt_params},
                                                             *prompt_args)
            e, c = cfg.embedding_size, cfg.prompt_embed_dim
            grid = jnp.zeros((e, e, c))
            return self._init_mask_decoder(key, grid, grid, sparse, valid, dense,
                                           *self._decoder_extra_inputs())

        dec = jax.eval_shape(decoder_init, prompt)
        return {"image_encoder": img, "prompt_encoder": prompt, "mask_decoder": dec}

    def _decoder_extra_inputs(self) -> tuple:
        """Dummy inputs the mask decoder takes after the dense prompt (none for SAM)."""
        return ()

    def _init_mask_decoder(self, key, *args) -> dict:
        """The mask decoder's params from its ``init`` on dummy inputs ``args``."""
        return self.mask_decoder.init(key, *args)["params"]

    def init(self, key) -> dict:
        """Random parameters of sensible scale (see `random_init.random_params`).

        Not SAM's training init: zero-initialised tables such as ``pos_embed``
        and ``rel_pos_*`` get small random values so every path is exercised.
        Drawn on the host (nothing to compile), deterministic in ``key``.

        Args:
          key: a JAX PRNG key or an int seed.

        Returns:
          {"image_encoder", "prompt_encoder", "mask_decoder"} param pytree (float32).
        """
        return random_params(self.param_shapes(), key)

    # ---- protocol --------------------------------------------------------
    def image_resize_path(self) -> str:
        """``image_resize`` (`models.base.SegmenterBase.image_resize_path`)."""
        return self.image_resize

    def preprocess(self, image, *, frame_hw: tuple[int, int] | None = None):
        """Resizes, normalises and zero-pads an image into the model frame.

        Args:
          image: uint8[H, W, 3] RGB (the "float" path also accepts float
            values on the 0..255 scale).
          frame_hw: static output frame (Hf, Wf) >= (H, W) for `decode`'s
            full-resolution logits; default (H, W).

        Returns:
          (f32[S, S, 3] model input, `Transform` with ``frame_hw`` set).

        Raises:
          ValueError: wrong shape or dtype, or a frame smaller than the image.
        """
        image = np.asarray(image)
        if image.ndim != 3 or image.shape[2] != 3 or min(image.shape[:2]) < 1:
            raise ValueError(f"image must have shape [H, W, 3]; got {image.shape}")
        cfg = self.config
        h, w = int(image.shape[0]), int(image.shape[1])
        resized_hw = longest_side_shape(h, w, cfg.image_size)
        if min(resized_hw) < 1:
            raise ValueError(f"image of size {h}x{w} is too elongated: it would be resized to "
                             f"{resized_hw[0]}x{resized_hw[1]}")
        if self.image_resize == "pil":
            if image.dtype != np.uint8:
                raise ValueError(f"the 'pil' image path needs a uint8 image; got {image.dtype}")
            resized = pil_resize(image, resized_hw)
        else:
            if not (image.dtype == np.uint8 or np.issubdtype(image.dtype, np.floating)):
                raise ValueError(f"image must be uint8 or float; got {image.dtype}")
            resized = resize_bilinear_antialias_host(image, resized_hw)
        x = _model_input(resized, cfg.pixel_mean, cfg.pixel_std, cfg.image_size)
        return x, make_transform((h, w), resized_hw, frame_hw)

    def encode_image(self, params, model_input: jnp.ndarray, *, collect_interm: bool = False):
        """Runs the image encoder on f32[B, S, S, 3].

        Returns:
          (f32[B, E, E, C] embeddings, tuple of intermediate f32[B, E, E, D]
          (global-attention block outputs; empty unless ``collect_interm``)).
        """
        variables = {"params": params["image_encoder"]}
        if not collect_interm:
            return self.image_encoder.apply(variables, model_input), ()
        emb, state = self.image_encoder.apply(variables, model_input, mutable=["intermediates"])
        interm = state.get("intermediates", {}).get("interm_embeddings", ())
        return emb, tuple(interm)

    def embed(self, params, model_input: jnp.ndarray) -> SamFeatures:
        """f32[S, S, 3] (or [B, S, S, 3]) model input -> `SamFeatures` (batched alike)."""
        x, single = self._batched_input(model_input)
        emb, _ = self.encode_image(params, x)
        return SamFeatures(image_embeddings=emb[0] if single else emb)

    def _batched_input(self, model_input: jnp.ndarray) -> tuple[jnp.ndarray, bool]:
        """Checks a model input; returns (f32[B, S, S, 3], whether it was one image)."""
        cfg = self.config
        if model_input.shape[-3:] != (cfg.image_size, cfg.image_size, 3) or \
                model_input.ndim not in (3, 4):
            raise ValueError(f"model_input must be [{cfg.image_size}, {cfg.image_size}, 3] or "
                             f"[B, {cfg.image_size}, {cfg.image_size}, 3]; "
                             f"got {model_input.shape}")
        single = model_input.ndim == 3
        return (model_input[None] if single else model_input), single

    def dense_pe(self, params) -> jnp.ndarray:
        """f32[E, E, C] position encoding of the embedding grid."""
        return self.prompt_encoder.apply({"params": params["prompt_encoder"]},
                                         method=PromptEncoder.dense_pe)

    def decode_low_res(self, params, features: SamFeatures, prompts: Prompts,
                       transform: Transform):
        """All K mask candidates at low resolution for one prompt set.

        Args:
          params: the model's param tree.
          features: `SamFeatures` of one image (image_embeddings f32[E, E, C]).
          prompts: one `Prompts` (coordinates in original-image pixels).
          transform: the image's `Transform` (scale_xy maps prompts to the
            model frame: x * sx, y * sy; the prompt encoder adds +0.5).

        Returns:
          (low_res f32[K, 4E, 4E] logits, iou f32[K]); K = num_multimask_outputs + 1,
          candidate 0 is the single-mask output.
        """
        emb = check_image_embeddings(features.image_embeddings, self.config)
        sparse, valid, dense = self.encode_prompts(params, prompts, transform)
        return self.mask_decoder.apply({"params": params["mask_decoder"]}, emb,
                                       self.dense_pe(params), sparse, valid, dense)

    def encode_prompts(self, params, prompts: Prompts, transform: Transform):
        """The prompt encoder on one prompt set (`encode_prompt_set`).

        Returns:
          (sparse f32[N + 3, C], valid bool[N + 3], dense `LowRankDense` [E, E]).
        """
        return encode_prompt_set(self.prompt_encoder, params["prompt_encoder"], prompts, transform,
                                 self.config.low_res_size)

    def upsample(self, low_res: jnp.ndarray, transform: Transform) -> jnp.ndarray:
        """SAM's ``postprocess_masks``: f32[..., 4E, 4E] -> f32[..., Hf, Wf] in ``transform.frame_hw``.

        Pixels outside the original image hold `OUTSIDE_LOGIT`.
        """
        _check_frame(transform)
        return upsample_sam_logits(low_res, transform.resized_hw, transform.original_hw,
                                   tuple(transform.frame_hw), model_size=self.config.image_size,
                                   fill_value=OUTSIDE_LOGIT)

    def decode(self, params, features: SamFeatures, prompts: Prompts, transform: Transform, *,
               multimask_output: bool = True) -> Prediction:
        """Decodes one prompt set into a `Prediction`.

        Args:
          params, features, prompts, transform: as in `decode_low_res`.
          multimask_output: static; True -> the 3 multimask candidates and
            ``index = argmax(scores)``; False -> the single-mask candidate.

        Returns:
          Prediction(logits f32[Hf, Wf] of the selected candidate upsampled as
          ``postprocess_masks``, low_res_logits f32[C, 4E, 4E], scores f32[C],
          index i32[]), C = 3 or 1.
        """
        _check_frame(transform)
        low_res, iou = self.decode_low_res(params, features, prompts, transform)
        low_res, iou, index = self.select(low_res, iou, multimask_output=multimask_output)
        selected = jnp.take(low_res, index, axis=0)
        return Prediction(logits=self.upsample(selected, transform), low_res_logits=low_res,
                          scores=iou, index=index)

    # ---- interactive state (Segmenter contract) ----------------------------
    def feedback_shape(self, frame_hw: tuple[int, int]) -> tuple[int, int]:
        """(low_res_size, low_res_size), whatever the frame (SAM: 256 x 256)."""
        size = int(self.config.low_res_size)
        return (size, size)

    def feedback(self, prediction: Prediction) -> jnp.ndarray:
        """The selected candidate's low-res logits f32[low, low] (SAM's ``mask_input`` of the next click)."""
        return prediction.selected_low_res

    def resized_logits(self, prediction: Prediction, transform: Transform) -> jnp.ndarray:
        """f32[S, S] the selected logits at the model's resized resolution, zero-padded to the input size S.

        What ``SamPredictor.predict`` returns for an image that was already
        resized (the BREPS jitter / user-box scripts): the 1024-frame
        upsampling cropped to ``(h', w')`` (a SAM-family capability, used by
        the fixed-box protocol's ``iou_resized``; docs/protocols/breps.md).
        """
        return self.upsample(prediction.selected_low_res, resized_frame_transform(transform, self.config.image_size))

    def select(self, low_res: jnp.ndarray, iou: jnp.ndarray, *, multimask_output: bool):
        """SAM's output selection from every candidate of `decode_low_res`.

        Args:
          low_res: f32[K, h, w] all candidates (0 = single-mask output).
          iou: f32[K] their predicted IoU.
          multimask_output: static; True -> candidates 1..K-1, else candidate 0.

        Returns:
          (low_res f32[C, h, w], scores f32[C], index i32[] = argmax(scores)
          with multimask, else 0); C = K - 1 or 1.
        """
        if multimask_output:
            low_res, iou = low_res[1:], iou[1:]
            return low_res, iou, jnp.argmax(iou).astype(jnp.int32)
        return low_res[:1], iou[:1], jnp.zeros((), jnp.int32)


def check_image_embeddings(image_embeddings: jnp.ndarray, config) -> jnp.ndarray:
    """``image_embeddings`` if it is f32[E, E, C] of one image (E = ``config.embedding_size``,
    C = ``config.prompt_embed_dim``; a SAM or SAM 2 config), else ValueError."""
    e, c = config.embedding_size, config.prompt_embed_dim
    if image_embeddings.shape != (e, e, c):
        raise ValueError(f"features.image_embeddings must be [{e}, {e}, {c}] for one image "
                         f"(vmap over batches); got {image_embeddings.shape}")
    return image_embeddings


def encode_prompt_set(prompt_encoder: PromptEncoder, encoder_params, prompts: Prompts,
                      transform: Transform, low_res_size: int):
    """SAM's prompt encoder on one prompt set, its coordinates mapped to the model frame.

    Args:
      prompt_encoder: the `PromptEncoder` module; ``encoder_params`` its param tree.
      prompts: one `Prompts` (coordinates in original-image pixels, mask_logits
        f32[low_res_size, low_res_size]).
      transform: the image's `Transform` (x * sx, y * sy; the prompt encoder adds +0.5).
      low_res_size: 4E, the side of the mask input.

    Returns:
      (sparse f32[N + 3, C], valid bool[N + 3], dense `LowRankDense` [E, E]): N point
      slots, the padding point, the two box corners.
    """
    low = low_res_size
    if prompts.mask_logits.shape != (low, low) or prompts.points.ndim != 2:
        raise ValueError(f"prompts must be one prompt set with mask_logits [{low}, {low}] "
                         f"(vmap over batches); got points {prompts.points.shape}, "
                         f"mask_logits {prompts.mask_logits.shape}")
    scale = jnp.asarray(transform.scale_xy, jnp.float32)
    points = prompts.points * scale
    box = (prompts.box.reshape(2, 2) * scale).reshape(4)
    return prompt_encoder.apply({"params": encoder_params}, points, prompts.labels, box, prompts.has_box,
                                prompts.mask_logits, prompts.has_mask)


def _check_frame(transform: Transform) -> None:
    if transform.frame_hw is None:
        raise ValueError("transform.frame_hw is not set (make the Transform with "
                         "SamSegmenter.preprocess or make_transform)")


def resized_frame_transform(transform: Transform, model_size: int) -> Transform:
    """A `Transform` whose outputs are SAM's resized-resolution masks in a ``model_size`` square frame.

    ``upsample`` with it gives the 1024-frame upsampling cropped to ``(h', w')``
    (the crop-to-crop resize is the identity), i.e. what ``predict`` returns
    for an image that was already resized (the BREPS jitter / user scripts).
    Box coordinates are taken as resized-frame pixels (scale 1).
    """
    return Transform(original_hw=transform.resized_hw, resized_hw=transform.resized_hw,
                     scale_xy=jnp.ones_like(jnp.asarray(transform.scale_xy, jnp.float32)),
                     frame_hw=(int(model_size), int(model_size)))


def make_transform(original_hw: tuple[int, int], resized_hw: tuple[int, int],
                   frame_hw: tuple[int, int] | None = None) -> Transform:
    """A `Transform` for an image of ``original_hw`` resized to ``resized_hw``.

    Args:
      original_hw: (H, W) of the image.
      resized_hw: (h', w') inside the model frame.
      frame_hw: static output frame (Hf, Wf) >= (H, W); default (H, W).
    """
    h, w = original_hw
    frame = (int(h), int(w)) if frame_hw is None else (int(frame_hw[0]), int(frame_hw[1]))
    if frame[0] < h or frame[1] < w:
        raise ValueError(f"frame_hw {frame} is smaller than the image ({h}, {w})")
    return Transform(original_hw=jnp.asarray([h, w], jnp.int32),
                     resized_hw=jnp.asarray(resized_hw, jnp.int32),
                     scale_xy=jnp.asarray(scale_factors((h, w), resized_hw)),
                     frame_hw=frame)

