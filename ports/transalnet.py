"""TranSalNet_Res (``TranSalNet_Res.pth``), the saliency model of RClicks' SM baseline.

The official file is a plain state dict of the authors' ``TranSalNet`` (ResNet-50
backbone): ``encoder.encoder.{0,1,4..7}.*`` (the first eight children of a torchvision
ResNet-50: conv1, bn1, -, -, layer1..layer4), ``decoder.conv{1..7}``,
``decoder.batchnorm{1..6}`` and ``decoder.TransEncoder{1,2,3}.*`` (patch embedding,
position embeddings, transformer blocks). The port is strict:

1. the ``*.num_batches_tracked`` counters are validated and dropped by name
   (`ports.torch_checkpoint.drop_batchnorm_counters`);
2. every remaining key maps through `transalnet_rules` with `ports.keytable.convert`
   onto the variables {"params", "batch_stats"} of
   `jaxseg_robust.models.saliency.network.TranSalNet`; unknown, missing, duplicated or
   mis-shaped keys raise `PortError` naming the key. The configuration is the released
   one unless given (the tiny test configuration in tests).

Command line: ``python -m ports transalnet --checkpoint TranSalNet_Res.pth --out DIR``.
"""

from __future__ import annotations

import argparse
import os
from typing import Mapping

import numpy as np

from ports.keytable import Rule, batch_norm_rules, conv_rules, convert, layer_norm_rules, linear
from ports.port_cli import add_checkpoint_arguments, report_converted
from ports.torch_checkpoint import drop_batchnorm_counters

CHECKPOINT_NAME = "TranSalNet_Res.pth"
_BACKBONE = r"encoder\.encoder\."
_LAYER_CHILD = {"4": "1", "5": "2", "6": "3", "7": "4"}  # ResNet child index -> layer number


def _backbone_rules() -> list[Rule]:
    """ResNet-50 children 0 (conv1), 1 (bn1) and 4..7 (layer1..4) -> ``backbone/...``."""
    rules = conv_rules(_BACKBONE + r"0", "backbone/conv1") + batch_norm_rules(_BACKBONE + r"1", "backbone/bn1")
    for child, layer in _LAYER_CHILD.items():
        block = _BACKBONE + child + r"\.(\d+)\."
        flax_block = rf"backbone/layer{layer}_\1"
        rules += conv_rules(block + r"(conv[123])", flax_block + r"/\2")
        rules += batch_norm_rules(block + r"(bn[123])", flax_block + r"/\2")
        rules += conv_rules(block + r"downsample\.0", flax_block + "/downsample_conv")
        rules += batch_norm_rules(block + r"downsample\.1", flax_block + "/downsample_bn")
    return rules


def _linear_rules(torch_prefix: str, flax_prefix: str) -> list[Rule]:
    """torch Linear weight [out, in] / bias -> Dense kernel [in, out] / bias."""
    return [Rule(torch_prefix + r"\.weight", f"params/{flax_prefix}/kernel", linear),
            Rule(torch_prefix + r"\.bias", f"params/{flax_prefix}/bias")]


def _trans_encoder_rules() -> list[Rule]:
    """``decoder.TransEncoder{k}.*`` -> ``decoder/TransEncoder{k}/...``."""
    enc, flax_enc = r"decoder\.(TransEncoder[123])\.", r"decoder/\1"
    block, flax_block = enc + r"transformer_encoder\.layer\.(\d+)\.", flax_enc + r"/layer_\2"
    rules = conv_rules(enc + "patch_embeddings", flax_enc + "/patch_embeddings", bias=True)
    rules.append(Rule(enc + "position_embeddings", f"params/{flax_enc}/position_embeddings"))
    rules += layer_norm_rules(enc + r"transformer_encoder\.encoder_norm", flax_enc + "/encoder_norm")
    rules += layer_norm_rules(block + r"(attention_norm|ffn_norm)", flax_block + r"/\3")
    rules += _linear_rules(block + r"attn\.(query|key|value|out)", flax_block + r"/attn/\3")
    rules += _linear_rules(block + r"ffn\.(fc[12])", flax_block + r"/\3")
    return rules


def transalnet_rules() -> list[Rule]:
    """The key table: official TranSalNet_Res state-dict keys -> Flax variable paths."""
    rules = _backbone_rules() + _trans_encoder_rules()
    rules += conv_rules(r"decoder\.(conv[1-7])", r"decoder/\1", bias=True)
    rules += batch_norm_rules(r"decoder\.(batchnorm[1-6])", r"decoder/\1")
    return rules


def convert_transalnet(state_dict: Mapping[str, np.ndarray], config=None, *, what: str = "checkpoint") -> dict:
    """Strictly converts an official state dict to `TranSalNet` variables.

    Args:
      state_dict: torch key -> numpy array (`ports.torch_checkpoint.load_state_dict`).
      config: a `TranSalNetConfig` (default: the released TranSalNet_Res).
      what: name for error messages.

    Returns:
      {"params", "batch_stats"}: nested dicts of float32 numpy arrays.

    Raises:
      PortError: naming the offending key.
    """
    from jaxseg_robust.models.saliency.config import TRANSALNET_RES  # noqa: PLC0415
    from jaxseg_robust.models.saliency.network import TranSalNet  # noqa: PLC0415

    config = TRANSALNET_RES if config is None else config
    prepared = drop_batchnorm_counters(state_dict, what=what)
    return convert(prepared, transalnet_rules(), TranSalNet(config).variable_shapes(), what=what)


def port_transalnet(checkpoint: str | os.PathLike, out_dir: str | os.PathLike, *, config=None,
                    overwrite: bool = False) -> str:
    """Reads the official ``.pth`` (``weights_only``), converts it strictly, saves it with `models.store`.

    Args:
      checkpoint: path of ``TranSalNet_Res.pth``.
      out_dir: output directory (orbax variables + config.json, family "transalnet").
      config: the network configuration (default: the released one).
      overwrite: replace an existing converted model in ``out_dir``.

    Returns:
      The output directory.
    """
    from jaxseg_robust.models import store  # noqa: PLC0415
    from jaxseg_robust.models.saliency.config import FAMILY, TRANSALNET_RES  # noqa: PLC0415
    from ports.torch_checkpoint import load_state_dict  # noqa: PLC0415

    config = TRANSALNET_RES if config is None else config
    checkpoint = os.fspath(checkpoint)
    variables = convert_transalnet(load_state_dict(checkpoint), config, what=checkpoint)
    return store.save(out_dir, variables, family=FAMILY, variant=config.variant, config=config.to_dict(),
                      source_path=checkpoint, overwrite=overwrite)


# ---- command line (python -m ports transalnet ...) --------------------------------

def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``python -m ports transalnet``."""
    add_checkpoint_arguments(parser, f"official {CHECKPOINT_NAME} (TranSalNet with the ResNet-50 backbone)")


def run(args: argparse.Namespace) -> int:
    """Runs the port; prints where the model went. Returns an exit code."""
    out = port_transalnet(args.checkpoint, args.out, overwrite=args.overwrite)
    return report_converted(args.checkpoint, out)
