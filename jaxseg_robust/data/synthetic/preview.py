"""A contact sheet of samples with their mask outlines, as one uint8 image."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from jaxseg_robust.data.synthetic.topology import inner_boundary

MASK_OUTLINE_RGB = (255, 40, 40)
DISTRACTOR_OUTLINE_RGB = (40, 160, 255)
SHEET_RGB = (255, 255, 255)


def _image_and_masks(item):
    """(image, object mask, distractor mask or None) of a `SyntheticSample`, an `Instance` or a pair."""
    if hasattr(item, "distractor_mask"):
        return item.image, item.mask, item.distractor_mask
    if hasattr(item, "gt"):
        return item.image, np.asarray(item.gt) == 1, None
    if isinstance(item, (tuple, list)) and len(item) == 2:
        return item[0], np.asarray(item[1]) > 0, None
    raise ValueError(f"items must be SyntheticSample, Instance or (image, mask) pairs, got {type(item).__name__}")


def preview_grid(items: Sequence, *, columns: int | None = None, pad: int = 2,
                 outline_rgb=MASK_OUTLINE_RGB, distractor_rgb=DISTRACTOR_OUTLINE_RGB) -> np.ndarray:
    """Tiles images with the outlines of their masks into one sheet.

    Args:
      items: `SyntheticSample`s (object and distractor outlines), `Instance`s
        (outline of ``gt == 1``) or ``(image uint8[H, W, 3], mask [H, W])`` pairs.
      columns: tiles per row (default ``ceil(sqrt(N))``).
      pad: pixels of sheet colour between and around tiles.
      outline_rgb: colour of the object outline (the mask's inner boundary
        pixels, 4-neighbourhood).
      distractor_rgb: colour of distractor outlines, or None to draw none.

    Returns:
      uint8[R * (Hmax + pad) + pad, C * (Wmax + pad) + pad, 3]; each tile is
      placed at the top left of its cell, cells sized to the largest tile.
    """
    items = list(items)
    if not items:
        raise ValueError("items must not be empty")
    if columns is None:
        columns = math.ceil(math.sqrt(len(items)))
    if isinstance(columns, bool) or not isinstance(columns, int) or columns < 1:
        raise ValueError(f"columns must be a positive int, got {columns!r}")
    if isinstance(pad, bool) or not isinstance(pad, int) or pad < 0:
        raise ValueError(f"pad must be a non-negative int, got {pad!r}")
    tiles = []
    for item in items:
        image, mask, distractors = _image_and_masks(item)
        image = np.asarray(image)
        if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3:
            raise ValueError(f"items: image must be uint8[H, W, 3], got {image.dtype}{list(image.shape)}")
        if mask.shape != image.shape[:2]:
            raise ValueError(f"items: mask shape {mask.shape} differs from image size {image.shape[:2]}")
        tile = image.copy()
        if distractors is not None and distractor_rgb is not None:
            tile[inner_boundary(distractors)] = distractor_rgb
        tile[inner_boundary(mask)] = outline_rgb
        tiles.append(tile)
    cell_h = max(t.shape[0] for t in tiles)
    cell_w = max(t.shape[1] for t in tiles)
    rows = math.ceil(len(tiles) / columns)
    sheet = np.empty((rows * (cell_h + pad) + pad, columns * (cell_w + pad) + pad, 3), np.uint8)
    sheet[...] = SHEET_RGB
    for k, tile in enumerate(tiles):
        top = pad + (k // columns) * (cell_h + pad)
        left = pad + (k % columns) * (cell_w + pad)
        sheet[top:top + tile.shape[0], left:left + tile.shape[1]] = tile
    return sheet
