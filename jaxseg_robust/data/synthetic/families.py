"""Object families of graded difficulty: random geometry and each family's contract.

Every family draws a shape (see `geometry`) from a random generator at a scale
set by the image's shorter side ``s``, rasterises it, and checks the family's
*contract* on the exact mask; a draw that breaks it is discarded and drawn
again from the same generator (so the result is still a pure function of the
generator's seed). The contracts, which the tests check with independent
oracles:

============ =================================================== ============ ====== ====== ========
family       shapes                                               components   holes  border area
============ =================================================== ============ ====== ====== ========
convex       disc, ellipse, rounded_rectangle, convex_polygon     1            0      no     >= 2 %
thin         bar, curved_stroke, wavy_stroke (width 2-6 px)      1            0      no     any
ring         annulus, elliptic_ring, frame (thickness >= 3 px)   1            1      no     >= 2 %
multi_part   2-4 convex parts, >= 3 px apart (Chebyshev)          num_parts    0      no     >= 2 %
non_convex   star, c_shape, cross                                 1            0      no     >= 2 %
border       convex shape or star cut by 1 side or a corner       1            0      yes    >= 2 %
small        disc, ellipse, convex_polygon, star                  1            0      no     < 2 %
============ =================================================== ============ ====== ====== ========

Components are 8-connected, holes 4-connected background regions not
touching the image border; "border" = some mask pixel lies in the first or
last row or column; every object has at least `MIN_OBJECT_PIXELS` pixels.
Families other than ``border`` keep a margin of at least 2 px to the border.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from jaxseg_robust.data.synthetic import topology
from jaxseg_robust.data.synthetic.geometry import (
    Difference,
    Disc,
    Ellipse,
    Polygon,
    RoundedRectangle,
    Stroke,
    Union,
    annulus,
    rasterize,
    regular_star,
)

FAMILIES = ("convex", "thin", "ring", "multi_part", "non_convex", "border", "small")
FAMILY_SHAPES = {
    "convex": ("disc", "ellipse", "rounded_rectangle", "convex_polygon"),
    "thin": ("bar", "curved_stroke", "wavy_stroke"),
    "ring": ("annulus", "elliptic_ring", "frame"),
    "multi_part": ("parts",),
    "non_convex": ("star", "c_shape", "cross"),
    "border": ("disc", "ellipse", "rounded_rectangle", "convex_polygon", "star"),
    "small": ("disc", "ellipse", "convex_polygon", "star"),
}
# Intrinsic difficulty of a family for a click/box model (0 easiest); independent of
# the scene difficulty (contrast, background, distractors) of `scenes.DIFFICULTIES`.
FAMILY_DIFFICULTY = {"convex": 0, "non_convex": 1, "ring": 1, "border": 1, "thin": 2, "multi_part": 2, "small": 2}

MIN_OBJECT_PIXELS = 8
SMALL_AREA_FRACTION = 0.02
STROKE_WIDTH_RANGE = (2.0, 6.0)
PART_GAP = 3  # Chebyshev pixels of background between parts of a multi-part object
BORDER_MARGIN = 2  # pixels between a non-border object and the image border
MAX_ATTEMPTS = 200


class GenerationError(RuntimeError):
    """A family could not draw a shape meeting its contract (the image is too small for it)."""


@dataclasses.dataclass(frozen=True)
class ObjectGeometry:
    """One drawn object.

    Attributes:
      family: a `FAMILIES` entry.
      kind: the shape kind (a `FAMILY_SHAPES[family]` entry).
      shape: the shape (signed-distance object, see `geometry`).
      mask: bool[H, W] exact mask.
      coverage: f32[H, W] anti-aliased coverage (>= 0.5 exactly on the mask).
      num_parts: number of 8-connected components of the mask.
      stroke_width: stroke width in pixels (``thin`` family), else None.
    """

    family: str
    kind: str
    shape: object
    mask: np.ndarray
    coverage: np.ndarray
    num_parts: int = 1
    stroke_width: float | None = None


def _uniform(rng: np.random.Generator, low: float, high: float) -> float:
    return float(low + (high - low) * rng.random())


def _pick(rng: np.random.Generator, options):
    return options[int(rng.integers(len(options)))]


def _half_extents(shape) -> tuple[float, float, float, float]:
    """Distances from the origin to the four sides of a shape's bounds (left, top, right, bottom)."""
    x0, y0, x1, y1 = shape.bounds()
    return -x0, -y0, x1, y1


def place_inside(rng: np.random.Generator, shape, height: int, width: int, margin: float = BORDER_MARGIN):
    """The shape (drawn around the origin) moved to a uniform position keeping ``margin`` px to the border.

    Returns None when the shape does not fit.
    """
    left, top, right, bottom = _half_extents(shape)
    low_x, high_x = left + margin, width - right - margin
    low_y, high_y = top + margin, height - bottom - margin
    if high_x < low_x or high_y < low_y:
        return None
    return shape.moved(_uniform(rng, low_x, high_x), _uniform(rng, low_y, high_y))


def convex_polygon(rng: np.random.Generator, radius: float) -> Polygon:
    """Convex polygon with 5 to 9 vertices on an ellipse of semi-axes (radius, 0.6..1 radius), random rotation."""
    count = int(rng.integers(5, 10))
    minor = radius * _uniform(rng, 0.6, 1.0)
    rotation = _uniform(rng, 0, 2 * math.pi)
    cos, sin = math.cos(rotation), math.sin(rotation)
    vertices = []
    for k in range(count):
        theta = 2 * math.pi * (k + _uniform(rng, -0.3, 0.3)) / count
        px, py = radius * math.cos(theta), minor * math.sin(theta)
        vertices.append((px * cos - py * sin, px * sin + py * cos))
    return Polygon(tuple(vertices))


def convex_shape(rng: np.random.Generator, kind: str, radius: float):
    """A convex shape of a `FAMILY_SHAPES['convex']` kind and size ``radius`` (px), centred at the origin."""
    angle = _uniform(rng, 0, math.pi)
    if kind == "disc":
        return Disc(0.0, 0.0, radius)
    if kind == "ellipse":
        return Ellipse(0.0, 0.0, radius, radius * _uniform(rng, 0.4, 0.8), angle)
    if kind == "rounded_rectangle":
        half_width = radius * _uniform(rng, 0.6, 1.0)
        half_height = radius * _uniform(rng, 0.35, 0.9)
        corner = _uniform(rng, 0.0, 0.5) * min(half_width, half_height)
        return RoundedRectangle(0.0, 0.0, half_width, half_height, corner, angle)
    if kind == "convex_polygon":
        return convex_polygon(rng, radius)
    raise ValueError(f"unknown convex kind {kind!r}")


def star_shape(rng: np.random.Generator, radius: float, inner_ratio=(0.4, 0.6), points=(5, 8)) -> Polygon:
    """Star polygon (``points`` tips, inner/outer radius ratio in ``inner_ratio``) centred at the origin."""
    count = int(rng.integers(points[0], points[1] + 1))
    return regular_star(0.0, 0.0, radius, radius * _uniform(rng, *inner_ratio), count, _uniform(rng, 0, 2 * math.pi))


def _rotate_points(points, angle: float):
    cos, sin = math.cos(angle), math.sin(angle)
    return tuple((px * cos - py * sin, px * sin + py * cos) for px, py in points)


def thin_shape(rng: np.random.Generator, kind: str, length: float, stroke_width: float):
    """A thin shape of width ``stroke_width`` and length about ``length`` (px), centred at the origin."""
    half = stroke_width / 2.0
    angle = _uniform(rng, 0, math.pi)
    if kind == "bar":
        return RoundedRectangle(0.0, 0.0, length / 2.0, half, 0.0, angle)
    if kind == "curved_stroke":
        bend = _uniform(rng, 0.2, 0.45) * length * (1 if rng.random() < 0.5 else -1)
        control = (_uniform(rng, -0.25, 0.25) * length, bend)
        start, end = (-length / 2.0, 0.0), (length / 2.0, 0.0)
        t = np.linspace(0.0, 1.0, 25)
        xs = (1 - t) ** 2 * start[0] + 2 * (1 - t) * t * control[0] + t**2 * end[0]
        ys = (1 - t) ** 2 * start[1] + 2 * (1 - t) * t * control[1] + t**2 * end[1]
        points = tuple(zip(xs.tolist(), (ys - ys.mean()).tolist()))
        return Stroke(_rotate_points(points, angle), half)
    if kind == "wavy_stroke":
        amplitude = _uniform(rng, 0.05, 0.1) * length
        cycles = _uniform(rng, 1.0, 1.5)
        phase = _uniform(rng, 0, 2 * math.pi)
        xs = np.linspace(-length / 2.0, length / 2.0, 33)
        ys = amplitude * np.sin(2 * math.pi * cycles * xs / length + phase)
        return Stroke(_rotate_points(tuple(zip(xs.tolist(), ys.tolist())), angle), half)
    raise ValueError(f"unknown thin kind {kind!r}")


def ring_shape(rng: np.random.Generator, kind: str, radius: float, thickness: float):
    """A ring of outer size ``radius`` and band ``thickness`` (px), centred at the origin; None if no hole is left."""
    angle = _uniform(rng, 0, math.pi)
    if kind == "annulus":
        inner = (radius - thickness,)
        shape = annulus(0.0, 0.0, radius - thickness, radius) if min(inner) >= 1.0 else None
    elif kind == "elliptic_ring":
        minor = radius * _uniform(rng, 0.55, 0.85)
        inner = (radius - thickness, minor - thickness)
        shape = Difference(Ellipse(0.0, 0.0, radius, minor, angle),
                           Ellipse(0.0, 0.0, radius - thickness, minor - thickness, angle))
    elif kind == "frame":
        half_width, half_height = radius, radius * _uniform(rng, 0.55, 1.0)
        corner = _uniform(rng, 0.0, 0.4) * half_height
        inner = (half_width - thickness, half_height - thickness)
        shape = Difference(
            RoundedRectangle(0.0, 0.0, half_width, half_height, corner, angle),
            RoundedRectangle(0.0, 0.0, half_width - thickness, half_height - thickness,
                             max(0.0, corner - thickness), angle))
    else:
        raise ValueError(f"unknown ring kind {kind!r}")
    return shape if min(inner) >= 1.0 else None


def non_convex_shape(rng: np.random.Generator, kind: str, radius: float):
    """A non-convex shape (star, C, cross) of size ``radius`` (px), centred at the origin."""
    angle = _uniform(rng, 0, 2 * math.pi)
    if kind == "star":
        return star_shape(rng, radius)
    if kind == "c_shape":
        inner = radius * _uniform(rng, 0.45, 0.6)
        half_gap = _uniform(rng, 0.35, 0.8)
        far = 2.0 * radius
        wedge = Polygon(((0.0, 0.0),
                         (far * math.cos(angle - half_gap), far * math.sin(angle - half_gap)),
                         (far * math.cos(angle + half_gap), far * math.sin(angle + half_gap))))
        return Difference(annulus(0.0, 0.0, inner, radius), wedge)
    if kind == "cross":
        arm = radius * _uniform(rng, 0.22, 0.38)
        r = radius
        outline = ((arm, arm), (r, arm), (r, -arm), (arm, -arm), (arm, -r), (-arm, -r), (-arm, -arm),
                   (-r, -arm), (-r, arm), (-arm, arm), (-arm, r), (arm, r))
        return Polygon(_rotate_points(outline, angle))
    raise ValueError(f"unknown non-convex kind {kind!r}")


def small_shape(rng: np.random.Generator, kind: str, area: float):
    """A small shape of about ``area`` px^2, centred at the origin."""
    if kind == "disc":
        return Disc(0.0, 0.0, math.sqrt(area / math.pi))
    if kind == "ellipse":
        ratio = _uniform(rng, 0.5, 0.9)
        major = math.sqrt(area / (math.pi * ratio))
        return Ellipse(0.0, 0.0, major, major * ratio, _uniform(rng, 0, math.pi))
    if kind == "convex_polygon":
        return convex_polygon(rng, 1.15 * math.sqrt(area / math.pi))
    if kind == "star":
        ratio = _uniform(rng, 0.5, 0.65)
        count = int(rng.integers(5, 7))
        outer = math.sqrt(area / (count * ratio * math.sin(math.pi / count)))
        return regular_star(0.0, 0.0, outer, outer * ratio, count, _uniform(rng, 0, 2 * math.pi))
    raise ValueError(f"unknown small kind {kind!r}")


def _cut_by_border(rng: np.random.Generator, shape, height: int, width: int):
    """The shape moved so that 25-60 % of its extent lies beyond one side (70 %) or a corner (30 %)."""
    left, top, right, bottom = _half_extents(shape)
    sides = ("left", "right", "top", "bottom")
    cut = {_pick(rng, sides)}
    if rng.random() < 0.3:
        cut.add(_pick(rng, ("top", "bottom") if cut & {"left", "right"} else ("left", "right")))

    def along(axis_low, axis_high, size, low_side, high_side):
        extent = axis_low + axis_high
        fraction = _uniform(rng, 0.25, 0.6)
        if low_side in cut:
            return extent * fraction - axis_high
        if high_side in cut:
            return size - extent * fraction + axis_low
        low, high = axis_low + BORDER_MARGIN, size - axis_high - BORDER_MARGIN
        return _uniform(rng, low, high) if high >= low else _uniform(rng, 0, size)

    cx = along(left, right, width, "left", "right")
    cy = along(top, bottom, height, "top", "bottom")
    return shape.moved(cx, cy)


def _draw_multi_part(rng: np.random.Generator, height: int, width: int):
    """2-4 convex parts near each other, at least `PART_GAP` px apart; None when they do not fit."""
    side = min(height, width)
    count = int(rng.integers(2, 5))
    radius = side * _uniform(rng, 0.08, 0.14) * (0.85 if count == 4 else 1.0)
    spread = 0.3 * side
    centre = (_uniform(rng, spread, width - spread), _uniform(rng, spread, height - spread))
    parts, union = [], np.zeros((height, width), bool)
    for _ in range(count):
        for _try in range(40):
            part = convex_shape(rng, _pick(rng, FAMILY_SHAPES["convex"]), radius * _uniform(rng, 0.7, 1.2))
            left, top, right, bottom = _half_extents(part)
            cx = _uniform(rng, max(left + BORDER_MARGIN, centre[0] - spread),
                          min(width - right - BORDER_MARGIN, centre[0] + spread))
            cy = _uniform(rng, max(top + BORDER_MARGIN, centre[1] - spread),
                          min(height - bottom - BORDER_MARGIN, centre[1] + spread))
            part = part.moved(cx, cy)
            part_mask = rasterize(part, height, width)[0]
            if part_mask.any() and not (part_mask & topology.dilate(union, PART_GAP)).any():
                parts.append(part)
                union |= part_mask
                break
        else:
            return None
    return Union(tuple(parts)), count


def _draw(rng: np.random.Generator, family: str, height: int, width: int):
    """One unchecked draw: ``(kind, shape, num_parts, stroke_width)`` or None when it does not fit."""
    side = min(height, width)
    if family == "multi_part":
        drawn = _draw_multi_part(rng, height, width)
        return None if drawn is None else ("parts", drawn[0], drawn[1], None)
    kind = _pick(rng, FAMILY_SHAPES[family])
    stroke_width = None
    if family == "convex":
        shape = convex_shape(rng, kind, side * _uniform(rng, 0.15, 0.32))
    elif family == "thin":
        stroke_width = _uniform(rng, *STROKE_WIDTH_RANGE)
        shape = thin_shape(rng, kind, side * _uniform(rng, 0.45, 0.85), stroke_width)
    elif family == "ring":
        radius = side * _uniform(rng, 0.18, 0.32)
        shape = ring_shape(rng, kind, radius, max(3.0, radius * _uniform(rng, 0.2, 0.45)))
        if shape is None:
            return None
    elif family == "non_convex":
        shape = non_convex_shape(rng, kind, side * _uniform(rng, 0.2, 0.33))
    elif family == "border":
        radius = side * _uniform(rng, 0.2, 0.35)
        shape = star_shape(rng, radius) if kind == "star" else convex_shape(rng, kind, radius)
        return kind, _cut_by_border(rng, shape, height, width), 1, None
    elif family == "small":
        shape = small_shape(rng, kind, height * width * _uniform(rng, 0.003, 0.015))
    else:
        raise ValueError(f"unknown family {family!r}; known: {', '.join(FAMILIES)}")
    placed = place_inside(rng, shape, height, width)
    return None if placed is None else (kind, placed, 1, stroke_width)


def contract_violation(family: str, mask: np.ndarray, num_parts: int = 1) -> str | None:
    """Why a mask breaks its family's contract (see the module docstring), or None when it meets it.

    Args:
      family: a `FAMILIES` entry.
      mask: bool[H, W] object mask.
      num_parts: the stated number of parts (``multi_part``; 1 otherwise).
    """
    height, width = mask.shape
    area = int(mask.sum())
    if area < MIN_OBJECT_PIXELS:
        return f"area {area} < {MIN_OBJECT_PIXELS} px"
    fraction = area / float(height * width)
    if family == "small" and fraction >= SMALL_AREA_FRACTION:
        return f"small object covers {fraction:.3%} >= {SMALL_AREA_FRACTION:.0%}"
    if family not in ("small", "thin") and fraction < SMALL_AREA_FRACTION:
        return f"{family} object covers {fraction:.3%} < {SMALL_AREA_FRACTION:.0%}"
    on_border = topology.touches_border(mask)
    if family == "border" and not on_border:
        return "border object does not touch the border"
    if family != "border" and topology.touches_border(topology.dilate(mask, BORDER_MARGIN - 1)):
        return f"object closer than {BORDER_MARGIN} px to the border"
    components = topology.count_components(mask, 8)
    if components != num_parts:
        return f"{components} components, expected {num_parts}"
    holes = topology.count_holes(mask)
    expected_holes = 1 if family == "ring" else 0
    if holes != expected_holes:
        return f"{holes} holes, expected {expected_holes}"
    return None


def draw_object(rng: np.random.Generator, family: str, height: int, width: int) -> ObjectGeometry:
    """Draws an object of a family that meets the family's contract.

    Args:
      rng: random generator (consumed; the result is a function of its state).
      family: a `FAMILIES` entry.
      height, width: image size in pixels.

    Returns:
      The `ObjectGeometry`.

    Raises:
      ValueError: unknown family.
      GenerationError: no valid draw in `MAX_ATTEMPTS` tries (image too small).
    """
    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}; known: {', '.join(FAMILIES)}")
    last_reason = "the shape did not fit in the image"
    for _ in range(MAX_ATTEMPTS):
        drawn = _draw(rng, family, height, width)
        if drawn is None:
            continue
        kind, shape, num_parts, stroke_width = drawn
        mask, coverage = rasterize(shape, height, width)
        reason = contract_violation(family, mask, num_parts)
        if reason is None:
            return ObjectGeometry(family, kind, shape, mask, coverage, num_parts, stroke_width)
        last_reason = reason
    raise GenerationError(f"family {family!r}: no valid {height}x{width} object in {MAX_ATTEMPTS} draws "
                          f"(last: {last_reason})")
