"""One synthetic sample: an object of a family on a background, at a scene difficulty.

`render_sample(seed, index, family, difficulty, size)` is a pure function of
its arguments. Its random streams are children of
``SeedSequence([STREAM_TAG, seed, index])``: one for the object's geometry,
one for the appearance, one for distractors, one for pixel noise. So the
*same* object geometry is drawn at every difficulty (a matched ladder), and
a sample never depends on which other samples are generated.

Scene difficulty (`DIFFICULTIES`, independent of the family's own difficulty):

======== ============ ===================================== ============= ===================== ======
level    contrast     background (amplitude)                object paint  distractors           noise
======== ============ ===================================== ============= ===================== ======
easy     0.35 - 0.50  flat or gradient (<= 0.05)            flat          none                  none
medium   0.18 - 0.30  gradient or smooth noise (0.04-0.08)  flat/gradient 1-2, colour 0.10-0.20  2/255
                                                                          from the object's
hard     0.07 - 0.15  stripes, checker, multi-scale noise   gradient or   1-3, the object's own 3/255
                      or smooth noise (0.04-0.09)           texture       paint
======== ============ ===================================== ============= ===================== ======

Contrast is the RMS per-channel difference between the object's and the
background's base colours (`appearance.colour_contrast`). Distractors are
shapes (convex, star or cross) of a size like the object's; their painted
pixels (coverage > 0) stay at least `DISTRACTOR_GAP` + 1 px (Chebyshev) away
from the object mask, so they never overlap it nor blur into it; a
distractor that finds no room is left out (``num_distractors`` counts those drawn).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from jaxseg_robust.data.instances import Instance, make_instance
from jaxseg_robust.data.synthetic import appearance, families, topology
from jaxseg_robust.data.synthetic.geometry import rasterize
from jaxseg_robust.data.synthetic.prompts import gt_tight_box

STREAM_TAG = 0x5EEDDA7A
DIFFICULTIES = ("easy", "medium", "hard")
DISTRACTOR_GAP = 3
MIN_SIDE = 32
MAX_SIDE = 1024
_DISTRACTOR_TRIES = 30
_DISTRACTOR_KINDS = ("disc", "ellipse", "rounded_rectangle", "convex_polygon", "star", "cross")


@dataclasses.dataclass(frozen=True)
class Level:
    """Scene parameters of one difficulty level (ranges are drawn uniformly)."""

    contrast: tuple[float, float]
    backgrounds: tuple[str, ...]
    background_amplitude: tuple[float, float]
    appearances: tuple[str, ...]
    object_amplitude: tuple[float, float]
    distractors: tuple[int, int]  # inclusive range of the number tried
    distractor_colour_distance: tuple[float, float] | None  # None: the object's own paint
    noise_sigma: float  # per channel, in [0, 1] units


LEVELS = {
    "easy": Level((0.35, 0.5), ("flat", "gradient"), (0.0, 0.05), ("flat",), (0.0, 0.0), (0, 0), None, 0.0),
    "medium": Level((0.18, 0.3), ("gradient", "smooth_noise"), (0.04, 0.08), ("flat", "gradient"), (0.03, 0.06),
                    (1, 2), (0.10, 0.20), 2.0 / 255.0),
    "hard": Level((0.07, 0.15), ("stripes", "checker", "noise", "smooth_noise"), (0.04, 0.09),
                  ("gradient", "texture"), (0.04, 0.08), (1, 3), None, 3.0 / 255.0),
}


@dataclasses.dataclass(frozen=True, eq=False)
class SyntheticSample:
    """One generated image with its exact object mask and what it was made of.

    Attributes:
      seed, index: the sample's address (`render_sample` arguments).
      family: object family (`families.FAMILIES`); kind: its shape kind.
      difficulty: scene level (`DIFFICULTIES`).
      image: uint8[H, W, 3] RGB.
      mask: bool[H, W] exact object mask (pixel centres inside the shape).
      distractor_mask: bool[H, W] union of the distractors' exact masks
        (disjoint from ``mask`` with a gap; not part of the object).
      num_parts: 8-connected components of ``mask``.
      num_distractors: distractors painted.
      contrast: RMS per-channel difference of object and background base colours.
      background, appearance: background kind and object paint kind.
      stroke_width: stroke width in px for the ``thin`` family, else None.
    """

    seed: int
    index: int
    family: str
    kind: str
    difficulty: str
    image: np.ndarray
    mask: np.ndarray
    distractor_mask: np.ndarray
    num_parts: int
    num_distractors: int
    contrast: float
    background: str
    appearance: str
    stroke_width: float | None = None

    @property
    def size(self) -> tuple[int, int]:
        """(H, W) in pixels."""
        return (int(self.image.shape[0]), int(self.image.shape[1]))

    @property
    def id(self) -> str:
        """Instance id ``"<index:06d>_<family>_<difficulty>"`` (unique per index)."""
        return f"{self.index:06d}_{self.family}_{self.difficulty}"

    @property
    def box(self) -> np.ndarray:
        """int32[4] tight box (x1, y1, x2, y2) of ``mask`` in inclusive pixel indices (`gt_tight_box`)."""
        return gt_tight_box(self.mask)

    def to_instance(self, dataset: str = "synthetic") -> Instance:
        """The sample as a validated `Instance` (gt int8: 1 object, 0 background)."""
        return make_instance(self.id, self.image, self.mask, dataset=dataset)


def _uniform(rng: np.random.Generator, low: float, high: float) -> float:
    return float(low + (high - low) * rng.random())


def _pick(rng: np.random.Generator, options):
    return options[int(rng.integers(len(options)))]


def check_size(size) -> tuple[int, int]:
    """``(H, W)`` from an int (square) or a pair; both sides in [`MIN_SIDE`, `MAX_SIDE`].

    Raises:
      ValueError: naming ``size``.
    """
    if isinstance(size, (int, np.integer)) and not isinstance(size, bool):
        pair = (int(size), int(size))
    elif isinstance(size, (tuple, list)) and len(size) == 2 and all(
            isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in size):
        pair = (int(size[0]), int(size[1]))
    else:
        raise ValueError(f"size must be an int or an (H, W) pair of ints, got {size!r}")
    if not all(MIN_SIDE <= v <= MAX_SIDE for v in pair):
        raise ValueError(f"size sides must be in [{MIN_SIDE}, {MAX_SIDE}] px, got {pair}")
    return pair


def sample_streams(seed: int, index: int) -> tuple[np.random.Generator, ...]:
    """The four generators (geometry, appearance, distractors, noise) of sample ``(seed, index)``."""
    for name, value in (("seed", seed), ("index", index)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
            raise ValueError(f"{name} must be a non-negative int, got {value!r}")
    children = np.random.SeedSequence([STREAM_TAG, int(seed), int(index)]).spawn(4)
    return tuple(np.random.Generator(np.random.PCG64(child)) for child in children)


def _distractor_shape(rng: np.random.Generator, family: str, side: int):
    kind = _pick(rng, _DISTRACTOR_KINDS)
    scale = (0.04, 0.08) if family == "small" else (0.07, 0.16)
    radius = side * _uniform(rng, *scale)
    if kind == "star":
        return families.star_shape(rng, radius)
    if kind == "cross":
        return families.non_convex_shape(rng, "cross", radius)
    return families.convex_shape(rng, kind, radius)


def draw_distractors(rng: np.random.Generator, family: str, object_mask: np.ndarray, count: int):
    """Up to ``count`` distractor shapes whose painted pixels keep away from ``object_mask``.

    Args:
      rng: random generator.
      family: the object's family (sets the distractors' size).
      object_mask: bool[H, W] exact object mask.
      count: number of distractors to try to place.

    Returns:
      list of ``(mask bool[H, W], coverage f32[H, W])``: every coverage is 0
      on the object mask dilated by `DISTRACTOR_GAP` px (Chebyshev).
    """
    height, width = object_mask.shape
    keep_out = topology.dilate(object_mask, DISTRACTOR_GAP)
    placed = []
    for _ in range(count):
        for _try in range(_DISTRACTOR_TRIES):
            shape = _distractor_shape(rng, family, min(height, width))
            shape = shape.moved(_uniform(rng, 0, width), _uniform(rng, 0, height))
            mask, coverage = rasterize(shape, height, width)
            if mask.sum() >= families.MIN_OBJECT_PIXELS and not (keep_out & (coverage > 0)).any():
                placed.append((mask, coverage))
                break
    return placed


def _composite(canvas: np.ndarray, coverage: np.ndarray, paint: np.ndarray) -> np.ndarray:
    alpha = coverage[:, :, None]
    return canvas + alpha * (paint - canvas)


def render_sample(seed: int, index: int, family: str, difficulty: str, size,
                  contrast: float | None = None) -> SyntheticSample:
    """Renders sample ``(seed, index)`` of a given family, difficulty and size.

    Args:
      seed, index: non-negative ints addressing the sample.
      family: a `families.FAMILIES` entry.
      difficulty: a `DIFFICULTIES` entry.
      size: image size, an int (square) or ``(H, W)``; sides in [32, 1024] px.
      contrast: optional object/background contrast in (0, 0.9] replacing the
        level's random one (everything else is drawn as without it).

    Returns:
      The `SyntheticSample`; identical bytes for identical arguments.

    Raises:
      ValueError: bad argument, naming it.
    """
    if family not in families.FAMILIES:
        raise ValueError(f"family must be one of {families.FAMILIES}, got {family!r}")
    if difficulty not in LEVELS:
        raise ValueError(f"difficulty must be one of {DIFFICULTIES}, got {difficulty!r}")
    height, width = check_size(size)
    geometry_rng, appearance_rng, distractor_rng, noise_rng = sample_streams(seed, index)
    level = LEVELS[difficulty]

    obj = families.draw_object(geometry_rng, family, height, width)

    if contrast is not None and (isinstance(contrast, bool) or not isinstance(contrast, (int, float))
                                 or not 0 < contrast <= 0.9):
        raise ValueError(f"contrast must be a number in (0, 0.9] or None, got {contrast!r}")
    drawn_contrast = _uniform(appearance_rng, *level.contrast)
    contrast = drawn_contrast if contrast is None else float(contrast)
    background_colour, object_colour = appearance.colour_pair(appearance_rng, contrast)
    background_kind = _pick(appearance_rng, level.backgrounds)
    appearance_kind = _pick(appearance_rng, level.appearances)
    canvas = appearance.paint(background_kind, appearance_rng, height, width, background_colour,
                              _uniform(appearance_rng, *level.background_amplitude))
    object_paint = appearance.paint(appearance_kind, appearance_rng, height, width, object_colour,
                                    _uniform(appearance_rng, *level.object_amplitude))

    count = int(distractor_rng.integers(level.distractors[0], level.distractors[1] + 1))
    distractors = draw_distractors(distractor_rng, family, obj.mask, count)
    distractor_mask = np.zeros((height, width), bool)
    for mask, coverage in distractors:
        if level.distractor_colour_distance is None:
            paint = object_paint
        else:
            colour = appearance.colour_near(distractor_rng, object_colour,
                                            _uniform(distractor_rng, *level.distractor_colour_distance))
            paint = appearance.paint(appearance_kind, distractor_rng, height, width, colour,
                                     _uniform(distractor_rng, *level.object_amplitude))
        canvas = _composite(canvas, coverage, paint)
        distractor_mask |= mask
    canvas = _composite(canvas, obj.coverage, object_paint)
    if level.noise_sigma > 0:
        canvas = canvas + np.float32(level.noise_sigma) * noise_rng.standard_normal(canvas.shape, dtype=np.float32)
    image = np.rint(np.clip(canvas, 0.0, 1.0) * 255.0).astype(np.uint8)

    return SyntheticSample(
        seed=int(seed), index=int(index), family=family, kind=obj.kind, difficulty=difficulty,
        image=image, mask=obj.mask, distractor_mask=distractor_mask, num_parts=obj.num_parts,
        num_distractors=len(distractors), contrast=float(contrast), background=background_kind,
        appearance=appearance_kind, stroke_width=obj.stroke_width)


def measured_contrast(sample: SyntheticSample, band: int = 2) -> float:
    """RMS per-channel difference of the mean image colour on the object and on the clear background.

    The object's pixels next to (8-neighbours of) the background, and the
    background within ``band`` px (Chebyshev) of the object's or a
    distractor's mask, are left out (their colour is blended). Returns NaN
    when either region is empty.
    """
    image = sample.image.astype(np.float64) / 255.0
    inner = sample.mask & ~topology.dilate(~sample.mask, 1)
    outer = ~topology.dilate(sample.mask | sample.distractor_mask, band)
    if not inner.any() or not outer.any():
        return math.nan
    return appearance.colour_contrast(image[inner].mean(axis=0), image[outer].mean(axis=0))
