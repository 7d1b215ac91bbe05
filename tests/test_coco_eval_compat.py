"""The COCOeval-compatible class, COCOeval's settings and split evaluations (docs/protocols/boundary_ap_pq.md).

Oracle: pycocotools' COCOeval on the self-made sets of tests/coco_toy.py
(stats, eval arrays, evalImgs, ious and the printed lines, all compared
exactly), and for Boundary AP a COCOeval whose IoU is the official rule
re-stated on pycocotools RLE (tests/test_coco_eval.py).
"""

from __future__ import annotations

import contextlib
import copy
import csv
import io
import json
import pathlib
import sys
import zipfile

import numpy as np
import pytest

from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval as ReferenceCOCOeval

from jaxseg_robust import cli
from jaxseg_robust.data.coco_instances import CocoFormatError
from jaxseg_robust.evaluation import partials
from jaxseg_robust.evaluation.cocoeval import COCOeval
from jaxseg_robust.evaluation.instances import InstanceEvalConfig, evaluate_instances
from jaxseg_robust.metrics import coco_ap

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import coco_toy  # noqa: E402
from test_coco_eval import _official_boundary_iou  # noqa: E402

SETTINGS = {  # COCOeval params a script sets, by name
    "defaults": {},
    "class_agnostic": {"useCats": 0},
    "image_and_category_subset": {"imgIds": [2, 3, 5, 9, 10], "catIds": [1, 5]},
    "agnostic_subset": {"useCats": 0, "imgIds": [1, 4, 6, 7], "catIds": [2, 5]},
    "agnostic_categories_as_listed": {"useCats": 0, "catIds": [5, 2, 1]},
    "unsorted_ids_and_max_dets": {"imgIds": [9, 2, 2, 4], "catIds": [5, 1], "maxDets": [10, 100, 1]},
    "no_images": {"imgIds": []},
    "max_dets": {"maxDets": [1, 2, 3]},
    "max_dets_with_100": {"maxDets": [1, 100, 300]},
    "iou_thresholds": {"iouThrs": np.array([0.3, 0.5, 0.75, 0.9])},
    "area_ranges": {"areaRng": [[0, 1e10], [0, 400], [400, 1e10]], "areaRngLbl": ["all", "small", "large"]},
    "recall_thresholds": {"recThrs": np.linspace(0.0, 1.0, 11)},
}


@pytest.fixture(scope="module")
def toy():
    return coco_toy.instance_set(seed=0, images=10)


@pytest.fixture(scope="module")
def coco_pair(toy):
    """pycocotools' COCO objects of the toy set (ground truth, loadRes results)."""
    gt, results = toy
    with contextlib.redirect_stdout(io.StringIO()):
        coco_gt = COCO()
        coco_gt.dataset = copy.deepcopy(gt)
        coco_gt.createIndex()
        coco_dt = coco_gt.loadRes(copy.deepcopy(results))
    return coco_gt, coco_dt


def _set(evaluator, settings: dict) -> None:
    for name, value in settings.items():
        setattr(evaluator.params, name, copy.deepcopy(value))


def _run(evaluator) -> str:
    """evaluate, accumulate, summarize; returns what summarize printed."""
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        evaluator.evaluate()
        evaluator.accumulate()
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        evaluator.summarize()
    return printed.getvalue()


def _reference(coco_pair, settings: dict, compute_iou=None):
    reference = ReferenceCOCOeval(*coco_pair, iouType="segm")
    _set(reference, settings)
    if compute_iou is not None:
        reference.computeIoU = compute_iou.__get__(reference)
    return reference, _run(reference)


def assert_eval_images_equal(ours: list, reference: list) -> None:
    """evalImgs equal entry by entry: the same keys, lists and arrays (values and dtypes' kinds)."""
    assert len(ours) == len(reference)
    assert [e is None for e in ours] == [e is None for e in reference]
    for mine, theirs in zip(ours, reference):
        if theirs is None:
            continue
        assert set(mine) == set(theirs)
        for key, value in theirs.items():
            if isinstance(value, np.ndarray):
                assert mine[key].shape == value.shape and mine[key].dtype.kind == value.dtype.kind, key
                np.testing.assert_array_equal(mine[key], value, err_msg=key)
            else:
                assert mine[key] == value, key


def assert_same_evaluation(ours: COCOeval, reference) -> None:
    np.testing.assert_array_equal(ours.stats, reference.stats)
    for name in ("precision", "recall", "scores"):
        np.testing.assert_array_equal(ours.eval[name], reference.eval[name], err_msg=name)
    assert ours.eval["counts"] == reference.eval["counts"]


@pytest.mark.parametrize("name", list(SETTINGS))
def test_cocoeval_gives_pycocotools_numbers_eval_images_and_lines(coco_pair, name):
    reference, reference_text = _reference(coco_pair, SETTINGS[name])
    ours = COCOeval(*coco_pair, iouType="segm")
    _set(ours, SETTINGS[name])
    text = _run(ours)
    assert_same_evaluation(ours, reference)
    assert_eval_images_equal(ours.evalImgs, reference.evalImgs)
    assert text == reference_text and str(ours) == text.rstrip("\n")
    compared = 0
    for key, value in reference.ious.items():
        if len(value) and np.size(value):
            np.testing.assert_array_equal(ours.ious[key], value)
            compared += 1
    assert compared >= (0 if name == "no_images" else 2)
    if name in ("defaults", "class_agnostic"):  # the settings change the numbers
        assert 0 < ours.stats[0] < 1


def test_cocoeval_default_params_are_pycocotools(coco_pair):
    ours, reference = COCOeval(*coco_pair, iouType="segm").params, ReferenceCOCOeval(*coco_pair, iouType="segm").params
    for name in ("imgIds", "catIds", "maxDets", "areaRng", "areaRngLbl", "useCats", "iouType"):
        assert getattr(ours, name) == getattr(reference, name), name
    np.testing.assert_array_equal(ours.iouThrs, reference.iouThrs)
    np.testing.assert_array_equal(ours.recThrs, reference.recThrs)


def test_cocoeval_boundary_equals_the_official_rule(coco_pair):
    reference, reference_text = _reference(coco_pair, {}, compute_iou=_official_boundary_iou)
    ours = COCOeval(*coco_pair, iouType="boundary")
    assert _run(ours) == reference_text
    assert_same_evaluation(ours, reference)
    assert_eval_images_equal(ours.evalImgs, reference.evalImgs)


def test_cocoeval_takes_the_projects_files_without_coco_objects(tmp_path, toy, coco_pair):
    gt, results = toy
    (tmp_path / "gt.json").write_text(json.dumps(gt))
    (tmp_path / "res.json").write_text(json.dumps(results))
    reference, _ = _reference(coco_pair, SETTINGS["image_and_category_subset"])
    for ground_truth, detections in ((gt, results), (tmp_path / "gt.json", tmp_path / "res.json")):
        ours = COCOeval(ground_truth, detections, "segm")
        _set(ours, SETTINGS["image_and_category_subset"])
        _run(ours)
        assert_same_evaluation(ours, reference)
        assert_eval_images_equal(ours.evalImgs, reference.evalImgs)


def test_cocoeval_uses_the_areas_loadres_gives_box_results(toy):
    gt, results = toy
    boxed = [dict(r, bbox=[0.0, 0.0, 3.0, 4.0 + i % 50]) for i, r in enumerate(results)]
    with contextlib.redirect_stdout(io.StringIO()):
        coco_gt = COCO()
        coco_gt.dataset = copy.deepcopy(gt)
        coco_gt.createIndex()
        coco_dt = coco_gt.loadRes(copy.deepcopy(boxed))
    reference, reference_text = _reference((coco_gt, coco_dt), {})
    ours = COCOeval(coco_gt, coco_dt, "segm")
    assert _run(ours) == reference_text
    assert_same_evaluation(ours, reference)
    plain = COCOeval(coco_gt, coco_gt.loadRes(copy.deepcopy(results)), "segm")
    _run(plain)
    assert plain.stats.tolist() != ours.stats.tolist()  # box areas move detections between area ranges


def test_cocoeval_refuses_iou_types_it_does_not_provide(coco_pair):
    with pytest.raises(ValueError, match="'bbox' is not provided"):
        COCOeval(*coco_pair, iouType="bbox")
    with pytest.raises(RuntimeError, match="accumulate"):
        COCOeval(*coco_pair).summarize()


def test_unknown_subset_ids_are_named(toy):
    gt, results = toy
    with pytest.raises(CocoFormatError, match="category_ids: 4 is not in the ground truth"):
        evaluate_instances(gt, results, InstanceEvalConfig(category_ids=(1, 4), progress="none"))


# ---- split evaluations --------------------------------------------------------------------------------

@pytest.mark.parametrize("settings", [{"iou_type": "segm"}, {"iou_type": "boundary"},
                                      {"dataset": "lvis", "iou_type": "boundary", "category_ids": (1, 5)},
                                      {"use_cats": False, "category_ids": (2, 5)},
                                      {"image_ids": (1, 2, 3, 5, 8, 9, 10), "ap_params": coco_ap.APParams(
                                          max_dets=(1, 5, 100), iou_thresholds=(0.5, 0.6))}])
def test_three_shares_merged_equal_the_whole(tmp_path, toy, settings):
    gt, results = toy
    whole = evaluate_instances(gt, results, InstanceEvalConfig(progress="none", **settings))
    paths = []
    for share in (1, 2, 3):
        config = InstanceEvalConfig(progress="none", images_of=(share, 3), **settings)
        part = evaluate_instances(gt, results, config)
        assert part.counts["images"] < whole.counts["images"]
        paths.append(partials.save_partial(tmp_path / f"part{share}.npz", part.blocks, config))
    merged = partials.evaluate_partials([paths[2], paths[0], paths[1]])
    assert merged.summary == whole.summary and merged.per_category == whole.per_category
    assert merged.counts == whole.counts
    np.testing.assert_array_equal(merged.accumulated.precision, whole.accumulated.precision)
    np.testing.assert_array_equal(merged.accumulated.recall, whole.accumulated.recall)
    assert merged.blocks.keys == whole.blocks.keys and merged.blocks.dt_ids == whole.blocks.dt_ids
    with zipfile.ZipFile(paths[0]) as archive:  # plain arrays and a JSON document, no pickles
        assert sorted(archive.namelist()) == sorted(f"{f}.npy" for f in ("meta",) + coco_ap.Blocks._fields)
    with np.load(paths[0], allow_pickle=False) as archive:
        assert json.loads(str(archive["meta"]))["images_of"] == [1, 3]


def test_class_shares_of_image_subsets_merge_to_pycocotools(tmp_path, coco_pair):
    reference, reference_text = _reference(coco_pair, {"useCats": 0})
    paths = []
    for index, images in enumerate(([1, 4, 7, 10], [2, 5, 8], [3, 6, 9])):
        share = COCOeval(*coco_pair, iouType="segm")
        share.params.imgIds, share.params.useCats = images, 0
        share.evaluate()
        paths.append(share.save_partial(tmp_path / f"share{index}.npz"))
    merged = COCOeval.from_partials(paths)
    assert merged.params.imgIds == list(range(1, 11)) and merged.params.useCats == 0
    assert _run(merged) == reference_text
    assert_same_evaluation(merged, reference)
    assert_eval_images_equal(merged.evalImgs, reference.evalImgs)


def test_merge_refuses_overlaps_missing_shares_and_other_settings(tmp_path, toy):
    gt, results = toy

    def share(name, **settings):
        config = InstanceEvalConfig(progress="none", **settings)
        return partials.save_partial(tmp_path / name, evaluate_instances(gt, results, config).blocks, config)

    first, second = share("a.npz", images_of=(1, 2)), share("b.npz", images_of=(2, 2))
    with pytest.raises(CocoFormatError, match=r"leave 5 of the 10 images unevaluated"):
        partials.merge_partials([first])
    with pytest.raises(CocoFormatError, match=r"a\.npz and .*a\.npz both evaluate image 1"):
        partials.merge_partials([first, first, second])
    other = share("c.npz", images_of=(2, 2), iou_type="boundary")
    with pytest.raises(CocoFormatError, match=r"c\.npz: its settings differ"):
        partials.merge_partials([first, other])
    (tmp_path / "d.npz").write_text("[]")
    with pytest.raises(CocoFormatError, match=r"d\.npz is not a partial evaluation"):
        partials.merge_partials([first, tmp_path / "d.npz"])


# ---- the command ----------------------------------------------------------------------------------------

def _files(tmp_path, toy):
    gt, results = toy
    (tmp_path / "gt.json").write_text(json.dumps(gt))
    (tmp_path / "res.json").write_text(json.dumps(results))
    return ["--gt", str(tmp_path / "gt.json"), "--results", str(tmp_path / "res.json"), "--progress", "none"]


def _summary_csv(path) -> list[float]:
    with open(path, newline="") as handle:
        return [float(row["value"]) for row in csv.DictReader(handle)]


def test_coco_eval_settings_flags_give_pycocotools_numbers(tmp_path, toy, coco_pair, capsys):
    settings = {"imgIds": [1, 2, 3, 4, 5, 6], "catIds": [1, 2], "useCats": 0, "maxDets": [1, 10, 300],
                "iouThrs": np.array([0.5, 0.75]), "areaRng": [[0, 1e10], [0, 300]], "areaRngLbl": ["all", "small"]}
    reference, reference_text = _reference(coco_pair, settings)
    flags = ["--image-ids", "1", "2", "3", "4", "5", "6", "--category-ids", "1", "2", "--class-agnostic",
             "--max-dets", "1", "10", "300", "--iou-thresholds", "0.5", "0.75",
             "--area-ranges", "all:0:1e10", "small:0:300", "--out", str(tmp_path / "ap.csv")]
    assert cli.main(["coco-eval"] + _files(tmp_path, toy) + flags) == 0
    assert capsys.readouterr().out == reference_text
    assert _summary_csv(tmp_path / "ap.csv") == reference.stats.tolist()


def test_coco_eval_split_and_merge_equal_the_whole(tmp_path, toy, capsys):
    files = _files(tmp_path, toy)
    assert cli.main(["coco-eval"] + files + ["--iou-type", "boundary", "--out", str(tmp_path / "whole.csv")]) == 0
    whole_text = capsys.readouterr().out
    for share in (1, 2, 3):
        assert cli.main(["coco-eval"] + files + ["--iou-type", "boundary", "--images-of", f"{share}/3",
                                                 "--save-partial", str(tmp_path / f"p{share}.npz")]) == 0
        captured = capsys.readouterr()
        assert captured.out == "" and f"p{share}.npz" in captured.err
    parts = [str(tmp_path / f"p{share}.npz") for share in (3, 1, 2)]
    assert cli.main(["coco-eval", "--merge", *parts, "--out", str(tmp_path / "merged.csv")]) == 0
    assert capsys.readouterr().out == whole_text
    assert _summary_csv(tmp_path / "merged.csv") == _summary_csv(tmp_path / "whole.csv")
    assert cli.main(["coco-eval", "--merge", *parts[:2]]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unevaluated" in err[0]


def test_coco_eval_writes_pycocotools_eval_images(tmp_path, toy, coco_pair, capsys):
    settings = {"imgIds": [2, 3, 4, 5, 7], "useCats": 0}
    reference, _ = _reference(coco_pair, settings)
    out = tmp_path / "out" / "eval_images.json"
    flags = ["--image-ids", "2", "3", "4", "5", "7", "--class-agnostic", "--eval-images", str(out)]
    assert cli.main(["coco-eval"] + _files(tmp_path, toy) + flags) == 0
    written = json.loads(out.read_text())
    expected = [{key: np.asarray(value).tolist() if isinstance(value, np.ndarray) else
                 [int(v) for v in value] if key in ("dtIds", "gtIds") else value for key, value in entry.items()}
                for entry in reference.evalImgs if entry is not None]
    for entry in expected:
        entry["image_id"] = int(entry["image_id"])
    assert len(written) == len(expected) > 10 and written == expected
    assert f"wrote {len(expected)} evalImgs entries" in capsys.readouterr().err


@pytest.mark.parametrize("flags, message", [
    (["--images-of", "2/3"], "add --save-partial"),
    (["--images-of", "4/3", "--save-partial", "x.npz"], "1 <= K <= N"),
    (["--images-of", "two", "--save-partial", "x.npz"], "K/N"),
    (["--area-ranges", "all:0"], "LABEL:LOW:HIGH"),
    (["--dataset", "lvis", "--max-dets", "1", "10", "100"], "--max-dets is a COCO setting"),
    (["--dataset", "lvis", "--class-agnostic"], "use_cats=False"),
    (["--image-ids", "77"], "image_ids: 77"),
    (["--merge", "p.npz"], "--merge reads only the partial files"),
    (["--dataset", "lvis", "--eval-images", "e.json"], "an lvis evaluation has none"),
])
def test_coco_eval_bad_settings_are_one_line_exit_2(tmp_path, toy, capsys, flags, message):
    assert cli.main(["coco-eval"] + _files(tmp_path, toy) + flags) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("jaxseg-robust coco-eval: error:") and message in err[-1]
