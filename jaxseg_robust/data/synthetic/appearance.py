"""Colours and paint fields for synthetic images: flat, gradients, smooth noise, textures.

A *paint* is a float32[H, W, 3] RGB field in [0, 1] (before clipping): a base
colour plus ``amplitude * pattern * tint``, where ``pattern`` is a float field
in [-1, 1] with mean near 0 and ``tint`` an RGB direction scaled to unit RMS,
so ``amplitude`` is the RMS-per-channel swing of the paint around its base
colour. Everything is drawn from an explicit ``numpy.random.Generator``.

*Contrast* between two colours is their RMS per-channel difference,
``|o - b|_2 / sqrt(3)`` in [0, 1] (0.5 = mid grey against black or white).
"""

from __future__ import annotations

import math

import numpy as np

from jaxseg_robust.data.synthetic.geometry import pixel_centres

# Background kinds and object appearance kinds.
BACKGROUND_KINDS = ("flat", "gradient", "smooth_noise", "stripes", "checker", "noise")
APPEARANCE_KINDS = ("flat", "gradient", "texture")
TEXTURE_KINDS = ("stripes", "checker", "noise")

_COLOUR_LOW, _COLOUR_HIGH = 0.05, 0.95


def _uniform(rng: np.random.Generator, low: float, high: float) -> float:
    return float(low + (high - low) * rng.random())


def colour_contrast(a, b) -> float:
    """RMS per-channel difference ``|a - b|_2 / sqrt(3)`` of two RGB colours in [0, 1]."""
    return float(np.linalg.norm(np.asarray(a, np.float64) - np.asarray(b, np.float64)) / math.sqrt(3.0))


def _random_direction(rng: np.random.Generator) -> np.ndarray:
    """Unit RGB vector, biased towards the grey axis (luminance change plus some hue change)."""
    direction = np.full(3, 1.0 / math.sqrt(3.0)) * (1.0 if rng.random() < 0.5 else -1.0) + 0.6 * rng.standard_normal(3)
    return direction / max(np.linalg.norm(direction), 1e-9)


def colour_pair(rng: np.random.Generator, contrast: float, tries: int = 64) -> tuple[np.ndarray, np.ndarray]:
    """A background and an object colour at a given contrast.

    Args:
      rng: random generator.
      contrast: RMS per-channel difference in (0, 0.9].

    Returns:
      ``(background f64[3], object f64[3])``, both in [0.05, 0.95], with
      `colour_contrast` equal to ``contrast`` (up to float rounding).
    """
    if not 0 < contrast <= 0.9:
        raise ValueError(f"contrast must be in (0, 0.9], got {contrast}")
    step = contrast * math.sqrt(3.0)
    for _ in range(tries):
        background = rng.uniform(0.1, 0.9, 3)
        obj = background + step * _random_direction(rng)
        if np.all((obj >= _COLOUR_LOW) & (obj <= _COLOUR_HIGH)):
            return background, obj
    # Grey pair centred on mid grey: always in range for contrast <= 0.9.
    background = np.full(3, 0.5 - contrast / 2.0)
    return background, background + contrast


def colour_near(rng: np.random.Generator, colour, distance: float, tries: int = 64) -> np.ndarray:
    """A colour at RMS per-channel distance ``distance`` from ``colour``, kept in [0.05, 0.95] where possible."""
    colour = np.asarray(colour, np.float64)
    step = distance * math.sqrt(3.0)
    for _ in range(tries):
        candidate = colour + step * _random_direction(rng)
        if np.all((candidate >= _COLOUR_LOW) & (candidate <= _COLOUR_HIGH)):
            return candidate
    return np.clip(colour + np.where(colour < 0.5, 1.0, -1.0) * distance, _COLOUR_LOW, _COLOUR_HIGH)


def _tint(rng: np.random.Generator) -> np.ndarray:
    """RGB direction of a pattern's swing, scaled to unit RMS per channel."""
    return _random_direction(rng) * math.sqrt(3.0)


def linear_ramp(height: int, width: int, angle: float) -> np.ndarray:
    """f32[H, W] ramp from -1 to 1 across the image along direction ``angle`` (radians)."""
    x, y = pixel_centres(height, width)
    cos, sin = math.cos(angle), math.sin(angle)
    projection = (x - width / 2.0) * cos + (y - height / 2.0) * sin
    half_extent = 0.5 * (abs(width * cos) + abs(height * sin))
    return np.broadcast_to(projection / half_extent, (height, width)).astype(np.float32)


def smooth_noise(rng: np.random.Generator, height: int, width: int, waves: int = 3) -> np.ndarray:
    """f32[H, W] sum of ``waves`` low-frequency plane sinusoids (0.5 to 3 cycles per image), scaled to [-1, 1]."""
    x, y = pixel_centres(height, width)
    side = float(max(height, width))
    field = np.zeros((height, width))
    for _ in range(waves):
        cycles = _uniform(rng, 0.5, 3.0)
        angle = _uniform(rng, 0.0, 2 * math.pi)
        phase = _uniform(rng, 0.0, 2 * math.pi)
        field = field + np.sin(2 * math.pi * cycles * (x * math.cos(angle) + y * math.sin(angle)) / side + phase)
    return (field / waves).astype(np.float32)


def stripes(rng: np.random.Generator, height: int, width: int, period_range=(4.0, 16.0)) -> np.ndarray:
    """f32[H, W] stripes of random angle and period (pixels), soft-edged square wave in [-1, 1]."""
    x, y = pixel_centres(height, width)
    period = _uniform(rng, *period_range)
    angle = _uniform(rng, 0.0, math.pi)
    phase = _uniform(rng, 0.0, 2 * math.pi)
    wave = np.sin(2 * math.pi * (x * math.cos(angle) + y * math.sin(angle)) / period + phase)
    return np.clip(2.5 * wave, -1.0, 1.0).astype(np.float32)


def checker(rng: np.random.Generator, height: int, width: int, cell_range=(4.0, 16.0)) -> np.ndarray:
    """f32[H, W] rotated checkerboard of random cell size (pixels), values in [-1, 1]."""
    x, y = pixel_centres(height, width)
    cell = _uniform(rng, *cell_range)
    angle = _uniform(rng, 0.0, math.pi / 2)
    u = x * math.cos(angle) + y * math.sin(angle)
    v = -x * math.sin(angle) + y * math.cos(angle)
    phase_u, phase_v = _uniform(rng, 0, math.pi), _uniform(rng, 0, math.pi)
    wave = np.sin(math.pi * u / cell + phase_u) * np.sin(math.pi * v / cell + phase_v)
    return np.clip(4.0 * wave, -1.0, 1.0).astype(np.float32)


def _upsampled_noise(rng: np.random.Generator, height: int, width: int, scale: float) -> np.ndarray:
    """Uniform [-1, 1] noise on a grid of spacing ``scale`` pixels, bilinearly interpolated to [H, W]."""
    rows = int(math.ceil(height / scale)) + 2
    cols = int(math.ceil(width / scale)) + 2
    grid = rng.uniform(-1.0, 1.0, (rows, cols))
    gy = (np.arange(height) + 0.5) / scale
    gx = (np.arange(width) + 0.5) / scale
    y0, x0 = np.floor(gy).astype(int), np.floor(gx).astype(int)
    fy, fx = (gy - y0)[:, None], (gx - x0)[None, :]
    top = grid[y0][:, x0] * (1 - fx) + grid[y0][:, x0 + 1] * fx
    bottom = grid[y0 + 1][:, x0] * (1 - fx) + grid[y0 + 1][:, x0 + 1] * fx
    return top * (1 - fy) + bottom * fy


def multiscale_noise(rng: np.random.Generator, height: int, width: int, scales=(3.0, 8.0, 20.0)) -> np.ndarray:
    """f32[H, W] sum of value noise at several scales (pixels, equal weights), scaled to [-1, 1]."""
    field = sum(_upsampled_noise(rng, height, width, scale) for scale in scales)
    peak = max(float(np.abs(field).max()), 1e-9)
    return (field / peak).astype(np.float32)


def pattern(kind: str, rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    """f32[H, W] pattern in [-1, 1] of a background/texture kind (``flat`` gives zeros)."""
    if kind == "flat":
        return np.zeros((height, width), np.float32)
    if kind == "gradient":
        return linear_ramp(height, width, _uniform(rng, 0.0, 2 * math.pi))
    if kind == "smooth_noise":
        return smooth_noise(rng, height, width)
    if kind == "stripes":
        return stripes(rng, height, width)
    if kind == "checker":
        return checker(rng, height, width)
    if kind == "noise":
        return multiscale_noise(rng, height, width)
    raise ValueError(f"unknown pattern kind {kind!r}; known: {', '.join(BACKGROUND_KINDS)}")


def paint(kind: str, rng: np.random.Generator, height: int, width: int, base, amplitude: float) -> np.ndarray:
    """f32[H, W, 3] paint field: ``base + amplitude * pattern(kind) * tint`` (not clipped).

    Args:
      kind: a `BACKGROUND_KINDS` entry, or ``"texture"`` (a random `TEXTURE_KINDS` entry).
      rng: random generator.
      height, width: size in pixels.
      base: RGB base colour in [0, 1].
      amplitude: RMS per-channel swing of the pattern (0 = flat).
    """
    if kind == "texture":
        kind = TEXTURE_KINDS[int(rng.integers(len(TEXTURE_KINDS)))]
    field = pattern(kind, rng, height, width)
    tint = _tint(rng).astype(np.float32)
    base = np.asarray(base, np.float32)
    return base[None, None, :] + np.float32(amplitude) * field[:, :, None] * tint[None, None, :]
