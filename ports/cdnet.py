"""Official CDNet checkpoints (ClickSEG ``DeeplabModel``, isegm format) -> jaxseg_robust models.

``python -m ports cdnet --checkpoint cdnet_res34_cclvs.pth --out DIR``

The checkpoint (``{"state_dict", "config"}``, isegm ``save_checkpoint``) is
read without running pickled code (`ports.isegm_checkpoint`). Its config
must be class ``isegm.model.is_deeplab_model.DeeplabModel``; ``backbone`` and
``deeplab_ch`` give the architecture, ``use_leaky_relu`` the maps transform;
the options the released models leave at isegm's defaults or set as every
release does (no RGB conv, no previous mask, no click groups) must keep
those values (`SUPPORTED_VALUES`), else the port refuses naming the
parameter. The key table is strict: every key other than the BatchNorm
counters maps to the Flax path of the same name (dots -> "/"), conv weights
transposed to [kh, kw, in, out]; the training-only ``latent_head`` and the
PDM's constant shift kernels are checked (shape; the kernels' values) and
dropped; missing, extra or mis-shaped keys are errors naming the key.
"""

from __future__ import annotations

import argparse
import os

import numpy as np

from ports.isegm_checkpoint import (
    PathRule,
    drop_unused,
    load_isegm_checkpoint,
    require_model_class,
    require_values,
    torch_layout,
)
from ports.keytable import PortError, convert
from ports.port_cli import add_output_arguments, report_converted
from ports.torch_checkpoint import drop_batchnorm_counters

CDNET_CLASS = "isegm.model.is_deeplab_model.DeeplabModel"
SUPPORTED_VALUES = {
    "use_rgb_conv": False, "with_prev_mask": False, "clicks_groups": None,
    "binary_prev_mask": False, "conv_extend": False,
    "norm_layer": "torch.nn.modules.batchnorm.BatchNorm2d", "backbone_norm_layer": None,
    "norm_mean_std": ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
}
LEAF = r"\.(weight|bias|running_mean|running_var)"
PDM_KERNELS = {"PDM.aff_x.kernel": 8, "PDM.aff_m.kernel": 8, "PDM.aff_std.kernel": 9}


def cdnet_rules() -> list[PathRule]:
    """The key table: maps transform, feature extractor (backbone, ASPP, FDM, decoder) and head."""
    return [PathRule(r"maps_transform\.[02]\.(weight|bias)", "", torch_layout),
            PathRule(r"maps_transform\.3\.scale", "", torch_layout),
            PathRule(r"(feature_extractor|head)\.[A-Za-z0-9_.]+" + LEAF, "", torch_layout)]


def config_from_checkpoint(config: dict, *, what: str):
    """isegm ``DeeplabModel`` config -> `CdnetConfig`.

    Raises:
      PortError: another model class, or an option the port does not support.
    """
    from jaxseg_robust.models.cdnet.config import CdnetConfig  # noqa: PLC0415

    require_model_class(config, CDNET_CLASS, "CDNet",
                        "RITM checkpoints use `python -m ports ritm`, SimpleClick's `python -m ports simpleclick`",
                        what=what)
    require_values(config, SUPPORTED_VALUES, what=what)
    p = config["params"]
    backbone = str(p.get("backbone", "resnet50"))
    try:
        return CdnetConfig(backbone=backbone, deeplab_ch=int(p.get("deeplab_ch", 256)),
                           use_leaky_relu=bool(p.get("use_leaky_relu", False)), variant=backbone)
    except ValueError as err:
        raise PortError(f"{what}: config: {err}") from None


def latent_head_shapes(channels: int) -> dict[str, tuple[int, ...]]:
    """Torch shapes of ``latent_head`` (``SepConvHead(4, ch, ch // 2, num_layers=2)``, training only)."""
    mid = channels // 2
    out = {}
    for i, cin in enumerate((channels, mid)):
        out[f"latent_head.layers.{i}.body.0.weight"] = (cin, 1, 3, 3)
        out[f"latent_head.layers.{i}.body.1.weight"] = (mid, cin, 1, 1)
        for leaf in ("weight", "bias", "running_mean", "running_var"):
            out[f"latent_head.layers.{i}.body.2.{leaf}"] = (mid,)
    out["latent_head.layers.2.weight"] = (4, mid, 1, 1)
    out["latent_head.layers.2.bias"] = (4,)
    return out


def check_pdm_kernels(state_dict, *, what: str) -> None:
    """The PDM's registered shift kernels must be the constants its code builds (they are not ported)."""
    for key, count in PDM_KERNELS.items():
        if key not in state_dict:
            raise PortError(f"{what}: key '{key}' is missing (truncated checkpoint or wrong family?)")
        kernel = np.asarray(state_dict[key])
        if kernel.shape != (count, 1, 3, 3) or not np.all(np.isin(kernel, (-1.0, 0.0, 1.0))):
            raise PortError(f"{what}: key '{key}' is not the PDM's constant shift kernel "
                            f"(shape {kernel.shape})")


def convert_cdnet(state_dict, config, *, what: str = "checkpoint") -> dict:
    """Strictly converts a CDNet state dict for ``config`` (a `CdnetConfig`)."""
    from jaxseg_robust.models.cdnet.segmenter import CdnetSegmenter  # noqa: PLC0415

    state_dict = drop_batchnorm_counters(state_dict, what=what)
    check_pdm_kernels(state_dict, what=what)
    unused = dict(latent_head_shapes(config.deeplab_ch))
    unused.update({key: (count, 1, 3, 3) for key, count in PDM_KERNELS.items()})
    state_dict = drop_unused(state_dict, unused, what=what)
    return convert(state_dict, cdnet_rules(), CdnetSegmenter(config).param_shapes(), what=what)


def port_checkpoint(checkpoint: str | os.PathLike, out_dir: str | os.PathLike, *,
                    overwrite: bool = False) -> str:
    """Reads, converts and saves an official CDNet checkpoint; returns the output directory."""
    from jaxseg_robust.models import store  # noqa: PLC0415

    checkpoint = os.fspath(checkpoint)
    state_dict, raw_config = load_isegm_checkpoint(checkpoint)
    config = config_from_checkpoint(raw_config, what=checkpoint)
    params = convert_cdnet(state_dict, config, what=checkpoint)
    return store.save(out_dir, params, family=config.family, variant=config.variant,
                      config=config.to_dict(), source_path=checkpoint, overwrite=overwrite)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``python -m ports cdnet``."""
    parser.add_argument("--checkpoint", required=True,
                        help="official CDNet .pth checkpoint (ClickSEG isegm format with its config)")
    add_output_arguments(parser)


def run(args: argparse.Namespace) -> int:
    """Runs the port; prints where the model went. Returns an exit code."""
    out = port_checkpoint(args.checkpoint, args.out, overwrite=args.overwrite)
    return report_converted(args.checkpoint, out)
