"""Official RobustSAM checkpoints (ViT-B/L/H) -> jaxseg_robust Flax parameters.

``python -m ports robustsam --checkpoint robustsam_checkpoint_b.pth --out DIR [--variant auto]
[--decoder-path clear|robust]``

A RobustSAM checkpoint is a flat state dict of ``robust_segment_anything``'s
``Sam``: SAM's ViT encoder, prompt encoder and mask decoder, and the decoder's
extra modules (``custom_robust_token``, ``robust_mlp``, ``custom_token_block``
and the three Fourier feature blocks ``fourier_{mask,first_layer,last_layer}_features``,
``robust_segment_anything/modeling/mask_decoder.py`` and ``components.py``).
The key table reuses ports/sam.py and adds `robust_decoder_rules`. Strict:
every key of the official layout (`official_robustsam_shapes`) must be present
with its shape and nothing else (the reference builder loads with
``strict=False``; this port does not). A ``module.`` prefix on every key (a
checkpoint saved from DistributedDataParallel, which the builder strips too)
is removed; the BatchNorm ``num_batches_tracked`` counters are checked and
dropped. ``--decoder-path`` is stored in config.json (docs/models/robustsam.md;
default "clear", the path of the reference predictor and of BREPS).
"""

from __future__ import annotations

import argparse
import os
from typing import Mapping

import numpy as np

from ports.keytable import PortError, Rule, conv, convert, identity, linear
from ports.port_cli import add_checkpoint_arguments, report_converted
from ports.sam import (check_official_keys, check_sam_family, conv1x1_as_linear, infer_variant,
                       mask_decoder_rules, official_mask_decoder_shapes, official_mlp_shapes,
                       official_prompt_encoder_shapes, official_vit_shapes, patch_conv_transpose,
                       prefixed_rules, prompt_encoder_rules, vit_encoder_rules)
from ports.torch_checkpoint import drop_batchnorm_counters, strip_wrapper_prefix

VARIANTS = ("vit_b", "vit_l", "vit_h")
FEATURE_BLOCKS = ("fourier_mask_features", "fourier_first_layer_features",
                  "fourier_last_layer_features")


def _pair(torch_name: str, flax_name: str, weight_transform) -> list[tuple[str, str, object]]:
    """``<torch_name>.weight`` / ``.bias`` -> ``<flax_name>/kernel`` / ``/bias``."""
    return [(torch_name + r"\.weight", flax_name + "/kernel", weight_transform),
            (torch_name + r"\.bias", flax_name + "/bias", identity)]


def degradation_rules(torch_block: str, flax_block: str) -> list[tuple[str, str, object]]:
    """``dnc_block_combined``, ``fgm_block`` and ``conv_layer`` of one feature block -> `DegradationBlock`."""
    dnc = torch_block + r"\.dnc_block_combined\."
    sk = dnc + r"SEMBlock\.maxpool_conv\.0\."
    flax = flax_block + "/degradation/"
    bn = flax + "selective_conv/bn/"
    return [
        (sk + r"conv1\.weight", flax + "selective_conv/conv1/kernel", conv),
        (sk + r"conv2\.weight", flax + "selective_conv/conv2/kernel", conv),
        (sk + r"BN\.weight", bn + "scale", identity),
        (sk + r"BN\.bias", bn + "bias", identity),
        (sk + r"BN\.running_mean", bn + "mean", identity),
        (sk + r"BN\.running_var", bn + "var", identity),
        (sk + r"selector\.fc\.0\.weight", flax + "selective_conv/selector/fc/kernel", linear),
        *_pair(sk + r"selector\.att_conv1", flax + "selective_conv/selector/att_conv1", linear),
        *_pair(sk + r"selector\.att_conv2", flax + "selective_conv/selector/att_conv2", linear),
        *_pair(dnc + r"channel_attention\.excitation\.0", flax + "channel_attention/lin1", linear),
        *_pair(dnc + r"channel_attention\.excitation\.2", flax + "channel_attention/lin2", linear),
        *_pair(torch_block + r"\.fgm_block\.conv_layer", flax + "fourier/conv", conv1x1_as_linear),
        *_pair(torch_block + r"\.conv_layer", flax + "conv_layer", conv),
    ]


def _sequential(torch_name: str, flax_name: str, names: tuple[str, str, str],
                weight_transform) -> list[tuple[str, str, object]]:
    """Conv -> LN2d -> GELU -> Conv (torch Sequential indices 0, 1, 3) -> flax ``names``."""
    first, norm, last = names
    return [*_pair(torch_name + r"\.0", f"{flax_name}/{first}", weight_transform),
            (torch_name + r"\.1\.weight", f"{flax_name}/{norm}/scale", identity),
            (torch_name + r"\.1\.bias", f"{flax_name}/{norm}/bias", identity),
            *_pair(torch_name + r"\.3", f"{flax_name}/{last}", weight_transform)]


def robust_decoder_rules(torch_prefix: str = "mask_decoder.",
                         flax_prefix: str = "mask_decoder/") -> list[Rule]:
    """Rules for `RobustMaskDecoder`: SAM's decoder rules plus RobustSAM's modules."""
    table = [
        (r"custom_robust_token\.weight", "custom_robust_token", identity),
        *_pair(r"robust_mlp\.layers\.(\d+)", r"robust_mlp/layers_\1", linear),
        *_pair(r"custom_token_block\.mlp\.0", "custom_token_block/lin1", linear),
        *_pair(r"custom_token_block\.mlp\.2", "custom_token_block/lin2", linear),
        *_sequential(r"fourier_mask_features\.downsample_layer", "fourier_mask_features/downsample",
                     ("conv1", "norm", "conv2"), conv),
    ]
    for block in FEATURE_BLOCKS:
        table += degradation_rules(block, block)
    for block in FEATURE_BLOCKS[1:]:
        table += _sequential(block + r"\.upsample_layer", block + "/upsample",
                             ("upscale1", "norm", "upscale2"), patch_conv_transpose)
    return mask_decoder_rules(torch_prefix, flax_prefix) + prefixed_rules(torch_prefix, flax_prefix,
                                                                          table)


def robustsam_rules() -> list[Rule]:
    """The full key table of a RobustSAM checkpoint (BatchNorm counters dropped)."""
    return vit_encoder_rules() + prompt_encoder_rules() + robust_decoder_rules()


def official_degradation_shapes(prefix: str, channels: int) -> dict[str, tuple[int, ...]]:
    """Keys and shapes of one feature block's ``dnc_block_combined``, ``fgm_block``, ``conv_layer``.

    ``channels`` is the block's input width (C / 8, D or C); counters included.
    """
    c, c2, flat = channels, 2 * channels, 16 * channels
    sk = prefix + "dnc_block_combined.SEMBlock.maxpool_conv.0."
    ca = prefix + "dnc_block_combined.channel_attention.excitation."
    out = {sk + "conv1.weight": (c, c, 3, 3), sk + "conv2.weight": (c, c, 3, 3),
           sk + "selector.fc.0.weight": (flat // 16, flat),
           sk + "selector.att_conv1.weight": (flat, flat // 16), sk + "selector.att_conv1.bias": (flat,),
           sk + "selector.att_conv2.weight": (flat, flat // 16), sk + "selector.att_conv2.bias": (flat,),
           sk + "BN.num_batches_tracked": (),
           ca + "0.weight": (c2 // 16, c2), ca + "0.bias": (c2 // 16,),
           ca + "2.weight": (c2, c2 // 16), ca + "2.bias": (c2,),
           prefix + "fgm_block.conv_layer.weight": (c2, c2, 1, 1),
           prefix + "fgm_block.conv_layer.bias": (c2,),
           prefix + "conv_layer.weight": (c, c2, 3, 3), prefix + "conv_layer.bias": (c,)}
    out.update({sk + f"BN.{name}": (c,) for name in ("weight", "bias", "running_mean", "running_var")})
    return out


def _sequential_shapes(prefix: str, *, transposed: bool, cin: int, mid: int,
                       cout: int) -> dict[str, tuple[int, ...]]:
    """Keys and shapes of Conv -> LN2d -> GELU -> Conv (3 x 3 convolutions, or 2 x 2 transposed ones)."""
    if transposed:
        first, last = (cin, mid, 2, 2), (mid, cout, 2, 2)
    else:
        first, last = (mid, cin, 3, 3), (cout, mid, 3, 3)
    return {prefix + "0.weight": first, prefix + "0.bias": (mid,),
            prefix + "1.weight": (mid,), prefix + "1.bias": (mid,),
            prefix + "3.weight": last, prefix + "3.bias": (cout,)}


def official_robust_extra_shapes(config, prefix: str = "mask_decoder.") -> dict[str, tuple[int, ...]]:
    """Keys and shapes RobustSAM's decoder adds to SAM's (``MaskDecoder`` of ``robust_segment_anything``)."""
    c, d, p = config.prompt_embed_dim, config.vit_dim, prefix
    k = config.decoder.num_multimask_outputs + 1
    out = {p + "custom_robust_token.weight": (k, c),
           p + "custom_token_block.mlp.0.weight": (c // k, c // k),
           p + "custom_token_block.mlp.0.bias": (c // k,),
           p + "custom_token_block.mlp.2.weight": (c, c // k),
           p + "custom_token_block.mlp.2.bias": (c,)}
    out.update(official_mlp_shapes(p + "robust_mlp.", [c, c, c, c // 8]))
    for block, width in zip(FEATURE_BLOCKS, (c // 8, d, c)):
        out.update(official_degradation_shapes(f"{p}{block}.", width))
    out.update(_sequential_shapes(p + "fourier_mask_features.downsample_layer.", transposed=False,
                                  cin=c // 8, mid=c // 4, cout=c // 8))
    out.update(_sequential_shapes(p + "fourier_first_layer_features.upsample_layer.",
                                  transposed=True, cin=d, mid=c, cout=c // 8))
    out.update(_sequential_shapes(p + "fourier_last_layer_features.upsample_layer.",
                                  transposed=True, cin=c, mid=c, cout=c // 8))
    return out


def official_robustsam_shapes(config) -> dict[str, tuple[int, ...]]:
    """Every key and shape of the official RobustSAM state dict for a `RobustSamConfig`.

    Written from ``robust_segment_anything``'s modules (BatchNorm counters
    included, as scalars); the parity suite checks it against the reference builder.
    """
    return {**official_vit_shapes(config.encoder), **official_prompt_encoder_shapes(config),
            **official_mask_decoder_shapes(config), **official_robust_extra_shapes(config)}


def prepare_state_dict(state_dict: Mapping[str, np.ndarray], config, *,
                       what: str = "checkpoint") -> dict[str, np.ndarray]:
    """Strips a ``module.`` prefix, checks the official layout, drops the BatchNorm counters.

    Raises:
      PortError: another family's checkpoint, or a key that is unexpected,
        missing or mis-shaped (named).
    """
    state_dict = strip_wrapper_prefix(state_dict, what=what)
    check_sam_family(state_dict, ("robustsam",), "robustsam", what=what)
    check_official_keys(state_dict, official_robustsam_shapes(config), what=what)
    return drop_batchnorm_counters(state_dict, what=what)


def convert_robustsam(state_dict: Mapping[str, np.ndarray], config, *,
                      what: str = "checkpoint") -> dict:
    """Strictly converts an official RobustSAM state dict for ``config`` (a `RobustSamConfig`).

    Returns:
      The Flax param tree {"image_encoder", "prompt_encoder", "mask_decoder"}
      of float32 numpy arrays (both decoder paths' parameters).

    Raises:
      PortError: naming the offending key.
    """
    from jaxseg_robust.models.robustsam.segmenter import RobustSamSegmenter  # noqa: PLC0415

    state_dict = prepare_state_dict(state_dict, config, what=what)
    expected = RobustSamSegmenter(config).param_shapes()
    return convert(state_dict, robustsam_rules(), expected, what=what)


def port_checkpoint(checkpoint: str | os.PathLike, out_dir: str | os.PathLike, *,
                    variant: str = "auto", decoder_path: str = "clear",
                    overwrite: bool = False) -> str:
    """Reads an official RobustSAM ``.pth``, converts it strictly, saves it with `jaxseg_robust.models.store`.

    Args:
      checkpoint: path of the official checkpoint.
      out_dir: output directory (orbax params + config.json).
      variant: "vit_b", "vit_l", "vit_h" or "auto" (from tensor shapes).
      decoder_path: "clear" or "robust", stored in the config.
      overwrite: replace an existing converted model in ``out_dir``.

    Returns:
      The output directory (family "robustsam").
    """
    from jaxseg_robust.models import store  # noqa: PLC0415
    from jaxseg_robust.models.robustsam.registry import (ROBUSTSAM_CONFIGS,  # noqa: PLC0415
                                                         with_decoder_path)
    from ports.torch_checkpoint import load_state_dict  # noqa: PLC0415

    if variant != "auto" and variant not in VARIANTS:
        raise ValueError(f"variant must be 'auto' or one of {VARIANTS}; got {variant!r}")
    checkpoint = os.fspath(checkpoint)
    state_dict = strip_wrapper_prefix(load_state_dict(checkpoint), what=checkpoint)
    check_sam_family(state_dict, ("robustsam",), "robustsam", what=checkpoint)
    if variant == "auto":
        variant = infer_variant(state_dict, what=checkpoint)
    config = with_decoder_path(ROBUSTSAM_CONFIGS[variant], decoder_path)
    params = convert_robustsam(state_dict, config, what=checkpoint)
    return store.save(out_dir, params, family=config.family, variant=variant,
                      config=config.to_dict(), source_path=checkpoint, overwrite=overwrite)


# ---- command line ----------------------------------------------------------------

def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``python -m ports robustsam``."""
    add_checkpoint_arguments(parser, "official RobustSAM checkpoint (robustsam_checkpoint_{b,l,h}.pth)",
                             VARIANTS)
    parser.add_argument("--decoder-path", default="clear", choices=("clear", "robust"),
                        help="the decoder output stored in config.json: 'clear' (SAM's output tokens, "
                             "the reference predictor's default and BREPS's) or 'robust' (the robust "
                             "output tokens of the authors' evaluation)")


def run(args: argparse.Namespace) -> int:
    """Runs the port; prints where the model went. Returns an exit code."""
    out = port_checkpoint(args.checkpoint, args.out, variant=args.variant,
                          decoder_path=args.decoder_path, overwrite=args.overwrite)
    return report_converted(args.checkpoint, out)


__all__ = ["VARIANTS", "FEATURE_BLOCKS", "robust_decoder_rules", "robustsam_rules",
           "official_robust_extra_shapes", "official_robustsam_shapes", "prepare_state_dict",
           "convert_robustsam", "port_checkpoint", "add_arguments", "run", "PortError"]
