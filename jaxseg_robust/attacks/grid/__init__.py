"""Exhaustive prompt grids: the click grid (TETRIS heat maps) and the centred box grid (BREPS heat maps).

docs/protocols/grids.md describes both. `candidates` holds the chunked
evaluation of compacted candidates and the heat-map extremes, `clicks` the
click grid and its protocol, `boxes` the centred box grid, the corner heat map
and its protocol. Every public name is importable from this package.
"""

from jaxseg_robust.attacks.grid.boxes import (
    BoxGridConfig,
    BoxGridProtocol,
    BoxGridResult,
    CentredAxis,
    CentredBoxes,
    GridScores,
    box_grid,
    centred_axis,
    centred_boxes,
    corner_heatmap,
    make_box_grid_batch_fn,
)
from jaxseg_robust.attacks.grid.candidates import (
    DEFAULT_CHUNK_SIZE,
    DEFAULT_STRIDE,
    Extremes,
    evaluate_candidates,
    flat_to_click,
    grid_axis,
    heatmap_extremes,
)
from jaxseg_robust.attacks.grid.clicks import (
    CLICK_PREFIXES,
    CLICK_REGIONS,
    DEFAULT_THRESHOLD,
    ClickGridConfig,
    ClickGridProtocol,
    ClickGridResult,
    click_grid,
    make_click_grid_batch_fn,
)
from jaxseg_robust.metrics.packed import REFERENCE_IOU_EPS

__all__ = [
    "DEFAULT_STRIDE", "DEFAULT_CHUNK_SIZE", "DEFAULT_THRESHOLD", "REFERENCE_IOU_EPS", "CLICK_REGIONS",
    "CLICK_PREFIXES", "evaluate_candidates", "Extremes", "heatmap_extremes", "grid_axis", "ClickGridResult",
    "flat_to_click", "click_grid", "CentredAxis", "centred_axis", "CentredBoxes", "centred_boxes",
    "corner_heatmap", "BoxGridResult", "box_grid", "GridScores", "ClickGridConfig", "ClickGridProtocol",
    "make_click_grid_batch_fn", "BoxGridConfig", "BoxGridProtocol", "make_box_grid_batch_fn",
]
