"""Tests for the RClicks clicks CSV reader, task loading and previous masks (spec §1)."""

from __future__ import annotations

import io

import jax.numpy as jnp
import numpy as np
import pytest
from PIL import Image

from jaxseg_robust.clicksim import clickability as C
from jaxseg_robust.clicksim import clicks_csv as K
from jaxseg_robust.clicksim.previous_mask import previous_mask_path, read_previous_mask
from jaxseg_robust.data.masks_io import MaskReadError

HEADER = "dataset,image_stem,object_stem,model_type,click_type,full_stem,device,x,y,w,h"
ROWS = [
    "GrabCut,person7,,,first,person7,pc,100,50,640,480",
    "GrabCut,person7,,,first,person7,mobile,700,-3,640,480",        # clipped to (639, 0)
    "GrabCut,person7,,mivos,fn,person7_mivos_fn,pc,10,20,640,480",
    "Berkeley,153093,,simple,fn,153093_simple_fn_pc_20,mobile,5,6,481,321",
    "GrabCut,person7,,,first,person7,pc,101,51,640,480",
    "TETRIS,img9,65793,,first,img9_______65793,pc,3999,2999,4000,3000",
    "TETRIS,img9,65793,sam,fp,img9_______65793_sam_fp_mobile_3,mobile,2000,1000,4000,3000",
]


def csv_text(rows=ROWS, header=HEADER) -> str:
    return "\n".join([header, *rows]) + "\n"


def read(text: str, strict: bool = True) -> K.ClicksTable:
    return K.read_clicks_csv(io.StringIO(text), strict=strict)


def test_read_table_and_tasks(tmp_path):
    path = tmp_path / "clicks.csv"
    path.write_text(csv_text())
    table = K.read_clicks_csv(path)
    assert len(table) == 7 and table.source == str(path)
    assert table.object_stem[0] == "" and table.model_type[0] == ""  # empty strings kept
    np.testing.assert_array_equal(table.line, np.arange(2, 9))
    assert K.task_stems(table) == ["person7", "person7_mivos_fn", "153093_simple_fn_pc_20", "img9_______65793",
                                   "img9_______65793_sam_fp_mobile_3"]
    assert K.task_stems(table, dataset="GrabCut") == ["person7", "person7_mivos_fn"]
    assert K.task_stems(table, dataset="GrabCut", available_image_stems={"other"}) == []
    assert K.task_stems(table, image_stems=["153093"]) == ["153093_simple_fn_pc_20"]
    assert len(table.filter(click_type="first", device="pc")) == 3


def test_column_order_and_extra_columns_do_not_matter():
    header = "x,y,w,h,extra,full_stem,device,click_type,model_type,object_stem,image_stem,dataset"
    row = "7,8,20,10,zzz,a1,pc,first,,,a1,DAVIS"
    table = read(csv_text([row], header))
    clicks = K.task_clicks(table, "a1")
    assert (clicks.xs.tolist(), clicks.ys.tolist(), clicks.width, clicks.height) == ([7], [8], 20, 10)


def test_task_clicks_clip_device_and_order():
    table = read(csv_text())
    clicks = K.task_clicks(table, "person7")
    assert clicks.xs.tolist() == [100, 639, 101] and clicks.ys.tolist() == [50, 0, 51]  # CSV order, clipped
    assert clicks.devices.tolist() == ["pc", "mobile", "pc"]
    assert (clicks.click_type, clicks.model_type, clicks.object_stem) == ("first", "", "")
    assert K.task_clicks(table, "person7", device="mobile").xs.tolist() == [639]
    assert K.task_clicks(table, "person7_mivos_fn", device="mobile").xs.size == 0
    with pytest.raises(KeyError, match="nope"):
        K.task_clicks(table, "nope")
    with pytest.raises(ValueError, match="device"):
        K.task_clicks(table, "person7", device="tablet")


def test_task_clicks_with_tetris_size_cap():
    table = read(csv_text())
    clicks = K.task_clicks(table, "img9_______65793", max_side=K.TETRIS_MAX_SIDE)
    assert (clicks.width, clicks.height) == (2048, 1536)
    # floor(x * w' / w): 3999 * 2048 / 4000 = 2047.48 -> 2047; 2999 * 1536 / 3000 = 1535.49 -> 1535.
    assert clicks.xs.tolist() == [2047] and clicks.ys.tolist() == [1535]
    assert K.object_code(clicks.object_stem) == 65793 and K.object_code("") is None
    uncapped = K.task_clicks(table, "img9_______65793")
    assert (uncapped.width, uncapped.height) == (4000, 3000)


@pytest.mark.parametrize("size, cap, expected", [
    ((640, 480), 2048, (640, 480)), ((4000, 3000), 2048, (2048, 1536)), ((3000, 4000), 2048, (1536, 2048)),
    ((2049, 2049), 2048, (2048, 2048)), ((5000, 1001), 2048, (2048, 410)), ((640, 480), None, (640, 480))])
def test_limited_image_size(size, cap, expected):
    assert K.limited_image_size(*size, cap) == expected


def test_full_stem_grammar():
    assert K.image_stem_of("153093_simple_fn_pc_20") == "153093"
    assert K.image_stem_of("person7_mivos_fn") == "person7"
    assert K.image_object_stem_of("img9_______65793_sam_fp_mobile_3") == "img9_______65793"
    assert K.image_stem_of("img9_______65793_sam_fp_mobile_3") == "img9"
    assert K.image_stem_of("dog_sample_ritm_fn") == "dog"  # reference quirk: '_sam' cuts first


@pytest.mark.parametrize("row, line_column, message", [
    ("GrabCut,a,,,first,a,pc,1.5,2,10,10", ("line 2", "'x'"), "integer"),
    ("GrabCut,a,,,first,a,pc,1,2,0,10", ("line 2", "'w'"), ">= 1"),
    ("GrabCut,a,,,second,a,pc,1,2,10,10", ("line 2", "'click_type'"), "first"),
    ("GrabCut,a,,,first,a,laptop,1,2,10,10", ("line 2", "'device'"), "pc"),
    ("GrabCut,a,,,first,,pc,1,2,10,10", ("line 2", "'full_stem'"), "empty"),
    ("GrabCut,a,,,first,a,pc,1,2,10", ("line 2",), "expected 11 fields"),
    ("GrabCut,a,,ritm,first,a,pc,1,2,10,10", ("line 2", "'model_type'"), "'first'"),
    ("GrabCut,a,,,fn,a_mivos_fn,pc,1,2,10,10", ("line 2", "'model_type'"), "'first'"),
    ("GrabCut,a,,gpt,fn,a_gpt_fn,pc,1,2,10,10", ("line 2", "'model_type'"), "strict=False"),
    ("TETRIS,a,x1,,first,a_______x1,pc,1,2,10,10", ("line 2", "'object_stem'"), "integer"),
    ("GrabCut,b,,,first,a,pc,1,2,10,10", ("line 2", "'full_stem'"), "image/object"),
])
def test_row_errors_name_line_and_column(row, line_column, message):
    with pytest.raises(K.ClicksCsvError, match=message) as error:
        read(csv_text([row]))
    for part in line_column:
        assert part in str(error.value)
    assert str(error.value).startswith("<stream>: line 2 (data row 1)")


def test_error_on_a_later_row_names_that_row():
    rows = ROWS[:3] + ["GrabCut,person7,,,first,person7,pc,abc,5,640,480"]
    with pytest.raises(K.ClicksCsvError, match=r"line 5 \(data row 4\), column 'x'"):
        read(csv_text(rows))


def test_header_errors():
    with pytest.raises(K.ClicksCsvError, match=r"missing required column\(s\) \['device'\]"):
        read(csv_text(["x"], HEADER.replace(",device", "")))
    with pytest.raises(K.ClicksCsvError, match="column 'x': appears 2 times"):
        read(csv_text([], HEADER + ",x"))
    with pytest.raises(K.ClicksCsvError, match="empty file"):
        read("")
    # A UTF-8 byte-order mark before the header is accepted.
    assert len(read("\ufeff" + csv_text())) == 7


def test_task_consistency_strict_and_reference_mode():
    rows = ROWS[:2] + ["GrabCut,person7,,,first,person7,pc,100,50,641,480"]
    with pytest.raises(K.ClicksCsvError, match=r"line 4 \(data row 3\), column 'w'.*'person7'.*line 2"):
        read(csv_text(rows))
    table = read(csv_text(rows), strict=False)  # reference: the first row's w, h win
    clicks = K.task_clicks(table, "person7")
    assert clicks.width == 640 and clicks.xs.tolist() == [100, 639, 100]
    # Non-strict mode accepts unknown model types and stems that do not parse.
    loose = read(csv_text(["GrabCut,b,,gpt,fn,a_gpt_fn,pc,1,2,10,10"]), strict=False)
    assert K.task_stems(loose) == ["a_gpt_fn"]


def test_split_file_and_padding(tmp_path):
    split = tmp_path / "TETRIS_val.txt"
    split.write_text("img1\nimg2\r\n\nimg3")  # no newline at the end, a blank line, CRLF
    assert K.read_split_file(split) == ["img1", "img2", "img3"]
    points, valid = K.pad_clicks([3, 4], [5, 6], 4)
    np.testing.assert_array_equal(points, [[3, 5], [4, 6], [0, 0], [0, 0]])
    np.testing.assert_array_equal(valid, [True, True, False, False])
    with pytest.raises(ValueError, match="num_slots"):
        K.pad_clicks([1, 2, 3], [1, 2, 3], 2)


def test_previous_mask_red_channel(tmp_path):
    rgb = np.zeros((4, 5, 3), np.uint8)
    rgb[..., 0] = np.arange(20).reshape(4, 5) * 10
    rgb[..., 1] = 255  # other channels are ignored
    Image.fromarray(rgb).save(previous_mask_path(tmp_path, "t_sam_fn"))
    mask = read_previous_mask(tmp_path / "t_sam_fn.png")
    assert mask.dtype == np.float32
    np.testing.assert_allclose(mask, rgb[..., 0] / np.float32(255))
    Image.fromarray(rgb[..., 0]).save(tmp_path / "grey.png")
    np.testing.assert_allclose(read_previous_mask(tmp_path / "grey.png"), mask)
    Image.fromarray(np.zeros((3, 3), np.uint16)).save(tmp_path / "deep.png")
    with pytest.raises(MaskReadError, match="deep.png"):
        read_previous_mask(tmp_path / "deep.png")
    with pytest.raises(MaskReadError, match="missing.png"):
        read_previous_mask(tmp_path / "missing.png")


def test_task_to_ground_truth_map_end_to_end():
    table = read(csv_text())
    clicks = K.task_clicks(table, "person7")
    points, valid = K.pad_clicks(clicks.xs, clicks.ys, 8)
    gt = np.zeros((clicks.height, clicks.width), np.float32)
    gt[20:200, 50:300] = 1.0
    error = C.error_mask(gt, None, clicks.click_type)
    clickability = C.gt_clickability_map(points, valid, error)
    assert clickability.shape == (480, 640)
    # The peak sits at the two clustered pc clicks (the third lies outside the soft mask).
    y, x = np.unravel_index(int(jnp.argmax(clickability)), clickability.shape)
    assert abs(x - 100.5) <= 1 and abs(y - 50.5) <= 1
