"""Official SimpleClick / CFR-ICL checkpoints (plain ViT, isegm format) -> jaxseg_robust models.

``python -m ports simpleclick --checkpoint cocolvis_vit_base.pth --out DIR``
(CFR-ICL's ``cocolvis_icl_vit_huge.pth`` is the same format and network).

The checkpoint (``{"state_dict", "config"}``) is read without running pickled
code (`ports.isegm_checkpoint`; its ``head_params.loss_decode`` is a pickled
library object and becomes an inert stand-in). The config gives the
architecture: class ``isegm.model.is_plainvit_model.PlainVitModel`` with
``backbone_params`` (patch size, width, depth, heads, MLP ratio, training
size), ``neck_params``, ``head_params`` (channels, ``upsample='x1'``),
``norm_radius``, ``use_disks``, ``with_prev_mask``.

The key table is strict: every key maps to the Flax path of the same name
(dots -> "/"; conv weights to [kh, kw, in, out], Linear weights transposed,
the neck's transposed-conv weights kept as [in, out, k, k]), except the keys
the interactive model never reads, which are checked present and shaped and
then dropped (`unused_keys`: the ViT's class token, final norm and ImageNet
classifier, and the head's ``up_conv1``/``up_conv2``, built but unused with
``upsample='x1'``).
"""

from __future__ import annotations

import argparse
import dataclasses
import os

from ports.isegm_checkpoint import (
    PathRule,
    drop_unused,
    load_isegm_checkpoint,
    require_model_class,
    require_values,
    torch_layout,
)
from ports.keytable import PortError, convert, identity
from ports.port_cli import add_output_arguments, report_converted

SIMPLECLICK_CLASS = "isegm.model.is_plainvit_model.PlainVitModel"
TRANSPOSED = r"neck\.down_4\.[03]|neck\.down_8\.0"
SUPPORTED_DEFAULTS = {"random_split": False,
                      "norm_mean_std": ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))}


def simpleclick_rules() -> list[PathRule]:
    """The key table (patch embeddings, ViT blocks, neck, head)."""
    leaf = r"\.(weight|bias)"
    return [
        PathRule(r"patch_embed_coords\.proj" + leaf, "", torch_layout),
        PathRule(r"backbone\.patch_embed\.proj" + leaf, "", torch_layout),
        PathRule(r"backbone\.pos_embed", "", identity),
        PathRule(r"backbone\.blocks\.\d+\.(norm[12]|attn\.qkv|attn\.proj|mlp\.fc[12])" + leaf,
                 "", torch_layout),
        PathRule(r"(" + TRANSPOSED + r")" + leaf, "", identity),
        PathRule(r"(?!" + TRANSPOSED + r"\.)neck\.down_(4|8|16|32)\.\d+" + leaf, "",
                 torch_layout),
        PathRule(r"head\.(convs\.\d+\.conv|fusion_conv\.conv|conv_seg)" + leaf, "",
                 torch_layout),
    ]


def unused_keys(config) -> dict[str, tuple[int, ...]]:
    """Keys of the official state dict that the interactive model does not read, with shapes."""
    d, c = config.embed_dim, config.head_channels
    out = {"backbone.cls_token": (1, 1, d), "backbone.fc_norm.weight": (d,),
           "backbone.fc_norm.bias": (d,), "backbone.head.weight": (1000, d),
           "backbone.head.bias": (1000,)}
    for name, cin, cout in (("up_conv1", c, c // 2), ("up_conv2", c // 2, c // 4)):
        out.update({f"head.{name}.0.weight": (cin, cout, 2, 2), f"head.{name}.0.bias": (cout,),
                    f"head.{name}.1.weight": (cout,), f"head.{name}.1.bias": (cout,),
                    f"head.{name}.2.weight": (cout, cout, 1, 1), f"head.{name}.2.bias": (cout,),
                    f"head.{name}.3.weight": (cout,), f"head.{name}.3.bias": (cout,)})
    return out


def _pair(value, name: str, what: str) -> tuple[int, int]:
    if isinstance(value, int):
        return (value, value)
    try:
        a, b = value
        return (int(a), int(b))
    except (TypeError, ValueError):
        raise PortError(f"{what}: config '{name}' = {value!r} is not a size pair") from None


def config_from_checkpoint(config: dict, *, what: str):
    """isegm ``PlainVitModel`` config -> `SimpleClickConfig`.

    Raises:
      PortError: another model class, or a setting the port does not support.
    """
    from jaxseg_robust.models.simpleclick.config import SimpleClickConfig  # noqa: PLC0415

    require_model_class(config, SIMPLECLICK_CLASS, "SimpleClick", "RITM checkpoints use `python -m ports ritm`",
                        what=what)
    require_values(config, SUPPORTED_DEFAULTS, what=what)
    p = config["params"]
    backbone, neck, head = (dict(p.get(k) or {}) for k in
                            ("backbone_params", "neck_params", "head_params"))
    for name, section in (("backbone_params", backbone), ("neck_params", neck),
                          ("head_params", head)):
        if not section:
            raise PortError(f"{what}: config '{name}' is missing or empty")
    upsample = head.get("upsample", "x1")
    if upsample != "x1":
        raise PortError(f"{what}: config head_params.upsample = {upsample!r} is not supported "
                        f"(the released checkpoints use 'x1')")
    if int(head.get("num_classes", 1)) != 1:
        raise PortError(f"{what}: config head_params.num_classes = {head['num_classes']!r}; "
                        f"an interactive model has 1")
    if not bool(p.get("use_disks", False)):
        raise PortError(f"{what}: config 'use_disks' is False (tanh distance maps); only disk "
                        f"click maps are supported, as in every released checkpoint")
    patch = _pair(backbone.get("patch_size", 16), "backbone_params.patch_size", what)
    if patch[0] != patch[1]:
        raise PortError(f"{what}: non-square patches {patch} are not supported")
    out_dims = tuple(int(v) for v in neck.get("out_dims", (128, 256, 512, 1024)))
    if tuple(int(v) for v in head.get("in_channels", out_dims)) != out_dims:
        raise PortError(f"{what}: head_params.in_channels {head.get('in_channels')} differ "
                        f"from neck_params.out_dims {out_dims}")
    embed_dim = int(backbone.get("embed_dim", 768))
    variant = {160: "vit_xt", 768: "vit_b", 1024: "vit_l", 1280: "vit_h"}.get(
        embed_dim, f"vit_{embed_dim}")
    return SimpleClickConfig(
        patch_size=patch[0], embed_dim=embed_dim, depth=int(backbone.get("depth", 12)),
        num_heads=int(backbone.get("num_heads", 12)),
        mlp_ratio=float(backbone.get("mlp_ratio", 4.0)),
        train_size=_pair(backbone.get("img_size", (224, 224)), "backbone_params.img_size", what),
        neck_out_dims=out_dims, head_channels=int(head["channels"]),
        norm_radius=float(p.get("norm_radius", 5)),
        with_prev_mask=bool(p.get("with_prev_mask", False)), variant=variant)


def convert_simpleclick(state_dict, config, *, what: str = "checkpoint") -> dict:
    """Strictly converts a SimpleClick / CFR-ICL state dict for ``config``."""
    from jaxseg_robust.models.clickmap.segmenter import ClickMapSegmenter  # noqa: PLC0415

    state_dict = drop_unused(state_dict, unused_keys(config), what=what)
    expected = ClickMapSegmenter(config).param_shapes()
    return convert(state_dict, simpleclick_rules(), expected, what=what)


def port_checkpoint(checkpoint: str | os.PathLike, out_dir: str | os.PathLike, *,
                    cfr_icl: bool = False, overwrite: bool = False) -> str:
    """Reads, converts and saves an official SimpleClick / CFR-ICL checkpoint; returns the directory.

    ``cfr_icl``: the weights are CFR-ICL's (its checkpoint holds the same ``PlainVitModel`` as
    SimpleClick's); recorded as ``cfr_icl`` in the converted config.json, whatever the file names,
    so the authors' predictor runs them with CFR-ICL's cascade (docs/models/click_models.md).
    """
    from jaxseg_robust.models import store  # noqa: PLC0415

    checkpoint = os.fspath(checkpoint)
    state_dict, raw_config = load_isegm_checkpoint(checkpoint)
    config = dataclasses.replace(config_from_checkpoint(raw_config, what=checkpoint), cfr_icl=bool(cfr_icl))
    params = convert_simpleclick(state_dict, config, what=checkpoint)
    return store.save(out_dir, params, family=config.family, variant=config.variant,
                      config=config.to_dict(), source_path=checkpoint, overwrite=overwrite)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``python -m ports simpleclick``."""
    parser.add_argument("--checkpoint", required=True,
                        help="official SimpleClick or CFR-ICL .pth checkpoint (isegm format)")
    parser.add_argument("--cfr-icl", action="store_true",
                        help="the checkpoint holds CFR-ICL weights (e.g. cocolvis_icl_vit_huge.pth): recorded in "
                             "the converted config, the authors' predictor then adds CFR-ICL's cascade")
    add_output_arguments(parser)


def run(args: argparse.Namespace) -> int:
    """Runs the port; prints where the model went. Returns an exit code."""
    out = port_checkpoint(args.checkpoint, args.out, cfr_icl=args.cfr_icl, overwrite=args.overwrite)
    return report_converted(args.checkpoint, out)
