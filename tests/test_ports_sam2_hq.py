"""Tests of the strict HQ-SAM 2 checkpoint port (ports/sam2_hq.py) on the tiny config.

Default tests work on numpy state dicts laid out as the official checkpoint
(`official_sam2_hq_image_shapes` plus video keys); writing and reading a real
``.pt`` through the CLI needs torch and is parity-marked.
"""

from __future__ import annotations

import numpy as np
import pytest
from flax import traverse_util

from jaxseg_robust.models.sam2.config import HQ_TEST_CONFIG, TEST_CONFIG, official_hq_config
from ports.keytable import PortError
from ports.sam import official_sam_shapes
from ports.sam2 import SKIPPED_FILE, convert_sam2, official_sam2_image_shapes
from ports.sam2_hq import convert_sam2_hq, official_sam2_hq_image_shapes, sam2_hq_rules

VIDEO_KEYS_2_1 = {"memory_attention.layers.0.self_attn.q_proj.weight": (8, 8),
                  "memory_encoder.out_proj.weight": (4, 8, 1, 1), "maskmem_tpos_enc": (7, 1, 1, 4),
                  "no_mem_pos_enc": (1, 1, 8), "obj_ptr_proj.layers.0.weight": (8, 8),
                  "no_obj_ptr": (1, 8), "mask_downsample.weight": (1, 1, 4, 4),
                  "no_obj_embed_spatial": (1, 4), "obj_ptr_tpos_proj.weight": (4, 8)}
HQ_KEYS = {  # the tiny config's decoder width is 32: C/8 = 4, C/4 = 8
    "sam_mask_decoder.hf_token.weight": (1, 32),
    "sam_mask_decoder.hf_mlp.layers.0.weight": (32, 32), "sam_mask_decoder.hf_mlp.layers.0.bias": (32,),
    "sam_mask_decoder.hf_mlp.layers.1.weight": (32, 32), "sam_mask_decoder.hf_mlp.layers.1.bias": (32,),
    "sam_mask_decoder.hf_mlp.layers.2.weight": (4, 32), "sam_mask_decoder.hf_mlp.layers.2.bias": (4,),
    "sam_mask_decoder.embedding_maskfeature.0.weight": (8, 4, 3, 3),
    "sam_mask_decoder.embedding_maskfeature.0.bias": (8,),
    "sam_mask_decoder.embedding_maskfeature.1.weight": (8,),
    "sam_mask_decoder.embedding_maskfeature.1.bias": (8,),
    "sam_mask_decoder.embedding_maskfeature.3.weight": (4, 8, 3, 3),
    "sam_mask_decoder.embedding_maskfeature.3.bias": (4,),
}


def state_dict(config, video=VIDEO_KEYS_2_1, seed=0) -> dict:
    rng = np.random.default_rng(seed)
    shapes = {**official_sam2_hq_image_shapes(config), **video}
    return {k: rng.normal(size=s).astype(np.float32) for k, s in shapes.items()}


@pytest.fixture(scope="module")
def test_sd():
    return state_dict(HQ_TEST_CONFIG)


def test_official_layout_is_sam2_plus_the_hq_token():
    shapes = official_sam2_hq_image_shapes(HQ_TEST_CONFIG)
    sam2 = official_sam2_image_shapes(TEST_CONFIG)
    assert {k: v for k, v in shapes.items() if k not in sam2} == HQ_KEYS
    assert set(sam2) <= set(shapes)
    large = official_sam2_hq_image_shapes(official_hq_config("hiera_large"))
    assert large["sam_mask_decoder.embedding_maskfeature.0.weight"] == (64, 32, 3, 3)
    assert large["sam_mask_decoder.hf_mlp.layers.2.weight"] == (32, 256)


def test_convert_places_and_transposes_the_hq_token(test_sd):
    params, skipped = convert_sam2_hq(test_sd, HQ_TEST_CONFIG)
    dec, sd = params["mask_decoder"], test_sd
    np.testing.assert_array_equal(dec["hf_token"], sd["sam_mask_decoder.hf_token.weight"])
    np.testing.assert_array_equal(dec["hf_mlp"]["layers_2"]["kernel"],
                                  sd["sam_mask_decoder.hf_mlp.layers.2.weight"].T)
    np.testing.assert_array_equal(dec["embedding_maskfeature"]["conv1"]["kernel"],
                                  sd["sam_mask_decoder.embedding_maskfeature.0.weight"].transpose(2, 3, 1, 0))
    np.testing.assert_array_equal(dec["embedding_maskfeature"]["norm"]["scale"],
                                  sd["sam_mask_decoder.embedding_maskfeature.1.weight"])
    np.testing.assert_array_equal(dec["embedding_maskfeature"]["conv2"]["bias"],
                                  sd["sam_mask_decoder.embedding_maskfeature.3.bias"])
    np.testing.assert_array_equal(dec["conv_s0"]["kernel"],
                                  sd["sam_mask_decoder.conv_s0.weight"][:, :, 0, 0].T)
    used = sum(v.size for v in traverse_util.flatten_dict(params).values())
    assert used == sum(v.size for k, v in sd.items() if k not in VIDEO_KEYS_2_1)
    assert sorted(k for keys in skipped.values() for k in keys) == sorted(VIDEO_KEYS_2_1)


def test_every_hq_key_has_exactly_one_rule():
    rules = sam2_hq_rules()
    for key in HQ_KEYS:
        assert sum(rule.match(key) is not None for rule in rules) == 1, key


def test_missing_misshaped_and_unknown_hq_keys_are_named(test_sd):
    broken = dict(test_sd)
    del broken["sam_mask_decoder.embedding_maskfeature.3.weight"]
    with pytest.raises(PortError, match="'sam_mask_decoder.embedding_maskfeature.3.weight' is missing"):
        convert_sam2_hq(broken, HQ_TEST_CONFIG)
    broken = {**test_sd, "sam_mask_decoder.hf_mlp.layers.2.weight": np.zeros((8, 32), np.float32)}
    with pytest.raises(PortError, match="'sam_mask_decoder.hf_mlp.layers.2.weight' has shape"):
        convert_sam2_hq(broken, HQ_TEST_CONFIG)
    # SAM-HQ (1)'s fused early-feature modules are not part of HQ-SAM 2
    extra = {**test_sd, "sam_mask_decoder.compress_vit_feat.0.weight": np.zeros((8, 32, 2, 2))}
    with pytest.raises(PortError, match="'sam_mask_decoder.compress_vit_feat.0.weight'"):
        convert_sam2_hq(extra, HQ_TEST_CONFIG)


def test_sam2_and_hq_checkpoints_are_refused_by_the_other_port_with_its_name(test_sd):
    plain = {k: v for k, v in test_sd.items() if k not in HQ_KEYS}
    with pytest.raises(PortError, match="python -m ports sam2`"):
        convert_sam2_hq(plain, HQ_TEST_CONFIG)
    with pytest.raises(PortError, match="python -m ports sam2_hq`"):
        convert_sam2(test_sd, TEST_CONFIG)
    from jaxseg_robust.models.sam.registry import TINY_CONFIG
    sam1 = {k: np.zeros(s, np.float32) for k, s in official_sam_shapes(TINY_CONFIG).items()}
    with pytest.raises(PortError, match="python -m ports sam`"):
        convert_sam2_hq(sam1, HQ_TEST_CONFIG)


@pytest.mark.parity
def test_cli_round_trip(tmp_path, capsys):
    torch = pytest.importorskip("torch")

    from jaxseg_robust.models import zoo
    from jaxseg_robust.models.sam2.config import official_config
    from ports.__main__ import main as ports_main

    config = official_hq_config("hiera_tiny")  # the port accepts any SAM 2.1 trunk
    sd = state_dict(config)
    ckpt = tmp_path / "sam2.1_hq_hiera_tiny.pt"
    torch.save({"model": {k: torch.from_numpy(v) for k, v in sd.items()}}, ckpt)
    out = tmp_path / "converted"
    assert ports_main(["sam2_hq", "--checkpoint", str(ckpt), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "HQ-SAM 2 hiera_tiny: skipped 9 video-only keys" in printed
    listed = (out / SKIPPED_FILE).read_text().splitlines()[1:]
    assert sorted(line.split("\t")[0] for line in listed) == sorted(VIDEO_KEYS_2_1)
    seg, params, meta = zoo.load_params(out)
    assert type(seg).__name__ == "Sam2HQSegmenter" and meta["family"] == "sam2_hq"
    assert seg.config.encoder == official_config("hiera_tiny", "2.1").encoder
    np.testing.assert_array_equal(np.asarray(params["mask_decoder"]["hf_token"]),
                                  sd["sam_mask_decoder.hf_token.weight"])
    plain = tmp_path / "sam2.1_hiera_tiny.pt"
    torch.save({"model": {k: torch.from_numpy(v) for k, v in sd.items() if k not in HQ_KEYS}}, plain)
    assert ports_main(["sam2_hq", "--checkpoint", str(plain), "--out", str(tmp_path / "x")]) == 2
    assert "python -m ports sam2`" in capsys.readouterr().err
