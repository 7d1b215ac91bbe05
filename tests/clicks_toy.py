"""A generated clicks CSV in the RClicks authors' format over a generated image/mask folder.

`write_toy_clicks(root)` writes ``root/toy/{images,masks}`` (``COUNT`` RGB images with one elliptic
object each, sizes differing) and ``root/clicks.csv`` with the authors' columns (``dataset, image_stem,
object_stem, model_type, click_type, full_stem, device, x, y, w, h``): per image ``CLICKS_PER_IMAGE``
first-round clicks drawn near the object's centre (pc and mobile rows, a few outside the frame, which
the reader clips), plus fn / fp rows of a later round, which the clickability evaluation does not read.
"""

from __future__ import annotations

import pathlib

import numpy as np
from PIL import Image

from jaxseg_robust.clicksim.clicks_csv import CLICKS_COLUMNS

COUNT = 4
CLICKS_PER_IMAGE = 9
DATASET = "toy"  # the folder's dataset name (the images folder's parent) and the CSV's dataset value


def toy_size(index: int) -> tuple[int, int]:
    """(H, W) of toy image ``index``."""
    return 36 + 4 * index, 44 - 2 * index


def toy_mask(index: int) -> np.ndarray:
    """bool[H, W]: the elliptic object of toy image ``index``."""
    height, width = toy_size(index)
    yy, xx = np.mgrid[:height, :width]
    cy, cx = height * (0.45 + 0.03 * index), width * (0.5 - 0.02 * index)
    return ((yy - cy) / (0.3 * height)) ** 2 + ((xx - cx) / (0.28 * width)) ** 2 <= 1


def toy_rows(index: int, rng: np.random.Generator) -> list[dict]:
    """The CSV rows of toy image ``index``: first-round clicks near the object centre, and fn / fp rows."""
    height, width = toy_size(index)
    stem = f"a{index}"
    ys, xs = np.nonzero(toy_mask(index))
    centre = np.array([xs.mean(), ys.mean()])
    rows = []
    for k in range(CLICKS_PER_IMAGE):
        x, y = np.round(centre + rng.normal(0, 3.0, 2)).astype(int)
        rows.append({"dataset": DATASET, "image_stem": stem, "object_stem": "", "model_type": "",
                     "click_type": "first", "full_stem": stem, "device": ("pc", "mobile")[k % 2],
                     "x": int(x), "y": int(y), "w": width, "h": height})
    rows[-1]["x"] = width + 5  # outside the frame: clipped to width - 1 by the reader
    for click_type in ("fn", "fp"):
        rows.append({"dataset": DATASET, "image_stem": stem, "object_stem": "", "model_type": "sam",
                     "click_type": click_type, "full_stem": f"{stem}_sam_{click_type}", "device": "pc",
                     "x": 1, "y": 1, "w": width, "h": height})
    return rows


def write_toy_clicks(root: pathlib.Path, seed: int = 0) -> tuple[pathlib.Path, pathlib.Path]:
    """Writes the folder and the CSV under ``root``; returns (the ``toy`` folder, the CSV path)."""
    rng = np.random.default_rng(seed)
    folder = pathlib.Path(root) / DATASET
    (folder / "images").mkdir(parents=True)
    (folder / "masks").mkdir()
    lines = [",".join(CLICKS_COLUMNS)]
    for index in range(COUNT):
        height, width = toy_size(index)
        mask = toy_mask(index)
        image = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
        image[mask] = (image[mask] // 2 + 100).astype(np.uint8)
        Image.fromarray(image).save(folder / "images" / f"a{index}.png")
        Image.fromarray(mask.astype(np.uint8) * 255).save(folder / "masks" / f"a{index}.png")
        lines += [",".join(str(row[name]) for name in CLICKS_COLUMNS) for row in toy_rows(index, rng)]
    path = pathlib.Path(root) / "clicks.csv"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return folder, path
