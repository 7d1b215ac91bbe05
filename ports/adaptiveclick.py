"""Official AdaptiveClick checkpoints (isegm format) -> jaxseg_robust models.

``python -m ports adaptiveclick --checkpoint adaptiveclick_base448_cocolvis.pth --out DIR``
(the SBD ViT-B checkpoint is the same format and network).

The checkpoint (``{"state_dict", "config"}``) is read without running pickled
code (`ports.isegm_checkpoint`): its one ``cfg`` parameter is an
``easydict.EasyDict`` (the authors' yaml merged with the training script's
arguments) holding ``pathlib`` paths and a ``torch.device``; the paths become
inert stand-ins, the device is torch's own allow-listed object, and the
EasyDicts are read back as plain dicts (`opaque_mapping`). The config gives the
architecture (class ``isegm.model.is_adaptiveclick_model.AdaptiveClickModel``):
``MODEL.BACKBONE``, ``MODEL.SIMPLE_FEATURE_PYRAMID``, ``MODEL.SEM_SEG_HEAD``,
``MODEL.MASK_FORMER``, ``crop_size``; and ``norm_radius``, ``use_disks``,
``with_prev_mask`` beside it. Settings the network does not implement
(``random_split``, pre-norm, other feature lists, ...) are refused naming the key.

The key table is strict: every key maps to the Flax path of the same name
(dots -> "/"; conv weights to [kh, kw, in, out], Linear weights and
``in_proj_weight`` transposed, the neck's transposed-conv weights kept as
[in, out, k, k]), except the keys the interactive model never reads, which are
checked present and shaped and then dropped (`unused_keys`: the ViT's class
token, final norm and ImageNet classifier, the loss's ``criterion.empty_weight``)
and the pixel decoder's second names of its FPN level (``lateral_convs.0`` and
``output_convs.0`` are ``adapter_1`` and ``layer_1`` registered twice), checked
equal to the first and dropped (`drop_aliases`).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from ports.isegm_checkpoint import (
    PathRule,
    drop_unused,
    load_isegm_checkpoint,
    opaque_mapping,
    require_model_class,
    require_values,
    torch_layout,
)
from ports.keytable import PortError, convert, identity
from ports.port_cli import add_output_arguments, report_converted

ADAPTIVECLICK_CLASS = "isegm.model.is_adaptiveclick_model.AdaptiveClickModel"
TRANSPOSED = r"pixel_decoder\.neck\.down_4\.[03]|pixel_decoder\.neck\.down_8\.0"
ALIASES = {"pixel_decoder.lateral_convs.0": "pixel_decoder.adapter_1",
           "pixel_decoder.output_convs.0": "pixel_decoder.layer_1"}
# cfg values the network implements as the released configuration sets them.
SUPPORTED_CFG = {
    "random_split": False,
    "MODEL.BACKBONE.IN_CHANS": 3,
    "MODEL.BACKBONE.QKV_BIAS": True,
    "MODEL.SEM_SEG_HEAD.IN_FEATURES": ("res2", "res3", "res4", "res5"),
    "MODEL.SEM_SEG_HEAD.DEFORMABLE_TRANSFORMER_ENCODER_IN_FEATURES": ("res3", "res4", "res5"),
    "MODEL.SEM_SEG_HEAD.COMMON_STRIDE": 4,
    "MODEL.SEM_SEG_HEAD.NUM_CLASSES": 1,
    "MODEL.MASK_FORMER.PRE_NORM": False,
}


def adaptiveclick_rules() -> list[PathRule]:
    """The key table (patch embeddings, ViT blocks, neck, pixel decoder, click-aware decoder)."""
    leaf = r"\.(weight|bias)"
    layer = r"pixel_decoder\.transformer\.encoder\.layers\.\d+\."
    dec = r"click_aware_decoder\."
    return [
        PathRule(r"patch_embed_coords\.proj" + leaf, "", torch_layout),
        PathRule(r"backbone\.patch_embed\.proj" + leaf, "", torch_layout),
        PathRule(r"backbone\.pos_embed", "", identity),
        PathRule(r"backbone\.blocks\.\d+\.(norm[12]|attn\.qkv|attn\.proj|mlp\.fc[12])" + leaf, "", torch_layout),
        PathRule(r"(" + TRANSPOSED + r")" + leaf, "", identity),
        PathRule(r"(?!" + TRANSPOSED + r"\.)pixel_decoder\.neck\.down_(4|8|16|32)\.\d+" + leaf, "", torch_layout),
        PathRule(r"pixel_decoder\.(input_proj\.\d+|adapter_1|layer_1)\.[01]" + leaf, "", torch_layout),
        PathRule(r"pixel_decoder\.mask_features" + leaf, "", torch_layout),
        PathRule(r"pixel_decoder\.transformer\.level_embed", "", identity),
        PathRule(layer + r"(self_attn\.(sampling_offsets|attention_weights|value_proj|output_proj)"
                 r"|norm[12]|linear[12])" + leaf, "", torch_layout),
        PathRule(dec + r"transformer_(self|cross)_attention_layers\.\d+\.(self_attn|multihead_attn)\.in_proj_"
                 r"(weight|bias)", "", torch_layout),
        PathRule(dec + r"transformer_(self|cross)_attention_layers\.\d+\.((self_attn|multihead_attn)\.out_proj|norm)"
                 + leaf, "", torch_layout),
        PathRule(dec + r"transformer_ffn_layers\.\d+\.(linear[12]|norm)" + leaf, "", torch_layout),
        PathRule(dec + r"(decoder_norm|class_embed|mask_embed\.layers\.\d+)" + leaf, "", torch_layout),
        PathRule(dec + r"(query_feat|query_embed|level_embed)\.weight", "", identity),
    ]


def unused_keys(config) -> dict[str, tuple[int, ...]]:
    """Keys of the official state dict that the interactive model does not read, with shapes."""
    d = config.embed_dim
    return {"backbone.cls_token": (1, 1, d), "backbone.fc_norm.weight": (d,), "backbone.fc_norm.bias": (d,),
            "backbone.head.weight": (1000, d), "backbone.head.bias": (1000,),
            "criterion.empty_weight": (config.num_classes + 1,)}


def drop_aliases(state_dict: Mapping[str, np.ndarray], *, what: str) -> dict[str, np.ndarray]:
    """Removes the second names of modules registered twice (`ALIASES`), each checked equal to the first.

    Raises:
      PortError: an alias key without its first name, or with other values.
    """
    out = dict(state_dict)
    for key in [k for k in out if k.startswith(tuple(a + "." for a in ALIASES))]:
        alias = next(a for a in ALIASES if key.startswith(a + "."))
        first = ALIASES[alias] + key[len(alias):]
        if first not in out:
            raise PortError(f"{what}: key '{key}' has no '{first}' (the same module's first name)")
        if np.shape(out[first]) != np.shape(out[key]) or not np.array_equal(out[first], out[key]):
            raise PortError(f"{what}: key '{key}' differs from '{first}' (the same module registered twice)")
        del out[key]
    return out


def _cfg_value(cfg: Mapping, dotted: str, *, what: str) -> Any:
    node: Any = cfg
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            raise PortError(f"{what}: config cfg.{dotted} is missing (not an AdaptiveClick config?)")
        node = node[part]
    return node


def _plain(value: Any) -> Any:
    return tuple(_plain(v) for v in value) if isinstance(value, (list, tuple)) else value


def _check_cfg(cfg: Mapping, *, what: str) -> None:
    for dotted, want in SUPPORTED_CFG.items():
        got = _plain(_cfg_value(cfg, dotted, what=what))
        if got != want:
            raise PortError(f"{what}: config cfg.{dotted} = {got!r} is not supported (the port handles "
                            f"{want!r}, as in the released checkpoints)")


def config_from_checkpoint(config: dict, *, what: str):
    """isegm ``AdaptiveClickModel`` config -> `AdaptiveClickConfig`.

    Raises:
      PortError: another model class, a missing cfg key, or a setting the port does not support.
    """
    from jaxseg_robust.models.adaptiveclick.config import AdaptiveClickConfig  # noqa: PLC0415

    require_model_class(config, ADAPTIVECLICK_CLASS, "AdaptiveClick",
                        "RITM / SimpleClick checkpoints use `python -m ports ritm` / `simpleclick`", what=what)
    require_values(config, {"use_disks": True}, what=what)
    cfg = opaque_mapping(config["params"].get("cfg"))
    if not isinstance(cfg, Mapping) or not cfg:
        raise PortError(f"{what}: config parameter 'cfg' is missing or not a mapping")
    _check_cfg(cfg, what=what)

    def get(dotted):
        return _plain(_cfg_value(cfg, dotted, what=what))

    patch = get("MODEL.BACKBONE.PATCH_SIZE")
    patch = (patch, patch) if isinstance(patch, int) else patch
    if patch[0] != patch[1]:
        raise PortError(f"{what}: config cfg.MODEL.BACKBONE.PATCH_SIZE = {patch} is not square")
    if get("MODEL.SIMPLE_FEATURE_PYRAMID.IN_DIM") != get("MODEL.BACKBONE.EMBED_DIM"):
        raise PortError(f"{what}: config cfg.MODEL.SIMPLE_FEATURE_PYRAMID.IN_DIM differs from the ViT's EMBED_DIM")
    crop = get("crop_size")
    crop = (crop, crop) if isinstance(crop, int) else crop
    embed_dim = int(get("MODEL.BACKBONE.EMBED_DIM"))
    try:
        return AdaptiveClickConfig(
            patch_size=int(patch[0]), embed_dim=embed_dim, depth=int(get("MODEL.BACKBONE.DEPTH")),
            num_heads=int(get("MODEL.BACKBONE.NUM_HEADS")), mlp_ratio=float(get("MODEL.BACKBONE.MLP_RATIO")),
            train_size=tuple(int(v) for v in crop),
            neck_out_dims=tuple(int(v) for v in get("MODEL.SIMPLE_FEATURE_PYRAMID.OUT_DIMS")),
            conv_dim=int(get("MODEL.SEM_SEG_HEAD.CONVS_DIM")), mask_dim=int(get("MODEL.SEM_SEG_HEAD.MASK_DIM")),
            encoder_layers=int(get("MODEL.SEM_SEG_HEAD.TRANSFORMER_ENC_LAYERS")),
            encoder_ffn_dim=int(get("MODEL.MASK_FORMER.DIM_FEEDFORWARD")) // 2,
            hidden_dim=int(get("MODEL.MASK_FORMER.HIDDEN_DIM")),
            num_queries=int(get("MODEL.MASK_FORMER.NUM_OBJECT_QUERIES")),
            num_heads_decoder=int(get("MODEL.MASK_FORMER.NHEADS")),
            decoder_ffn_dim=int(get("MODEL.MASK_FORMER.DIM_FEEDFORWARD")),
            decoder_layers=int(get("MODEL.MASK_FORMER.DEC_LAYERS")) - 1,
            num_classes=int(get("MODEL.SEM_SEG_HEAD.NUM_CLASSES")),
            norm_radius=float(config["params"].get("norm_radius", 5)),
            with_prev_mask=bool(config["params"].get("with_prev_mask", True)),
            variant={768: "vit_b", 1024: "vit_l", 1280: "vit_h"}.get(embed_dim, f"vit_{embed_dim}"))
    except ValueError as err:
        raise PortError(f"{what}: {err}") from None


def convert_adaptiveclick(state_dict, config, *, what: str = "checkpoint") -> dict:
    """Strictly converts an AdaptiveClick state dict for ``config``."""
    from jaxseg_robust.models.clickmap.segmenter import ClickMapSegmenter  # noqa: PLC0415

    state_dict = drop_aliases(drop_unused(state_dict, unused_keys(config), what=what), what=what)
    expected = ClickMapSegmenter(config).param_shapes()
    return convert(state_dict, adaptiveclick_rules(), expected, what=what)


def port_checkpoint(checkpoint: str | os.PathLike, out_dir: str | os.PathLike, *, overwrite: bool = False) -> str:
    """Reads, converts and saves an official AdaptiveClick checkpoint; returns the directory."""
    from jaxseg_robust.models import store  # noqa: PLC0415

    checkpoint = os.fspath(checkpoint)
    state_dict, raw_config = load_isegm_checkpoint(checkpoint)
    config = config_from_checkpoint(raw_config, what=checkpoint)
    params = convert_adaptiveclick(state_dict, config, what=checkpoint)
    return store.save(out_dir, params, family=config.family, variant=config.variant,
                      config=config.to_dict(), source_path=checkpoint, overwrite=overwrite)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``python -m ports adaptiveclick``."""
    parser.add_argument("--checkpoint", required=True, help="official AdaptiveClick .pth checkpoint (isegm format)")
    add_output_arguments(parser)


def run(args: argparse.Namespace) -> int:
    """Runs the port; prints where the model went. Returns an exit code."""
    out = port_checkpoint(args.checkpoint, args.out, overwrite=args.overwrite)
    return report_converted(args.checkpoint, out)
