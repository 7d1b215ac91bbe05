"""UPerNet-ConvNeXt checkpoints of Robust-Segmentation (SEA-AT models) -> family ``upernet``.

Command line (listed in ``ports/__main__.py`` as family ``upernet``)::

    python -m ports upernet --checkpoint model_ckpt.pth --out DIR
        [--pool-scales 1,2,3,6] [--background-class auto|none|N] [--overwrite]

Checkpoint format: Robust-Segmentation's training script saves
``model.module.state_dict()`` of ``UperNetForSemanticSegmentation`` (a bare
state dict, no prefix; ``tools/infer.py`` loads it with a strict
``load_state_dict``), and its models take plain [0, 1] images (``ToTensor()``
only, no normalisation layer). The port reads it with
``torch.load(weights_only=True)`` and accepts, besides, a ``module.`` prefix
and the ``normalize_model`` wrapper of the same code base
(``normalize.mean`` / ``normalize.std`` buffers, the network under
``model.``): the buffers become the model's ``pixel_mean`` / ``pixel_std``,
so the converted model normalises exactly as the saved one did. The
auxiliary FCN head is mapped (strict key table) and unused by ``apply``.

Read from keys and shapes (`upernet_config_from_state_dict`): the stem (conv
"CvSt" or patchify), depths and widths of the stages (tiny vs small), head
width, classes, auxiliary head. Not recorded in the weights: the PSP pool
sizes (``--pool-scales``; their count is checked) and the background label
(``auto``: class 0 for 21 PASCAL VOC classes, none for 150 ADE20K classes).
"""

from __future__ import annotations

import argparse
import os
import re
from typing import Mapping

import numpy as np

from ports.keytable import (PortError, Rule, batch_norm_rules, conv_rules, convert, identity,
                            layer_norm_rules, linear)
from ports.port_cli import add_checkpoint_arguments, report_converted
from ports.semseg import parse_background, parse_ints
from ports.torch_checkpoint import drop_batchnorm_counters, load_state_dict, strip_wrapper_prefix

NORMALIZER_KEYS = ("normalize.mean", "normalize.std")
BACKGROUND_BY_CLASSES = {21: 0, 150: None}


def _conv_bn(torch_prefix: str, flax_prefix: str) -> list[Rule]:
    """An ``UperNetConvModule`` (``.conv`` + ``.batch_norm``) -> ``<flax>/conv`` + ``<flax>/bn``."""
    return (conv_rules(torch_prefix + r"\.conv", flax_prefix + "/conv")
            + batch_norm_rules(torch_prefix + r"\.batch_norm", flax_prefix + "/bn"))


def upernet_rules() -> list[Rule]:
    """Robust-Segmentation ``UperNetForSemanticSegmentation`` keys -> `UperNet` variable paths."""
    b, stem = r"backbone\.", r"backbone\.downsample_layers\.0\."
    rules = conv_rules(stem + r"stem\.0", "backbone/stem_conv1", bias=True)
    rules += layer_norm_rules(stem + r"stem\.1", "backbone/stem_norm1")
    rules += conv_rules(stem + r"stem\.3", "backbone/stem_conv2", bias=True)
    rules += layer_norm_rules(stem + r"stem\.4", "backbone/stem_norm2")
    rules += conv_rules(stem + "0", "backbone/stem_conv", bias=True)  # patchify stem
    rules += layer_norm_rules(stem + "1", "backbone/stem_norm")
    rules += layer_norm_rules(b + r"downsample_layers\.([1-3])\.0", r"backbone/downsample\1_norm")
    rules += conv_rules(b + r"downsample_layers\.([1-3])\.1", r"backbone/downsample\1_conv", bias=True)
    blk, blk_flax = b + r"stages\.([0-3])\.(\d+)\.", r"backbone/stage\1_\2"
    rules += [Rule(blk + "gamma", "params/" + blk_flax + "/scale", identity)]
    rules += conv_rules(blk + "dwconv", blk_flax + "/dwconv", bias=True)
    rules += layer_norm_rules(blk + "norm", blk_flax + "/norm")
    for fc in ("pwconv1", "pwconv2"):
        rules += [Rule(blk + fc + r"\.weight", f"params/{blk_flax}/{fc}/kernel", linear),
                  Rule(blk + fc + r"\.bias", f"params/{blk_flax}/{fc}/bias", identity)]
    rules += layer_norm_rules(b + r"norm([0-3])", r"backbone/norm\1")
    d = r"decode_head\."
    rules += _conv_bn(d + r"psp_modules\.(\d+)\.1", r"decode_head/psp\1")
    rules += _conv_bn(d + "bottleneck", "decode_head/bottleneck")
    rules += _conv_bn(d + r"lateral_convs\.(\d+)", r"decode_head/lateral\1")
    rules += _conv_bn(d + r"fpn_convs\.(\d+)", r"decode_head/fpn\1")
    rules += _conv_bn(d + "fpn_bottleneck", "decode_head/fpn_bottleneck")
    rules += conv_rules(d + "classifier", "decode_head/classifier", bias=True)
    rules += _conv_bn(r"auxiliary_head\.convs\.0", "auxiliary_head/conv")
    rules += conv_rules(r"auxiliary_head\.classifier", "auxiliary_head/classifier", bias=True)
    return rules


def unwrap_normalizer(state_dict: Mapping[str, np.ndarray], *, what: str = "checkpoint"):
    """Splits a ``normalize_model`` wrapper off: returns (network state dict, (mean, std) or None).

    Raises:
      PortError: only one of the two buffers, a buffer that is not 3 values,
        or network keys outside ``model.``.
    """
    present = [k for k in NORMALIZER_KEYS if k in state_dict]
    if not present:
        return dict(state_dict), None
    if len(present) != 2:
        raise PortError(f"{what}: '{present[0]}' without its partner {set(NORMALIZER_KEYS) - set(present)}")
    stats = []
    for key in NORMALIZER_KEYS:
        value = np.asarray(state_dict[key], np.float64).ravel()
        if value.shape != (3,):
            raise PortError(f"{what}: '{key}' must hold 3 channel values; got shape "
                            f"{np.shape(state_dict[key])}")
        stats.append(tuple(float(v) for v in value))
    rest = {k: v for k, v in state_dict.items() if k not in NORMALIZER_KEYS}
    outside = [k for k in rest if not k.startswith("model.")]
    if outside:
        raise PortError(f"{what}: a normalising wrapper keeps the network under 'model.', but "
                        f"'{outside[0]}' is not")
    return {k[len("model."):]: v for k, v in rest.items()}, (stats[0], stats[1])


def _count(state_dict: Mapping[str, np.ndarray], pattern: str) -> dict[int, int]:
    """{group 1: 1 + max group 2} over keys matching ``pattern`` (two int groups)."""
    counts: dict[int, int] = {}
    for key in state_dict:
        m = re.match(pattern, key)
        if m:
            i, j = int(m.group(1)), int(m.group(2))
            counts[i] = max(counts.get(i, 0), j + 1)
    return counts


def _shape(state_dict, key: str, what: str) -> tuple[int, ...]:
    if key not in state_dict:
        raise PortError(f"{what}: '{key}' is missing (not a Robust-Segmentation UPerNet-ConvNeXt?)")
    return tuple(np.shape(state_dict[key]))


def upernet_config_from_state_dict(state_dict: Mapping[str, np.ndarray], *,
                                   pool_scales: tuple[int, ...] = (1, 2, 3, 6),
                                   normalizer=None, background_class="auto",
                                   what: str = "checkpoint"):
    """The `UperNetConfig` of a (prefix-free, counter-free) state dict.

    Raises:
      PortError: keys that do not describe the model, or a pool-scale count
        that differs from ``pool_scales``.
    """
    from jaxseg_robust.models.dense.upernet import UperNetConfig  # noqa: PLC0415

    stages = _count(state_dict, r"backbone\.stages\.(\d+)\.(\d+)\.")
    if sorted(stages) != [0, 1, 2, 3]:
        raise PortError(f"{what}: backbone.stages.0..3 keys are missing (not a ConvNeXt backbone); "
                        f"found stages {sorted(stages)}")
    depths = tuple(stages[i] for i in range(4))
    dims = tuple(_shape(state_dict, f"backbone.stages.{i}.0.dwconv.weight", what)[0] for i in range(4))
    conv_stem = "backbone.downsample_layers.0.stem.0.weight" in state_dict
    stem_width = _shape(state_dict, "backbone.downsample_layers.0.stem.0.weight", what)[0] if conv_stem else 48
    num_classes, channels = _shape(state_dict, "decode_head.classifier.weight", what)[:2]
    found = len({k.split(".")[2] for k in state_dict if k.startswith("decode_head.psp_modules.")})
    if found != len(pool_scales):
        raise PortError(f"{what}: the checkpoint has {found} PSP pools (decode_head.psp_modules.*) but "
                        f"--pool-scales gives {len(pool_scales)}: {list(pool_scales)}")
    aux = "auxiliary_head.classifier.weight" in state_dict
    if background_class == "auto":
        if num_classes not in BACKGROUND_BY_CLASSES:
            raise PortError(f"{what}: {num_classes} classes is neither PASCAL VOC (21) nor ADE20K (150); "
                            f"pass --background-class none or a class index")
        background_class = BACKGROUND_BY_CLASSES[num_classes]
    mean, std = normalizer if normalizer is not None else (None, None)
    try:
        return UperNetConfig(
            num_classes=num_classes, depths=depths, dims=dims, stem="conv" if conv_stem else "patch",
            stem_width=stem_width, channels=channels, pool_scales=tuple(pool_scales), aux=aux,
            aux_channels=_shape(state_dict, "auxiliary_head.classifier.weight", what)[1] if aux else 256,
            pixel_mean=mean, pixel_std=std, background_class=background_class)
    except ValueError as err:
        raise PortError(f"{what}: {err}") from None


def prepare_state_dict(state_dict: Mapping[str, np.ndarray], *, what: str = "checkpoint"):
    """Strips ``module.``, splits off a normaliser, drops BatchNorm counters: (state dict, normaliser)."""
    unwrapped, normalizer = unwrap_normalizer(strip_wrapper_prefix(state_dict, what=what), what=what)
    return drop_batchnorm_counters(unwrapped, what=what), normalizer


def convert_upernet(state_dict: Mapping[str, np.ndarray], config=None, *,
                    what: str = "checkpoint") -> dict:
    """Strictly converts a Robust-Segmentation UPerNet state dict to ``{"params", "batch_stats"}``.

    Raises:
      PortError: naming the offending key.
    """
    from jaxseg_robust.models.dense.upernet import UperNetDense  # noqa: PLC0415

    prepared, normalizer = prepare_state_dict(state_dict, what=what)
    if config is None:
        config = upernet_config_from_state_dict(prepared, normalizer=normalizer, what=what)
    return convert(prepared, upernet_rules(), UperNetDense(config).variable_shapes(), what=what)


def port_upernet(checkpoint: str | os.PathLike, out_dir: str | os.PathLike, *,
                 pool_scales: tuple[int, ...] = (1, 2, 3, 6), background_class="auto",
                 overwrite: bool = False) -> str:
    """Reads a UPerNet-ConvNeXt ``.pth`` (weights only), converts and saves it (family "upernet")."""
    from jaxseg_robust.models import store  # noqa: PLC0415
    from jaxseg_robust.models.dense.upernet import FAMILY, UperNetDense  # noqa: PLC0415

    checkpoint = os.fspath(checkpoint)
    prepared, normalizer = prepare_state_dict(load_state_dict(checkpoint), what=checkpoint)
    config = upernet_config_from_state_dict(prepared, pool_scales=pool_scales, normalizer=normalizer,
                                            background_class=background_class, what=checkpoint)
    variables = convert(prepared, upernet_rules(), UperNetDense(config).variable_shapes(), what=checkpoint)
    return store.save(out_dir, variables, family=FAMILY, variant=config.variant,
                      config=config.to_dict(), source_path=checkpoint, overwrite=overwrite)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``python -m ports upernet``."""
    add_checkpoint_arguments(parser, "Robust-Segmentation UPerNet-ConvNeXt state dict (.pth)")
    parser.add_argument("--pool-scales", default="1,2,3,6", help="PSP pool sizes (default 1,2,3,6)")
    parser.add_argument("--background-class", default="auto",
                        help="background label: auto (0 for 21 classes, none for 150), none, or an index")


def run(args: argparse.Namespace) -> int:
    """Converts ``--checkpoint`` into ``--out``; returns 0."""
    out = port_upernet(args.checkpoint, args.out,
                       pool_scales=parse_ints(args.pool_scales, name="--pool-scales"),
                       background_class=parse_background(args.background_class),
                       overwrite=args.overwrite)
    return report_converted(args.checkpoint, out)
