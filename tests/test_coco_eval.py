"""Mask AP / Boundary AP / PQ evaluators on self-made data (docs/protocols/boundary_ap_pq.md).

Oracles: plain pycocotools (RLE code, polygon rasterisation, COCOeval for mask
AP), OpenCV for the boundary band, and a COCOeval whose IoU is the official
Boundary AP rule re-stated on pycocotools RLE. Parity with the authors' code
on the real masks is in tests/test_coco_eval_parity.py.
"""

from __future__ import annotations

import contextlib
import copy
import gc
import io
import json
import math
import pathlib
import sys

import cv2
import numpy as np
import pytest

import pycocotools.mask as mask_utils
from hypothesis import given
from hypothesis import strategies as st
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

from jaxseg_robust import cli
from jaxseg_robust.data import coco_rle
from jaxseg_robust.data.coco_instances import CocoEvalWarning, CocoFormatError
from jaxseg_robust.data.coco_panoptic import PanopticFormatError
from jaxseg_robust.evaluation import instances as instance_eval
from jaxseg_robust.evaluation.instances import InstanceEvalConfig, evaluate_instances
from jaxseg_robust.evaluation import mask_counts
from jaxseg_robust.evaluation import panoptic
from jaxseg_robust.evaluation.mask_counts import CountSettings, count_pairs, uses_runs
from jaxseg_robust.evaluation.panoptic import PanopticEvalConfig, evaluate_panoptic
from jaxseg_robust.metrics import coco_ap
from jaxseg_robust.metrics.coco_ap import COCO_SUMMARY_NAMES
from jaxseg_robust.metrics.masks import boundary_width
from jaxseg_robust.metrics.run_pairs import pair_intersections, run_table
from jaxseg_robust.ops import morphology as morph

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import coco_toy  # noqa: E402
from mask_patterns import PATTERNS, make_mask  # noqa: E402

# ---- RLE -----------------------------------------------------------------------------------------


def _random_masks(seed=0):
    rng = np.random.default_rng(seed)
    masks = []
    for height, width in ((1, 1), (5, 3), (33, 31), (37, 70), (64, 64)):
        for density in (0.0, 1.0, 0.05, 0.5, 0.95):
            masks.append(rng.random((height, width)) < density)
        masks.append(coco_toy.blob(height, width, rng))
    return masks


def test_rle_strings_round_trip_with_pycocotools():
    for mask in _random_masks():
        rle = mask_utils.encode(np.asfortranarray(mask.astype(np.uint8)))
        runs = coco_rle.string_runs(rle["counts"])
        assert runs.sum() == mask.size and coco_rle.foreground_pixels(runs) == mask.sum()
        assert coco_rle.runs_to_string(runs) == rle["counts"].decode("ascii")


def test_decode_into_packed_words_matches_pycocotools_decode():
    masks = _random_masks(1)
    slots = [(coco_rle.string_runs(mask_utils.encode(np.asfortranarray(m.astype(np.uint8)))["counts"]),) + m.shape
             for m in masks]
    out = np.full((len(masks) + 1, 70, 2), 0xAAAAAAAA, np.uint32)
    coco_rle.decode_into(slots, out)
    for index, mask in enumerate(masks):
        bits = ((out[index][:, :, None] >> np.arange(32, dtype=np.uint32)) & 1).reshape(70, 64).T.astype(bool)
        expected = np.zeros((64, 70), bool)
        expected[: mask.shape[0], : mask.shape[1]] = mask_utils.decode(
            mask_utils.encode(np.asfortranarray(mask.astype(np.uint8)))).astype(bool)
        np.testing.assert_array_equal(bits, expected)
    assert (out[-1] == 0xAAAAAAAA).all()  # slots beyond the masks are left alone


def test_many_strings_at_once_equal_one_at_a_time():
    masks = _random_masks(4) + _random_masks(5)
    strings = [mask_utils.encode(np.asfortranarray(m.astype(np.uint8)))["counts"] for m in masks]
    together = coco_rle.strings_runs(strings)
    for string, runs, mask in zip(strings, together, masks):
        assert coco_rle.runs_to_string(runs) == string.decode("ascii") and runs.sum() == mask.size
    hand_made = [0, 5, 3, 100000, 2, 7, 1, 1, 0, 2**40, 0]  # long numbers, negative differences, empty runs
    mixed = ["", coco_rle.runs_to_string(hand_made), "", strings[0], coco_rle.runs_to_string([7])]
    runs, counts = coco_rle.strings_runs_flat(mixed)
    assert counts.tolist() == [0, len(hand_made), 0, len(together[0]), 1]
    np.testing.assert_array_equal(runs, np.concatenate([hand_made, together[0], [7]]))
    with pytest.raises(ValueError, match="string 2: the last number is truncated"):
        coco_rle.strings_runs(strings[:2] + ["5c"] + strings[2:])


@pytest.mark.parametrize("bad", ["zzzz", "0!", "5c"])
def test_malformed_rle_strings_are_refused(bad):
    with pytest.raises(ValueError):
        coco_rle.string_runs(bad)


# ---- run-length pair counts (the host path of mask AP) -------------------------------------------------

def _runs_of(mask: np.ndarray, split: int = 0) -> np.ndarray:
    """The mask's COCO run lengths; ``split`` > 0 cuts every ``split``-th run in two with an empty run between."""
    runs = coco_rle.string_runs(mask_utils.encode(np.asfortranarray(mask.astype(np.uint8)))["counts"])
    if not split:
        return runs
    out = []
    for index, run in enumerate(runs):
        out.extend([run // 2, 0, run - run // 2] if index % split == 0 and run > 1 else [run])
    return np.array(out, np.int64)


@given(st.lists(st.tuples(st.sampled_from(PATTERNS), st.floats(0.01, 0.99), st.integers(0, 2**32 - 1)),
                min_size=1, max_size=5),
       st.sampled_from([(1, 1), (1, 7), (6, 1), (9, 13), (33, 20)]), st.integers(0, 3))
def test_run_intersections_equal_those_of_the_decoded_masks(drawn, shape, split):
    masks = [make_mask(pattern, shape, density, seed) for pattern, density, seed in drawn]
    others = [np.ones((4, 5), bool), np.zeros((3, 3), bool)]  # masks of other images in the same table
    table = run_table([_runs_of(others[0])] + [_runs_of(m, split) for m in masks] + [_runs_of(others[1])])
    np.testing.assert_array_equal(table.area, [20] + [m.sum() for m in masks] + [0])
    pairs = np.array([(a, b) for a in range(1, len(masks) + 1) for b in range(1, len(masks) + 1)], np.int64)
    expected = [(masks[a - 1] & masks[b - 1]).sum() for a, b in pairs]
    np.testing.assert_array_equal(pair_intersections(table, pairs), expected)
    assert pair_intersections(table, np.zeros((0, 2), np.int64)).shape == (0,)


@pytest.mark.parametrize("runs_per_batch", [1, 1 << 18])  # one image per host batch, or all at once
def test_mask_counts_from_runs_equal_the_device_counts(toy, monkeypatch, runs_per_batch):
    monkeypatch.setattr(mask_counts, "RUNS_PER_BATCH", runs_per_batch)
    gt_dict, results = toy
    config = InstanceEvalConfig(iou_type="segm", progress="none")
    works = instance_eval.prepare_instances(gt_dict, results, config).works
    settings = {path: CountSettings(with_boundary=False, progress="none", mask_path=path)
                for path in ("runs", "device")}
    assert uses_runs(settings["runs"]) and not uses_runs(settings["device"])
    assert uses_runs(CountSettings(with_boundary=False))  # auto: the runs, whatever the backend
    assert not uses_runs(CountSettings(with_boundary=True, mask_path="runs"))  # bands need the device
    on_runs, on_device = count_pairs(works, settings["runs"]), count_pairs(works, settings["device"])
    assert sum(c is not None for c in on_runs) >= 5
    for runs_counts, device_counts in zip(on_runs, on_device):
        assert (runs_counts is None) == (device_counts is None)
        if runs_counts is not None:
            np.testing.assert_array_equal(runs_counts.area, device_counts.area)
            np.testing.assert_array_equal(runs_counts.intersection, device_counts.intersection)
    summaries = [evaluate_instances(gt_dict, results, InstanceEvalConfig(progress="none", mask_path=path)).summary
                 for path in ("runs", "device")]
    assert summaries[0] == summaries[1]
    with pytest.raises(ValueError, match="mask_path"):
        InstanceEvalConfig(mask_path="gpu")


# ---- traced-radius morphology -----------------------------------------------------------------------

def test_traced_radius_erosion_equals_the_static_one():
    rng = np.random.default_rng(2)
    masks = rng.random((3, 37, 70)) < 0.85
    masks[0] = coco_toy.blob(37, 70, rng)
    words = morph.pack_rows(masks)
    for radius in (0, 1, 2, 5, 16, 21):
        out = morph.unpack_rows(morph.erode_square_packed_traced(words, np.int32(radius), 21), 37)
        np.testing.assert_array_equal(np.asarray(out), np.asarray(morph.erode(masks, radius)), err_msg=str(radius))


def test_uniform_window_marks_every_segments_boundary_band():
    rng = np.random.default_rng(3)
    labels = rng.integers(0, 3, (2, 30, 41))
    labels[:, 5:25, 8:30] = 7
    for radius in (0, 1, 3, 9):
        uniform = np.asarray(morph.uniform_window_traced(labels, np.int32(radius), 9))
        for value in np.unique(labels):
            mask = labels == value
            inner = np.asarray(morph.erode(mask, radius))
            np.testing.assert_array_equal(uniform[mask], inner[mask])


def _cv2_boundary(mask: np.ndarray, ratio: float = 0.02) -> np.ndarray:
    """The official API's mask_to_boundary, re-stated with OpenCV (docs/protocols/boundary_iou.md §1)."""
    h, w = mask.shape
    d = boundary_width(h, w, ratio)
    padded = cv2.copyMakeBorder(mask.astype(np.uint8), 1, 1, 1, 1, cv2.BORDER_CONSTANT, value=0)
    eroded = cv2.erode(padded, np.ones((3, 3), np.uint8), iterations=d)[1:h + 1, 1:w + 1]
    return mask.astype(np.uint8) - eroded


# ---- mask AP against plain pycocotools --------------------------------------------------------------

def _pycocotools_eval(gt, results, compute_iou=None):
    with contextlib.redirect_stdout(io.StringIO()):
        coco_gt = COCO()
        coco_gt.dataset = copy.deepcopy(gt)
        coco_gt.createIndex()
        coco_dt = coco_gt.loadRes(copy.deepcopy(results))
        evaluator = COCOeval(coco_gt, coco_dt, iouType="segm")
        if compute_iou is not None:
            evaluator.computeIoU = compute_iou.__get__(evaluator)
        evaluator.evaluate()
        evaluator.accumulate()
        evaluator.summarize()
    return evaluator


@pytest.fixture(scope="module")
def toy():
    return coco_toy.instance_set(seed=0, images=10)


def test_mask_ap_equals_pycocotools_cocoeval(toy):
    gt, results = toy
    reference = _pycocotools_eval(gt, results)
    ours = evaluate_instances(gt, results, InstanceEvalConfig(iou_type="segm", progress="none"))
    assert list(ours.summary) == list(COCO_SUMMARY_NAMES)
    np.testing.assert_allclose(list(ours.summary.values()), reference.stats, rtol=0, atol=1e-12)
    np.testing.assert_array_equal(ours.accumulated.precision, reference.eval["precision"])
    np.testing.assert_array_equal(ours.accumulated.recall, reference.eval["recall"])


def _official_boundary_iou(self, image_id, category_id):
    """The official Boundary AP IoU (min of mask and boundary IoU; crowd: mask IoU) on pycocotools RLE."""
    gts, dts = self._gts[image_id, category_id], self._dts[image_id, category_id]
    if not gts and not dts:
        return []
    dts = [dts[i] for i in np.argsort([-d["score"] for d in dts], kind="mergesort")][: self.params.maxDets[-1]]
    crowd = [int(g["iscrowd"]) for g in gts]

    def band(ann, coco):
        mask = mask_utils.decode(coco.annToRLE(ann))
        return mask_utils.encode(np.asfortranarray(_cv2_boundary(mask)))

    mask_ious = np.array(mask_utils.iou([d["segmentation"] for d in dts], [g["segmentation"] for g in gts], crowd))
    band_ious = np.array(mask_utils.iou([band(d, self.cocoDt) for d in dts], [band(g, self.cocoGt) for g in gts],
                                        crowd))
    if len(gts) and len(dts):
        noncrowd = np.array(crowd) == 0
        mask_ious[:, noncrowd] = np.minimum(mask_ious[:, noncrowd], band_ious[:, noncrowd])
    return mask_ious


def test_boundary_ap_equals_the_official_rule_on_pycocotools(toy):
    gt, results = toy
    reference = _pycocotools_eval(gt, results, compute_iou=_official_boundary_iou)
    ours = evaluate_instances(gt, results, InstanceEvalConfig(iou_type="boundary", progress="none"))
    np.testing.assert_allclose(list(ours.summary.values()), reference.stats, rtol=0, atol=1e-12)
    np.testing.assert_array_equal(ours.accumulated.precision, reference.eval["precision"])
    plain = evaluate_instances(gt, results, InstanceEvalConfig(iou_type="segm", progress="none"))
    assert ours.summary["AP"] < plain.summary["AP"]


def test_the_garbage_collector_is_paused_while_counting_and_restored(toy, monkeypatch):
    seen = []

    def counting(works, settings):
        seen.append(gc.isenabled())
        return count_pairs(works, settings)

    monkeypatch.setattr(instance_eval, "count_pairs", counting)
    gt, results = toy
    assert gc.isenabled()
    evaluate_instances(gt, results, InstanceEvalConfig(progress="none"))
    assert seen == [False] and gc.isenabled()


def test_results_with_boxes_use_box_areas_like_the_official_loader(toy):
    gt, results = toy
    boxed = [dict(r, bbox=[0.0, 0.0, 3.0, 4.0 + i % 50]) for i, r in enumerate(results)]
    reference = _pycocotools_eval(gt, boxed)
    ours = evaluate_instances(gt, boxed, InstanceEvalConfig(progress="none"))
    np.testing.assert_allclose(list(ours.summary.values()), reference.stats, rtol=0, atol=1e-12)


def test_per_category_rows_and_undefined_settings(toy):
    gt, results = toy
    ours = evaluate_instances(gt, results, InstanceEvalConfig(progress="none"))
    assert [row["category_id"] for row in ours.per_category] == [1, 2, 5]
    precision = ours.accumulated.precision[:, :, 0, 0, -1]
    assert ours.per_category[0]["AP"] == pytest.approx(precision[precision > -1].mean())
    acc = ours.accumulated
    for k, row in enumerate(ours.per_category):  # all categories at once == each alone, to the bit
        alone = coco_ap.Accumulated(acc.precision[:, :, k:k + 1], acc.recall[:, k:k + 1])
        expected = [coco_ap.summary_value(alone, "ap"), coco_ap.summary_value(alone, "ap", iou=0.5),
                    coco_ap.summary_value(alone, "ap", iou=0.75),
                    *(coco_ap.summary_value(alone, "ap", area=a) for a in ("small", "medium", "large"))]
        assert [row[name] for name in coco_ap.PER_CATEGORY_COLUMNS] == expected
    assert any(row["APl"] == -1 for row in ours.per_category) or any(row["APs"] == -1 for row in ours.per_category)


def test_accumulation_in_chunks_of_categories_equals_all_at_once(toy, monkeypatch):
    gt, results = toy
    whole = evaluate_instances(gt, results, InstanceEvalConfig(progress="none")).accumulated
    monkeypatch.setattr(coco_ap, "ACCUMULATE_ELEMENTS", 1)  # one category per step
    chunked = evaluate_instances(gt, results, InstanceEvalConfig(progress="none")).accumulated
    np.testing.assert_array_equal(whole.precision, chunked.precision)
    np.testing.assert_array_equal(whole.recall, chunked.recall)


# ---- bad input -------------------------------------------------------------------------------------

def test_results_for_unknown_images_are_named(toy):
    gt, results = toy
    bad = results + [dict(results[0], image_id=999)]
    with pytest.raises(CocoFormatError, match=r"999 \(results\[%d\]\)" % len(results)):
        evaluate_instances(gt, bad, InstanceEvalConfig(progress="none"))


def test_malformed_rle_and_size_mismatch_are_named(toy):
    gt, results = toy
    broken = copy.deepcopy(results)
    broken[3]["segmentation"]["counts"] = "0"
    with pytest.raises(CocoFormatError, match=r"results\[3\] \(image .*\): RLE runs cover"):
        evaluate_instances(gt, broken, InstanceEvalConfig(progress="none"))
    broken = copy.deepcopy(results)
    broken[2]["segmentation"]["size"] = [5, 5]
    with pytest.raises(CocoFormatError, match=r"results\[2\].*differs from the image"):
        evaluate_instances(gt, broken, InstanceEvalConfig(progress="none"))
    no_area = copy.deepcopy(gt)
    del no_area["annotations"][1]["area"]
    with pytest.raises(CocoFormatError, match=r"annotation 2 .*no 'area'"):
        evaluate_instances(no_area, results, InstanceEvalConfig(progress="none"))


def test_ground_truth_rle_problems_name_the_annotation(toy):
    gt, results = toy
    rle_index = next(i for i, a in enumerate(gt["annotations"]) if isinstance(a["segmentation"], dict))
    broken = copy.deepcopy(gt)
    broken["annotations"][rle_index]["segmentation"]["counts"] += "0"  # one run too many
    ann = broken["annotations"][rle_index]
    with pytest.raises(CocoFormatError, match=rf"annotation {ann['id']} \(image {ann['image_id']}\): RLE runs cover"):
        evaluate_instances(broken, results, InstanceEvalConfig(progress="none"))
    broken["annotations"][rle_index]["segmentation"]["counts"] = "!!"
    with pytest.raises(CocoFormatError, match=rf"annotation {ann['id']} .*outside the RLE alphabet"):
        evaluate_instances(broken, results, InstanceEvalConfig(progress="none"))


def test_uncompressed_rle_and_polygon_results_equal_compressed_ones(toy):
    gt, results = toy
    mixed = copy.deepcopy(results)
    for index in range(0, len(mixed), 3):
        rle = mixed[index]["segmentation"]
        mixed[index]["segmentation"] = {"size": rle["size"], "counts": coco_rle.string_runs(rle["counts"]).tolist()}
    square = [[2.0, 2.0, 12.0, 2.0, 12.0, 9.0, 2.0, 9.0]]
    height, width = next((i["height"], i["width"]) for i in gt["images"] if i["id"] == mixed[1]["image_id"])
    mixed[1]["segmentation"] = square
    expected = copy.deepcopy(results)
    expected[1]["segmentation"] = coco_toy.encode(mask_utils.decode(mask_utils.merge(
        mask_utils.frPyObjects(square, height, width))).astype(bool))
    config = InstanceEvalConfig(progress="none")
    assert evaluate_instances(gt, mixed, config).summary == evaluate_instances(gt, expected, config).summary


def test_unknown_categories_warn_and_are_skipped_like_the_official_evaluator(toy):
    gt, results = toy
    with pytest.warns(CocoEvalWarning, match=r"category ids not in the ground truth.*77"):
        ours = evaluate_instances(gt, results + [dict(results[0], category_id=77)], InstanceEvalConfig(progress="none"))
    assert ours.summary == evaluate_instances(gt, results, InstanceEvalConfig(progress="none")).summary


# ---- the command -----------------------------------------------------------------------------------

def test_coco_eval_command_writes_standard_names(tmp_path, toy, capsys):
    gt, results = toy
    (tmp_path / "gt.json").write_text(json.dumps(gt))
    (tmp_path / "res.json").write_text(json.dumps(results))
    out = tmp_path / "out" / "ap.csv"
    code = cli.main(["coco-eval", "--gt", str(tmp_path / "gt.json"), "--results", str(tmp_path / "res.json"),
                     "--iou-type", "boundary", "--out", str(out), "--progress", "none", "--per-category"])
    assert code == 0
    printed = capsys.readouterr().out
    assert "Average Precision  (AP) @[ IoU=0.50:0.95 | area=   all | maxDets=100 ]" in printed
    rows = out.read_text().splitlines()
    assert rows[0] == "metric,value" and [r.split(",")[0] for r in rows[1:]] == list(COCO_SUMMARY_NAMES)
    assert (tmp_path / "out" / "ap.md").read_text().startswith("# Boundary AP (coco)")
    assert (tmp_path / "out" / "ap.per_category.csv").read_text().startswith("category_id,name,AP,")


def _markdown_rows(text: str, first_header: str) -> dict[str, list[str]]:
    """Body rows of the Markdown table whose header starts with ``first_header``: first cell -> other cells."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {first_header} |"))
    rows = {}
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        rows[cells[0]] = cells[1:]
    return rows


def test_coco_eval_uses_fractions_on_stdout_csv_and_markdown(tmp_path, toy, capsys):
    """One unit: the per-category table (printed and in FILE.md) and FILE.md's summary are the fractions of
    the CSVs to three decimals, as the 12 summary lines print them."""
    import csv  # noqa: PLC0415

    gt, results = toy
    (tmp_path / "gt.json").write_text(json.dumps(gt))
    (tmp_path / "res.json").write_text(json.dumps(results))
    out = tmp_path / "ap.csv"
    assert cli.main(["coco-eval", "--gt", str(tmp_path / "gt.json"), "--results", str(tmp_path / "res.json"),
                     "--out", str(out), "--progress", "none", "--per-category"]) == 0
    printed = capsys.readouterr().out
    summary = {row["metric"]: float(row["value"]) for row in csv.DictReader(out.open())}
    assert f"maxDets=100 ] = {summary['AP']:0.3f}" in printed
    with open(tmp_path / "ap.per_category.csv", newline="") as handle:
        categories = list(csv.DictReader(handle))
    expected = {f"{r['name']} ({r['category_id']})": ["-" if float(r[c]) < 0 else f"{float(r[c]):.3f}"
                                                       for c in coco_ap.PER_CATEGORY_COLUMNS] for r in categories}
    assert any(0 < float(r["AP"]) < 1 for r in categories)  # a value whose x100 would show
    assert _markdown_rows(printed, "category") == expected
    markdown = (tmp_path / "ap.md").read_text()
    assert _markdown_rows(markdown, "category") == expected
    assert _markdown_rows(markdown, "metric") == {name: ["-" if v < 0 else f"{v:.3f}"] for name, v in summary.items()}
    assert "fractions in [0, 1]" in markdown and "percent" not in markdown


def test_coco_eval_command_bad_input_is_one_line_exit_2(tmp_path, toy, capsys):
    gt, results = toy
    (tmp_path / "gt.json").write_text(json.dumps(gt))
    (tmp_path / "res.json").write_text(json.dumps(results + [dict(results[0], image_id=4242)]))
    code = cli.main(["coco-eval", "--gt", str(tmp_path / "gt.json"), "--results", str(tmp_path / "res.json"),
                     "--progress", "none"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err[-1].startswith("jaxseg-robust coco-eval: error:") and "4242" in err[-1]


# ---- panoptic ------------------------------------------------------------------------------------

CATEGORIES = [{"id": 1, "name": "thing", "isthing": 1}, {"id": 2, "name": "stuff", "isthing": 0}]


def _panoptic_toy(tmp_path):
    """Two 40x50 images with hand-checkable PQ (see the test)."""
    gt = np.full((40, 50), 20, np.int64)  # stuff
    gt[10:30, 10:30] = 5  # a thing
    gt[:, 45:] = 0  # VOID
    pred = np.full((40, 50), 21, np.int64)
    pred[12:30, 10:30] = 6  # the thing, 2 rows short: IoU 360 / 400
    pred[0:4, 0:4] = 7  # a small spurious thing
    image_1 = {"id": 1, "gt_ids": gt, "pred_ids": pred,
               "gt_segments": [{"id": 5, "category_id": 1, "iscrowd": 0, "area": 400},
                               {"id": 20, "category_id": 2, "iscrowd": 0, "area": int((gt == 20).sum())}],
               "pred_segments": [{"id": 6, "category_id": 1}, {"id": 21, "category_id": 2},
                                 {"id": 7, "category_id": 1}]}
    gt2 = np.full((40, 50), 20, np.int64)
    pred2 = np.full((40, 50), 21, np.int64)
    pred2[0:20, 0:20] = 8  # an unmatched thing prediction: FP
    image_2 = {"id": 2, "gt_ids": gt2, "pred_ids": pred2,
               "gt_segments": [{"id": 20, "category_id": 2, "iscrowd": 0, "area": 2000}],
               "pred_segments": [{"id": 21, "category_id": 2}, {"id": 8, "category_id": 1}]}
    return coco_toy.write_panoptic(tmp_path, [image_1, image_2], CATEGORIES)


def test_pq_of_a_hand_checked_case(tmp_path):
    paths = _panoptic_toy(tmp_path)
    result = evaluate_panoptic(paths["gt_json"], paths["gt_folder"], paths["pred_json"], paths["pred_folder"],
                               PanopticEvalConfig(progress="none"))
    # things: TP (IoU 0.9), FP (the 4x4 spurious), FP (image 2) -> PQ = 0.9 / (1 + 1) = 0.45, SQ 0.9, RQ 0.5
    assert result.groups["Things"]["pq"] == pytest.approx(0.45)
    assert result.groups["Things"]["sq"] == pytest.approx(0.9)
    # stuff image 1: gt 20 = 40*45 - 400 = 1400 px; pred 21 covers it except the thing and spurious pixels;
    # pixels of pred 21 on VOID are left out of the union.
    stuff_1 = (1400 - 16) / (1400 + (2000 - 360 - 16) - (1400 - 16) - 5 * 40)
    stuff_2 = (2000 - 400) / 2000
    assert result.groups["Stuff"]["sq"] == pytest.approx((stuff_1 + stuff_2) / 2)
    assert result.groups["Stuff"]["rq"] == 1.0
    assert result.summary["PQ_all"] == pytest.approx((result.groups["Things"]["pq"] + result.groups["Stuff"]["pq"]) / 2)
    boundary = evaluate_panoptic(paths["gt_json"], paths["gt_folder"], paths["pred_json"], paths["pred_folder"],
                                 PanopticEvalConfig(iou_type="boundary", progress="none"))
    assert boundary.groups["All"]["pq"] < result.groups["All"]["pq"]


def test_boundary_pq_is_the_same_in_one_crop_batch_or_one_per_image(tmp_path, monkeypatch):
    paths = _panoptic_toy(tmp_path)
    config = PanopticEvalConfig(iou_type="boundary", progress="none")
    together = evaluate_panoptic(paths["gt_json"], paths["gt_folder"], paths["pred_json"], paths["pred_folder"], config)
    monkeypatch.setattr(panoptic, "RUNS_PER_BATCH", 1)  # each image's bands counted on its own
    apart = evaluate_panoptic(paths["gt_json"], paths["gt_folder"], paths["pred_json"], paths["pred_folder"], config)
    assert together.summary == apart.summary
    assert together.per_category == apart.per_category
    assert 0 < together.groups["All"]["pq"] < 1


def test_panoptic_segments_missing_from_the_png_or_json_are_named(tmp_path):
    paths = _panoptic_toy(tmp_path)
    doc = json.loads(pathlib.Path(paths["pred_json"]).read_text())
    doc["annotations"][0]["segments_info"].pop()  # segment 7 stays in the PNG only
    pathlib.Path(paths["pred_json"]).write_text(json.dumps(doc))
    with pytest.raises(PanopticFormatError, match=r"image 1: prediction segment id\(s\) \[7\] are in the PNG"):
        evaluate_panoptic(paths["gt_json"], paths["gt_folder"], paths["pred_json"], paths["pred_folder"],
                          PanopticEvalConfig(progress="none"))


def test_panoptic_eval_command_writes_pq_names(tmp_path, capsys):
    paths = _panoptic_toy(tmp_path)
    out = tmp_path / "pq.csv"
    code = cli.main(["panoptic-eval", "--gt-json", paths["gt_json"], "--gt-folder", paths["gt_folder"],
                     "--pred-json", paths["pred_json"], "--pred-folder", paths["pred_folder"], "--out", str(out),
                     "--progress", "none"])
    printed = capsys.readouterr().out
    assert code == 0 and "Things" in printed
    assert printed.splitlines()[0].startswith("percent   |")  # panopticapi's x100 table says its unit
    names = [line.split(",")[0] for line in out.read_text().splitlines()[1:]]
    assert names == ["PQ_all", "SQ_all", "RQ_all", "PQ_things", "SQ_things", "RQ_things", "PQ_stuff", "SQ_stuff",
                     "RQ_stuff"]
    assert not math.isnan(float(out.read_text().splitlines()[1].split(",")[1]))
    pq_all = float(out.read_text().splitlines()[1].split(",")[1])  # a fraction, as in pq.md
    assert 0 <= pq_all <= 1 and f"| PQ_all | {pq_all:.3f} |" in (tmp_path / "pq.md").read_text()
