"""CDNet parity with the authors' ClickSEG code (``$JAXSEG_CDNET_REPO``).

ClickSEG's ``DeeplabModel`` in the released configuration (ResNet-34,
``deeplab_ch=128``; tests/cdnet_reference.py) gets seeded random weights in
every tensor, is saved in the isegm checkpoint format and converted with
``python -m ports cdnet``. Then, on a smooth 150 x 200 image with clicks:

* the network's logits (``forward(...)["instances"]``, before the PDM) on
  the 384 x 384 grid, within 1e-4 of their scale;
* the pixel diffusion (``PDM.forward``) on those logits, within 1e-4 of scale;
* the authors' ``DiffisionPredictor`` (ResizeTrans(384), flip averaging,
  PDM, sigmoid, resize back) against `CdnetSegmenter.interactive_predict`
  with `clickseg_options`: probabilities within 1e-4, the 0.5-binarised masks
  equal but for pixels within 1e-4 of the threshold;
* gradients of a loss w.r.t. the radius-5 click maps (what TETRIS
  differentiates; the FDM's click weights are detached in both) within 1e-3
  relative;
* isegm's NoC loop (``evaluate_sample``: RITM clicker, 5 clicks, no early
  stop) with that predictor against `noc_trajectory`: identical clicks, IoUs
  within 1e-3, and the IoUs must move (else the loop proved nothing);
* the same loop as both papers' ``evaluate_model_cdnet.py`` run it: the
  predictor given the ``ZoomIn`` of ``zoom_in_gpcis.py`` (``$JAXSEG_RCLICKS_REPO``,
  or the same file from ``$JAXSEG_GPCIS_REPO``) with the TETRIS
  (``skip_clicks=0``) and the RClicks (``skip_clicks=1``) settings, against
  `noc_trajectory` with `cdnet_options`: identical clicks, IoUs within 1e-3,
  the last probability map within 1e-4, and at least one click zoomed into
  a crop smaller than the image.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytestmark = pytest.mark.parity

torch = pytest.importorskip("torch")

from cdnet_reference import REPO_ENV, import_isegm, load_zoom_in, release_model, repo_path, zoom_in_path  # noqa: E402

if repo_path() is None:
    pytest.skip(f"${REPO_ENV} does not name a ClickSEG checkout", allow_module_level=True)

from jaxseg_robust.models import store  # noqa: E402
from jaxseg_robust.models.cdnet.config import CdnetConfig  # noqa: E402
from jaxseg_robust.models.cdnet.pdm import pixel_diffusion  # noqa: E402
from jaxseg_robust.models.cdnet.segmenter import CdnetSegmenter, clickseg_options  # noqa: E402
from ports.__main__ import main as ports_main  # noqa: E402

RTOL = 1e-4
GRAD_RTOL = 1e-3
H, W = 150, 200
CLICKS = [(70.0, 90.0, True), (30.0, 150.0, False), (100.0, 60.0, True)]  # (row, col, positive)


def smooth_image(seed: int = 5) -> np.ndarray:
    """uint8[H, W, 3]: a few soft colour blobs on a gradient, with pixel noise of +-12 grey levels.

    The noise keeps every 3 x 3 window of the resized image from being flat: on a
    flat window the PDM divides differences of rounding size by ``1e-8 + 0.1 std``
    of rounding size, so its affinities there depend on the last bit of the
    bilinear resize, which torch's and ours round differently (docs/models/cdnet.md).
    """
    rng = np.random.default_rng(seed)
    rows, cols = np.mgrid[0:H, 0:W].astype(np.float32)
    image = np.stack([rows / H, cols / W, 0.5 * np.ones_like(rows)], axis=-1)
    for _ in range(4):
        r, c, s = rng.uniform(0, H), rng.uniform(0, W), rng.uniform(15, 40)
        image += rng.uniform(-0.5, 0.5, 3) * np.exp(-((rows - r) ** 2 + (cols - c) ** 2) / (2 * s * s))[..., None]
    image = image * 255 + rng.uniform(-12, 12, image.shape)
    return np.clip(np.round(image), 0, 255).astype(np.uint8)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    DeeplabModel, DiffisionPredictor, Click = import_isegm()
    net = release_model(DeeplabModel, seed=21)
    path = tmp_path_factory.mktemp("cdnet") / "cdnet_res34.pth"
    torch.save({"state_dict": net.state_dict(), "config": net._config}, str(path))
    out = tmp_path_factory.mktemp("cdnet_port") / "model"
    assert ports_main(["cdnet", "--checkpoint", str(path), "--out", str(out)]) == 0
    params, meta = store.load(out)
    config = CdnetConfig.from_dict(meta["config"])
    return net, DiffisionPredictor, Click, CdnetSegmenter(config), params


def scale_err(got, want) -> tuple[float, float]:
    want = np.asarray(want, np.float64)
    return float(np.max(np.abs(np.asarray(got, np.float64) - want))), float(np.max(np.abs(want)))


def reference_inputs(size: int = 384):
    """The image resized as ResizeTrans does, and isegm's points tensor of CLICKS scaled to it."""
    image = torch.from_numpy(smooth_image()).permute(2, 0, 1)[None].float() / 255.0
    image = torch.nn.functional.interpolate(image, (size, size), mode="bilinear", align_corners=True)
    pos = [(r * size / H, c * size / W, i) for i, (r, c, p) in enumerate(CLICKS) if p]
    neg = [(r * size / H, c * size / W, i) for i, (r, c, p) in enumerate(CLICKS) if not p]
    n = max(len(pos), len(neg))
    pad = [(-1, -1, -1)]
    points = torch.tensor([pos + pad * (n - len(pos)) + neg + pad * (n - len(neg))], dtype=torch.float32)
    return image, points


def our_points(size: int = 384):
    """The same clicks as (x, y) on the resized grid, and their labels."""
    pts = jnp.asarray([[c * size / W, r * size / H] for r, c, _ in CLICKS], jnp.float32)
    return pts, jnp.asarray([1 if p else 0 for *_, p in CLICKS], jnp.int32)


def test_network_logits_and_pdm_match(models):
    net, _, _, seg, params = models
    image, points = reference_inputs()
    with torch.no_grad():
        out = net(image, points)
        want = out["instances"][0, 0].numpy()
        want_pdm = net.PixelDiffusion(image, out["instances"], out["click_map"])[0, 0].numpy()
    x = jnp.asarray(image[0].permute(1, 2, 0).numpy())
    pts, labels = our_points()
    maps = seg.click_features(pts, labels, jnp.zeros((384, 384)))
    np.testing.assert_array_equal(np.asarray(maps[..., :2]), out["click_map"][0].permute(1, 2, 0).numpy())
    got = seg.network_logits(params, x, maps)
    err, scale = scale_err(got, want)
    assert err <= RTOL * scale, f"logits: max error {err:.3g} at scale {scale:.3g}"
    got_pdm = pixel_diffusion(x, jnp.asarray(want), maps[..., :2])
    err, scale = scale_err(got_pdm, want_pdm)
    assert err <= RTOL * scale, f"PDM: max error {err:.3g} at scale {scale:.3g}"


def reference_probability(net, DiffisionPredictor, Click):
    """``DiffisionPredictor.get_prediction`` up to its threshold: the probability map f32[H, W]."""
    predictor = DiffisionPredictor(net, "cpu")
    predictor.set_input_image(smooth_image())
    clicks = [Click(is_positive=p, coords=(r, c), indx=i) for i, (r, c, p) in enumerate(CLICKS)]
    image_nd, clicks_lists, changed = predictor.apply_transforms(predictor.original_image, [clicks])
    with torch.no_grad():
        prediction = predictor._get_prediction(image_nd, clicks_lists, changed)
    for t in reversed(predictor.transforms):
        if type(t).__name__ != "AddHorizontalFlip":
            prediction = t.inv_transform(prediction)
    return prediction[0, 0].numpy()


def test_predictor_matches_diffusion_predictor(models):
    net, DiffisionPredictor, Click, seg, params = models
    want = reference_probability(net, DiffisionPredictor, Click)
    seg = dataclasses.replace(seg, evaluation=clickseg_options(seg.config.infer_size))
    x, transform = seg.preprocess(smooth_image())
    features = seg.embed(params, x)
    pts = jnp.asarray([[c, r] for r, c, _ in CLICKS], jnp.float32)
    labels = jnp.asarray([1 if p else 0 for *_, p in CLICKS], jnp.int32)
    prob, _ = seg.interactive_predict(params, features, transform, pts, labels,
                                      seg.interactive_state((H, W)), True, len(CLICKS))
    err, _ = scale_err(prob, want)
    assert err <= RTOL, f"probability: max error {err:.3g}"
    differ = (np.asarray(prob) > 0.5) != (want > 0.5)
    assert np.all(np.abs(want[differ] - 0.5) <= RTOL)
    assert 0.01 < float(np.mean(want > 0.5)) < 0.99  # the test sees both classes


def test_click_map_gradients_match(models):
    net, _, _, seg, params = models
    image, points = reference_inputs()
    pts, labels = our_points()
    maps = seg.click_features(pts, labels, jnp.zeros((384, 384)))
    weights = np.random.default_rng(2).standard_normal((384, 384)).astype(np.float32)

    near = torch.from_numpy(np.asarray(maps[..., :2])).permute(2, 0, 1)[None].requires_grad_(True)
    wide = torch.from_numpy(np.asarray(maps[..., 2:])).permute(2, 0, 1)[None]
    fdm = torch.nn.functional.interpolate(wide, (48, 48), mode="bilinear", align_corners=True)
    normed = net.normalization(image)
    logits = net.backbone_forward(normed, net.maps_transform(near), fdm)["instances"]
    logits = torch.nn.functional.interpolate(logits, (384, 384), mode="bilinear", align_corners=True)
    refined = net.PixelDiffusion(image, logits, near)
    (torch.sigmoid(refined)[0, 0] * torch.from_numpy(weights)).sum().backward()
    want = near.grad[0].permute(1, 2, 0).numpy()

    x = jnp.asarray(image[0].permute(1, 2, 0).numpy())

    def loss(near_maps):
        full = jnp.concatenate([near_maps, maps[..., 2:]], axis=-1)
        out = seg.network_logits(params, x, full)
        return jnp.sum(jax.nn.sigmoid(pixel_diffusion(x, out, near_maps)) * weights)

    got = jax.grad(loss)(maps[..., :2])
    rel = float(np.linalg.norm(np.asarray(got) - want) / np.linalg.norm(want))
    print(f"click-map gradient: relative L2 error {rel:.3g}")
    assert rel <= GRAD_RTOL, f"click-map gradient: relative L2 error {rel:.3g}"


N_NOC_CLICKS = 5


def ellipse_gt() -> np.ndarray:
    """bool[H, W]: an ellipse off the image centre."""
    rows, cols = np.mgrid[0:H, 0:W]
    return ((rows - 70) / 40.0) ** 2 + ((cols - 110) / 55.0) ** 2 <= 1.0


def reference_noc(net, DiffisionPredictor, zoom_in=None, n_clicks: int = N_NOC_CLICKS):
    """isegm ``evaluate_sample`` (no early stop, no initial mask) with ClickSEG's predictor, given the
    ``zoom_in`` transform or none: (clicks, IoUs, the zoom-in's ROI per click (None when skipped),
    the last probability map f32[H, W] as the zoom-in stored it, or None without one)."""
    from isegm.inference.clicker import Clicker  # noqa: PLC0415

    gt = ellipse_gt()
    predictor = DiffisionPredictor(net, "cpu", zoom_in=zoom_in)
    clicker = Clicker(gt_mask=gt)
    pred = np.zeros_like(gt)
    clicks, ious, rois = [], [], []
    with torch.no_grad():
        predictor.set_input_image(smooth_image())
        for _ in range(n_clicks):
            clicker.make_next_click(pred)
            pred = predictor.get_prediction(clicker) > 0.49
            click = clicker.get_clicks()[-1]
            clicks.append((int(click.coords[0]), int(click.coords[1]), bool(click.is_positive)))
            ious.append(float(np.sum(gt & pred) / np.sum(gt | pred)))
            if zoom_in is not None:
                rois.append(None if zoom_in._object_roi is None else tuple(int(v) for v in zoom_in._object_roi))
    last = None if zoom_in is None else zoom_in._prev_probs[0, 0]
    return clicks, ious, rois, last


def test_noc_loop_matches_authors(models):
    from jaxseg_robust.models.clickmap.noc import NocConfig, noc_trajectory  # noqa: PLC0415

    net, DiffisionPredictor, _, seg, params = models
    want_clicks, want_ious, _, _ = reference_noc(net, DiffisionPredictor)
    seg = dataclasses.replace(seg, evaluation=clickseg_options(seg.config.infer_size))
    x, transform = seg.preprocess(smooth_image())
    gt = jnp.asarray(ellipse_gt())
    out = noc_trajectory(seg, params, x, transform.original_hw, gt, jnp.ones_like(gt),
                         NocConfig(n_clicks=N_NOC_CLICKS, options=seg.evaluation))
    got_clicks = [(int(r), int(c), bool(p)) for (r, c), p in zip(np.asarray(out["clicks"]), np.asarray(out["positive"]))]
    print("NoC IoUs", want_ious, np.asarray(out["ious"]).tolist())
    assert got_clicks == want_clicks
    np.testing.assert_allclose(np.asarray(out["ious"]), want_ious, atol=1e-3)
    assert max(want_ious) - min(want_ious) > 0.05  # the clicks move the prediction: the loop is exercised


# both papers' evaluate_model_cdnet.py, --eval-mode cvpr (target_size is unused: the crop stays native)
PAPERS_ZOOM_IN = {"tetris": {"skip_clicks": 0, "target_size": 400, "expansion_ratio": 1.4},
                  "rclicks": {"skip_clicks": 1, "target_size": 400, "expansion_ratio": 1.4}}
# The seeded network's prediction is scattered over the whole image, so its box is the image and the zoom-in
# never crops; a head bias of -0.5 (the same on both sides) keeps it near the clicks, and the second and third
# clicks zoom into crops of the image (after that it empties and the authors' ZoomIn pastes into a stale ROI,
# docs/models/gpcis.md "Where the project departs").
ZOOM_HEAD_BIAS = -0.5
N_ZOOM_CLICKS = 3


def with_head_bias(net, params, bias: float):
    """Copies of the torch network and of the converted parameters with the head's output bias set to ``bias``."""
    import copy  # noqa: PLC0415

    from flax import traverse_util  # noqa: PLC0415

    net = copy.deepcopy(net)
    with torch.no_grad():
        net.head.layers[2].bias.fill_(bias)
    flat = traverse_util.flatten_dict(params)
    key = next(k for k in flat if "/".join(k) == "head/layers/2/bias")
    flat[key] = jnp.full_like(flat[key], bias)
    return net, traverse_util.unflatten_dict(flat)


@pytest.mark.skipif(zoom_in_path() is None, reason="neither $JAXSEG_RCLICKS_REPO nor $JAXSEG_GPCIS_REPO is set")
@pytest.mark.parametrize("protocol", ["tetris", "rclicks"])
def test_noc_loop_with_the_papers_zoom_in_matches_authors(models, protocol):
    from jaxseg_robust.models.clickmap.noc import NocConfig, noc_trajectory  # noqa: PLC0415

    net, DiffisionPredictor, _, seg, params = models
    net, params = with_head_bias(net, params, ZOOM_HEAD_BIAS)
    zoom_in = load_zoom_in()(**PAPERS_ZOOM_IN[protocol])
    want_clicks, want_ious, rois, want_prob = reference_noc(net, DiffisionPredictor, zoom_in, N_ZOOM_CLICKS)
    seg = seg.with_predictor(True, None, protocol)
    x, transform = seg.preprocess(smooth_image())
    gt = jnp.asarray(ellipse_gt())
    out = noc_trajectory(seg, params, x, transform.original_hw, gt, jnp.ones_like(gt),
                         NocConfig(n_clicks=N_ZOOM_CLICKS, options=seg.evaluation))
    got_clicks = [(int(r), int(c), bool(p)) for (r, c), p in zip(np.asarray(out["clicks"]), np.asarray(out["positive"]))]
    err, _ = scale_err(out["prob"], want_prob)
    iou_err = float(np.max(np.abs(np.asarray(out["ious"]) - want_ious)))
    print(f"\nPARITY cdnet zoom-in NoC [{protocol}]: clicks {want_clicks} rois {rois} IoUs {want_ious} vs "
          f"{np.asarray(out['ious']).tolist()} (max diff {iou_err:.3g}); last probability max error {err:.3g}, "
          f"max {float(np.max(want_prob)):.3g}")
    assert got_clicks == want_clicks
    assert iou_err <= 1e-3
    assert err <= RTOL, f"last probability: max error {err:.3g}"
    assert all(roi is not None and roi != (0, H - 1, 0, W - 1) for roi in rois[1:])  # the clicks after the first zoom in
