"""Static configuration of SAM-family models, and the pluggable image-encoder registry.

A `SamConfig` fixes every shape of a model: the image encoder (named by
``encoder_kind`` and described by an encoder config object), the prompt
encoder and the mask decoder. Configs are frozen dataclasses (hashable, so a
segmenter holding one can be closed over by ``jit``) and round-trip through
JSON (`SamConfig.to_dict` / `SamConfig.from_dict`) for converted-model
directories.

`SamHQConfig` (family "sam_hq") is a `SamConfig` whose mask decoder is
SAM-HQ's: it also reads one early feature map of the image encoder
(`early_feature_channels` says which one and its width per encoder kind).

Image encoders register themselves with `register_image_encoder(kind,
config_cls, build)`; ``build(config, dtype)`` returns a linen Module mapping
f32[B, S, S, 3] (normalised, zero-padded) to f32[B, E, E, C] channels-last.
A kind that is not yet registered is looked up by importing
``jaxseg_robust.models.sam.<kind>`` (so ``tiny_vit`` registers on import).
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any, Callable

import jax.numpy as jnp

from jaxseg_robust.models.config_json import dataclass_from_dict

PIXEL_MEAN = (123.675, 116.28, 103.53)
PIXEL_STD = (58.395, 57.12, 57.375)
COMPUTE_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


def named_compute_dtype(name: str):
    """The jnp dtype a config's ``compute_dtype`` names (a key of `COMPUTE_DTYPES`);
    ValueError for any other name."""
    if name not in COMPUTE_DTYPES:
        raise ValueError(f"compute_dtype must be one of {sorted(COMPUTE_DTYPES)}; got {name!r}")
    return COMPUTE_DTYPES[name]


_ENCODERS: dict[str, tuple[type, Callable[[Any, Any], Any]]] = {}


def register_image_encoder(kind: str, config_cls: type, build: Callable[[Any, Any], Any]) -> None:
    """Registers an image-encoder kind.

    Args:
      kind: the name stored in ``SamConfig.encoder_kind`` (e.g. "vit", "tiny_vit").
      config_cls: a frozen dataclass describing the encoder; its fields must be
        JSON-representable (ints, floats, strings, bools, tuples of those).
      build: ``(config, compute_dtype) -> linen Module``.
    """
    if not dataclasses.is_dataclass(config_cls):
        raise ValueError(f"config_cls for encoder kind '{kind}' must be a dataclass")
    _ENCODERS[kind] = (config_cls, build)


def _encoder_entry(kind: str) -> tuple[type, Callable[[Any, Any], Any]]:
    reason = ""
    if kind not in _ENCODERS:
        try:
            importlib.import_module(f"jaxseg_robust.models.sam.{kind}")
        except ImportError as err:
            reason = f" (importing jaxseg_robust.models.sam.{kind}: {err})"
    if kind not in _ENCODERS:
        raise ValueError(f"unknown image encoder kind '{kind}'; registered: "
                         f"{sorted(_ENCODERS)}{reason}")
    return _ENCODERS[kind]


def build_image_encoder(kind: str, config: Any, dtype: Any):
    """Returns the linen Module for an encoder kind and its config (compute ``dtype``)."""
    config_cls, build = _encoder_entry(kind)
    if not isinstance(config, config_cls):
        raise ValueError(f"encoder kind '{kind}' needs a {config_cls.__name__}, "
                         f"got {type(config).__name__}")
    return build(config, dtype)


@dataclasses.dataclass(frozen=True)
class MaskDecoderConfig:
    """SAM's mask decoder (two-way transformer + hypernetwork heads).

    LayerNorm eps: the transformer's token/image norms use torch's default
    1e-5; the LayerNorm2d in the output upscaling uses 1e-6.
    """

    transformer_depth: int = 2
    transformer_mlp_dim: int = 2048
    transformer_num_heads: int = 8
    attention_downsample_rate: int = 2
    num_multimask_outputs: int = 3
    iou_head_depth: int = 3
    iou_head_hidden_dim: int = 256


@dataclasses.dataclass(frozen=True)
class SamConfig:
    """Everything static about a SAM-family model.

    Attributes:
      encoder: the image-encoder config (e.g. `ViTConfig`, `TinyViTConfig`).
      encoder_kind: registry name of the encoder ("vit", "tiny_vit", ...).
      family: model family name stored with converted weights ("sam", ...).
      variant: variant name ("vit_b", ...), informational.
      image_size: side of the square, padded model input (1024).
      embedding_size: side of the image embedding grid (64).
      prompt_embed_dim: channels of image embeddings and prompt tokens (256).
      mask_in_chans: hidden channels of the mask-input downscaling (16).
      decoder: the mask decoder's config.
      pixel_mean, pixel_std: per-channel normalisation (RGB, 0..255 scale).
      compute_dtype: "float32" or "bfloat16", compute dtype of the image
        encoder (parameters stay float32; prompts/decoder always float32).
    """

    encoder: Any
    encoder_kind: str = "vit"
    family: str = "sam"
    variant: str = ""
    image_size: int = 1024
    embedding_size: int = 64
    prompt_embed_dim: int = 256
    mask_in_chans: int = 16
    decoder: MaskDecoderConfig = MaskDecoderConfig()
    pixel_mean: tuple[float, float, float] = PIXEL_MEAN
    pixel_std: tuple[float, float, float] = PIXEL_STD
    compute_dtype: str = "float32"

    def __post_init__(self):
        named_compute_dtype(self.compute_dtype)  # refuses an unknown name
        if self.image_size % self.embedding_size:
            raise ValueError(f"image_size {self.image_size} is not a multiple of "
                             f"embedding_size {self.embedding_size}")

    @property
    def low_res_size(self) -> int:
        """Side of the decoder's low-resolution logits (4 x embedding_size; SAM: 256)."""
        return 4 * self.embedding_size

    @property
    def dtype(self):
        """The jnp dtype named by ``compute_dtype``."""
        return named_compute_dtype(self.compute_dtype)

    def to_dict(self) -> dict:
        """JSON-representable dict (tuples become lists when serialised)."""
        out = dataclasses.asdict(self)
        out["encoder"] = dataclasses.asdict(self.encoder)
        return out

    @classmethod
    def from_dict(cls, data: dict) -> "SamConfig":
        """Inverse of `to_dict`; the encoder config class comes from ``encoder_kind``."""
        data = dict(data)
        kind = data.get("encoder_kind", "vit")
        encoder_cls, _ = _encoder_entry(kind)
        encoder = dataclass_from_dict(encoder_cls, dict(data.pop("encoder")),
                                      what=f"encoder config ({kind})")
        decoder = dataclass_from_dict(MaskDecoderConfig, dict(data.pop("decoder", {})),
                                      what="mask decoder config")
        return dataclass_from_dict(cls, {**data, "encoder": encoder, "decoder": decoder},
                                   what="SAM config")


def early_feature_channels(encoder_kind: str, encoder: Any) -> int:
    """Channels of the early encoder feature SAM-HQ fuses into its mask features.

    SAM-HQ reads the first entry of the encoder's ``interm_embeddings``:
      * "vit": the output of the first global-attention block
        (``global_attn_indexes[0]``; ViT-B block 2, ViT-L 5, ViT-H 7), ``embed_dim``
        channels on the E x E patch grid;
      * "tiny_vit": the output of stage 1 after its patch merging,
        ``embed_dims[2]`` channels (160 for MobileSAM's TinyViT), which must
        already be on the E x E grid (every later merge has stride 1), as
        SAM-HQ's reference reshapes it to 64 x 64.

    Raises:
      ValueError: an encoder kind without such a feature, or a configuration
        in which it does not exist or is not on the embedding grid.
    """
    if encoder_kind == "vit":
        if not encoder.global_attn_indexes:
            raise ValueError("SAM-HQ needs a ViT with at least one global-attention block "
                             "(global_attn_indexes is empty)")
        return int(encoder.embed_dim)
    if encoder_kind == "tiny_vit":
        if len(encoder.embed_dims) < 3:
            raise ValueError(f"SAM-HQ needs a TinyViT with at least 3 stages (its early feature "
                             f"is stage 1's merged output); got embed_dims {encoder.embed_dims}")
        if any(s != 1 for s in encoder.merge_strides[2:]):
            raise ValueError(f"SAM-HQ's TinyViT early feature (stage 1 output) must be on the "
                             f"embedding grid: merge_strides after stage 1 must be 1, got "
                             f"{encoder.merge_strides}")
        return int(encoder.embed_dims[2])
    raise ValueError(f"SAM-HQ has no early-feature rule for image encoder kind '{encoder_kind}' "
                     f"(known: 'vit', 'tiny_vit')")


@dataclasses.dataclass(frozen=True)
class SamHQConfig(SamConfig):
    """A SAM-HQ model: `SamConfig` plus SAM-HQ's decoder (family "sam_hq").

    The HQ mask decoder adds an HQ output token and fuses the early encoder
    feature (`early_feature_channels`, ``vit_dim`` channels) with the image
    embedding; no extra fields are needed, every HQ shape follows from the
    encoder and ``prompt_embed_dim``.
    """

    family: str = "sam_hq"

    def __post_init__(self):
        super().__post_init__()
        early_feature_channels(self.encoder_kind, self.encoder)  # validates

    @property
    def vit_dim(self) -> int:
        """Channels of the early encoder feature (the reference's ``vit_dim``)."""
        return early_feature_channels(self.encoder_kind, self.encoder)
