"""Tests for jaxseg_robust.data.masks_io and jaxseg_robust.data.examples."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from jaxseg_robust.data import examples
from jaxseg_robust.data.masks_io import (
    MaskReadError,
    MaskRule,
    list_mask_files,
    parse_rule,
    read_gt_mask,
    read_mask,
    read_mask_size,
    read_mask_values,
)

VALUES = np.array([[0, 1, 127, 128], [129, 200, 255, 0]], np.uint8)


def test_parse_rule():
    assert parse_rule(">128") == MaskRule(">", 128)
    assert parse_rule(" >= 1 ") == MaskRule(">=", 1)
    assert str(parse_rule("==255")) == "==255"
    np.testing.assert_array_equal(parse_rule("!=0").apply(VALUES), VALUES != 0)
    for bad in ("128", "<5", ">-1", "> x", ""):
        with pytest.raises(ValueError, match="mask rule"):
            parse_rule(bad)


@pytest.mark.parametrize(
    "mode, make",
    [
        ("L", lambda v: Image.fromarray(v, "L")),
        ("RGB", lambda v: Image.fromarray(np.stack([v, v, v], -1), "RGB")),
        ("RGBA", lambda v: Image.fromarray(np.stack([v, v // 2, v, np.full_like(v, 7)], -1), "RGBA")),
        ("LA", lambda v: Image.fromarray(np.stack([v, np.full_like(v, 255)], -1), "LA")),
        ("I;16", lambda v: Image.fromarray(v.astype(np.uint16))),
    ],
)
def test_modes_decode_to_values(tmp_path, mode, make):
    path = tmp_path / "m.png"
    make(VALUES).save(path)
    with Image.open(path) as image:
        assert image.mode == mode
    np.testing.assert_array_equal(read_mask_values(path), VALUES)
    np.testing.assert_array_equal(read_mask(path, ">128"), VALUES > 128)
    assert read_mask_size(path) == (2, 4)


def test_palette_and_bilevel(tmp_path):
    palette = Image.fromarray(np.array([[0, 1], [2, 0]], np.uint8), "P")
    palette.putpalette([0, 0, 0, 255, 0, 0, 0, 255, 0] + [0] * 759)
    palette.save(tmp_path / "p.png")
    np.testing.assert_array_equal(read_mask(tmp_path / "p.png", "!=0"), [[False, True], [True, False]])
    Image.fromarray(np.array([[True, False]])).convert("1").save(tmp_path / "b.png")
    np.testing.assert_array_equal(read_mask_values(tmp_path / "b.png"), [[255, 0]])


def test_gt_ignore_band(tmp_path):
    Image.fromarray(VALUES).save(tmp_path / "gt.bmp")
    gt, valid = read_gt_mask(tmp_path / "gt.bmp", ">=128", ignore_value=128)
    np.testing.assert_array_equal(valid, VALUES != 128)
    np.testing.assert_array_equal(gt, (VALUES >= 128) & (VALUES != 128))
    gt, valid = read_gt_mask(tmp_path / "gt.bmp", ">128")
    assert valid.all() and gt.sum() == 3


def test_errors_name_the_file(tmp_path):
    broken = tmp_path / "broken.png"
    broken.write_bytes(b"\x89PNG not really")
    with pytest.raises(MaskReadError, match="broken.png: cannot read image"):
        read_mask(broken)
    with pytest.raises(MaskReadError, match="missing.png: cannot read image"):
        read_mask_size(tmp_path / "missing.png")
    Image.fromarray(VALUES.astype(np.float32), "F").save(tmp_path / "float.tif")
    with pytest.raises(MaskReadError, match="float.tif: unsupported image mode 'F'"):
        read_mask(tmp_path / "float.tif")
    with pytest.raises(MaskReadError, match="not a directory"):
        list_mask_files(tmp_path / "nowhere")


def test_list_mask_files(tmp_path):
    for name in ("a.png", "a.jpg", "b.bmp", "notes.txt"):
        (tmp_path / name).write_bytes(b"")
    (tmp_path / "sub.png").mkdir()
    unique, ambiguous = list_mask_files(tmp_path)
    assert list(unique) == ["b"] and unique["b"].name == "b.bmp"
    assert [p.name for p in ambiguous["a"]] == ["a.jpg", "a.png"]


def test_real_grabcut_mask_has_an_ignore_band(real_data_dir):
    folder = real_data_dir / "grabcut" / "masks"
    if not folder.is_dir():
        pytest.skip(f"{folder} not present")
    path = sorted(folder.glob("*.bmp"))[0]
    values = read_mask_values(path)
    gt, valid = read_gt_mask(path, "==255", ignore_value=128)
    assert set(np.unique(values)) <= {0, 128, 255}
    assert int((~valid).sum()) == int((values == 128).sum()) > 0
    np.testing.assert_array_equal(gt, values == 255)


def test_examples_are_deterministic_and_varied(tmp_path):
    first, second = examples.example_pairs(), examples.example_pairs()
    assert [p.name for p in first] == [p.name for p in second]
    for a, b in zip(first, second):
        np.testing.assert_array_equal(a.gt, b.gt)
        np.testing.assert_array_equal(a.pred, b.pred)
        assert a.gt.any() and a.pred.any() and not np.array_equal(a.gt, a.pred), a.name
    assert len({p.gt.shape for p in first}) == 2
    border = next(p for p in first if "border" in p.name)
    assert border.gt[:, 0].any() and border.gt[-1, :].any()
    gt_dir, pred_dir = examples.write_example_folders(tmp_path)
    assert sorted(p.stem for p in gt_dir.iterdir()) == sorted(p.name for p in first)
    np.testing.assert_array_equal(read_mask(pred_dir / f"{first[0].name}.png"), first[0].pred)


def test_checked_reading_applies_one_rule_to_label_masks_ignore_values_and_off_values(tmp_path):
    from jaxseg_robust.data.masks_io import empty_mask_hint, off_value_fraction, read_mask_checked

    labels = np.array([[0, 1, 1], [0, 255, 1]], np.uint8)  # 0/1 labels with an ignore value 255
    Image.fromarray(labels).save(tmp_path / "l.png")
    reading = read_mask_checked(tmp_path / "l.png", ">128", ignore_value=255)
    assert str(reading.rule) == ">128" and reading.warning is None and not reading.foreground.any()
    assert empty_mask_hint(reading.values, reading.rule, reading.valid) == (
        "rule >128; values in the file: 0, 1; label or palette-id masks: rule '>0'")
    reading = read_mask_checked(tmp_path / "l.png", ">0", ignore_value=255)
    np.testing.assert_array_equal(reading.foreground, [[False, True, True], [False, False, True]])
    np.testing.assert_array_equal(reading.valid, labels != 255)
    assert empty_mask_hint(np.zeros((2, 2), np.uint8), ">128") == "rule >128; values in the file: only 0"
    assert empty_mask_hint(np.array([[0, 100]]), ">128") == "rule >128; values in the file: 0, 100"  # no label hint
    ringing = np.where(np.arange(100)[:, None] < 50, 0, 255).repeat(100, 1).astype(np.uint8)
    ringing[48:52] = [[30], [60], [200], [230]]  # JPEG-like values next to 0 / 255: within a quarter gap
    assert off_value_fraction(ringing)[0] == 0.0
    ringing[48:52] = 128  # a grey band in the middle: 4 % off
    assert off_value_fraction(ringing)[0] == pytest.approx(0.04)
    assert "16.7%" in read_mask_checked(tmp_path / "l.png").warning  # 255 is off without the ignore value
    Image.fromarray(ringing).save(tmp_path / "r.png")
    assert read_mask_checked(tmp_path / "r.png").warning.startswith(f"{tmp_path / 'r.png'}: not a two-valued mask: 4.0%")


def test_label_maps_are_clean_under_id_rules_only(tmp_path):
    from jaxseg_robust.data.masks_io import read_mask_checked

    ids = np.zeros((60, 60), np.uint8)
    ids[5:25, 5:25], ids[30:55, 30:55] = 1, 2  # two objects: pick one with ==2, merge with !=0
    Image.fromarray(ids).save(tmp_path / "ids.png")
    for rule in ("==2", "!=0"):
        assert read_mask_checked(tmp_path / "ids.png", rule).warning is None
    assert "not a two-valued mask" in read_mask_checked(tmp_path / "ids.png", ">=1").warning  # a threshold rule
