"""jaxseg_robust.clicksim: RClicks click data, clickability maps and clicking groups.

Modules (docs/protocols/rclicks.md):
  * ``clicks_csv``    -- reader/validator of the published clicks CSV, tasks, split files (§1).
  * ``previous_mask`` -- previous-round mask PNGs of subsequent-round tasks (§1.2 step 5).
  * ``clickability``  -- error masks, ground-truth clickability maps, UD / DT baselines (§1.2, §2, §4).
  * ``sampling``      -- exact weighted pixel sampling with explicit keys, per-image keys (§5.3, §7).
  * ``groups``        -- clicking groups G1..G10 (probability-mass bands) and in-band sampling (§5.2).
  * ``error_region``  -- polarity / error region / fallback map of a simulated round (§5.2).
  * ``click_models``  -- one interface over click models: DT / UD baselines, the clickability
                         network (zoo name ``rclicks_clickability``) and the TranSalNet SM / SI baselines
                         (``saliency`` / ``saliency_image`` of ``transalnet_res``) (§3.6, §4).
  * ``user_clicks``   -- real-user clicks per instance from the clicks CSV: first-round (§5.1), every
                         task (first, fn, fp) of the clickability evaluation.
  * ``task_instances`` -- the clickability evaluation's tasks as runner instances (object, error region).
  * ``map_evaluation`` -- the clickability evaluation's batch program and metrics (Table 3).
  * ``evaluation``    -- the multi-round simulated evaluation (Base, G1..G10), batched (§5).
The click-distribution metrics live in ``jaxseg_robust.metrics.clicks``.
"""

from jaxseg_robust.clicksim.clickability import (
    CLICK_TYPES,
    DEFAULT_SIGMA,
    REFERENCE_DIAGONAL,
    click_density,
    click_type_code,
    distance_transform_map,
    error_mask,
    gt_clickability_map,
    scaled_sigma,
    soft_error_mask,
    soft_mask_sigma,
    uniform_map,
)
from jaxseg_robust.clicksim.clicks_csv import (
    CLICKS_COLUMNS,
    TETRIS_MAX_SIDE,
    ClicksCsvError,
    ClicksTable,
    TaskClicks,
    image_stem_of,
    limited_image_size,
    pad_clicks,
    read_clicks_csv,
    read_split_file,
    task_clicks,
    task_stems,
)
from jaxseg_robust.clicksim.error_region import ErrorRegion, choose_error_region
from jaxseg_robust.clicksim.groups import (
    DEFAULT_NUM_GROUPS,
    GroupBand,
    GroupClick,
    band_mask,
    band_thresholds,
    band_weights,
    first_argmax_xy,
    group_bounds,
    masked_clickability,
    sample_group_click,
    sample_group_clicks,
)
from jaxseg_robust.clicksim.previous_mask import previous_mask_path, read_previous_mask
from jaxseg_robust.ops.sampling import flat_to_xy, image_key, sample_flat_indices, sample_pixels

__all__ = [
    "CLICK_TYPES", "DEFAULT_SIGMA", "REFERENCE_DIAGONAL", "click_density", "click_type_code",
    "distance_transform_map", "error_mask", "gt_clickability_map", "scaled_sigma", "soft_error_mask",
    "soft_mask_sigma", "uniform_map",
    "CLICKS_COLUMNS", "TETRIS_MAX_SIDE", "ClicksCsvError", "ClicksTable", "TaskClicks", "image_stem_of",
    "limited_image_size", "pad_clicks", "read_clicks_csv", "read_split_file", "task_clicks", "task_stems",
    "ErrorRegion", "choose_error_region",
    "DEFAULT_NUM_GROUPS", "GroupBand", "GroupClick", "band_mask", "band_thresholds", "band_weights",
    "first_argmax_xy", "group_bounds", "masked_clickability", "sample_group_click", "sample_group_clicks",
    "previous_mask_path", "read_previous_mask",
    "flat_to_xy", "image_key", "sample_flat_indices", "sample_pixels",
]
