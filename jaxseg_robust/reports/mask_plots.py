"""PNG figure of predicted masks: one panel per trajectory or box, the mask over the image with its prompts.

`mask_panels_figure` draws, side by side, the image with a predicted binary
mask filled in translucent colour and outlined, the ground-truth outline
(thin, white: `jaxseg_robust.reports.figures.draw_gt_outline`), and the
prompts that produced it (clicks numbered, green positive / red negative; a
box); `plot_mask_panels` saves it. Same pixel frame and fixed figure size as
`jaxseg_robust.reports.figures` (``FIGURE_PX``, x = column, y = row, pixel
centres at integers); docs/ARCHITECTURE.md ("Figures").
"""

from __future__ import annotations

import dataclasses
import pathlib
from collections.abc import Sequence

import numpy as np

from jaxseg_robust.reports.figures import DPI, FIGURE_INCHES, draw_gt_outline, save_figure

MASK_COLOURS = {"min": (0.84, 0.15, 0.16), "baseline": (0.12, 0.47, 0.71), "max": (0.17, 0.63, 0.17)}
_OTHER = (1.0, 0.5, 0.05)
_ALPHA = 0.45


@dataclasses.dataclass(frozen=True)
class MaskPanel:
    """One panel: a title, a bool[H, W] mask (None: image only) and its prompts.

    Attributes:
      title: panel title (e.g. "min: IoU 41.2").
      mask: bool[H, W] predicted mask at the image size, or None.
      colour: key of ``MASK_COLOURS`` ("min", "baseline", "max") or any other text (orange).
      clicks: float[n, 2] (x, y) pixels (`jaxseg_robust.reports.figures.record_clicks_xy`) or None;
        positive: bool[n].
      box: (x1, y1, x2, y2) inclusive pixel box or None.
    """

    title: str
    mask: np.ndarray | None
    colour: str = ""
    clicks: np.ndarray | None = None
    positive: np.ndarray | None = None
    box: Sequence[float] | None = None


def mask_overlay(image, mask, colour) -> np.ndarray:
    """float[H, W, 3] in [0, 1]: ``image`` with ``colour`` blended (alpha 0.45) where ``mask`` is True."""
    base = np.asarray(image, np.float32) / 255.0
    if mask is None:
        return base
    mask = np.asarray(mask, bool)
    if mask.shape != base.shape[:2]:
        raise ValueError(f"mask shape {mask.shape} differs from the image's {base.shape[:2]}")
    out = base.copy()
    out[mask] = (1.0 - _ALPHA) * base[mask] + _ALPHA * np.asarray(colour, np.float32)
    return out


def _draw_panel(axes, image, panel: MaskPanel, gt) -> None:
    from matplotlib.patches import Rectangle  # noqa: PLC0415

    colour = MASK_COLOURS.get(panel.colour, _OTHER)
    axes.imshow(mask_overlay(image, panel.mask, colour), interpolation="nearest")
    if panel.mask is not None and np.asarray(panel.mask).any() and not np.asarray(panel.mask).all():
        axes.contour(np.asarray(panel.mask, np.float32), levels=[0.5], colors=[colour], linewidths=1.0)
    draw_gt_outline(axes, gt)
    if panel.clicks is not None and len(panel.clicks):
        xy = np.asarray(panel.clicks, np.float64).reshape(-1, 2)
        positive = np.asarray(panel.positive if panel.positive is not None else np.ones(len(xy)), bool)
        axes.scatter(xy[:, 0], xy[:, 1], s=30, c=list(np.where(positive, "lime", "red")),
                     edgecolors="black", linewidths=0.6, zorder=3)
        for number, (x, y) in enumerate(xy, start=1):
            axes.annotate(str(number), (x, y), textcoords="offset points", xytext=(3, 3), fontsize=5,
                          color="white")
    if panel.box is not None:
        x1, y1, x2, y2 = (float(v) for v in panel.box)
        axes.add_patch(Rectangle((x1, y1), x2 - x1, y2 - y1, fill=False, edgecolor="yellow", linewidth=1.2,
                                 zorder=2))
    axes.set_xlim(-0.5, image.shape[1] - 0.5)
    axes.set_ylim(image.shape[0] - 0.5, -0.5)
    axes.set_xticks([])
    axes.set_yticks([])
    axes.set_title(panel.title, fontsize=8)


def mask_panels_figure(image, panels: Sequence[MaskPanel], *, gt=None, title: str = ""):
    """The panels side by side (one row); returns the matplotlib figure (`plot_mask_panels` saves it).

    Args:
      image: uint8[H, W, 3] RGB.
      panels: one `MaskPanel` per predicted mask (at least one).
      gt: optional bool[H, W] ground truth, outlined in every panel.
      title: figure title ("(white: GT outline)" is appended when ``gt`` is drawn).

    Raises:
      ValueError: no panel, a bad image, or a mask / gt whose shape is not the image's.
    """
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    image = np.asarray(image)
    if image.ndim != 3 or image.shape[2] != 3:
        raise ValueError(f"image must be [H, W, 3]; got {image.shape}")
    if not panels:
        raise ValueError("panels must not be empty")
    if gt is not None and np.shape(gt) != image.shape[:2]:
        raise ValueError(f"gt shape {np.shape(gt)} differs from the image's {image.shape[:2]}")
    figure = plt.figure(figsize=FIGURE_INCHES, dpi=DPI)
    for index, panel in enumerate(panels):
        _draw_panel(figure.add_subplot(1, len(panels), index + 1), image, panel, gt)
    if gt is not None:
        title = f"{title} (white: GT outline)" if title else "white: GT outline"
    if title:
        figure.suptitle(title, fontsize=9)
    figure.tight_layout()
    return figure


def plot_mask_panels(image, panels: Sequence[MaskPanel], path, *, gt=None, title: str = "") -> pathlib.Path:
    """Saves `mask_panels_figure` as a ``FIGURE_PX`` PNG; returns the path."""
    return save_figure(mask_panels_figure(image, panels, gt=gt, title=title), path)


__all__ = ["MASK_COLOURS", "MaskPanel", "mask_overlay", "mask_panels_figure", "plot_mask_panels"]
