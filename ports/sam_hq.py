"""Official SAM-HQ checkpoints (ViT-B/L/H, TinyViT) -> jaxseg_robust Flax parameters.

``python -m ports sam_hq --checkpoint sam_hq_vit_b.pth --out DIR [--variant auto]``

A SAM-HQ checkpoint is a SAM checkpoint (ViT encoder, or MobileSAM's TinyViT
for ``vit_tiny``) whose mask decoder has five extra modules: ``hf_token``,
``hf_mlp``, ``compress_vit_feat``, ``embedding_encoder`` and
``embedding_maskfeature`` (``segment_anything_hq/modeling/mask_decoder_hq.py``).
The key table reuses ports/sam.py (ViT, prompt encoder, SAM decoder) and
ports/mobile_sam.py (TinyViT) and adds `hq_decoder_rules`. Strict: every key
of the official layout (`official_sam_hq_shapes`) must be present with its
shape and nothing else (``segment_anything_hq``'s own builder loads with
``strict=False``; this port does not). Plain SAM and MobileSAM checkpoints
are refused with a message naming the port to use.

The TinyViT variant has MobileSAM's attention-bias caching quirk (its builder
calls ``eval()`` before loading); the port uses the checkpoint's biases, see
ports/mobile_sam.py.
"""

from __future__ import annotations

import argparse
import os
from typing import Mapping

import numpy as np

from ports.keytable import PortError, Rule, conv, convert, identity, linear
from ports.mobile_sam import prepare_tiny_vit_state_dict, tiny_vit_rules
from ports.port_cli import add_checkpoint_arguments, report_converted
from ports.sam import (check_official_keys, check_sam_family, infer_variant, mask_decoder_rules,
                       official_mask_decoder_shapes, official_mlp_shapes,
                       official_prompt_encoder_shapes, official_vit_shapes, patch_conv_transpose,
                       prefixed_rules, prompt_encoder_rules, vit_encoder_rules)

VARIANTS = ("vit_b", "vit_l", "vit_h", "vit_tiny")
TINY_VIT_MARKER = "image_encoder.patch_embed.seq.0.c.weight"


def _upscaling(torch_name: str, flax_name: str) -> list[tuple[str, str, object]]:
    """ConvT -> LN2d -> GELU -> ConvT (torch Sequential indices 0, 1, 3)."""
    return [
        (torch_name + r"\.0\.weight", flax_name + "/upscale1/kernel", patch_conv_transpose),
        (torch_name + r"\.0\.bias", flax_name + "/upscale1/bias", identity),
        (torch_name + r"\.1\.weight", flax_name + "/norm/scale", identity),
        (torch_name + r"\.1\.bias", flax_name + "/norm/bias", identity),
        (torch_name + r"\.3\.weight", flax_name + "/upscale2/kernel", patch_conv_transpose),
        (torch_name + r"\.3\.bias", flax_name + "/upscale2/bias", identity),
    ]


def hq_token_table() -> list[tuple[str, str, object]]:
    """(torch regex, Flax path, transform) of the HQ token's modules, relative to the decoder.

    ``hf_token``, ``hf_mlp`` and ``embedding_maskfeature`` (Conv3x3 -> LN2d ->
    GELU -> Conv3x3, Sequential indices 0, 1, 3): shared by SAM-HQ and HQ-SAM 2.
    """
    return [
        (r"hf_token\.weight", "hf_token", identity),
        (r"hf_mlp\.layers\.(\d+)\.weight", r"hf_mlp/layers_\1/kernel", linear),
        (r"hf_mlp\.layers\.(\d+)\.bias", r"hf_mlp/layers_\1/bias", identity),
        (r"embedding_maskfeature\.0\.weight", "embedding_maskfeature/conv1/kernel", conv),
        (r"embedding_maskfeature\.0\.bias", "embedding_maskfeature/conv1/bias", identity),
        (r"embedding_maskfeature\.1\.weight", "embedding_maskfeature/norm/scale", identity),
        (r"embedding_maskfeature\.1\.bias", "embedding_maskfeature/norm/bias", identity),
        (r"embedding_maskfeature\.3\.weight", "embedding_maskfeature/conv2/kernel", conv),
        (r"embedding_maskfeature\.3\.bias", "embedding_maskfeature/conv2/bias", identity),
    ]


def hq_decoder_rules(torch_prefix: str = "mask_decoder.",
                     flax_prefix: str = "mask_decoder/") -> list[Rule]:
    """Rules for SAM-HQ's `MaskDecoderHQ`: SAM's decoder rules plus the HQ modules."""
    table = [
        *hq_token_table(),
        *_upscaling(r"compress_vit_feat", "compress_vit_feat"),
        *_upscaling(r"embedding_encoder", "embedding_encoder"),
    ]
    return (mask_decoder_rules(torch_prefix, flax_prefix)
            + prefixed_rules(torch_prefix, flax_prefix, table))


def sam_hq_rules(config) -> list[Rule]:
    """The full key table of a SAM-HQ checkpoint for a `SamHQConfig` (ViT or TinyViT)."""
    encoder = tiny_vit_rules() if config.encoder_kind == "tiny_vit" else vit_encoder_rules()
    return encoder + prompt_encoder_rules() + hq_decoder_rules()


def official_hq_extra_shapes(config, prefix: str = "mask_decoder.") -> dict[str, tuple[int, ...]]:
    """Keys and shapes the HQ decoder adds to SAM's decoder (``MaskDecoderHQ``)."""
    c, d, p = config.prompt_embed_dim, config.vit_dim, prefix
    out = official_hq_token_shapes(c, prefix)
    for name, (cin, mid) in (("compress_vit_feat", (d, c)), ("embedding_encoder", (c, c // 4))):
        out.update({p + f"{name}.0.weight": (cin, mid, 2, 2), p + f"{name}.0.bias": (mid,),
                    p + f"{name}.1.weight": (mid,), p + f"{name}.1.bias": (mid,),
                    p + f"{name}.3.weight": (mid, c // 8, 2, 2), p + f"{name}.3.bias": (c // 8,)})
    return out


def official_hq_token_shapes(c: int, prefix: str) -> dict[str, tuple[int, ...]]:
    """Keys and shapes of the HQ token's modules (see `hq_token_table`) for decoder width ``c``."""
    out = {prefix + "hf_token.weight": (1, c)}
    out.update(official_mlp_shapes(prefix + "hf_mlp.", [c, c, c, c // 8]))
    m = prefix + "embedding_maskfeature."
    out.update({m + "0.weight": (c // 4, c // 8, 3, 3), m + "0.bias": (c // 4,),
                m + "1.weight": (c // 4,), m + "1.bias": (c // 4,),
                m + "3.weight": (c // 8, c // 4, 3, 3), m + "3.bias": (c // 8,)})
    return out


def official_sam_hq_shapes(config, *, include_encoder: bool = True) -> dict[str, tuple[int, ...]]:
    """Every key and shape of the official SAM-HQ state dict for a `SamHQConfig`.

    Written from ``segment_anything_hq``'s modules; the parity suite checks it
    against the reference builders. The TinyViT encoder's keys are not listed
    (``include_encoder`` must be False for it; its key table is strict on its own).
    """
    out: dict[str, tuple[int, ...]] = {}
    if include_encoder:
        if config.encoder_kind != "vit":
            raise ValueError(f"official encoder keys are listed for ViT encoders only; got "
                             f"'{config.encoder_kind}' (pass include_encoder=False)")
        out.update(official_vit_shapes(config.encoder))
    out.update(official_prompt_encoder_shapes(config))
    out.update(official_mask_decoder_shapes(config))
    out.update(official_hq_extra_shapes(config))
    return out


def infer_hq_variant(state_dict: Mapping[str, np.ndarray], *, what: str = "checkpoint") -> str:
    """vit_tiny (TinyViT encoder) or vit_b / vit_l / vit_h (see `ports.sam.infer_variant`)."""
    if TINY_VIT_MARKER in state_dict:
        return "vit_tiny"
    return infer_variant(state_dict, what=what)


def convert_sam_hq(state_dict: Mapping[str, np.ndarray], config, *,
                   what: str = "checkpoint") -> dict:
    """Strictly converts an official SAM-HQ state dict for ``config`` (a `SamHQConfig`).

    Returns:
      The Flax param tree {"image_encoder", "prompt_encoder", "mask_decoder"}
      of float32 numpy arrays.

    Raises:
      PortError: naming the offending key (another family's checkpoint,
        unused, missing, mis-shaped, non-float or non-finite entries).
    """
    from jaxseg_robust.models.sam.hq_segmenter import SamHQSegmenter  # noqa: PLC0415

    check_sam_family(state_dict, ("sam_hq",), "sam_hq", what=what)
    if config.encoder_kind == "tiny_vit":
        state_dict = prepare_tiny_vit_state_dict(state_dict, config.encoder, what=what)
        rest = {k: v for k, v in state_dict.items() if not k.startswith("image_encoder.")}
        check_official_keys(rest, official_sam_hq_shapes(config, include_encoder=False),
                            what=what)
    else:
        check_official_keys(state_dict, official_sam_hq_shapes(config), what=what)
    expected = SamHQSegmenter(config).param_shapes()
    return convert(state_dict, sam_hq_rules(config), expected, what=what)


def port_checkpoint(checkpoint: str | os.PathLike, out_dir: str | os.PathLike, *,
                    variant: str = "auto", overwrite: bool = False) -> str:
    """Reads an official SAM-HQ ``.pth``, converts it strictly, saves it with `jaxseg_robust.models.store`.

    Args:
      checkpoint: path of the official checkpoint.
      out_dir: output directory (orbax params + config.json).
      variant: "vit_b", "vit_l", "vit_h", "vit_tiny" or "auto" (from tensor shapes).
      overwrite: replace an existing converted model in ``out_dir``.

    Returns:
      The output directory (family "sam_hq").
    """
    from jaxseg_robust.models.sam.registry import SAM_HQ_CONFIGS  # noqa: PLC0415
    from jaxseg_robust.models import store  # noqa: PLC0415
    from ports.torch_checkpoint import load_state_dict  # noqa: PLC0415

    if variant != "auto" and variant not in VARIANTS:
        raise ValueError(f"variant must be 'auto' or one of {VARIANTS}; got {variant!r}")
    checkpoint = os.fspath(checkpoint)
    state_dict = load_state_dict(checkpoint)
    check_sam_family(state_dict, ("sam_hq",), "sam_hq", what=checkpoint)
    if variant == "auto":
        variant = infer_hq_variant(state_dict, what=checkpoint)
    config = SAM_HQ_CONFIGS[variant]
    params = convert_sam_hq(state_dict, config, what=checkpoint)
    return store.save(out_dir, params, family=config.family, variant=variant,
                      config=config.to_dict(), source_path=checkpoint, overwrite=overwrite)


# ---- command line ----------------------------------------------------------------

def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``python -m ports sam_hq``."""
    add_checkpoint_arguments(parser, "official SAM-HQ checkpoint (sam_hq_vit_{b,l,h,tiny}.pth)", VARIANTS)


def run(args: argparse.Namespace) -> int:
    """Runs the port; prints where the model went. Returns an exit code."""
    out = port_checkpoint(args.checkpoint, args.out, variant=args.variant, overwrite=args.overwrite)
    return report_converted(args.checkpoint, out)


__all__ = ["VARIANTS", "hq_token_table", "official_hq_token_shapes", "hq_decoder_rules",
           "sam_hq_rules", "official_hq_extra_shapes",
           "official_sam_hq_shapes", "infer_hq_variant", "convert_sam_hq", "port_checkpoint",
           "add_arguments", "run", "PortError"]
