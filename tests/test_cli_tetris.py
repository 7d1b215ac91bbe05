"""End-to-end tests of `jaxseg-robust tetris` (and its report) on a generated folder with the tiny random SAM."""

from __future__ import annotations

import csv
import json
import math

import numpy as np
import pytest

from jaxseg_robust import cli
from jaxseg_robust.attacks.clicks import RECORDS_FORMAT
from jaxseg_robust.reports.tetris_scores import trajectory_scores
from jaxseg_robust.reports.tetris import tetris_table, to_csv, to_markdown
from jaxseg_robust.reports.timing_summary import TIMING_CSV_COLUMNS
from jaxseg_robust.runner.records import latest_records, read_run_records

from cli_helpers import (
    ATTACK_ARGPARSE_ERRORS,
    BAD,
    GOOD,
    HEIGHT,
    WIDTH,
    assert_argparse_rejects,
    assert_command_error,
    assert_resume_refused,
    assert_png,
    assert_resume_skips_everything,
    assert_timed_summary,
    folder_flags,
    help_text,
    make_folder,
    records_by_status,
    run_on_new_folder,
    run_cli,
    table_cells,
)

CLICKS, STEPS, BASELINE_CLICKS = 3, 3, 4


def tetris_argv(folder, out, *extra: str) -> list[str]:
    return ["tetris", "--model", "sam_tiny", *folder_flags(folder), "--out", str(out), "--n_clicks", str(CLICKS),
            "--n_opt_steps", str(STEPS), "--lr_mult", "4", "--baseline-clicks", str(BASELINE_CLICKS),
            "--progress", "none", *extra]


@pytest.fixture(scope="module")
def first_run(tmp_path_factory):
    """One minmax + baseline run over 3 good and 2 bad instances (the only compile of this module)."""
    return run_on_new_folder(tmp_path_factory, "tetris",
                             lambda folder, out: tetris_argv(folder, out, "--batch-size", "2"))


def test_help_lists_the_ritm_tetris_flags(capsys):
    out = help_text("tetris", capsys)
    for flag in ("--n-clicks", "--n_clicks", "--n_opt_steps", "--lr_mult", "--thresh", "--mode", "--baseline-clicks",
                 "--fixed-first-click", "--acceptance", "--datasets", "--batch_size"):
        assert flag in out


def test_records_hold_min_max_and_baseline_trajectories(first_run):
    folder, out, code, stdout, stderr = first_run
    assert code == cli.EXIT_PARTIAL, stderr
    ok, failed, _ = records_by_status(out)
    assert set(ok) == set(GOOD) and set(failed) == set(BAD)
    for name, record in ok.items():
        payload = record["payload"]
        assert set(payload) == {"min", "max", "baseline", "source"}
        assert len(payload["min"]["iou"]) == len(payload["max"]["clicks_xy"]) == CLICKS
        assert len(payload["baseline"]["iou"]) == BASELINE_CLICKS
        clicks = np.asarray([c for t in ("min", "max", "baseline") for c in payload[t]["clicks_xy"]])
        assert (clicks >= 0).all() and (clicks[:, 0] <= WIDTH - 1).all() and (clicks[:, 1] <= HEIGHT - 1).all()
        # each trajectory's per-instance AuC is named with its own number of clicks
        assert {k for k in payload["min"] if k.startswith("auc_")} == {f"auc_iou@{CLICKS}", f"auc_biou@{CLICKS}"}
        assert {k for k in payload["baseline"] if k.startswith("auc_")} == {
            f"auc_iou@{BASELINE_CLICKS}", f"auc_biou@{BASELINE_CLICKS}"}
        assert "clicks" not in payload["min"] and "baseline_clicks" not in payload["max"]
        # click 1 of MIN / MAX starts from the same empty history as the baseline (spec §3.1 guarantee)
        low, base, high = (payload[t]["selection_iou"][0] for t in ("min", "baseline", "max"))
        assert low <= base + 1e-6 and base <= high + 1e-6
        assert payload["source"]["size"] == [HEIGHT, WIDTH]
        assert payload["source"]["image"].endswith(f"images/{name}.png")
    manifest = json.loads((out / "manifest.json").read_text())
    config = manifest["config"]
    assert config["protocol"] == "tetris" and config["mode"] == "minmax" and config["baseline_clicks"] == 4
    assert config["attack"]["n_opt_steps"] == STEPS and config["attack"]["lr_mult"] == 4.0
    assert config["records_format"] == RECORDS_FORMAT


def test_summary_table_matches_the_records(first_run):
    _, out, _, stdout, _ = first_run
    records = list(records_by_status(out)[0].values())
    assert "5 instances: 3 ok, 2 failed" in stdout and "failed toy/b_unreadable" in stdout
    cells = table_cells(stdout)
    assert cells[:3] == ["toy", "3", "2"]
    scores = {t: trajectory_scores([r["payload"][t] for r in records], num_clicks=CLICKS) for t in ("min", "max")}
    base = trajectory_scores([r["payload"]["baseline"] for r in records], num_clicks=BASELINE_CLICKS)
    auc = f"auc_iou@{CLICKS}"
    assert float(cells[3]) == pytest.approx(100 * scores["min"][auc], abs=0.006)
    assert float(cells[4]) == pytest.approx(100 * scores["max"][auc], abs=0.006)
    assert float(cells[5]) == pytest.approx(100 * (scores["max"][auc] - scores["min"][auc]), abs=0.011)
    header = next(line for line in stdout.splitlines() if line.startswith("| dataset |"))
    by_header = dict(zip([h.strip() for h in header.strip("|").split("|")], cells))
    noc = trajectory_scores([r["payload"]["baseline"] for r in records], num_clicks=BASELINE_CLICKS,
                            noc_thresholds=(0.8, 0.85, 0.9))
    for label in ("80", "85", "90"):
        assert float(by_header[f"NoC@{label}"]) == pytest.approx(noc[f"noc@{label}"], abs=0.006)
    assert float(by_header[f">={BASELINE_CLICKS}@85"]) == base["nof@85"]
    assert f"IoU-AuC@{CLICKS} Min" in header and "NoC@90" in header and f">={BASELINE_CLICKS}@90" in header
    assert header.index("NoC@80") < header.index("NoC@85") < header.index("NoC@90")
    with open(out / "summary.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert rows[0]["dataset"] == "toy" and rows[0]["auc_clicks"] == str(CLICKS)
    # the CSV's AuC columns name their K (the baseline's too, computed over K of its clicks)
    assert float(rows[0][f"biou_max@{CLICKS}"]) == pytest.approx(scores["max"][f"auc_biou@{CLICKS}"], rel=1e-6)
    base_k = trajectory_scores([r["payload"]["baseline"] for r in records], num_clicks=CLICKS)
    assert float(rows[0][f"iou_base@{CLICKS}"]) == pytest.approx(base_k[f"auc_iou@{CLICKS}"], rel=1e-6)
    assert "iou_max" not in rows[0] and "iou_base" not in rows[0]


def test_resume_skips_everything_and_prints_the_same_table(first_run, capsys):
    folder, out, _, stdout, _ = first_run
    assert_resume_skips_everything(tetris_argv(folder, out, "--batch-size", "2"), out, stdout, capsys,
                                   expected_code=cli.EXIT_PARTIAL,
                                   skipped="0 ok, 0 failed, 5 skipped (already recorded, 2 of them failed)")


def test_changed_settings_refuse_to_resume(first_run, capsys):
    folder, out, _, _, _ = first_run
    assert_resume_refused(tetris_argv(folder, out, "--tolerance", "2"), capsys, "tolerance")


def test_report_writes_every_table_and_plot(first_run, tmp_path, capsys):
    _, out, _, _, _ = first_run
    report = tmp_path / "report"
    code, stdout, err = run_cli(["report", str(out), "--out", str(report)], capsys)
    assert code == cli.EXIT_OK, err
    names = {p.name for p in report.iterdir()}
    assert {"tetris.md", "tetris.csv", "report.md", "curves_toy.png"} <= names
    assert {f"clicks_toy_{name}.png" for name in GOOD} <= names
    for png in report.glob("*.png"):
        assert_png(png)
    text = (report / "report.md").read_text()
    assert "IoU-AuC@3 Min" in text and "NoC@85" in text and "![mIoU per click](curves_toy.png)" in text
    assert "## Failed instances" in text and "toy/b_mismatch" in text
    # the command's summary.csv is the report's table plus the run's seconds columns (reports.timing_summary)
    with open(out / "summary.csv", newline="") as handle:
        summary = [{k: v for k, v in row.items() if k not in TIMING_CSV_COLUMNS} for row in csv.DictReader(handle)]
    with open(report / "tetris.csv", newline="") as handle:
        assert list(csv.DictReader(handle)) == summary


@pytest.mark.parametrize("extra, message", [
    (["--mode", "baseline", "--baseline-clicks", "5"], "--baseline-clicks"),
    (["--thresh", "1.5"], "--thresh"),
    (["--n_clicks", "1"], "--n-clicks"),
    (["--baseline-clicks", "1"], "--baseline-clicks"),
    (["--radius", "0"], "radius"),
    (["--model", "no_such_model"], "unknown model"),
])
def test_bad_arguments_exit_2_with_a_clear_error(tmp_path, capsys, extra, message):
    folder = make_folder(tmp_path, bad=False)
    assert_command_error("tetris", tetris_argv(folder, tmp_path / "run", *extra), capsys, message)


@pytest.mark.parametrize("argv, message", ATTACK_ARGPARSE_ERRORS)
def test_argparse_rejects_bad_values(tmp_path, capsys, argv, message):
    assert_argparse_rejects("tetris", argv, tmp_path, capsys, message)


# ---- the table (pure) ------------------------------------------------------------------------

def _record(dataset, name, status="ok", **trajectories):
    payload = {t: {"iou": list(v), "biou": [None if x is None else x / 2 for x in v]} for t, v in trajectories.items()}
    return {"dataset": dataset, "id": name, "status": status, "error": None if status == "ok" else "E: x",
            "payload": payload}


def test_tetris_table_auc_delta_noc_and_mean_row():
    records = [_record("a", "1", min=[0.2, 0.4, 0.6], max=[0.6, 0.8, 1.0], baseline=[0.5, 0.86, 0.95, 0.95]),
               _record("a", "2", min=[0.0, 0.2, 0.4], max=[0.4, 0.6, 0.8], baseline=[0.3, 0.5, 0.7, 0.91]),
               _record("a", "3", status="failed"),
               _record("b", "1", min=[0.1, 0.1, 0.1], max=[0.3, 0.3, 0.3], baseline=[0.9, 0.9, 0.9, 0.9])]
    table = tetris_table(records)
    assert table.trajectories == ("min", "baseline", "max") and table.auc_clicks == 3 and table.noc_clicks == 4
    a, b, mean = table.rows
    assert (a.ok, a.failed, b.ok, mean.ok, mean.failed) == (2, 1, 1, 3, 1)
    # AuC of the mean curve: min mean curve (0.1, 0.3, 0.5) -> (0.05 + 0.3 + 0.25) / 2
    assert a.values["iou_min"] == pytest.approx(0.3)
    assert a.values["iou_max"] == pytest.approx(0.7)
    assert a.values["iou_delta"] == pytest.approx(0.4)
    assert a.values["biou_delta"] == pytest.approx(0.2)
    assert a.values["noc85"] == pytest.approx((2 + 4) / 2) and a.values["noc90"] == pytest.approx((3 + 4) / 2)
    assert a.values["nof85"] == 1 and a.values["nof90"] == 1  # NoC == max clicks counts as a failure (RITM)
    assert b.values["noc90"] == 1 and b.values["nof90"] == 0
    assert mean.values["iou_min"] == pytest.approx((0.3 + 0.1) / 2)
    markdown = to_markdown(table)
    assert "| a | 2 | 1 | 30.00 | 70.00 | 40.00 |" in markdown and "| 3.00 | 3.50 | 1.00 | 1.00 |" in markdown
    lines = to_csv(table).splitlines()
    assert lines[0].startswith("dataset,ok,failed,auc_clicks,noc_clicks,iou_min@3,iou_max@3,iou_delta@3")
    assert len(lines) == 4


def test_tetris_table_single_mode_nan_and_errors():
    table = tetris_table([_record("d", "1", min=[0.5, None]), _record("d", "2", min=[0.5, 0.7])])
    assert table.columns == ("iou_min", "biou_min")
    assert math.isnan(table.rows[0].values["iou_min"])  # NaN propagates as the reference's np.mean
    with pytest.raises(ValueError, match="trajectory"):
        tetris_table([{"dataset": "d", "id": "1", "status": "ok", "payload": {"x": 1}}])
    with pytest.raises(ValueError, match="2 clicks"):
        tetris_table([_record("d", "1", baseline=[0.5])])
    only_failed = tetris_table([_record("d", "1", status="failed")])
    assert only_failed.rows[0].ok == 0 and only_failed.columns == ()


@pytest.mark.slow
def test_baseline_mode_records_only_the_baseline(tmp_path, capsys):
    folder = make_folder(tmp_path, bad=False)
    out = tmp_path / "run"
    argv = ["tetris", "--model", "sam_tiny", *folder_flags(folder), "--out", str(out), "--mode", "baseline",
            "--n-clicks", "5", "--progress", "none"]
    code, stdout, err = run_cli(argv, capsys)
    assert code == cli.EXIT_OK, err
    payloads = [r["payload"] for r in latest_records(read_run_records(out)).values()]
    assert all(set(p) == {"baseline", "source"} and len(p["baseline"]["iou"]) == 5 for p in payloads)
    assert "IoU-AuC@5 Base" in stdout and "Min" not in stdout.split("| dataset |")[1].splitlines()[0]


# ---- what users of RITM / TETRIS look for (issue 12) -----------------------------------------

def test_help_says_how_to_pick_the_device(capsys):
    out = help_text("tetris", capsys)
    assert "JAX_PLATFORMS=cpu|cuda|tpu" in out and "--target-iou" in out


def test_startup_lines_on_stderr(first_run):
    *_, stderr = first_run
    assert "loading sam_tiny ..." in stderr
    assert "compiling the TETRIS program (minmax + baseline) for bucket 64x64, batch 2 (first batch) ..." in stderr


def test_timings_beside_the_records_and_in_the_table(first_run):
    from jaxseg_robust.reports.artifacts import read_timings

    _, out, _, stdout, _ = first_run
    timings = read_timings(out)
    assert set(timings) == {("toy", name) for name in GOOD}
    for entry in timings.values():
        # 3 instances in batches of 2: one batch of 2, one of 1
        assert entry["batch_instances"] in (1, 2) and entry["seconds"] > 0
        assert entry["seconds"] == pytest.approx(entry["batch_seconds"] / entry["batch_instances"])
        assert entry["clicks"] == 2 * CLICKS + BASELINE_CLICKS
    header = next(line for line in stdout.splitlines() if line.startswith("| dataset |"))
    cells = dict(zip([h.strip() for h in header.strip("|").split("|")], table_cells(stdout)))
    seconds = [e["seconds"] for e in timings.values()]
    assert float(cells["device s/instance"]) == pytest.approx(np.mean(seconds), rel=0.01)
    assert float(cells["device s/click"]) == pytest.approx(sum(seconds) / (3 * (2 * CLICKS + BASELINE_CLICKS)),
                                                           rel=0.01)
    assert "compile time excluded" in stdout
    # wall time: the device call plus the batch's host preparation, so never below the device time
    for entry in timings.values():
        assert entry["wall_seconds"] >= entry["seconds"] > 0
        assert entry["wall_seconds"] == pytest.approx(entry["batch_wall_seconds"] / entry["batch_instances"])
    assert_timed_summary(out)
    # records stay free of timings (same line after a resume) and of masks
    ok, _, _ = records_by_status(out)
    assert all("_timing" not in r["payload"] and "mask" not in r["payload"]["min"] for r in ok.values())


def test_ious_csv_has_one_row_per_instance_trajectory_and_click(first_run):
    _, out, _, _, _ = first_run
    ok, _, _ = records_by_status(out)
    with open(out / "ious.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert list(rows[0]) == ["dataset", "id", "trajectory", "click", "x", "y", "label", "iou", "biou"]
    assert len(rows) == len(GOOD) * (2 * CLICKS + BASELINE_CLICKS)
    for row in rows:
        part = ok[row["id"]]["payload"][row["trajectory"]]
        index = int(row["click"]) - 1
        assert float(row["iou"]) == part["iou"][index] and float(row["biou"]) == part["biou"][index]
        assert [float(row["x"]), float(row["y"])] == part["clicks_xy"][index]
        assert row["label"] == str(int(part["is_positive"][index]))
    assert {(r["trajectory"], r["click"]) for r in rows if r["id"] == "a0"} == (
        {(t, str(k)) for t in ("min", "max") for k in range(1, CLICKS + 1)}
        | {("baseline", str(k)) for k in range(1, BASELINE_CLICKS + 1)})


def test_final_masks_beside_the_records_match_the_recorded_iou(first_run):
    from jaxseg_robust.data.datasets import list_dataset_folder
    from jaxseg_robust.reports.artifacts import read_mask

    folder, out, _, _, _ = first_run
    ok, _, _ = records_by_status(out)
    refs = {ref.id: ref for ref in list_dataset_folder("folder", folder, name="toy", images_dir=str(folder / "images"),
                                                       masks_dir=str(folder / "masks"), on_bad_pair="fail")}
    for name in GOOD:
        gt = np.asarray(refs[name].load().gt)
        for trajectory in ("min", "max", "baseline"):
            mask = read_mask(out, ("toy", name), trajectory)
            assert mask is not None and mask.shape == (HEIGHT, WIDTH)
            valid = gt >= 0
            union = ((mask | (gt == 1)) & valid).sum()
            iou = ((mask & (gt == 1)) & valid).sum() / union if union else math.nan
            recorded = ok[name]["payload"][trajectory]["iou"][-1]
            assert iou == pytest.approx(recorded, abs=1e-6), (name, trajectory)


def test_report_draws_the_predicted_masks_and_writes_the_ious_csv(first_run, tmp_path, capsys):
    _, out, _, _, _ = first_run
    report = tmp_path / "report"
    code, _, err = run_cli(["report", str(out), "--out", str(report)], capsys)
    assert code == cli.EXIT_OK, err
    names = {p.name for p in report.iterdir()}
    assert {f"masks_toy_{name}.png" for name in GOOD} <= names and "ious.csv" in names
    assert_png(report / "masks_toy_a0.png")
    assert (report / "ious.csv").read_text() == (out / "ious.csv").read_text()
    text = (report / "report.md").read_text()
    assert "![a0 predicted masks](masks_toy_a0.png)" in text and "s/click" in text


def test_an_old_run_directory_without_masks_or_timings_still_reports(first_run, tmp_path, capsys):
    import shutil

    _, out, _, _, _ = first_run
    old = tmp_path / "old_run"
    shutil.copytree(out, old, ignore=shutil.ignore_patterns("masks", "timings*.jsonl", "ious.csv", "report"))
    code, _, err = run_cli(["report", str(old)], capsys)
    assert code == cli.EXIT_OK, err
    names = {p.name for p in (old / "report").iterdir()}
    assert not any(name.startswith("masks_") for name in names) and "clicks_toy_a0.png" in names
    text = (old / "report" / "report.md").read_text()
    assert "NoC@80" in text and "s/click" not in text


def test_a_run_directory_of_the_older_records_layout_is_refused_in_one_line(first_run, tmp_path, capsys):
    import shutil

    folder, out, _, _, _ = first_run
    old = tmp_path / "old_layout"  # the run as the version before (x, y) clicks wrote it: no records_format
    shutil.copytree(out, old, ignore=shutil.ignore_patterns("report"))
    manifest = json.loads((old / "manifest.json").read_text())
    del manifest["config"]["records_format"]
    (old / "manifest.json").write_text(json.dumps(manifest))
    records = (old / "records.jsonl").read_text()
    for extra in ((), ("--allow-manifest-mismatch",)):  # never resumed: it would mix two layouts
        code, _, err = run_cli(tetris_argv(folder, old, "--batch-size", "2", *extra), capsys)
        assert code == cli.EXIT_FAILURE
        errors = [line for line in err.splitlines() if "error:" in line]
        assert len(errors) == 1 and "older layout" in errors[0] and RECORDS_FORMAT in errors[0]
        assert err.rstrip().endswith(errors[0])  # one line, nothing after it
    assert (old / "records.jsonl").read_text() == records


def test_click_plot_draws_each_recorded_xy_click_at_its_pixel(first_run, monkeypatch):
    import jaxseg_robust.reports.figures as figures
    from jaxseg_robust.reports.tetris import click_figure

    _, out, _, _, _ = first_run
    record = records_by_status(out)[0]["a0"]
    drawn = {}
    monkeypatch.setattr(figures, "prompts_figure", lambda image, **kwargs: drawn.update(kwargs))
    click_figure(record, ("min", "baseline"), np.zeros((40, 48, 3), np.uint8))
    for label, (points, positive) in drawn["clicks"].items():
        part = record["payload"][label.split()[0]]
        # drawn at the recorded (x, y), the signs unchanged
        np.testing.assert_array_equal(points, np.asarray(part["clicks_xy"], np.float32))
        np.testing.assert_array_equal(positive, part["is_positive"])
    assert len(drawn["clicks"]) == 2


def test_target_iou_adds_its_noc_column_and_stops_nothing(tmp_path, capsys):
    folder = make_folder(tmp_path, bad=False)
    out = tmp_path / "run"
    argv = ["tetris", "--model", "sam_tiny", *folder_flags(folder), "--out", str(out), "--mode", "baseline",
            "--n-clicks", "3", "--target-iou", "0.95", "--limit", "2", "--progress", "none"]
    code, stdout, err = run_cli(argv, capsys)
    assert code == cli.EXIT_OK, err
    header = next(line for line in stdout.splitlines() if line.startswith("| dataset |"))
    assert "NoC@80" in header and "NoC@95" in header and ">=3@95" in header
    records = list(records_by_status(out)[0].values())
    assert all(len(r["payload"]["baseline"]["iou"]) == 3 for r in records)  # no early stop
    expected = trajectory_scores([r["payload"]["baseline"] for r in records], num_clicks=3, noc_thresholds=(0.95,))
    cells = dict(zip([h.strip() for h in header.strip("|").split("|")], table_cells(stdout)))
    assert float(cells["NoC@95"]) == pytest.approx(expected["noc@95"], abs=0.006)
    assert json.loads((out / "manifest.json").read_text())["config"]["target_iou"] == 0.95
    code, _, err = run_cli(["report", str(out)], capsys)
    assert code == cli.EXIT_OK, err
    assert "NoC@95" in (out / "report" / "tetris.md").read_text()
    assert_command_error("tetris", argv[:-2] + ["--target-iou", "1.5", "--out", str(tmp_path / "r2")], capsys,
                         "--target-iou")


def test_tetris_table_noc80_target_and_timing_columns():
    records = [_record("a", "1", baseline=[0.5, 0.81, 0.86, 0.96]),
               _record("a", "2", baseline=[0.3, 0.5, 0.7, 0.91])]
    table = tetris_table(records)
    assert table.columns == ("iou_base", "biou_base", "noc80", "noc85", "noc90", "nof85", "nof90")
    assert table.rows[0].values["noc80"] == pytest.approx((2 + 4) / 2)
    table = tetris_table(records, target_iou=0.95,
                         timings={("a", "1"): {"seconds": 2.0, "clicks": 4}, ("a", "2"): {"seconds": 4.0, "clicks": 4}})
    assert table.columns[-4:] == ("nof90", "nof95", "sec_instance", "sec_click") and "noc95" in table.columns
    values = table.rows[0].values
    assert values["noc95"] == pytest.approx((4 + 4) / 2) and values["nof95"] == 2
    assert values["sec_instance"] == pytest.approx(3.0) and values["sec_click"] == pytest.approx(6.0 / 8)
    markdown = to_markdown(table)
    assert "NoC@95" in markdown and ">=4@95" in markdown and "| 3 | 0.75 |" in markdown
    assert to_csv(table).splitlines()[0].endswith("noc95,nof85,nof90,nof95,sec_instance,sec_click")
    assert tetris_table(records, target_iou=0.9).columns == tetris_table(records).columns
    assert tetris_table(records, target_iou=0.80000001).columns == tetris_table(records).columns
    assert "noc92_5" in tetris_table(records, target_iou=0.925).columns
    with pytest.raises(ValueError, match="target_iou"):
        tetris_table(records, target_iou=1.5)
