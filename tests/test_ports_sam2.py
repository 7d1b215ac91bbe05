"""Tests of the strict SAM 2 checkpoint port (ports/sam2.py).

Default tests work on numpy state dicts laid out as the official checkpoint
(`official_sam2_image_shapes` plus video keys); writing and reading a real
``.pt`` through the CLI needs torch and is parity-marked.
"""

from __future__ import annotations

import numpy as np
import pytest
from flax import traverse_util

from jaxseg_robust.models.sam2.config import TEST_CONFIG, official_config
from ports.keytable import PortError
from ports.sam import official_sam_shapes
from ports.sam2 import (SKIPPED_FILE, convert_sam2, infer_variant, infer_version,
                        official_sam2_image_shapes, split_video_keys)

VIDEO_KEYS = {"memory_attention.layers.0.self_attn.q_proj.weight": (8, 8),
              "memory_encoder.out_proj.weight": (4, 8, 1, 1), "maskmem_tpos_enc": (7, 1, 1, 4),
              "no_mem_pos_enc": (1, 1, 8), "obj_ptr_proj.layers.0.weight": (8, 8),
              "no_obj_ptr": (1, 8), "mask_downsample.weight": (1, 1, 4, 4)}
VIDEO_KEYS_2_1 = {**VIDEO_KEYS, "no_obj_embed_spatial": (1, 4), "obj_ptr_tpos_proj.weight": (4, 8)}


def state_dict(config, video=VIDEO_KEYS_2_1, seed=0) -> dict:
    rng = np.random.default_rng(seed)
    shapes = {**official_sam2_image_shapes(config), **video}
    return {k: rng.normal(size=s).astype(np.float32) for k, s in shapes.items()}


def shapes_only(config, video=VIDEO_KEYS_2_1) -> dict:
    shapes = {**official_sam2_image_shapes(config), **video}
    return {k: np.broadcast_to(np.float32(0), s) for k, s in shapes.items()}


@pytest.fixture(scope="module")
def test_sd():
    return state_dict(TEST_CONFIG)


def test_convert_places_transposes_and_skips_by_name(test_sd):
    params, skipped = convert_sam2(test_sd, TEST_CONFIG)
    sd, trunk = test_sd, params["image_encoder"]["trunk"]
    np.testing.assert_array_equal(trunk["pos_embed"],
                                  sd["image_encoder.trunk.pos_embed"][0].transpose(1, 2, 0))
    np.testing.assert_array_equal(trunk["blocks_1"]["proj"]["kernel"],
                                  sd["image_encoder.trunk.blocks.1.proj.weight"].T)
    np.testing.assert_array_equal(trunk["blocks_3"]["mlp"]["layers_1"]["kernel"],
                                  sd["image_encoder.trunk.blocks.3.mlp.layers.1.weight"].T)
    np.testing.assert_array_equal(params["image_encoder"]["neck"]["convs_0"]["kernel"][0, 0],
                                  sd["image_encoder.neck.convs.0.conv.weight"][:, :, 0, 0].T)
    dec = params["mask_decoder"]
    np.testing.assert_array_equal(dec["conv_s1"]["kernel"],
                                  sd["sam_mask_decoder.conv_s1.weight"][:, :, 0, 0].T)
    np.testing.assert_array_equal(dec["transformer"]["layers_1"]["mlp"]["lin2"]["kernel"],
                                  sd["sam_mask_decoder.transformer.layers.1.mlp.layers.1.weight"].T)
    np.testing.assert_array_equal(dec["pred_obj_score_head"]["layers_2"]["bias"],
                                  sd["sam_mask_decoder.pred_obj_score_head.layers.2.bias"])
    np.testing.assert_array_equal(params["no_mem_embed"], sd["no_mem_embed"].reshape(-1))
    used = sum(v.size for v in traverse_util.flatten_dict(params).values())
    assert used == sum(v.size for k, v in sd.items() if k not in VIDEO_KEYS_2_1)
    assert sorted(k for keys in skipped.values() for k in keys) == sorted(VIDEO_KEYS_2_1)
    assert "memory attention" in skipped and "no-object spatial embedding (2.1)" in skipped


def test_unknown_missing_and_misshaped_keys_are_named(test_sd):
    with pytest.raises(PortError, match="'sam_mask_decoder.extra_head.weight'"):
        convert_sam2({**test_sd, "sam_mask_decoder.extra_head.weight": np.zeros((2, 2))},
                     TEST_CONFIG)
    broken = dict(test_sd)
    del broken["image_encoder.trunk.blocks.2.attn.qkv.bias"]
    with pytest.raises(PortError, match="'image_encoder.trunk.blocks.2.attn.qkv.bias' is missing"):
        convert_sam2(broken, TEST_CONFIG)
    broken = {**test_sd, "no_mem_embed": np.zeros((1, 1, 16), np.float32)}
    with pytest.raises(PortError, match="'no_mem_embed' has shape"):
        convert_sam2(broken, TEST_CONFIG)
    with pytest.raises(PortError, match="non-finite"):
        convert_sam2({**test_sd, "no_mem_embed": np.full((1, 1, 32), np.nan, np.float32)},
                     TEST_CONFIG)


def test_sam1_checkpoint_is_refused_with_its_port():
    from jaxseg_robust.models.sam.registry import TINY_CONFIG
    sam1 = {k: np.zeros(s, np.float32) for k, s in official_sam_shapes(TINY_CONFIG).items()}
    with pytest.raises(PortError, match="python -m ports sam`"):
        convert_sam2(sam1, TEST_CONFIG)
    with pytest.raises(PortError, match="not an official SAM 2"):
        infer_variant(sam1)


@pytest.mark.parametrize("variant", ["hiera_tiny", "hiera_small", "hiera_base_plus",
                                     "hiera_large"])
def test_variant_and_version_inference(variant):
    config = official_config(variant, "2.1")
    assert infer_variant(shapes_only(config)) == variant
    assert infer_version(shapes_only(config)) == "2.1"
    assert infer_version(shapes_only(config, VIDEO_KEYS)) == "2"
    with pytest.raises(PortError, match="pass --version"):
        infer_version(shapes_only(config, {}))


def test_split_video_keys_keeps_image_path():
    image, skipped = split_video_keys({"no_mem_embed": 1, "no_mem_pos_enc": 2,
                                       "memory_encoder.x.weight": 3})
    assert image == {"no_mem_embed": 1}
    assert skipped == {"no-memory position encoding": ["no_mem_pos_enc"],
                       "memory encoder": ["memory_encoder.x.weight"]}


@pytest.mark.parity
def test_cli_round_trip(tmp_path, capsys):
    torch = pytest.importorskip("torch")
    import jax

    from jaxseg_robust.models import zoo
    from ports.__main__ import main as ports_main

    config = official_config("hiera_tiny", "2")
    sd = state_dict(config, VIDEO_KEYS)
    ckpt = tmp_path / "sam2_hiera_tiny.pt"
    torch.save({"model": {k: torch.from_numpy(v) for k, v in sd.items()}}, ckpt)
    out = tmp_path / "converted"
    assert ports_main(["sam2", "--checkpoint", str(ckpt), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "SAM 2 hiera_tiny: skipped 7 video-only keys" in printed and "memory attention" in printed
    listed = (out / SKIPPED_FILE).read_text().splitlines()[1:]
    assert sorted(line.split("\t")[0] for line in listed) == sorted(VIDEO_KEYS)
    seg, params, meta = zoo.load_params(out)
    assert meta["variant"] == "hiera_tiny" and seg.config.version == "2"
    np.testing.assert_array_equal(np.asarray(params["no_mem_embed"]), sd["no_mem_embed"][0, 0])
    assert ports_main(["sam2", "--checkpoint", str(ckpt), "--out", str(out)]) == 2  # exists
    del jax
