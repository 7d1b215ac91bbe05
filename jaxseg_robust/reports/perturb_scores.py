"""Dataset scores of the perturbation battery from its records (docs/protocols/perturbation.md §5-§6, §9.3).

Pure functions of the stored per-candidate, per-image confusion matrices
(`jaxseg_robust.attacks.perturb.ensemble.run_battery` writes them into the
records): the per-image worst case over candidates (`aggregate`), a
prediction set's dataset metrics (`dataset_metrics`) and the clean / per-attack
/ aggregated table (`battery_table`).
"""

from __future__ import annotations

from collections.abc import Sequence

import jax.numpy as jnp
import numpy as np

from jaxseg_robust.attacks.perturb.common import per_image_scores
from jaxseg_robust.attacks.perturb.ensemble import select_worst
from jaxseg_robust.metrics.semantic import cmiou, dataset_pixel_accuracy, mean_image_pixel_accuracy, nmiou


def aggregate(confusions, *, metric: str, with_background: bool = True, background_class: int = 0,
              select_with_background: bool | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Per-image worst-case selection from stored statistics (§5).

    Args:
      confusions: int[K, N, C, C] per-candidate per-image confusion matrices.
      metric: ``"accuracy"`` or ``"miou"``.
      with_background: the metric variant being reported.
      select_with_background: None selects with the reported variant's score
        (default); a bool forces that variant's score for the selection.

    Returns:
      (index int32[N] of the selected candidate, confusion int64[N, C, C] of the selection).
    """
    confusions = np.asarray(confusions)
    if confusions.ndim != 4:
        raise ValueError(f"confusions must have shape [K, N, C, C], got {confusions.shape}")
    selection_background = with_background if select_with_background is None else bool(select_with_background)
    scores = per_image_scores(jnp.asarray(confusions), metric=metric, with_background=selection_background,
                              background_class=background_class)
    index = np.asarray(select_worst(scores)[0])
    selected = np.take_along_axis(confusions.astype(np.int64), index[None, :, None, None], axis=0)[0]
    return index, selected


def dataset_metrics(confusions, *, with_background: bool = True, background_class: int = 0) -> dict[str, float]:
    """Dataset metrics of one set of predictions (§6.2): pooled accuracy, mean image accuracy, CmIoU, NmIoU.

    Args:
      confusions: int[N, C, C] per-image confusion matrices.

    Returns:
      dict with ``accuracy``, ``mean_image_accuracy``, ``cmiou``, ``nmiou`` (fractions in [0, 1]).
    """
    confusions = jnp.asarray(np.asarray(confusions, np.float64).astype(np.float32))
    kwargs = dict(with_background=with_background, background_class=background_class)
    return {"accuracy": float(dataset_pixel_accuracy(confusions, **kwargs)),
            "mean_image_accuracy": float(mean_image_pixel_accuracy(confusions, **kwargs)),
            "cmiou": float(cmiou(confusions, **kwargs)), "nmiou": float(nmiou(confusions, **kwargs))}


def battery_table(names: Sequence[str], confusions, *, with_background: bool = True, background_class: int = 0,
                  select_with_background: bool | None = None) -> dict[str, dict[str, float]]:
    """The §9.3 table: Acc / CmIoU / NmIoU per candidate plus the aggregate.

    The aggregate row selects per image with accuracy for ``accuracy`` and
    with per-image mIoU for ``cmiou`` / ``nmiou`` (one selection serves both).

    Args:
      names: candidate names (length K).
      confusions: int[K, N, C, C] (e.g. :class:`BatteryResult` confusions of all batches concatenated on N).

    Returns:
      {row name: {"accuracy", "cmiou", "nmiou"}}, rows in input order then ``"aggregated"``.
    """
    confusions = np.asarray(confusions)
    if len(names) != confusions.shape[0]:
        raise ValueError(f"names has {len(names)} entries for {confusions.shape[0]} candidates")
    kwargs = dict(with_background=with_background, background_class=background_class)
    rows = {}
    for name, confusion in zip(names, confusions):
        metrics = dataset_metrics(confusion, **kwargs)
        rows[name] = {key: metrics[key] for key in ("accuracy", "cmiou", "nmiou")}
    _, by_accuracy = aggregate(confusions, metric="accuracy", select_with_background=select_with_background, **kwargs)
    _, by_miou = aggregate(confusions, metric="miou", select_with_background=select_with_background, **kwargs)
    accuracy_metrics = dataset_metrics(by_accuracy, **kwargs)
    miou_metrics = dataset_metrics(by_miou, **kwargs)
    rows["aggregated"] = {"accuracy": accuracy_metrics["accuracy"], "cmiou": miou_metrics["cmiou"],
                          "nmiou": miou_metrics["nmiou"]}
    return rows


__all__ = ["aggregate", "dataset_metrics", "battery_table"]
