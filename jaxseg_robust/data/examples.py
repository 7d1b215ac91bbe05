"""A small deterministic set of example GT / prediction mask pairs.

Used by ``jaxseg-robust score --example`` to show what the mask metrics see:
shapes of graded difficulty (a disc, a thin bar, a ring, a two-part object,
an object cut by the image border, a fine-detailed star), each paired with a
prediction made from the GT by a shift, an erosion, a dilation or boundary
noise. Two image sizes are used so the scorer's size bucketing is exercised.
Everything is computed from integer grids and a seeded NumPy generator, so the
files are identical on every machine.
"""

from __future__ import annotations

import dataclasses
import pathlib

import numpy as np
from PIL import Image

from jaxseg_robust.ops.morphology import dilate, erode

DEFAULT_SEED = 0
GT_FOLDER = "gt"
PRED_FOLDER = "pred"


@dataclasses.dataclass(frozen=True)
class ExamplePair:
    """One example: ``gt`` and ``pred`` bool[H, W] masks and what was done to the GT."""

    name: str
    gt: np.ndarray
    pred: np.ndarray
    description: str


def _grid(height: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    return np.mgrid[:height, :width]


def _disc(height: int, width: int, cy: float, cx: float, radius: float) -> np.ndarray:
    yy, xx = _grid(height, width)
    return (yy - cy) ** 2 + (xx - cx) ** 2 <= radius**2


def _shift(mask: np.ndarray, dy: int, dx: int) -> np.ndarray:
    """Shifts content by (dy, dx) pixels; what leaves the frame is lost, new pixels are background."""
    height, width = mask.shape
    out = np.zeros_like(mask)
    src = mask[max(0, -dy): height - max(0, dy), max(0, -dx): width - max(0, dx)]
    out[max(0, dy): max(0, dy) + src.shape[0], max(0, dx): max(0, dx) + src.shape[1]] = src
    return out


def _boundary_noise(mask: np.ndarray, band: int, flip_probability: float, rng: np.random.Generator) -> np.ndarray:
    """Flips pixels within ``band`` px (Chebyshev) of the mask contour with the given probability."""
    near = np.asarray(dilate(mask, band)) & ~np.asarray(erode(mask, band))
    flips = near & (rng.random(mask.shape) < flip_probability)
    return mask ^ flips


def example_pairs(seed: int = DEFAULT_SEED) -> list[ExamplePair]:
    """The example pairs, easiest first (deterministic for a given ``seed``)."""
    rng = np.random.default_rng(seed)
    height, width = 160, 240
    yy, xx = _grid(height, width)
    pairs = []

    disc = _disc(height, width, 80, 120, 50)
    pairs.append(ExamplePair("01_disc_shift2", disc, _shift(disc, 2, 2), "disc r=50, prediction shifted by (2, 2) px"))

    pairs.append(ExamplePair("02_disc_noise", disc, _boundary_noise(disc, 3, 0.3, rng),
                             "disc r=50, 30 % of pixels within 3 px of the contour flipped"))

    two_part = _disc(height, width, 60, 70, 35) | _disc(height, width, 100, 175, 30)
    pairs.append(ExamplePair("03_two_part_one_missed", two_part, _disc(height, width, 60, 70, 35),
                             "two discs, prediction finds only the larger one"))

    border = (yy >= 70) & (xx < 110)
    pairs.append(ExamplePair("04_border_dilate3", border, np.asarray(dilate(border, 3)),
                             "rectangle cut by the left and bottom image border, prediction dilated by 3 px"))

    ring = _disc(height, width, 80, 120, 60) & ~_disc(height, width, 80, 120, 40)
    pairs.append(ExamplePair("05_ring_erode2", ring, np.asarray(erode(ring, 2, shape="disk")),
                             "ring 40 <= r <= 60, prediction eroded by a radius-2 disk"))

    bar = (np.abs(yy - 80) <= 2) & (xx >= 20) & (xx < 220)
    pairs.append(ExamplePair("06_thin_bar_shift3", bar, _shift(bar, 3, 0),
                             "5-px thick bar, prediction shifted 3 px down"))

    size = 128
    yy, xx = _grid(size, size)
    angle = np.arctan2(yy - 64.0, xx - 64.0)
    star = np.hypot(yy - 64.0, xx - 64.0) <= 30 + 18 * np.cos(7 * angle)
    pairs.append(ExamplePair("07_star_as_disc", star, _disc(size, size, 64, 64, 32),
                             "seven-pointed star, prediction is a disc of similar area (128x128 image)"))
    return pairs


def write_example_folders(root, seed: int = DEFAULT_SEED) -> tuple[pathlib.Path, pathlib.Path]:
    """Writes the examples as 8-bit PNGs (0 = background, 255 = object).

    Args:
      root: output folder (created); files go to ``root/gt/<name>.png`` and
        ``root/pred/<name>.png`` (existing files of the same name are replaced).
      seed: generator seed.

    Returns:
      (gt_dir, pred_dir).
    """
    root = pathlib.Path(root)
    gt_dir, pred_dir = root / GT_FOLDER, root / PRED_FOLDER
    gt_dir.mkdir(parents=True, exist_ok=True)
    pred_dir.mkdir(parents=True, exist_ok=True)
    for pair in example_pairs(seed):
        Image.fromarray(pair.gt.astype(np.uint8) * 255).save(gt_dir / f"{pair.name}.png")
        Image.fromarray(pair.pred.astype(np.uint8) * 255).save(pred_dir / f"{pair.name}.png")
    return gt_dir, pred_dir
