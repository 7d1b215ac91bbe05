"""Side files of a run directory (`jaxseg_robust.reports.artifacts`): masks, timings; the mask figure."""

from __future__ import annotations

import json
import types

import numpy as np
import pytest

from jaxseg_robust.reports import artifacts
from jaxseg_robust.reports.mask_plots import MaskPanel, mask_overlay, plot_mask_panels


def test_file_stems_are_safe_and_distinct():
    assert artifacts.file_stem("124080") == "124080" and artifacts.file_stem("a_b") == "a_b"
    spaced, slashed = artifacts.file_stem("a b"), artifacts.file_stem("a/b")
    assert len({spaced, slashed, "a_b"}) == 3 and spaced.startswith("a_b-") and "/" not in slashed
    assert artifacts.file_stem("..") != ".." and artifacts.file_stem("") != ""


def test_mask_round_trip_is_exact_and_checks_the_size(tmp_path):
    rng = np.random.default_rng(0)
    mask = rng.random((37, 53)) > 0.5
    path = artifacts.write_mask(tmp_path, ("data set", "id/1"), "min", mask)
    assert path.parent.name.startswith("data_set-") and path.name.endswith(".min.png")
    assert np.array_equal(artifacts.read_mask(tmp_path, ("data set", "id/1"), "min"), mask)
    assert artifacts.read_mask(tmp_path, ("data set", "id/1"), "min", size=(37, 52)) is None
    assert artifacts.read_mask(tmp_path, ("data set", "id/1"), "max") is None
    assert not list(tmp_path.rglob("*.tmp"))
    with pytest.raises(ValueError, match="2-D"):
        artifacts.write_mask(tmp_path, ("d", "i"), "min", np.zeros((2, 2, 2), bool))


def test_store_masks_crops_and_removes_them_from_the_payload(tmp_path):
    instance = types.SimpleNamespace(key=("d", "i"), size=(3, 4))
    frame = np.zeros((8, 8), bool)
    frame[1, 2] = frame[6, 6] = True  # (6, 6) lies in the padding
    payload = artifacts.store_masks(tmp_path, instance, {"min": {"iou": 0.5, "mask": frame}, "iou": 1.0,
                                                         "mask": ~frame}, top_level="max")
    assert payload == {"min": {"iou": 0.5}, "iou": 1.0}
    low = artifacts.read_mask(tmp_path, ("d", "i"), "min")
    assert low.shape == (3, 4) and low.sum() == 1 and low[1, 2]
    assert artifacts.read_mask(tmp_path, ("d", "i"), "max").sum() == 11


def test_timed_finalize_writes_timings_and_compiles_and_passes_the_rest_on(tmp_path):
    from jaxseg_robust.data.instances import make_instance
    from jaxseg_robust.runner.program import TIMING_KEY, CompileEvent, CompileLog, batch_timing

    log = CompileLog()
    log.add(CompileEvent("toy program", (8, 16), 2, 1.5, 1000.0))
    finalize = artifacts.timed_finalize(tmp_path, log, clicks=4,
                                        finalize=lambda instance, outputs: {"kept": sorted(outputs)})
    instance = make_instance("a", np.zeros((4, 4, 3), np.uint8), np.ones((4, 4), np.int8), dataset="d")
    timing = {k: v[0] for k, v in batch_timing(np.array([True, True]), 0.5, 0.75, 990.0, 1001.0).items()}
    assert finalize(instance, {"iou": 1.0, TIMING_KEY: timing}) == {"kept": ["iou"]}
    other = make_instance("b", np.zeros((4, 4, 3), np.uint8), np.ones((4, 4), np.int8), dataset="d")
    assert artifacts.timed_finalize(tmp_path, log)(other, {"iou": 0.5, TIMING_KEY: timing}) == {"iou": 0.5}
    entry = artifacts.read_timings(tmp_path)[("d", "a")]
    assert (entry["seconds"], entry["wall_seconds"], entry["batch_instances"], entry["clicks"]) == (0.25, 0.375, 2, 4)
    assert (entry["batch_started"], entry["batch_ended"]) == (990.0, 1001.0)
    assert artifacts.read_timings(tmp_path)[("d", "b")]["session"] not in ("", entry["session"])  # one per finalize
    [event] = artifacts.read_compile_events(tmp_path)  # drained once: one line
    assert event == {"program": "toy program", "frame": [8, 16], "batch": 2, "seconds": 1.5, "from_cache": False,
                     "process": 0, "ended": 1000.0, "session": entry["session"]}
    with open(tmp_path / artifacts.COMPILE_LOG, "a") as handle:  # perturb's session summary line is not a bucket
        handle.write('{"programs": 3, "compile_seconds": 9.0}\n{"program": "cut')
    assert len(artifacts.read_compile_events(tmp_path)) == 1
    assert artifacts.read_compile_events(tmp_path / "missing") == []


def test_timings_last_line_wins_and_broken_lines_are_skipped(tmp_path):
    artifacts.append_timing(tmp_path, artifacts.timing_line(("d", "a"), 2.0, 2, 10))
    artifacts.append_timing(tmp_path, artifacts.timing_line(("d", "b"), 2.0, 2, 10), process_index=1)
    artifacts.append_timing(tmp_path, artifacts.timing_line(("d", "a"), 3.0, 1, 10))
    with open(artifacts.timings_path(tmp_path), "a") as handle:
        handle.write('{"dataset": "d", "id": "c", "sec')  # cut off by a kill
    timings = artifacts.read_timings(tmp_path)
    assert set(timings) == {("d", "a"), ("d", "b")}
    assert timings[("d", "a")]["seconds"] == 3.0 and timings[("d", "b")]["seconds"] == 1.0
    assert artifacts.timings_path(tmp_path, 1).name == "timings.process1.jsonl"
    assert json.loads(artifacts.timings_path(tmp_path).read_text().splitlines()[0])["clicks"] == 10
    assert artifacts.read_timings(tmp_path / "missing") == {}


def test_mask_panels_figure(tmp_path):
    image = np.full((30, 40, 3), 100, np.uint8)
    mask = np.zeros((30, 40), bool)
    mask[5:15, 10:30] = True
    blended = mask_overlay(image, mask, (1.0, 0.0, 0.0))
    assert blended[10, 20, 0] > blended[10, 20, 1] and blended[0, 0, 0] == pytest.approx(100 / 255)
    path = plot_mask_panels(image, [MaskPanel("min", mask, "min", np.array([[10.0, 20.0]]), np.array([True])),
                                    MaskPanel("max", ~mask, "max", box=(2, 3, 30, 25))], tmp_path / "m.png")
    from PIL import Image

    assert Image.open(path).size == (640, 480)
    with pytest.raises(ValueError, match="shape"):
        mask_overlay(image, mask[:10], (1, 0, 0))
    with pytest.raises(ValueError, match="empty"):
        plot_mask_panels(image, [], tmp_path / "n.png")
