"""`jaxseg-robust report`: dispatch on the manifest's protocol (breps, rclicks, perturb), folders of runs.

The run directories here are made by the real engine with tiny NumPy batch
functions that return payloads of each protocol's shape (no model, no compile).
"""

from __future__ import annotations

import pathlib
import sys

import numpy as np
import pytest

from jaxseg_robust import cli
from jaxseg_robust.data.datasets import read_image_rgb
from jaxseg_robust.data.instances import make_instance
from jaxseg_robust.reports import run_report
from jaxseg_robust.reports.sources import image_source, load_source_image, with_image_source
from jaxseg_robust.runner.engine import run

from cli_helpers import GOOD, HEIGHT, WIDTH, assert_png, make_folder, run_cli


def folder_instances(folder: pathlib.Path) -> list:
    instances = []
    for name in GOOD:
        image_path, mask_path = folder / "images" / f"{name}.png", folder / "masks" / f"{name}.png"
        gt = (np.asarray(read_image_rgb(mask_path))[..., 0] > 128).astype(np.int8)
        instances.append(make_instance(name, np.array(read_image_rgb(image_path)), gt, dataset="toy",
                                       source_paths=(str(image_path), str(mask_path))))
    return instances


def breps_batch(batch):
    count = np.asarray(batch.gt).shape[0]
    half = lambda v: np.full((count,), v, np.float32)  # noqa: E731
    box = np.tile(np.array([[8.0, 6.0, 40.0, 34.0]], np.float32), (count, 1))
    return {"tight_box": box, "tight_iou": half(0.7), "tight_biou": half(0.5),
            "min": {"iou": half(0.4), "biou": half(0.3), "box": box + np.float32([4, 2, -3, -5]),
                    "box_clipped": box + np.float32([4, 2, -3, -5])},
            "max": {"iou": half(0.8), "biou": half(0.6), "box": box - np.float32([2, 2, -1, -3]),
                    "box_clipped": box - np.float32([2, 2, -1, -3])}}


def rclicks_batch(batch):
    count = np.asarray(batch.gt).shape[0]
    curve = np.linspace(0.5, 0.95, 5, dtype=np.float32)
    clicks = np.array([[3 + k, 7 + 2 * k, int(k % 2 == 0)] for k in range(5)], np.int32)  # (x, y, is_positive)
    return {"base_iou": np.tile(curve, (count, 1)), "group_iou": np.tile(curve * 0.9, (count, 10, 1)),
            "base_clicks": np.tile(clicks, (count, 1, 1)),
            "group_clicks": np.tile(clicks + [1, 0, 0], (count, 10, 1, 1))}


def make_run(out, instances, batch_fn, config, finalize=None):
    summary = run(instances, batch_fn, out, 2, config=config, progress="none", finalize=finalize)
    assert summary.ok == len(instances)
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("report")
    instances = folder_instances(make_folder(root, bad=False))
    suite = root / "suite"
    breps = make_run(suite / "breps", instances, breps_batch, {"protocol": "breps", "mode": "minmax"},
                     with_image_source())
    rclicks = make_run(suite / "rclicks", instances, rclicks_batch,
                       {"protocol": "rclicks", "settings": {"num_rounds": 5}})
    return root, instances, suite, breps, rclicks


def test_breps_report_tables_and_box_plots(runs, tmp_path, capsys):
    _, _, _, breps, _ = runs
    code, stdout, err = run_cli(["report", str(breps), "--out", str(tmp_path)], capsys)
    assert code == cli.EXIT_OK, err
    names = {p.name for p in tmp_path.iterdir()}
    assert {"breps.md", "breps.csv", "report.md"} <= names
    assert {f"boxes_toy_{name}.png" for name in GOOD} <= names
    for png in tmp_path.glob("*.png"):
        assert_png(png)
    assert "| toy | 3 | 0 | 70.00 | 40.00 | 80.00 | 40.00 |" in stdout  # IoU-Tight/Min/Max/Δ@BBox


def test_breps_report_draws_the_recorded_masks_and_skips_runs_without(runs, tmp_path, capsys):
    from jaxseg_robust.runs.breps import store_masks_finalize
    from jaxseg_robust.reports.artifacts import read_mask

    root, instances, _, old_breps, _ = runs

    def with_masks(batch):
        outputs = breps_batch(batch)
        frame = np.asarray(batch.gt).shape
        low = np.zeros(frame, bool)
        low[:, 10:20, 12:30] = True
        outputs["min"]["mask"], outputs["max"]["mask"] = low, ~low
        return outputs

    out = tmp_path / "breps_masks"
    make_run(out, instances, with_masks, {"protocol": "breps", "mode": "minmax"},
             with_image_source(store_masks_finalize(out, "minmax")))
    mask = read_mask(out, ("toy", "a0"), "min")
    assert mask.shape == (HEIGHT, WIDTH) and mask.sum() == 10 * 18 and (read_mask(out, ("toy", "a0"), "max") == ~mask).all()
    code, _, err = run_cli(["report", str(out)], capsys)
    assert code == cli.EXIT_OK, err
    assert_png(out / "report" / "masks_toy_a0.png")
    # a run directory written before masks were kept still reports, without mask plots
    code, _, err = run_cli(["report", str(old_breps), "--out", str(tmp_path / "old")], capsys)
    assert code == cli.EXIT_OK, err
    assert not any(p.name.startswith("masks_") for p in (tmp_path / "old").iterdir())


def test_rclicks_report_writes_the_per_click_ious_csv(runs, tmp_path):
    import csv

    _, _, _, _, rclicks = runs
    run_report.write_run_report(rclicks, tmp_path)
    with open(tmp_path / "ious.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == len(GOOD) * 11 * 5  # base + G1..G10, 5 clicks each
    curve = np.linspace(0.5, 0.95, 5, dtype=np.float32)
    base = [r for r in rows if r["id"] == "a1" and r["trajectory"] == "base"]
    assert [float(r["iou"]) for r in base] == [float(v) for v in curve] and all(r["biou"] == "" for r in base)
    g10 = [r for r in rows if r["id"] == "a1" and r["trajectory"] == "G10"]
    assert [int(r["click"]) for r in g10] == [1, 2, 3, 4, 5]
    assert float(g10[2]["iou"]) == float(np.float32(curve[2] * np.float32(0.9)))
    # each click's (x, y) and label, as recorded
    assert [(r["x"], r["y"], r["label"]) for r in base[:2]] == [("3", "7", "1"), ("4", "9", "0")]
    assert (g10[1]["x"], g10[1]["y"], g10[1]["label"]) == ("5", "9", "0")


def test_a_run_of_an_older_records_layout_is_refused_in_one_line(tmp_path, capsys):
    def old_tetris_batch(batch):  # the layout before clicks were (x, y): (row, col) under "clicks"
        count = np.asarray(batch.gt).shape[0]
        return {"min": {"iou": np.full((count, 3), 0.5, np.float32), "clicks": np.zeros((count, 3, 2), np.float32)}}

    instances = folder_instances(make_folder(tmp_path, bad=False))
    old = make_run(tmp_path / "old", instances, old_tetris_batch, {"protocol": "tetris"})
    code, _, err = run_cli(["report", str(old)], capsys)
    assert code == cli.EXIT_FAILURE
    assert len(err.strip().splitlines()) == 1 and "older layout" in err and str(old) in err


def test_rclicks_report_uses_the_recorded_click_budget(runs, tmp_path):
    _, _, _, _, rclicks = runs
    paths = run_report.write_run_report(rclicks, tmp_path)
    assert paths["rclicks_md"].is_file() and paths["rclicks_csv"].is_file()
    assert "| toy | 3 |" in paths["report"].read_text()


def test_a_folder_of_runs_gets_one_report_each_and_an_index(runs, tmp_path):
    _, _, suite, _, _ = runs
    paths = run_report.write_run_report(suite, tmp_path)
    assert (tmp_path / "breps" / "breps.md").is_file() and (tmp_path / "rclicks" / "rclicks.md").is_file()
    index = paths["report"].read_text()
    assert "## breps (breps)" in index and "## rclicks (rclicks)" in index
    assert f"(breps/boxes_toy_{GOOD[0]}.png)" in index  # image links point into the sub-report
    assert "\n### BREPS box robustness" in index


def test_perturb_report_is_skipped_cleanly_when_its_module_is_missing(runs, tmp_path, monkeypatch):
    _, instances, _, _, _ = runs
    out = make_run(tmp_path / "perturb", instances[:1], rclicks_batch, {"protocol": "perturb"})
    monkeypatch.setitem(sys.modules, "jaxseg_robust.reports.perturb", None)  # import -> ModuleNotFoundError
    paths = run_report.write_run_report(out, tmp_path / "report")
    assert "not installed" in paths["report"].read_text()


def test_unknown_protocol_and_missing_protocol_are_errors(runs, tmp_path, capsys):
    _, instances, _, _, _ = runs
    unknown = make_run(tmp_path / "unknown", instances[:1], rclicks_batch, {"protocol": "nonsense"})
    code, _, err = run_cli(["report", str(unknown)], capsys)
    assert code == cli.EXIT_FAILURE and "no report for protocol 'nonsense'" in err
    bare = make_run(tmp_path / "bare", instances[:1], rclicks_batch, {})
    with pytest.raises(run_report.ReportError, match="config.protocol"):
        run_report.write_run_report(bare)


def test_image_source_round_trip_and_resize(runs, tmp_path):
    _, instances, _, _, _ = runs
    source = image_source(instances[0])
    assert source["size"] == [HEIGHT, WIDTH] and pathlib.Path(source["image"]).is_absolute()
    np.testing.assert_array_equal(load_source_image({"source": source}), instances[0].image)
    smaller = load_source_image({"source": {**source, "size": [20, 24]}})  # a capped instance
    assert smaller.shape == (20, 24, 3)
    assert load_source_image({"source": {**source, "image": str(tmp_path / "gone.png")}}) is None
    assert load_source_image({}) is None and load_source_image({"source": {"image": None, "size": [1, 1]}}) is None
    with pytest.raises(ValueError, match="source"):
        with_image_source()(instances[0], {"source": 1})
