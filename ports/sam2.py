"""Official SAM 2 / SAM 2.1 checkpoints -> jaxseg_robust Flax parameters, strictly.

``python -m ports sam2 --checkpoint sam2.1_hiera_large.pt --out DIR [--variant auto] [--version auto]``

An official checkpoint is ``{"model": state_dict}`` of the whole video model
(``SAM2Base``). The single-image path (Hiera trunk, FPN neck, prompt encoder,
mask decoder, ``no_mem_embed``) is converted with a strict key table
(`sam2_rules`; every key used once, every parameter filled, shapes checked).
The video-only parts are recognised by name (`VIDEO_PARTS`) and skipped;
`port_checkpoint` returns, prints and writes (``DIR/skipped_video_keys.txt``)
every skipped key. A key that is neither is an error naming it.

The variant comes from the trunk width and block count (tiny and small share
the width), the version from the keys SAM 2.1 added (``no_obj_embed_spatial``,
``obj_ptr_tpos_proj.*``); both can be given explicitly.
"""

from __future__ import annotations

import argparse
import os
import re
from typing import Mapping

import numpy as np

from ports.keytable import PortError, Rule, conv, convert, identity, linear
from ports.port_cli import add_checkpoint_arguments
from ports.sam import (check_official_keys, conv1x1_as_linear, guess_sam_family,
                       mask_decoder_rules, official_mask_decoder_shapes, official_mlp_shapes,
                       official_prompt_encoder_shapes, prefixed_rules, prompt_encoder_rules)

VARIANTS = ("hiera_tiny", "hiera_small", "hiera_base_plus", "hiera_large")
VERSION_MARKERS_2_1 = ("no_obj_embed_spatial", "obj_ptr_tpos_proj.weight")
SKIPPED_FILE = "skipped_video_keys.txt"
HQ_MARKER = "sam_mask_decoder.hf_token.weight"  # HQ-SAM 2's decoder (ports/sam2_hq.py)
# The parts of SAM2Base that only the video predictor uses: (regex on the key, what it is).
VIDEO_PARTS = (
    (r"memory_attention\..+", "memory attention"),
    (r"memory_encoder\..+", "memory encoder"),
    (r"maskmem_tpos_enc", "memory temporal position encoding"),
    (r"no_mem_pos_enc", "no-memory position encoding"),
    (r"obj_ptr_proj\..+", "object-pointer projection"),
    (r"obj_ptr_tpos_proj\..+", "object-pointer temporal projection (2.1)"),
    (r"no_obj_ptr", "no-object pointer"),
    (r"no_obj_embed_spatial", "no-object spatial embedding (2.1)"),
    (r"mask_downsample\..+", "mask downsampler of object pointers"),
)


# ---- layout transforms ------------------------------------------------------------

def channels_last_table(x: np.ndarray) -> np.ndarray:
    """torch position table [1, C, h, w] -> [h, w, C]."""
    if x.ndim != 4 or x.shape[0] != 1:
        raise PortError(f"a position table must have shape [1, C, h, w], got {x.shape}")
    return x[0].transpose(1, 2, 0)


def flat_vector(x: np.ndarray) -> np.ndarray:
    """``no_mem_embed`` [1, 1, C] -> [C]."""
    if x.ndim != 3 or x.shape[:2] != (1, 1):
        raise PortError(f"no_mem_embed must have shape [1, 1, C], got {x.shape}")
    return x.reshape(-1)


# ---- the key table -------------------------------------------------------------------

def _pair(torch_name: str, flax_name: str, transform=identity) -> list[tuple[str, str, object]]:
    """(weight, bias) rules; ``transform`` applies to the weight. Norms use ``scale``."""
    weight = "/scale" if transform is identity else "/kernel"
    return [(torch_name + r"\.weight", flax_name + weight, transform),
            (torch_name + r"\.bias", flax_name + "/bias", identity)]


def hiera_rules(torch_prefix: str = "image_encoder.",
                flax_prefix: str = "image_encoder/") -> list[Rule]:
    """Rules for the Hiera trunk and the FPN neck (any depth)."""
    b = r"trunk\.blocks\.(\d+)\."
    fb = r"trunk/blocks_\1/"
    table = [
        (r"trunk\.pos_embed", "trunk/pos_embed", channels_last_table),
        (r"trunk\.pos_embed_window", "trunk/pos_embed_window", channels_last_table),
        *_pair(r"trunk\.patch_embed\.proj", "trunk/patch_embed_proj", conv),
        *_pair(b + r"norm1", fb + "norm1"),
        *_pair(b + r"norm2", fb + "norm2"),
        *_pair(b + r"attn\.qkv", fb + "attn/qkv", linear),
        *_pair(b + r"attn\.proj", fb + "attn/proj", linear),
        *_pair(b + r"mlp\.layers\.([01])", fb + r"mlp/layers_\2", linear),
        *_pair(b + r"proj", fb + "proj", linear),
        *_pair(r"neck\.convs\.(\d+)\.conv", r"neck/convs_\1", conv),
    ]
    return prefixed_rules(torch_prefix, flax_prefix, table)


def sam2_decoder_rules(torch_prefix: str = "sam_mask_decoder.",
                       flax_prefix: str = "mask_decoder/") -> list[Rule]:
    """SAM's decoder rules plus SAM 2's token MLP names and additions."""
    layer = r"transformer\.layers\.(\d+)\.mlp\.layers\."
    table = [
        *_pair(layer + "0", r"transformer/layers_\1/mlp/lin1", linear),
        *_pair(layer + "1", r"transformer/layers_\1/mlp/lin2", linear),
        (r"obj_score_token\.weight", "obj_score_token", identity),
        *_pair(r"pred_obj_score_head\.layers\.(\d+)", r"pred_obj_score_head/layers_\1", linear),
        *_pair(r"pred_obj_score_head", "pred_obj_score_head", linear),
        *_pair(r"conv_s0", "conv_s0", conv1x1_as_linear),
        *_pair(r"conv_s1", "conv_s1", conv1x1_as_linear),
    ]
    return mask_decoder_rules(torch_prefix, flax_prefix) + prefixed_rules(torch_prefix,
                                                                          flax_prefix, table)


def sam2_rules() -> list[Rule]:
    """The full key table of the image path of an official SAM 2 checkpoint."""
    return (hiera_rules() + prompt_encoder_rules("sam_prompt_encoder.", "prompt_encoder/")
            + sam2_decoder_rules() + [Rule("no_mem_embed", "no_mem_embed", flat_vector)])


# ---- the official layout (image path) -----------------------------------------------

def official_hiera_shapes(config, prefix: str = "image_encoder.") -> dict[str, tuple[int, ...]]:
    """Every key and shape of the official trunk + neck for a `Sam2Config`."""
    hiera = config.encoder
    c0, w0 = hiera.embed_dim, hiera.window_spec[0]
    t = prefix + "trunk."
    out = {t + "pos_embed": (1, c0, *hiera.window_pos_embed_bkg_spatial_size),
           t + "pos_embed_window": (1, c0, w0, w0),
           t + "patch_embed.proj.weight": (c0, 3, 7, 7), t + "patch_embed.proj.bias": (c0,)}
    for i, spec in enumerate(hiera.blocks()):
        k, d, do = f"{t}blocks.{i}.", spec.dim, spec.dim_out
        hidden = int(do * hiera.mlp_ratio)
        out.update({k + "norm1.weight": (d,), k + "norm1.bias": (d,),
                    k + "attn.qkv.weight": (3 * do, d), k + "attn.qkv.bias": (3 * do,),
                    k + "attn.proj.weight": (do, do), k + "attn.proj.bias": (do,),
                    k + "norm2.weight": (do,), k + "norm2.bias": (do,),
                    k + "mlp.layers.0.weight": (hidden, do), k + "mlp.layers.0.bias": (hidden,),
                    k + "mlp.layers.1.weight": (do, hidden), k + "mlp.layers.1.bias": (do,)})
        if d != do:
            out.update({k + "proj.weight": (do, d), k + "proj.bias": (do,)})
    for i, channels in enumerate(hiera.channel_list):
        out[f"{prefix}neck.convs.{i}.conv.weight"] = (config.d_model, channels, 1, 1)
        out[f"{prefix}neck.convs.{i}.conv.bias"] = (config.d_model,)
    return out


def official_sam2_decoder_shapes(config, prefix: str = "sam_mask_decoder.") -> dict:
    """Every key and shape of the official SAM 2 ``MaskDecoder`` for a `Sam2Config`."""
    out = {}
    for key, shape in official_mask_decoder_shapes(config, prefix).items():
        out[key.replace(".mlp.lin1.", ".mlp.layers.0.").replace(".mlp.lin2.", ".mlp.layers.1.")] \
            = shape
    c = config.prompt_embed_dim
    if config.pred_obj_scores:
        out[prefix + "obj_score_token.weight"] = (1, c)
        if config.pred_obj_scores_mlp:
            out.update(official_mlp_shapes(prefix + "pred_obj_score_head.", [c, c, c, 1]))
        else:
            out.update({prefix + "pred_obj_score_head.weight": (1, c),
                        prefix + "pred_obj_score_head.bias": (1,)})
    if config.use_high_res_features:
        out.update({prefix + "conv_s0.weight": (c // 8, c, 1, 1), prefix + "conv_s0.bias": (c // 8,),
                    prefix + "conv_s1.weight": (c // 4, c, 1, 1), prefix + "conv_s1.bias": (c // 4,)})
    return out


def official_sam2_image_shapes(config) -> dict[str, tuple[int, ...]]:
    """Every key and shape of the image path of an official SAM 2 state dict.

    Written from the reference modules; the parity suite checks it against
    the official ``build_sam2`` for the eight configurations.
    """
    return {**official_hiera_shapes(config),
            **official_prompt_encoder_shapes(config, "sam_prompt_encoder."),
            **official_sam2_decoder_shapes(config), "no_mem_embed": (1, 1, config.d_model)}


# ---- splitting, recognising -------------------------------------------------------

def video_part(key: str) -> str | None:
    """What video-only part ``key`` belongs to (see `VIDEO_PARTS`), or None."""
    for pattern, name in VIDEO_PARTS:
        if re.fullmatch(pattern, key):
            return name
    return None


def split_video_keys(state_dict: Mapping[str, np.ndarray]):
    """(image-path state dict, {video part: [skipped keys]})."""
    image, skipped = {}, {}
    for key, value in state_dict.items():
        part = video_part(key)
        if part is None:
            image[key] = value
        else:
            skipped.setdefault(part, []).append(key)
    return image, skipped


def infer_variant(state_dict: Mapping[str, np.ndarray], *, what: str = "checkpoint") -> str:
    """hiera_tiny / small / base_plus / large from the trunk width and block count."""
    from jaxseg_robust.models.sam2.config import TRUNKS  # noqa: PLC0415

    key = "image_encoder.trunk.patch_embed.proj.weight"
    if key not in state_dict:
        guess = guess_sam_family(state_dict)
        hint = (f"; key '{guess[1]}' marks a '{guess[0]}' (SAM 1 family) checkpoint: use "
                f"`python -m ports {guess[0]}`") if guess else ""
        sample = ", ".join(f"'{k}'" for k in list(state_dict)[:3])
        raise PortError(f"{what}: key '{key}' is missing, so this is not an official SAM 2 "
                        f"checkpoint (first keys: {sample}){hint}")
    width = int(np.shape(state_dict[key])[0])
    blocks = {int(m.group(1)) for k in state_dict
              if (m := re.match(r"image_encoder\.trunk\.blocks\.(\d+)\.", k))}
    depth = max(blocks) + 1 if blocks else 0
    hits = [v for v in VARIANTS if TRUNKS[v].embed_dim == width and TRUNKS[v].depth == depth]
    if len(hits) != 1:
        raise PortError(f"{what}: no SAM 2 variant has trunk width {width} (key '{key}') and "
                        f"{depth} blocks; pass --variant explicitly")
    return hits[0]


def infer_version(state_dict: Mapping[str, np.ndarray], *, what: str = "checkpoint") -> str:
    """"2.1" when a key SAM 2.1 added is present, "2" when only SAM 2's video keys are."""
    markers = [k for k in VERSION_MARKERS_2_1 if k in state_dict]
    if markers:
        return "2.1"
    if any(k.startswith("memory_attention.") for k in state_dict):
        return "2"
    raise PortError(f"{what}: the checkpoint has no video keys to tell SAM 2 from SAM 2.1 "
                    f"(neither '{VERSION_MARKERS_2_1[0]}' nor 'memory_attention.*'); pass "
                    f"--version")


def check_not_sam1(state_dict: Mapping[str, np.ndarray], *, what: str = "checkpoint") -> None:
    """Raises a PortError naming the port to use when ``state_dict`` is a SAM 1 family checkpoint."""
    guess = guess_sam_family(state_dict)
    if guess is not None:
        raise PortError(f"{what}: key '{guess[1]}' marks a SAM 1 family ('{guess[0]}') "
                        f"checkpoint, not SAM 2; convert it with `python -m ports {guess[0]}`")


def convert_sam2(state_dict: Mapping[str, np.ndarray], config, *, what: str = "checkpoint"):
    """Strictly converts the image path of an official SAM 2 state dict.

    Returns:
      (params {"image_encoder", "prompt_encoder", "mask_decoder", "no_mem_embed"}
      of float32 numpy arrays, {video part: [skipped keys]}).

    Raises:
      PortError: naming the offending key (not image path nor video part,
        missing, mis-shaped, ...).
    """
    from jaxseg_robust.models.sam2.segmenter import Sam2Segmenter  # noqa: PLC0415

    check_not_sam1(state_dict, what=what)
    if HQ_MARKER in state_dict:
        raise PortError(f"{what}: key '{HQ_MARKER}' marks an HQ-SAM 2 checkpoint; convert it "
                        f"with `python -m ports sam2_hq`")
    image, skipped = split_video_keys(state_dict)
    check_official_keys(image, official_sam2_image_shapes(config), what=what)
    params = convert(image, sam2_rules(), Sam2Segmenter(config).param_shapes(), what=what)
    return params, skipped


def describe_skipped(skipped: Mapping[str, list], state_dict: Mapping[str, np.ndarray]) -> str:
    """One line per skipped video part: name, key count, parameter count."""
    lines = []
    for part, keys in skipped.items():
        count = sum(int(np.size(state_dict[k])) for k in keys)
        lines.append(f"  {part}: {len(keys)} keys, {count} values")
    return "\n".join(lines) if lines else "  (none)"


def port_checkpoint(checkpoint: str | os.PathLike, out_dir: str | os.PathLike, *,
                    variant: str = "auto", version: str = "auto", overwrite: bool = False):
    """Reads an official SAM 2 ``.pt``, converts its image path, saves it with the store.

    Returns:
      (output directory, {video part: [skipped keys]}).
    """
    from jaxseg_robust.models import store  # noqa: PLC0415
    from jaxseg_robust.models.sam2.config import VERSIONS, official_config  # noqa: PLC0415
    from ports.torch_checkpoint import load_state_dict  # noqa: PLC0415

    if variant != "auto" and variant not in VARIANTS:
        raise ValueError(f"variant must be 'auto' or one of {VARIANTS}; got {variant!r}")
    if version != "auto" and version not in VERSIONS:
        raise ValueError(f"version must be 'auto' or one of {VERSIONS}; got {version!r}")
    checkpoint = os.fspath(checkpoint)
    state_dict = load_state_dict(checkpoint)
    variant = infer_variant(state_dict, what=checkpoint) if variant == "auto" else variant
    version = infer_version(state_dict, what=checkpoint) if version == "auto" else version
    config = official_config(variant, version)
    params, skipped = convert_sam2(state_dict, config, what=checkpoint)
    out = store.save(out_dir, params, family=config.family, variant=variant,
                     config=config.to_dict(), source_path=checkpoint, overwrite=overwrite)
    write_skipped(out, skipped, state_dict, title=f"SAM {version} {variant}")
    return out, skipped


def write_skipped(out: str, skipped: Mapping[str, list], state_dict: Mapping[str, np.ndarray], *,
                  title: str) -> None:
    """Writes ``out/skipped_video_keys.txt`` (one ``key<TAB>part`` line each) and prints a summary."""
    listing = [f"{key}\t{part}" for part, keys in skipped.items() for key in keys]
    with open(os.path.join(out, SKIPPED_FILE), "w") as f:
        f.write("# video-only keys of the checkpoint, not used by the image model\n")
        f.write("".join(line + "\n" for line in listing))
    print(f"{title}: skipped {len(listing)} video-only keys by name "
          f"(listed in {os.path.join(out, SKIPPED_FILE)}):\n"
          + describe_skipped(skipped, state_dict))


# ---- command line ------------------------------------------------------------------

def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``python -m ports sam2``."""
    add_checkpoint_arguments(parser, "official SAM 2 / SAM 2.1 .pt checkpoint", VARIANTS)
    parser.add_argument("--version", default="auto", choices=("auto", "2", "2.1"),
                        help="SAM 2 or SAM 2.1; 'auto' infers it from the keys 2.1 added")


def run(args: argparse.Namespace) -> int:
    """Runs the port; prints where the model went and what was skipped. Returns an exit code."""
    out, _ = port_checkpoint(args.checkpoint, args.out, variant=args.variant,
                             version=args.version, overwrite=args.overwrite)
    print(f"converted {args.checkpoint} -> {out}")
    return 0
