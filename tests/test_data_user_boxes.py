"""Tests of the user-box readers (BREPS PNG layout, CSV) and the BREPS aggregation (spec §4.9)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from PIL import Image

from jaxseg_robust.data.user_boxes import (
    UserBoxError,
    aggregate_user_ious,
    boxes_by_image,
    dataset_of,
    image_stem_of,
    per_image_iou_stats,
    read_user_box_masks,
    read_user_boxes_csv,
    resized_prompt_box,
)


def _write(tmp_path, text, name="boxes.csv"):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_csv_with_and_without_user(tmp_path):
    path = _write(tmp_path, "image_id,x1,y1,x2,y2,user\nGrabCut_a,1,2,30.5,40,u1\n\n"
                            " GrabCut_a , 0,0,5,5 , u2\nDAVIS_b,-3,1e1,7,10,u1\n")
    boxes = read_user_boxes_csv(path)
    assert [b.image_id for b in boxes] == ["GrabCut_a", "GrabCut_a", "DAVIS_b"]
    assert [b.user for b in boxes] == ["u1", "u2", "u1"]
    assert boxes[0].box == (1.0, 2.0, 30.5, 40.0) and boxes[2].box == (-3.0, 10.0, 7.0, 10.0)
    assert boxes[1].source.endswith("row 4")  # the blank line counts as a line
    grouped = boxes_by_image(boxes)
    assert list(grouped) == ["GrabCut_a", "DAVIS_b"] and grouped["GrabCut_a"].shape == (2, 4)
    plain = read_user_boxes_csv(_write(tmp_path, "image_id,x1,y1,x2,y2\na,1,1,2,2\na,1,1,2,2\n", "p.csv"))
    assert [b.user for b in plain] == ["", ""]  # anonymous duplicates are allowed


@pytest.mark.parametrize("text, match", [
    ("", "empty file"),
    ("image,x1,y1,x2,y2\n", "header"),
    ("image_id,x1,y1,x2,y2,user,extra\n", "header"),
    ("image_id,x1,y1,x2,y2\n", "no boxes"),
    ("image_id,x1,y1,x2,y2\na,1,2,3\n", "row 2: expected 5 fields"),
    ("image_id,x1,y1,x2,y2\na,1,2,3,4\nb,1,x,3,4\n", "row 3: column 'y1' is not a number"),
    ("image_id,x1,y1,x2,y2\na,1,2,nan,4\n", "column 'x2' is not finite"),
    ("image_id,x1,y1,x2,y2\na,1,2,inf,4\n", "not finite"),
    ("image_id,x1,y1,x2,y2\na,5,2,3,4\n", "row 2: corners not ordered"),
    ("image_id,x1,y1,x2,y2\na,1,5,3,4\n", "corners not ordered"),
    ("image_id,x1,y1,x2,y2\n,1,2,3,4\n", "empty image_id"),
    ("image_id,x1,y1,x2,y2,user\na,1,2,3,4,\n", "empty user"),
    ("image_id,x1,y1,x2,y2,user\na,1,2,3,4,u\na,1,2,3,5,u\n", r"row 3: user 'u' already .* \(row 2\)"),
])
def test_csv_errors_name_file_and_row(tmp_path, text, match):
    path = _write(tmp_path, text)
    with pytest.raises(UserBoxError, match=match) as info:
        read_user_boxes_csv(path)
    assert str(path) in str(info.value)


def test_csv_missing_file(tmp_path):
    with pytest.raises(UserBoxError, match="no such file"):
        read_user_boxes_csv(tmp_path / "absent.csv")


def test_image_stem_rules():
    assert image_stem_of("GrabCut_12_1_abc") == ("GrabCut_12", "abc")
    assert image_stem_of("img_1_u_1_x") == ("img", "u_1_x")  # first _1_ (reference rule)
    # the reference's BUID patch: with known stems the full stem wins
    assert image_stem_of("BUID_1_1_worker7") == ("BUID", "1_worker7")
    assert image_stem_of("BUID_1_1_worker7", ["BUID_1", "COCO_3"]) == ("BUID_1", "worker7")
    with pytest.raises(UserBoxError, match="ambiguous"):
        image_stem_of("BUID_1_1_worker7", ["BUID", "BUID_1"])
    with pytest.raises(UserBoxError, match="no image stem"):
        image_stem_of("COCO_1_u", ["DAVIS"])
    with pytest.raises(UserBoxError, match="_1_"):
        image_stem_of("GrabCut_12")


def _rectangle_png(path, hw, box, mode="L"):
    x1, y1, x2, y2 = box
    mask = np.zeros(hw, np.uint8)
    mask[y1:y2 + 1, x1:x2 + 1] = 255
    image = Image.fromarray(mask)
    if mode == "RGB":
        rgb = np.zeros(hw + (3,), np.uint8)
        rgb[..., 2] = mask  # only one channel drawn
        image = Image.fromarray(rgb)
    image.save(path)


def test_png_layout(tmp_path):
    _rectangle_png(tmp_path / "DAVIS_cat_1_w2.png", (40, 60), (5, 6, 20, 30))
    _rectangle_png(tmp_path / "DAVIS_cat_1_w1.png", (40, 60), (0, 0, 59, 39), mode="RGB")
    _rectangle_png(tmp_path / "COCO_7_1_w1.png", (30, 20), (3, 3, 3, 3))  # one pixel
    (tmp_path / "notes.txt").write_text("ignored")
    boxes = read_user_box_masks(tmp_path)
    assert [(b.image_id, b.user) for b in boxes] == [("COCO_7", "w1"), ("DAVIS_cat", "w1"), ("DAVIS_cat", "w2")]
    assert boxes[0].box == (3.0, 3.0, 3.0, 3.0)
    assert boxes[1].box == (0.0, 0.0, 59.0, 39.0)
    assert boxes[2].box == (5.0, 6.0, 20.0, 30.0) and boxes[2].box_resized is None
    resized = read_user_box_masks(tmp_path, ["DAVIS_cat", "COCO_7"], resized_long_side=1024)
    full = resized[1].box_resized  # the whole 40x60 image -> the whole 683x1024 frame
    assert full == (0.0, 0.0, 1023.0, 682.0)
    x1, y1, x2, y2 = resized[2].box_resized  # antialias tails widen the box by at most ~1 source pixel
    scale = 1024 / 60
    assert 5 * scale - scale - 1 <= x1 <= 5 * scale and 20 * scale <= x2 <= 21 * scale + scale
    assert 6 * scale - scale - 1 <= y1 <= 6 * scale and 30 * scale <= y2 <= 31 * scale + scale
    with pytest.raises(UserBoxError, match="resized"):
        boxes_by_image(boxes, resized=True)
    np.testing.assert_array_equal(boxes_by_image(resized, resized=True)["COCO_7"].shape, (1, 4))


def test_png_layout_errors(tmp_path):
    with pytest.raises(UserBoxError, match="not a directory"):
        read_user_box_masks(tmp_path / "absent")
    with pytest.raises(UserBoxError, match="no .png"):
        read_user_box_masks(tmp_path)
    _rectangle_png(tmp_path / "A_1_u.png", (8, 8), (1, 1, 2, 2))
    with pytest.raises(UserBoxError, match="no image stem"):
        read_user_box_masks(tmp_path, ["B"])
    Image.fromarray(np.zeros((8, 8), np.uint8)).save(tmp_path / "A_1_v.png")
    with pytest.raises(UserBoxError, match="A_1_v.png: empty prompt mask"):
        read_user_box_masks(tmp_path)
    (tmp_path / "A_1_v.png").write_bytes(b"not a png")
    with pytest.raises(UserBoxError, match="A_1_v.png"):
        read_user_box_masks(tmp_path)
    (tmp_path / "A_1_v.png").unlink()
    _rectangle_png(tmp_path / "stray.png", (8, 8), (1, 1, 2, 2))
    with pytest.raises(UserBoxError, match="stray.png"):
        read_user_box_masks(tmp_path)


@pytest.mark.parity
def test_resized_box_matches_torch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(1)
    mask = np.zeros((75, 113), bool)
    mask[rng.integers(0, 30):rng.integers(40, 75), rng.integers(0, 50):rng.integers(60, 113)] = True
    resized = torch.nn.functional.interpolate(torch.from_numpy(mask.astype(np.float32))[None, None],
                                              (680, 1024), mode="bilinear", align_corners=False,
                                              antialias=True)[0, 0].numpy() > 0
    rows, cols = np.flatnonzero(resized.any(1)), np.flatnonzero(resized.any(0))
    assert resized_prompt_box(mask, 1024) == (cols[0], rows[0], cols[-1], rows[-1])


def test_aggregation_by_hand():
    ids = ["GrabCut_a", "GrabCut_a", "GrabCut_a", "GrabCut_b", "GrabCut_b", "DAVIS_x"]
    ious = [0.5, 0.7, 0.9, 0.2, np.nan, 0.4]
    stats = per_image_iou_stats(ids, ious)
    assert stats["GrabCut_a"].mean == pytest.approx(0.7) and stats["GrabCut_a"].std == pytest.approx(0.2)
    assert stats["GrabCut_b"].count == 1 and math.isnan(stats["GrabCut_b"].std)
    summary = aggregate_user_ious(ids, ious)
    assert list(summary) == ["GrabCut", "DAVIS"]
    assert summary["GrabCut"].mean == pytest.approx((0.7 + 0.2) / 2)
    assert summary["GrabCut"].std == pytest.approx(0.2)  # image b's NaN std is skipped
    assert (summary["GrabCut"].n_images, summary["GrabCut"].n_boxes) == (2, 4)
    assert summary["DAVIS"].mean == pytest.approx(0.4) and math.isnan(summary["DAVIS"].std)
    assert dataset_of("MedScribble_12_3") == "MedScribble"
    with pytest.raises(ValueError, match="equal length"):
        aggregate_user_ious(["a"], [0.1, 0.2])


def test_aggregation_equals_a_restatement_of_the_notebook():
    """groupby(image).mean().mean() and groupby(image).std().mean() with pandas' NaN skipping."""
    import statistics

    rng = np.random.default_rng(3)
    ids = [f"{d}_{i}" for d in ("COCO", "ADE20K", "BUID") for i in range(6) for _ in range(rng.integers(1, 6))]
    ious = rng.uniform(0, 1, len(ids))
    ious[rng.integers(0, len(ids), 4)] = np.nan
    summary = aggregate_user_ious(ids, ious)
    for dataset in ("COCO", "ADE20K", "BUID"):
        per_image: dict = {}
        for image_id, value in zip(ids, ious):
            if image_id.split("_")[0] == dataset and not math.isnan(value):
                per_image.setdefault(image_id, []).append(float(value))
        means = [statistics.mean(v) for v in per_image.values()]
        stds = [statistics.stdev(v) for v in per_image.values() if len(v) >= 2]
        assert summary[dataset].mean == pytest.approx(statistics.mean(means), abs=1e-12)
        assert summary[dataset].std == pytest.approx(statistics.mean(stds), abs=1e-12)
        assert summary[dataset].n_images == len(means)
