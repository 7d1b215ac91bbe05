"""CDNet without torch: config, click maps, FDM / PDM gradients, the predictor's rules and the port's checks."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxseg_robust.models import zoo
from jaxseg_robust.models.cdnet.config import TINY, CdnetConfig
from jaxseg_robust.models.cdnet.network import fdm_size
from jaxseg_robust.models.cdnet.pdm import pixel_diffusion
from jaxseg_robust.models.cdnet.segmenter import CdnetSegmenter, cdnet_options, clickseg_options
from jaxseg_robust.models.clickmap.attack_view import PredictorView
from ports.cdnet import config_from_checkpoint, convert_cdnet, latent_head_shapes
from ports.keytable import PortError

SEG = CdnetSegmenter(TINY)


@pytest.fixture(scope="module")
def params():
    return SEG.init(0)


def test_config_round_trip_and_checks():
    assert CdnetConfig.from_dict(TINY.to_dict()) == TINY
    with pytest.raises(ValueError, match="unknown isegm backbone 'resnet35'"):
        CdnetConfig(backbone="resnet35")
    with pytest.raises(ValueError, match="unknown keys|bogus"):
        CdnetConfig.from_dict({**TINY.to_dict(), "bogus": 1})
    assert fdm_size((384, 384)) == (48, 48) and fdm_size((50, 70)) == (7, 9)


def test_click_features_are_two_radii():
    points = jnp.asarray([[20.0, 30.0], [-1.0, -1.0]])
    labels = jnp.asarray([1, -1])
    maps = SEG.click_features(points, labels, jnp.zeros((64, 64)))
    assert maps.shape == (64, 64, 4)
    assert float(maps[..., 0].sum()) == 81.0  # radius-5 disk: 81 pixels
    assert float(maps[..., 2].sum()) > 1500.0 and float(maps[..., 1].sum() + maps[..., 3].sum()) == 0.0


def test_fdm_maps_carry_no_gradient_and_near_maps_do(params):
    image = jax.random.uniform(jax.random.PRNGKey(0), (64, 64, 3))
    maps = SEG.click_features(jnp.asarray([[20.0, 30.0]]), jnp.asarray([1]), jnp.zeros((64, 64)))
    grad = jax.grad(lambda m: jnp.sum(SEG.network_logits(params, image, m)))(maps)
    assert float(jnp.abs(grad[..., 2:]).max()) == 0.0  # the FDM detaches its click weights
    assert float(jnp.abs(grad[..., :2]).max()) > 0.0


def test_pixel_diffusion_follows_the_clicks():
    rng = np.random.default_rng(0)
    image = jnp.asarray(rng.uniform(0, 1, (32, 32, 3)), jnp.float32)
    logits = jnp.zeros((32, 32))
    clicks = jnp.zeros((32, 32, 2)).at[10:13, 10:13, 0].set(1.0).at[25:28, 25:28, 1].set(1.0)
    out = pixel_diffusion(image, logits, clicks)
    assert out.shape == (32, 32)
    assert float(out[11, 11]) > 0.0 and float(out[26, 26]) < 0.0
    assert abs(float(out[0, 31])) < min(float(out[11, 11]), -float(out[26, 26]))
    # no clicks, logits 0: s = 0 everywhere, nothing to diffuse
    np.testing.assert_array_equal(pixel_diffusion(image, logits, jnp.zeros((32, 32, 2))), 0.0)


def test_authors_predictor_rules():
    seg = SEG.with_predictor(True, protocol="rclicks")
    options = seg.evaluation
    assert options.resize_hw is None and options.with_flip and options.pixel_diffusion and options.threshold == 0.5
    zoom = options.zoom_in  # the scripts' zoom_in_gpcis ZoomIn, resized to the infer size
    assert zoom.native_crop and zoom.target_hw == (64, 64) and zoom.skip_clicks == 1
    assert (zoom.min_crop_size, zoom.expansion_ratio, zoom.prob_thresh, zoom.recompute_thresh_iou) == \
        (10, 1.4, 0.49, 1.0)
    # TETRIS skips the zoom only without a previous prediction; RClicks' TETRIS set never skips it;
    # ResizeTrans(384) is hard-coded in the predictor, so SBD keeps the infer size (GPCIS: 256)
    assert SEG.with_predictor(True, protocol="tetris").evaluation.zoom_in.skip_clicks == 0
    assert SEG.with_predictor(True, "TETRIS", "rclicks").evaluation.zoom_in.skip_clicks == -1
    assert SEG.with_predictor(True, "SBD", "rclicks").evaluation.zoom_in.target_hw == (64, 64)
    assert cdnet_options("rclicks", "SBD").zoom_in.target_hw == (384, 384)
    assert clickseg_options(384).resize_hw == (384, 384) and clickseg_options(384).zoom_in is None
    rules = seg.rules
    assert rules.family == "cdnet" and rules.click_step_hw == (64, 64) and rules.frame_policy == "any"
    assert seg.probability_threshold == 0.5
    assert SEG.with_predictor(False).evaluation is None
    assert zoo.get("cdnet_resnet34_sbd").config == CdnetConfig()


def test_predictor_view_maps_clicks_through_the_resize(params):
    seg = SEG.with_predictor(True, protocol="tetris").with_differentiable_clicks()
    view = seg.predictor_view()
    assert isinstance(view, PredictorView) and view.grid_hw((40, 50)) == (64, 64)
    image = np.random.default_rng(1).integers(0, 256, (40, 50, 3), dtype=np.uint8)
    x, transform = seg.preprocess(image, frame_hw=(48, 56))
    features = seg.embed(params, x)
    points, labels = jnp.asarray([[25.0, 20.0]]), jnp.asarray([1])
    crop = view.crop(features, transform.original_hw, points, labels, jnp.zeros((48, 56)),
                     view.initial_state((48, 56)))
    np.testing.assert_array_equal(crop.roi, [0, 39, 0, 49])
    np.testing.assert_allclose(crop.points, [[25.0 * 64 / 50, 20.0 * 64 / 40]], rtol=1e-6)
    np.testing.assert_allclose(view.to_image(crop, crop.points[0]), [20.0, 25.0], rtol=1e-5)
    halves, prob, _ = view.predict(params, crop, crop.points, labels, transform.original_hw, (48, 56))
    assert halves.shape == (1, 64, 64)  # the Dice term reads the diffused flip average
    assert prob.shape == (48, 56) and float(prob[40:].max()) == 0.0


def test_predictor_view_zooms_after_a_prediction(params):
    """With a previous prediction the second click's grid is the zoom-in's crop around it (box
    expanded 1.4 times, at least 10 px), resized to the infer size."""
    seg = SEG.with_predictor(True, protocol="tetris").with_differentiable_clicks()
    view = seg.predictor_view()
    image = np.random.default_rng(1).integers(0, 256, (40, 50, 3), dtype=np.uint8)
    x, transform = seg.preprocess(image)
    features = seg.embed(params, x)
    prev = jnp.zeros((40, 50)).at[10:20, 20:30].set(0.9)   # box rows 10..19, cols 20..29
    state = view.initial_state((40, 50)).replace(prev_prob=prev, has_prev=jnp.asarray(True))
    points, labels = jnp.asarray([[25.0, 15.0], [5.0, 5.0]]), jnp.asarray([1, 0])
    crop = view.crop(features, transform.original_hw, points, labels, jnp.zeros((40, 50)), state)
    np.testing.assert_array_equal(crop.roi, [8, 22, 18, 32])   # 10 px * 1.4 = 14 around the centre
    np.testing.assert_allclose(crop.points[0], [64 * (25.0 - 18) / 15, 64 * (15.0 - 8) / 15], rtol=1e-6)


def _official_state(config):
    """A zero-valued state dict with the official keys and shapes (from the Flax tree), plus the extras."""
    from flax import traverse_util

    state = {}
    for path, leaf in traverse_util.flatten_dict(SEG.param_shapes()).items():
        shape = tuple(leaf.shape)
        key = ".".join(path)
        if len(shape) == 4:
            shape = (shape[3], shape[2], shape[0], shape[1])
        state[key] = np.zeros(shape, np.float32) + (1.0 if path[-1] == "running_var" else 0.0)
    for key, shape in latent_head_shapes(config.deeplab_ch).items():
        state[key] = np.ones(shape, np.float32)
    for key in [k for k in state if k.endswith(".running_mean")]:
        state[key.removesuffix("running_mean") + "num_batches_tracked"] = np.asarray(0, np.int64)
    state["PDM.aff_x.kernel"] = np.zeros((8, 1, 3, 3), np.float32)
    state["PDM.aff_m.kernel"] = np.zeros((8, 1, 3, 3), np.float32)
    state["PDM.aff_std.kernel"] = np.zeros((9, 1, 3, 3), np.float32)
    return state


def test_port_is_strict():
    state = _official_state(TINY)
    params = convert_cdnet(state, TINY)
    assert params["feature_extractor"]["FDM"]["t"]["weight"].shape == (1, 1, 16, 16)
    missing = dict(state)
    del missing["feature_extractor.FDM.z2.weight"]
    with pytest.raises(PortError, match="feature_extractor.FDM.z2.weight"):
        convert_cdnet(missing, TINY)
    bad_kernel = dict(state, **{"PDM.aff_m.kernel": np.full((8, 1, 3, 3), 0.5, np.float32)})
    with pytest.raises(PortError, match="PDM.aff_m.kernel"):
        convert_cdnet(bad_kernel, TINY)


def test_port_refuses_other_configs():
    base = {"class": "isegm.model.is_deeplab_model.DeeplabModel",
            "params": {"backbone": "resnet34", "deeplab_ch": 128, "use_leaky_relu": True}}
    assert config_from_checkpoint(base, what="x.pth") == CdnetConfig()
    with pytest.raises(PortError, match="'with_prev_mask'"):
        config_from_checkpoint({**base, "params": {**base["params"], "with_prev_mask": True}}, what="x.pth")
    with pytest.raises(PortError, match="HRNetModel"):
        config_from_checkpoint({**base, "class": "isegm.model.is_hrnet_model.HRNetModel"}, what="x.pth")
