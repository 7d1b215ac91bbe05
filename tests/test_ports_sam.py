"""Tests of the strict SAM checkpoint port (ports/sam.py), the store and the CLI.

Default tests work on numpy state dicts laid out as the official checkpoint
(`official_sam_shapes`); tests that read or write real ``.pth`` files need
torch and are parity-marked.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from jaxseg_robust.models.sam.registry import SAM_CONFIGS, TINY_CONFIG
from jaxseg_robust.models import store
from ports.__main__ import main as ports_main
from ports.keytable import PortError
from ports.sam import convert_sam, infer_variant, official_sam_shapes


def random_state_dict(config, seed=0) -> dict:
    rng = np.random.default_rng(seed)
    return {k: rng.normal(size=shape).astype(np.float32)
            for k, shape in official_sam_shapes(config).items()}


def shapes_only(config) -> dict:
    """Zero-stride arrays of the official shapes (no memory), for variant inference."""
    return {k: np.broadcast_to(np.float32(0), s) for k, s in official_sam_shapes(config).items()}


@pytest.fixture(scope="module")
def tiny_sd():
    return random_state_dict(TINY_CONFIG)


def test_convert_places_and_transposes_every_tensor(tiny_sd):
    params = convert_sam(tiny_sd, TINY_CONFIG)
    enc, pe, dec = params["image_encoder"], params["prompt_encoder"], params["mask_decoder"]
    sd = tiny_sd
    np.testing.assert_array_equal(enc["blocks_1"]["attn"]["qkv"]["kernel"],
                                  sd["image_encoder.blocks.1.attn.qkv.weight"].T)
    np.testing.assert_array_equal(enc["patch_embed"]["proj"]["kernel"],
                                  sd["image_encoder.patch_embed.proj.weight"].transpose(2, 3, 1, 0))
    np.testing.assert_array_equal(enc["blocks_0"]["attn"]["rel_pos_h"],
                                  sd["image_encoder.blocks.0.attn.rel_pos_h"])
    np.testing.assert_array_equal(enc["neck"]["norm2"]["scale"], sd["image_encoder.neck.3.weight"])
    np.testing.assert_array_equal(pe["mask_downscaling"]["proj"]["kernel"],
                                  sd["prompt_encoder.mask_downscaling.6.weight"][:, :, 0, 0].T)
    np.testing.assert_array_equal(pe["point_embeddings_3"], sd["prompt_encoder.point_embeddings.3.weight"])
    np.testing.assert_array_equal(dec["output_upscaling"]["upscale2"]["kernel"],
                                  sd["mask_decoder.output_upscaling.3.weight"].transpose(2, 3, 0, 1))
    np.testing.assert_array_equal(
        dec["transformer"]["layers_1"]["norm4"]["bias"],
        sd["mask_decoder.transformer.layers.1.norm4.bias"])
    np.testing.assert_array_equal(
        dec["output_hypernetworks_mlps_2"]["layers_1"]["kernel"],
        sd["mask_decoder.output_hypernetworks_mlps.2.layers.1.weight"].T)
    n_params = sum(v.size for v in sd.values())
    from flax import traverse_util
    assert sum(v.size for v in traverse_util.flatten_dict(params).values()) == n_params


def test_round_trip_through_the_store(tiny_sd, tmp_path):
    params = convert_sam(tiny_sd, TINY_CONFIG)
    source = tmp_path / "fake.pth"
    source.write_bytes(b"not really a checkpoint")
    out = store.save(tmp_path / "model", params, family="sam", variant="tiny",
                     config=TINY_CONFIG.to_dict(), source_path=source)
    loaded, meta = store.load(out)
    from flax import traverse_util
    flat_a = traverse_util.flatten_dict(params)
    flat_b = traverse_util.flatten_dict(loaded)
    assert flat_a.keys() == flat_b.keys()
    for k in flat_a:
        np.testing.assert_array_equal(flat_a[k], flat_b[k])
    assert meta["family"] == "sam" and meta["variant"] == "tiny"
    assert meta["config"] == json.loads(json.dumps(TINY_CONFIG.to_dict()))
    import hashlib
    assert meta["source"]["sha256"] == hashlib.sha256(b"not really a checkpoint").hexdigest()
    with pytest.raises(store.StoreError, match="already holds"):
        store.save(out, params, family="sam", variant="tiny", config=TINY_CONFIG.to_dict())
    store.save(out, params, family="sam", variant="tiny", config=TINY_CONFIG.to_dict(),
               overwrite=True)


def test_store_rejects_damaged_directories(tmp_path):
    with pytest.raises(store.StoreError, match="not found"):
        store.read_meta(tmp_path / "nope")
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(store.StoreError, match="invalid JSON"):
        store.read_meta(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"format_version": 99, "family": "sam",
                                                      "variant": "x", "config": {}}))
    with pytest.raises(store.StoreError, match="format_version"):
        store.read_meta(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"format_version": 1, "family": "sam",
                                                      "variant": "x", "config": {}}))
    with pytest.raises(store.StoreError, match="params"):
        store.load(tmp_path)


@pytest.mark.parametrize("edit, match", [
    ("missing", "key 'mask_decoder.iou_token.weight' is missing"),
    ("extra", "key 'mask_decoder.extra_head.weight' is not part"),
    ("misshaped", "key 'image_encoder.blocks.0.attn.rel_pos_w' has shape"),
    ("nonfloat", "key 'prompt_encoder.no_mask_embed.weight' has dtype"),
    ("nonfinite", "key 'mask_decoder.mask_tokens.weight' contains non-finite"),
])
def test_strict_errors_name_the_key(tiny_sd, edit, match):
    sd = dict(tiny_sd)
    if edit == "missing":
        del sd["mask_decoder.iou_token.weight"]
    elif edit == "extra":
        sd["mask_decoder.extra_head.weight"] = np.zeros((2, 2), np.float32)
    elif edit == "misshaped":
        sd["image_encoder.blocks.0.attn.rel_pos_w"] = np.zeros((3, 16), np.float32)
    elif edit == "nonfloat":
        sd["prompt_encoder.no_mask_embed.weight"] = np.zeros((1, 32), np.int64)
    else:
        sd["mask_decoder.mask_tokens.weight"] = np.full((4, 32), np.nan, np.float32)
    with pytest.raises(PortError, match=match):
        convert_sam(sd, TINY_CONFIG, what="ckpt")


def test_wrong_family_checkpoint_is_rejected(tiny_sd):
    # MobileSAM-like: a TinyViT image encoder with SAM's prompt encoder and decoder.
    sd = {k: v for k, v in tiny_sd.items() if not k.startswith("image_encoder.")}
    sd["image_encoder.patch_embed.seq.0.c.weight"] = np.zeros((32, 3, 3, 3), np.float32)
    sd["image_encoder.layers.0.blocks.0.mlp.fc1.weight"] = np.zeros((64, 32), np.float32)
    with pytest.raises(PortError, match="image_encoder.patch_embed.proj.weight' is missing"):
        infer_variant(sd)
    with pytest.raises(PortError, match="key 'image_encoder.patch_embed.seq.0.c.weight'"):
        convert_sam(sd, TINY_CONFIG)


def test_infer_variant_from_shapes():
    for name, config in SAM_CONFIGS.items():
        assert infer_variant(shapes_only(config)) == name
    mixed = shapes_only(SAM_CONFIGS["vit_l"])  # ViT-L depth with a ViT-B width
    mixed["image_encoder.patch_embed.proj.weight"] = np.broadcast_to(np.float32(0), (768, 3, 16, 16))
    with pytest.raises(PortError, match="ambiguous"):
        infer_variant(mixed)


def test_cli_failures_exit_2(tmp_path, capsys):
    assert ports_main([]) == 2
    code = ports_main(["sam", "--checkpoint", str(tmp_path / "missing.pth"),
                       "--out", str(tmp_path / "out")])
    assert code == 2 and "missing.pth" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        ports_main(["sam", "--checkpoint", "x.pth", "--out", "y", "--variant", "vit_q"])


def test_cli_survives_a_broken_family_module(monkeypatch, capsys):
    import ports.__main__ as cli

    monkeypatch.setattr(cli, "FAMILY_MODULES", ("sam", "no_such_family"))
    assert cli.main(["no_such_family", "--checkpoint", "x.pth"]) == 2
    assert "'no_such_family' port cannot be loaded" in capsys.readouterr().err
    assert cli.main(["sam", "--checkpoint", "missing.pth", "--out", "o"]) == 2


# ---- with torch: real .pth files ------------------------------------------------


def _official_tiny_model(torch):
    """The official modules at TINY_CONFIG's sizes, every tensor randomised."""
    import functools

    from segment_anything.modeling import (ImageEncoderViT, MaskDecoder, PromptEncoder, Sam,
                                           TwoWayTransformer)

    cfg, vit = TINY_CONFIG, TINY_CONFIG.encoder
    model = Sam(
        image_encoder=ImageEncoderViT(
            depth=vit.depth, embed_dim=vit.embed_dim, img_size=vit.img_size, mlp_ratio=4,
            norm_layer=functools.partial(torch.nn.LayerNorm, eps=1e-6), num_heads=vit.num_heads,
            patch_size=vit.patch_size, qkv_bias=True, use_rel_pos=True,
            global_attn_indexes=list(vit.global_attn_indexes), window_size=vit.window_size,
            out_chans=vit.out_chans),
        prompt_encoder=PromptEncoder(
            embed_dim=cfg.prompt_embed_dim, image_embedding_size=(cfg.embedding_size,) * 2,
            input_image_size=(cfg.image_size,) * 2, mask_in_chans=cfg.mask_in_chans),
        mask_decoder=MaskDecoder(
            num_multimask_outputs=3, transformer_dim=cfg.prompt_embed_dim, iou_head_depth=3,
            iou_head_hidden_dim=cfg.decoder.iou_head_hidden_dim,
            transformer=TwoWayTransformer(depth=2, embedding_dim=cfg.prompt_embed_dim,
                                          mlp_dim=cfg.decoder.transformer_mlp_dim,
                                          num_heads=cfg.decoder.transformer_num_heads)),
    ).eval()
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for tensor in model.state_dict().values():
            tensor.copy_(torch.randn(tensor.shape, generator=gen) * 0.2)
    return model


@pytest.mark.parity
def test_cli_ports_a_real_checkpoint_and_rejects_damaged_files(tmp_path, capsys):
    torch = pytest.importorskip("torch")
    pytest.importorskip("segment_anything")
    model = _official_tiny_model(torch)
    ckpt = tmp_path / "tiny.pth"
    torch.save(model.state_dict(), ckpt)
    assert {k: tuple(v.shape) for k, v in model.state_dict().items()} == \
        official_sam_shapes(TINY_CONFIG)
    # variant inference covers the official variants only: pass the tiny config explicitly
    from ports.sam import convert_sam as convert
    from ports.torch_checkpoint import load_state_dict
    params = convert(load_state_dict(ckpt), TINY_CONFIG)
    np.testing.assert_array_equal(
        params["mask_decoder"]["iou_token"], model.mask_decoder.iou_token.weight.detach().numpy())
    code = ports_main(["sam", "--checkpoint", str(ckpt), "--out", str(tmp_path / "o")])
    assert code == 2 and "cannot infer the SAM variant" in capsys.readouterr().err

    truncated = tmp_path / "truncated.pth"
    data = ckpt.read_bytes()
    truncated.write_bytes(data[: len(data) // 2])
    corrupt = tmp_path / "corrupt.pth"
    corrupt.write_bytes(np.random.default_rng(0).bytes(4096))
    for bad in (truncated, corrupt):
        code = ports_main(["sam", "--checkpoint", str(bad), "--out", str(tmp_path / "o")])
        err = capsys.readouterr().err
        assert code == 2 and str(bad) in err and "not a readable PyTorch checkpoint" in err
    sd = model.state_dict()
    sd.pop("mask_decoder.mask_tokens.weight")
    torch.save(sd, tmp_path / "missing.pth")
    with pytest.raises(PortError, match="mask_decoder.mask_tokens.weight"):
        convert(load_state_dict(tmp_path / "missing.pth"), TINY_CONFIG)


@pytest.mark.parity
def test_cli_end_to_end_vit_b_and_mobile_sam_is_rejected(tmp_path, capsys):
    torch = pytest.importorskip("torch")
    sam = pytest.importorskip("segment_anything")
    ckpt = tmp_path / "sam_vit_b.pth"
    model = sam.sam_model_registry["vit_b"]()
    torch.save(model.state_dict(), ckpt)
    out = tmp_path / "sam_vit_b"
    assert ports_main(["sam", "--checkpoint", str(ckpt), "--out", str(out)]) == 0
    params, meta = store.load(out)
    assert meta["variant"] == "vit_b" and meta["source"]["bytes"] == os.path.getsize(ckpt)
    np.testing.assert_array_equal(
        params["image_encoder"]["blocks_11"]["mlp"]["lin2"]["kernel"],
        model.image_encoder.blocks[11].mlp.lin2.weight.detach().numpy().T)
    del model, params
    mobile = pytest.importorskip("mobile_sam")
    mobile_ckpt = tmp_path / "mobile_sam.pth"
    torch.save(mobile.sam_model_registry["vit_t"]().state_dict(), mobile_ckpt)
    code = ports_main(["sam", "--checkpoint", str(mobile_ckpt), "--out", str(tmp_path / "m")])
    assert code == 2 and "image_encoder.patch_embed.proj.weight" in capsys.readouterr().err
    code = ports_main(["sam", "--checkpoint", str(mobile_ckpt), "--out", str(tmp_path / "m"),
                       "--variant", "vit_b"])
    assert code == 2 and "key 'image_encoder." in capsys.readouterr().err


@pytest.mark.parity
@pytest.mark.parametrize("variant", ["vit_b", "vit_l", "vit_h"])
def test_official_shapes_match_the_reference_builders(variant):
    torch = pytest.importorskip("torch")
    sam = pytest.importorskip("segment_anything")
    with torch.device("meta"):
        model = sam.sam_model_registry[variant]()
    got = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    assert got == official_sam_shapes(SAM_CONFIGS[variant])
