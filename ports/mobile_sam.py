"""MobileSAM checkpoints -> jaxseg_robust Flax parameters, strictly.

``python -m ports mobile_sam --checkpoint mobile_sam.pt --out DIR``

The whole model (`convert_mobile_sam`): MobileSAM's TinyViT encoder (the key
table below) plus SAM's prompt encoder and mask decoder (the rules of
ports/sam.py; ``build_sam_vit_t`` uses SAM's default decoder settings),
saved as zoo family "sam", variant "mobile_sam" (zoo name ``mobile_sam``).
SAM, SAM-HQ and SAM-HQ-TinyViT checkpoints are refused with a message naming
the key that identifies them and the port to use.

Attention biases: MobileSAM's ``build_sam_vit_t(checkpoint)`` switches the
model to eval mode *before* loading the weights, which caches each TinyViT
attention's bias table (``ab``) while the biases are still zero; unless the
caller calls ``.eval()`` again (as MobileSAM's README does), the reference
then runs with all attention biases zero. The port uses the checkpoint's
``attention_biases`` (the README usage), as the parity tests check.

The encoder:

The key table (`tiny_vit_rules`) maps every *parameter* of MobileSAM's
``TinyViT`` (``mobile_sam/modeling/tiny_vit_sam.py``) onto
`jaxseg_robust.models.sam.tiny_vit.TinyViTEncoder`. A MobileSAM state dict also
holds entries that are not parameters of the Flax encoder; `prepare_tiny_vit_state_dict`
handles each of them explicitly, by name, and never drops anything else:

  * ``...bn.num_batches_tracked`` (integer scalars of every BatchNorm): a
    training counter with no effect in eval mode. Checked to be an integer
    scalar whose BatchNorm (``...bn.running_var``) is in the checkpoint, then
    removed.
  * ``norm_head.{weight,bias}``, ``head.{weight,bias}``: TinyViT's ImageNet
    classifier, built by ``build_sam_vit_t`` (``num_classes=1000``) but never
    called by its forward. Removed.
  * ``layers.{i}.blocks.{j}.attn.attention_bias_idxs``: the (query, key) ->
    offset index table (a non-persistent buffer in MobileSAM, so usually
    absent). The Flax model rebuilds it from the window size
    (`attention_bias_index`); when a checkpoint carries it, it must equal the
    rebuilt table exactly, else PortError. Then removed.

It also rejects negative BatchNorm running variances (they would give NaN).

Flax layout (under ``flax_prefix``): ``patch_embed/conv_{0,1}``,
``layers_{i}/blocks_{j}/...``, ``layers_{i}/downsample/conv{1,2,3}``,
``neck/{conv_0,norm_0,conv_1,norm_1}``; each Conv2d_BN becomes
``<name>/conv/kernel`` + ``<name>/bn/{scale,bias,mean,var}``.
"""

from __future__ import annotations

import argparse
import os
import re
from typing import Mapping

import jax
import jax.numpy as jnp
import numpy as np

from jaxseg_robust.models.sam.tiny_vit import TinyViTConfig, TinyViTEncoder, attention_bias_index
from ports.keytable import PortError, Rule, conv, convert, linear
from ports.port_cli import add_checkpoint_arguments, report_converted

# Regex fragments (relative to the prefix) of every Conv2d_BN in TinyViT, with
# the Flax path template each maps to. Groups are numbered within a fragment.
_CONV_BN_SITES: tuple[tuple[str, str], ...] = (
    (r"patch_embed\.seq\.0", "patch_embed/conv_0"),
    (r"patch_embed\.seq\.2", "patch_embed/conv_1"),
    (r"layers\.(\d+)\.blocks\.(\d+)\.(conv[123])", r"layers_\1/blocks_\2/\3"),
    (r"layers\.(\d+)\.downsample\.(conv[123])", r"layers_\1/downsample/\2"),
    (r"layers\.(\d+)\.blocks\.(\d+)\.local_conv", r"layers_\1/blocks_\2/local_conv"),
)

_BATCH_NORM_FIELDS = (("weight", "scale"), ("bias", "bias"),
                      ("running_mean", "mean"), ("running_var", "var"))

_CLASSIFIER_HEAD = r"(?:norm_head|head)\.(?:weight|bias)"
_BIAS_INDEX = r"layers\.(\d+)\.blocks\.(\d+)\.attn\.attention_bias_idxs"


def tiny_vit_rules(torch_prefix: str = "image_encoder.", flax_prefix: str = "image_encoder/") -> list[Rule]:
    """The key table of MobileSAM's TinyViT encoder parameters.

    Args:
      torch_prefix: literal prefix of the encoder's keys in the state dict
        (``"image_encoder."`` in a full MobileSAM checkpoint, ``""`` for an
        encoder-only state dict).
      flax_prefix: prefix of the encoder's params in the Flax tree
        (``"image_encoder/"`` inside the whole model, ``""`` for the encoder alone).

    Returns:
      Rules covering every float parameter/statistic; the non-parameter entries
      listed in the module docstring are *not* covered and must first be
      removed with `prepare_tiny_vit_state_dict`.
    """
    p = re.escape(torch_prefix)
    f = flax_prefix.replace("\\", "\\\\")
    rules: list[Rule] = []
    for torch_site, flax_site in _CONV_BN_SITES:
        rules.append(Rule(rf"{p}{torch_site}\.c\.weight", f"{f}{flax_site}/conv/kernel", conv))
        for torch_name, flax_name in _BATCH_NORM_FIELDS:
            rules.append(Rule(rf"{p}{torch_site}\.bn\.{torch_name}", f"{f}{flax_site}/bn/{flax_name}"))
    block = r"layers\.(\d+)\.blocks\.(\d+)"
    flax_block = r"layers_\1/blocks_\2"
    rules += [
        Rule(rf"{p}{block}\.attn\.attention_biases", rf"{f}{flax_block}/attn/attention_biases"),
        Rule(rf"{p}{block}\.(attn|mlp)\.norm\.weight", rf"{f}{flax_block}/\3/norm/scale"),
        Rule(rf"{p}{block}\.(attn|mlp)\.norm\.bias", rf"{f}{flax_block}/\3/norm/bias"),
        Rule(rf"{p}{block}\.attn\.(qkv|proj)\.weight", rf"{f}{flax_block}/attn/\3/kernel", linear),
        Rule(rf"{p}{block}\.attn\.(qkv|proj)\.bias", rf"{f}{flax_block}/attn/\3/bias"),
        Rule(rf"{p}{block}\.mlp\.(fc1|fc2)\.weight", rf"{f}{flax_block}/mlp/\3/kernel", linear),
        Rule(rf"{p}{block}\.mlp\.(fc1|fc2)\.bias", rf"{f}{flax_block}/mlp/\3/bias"),
        Rule(rf"{p}neck\.0\.weight", f"{f}neck/conv_0/kernel", conv),
        Rule(rf"{p}neck\.1\.weight", f"{f}neck/norm_0/scale"),
        Rule(rf"{p}neck\.1\.bias", f"{f}neck/norm_0/bias"),
        Rule(rf"{p}neck\.2\.weight", f"{f}neck/conv_1/kernel", conv),
        Rule(rf"{p}neck\.3\.weight", f"{f}neck/norm_1/scale"),
        Rule(rf"{p}neck\.3\.bias", f"{f}neck/norm_1/bias"),
    ]
    return rules


def _check_bias_index(key: str, value: np.ndarray, stage: int, block: int,
                      config: TinyViTConfig, what: str) -> None:
    """Raises PortError unless ``value`` is the offset index table of ``stage``'s ``block``."""
    if not 1 <= stage < len(config.embed_dims) or block >= config.depths[stage]:
        raise PortError(f"{what}: key '{key}' names an attention block the model does not have "
                        f"(attention stages 1..{len(config.embed_dims) - 1} with depths "
                        f"{config.depths[1:]})")
    if not np.issubdtype(value.dtype, np.integer):
        raise PortError(f"{what}: key '{key}' has dtype {value.dtype}, expected an integer index table")
    want = attention_bias_index(config.window_sizes[stage])
    if value.shape != want.shape or not np.array_equal(value, want):
        raise PortError(f"{what}: key '{key}' (shape {value.shape}) differs from the attention "
                        f"bias index table the model rebuilds for window "
                        f"{config.window_sizes[stage]} (shape {want.shape}); the checkpoint "
                        f"does not match this TinyViT configuration")


def prepare_tiny_vit_state_dict(
    state_dict: Mapping[str, np.ndarray],
    config: TinyViTConfig = TinyViTConfig(),
    *,
    torch_prefix: str = "image_encoder.",
    what: str = "checkpoint",
) -> dict[str, np.ndarray]:
    """Validates and removes the TinyViT entries that are not Flax parameters.

    Removes exactly the entries listed in this module's docstring (after
    checking each), rejects negative BatchNorm running variances, and returns
    every other entry unchanged (keys outside ``torch_prefix`` included, so
    that other parts of a MobileSAM checkpoint can be handled by their own
    port before `ports.keytable.convert` runs on the rest).

    Args:
      state_dict: torch key -> numpy array (e.g. from
        `ports.torch_checkpoint.load_state_dict`).
      config: the encoder configuration (window sizes for the index check).
      torch_prefix: literal prefix of the encoder's keys.
      what: a name for error messages.

    Returns:
      A new dict without the non-parameter TinyViT entries.

    Raises:
      PortError: naming the key, for a BatchNorm counter that is not an
        integer scalar or has no BatchNorm beside it, an attention-bias index
        table that differs from the rebuilt one or names a block the model
        lacks, or a negative running variance.
    """
    p = re.escape(torch_prefix)
    counter_re = re.compile(
        rf"{p}(?:{'|'.join(site for site, _ in _CONV_BN_SITES)})\.bn\.num_batches_tracked")
    running_var_re = re.compile(
        rf"{p}(?:{'|'.join(site for site, _ in _CONV_BN_SITES)})\.bn\.running_var")
    head_re = re.compile(rf"{p}{_CLASSIFIER_HEAD}")
    index_re = re.compile(rf"{p}{_BIAS_INDEX}")
    kept: dict[str, np.ndarray] = {}
    for key, value in state_dict.items():
        value = np.asarray(value)
        if counter_re.fullmatch(key):
            if value.shape != () or not np.issubdtype(value.dtype, np.integer):
                raise PortError(f"{what}: key '{key}' should be an integer scalar BatchNorm "
                                f"counter, got dtype {value.dtype} shape {value.shape}")
            # Only a counter whose BatchNorm is in the checkpoint (and so is
            # checked against the model by the key table) may be dropped.
            sibling = key[: -len("num_batches_tracked")] + "running_var"
            if sibling not in state_dict:
                raise PortError(f"{what}: key '{key}' is a BatchNorm counter without its "
                                f"BatchNorm ('{sibling}' is absent)")
            continue
        if head_re.fullmatch(key):
            continue
        index_match = index_re.fullmatch(key)
        if index_match:
            _check_bias_index(key, value, int(index_match.group(1)), int(index_match.group(2)),
                              config, what)
            continue
        if running_var_re.fullmatch(key) and np.issubdtype(value.dtype, np.floating) \
                and np.any(value < 0):
            raise PortError(f"{what}: key '{key}' has negative BatchNorm running variances "
                            f"(min {float(value.min())}); corrupt checkpoint?")
        kept[key] = value
    return kept


def tiny_vit_param_shapes(config: TinyViTConfig = TinyViTConfig()) -> dict:
    """Shapes of the encoder's Flax params: a nested dict of ShapeDtypeStruct (no compute)."""
    side = config.total_stride
    images = jax.ShapeDtypeStruct((1, side, side, config.in_chans), jnp.float32)
    variables = jax.eval_shape(TinyViTEncoder(config).init, jax.random.key(0), images)
    return variables["params"]


def convert_tiny_vit(
    state_dict: Mapping[str, np.ndarray],
    config: TinyViTConfig = TinyViTConfig(),
    *,
    torch_prefix: str = "image_encoder.",
    what: str = "checkpoint",
) -> dict:
    """Converts a state dict holding only the TinyViT encoder into Flax params.

    Every key must start with ``torch_prefix`` (use ``""`` for a bare encoder
    state dict); any other key is an error. For a full MobileSAM checkpoint,
    combine `tiny_vit_rules` with the prompt-encoder/decoder rules instead.

    Returns:
      The encoder's param tree (float32 numpy arrays), for
      ``TinyViTEncoder(config).apply({'params': tree}, images)``.

    Raises:
      PortError: naming the key, for any unmapped, missing, mis-shaped,
        non-float or inconsistent entry.
    """
    kept = prepare_tiny_vit_state_dict(state_dict, config, torch_prefix=torch_prefix, what=what)
    rules = tiny_vit_rules(torch_prefix=torch_prefix, flax_prefix="")
    return convert(kept, rules, tiny_vit_param_shapes(config), what=what)


# ---- the whole MobileSAM model -------------------------------------------------------

def convert_mobile_sam(state_dict: Mapping[str, np.ndarray], config=None, *,
                       what: str = "checkpoint") -> dict:
    """Strictly converts a full MobileSAM state dict.

    Args:
      state_dict: torch key -> numpy array (``image_encoder.*`` TinyViT,
        ``prompt_encoder.*``, ``mask_decoder.*``).
      config: a `SamConfig` with a TinyViT encoder; default the zoo's ``mobile_sam``.
      what: a name for error messages.

    Returns:
      The Flax param tree {"image_encoder", "prompt_encoder", "mask_decoder"}
      of float32 numpy arrays.

    Raises:
      PortError: naming the offending key (another family's checkpoint,
        unused, missing, mis-shaped, non-float or non-finite entries).
    """
    from jaxseg_robust.models.sam.registry import MOBILE_SAM_CONFIG  # noqa: PLC0415
    from jaxseg_robust.models.sam.segmenter import SamSegmenter  # noqa: PLC0415
    from ports.sam import (check_official_keys, check_sam_family,  # noqa: PLC0415
                           mask_decoder_rules, official_mask_decoder_shapes,
                           official_prompt_encoder_shapes, prompt_encoder_rules)

    config = MOBILE_SAM_CONFIG if config is None else config
    if config.encoder_kind != "tiny_vit":
        raise ValueError(f"config must have a TinyViT encoder (encoder_kind 'tiny_vit'); "
                         f"got '{config.encoder_kind}'")
    check_sam_family(state_dict, ("mobile_sam",), "mobile_sam", what=what)
    kept = prepare_tiny_vit_state_dict(state_dict, config.encoder, what=what)
    # prompt encoder and decoder: the official key list, so errors name torch keys
    check_official_keys({k: v for k, v in kept.items() if not k.startswith("image_encoder.")},
                        {**official_prompt_encoder_shapes(config),
                         **official_mask_decoder_shapes(config)}, what=what)
    rules = tiny_vit_rules() + prompt_encoder_rules() + mask_decoder_rules()
    return convert(kept, rules, SamSegmenter(config).param_shapes(), what=what)


def port_checkpoint(checkpoint: str | os.PathLike, out_dir: str | os.PathLike, *,
                    overwrite: bool = False) -> str:
    """Reads a MobileSAM ``.pt``, converts it strictly, saves it with `jaxseg_robust.models.store`.

    Returns:
      The output directory (family "sam", variant "mobile_sam").
    """
    from jaxseg_robust.models.sam.registry import MOBILE_SAM_CONFIG  # noqa: PLC0415
    from jaxseg_robust.models import store  # noqa: PLC0415
    from ports.torch_checkpoint import load_state_dict  # noqa: PLC0415

    checkpoint = os.fspath(checkpoint)
    params = convert_mobile_sam(load_state_dict(checkpoint), MOBILE_SAM_CONFIG, what=checkpoint)
    return store.save(out_dir, params, family=MOBILE_SAM_CONFIG.family,
                      variant=MOBILE_SAM_CONFIG.variant, config=MOBILE_SAM_CONFIG.to_dict(),
                      source_path=checkpoint, overwrite=overwrite)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``python -m ports mobile_sam``."""
    add_checkpoint_arguments(parser, "MobileSAM checkpoint (mobile_sam.pt)")


def run(args: argparse.Namespace) -> int:
    """Runs the port; prints where the model went. Returns an exit code."""
    out = port_checkpoint(args.checkpoint, args.out, overwrite=args.overwrite)
    return report_converted(args.checkpoint, out)
