"""`jaxseg-robust rclicks` end to end on a tiny folder dataset; user clicks from a CSV; the report."""

from __future__ import annotations

import csv
import io
import json

import numpy as np
import pytest
from PIL import Image

from jaxseg_robust import cli
from jaxseg_robust.clicksim.clicks_csv import parse_clicks_csv
from jaxseg_robust.clicksim.user_clicks import first_round_clicks
from jaxseg_robust.data.instances import InstanceRef
from jaxseg_robust.reports import run_report
from jaxseg_robust.reports.rclicks import group_index_map, plot_clicking_groups

from cli_helpers import assert_timed_summary

HEADER = "dataset,image_stem,object_stem,model_type,click_type,full_stem,device,x,y,w,h\n"


def _folder(root, count=3):
    images, masks = root / "toy" / "images", root / "toy" / "masks"
    images.mkdir(parents=True)
    masks.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for index in range(count):
        height, width = 32 + 2 * index, 40 - 3 * index
        image = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
        mask = np.zeros((height, width), np.uint8)
        mask[6:24, 8 + index:30 - index] = 255
        Image.fromarray(image).save(images / f"a{index}.png")
        Image.fromarray(mask).save(masks / f"a{index}.png")
    return images, masks


def test_first_round_clicks_from_the_csv():
    text = HEADER + ("GrabCut,img1,,,first,img1,pc,5,6,100,50\n"
                     "GrabCut,img1,,,first,img1,mobile,120,-3,100,50\n"
                     "GrabCut,img1,,sam,fn,img1_sam_fn,pc,1,1,100,50\n"
                     "TETRIS,t1,3,,first,t1_______3,pc,10,5,20,10\n"
                     "TETRIS,t2,,,first,t2,pc,4,4,20,10\n")
    table = parse_clicks_csv(io.StringIO(text))
    refs = [InstanceRef("img1", 50, 100, None, "grabcut"), InstanceRef("t1#3", 20, 40, None, "tetris"),
            InstanceRef("t1#4", 20, 40, None, "tetris"), InstanceRef("t2#1", 10, 20, None, "tetris"),
            InstanceRef("img9", 50, 100, None, "grabcut")]
    clicks = first_round_clicks(table, refs)
    assert set(clicks) == {("grabcut", "img1"), ("tetris", "t1#3"), ("tetris", "t2#1")}
    np.testing.assert_array_equal(clicks[("grabcut", "img1")], [[5, 6], [99, 0]])  # clipped, fn row ignored
    np.testing.assert_array_equal(clicks[("tetris", "t1#3")], [[20, 10]])  # CSV frame 20x10 -> 40x20
    np.testing.assert_array_equal(clicks[("tetris", "t2#1")], [[4, 4]])  # only instance: '' object stem


def test_group_index_map_and_plot(tmp_path):
    values = np.array([[0, 0, 0, 1, 1], [2, 2, 3, 4, 5], [6, 7, 8, 9, 10]], np.float32)
    groups = group_index_map(values)
    assert groups[0, 0] == -1 and groups[2, 4] == 9 and groups[1, 0] == 1  # value 2 is shared by G1/G2
    assert np.all(np.diff(groups[values > 0][np.argsort(values[values > 0], kind="stable")]) >= 0)
    path = plot_clicking_groups(np.zeros((3, 5, 3), np.uint8), values > 0, groups, tmp_path / "g.png",
                                title="t", clicks=np.array([[1, 1]]))
    assert path.stat().st_size > 0


def test_cli_end_to_end_with_resume(tmp_path, capsys):
    images, masks = _folder(tmp_path)
    (tmp_path / "clicks.csv").write_text(HEADER + "toy,a0,,,first,a0,pc,15,12,40,32\n"
                                                  "toy,a0,,,first,a0,mobile,20,14,40,32\n")
    out = tmp_path / "run"
    argv = ["rclicks", "--model", "sam_tiny", "--clickability", "dt", "--folder", str(images), str(masks),
            "--n-clicks", "4", "--groups", "4", "--frame", "fixed:36x44", "--batch-size", "3",
            "--clicks-csv", str(tmp_path / "clicks.csv"), "--out", str(out), "--progress", "none"]
    assert cli.main(argv) == 0
    printed = capsys.readouterr().out
    assert "NoC4@90 Sample" in printed and "NSR@4" in printed and "| toy | 3 |" in printed
    assert "NoC20" not in printed and "NSR@20" not in printed  # headers follow --n-clicks
    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    assert len(records) == 3 and all(r["status"] == "ok" for r in records)
    assert {r["id"]: r["payload"]["n_user_clicks"] for r in records} == {"a0": 2, "a1": 0, "a2": 0}
    for record in records:  # Boundary IoU per round beside the IoU, and in the report's ious.csv
        payload = record["payload"]
        assert np.shape(payload["base_biou"]) == (4,) and np.shape(payload["group_biou"]) == (4, 4)
        assert all(0.0 <= v <= 1.0 for v in np.ravel(payload["group_biou"]) if v is not None)
    run_report.write_run_report(out, tmp_path / "report")
    with open(tmp_path / "report" / "ious.csv", newline="") as handle:
        rows = [r for r in csv.DictReader(handle) if r["id"] == "a0" and r["trajectory"] == "G2"]
    expected = next(r for r in records if r["id"] == "a0")["payload"]["group_biou"][1]
    np.testing.assert_array_equal([float(r["biou"]) for r in rows],
                                  [float("nan") if v is None else v for v in expected])
    assert (out / "summary.csv").read_text().startswith("dataset,instances,noc_sample")
    assert "nsr_at_4" in (out / "summary.csv").read_text().splitlines()[0]
    assert (out / "groups_toy_a0.png").exists()
    assert_timed_summary(out)
    assert cli.main(argv) == 0  # resume: nothing left to do
    assert "3 skipped" in capsys.readouterr().out
    assert cli.main(argv[:4] + ["nonsense"] + argv[5:]) == 2
    assert "--clickability nonsense" in capsys.readouterr().err
    assert cli.main(argv[:-4] + ["--n-clicks", "1", "--out", str(tmp_path / "r2")]) == 2


@pytest.mark.parametrize("flags, message", [
    (["--groups", "3"], "--groups must be even"),
    (["--groups", "1"], "--groups must be even"),
    (["--target-iou", "1.5"], "--target-iou must be an IoU in (0, 1]"),
    (["--target-iou", "0"], "--target-iou must be an IoU in (0, 1]"),
    (["--no-base", "--groups", "0"], "--no-base with --groups 0 leaves nothing to evaluate"),
])
def test_impossible_flags_are_refused_before_anything_runs(tmp_path, capsys, flags, message):
    out = tmp_path / "run"
    argv = ["rclicks", "--model", "sam_tiny", "--clickability", "dt", "--folder", str(tmp_path / "missing"),
            str(tmp_path / "missing"), "--out", str(out), "--progress", "none", *flags]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    assert not out.exists()  # refused up front: no run directory, no model, no data read


def test_headers_follow_the_flags_and_base_only_fills_the_base_columns(tmp_path, capsys):
    images, masks = _folder(tmp_path, count=2)
    for name in ("a b", "a_b"):  # names that sanitize alike get distinct figure files
        Image.open(images / "a0.png").save(images / f"{name}.png")
        Image.open(masks / "a0.png").save(masks / f"{name}.png")
    out = tmp_path / "run"
    argv = ["rclicks", "--model", "sam_tiny", "--clickability", "dt", "--folder", str(images), str(masks),
            "--n-clicks", "3", "--groups", "2", "--target-iou", "0.85", "--frame", "fixed:36x44",
            "--plot-groups", "4", "--out", str(out), "--progress", "none"]
    assert cli.main(argv) == 0
    printed = capsys.readouterr().out
    assert "NoC3@85 Sample" in printed and "NoF3@85 Sample" in printed and "IoU-AuC3 Sample" in printed
    assert "@90" not in printed and "20" not in printed.split("| dataset |")[1].splitlines()[0]
    figures = sorted(path.name for path in out.glob("groups_*.png"))
    assert len(figures) == 4 and "groups_toy_a_b.png" in figures  # "a b" -> groups_toy_a_b~<hash>.png
    base_only = tmp_path / "base_only"
    assert cli.main(argv[:-4] + ["--groups", "0", "--out", str(base_only), "--progress", "none"]) == 0
    row = (base_only / "summary.csv").read_text().splitlines()
    values = dict(zip(row[0].split(","), row[1].split(",")))
    assert values["noc_sample"] == "nan" and 1.0 <= float(values["noc_base"]) <= 3.0  # was all-NaN
    assert float(values["nof_base"]) >= 0 and 0.0 <= float(values["auc_base"]) <= 1.0
    assert values["n_clicks"] == "3" and float(values["target_iou"]) == 0.85
