"""`jaxseg-robust perturb` and its report on a tiny generated dataset with a tiny random dense model.

One module-scoped run (3 instances of one size, a two-class tiny DeepLabV3,
one max-damage and one min-norm attack with 2-step budgets: each compiles
once) feeds several checks: records and resume, the report files, a failing
instance (exit 1), argument errors (exit 2). The whole battery and a
SAM-family model are exercised by the slow tests.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import pathlib

import jax
import numpy as np
import pytest
from PIL import Image

from jaxseg_robust.cli import EXIT_FAILURE, EXIT_OK, EXIT_PARTIAL, main
from jaxseg_robust.commands.perturb import parse_attacks, parse_epsilon
from jaxseg_robust.models.dense import DeepLabV3Dense, U2NetDense
from jaxseg_robust.reports import perturb as report
from jaxseg_robust.runner.records import read_run_records
from jaxseg_robust.models import store

from cli_helpers import assert_argparse_rejects, assert_device_busy_line
from dense_configs import TINY_DEEPLAB, TINY_U2NET

HEIGHT, WIDTH = 14, 18
ATTACKS = "padam-ce,dag-0.003"
BUDGETS = ["--padam-steps", "2", "--sea-iterations", "4", "--dag-iterations", "2", "--pdpgd-steps", "2",
           "--alma-steps", "2"]
BINARY_DEEPLAB = dataclasses.replace(TINY_DEEPLAB, num_classes=2, aux_classifier=False)
CANDIDATES = ["clean", "padam_ce", "dag_0.003"]
LABELS = ["clean", "PAdam-CE", "DAG-0.003"]


def write_dataset(root: pathlib.Path, count: int, seed: int = 0) -> pathlib.Path:
    """``root/images/*.png`` + ``root/masks/*.png`` (object = 255): a bright square on noise."""
    rng = np.random.default_rng(seed)
    (root / "images").mkdir(parents=True, exist_ok=True)
    (root / "masks").mkdir(parents=True, exist_ok=True)
    for index in range(count):
        image = rng.integers(0, 120, (HEIGHT, WIDTH, 3), dtype=np.uint8)
        mask = np.zeros((HEIGHT, WIDTH), np.uint8)
        y, x = rng.integers(1, HEIGHT // 2), rng.integers(1, WIDTH // 2)
        mask[y:y + 5, x:x + 6] = 255
        image[mask > 0] += 120
        Image.fromarray(image).save(root / "images" / f"im{index}.png")
        Image.fromarray(mask).save(root / "masks" / f"im{index}.png")
    return root


def save_model(path: pathlib.Path, model, family: str) -> pathlib.Path:
    """A converted-model directory holding ``model`` with random weights."""
    variables = jax.tree.map(np.asarray, model.init(jax.random.key(0)))
    store.save(path, variables, family=family, variant="tiny", config=model.config.to_dict())
    return path


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> pathlib.Path:
    """A converted-model directory holding a tiny random two-class DeepLabV3."""
    return save_model(tmp_path_factory.mktemp("model") / "tiny_deeplab", DeepLabV3Dense(BINARY_DEEPLAB), "deeplabv3")


@pytest.fixture(scope="module")
def first_run(tmp_path_factory, tiny_model):
    """(exit code, run dir, dataset dir, captured stdout) of one full run."""
    root = tmp_path_factory.mktemp("perturb")
    data = write_dataset(root / "toyset", 3)
    out = root / "run"
    argv = ["perturb", "--model", str(tiny_model), "--datasets", str(data), "--attacks", ATTACKS, "--eps", "8/255",
            "--out", str(out), "--progress", "none", "--examples", "2", *BUDGETS]
    return main(argv), out, data, argv


def test_full_run_records_every_instance_and_writes_the_report(first_run, capsys):
    code, out, _, _ = first_run
    assert code == EXIT_OK
    records = read_run_records(out)
    assert sorted(r["id"] for r in records) == ["im0", "im1", "im2"]
    assert all(r["status"] == "ok" for r in records)
    manifest = json.loads((out / "manifest.json").read_text())
    names = manifest["config"]["candidates"]
    assert names == CANDIDATES
    payload = records[0]["payload"]
    assert np.asarray(payload["confusions"]).shape == (3, 2, 2)
    assert np.asarray(payload["confusions"])[0].sum() == HEIGHT * WIDTH  # every pixel labelled
    np.testing.assert_array_equal(payload["forwards"][:2], [0, 2])  # clean: none; PAdam: 2 steps
    for name in ("report.md", "table.md", "table.csv", "wins.csv", "miou_hist.png", "examples.png"):
        assert (out / "report" / name).is_file(), name
    assert len(list((out / "examples").glob("*.npz"))) == 2
    with open(out / "report" / "table.csv") as handle:
        rows = list(csv.DictReader(handle))
    attacks = [r["attack"] for r in rows if r["mode"] == "with background"]
    assert attacks == [*LABELS, "aggregated"]
    for image in ("miou_hist.png", "examples.png"):
        assert (out / "report" / image).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_report_numbers_are_consistent(first_run):
    _, out, _, _ = first_run
    run = report.load_run(out)
    assert run.confusions.shape == (3, 3, 2, 2) and not run.failed
    rows = {(r["mode"], r["attack"]): r for r in report.metric_rows(run)}
    for mode in ("with background", "without background"):
        aggregated = rows[(mode, "aggregated")]
        for name in LABELS:
            # the per-image worst case is never better than any candidate (image-wise metrics)
            assert aggregated["nmiou"] <= rows[(mode, name)]["nmiou"] + 1e-6
    wins = report.win_counts(run)
    assert sum(w["wins_miou"] for w in wins) == 3 and sum(w["wins_accuracy"] for w in wins) == 3
    clean, robust = report.image_mious(run)
    assert clean.shape == robust.shape == (3,) and np.all(robust <= clean + 1e-6)
    for values in np.asarray(run.forwards).T:
        assert values[0] == 0


def test_seconds_per_instance_and_compile_time_in_the_run_directory_and_summary(first_run):
    from jaxseg_robust.reports.artifacts import read_compile_events, read_timings

    _, out, _, _ = first_run
    keys = {(r["dataset"], r["id"]) for r in read_run_records(out)}
    timings = read_timings(out)
    assert set(timings) == keys
    for entry in timings.values():  # device: the battery's programs; wall: the whole batch, compile excluded
        assert entry["wall_seconds"] >= entry["seconds"] > 0
    events = read_compile_events(out)
    assert events and all(e["program"] == "perturbation battery" and e["seconds"] > 0 for e in events)
    session = json.loads((out / "compile.jsonl").read_text().splitlines()[-1])
    assert session["compile_seconds"] > 0 and "seconds" not in session  # the session summary stays the last line
    with open(out / "summary.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert [r["attack"] for r in rows if r["mode"] == "with background"] == [*LABELS, "aggregated"]
    for row in rows:
        assert float(row["sec_device"]) == pytest.approx(np.mean([t["seconds"] for t in timings.values()]))
        assert float(row["sec_wall"]) == pytest.approx(np.mean([t["wall_seconds"] for t in timings.values()]))
        assert float(row["compile_sec"]) == pytest.approx(sum(e["seconds"] for e in events))
    markdown = (out / "summary.md").read_text()
    assert "| dataset | timed | s/instance device | s/instance wall |" in markdown
    assert f"compile: {sum(e['seconds'] for e in events):.1f} s for {len(events)} bucket program(s)" in markdown
    assert_device_busy_line(out, markdown)


def test_rerun_resumes_and_a_broken_instance_gives_exit_1(first_run, capsys):
    code, out, data, argv = first_run
    assert main(argv) == EXIT_OK  # everything recorded: nothing recomputed
    assert "3 skipped" in capsys.readouterr().out
    (data / "images" / "im9.png").write_bytes(b"\x89PNG\r\n\x1a\n broken")
    Image.fromarray(np.zeros((HEIGHT, WIDTH), np.uint8)).save(data / "masks" / "im9.png")
    # the dataset grew by one instance: no recorded result is invalidated, so it resumes without an override
    assert main(argv) == EXIT_PARTIAL
    captured = capsys.readouterr()
    assert "im9" in captured.out
    failed = [r for r in read_run_records(out) if r["status"] == "failed"]
    assert [r["id"] for r in failed] == ["im9"]
    assert main(["perturb", "--out", str(out), "--report-only"]) == EXIT_OK
    assert "im9" in (out / "report" / "report.md").read_text()


def test_max_side_is_the_shared_size_guard_and_the_record_says_so(tiny_model, tmp_path, capsys):
    data = write_dataset(tmp_path / "big", 1)
    out = tmp_path / "run"
    argv = ["perturb", "--model", str(tiny_model), "--datasets", str(data), "--attacks", "padam-ce", "--out",
            str(out), "--progress", "none", "--examples", "0", "--no-report", *BUDGETS, "--max_side", "9"]
    assert main(argv) == EXIT_OK
    printed, err = capsys.readouterr()
    (said,) = [line for line in err.splitlines() if line.startswith("resized ")]
    assert said.endswith(f": {HEIGHT}x{WIDTH} -> 7x9 (--max-side 9)")
    assert printed.strip().splitlines()[-1].startswith("1 of 1 instances were resized on load")
    (record,) = read_run_records(out)
    assert record["resized"]["original_size"] == [HEIGHT, WIDTH] and record["resized"]["size"] == [7, 9]
    assert (record["payload"]["height"], record["payload"]["width"]) == (7, 9)
    assert json.loads((out / "manifest.json").read_text())["config"]["max_side"] == 9


@pytest.mark.parametrize("extra, message", [
    (["--attacks", "alma-prox"], "alma-prox needs a model with >= 3 classes"),
    (["--attacks", "fgsm"], "unknown attack"),
    (["--eps", "8/0"], "--eps"),
    (["--eps", "2"], "--eps"),
    (["--sea-iterations", "3"], "--sea-iterations"),
])
def test_bad_arguments_exit_2_with_a_message(first_run, tmp_path, capsys, extra, message):
    _, _, data, _ = first_run
    _, _, _, argv = first_run
    model = argv[argv.index("--model") + 1]
    code = main(["perturb", "--model", model, "--datasets", str(data), "--out", str(tmp_path / "r"), *extra])
    assert code == EXIT_FAILURE
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("extra, message", [
    (["--padam-steps", "0"], "expected a positive integer, got 0"),
    (["--limit", "-1"], "expected a positive integer"),
    (["--examples", "-1"], "expected a non-negative integer"),
])
def test_the_shared_argparse_types_refuse_bad_counts(tmp_path, capsys, extra, message):
    assert_argparse_rejects("perturb", extra, tmp_path, capsys, message)


def test_old_flag_spellings_are_aliases(tmp_path, capsys):
    from jaxseg_robust.commands import build_parser  # noqa: PLC0415

    args = build_parser().parse_args(["perturb", "--model", "m", "--random-init", "--datasets", "d", "--out", "o",
                                      "--max_side", "9", "--batch_size", "2"])
    assert (args.random_weights, args.max_side, args.batch_size) == (0, 9, 2)


def test_missing_model_or_multiclass_gt_is_refused(tmp_path, capsys, first_run):
    _, _, data, _ = first_run
    assert main(["perturb", "--model", str(tmp_path / "nothing"), "--datasets", str(data),
                 "--out", str(tmp_path / "r")]) == EXIT_FAILURE
    deeplab = save_model(tmp_path / "deeplab", DeepLabV3Dense(TINY_DEEPLAB), "deeplabv3")
    assert main(["perturb", "--model", str(deeplab), "--datasets", str(data), "--out", str(tmp_path / "r")]) \
        == EXIT_FAILURE
    assert "--labels prediction" in capsys.readouterr().err
    assert main(["perturb", "--out", str(tmp_path / "not_a_run"), "--report-only"]) == EXIT_FAILURE


def test_help_has_examples(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["perturb", "--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    assert "examples:" in text and "--eps 8/255" in text and "exit codes" in text


def test_attack_and_epsilon_parsing():
    assert parse_attacks("sea,padam-ce") == ("padam_ce", "sea_mce", "sea_bce", "sea_jsd", "sea_msl")
    assert parse_attacks("dag,DAG_0.001") == ("dag_0.001", "dag_0.003")
    assert len(parse_attacks("all")) == 10
    assert parse_epsilon("8/255") == pytest.approx(8 / 255) and parse_epsilon("0.5") == 0.5
    for bad in ("0", "-1/255", "x", ""):
        with pytest.raises(ValueError, match="--eps"):
            parse_epsilon(bad)
    with pytest.raises(ValueError, match="--attacks"):
        parse_attacks(" , ")


@pytest.mark.slow
def test_whole_battery_on_a_tiny_u2net_and_prediction_labels_on_a_multiclass_model(tmp_path, first_run):
    _, _, data, _ = first_run
    u2net = save_model(tmp_path / "u2net", U2NetDense(TINY_U2NET), "u2netp")
    out = tmp_path / "u2"
    code = main(["perturb", "--model", str(u2net), "--datasets", str(data), "--attacks", "padam,sea,dag,pdpgd",
                 "--out", str(out), "--progress", "none", "--limit", "1", *BUDGETS])
    assert code == EXIT_OK
    assert report.load_run(out).confusions.shape == (10, 1, 2, 2)
    deeplab = save_model(tmp_path / "deeplab", DeepLabV3Dense(TINY_DEEPLAB), "deeplabv3")
    out = tmp_path / "dl"
    code = main(["perturb", "--model", str(deeplab), "--labels", "prediction", "--datasets", str(data),
                 "--attacks", "alma-prox", "--out", str(out), "--progress", "none", "--limit", "1", *BUDGETS])
    assert code == EXIT_OK
    run = report.load_run(out)
    assert run.confusions.shape == (2, 1, 5, 5)
    clean = run.confusions[0, 0]
    assert np.trace(clean) == clean.sum()  # the clean prediction is its own label


@pytest.mark.slow
def test_sam_family_model_with_box_prompts(tmp_path, first_run):
    _, _, data, _ = first_run
    out = tmp_path / "sam"
    code = main(["perturb", "--model", "sam_tiny", "--random-init", "--datasets", str(data), "--attacks",
                 "padam-cos", "--padam-steps", "1", "--out", str(out), "--progress", "none", "--limit", "1"])
    assert code == EXIT_OK
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["config"]["kind"] == "prompted" and manifest["config"]["prompt"] == "tight GT box"
    assert len(read_run_records(out)) == 1


@pytest.mark.parametrize("name, reason", [("ritm_tiny", "takes clicks only"),
                                          ("sam2_test", "SAM's image frame")])
def test_families_without_boxes_in_sams_frame_are_refused_before_running(tmp_path, capsys, first_run, name,
                                                                         reason):
    _, _, data, _ = first_run
    out = tmp_path / name
    assert main(["perturb", "--model", name, "--random-init", "--datasets", str(data), "--out", str(out),
                 "--progress", "none", "--limit", "1"]) == EXIT_FAILURE
    err = capsys.readouterr().err
    assert reason in err and name in err
    assert not (out / "records.jsonl").exists()
