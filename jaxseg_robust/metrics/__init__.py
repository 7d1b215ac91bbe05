"""jaxseg_robust.metrics: mask, interactive and semantic-segmentation metrics.

Mask metrics (masks.py), interactive curve metrics (interactive.py) and
semantic-segmentation metrics (semantic.py); see each module for conventions.
"""

from jaxseg_robust.metrics.interactive import (
    breps_min_max_delta,
    failed_instances,
    normalized_auc,
    number_of_clicks,
    number_of_failures,
    rclicks_auc,
    tetris_auc,
    tetris_min_max_delta,
)
from jaxseg_robust.metrics.masks import (
    boundary_f_measure,
    boundary_iou,
    boundary_width,
    mask_iou,
    mask_scores,
    mask_to_boundary,
    min_iou_boundary_iou,
    split_ignore_label,
    trimap_iou,
)
from jaxseg_robust.metrics.semantic import (
    class_iou,
    cmiou,
    confusion_matrix,
    dataset_pixel_accuracy,
    mean_image_pixel_accuracy,
    mean_iou,
    nmiou,
    pixel_accuracy,
)

__all__ = [
    "boundary_f_measure",
    "boundary_iou",
    "boundary_width",
    "breps_min_max_delta",
    "class_iou",
    "cmiou",
    "confusion_matrix",
    "dataset_pixel_accuracy",
    "failed_instances",
    "mask_iou",
    "mask_scores",
    "mask_to_boundary",
    "mean_image_pixel_accuracy",
    "mean_iou",
    "min_iou_boundary_iou",
    "nmiou",
    "normalized_auc",
    "number_of_clicks",
    "number_of_failures",
    "pixel_accuracy",
    "rclicks_auc",
    "split_ignore_label",
    "tetris_auc",
    "tetris_min_max_delta",
    "trimap_iou",
]
