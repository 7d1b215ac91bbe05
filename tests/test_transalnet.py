"""TranSalNet (tiny configuration): the port's key table, the zoo entries, and the SM click model.

The SM construction (`SaliencyClickModel.clickability`, RClicks' Appendix B.2 / the authors'
``SaliencyModel``) is checked against `restated_sm`, a NumPy restatement of the authors'
steps on a fixed saliency map: crop the grown bounding box by slicing, grey outside the
region, letterbox, un-letterbox, multiply, normalise, paste. Its resizes are either the
float OpenCV-rule resize with 8-bit rounding (the library's arithmetic: equal to float32
precision) or OpenCV's own 8-bit ``cv2.resize`` as the authors run it (within one level).
Parity of the network with the authors' code is in test_transalnet_parity.py.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxseg_robust.clicksim import click_models as CM
from jaxseg_robust.models import store, zoo
from jaxseg_robust.models.clickability.letterbox import resize_linear
from jaxseg_robust.models.saliency import TINY, TRANSALNET_RES, SaliencyClickModel, TranSalNet
from jaxseg_robust.models.saliency import click_model as SM
from ports import __main__ as ports_main
from ports.keytable import PortError
from ports.transalnet import convert_transalnet

cv2 = pytest.importorskip("cv2")


# ---- the authors' state-dict layout, restated ------------------------------------------------

def _bn(prefix: str, channels: int) -> dict:
    return {f"{prefix}.weight": (channels,), f"{prefix}.bias": (channels,), f"{prefix}.running_mean": (channels,),
            f"{prefix}.running_var": (channels,), f"{prefix}.num_batches_tracked": ()}


def _resnet_keys(config) -> dict:
    width = config.resnet_width
    keys = {"encoder.encoder.0.weight": (width, 3, 7, 7), **_bn("encoder.encoder.1", width)}
    in_channels = width
    for stage, blocks in enumerate(config.resnet_blocks):
        planes = width * 2 ** stage
        for j in range(blocks):
            p = f"encoder.encoder.{4 + stage}.{j}"
            block_in = in_channels if j == 0 else planes * 4
            keys.update({f"{p}.conv1.weight": (planes, block_in, 1, 1), **_bn(f"{p}.bn1", planes),
                         f"{p}.conv2.weight": (planes, planes, 3, 3), **_bn(f"{p}.bn2", planes),
                         f"{p}.conv3.weight": (planes * 4, planes, 1, 1), **_bn(f"{p}.bn3", planes * 4)})
            if j == 0:
                keys.update({f"{p}.downsample.0.weight": (planes * 4, block_in, 1, 1),
                             **_bn(f"{p}.downsample.1", planes * 4)})
        in_channels = planes * 4
    return keys


def _trans_encoder_keys(config, k: int, in_channels: int, stride: int) -> dict:
    hidden, mlp = config.hidden_sizes[k - 1], config.hidden_sizes[k - 1] * config.mlp_ratio
    h, w = config.input_hw[0] // stride, config.input_hw[1] // stride
    p = f"decoder.TransEncoder{k}"
    keys = {f"{p}.patch_embeddings.weight": (hidden, in_channels, 1, 1), f"{p}.patch_embeddings.bias": (hidden,),
            f"{p}.position_embeddings": (1, h * w, hidden),
            f"{p}.transformer_encoder.encoder_norm.weight": (hidden,),
            f"{p}.transformer_encoder.encoder_norm.bias": (hidden,)}
    for i in range(config.num_layers[k - 1]):
        b = f"{p}.transformer_encoder.layer.{i}"
        for norm in ("attention_norm", "ffn_norm"):
            keys.update({f"{b}.{norm}.weight": (hidden,), f"{b}.{norm}.bias": (hidden,)})
        for linear in ("query", "key", "value", "out"):
            keys.update({f"{b}.attn.{linear}.weight": (hidden, hidden), f"{b}.attn.{linear}.bias": (hidden,)})
        keys.update({f"{b}.ffn.fc1.weight": (mlp, hidden), f"{b}.ffn.fc1.bias": (mlp,),
                     f"{b}.ffn.fc2.weight": (hidden, mlp), f"{b}.ffn.fc2.bias": (hidden,)})
    return keys


def official_keys(config) -> dict:
    """torch key -> shape of the authors' ``TranSalNet`` state dict, for a configuration."""
    w, (h1, h2, h3), dec = config.resnet_width, config.hidden_sizes, config.decoder_channels
    keys = _resnet_keys(config)
    for k, (channels, stride) in enumerate(((32 * w, 32), (16 * w, 16), (8 * w, 8)), start=1):
        keys.update(_trans_encoder_keys(config, k, channels, stride))
    convs = ((h1, h2), (h2, h3), (h3, dec[0]), (dec[0], dec[1]), (dec[1], dec[2]), (dec[2], dec[3]), (dec[3], 1))
    for i, (cin, cout) in enumerate(convs, start=1):
        keys.update({f"decoder.conv{i}.weight": (cout, cin, 3, 3), f"decoder.conv{i}.bias": (cout,)})
        if i < 7:
            keys.update(_bn(f"decoder.batchnorm{i}", cout))
    return keys


def official_state_dict(config, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    out = {}
    for key, shape in official_keys(config).items():
        if key.endswith("num_batches_tracked"):
            out[key] = np.asarray(7, np.int64)
        elif key.endswith("running_var"):
            out[key] = rng.uniform(0.5, 1.5, shape).astype(np.float32)
        else:
            out[key] = (0.1 * rng.standard_normal(shape)).astype(np.float32)
    return out


# ---- the port -------------------------------------------------------------------------------

def test_key_table_fills_every_variable_in_place():
    state = official_state_dict(TINY)
    variables = convert_transalnet(state, TINY)
    expected = TranSalNet(TINY).variable_shapes()
    assert jax.tree.structure(variables) == jax.tree.structure(expected)
    jax.tree.map(lambda a, e: np.testing.assert_equal(a.shape, e.shape), variables, expected)
    params, stats = variables["params"], variables["batch_stats"]
    np.testing.assert_array_equal(params["backbone"]["conv1"]["kernel"],
                                  state["encoder.encoder.0.weight"].transpose(2, 3, 1, 0))
    np.testing.assert_array_equal(params["backbone"]["layer4_0"]["downsample_conv"]["kernel"],
                                  state["encoder.encoder.7.0.downsample.0.weight"].transpose(2, 3, 1, 0))
    np.testing.assert_array_equal(stats["backbone"]["layer2_0"]["bn3"]["var"],
                                  state["encoder.encoder.5.0.bn3.running_var"])
    block = params["decoder"]["TransEncoder2"]["layer_0"]
    np.testing.assert_array_equal(block["attn"]["value"]["kernel"],
                                  state["decoder.TransEncoder2.transformer_encoder.layer.0.attn.value.weight"].T)
    np.testing.assert_array_equal(block["fc2"]["bias"],
                                  state["decoder.TransEncoder2.transformer_encoder.layer.0.ffn.fc2.bias"])
    np.testing.assert_array_equal(params["decoder"]["TransEncoder3"]["position_embeddings"],
                                  state["decoder.TransEncoder3.position_embeddings"])
    np.testing.assert_array_equal(stats["decoder"]["batchnorm6"]["mean"], state["decoder.batchnorm6.running_mean"])
    np.testing.assert_array_equal(params["decoder"]["conv7"]["kernel"],
                                  state["decoder.conv7.weight"].transpose(2, 3, 1, 0))


def test_released_configuration_has_the_official_key_count():
    keys = official_keys(TRANSALNET_RES)
    flat = jax.tree.leaves(TranSalNet(TRANSALNET_RES).variable_shapes())
    counters = sum(k.endswith("num_batches_tracked") for k in keys)
    assert len(keys) - counters == len(flat)
    assert keys["decoder.TransEncoder1.position_embeddings"] == (1, 9 * 12, 768)
    assert keys["decoder.TransEncoder3.position_embeddings"] == (1, 36 * 48, 512)


@pytest.mark.parametrize("change, message", [
    (lambda s: s.update({"decoder.conv8.weight": np.zeros((1, 1, 3, 3), np.float32)}), "decoder.conv8.weight"),
    (lambda s: s.pop("decoder.TransEncoder1.transformer_encoder.layer.0.attn.out.bias"), "attn/out/bias"),
    (lambda s: s.update({"decoder.conv2.weight": np.zeros((8, 8, 3, 3), np.float32)}), "decoder.conv2.weight"),
    (lambda s: s.pop("decoder.batchnorm2.num_batches_tracked"), "decoder.batchnorm2"),
])
def test_key_table_is_strict(change, message):
    state = official_state_dict(TINY)
    change(state)
    with pytest.raises(PortError, match=message):
        convert_transalnet(state, TINY)


def test_port_command_and_the_converted_directory(tmp_path, monkeypatch, capsys):
    torch = pytest.importorskip("torch")
    from ports.transalnet import port_transalnet

    state = official_state_dict(TINY)
    checkpoint = tmp_path / "TranSalNet_Res.pth"
    torch.save({k: torch.from_numpy(np.asarray(v)) for k, v in state.items()}, checkpoint)
    out = port_transalnet(checkpoint, tmp_path / "tiny", config=TINY)
    loaded = CM.load_click_model(out)
    assert isinstance(loaded.model, CM.SaliencyClickModel) and loaded.model.config == TINY
    jax.tree.map(np.testing.assert_array_equal, jax.tree.map(np.asarray, loaded.params),
                 convert_transalnet(state, TINY))
    # The command converts the released configuration: a tiny checkpoint is refused, naming a key.
    assert ports_main.main(["transalnet", "--checkpoint", str(checkpoint), "--out", str(tmp_path / "x")]) == 2
    assert "has shape" in capsys.readouterr().err
    assert ports_main.main(["transalnet", "--checkpoint", str(tmp_path / "missing.pth"),
                            "--out", str(tmp_path / "y")]) == 2


# ---- the zoo and load_click_model ----------------------------------------------------------------

def test_zoo_names_and_the_saliency_alias(tmp_path, monkeypatch):
    assert zoo.get("transalnet_res").checkpoint_hint == "TranSalNet_Res.pth"
    assert zoo.get("transalnet_res").config == TRANSALNET_RES and zoo.get(CM.SALIENCY_ZOO_NAME).family == "transalnet"
    assert zoo.get("transalnet_tiny").checkpoint_hint.startswith("<none")
    loaded = CM.load_click_model("saliency", random_seed=3, config=TINY)
    assert isinstance(loaded.model, SaliencyClickModel) and loaded.source == "random:3"
    assert loaded.model.config == TINY
    assert CM.load_click_model("transalnet_tiny", random_seed=3).model.config == TINY
    with pytest.raises(ValueError, match="not a click model"):
        CM.load_click_model("sam_demo", random_seed=0)
    monkeypatch.setenv(zoo.ENV_MODELS_DIR, str(tmp_path))
    with pytest.raises(FileNotFoundError, match="python -m ports transalnet --checkpoint TranSalNet_Res.pth"):
        CM.load_click_model("saliency")
    store.save(tmp_path / "transalnet_res", TranSalNet(TINY).init_variables(jax.random.key(0)),
               family="transalnet", variant="tiny", config=TINY.to_dict())
    assert CM.load_click_model("saliency").model.config == TINY  # the directory's config, not the zoo's


# ---- the SM construction -------------------------------------------------------------------------

def _round_half_up(x):
    return np.clip(np.floor(np.asarray(x, np.float64) + 0.5), 0, 255)


def float_resize(array, out_h, out_w):
    """8-bit data resized with OpenCV's rule in float, rounded half up (the library's arithmetic)."""
    return _round_half_up(resize_linear(array, out_h, out_w))


def cv2_resize(array, out_h, out_w):
    """``cv2.resize`` of 8-bit data (INTER_LINEAR, fixed-point), as the authors run it."""
    return cv2.resize(np.asarray(array, np.uint8), (out_w, out_h)).astype(np.float64)


def restated_sm(image, region, saliency, resize, input_hw=(288, 384), grey=True):
    """NumPy restatement of ``SaliencyModel.__call__`` (``grey=False``: ``SaliencyImageModel``, whose
    ``cut_image_from_mask`` only slices the crop) with ``saliency`` in place of the network.

    Returns (network input f64[in_h, in_w, 3] in [0, 1], click map f64[H, W], the map's value of
    one 8-bit level).
    """
    rows, cols = np.where(region)
    h, w = rows.max() - rows.min() + 1, cols.max() - cols.min() + 1
    dh, dw = int((int(1.4 * h) - h) / 2), int((int(1.4 * w) - w) / 2)
    y1, y2 = max(rows.min() - dh, 0), min(rows.max() + dh, region.shape[0]) + 1
    x1, x2 = max(cols.min() - dw, 0), min(cols.max() + dw, region.shape[1]) + 1
    crop, mask = image[y1:y2, x1:x2].astype(np.float64), region[y1:y2, x1:x2]
    if grey:
        crop = np.where(mask[..., None], crop, 127.0)
    (ch, cw), (sr, sc) = crop.shape[:2], input_hw
    canvas = np.ones((sr, sc, 3))
    if ch / sr > cw / sc:
        new_cols = (cw * sr) // ch
        canvas[:, (sc - new_cols) // 2:(sc - new_cols) // 2 + new_cols] = resize(crop, sr, new_cols)
    else:
        new_rows = (ch * sc) // cw
        canvas[(sr - new_rows) // 2:(sr - new_rows) // 2 + new_rows] = resize(crop, new_rows, sc)
    levels = np.floor(np.asarray(saliency, np.float64) * 255.0)
    if ch / sr > cw / sc:
        new_cols = (sc * ch) // sr
        back = resize(levels, ch, new_cols)[:, (new_cols - cw) // 2:(new_cols - cw) // 2 + cw]
    else:
        new_rows = (sr * cw) // sc
        back = resize(levels, new_rows, cw)[(new_rows - ch) // 2:(new_rows - ch) // 2 + ch]
    back = back * mask
    level = 1.0 if back.sum() == 0 else 1.0 / back.sum()
    back = mask.astype(np.float64) if back.sum() == 0 else back / back.sum()
    out = np.zeros(region.shape)
    out[y1:y2, x1:x2] = back
    return canvas / 255.0, out, level


def _scene(seed=0, hw=(70, 101)):
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[:hw[0], :hw[1]]
    image = (120 + 100 * np.sin(xx / 7.0)[..., None] * np.cos(yy / 5.0)[..., None]
             + rng.normal(0, 10, (*hw, 3))).clip(0, 255).astype(np.uint8)
    return image


def _fixed_saliency(input_hw, seed=1):
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[:input_hw[0], :input_hw[1]]
    return (0.5 + 0.4 * np.sin(xx / 13.0 + yy / 29.0) + rng.uniform(-0.05, 0.05, input_hw)).astype(np.float32)


REGIONS = {
    "wide": (slice(20, 41), slice(10, 90)),
    "tall": (slice(5, 66), slice(40, 55)),
    "border": (slice(0, 25), slice(60, 101)),
    "small": (slice(33, 36), slice(47, 51)),
    "tiny_letterbox": (slice(10, 60), slice(30, 76)),
}


@pytest.fixture(scope="module")
def sm_program():
    """jit of (saliency map, image, image_hw, region) -> (network input, click map) at 288 x 384."""
    def program(saliency, image, image_hw, region):
        crop = SM.crop_geometry(region, image_hw, (288, 384))
        return SM.sm_network_input(image, region, crop, (288, 384)), SM.sm_distribution(saliency, region, crop)

    return jax.jit(program)


def _region(hw, key, frame_hw=None):
    frame_hw = hw if frame_hw is None else frame_hw
    region = np.zeros(frame_hw, bool)
    region[REGIONS[key]] = True
    if key == "tiny_letterbox":
        region[25:40, 40:60] = False  # a hole: grey inside the crop
    return region


@pytest.mark.parametrize("key", sorted(REGIONS))
def test_sm_construction_equals_the_numpy_restatement(sm_program, key):
    image, saliency = _scene(), _fixed_saliency((288, 384))
    region = _region(image.shape[:2], key)
    canvas, got = (np.asarray(a) for a in sm_program(saliency, image.astype(np.float32),
                                                   np.asarray(image.shape[:2], np.int32), region))
    want_canvas, want, level = restated_sm(image, region, saliency, float_resize)
    # A value exactly half-way between two levels may round either way between float32 matrix
    # products and the float64 restatement: at most one level, at few pixels.
    canvas_differ = np.round(canvas * 255) != np.round(want_canvas * 255)
    assert np.abs(canvas - want_canvas).max() <= 1 / 255 + 1e-6 and canvas_differ.mean() < 0.01
    map_differ = ~np.isclose(got, want, rtol=1e-5, atol=1e-9)
    assert np.abs(got - want).max() <= 1.001 * level and map_differ.mean() < 0.002
    assert abs(got.sum() - 1) < 1e-5 and np.all(got[~region] == 0)
    # OpenCV's own 8-bit resizes (the authors' arithmetic, 11-bit fixed-point weights): within one level.
    cv_canvas, cv_map, cv_level = restated_sm(image, region, saliency, cv2_resize)
    assert np.abs(canvas - cv_canvas).max() <= 1 / 255 + 1e-6
    levels, cv_levels = np.round(got / level), np.round(cv_map / cv_level)  # back to 8-bit levels
    assert np.abs(levels - cv_levels).max() <= 1


@pytest.mark.parametrize("key", ["tiny_letterbox", "border"])
def test_si_differs_from_sm_only_by_the_grey(key):
    """SI (``grey_outside=False``): the network sees the raw crop, the restatement without the grey; the
    crop, the letterbox and the map of a given saliency are SM's."""
    image, saliency = _scene(), _fixed_saliency((288, 384))
    region = _region(image.shape[:2], key)
    image_hw = np.asarray(image.shape[:2], np.int32)

    def program(grey_outside):
        def one(image, region):
            crop = SM.crop_geometry(region, image_hw, (288, 384))
            return (SM.sm_network_input(image, region, crop, (288, 384), grey_outside),
                    SM.sm_clickability(lambda canvas: jnp.asarray(saliency), image, image_hw, region, (288, 384),
                                       grey_outside))
        return jax.jit(one)(image.astype(np.float32), region)

    (sm_canvas, sm_map), (si_canvas, si_map) = (tuple(np.asarray(a) for a in program(g)) for g in (True, False))
    want_canvas, want_map, level = restated_sm(image, region, saliency, float_resize, grey=False)
    assert np.abs(si_canvas - want_canvas).max() <= 1 / 255 + 1e-6
    assert (np.round(si_canvas * 255) != np.round(want_canvas * 255)).mean() < 0.01
    assert np.abs(si_map - want_map).max() <= 1.001 * level
    np.testing.assert_array_equal(si_map, sm_map)  # one saliency, one map: the grey only enters the network input
    # SM's input minus SI's is the restatement's grey minus raw input (each within one level of its own).
    grey_canvas, _, _ = restated_sm(image, region, saliency, float_resize, grey=True)
    assert np.abs(grey_canvas - want_canvas).max() > 10 / 255
    assert np.abs((sm_canvas - si_canvas) - (grey_canvas - want_canvas)).max() <= 2 / 255 + 1e-6


def test_the_saliency_image_click_model(tmp_path, monkeypatch):
    """``saliency_image`` is TranSalNet_Res's weights behind the SI construction, declared beside ``saliency``."""
    sm, si = (CM.load_click_model(name, random_seed=3, config=TINY) for name in ("saliency", "saliency_image"))
    assert (sm.model.name, sm.model.grey_outside) == ("saliency", True)
    assert (si.model.name, si.model.grey_outside) == ("saliency_image", False)
    jax.tree.map(np.testing.assert_array_equal, sm.params, si.params)
    image = _scene(hw=(40, 57))
    region = _region((70, 101), "tiny_letterbox")[:40, :57]
    inside = np.ones((40, 57), bool)
    prepared = si.model.prepare(image, region, (40, 57))
    got = np.asarray(jax.jit(si.model.clickability)(si.params, prepared, region, inside))
    crop = SM.crop_geometry(jnp.asarray(region), jnp.asarray([40, 57]), TINY.input_hw)
    canvas = SM.sm_network_input(jnp.asarray(image, jnp.float32), region, crop, TINY.input_hw, False)
    saliency = TranSalNet(TINY).apply(si.params, canvas[None])[0]
    _, want, level = restated_sm(image, region, np.asarray(saliency), float_resize, TINY.input_hw, grey=False)
    assert np.abs(got - want).max() <= 1.001 * level and np.isclose(got, want, rtol=1e-5).mean() > 0.99
    sm_map = np.asarray(jax.jit(sm.model.clickability)(sm.params, prepared, region, inside))
    assert np.abs(sm_map - got).max() > 0  # the grey changes what the network sees
    monkeypatch.setenv(zoo.ENV_MODELS_DIR, str(tmp_path))
    store.save(tmp_path / "transalnet_res", TranSalNet(TINY).init_variables(jax.random.key(0)),
               family="transalnet", variant="tiny", config=TINY.to_dict())
    converted = CM.load_click_model("saliency_image")
    assert converted.model.grey_outside is False and converted.model.config == TINY


def test_sm_fallback_and_empty_region(sm_program):
    image = _scene()
    region = _region(image.shape[:2], "wide")
    zero = np.zeros((288, 384), np.float32)
    _, got = sm_program(zero, image.astype(np.float32), np.asarray(image.shape[:2], np.int32), region)
    np.testing.assert_array_equal(np.asarray(got), region.astype(np.float32))  # the authors' fallback: R itself
    _, empty = sm_program(_fixed_saliency((288, 384)), image.astype(np.float32),
                          np.asarray(image.shape[:2], np.int32), np.zeros_like(region))
    assert not np.asarray(empty).any()


def test_crop_margins_follow_the_authors_float_arithmetic():
    margins = SM.crop_margins(100)
    assert margins[45] == 8  # int(1.4 * 45) = 62 in float64, not 63
    assert margins[10] == 2 and margins[1] == 0


@pytest.mark.parametrize("in_len, out_len", [(37, 288), (400, 288), (50, 50), (7, 384), (290, 145)])
def test_resize_matrix_is_opencvs_linear_resize(in_len, out_len):
    rng = np.random.default_rng(in_len)
    axis = rng.uniform(0, 255, (in_len + 9, 3)).astype(np.float32)
    start = 4
    matrix = np.asarray(SM.resize_matrix(jnp.arange(out_len), jnp.int32(out_len), jnp.int32(in_len),
                                         jnp.int32(start), in_len + 9))
    want = resize_linear(axis[start:start + in_len], out_len, 3)
    np.testing.assert_allclose(matrix @ axis, want, rtol=1e-5, atol=1e-4)
    want_cv = cv2.resize(axis[start:start + in_len], (3, out_len), interpolation=cv2.INTER_LINEAR)
    np.testing.assert_allclose(matrix @ axis, want_cv, rtol=1e-5, atol=1e-3)


def test_click_model_in_a_padded_frame_and_under_vmap():
    model = SaliencyClickModel(TINY)
    params = model.init(0)
    image = _scene(hw=(40, 57))
    exact, padded = (40, 57), (48, 64)
    regions = [_region((70, 101), key)[:40, :57] for key in ("wide", "tall")]
    maps = []
    for frame in (exact, padded):
        prepared = model.prepare(image, regions[0], frame)
        framed = np.zeros((2, *frame), bool)
        framed[:, :40, :57] = regions
        inside = np.zeros(frame, bool)
        inside[:40, :57] = True
        out = jax.jit(jax.vmap(model.clickability, in_axes=(None, None, 0, None)))(params, prepared, framed, inside)
        maps.append(np.asarray(out))
    np.testing.assert_allclose(maps[1][:, :40, :57], maps[0], rtol=1e-6, atol=1e-9)
    assert np.all(maps[1][:, 40:] == 0) and np.all(maps[1][:, :, 57:] == 0)
    np.testing.assert_allclose(maps[0].sum(axis=(1, 2)), 1.0, rtol=1e-5)
    for region, got in zip(regions, maps[0]):
        assert np.all(got[~region] == 0) and got[region].std() > 0  # the network's saliency, not uniform
    saliency = TranSalNet(TINY).apply(params, SM.sm_network_input(
        jnp.asarray(image, jnp.float32), regions[0], SM.crop_geometry(regions[0], jnp.asarray([40, 57]), TINY.input_hw),
        TINY.input_hw)[None])[0]
    _, want, level = restated_sm(image, regions[0], np.asarray(saliency), float_resize, TINY.input_hw)
    assert np.abs(maps[0][0] - want).max() <= 1.001 * level and np.isclose(maps[0][0], want, rtol=1e-5).mean() > 0.99


def test_rclicks_run_with_the_tiny_saliency_click_model(tmp_path):
    import json

    from cli_helpers import make_folder
    from jaxseg_robust import runs
    from jaxseg_robust.runs.rclicks import RClicksSpec

    folder = make_folder(tmp_path)
    spec = runs.RunSpec(model=runs.ModelSpec("sam_tiny"),
                        data=runs.DataSpec(folders=((str(folder / "images"), str(folder / "masks")),)),
                        engine=runs.EngineSpec(progress="none"),
                        protocol=RClicksSpec(clickability="transalnet_tiny", clickability_random_seed=0,
                                             n_clicks=2, groups=2, seed=7))
    result = runs.evaluate(spec, tmp_path / "run", say=lambda line: None)
    records = [json.loads(line) for line in (tmp_path / "run" / "records.jsonl").read_text().splitlines()]
    assert result.exit_code == 1 and sum(r["status"] == "ok" for r in records) == 3  # two broken pairs fail
    config = json.loads((tmp_path / "run" / "manifest.json").read_text())["config"]
    assert config["clickability_source"] == "random:0"
