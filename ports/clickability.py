"""RClicks clickability model (``clickability_model.pth``, SegNeXtSaliency arch 'b').

The official file is a plain state dict of 862 tensors (docs/protocols/rclicks.md
§3.8): 720 learnable, 47 BatchNorms × (running_mean, running_var,
num_batches_tracked) and the NMF ``bases`` buffer. The port is strict:

1. `prepare_state_dict` handles the non-parameter entries explicitly and by
   name: every ``<bn>.num_batches_tracked`` must be an integer scalar
   belonging to a BatchNorm that also has ``running_mean``/``running_var``
   (and every BatchNorm must have one); they are then removed, since the
   network does not use them. Running variances must be non-negative. The
   NMF buffer ``encoder_decoder.decode_head.0.hamburger.ham.bases`` must be
   present (it exists only after the reference's dummy forward) and be a
   finite non-negative [1, D, R] tensor. Nothing else is removed.
2. `convert_clickability` maps every remaining key through `clickability_rules`
   with `ports.keytable.convert`, onto the variable tree
   {"params", "batch_stats", "buffers"} of `ClickabilityNet`; unknown, missing,
   duplicated or mis-shaped keys raise `PortError` naming the key.

Command line (once listed in ``ports/__main__.py``):
``python -m ports clickability --checkpoint clickability_model.pth --out DIR``.
"""

from __future__ import annotations

import argparse
import os
from typing import Mapping

import numpy as np

from ports.keytable import PortError, Rule, batch_norm_rules, conv_rules, convert, identity, layer_norm_rules
from ports.port_cli import add_checkpoint_arguments, report_converted
from ports.torch_checkpoint import drop_batchnorm_counters

BACKBONE = r"encoder_decoder\.backbone\."
HEAD = r"encoder_decoder\.decode_head\.0\."
BASES_KEY = "encoder_decoder.decode_head.0.hamburger.ham.bases"

# Convolutions inside an MSCA block: torch sub-path regex -> flax sub-path (group 3).
_BLOCK_CONVS = (
    (r"attn\.(proj_[12])", r"/attn/\g<3>"),
    (r"attn\.spatial_gating_unit\.(conv0|conv[012]_[12]|conv3)",
     r"/attn/spatial_gating_unit/\g<3>"),
    (r"mlp\.(fc1|dwconv|fc2)", r"/mlp/\g<3>"),
)


def clickability_rules() -> list[Rule]:
    """The key table: official SegNeXtSaliency state-dict keys -> Flax variable paths."""
    e, h = BACKBONE, HEAD
    blk = e + r"block([1-4])\.(\d+)\."
    blk_flax = r"backbone/block\g<1>_\g<2>"
    rules: list[Rule] = []
    # Mask encoder (maps_transform.{0,2,4} convs, .5 ScaleLayer).
    rules += conv_rules(r"maps_transform\.([024])", r"maps_transform/conv_\g<1>", bias=True)
    rules.append(Rule(r"maps_transform\.5\.scale", "params/maps_transform/scale"))
    # Stem (patch_embed1.proj.{0: conv, 1: BN, 3: conv, 4: BN}).
    rules += conv_rules(e + r"patch_embed1\.proj\.([03])", r"backbone/patch_embed1/proj_\g<1>", bias=True)
    rules += batch_norm_rules(e + r"patch_embed1\.proj\.([14])", r"backbone/patch_embed1/proj_\g<1>")
    # Stages 2-4 patch embeddings.
    rules += conv_rules(e + r"patch_embed([234])\.proj", r"backbone/patch_embed\g<1>/proj", bias=True)
    rules += batch_norm_rules(e + r"patch_embed([234])\.norm", r"backbone/patch_embed\g<1>/norm")
    # Blocks.
    rules.append(Rule(blk + r"(layer_scale_[12])", "params/" + blk_flax + r"/\g<3>"))
    rules += batch_norm_rules(blk + r"(norm[12])", blk_flax + r"/\g<3>")
    for torch_conv, flax_conv in _BLOCK_CONVS:
        rules += conv_rules(blk + torch_conv, blk_flax + flax_conv, bias=True)
    # Stage LayerNorms.
    rules += layer_norm_rules(e + r"norm([1-4])", r"backbone/norm\g<1>")
    # Decode head.
    rules += conv_rules(h + r"conv_seg", "decode_head/conv_seg", bias=True)
    for name in ("squeeze", "align", "hamburger.ham_out"):
        flax_name = "decode_head/" + name.replace(".", "/")
        rules += conv_rules(h + name.replace(".", r"\.") + r"\.conv", flax_name + "/conv")
        rules += layer_norm_rules(h + name.replace(".", r"\.") + r"\.gn", flax_name + "/gn")
    rules += conv_rules(h + r"hamburger\.ham_in\.conv", "decode_head/hamburger/ham_in", bias=True)
    rules.append(Rule(h + r"hamburger\.ham\.bases", "buffers/decode_head/hamburger/ham/bases",
                      identity))
    return rules


def prepare_state_dict(state_dict: Mapping[str, np.ndarray], *,
                       what: str = "checkpoint") -> dict[str, np.ndarray]:
    """Validates and removes the BatchNorm counters; validates the NMF bases buffer.

    Args:
      state_dict: torch key -> numpy array (as `ports.torch_checkpoint.load_state_dict`).
      what: name for error messages.

    Returns:
      A new dict without the ``*.num_batches_tracked`` entries; every other
      key is kept unchanged for the strict conversion.

    Raises:
      PortError: a counter without its BatchNorm (or of a wrong type), a
        BatchNorm without its counter, negative running variances, or a
        missing / negative / non-finite / mis-ranked NMF bases buffer.
    """
    out = drop_batchnorm_counters(state_dict, what=what)
    if BASES_KEY not in out:
        raise PortError(f"{what}: the NMF buffer '{BASES_KEY}' is missing (the reference "
                        f"creates it in the first forward; a state dict saved before any "
                        f"forward cannot be ported)")
    bases = np.asarray(out[BASES_KEY])
    if bases.ndim != 3 or bases.shape[0] != 1:
        raise PortError(f"{what}: '{BASES_KEY}' must have shape [1, D, R]; got {bases.shape}")
    if not np.isfinite(bases).all() or np.any(bases < 0):
        raise PortError(f"{what}: '{BASES_KEY}' must be finite and non-negative (NMF bases)")
    return out


def convert_clickability(state_dict: Mapping[str, np.ndarray], config=None, *,
                         what: str = "checkpoint") -> dict:
    """Strictly converts an official state dict to ClickabilityNet variables.

    Args:
      state_dict: torch key -> numpy array.
      config: a `ClickabilityConfig` (default: the released SegNeXt-B model).
      what: name for error messages.

    Returns:
      {"params", "batch_stats", "buffers"}: nested dicts of float32 numpy arrays.

    Raises:
      PortError: naming the offending key.
    """
    from jaxseg_robust.models.clickability.model import SEGNEXT_B, ClickabilityNet  # noqa: PLC0415

    config = SEGNEXT_B if config is None else config
    prepared = prepare_state_dict(state_dict, what=what)
    expected = ClickabilityNet(config).variable_shapes()
    return convert(prepared, clickability_rules(), expected, what=what)


def port_clickability(checkpoint: str | os.PathLike, out_dir: str | os.PathLike, *,
                      overwrite: bool = False) -> str:
    """Reads the official ``.pth``, converts it strictly and saves it with `jaxseg_robust.models.store`.

    Args:
      checkpoint: path of ``clickability_model.pth`` (or an ablation ``_{sigma}`` file).
      out_dir: output directory (orbax variables + config.json, family "clickability").
      overwrite: replace an existing converted model in ``out_dir``.

    Returns:
      The output directory.
    """
    from jaxseg_robust.models.clickability.model import FAMILY, SEGNEXT_B  # noqa: PLC0415
    from jaxseg_robust.models import store  # noqa: PLC0415
    from ports.torch_checkpoint import load_state_dict  # noqa: PLC0415

    checkpoint = os.fspath(checkpoint)
    variables = convert_clickability(load_state_dict(checkpoint), SEGNEXT_B, what=checkpoint)
    return store.save(out_dir, variables, family=FAMILY, variant=SEGNEXT_B.variant,
                      config=SEGNEXT_B.to_dict(), source_path=checkpoint, overwrite=overwrite)


# ---- command line (python -m ports clickability ...) ----------------------------

def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``python -m ports clickability``."""
    add_checkpoint_arguments(parser, "official RClicks clickability_model.pth")


def run(args: argparse.Namespace) -> int:
    """Runs the port; prints where the model went. Returns an exit code."""
    out = port_clickability(args.checkpoint, args.out, overwrite=args.overwrite)
    return report_converted(args.checkpoint, out)
