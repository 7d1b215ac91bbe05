"""`jaxseg-robust perturb --dataset voc|cityscapes` on tiny random models and generated dataset folders.

One module-scoped VOC run (a tiny PSPNet; three 40x50 VOC images resized to
24x30, one image with a label value outside VOC's classes, PAdam-Cos with one
step) checks the records, the paper-layout tables and the failed instance
naming its file; one Cityscapes run (a tiny UPerNet-ConvNeXt saved as the
port saves it; three images in two cities of the official
leftImg8bit / gtFine layout, label ids mapped to train ids, DAG-0.003 with
two iterations) checks the train-id confusions, the ignored void and the
tables without background rows (``slow``). The flag checks only parse and list (nothing
is compiled). docs/protocols/perturbation.md.
"""

from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest
from semantic_folders import make_cityscapes, save_semseg, save_upernet, write_voc

from jaxseg_robust.cli import EXIT_FAILURE, EXIT_PARTIAL, main
from jaxseg_robust.commands import build_parser
from jaxseg_robust.commands.perturb import spec_of
from jaxseg_robust.data.semantic import CITYSCAPES_EVAL_IDS, resize_labels
from jaxseg_robust.reports import perturb as report
from jaxseg_robust.reports.perturb_tables import per_attack_rows, worst_case_rows
from jaxseg_robust.runner.records import read_run_records

IDS = ("2007_000001", "2007_000002", "2007_000003")
BAD_ID = "2007_000009"
CITIES = {"lindau": ["lindau_000001_000019", "lindau_000000_000019"], "frankfurt": ["frankfurt_000000_000294"]}
CITYSCAPES_HW = (32, 64)
# The UPerNet run costs about as much as the VOC one (~30 s on two idle cores, ~50 s at load 9): slow.
SLOW_CITYSCAPES = pytest.mark.slow


@pytest.fixture(scope="module")
def semseg_dir(tmp_path_factory) -> pathlib.Path:
    return save_semseg(tmp_path_factory.mktemp("model") / "pspnet_tiny")


@pytest.fixture(scope="module")
def voc_root(tmp_path_factory) -> pathlib.Path:
    return write_voc(tmp_path_factory.mktemp("data"), IDS, bad=BAD_ID)


@pytest.fixture(scope="module")
def voc_run(tmp_path_factory, semseg_dir, voc_root):
    out = tmp_path_factory.mktemp("runs") / "voc"
    argv = ["perturb", "--model", str(semseg_dir), "--dataset", "voc", "--data-root", str(voc_root),
            "--resize", "shorter:24", "--attacks", "padam-cos", "--padam-steps", "1", "--eps", "8/255",
            "--out", str(out), "--progress", "none", "--examples", "1"]
    return main(argv), out


def _args(*extra):
    return build_parser().parse_args(["perturb", *extra])


def test_voc_run_records_multiclass_confusions_and_names_the_bad_file(voc_run):
    code, out = voc_run
    assert code == EXIT_PARTIAL  # the bad label file fails its own instance only
    records = {r["id"]: r for r in read_run_records(out)}
    assert set(records) == {*IDS, BAD_ID}
    assert records[BAD_ID]["status"] == "failed"
    assert f"{BAD_ID}.png" in records[BAD_ID]["error"] and "[50]" in records[BAD_ID]["error"]
    config = json.loads((out / "manifest.json").read_text())["config"]
    assert config["dataset"] == "voc" and config["resize"] == "shorter:24"
    assert config["void_policy"] == "as_background" and config["num_classes"] == 21
    assert config["candidates"] == ["clean", "padam_cos"]
    for image_id in IDS:
        payload = records[image_id]["payload"]
        confusions = np.asarray(payload["confusions"])
        assert confusions.shape == (2, 21, 21)
        assert (payload["height"], payload["width"]) == (24, 30)
        assert confusions[0].sum() == 23 * 30  # the void first row is not counted
        np.testing.assert_array_equal(payload["clean_confusion"], confusions[0])
        assert 0 <= payload["worst_miou"] < 2 and 0 <= payload["worst_accuracy"] < 2


def test_voc_run_writes_the_paper_tables(voc_run, capsys):
    _, out = voc_run
    compiled = [json.loads(line) for line in (out / "compile.jsonl").read_text().splitlines()]
    assert compiled[-1]["programs"] == 2 and compiled[-1]["compiles"] == 2  # PAdam + scoring, one bucket
    for name in ("worst_case.md", "worst_case.csv", "per_attack.md", "per_attack.csv", "report.md"):
        assert (out / "report" / name).is_file(), name
    run = report.load_run(out)
    rows = worst_case_rows([run], ["tiny"])
    assert [(r["metric"], r["setting"]) for r in rows] == [
        ("Acc", ""), ("Acc", "fg"), ("CmIoU", ""), ("CmIoU", "fg"), ("NmIoU", ""), ("NmIoU", "fg")]
    for row in rows:
        clean, robust = (float(v) for v in row["tiny"].split(" / "))
        assert robust <= clean + 1e-9 or row["metric"] == "CmIoU"  # CmIoU is not per-image monotone
    attacks = [r["attack"] for r in per_attack_rows(run)]
    assert attacks == ["clean", "PAdam-Cos", "aggregated"]
    table = (out / "report" / "worst_case.md").read_text()
    assert "| Acc | fg |" in table


def _listed_and_battery(args):
    """(the listed instances, the `BatteryConfig` of the 21-class tiny PSPNet) of the flags' run spec."""
    spec = spec_of(args)
    spec.protocol.check()
    listed = spec.protocol.load_instances(spec.data, say=print)
    return listed.refs, spec.protocol.battery_config(21, 0)


def test_flags_reach_the_battery_config(semseg_dir, voc_root):
    common = ["--model", str(semseg_dir), "--dataset", "voc", "--data-root", str(voc_root), "--out", "unused"]
    instances, battery = _listed_and_battery(_args(*common))
    assert [i.size for i in instances] == [(512, 640)] * 4  # the paper's shorter side -> 512 (listing only)
    assert (battery.msl_track, battery.alma_lr_init, battery.include_clean, battery.select_with_background,
            battery.reference_quirks, battery.void_policy) == (None, 1e-4, True, None, True, "as_background")
    assert battery.accelerator_chunk == 1
    instances, battery = _listed_and_battery(_args(
        *common, "--msl-track", "masked", "--alma-lr-init", "1e-3", "--no-include-clean",
        "--select-with-background", "without-background", "--no-reference-quirks", "--void-policy", "ignore",
        "--resize", "longer:25", "--limit", "2", "--accelerator-chunk", "3"))
    assert [i.size for i in instances] == [(20, 25)] * 2
    assert (battery.msl_track, battery.alma_lr_init, battery.include_clean, battery.select_with_background,
            battery.reference_quirks, battery.void_policy) == ("masked", 1e-3, False, False, False, "ignore")
    assert battery.accelerator_chunk == 3
    assert battery.candidate_names()[0] != "clean"


def test_semantic_errors_name_the_file_or_flag(tmp_path, semseg_dir, voc_root, capsys):
    broken = write_voc(tmp_path / "broken", IDS)
    (broken / "VOCdevkit/VOC2012/SegmentationClass" / f"{IDS[1]}.png").unlink()
    out = str(tmp_path / "run")
    code = main(["perturb", "--model", str(semseg_dir), "--dataset", "voc", "--data-root", str(broken),
                 "--out", out, "--progress", "none"])
    assert code == EXIT_FAILURE and f"{IDS[1]}.png" in capsys.readouterr().err
    cityscapes_model = save_semseg(tmp_path / "cs_model", classes=19, background=None)
    code = main(["perturb", "--model", str(cityscapes_model), "--dataset", "voc", "--data-root", str(voc_root),
                 "--out", out, "--progress", "none"])
    assert code == EXIT_FAILURE and "21 classes" in capsys.readouterr().err
    code = main(["perturb", "--model", str(semseg_dir), "--dataset", "voc", "--data-root", str(voc_root),
                 "--resize", "sideways:3", "--out", out, "--progress", "none"])
    assert code == EXIT_FAILURE and "sideways:3" in capsys.readouterr().err


@pytest.fixture(scope="module")
def cityscapes_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("cityscapes")
    raw = make_cityscapes(root, CITIES, size=(2 * CITYSCAPES_HW[0], 2 * CITYSCAPES_HW[1]))
    model = save_upernet(tmp_path_factory.mktemp("model") / "upernet_tiny", classes=19, background=None)
    out = tmp_path_factory.mktemp("runs") / "cityscapes"
    argv = ["perturb", "--model", str(model), "--dataset", "cityscapes", "--data-root", str(root),
            "--resize", "fixed:{}x{}".format(*CITYSCAPES_HW), "--attacks", "dag-0.003", "--dag-iterations", "2",
            "--out", str(out), "--progress", "none", "--examples", "1"]
    return main(argv), out, raw


@SLOW_CITYSCAPES
def test_cityscapes_run_with_upernet_counts_train_ids_only(cityscapes_run):
    code, out, raw = cityscapes_run
    assert code == 0
    records = {r["id"]: r for r in read_run_records(out)}
    assert sorted(records) == sorted(raw)
    config = json.loads((out / "manifest.json").read_text())["config"]
    assert (config["dataset"], config["family"], config["resize"]) == ("cityscapes", "upernet", "fixed:32x64")
    assert (config["void_policy"], config["num_classes"], config["background_class"]) == ("ignore", 19, None)
    assert config["candidates"] == ["clean", "dag_0.003"]
    for key, ids in raw.items():
        payload = records[key]["payload"]
        confusions = np.asarray(payload["confusions"])
        assert confusions.shape == (2, 19, 19)
        assert (payload["height"], payload["width"]) == CITYSCAPES_HW
        counted = np.isin(resize_labels(ids, CITYSCAPES_HW), CITYSCAPES_EVAL_IDS).sum()
        assert 0 < counted < np.prod(CITYSCAPES_HW)  # the ids other than the 19 train ids are void
        assert confusions.sum(axis=(1, 2)).tolist() == [counted, counted]
        labels = resize_labels(ids, CITYSCAPES_HW)
        for train_id in (0, 18):  # label ids 7 (road) and 33 (bicycle) are the first and last rows
            assert confusions[0, train_id].sum() == (labels == CITYSCAPES_EVAL_IDS[train_id]).sum()
        assert payload["backwards"][0] == 0 and 1 <= payload["backwards"][1] <= 2  # clean, DAG


@SLOW_CITYSCAPES
def test_cityscapes_run_writes_tables_without_background_rows(cityscapes_run):
    _, out, _ = cityscapes_run
    compiled = [json.loads(line) for line in (out / "compile.jsonl").read_text().splitlines()]
    assert compiled[-1]["programs"] == 2 and compiled[-1]["compiles"] == 2  # DAG + scoring, one size
    run = report.load_run(out)
    rows = worst_case_rows([run], ["upernet"])
    assert [(r["metric"], r["setting"]) for r in rows] == [("Acc", ""), ("CmIoU", ""), ("NmIoU", "")]
    for row in rows:
        clean, robust = (float(v) for v in row["upernet"].split(" / "))
        assert 0 <= robust <= 100 and 0 <= clean <= 100
    assert [r["attack"] for r in per_attack_rows(run)] == ["clean", "DAG-0.003", "aggregated"]
    per_attack = (out / "report" / "per_attack.md").read_text()
    assert "with background" in per_attack and "without background" not in per_attack
    assert len(list((out / "examples").glob("*.npz"))) == 1


def test_padded_voc_run_compiles_one_program_set_for_several_sizes(tmp_path, semseg_dir):
    sizes = {"2008_000001": (40, 50), "2008_000002": (40, 56), "2008_000003": (44, 40)}
    root = write_voc(tmp_path / "mixed", tuple(sizes), sizes=sizes)
    out = tmp_path / "padded"
    argv = ["perturb", "--model", str(semseg_dir), "--dataset", "voc", "--data-root", str(root),
            "--resize", "shorter:24", "--pad-to-multiple", "40", "--attacks", "padam-ce", "--padam-steps", "1",
            "--out", str(out), "--progress", "none", "--examples", "3"]
    assert main(argv) == 0
    compiled = [json.loads(line) for line in (out / "compile.jsonl").read_text().splitlines()]
    assert compiled[-1]["programs"] == 2 and compiled[-1]["compiles"] == 2  # 24x30, 24x33, 26x24 -> one 40x40 frame
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["config"]["pad_to_multiple"] == 40 and "40" in manifest["engine"]["frame_policy"]
    records = {r["id"]: r["payload"] for r in read_run_records(out)}
    expected = {"2008_000001": (24, 30), "2008_000002": (24, 33), "2008_000003": (26, 24)}
    for image_id, (height, width) in expected.items():
        assert (records[image_id]["height"], records[image_id]["width"]) == (height, width)
        confusions = np.asarray(records[image_id]["confusions"])
        assert confusions.sum(axis=(1, 2)).tolist() == [(height - 1) * width] * 2  # image pixels, void row out
        example = np.load(out / "examples" / f"voc__{image_id}.npz")
        assert example["adversarial"].shape == (height, width, 3) and example["valid"].shape == (height, width)
