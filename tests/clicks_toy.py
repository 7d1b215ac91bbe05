"""A generated clicks CSV in the RClicks authors' format over a generated image/mask folder.

`write_toy_clicks(root)` writes ``root/toy/{images,masks}`` (``COUNT`` RGB images with one elliptic
object each, sizes differing) and ``root/clicks.csv`` with the authors' columns (``dataset, image_stem,
object_stem, model_type, click_type, full_stem, device, x, y, w, h``): per image ``CLICKS_PER_IMAGE``
first-round clicks drawn near the object's centre (pc and mobile rows, a few outside the frame, which
the reader clips), and an fn and an fp task of a later round (`toy_rounds`: full stems as the authors
name them, ``<stem>_sam_fn_pc_<k>`` and ``<stem>_mivos_fp``) with clicks drawn near the centre of their
error region. Their previous masks go to ``root/prev_masks/<full_stem>.png`` (`PREV_MASKS`) as the
authors store them: an RGB PNG whose red channel is the mask times 255 (the other channels hold noise,
which a reader of the red channel never sees).
"""

from __future__ import annotations

import pathlib

import numpy as np
from PIL import Image

from jaxseg_robust.clicksim.clicks_csv import CLICKS_COLUMNS

COUNT = 4
CLICKS_PER_IMAGE = 9
ROUND_CLICKS = {"fn": 7, "fp": 6}  # clicks of each later-round task
DATASET = "toy"  # the folder's dataset name (the images folder's parent) and the CSV's dataset value
PREV_MASKS = "prev_masks"  # the previous masks' folder under root


def toy_size(index: int) -> tuple[int, int]:
    """(H, W) of toy image ``index``."""
    return 36 + 4 * index, 44 - 2 * index


def toy_mask(index: int) -> np.ndarray:
    """bool[H, W]: the elliptic object of toy image ``index``."""
    height, width = toy_size(index)
    yy, xx = np.mgrid[:height, :width]
    cy, cx = height * (0.45 + 0.03 * index), width * (0.5 - 0.02 * index)
    return ((yy - cy) / (0.3 * height)) ** 2 + ((xx - cx) / (0.28 * width)) ** 2 <= 1


def toy_rounds(index: int) -> list[tuple[str, str, str, np.ndarray]]:
    """The later-round tasks of toy image ``index``: (full stem, click type, model type, previous mask bool[H, W]).

    fn: the previous mask is the object's upper part, so the error region is its lower part; fp: the previous
    mask is the object and a block in the top-left corner, outside the object (the error region).
    """
    mask = toy_mask(index)
    rows = np.nonzero(mask)[0]
    upper = np.zeros_like(mask)
    upper[: int(np.median(rows)) + index] = True
    block = np.zeros_like(mask)
    block[2:9 + index, 3:10] = True
    return [(f"a{index}_sam_fn_pc_{index}", "fn", "sam", mask & upper),
            (f"a{index}_mivos_fp", "fp", "mivos", mask | block)]


def _round_rows(index: int, full_stem: str, click_type: str, model_type: str, region: np.ndarray) -> list[dict]:
    height, width = region.shape
    rng = np.random.default_rng(1000 + index + len(full_stem))
    ys, xs = np.nonzero(region)
    centre = np.array([xs.mean(), ys.mean()])
    rows = []
    for k in range(ROUND_CLICKS[click_type]):
        x, y = np.round(centre + rng.normal(0, 2.0, 2)).astype(int)
        rows.append({"dataset": DATASET, "image_stem": f"a{index}", "object_stem": "", "model_type": model_type,
                     "click_type": click_type, "full_stem": full_stem, "device": ("pc", "mobile")[k % 2],
                     "x": int(x), "y": int(y), "w": width, "h": height})
    return rows


def toy_rows(index: int, rng: np.random.Generator) -> list[dict]:
    """The CSV rows of toy image ``index``: first-round clicks near the object centre, and the `toy_rounds`."""
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
    mask = toy_mask(index)
    for full_stem, click_type, model_type, previous in toy_rounds(index):
        region = mask & ~previous if click_type == "fn" else ~mask & previous
        rows += _round_rows(index, full_stem, click_type, model_type, region)
    return rows


def write_previous_mask(path: pathlib.Path, previous: np.ndarray, seed: int) -> None:
    """An RGB PNG in the authors' layout: red = 255 · mask, green and blue noise."""
    rgb = np.random.default_rng(seed).integers(0, 256, (*previous.shape, 3), dtype=np.uint8)
    rgb[..., 0] = previous.astype(np.uint8) * 255
    Image.fromarray(rgb).save(path)


def write_toy_clicks(root: pathlib.Path, seed: int = 0) -> tuple[pathlib.Path, pathlib.Path]:
    """Writes the folder and the CSV under ``root``; returns (the ``toy`` folder, the CSV path)."""
    rng = np.random.default_rng(seed)
    folder = pathlib.Path(root) / DATASET
    (folder / "images").mkdir(parents=True)
    (folder / "masks").mkdir()
    (pathlib.Path(root) / PREV_MASKS).mkdir()
    lines = [",".join(CLICKS_COLUMNS)]
    for index in range(COUNT):
        height, width = toy_size(index)
        mask = toy_mask(index)
        image = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
        image[mask] = (image[mask] // 2 + 100).astype(np.uint8)
        Image.fromarray(image).save(folder / "images" / f"a{index}.png")
        Image.fromarray(mask.astype(np.uint8) * 255).save(folder / "masks" / f"a{index}.png")
        lines += [",".join(str(row[name]) for name in CLICKS_COLUMNS) for row in toy_rows(index, rng)]
        for number, (full_stem, _, _, previous) in enumerate(toy_rounds(index)):
            write_previous_mask(pathlib.Path(root) / PREV_MASKS / f"{full_stem}.png", previous, 10 * index + number)
    path = pathlib.Path(root) / "clicks.csv"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return folder, path
