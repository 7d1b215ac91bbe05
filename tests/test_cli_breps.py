"""End-to-end tests of `jaxseg-robust breps` on a generated image/mask folder with the tiny random SAM."""

from __future__ import annotations

import csv
import json
import math
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from PIL import Image

from jaxseg_robust import cli
from jaxseg_robust.commands import flags as prompt_flags
from jaxseg_robust.data.user_boxes import resized_prompt_box
from jaxseg_robust.reports.breps import breps_table, to_csv, to_markdown
from jaxseg_robust.runner.records import latest_records, read_records, read_run_records

from cli_helpers import (
    ATTACK_ARGPARSE_ERRORS,
    BAD,
    GOOD,
    HEIGHT,
    WIDTH,
    assert_argparse_rejects,
    assert_command_error,
    assert_resume_refused,
    assert_resume_skips_everything,
    assert_timed_summary,
    folder_flags,
    help_text,
    make_folder,
    records_by_status,
    run_on_new_folder,
    run_cli,
    table_cells,
    write_pair,
)

STEPS = "3"
LR_MULT = "60"  # tiny images: move the box by a few pixels per step


def breps_argv(folder, out, *extra: str) -> list[str]:
    return ["breps", "--model", "sam_tiny", *folder_flags(folder), "--out", str(out), "--n_opt_steps", STEPS,
            "--lr_mult", LR_MULT, "--progress", "none", *extra]


@pytest.fixture(scope="module")
def first_run(tmp_path_factory):
    """One minmax run over 3 good and 2 bad instances (the only compile of this module)."""
    return run_on_new_folder(tmp_path_factory, "breps",
                             lambda folder, out: breps_argv(folder, out, "--batch-size", "2"))


def test_seconds_per_instance_and_compile_time_in_the_run_directory_and_summary(first_run):
    assert_timed_summary(first_run[1])


def test_help_has_an_example_and_breps_flags(capsys):
    out = help_text("breps", capsys)
    assert "jaxseg-robust breps --model sam_vit_b --datasets" in out
    for flag in ("--n_opt_steps", "--n-opt-steps", "--lr_mult", "--thresh", "--mode", "--user-boxes",
                 "--batch-size", "--batch_size", "--limit", "--seed"):
        assert flag in out


def test_run_records_failures_table_and_exit_code(first_run):
    folder, out, code, stdout, stderr = first_run
    assert code == cli.EXIT_PARTIAL, stderr
    ok, failed, records = records_by_status(out)
    assert len(records) == 5
    assert set(ok) == set(GOOD)
    assert set(failed) == set(BAD)
    assert "b_mismatch.png" in failed["b_mismatch"]["error"] and "size" in failed["b_mismatch"]["error"]
    assert "b_unreadable.png" in failed["b_unreadable"]["error"]
    for record in ok.values():
        payload = record["payload"]
        tight, low, high = (payload["tight_selection_iou"], payload["min"]["selection_iou"],
                            payload["max"]["selection_iou"])
        assert low <= tight <= high
        assert len(payload["min"]["trajectory"]["box_resized"]) == int(STEPS)
        assert payload["tight_box"][0] <= payload["tight_box"][2] < WIDTH
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["config"]["mode"] == "minmax" and manifest["config"]["n_opt_steps"] == int(STEPS)
    assert manifest["config"]["model_source"] == "random:0"
    assert manifest["fingerprints"]["model"].startswith("sha256:")
    # the summary: counts and per-dataset means of the records
    assert "5 instances: 3 ok, 2 failed" in stdout
    assert "failed toy/b_mismatch" in stdout
    cells = table_cells(stdout)
    assert cells[:3] == ["toy", "3", "2"]
    mean_min = np.mean([r["payload"]["min"]["iou"] for r in ok.values()])
    mean_max = np.mean([r["payload"]["max"]["iou"] for r in ok.values()])
    mean_tight = np.mean([r["payload"]["tight_iou"] for r in ok.values()])
    assert float(cells[3]) == pytest.approx(100 * mean_tight, abs=0.006)
    assert float(cells[4]) == pytest.approx(100 * mean_min, abs=0.006)
    assert float(cells[5]) == pytest.approx(100 * mean_max, abs=0.006)
    assert float(cells[6]) == pytest.approx(100 * (mean_max - mean_min), abs=0.006)
    with open(out / "summary.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert rows[0]["dataset"] == "toy" and rows[0]["failed"] == "2"
    assert float(rows[0]["iou_min"]) == pytest.approx(mean_min, rel=1e-6)
    assert (out / "summary.md").read_text().startswith("| dataset |")


def test_resume_does_nothing_new_and_prints_the_same_table(first_run, capsys):
    folder, out, _, stdout, _ = first_run
    assert_resume_skips_everything(breps_argv(folder, out, "--batch-size", "2"), out, stdout, capsys,
                                   expected_code=cli.EXIT_PARTIAL,
                                   skipped="0 ok, 0 failed, 5 skipped (already recorded, 2 of them failed)")


def test_changed_settings_refuse_to_resume(first_run, capsys):
    folder, out, _, _, _ = first_run
    assert_resume_refused(breps_argv(folder, out, "--lr_mult", "5"), capsys, "config.lr_mult")


@pytest.mark.parametrize("extra, message", [
    (["--mode", "user"], "--user-boxes"),
    (["--user-boxes", "x.csv"], "needs --mode user"),
    (["--thresh", "1.5"], "--thresh"),
    (["--frame", "round:0"], "--frame"),
    (["--model", "no_such_model"], "unknown model"),
])
def test_bad_arguments_exit_2_with_a_clear_error(tmp_path, capsys, extra, message):
    folder = make_folder(tmp_path, bad=False)
    assert_command_error("breps", breps_argv(folder, tmp_path / "run", *extra), capsys, message)


@pytest.mark.parametrize("argv, message", ATTACK_ARGPARSE_ERRORS)
def test_argparse_rejects_bad_values(tmp_path, capsys, argv, message):
    assert_argparse_rejects("breps", argv, tmp_path, capsys, message)


def test_missing_data_is_a_clear_error(tmp_path, capsys):
    code, _, err = run_cli(["breps", "--model", "sam_tiny", "--datasets", "grabcut", "--data-root",
                            str(tmp_path), "--out", str(tmp_path / "run")], capsys)
    assert code == cli.EXIT_FAILURE and "grabcut" in err
    code, _, err = run_cli(["breps", "--model", "sam_tiny", "--out", str(tmp_path / "run")], capsys)
    assert code == cli.EXIT_FAILURE and "--datasets" in err


def test_flag_spellings_and_frame_policy():
    assert prompt_flags.flag_spellings("--n-opt-steps") == ["--n-opt-steps", "--n_opt_steps"]
    assert prompt_flags.flag_spellings("--thresh") == ["--thresh"]
    assert prompt_flags.parse_frame_policy("exact").description == "exact"
    assert prompt_flags.parse_frame_policy("round:32").description == "round_up:32"
    assert prompt_flags.parse_frame_policy("fixed:40x50").description == "fixed:40x50"
    for bad in ("round", "fixed:4x", "round:-1", "square"):
        with pytest.raises(prompt_flags.CommandError, match="--frame"):
            prompt_flags.parse_frame_policy(bad)


# ---- the report (pure) ---------------------------------------------------------------------

def _record(dataset, name, status="ok", **payload):
    return {"dataset": dataset, "id": name, "status": status, "error": None if status == "ok" else "E: x",
            "payload": payload}


def test_breps_table_minmax_means_delta_failed_and_nan():
    def attack(tight, low, high):
        def half(value):
            return None if value is None else value / 2
        return dict(tight_iou=tight, tight_biou=half(tight), min={"iou": low, "biou": half(low)},
                    max={"iou": high, "biou": half(high)})
    records = [_record("a", "1", **attack(0.8, 0.5, 0.9)), _record("a", "2", **attack(0.6, 0.3, 0.7)),
               _record("a", "3", status="failed"), _record("b", "1", **attack(0.5, 0.2, None)),
               _record("b", "2", **attack(0.7, 0.4, 0.8))]
    table = breps_table(records, "minmax")
    a, b, mean = table.rows
    assert (a.dataset, a.ok, a.failed, a.undefined) == ("a", 2, 1, 0)
    assert a.values["iou_tight"] == pytest.approx(0.7) and a.values["iou_min"] == pytest.approx(0.4)
    assert a.values["iou_delta"] == pytest.approx(0.8 - 0.4)
    assert b.undefined == 1 and b.values["iou_max"] == pytest.approx(0.8)  # NaN (null) skipped
    assert mean.dataset == "mean" and mean.ok == 4 and mean.failed == 1
    assert mean.values["iou_min"] == pytest.approx((0.4 + 0.3) / 2)
    markdown = to_markdown(table)
    assert "| a | 2 | 1 | 70.00 | 40.00 | 80.00 | 40.00 | 0 |" in markdown and "undefined" in markdown
    assert "IoU-Tight@BBox (multimask + selection)" in markdown  # the attack's iterate 0 is a multimask decode
    lines = to_csv(table).splitlines()
    assert lines[0].startswith("dataset,ok,failed,undefined,iou_tight_multimask,iou_min,iou_max,iou_delta")
    assert "biou_tight_multimask" in lines[0] and len(lines) == 4


def test_breps_table_other_modes():
    table = breps_table([_record("d", "1", tight_iou=0.5, tight_biou=0.4, iou=0.3, biou=0.2)], "min")
    assert table.columns == ("iou_tight", "iou_min", "biou_tight", "biou_min") and len(table.rows) == 1
    assert table.rows[0].values["iou_min"] == pytest.approx(0.3)
    table = breps_table([_record("d", "1", iou=0.5, biou=0.4, iou_resized=0.45)], "tight")
    assert table.rows[0].values["iou_tight_resized"] == pytest.approx(0.45)
    # the fixed tight box is a single-mask decode: its headers and CSV names say so
    assert "IoU-Tight@BBox (single mask)" in to_markdown(table)
    assert "IoU-Tight (resized, single mask)" in to_markdown(table)
    assert to_csv(table).splitlines()[0] == ("dataset,ok,failed,undefined,iou_tight_single,biou_tight_single,"
                                             "iou_tight_single_resized")
    table = breps_table([_record("d", "1", mean_iou=0.5, mean_biou=0.4, mean_iou_resized=0.6)], "jitter")
    assert table.rows[0].values["iou_jitter"] == pytest.approx(0.5)
    users = [_record("d", "1", iou=[0.5, 0.7], iou_resized=[0.4, 0.6]),
             _record("d", "2", iou=[0.9], iou_resized=[0.8])]
    row = breps_table(users, "user").rows[0]
    assert row.values["iou_user"] == pytest.approx((0.6 + 0.9) / 2)
    assert row.values["iou_user_std"] == pytest.approx(np.std([0.5, 0.7], ddof=1))  # one-user image skipped
    assert row.undefined == 0
    with pytest.raises(ValueError, match="mode"):
        breps_table([], "median")
    with pytest.raises(ValueError, match="d/1"):
        breps_table([_record("d", "1", iou=0.5)], "minmax")
    assert math.isnan(breps_table([_record("d", "1", status="failed")], "tight").rows[0].values["iou_tight"])


# ---- user boxes (fixed boxes, single-mask output) -------------------------------------------

def test_user_boxes_csv(tmp_path, capsys):
    folder = make_folder(tmp_path, bad=False)
    boxes = tmp_path / "boxes.csv"
    boxes.write_text("image_id,x1,y1,x2,y2,user\n"
                     "a0,10,8,38,32,u1\na0,12,6,36,30,u2\ntoy/a1,9,9,40,30,u1\nzz,1,1,5,5,u1\n")
    out = tmp_path / "run"
    code, stdout, err = run_cli(breps_argv(folder, out, "--mode", "user", "--user-boxes", str(boxes)), capsys)
    assert code == cli.EXIT_OK, err
    assert "not instances were ignored: zz" in err and "1 instance(s) have no user box" in err
    records = latest_records(read_run_records(out))
    assert {key[1] for key in records} == {"a0", "a1"}
    a0 = records["toy", "a0"]["payload"]
    assert a0["users"] == ["u1", "u2"] and len(a0["iou"]) == 2
    np.testing.assert_allclose(a0["boxes"], [[10, 8, 38, 32], [12, 6, 36, 30]])
    assert all(0.0 <= v <= 1.0 for v in a0["iou"] + a0["iou_resized"])
    row = next(line for line in stdout.splitlines() if line.startswith("| toy |"))
    assert row.split("|")[2].strip() == "2"
    # the BREPS layout: one PNG per user box, <image stem>_1_<user>.png; boxes in SAM's resized frame
    prompts = tmp_path / "prompts"
    prompts.mkdir()
    for user, (x1, y1, x2, y2) in (("u1", (10, 8, 38, 32)), ("u2", (12, 6, 36, 30))):
        drawn = np.zeros((HEIGHT, WIDTH), np.uint8)
        drawn[y1:y2 + 1, x1:x2 + 1] = 255
        Image.fromarray(drawn).save(prompts / f"a2_1_{user}.png")
    out2 = tmp_path / "run_masks"
    code, _, err = run_cli(breps_argv(folder, out2, "--mode", "user", "--user-box-masks", str(prompts),
                                      "--box-frame", "resized"), capsys)
    assert code == cli.EXIT_OK, err
    payload = latest_records(read_run_records(out2))["toy", "a2"]["payload"]
    assert payload["users"] == ["u1", "u2"] and payload["box_frame"] == "resized"
    drawn = np.asarray(Image.open(prompts / "a2_1_u1.png")) > 0
    np.testing.assert_allclose(payload["boxes"][0], resized_prompt_box(drawn, 128))  # sam_tiny's input side
    assert payload["boxes"][0][2] > 38 * 128 / WIDTH - 1  # really the resized frame, not the image's


# ---- a kill at the CLI level --------------------------------------------------------------

@pytest.mark.slow
def test_sigkill_mid_run_then_resume_completes_without_duplicates(tmp_path):
    folder = make_folder(tmp_path, bad=False)
    for index in range(3, 8):
        write_pair(folder, f"a{index}", index)
    out = tmp_path / "run"
    argv = [sys.executable, "-m", "jaxseg_robust.cli", *breps_argv(folder, out, "--batch-size", "1")]
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    process = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    records_file = out / "records.jsonl"
    deadline = time.monotonic() + 300
    while process.poll() is None and time.monotonic() < deadline:
        if records_file.exists() and records_file.read_bytes().count(b"\n") >= 2:
            break
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=60)
    process.stderr.close()
    survived = read_records(records_file)
    assert 2 <= len(survived) < 8
    finished = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    assert finished.returncode == cli.EXIT_OK, finished.stderr[-2000:]
    final = read_records(records_file)
    keys = [(r["dataset"], r["id"]) for r in final]
    assert len(keys) == len(set(keys)) == 8
    assert final[:len(survived)] == survived  # nothing completed was lost or rewritten
    assert f"{8 - len(survived)} ok, 0 failed, {len(survived)} skipped" in finished.stdout


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["jitter", "tight"])
def test_fixed_box_modes(tmp_path, capsys, mode):
    folder = make_folder(tmp_path, bad=False)
    out = tmp_path / "run"
    code, stdout, err = run_cli(breps_argv(folder, out, "--mode", mode, "--limit", "2"), capsys)
    assert code == cli.EXIT_OK, err
    records = latest_records(read_run_records(out))
    assert len(records) == 2
    table = breps_table(records.values(), mode)
    column = "iou_jitter" if mode == "jitter" else "iou_tight"
    expected = np.mean([r["payload"]["mean_iou" if mode == "jitter" else "iou"] for r in records.values()])
    assert table.rows[0].values[column] == pytest.approx(expected)
    assert_timed_summary(out)  # the fixed boxes are timed like the attack
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["config"]["mode"] == mode and "n_opt_steps" not in manifest["config"]
    if mode == "jitter":
        payload = next(iter(records.values()))["payload"]
        assert manifest["config"]["seed"] == 42
        # the count is the number of valid jitter slots, each of which carries a finite IoU
        assert payload["n_boxes"] == int(np.sum(payload["box_valid"])) >= 1
        ious = np.asarray(payload["iou"], float)
        assert np.isfinite(ious[np.asarray(payload["box_valid"], bool)]).all()
        assert payload["mean_iou"] == pytest.approx(np.nanmean(ious[np.asarray(payload["box_valid"], bool)]))


# ---- predicted masks, start-up lines, device help (issue 12) -----------------------------------

def test_help_says_how_to_pick_the_device(capsys):
    assert "JAX_PLATFORMS=cpu|cuda|tpu" in help_text("breps", capsys)


def test_startup_lines_on_stderr(first_run):
    *_, stderr = first_run
    assert "loading sam_tiny ..." in stderr
    assert "compiling the BREPS program (minmax) for bucket 64x64, batch 2 (first batch) ..." in stderr


def test_attack_masks_beside_the_records_match_the_recorded_iou(first_run, tmp_path, capsys):
    from jaxseg_robust.data.datasets import list_dataset_folder
    from jaxseg_robust.reports.artifacts import read_mask

    folder, out, _, _, _ = first_run
    ok, _, _ = records_by_status(out)
    refs = {ref.id: ref for ref in list_dataset_folder("folder", folder, name="toy", images_dir=str(folder / "images"),
                                                       masks_dir=str(folder / "masks"), on_bad_pair="fail")}
    for name in GOOD:
        gt = np.asarray(refs[name].load().gt)
        for attack in ("min", "max"):
            assert "mask" not in ok[name]["payload"][attack]
            mask = read_mask(out, ("toy", name), attack)
            assert mask is not None and mask.shape == (HEIGHT, WIDTH)
            union = ((mask | (gt == 1)) & (gt >= 0)).sum()
            iou = ((mask & (gt == 1)) & (gt >= 0)).sum() / union if union else math.nan
            assert iou == pytest.approx(ok[name]["payload"][attack]["iou"], abs=1e-6), (name, attack)
    report = tmp_path / "report"
    code, _, err = run_cli(["report", str(out), "--out", str(report)], capsys)
    assert code == cli.EXIT_OK, err
    assert {f"masks_toy_{name}.png" for name in GOOD} <= {p.name for p in report.iterdir()}
    assert "![a0 predicted masks](masks_toy_a0.png)" in (report / "report.md").read_text()
