"""Ground-truth prompt helpers for synthetic samples (host-side NumPy)."""

from __future__ import annotations

import numpy as np

# The box of an empty mask, as `jaxseg_robust.ops.boxes.EMPTY_MASK_BOX` (BREPS).
EMPTY_MASK_BOX = (0, 0, 1, 1)


def gt_tight_box(mask) -> np.ndarray:
    """Tight box of a mask in inclusive pixel indices; NumPy twin of `jaxseg_robust.ops.boxes.tight_box`.

    Args:
      mask: [H, W] bool or numeric mask; pixels with ``mask > 0`` are the object
        (so a {-1, 0, 1} GT gives the box of its object pixels).

    Returns:
      int32[4] ``(x1, y1, x2, y2) = (min col, min row, max col, max row)``;
      ``(0, 0, 1, 1)`` for an empty mask.
    """
    mask = np.asarray(mask)
    if mask.ndim != 2:
        raise ValueError(f"mask must be 2-D [H, W], got shape {mask.shape}")
    foreground = mask if mask.dtype == bool else mask > 0
    rows = np.flatnonzero(foreground.any(axis=1))
    cols = np.flatnonzero(foreground.any(axis=0))
    if rows.size == 0:
        return np.asarray(EMPTY_MASK_BOX, np.int32)
    return np.asarray((cols[0], rows[0], cols[-1], rows[-1]), np.int32)
