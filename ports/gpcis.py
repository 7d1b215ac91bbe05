"""Official GPCIS checkpoints (DeepLabV3+ ResNet-50 + Gaussian-process head, isegm format) -> jaxseg_robust models.

``python -m ports gpcis --checkpoint GPCIS_Resnet50.pth --out DIR``

The checkpoint (``{"state_dict", "config"}``, isegm ``save_checkpoint``) is read
without running pickled code (`ports.isegm_checkpoint`). Its config must be
class ``isegm.model.is_gp_resnet50.GpModel`` with an isegm backbone name
(``backbone``, "resnet50" in the release) and ``deeplab_ch``; the release's
previous-mask channel (``with_prev_mask`` True) and soft previous mask
(``binary_prev_mask`` False) must be set so, else the port refuses naming the
parameter (GPCIS's click disks are fixed in its code: radius 5, whatever
``use_disks`` says). The key table is strict:

* ``maps_transform.{0,2}.{weight,bias}``, ``maps_transform.3.scale`` and every
  ``model.*`` key (backbone, skip projection, ASPP, head; BatchNorm running
  statistics included, their ``num_batches_tracked`` counters dropped) map to
  the Flax path of the same name, convolution weights transposed to
  [kh, kw, in, out];
* the GP head: ``theta.{weight,bias}`` and ``u_mlp.{0,2}.{weight,bias}``
  (Linear weights transposed to [in, out]), ``omega`` f32[L, 1], ``logsigma2``
  f32[48] and ``weights`` f32[1] as they are;
* ``omega_var`` (the training-time spread of ``omega``'s sample; inference
  reads ``omega`` itself) is checked present as a scalar and dropped.

Missing, extra or mis-shaped keys are errors naming the key.
"""

from __future__ import annotations

import argparse
import os

from ports.isegm_checkpoint import (
    PathRule,
    drop_unused,
    load_isegm_checkpoint,
    require_model_class,
    require_values,
    torch_layout,
)
from ports.keytable import PortError, convert, identity, linear
from ports.port_cli import add_output_arguments, report_converted
from ports.torch_checkpoint import drop_batchnorm_counters

GPCIS_CLASS = "isegm.model.is_gp_resnet50.GpModel"
REQUIRED_VALUES = {"binary_prev_mask": False}
TRAINING_ONLY = {"omega_var": ()}


def gpcis_rules() -> list[PathRule]:
    """The key table (see the module docstring)."""
    leaf = r"\.(weight|bias|running_mean|running_var)"
    return [PathRule(r"maps_transform\.[02]\.(weight|bias)", "", torch_layout),
            PathRule(r"maps_transform\.3\.scale", "", torch_layout),
            PathRule(r"model\.[A-Za-z0-9_.]+" + leaf, "", torch_layout),
            PathRule(r"(theta|u_mlp\.[02])\.weight", "", linear),
            PathRule(r"(theta|u_mlp\.[02])\.bias", "", identity),
            PathRule(r"omega|logsigma2|weights", "", identity)]


def config_from_checkpoint(config: dict, *, what: str):
    """isegm ``GpModel`` config -> `GpcisConfig` (ResNet widths of the named backbone).

    Raises:
      PortError: another model class, an unknown backbone or an option the port does not support.
    """
    from jaxseg_robust.models.gpcis.config import GpcisConfig  # noqa: PLC0415

    require_model_class(config, GPCIS_CLASS, "GPCIS",
                        "RITM / SimpleClick checkpoints use `python -m ports ritm` / `simpleclick`", what=what)
    p = config["params"]
    require_values(config, REQUIRED_VALUES, what=what)
    if p.get("with_prev_mask") is not True:
        raise PortError(f"{what}: config parameter 'with_prev_mask' = {p.get('with_prev_mask')!r} is not "
                        f"supported (the port handles True, as in the released checkpoint)")
    backbone = str(p.get("backbone", "resnet50"))
    try:
        return GpcisConfig(backbone=backbone, deeplab_ch=int(p.get("deeplab_ch", 256)), variant=backbone)
    except ValueError as err:
        raise PortError(f"{what}: config 'backbone': {err}") from None


def convert_gpcis(state_dict, config, *, what: str = "checkpoint") -> dict:
    """Strictly converts a GPCIS state dict for ``config`` (a `GpcisConfig`)."""
    from jaxseg_robust.models.gpcis.segmenter import GpcisSegmenter  # noqa: PLC0415

    state_dict = drop_batchnorm_counters(state_dict, what=what)
    state_dict = drop_unused(state_dict, TRAINING_ONLY, what=what)
    expected = GpcisSegmenter(config).param_shapes()
    return convert(state_dict, gpcis_rules(), expected, what=what)


def port_checkpoint(checkpoint: str | os.PathLike, out_dir: str | os.PathLike, *,
                    overwrite: bool = False) -> str:
    """Reads, converts and saves an official GPCIS checkpoint; returns the output directory."""
    from jaxseg_robust.models import store  # noqa: PLC0415

    checkpoint = os.fspath(checkpoint)
    state_dict, raw_config = load_isegm_checkpoint(checkpoint)
    config = config_from_checkpoint(raw_config, what=checkpoint)
    params = convert_gpcis(state_dict, config, what=checkpoint)
    return store.save(out_dir, params, family=config.family, variant=config.variant,
                      config=config.to_dict(), source_path=checkpoint, overwrite=overwrite)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``python -m ports gpcis``."""
    parser.add_argument("--checkpoint", required=True,
                        help="official GPCIS .pth checkpoint (isegm format with its config)")
    add_output_arguments(parser)


def run(args: argparse.Namespace) -> int:
    """Runs the port; prints where the model went. Returns an exit code."""
    out = port_checkpoint(args.checkpoint, args.out, overwrite=args.overwrite)
    return report_converted(args.checkpoint, out)
