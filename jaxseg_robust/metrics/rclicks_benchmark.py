"""RClicks benchmark aggregation: NoC20@90, NoF20@90, IoU-AuC20 per group and per dataset.

Reference: docs/protocols/rclicks.md §6 (C-R ``compute_benchmark_metrics.ipynb``) and
§8.2 rows 12-15. Pure NumPy functions of per-instance IoU arrays (the host-side
end of a run; `jaxseg_robust.metrics.interactive` holds the per-curve metrics).

Per instance i (20-round curves ``u_1..u_20``, groups g = 1..G, Base B):

  * ``NoC@90 = min{k : u_k >= 0.9}``, or 20 if never reached (not 21);
  * ``IoU-AuC = (u_1/2 + u_2 + ... + u_19 + u_20/2) / 19``;
  * ``NSR@20(i) = std_g AUC_g(i) / mean_g AUC_g(i)`` (population std, no eps, float32);
  * User@1: ``mean_v``, ``std_v`` (population) of the IoUs of the instance's real
    first-round clicks, ``NSR@1 = std_v / (mean_v + 1e-9)``; the same for the
    SamplingUsersCount clicks ("Sample IoU@1").

Dataset (N instances; ``mean_i`` over instances):

  ================  ===============================================  ===========================
  row               NoC (relative, %)                                AUC (absolute) / NoF (count)
  ================  ===============================================  ===========================
  Sample mean       ``mean_i mean_g X_g(i)``                          same; NoF: ``mean_g NoF_g``
  Sample ± std      ``mean_i std_g X_g(i)`` (mean of per-instance     same; NoF: ``std_g NoF_g``
                    stds, §8.2 #13)
  Base              ``mean_i X_B(i)``                                 same; NoF: count
  ΔSB               ``100 mean_i (mean_g NoC_g - NoC_B) / NoC_B``     ``mean_i (mean_g X_g - X_B)``
  ΔGR               ``100 mean_i (NoC_1 - NoC_G) / NoC_G``            ``mean_i (X_1 - X_G)``
  ΔHH               ``100 mean_{i, j<=G/2} (NoC_j - NoC_{j+G/2})       ``mean_{i,j} (X_j - X_{j+G/2})``
                    / NoC_{j+G/2}``
  ================  ===============================================  ===========================

``NoF_g = #{i : NoC_g(i) == 20}`` is a dataset-level count (an instance first
reaching 90 % exactly at click 20 counts, §8.2 #15). ΔSB/ΔGR/ΔHH are means of
per-instance relative differences, not relative differences of means (§8.2 #12):
e.g. NoC_B = (1, 10), mean_g NoC_g = (2, 10) gives ΔSB = 50 %, while
12/11 - 1 = 9.1 %. ΔGR is (G1 - G10)/G10 (§8.2 #14).

Table formats (§6.2): NoC ``%.2f±%.2f`` and Δ in percent ``%.2f``; NoF
``%.1f±%.2f``, ΔGR NoF as an int; IoU values ×100 ``%.2f`` (`reports.rclicks`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import NamedTuple

import numpy as np

__all__ = [
    "NUM_CLICKS",
    "IOU_TARGET",
    "NSR_EPS",
    "noc_per_instance",
    "auc_per_instance",
    "nsr_at_20",
    "SummaryRow",
    "noc_summary",
    "auc_summary",
    "nof_summary",
    "UserRoundSummary",
    "user_round_summary",
    "mean_curve_auc",
    "DatasetBenchmark",
    "dataset_benchmark",
    "benchmark_by_dataset",
]

NUM_CLICKS = 20
IOU_TARGET = 0.9
NSR_EPS = 1e-9  # NSR@1 only; NSR@20 has no eps (§6.1)


def _curves(ious, name: str, min_ndim: int) -> np.ndarray:
    ious = np.asarray(ious, np.float64)
    if ious.ndim < min_ndim or ious.shape[-1] < 1:
        raise ValueError(f"{name} must have at least {min_ndim} dimensions with a non-empty last axis; "
                         f"got shape {ious.shape}")
    return ious


def _check_clicks(ious: np.ndarray, num_clicks: int, name: str) -> None:
    if isinstance(num_clicks, bool) or not isinstance(num_clicks, int) or num_clicks < 1:
        raise ValueError(f"num_clicks must be a positive int; got {num_clicks!r}")
    if ious.shape[-1] < num_clicks:
        raise ValueError(f"{name} has {ious.shape[-1]} clicks per curve; need num_clicks={num_clicks}")


def noc_per_instance(ious, threshold: float = IOU_TARGET, num_clicks: int = NUM_CLICKS) -> np.ndarray:
    """NoC@threshold of each curve: first 1-based click with ``iou >= threshold``, else ``num_clicks``.

    Args:
      ious: float[..., K] per-click IoU curves, K >= num_clicks (NaN never reaches the target).
      threshold: target IoU (0.9).
      num_clicks: clicks considered (20).
    Returns:
      int64[...].
    """
    ious = _curves(ious, "ious", 1)
    _check_clicks(ious, num_clicks, "ious")
    reached = ious[..., :num_clicks] >= threshold
    return np.where(reached.any(axis=-1), reached.argmax(axis=-1) + 1, num_clicks).astype(np.int64)


def auc_per_instance(ious, num_clicks: int = NUM_CLICKS) -> np.ndarray:
    """IoU-AuC of each curve: ``trapz(u_1..u_K, dx=1) / (K - 1)`` with K = ``num_clicks`` (>= 2).

    Args:
      ious: float[..., K'] curves, K' >= num_clicks.
    Returns:
      float64[...] (NaN where a used entry is NaN).
    """
    ious = _curves(ious, "ious", 1)
    _check_clicks(ious, num_clicks, "ious")
    if num_clicks < 2:
        raise ValueError("num_clicks must be >= 2 for an area")
    used = ious[..., :num_clicks]
    return (used.sum(axis=-1) - 0.5 * (used[..., 0] + used[..., -1])) / (num_clicks - 1)


def nsr_at_20(group_auc) -> np.ndarray:
    """Per-instance NSR@20 = ``std_g(AUC_g) / mean_g(AUC_g)`` (population std, no eps, float32).

    Args:
      group_auc: float[N, G] per-group IoU-AuC of each instance.
    Returns:
      float32[N].
    """
    auc = np.asarray(group_auc, np.float32)
    if auc.ndim != 2 or auc.shape[1] < 1:
        raise ValueError(f"group_auc must have shape [N, G] with G >= 1; got {auc.shape}")
    return (auc.std(axis=1) / auc.mean(axis=1)).astype(np.float32)


class SummaryRow(NamedTuple):
    """One dataset row of a benchmark table (§6.2)."""

    sample_mean: float
    sample_std: float
    base: float
    delta_sb: float
    delta_gr: float
    delta_hh: float


def _groups_and_base(groups, base, name: str) -> tuple[np.ndarray, np.ndarray]:
    groups = np.asarray(groups, np.float64)
    base = np.asarray(base, np.float64)
    if groups.ndim != 2 or groups.shape[0] < 1 or groups.shape[1] < 2:
        raise ValueError(f"{name} groups must have shape [N, G] with N >= 1 and G >= 2; got {groups.shape}")
    if base.shape != groups.shape[:1]:
        raise ValueError(f"{name} base must have shape [{groups.shape[0]}] (one value per instance); "
                         f"got {base.shape}")
    if groups.shape[1] % 2:
        raise ValueError(f"ΔHH pairs group j with j + G/2: G must be even; got G = {groups.shape[1]}")
    return groups, base


def _halves(groups: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    half = groups.shape[1] // 2
    return groups[:, :half], groups[:, half:]


def _summary_row(groups: np.ndarray | None, base: np.ndarray | None, *, relative: bool) -> SummaryRow:
    """The §6.2 row of whatever was run: NaN for every entry whose inputs are missing.

    Args:
      groups: float64[N, G] per-instance values of the groups G1..G (None: not run).
      base: float64[N] per-instance Base values (None: not run).
      relative: deltas as mean per-instance relative differences in % (NoC), else
        mean absolute differences (IoU-AuC).
    Returns:
      SummaryRow: Sample mean/std need the groups, Base the Base, ΔSB both, ΔGR
      G >= 2 and ΔHH an even G >= 2.
    """
    def delta(a, b):
        return float(100.0 * ((a - b) / b).mean()) if relative else float((a - b).mean())

    values = dict.fromkeys(SummaryRow._fields, float("nan"))
    if groups is not None:
        values.update(sample_mean=float(groups.mean(axis=1).mean()), sample_std=float(groups.std(axis=1).mean()))
        if groups.shape[1] >= 2:
            values["delta_gr"] = delta(groups[:, 0], groups[:, -1])
        if groups.shape[1] >= 2 and groups.shape[1] % 2 == 0:
            values["delta_hh"] = delta(*_halves(groups))
    if base is not None:
        values["base"] = float(base.mean())
        if groups is not None:
            values["delta_sb"] = delta(groups.mean(axis=1), base)
    return SummaryRow(**values)


def _nof_row(noc_groups: np.ndarray | None, noc_base: np.ndarray | None, num_clicks: int) -> SummaryRow:
    """NoF row of whatever was run (`nof_summary`; NaN for entries whose inputs are missing)."""
    values = dict.fromkeys(SummaryRow._fields, float("nan"))
    counts = None if noc_groups is None else (noc_groups == num_clicks).sum(axis=0).astype(np.float64)
    if counts is not None:
        values.update(sample_mean=float(counts.mean()), sample_std=float(counts.std()))
        if counts.shape[0] >= 2:
            values["delta_gr"] = float(counts[0] - counts[-1])
        if counts.shape[0] >= 2 and counts.shape[0] % 2 == 0:
            half = counts.shape[0] // 2
            values["delta_hh"] = float((counts[:half] - counts[half:]).mean())
    if noc_base is not None:
        values["base"] = float((noc_base == num_clicks).sum())
        if counts is not None:
            values["delta_sb"] = float(counts.mean() - values["base"])
    return SummaryRow(**values)


def noc_summary(noc_groups, noc_base) -> SummaryRow:
    """NoC20@90 row: Sample mean ± std, Base, ΔSB, ΔGR, ΔHH (relative, in percent).

    Args:
      noc_groups: int[N, G] NoC of each instance and group (G1 first).
      noc_base: int[N] NoC of the Base trajectory (>= 1).
    Returns:
      SummaryRow (NoC in clicks, deltas in %).
    """
    groups, base = _groups_and_base(noc_groups, noc_base, "NoC")
    if np.any(base < 1) or np.any(groups < 1):
        raise ValueError("NoC values must be >= 1")
    return _summary_row(groups, base, relative=True)


def auc_summary(auc_groups, auc_base) -> SummaryRow:
    """IoU-AuC20 row: Sample mean ± std, Base, and absolute ΔSB, ΔGR, ΔHH (fractions; ×100 in tables).

    Args:
      auc_groups: float[N, G] IoU-AuC of each instance and group.
      auc_base: float[N] IoU-AuC of Base.
    """
    groups, base = _groups_and_base(auc_groups, auc_base, "AUC")
    return _summary_row(groups, base, relative=False)


def nof_summary(noc_groups, noc_base, num_clicks: int = NUM_CLICKS) -> SummaryRow:
    """NoF20@90 row from per-instance NoC: counts ``NoF_g = #{NoC_g == num_clicks}``.

    Sample mean / std = mean / population std of the G counts; Base = the Base
    count; ΔSB = ``mean_g NoF_g - NoF_B``; ΔGR = ``NoF_1 - NoF_G``; ΔHH =
    ``mean_j (NoF_j - NoF_{j+G/2})``.

    Args:
      noc_groups: int[N, G]; noc_base: int[N]; num_clicks: the failure value (20).
    """
    groups, base = _groups_and_base(noc_groups, noc_base, "NoC")
    return _nof_row(groups, base, num_clicks)


class UserRoundSummary(NamedTuple):
    """First-round statistics of real (User) or sampled (SamplingUsersCount) clicks (§6.1-6.2)."""

    mean: float      # mean_i mean_v(i)
    std: float       # mean_i std_v(i)
    nsr: float       # mean_i std_v(i) / (mean_v(i) + 1e-9)
    instances: int   # instances with at least one click


def user_round_summary(per_instance_ious: Iterable[Sequence[float]]) -> UserRoundSummary:
    """User@1 / Sample@1: per instance mean and population std of its clicks' IoUs, then means.

    Args:
      per_instance_ious: one sequence of first-round IoUs per instance (empty ones skipped).
    Returns:
      UserRoundSummary (NaN fields when no instance has a click).
    """
    means, stds = [], []
    for ious in per_instance_ious:
        values = np.asarray(ious, np.float64).reshape(-1)
        if values.size == 0:
            continue
        means.append(values.mean())
        stds.append(values.std())
    if not means:
        return UserRoundSummary(float("nan"), float("nan"), float("nan"), 0)
    means, stds = np.asarray(means), np.asarray(stds)
    return UserRoundSummary(float(means.mean()), float(stds.mean()), float((stds / (means + NSR_EPS)).mean()),
                            int(means.size))


def mean_curve_auc(ious, num_clicks: int = NUM_CLICKS) -> float:
    """Fig. 7 legend value: IoU-AuC of the mean curve over instances (fraction; ×100 in the figure).

    Args:
      ious: float[N, K] curves of one group (or Base).
    """
    ious = _curves(ious, "ious", 2)
    return float(auc_per_instance(ious.mean(axis=0), num_clicks))


class DatasetBenchmark(NamedTuple):
    """Every §6.2 quantity of one dataset (NaN / None where the inputs were not run)."""

    instances: int
    noc: SummaryRow | None
    nof: SummaryRow | None
    auc: SummaryRow | None
    nsr_at_20: float               # NSR at the click budget (``num_clicks``; 20 in the benchmark)
    base_iou_at_1: float
    user: UserRoundSummary
    sample: UserRoundSummary
    group_noc: tuple[float, ...]   # mean NoC of each group G1..G (Fig. 6-style per-group view)
    group_auc: tuple[float, ...]   # mean IoU-AuC of each group
    num_clicks: int = NUM_CLICKS   # click budget of NoC / NoF / IoU-AuC / NSR (table headers)
    threshold: float = IOU_TARGET  # NoC / NoF IoU target (table headers)


def _stacked(payloads: Sequence[Mapping], name: str, ndim: int) -> np.ndarray | None:
    """``payload[name]`` of every instance stacked (float64), or None when an instance lacks it or it is empty."""
    if not all(name in p for p in payloads):
        return None
    stacked = np.stack([np.asarray(p[name], np.float64) for p in payloads])
    return stacked if stacked.ndim == ndim + 1 and stacked.size else None


def dataset_benchmark(payloads: Sequence[Mapping], *, threshold: float = IOU_TARGET,
                      num_clicks: int = NUM_CLICKS) -> DatasetBenchmark:
    """Aggregates the per-instance payloads of one dataset (`clicksim.evaluation.finalize_record`).

    Args:
      payloads: per-instance mappings with ``group_iou`` [G, K] and ``base_iou`` [K]
        (either may be missing), and optionally ``user_iou`` / ``sample_iou`` [n].
      threshold, num_clicks: NoC target and click budget (0.9, 20).
    Returns:
      DatasetBenchmark. The rows hold what was run (`SummaryRow` entries are NaN
      where their inputs are missing): groups only (no Base) give Sample mean ±
      std, ΔGR and, for an even G, ΔHH; Base only gives Base; ΔSB needs both.
      Base IoU@1 is averaged over the instances that have real first-round
      clicks when user clicks were evaluated (the TETRIS rule of §6.2), else over
      all instances.
    """
    payloads = list(payloads)
    if not payloads:
        raise ValueError("payloads must not be empty")
    if not isinstance(threshold, (int, float)) or not 0.0 < float(threshold) <= 1.0:
        raise ValueError(f"threshold must be an IoU in (0, 1]; got {threshold!r}")
    have_users = all("user_iou" in p for p in payloads)
    groups = _stacked(payloads, "group_iou", 2)
    base = _stacked(payloads, "base_iou", 1)
    noc = nof = auc = None
    nsr = float("nan")
    group_noc: tuple[float, ...] = ()
    group_auc: tuple[float, ...] = ()
    noc_g = auc_g = noc_b = auc_b = None
    if groups is not None:
        noc_g = noc_per_instance(groups, threshold, num_clicks)
        auc_g = auc_per_instance(groups, num_clicks)
        nsr = float(nsr_at_20(auc_g).mean())
        group_noc = tuple(float(v) for v in noc_g.mean(axis=0))
        group_auc = tuple(float(v) for v in auc_g.mean(axis=0))
    if base is not None:
        noc_b = noc_per_instance(base, threshold, num_clicks)
        auc_b = auc_per_instance(base, num_clicks)
    if groups is not None or base is not None:
        noc = _summary_row(None if noc_g is None else noc_g.astype(np.float64),
                           None if noc_b is None else noc_b.astype(np.float64), relative=True)
        nof = _nof_row(noc_g, noc_b, num_clicks)
        auc = _summary_row(auc_g, auc_b, relative=False)
    base_at_1 = float("nan")
    if base is not None:
        keep = [p for p in payloads if not have_users or len(p["user_iou"]) > 0]
        if keep:
            base_at_1 = float(np.mean([np.asarray(p["base_iou"], np.float64)[0] for p in keep]))
    user = user_round_summary(p["user_iou"] for p in payloads) if have_users else user_round_summary([])
    sample = user_round_summary(p["sample_iou"] for p in payloads) if have_users else user_round_summary([])
    return DatasetBenchmark(len(payloads), noc, nof, auc, nsr, base_at_1, user, sample, group_noc, group_auc,
                            num_clicks, float(threshold))


def benchmark_by_dataset(records: Iterable[Mapping], **options) -> dict[str, DatasetBenchmark]:
    """`dataset_benchmark` of every dataset in a run's ok records (``{"dataset", "status", "payload"}``).

    Returns:
      ``{dataset: DatasetBenchmark}`` in first-seen order (failed records skipped).
    """
    by_dataset: dict[str, list[Mapping]] = {}
    for record in records:
        if record.get("status") == "ok":
            by_dataset.setdefault(record["dataset"], []).append(record["payload"])
    return {name: dataset_benchmark(payloads, **options) for name, payloads in by_dataset.items()}
