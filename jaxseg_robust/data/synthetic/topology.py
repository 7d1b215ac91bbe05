"""Host-side (NumPy) mask topology used to check generated shapes: components, holes, dilation.

These run while data is generated (not under jit), on masks of at most a few
hundred pixels a side. Components are counted with a union-find over
horizontal runs, so the cost grows with the number of runs, not pixels.
"""

from __future__ import annotations

import numpy as np


def _check_mask(mask, name: str = "mask") -> np.ndarray:
    mask = np.asarray(mask)
    if mask.ndim != 2:
        raise ValueError(f"{name} must be 2-D [H, W], got shape {mask.shape}")
    return mask.astype(bool, copy=False)


def _row_runs(row: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Half-open runs ``[start, end)`` of true values in a bool row."""
    edges = np.diff(np.concatenate(([0], row.view(np.int8), [0])))
    return np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)


def count_components(mask, connectivity: int = 8) -> int:
    """Number of connected components of the true pixels of a mask.

    Args:
      mask: bool[H, W] (or anything NumPy turns into bool).
      connectivity: 8 (pixels touching by an edge or a corner are connected)
        or 4 (by an edge only).

    Returns:
      The component count (0 for an empty mask).
    """
    mask = _check_mask(mask)
    if connectivity not in (4, 8):
        raise ValueError(f"connectivity must be 4 or 8, got {connectivity!r}")
    reach = 1 if connectivity == 8 else 0  # runs [s, e) touch [s', e') iff s < e' + reach and s' < e + reach
    parent: list[int] = []

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    previous_starts = previous_ends = np.zeros(0, dtype=np.intp)
    previous_first = 0
    for row in mask:
        starts, ends = _row_runs(np.ascontiguousarray(row))
        first = len(parent)
        parent.extend(range(first, first + len(starts)))
        j = 0
        for i in range(len(starts)):
            # skip previous runs that end before this one can touch them
            while j < len(previous_starts) and previous_ends[j] + reach <= starts[i]:
                j += 1
            k = j
            while k < len(previous_starts) and previous_starts[k] < ends[i] + reach:
                a, b = find(first + i), find(previous_first + k)
                if a != b:
                    parent[a] = b
                k += 1
        previous_starts, previous_ends, previous_first = starts, ends, first
    return sum(1 for i in range(len(parent)) if find(i) == i)


def count_holes(mask) -> int:
    """Number of holes: 4-connected background regions not touching the image border.

    4-connected background is the topological dual of 8-connected foreground,
    so a ring of 8-connected pixels has exactly one hole.
    """
    mask = _check_mask(mask)
    padded = np.pad(mask, 1, constant_values=False)
    return count_components(~padded, connectivity=4) - 1


def dilate(mask, radius: int) -> np.ndarray:
    """bool[H, W] dilation by a (2 radius + 1)-pixel square (Chebyshev ball); radius 0 returns a copy."""
    mask = _check_mask(mask)
    if radius < 0:
        raise ValueError(f"radius must be >= 0, got {radius}")
    out = mask.copy()
    for axis in (0, 1):
        grown = out.copy()
        for shift in range(1, radius + 1):
            if shift >= out.shape[axis]:
                break
            head = [slice(None)] * 2
            tail = [slice(None)] * 2
            head[axis], tail[axis] = slice(shift, None), slice(None, -shift)
            grown[tuple(head)] |= out[tuple(tail)]
            grown[tuple(tail)] |= out[tuple(head)]
        out = grown
    return out


def inner_boundary(mask) -> np.ndarray:
    """bool[H, W] pixels of the mask with a 4-neighbour outside it (pixels outside the image count as outside)."""
    mask = _check_mask(mask)
    padded = np.pad(mask, 1, constant_values=False)
    interior = padded[:-2, 1:-1] & padded[2:, 1:-1] & padded[1:-1, :-2] & padded[1:-1, 2:]
    return mask & ~interior


def touches_border(mask) -> bool:
    """Whether any true pixel lies in the first or last row or column."""
    mask = _check_mask(mask)
    return bool(mask[0].any() or mask[-1].any() or mask[:, 0].any() or mask[:, -1].any())
