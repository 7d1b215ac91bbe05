"""Generated PASCAL VOC 2012 / Cityscapes folders and tiny converted semseg / UPerNet models for the tests.

The folders follow the official layouts that `jaxseg_robust.data.semantic`
reads (docs/models/semseg.md, "Datasets and the image protocol"); the models
are saved with `jaxseg_robust.models.store` exactly as ``python -m ports
semseg|upernet`` saves them (family, variant, config.json, orbax variables),
with seeded random weights.
"""

from __future__ import annotations

import pathlib

import jax
import numpy as np
from PIL import Image

from jaxseg_robust.models import store
from jaxseg_robust.models.dense import semseg, upernet
from jaxseg_robust.models.dense.semseg import SemsegConfig, SemsegDense
from jaxseg_robust.models.dense.upernet import UperNetConfig, UperNetDense

TINY_SEMSEG = dict(width=4, blocks=(1, 1, 1, 1), head_channels=8, aux_channels=4, bins=(1, 2))
TINY_UPERNET = dict(depths=(1, 1, 1, 1), dims=(8, 16, 24, 32), stem_width=4, channels=16, aux_channels=8)


def palette_png(path, labels: np.ndarray) -> None:
    """Writes uint8 ``labels`` [H, W] as a palette ("P") PNG, as VOC's SegmentationClass files are."""
    image = Image.fromarray(labels.astype(np.uint8), mode="P")
    image.putpalette([v for i in range(256) for v in (i, 255 - i, (7 * i) % 256)])
    image.save(path)


def write_voc(root: pathlib.Path, ids, *, bad: str | None = None, size=(40, 50), sizes=None,
              seed=0) -> pathlib.Path:
    """``root/VOCdevkit/VOC2012`` with JPEG images, palette labels 0..20 + void 255 and ``val.txt``.

    Each label map has a void first row and one foreground rectangle; ``bad``
    adds an image whose label map holds the value 50 (not a VOC class).
    ``sizes`` ({id: (H, W)}) overrides ``size`` per image.
    """
    rng = np.random.default_rng(seed)
    voc = root / "VOCdevkit" / "VOC2012"
    for sub in ("ImageSets/Segmentation", "JPEGImages", "SegmentationClass"):
        (voc / sub).mkdir(parents=True, exist_ok=True)
    listed = (*ids, *([bad] if bad else []))
    for image_id in listed:
        hw = (sizes or {}).get(image_id, size)
        image = rng.integers(0, 256, (*hw, 3), dtype=np.uint8)
        labels = np.zeros(hw, np.uint8)
        labels[5:20, 10:30] = rng.integers(1, 21)
        labels[0, :] = 255
        if image_id == bad:
            labels[3, 3] = 50
        Image.fromarray(image).save(voc / "JPEGImages" / f"{image_id}.jpg")
        palette_png(voc / "SegmentationClass" / f"{image_id}.png", labels)
    (voc / "ImageSets/Segmentation/val.txt").write_text("\n".join(listed) + "\n")
    return root


def make_cityscapes(root: pathlib.Path, cities: dict, *, size=(8, 16), split="val", seed=0) -> dict:
    """``leftImg8bit/<split>/<city>/<stem>_leftImg8bit.png`` + ``gtFine/<split>/<city>/<stem>_gtFine_labelIds.png``.

    Random RGB images and random label ids 0..33 (train ids and void mixed).
    Returns {"city/stem": uint8 label ids [H, W]}.
    """
    rng = np.random.default_rng(seed)
    raw = {}
    for city, stems in cities.items():
        (root / "leftImg8bit" / split / city).mkdir(parents=True, exist_ok=True)
        (root / "gtFine" / split / city).mkdir(parents=True, exist_ok=True)
        for stem in stems:
            Image.fromarray(rng.integers(0, 256, (*size, 3), dtype=np.uint8)).save(
                root / "leftImg8bit" / split / city / f"{stem}_leftImg8bit.png")
            ids = rng.integers(0, 34, size).astype(np.uint8)
            Image.fromarray(ids, mode="L").save(root / "gtFine" / split / city / f"{stem}_gtFine_labelIds.png")
            raw[f"{city}/{stem}"] = ids
    return raw


def _save(path: pathlib.Path, model, family: str) -> pathlib.Path:
    variables = jax.tree.map(np.asarray, model.init(jax.random.key(0)))
    store.save(path, variables, family=family, variant=model.config.variant, config=model.config.to_dict())
    return path


def save_semseg(path: pathlib.Path, classes: int = 21, background: int | None = 0) -> pathlib.Path:
    """A tiny random PSPNet (ResNet, one block per stage) saved as ``python -m ports semseg`` saves one."""
    return _save(path, SemsegDense(SemsegConfig(num_classes=classes, background_class=background,
                                                **TINY_SEMSEG)), semseg.FAMILY)


def save_upernet(path: pathlib.Path, classes: int = 19, background: int | None = None) -> pathlib.Path:
    """A tiny random UPerNet-ConvNeXt (CvSt stem) saved as ``python -m ports upernet`` saves one."""
    return _save(path, UperNetDense(UperNetConfig(num_classes=classes, background_class=background,
                                                  **TINY_UPERNET)), upernet.FAMILY)
