"""PASCAL VOC 2012 and Cityscapes loaders on small fake folders the tests write themselves."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image
from semantic_folders import make_cityscapes, palette_png

from jaxseg_robust.data.semantic import (CITYSCAPES_EVAL_IDS, CITYSCAPES_PROTOCOL, VOC_PROTOCOL, VOID,
                                         ResizeRule, SemanticDatasetError, list_cityscapes,
                                         list_semantic_dataset, list_voc, load_all, nearest_indices,
                                         resize_image, resize_labels)


def make_voc(root, ids_sizes, *, layout=("VOCdevkit", "VOC2012"), seed=0):
    """A VOC2012 folder with JPEG images and palette labels (classes 0..20 and void)."""
    rng = np.random.default_rng(seed)
    voc = root.joinpath(*layout)
    for sub in ("ImageSets/Segmentation", "JPEGImages", "SegmentationClass"):
        (voc / sub).mkdir(parents=True, exist_ok=True)
    labels = {}
    for i, (h, w) in ids_sizes.items():
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(voc / "JPEGImages" / f"{i}.jpg")
        lab = rng.integers(0, 21, (h, w)).astype(np.uint8)
        lab[0, :] = VOID
        palette_png(voc / "SegmentationClass" / f"{i}.png", lab)
        labels[i] = lab
    (voc / "ImageSets/Segmentation/val.txt").write_text("\n".join(ids_sizes) + "\n")
    return voc, labels


def test_resize_rules_follow_torchvision():
    assert VOC_PROTOCOL.output_size(375, 500) == (512, 682)  # int(512 * 500 / 375) = 682
    assert VOC_PROTOCOL.output_size(500, 375) == (682, 512)
    assert VOC_PROTOCOL.output_size(500, 500) == (512, 512)
    assert ResizeRule("longer", 512).output_size(375, 500) == (384, 512)
    assert CITYSCAPES_PROTOCOL.output_size(1024, 2048) == (512, 1024)
    assert ResizeRule("none").output_size(7, 9) == (7, 9)
    for bad in (("shorter", 0), ("fixed", 512), ("sideways", 3), ("none", 4)):
        with pytest.raises(ValueError):
            ResizeRule(*bad)


def test_nearest_label_resize_matches_torch_rule():
    # floor(o * in/out) in float32, clamped; a halving reads every other row.
    np.testing.assert_array_equal(nearest_indices(2048, 1024)[:4], [0, 2, 4, 6])
    np.testing.assert_array_equal(nearest_indices(3, 7), [0, 0, 0, 1, 1, 2, 2])
    labels = np.arange(12, dtype=np.uint8).reshape(3, 4)
    np.testing.assert_array_equal(resize_labels(labels, (3, 4)), labels)
    out = resize_labels(labels, (5, 2))
    assert out.shape == (5, 2) and set(np.unique(out)) <= set(np.unique(labels))
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    for in_hw, out_hw in (((375, 500), (512, 682)), ((1024, 2048), (512, 1024)), ((333, 500), (512, 768))):
        lab = rng.integers(0, 21, in_hw).astype(np.uint8)
        want = torch.nn.functional.interpolate(torch.from_numpy(lab)[None, None].float(), size=out_hw,
                                               mode="nearest")[0, 0].numpy().astype(np.uint8)
        np.testing.assert_array_equal(resize_labels(lab, out_hw), want)


def test_image_resize_is_pillow_bilinear():
    image = np.random.default_rng(1).integers(0, 256, (30, 40, 3), dtype=np.uint8)
    assert resize_image(image, (30, 40)) is image
    out = resize_image(image, (16, 21))
    np.testing.assert_array_equal(out, np.asarray(Image.fromarray(image).resize((21, 16), Image.BILINEAR)))


@pytest.mark.parametrize("layout", [("VOCdevkit", "VOC2012"), ("VOC2012",), ()])
def test_voc_listing_order_sizes_and_labels(tmp_path, layout):
    _, labels = make_voc(tmp_path, {"2007_000033": (30, 40), "2007_000042": (40, 30)}, layout=layout)
    refs = list_voc(tmp_path, resize=ResizeRule("shorter", 16))
    assert [r.id for r in refs] == ["2007_000033", "2007_000042"]
    assert [r.size for r in refs] == [(16, 21), (21, 16)]
    samples = load_all(refs)
    assert samples[0].image.shape == (16, 21, 3) and samples[0].labels.dtype == np.uint8
    np.testing.assert_array_equal(samples[0].labels, resize_labels(labels["2007_000033"], (16, 21)))
    assert samples[0].valid[0].sum() == 0 and samples[0].key == ("voc", "2007_000033")
    full = load_all(list_voc(tmp_path, resize=ResizeRule("none"), num_images=1))
    np.testing.assert_array_equal(full[0].labels, labels["2007_000033"])  # palette indices as stored
    assert len(list_semantic_dataset("voc", tmp_path, num_images=1)) == 1


def test_voc_errors_name_the_file(tmp_path):
    with pytest.raises(SemanticDatasetError, match="no PASCAL VOC 2012 layout"):
        list_voc(tmp_path)
    voc, _ = make_voc(tmp_path, {"a": (10, 12), "b": (10, 12)})
    with pytest.raises(SemanticDatasetError, match="train.txt"):
        list_voc(tmp_path, split="train")
    with pytest.raises(SemanticDatasetError, match="num_images=3"):
        list_voc(tmp_path, num_images=3)
    (voc / "SegmentationClass" / "b.png").unlink()
    with pytest.raises(SemanticDatasetError, match="b.png"):
        list_voc(tmp_path)
    palette_png(voc / "SegmentationClass" / "b.png", np.zeros((11, 12), np.uint8))
    with pytest.raises(SemanticDatasetError, match=r"b\.png.*12x11 labels"):
        list_voc(tmp_path)
    bad = np.zeros((10, 12), np.uint8)
    bad[3, 3] = 40
    palette_png(voc / "SegmentationClass" / "b.png", bad)
    refs = list_voc(tmp_path)  # listing reads headers only; decoding names the file
    with pytest.raises(SemanticDatasetError, match=r"b\.png: label values \[40\]"):
        refs[1].load()
    Image.fromarray(np.zeros((10, 12, 3), np.uint8)).save(voc / "SegmentationClass" / "b.png")
    with pytest.raises(SemanticDatasetError, match="mode RGB"):
        list_voc(tmp_path)[1].load()
    (voc / "JPEGImages" / "a.jpg").write_bytes(b"not a jpeg")
    with pytest.raises(SemanticDatasetError, match="a.jpg"):
        list_voc(tmp_path)


def test_cityscapes_train_ids_order_and_errors(tmp_path):
    raw = make_cityscapes(tmp_path, {"lindau": ["lindau_000001_000019", "lindau_000000_000019"],
                                     "frankfurt": ["frankfurt_000000_000294"]})
    refs = list_cityscapes(tmp_path, resize=ResizeRule("fixed", (4, 8)))
    assert [r.id for r in refs] == ["frankfurt/frankfurt_000000_000294", "lindau/lindau_000000_000019",
                                    "lindau/lindau_000001_000019"]
    full = list_cityscapes(tmp_path, resize=ResizeRule("none"))[0].load()
    ids = raw["frankfurt/frankfurt_000000_000294"]
    for train_id, label_id in enumerate(CITYSCAPES_EVAL_IDS):
        assert np.all(full.labels[ids == label_id] == train_id)
    assert np.all(full.labels[~np.isin(ids, CITYSCAPES_EVAL_IDS)] == VOID)
    small = refs[0].load()
    assert small.size == (4, 8)
    np.testing.assert_array_equal(small.labels, full.labels[::2, ::2])  # halving reads even pixels
    bad_path = tmp_path / "gtFine/val/lindau/lindau_000000_000019_gtFine_labelIds.png"
    Image.fromarray(np.full((8, 16), 255, np.uint8), mode="L").save(bad_path)
    with pytest.raises(SemanticDatasetError, match="labelTrainIds"):
        list_cityscapes(tmp_path)[1].load()
    bad_path.unlink()
    with pytest.raises(SemanticDatasetError, match="lindau_000000_000019_gtFine_labelIds.png"):
        list_cityscapes(tmp_path)
    with pytest.raises(SemanticDatasetError, match="leftImg8bit/train"):
        list_cityscapes(tmp_path, split="train")
    with pytest.raises(ValueError, match="unknown semantic dataset"):
        list_semantic_dataset("ade20k", tmp_path)


def test_semantic_samples_become_multiclass_instances(tmp_path):
    from jaxseg_robust.data.instances import InstanceError, validate_instance  # noqa: PLC0415
    from jaxseg_robust.data.semantic import instance_refs, parse_resize_rule, rule_text  # noqa: PLC0415

    _, labels = make_voc(tmp_path, {"a": (6, 8)})
    (ref,) = instance_refs(list_voc(tmp_path, resize=ResizeRule("none")), 21)
    instance = ref.load()
    validate_instance(instance)
    assert instance.num_classes == 21 and instance.gt.dtype == np.int8
    expected = labels["a"].astype(np.int16)
    np.testing.assert_array_equal(instance.gt, np.where(expected == VOID, -1, expected))
    with pytest.raises(SemanticDatasetError, match=r"a\.png.*outside the model's 5 classes"):
        instance_refs(list_voc(tmp_path, resize=ResizeRule("none")), 5)[0].load()
    bad = type(instance)(id="x", image=instance.image, gt=np.full(instance.gt.shape, 21, np.int8), dataset="voc",
                         num_classes=21)
    with pytest.raises(InstanceError, match=r"voc/x: gt holds values \[21\] outside \[-1, 21\)"):
        validate_instance(bad)
    for text in ("shorter:512", "longer:500", "fixed:512x1024", "none"):
        assert rule_text(parse_resize_rule(text)) == text
    assert parse_resize_rule("shorter:512").output_size(375, 500) == (512, 682)
    with pytest.raises(ValueError, match="fixed:12"):
        parse_resize_rule("fixed:12")
