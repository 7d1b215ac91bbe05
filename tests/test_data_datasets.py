"""Tests for jaxseg_robust.data.datasets: layouts, decoding rules, errors, resizing, real data."""

from __future__ import annotations

import csv
import json
import os
import pathlib
import sys
import warnings

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from PIL import Image

from jaxseg_robust.data import datasets as ds
from jaxseg_robust.data.datasets import (
    DATA_ENV_VAR,
    DatasetError,
    DatasetWarning,
    capped_size,
    decode_grabcut_gt,
    load_dataset,
    load_datasets,
    packed_ids,
    read_image_rgb,
    read_image_size,
    resize_bilinear_uint8,
    resize_id_map,
    resolve_datasets,
    split_instance_id,
)
from jaxseg_robust.data.instances import InstanceError, validate_instance

cv2 = pytest.importorskip("cv2")

RNG = np.random.default_rng(0)


# ----------------------------------------------------------------------------- helpers


def _image(height, width, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)


def _save(array, path, mode=None):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(array, mode).save(path) if mode else Image.fromarray(array).save(path)
    return path


def _cv2_rgb(path):
    return cv2.cvtColor(cv2.imread(str(path), cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB)


def _pair_folder(root, images="images", masks="masks", count=2, size=(6, 8), mask_suffix=".png"):
    """``count`` PNG images and 0/255 grey masks (a filled rectangle each)."""
    for index in range(count):
        stem = f"im{index}"
        _save(_image(*size, seed=index), root / images / f"{stem}.png")
        mask = np.zeros(size, np.uint8)
        mask[1: 3 + index, 2:5] = 255
        _save(mask, root / masks / f"{stem}{mask_suffix}")
    return root


# ----------------------------------------------------------------------------- single-object kinds


def test_grabcut_decoding_layouts_and_order(tmp_path):
    folder = tmp_path / "GrabCut"
    values = np.array([[0, 128, 255, 1], [50, 200, 129, 127], [128, 0, 0, 255]], np.uint8)
    image_b = _image(3, 4, seed=1)
    _save(image_b, folder / "data_GT" / "b.bmp")
    _save(_image(3, 4, seed=2), folder / "data_GT" / "a.png")
    _save(values, folder / "boundary_GT" / "b.bmp")
    _save(values, folder / "boundary_GT" / "a.bmp")
    (folder / "data_GT" / "notes.txt").write_text("not an image")
    refs = load_dataset("grabcut", tmp_path)
    assert [r.id for r in refs] == ["a", "b"]  # sorted by image file name
    assert all(r.dataset == "grabcut" and r.size == (3, 4) for r in refs)
    instance = refs[1].load()
    validate_instance(instance)
    np.testing.assert_array_equal(instance.image, image_b)
    expected = np.array([[0, -1, 1, 1], [0, 1, 1, 0], [-1, 0, 0, 1]], np.int8)
    np.testing.assert_array_equal(instance.gt, expected)
    assert instance.gt.dtype == np.int8
    assert instance.source_paths == (str(folder / "data_GT" / "b.bmp"), str(folder / "boundary_GT" / "b.bmp"))
    # the same result as RITM's rule applied to OpenCV's channel 0
    blue = cv2.imread(str(folder / "boundary_GT" / "b.bmp"))[:, :, 0].astype(np.int32)
    blue[blue == 128] = -1
    blue[blue > 128] = 1
    np.testing.assert_array_equal(instance.gt, np.where(blue == 1, 1, np.where(blue == -1, -1, 0)))


def test_layout_candidates_and_overrides(tmp_path):
    _pair_folder(tmp_path / "davis", "img", "gt")
    assert [r.id for r in load_dataset("DAVIS", tmp_path)] == ["im0", "im1"]
    _pair_folder(tmp_path / "davis", "images", "masks")
    with pytest.raises(DatasetError, match="several image/mask folder pairs"):
        load_dataset("davis", tmp_path)
    refs = load_dataset("davis", tmp_path, images_dir="images", masks_dir="masks")
    assert refs[0].source_paths[0].endswith("images/im0.png")
    with pytest.raises(DatasetError, match="masks folder .* does not exist"):
        load_dataset("davis", tmp_path, masks_dir="nowhere")


def test_berkeley_uses_opencv_channel_zero(tmp_path):
    mask = np.zeros((2, 4, 3), np.uint8)
    mask[0, 0] = (255, 0, 0)  # red: OpenCV's channel 2, not object
    mask[0, 1] = (0, 0, 255)  # blue: OpenCV's channel 0, object
    mask[0, 2] = (255, 0, 255)  # magenta (as in some Berkeley masks): object
    mask[1, :] = (197, 197, 197)
    _save(_image(2, 4), tmp_path / "berkeley" / "images" / "x.jpg")
    _save(mask, tmp_path / "berkeley" / "masks" / "x.png")
    gt = load_dataset("berkeley", tmp_path)[0].load().gt
    np.testing.assert_array_equal(gt, [[0, 1, 1, 0], [1, 1, 1, 1]])
    channel0 = cv2.imread(str(tmp_path / "berkeley" / "masks" / "x.png"))[:, :, 0]
    np.testing.assert_array_equal(gt == 1, channel0 > 128)


def test_davis_palette_reads_colours_like_opencv(tmp_path):
    index = np.array([[0, 1, 2], [3, 0, 2]], np.uint8)
    palette = Image.fromarray(index, "P")
    palette.putpalette([0, 0, 0, 0, 0, 0, 200, 0, 0, 0, 0, 1] + [0] * 756)  # index 1 is black
    (tmp_path / "coco_mval" / "gt").mkdir(parents=True)
    palette.save(tmp_path / "coco_mval" / "gt" / "p.png")
    _save(_image(2, 3), tmp_path / "coco_mval" / "img" / "p.jpg")
    ref = load_datasets("COCO_MVal", root=tmp_path)[0]
    assert (ref.dataset, ref.id) == ("coco_mval", "p")
    gt = ref.load().gt
    np.testing.assert_array_equal(gt, [[0, 0, 1], [1, 0, 1]])  # black index 1 is background, as in OpenCV
    np.testing.assert_array_equal(gt == 1, cv2.imread(str(tmp_path / "coco_mval" / "gt" / "p.png")).max(2) > 0)


def test_folder_kind_rule_ignore_and_path_forms(tmp_path):
    folder = tmp_path / "my pairs"
    values = np.array([[0, 128, 255], [255, 7, 128]], np.uint8)
    _save(_image(2, 3), folder / "images" / "z.png")
    _save(values, folder / "masks" / "z.png")
    by_path = load_dataset(folder, rule="==255", ignore_value=128)
    by_kind = load_dataset("folder", folder, rule="==255", ignore_value=128, name="pairs")
    assert by_path[0].key == ("my pairs", "z") and by_kind[0].key == ("pairs", "z")
    for ref in (by_path[0], by_kind[0]):
        np.testing.assert_array_equal(ref.load().gt, [[0, -1, 1], [1, 0, -1]])
    default_rule = load_dataset(folder)[0].load().gt  # >128, no ignore value
    np.testing.assert_array_equal(default_rule, [[0, 0, 1], [1, 0, 0]])
    with pytest.raises(DatasetError, match="'folder' kind needs root"):
        load_dataset("folder")


def test_empty_object_fails_at_load_unless_allowed(tmp_path):
    _save(_image(4, 4), tmp_path / "pairs" / "images" / "e.png")
    _save(np.zeros((4, 4), np.uint8), tmp_path / "pairs" / "masks" / "e.png")
    ref = load_dataset(tmp_path / "pairs")[0]
    with pytest.raises(InstanceError, match=r"pairs/e: mask .*e\.png has no object pixel \(rule >128; values in the "
                                            r"file: only 0\)") as caught:
        ref.load()
    assert "allow_empty" not in str(caught.value)  # no Python argument a CLI user cannot set
    assert not load_dataset(tmp_path / "pairs", allow_empty=True)[0].load().gt.any()


# ----------------------------------------------------------------------------- image reading


@pytest.mark.parametrize("mode", ["L", "RGBA", "P", "LA", "1"])
def test_image_modes_read_as_opencv(tmp_path, mode):
    rgb = _image(5, 7, seed=3)
    image = Image.fromarray(rgb).convert(mode)
    path = tmp_path / "m.png"
    image.save(path)
    decoded = read_image_rgb(path)
    assert decoded.dtype == np.uint8 and decoded.shape == (5, 7, 3)
    np.testing.assert_array_equal(decoded, _cv2_rgb(path))


def test_sixteen_bit_keeps_high_byte(tmp_path):
    values = np.array([[0, 255, 256, 65535], [1000, 40000, 511, 512]], np.uint16)
    path = tmp_path / "d.png"
    Image.fromarray(values).save(path)
    np.testing.assert_array_equal(read_image_rgb(path)[..., 0], values >> 8)
    np.testing.assert_array_equal(read_image_rgb(path), _cv2_rgb(path))


@pytest.mark.parametrize("orientation", [3, 5, 6, 8])
def test_exif_orientation_applied_like_opencv(tmp_path, orientation):
    path = tmp_path / "o.jpg"
    exif = Image.Exif()
    exif[0x0112] = orientation
    Image.fromarray(_image(6, 10, seed=4)).save(path, quality=95, exif=exif.tobytes())
    expected = _cv2_rgb(path)
    assert read_image_size(path) == expected.shape[:2]
    np.testing.assert_array_equal(read_image_rgb(path), expected)


# ----------------------------------------------------------------------------- listing problems


def test_missing_mask_modes(tmp_path):
    folder = _pair_folder(tmp_path / "pairs", count=3)
    (folder / "masks" / "im1.png").unlink()
    with pytest.raises(DatasetError, match=r"(?s)1 problem.*images/im1\.png: no mask with stem 'im1'"):
        load_dataset(folder)
    with pytest.warns(DatasetWarning, match=r"im1\.png: no mask"):
        assert [r.id for r in load_dataset(folder, on_bad_pair="skip")] == ["im0", "im2"]
    refs = load_dataset(folder, on_bad_pair="fail")
    assert [r.id for r in refs] == ["im0", "im1", "im2"]
    assert refs[1].size == (6, 8)  # declared from the image header
    with pytest.raises(InstanceError, match=r"pairs/im1: .*im1\.png: no mask"):
        refs[1].load()


def test_orphan_mask_and_ambiguous_stems(tmp_path):
    folder = _pair_folder(tmp_path / "pairs", count=2)
    _save(np.zeros((6, 8), np.uint8), folder / "masks" / "ghost.png")
    with pytest.raises(DatasetError, match=r"masks/ghost\.png: no image with stem 'ghost'"):
        load_dataset(folder)
    for mode in ("skip", "fail"):  # a mask without an image is no instance: only warned about
        with pytest.warns(DatasetWarning, match="ghost"):
            assert [r.id for r in load_dataset(folder, on_bad_pair=mode)] == ["im0", "im1"]
    (folder / "masks" / "ghost.png").unlink()
    _save(_image(6, 8), folder / "images" / "im0.jpg")
    with pytest.raises(DatasetError, match=r"(?s)several images share the stem 'im0'.*im0\.jpg.*im0\.png"):
        load_dataset(folder)


def test_size_mismatch_is_named(tmp_path):
    folder = _pair_folder(tmp_path / "pairs", count=2)
    _save(np.zeros((5, 8), np.uint8), folder / "masks" / "im1.png")
    with pytest.raises(DatasetError, match=r"masks/im1\.png: mask size \(H, W\) = \(5, 8\) differs from image .*"
                                           r"im1\.png size \(6, 8\)"):
        load_dataset(folder)
    failing = load_dataset(folder, on_bad_pair="fail")[1]
    with pytest.raises(InstanceError, match="differs from image"):
        failing.load()


def test_corrupt_files(tmp_path):
    folder = _pair_folder(tmp_path / "pairs", count=3, size=(40, 50))
    (folder / "images" / "im0.png").write_bytes(b"this is not an image")
    data = (folder / "images" / "im2.png").read_bytes()
    (folder / "images" / "im2.png").write_bytes(data[: len(data) // 2])  # header fine, pixels truncated
    with pytest.raises(DatasetError, match=r"images/im0\.png: cannot read image header"):
        load_dataset(folder)
    refs = load_dataset(folder, on_bad_pair="fail")
    assert [r.id for r in refs] == ["im0", "im1", "im2"]
    assert refs[0].size == ds.UNREADABLE_DECLARED_SIZE
    with pytest.raises(InstanceError, match=r"im0\.png: cannot read image header"):
        refs[0].load()
    validate_instance(refs[1].load())
    with pytest.raises(InstanceError, match=r"pairs/im2: .*images/im2\.png: cannot decode image"):
        refs[2].load()


def test_immediate_errors_and_bad_options(tmp_path, monkeypatch):
    monkeypatch.delenv(DATA_ENV_VAR, raising=False)
    with pytest.raises(DatasetError, match="no datasets root"):
        load_dataset("grabcut")
    (tmp_path / "GrabCutt").mkdir()
    with pytest.raises(DatasetError, match=r"no folder named like 'grabcut' .*\(its folders: GrabCutt\)") as caught:
        load_dataset("grabcut", tmp_path)
    assert "load_dataset" not in str(caught.value)  # the CLI prints it: no Python call in the message
    with pytest.raises(DatasetError, match="neither a known dataset"):
        load_dataset(tmp_path / "nothing")
    with pytest.raises(DatasetError, match="no image/mask folders"):
        load_dataset(tmp_path)
    (tmp_path / "images").mkdir()
    (tmp_path / "masks").mkdir()
    with pytest.raises(DatasetError, match="no image files"):
        load_dataset(tmp_path)
    with pytest.raises(DatasetError, match="unknown dataset kind"):
        ds.list_dataset_folder("sbd", tmp_path)
    folder = _pair_folder(tmp_path / "GrabCut")
    with pytest.raises(ValueError, match="on_bad_pair"):
        load_dataset(folder, on_bad_pair="ignore")
    with pytest.raises(ValueError, match="mask rule"):
        load_dataset(folder, rule="128")
    with pytest.raises(ValueError, match="max_side and objects_index"):
        load_dataset("grabcut", tmp_path, max_side=512)
    with pytest.raises(ValueError, match="rule and ignore_value"):
        load_dataset("grabcut", tmp_path, ignore_value=128)
    with pytest.raises(ValueError, match="max_side"):
        load_dataset(folder, kind="tetris", max_side=-3)


# ----------------------------------------------------------------------------- multi-object (TETRIS)


def _packed_mask(ids: np.ndarray) -> np.ndarray:
    """RGB (Pillow order) array encoding ``ids`` as B*65536 + G*256 + R."""
    return np.stack([ids & 255, (ids >> 8) & 255, (ids >> 16) & 255], -1).astype(np.uint8)


def _tetris_folder(root, ids, image):
    _save(image, root / "tetris" / "images" / "scene.jpg")
    _save(_packed_mask(ids), root / "tetris" / "masks" / "scene.png")
    return root / "tetris"


def _opencv_aligned_resize(ids, height, width):
    """The spec's rule with OpenCV: each id's 0/1 mask resized INTER_LINEAR, written where non-zero, ascending."""
    out = np.zeros((height, width), np.int64)
    for value in np.unique(ids):
        if value:
            resized = cv2.resize((ids == value).astype(np.uint8), (width, height), interpolation=cv2.INTER_LINEAR)
            out = np.where(resized != 0, value, out)
    return out


def test_packed_ids_match_opencv_formula(tmp_path):
    ids = RNG.choice([0, 1, 256, 65536 * 2 + 3, 16777215], size=(5, 6)).astype(np.int32)
    path = _save(_packed_mask(ids), tmp_path / "m.png")
    bgr = cv2.imread(str(path)).astype(np.int64)
    np.testing.assert_array_equal(packed_ids(read_image_rgb(path)), bgr[..., 0] * 65536 + bgr[..., 1] * 256
                                  + bgr[..., 2])
    np.testing.assert_array_equal(packed_ids(read_image_rgb(path)), ids)


def test_tetris_objects_full_resolution(tmp_path):
    ids = np.zeros((30, 40), np.int32)
    ids[2:10, 3:12] = 65536 * 2 + 3
    ids[15:25, 20:38] = 1
    ids[20:28, 5:9] = 256
    folder = _tetris_folder(tmp_path, ids, _image(30, 40))
    refs = load_dataset("tetris", tmp_path, max_side=None)
    assert [r.id for r in refs] == ["scene#1", "scene#256", "scene#131075"]
    assert [split_instance_id(r.id) for r in refs] == [("scene", 1), ("scene", 256), ("scene", 131075)]
    for ref in refs:
        instance = ref.load()
        np.testing.assert_array_equal(instance.gt, ids == split_instance_id(ref.id)[1])
        np.testing.assert_array_equal(instance.image, _cv2_rgb(folder / "images" / "scene.jpg"))


def test_tetris_cap_matches_opencv_and_drops_vanished_ids(tmp_path):
    ids = np.zeros((60, 90), np.int32)
    ids[5:40, 10:50] = 7
    ids[30:55, 40:85] = 9  # overlaps 7 after resizing: 9 wins
    ids[58, 2] = 4  # a single pixel: gone at 1/3 scale
    folder = _tetris_folder(tmp_path, ids, _image(60, 90, seed=5))
    refs = load_dataset("tetris", tmp_path, max_side=30)
    assert [r.id for r in refs] == ["scene#7", "scene#9"]
    assert refs[0].size == capped_size(60, 90, 30) == (20, 30)
    expected_ids = _opencv_aligned_resize(ids, 20, 30)
    assert 4 not in expected_ids
    expected_image = cv2.resize(_cv2_rgb(folder / "images" / "scene.jpg"), (30, 20), interpolation=cv2.INTER_LINEAR)
    for ref in refs:
        instance = ref.load()
        np.testing.assert_array_equal(instance.image, expected_image)
        np.testing.assert_array_equal(instance.gt, expected_ids == split_instance_id(ref.id)[1])
    assert load_dataset("tetris", tmp_path)[0].size == (60, 90)  # default cap 1024 never enlarges


def test_tetris_objects_index_cache(tmp_path, monkeypatch):
    ids = np.zeros((12, 16), np.int32)
    ids[2:6, 2:6] = 5
    folder = _tetris_folder(tmp_path, ids, _image(12, 16))
    index = tmp_path / "objects.json"
    first = load_dataset("tetris", tmp_path, objects_index=index)
    entries = json.loads(index.read_text())["entries"]
    assert entries["scene.png"]["ids"] == [5] and entries["scene.png"]["max_side"] == 1024

    def must_not_decode(*args):
        raise AssertionError("the index should have been used")

    monkeypatch.setattr(ds, "_mask_object_ids", must_not_decode)
    assert [r.id for r in load_dataset("tetris", tmp_path, objects_index=index)] == [r.id for r in first]
    monkeypatch.undo()
    ids[8:11, 9:15] = 6  # the mask changes: its entry is stale (size or mtime differ)
    mask_path = _save(_packed_mask(ids), folder / "masks" / "scene.png")
    later = mask_path.stat().st_mtime_ns + 10**9
    os.utime(mask_path, ns=(later, later))
    assert [r.id for r in load_dataset("tetris", tmp_path, objects_index=index)] == ["scene#5", "scene#6"]
    assert [r.id for r in load_dataset("tetris", tmp_path, objects_index=index, max_side=8)] == ["scene#5",
                                                                                                  "scene#6"]
    assert json.loads(index.read_text())["entries"]["scene.png"]["max_side"] == 8


def test_tetris_mask_without_objects_warns(tmp_path):
    _tetris_folder(tmp_path, np.zeros((8, 8), np.int32), _image(8, 8))
    _save(_image(8, 8), tmp_path / "tetris" / "images" / "other.png")
    other = np.zeros((8, 8), np.int32)
    other[1:4, 1:4] = 3
    _save(_packed_mask(other), tmp_path / "tetris" / "masks" / "other.png")
    with pytest.warns(DatasetWarning, match=r"(?s)1 mask\(s\) hold no object.*scene\.png"):
        assert [r.id for r in load_dataset("tetris", tmp_path)] == ["other#3"]


def test_tetris_changed_mask_fails_at_load(tmp_path):
    ids = np.zeros((10, 10), np.int32)
    ids[2:5, 2:5], ids[6:9, 6:9] = 1, 2
    folder = _tetris_folder(tmp_path, ids, _image(10, 10))
    refs = load_dataset("tetris", tmp_path)
    ids[ids == 2] = 0
    _save(_packed_mask(ids), folder / "masks" / "scene.png")
    validate_instance(refs[0].load())
    with pytest.raises(InstanceError, match=r"tetris/scene#2: object id 2 is not in mask"):
        refs[1].load()


# ----------------------------------------------------------------------------- resizing


@pytest.mark.parametrize("height, width, max_side, expected", [
    (3000, 4000, 1024, (768, 1024)), (4000, 3000, 1024, (1024, 768)), (1365, 2048, 1024, (683, 1024)),
    (2048, 1365, 1024, (1024, 683)), (1366, 2048, 1024, (683, 1024)), (2047, 1023, 1024, (1024, 512)), (500, 500, 300, (300, 300)), (321, 481, 1024, (321, 481)),
    (3000, 4000, None, (3000, 4000)), (3000, 4000, 0, (3000, 4000)), (4000, 3000, 2048, (2048, 1536)),
])
def test_capped_size(height, width, max_side, expected):
    assert capped_size(height, width, max_side) == expected


def test_capped_size_rejects_bad_arguments():
    for args, name in (((0, 5, 10), "height"), ((5, -1, 10), "width"), ((5, 5, -1), "max_side"),
                       ((5, 5, 2.5), "max_side")):
        with pytest.raises(ValueError, match=name):
            capped_size(*args)


@given(in_h=st.integers(1, 70), in_w=st.integers(1, 70), out_h=st.integers(1, 70), out_w=st.integers(1, 70),
       channels=st.sampled_from([None, 3]), seed=st.integers(0, 2**16))
def test_resize_bilinear_uint8_equals_opencv(in_h, in_w, out_h, out_w, channels, seed):
    shape = (in_h, in_w) if channels is None else (in_h, in_w, channels)
    image = np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8)
    expected = cv2.resize(image, (out_w, out_h), interpolation=cv2.INTER_LINEAR)
    np.testing.assert_array_equal(resize_bilinear_uint8(image, out_h, out_w), expected)


def test_resize_bilinear_large_downscale_equals_opencv():
    image = RNG.integers(0, 256, (600, 800, 3), dtype=np.uint8)
    for out in ((150, 200), (300, 400), (193, 257)):
        np.testing.assert_array_equal(resize_bilinear_uint8(image, *out),
                                      cv2.resize(image, out[::-1], interpolation=cv2.INTER_LINEAR))


@given(in_h=st.integers(1, 60), in_w=st.integers(1, 60), out_h=st.integers(1, 60), out_w=st.integers(1, 60),
       block=st.integers(1, 6), seed=st.integers(0, 2**16))
def test_resize_id_map_equals_per_id_opencv(in_h, in_w, out_h, out_w, block, seed):
    coarse = np.random.default_rng(seed).choice([0, 3, 70000, 5, 16777215],
                                                size=(-(-in_h // block), -(-in_w // block)))
    ids = np.repeat(np.repeat(coarse, block, 0), block, 1)[:in_h, :in_w].astype(np.int32)
    np.testing.assert_array_equal(resize_id_map(ids, out_h, out_w), _opencv_aligned_resize(ids, out_h, out_w))


def test_resize_rejects_bad_input():
    with pytest.raises(ValueError, match="image must be"):
        resize_bilinear_uint8(np.zeros((3, 3), np.float32), 2, 2)
    with pytest.raises(ValueError, match="height"):
        resize_bilinear_uint8(np.zeros((3, 3), np.uint8), 0, 2)
    with pytest.raises(ValueError, match="ids must be"):
        resize_id_map(np.zeros((3, 3), np.float32), 2, 2)


def test_decoders_on_edge_values():
    blue = np.array([[0, 1, 2, 127, 128, 129, 255]], np.uint8)
    np.testing.assert_array_equal(decode_grabcut_gt(blue), [[0, 1, 0, 0, -1, 1, 1]])
    np.testing.assert_array_equal(ds.decode_davis_gt(np.array([[[0, 0, 0], [0, 1, 0]]], np.uint8)), [[0, 1]])
    assert ds.unique_nonzero_ids(np.array([[0, 5, 5, 2], [2, 2, 0, 9]])) == [2, 5, 9]
    assert split_instance_id("a#b") == ("a#b", None) and split_instance_id("x#12") == ("x", 12)


# ----------------------------------------------------------------------------- --datasets resolution


def test_resolve_datasets_root_env_and_paths(tmp_path, monkeypatch):
    _pair_folder(tmp_path / "GrabCut", "data_GT", "boundary_GT")
    _pair_folder(tmp_path / "Berkeley")
    elsewhere = _pair_folder(tmp_path / "elsewhere" / "bk")
    monkeypatch.setenv(DATA_ENV_VAR, str(tmp_path))
    sources = resolve_datasets("GrabCut, Berkeley")
    assert [(s.name, s.kind, s.path.name) for s in sources] == [("grabcut", "grabcut", "GrabCut"),
                                                                  ("berkeley", "berkeley", "Berkeley")]
    config = {"BERKELEY_PATH": "elsewhere/bk", "my_set": str(elsewhere)}
    sources = resolve_datasets(["berkeley", "my_set"], paths=config)
    assert [(s.name, s.kind, s.path) for s in sources] == [("berkeley", "berkeley", elsewhere),
                                                            ("my_set", "folder", elsewhere)]
    refs = load_datasets("GrabCut,my_set", paths=config, options={"my_set": {"rule": "!=0"}})
    assert [r.key for r in refs] == [("grabcut", "im0"), ("grabcut", "im1"), ("my_set", "im0"), ("my_set", "im1")]
    for text, message in (("grabcut,GrabCut", "listed twice"), ("sbd", "unknown dataset 'sbd'"), ("", "no dataset"),
                          ("davis", "no folder named like 'davis'"), ("folder", "is a kind")):
        with pytest.raises(DatasetError, match=message):
            resolve_datasets(text)
    with pytest.raises(ValueError, match="options given for datasets not listed"):
        load_datasets("grabcut", options={"tetris": {"max_side": 2048}})
    (tmp_path / "grab-cut").mkdir()
    with pytest.raises(DatasetError, match="several folders match"):
        resolve_datasets("grabcut")


# ----------------------------------------------------------------------------- with the engine


def test_refs_run_through_the_engine_failures_recorded(tmp_path):
    sys.path.insert(0, str(pathlib.Path(__file__).parent))
    import runner_toy as toy  # noqa: PLC0415

    from jaxseg_robust.runner.engine import run  # noqa: PLC0415
    from jaxseg_robust.runner.fingerprints import dataset_fingerprint  # noqa: PLC0415
    from jaxseg_robust.runner.records import latest_records, read_run_records  # noqa: PLC0415

    folder = _pair_folder(tmp_path / "pairs", count=4, size=(20, 24))
    (folder / "masks" / "im1.png").unlink()
    data = (folder / "images" / "im3.png").read_bytes()
    (folder / "images" / "im3.png").write_bytes(data[: len(data) // 2])
    refs = load_dataset(folder, on_bad_pair="fail")
    assert dataset_fingerprint(refs).startswith("sha256:")
    summary = run(refs, toy.toy_batch_fn, tmp_path / "run", 2, config={"protocol": "toy"}, progress="none")
    assert (summary.ok, summary.failed) == (2, 2)
    records = latest_records(read_run_records(tmp_path / "run"))
    errors = {key[1]: record["error"] for key, record in records.items() if record["status"] == "failed"}
    assert set(errors) == {"im1", "im3"}
    assert "im1.png: no mask" in errors["im1"] and "im3.png: cannot decode image" in errors["im3"]


# ----------------------------------------------------------------------------- shared real data

REAL_KINDS = ("grabcut", "berkeley", "davis", "coco_mval")
# The MANIFEST wording of each rule, and that rule written independently on the Pillow read.
MANIFEST_RULES = {
    "grabcut": ("fg: value==255; ignore: value==128",
                lambda values: (values == 255, values == 128)),
    "berkeley": ("fg: channel 0 > 128",
                 lambda values: (values[..., 0] > 128, np.zeros(values.shape[:2], bool))),
    "davis": ("fg: value != 0", lambda values: (values != 0, np.zeros(values.shape, bool))),
    "coco_mval": ("fg: value > 128", lambda values: (values > 128, np.zeros(values.shape, bool))),
}


def _index_rows(folder: pathlib.Path) -> list[dict]:
    with open(folder / "index.csv", newline="") as handle:
        return list(csv.DictReader(handle))


@pytest.mark.parametrize("kind", REAL_KINDS)
@pytest.mark.filterwarnings("error::jaxseg_robust.data.datasets.DatasetWarning")  # e.g. "not a two-valued mask"
def test_real_datasets_match_index_and_manifest(real_data_dir, kind):
    folder = real_data_dir / kind
    rows = _index_rows(folder)
    refs = load_dataset(kind, real_data_dir)
    assert len(refs) == len(rows)
    by_id = {ref.id: ref for ref in refs}
    assert sorted(by_id) == sorted(pathlib.Path(row["mask"]).stem for row in rows)
    wording, manifest_rule = MANIFEST_RULES[kind]
    for row in rows:
        assert row["mask_rule"].startswith(wording)
        ref = by_id[pathlib.Path(row["mask"]).stem]
        assert ref.size == (int(row["height"]), int(row["width"]))
        instance = ref.load()
        validate_instance(instance)
        obj = instance.gt == 1
        ys, xs = np.nonzero(obj)
        assert f"{xs.min()} {ys.min()} {xs.max()} {ys.max()}" == row["bbox_xyxy"], row["mask"]  # inclusive xyxy
        assert int(obj.sum()) == int(row["fg_pixels"])
        expected_fg, expected_ignore = manifest_rule(np.asarray(Image.open(folder / row["mask"])))
        np.testing.assert_array_equal(obj, expected_fg)
        np.testing.assert_array_equal(instance.gt == -1, expected_ignore)
    sample = refs[:: max(1, len(refs) // 8)]
    for ref in sample:  # images decode exactly as OpenCV (the reference loaders' reader)
        np.testing.assert_array_equal(ref.load().image, _cv2_rgb(ref.source_paths[0]))


def test_real_datasets_via_names(real_data_dir):
    refs = load_datasets("GrabCut,Berkeley,DAVIS,COCO_MVal", root=real_data_dir)
    counts = {kind: len(_index_rows(real_data_dir / kind)) for kind in REAL_KINDS}
    assert len(refs) == sum(counts.values())
    assert len({ref.key for ref in refs}) == len(refs)
    assert {kind: sum(r.dataset == kind for r in refs) for kind in REAL_KINDS} == counts
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_dataset("grabcut", real_data_dir)  # no problem and no warning on the shared data


# ----------------------------------------------------------------------------- inputs people actually have


def test_a_folder_rule_reads_every_file_the_same_way_and_an_empty_object_names_its_file(tmp_path):
    folder = tmp_path / "labels"
    for index, values in enumerate([(1,), (1, 2, 3), (255,)]):  # 0/1 export, DAVIS palette ids, 0/255
        mask = np.zeros((6, 8), np.uint8)
        for row, value in enumerate(values):
            mask[1 + row, 2 + index:6] = value
        _save(_image(6, 8, seed=index), folder / "images" / f"m{index}.png")
        _save(mask, folder / "masks" / f"m{index}.png")
    refs = load_dataset(folder)
    for ref, shown in zip(refs[:2], ["0, 1", "0, 1, 2, 3"]):  # no per-file switch of the default >128
        with pytest.raises(InstanceError) as caught:
            ref.load()
        assert str(caught.value) == (f"labels/{ref.id}: mask {folder / 'masks' / (ref.id + '.png')} has no object "
                                     f"pixel (rule >128; values in the file: {shown}; label or palette-id "
                                     "masks: rule '>0')")
    assert int((refs[2].load().gt == 1).sum()) == 2
    assert [int((ref.load().gt == 1).sum()) for ref in load_dataset(folder, rule=">0")] == [4, 9, 2]
    with pytest.raises(InstanceError, match=r"no object pixel \(ignore value 1; rule >0; values in the file: only 0\)"):
        load_dataset(folder, rule=">0", ignore_value=1)[0].load()


@pytest.mark.parametrize("kind, expected", [
    ("grabcut", [[0, 1, 0, 0], [-1, 1, 0, 1]]),   # RITM grabcut.py: 128 -> -1, > 128 -> 1, 1 stays 1, else 0
    ("berkeley", [[0, 1, 0, 0], [-1, 1, 0, 1]]),  # berkeley.py: GrabCutDataset with images/ + masks/
    ("davis", [[0, 1, 1, 1], [1, 1, 1, 1]]),      # davis.py: max over B, G, R > 0 -> 1
    ("coco_mval", [[0, 1, 1, 1], [1, 1, 1, 1]]),  # RITM's COCO_MVAL_PATH is read by DavisDataset
])
def test_each_benchmark_kind_reads_label_and_palette_values_by_its_own_rule(tmp_path, kind, expected):
    values = np.array([[0, 1, 2, 3], [128, 200, 100, 1]], np.uint8)  # 0/1 labels, palette ids and grey together
    folder = tmp_path / kind
    _save(_image(2, 4), folder / "images" / "a.png")
    _save(values, folder / "masks" / "a.png")
    np.testing.assert_array_equal(load_dataset(kind, tmp_path)[0].load().gt, expected)


def test_the_tetris_kind_reads_each_packed_id_as_one_object(tmp_path):
    ids = np.array([[0, 1, 1, 3], [2, 2, 0, 3]], np.uint8)  # palette-like ids 1..3 in the red channel
    packed = np.stack([ids, np.zeros_like(ids), np.zeros_like(ids)], axis=-1)
    _save(_image(2, 4), tmp_path / "tetris" / "images" / "a.png")
    _save(packed, tmp_path / "tetris" / "masks" / "a.png")
    refs = load_dataset("tetris", tmp_path)
    assert [ref.id for ref in refs] == ["a#1", "a#2", "a#3"]
    for ref, object_id in zip(refs, (1, 2, 3)):
        np.testing.assert_array_equal(ref.load().gt, ids == object_id)


@pytest.mark.parametrize("kind", ["folder", "grabcut", "davis"])
def test_a_noise_mask_or_a_photo_warns_naming_the_file(tmp_path, kind):
    root = tmp_path / kind
    clean = np.zeros((40, 50), np.uint8)
    clean[10:30, 10:40] = 255
    _save(_image(40, 50), root / "images" / "clean.png")
    _save(clean, root / "masks" / "clean.png")
    _save(_image(40, 50), root / "images" / "noise.png")
    _save(RNG.integers(0, 256, (40, 50), dtype=np.uint8), root / "masks" / "noise.png")
    _save(_image(40, 50), root / "images" / "photo.png")
    _save(_image(40, 50, seed=9), root / "masks" / "photo.png")  # colour channels differ everywhere
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for ref in load_dataset(root, kind=kind):
            ref.load()
    messages = [str(w.message) for w in caught if issubclass(w.category, DatasetWarning)]
    assert sorted(pathlib.Path(m.split(": ")[1]).name for m in messages) == ["noise.png", "photo.png"], messages
    assert all("mask: " in m and "binarised anyway" in m for m in messages)


def test_clean_masks_of_every_shape_do_not_warn(tmp_path):
    root = tmp_path / "clean"
    base = np.zeros((64, 64), np.uint8)
    base[16:48, 12:52] = 255
    jpeg_like = base.copy()
    jpeg_like[15:17, :] = np.clip(base[15:17, :].astype(int) + 40, 0, 255)  # ringing near the edge
    colour = np.zeros((64, 64, 3), np.uint8)
    colour[base > 0] = (255, 0, 255)  # magenta on black
    ignore_band = base.copy()
    ignore_band[14:16, 12:52] = 128
    for name, mask in (("a", base), ("b", jpeg_like), ("c", colour), ("d", ignore_band)):
        _save(_image(64, 64), root / "images" / f"{name}.png")
        _save(mask, root / "masks" / f"{name}.png")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for ref in load_dataset(root, ignore_value=128):
            ref.load()
        for ref in load_dataset(root, kind="grabcut"):
            ref.load()

