"""Shapes given by signed distances, rasterised into exact masks and consistent coverage.

Coordinates are continuous image coordinates in pixels: ``x`` to the right,
``y`` down; pixel ``(row r, column c)`` covers ``[c, c+1) x [r, r+1)`` and its
centre is ``(x, y) = (c + 0.5, r + 0.5)`` (the +0.5 convention of the SAM
point encoder).

A shape is any object with
  * ``signed_distance(x, y) -> f64[...]``: distance in pixels to the shape's
    boundary, negative inside (exact for discs, rounded rectangles,
    polygons and strokes; first-order for ellipses; the set operations below
    keep the sign exact and the magnitude a good approximation near edges);
  * ``bounds() -> (x0, y0, x1, y1)``: a box holding every point with
    ``signed_distance <= 0`` (the mask never extends past it);
  * ``moved(dx, dy)``: the same shape translated by (dx, dy) pixels.

The **mask** of a shape is the set of pixel centres with signed distance
``<= 0``. The **coverage** (the anti-aliased alpha the image is painted with)
is ``clip(0.5 - signed_distance, 0, 1)`` at the pixel centre, clamped so that
``coverage >= 0.5`` exactly on the mask and ``< 0.5`` off it: thresholding the
painted alpha at one half gives back the mask.
"""

from __future__ import annotations

import dataclasses
import math
import numpy as np

# Pixels beyond a shape's bounds that still get (anti-aliased) coverage.
_COVERAGE_MARGIN = 3
_BELOW_HALF = np.nextafter(np.float32(0.5), np.float32(0.0))


def pixel_centres(height: int, width: int, window=None) -> tuple[np.ndarray, np.ndarray]:
    """Pixel-centre coordinates of an image (or of a window of it), ready to broadcast.

    Args:
      height, width: image size in pixels.
      window: optional ``(row0, row1, col0, col1)`` half-open window.

    Returns:
      ``(x f64[1, w], y f64[h, 1])`` with ``x = col + 0.5``, ``y = row + 0.5``.
    """
    row0, row1, col0, col1 = window if window is not None else (0, height, 0, width)
    x = (np.arange(col0, col1, dtype=np.float64) + 0.5)[None, :]
    y = (np.arange(row0, row1, dtype=np.float64) + 0.5)[:, None]
    return x, y


def _rotate_into(x, y, cx: float, cy: float, angle: float):
    """Coordinates of (x, y) in the frame centred at (cx, cy) and rotated by ``angle`` radians."""
    dx, dy = x - cx, y - cy
    cos, sin = math.cos(angle), math.sin(angle)
    return dx * cos + dy * sin, -dx * sin + dy * cos


def _rotated_half_extents(half_u: float, half_v: float, angle: float) -> tuple[float, float]:
    """Half width and height of the axis-aligned box around a rotated box of half sides (u, v)."""
    cos, sin = abs(math.cos(angle)), abs(math.sin(angle))
    return half_u * cos + half_v * sin, half_u * sin + half_v * cos


@dataclasses.dataclass(frozen=True)
class Disc:
    """Closed disc of centre (cx, cy) and radius ``radius`` (pixels)."""

    cx: float
    cy: float
    radius: float

    def signed_distance(self, x, y) -> np.ndarray:
        """Exact signed distance (pixels, negative inside)."""
        return np.hypot(x - self.cx, y - self.cy) - self.radius

    def bounds(self) -> tuple[float, float, float, float]:
        """(x0, y0, x1, y1) box holding the disc."""
        return (self.cx - self.radius, self.cy - self.radius, self.cx + self.radius, self.cy + self.radius)

    def moved(self, dx: float, dy: float) -> Disc:
        """The disc translated by (dx, dy)."""
        return dataclasses.replace(self, cx=self.cx + dx, cy=self.cy + dy)


@dataclasses.dataclass(frozen=True)
class Ellipse:
    """Closed ellipse: centre (cx, cy), semi-axes ``a`` (along ``angle``) and ``b``, ``angle`` in radians."""

    cx: float
    cy: float
    a: float
    b: float
    angle: float = 0.0

    def signed_distance(self, x, y) -> np.ndarray:
        """Signed distance to first order, ``(k - 1) / |grad k|`` with ``k = |(u/a, v/b)|`` (sign exact)."""
        u, v = _rotate_into(x, y, self.cx, self.cy, self.angle)
        k = np.hypot(u / self.a, v / self.b)
        gradient = np.hypot(u / self.a**2, v / self.b**2)
        with np.errstate(divide="ignore", invalid="ignore"):
            distance = k * (k - 1.0) / gradient
        return np.where(gradient > 0, distance, -min(self.a, self.b))

    def bounds(self) -> tuple[float, float, float, float]:
        """(x0, y0, x1, y1) box holding the ellipse."""
        cos, sin = math.cos(self.angle), math.sin(self.angle)
        half_x = math.sqrt((self.a * cos) ** 2 + (self.b * sin) ** 2)
        half_y = math.sqrt((self.a * sin) ** 2 + (self.b * cos) ** 2)
        return (self.cx - half_x, self.cy - half_y, self.cx + half_x, self.cy + half_y)

    def moved(self, dx: float, dy: float) -> Ellipse:
        """The ellipse translated by (dx, dy)."""
        return dataclasses.replace(self, cx=self.cx + dx, cy=self.cy + dy)


@dataclasses.dataclass(frozen=True)
class RoundedRectangle:
    """Closed rectangle of half sides (half_width along ``angle``, half_height), corners rounded by ``radius``.

    ``radius = 0`` gives a sharp rectangle (a bar when one side is thin);
    ``radius <= min(half_width, half_height)``.
    """

    cx: float
    cy: float
    half_width: float
    half_height: float
    radius: float = 0.0
    angle: float = 0.0

    def signed_distance(self, x, y) -> np.ndarray:
        """Exact signed distance (pixels, negative inside)."""
        u, v = _rotate_into(x, y, self.cx, self.cy, self.angle)
        qu = np.abs(u) - (self.half_width - self.radius)
        qv = np.abs(v) - (self.half_height - self.radius)
        outside = np.hypot(np.maximum(qu, 0.0), np.maximum(qv, 0.0))
        inside = np.minimum(np.maximum(qu, qv), 0.0)
        return outside + inside - self.radius

    def bounds(self) -> tuple[float, float, float, float]:
        """(x0, y0, x1, y1) box holding the rectangle."""
        half_x, half_y = _rotated_half_extents(self.half_width, self.half_height, self.angle)
        return (self.cx - half_x, self.cy - half_y, self.cx + half_x, self.cy + half_y)

    def moved(self, dx: float, dy: float) -> RoundedRectangle:
        """The rectangle translated by (dx, dy)."""
        return dataclasses.replace(self, cx=self.cx + dx, cy=self.cy + dy)


def _segment_squared_distance(x, y, ax, ay, bx, by) -> np.ndarray:
    """Squared distance from points (x, y) to the closed segment (a, b)."""
    ex, ey = bx - ax, by - ay
    wx, wy = x - ax, y - ay
    length2 = ex * ex + ey * ey
    t = np.clip((wx * ex + wy * ey) / length2, 0.0, 1.0) if length2 > 0 else 0.0
    return (wx - t * ex) ** 2 + (wy - t * ey) ** 2


@dataclasses.dataclass(frozen=True)
class Polygon:
    """Closed simple polygon with vertices ``((x0, y0), (x1, y1), ...)`` in order (either orientation).

    Inside is decided by the even-odd rule; the distance is the exact distance
    to the nearest edge, so points on an edge are inside.
    """

    vertices: tuple[tuple[float, float], ...]

    def __post_init__(self):
        if len(self.vertices) < 3:
            raise ValueError(f"vertices must hold at least 3 points, got {len(self.vertices)}")

    def signed_distance(self, x, y) -> np.ndarray:
        """Exact signed distance (pixels, negative inside)."""
        squared = None
        inside = np.zeros(np.broadcast_shapes(np.shape(x), np.shape(y)), dtype=bool)
        count = len(self.vertices)
        for i in range(count):
            ax, ay = self.vertices[i]
            bx, by = self.vertices[(i + 1) % count]
            d2 = _segment_squared_distance(x, y, ax, ay, bx, by)
            squared = d2 if squared is None else np.minimum(squared, d2)
            if ay != by:
                straddles = (ay > y) != (by > y)
                crossing_x = ax + (bx - ax) * (y - ay) / (by - ay)
                inside ^= straddles & (x < crossing_x)
        distance = np.sqrt(squared)
        return np.where(inside, -distance, distance)

    def bounds(self) -> tuple[float, float, float, float]:
        """(x0, y0, x1, y1) box of the vertices."""
        xs = [vx for vx, _ in self.vertices]
        ys = [vy for _, vy in self.vertices]
        return (min(xs), min(ys), max(xs), max(ys))

    def moved(self, dx: float, dy: float) -> Polygon:
        """The polygon translated by (dx, dy)."""
        return Polygon(tuple((vx + dx, vy + dy) for vx, vy in self.vertices))


@dataclasses.dataclass(frozen=True)
class Stroke:
    """Points within ``half_width`` of an open polyline ``points`` (a thick curve with round caps)."""

    points: tuple[tuple[float, float], ...]
    half_width: float

    def __post_init__(self):
        if len(self.points) < 2:
            raise ValueError(f"points must hold at least 2 points, got {len(self.points)}")

    def signed_distance(self, x, y) -> np.ndarray:
        """Exact signed distance (pixels, negative inside)."""
        squared = None
        for (ax, ay), (bx, by) in zip(self.points[:-1], self.points[1:]):
            d2 = _segment_squared_distance(x, y, ax, ay, bx, by)
            squared = d2 if squared is None else np.minimum(squared, d2)
        return np.sqrt(squared) - self.half_width

    def bounds(self) -> tuple[float, float, float, float]:
        """(x0, y0, x1, y1) box of the points widened by the half width."""
        xs = [px for px, _ in self.points]
        ys = [py for _, py in self.points]
        h = self.half_width
        return (min(xs) - h, min(ys) - h, max(xs) + h, max(ys) + h)

    def moved(self, dx: float, dy: float) -> Stroke:
        """The stroke translated by (dx, dy)."""
        return Stroke(tuple((px + dx, py + dy) for px, py in self.points), self.half_width)


@dataclasses.dataclass(frozen=True)
class Union:
    """Points inside any of ``parts`` (signed distance = minimum of the parts')."""

    parts: tuple

    def __post_init__(self):
        if not self.parts:
            raise ValueError("parts must not be empty")

    def signed_distance(self, x, y) -> np.ndarray:
        """Minimum of the parts' signed distances."""
        distances = [part.signed_distance(x, y) for part in self.parts]
        return np.minimum.reduce(np.broadcast_arrays(*distances))

    def bounds(self) -> tuple[float, float, float, float]:
        """Box around all parts' boxes."""
        boxes = np.array([part.bounds() for part in self.parts])
        return (boxes[:, 0].min(), boxes[:, 1].min(), boxes[:, 2].max(), boxes[:, 3].max())

    def moved(self, dx: float, dy: float) -> Union:
        """Every part translated by (dx, dy)."""
        return Union(tuple(part.moved(dx, dy) for part in self.parts))


@dataclasses.dataclass(frozen=True)
class Difference:
    """Points inside ``keep`` and outside the interior of ``remove`` (signed distance ``max(d_keep, -d_remove)``).

    Points on ``remove``'s boundary stay in (an annulus is ``r_in <= d <= r_out``).
    """

    keep: object
    remove: object

    def signed_distance(self, x, y) -> np.ndarray:
        """``max(d_keep, -d_remove)``."""
        return np.maximum(self.keep.signed_distance(x, y), -self.remove.signed_distance(x, y))

    def bounds(self) -> tuple[float, float, float, float]:
        """The box of ``keep``."""
        return self.keep.bounds()

    def moved(self, dx: float, dy: float) -> Difference:
        """Both operands translated by (dx, dy)."""
        return Difference(self.keep.moved(dx, dy), self.remove.moved(dx, dy))


def annulus(cx: float, cy: float, inner_radius: float, outer_radius: float) -> Difference:
    """Ring ``inner_radius <= |p - c| <= outer_radius`` (pixels)."""
    if not 0 < inner_radius < outer_radius:
        raise ValueError(f"need 0 < inner_radius < outer_radius, got {inner_radius}, {outer_radius}")
    return Difference(Disc(cx, cy, outer_radius), Disc(cx, cy, inner_radius))


def regular_star(cx: float, cy: float, outer_radius: float, inner_radius: float, points: int,
                 angle: float = 0.0) -> Polygon:
    """Star polygon with ``points`` tips at ``outer_radius`` and notches at ``inner_radius`` (pixels, radians)."""
    if points < 3:
        raise ValueError(f"points must be >= 3, got {points}")
    vertices = []
    for k in range(2 * points):
        radius = outer_radius if k % 2 == 0 else inner_radius
        theta = angle + math.pi * k / points
        vertices.append((cx + radius * math.cos(theta), cy + radius * math.sin(theta)))
    return Polygon(tuple(vertices))


def shape_window(shape, height: int, width: int, margin: int = _COVERAGE_MARGIN) -> tuple[int, int, int, int]:
    """Half-open pixel window ``(row0, row1, col0, col1)`` around a shape's bounds, clipped to the image.

    Every pixel whose centre lies in the shape is inside the window; ``margin``
    extra pixels on each side hold the anti-aliased fringe.
    """
    x0, y0, x1, y1 = shape.bounds()
    col0 = max(0, int(math.floor(x0)) - margin)
    row0 = max(0, int(math.floor(y0)) - margin)
    col1 = min(width, int(math.ceil(x1)) + margin + 1)
    row1 = min(height, int(math.ceil(y1)) + margin + 1)
    return row0, max(row0, row1), col0, max(col0, col1)


def rasterize(shape, height: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    """Exact mask and consistent anti-aliased coverage of a shape on an image grid.

    Args:
      shape: a shape (see the module docstring).
      height, width: image size in pixels (> 0).

    Returns:
      ``(mask bool[H, W], coverage f32[H, W])``: ``mask`` is the set of pixel
      centres with signed distance ``<= 0``; ``coverage`` is
      ``clip(0.5 - d, 0, 1)``, with ``coverage >= 0.5`` exactly where ``mask``
      is true and ``< 0.5`` elsewhere (0 outside a few pixels of the shape).
    """
    if height <= 0 or width <= 0:
        raise ValueError(f"height and width must be positive, got {height}, {width}")
    mask = np.zeros((height, width), dtype=bool)
    coverage = np.zeros((height, width), dtype=np.float32)
    row0, row1, col0, col1 = shape_window(shape, height, width)
    if row1 > row0 and col1 > col0:
        x, y = pixel_centres(height, width, (row0, row1, col0, col1))
        distance = np.broadcast_to(shape.signed_distance(x, y), (row1 - row0, col1 - col0))
        inside = distance <= 0.0
        alpha = np.clip(0.5 - distance, 0.0, 1.0).astype(np.float32)
        alpha = np.where(inside, np.maximum(alpha, np.float32(0.5)), np.minimum(alpha, _BELOW_HALF))
        mask[row0:row1, col0:col1] = inside
        coverage[row0:row1, col0:col1] = alpha
    return mask, coverage


def shape_mask(shape, height: int, width: int) -> np.ndarray:
    """bool[H, W] exact mask of a shape (pixel centres with signed distance ``<= 0``)."""
    return rasterize(shape, height, width)[0]

