"""Official HQ-SAM 2 checkpoints -> jaxseg_robust Flax parameters, strictly.

``python -m ports sam2_hq --checkpoint sam2.1_hq_hiera_large.pt --out DIR [--variant auto]``

An HQ-SAM 2 checkpoint (SysCV/sam-hq, folder ``sam-hq2``) is
``{"model": state_dict}`` of ``SAM2HQBase``: a SAM 2.1 video model whose mask
decoder (``MaskDecoderHQ``) adds ``hf_token``, ``hf_mlp`` and
``embedding_maskfeature``. The key table is SAM 2's (`ports.sam2.sam2_rules`)
plus the HQ token's (`ports.sam_hq.hq_token_table`, shared with SAM-HQ);
every key of the image path is used once, every parameter filled, shapes are
checked against the official layout (`official_sam2_hq_image_shapes`). The
video-only parts are skipped by name and listed in
``DIR/skipped_video_keys.txt``, as the SAM 2 port does. A plain SAM 2 or a
SAM 1 family checkpoint is refused with the port to use.

The trunk variant is inferred from the trunk width and block count (the
released checkpoint is Hiera-L); the version must be 2.1, the only one
HQ-SAM 2 was built on.
"""

from __future__ import annotations

import argparse
import os
from typing import Mapping

import numpy as np

from ports.keytable import PortError, Rule, convert
from ports.port_cli import add_checkpoint_arguments, report_converted
from ports.sam import check_official_keys, prefixed_rules
from ports.sam2 import (HQ_MARKER, VARIANTS, check_not_sam1, infer_variant, infer_version,
                        official_sam2_image_shapes, sam2_rules, split_video_keys, write_skipped)
from ports.sam_hq import hq_token_table, official_hq_token_shapes

DECODER_PREFIX = "sam_mask_decoder."


def sam2_hq_rules() -> list[Rule]:
    """The full key table of the image path of an official HQ-SAM 2 checkpoint."""
    return sam2_rules() + prefixed_rules(DECODER_PREFIX, "mask_decoder/", hq_token_table())


def official_sam2_hq_image_shapes(config) -> dict[str, tuple[int, ...]]:
    """Every key and shape of the image path of an official HQ-SAM 2 state dict.

    Written from ``mask_hq_decoder.MaskDecoderHQ``; the parity suite checks it
    against the official model built from its yaml config.
    """
    return {**official_sam2_image_shapes(config),
            **official_hq_token_shapes(config.d_model, DECODER_PREFIX)}


def convert_sam2_hq(state_dict: Mapping[str, np.ndarray], config, *, what: str = "checkpoint"):
    """Strictly converts the image path of an official HQ-SAM 2 state dict.

    Args:
      state_dict: the checkpoint's ``"model"`` entry as numpy arrays.
      config: a `Sam2HQConfig`.
      what: the checkpoint's name in messages.

    Returns:
      (params {"image_encoder", "prompt_encoder", "mask_decoder", "no_mem_embed"}
      of float32 numpy arrays, {video part: [skipped keys]}).

    Raises:
      PortError: naming the offending key, or the port to use for a SAM 1 or
        plain SAM 2 checkpoint.
    """
    from jaxseg_robust.models.sam2.hq_segmenter import Sam2HQSegmenter  # noqa: PLC0415

    check_not_sam1(state_dict, what=what)
    if HQ_MARKER not in state_dict:
        raise PortError(f"{what}: key '{HQ_MARKER}' is missing, so this is not an HQ-SAM 2 "
                        f"checkpoint; a SAM 2 checkpoint converts with `python -m ports sam2`")
    image, skipped = split_video_keys(state_dict)
    check_official_keys(image, official_sam2_hq_image_shapes(config), what=what)
    params = convert(image, sam2_hq_rules(), Sam2HQSegmenter(config).param_shapes(), what=what)
    return params, skipped


def port_checkpoint(checkpoint: str | os.PathLike, out_dir: str | os.PathLike, *,
                    variant: str = "auto", overwrite: bool = False):
    """Reads an official HQ-SAM 2 ``.pt``, converts its image path, saves it with the store.

    Returns:
      (output directory (family "sam2_hq"), {video part: [skipped keys]}).
    """
    from jaxseg_robust.models import store  # noqa: PLC0415
    from jaxseg_robust.models.sam2.config import official_hq_config  # noqa: PLC0415
    from ports.torch_checkpoint import load_state_dict  # noqa: PLC0415

    if variant != "auto" and variant not in VARIANTS:
        raise ValueError(f"variant must be 'auto' or one of {VARIANTS}; got {variant!r}")
    checkpoint = os.fspath(checkpoint)
    state_dict = load_state_dict(checkpoint)
    check_not_sam1(state_dict, what=checkpoint)
    variant = infer_variant(state_dict, what=checkpoint) if variant == "auto" else variant
    version = infer_version(state_dict, what=checkpoint)
    if version != "2.1":
        raise PortError(f"{checkpoint}: the keys mark a SAM {version} model; HQ-SAM 2 is built "
                        f"on SAM 2.1 (its checkpoints have 'no_obj_embed_spatial')")
    config = official_hq_config(variant)
    params, skipped = convert_sam2_hq(state_dict, config, what=checkpoint)
    out = store.save(out_dir, params, family=config.family, variant=variant,
                     config=config.to_dict(), source_path=checkpoint, overwrite=overwrite)
    write_skipped(out, skipped, state_dict, title=f"HQ-SAM 2 {variant}")
    return out, skipped


# ---- command line ------------------------------------------------------------------

def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``python -m ports sam2_hq``."""
    add_checkpoint_arguments(parser, "official HQ-SAM 2 .pt checkpoint (sam2.1_hq_hiera_large.pt)",
                             VARIANTS)


def run(args: argparse.Namespace) -> int:
    """Runs the port; prints where the model went and what was skipped. Returns an exit code."""
    out, _ = port_checkpoint(args.checkpoint, args.out, variant=args.variant,
                             overwrite=args.overwrite)
    return report_converted(args.checkpoint, out)


__all__ = ["sam2_hq_rules", "official_sam2_hq_image_shapes", "convert_sam2_hq", "port_checkpoint",
           "add_arguments", "run", "PortError"]
