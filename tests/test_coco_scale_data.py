"""The COCO-scale synthetic set of the evaluator benchmark (experiments/coco_scale_data.py).

Small scales only: the files load as COCO ground truth and results
(pycocotools), the counts are the spec's, one seed gives the same bytes; the
panoptic variant's segments_info agree with its PNGs (ids, areas, boxes).
"""

from __future__ import annotations

import contextlib
import io
import json
import pathlib
import sys

import numpy as np
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "experiments"))
import coco_scale_data  # noqa: E402

pytest.importorskip("pycocotools")


@pytest.fixture(scope="module")
def small_set(tmp_path_factory):
    spec = coco_scale_data.scaled_spec(0.004, seed=3)  # 20 images
    folder = tmp_path_factory.mktemp("coco_scale")
    return spec, coco_scale_data.write_instance_set(folder, spec)


def test_scaled_spec_keeps_val2017_counts_per_image():
    spec = coco_scale_data.scaled_spec(0.1)
    assert (spec.images, spec.ground_truths, spec.detections) == (500, 3678, 50_000)
    full = coco_scale_data.scaled_spec(1.0)
    assert (full.images, full.ground_truths, full.detections) == (5_000, 36_781, 500_000)
    with pytest.raises(ValueError, match="scale must be positive"):
        coco_scale_data.scaled_spec(0)


def test_counts_are_the_specs(small_set):
    spec, written = small_set
    gt = json.loads(written["gt"].read_text())
    results = json.loads(written["results"].read_text())
    assert (written["images"], written["ground_truths"], written["detections"]) == (20, spec.ground_truths, 2000)
    assert len(gt["images"]) == 20 and len(gt["annotations"]) == spec.ground_truths and len(results) == 2000
    per_image = np.bincount([r["image_id"] for r in results], minlength=21)[1:]
    assert (per_image == spec.detections_per_image).all()
    assert [c["id"] for c in gt["categories"]] == list(coco_scale_data.COCO_CATEGORY_IDS)
    assert len({a["id"] for a in gt["annotations"]}) == len(gt["annotations"])


def test_files_are_valid_coco(small_set):
    from pycocotools import mask as mask_utils
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    _, written = small_set
    with contextlib.redirect_stdout(io.StringIO()):
        gt = COCO(str(written["gt"]))
        dt = gt.loadRes(str(written["results"]))
        evaluator = COCOeval(gt, dt, "segm")
        evaluator.evaluate()
        evaluator.accumulate()
        evaluator.summarize()
    assert 0 < evaluator.stats[0] < 1
    document = json.loads(written["gt"].read_text())  # COCOeval turned gt's polygons into RLE in place
    sizes = {image["id"]: (image["height"], image["width"]) for image in document["images"]}
    for annotation in document["annotations"]:
        mask = gt.annToMask(annotation)
        assert mask.shape == sizes[annotation["image_id"]]
        if annotation["iscrowd"]:  # uncompressed RLE: the counts cover the image, area is the pixel count
            assert isinstance(annotation["segmentation"]["counts"], list)
            assert sum(annotation["segmentation"]["counts"]) == mask.size
            assert annotation["area"] == mask.sum()
        elif len(annotation["segmentation"]) == 1:  # one polygon: its shoelace area is close to the pixel count
            assert abs(annotation["area"] - mask.sum()) <= 0.25 * mask.sum() + 20
        else:  # two parts, which may overlap: the sum of their areas
            assert len(annotation["segmentation"]) == 2 and annotation["area"] >= 0.75 * mask.sum()
    for result in dt.dataset["annotations"][:200]:
        rle = {"size": result["segmentation"]["size"], "counts": result["segmentation"]["counts"].encode()}
        np.testing.assert_allclose(result["bbox"], mask_utils.toBbox(rle))
        assert tuple(rle["size"]) == sizes[result["image_id"]]
        assert result["score"] == round(result["score"], 3)


def test_one_seed_gives_the_same_bytes(tmp_path, small_set):
    spec, written = small_set
    again = coco_scale_data.write_instance_set(tmp_path / "again", spec)
    other = coco_scale_data.write_instance_set(tmp_path / "other", coco_scale_data.scaled_spec(0.004, seed=4))
    for key in ("gt", "results"):
        assert again[key].read_bytes() == written[key].read_bytes()
        assert other[key].read_bytes() != written[key].read_bytes()


def test_panoptic_files_agree_with_their_pngs(tmp_path):
    from PIL import Image

    spec = coco_scale_data.CocoScaleSpec(images=4, ground_truths=30, seed=5)
    written = coco_scale_data.write_panoptic_set(tmp_path, spec)
    assert written["images"] == 4
    things = 0
    for name in ("gt", "pred"):
        document = json.loads(written[f"{name}_json"].read_text())
        kinds = {c["id"]: c["isthing"] for c in document["categories"]}
        assert sum(kinds.values()) == 80 and len(kinds) == 133
        sizes = {image["id"]: (image["height"], image["width"]) for image in document["images"]}
        assert len(document["annotations"]) == 4
        for annotation in document["annotations"]:
            rgb = np.array(Image.open(written[f"{name}_folder"] / annotation["file_name"])).astype(np.int64)
            ids = rgb[..., 0] + 256 * rgb[..., 1] + 65536 * rgb[..., 2]
            assert ids.shape == sizes[annotation["image_id"]]
            segments = {s["id"]: s for s in annotation["segments_info"]}
            assert set(np.unique(ids[ids > 0]).tolist()) == set(segments)  # every listed segment has pixels
            for segment_id, segment in segments.items():
                rows, cols = np.nonzero(ids == segment_id)
                assert segment["area"] == rows.size
                assert segment["bbox"] == [cols.min(), rows.min(), cols.max() - cols.min() + 1,
                                           rows.max() - rows.min() + 1]
            stuff = [s["category_id"] for s in segments.values() if not kinds[s["category_id"]]]
            assert len(stuff) == len(set(stuff)) >= 1  # one segment per stuff category
            if name == "gt":
                things += sum(kinds[s["category_id"]] for s in segments.values())
    assert 0 < things <= spec.ground_truths  # things painted over may vanish
    again = coco_scale_data.write_panoptic_set(tmp_path / "again", spec)
    assert again["gt_json"].read_bytes() == written["gt_json"].read_bytes()
    assert again["pred_json"].read_bytes() == written["pred_json"].read_bytes()
