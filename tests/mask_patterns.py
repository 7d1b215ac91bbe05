"""Structured random binary masks for the distance / components / clicker tests.

``mask_strategy(shape)`` is a hypothesis strategy drawing a pattern name, a density
and a seed, and building the mask with numpy (fast, reproducible, shrinks over
the pattern list). Patterns cover the cases the ops must survive: empty, full,
one pixel, one zero, sparse and dense noise, thin lines, checkerboards, smooth
blobs (multi-component), rectangles, spirals and boustrophedon snakes.
"""

from __future__ import annotations

import numpy as np
import scipy.ndimage as ndi
from hypothesis import strategies as st

PATTERNS = ("empty", "full", "one_pixel", "one_zero", "noise", "lines", "checker",
            "blobs", "rects", "spiral", "snake")


def spiral(height: int, width: int) -> np.ndarray:
    """One-pixel-wide rectangular spiral (a single 4-connected component)."""
    m = np.zeros((height, width), bool)
    top, left, bottom, right = 0, 0, height - 1, width - 1
    while top <= bottom and left <= right:
        m[top, left:right + 1] = True
        m[top:bottom + 1, right] = True
        if bottom - top >= 2:
            m[bottom, left:right + 1] = True
        if right - left >= 2 and bottom - top >= 2:
            m[top + 2:bottom + 1, left] = True
        top, left, bottom, right = top + 2, left + 2, bottom - 2, right - 2
    return m


def snake(height: int, width: int) -> np.ndarray:
    """Boustrophedon path: full rows every other row, joined at alternating ends."""
    m = np.zeros((height, width), bool)
    for r in range(0, height, 2):
        m[r] = True
        if r + 1 < height:
            m[r + 1, width - 1 if (r // 2) % 2 == 0 else 0] = True
    return m


def make_mask(pattern: str, shape: tuple[int, int], density: float, seed: int) -> np.ndarray:
    """Build a bool mask of ``shape`` for one pattern (density in (0, 1))."""
    rng = np.random.default_rng(seed)
    h, w = shape
    if pattern == "empty":
        return np.zeros(shape, bool)
    if pattern == "full":
        return np.ones(shape, bool)
    if pattern == "one_pixel":
        m = np.zeros(shape, bool)
        m[rng.integers(h), rng.integers(w)] = True
        return m
    if pattern == "one_zero":
        m = np.ones(shape, bool)
        m[rng.integers(h), rng.integers(w)] = False
        return m
    if pattern == "noise":
        return rng.random(shape) < density
    if pattern == "lines":
        m = np.zeros(shape, bool)
        for _ in range(1 + int(4 * density)):
            if rng.random() < 0.5:
                m[rng.integers(h), :] = True
            else:
                m[:, rng.integers(w)] = True
        return m ^ (rng.random(shape) < 0.02)
    if pattern == "checker":
        return (np.add.outer(np.arange(h), np.arange(w)) % 2 == 0) ^ (density > 0.5)
    if pattern == "blobs":
        sigma = 1.0 + 4.0 * density
        return ndi.gaussian_filter(rng.standard_normal(shape), sigma, mode="wrap") > (density - 0.5) * 0.2
    if pattern == "rects":
        m = np.zeros(shape, bool)
        for _ in range(1 + int(5 * density)):
            r0, c0 = rng.integers(h), rng.integers(w)
            m[r0:r0 + rng.integers(1, h + 1), c0:c0 + rng.integers(1, w + 1)] = True
        return m
    if pattern == "spiral":
        return spiral(h, w)
    if pattern == "snake":
        return snake(h, w) if density < 0.5 else snake(w, h).T.copy()
    raise ValueError(f"unknown pattern {pattern!r}")


def mask_strategy(shape: tuple[int, int]) -> st.SearchStrategy[np.ndarray]:
    """Hypothesis strategy of structured bool masks with a fixed shape."""
    return st.builds(make_mask, st.sampled_from(PATTERNS), st.just(shape),
                     st.floats(0.01, 0.99), st.integers(0, 2 ** 32 - 1))
