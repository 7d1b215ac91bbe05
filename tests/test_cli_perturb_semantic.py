"""`jaxseg-robust perturb --dataset voc|cityscapes` on a tiny random semseg model and a generated VOC folder.

One module-scoped run (three 40x50 VOC images resized to 24x30, one image
with a label value outside VOC's classes, PAdam-Cos with one step) checks the records, the paper-layout tables and the
failed instance naming its file; the flag checks only parse and list
(nothing is compiled). docs/protocols/perturbation.md.
"""

from __future__ import annotations

import json
import pathlib

import jax
import numpy as np
import pytest
from PIL import Image

from jaxseg_robust.cli import EXIT_FAILURE, EXIT_PARTIAL, main
from jaxseg_robust.commands import build_parser
from jaxseg_robust.commands.perturb import prepare
from jaxseg_robust.models import store
from jaxseg_robust.models.dense.semseg import SemsegConfig, SemsegDense
from jaxseg_robust.reports import perturb as report
from jaxseg_robust.reports.perturb_tables import per_attack_rows, worst_case_rows
from jaxseg_robust.runner.records import read_run_records

TINY_SEMSEG = dict(width=4, blocks=(1, 1, 1, 1), head_channels=8, aux_channels=4, bins=(1, 2))
IDS = ("2007_000001", "2007_000002", "2007_000003")
BAD_ID = "2007_000009"


def _palette_png(path, labels: np.ndarray) -> None:
    image = Image.fromarray(labels.astype(np.uint8), mode="P")
    image.putpalette([v for i in range(256) for v in (i, 255 - i, (7 * i) % 256)])
    image.save(path)


def write_voc(root: pathlib.Path, ids, *, bad: str | None = None, size=(40, 50), seed=0) -> pathlib.Path:
    """``root/VOCdevkit/VOC2012`` with JPEG images, palette labels 0..20 + void 255 and ``val.txt``."""
    rng = np.random.default_rng(seed)
    voc = root / "VOCdevkit" / "VOC2012"
    for sub in ("ImageSets/Segmentation", "JPEGImages", "SegmentationClass"):
        (voc / sub).mkdir(parents=True, exist_ok=True)
    for image_id in (*ids, *([bad] if bad else [])):
        image = rng.integers(0, 256, (*size, 3), dtype=np.uint8)
        labels = np.zeros(size, np.uint8)
        labels[5:20, 10:30] = rng.integers(1, 21)
        labels[0, :] = 255
        if image_id == bad:
            labels[3, 3] = 50
        Image.fromarray(image).save(voc / "JPEGImages" / f"{image_id}.jpg")
        _palette_png(voc / "SegmentationClass" / f"{image_id}.png", labels)
    listed = (*ids, *([bad] if bad else []))
    (voc / "ImageSets/Segmentation/val.txt").write_text("\n".join(listed) + "\n")
    return root


def save_semseg(path: pathlib.Path, classes: int = 21, background: int | None = 0) -> pathlib.Path:
    config = SemsegConfig(num_classes=classes, background_class=background, **TINY_SEMSEG)
    model = SemsegDense(config)
    variables = jax.tree.map(np.asarray, model.init(jax.random.key(0)))
    store.save(path, variables, family="semseg", variant=config.variant, config=config.to_dict())
    return path


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


def test_flags_reach_the_battery_config(semseg_dir, voc_root):
    common = ["--model", str(semseg_dir), "--dataset", "voc", "--data-root", str(voc_root), "--out", "unused"]
    _, instances, battery = prepare(_args(*common))
    assert [i.size for i in instances] == [(512, 640)] * 4  # the paper's shorter side -> 512 (listing only)
    assert (battery.msl_track, battery.alma_lr_init, battery.include_clean, battery.select_with_background,
            battery.reference_quirks, battery.void_policy) == (None, 1e-4, True, None, True, "as_background")
    _, instances, battery = prepare(_args(
        *common, "--msl-track", "masked", "--alma-lr-init", "1e-3", "--no-include-clean",
        "--select-with-background", "without-background", "--no-reference-quirks", "--void-policy", "ignore",
        "--resize", "longer:25", "--limit", "2"))
    assert [i.size for i in instances] == [(20, 25)] * 2
    assert (battery.msl_track, battery.alma_lr_init, battery.include_clean, battery.select_with_background,
            battery.reference_quirks, battery.void_policy) == ("masked", 1e-3, False, False, False, "ignore")
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
