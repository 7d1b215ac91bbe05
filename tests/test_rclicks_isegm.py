"""RClicks runs click-map models through the authors' isegm predictor (docs/protocols/rclicks.md §5.5).

`IsegmTestModel` is the small network of tests/clickmap_model.py (two
convolutions of the image, isegm's hard click disks and the previous
probability map, two convolutions; a fixed click term so that its prediction
follows the clicks and the zoom-in moves) behind the optional members
``interactive_state`` / ``interactive_predict`` with the authors' machinery
(zoom-in at a fixed size, flip averaging, a two-pass cascade at the first
click: `isegm.interactive_predict`, what `ClickMapSegmenter` runs with
``evaluation`` set). The RClicks program runs it in a padded bucket; every
trajectory's clicks and every real first-round click are then replayed one by
one through `isegm.predict_click` (the machinery tests/test_click_noc_parity.py
checks against the authors' ``evaluate_sample``) from a fresh predictor state.
The IoUs must agree. The parity test against the authors' own predictor is
tests/test_rclicks_isegm_parity.py (RITM HRNet-18s).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from clickmap_model import ClickMapSegmenter as SmallClickModel
from clickmap_model import _Encoder, _Head
from jaxseg_robust.clicksim.click_models import DistanceTransformClickModel
from jaxseg_robust.clicksim.evaluation import RClicksConfig, make_rclicks_batch_fn
from jaxseg_robust.data.buckets import pad_batch
from jaxseg_robust.data.instances import make_instance
from jaxseg_robust.metrics.masks import mask_iou
from jaxseg_robust.models.base import SegmenterBase, initial_state
from jaxseg_robust.models.clickmap import isegm
from jaxseg_robust.models.clickmap.encoding import coord_features
from jaxseg_robust.models.clickmap.isegm import CascadeConfig, IsegmOptions, IsegmState, predict_click
from jaxseg_robust.models.clickmap.segmenter import ClickMapSegmenter
from jaxseg_robust.models.clickmap.zoom_in import ZoomInConfig
from jaxseg_robust.models.ritm.config import TINY

FRAME = (40, 52)
ROUNDS = 3
OPTIONS = IsegmOptions(zoom_in=ZoomInConfig(target_hw=(32, 32), min_crop_size=16), with_flip=True,
                       cascade=CascadeConfig(steps=2, adaptive=False, clicks=1))


def _instance(index, height, width, seed):
    rng = np.random.default_rng(seed)
    image = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
    yy, xx = np.mgrid[:height, :width]
    gt = (((yy - 0.5 * height) / (0.3 * height)) ** 2 + ((xx - 0.4 * width) / (0.25 * width)) ** 2) <= 1
    image[gt] = (image[gt] // 2 + 100).astype(np.uint8)
    return make_instance(f"im{index}", image, gt.astype(np.int8), dataset="toy")


INSTANCES = [_instance(0, 40, 52, 0), _instance(1, 33, 45, 1)]
USER_CLICKS = {("toy", "im0"): np.array([[20, 20], [18, 22]]), ("toy", "im1"): np.array([[17, 16]])}


@dataclasses.dataclass(frozen=True)
class IsegmTestModel(SmallClickModel, SegmenterBase):
    """tests/clickmap_model.py's network with the authors' predictor (see the module docstring)."""

    click_gain: float = 6.0

    def click_features(self, points, labels, prev):
        """[prev, positive, negative] hard disks f32[h, w, 3] on the grid of ``prev``."""
        return coord_features(points, labels, prev, self.radius, with_prev_mask=True, encoding="hard")

    def network_logits(self, params, image, maps):
        """Images f32[..., h, w, 3] and maps f32[..., h, w, 3] -> logits f32[..., h, w]."""
        features = _Encoder(self.channels).apply({"params": params["encoder"]}, image.reshape((-1,) + image.shape[-3:]))
        x = jnp.concatenate([features, maps.reshape((-1,) + maps.shape[-3:])], axis=-1)
        logits = _Head(self.channels).apply({"params": params["head"]}, x)
        logits = logits + self.click_gain * (x[..., -2] - x[..., -1] + x[..., -3] - 0.6)
        return logits.reshape(image.shape[:-1])

    def grid_logits(self, params, image, points, labels, prev):
        """One network run on one grid."""
        return self.network_logits(params, image, self.click_features(points, labels, prev))

    def interactive_state(self, frame_hw):
        return IsegmState.initial(frame_hw)

    def interactive_predict(self, params, features, transform, points, labels, state, use_state, num_clicks, *,
                            multimask_output=True):
        return isegm.interactive_predict(self, params, features, transform.original_hw, points, labels, state,
                                         use_state, num_clicks, OPTIONS)

    def embed(self, params, model_input):
        """The image itself (the network runs on the crops)."""
        return model_input


def _replay(step, params, image, hw, clicks, gt):
    """IoU per round of ``clicks`` [(x, y, positive)] fed one by one to a fresh predictor."""
    state = IsegmState.initial(FRAME)
    points = np.zeros((len(clicks), 2), np.float32)
    labels = np.full((len(clicks),), -1, np.int32)
    inside = np.zeros(FRAME, bool)
    inside[:hw[0], :hw[1]] = True
    ious = []
    for k, (x, y, positive) in enumerate(clicks):
        points[k], labels[k] = (x, y), int(positive)
        prob, state = step(params, image, hw, jnp.asarray(points), jnp.asarray(labels), jnp.int32(k + 1), state)
        pred = (np.asarray(prob) > 0.49) & inside
        ious.append(float(mask_iou(jnp.asarray(gt & inside), jnp.asarray(pred), jnp.asarray(inside))))
    return np.asarray(ious)


def test_rclicks_rounds_are_the_authors_predictor_loop():
    seg = IsegmTestModel()
    params = seg.init(0)
    step = jax.jit(lambda p, image, hw, pts, lab, n, st: predict_click(seg, p, image, hw, pts, lab, n, st, OPTIONS))
    assert isinstance(initial_state(seg, FRAME), IsegmState)
    config = RClicksConfig(num_rounds=ROUNDS, num_groups=2, threshold=0.49)
    fn = make_rclicks_batch_fn(seg, params, DistanceTransformClickModel(), config=config,
                               user_clicks=USER_CLICKS)
    out = jax.device_get(fn(pad_batch(INSTANCES, FRAME, 2)))
    checked = 0
    for slot, instance in enumerate(INSTANCES):
        height, width = instance.gt.shape
        x, transform = seg.preprocess(instance.image, frame_hw=FRAME)
        gt = np.zeros(FRAME, bool)
        gt[:height, :width] = instance.gt == 1
        trajectories = [(out["base_clicks"][slot], out["base_iou"][slot])]
        trajectories += list(zip(out["group_clicks"][slot], out["group_iou"][slot]))
        for clicks, ious in trajectories:
            replayed = _replay(step, params, x, transform.original_hw, clicks.tolist(), gt)
            np.testing.assert_allclose(ious, replayed, atol=1e-6)
            checked += 1
        users = USER_CLICKS[("toy", instance.id)]
        for k, (cx, cy) in enumerate(users):
            replayed = _replay(step, params, x, transform.original_hw, [(cx, cy, 1)], gt)
            np.testing.assert_allclose(out["user_iou"][slot][k], replayed[0], atol=1e-6)
    assert checked == 6
    # the zoom moved: some trajectory's IoU changes after round 1
    assert np.ptp(out["base_iou"], axis=-1).max() > 0


def test_clickmap_segmenter_evaluation_switches_state_and_frame_policy():
    """``ClickMapSegmenter.evaluation`` decides the state and the bucket policy (no network run)."""
    options = isegm.rclicks_options("ritm")
    seg = ClickMapSegmenter(TINY, evaluation=options)
    assert seg.frame_policy == "any" and ClickMapSegmenter(TINY).frame_policy == "exact"
    assert isinstance(seg.interactive_state(FRAME), IsegmState)
    assert ClickMapSegmenter(TINY).interactive_state(FRAME).shape == FRAME
    assert options.with_flip and options.zoom_in.target_hw == (400, 400) and options.cascade is None
    assert isegm.rclicks_options("ritm", "DAVIS").zoom_in.target_hw == (600, 600)
    assert isegm.rclicks_options("simpleclick", "DAVIS").zoom_in.target_hw == (672, 672)
    cfr = isegm.rclicks_options("cfr_icl")
    assert cfr.zoom_in.target_hw == (448, 448) and cfr.with_flip
    assert cfr.cascade == CascadeConfig(steps=2, adaptive=False, clicks=1)  # --cf-n=1, no --acf


def test_rclicks_click_map_models_get_the_authors_predictor(tmp_path):
    """`runs.authors_predictor.with_authors_predictor` under RClicks: the RClicks options by family and dataset,
    CFR-ICL from its config whatever the model's name, ``isegm="off"``, DAVIS mixed with others refused, SAM
    untouched."""
    import argparse  # noqa: PLC0415

    import pytest  # noqa: PLC0415

    from jaxseg_robust.models.simpleclick.config import TINY as SC_TINY  # noqa: PLC0415
    from jaxseg_robust.runs.authors_predictor import with_authors_predictor  # noqa: PLC0415
    from jaxseg_robust.runs.loading import LoadedModel  # noqa: PLC0415
    from jaxseg_robust.runs.spec import RunError  # noqa: PLC0415

    def loaded(segmenter, name):
        return LoadedModel(name, segmenter, None, "sha256:0", "random:0")

    def instances(*datasets):
        return [argparse.Namespace(dataset=name) for name in datasets]

    def authors(model, datasets, isegm="authors"):
        return with_authors_predictor(model, datasets, isegm, "rclicks", "RClicks")

    model, settings = authors(loaded(ClickMapSegmenter(TINY), "ritm_tiny"), instances("GrabCut"))
    assert model.segmenter.evaluation == isegm.rclicks_options("ritm") and settings["family"] == "ritm"
    model, _ = authors(loaded(ClickMapSegmenter(TINY), "ritm_tiny"), instances("DAVIS"))
    assert model.segmenter.evaluation.zoom_in.target_hw == (600, 600)
    cfr_icl = ClickMapSegmenter(dataclasses.replace(SC_TINY, cfr_icl=True))
    model, settings = authors(loaded(cfr_icl, "/models/neutral"), instances("GrabCut"))
    assert settings["family"] == "cfr_icl" and model.segmenter.evaluation.cascade.steps == 2
    # a name says nothing
    model, settings = authors(loaded(ClickMapSegmenter(SC_TINY), "/models/cfr_icl_named"), instances("GrabCut"))
    assert settings["family"] == "simpleclick" and model.segmenter.evaluation.cascade is None
    with pytest.raises(RunError, match="DAVIS"):
        authors(loaded(ClickMapSegmenter(TINY), "ritm_tiny"), instances("DAVIS", "GrabCut"))
    model, settings = authors(loaded(ClickMapSegmenter(TINY), "ritm_tiny"), instances("GrabCut"), "off")
    assert model.segmenter.evaluation is None and settings is None
    sam_like = loaded(SmallClickModel(), "sam_tiny")  # a segmenter without `evaluation` is left as it is
    assert authors(sam_like, instances("DAVIS", "GrabCut")) == (sam_like, None)
