"""GPCIS behind the Segmenter seam: its declared rules, the authors' predictor options, the zoo names.

The protocols themselves run it in tests/test_cli_gpcis.py; parity with the
authors' code is in tests/test_gpcis_parity.py.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxseg_robust.models import zoo
from jaxseg_robust.models.base import family_rules, takes_boxes
from jaxseg_robust.models.clickmap.isegm import IsegmOptions
from jaxseg_robust.models.gpcis.config import TINY
from jaxseg_robust.models.gpcis.segmenter import GpcisSegmenter, gpcis_options
from jaxseg_robust.prompts.types import click_prompts


@pytest.fixture(scope="module")
def tiny():
    predictor = zoo.init("gpcis_tiny", jax.random.key(0))
    return predictor.segmenter, predictor.params


@pytest.mark.parametrize("protocol, dataset, size, skip", [
    ("tetris", None, 384, 0), ("tetris", "SBD", 384, 0), ("rclicks", None, 384, 1),
    ("rclicks", "SBD", 256, 1), ("rclicks", "TETRIS", 384, -1),
])
def test_authors_options_per_protocol_and_dataset(protocol, dataset, size, skip):
    options = gpcis_options(protocol, dataset)
    zoom = options.zoom_in
    assert zoom.target_hw == (size, size) and zoom.skip_clicks == skip and zoom.native_crop
    assert zoom.min_crop_size == 10 and zoom.expansion_ratio == 1.4 and zoom.prob_thresh == 0.49
    assert zoom.recompute_thresh_iou == 1.0
    assert not options.with_flip and options.cascade is None


def test_declared_rules(tiny):
    segmenter, _ = tiny
    assert isinstance(segmenter, GpcisSegmenter)
    rules = family_rules(segmenter)
    assert rules.family == "gpcis" and rules.authors_predictor and not rules.accepts_boxes
    assert not takes_boxes(segmenter) and not rules.differentiable_clicks
    assert family_rules(segmenter.with_differentiable_clicks()).differentiable_clicks
    with_predictor = segmenter.with_predictor(True, None, "tetris")
    assert family_rules(with_predictor).frame_policy == "any"
    assert family_rules(with_predictor).click_step_hw == (384, 384)
    assert family_rules(segmenter).frame_policy == "exact"
    assert segmenter.with_predictor(False).evaluation is None


def test_flip_and_maps_only_calls_are_refused(tiny):
    segmenter, params = tiny
    with pytest.raises(ValueError, match="flip"):
        GpcisSegmenter(TINY, evaluation=IsegmOptions(with_flip=True))
    with pytest.raises(TypeError, match="grid_logits"):
        segmenter.network_logits(params, jnp.zeros((8, 8, 3)), jnp.zeros((8, 8, 3)))


def decode_sum(segmenter, params, point):
    image = np.random.default_rng(0).integers(0, 256, (36, 44, 3), dtype=np.uint8)
    x, transform = segmenter.preprocess(image)
    features = segmenter.embed(params, x)
    points = jnp.stack([point, jnp.asarray([30.0, 25.0])])
    prompts = click_prompts(points, jnp.asarray([1, 0]), jnp.zeros((36, 44)), False)
    return jnp.sum(jax.nn.sigmoid(segmenter.decode(params, features, prompts, transform).logits))


def test_the_click_gradient_flows_only_through_its_soft_disk(tiny):
    segmenter, params = tiny
    point = jnp.asarray([12.3, 17.6])
    soft = jax.grad(lambda p: decode_sum(segmenter.with_differentiable_clicks(), params, p))(point)
    hard = jax.grad(lambda p: decode_sum(segmenter, params, p))(point)
    assert np.abs(np.asarray(soft)).max() > 0   # the disk map carries it
    assert np.all(np.asarray(hard) == 0)        # hard disks and the GP's indices carry none


def test_zoo_predictor_predicts_a_mask():
    predictor = zoo.init("gpcis_tiny", jax.random.key(0))
    image = np.random.default_rng(1).integers(0, 256, (30, 40, 3), dtype=np.uint8)
    predictor.set_image(image)
    masks, scores, low = predictor.predict(point_coords=np.array([[20.0, 15.0]]), point_labels=np.array([1]))
    assert masks.shape[-2:] == (30, 40) and masks.dtype == bool


def test_runs_pick_the_options_of_the_runs_dataset():
    """`runs.authors_predictor.with_authors_predictor` hands GPCIS the run's one dataset: RClicks on their
    TETRIS set zooms from the first click (``skip_clicks=-1``), elsewhere from the second."""
    import argparse  # noqa: PLC0415

    from jaxseg_robust.runs.authors_predictor import with_authors_predictor  # noqa: PLC0415
    from jaxseg_robust.runs.loading import LoadedModel  # noqa: PLC0415

    model = LoadedModel("gpcis_tiny", GpcisSegmenter(TINY), None, "sha256:0", "random:0")

    def skip_of(protocol, *datasets):
        loaded, settings = with_authors_predictor(model, [argparse.Namespace(dataset=d) for d in datasets],
                                                  "authors", protocol, protocol)
        assert settings["family"] == "gpcis"
        return loaded.segmenter.evaluation.zoom_in.skip_clicks

    assert skip_of("rclicks", "tetris") == -1
    assert skip_of("rclicks", "grabcut") == skip_of("rclicks", "tetris", "grabcut") == 1
    assert skip_of("tetris", "tetris") == 0
