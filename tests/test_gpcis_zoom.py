"""The zoom-in's ``skip_clicks >= 0`` with ``native_crop`` (GPCIS's ``ZoomIn`` + ``ResizeTrans``).

Pins the authors' rule (``isegm/inference/transforms/zoom_in.py`` of GPCIS): the
zoom is skipped -- the whole image goes to the network at the infer size and
the ROI is left unset -- while at most ``skip_clicks`` clicks are given or no
previous prediction exceeds the threshold; the next zoom then takes the
prediction's box even where it overlaps the whole image by more than half
(``skip_clicks=-1`` would keep the whole image there).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from jaxseg_robust.models.clickmap.zoom_in import ZoomInConfig, ZoomState, update_roi

HW = jnp.asarray([40, 50], jnp.int32)


def big_prediction() -> jnp.ndarray:
    """A previous probability map whose expanded box covers most of the image (box IoU 0.82 with it)."""
    prev = np.zeros((40, 50), np.float32)
    prev[8:32, 8:42] = 0.9
    return jnp.asarray(prev)


def config(skip: int) -> ZoomInConfig:
    return ZoomInConfig(target_hw=(32, 32), skip_clicks=skip, min_crop_size=10, prob_thresh=0.49,
                        native_crop=skip >= 0)


def test_skip_clicks_needs_native_crop():
    with pytest.raises(ValueError, match="skip_clicks"):
        ZoomInConfig(skip_clicks=1)
    with pytest.raises(ValueError, match="skip_clicks"):
        ZoomInConfig(skip_clicks=-2, native_crop=True)


@pytest.mark.parametrize("skip", [0, 1])
def test_first_click_runs_on_the_whole_image_and_sets_no_roi(skip):
    points, labels = jnp.asarray([[10.0, 12.0]]), jnp.asarray([1])
    state = update_roi(ZoomState.empty(), jnp.zeros((40, 50)), jnp.asarray(False), points, labels, HW, config(skip))
    assert state.roi.tolist() == [0, 39, 0, 49] and not bool(state.has_roi)


def test_second_click_takes_the_prediction_box_after_a_skipped_zoom():
    points, labels = jnp.asarray([[10.0, 12.0], [30.0, 20.0]]), jnp.asarray([1, 0])
    first = update_roi(ZoomState.empty(), jnp.zeros((40, 50)), jnp.asarray(False), points[:1], labels[:1],
                       HW, config(1))
    second = update_roi(first, big_prediction(), jnp.asarray(True), points, labels, HW, config(1))
    # rows 8..31: 24 * 1.4 = 33.6 around 19.5 -> 3..36; cols 8..41: 34 * 1.4 = 47.6 around 24.5 -> 1..48
    assert second.roi.tolist() == [3, 36, 1, 48] and bool(second.has_roi)
    # skip_clicks=-1 keeps the whole-image ROI of the first click (box IoU >= 0.5); GPCIS takes `current`
    minus = update_roi(update_roi(ZoomState.empty(), jnp.zeros((40, 50)), jnp.asarray(False), points[:1],
                                  labels[:1], HW, config(-1)), big_prediction(), jnp.asarray(True), points, labels,
                       HW, config(-1))
    assert minus.roi.tolist() == [0, 39, 0, 49]
    small = np.zeros((40, 50), np.float32)
    small[10:30, 10:40] = 0.9
    taken = update_roi(first, jnp.asarray(small), jnp.asarray(True), points, labels, HW, config(1))
    # rows 10..29: 20 * 1.4 = 28 around 19.5 -> round(5.5)=6 (even) .. round(33.5)=34; cols 10..39: 42 -> 4..46
    assert taken.roi.tolist() == [6, 34, 4, 46] and bool(taken.has_roi)


def test_an_empty_previous_prediction_skips_the_zoom_again():
    points, labels = jnp.asarray([[10.0, 12.0], [30.0, 20.0]]), jnp.asarray([1, 0])
    zoomed = ZoomState(roi=jnp.asarray([6, 34, 4, 46], jnp.int32), has_roi=jnp.asarray(True))
    state = update_roi(zoomed, jnp.zeros((40, 50)), jnp.asarray(True), points, labels, HW, config(1))
    assert state.roi.tolist() == [0, 39, 0, 49] and not bool(state.has_roi)
    # with two clicks and skip_clicks=1 a prediction is zoomed into
    small = np.zeros((40, 50), np.float32)
    small[10:30, 10:40] = 0.9
    kept = update_roi(zoomed, jnp.asarray(small), jnp.asarray(True), points, labels, HW, config(1))
    assert kept.roi.tolist() == [6, 34, 4, 46]
