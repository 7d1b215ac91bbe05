"""PNG figures of the prompt-robustness reports (matplotlib, Agg canvas: no display needed).

Every figure is exactly ``FIGURE_PX`` = 640 x 480 pixels (``FIGURE_INCHES`` at
``DPI``; saved without tight cropping, so the size is fixed and testable).
Coordinates are image pixels: x = column, y = row, origin top-left, pixel
centres at integers (matplotlib's ``imshow`` convention), the same frame as
the records' clicks (row, col) and boxes (x1, y1, x2, y2).

  * `plot_curves`: mIoU-per-click curves (min / baseline / max);
  * `plot_heatmap`: a heatmap over (x, y) positions or over (w, h) box sizes,
    with a colour bar, optionally over the dimmed image, with markers;
  * `plot_prompts`: clicks (green positive, red negative, numbered) and boxes
    drawn over the image.
"""

from __future__ import annotations

import pathlib
from collections.abc import Mapping, Sequence

import numpy as np

DPI = 100
FIGURE_INCHES = (6.4, 4.8)
FIGURE_PX = (640, 480)  # (width, height) of every saved PNG
CURVE_STYLES = {"min": ("tab:red", "v"), "baseline": ("black", "o"), "max": ("tab:green", "^")}
BOX_COLOURS = ("yellow", "tab:red", "tab:green", "tab:cyan", "tab:orange", "tab:purple")


def _pyplot():
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    return plt


def _save(figure, path) -> pathlib.Path:
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=DPI)
    _pyplot().close(figure)
    return path


def _figure():
    return _pyplot().figure(figsize=FIGURE_INCHES, dpi=DPI)


def plot_curves(curves: Mapping[str, Sequence[float]], path, *, title: str = "", ylabel: str = "mIoU") -> pathlib.Path:
    """Saves a per-click curve plot (x = click 1..K, y in [0, 1]).

    Args:
      curves: label -> float[K] values (fractions; NaN points are not drawn);
        labels "min", "baseline", "max" get fixed colours and markers.
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
    return _save(figure, path)


def plot_heatmap(values, path, *, x_coords, y_coords, title: str = "", xlabel: str = "x (px)",
                 ylabel: str = "y (px)", colour_label: str = "IoU", image=None,
                 markers: Mapping[str, Sequence[float]] | None = None, vmin: float = 0.0,
                 vmax: float = 1.0, anchor: str = "centre") -> pathlib.Path:
    """Saves a heatmap with a colour bar (NaN cells transparent).

    Args:
      values: float[Gy, Gx] (rows follow ``y_coords``, columns ``x_coords``).
      path: output PNG.
      x_coords, y_coords: float[Gx], float[Gy] coordinate of each column / row
        (pixels or box sizes; evenly spaced).
      title, xlabel, ylabel, colour_label: texts.
      image: optional uint8[H, W, 3] drawn dimmed underneath (pixel frame; the
        heatmap cells are centred on their coordinates).
      markers: label -> (x, y) points drawn on top (e.g. "baseline click").
      vmin, vmax: colour range.
      anchor: "centre" (a cell is centred on its coordinate) or "start" (a
        cell spans ``[c - 0.5, c + step - 0.5]``: a strided click grid, where
        position c stands for the pixels c .. c + step - 1).

    Returns:
      The written path.
    """
    values = np.asarray(values, np.float64)
    xs, ys = np.asarray(x_coords, np.float64).reshape(-1), np.asarray(y_coords, np.float64).reshape(-1)
    if values.ndim != 2 or values.shape != (ys.shape[0], xs.shape[0]):
        raise ValueError(f"values must be [len(y_coords), len(x_coords)] = {(ys.shape[0], xs.shape[0])}; "
                         f"got {values.shape}")
    if anchor not in ("centre", "start"):
        raise ValueError(f"anchor must be 'centre' or 'start'; got {anchor!r}")
    step_x = float(xs[1] - xs[0]) if xs.shape[0] > 1 else 1.0
    step_y = float(ys[1] - ys[0]) if ys.shape[0] > 1 else 1.0
    if anchor == "centre":
        extent = (xs[0] - step_x / 2, xs[-1] + step_x / 2, ys[-1] + step_y / 2, ys[0] - step_y / 2)
    else:
        extent = (xs[0] - 0.5, xs[-1] + step_x - 0.5, ys[-1] + step_y - 0.5, ys[0] - 0.5)
    figure = _figure()
    axes = figure.add_subplot(1, 1, 1)
    if image is not None:
        image = np.asarray(image)
        axes.imshow((image.astype(np.float32) * 0.5).astype(np.uint8), interpolation="nearest")
    handle = axes.imshow(np.ma.masked_invalid(values), cmap="viridis", vmin=vmin, vmax=vmax, extent=extent,
                         interpolation="nearest", alpha=0.8 if image is not None else 1.0)
    if image is not None:
        axes.set_xlim(-0.5, image.shape[1] - 0.5)
        axes.set_ylim(image.shape[0] - 0.5, -0.5)
    styles = (("white", "*"), ("tab:red", "v"), ("tab:green", "^"), ("tab:cyan", "s"))
    for index, (label, point) in enumerate((markers or {}).items()):
        colour, marker = styles[index % len(styles)]
        axes.scatter([point[0]], [point[1]], s=120, c=colour, marker=marker, edgecolors="black", linewidths=0.8,
                     label=label, zorder=3)
    if markers:
        axes.legend(loc="upper right", fontsize=7, framealpha=0.7)
    bar = figure.colorbar(handle, ax=axes, fraction=0.046, pad=0.04)
    bar.set_label(colour_label)
    axes.set_xlabel(xlabel)
    axes.set_ylabel(ylabel)
    if title:
        axes.set_title(title, fontsize=9)
    figure.tight_layout()
    return _save(figure, path)


def plot_prompts(image, path, *, clicks: Mapping[str, tuple] | None = None,
                 boxes: Mapping[str, Sequence[float]] | None = None, title: str = "") -> pathlib.Path:
    """Saves the image with click sequences and boxes drawn over it.

    Args:
      image: uint8[H, W, 3] RGB.
      path: output PNG.
      clicks: label -> (points float[n, 2] (row, col), is_positive bool[n]);
        each sequence gets its own marker, positive clicks green, negative red,
        numbered 1..n.
      boxes: label -> (x1, y1, x2, y2) inclusive pixel box.
      title: text.

    Returns:
      The written path.
    """
    from matplotlib import patheffects  # noqa: PLC0415
    from matplotlib.patches import Rectangle  # noqa: PLC0415

    image = np.asarray(image)
    if image.ndim != 3 or image.shape[2] != 3:
        raise ValueError(f"image must be [H, W, 3]; got {image.shape}")
    figure = _figure()
    axes = figure.add_subplot(1, 1, 1)
    axes.imshow(image, interpolation="nearest")
    markers = ("o", "v", "^", "s", "D")
    for index, (label, (points, positive)) in enumerate((clicks or {}).items()):
        points = np.asarray(points, np.float64).reshape(-1, 2)
        positive = np.asarray(positive, bool).reshape(-1)
        colours = np.where(positive, "lime", "red")
        axes.scatter(points[:, 1], points[:, 0], s=60, c=list(colours), marker=markers[index % len(markers)],
                     edgecolors="black", linewidths=0.8, label=label, zorder=3)
        for number, (row, col) in enumerate(points, start=1):
            axes.annotate(str(number), (col, row), textcoords="offset points", xytext=(4, 4), fontsize=6,
                          color="white")
    for index, (label, box) in enumerate((boxes or {}).items()):
        x1, y1, x2, y2 = (float(v) for v in box)
        colour = BOX_COLOURS[index % len(BOX_COLOURS)]
        # a black under-stroke keeps every box visible on any image colour; the first box (the
        # reference: tight / user box) is dashed
        axes.add_patch(Rectangle((x1, y1), x2 - x1, y2 - y1, fill=False, edgecolor=colour, linewidth=1.5,
                                 linestyle="--" if index == 0 else "-", label=label, zorder=2,
                                 path_effects=[patheffects.Stroke(linewidth=3.0, foreground="black"),
                                               patheffects.Normal()]))
    if clicks or boxes:
        axes.legend(loc="upper right", fontsize=7, framealpha=0.7)
    axes.set_xlim(-0.5, image.shape[1] - 0.5)
    axes.set_ylim(image.shape[0] - 0.5, -0.5)
    axes.set_xlabel("x (px)")
    axes.set_ylabel("y (px)")
    if title:
        axes.set_title(title, fontsize=10)
    figure.tight_layout()
    return _save(figure, path)


__all__ = ["DPI", "FIGURE_INCHES", "FIGURE_PX", "plot_curves", "plot_heatmap", "plot_prompts"]
