"""Tests of the strict RobustSAM port (ports/robustsam.py) on numpy state dicts (no torch).

The state dicts are laid out as the official checkpoint (`official_robustsam_shapes`,
checked against the authors' builders in tests/test_robustsam_parity.py) for the
tiny config; the end-to-end CLI port of a ViT-B ``.pth`` is in the parity test.
"""

from __future__ import annotations

import numpy as np
import pytest
from flax import traverse_util

from jaxseg_robust.models.robustsam.config import RobustSamConfig, check_robust_shapes
from jaxseg_robust.models.robustsam.registry import ROBUSTSAM_CONFIGS, TINY_CONFIG, with_decoder_path
from jaxseg_robust.models.robustsam.segmenter import RobustSamSegmenter
from jaxseg_robust.models.sam.registry import TINY_CONFIG as SAM_TINY_CONFIG
from ports.__main__ import build_parser
from ports.keytable import PortError
from ports.robustsam import convert_robustsam, official_robustsam_shapes
from ports.sam import convert_sam, infer_variant

SELECTOR = "mask_decoder.fourier_first_layer_features.dnc_block_combined.SEMBlock.maxpool_conv.0."
COUNTER = SELECTOR + "BN.num_batches_tracked"


def random_state_dict(config, seed=0) -> dict:
    """Random float tensors of the official layout; BatchNorm counters as int64 scalars."""
    rng = np.random.default_rng(seed)
    out = {}
    for key, shape in official_robustsam_shapes(config).items():
        if key.endswith("num_batches_tracked"):
            out[key] = np.asarray(7, np.int64)
        elif key.endswith("running_var"):
            out[key] = rng.uniform(0.5, 1.5, shape).astype(np.float32)
        else:
            out[key] = rng.normal(size=shape).astype(np.float32)
    return out


@pytest.fixture(scope="module")
def tiny_sd():
    return random_state_dict(TINY_CONFIG)


def test_convert_places_and_transposes_every_tensor(tiny_sd):
    params = convert_robustsam(tiny_sd, TINY_CONFIG)
    dec, sd = params["mask_decoder"], tiny_sd
    first = dec["fourier_first_layer_features"]["degradation"]
    np.testing.assert_array_equal(first["selective_conv"]["selector"]["fc"]["kernel"],
                                  sd[SELECTOR + "selector.fc.0.weight"].T)
    np.testing.assert_array_equal(first["selective_conv"]["conv2"]["kernel"],
                                  sd[SELECTOR + "conv2.weight"].transpose(2, 3, 1, 0))
    np.testing.assert_array_equal(first["selective_conv"]["bn"]["var"], sd[SELECTOR + "BN.running_var"])
    np.testing.assert_array_equal(
        first["fourier"]["conv"]["kernel"],
        sd["mask_decoder.fourier_first_layer_features.fgm_block.conv_layer.weight"][:, :, 0, 0].T)
    np.testing.assert_array_equal(
        dec["fourier_last_layer_features"]["upsample"]["upscale2"]["kernel"],
        sd["mask_decoder.fourier_last_layer_features.upsample_layer.3.weight"].transpose(2, 3, 0, 1))
    np.testing.assert_array_equal(
        dec["fourier_mask_features"]["downsample"]["norm"]["scale"],
        sd["mask_decoder.fourier_mask_features.downsample_layer.1.weight"])
    np.testing.assert_array_equal(
        dec["fourier_mask_features"]["degradation"]["channel_attention"]["lin2"]["kernel"],
        sd["mask_decoder.fourier_mask_features.dnc_block_combined.channel_attention.excitation.2.weight"].T)
    np.testing.assert_array_equal(dec["custom_token_block"]["lin2"]["bias"],
                                  sd["mask_decoder.custom_token_block.mlp.2.bias"])
    np.testing.assert_array_equal(dec["custom_robust_token"], sd["mask_decoder.custom_robust_token.weight"])
    np.testing.assert_array_equal(dec["output_hypernetworks_mlps_3"]["layers_2"]["kernel"],
                                  sd["mask_decoder.output_hypernetworks_mlps.3.layers.2.weight"].T)
    floats = sum(v.size for k, v in sd.items() if not k.endswith("num_batches_tracked"))
    assert sum(v.size for v in traverse_util.flatten_dict(params).values()) == floats


def test_both_decoder_paths_hold_the_same_parameters():
    clear = RobustSamSegmenter(with_decoder_path(TINY_CONFIG, "clear")).param_shapes()
    robust = RobustSamSegmenter(with_decoder_path(TINY_CONFIG, "robust")).param_shapes()
    assert traverse_util.flatten_dict(clear).keys() == traverse_util.flatten_dict(robust).keys()


def test_a_data_parallel_prefix_is_stripped(tiny_sd):
    prefixed = {f"module.{k}": v for k, v in tiny_sd.items()}
    a = traverse_util.flatten_dict(convert_robustsam(prefixed, TINY_CONFIG))
    b = traverse_util.flatten_dict(convert_robustsam(tiny_sd, TINY_CONFIG))
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    half = dict(tiny_sd, **{"module.extra": np.zeros(1, np.float32)})
    with pytest.raises(PortError, match="wrapper prefix 'module.'"):
        convert_robustsam(half, TINY_CONFIG)


@pytest.mark.parametrize("edit, match", [
    ("missing", "key 'mask_decoder.robust_mlp.layers.2.bias' is missing"),
    ("extra", "key 'mask_decoder.robust_head.weight' is not part"),
    ("misshaped", f"key '{SELECTOR}selector.att_conv1.bias' has shape"),
    ("counter", f"'{COUNTER}' must be an integer scalar"),
    ("negative_var", "negative running variances"),
    ("nonfinite", "key 'mask_decoder.robust_mlp.layers.0.bias' contains non-finite"),
])
def test_strict_errors_name_the_key(tiny_sd, edit, match):
    sd = dict(tiny_sd)
    if edit == "missing":
        del sd["mask_decoder.robust_mlp.layers.2.bias"]
    elif edit == "extra":
        sd["mask_decoder.robust_head.weight"] = np.zeros((2, 2), np.float32)
    elif edit == "misshaped":
        sd[SELECTOR + "selector.att_conv1.bias"] = np.zeros((3,), np.float32)
    elif edit == "counter":
        sd[COUNTER] = np.asarray(7.0, np.float32)
    elif edit == "negative_var":
        sd[SELECTOR + "BN.running_var"] = -np.ones_like(sd[SELECTOR + "BN.running_var"])
    else:
        sd["mask_decoder.robust_mlp.layers.0.bias"] = np.full((64,), np.nan, np.float32)
    with pytest.raises(PortError, match=match):
        convert_robustsam(sd, TINY_CONFIG, what="ckpt")


def test_sam_and_robustsam_checkpoints_are_sent_to_their_ports(tiny_sd):
    with pytest.raises(PortError, match="RobustSAM checkpoint.*python -m ports robustsam"):
        convert_sam(tiny_sd, SAM_TINY_CONFIG)
    sam_sd = {k: np.zeros(s, np.float32) for k, s in
              official_robustsam_shapes(TINY_CONFIG).items()
              if k.startswith(("image_encoder.", "prompt_encoder."))}
    with pytest.raises(PortError, match="SAM \\(ViT\\) checkpoint.*python -m ports sam`"):
        convert_robustsam(sam_sd, TINY_CONFIG)


def test_variant_inference_on_official_shapes():
    for name, config in ROBUSTSAM_CONFIGS.items():
        shapes = {k: np.broadcast_to(np.float32(0), s)
                  for k, s in official_robustsam_shapes(config).items() if k.startswith("image_encoder.")}
        assert infer_variant(shapes) == name


def test_config_round_trip_and_its_checks():
    for config in (*ROBUSTSAM_CONFIGS.values(), TINY_CONFIG):
        assert RobustSamConfig.from_dict(config.to_dict()) == config
    assert TINY_CONFIG.robust and not ROBUSTSAM_CONFIGS["vit_b"].robust
    assert ROBUSTSAM_CONFIGS["vit_h"].vit_dim == 1280
    with pytest.raises(ValueError, match="decoder_path must be one of"):
        with_decoder_path(TINY_CONFIG, "degraded")
    with pytest.raises(ValueError, match="channel attention"):
        RobustSamConfig(**{f: getattr(SAM_TINY_CONFIG, f) for f in
                           ("encoder", "image_size", "embedding_size", "prompt_embed_dim",
                            "mask_in_chans", "decoder")})
    with pytest.raises(ValueError, match="multiple of 4"):
        check_robust_shapes(256, 768, 6, 4)


def test_the_port_command_is_listed_with_its_decoder_path_flag(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["robustsam", "--help"])
    out = capsys.readouterr().out
    assert "--decoder-path {clear,robust}" in out and "robustsam_checkpoint_" in out
