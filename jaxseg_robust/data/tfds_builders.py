"""TensorFlow-Datasets builders for the RITM-style benchmark folders (optional ``tfds`` extra).

``pip install "jaxseg_robust[tfds]"`` installs ``tensorflow-datasets``; TensorFlow
itself is not needed: the builders write ArrayRecord files and a TFDS
pipeline reads them with ``builder.as_data_source()`` (random access, NumPy
values), or, with TensorFlow installed, ``builder.as_dataset()``. The default
loader (`jaxseg_robust.data.datasets`) stays light: importing
`jaxseg_robust.data` never imports this module or TFDS.

One builder, ``ritm_benchmark``, with a config per dataset kind of
`jaxseg_robust.data.datasets.KINDS` (``ritm_benchmark/grabcut``, ``berkeley``,
``davis``, ``coco_mval``, ``tetris`` (longest side capped at 1024 px, as the
BREPS loader), ``tetris_rclicks`` (capped at 2048 px, as RClicks) and
``folder`` (any ``images/ + masks/`` folder, masks ``> 128``)). The datasets
cannot be downloaded: put the folder in ``manual_dir`` (the dataset folder
itself, or a datasets root holding a folder named like the kind, e.g.
``GrabCut/``). Listing, decoding, mask rules, ids and errors are those of
`jaxseg_robust.data.datasets.list_dataset_folder` (a bad pair stops the build
with a `DatasetError` naming the file), so an example equals the `Instance`
the default loader gives.

Features of an example (one object instance; split ``test``, the benchmarks
being evaluation sets):

  id        str    instance id (image stem, ``"<stem>#<object id>"`` for TETRIS)
  dataset   str    dataset name (the kind's name)
  image     uint8[H, W, 3] RGB (zlib-compressed tensor: encoding images as
                   PNG/JPEG would need TensorFlow)
  gt        int8[H, W]: 1 object, 0 background, -1 ignore
  image_file, mask_file   str  source file names, relative to the dataset folder

Usage::

    import tensorflow_datasets as tfds
    from jaxseg_robust.data import tfds_builders  # registers ritm_benchmark

    builder = tfds.builder("ritm_benchmark/davis", data_dir="~/tfds", file_format="array_record")
    builder.download_and_prepare(download_config=tfds.download.DownloadConfig(manual_dir="~/datasets"))
    source = builder.as_data_source()["test"]
    instance = tfds_builders.instance_from_example(source[0])   # -> data.instances.Instance
"""

from __future__ import annotations

import dataclasses
import pathlib

import numpy as np

try:
    import tensorflow_datasets as tfds
except ImportError as error:  # pragma: no cover - exercised in a subprocess by the tests
    raise ImportError('jaxseg_robust.data.tfds_builders needs tensorflow-datasets: pip install '
                      '"jaxseg_robust[tfds]"') from error

from jaxseg_robust.data.datasets import KINDS, RCLICKS_TETRIS_MAX_SIDE, TETRIS_MAX_SIDE, list_dataset_folder, normalize_name
from jaxseg_robust.data.instances import Instance

SPLIT = "test"
IMAGE_FEATURE_ENCODING = "zlib"


@dataclasses.dataclass(eq=False)  # tfds.core.BuilderConfig is a plain dataclass
class RitmBenchmarkConfig(tfds.core.BuilderConfig):
    """One dataset kind: ``kind`` (a `KINDS` key) and, for TETRIS, the longest-side cap ``max_side`` (px)."""

    kind: str = "folder"
    max_side: int | None = None


def _config(name: str, kind: str, max_side: int | None = None) -> RitmBenchmarkConfig:
    description = KINDS[kind].description
    if max_side is not None:
        description += f" (longest side capped at {max_side} px)"
    return RitmBenchmarkConfig(name=name, kind=kind, max_side=max_side, description=description)


BUILDER_CONFIGS = (
    _config("grabcut", "grabcut"),
    _config("berkeley", "berkeley"),
    _config("davis", "davis"),
    _config("coco_mval", "coco_mval"),
    _config("tetris", "tetris", TETRIS_MAX_SIDE),
    _config("tetris_rclicks", "tetris", RCLICKS_TETRIS_MAX_SIDE),
    _config("folder", "folder"),
)


def dataset_folder(manual_dir, kind: str) -> pathlib.Path:
    """The dataset folder inside ``manual_dir``: a sub-folder named like the kind, else ``manual_dir`` itself.

    Args:
      manual_dir: TFDS's manual folder (a path).
      kind: a `KINDS` key.

    Returns:
      The folder `list_dataset_folder` reads (the names compare as `normalize_name`: case, ``_`` and
      ``-`` ignored, so ``GrabCut/`` and ``COCO_MVal/`` match).
    """
    base = pathlib.Path(manual_dir)
    if kind != "folder":
        wanted = normalize_name(kind)
        matches = sorted(p for p in base.iterdir() if p.is_dir() and normalize_name(p.name) == wanted)
        if len(matches) == 1:
            return matches[0]
    return base


def example_of(instance: Instance, folder: pathlib.Path) -> dict:
    """The TFDS example of a loaded `Instance` (see the module docstring for the features)."""
    names = [pathlib.Path(p) for p in instance.source_paths]

    def relative(index: int) -> str:
        if index >= len(names):
            return ""
        try:
            return names[index].resolve().relative_to(folder.resolve()).as_posix()
        except ValueError:
            return names[index].name

    return {"id": instance.id, "dataset": instance.dataset, "image": np.asarray(instance.image, np.uint8),
            "gt": np.asarray(instance.gt, np.int8), "image_file": relative(0), "mask_file": relative(1)}


def _text(value) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def instance_from_example(example, dataset: str | None = None) -> Instance:
    """An `Instance` from a ``ritm_benchmark`` example (a dict of NumPy values, ``bytes`` or ``str`` text).

    Args:
      example: one example of ``as_data_source()`` or of ``tfds.as_numpy(as_dataset())``.
      dataset: dataset name of the instance (default: the example's ``dataset``).

    Returns:
      `Instance` with ``image`` uint8[H, W, 3] and ``gt`` int8[H, W] (1 / 0 / -1 ignore).

    Raises:
      ValueError: a feature is missing or has the wrong shape, naming the feature and the id.
    """
    missing = sorted({"id", "image", "gt"} - set(example))
    if missing:
        raise ValueError(f"example lacks the feature(s) {missing}; is it a ritm_benchmark example?")
    instance_id = _text(example["id"])
    image, gt = np.asarray(example["image"]), np.asarray(example["gt"])
    if image.ndim != 3 or image.shape[2] != 3 or gt.shape != image.shape[:2]:
        raise ValueError(f"example {instance_id!r}: image {image.shape} and gt {gt.shape} must be [H, W, 3] "
                         f"and [H, W]")
    name = dataset if dataset is not None else _text(example.get("dataset", ""))
    return Instance(id=instance_id, image=image.astype(np.uint8), gt=gt.astype(np.int8), dataset=name)


class RitmBenchmark(tfds.core.GeneratorBasedBuilder):
    """Interactive-segmentation benchmarks (GrabCut, Berkeley, DAVIS, COCO-MVal, TETRIS) from RITM-style folders."""

    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "First release: jaxseg_robust.data.datasets decoding, one example per object."}
    BUILDER_CONFIGS = list(BUILDER_CONFIGS)
    MANUAL_DOWNLOAD_INSTRUCTIONS = """\
    The benchmarks cannot be downloaded by TFDS. Put the dataset folder, laid out as the RITM code
    expects (GrabCut: data_GT/ + boundary_GT/; Berkeley: images/ + masks/; DAVIS and COCO_MVal:
    img/ + gt/; TETRIS: images/ + masks/ with RGB-packed object ids; any of them may also use
    images/ + masks/), in manual_dir: either the dataset folder itself or a datasets root holding a
    folder named like the dataset (GrabCut/, Berkeley/, DAVIS/, COCO_MVal/, TETRIS/).
    """

    def _info(self) -> tfds.core.DatasetInfo:
        features = tfds.features.FeaturesDict({
            "id": tfds.features.Text(),
            "dataset": tfds.features.Text(),
            "image": tfds.features.Tensor(shape=(None, None, 3), dtype=np.uint8, encoding=IMAGE_FEATURE_ENCODING),
            "gt": tfds.features.Tensor(shape=(None, None), dtype=np.int8, encoding=IMAGE_FEATURE_ENCODING),
            "image_file": tfds.features.Text(),
            "mask_file": tfds.features.Text(),
        })
        return tfds.core.DatasetInfo(
            builder=self, description=__doc__.splitlines()[0], features=features,
            homepage="https://github.com/SamsungLabs/ritm_interactive_segmentation",
            supervised_keys=("image", "gt"))

    def _split_generators(self, dl_manager):
        folder = dataset_folder(dl_manager.manual_dir, self.builder_config.kind)
        return {SPLIT: self._generate_examples(folder)}

    def _generate_examples(self, folder: pathlib.Path):
        config = self.builder_config
        options = {"max_side": config.max_side} if config.kind == "tetris" else {}
        for ref in list_dataset_folder(config.kind, folder, on_bad_pair="error", **options):
            yield ref.id, example_of(ref.load(), folder)


__all__ = ["BUILDER_CONFIGS", "RitmBenchmark", "RitmBenchmarkConfig", "SPLIT", "dataset_folder", "example_of",
           "instance_from_example"]
