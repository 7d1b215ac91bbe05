"""Official SAM (ViT-B/L/H) checkpoints -> jaxseg_robust Flax parameters.

``python -m ports sam --checkpoint sam_vit_b_01ec64.pth --out DIR [--variant auto]``

The key table is built from reusable pieces so other SAM-family ports
(MobileSAM, SAM-HQ) can combine them with their own encoder/decoder rules:

  * `vit_encoder_rules`     torch ``image_encoder.*``  -> flax ``image_encoder/...``
  * `prompt_encoder_rules`  torch ``prompt_encoder.*`` -> flax ``prompt_encoder/...``
  * `two_way_transformer_rules`, `mask_decoder_rules`
                            torch ``mask_decoder.*``   -> flax ``mask_decoder/...``

Every function takes the torch key prefix and the flax path prefix, so a
family whose modules live elsewhere reuses them unchanged. `official_sam_shapes`
lists every key and shape of the official state dict for a config (read from
the reference code; a parity test checks it against the reference builders).
"""

from __future__ import annotations

import argparse
import os
import re
from typing import Mapping

import numpy as np

from ports.keytable import PortError, Rule, conv, convert, identity, linear
from ports.port_cli import add_checkpoint_arguments, report_converted

VARIANTS = ("vit_b", "vit_l", "vit_h")


# ---- layout transforms specific to our SAM modules ---------------------------

def conv1x1_as_linear(x: np.ndarray) -> np.ndarray:
    """torch Conv2d 1x1 weight [out, in, 1, 1] -> `Linear` kernel [in, out]."""
    if x.ndim != 4 or x.shape[2:] != (1, 1):
        raise PortError(f"a 1x1 Conv2d weight must have shape [out, in, 1, 1], got {x.shape}")
    return x[:, :, 0, 0].T


def patch_conv_transpose(x: np.ndarray) -> np.ndarray:
    """torch ConvTranspose2d weight [in, out, p, p] -> `PatchConvTranspose` kernel [p, p, in, out]."""
    if x.ndim != 4:
        raise PortError(f"a ConvTranspose2d weight must be 4-D, got shape {x.shape}")
    return np.transpose(x, (2, 3, 0, 1))


# ---- rule builders -------------------------------------------------------------

def prefixed_rules(torch_prefix: str, flax_prefix: str,
           table: list[tuple[str, str, object]]) -> list[Rule]:
    """Prefixes a table of (torch regex tail, flax template tail, transform)."""
    head = re.escape(torch_prefix)
    return [Rule(head + pattern, flax_prefix + target, transform)
            for pattern, target, transform in table]


def _norm(torch_name: str, flax_name: str) -> list[tuple[str, str, object]]:
    return [(torch_name + r"\.weight", flax_name + "/scale", identity),
            (torch_name + r"\.bias", flax_name + "/bias", identity)]


def _dense(torch_name: str, flax_name: str) -> list[tuple[str, str, object]]:
    return [(torch_name + r"\.weight", flax_name + "/kernel", linear),
            (torch_name + r"\.bias", flax_name + "/bias", identity)]


def vit_encoder_rules(torch_prefix: str = "image_encoder.",
                      flax_prefix: str = "image_encoder/") -> list[Rule]:
    """Rules for SAM's ViT image encoder (`ImageEncoderViT`), any depth."""
    b = r"blocks\.(\d+)\."
    table = [
        (r"patch_embed\.proj\.weight", "patch_embed/proj/kernel", conv),
        (r"patch_embed\.proj\.bias", "patch_embed/proj/bias", identity),
        (r"pos_embed", "pos_embed", identity),
        *_norm(b + r"norm1", r"blocks_\1/norm1"),
        *_norm(b + r"norm2", r"blocks_\1/norm2"),
        *_dense(b + r"attn\.qkv", r"blocks_\1/attn/qkv"),
        *_dense(b + r"attn\.proj", r"blocks_\1/attn/proj"),
        (b + r"attn\.rel_pos_h", r"blocks_\1/attn/rel_pos_h", identity),
        (b + r"attn\.rel_pos_w", r"blocks_\1/attn/rel_pos_w", identity),
        *_dense(b + r"mlp\.lin1", r"blocks_\1/mlp/lin1"),
        *_dense(b + r"mlp\.lin2", r"blocks_\1/mlp/lin2"),
        (r"neck\.0\.weight", "neck/conv1/kernel", conv),
        *_norm(r"neck\.1", "neck/norm1"),
        (r"neck\.2\.weight", "neck/conv2/kernel", conv),
        *_norm(r"neck\.3", "neck/norm2"),
    ]
    return prefixed_rules(torch_prefix, flax_prefix, table)


def prompt_encoder_rules(torch_prefix: str = "prompt_encoder.",
                         flax_prefix: str = "prompt_encoder/") -> list[Rule]:
    """Rules for SAM's `PromptEncoder` (shared by SAM, MobileSAM and SAM-HQ)."""
    table = [
        (r"pe_layer\.positional_encoding_gaussian_matrix",
         "pe_layer/positional_encoding_gaussian_matrix", identity),
        (r"point_embeddings\.([0-3])\.weight", r"point_embeddings_\1", identity),
        (r"not_a_point_embed\.weight", "not_a_point_embed", identity),
        (r"no_mask_embed\.weight", "no_mask_embed", identity),
        (r"mask_downscaling\.0\.weight", "mask_downscaling/conv1/kernel", conv),
        (r"mask_downscaling\.0\.bias", "mask_downscaling/conv1/bias", identity),
        *_norm(r"mask_downscaling\.1", "mask_downscaling/norm1"),
        (r"mask_downscaling\.3\.weight", "mask_downscaling/conv2/kernel", conv),
        (r"mask_downscaling\.3\.bias", "mask_downscaling/conv2/bias", identity),
        *_norm(r"mask_downscaling\.4", "mask_downscaling/norm2"),
        (r"mask_downscaling\.6\.weight", "mask_downscaling/proj/kernel", conv1x1_as_linear),
        (r"mask_downscaling\.6\.bias", "mask_downscaling/proj/bias", identity),
    ]
    return prefixed_rules(torch_prefix, flax_prefix, table)


def _attention(torch_name: str, flax_name: str) -> list[tuple[str, str, object]]:
    out = []
    for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
        out += _dense(torch_name + r"\." + proj, flax_name + "/" + proj)
    return out


def two_way_transformer_rules(torch_prefix: str = "mask_decoder.transformer.",
                              flax_prefix: str = "mask_decoder/transformer/") -> list[Rule]:
    """Rules for SAM's `TwoWayTransformer`, any depth."""
    layer = r"layers\.(\d+)\."
    table = [
        *_attention(layer + r"self_attn", r"layers_\1/self_attn"),
        *_attention(layer + r"cross_attn_token_to_image", r"layers_\1/cross_attn_token_to_image"),
        *_attention(layer + r"cross_attn_image_to_token", r"layers_\1/cross_attn_image_to_token"),
        *_dense(layer + r"mlp\.lin1", r"layers_\1/mlp/lin1"),
        *_dense(layer + r"mlp\.lin2", r"layers_\1/mlp/lin2"),
        *_norm(layer + r"norm([1-4])", r"layers_\1/norm\2"),
        *_attention(r"final_attn_token_to_image", "final_attn_token_to_image"),
        *_norm(r"norm_final_attn", "norm_final_attn"),
    ]
    return prefixed_rules(torch_prefix, flax_prefix, table)


def mask_decoder_rules(torch_prefix: str = "mask_decoder.",
                       flax_prefix: str = "mask_decoder/") -> list[Rule]:
    """Rules for SAM's `MaskDecoder` (tokens, upscaling, hypernetworks, IoU head, transformer)."""
    table = [
        (r"iou_token\.weight", "iou_token", identity),
        (r"mask_tokens\.weight", "mask_tokens", identity),
        (r"output_upscaling\.0\.weight", "output_upscaling/upscale1/kernel", patch_conv_transpose),
        (r"output_upscaling\.0\.bias", "output_upscaling/upscale1/bias", identity),
        *_norm(r"output_upscaling\.1", "output_upscaling/norm"),
        (r"output_upscaling\.3\.weight", "output_upscaling/upscale2/kernel", patch_conv_transpose),
        (r"output_upscaling\.3\.bias", "output_upscaling/upscale2/bias", identity),
        *_dense(r"output_hypernetworks_mlps\.(\d+)\.layers\.(\d+)",
                r"output_hypernetworks_mlps_\1/layers_\2"),
        *_dense(r"iou_prediction_head\.layers\.(\d+)", r"iou_prediction_head/layers_\1"),
    ]
    return (prefixed_rules(torch_prefix, flax_prefix, table)
            + two_way_transformer_rules(torch_prefix + "transformer.", flax_prefix + "transformer/"))


def sam_rules() -> list[Rule]:
    """The full key table of an official SAM (ViT) checkpoint."""
    return vit_encoder_rules() + prompt_encoder_rules() + mask_decoder_rules()


# ---- the official layout, for variant inference and tests ----------------------

def official_vit_shapes(vit, prefix: str = "image_encoder.") -> dict[str, tuple[int, ...]]:
    """Every key and shape of the official ``ImageEncoderViT`` state dict for a `ViTConfig`."""
    d, hd = vit.embed_dim, vit.embed_dim // vit.num_heads
    g, p = vit.grid_size, vit.patch_size
    out: dict[str, tuple[int, ...]] = {
        prefix + "pos_embed": (1, g, g, d),
        prefix + "patch_embed.proj.weight": (d, vit.in_chans, p, p),
        prefix + "patch_embed.proj.bias": (d,),
    }
    hidden = int(d * vit.mlp_ratio)
    for i in range(vit.depth):
        k = f"{prefix}blocks.{i}."
        size = g if i in vit.global_attn_indexes else vit.window_size
        out.update({k + "norm1.weight": (d,), k + "norm1.bias": (d,),
                    k + "attn.rel_pos_h": (2 * size - 1, hd), k + "attn.rel_pos_w": (2 * size - 1, hd),
                    k + "attn.qkv.weight": (3 * d, d), k + "attn.qkv.bias": (3 * d,),
                    k + "attn.proj.weight": (d, d), k + "attn.proj.bias": (d,),
                    k + "norm2.weight": (d,), k + "norm2.bias": (d,),
                    k + "mlp.lin1.weight": (hidden, d), k + "mlp.lin1.bias": (hidden,),
                    k + "mlp.lin2.weight": (d, hidden), k + "mlp.lin2.bias": (d,)})
    oc = vit.out_chans
    out.update({prefix + "neck.0.weight": (oc, d, 1, 1), prefix + "neck.1.weight": (oc,),
                prefix + "neck.1.bias": (oc,), prefix + "neck.2.weight": (oc, oc, 3, 3),
                prefix + "neck.3.weight": (oc,), prefix + "neck.3.bias": (oc,)})
    return out


def official_prompt_encoder_shapes(config,
                                   prefix: str = "prompt_encoder.") -> dict[str, tuple[int, ...]]:
    """Every key and shape of the official ``PromptEncoder`` state dict for a `SamConfig`."""
    c, m, pe = config.prompt_embed_dim, config.mask_in_chans, prefix
    out = {pe + "pe_layer.positional_encoding_gaussian_matrix": (2, c // 2)}
    for i in range(4):
        out[pe + f"point_embeddings.{i}.weight"] = (1, c)
    out.update({pe + "not_a_point_embed.weight": (1, c),
                pe + "mask_downscaling.0.weight": (m // 4, 1, 2, 2),
                pe + "mask_downscaling.0.bias": (m // 4,),
                pe + "mask_downscaling.1.weight": (m // 4,), pe + "mask_downscaling.1.bias": (m // 4,),
                pe + "mask_downscaling.3.weight": (m, m // 4, 2, 2),
                pe + "mask_downscaling.3.bias": (m,),
                pe + "mask_downscaling.4.weight": (m,), pe + "mask_downscaling.4.bias": (m,),
                pe + "mask_downscaling.6.weight": (c, m, 1, 1), pe + "mask_downscaling.6.bias": (c,),
                pe + "no_mask_embed.weight": (1, c)})
    return out


def official_mask_decoder_shapes(config,
                                 prefix: str = "mask_decoder.") -> dict[str, tuple[int, ...]]:
    """Every key and shape of the official SAM ``MaskDecoder`` state dict for a `SamConfig`."""
    c, dec, md = config.prompt_embed_dim, config.decoder, prefix
    ci = c // dec.attention_downsample_rate
    out: dict[str, tuple[int, ...]] = {}

    def attention(key: str, internal: int) -> None:
        for proj in ("q_proj", "k_proj", "v_proj"):
            out[key + proj + ".weight"] = (internal, c)
            out[key + proj + ".bias"] = (internal,)
        out[key + "out_proj.weight"] = (c, internal)
        out[key + "out_proj.bias"] = (c,)

    for i in range(dec.transformer_depth):
        k = md + f"transformer.layers.{i}."
        attention(k + "self_attn.", c)
        attention(k + "cross_attn_token_to_image.", ci)
        attention(k + "cross_attn_image_to_token.", ci)
        out.update({k + "mlp.lin1.weight": (dec.transformer_mlp_dim, c),
                    k + "mlp.lin1.bias": (dec.transformer_mlp_dim,),
                    k + "mlp.lin2.weight": (c, dec.transformer_mlp_dim), k + "mlp.lin2.bias": (c,)})
        for n in range(1, 5):
            out[k + f"norm{n}.weight"] = (c,)
            out[k + f"norm{n}.bias"] = (c,)
    attention(md + "transformer.final_attn_token_to_image.", ci)
    out[md + "transformer.norm_final_attn.weight"] = (c,)
    out[md + "transformer.norm_final_attn.bias"] = (c,)
    n_tokens = dec.num_multimask_outputs + 1
    out.update({md + "iou_token.weight": (1, c), md + "mask_tokens.weight": (n_tokens, c),
                md + "output_upscaling.0.weight": (c, c // 4, 2, 2),
                md + "output_upscaling.0.bias": (c // 4,),
                md + "output_upscaling.1.weight": (c // 4,), md + "output_upscaling.1.bias": (c // 4,),
                md + "output_upscaling.3.weight": (c // 4, c // 8, 2, 2),
                md + "output_upscaling.3.bias": (c // 8,)})
    for i in range(n_tokens):
        out.update(official_mlp_shapes(md + f"output_hypernetworks_mlps.{i}.", [c, c, c, c // 8]))
    out.update(official_mlp_shapes(
        md + "iou_prediction_head.",
        [c] + [dec.iou_head_hidden_dim] * (dec.iou_head_depth - 1) + [n_tokens]))
    return out


def official_mlp_shapes(prefix: str, dims: list[int]) -> dict[str, tuple[int, ...]]:
    """Keys and shapes of SAM's ``MLP`` with layer widths ``dims`` (``layers.{j}``)."""
    out: dict[str, tuple[int, ...]] = {}
    for j in range(len(dims) - 1):
        out[prefix + f"layers.{j}.weight"] = (dims[j + 1], dims[j])
        out[prefix + f"layers.{j}.bias"] = (dims[j + 1],)
    return out


def official_sam_shapes(config) -> dict[str, tuple[int, ...]]:
    """Every key and shape of the official ``Sam`` state dict for a ViT `SamConfig`.

    Written from the reference modules (``build_sam._build_sam``); the parity
    suite checks it against the reference builders for ViT-B/L/H.
    """
    return {**official_vit_shapes(config.encoder), **official_prompt_encoder_shapes(config),
            **official_mask_decoder_shapes(config)}


# ---- which SAM-family port a checkpoint belongs to --------------------------------

# (family, a key only that family's official checkpoints have), most specific first.
_FAMILY_MARKERS = (
    ("sam_hq", "mask_decoder.hf_token.weight"),
    ("robustsam", "mask_decoder.custom_robust_token.weight"),
    ("mobile_sam", "image_encoder.patch_embed.seq.0.c.weight"),
    ("sam", "image_encoder.patch_embed.proj.weight"),
)
PORT_OF_FAMILY = {"sam": "sam", "mobile_sam": "mobile_sam", "sam_hq": "sam_hq",
                  "robustsam": "robustsam"}


def guess_sam_family(state_dict: Mapping[str, np.ndarray]) -> tuple[str, str] | None:
    """(family, the key that says so) of a SAM-family state dict, or None.

    "sam_hq" (an HQ decoder, ViT or TinyViT encoder), "robustsam" (RobustSAM's
    robust output tokens), "mobile_sam" (a TinyViT
    encoder with SAM's decoder) or "sam" (a ViT encoder with SAM's decoder).
    """
    for family, marker in _FAMILY_MARKERS:
        if marker in state_dict:
            return family, marker
    return None


def check_sam_family(state_dict: Mapping[str, np.ndarray], accepted: tuple[str, ...],
                     port: str, *, what: str = "checkpoint") -> None:
    """Raises PortError when a state dict is recognisably another SAM family's.

    Args:
      state_dict: torch key -> array.
      accepted: families this port converts.
      port: this port's name (for the message).
      what: a name for error messages.
    """
    guess = guess_sam_family(state_dict)
    if guess is not None and guess[0] not in accepted:
        family, marker = guess
        kind = {"sam_hq": "a SAM-HQ", "mobile_sam": "a MobileSAM",
                "robustsam": "a RobustSAM", "sam": "a SAM (ViT)"}[family]
        raise PortError(f"{what}: key '{marker}' marks {kind} checkpoint, not one for "
                        f"`python -m ports {port}` (wrong family); convert it with "
                        f"`python -m ports {PORT_OF_FAMILY[family]}`")


def infer_variant(state_dict: Mapping[str, np.ndarray], *, what: str = "checkpoint") -> str:
    """Infers vit_b / vit_l / vit_h from the patch-embedding width and the block count.

    Raises:
      PortError: not a SAM ViT checkpoint, or width and depth point to
        different variants (ambiguous).
    """
    from jaxseg_robust.models.sam.registry import SAM_CONFIGS  # noqa: PLC0415

    key = "image_encoder.patch_embed.proj.weight"
    if key not in state_dict:
        sample = ", ".join(f"'{k}'" for k in list(state_dict)[:3])
        guess = guess_sam_family(state_dict)
        hint = (f"; key '{guess[1]}' marks a '{guess[0]}' checkpoint: use `python -m ports "
                f"{PORT_OF_FAMILY[guess[0]]}`") if guess else ""
        raise PortError(f"{what}: key '{key}' is missing, so this is not an official SAM ViT "
                        f"checkpoint (wrong family? first keys: {sample}); pass --variant or use "
                        f"the port for its family{hint}")
    width = int(np.shape(state_dict[key])[0])
    blocks = {int(m.group(1)) for k in state_dict
              if (m := re.match(r"image_encoder\.blocks\.(\d+)\.", k))}
    depth = max(blocks) + 1 if blocks else 0
    by_width = [v for v in VARIANTS if SAM_CONFIGS[v].encoder.embed_dim == width]
    by_depth = [v for v in VARIANTS if SAM_CONFIGS[v].encoder.depth == depth]
    both = [v for v in by_width if v in by_depth]
    if len(both) == 1:
        return both[0]
    raise PortError(f"{what}: cannot infer the SAM variant: embedding width {width} (key '{key}') "
                    f"matches {by_width or 'no variant'}, {depth} image-encoder blocks match "
                    f"{by_depth or 'no variant'}; ambiguous or not a SAM ViT checkpoint "
                    f"(pass --variant explicitly)")


def convert_sam(state_dict: Mapping[str, np.ndarray], config, *, what: str = "checkpoint") -> dict:
    """Strictly converts an official SAM state dict for ``config`` (a ViT `SamConfig`).

    Returns:
      The Flax param tree {"image_encoder", "prompt_encoder", "mask_decoder"}
      of float32 numpy arrays.

    Raises:
      PortError: naming the offending key (unused, missing, mis-shaped, ...).
    """
    from jaxseg_robust.models.sam.segmenter import SamSegmenter  # noqa: PLC0415

    check_sam_family(state_dict, ("sam",), "sam", what=what)
    check_official_keys(state_dict, official_sam_shapes(config), what=what)
    expected = SamSegmenter(config).param_shapes()
    return convert(state_dict, sam_rules(), expected, what=what)


def check_official_keys(state_dict: Mapping[str, np.ndarray], official: Mapping[str, tuple],
                        *, what: str = "checkpoint") -> None:
    """Compares a state dict with the official key/shape list, naming torch keys.

    Raises:
      PortError: for the first unexpected key, missing key (with a count of
        the others) or key whose shape differs from the official one.
    """
    extra = [k for k in state_dict if k not in official]
    if extra:
        raise PortError(f"{what}: key '{extra[0]}' is not part of this model's official "
                        f"checkpoint" + (f" ({len(extra) - 1} more unexpected keys)"
                                         if len(extra) > 1 else "")
                        + " (wrong family or variant?)")
    missing = [k for k in official if k not in state_dict]
    if missing:
        raise PortError(f"{what}: key '{missing[0]}' is missing"
                        + (f" ({len(missing) - 1} more missing keys)" if len(missing) > 1 else "")
                        + " (truncated checkpoint or wrong variant?)")
    for key, shape in official.items():
        got = tuple(np.shape(state_dict[key]))
        if got != tuple(shape):
            raise PortError(f"{what}: key '{key}' has shape {got}, the official model has "
                            f"{tuple(shape)} (wrong variant?)")


def port_checkpoint(checkpoint: str | os.PathLike, out_dir: str | os.PathLike, *,
                    variant: str = "auto", overwrite: bool = False) -> str:
    """Reads an official SAM ``.pth``, converts it strictly, and saves it with `jaxseg_robust.models.store`.

    Args:
      checkpoint: path of the official checkpoint.
      out_dir: output directory (orbax params + config.json).
      variant: "vit_b", "vit_l", "vit_h" or "auto" (inferred from tensor shapes).
      overwrite: replace an existing converted model in ``out_dir``.

    Returns:
      The output directory.
    """
    from jaxseg_robust.models.sam.registry import SAM_CONFIGS  # noqa: PLC0415
    from jaxseg_robust.models import store  # noqa: PLC0415
    from ports.torch_checkpoint import load_state_dict  # noqa: PLC0415

    if variant != "auto" and variant not in VARIANTS:
        raise ValueError(f"variant must be 'auto' or one of {VARIANTS}; got {variant!r}")
    checkpoint = os.fspath(checkpoint)
    state_dict = load_state_dict(checkpoint)
    if variant == "auto":
        variant = infer_variant(state_dict, what=checkpoint)
    config = SAM_CONFIGS[variant]
    params = convert_sam(state_dict, config, what=checkpoint)
    return store.save(out_dir, params, family=config.family, variant=variant,
                      config=config.to_dict(), source_path=checkpoint, overwrite=overwrite)


# ---- command line ----------------------------------------------------------------

def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``python -m ports sam``."""
    add_checkpoint_arguments(parser, "official SAM .pth checkpoint", VARIANTS)


def run(args: argparse.Namespace) -> int:
    """Runs the port; prints where the model went. Returns an exit code."""
    out = port_checkpoint(args.checkpoint, args.out, variant=args.variant, overwrite=args.overwrite)
    return report_converted(args.checkpoint, out)
