"""Official SAM 3 checkpoints -> the interactive (SAM-1 task) image model, strictly.

``python -m ports sam3 --checkpoint sam3.pt --out DIR``

``sam3.pt`` (``{"model": state_dict}`` or the bare state dict) holds the whole
video model: ``detector.*`` (ViT backbone, both necks, text encoder, DETR-style
transformer and heads) and ``tracker.*`` (SAM 2 heads and the video memory).
``build_sam3_image_model(enable_inst_interactivity=True)`` reads the detector
keys and the tracker's under ``inst_interactive_predictor.model.``; the SAM-1
task path (``Sam3Image.predict_inst``, docs/models/sam3.md) uses:

* ``detector.backbone.vision_backbone.trunk.*``: the ViT (`vit_rules`);
  its ``blocks.N.attn.freqs_cis`` are RoPE tables, not parameters: each is
  checked against the angles `Sam3Vit` computes (`check_rope_tables`) and dropped;
* ``detector.backbone.vision_backbone.sam2_convs.{0,1,2}.*``: the SAM 2 neck;
* ``tracker.sam_prompt_encoder.*``, ``tracker.sam_mask_decoder.*`` and
  ``tracker.no_mem_embed``: SAM 2's heads (ports/sam2.py's rules).

Every other key is recognised by name (`UNUSED_PARTS`: the neck's 0.5 level,
which ``scalp = 1`` drops, the detector's own neck and heads, the text
encoder, the tracker's memory) and skipped; `port_checkpoint` lists them in
``DIR/skipped_video_keys.txt``. A key that is neither is an error naming it,
and so is a parameter left unfilled or of the wrong shape (ports/keytable.py).
"""

from __future__ import annotations

import argparse
import os
import re
from typing import Mapping

import numpy as np

from ports.keytable import PortError, Rule, conv, convert, identity, linear
from ports.port_cli import add_checkpoint_arguments, report_converted
from ports.sam import patch_conv_transpose, prefixed_rules, prompt_encoder_rules
from ports.sam2 import flat_vector, sam2_decoder_rules, write_skipped

BACKBONE = "detector.backbone.vision_backbone."
TRACKER = "tracker."
ROPE_KEY = re.compile(re.escape(BACKBONE) + r"trunk\.blocks\.(\d+)\.attn\.freqs_cis")
ROPE_ATOL = 1e-4  # the tables are cos / sin of float32 angles; a config mismatch differs by O(1)
# What the interactive path does not use: (regex on the key, what it is).
UNUSED_PARTS = (
    (re.escape(BACKBONE) + r"sam2_convs\.3\..+", "SAM 2 neck level 0.5 (dropped: scalp = 1)"),
    (re.escape(BACKBONE) + r"convs\..+", "detector neck"),
    (r"detector\.(?!backbone\.vision_backbone\.(trunk|sam2_convs)\.).+",
     "detector (text encoder, transformer, heads)"),
    (r"tracker\.(maskmem_backbone|transformer|obj_ptr_proj|obj_ptr_tpos_proj|mask_downsample)\..+",
     "tracker video memory"),
    (r"tracker\.(maskmem_tpos_enc|no_mem_pos_enc|no_obj_ptr|no_obj_embed_spatial)",
     "tracker video memory"),
)


def squeeze_table(x: np.ndarray) -> np.ndarray:
    """``pos_embed`` [1, 1 + P * P, C] -> [1 + P * P, C]."""
    if x.ndim != 3 or x.shape[0] != 1:
        raise PortError(f"pos_embed must have shape [1, 1 + P * P, C], got {x.shape}")
    return x[0]


def _pair(torch_name: str, flax_name: str, transform=identity) -> list[tuple[str, str, object]]:
    """(weight, bias) rules; ``transform`` applies to the weight. Norms use ``scale``."""
    weight = "/scale" if transform is identity else "/kernel"
    return [(torch_name + r"\.weight", flax_name + weight, transform),
            (torch_name + r"\.bias", flax_name + "/bias", identity)]


def vit_rules() -> list[Rule]:
    """Rules for the ViT trunk and the three SAM 2 neck levels kept (any depth)."""
    b, fb = r"trunk\.blocks\.(\d+)\.", r"trunk/blocks_\1/"
    table = [
        (r"trunk\.patch_embed\.proj\.weight", "trunk/patch_embed/kernel", conv),
        (r"trunk\.pos_embed", "trunk/pos_embed", squeeze_table),
        *_pair(r"trunk\.ln_pre", "trunk/ln_pre"),
        *_pair(b + "norm1", fb + "norm1"),
        *_pair(b + "norm2", fb + "norm2"),
        *_pair(b + r"attn\.qkv", fb + "attn/qkv", linear),
        *_pair(b + r"attn\.proj", fb + "attn/proj", linear),
        *_pair(b + r"mlp\.fc1", fb + "mlp/fc1", linear),
        *_pair(b + r"mlp\.fc2", fb + "mlp/fc2", linear),
        *_pair(r"sam2_convs\.([0-2])\.(dconv_2x2(?:_[01])?)", r"neck_sam2_convs_\1/\2",
               patch_conv_transpose),
        *_pair(r"sam2_convs\.([0-2])\.(conv_1x1|conv_3x3)", r"neck_sam2_convs_\1/\2", conv),
    ]
    return prefixed_rules(BACKBONE, "image_encoder/", table)


def sam3_rules() -> list[Rule]:
    """The full key table of the interactive path of an official SAM 3 checkpoint."""
    return (vit_rules() + prompt_encoder_rules(TRACKER + "sam_prompt_encoder.", "prompt_encoder/")
            + sam2_decoder_rules(TRACKER + "sam_mask_decoder.", "mask_decoder/")
            + [Rule(re.escape(TRACKER) + "no_mem_embed", "no_mem_embed", flat_vector)])


def unused_part(key: str) -> str | None:
    """What unused part ``key`` belongs to (see `UNUSED_PARTS`), or None."""
    for pattern, name in UNUSED_PARTS:
        if re.fullmatch(pattern, key):
            return name
    return None


def check_rope_tables(state_dict: Mapping[str, np.ndarray], vit, *, what: str) -> None:
    """Checks every ``freqs_cis`` buffer against `axial_rope_angles` of ``vit`` (a `Sam3VitConfig`).

    Raises:
      PortError: naming the first table whose shape or values differ (wrong config).
    """
    from jaxseg_robust.models.sam3.image_encoder import axial_rope_angles  # noqa: PLC0415

    for key, value in state_dict.items():
        m = ROPE_KEY.fullmatch(key)
        if m is None:
            continue
        block = int(m.group(1))
        side = vit.grid_size if block in vit.global_att_blocks else vit.window_size
        angles = axial_rope_angles(vit.head_dim, side, vit.window_size / side, vit.rope_theta)
        want = np.cos(angles) + 1j * np.sin(angles)
        got = np.asarray(value)
        if got.shape != want.shape or not np.allclose(got, want, rtol=0.0, atol=ROPE_ATOL):
            raise PortError(f"{what}: RoPE table '{key}' (shape {got.shape}) is not the one of "
                            f"this config (shape {want.shape}; wrong window or grid?)")


def split_keys(state_dict: Mapping[str, np.ndarray]):
    """(interactive-path state dict without RoPE tables, {unused part: [skipped keys]})."""
    used, skipped = {}, {}
    for key, value in state_dict.items():
        part = unused_part(key)
        if part is not None:
            skipped.setdefault(part, []).append(key)
        elif ROPE_KEY.fullmatch(key) is None:
            used[key] = value
    return used, skipped


def convert_sam3(state_dict: Mapping[str, np.ndarray], config, *, what: str = "checkpoint"):
    """Strictly converts the interactive path of an official SAM 3 state dict.

    Returns:
      (params {"image_encoder", "prompt_encoder", "mask_decoder", "no_mem_embed"}
      of float32 numpy arrays, {unused part: [skipped keys]}).

    Raises:
      PortError: naming the offending key.
    """
    from jaxseg_robust.models.sam3.segmenter import Sam3Segmenter  # noqa: PLC0415

    key = BACKBONE + "trunk.patch_embed.proj.weight"
    if key not in state_dict:
        sample = ", ".join(f"'{k}'" for k in list(state_dict)[:3])
        raise PortError(f"{what}: key '{key}' is missing, so this is not an official SAM 3 "
                        f"checkpoint (first keys: {sample})")
    check_rope_tables(state_dict, config.encoder, what=what)
    used, skipped = split_keys(state_dict)
    params = convert(used, sam3_rules(), Sam3Segmenter(config).param_shapes(), what=what)
    return params, skipped


def port_checkpoint(checkpoint: str | os.PathLike, out_dir: str | os.PathLike, *,
                    overwrite: bool = False, config=None):
    """Reads an official SAM 3 ``.pt``, converts its interactive path, saves it with the store.

    Args:
      config: the `Sam3Config` (default: the released model's).

    Returns:
      (output directory, {unused part: [skipped keys]}).
    """
    from jaxseg_robust.models import store  # noqa: PLC0415
    from jaxseg_robust.models.sam3.config import OFFICIAL_CONFIG  # noqa: PLC0415
    from ports.torch_checkpoint import load_state_dict  # noqa: PLC0415

    config = OFFICIAL_CONFIG if config is None else config
    checkpoint = os.fspath(checkpoint)
    state_dict = load_state_dict(checkpoint)
    params, skipped = convert_sam3(state_dict, config, what=checkpoint)
    out = store.save(out_dir, params, family=config.family, variant=config.variant,
                     config=config.to_dict(), source_path=checkpoint, overwrite=overwrite)
    write_skipped(out, skipped, state_dict, title=f"SAM 3 {config.variant}")
    return out, skipped


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``python -m ports sam3``."""
    add_checkpoint_arguments(parser, "official SAM 3 .pt checkpoint (sam3.pt)")


def run(args: argparse.Namespace) -> int:
    """Runs the port; prints where the model went and what was skipped. Returns an exit code."""
    out, _ = port_checkpoint(args.checkpoint, args.out, overwrite=args.overwrite)
    return report_converted(args.checkpoint, out)
