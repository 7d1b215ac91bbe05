"""semseg / DDC-AT PSPNet and DeepLabv3 checkpoints (normal, SAT, DDC-AT) -> family ``semseg``.

Command line (listed in ``ports/__main__.py`` as family ``semseg``)::

    python -m ports semseg --checkpoint train_epoch_50.pth --out DIR
        [--bins 1,2,3,6] [--atrous-rates 6,12,18] [--background-class auto|none|N] [--overwrite]

The checkpoint format is the one semseg's training script writes and the
DDC-AT test scripts read: ``torch.save({"epoch", "state_dict", "optimizer"})``
of a (Distributed)DataParallel model, i.e. the weights under ``state_dict``
with every key prefixed ``module.``. It is read with
``torch.load(weights_only=True)`` (`ports.torch_checkpoint.load_state_dict`);
a bare state dict, with or without the prefix, is accepted too. The training
models were built in training mode, so the auxiliary head (``aux.*``, DDC-AT
``aux_cls1.*``) is in the file; the port maps it (strict: every key is used
once) and the model keeps it unused.

What the weights do not record and the flags give: the PSP pool sizes
(``--bins``, semseg's (1, 2, 3, 6); their *count* is checked against the
file), the ASPP dilations (``--atrous-rates``, the DDC-AT code's (6, 12, 18))
and which label is background (``auto``: class 0 for a 21-class PASCAL VOC
model, none for a 19-class Cityscapes model). Everything else (PSPNet or
DeepLabv3, DDC-AT branches, block counts, widths, classes) is read from the
keys and shapes (`semseg_config_from_state_dict`). Key table: `semseg_rules`.
"""

from __future__ import annotations

import argparse
import os
import re
from typing import Mapping

import numpy as np

from ports.keytable import PortError, Rule, batch_norm_rules, conv_rules, convert
from ports.port_cli import add_checkpoint_arguments, report_converted
from ports.torch_checkpoint import drop_batchnorm_counters, load_state_dict, strip_wrapper_prefix

STEM = (("0", "stem_conv1", "conv"), ("1", "stem_bn1", "bn"), ("3", "stem_conv2", "conv"),
        ("4", "stem_bn2", "bn"), ("6", "stem_conv3", "conv"), ("7", "stem_bn3", "bn"))
CLASSIFIERS = ("cls", "cls1", "cls2", "mask1", "aux", "aux_cls1")
BACKGROUND_BY_CLASSES = {21: 0, 19: None}


def semseg_rules() -> list[Rule]:
    """semseg / DDC-AT state-dict keys (``module.`` stripped) -> `Semseg` variable paths."""
    rules: list[Rule] = []
    for index, name, kind in STEM:
        make = conv_rules if kind == "conv" else batch_norm_rules
        rules += make(r"layer0\." + index, f"backbone/{name}")
    blk, blk_flax = r"layer([1-4])\.(\d+)\.", r"backbone/layer\1_\2"
    rules += conv_rules(blk + r"(conv[123])", blk_flax + r"/\3")
    rules += batch_norm_rules(blk + r"(bn[123])", blk_flax + r"/\3")
    rules += conv_rules(blk + r"downsample\.0", blk_flax + "/downsample_conv")
    rules += batch_norm_rules(blk + r"downsample\.1", blk_flax + "/downsample_bn")
    rules += conv_rules(r"ppm\.features\.(\d+)\.1", r"ppm/bin\1_conv")
    rules += batch_norm_rules(r"ppm\.features\.(\d+)\.2", r"ppm/bin\1_bn")
    rules += conv_rules(r"aspp\.convs\.([0-3])\.0", r"aspp/branch\1_conv")
    rules += batch_norm_rules(r"aspp\.convs\.([0-3])\.1", r"aspp/branch\1_bn")
    rules += conv_rules(r"aspp\.convs\.4\.1", "aspp/pooling_conv")
    rules += batch_norm_rules(r"aspp\.convs\.4\.2", "aspp/pooling_bn")
    heads = "|".join(CLASSIFIERS)
    rules += conv_rules(rf"({heads})\.0", r"\1/conv")
    rules += batch_norm_rules(rf"({heads})\.1", r"\1/bn")
    rules += conv_rules(rf"({heads})\.4", r"\1/classifier", bias=True)
    return rules


def _shape(state_dict: Mapping[str, np.ndarray], key: str, what: str) -> tuple[int, ...]:
    if key not in state_dict:
        raise PortError(f"{what}: '{key}' is missing (not a semseg PSPNet / DeepLabv3 checkpoint?)")
    return tuple(np.shape(state_dict[key]))


def _blocks(state_dict: Mapping[str, np.ndarray], what: str) -> tuple[int, int, int, int]:
    blocks = [0, 0, 0, 0]
    for key in state_dict:
        m = re.match(r"layer([1-4])\.(\d+)\.", key)
        if m:
            stage = int(m.group(1)) - 1
            blocks[stage] = max(blocks[stage], int(m.group(2)) + 1)
    if min(blocks) == 0:
        raise PortError(f"{what}: layer1..layer4 keys are missing (not a semseg ResNet); block "
                        f"counts found {blocks}")
    return tuple(blocks)


def _head_kind(state_dict: Mapping[str, np.ndarray], what: str) -> str:
    has_ppm = any(k.startswith("ppm.") for k in state_dict)
    has_aspp = any(k.startswith("aspp.") for k in state_dict)
    if has_ppm == has_aspp:
        raise PortError(f"{what}: expected either 'ppm.*' (PSPNet) or 'aspp.*' (DeepLabv3) keys; "
                        f"found {'both' if has_ppm else 'neither'}")
    return "psp" if has_ppm else "aspp"


def _resolve_background(value, num_classes: int, what: str):
    if value != "auto":
        return value
    if num_classes not in BACKGROUND_BY_CLASSES:
        raise PortError(f"{what}: {num_classes} classes is neither PASCAL VOC (21) nor Cityscapes "
                        f"(19); pass --background-class none or a class index")
    return BACKGROUND_BY_CLASSES[num_classes]


def semseg_config_from_state_dict(state_dict: Mapping[str, np.ndarray], *,
                                  bins: tuple[int, ...] = (1, 2, 3, 6),
                                  atrous_rates: tuple[int, int, int] = (6, 12, 18),
                                  background_class="auto", what: str = "checkpoint"):
    """The `SemsegConfig` a (prefix-stripped, counter-free) state dict implements.

    Args:
      state_dict: torch key -> array.
      bins, atrous_rates: the pool sizes / dilations the weights cannot record.
      background_class: "auto" (0 for 21 classes, None for 19), None or an index.
      what: name for error messages.

    Raises:
      PortError: the keys do not describe a semseg PSPNet / DeepLabv3, or the
        number of PSP bins in the file differs from ``bins``.
    """
    from jaxseg_robust.models.dense.semseg import SemsegConfig  # noqa: PLC0415

    head = _head_kind(state_dict, what)
    ddcat = "cls1.4.weight" in state_dict
    main = "cls1" if ddcat else "cls"
    num_classes = _shape(state_dict, f"{main}.4.weight", what)[0]
    width = _shape(state_dict, "layer0.0.weight", what)[0]
    aux_name = "aux_cls1" if ddcat else "aux"
    aux = f"{aux_name}.0.weight" in state_dict
    if head == "psp":
        found = len({k.split(".")[2] for k in state_dict if k.startswith("ppm.features.")})
        if found != len(bins):
            raise PortError(f"{what}: the checkpoint has {found} PSP pyramid bins "
                            f"(ppm.features.*) but --bins gives {len(bins)}: {list(bins)}")
    fields = dict(head=head, num_classes=num_classes, blocks=_blocks(state_dict, what), width=width,
                  head_channels=_shape(state_dict, f"{main}.0.weight", what)[0],
                  aux_channels=_shape(state_dict, f"{aux_name}.0.weight", what)[0] if aux else 256,
                  bins=tuple(bins), atrous_rates=tuple(atrous_rates), aux=aux, ddcat=ddcat,
                  background_class=_resolve_background(background_class, num_classes, what))
    try:
        return SemsegConfig(**fields)
    except ValueError as err:
        raise PortError(f"{what}: {err}") from None


def prepare_state_dict(state_dict: Mapping[str, np.ndarray], *, what: str = "checkpoint") -> dict:
    """Strips the ``module.`` prefix and drops (validated) BatchNorm counters."""
    return drop_batchnorm_counters(strip_wrapper_prefix(state_dict, what=what), what=what)


def convert_semseg(state_dict: Mapping[str, np.ndarray], config=None, *,
                   what: str = "checkpoint") -> dict:
    """Strictly converts a semseg / DDC-AT state dict to ``{"params", "batch_stats"}``.

    Args:
      state_dict: torch key -> array (``module.`` prefix and counters allowed).
      config: the `SemsegConfig` to fill (default: `semseg_config_from_state_dict`).
      what: name for error messages.

    Raises:
      PortError: naming the offending key (unmapped, missing, duplicated, mis-shaped).
    """
    from jaxseg_robust.models.dense.semseg import SemsegDense  # noqa: PLC0415

    prepared = prepare_state_dict(state_dict, what=what)
    if config is None:
        config = semseg_config_from_state_dict(prepared, what=what)
    return convert(prepared, semseg_rules(), SemsegDense(config).variable_shapes(), what=what)


def port_semseg(checkpoint: str | os.PathLike, out_dir: str | os.PathLike, *,
                bins: tuple[int, ...] = (1, 2, 3, 6), atrous_rates: tuple[int, int, int] = (6, 12, 18),
                background_class="auto", overwrite: bool = False) -> str:
    """Reads a semseg / DDC-AT ``.pth`` (weights only), converts and saves it (family "semseg").

    Returns:
      The output directory.
    """
    from jaxseg_robust.models import store  # noqa: PLC0415
    from jaxseg_robust.models.dense.semseg import FAMILY, SemsegDense  # noqa: PLC0415

    checkpoint = os.fspath(checkpoint)
    prepared = prepare_state_dict(load_state_dict(checkpoint), what=checkpoint)
    config = semseg_config_from_state_dict(prepared, bins=bins, atrous_rates=atrous_rates,
                                           background_class=background_class, what=checkpoint)
    variables = convert(prepared, semseg_rules(), SemsegDense(config).variable_shapes(), what=checkpoint)
    return store.save(out_dir, variables, family=FAMILY, variant=config.variant,
                      config=config.to_dict(), source_path=checkpoint, overwrite=overwrite)


def parse_ints(text: str, *, name: str) -> tuple[int, ...]:
    """"1,2,3,6" -> (1, 2, 3, 6); ValueError naming the flag otherwise."""
    try:
        values = tuple(int(v) for v in str(text).split(",") if v.strip())
    except ValueError:
        raise ValueError(f"{name} must be comma-separated integers; got {text!r}") from None
    if not values or min(values) <= 0:
        raise ValueError(f"{name} must be positive integers; got {text!r}")
    return values


def parse_background(text: str):
    """"auto" | "none" | a class index."""
    text = str(text).strip().lower()
    if text in ("auto", "none"):
        return None if text == "none" else "auto"
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"--background-class must be auto, none or a class index; got {text!r}") from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``python -m ports semseg``."""
    add_checkpoint_arguments(parser, "semseg / DDC-AT training checkpoint (train_epoch_*.pth)")
    parser.add_argument("--bins", default="1,2,3,6", help="PSP pyramid pool sizes (default 1,2,3,6)")
    parser.add_argument("--atrous-rates", default="6,12,18",
                        help="DeepLabv3 ASPP dilations (default 6,12,18, the DDC-AT code's)")
    parser.add_argument("--background-class", default="auto",
                        help="background label: auto (0 for 21 classes, none for 19), none, or an index")


def run(args: argparse.Namespace) -> int:
    """Converts ``--checkpoint`` into ``--out``; returns 0."""
    rates = parse_ints(args.atrous_rates, name="--atrous-rates")
    if len(rates) != 3:
        raise ValueError(f"--atrous-rates needs 3 dilations; got {args.atrous_rates!r}")
    out = port_semseg(args.checkpoint, args.out, bins=parse_ints(args.bins, name="--bins"),
                      atrous_rates=rates, background_class=parse_background(args.background_class),
                      overwrite=args.overwrite)
    return report_converted(args.checkpoint, out)
