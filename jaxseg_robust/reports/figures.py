"""PNG figures of the prompt-robustness reports (matplotlib, Agg canvas: no display needed).

Every figure is exactly ``FIGURE_PX`` = 640 x 480 pixels (``FIGURE_INCHES`` at
``DPI``; saved without tight cropping, so the size is fixed and testable).
Coordinates are image pixels: x = column, y = row, origin top-left, pixel
centres at integers (matplotlib's ``imshow`` convention); clicks are drawn from
(x, y) points and boxes are (x1, y1, x2, y2). What each figure shows is
described in docs/ARCHITECTURE.md ("Figures").

  * `record_clicks_xy` / `record_point_xy`: the only readers of click
    coordinates out of a record (records store clicks as (x, y) under ``*_xy`` fields);
  * `plot_curves`: mIoU-per-click curves (min / baseline / max);
  * `heatmap_figure` / `plot_heatmap`: a heatmap over (x, y) positions or over
    (w, h) box sizes, colours fitted to the finite data (`data_range`), cells
    without data transparent, optionally over the dimmed image with the GT
    outline and markers;
  * `prompts_figure` / `plot_prompts`: clicks (green positive, red negative,
    numbered) and boxes drawn over the image with the GT outline.

The ``*_figure`` functions build and return the matplotlib figure (tests read
what was drawn from its artists); the ``plot_*`` functions save it.
"""

from __future__ import annotations

import dataclasses
import pathlib
from collections.abc import Mapping, Sequence

import numpy as np

DPI = 100
FIGURE_INCHES = (6.4, 4.8)
FIGURE_PX = (640, 480)  # (width, height) of every saved PNG
CURVE_STYLES = {"min": ("tab:red", "v"), "baseline": ("black", "o"), "max": ("tab:green", "^"),
                "worst group": ("tab:red", "v"), "mean of groups": ("tab:blue", "s"), "best group": ("tab:green", "^")}
BOX_COLOURS = ("yellow", "tab:red", "tab:green", "tab:cyan", "tab:orange", "tab:purple")
GT_OUTLINE_GID = "gt outline"  # the gid of the GT contour (tests find it by this)
GT_OUTLINE_COLOUR = "white"
GT_OUTLINE_WIDTH = 0.8
EQUAL_VALUES_PAD = 0.005  # half-width of the colour scale when every value is the same


def record_clicks_xy(part: Mapping) -> tuple[np.ndarray, np.ndarray]:
    """(xy f32[K, 2] as (x, y) pixels, positive bool[K]) of a trajectory record's clicks.

    The one place that reads click coordinates out of a TETRIS trajectory
    (``part["clicks_xy"]`` (x, y) float, ``part["is_positive"]``; docs/ARCHITECTURE.md,
    "Clicks in records"); every click plot goes through it.
    """
    xy = np.asarray(part["clicks_xy"], np.float32).reshape(-1, 2)
    positive = np.asarray(part["is_positive"], bool).reshape(-1)
    if positive.shape[0] != xy.shape[0]:
        raise ValueError(f"a trajectory records {xy.shape[0]} clicks but {positive.shape[0]} is_positive flags")
    return xy, positive


def record_point_xy(payload: Mapping, field: str) -> tuple[float, float] | None:
    """(x, y) of one click a record stores under ``field`` (click grid ``baseline_click_xy``,
    ``iou_argmin_xy`` ...); None when absent or negative (no such click)."""
    pair = payload.get(field)
    if pair is None or min(pair) < 0:
        return None
    return float(pair[0]), float(pair[1])


def data_range(values) -> tuple[float, float]:
    """(vmin, vmax) of the finite values; (0, 1) when there is none.

    Identical values get ``value -/+ EQUAL_VALUES_PAD`` so that they take the
    middle colour of the map instead of an empty scale.
    """
    values = np.asarray(values, np.float64)
    finite = values[np.isfinite(values)]
    if finite.size == 0:
        return 0.0, 1.0
    low, high = float(finite.min()), float(finite.max())
    if high - low <= 0.0:
        return low - EQUAL_VALUES_PAD, high + EQUAL_VALUES_PAD
    return low, high


FIGURE_ALT_TEXT = {"masks": "predicted masks", "corners": "corners"}  # figure name prefix -> what it shows


def figure_links(record_id: str, figures: Mapping[str, pathlib.Path]) -> list[str]:
    """``report.md`` lines of one instance's figures (name -> path, names like ``masks_<stem>``):
    ``![<id> <what>](<file>)`` and a blank line each; the alt text says what a figure shows."""
    lines = []
    for name, path in figures.items():
        what = FIGURE_ALT_TEXT.get(name.split("_", 1)[0])
        lines += [f"![{record_id} {what}]({path.name})" if what else f"![{record_id}]({path.name})", ""]
    return lines


def _pyplot():
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    return plt


def save_figure(figure, path) -> pathlib.Path:
    """Saves ``figure`` as a ``FIGURE_PX`` PNG (parents created), closes it; returns the path."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=DPI)
    _pyplot().close(figure)
    return path


def _figure():
    return _pyplot().figure(figsize=FIGURE_INCHES, dpi=DPI)


def draw_gt_outline(axes, gt) -> bool:
    """Draws a thin contour of the GT object (``gt`` bool[H, W] or int: > 0 object) on ``axes``.

    Nothing is drawn for None or a mask without both object and background
    pixels. Returns whether a contour was drawn (its gid is ``GT_OUTLINE_GID``).
    """
    if gt is None:
        return False
    mask = np.asarray(gt) > 0
    if mask.ndim != 2 or not mask.any() or mask.all():
        return False
    contour = axes.contour(mask.astype(np.float32), levels=[0.5], colors=[GT_OUTLINE_COLOUR],
                           linewidths=GT_OUTLINE_WIDTH, zorder=2.5)
    contour.set_gid(GT_OUTLINE_GID)
    return True


def _gt_legend_handle():
    from matplotlib.lines import Line2D  # noqa: PLC0415

    return Line2D([], [], color=GT_OUTLINE_COLOUR, linewidth=GT_OUTLINE_WIDTH, label="GT outline")


def _check_image(image) -> np.ndarray:
    image = np.asarray(image)
    if image.ndim != 3 or image.shape[2] != 3:
        raise ValueError(f"image must be [H, W, 3]; got {image.shape}")
    return image


def _check_gt(gt, image) -> None:
    if gt is not None and np.shape(gt) != image.shape[:2]:
        raise ValueError(f"gt shape {np.shape(gt)} differs from the image's {image.shape[:2]}")


def plot_curves(curves: Mapping[str, Sequence[float]], path, *, title: str = "", ylabel: str = "mIoU") -> pathlib.Path:
    """Saves a per-click curve plot (x = click 1..K, y in [0, 1]).

    Args:
      curves: label -> float[K] values (fractions; NaN points are not drawn);
        labels "min", "baseline", "max" (and RClicks' "worst group", "mean of
        groups", "best group") get fixed colours and markers.
      path: output PNG.
      title, ylabel: texts.

    Returns:
      The written path.
    """
    if not curves:
        raise ValueError("curves must not be empty")
    figure = _figure()
    axes = figure.add_subplot(1, 1, 1)
    longest = 1
    for label, values in curves.items():
        values = np.asarray(values, np.float64).reshape(-1)
        longest = max(longest, values.shape[0])
        colour, marker = CURVE_STYLES.get(label, (None, "."))
        axes.plot(np.arange(1, values.shape[0] + 1), values, marker=marker, color=colour, label=label)
    axes.set_xlabel("click")
    axes.set_ylabel(ylabel)
    axes.set_ylim(0.0, 1.0)
    axes.set_xlim(0.8, longest + 0.2)
    axes.set_xticks(np.arange(1, longest + 1, max(1, longest // 10)))
    axes.grid(True, alpha=0.3)
    axes.legend(loc="lower right")
    if title:
        axes.set_title(title, fontsize=10)
    figure.tight_layout()
    return save_figure(figure, path)


def _heatmap_extent(xs: np.ndarray, ys: np.ndarray, anchor: str) -> tuple[float, float, float, float]:
    """imshow extent (left, right, bottom, top) of cells at ``xs`` x ``ys`` (see `heatmap_figure`'s anchor)."""
    step_x = float(xs[1] - xs[0]) if xs.shape[0] > 1 else 1.0
    step_y = float(ys[1] - ys[0]) if ys.shape[0] > 1 else 1.0
    if anchor == "centre":
        return xs[0] - step_x / 2, xs[-1] + step_x / 2, ys[-1] + step_y / 2, ys[0] - step_y / 2
    return xs[0] - 0.5, xs[-1] + step_x - 0.5, ys[-1] + step_y - 0.5, ys[0] - 0.5


def _transparent_bad(name: str):
    """The colour map ``name`` whose masked (no data) cells are fully transparent."""
    from matplotlib import colormaps  # noqa: PLC0415

    return colormaps[name].with_extremes(bad=(0.0, 0.0, 0.0, 0.0))


def heatmap_figure(values, *, x_coords, y_coords, title: str = "", xlabel: str = "x (px)", ylabel: str = "y (px)",
                   colour_label: str = "IoU", image=None, gt=None,
                   markers: Mapping[str, Sequence[float]] | None = None, value_range: tuple[float, float] | None = None,
                   anchor: str = "centre"):
    """A heatmap with a colour bar; returns the matplotlib figure (`plot_heatmap` saves it).

    Args:
      values: float[Gy, Gx] (rows follow ``y_coords``, columns ``x_coords``);
        NaN (or masked) cells have no data and are not painted.
      x_coords, y_coords: float[Gx], float[Gy] coordinate of each column / row
        (pixels or box sizes; evenly spaced).
      title, xlabel, ylabel, colour_label: texts; the colour bar's label also
        states the colour range.
      image: optional uint8[H, W, 3] drawn dimmed underneath (pixel frame; the
        heatmap cells are centred on their coordinates); gt: optional bool[H, W]
        object mask outlined over it (`draw_gt_outline`).
      markers: label -> (x, y) points drawn on top (e.g. "baseline click").
      value_range: (vmin, vmax) of the colours; default `data_range` of ``values``.
      anchor: "centre" (a cell is centred on its coordinate) or "start" (a
        cell spans ``[c - 0.5, c + step - 0.5]``: a strided click grid, where
        position c stands for the pixels c .. c + step - 1).
    """
    values = np.ma.masked_invalid(np.ma.asarray(values, np.float64))
    xs, ys = np.asarray(x_coords, np.float64).reshape(-1), np.asarray(y_coords, np.float64).reshape(-1)
    if values.ndim != 2 or values.shape != (ys.shape[0], xs.shape[0]):
        raise ValueError(f"values must be [len(y_coords), len(x_coords)] = {(ys.shape[0], xs.shape[0])}; "
                         f"got {values.shape}")
    if anchor not in ("centre", "start"):
        raise ValueError(f"anchor must be 'centre' or 'start'; got {anchor!r}")
    vmin, vmax = value_range if value_range is not None else data_range(values.filled(np.nan))
    figure = _figure()
    axes = figure.add_subplot(1, 1, 1)
    if image is not None:
        image = _check_image(image)
        _check_gt(gt, image)
        axes.imshow((image.astype(np.float32) * 0.5).astype(np.uint8), interpolation="nearest")
    handle = axes.imshow(values, cmap=_transparent_bad("viridis"), vmin=vmin, vmax=vmax,
                         extent=_heatmap_extent(xs, ys, anchor), interpolation="nearest",
                         alpha=0.8 if image is not None else 1.0)
    handles = []
    if image is not None:
        if draw_gt_outline(axes, gt):
            handles.append(_gt_legend_handle())
        axes.set_xlim(-0.5, image.shape[1] - 0.5)
        axes.set_ylim(image.shape[0] - 0.5, -0.5)
    styles = (("white", "*"), ("tab:red", "v"), ("tab:green", "^"), ("tab:cyan", "s"))
    for index, (label, point) in enumerate((markers or {}).items()):
        colour, marker = styles[index % len(styles)]
        handles.append(axes.scatter([point[0]], [point[1]], s=120, c=colour, marker=marker, edgecolors="black",
                                    linewidths=0.8, label=label, zorder=3))
    if handles:
        axes.legend(handles=handles, loc="upper right", fontsize=7, framealpha=0.7)
    bar = figure.colorbar(handle, ax=axes, fraction=0.046, pad=0.04)
    bar.set_label(f"{colour_label} (colours span {vmin:.3f} to {vmax:.3f})")
    axes.set_xlabel(xlabel)
    axes.set_ylabel(ylabel)
    if title:
        axes.set_title(title, fontsize=9)
    figure.tight_layout()
    return figure


def plot_heatmap(values, path, **options) -> pathlib.Path:
    """Saves `heatmap_figure` (``values`` and keyword ``options`` as there) to ``path``; returns the path."""
    return save_figure(heatmap_figure(values, **options), path)


@dataclasses.dataclass(frozen=True)
class DrawnBox:
    """One box of `prompts_figure`: legend label, (x1, y1, x2, y2) in image pixels, colour and line."""

    label: str
    box: Sequence[float]
    colour: str = "yellow"
    linestyle: str = "-"
    linewidth: float = 1.5


def _draw_clicks(axes, label: str, xy, positive, marker: str):
    xy = np.asarray(xy, np.float64).reshape(-1, 2)
    positive = np.asarray(positive, bool).reshape(-1)
    handle = axes.scatter(xy[:, 0], xy[:, 1], s=60, c=list(np.where(positive, "lime", "red")), marker=marker,
                          edgecolors="black", linewidths=0.8, label=label, zorder=3)
    for number, (x, y) in enumerate(xy, start=1):
        axes.annotate(str(number), (x, y), textcoords="offset points", xytext=(4, 4), fontsize=6, color="white")
    return handle


def _draw_box(axes, drawn: DrawnBox):
    from matplotlib import patheffects  # noqa: PLC0415
    from matplotlib.patches import Rectangle  # noqa: PLC0415

    x1, y1, x2, y2 = (float(v) for v in drawn.box)
    # a black under-stroke keeps every box visible on any image colour
    return axes.add_patch(Rectangle((x1, y1), x2 - x1, y2 - y1, fill=False, edgecolor=drawn.colour,
                                    linewidth=drawn.linewidth, linestyle=drawn.linestyle, label=drawn.label, zorder=2,
                                    path_effects=[patheffects.Stroke(linewidth=drawn.linewidth + 1.5,
                                                                     foreground="black"), patheffects.Normal()]))


def prompts_figure(image, *, clicks: Mapping[str, tuple] | None = None, boxes: Sequence[DrawnBox] = (),
                   gt=None, title: str = ""):
    """The image with click sequences, boxes and the GT outline; returns the matplotlib figure.

    Args:
      image: uint8[H, W, 3] RGB.
      clicks: label -> (xy float[n, 2] as (x, y) pixels (`record_clicks_xy`),
        is_positive bool[n]); each sequence gets its own marker, positive
        clicks green, negative red, numbered 1..n.
      boxes: `DrawnBox` es, drawn in order (a `patches.Rectangle` each).
      gt: optional bool[H, W] object mask, outlined (`draw_gt_outline`).
      title: text.
    """
    image = _check_image(image)
    _check_gt(gt, image)
    figure = _figure()
    axes = figure.add_subplot(1, 1, 1)
    axes.imshow(image, interpolation="nearest")
    handles = [_gt_legend_handle()] if draw_gt_outline(axes, gt) else []
    markers = ("o", "v", "^", "s", "D")
    for index, (label, (xy, positive)) in enumerate((clicks or {}).items()):
        handles.append(_draw_clicks(axes, label, xy, positive, markers[index % len(markers)]))
    handles += [_draw_box(axes, drawn) for drawn in boxes]
    if handles:
        axes.legend(handles=handles, loc="upper right", fontsize=7, framealpha=0.7)
    axes.set_xlim(-0.5, image.shape[1] - 0.5)
    axes.set_ylim(image.shape[0] - 0.5, -0.5)
    axes.set_xlabel("x (px)")
    axes.set_ylabel("y (px)")
    if title:
        axes.set_title(title, fontsize=10)
    figure.tight_layout()
    return figure


def plot_prompts(image, path, **options) -> pathlib.Path:
    """Saves `prompts_figure` (``image`` and keyword ``options`` as there) to ``path``; returns the path."""
    return save_figure(prompts_figure(image, **options), path)


__all__ = ["DPI", "FIGURE_INCHES", "FIGURE_PX", "GT_OUTLINE_GID", "DrawnBox", "record_clicks_xy", "record_point_xy",
           "data_range", "figure_links", "save_figure", "draw_gt_outline", "plot_curves", "heatmap_figure",
           "plot_heatmap", "prompts_figure", "plot_prompts"]
