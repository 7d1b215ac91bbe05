"""TFDS builders of the benchmark folders: every example equals the default loader's instance.

The builder tests need the ``tfds`` extra (``tensorflow-datasets``; no TensorFlow):
they skip cleanly without it, as on CI, which installs only the ``test`` extra.
The import-isolation tests run everywhere.
"""

from __future__ import annotations

import pathlib
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from jaxseg_robust.data.datasets import DatasetError, load_dataset


def _run_python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)


def test_importing_the_package_and_its_loader_does_not_import_tfds():
    result = _run_python("import sys, jaxseg_robust, jaxseg_robust.data, jaxseg_robust.data.datasets, "
                         "jaxseg_robust.cli\nassert 'tensorflow_datasets' not in sys.modules\nprint('light')")
    assert result.returncode == 0 and "light" in result.stdout, result.stderr


def test_without_tfds_the_import_error_names_the_extra():
    result = _run_python("import sys\nsys.modules['tensorflow_datasets'] = None\n"
                         "import jaxseg_robust.data.tfds_builders")
    assert result.returncode != 0
    assert 'pip install "jaxseg_robust[tfds]"' in result.stderr


# ---- the builders (need tensorflow-datasets) -------------------------------------------------------

def _image(height: int, width: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)


def _disc(height: int, width: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[:height, :width]
    cy, cx, r = rng.uniform(0.3, 0.7) * height, rng.uniform(0.3, 0.7) * width, 0.25 * min(height, width)
    return (yy - cy) ** 2 + (xx - cx) ** 2 <= r * r


def write_grabcut(root: pathlib.Path) -> pathlib.Path:
    """``root/GrabCut/{data_GT, boundary_GT}``: grey BMP masks 0 / 128 (ignore band) / 255, JPEG-free images."""
    folder = root / "GrabCut"
    (folder / "data_GT").mkdir(parents=True)
    (folder / "boundary_GT").mkdir()
    for index, (h, w) in enumerate([(20, 28), (24, 18), (16, 16)]):
        disc = _disc(h, w, index)
        band = _disc(h, w, index) ^ np.roll(disc, 1, axis=1)
        mask = np.where(disc, 255, 0).astype(np.uint8)
        mask[band & ~disc] = 128
        Image.fromarray(_image(h, w, index)).save(folder / "data_GT" / f"img{index}.png")
        Image.fromarray(mask).save(folder / "boundary_GT" / f"img{index}.bmp")
    return folder


def write_davis(root: pathlib.Path) -> pathlib.Path:
    """``root/DAVIS/{img, gt}``: palette masks (index 0 black background, 1 and 2 coloured objects)."""
    folder = root / "DAVIS"
    (folder / "img").mkdir(parents=True)
    (folder / "gt").mkdir()
    for index, (h, w) in enumerate([(18, 22), (21, 17)]):
        indices = np.zeros((h, w), np.uint8)
        indices[_disc(h, w, 10 + index)] = 1 + index
        mask = Image.fromarray(indices, mode="P")
        mask.putpalette([0, 0, 0, 200, 0, 0, 0, 0, 180] + [0] * 759)
        Image.fromarray(_image(h, w, 10 + index)).save(folder / "img" / f"{index:05d}.png")
        mask.save(folder / "gt" / f"{index:05d}.png")
    return folder


def write_tetris(root: pathlib.Path) -> pathlib.Path:
    """``root/TETRIS/{images, masks}``: two objects per image as RGB-packed ids (R + 256 G + 65536 B)."""
    folder = root / "TETRIS"
    (folder / "images").mkdir(parents=True)
    (folder / "masks").mkdir()
    h, w = 24, 30
    ids = np.zeros((h, w), np.int64)
    ids[2:10, 3:12] = 5
    ids[12:22, 15:28] = 70000
    packed = np.stack([ids % 256, (ids // 256) % 256, ids // 65536], axis=-1).astype(np.uint8)
    Image.fromarray(_image(h, w, 20)).save(folder / "images" / "scene.png")
    Image.fromarray(packed).save(folder / "masks" / "scene.png")
    return folder


def _build(tfds, config: str, manual_dir: pathlib.Path, data_dir: pathlib.Path):
    builder = tfds.builder(f"ritm_benchmark/{config}", data_dir=str(data_dir), file_format="array_record")
    builder.download_and_prepare(download_config=tfds.download.DownloadConfig(manual_dir=str(manual_dir)))
    return builder


def _assert_equals_the_loader(builder, refs, tfds_builders) -> None:
    source = builder.as_data_source()[tfds_builders.SPLIT]
    expected = {ref.id: ref.load() for ref in refs}
    assert len(source) == len(expected) == builder.info.splits[tfds_builders.SPLIT].num_examples
    seen = set()
    for index in range(len(source)):
        example = source[index]
        instance = tfds_builders.instance_from_example(example)
        reference = expected[instance.id]
        assert instance.dataset == reference.dataset
        assert instance.image.dtype == np.uint8 and instance.gt.dtype == np.int8
        np.testing.assert_array_equal(instance.image, reference.image)
        np.testing.assert_array_equal(instance.gt, reference.gt)
        image_file = example["image_file"].decode()
        assert image_file and pathlib.Path(reference.source_paths[0]).as_posix().endswith(image_file)
        seen.add(instance.id)
    assert seen == set(expected)


@pytest.fixture(scope="module")
def tfds_modules():
    tfds = pytest.importorskip("tensorflow_datasets")
    from jaxseg_robust.data import tfds_builders  # noqa: PLC0415

    return tfds, tfds_builders


@pytest.mark.parametrize("config, write, kind", [
    ("grabcut", write_grabcut, "grabcut"),
    ("davis", write_davis, "davis"),
    ("tetris", write_tetris, "tetris"),
])
def test_examples_equal_the_default_loader(tfds_modules, tmp_path, config, write, kind):
    tfds, tfds_builders = tfds_modules
    folder = write(tmp_path / "root")
    # manual_dir = a datasets root holding the folder (the RITM layout) ...
    builder = _build(tfds, config, tmp_path / "root", tmp_path / "tfds_a")
    refs = load_dataset(kind, tmp_path / "root")
    _assert_equals_the_loader(builder, refs, tfds_builders)
    if kind == "grabcut":  # the ignore band survives
        assert any((tfds_builders.instance_from_example(e).gt == -1).any()
                   for e in builder.as_data_source()["test"])
    if kind == "tetris":  # one example per object id
        assert sorted(r.id for r in refs) == ["scene#5", "scene#70000"]
    # ... or the dataset folder itself
    builder = _build(tfds, config, folder, tmp_path / "tfds_b")
    _assert_equals_the_loader(builder, refs, tfds_builders)


def test_folder_config_reads_any_image_mask_folder(tfds_modules, tmp_path):
    tfds, tfds_builders = tfds_modules
    folder = tmp_path / "mine"
    (folder / "images").mkdir(parents=True)
    (folder / "masks").mkdir()
    for index in range(3):
        Image.fromarray(_image(15, 19, 30 + index)).save(folder / "images" / f"s{index}.png")
        Image.fromarray(_disc(15, 19, 30 + index).astype(np.uint8) * 255).save(folder / "masks" / f"s{index}.png")
    builder = _build(tfds, "folder", folder, tmp_path / "tfds")
    _assert_equals_the_loader(builder, load_dataset(folder), tfds_builders)


def test_a_bad_pair_stops_the_build_naming_the_file(tfds_modules, tmp_path):
    tfds, _ = tfds_modules
    folder = write_davis(tmp_path / "root")
    (folder / "gt" / "00001.png").unlink()
    with pytest.raises(DatasetError, match="00001"):
        _build(tfds, "davis", tmp_path / "root", tmp_path / "tfds")


def test_instance_from_example_checks_the_features(tfds_modules):
    _, tfds_builders = tfds_modules
    with pytest.raises(ValueError, match="lacks"):
        tfds_builders.instance_from_example({"id": b"x", "image": np.zeros((2, 2, 3), np.uint8)})
    with pytest.raises(ValueError, match="'x'"):
        tfds_builders.instance_from_example({"id": b"x", "image": np.zeros((2, 2, 3), np.uint8),
                                             "gt": np.zeros((3, 2), np.int8)})
    instance = tfds_builders.instance_from_example({"id": "y", "dataset": b"d", "image": np.zeros((2, 3, 3), np.uint8),
                                                    "gt": np.ones((2, 3), np.int8)}, dataset="other")
    assert instance.key == ("other", "y")


@pytest.mark.parametrize("kind", ["grabcut", "berkeley", "davis", "coco_mval"])
def test_real_benchmark_samples_round_trip(tfds_modules, real_data_dir, tmp_path, kind):
    tfds, tfds_builders = tfds_modules
    builder = _build(tfds, kind, real_data_dir, tmp_path / "tfds")
    _assert_equals_the_loader(builder, load_dataset(kind, real_data_dir), tfds_builders)
