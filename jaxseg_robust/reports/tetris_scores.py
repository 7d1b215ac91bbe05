"""Dataset scores of TETRIS and baseline click trajectories from their records (docs/protocols/tetris.md §3.5).

Pure functions of record payloads (the outputs of
`jaxseg_robust.attacks.clicks.trajectory_outputs`): IoU/BIoU-AuC@K of the mean
curve, NoC/NoF (`trajectory_scores`) and the TETRIS Min / Max / Δ
(`tetris_scores`). Values in [0, 1]; the tables multiply by 100.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from jaxseg_robust.metrics.interactive import (
    TETRIS_NUM_CLICKS,
    number_of_clicks,
    number_of_failures,
    tetris_auc,
    tetris_min_max_delta,
)

DEFAULT_N_CLICKS = TETRIS_NUM_CLICKS


def _curves(payloads: Sequence[Mapping], name: str, num_clicks: int) -> np.ndarray:
    rows = []
    for index, payload in enumerate(payloads):
        curve = np.asarray(payload[name], np.float64).reshape(-1)
        if curve.shape[0] < num_clicks:
            raise ValueError(f"payload {index} has {curve.shape[0]} clicks of {name!r}; need {num_clicks}")
        rows.append(curve[:num_clicks])
    return np.stack(rows).astype(np.float32)


def trajectory_scores(payloads: Sequence[Mapping], *, num_clicks: int = DEFAULT_N_CLICKS,
                      skip_nan: bool = False, noc_thresholds: Sequence[float] = (0.85, 0.9)) -> dict:
    """Dataset scores of one run's trajectories (baseline, MIN or MAX), in [0, 1].

    Args:
      payloads: per-instance outputs of one mode (record payloads of a
        "baseline"/"min"/"max" run, or the "min"/"max" parts of "minmax").
      num_clicks: clicks used (AuC@num_clicks, NoC max clicks).
      skip_nan: drop instances with a NaN in their curve (see `metrics.interactive`).
      noc_thresholds: NoC@t / NoF@t thresholds.

    Returns:
      {"auc_iou@K", "auc_biou@K": AuC@K of the mean curve (K = ``num_clicks``; TETRIS AuC@10),
       "mean_iou", "mean_biou": the mean curves (lists of K floats),
       "noc@t", "nof@t" per threshold (NoC averaged over instances),
       "instances": N}.
    """
    if not payloads:
        raise ValueError("payloads must not be empty")
    if num_clicks < 2:
        raise ValueError(f"num_clicks must be >= 2 for an AuC; got {num_clicks}")
    ious = _curves(payloads, "iou", num_clicks)
    bious = _curves(payloads, "biou", num_clicks)
    scores = {f"auc_iou@{num_clicks}": float(tetris_auc(ious, num_clicks, skip_nan=skip_nan)),
              f"auc_biou@{num_clicks}": float(tetris_auc(bious, num_clicks, skip_nan=skip_nan)),
              "instances": len(payloads)}
    for name, curves in (("mean_iou", ious), ("mean_biou", bious)):
        kept = curves[~np.isnan(curves).any(axis=1)] if skip_nan else curves
        scores[name] = [float(v) for v in (kept.mean(axis=0) if len(kept) else np.full(num_clicks, np.nan))]
    for threshold in noc_thresholds:
        label = f"{round(100 * threshold)}"
        scores[f"noc@{label}"] = float(np.mean(number_of_clicks(ious, threshold, num_clicks)))
        scores[f"nof@{label}"] = int(number_of_failures(ious, threshold, num_clicks))
    return scores


def tetris_scores(min_payloads: Sequence[Mapping], max_payloads: Sequence[Mapping] | None = None, *,
                  num_clicks: int = DEFAULT_N_CLICKS, skip_nan: bool = False) -> dict:
    """TETRIS IoU/BIoU-AuC@K Min / Max / Δ of a dataset (docs/protocols/tetris.md §3.5), in [0, 1] (×100 for the tables).

    Args:
      min_payloads: record payloads of a MIN run, or of a "minmax" run (each
        with "min" and "max" parts) when ``max_payloads`` is None.
      max_payloads: record payloads of the MAX run (same instances).
      num_clicks: K (10).
      skip_nan: drop instances with NaN curves (per run).

    Returns:
      {"iou_min", "iou_max", "iou_delta", "biou_min", "biou_max", "biou_delta", "instances"}.
    """
    if max_payloads is None:
        try:
            max_payloads = [payload["max"] for payload in min_payloads]
            min_payloads = [payload["min"] for payload in min_payloads]
        except (KeyError, TypeError):
            raise ValueError("without max_payloads, every payload must hold 'min' and 'max' parts") from None
    if not min_payloads or len(min_payloads) != len(max_payloads):
        raise ValueError(f"need equally many MIN and MAX payloads (>= 1); got {len(min_payloads)}, "
                         f"{len(max_payloads)}")
    scores = {"instances": len(min_payloads)}
    for name in ("iou", "biou"):
        summary = tetris_min_max_delta(_curves(min_payloads, name, num_clicks),
                                       _curves(max_payloads, name, num_clicks), num_clicks, skip_nan=skip_nan)
        scores[f"{name}_min"] = float(summary.min)
        scores[f"{name}_max"] = float(summary.max)
        scores[f"{name}_delta"] = float(summary.delta)
    return scores


__all__ = ["trajectory_scores", "tetris_scores"]
