"""The clickability evaluation's fn / fp tasks (``--prev-masks``) and the TETRIS split (``--split-file``) on the
generated clicks CSV and previous masks in the authors' layout (tests/clicks_toy.py): every metric of every task
against the independent restatement of test_clickability_cli.py, the error masks of soft previous masks, and
one clear line for a missing or bad previous mask or a split stem without an image."""

from __future__ import annotations

import csv
import io

import numpy as np
import pytest
from PIL import Image

from jaxseg_robust import cli
from jaxseg_robust.clicksim import click_models as CM
from jaxseg_robust.clicksim.map_evaluation import task_key
from jaxseg_robust.clicksim.previous_mask import check_previous_mask
from jaxseg_robust.clicksim.task_instances import error_region, task_labels, task_object, task_region
from jaxseg_robust.data.masks_io import MaskReadError
from jaxseg_robust.models import store
from jaxseg_robust.reports.sources import load_source_gt
from jaxseg_robust.runner.records import latest_records, read_run_records

from cli_helpers import Capture
from clicks_toy import COUNT, PREV_MASKS, ROUND_CLICKS, toy_rounds, write_toy_clicks
from test_clickability_cli import NUM_SETS, SEED, TINY, assert_metrics_match, restated_map, restated_metrics


@pytest.fixture(scope="module")
def rounds(tmp_path_factory):
    """The generated folder, CSV and previous masks, a random-weight tiny clickability network, and one CLI run
    of UD, DT and the network over every task (``--prev-masks``)."""
    root = tmp_path_factory.mktemp("clickability_rounds")
    folder, clicks_csv = write_toy_clicks(root)
    network = root / "cm_tiny"
    loaded = CM.load_click_model(CM.ZOO_NAME, random_seed=5, config=TINY)
    store.save(network, loaded.params, family="clickability", variant="tiny", config=TINY.to_dict())
    flags = ["--clicks-csv", str(clicks_csv), "--folder", str(folder / "images"), str(folder / "masks"),
             "--num-sets", str(NUM_SETS), "--seed", str(SEED), "--plot-instances", "1", "--progress", "none"]
    run_dir = root / "run"
    with Capture() as captured:
        code = cli.main(["--compile-cache", "off", "clickability", *flags, "--click-models", f"ud,dt,{network}",
                         "--prev-masks", str(root / PREV_MASKS), "--out", str(run_dir)])
    return {"root": root, "folder": folder, "flags": flags, "run": run_dir, "code": code, "out": captured.out,
            "err": captured.err, "network": str(network), "models": ("ud", "dt", str(network))}


def _read_csv(path) -> list[dict]:
    return list(csv.DictReader(io.StringIO(path.read_text(encoding="utf-8"))))


def _run_cli(args: list[str], capsys) -> tuple[int, list[str]]:
    code = cli.main(["--compile-cache", "off", "clickability", *args])
    return code, capsys.readouterr().err.strip().splitlines()


def test_every_task_has_a_row_with_its_click_type(rounds):
    assert rounds["code"] == 0, rounds["err"]
    assert f"{3 * COUNT} tasks ({COUNT} first, {COUNT} fn, {COUNT} fp)" in rounds["err"]  # a start-up step
    per_image = _read_csv(rounds["run"] / "toy_per_image.csv")
    assert len(per_image) == 3 * COUNT * len(rounds["models"])
    expected = {f"a{index}": "first" for index in range(COUNT)}
    expected.update({stem: kind for index in range(COUNT) for stem, kind, _, _ in toy_rounds(index)})
    assert {row["full_stem"]: row["click_type"] for row in per_image} == expected
    summary = _read_csv(rounds["run"] / "summary.csv")
    tasks = {(row["click_type"], row["model"]): int(row["tasks"]) for row in summary}
    assert tasks[("all", "ud")] == 3 * COUNT and tasks[("fn", "dt")] == COUNT
    assert tasks[("first", "ud")] == tasks[("fp", rounds["network"])] == COUNT
    fp_nss = [float(row["nss"]) for row in per_image if row["click_type"] == "fp" and row["model_name"] == "ud"]
    ud_fp = next(row for row in summary if row["click_type"] == "fp" and row["model"] == "ud")
    np.testing.assert_allclose(float(ud_fp["nss"]), np.mean(fp_nss), rtol=1e-12)
    means = {row["model_name"]: float(row["nss"]) for row in _read_csv(rounds["run"] / "toy_mean.csv")}
    all_ud = [float(row["nss"]) for row in per_image if row["model_name"] == "ud"]
    np.testing.assert_allclose(means["ud"], np.mean(all_ud), rtol=1e-12)  # the authors pool the click types


def _error_mask(object_mask: np.ndarray, previous_png, click_type: str) -> np.ndarray:
    """The authors' error mask (§1.2): the previous mask is the PNG's red channel / 255."""
    if click_type == "first":
        return object_mask.astype(np.float64)
    previous = np.asarray(Image.open(previous_png).convert("RGB"))[..., 0] / 255.0
    return object_mask * (1 - previous) if click_type == "fn" else (1 - object_mask) * previous


def test_each_metric_of_every_round_equals_its_restatement(rounds):
    records = {key: record for key, record in latest_records(read_run_records(rounds["run"])).items()
               if record["status"] == "ok"}
    assert len(records) == 3 * COUNT
    for (dataset, task_id), record in sorted(records.items()):
        payload = record["payload"]
        stem = task_id.split("_")[0]
        image = np.asarray(Image.open(rounds["folder"] / "images" / f"{stem}.png").convert("RGB"))
        object_mask = np.asarray(Image.open(rounds["folder"] / "masks" / f"{stem}.png")) > 128
        error = _error_mask(object_mask, rounds["root"] / PREV_MASKS / f"{task_id}.png", payload["click_type"])
        clicks = np.array(payload["clicks_xy"])
        assert payload["full_stem"] == task_id
        np.testing.assert_array_equal(load_source_gt(payload), object_mask)  # the source's gt is the object
        if payload["click_type"] != "first":
            assert len(clicks) == ROUND_CLICKS[payload["click_type"]] and error.any()
        for name in rounds["models"]:
            restated = restated_map(name, rounds["network"], image, object_mask, error)
            expected = restated_metrics(restated, clicks, object_mask, task_key(SEED, (dataset, task_id), name))
            assert_metrics_match(payload["metrics"][name], expected, name == rounds["network"], f"{task_id} {name}")


def test_without_prev_masks_only_first_rounds_and_the_split_file(rounds, capsys):
    out = rounds["root"] / "split"
    split = rounds["root"] / "val.txt"
    split.write_text("a1\na3\n")
    code = cli.main(["--compile-cache", "off", "clickability", *rounds["flags"], "--click-models", "ud",
                     "--split-file", str(split), "--out", str(out)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    # the split's two images, two later rounds each
    assert "4 fn / fp tasks are not evaluated: no folder of their previous masks" in captured.err
    rows = _read_csv(out / "toy_per_image.csv")
    assert [(row["full_stem"], row["click_type"]) for row in rows] == [("a1", "first"), ("a3", "first")]
    # Every task of the split's images (first, fn, fp) with --prev-masks; the first-round numbers do not move.
    code = cli.main(["--compile-cache", "off", "clickability", *rounds["flags"], "--click-models", "ud",
                     "--split-file", str(split), "--prev-masks", str(rounds["root"] / PREV_MASKS),
                     "--out", str(rounds["root"] / "split_rounds")])
    assert code == 0, capsys.readouterr().err
    rows_all = _read_csv(rounds["root"] / "split_rounds" / "toy_per_image.csv")
    assert sorted(row["full_stem"] for row in rows_all) == sorted(
        ["a1", "a3"] + [stem for index in (1, 3) for stem, _, _, _ in toy_rounds(index)])
    assert sorted((row for row in rows_all if row["click_type"] == "first"), key=lambda row: row["full_stem"]) == rows
    everything = _read_csv(rounds["run"] / "toy_per_image.csv")
    by_stem = sorted(rows_all, key=lambda row: row["full_stem"])
    assert by_stem == sorted((row for row in everything if row["model_name"] == "ud"
                              and row["full_stem"].split("_")[0] in ("a1", "a3")), key=lambda row: row["full_stem"])


def test_bad_split_or_previous_masks_is_one_line_naming_the_file(rounds, capsys, tmp_path):
    flags = [*rounds["flags"], "--click-models", "ud"]
    split = tmp_path / "val.txt"
    split.write_text("a0\nno_such_image\n")
    code, err = _run_cli([*flags, "--split-file", str(split), "--out", str(tmp_path / "r1")], capsys)
    assert code == 2 and len(err) == 1 and err[0].startswith("jaxseg-robust clickability: error: --split-file")
    assert str(split) in err[0] and "'no_such_image'" in err[0]
    masks = tmp_path / "masks"
    masks.mkdir()
    for path in (rounds["root"] / PREV_MASKS).iterdir():
        (masks / path.name).write_bytes(path.read_bytes())
    missing = masks / f"{toy_rounds(2)[1][0]}.png"
    missing.unlink()
    code, err = _run_cli([*flags, "--prev-masks", str(masks), "--out", str(tmp_path / "r2")], capsys)
    assert code == 2 and len(err) == 1 and err[0].startswith("jaxseg-robust clickability: error: --prev-masks")
    assert str(missing) in err[0] and "not found" in err[0]
    Image.fromarray(np.zeros((5, 7, 3), np.uint8)).save(missing)
    code, err = _run_cli([*flags, "--prev-masks", str(masks), "--out", str(tmp_path / "r3")], capsys)
    assert code == 2 and len(err) == 1 and str(missing) in err[0] and "5x7" in err[0]
    missing.write_bytes(b"not a png")
    code, err = _run_cli([*flags, "--prev-masks", str(masks), "--out", str(tmp_path / "r4")], capsys)
    assert code == 2 and len(err) == 1 and str(missing) in err[0] and "cannot read previous mask" in err[0]
    code, err = _run_cli([*flags, "--prev-masks", str(tmp_path / "nowhere"), "--out", str(tmp_path / "r5")], capsys)
    assert code == 2 and len(err) == 1 and "--prev-masks" in err[0] and "not a folder" in err[0]


def test_error_region_of_a_soft_previous_mask_is_the_dt_baselines():
    object_mask = np.array([[1, 1, 1, 1, 0, 0, 0]], bool)
    red = np.array([[0, 253, 254, 255, 0, 1, 255]], np.uint8)
    previous = red.astype(np.float32) / np.float32(255)
    # fn: E = G (1 - P) is 1, 2/255, 1/255, 0 on the object; uint8(255 E) keeps the first two: in float32, as the
    # authors compute it, 255 (1 - 254/255) is 0.99998 and truncates to 0. fp: E = (1 - G) P off the object.
    np.testing.assert_array_equal(error_region(object_mask, previous, "fn"), [[1, 1, 0, 0, 0, 0, 0]])
    np.testing.assert_array_equal(error_region(object_mask, previous, "fp"), [[0, 0, 0, 0, 0, 1, 1]])
    expected_fn = ((object_mask * (np.float32(1) - previous)) * np.float32(255)).astype(np.uint8) != 0
    np.testing.assert_array_equal(error_region(object_mask, previous, "fn"), expected_fn)
    with pytest.raises(ValueError, match="'fn' or 'fp'"):
        error_region(object_mask, previous, "first")


def test_task_labels_carry_the_object_and_the_error_region():
    rng = np.random.default_rng(0)
    object_mask, region = rng.random((2, 9, 11)) < 0.5
    labels = task_labels(object_mask, region)
    np.testing.assert_array_equal(task_object(labels), object_mask)
    np.testing.assert_array_equal(task_region(labels), region)
    gt = np.array([[-1, 0, 1]], np.int8)  # a first-round task: the instance's own gt, R = G = gt == 1
    np.testing.assert_array_equal(task_object(gt), [[0, 0, 1]])
    np.testing.assert_array_equal(task_region(gt), [[0, 0, 1]])


def test_check_previous_mask_reads_only_the_header(tmp_path):
    path = tmp_path / "m.png"
    Image.fromarray(np.zeros((4, 6), np.uint16)).save(path)
    with pytest.raises(MaskReadError, match="unsupported image mode"):
        check_previous_mask(path, (4, 6))
    Image.fromarray(np.zeros((4, 6, 3), np.uint8)).save(path)
    check_previous_mask(path, (4, 6))
    with pytest.raises(MaskReadError, match=r"4x6 \(HxW\), the instance's image is 6x4"):
        check_previous_mask(path, (6, 4))
