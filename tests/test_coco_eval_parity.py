"""Parity of mask AP, Boundary AP (COCO, LVIS) and PQ / Boundary PQ with the Boundary IoU authors' evaluators.

Data: ground truth and perturbed detections made from the real masks
(experiments/coco_eval_data.py). Reference: a checkout of
bowenc0221/boundary-iou-api named by ``$JAXSEG_BOUNDARY_IOU_API_REPO`` (loaded
with the ``np.float`` and ``panopticapi.utils`` shims); skipped without it or
without the real data. Tolerance: 1e-6 on every summary number (the issue's
bound); in practice the numbers agree exactly, since every count is an
integer and every ratio is formed with the reference's float64 operations.
See docs/protocols/boundary_ap_pq.md.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import pathlib
import sys

import numpy as np
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "experiments"))
import coco_eval_data  # noqa: E402

from jaxseg_robust.data.coco_rle import decode_into, string_runs  # noqa: E402
from jaxseg_robust.evaluation.instances import InstanceEvalConfig, evaluate_instances, prepare_instances  # noqa: E402
from jaxseg_robust.evaluation.mask_counts import CountSettings, count_pairs  # noqa: E402
from jaxseg_robust.evaluation.panoptic import PanopticEvalConfig, evaluate_panoptic  # noqa: E402
from jaxseg_robust.metrics.mask_pairs import chunk_pair_counts, packed_words  # noqa: E402
from jaxseg_robust.metrics.masks import boundary_width  # noqa: E402
from jaxseg_robust.ops.morphology import erode_square_packed_traced  # noqa: E402

pytestmark = [pytest.mark.parity, pytest.mark.slow]
TOLERANCE = 1e-6


@pytest.fixture(scope="module")
def reference():
    repo = coco_eval_data.reference_repo()
    if repo is None:
        pytest.skip(f"set {coco_eval_data.REFERENCE_ENV} to a checkout of bowenc0221/boundary-iou-api")
    pytest.importorskip("pycocotools")
    return coco_eval_data.load_reference(repo)


@pytest.fixture(scope="module")
def instance_files(real_data_dir, tmp_path_factory):
    gt, results = coco_eval_data.instance_dataset(real_data_dir, seed=0, copies=3)
    folder = tmp_path_factory.mktemp("coco")
    (folder / "gt.json").write_text(json.dumps(gt))
    (folder / "res.json").write_text(json.dumps(results))
    return folder, gt, results


def _official_coco(reference, folder, iou_type):
    with contextlib.redirect_stdout(io.StringIO()):
        gt = reference.coco.COCO(str(folder / "gt.json"), get_boundary=iou_type == "boundary")
        dt = gt.loadRes(str(folder / "res.json"))
        evaluator = reference.cocoeval.COCOeval(gt, dt, iouType=iou_type)
        evaluator.evaluate()
        evaluator.accumulate()
        evaluator.summarize()
    return evaluator


@pytest.mark.parametrize("iou_type", ["segm", "boundary"])
def test_coco_summary_matches_the_official_evaluator(reference, instance_files, iou_type):
    folder, _, results = instance_files
    assert len(results) > 1000
    official = _official_coco(reference, folder, iou_type)
    ours = evaluate_instances(folder / "gt.json", folder / "res.json",
                              InstanceEvalConfig(iou_type=iou_type, progress="none"))
    difference = np.abs(np.array(list(ours.summary.values())) - official.stats)
    print(f"coco {iou_type}: max |ours - official| over the 12 numbers = {difference.max():.3g}")
    assert difference.max() <= TOLERANCE
    np.testing.assert_allclose(ours.accumulated.precision, official.eval["precision"], rtol=0, atol=TOLERANCE)


def test_mask_counts_from_runs_equal_the_device_counts_on_the_real_masks(instance_files):
    """The two paths of mask AP's pixel counts give the same integers on every real (detection, ground truth) pair."""
    folder, _, _ = instance_files
    works = prepare_instances(folder / "gt.json", folder / "res.json", InstanceEvalConfig(progress="none")).works
    on_runs = count_pairs(works, CountSettings(with_boundary=False, progress="none", mask_path="runs"))
    on_device = count_pairs(works, CountSettings(with_boundary=False, progress="none", mask_path="device"))
    pairs = 0
    for runs_counts, device_counts in zip(on_runs, on_device):
        np.testing.assert_array_equal(runs_counts.area, device_counts.area)
        np.testing.assert_array_equal(runs_counts.intersection, device_counts.intersection)
        pairs += runs_counts.intersection.size
    print(f"runs vs device: {sum(len(w.masks) for w in works)} masks, {pairs} pairs, all counts equal")
    assert pairs > 1000


def _lvis_version(gt: dict, seed: int = 1) -> dict:
    """The instance set as LVIS: federated negatives, non-exhaustive categories, frequency groups."""
    rng = np.random.default_rng(seed)
    gt = copy.deepcopy(gt)
    categories = [c["id"] for c in gt["categories"]]
    present: dict = {}
    for ann in gt["annotations"]:
        present.setdefault(ann["image_id"], set()).add(ann["category_id"])
    for image in gt["images"]:
        here = present.get(image["id"], set())
        absent = [c for c in categories if c not in here]
        image["neg_category_ids"] = [int(c) for c in rng.choice(absent, size=min(len(absent), 3), replace=False)]
        image["not_exhaustive_category_ids"] = [c for c in here if rng.random() < 0.2]
    for index, category in enumerate(gt["categories"]):
        category["frequency"] = "rcf"[index % 3]
    return gt


@pytest.mark.parametrize("iou_type", ["segm", "boundary"])
def test_lvis_summary_matches_the_official_evaluator(reference, instance_files, tmp_path, iou_type):
    folder, gt, results = instance_files
    (tmp_path / "lvis.json").write_text(json.dumps(_lvis_version(gt)))
    capped = 4  # a per-image cap below the detections per image, so the cap is exercised
    with contextlib.redirect_stdout(io.StringIO()):
        official = reference.lvis_eval.LVISEval(str(tmp_path / "lvis.json"), str(folder / "res.json"),
                                                iou_type=iou_type, max_dets=capped)
        official.run()
    ours = evaluate_instances(tmp_path / "lvis.json", folder / "res.json",
                              InstanceEvalConfig(iou_type=iou_type, dataset="lvis", lvis_max_dets=capped,
                                                 progress="none"))
    names = {"AR": f"AR@{capped}", "ARs": f"ARs@{capped}", "ARm": f"ARm@{capped}", "ARl": f"ARl@{capped}"}
    difference = max(abs(value - official.results[names.get(name, name)]) for name, value in ours.summary.items())
    print(f"lvis {iou_type}: max |ours - official| over the 13 numbers = {difference:.3g}")
    assert difference <= TOLERANCE


@pytest.fixture(scope="module")
def panoptic_files(real_data_dir, tmp_path_factory):
    return coco_eval_data.panoptic_dataset(real_data_dir, tmp_path_factory.mktemp("panoptic"), seed=0)


@pytest.mark.parametrize("iou_type", ["segm", "boundary"])
def test_pq_matches_the_official_evaluator(reference, panoptic_files, iou_type):
    paths = panoptic_files
    with contextlib.redirect_stdout(io.StringIO()):
        official = reference.panoptic.pq_compute(paths["gt_json"], paths["pred_json"], paths["gt_folder"],
                                                 paths["pred_folder"], iou_type=iou_type)
    ours = evaluate_panoptic(paths["gt_json"], paths["gt_folder"], paths["pred_json"], paths["pred_folder"],
                             PanopticEvalConfig(iou_type=iou_type, progress="none"))
    difference = max(abs(ours.groups[group][key] - official[group][key])
                     for group in ("All", "Things", "Stuff") for key in ("pq", "sq", "rq"))
    print(f"panoptic {iou_type}: max |ours - official| over PQ/SQ/RQ x All/Things/Stuff = {difference:.3g}")
    assert difference <= TOLERANCE
    assert all(ours.groups[g]["n"] == official[g]["n"] for g in ("All", "Things", "Stuff"))


def test_boundary_bands_match_the_official_mask_to_boundary(reference, instance_files):
    """Every real ground-truth mask and many detections: the band the evaluator counts equals the API's."""
    _, gt, results = instance_files
    sizes = {image["id"]: (image["height"], image["width"]) for image in gt["images"]}
    masks = [(string_runs(r["segmentation"]["counts"]),) + sizes[r["image_id"]] for r in results[:600]]
    canvas = (max(h for _, h, _ in masks), max(w for _, _, w in masks))
    checked = 0
    for start in range(0, len(masks), 64):
        chunk = masks[start:start + 64]
        buffer = np.zeros((len(chunk), canvas[1], packed_words(canvas[0])), np.uint32)
        decode_into(chunk, buffer)
        rows = np.ascontiguousarray(buffer.transpose(0, 2, 1))
        for index, (_, height, width) in enumerate(chunk):
            radius = boundary_width(height, width)
            band = rows[index] & ~np.asarray(erode_square_packed_traced(rows[index], np.int32(radius),
                                                                        boundary_width(*canvas)))
            bits = ((band[:, None, :] >> np.arange(32, dtype=np.uint32)[:, None]) & 1).reshape(-1, canvas[1])
            mask = ((rows[index][:, None, :] >> np.arange(32, dtype=np.uint32)[:, None]) & 1).reshape(-1, canvas[1])
            official = reference.utils.mask_to_boundary(mask[:height, :width].astype(np.uint8))
            np.testing.assert_array_equal(bits[:height, :width], official)
            assert not bits[height:].any() and not bits[:, width:].any()
            checked += 1
        counts = chunk_pair_counts(rows, np.int32(boundary_width(*chunk[0][1:])), np.zeros((4, 2), np.int32),
                                   max_radius=boundary_width(*canvas))
        assert int(np.asarray(counts.area)[0]) == int(chunk[0][0][1::2].sum())
    assert checked == len(masks)
