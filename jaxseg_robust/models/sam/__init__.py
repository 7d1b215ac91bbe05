"""Segment Anything (SAM) family in Flax linen, behind the Segmenter protocol.

Public pieces:
  * `SamSegmenter` (segmenter.py): preprocess / embed / decode (pure, jit-,
    vmap- and grad-safe); `SamFeatures`; `make_transform`.
  * `SamPredictor` (predictor.py): ``segment_anything.SamPredictor``-compatible
    convenience layer (``zoo.load(name).predict(...)``).
  * `SamConfig`, `MaskDecoderConfig` (config.py); `ViTConfig`, `VIT_B/L/H`
    (image_encoder.py); `SAM_CONFIGS` (registry.py, names ``sam_vit_b/l/h``).
  * Modules: `ImageEncoderViT`, `PromptEncoder`, `MaskDecoder`,
    `TwoWayTransformer`, and the building blocks in layers.py.
  * Weights: ``python -m ports sam`` (ports/sam.py) converts official checkpoints.

Interfaces for other SAM-family models (MobileSAM, SAM-HQ):

1. Param tree of a SAM model: ``{"image_encoder": ..., "prompt_encoder": ...,
   "mask_decoder": ...}``. Port rules are built from reusable pieces in
   ports/sam.py: ``vit_encoder_rules``, ``prompt_encoder_rules``,
   ``mask_decoder_rules``, ``two_way_transformer_rules`` (each takes the torch
   key prefix and the flax path prefix).

2. Image encoders are pluggable. ``SamConfig.encoder_kind`` names the
   encoder and ``SamConfig.encoder`` holds its config (a frozen dataclass with
   JSON-representable fields). An encoder module maps f32[B, S, S, 3]
   (normalised, zero-padded, channels-last; S = ``SamConfig.image_size``,
   1024) to f32[B, E, E, C] (E = ``embedding_size``, 64; C =
   ``prompt_embed_dim``, 256). Register with
   ``config.register_image_encoder(kind, ConfigClass, build)`` where
   ``build(encoder_config, compute_dtype) -> linen.Module``; an unregistered
   kind is imported from ``jaxseg_robust.models.sam.<kind>`` on first use, so
   ``jaxseg_robust/models/sam/tiny_vit.py`` should call
   ``register_image_encoder("tiny_vit", TinyViTConfig, build)`` at import.
   A MobileSAM model is then ``SamConfig(encoder=TinyViTConfig(...),
   encoder_kind="tiny_vit", family="sam", variant="mobile_sam")`` served by
   `SamSegmenter` unchanged; register its name with
   ``zoo.register_model("mobile_sam", "sam", config, checkpoint_hint=...)``
   from a module listed in ``zoo.BUILTIN_REGISTRATIONS``.

3. `SamFeatures` is a pytree with ``image_embeddings`` f32[E, E, C] and
   ``interm_embeddings`` (a tuple, empty for SAM). The ViT sows the output of
   every global-attention block into the ``intermediates`` collection
   (``interm_embeddings``); ``SamSegmenter.encode_image(params, x,
   collect_interm=True)`` returns them (SAM-HQ uses the first). SAM-HQ can
   subclass `SamSegmenter` (override ``embed`` to fill ``interm_embeddings``,
   and ``mask_decoder``/``decode_low_res`` for its decoder) and register its
   own zoo family ("sam_hq").

4. Prompts are fixed-shape (`jaxseg_robust.prompts.types.Prompts`); the
   prompt encoder returns ``(sparse f32[N+3, C], valid bool[N+3],
   dense LowRankDense)`` and the decoder masks invalid tokens as attention
   keys, so padded prompt sets reproduce the reference on the valid prompts.
"""

from jaxseg_robust.models.sam.config import MaskDecoderConfig, SamConfig, register_image_encoder
from jaxseg_robust.models.sam.image_encoder import VIT_B, VIT_H, VIT_L, ImageEncoderViT, ViTConfig
from jaxseg_robust.models.sam.mask_decoder import MaskDecoder
from jaxseg_robust.models.sam.predictor import SamPredictor
from jaxseg_robust.models.sam.prompt_encoder import PromptEncoder
from jaxseg_robust.models.sam.segmenter import SamFeatures, SamSegmenter, make_transform
from jaxseg_robust.models.sam.transformer import TwoWayTransformer

__all__ = [
    "MaskDecoderConfig", "SamConfig", "register_image_encoder", "VIT_B", "VIT_H", "VIT_L",
    "ImageEncoderViT", "ViTConfig", "MaskDecoder", "SamPredictor", "PromptEncoder",
    "SamFeatures", "SamSegmenter", "make_transform", "TwoWayTransformer",
]
