"""Official RITM checkpoints (HRNet + OCR, isegm format) -> jaxseg_robust models.

``python -m ports ritm --checkpoint coco_lvis_h18_itermask.pth --out DIR``

The checkpoint (``{"state_dict", "config"}``, isegm ``save_checkpoint``) is read
without running pickled code (`ports.isegm_checkpoint`). Its config gives the
architecture: class ``isegm.model.is_hrnet_model.HRNetModel`` with ``width``,
``ocr_width``, ``small``, ``norm_radius``, ``use_disks``, ``with_prev_mask``,
``use_leaky_relu``; the options the released models leave at isegm's defaults
(RGB conv, conv_extend, click groups, binary previous mask, normalisation)
must keep those values (`SUPPORTED_DEFAULTS`), else the port refuses naming
the parameter. The key table is strict: every key other than the BatchNorm
counters maps to the Flax path of the same name (dots -> "/"), conv weights
transposed to [kh, kw, in, out]; missing, extra or mis-shaped keys are errors
naming the key.
"""

from __future__ import annotations

import argparse
import os

from ports.isegm_checkpoint import (
    PathRule,
    load_isegm_checkpoint,
    require_model_class,
    require_values,
    torch_layout,
)
from ports.keytable import PortError, convert
from ports.port_cli import add_output_arguments, report_converted
from ports.torch_checkpoint import drop_batchnorm_counters

RITM_CLASS = "isegm.model.is_hrnet_model.HRNetModel"
SUPPORTED_DEFAULTS = {
    "use_rgb_conv": False, "conv_extend": False, "clicks_groups": None,
    "binary_prev_mask": False, "norm_layer": "torch.nn.modules.batchnorm.BatchNorm2d",
    "norm_mean_std": ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
}


def ritm_rules() -> list[PathRule]:
    """The key table: the click-maps transform and the feature extractor (HRNet + OCR)."""
    leaf = r"\.(weight|bias|running_mean|running_var)"
    return [PathRule(r"maps_transform\.[02]\.(weight|bias)", "", torch_layout),
            PathRule(r"maps_transform\.3\.scale", "", torch_layout),
            PathRule(r"feature_extractor\.[A-Za-z0-9_.]+" + leaf, "", torch_layout)]


def config_from_checkpoint(config: dict, *, what: str):
    """isegm ``HRNetModel`` config -> `RitmConfig`.

    Raises:
      PortError: another model class, or an option the port does not support.
    """
    from jaxseg_robust.models.ritm.config import RitmConfig  # noqa: PLC0415

    require_model_class(config, RITM_CLASS, "RITM",
                        "SimpleClick/CFR-ICL checkpoints use `python -m ports simpleclick`", what=what)
    require_values(config, SUPPORTED_DEFAULTS, what=what)
    p = config["params"]
    width, ocr_width, small = int(p.get("width", 48)), int(p.get("ocr_width", 256)), \
        bool(p.get("small", False))
    variant = f"hrnet{width}{'s' if small else ''}"
    return RitmConfig(width=width, ocr_width=ocr_width, small=small,
                      norm_radius=float(p.get("norm_radius", 260)),
                      use_disks=bool(p.get("use_disks", False)),
                      with_prev_mask=bool(p.get("with_prev_mask", False)),
                      use_leaky_relu=bool(p.get("use_leaky_relu", False)), variant=variant)


def convert_ritm(state_dict, config, *, what: str = "checkpoint") -> dict:
    """Strictly converts a RITM state dict for ``config`` (a `RitmConfig`)."""
    from jaxseg_robust.models.clickmap.segmenter import ClickMapSegmenter  # noqa: PLC0415

    if not config.use_disks:
        raise PortError(f"{what}: config 'use_disks' is False (tanh distance maps); only disk "
                        f"click maps are supported, as in every released checkpoint")
    state_dict = drop_batchnorm_counters(state_dict, what=what)
    expected = ClickMapSegmenter(config).param_shapes()
    return convert(state_dict, ritm_rules(), expected, what=what)


def port_checkpoint(checkpoint: str | os.PathLike, out_dir: str | os.PathLike, *,
                    overwrite: bool = False) -> str:
    """Reads, converts and saves an official RITM checkpoint; returns the output directory."""
    from jaxseg_robust.models import store  # noqa: PLC0415

    checkpoint = os.fspath(checkpoint)
    state_dict, raw_config = load_isegm_checkpoint(checkpoint)
    config = config_from_checkpoint(raw_config, what=checkpoint)
    params = convert_ritm(state_dict, config, what=checkpoint)
    return store.save(out_dir, params, family=config.family, variant=config.variant,
                      config=config.to_dict(), source_path=checkpoint, overwrite=overwrite)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``python -m ports ritm``."""
    parser.add_argument("--checkpoint", required=True,
                        help="official RITM .pth checkpoint (isegm format with its config)")
    add_output_arguments(parser)


def run(args: argparse.Namespace) -> int:
    """Runs the port; prints where the model went. Returns an exit code."""
    out = port_checkpoint(args.checkpoint, args.out, overwrite=args.overwrite)
    return report_converted(args.checkpoint, out)
