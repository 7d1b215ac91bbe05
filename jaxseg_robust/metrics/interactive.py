"""Interactive-segmentation metrics on per-click IoU (or BIoU) curves.

A curve is ``ious[..., K]``: the score after click 1, 2, ..., K of one
instance (one trajectory). Conventions follow the reference code:

  * NoC@t (RITM ``compute_noc_metric``; RClicks docs/protocols/rclicks.md §6.1):
    the 1-based index of the first click whose IoU is ``>= t`` among the first
    ``max_clicks``; ``max_clicks`` (not ``max_clicks + 1``) when never reached.
  * NoF@t (RITM; RClicks §6.2 and §8.2 #15): number of instances whose NoC
    equals ``max_clicks`` -- an instance that first reaches ``t`` exactly at the
    last click counts as a failure. ``strict=True`` counts only the instances
    that never reach ``t``.
  * IoU-AuC: trapezoid rule with unit spacing divided by ``K - 1``, i.e.
    ``(u_1/2 + u_2 + ... + u_{K-1} + u_K/2) / (K - 1)`` in [0, 1].
    The two benchmarks differ only in *where* they average:
      - TETRIS (docs/protocols/tetris.md §3.5), AuC@10: the AuC of the
        **mean curve over instances** (:func:`tetris_auc`);
      - RClicks (§6.1), IoU-AuC@20: the AuC **per instance**
        (:func:`rclicks_auc`), averaged over instances (and groups) later.
    Without NaNs the two agree (the AuC is linear); they differ when some
    curves hold NaN.
  * Min / Max / Delta: TETRIS = AuC of the mean curve of the MIN run, of the
    MAX run, and MAX - MIN (:func:`tetris_min_max_delta`); BREPS (§4.6) = dataset
    mean of the final per-instance IoU of the MIN / MAX run
    (:func:`breps_min_max_delta`).

NaN handling: a NaN IoU (empty union) never reaches a threshold, so it counts
towards NoC = max_clicks and NoF. AuC and means propagate NaN by default
(an instance with an undefined score makes the aggregate undefined, as the
reference ``np.mean`` does); ``skip_nan=True`` drops every instance whose curve
(its first ``num_clicks`` entries) holds a NaN, and returns NaN when none is left.

All functions are pure jnp and wrapped in ``jax.jit`` (click counts and flags
static); they compose with ``jit`` and ``vmap``.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxseg_robust.ops.morphology import check_radius

TETRIS_NUM_CLICKS = 10
RCLICKS_NUM_CLICKS = 20


def _curves(ious, name: str = "ious", min_ndim: int = 1) -> jnp.ndarray:
    ious = jnp.asarray(ious)
    if ious.ndim < min_ndim:
        raise ValueError(f"{name} must have at least {min_ndim} dimension(s), got shape {ious.shape}")
    if not jnp.issubdtype(ious.dtype, jnp.floating):
        ious = ious.astype(jnp.float32)
    return ious


def _clicks(ious, num_clicks, name: str) -> int:
    available = ious.shape[-1]
    if num_clicks is None:
        num_clicks = available
    num_clicks = check_radius(num_clicks, name)
    if not 1 <= num_clicks <= available:
        raise ValueError(f"{name} must be in [1, {available}] (clicks in the curves), got {num_clicks}")
    return num_clicks


# ---- NoC / NoF -----------------------------------------------------------------

@functools.partial(jax.jit, static_argnames=("max_clicks",))
def number_of_clicks(ious, threshold: float = 0.9, max_clicks: int | None = None) -> jnp.ndarray:
    """NoC@threshold per instance.

    Args:
      ious: float[..., K] per-click scores of each instance.
      threshold: target score t (reached when ``iou >= t``).
      max_clicks: static int in [1, K] (default K); only the first
        ``max_clicks`` clicks are considered.

    Returns:
      int32[...]: first click index k (1-based) with ``ious[..., k-1] >= t``,
      else ``max_clicks``.
    """
    ious = _curves(ious)
    max_clicks = _clicks(ious, max_clicks, "max_clicks")
    reached = ious[..., :max_clicks] >= threshold
    first = jnp.argmax(reached, axis=-1).astype(jnp.int32) + 1
    return jnp.where(jnp.any(reached, axis=-1), first, jnp.int32(max_clicks))


@functools.partial(jax.jit, static_argnames=("max_clicks", "strict"))
def failed_instances(
    ious, threshold: float = 0.9, max_clicks: int | None = None, *, strict: bool = False
) -> jnp.ndarray:
    """Which instances count as failures for NoF@threshold.

    Args:
      ious: float[..., K]; threshold, max_clicks: as in :func:`number_of_clicks`.
      strict: False (reference convention): failure iff NoC == max_clicks, which
        includes first reaching t exactly at the last click. True: failure iff t
        is never reached within max_clicks.

    Returns:
      bool[...].
    """
    ious = _curves(ious)
    max_clicks = _clicks(ious, max_clicks, "max_clicks")
    if strict:
        return ~jnp.any(ious[..., :max_clicks] >= threshold, axis=-1)
    return number_of_clicks(ious, threshold, max_clicks) == max_clicks


@functools.partial(jax.jit, static_argnames=("max_clicks", "strict"))
def number_of_failures(
    ious, threshold: float = 0.9, max_clicks: int | None = None, *, strict: bool = False
) -> jnp.ndarray:
    """NoF@threshold: failures counted over the instance axis.

    Args:
      ious: float[..., N, K] curves of N instances (leading axes, e.g. clicking
        groups, are kept).
      threshold, max_clicks, strict: see :func:`failed_instances`.

    Returns:
      int32[...].
    """
    ious = _curves(ious, min_ndim=2)
    return jnp.sum(failed_instances(ious, threshold, max_clicks, strict=strict), axis=-1, dtype=jnp.int32)


# ---- AuC -------------------------------------------------------------------------

@functools.partial(jax.jit, static_argnames=("num_clicks",))
def normalized_auc(curve, num_clicks: int | None = None) -> jnp.ndarray:
    """Area under a per-click curve, normalised to [0, 1] for scores in [0, 1].

    ``trapz(curve[..., :num_clicks], dx=1) / (num_clicks - 1)``.

    Args:
      curve: float[..., K].
      num_clicks: static int in [2, K] (default K), number of leading clicks used.

    Returns:
      float[...]; NaN wherever the used part of the curve holds a NaN.
    """
    curve = _curves(curve, "curve")
    num_clicks = _clicks(curve, num_clicks, "num_clicks")
    if num_clicks < 2:
        raise ValueError(f"num_clicks must be >= 2 for an area, got {num_clicks}")
    used = curve[..., :num_clicks]
    area = jnp.sum(used, axis=-1) - 0.5 * (used[..., 0] + used[..., -1])
    return area / (num_clicks - 1)


@functools.partial(jax.jit, static_argnames=("num_clicks",))
def rclicks_auc(ious, num_clicks: int = RCLICKS_NUM_CLICKS) -> jnp.ndarray:
    """RClicks IoU-AuC@20 per instance: :func:`normalized_auc` of each curve.

    Args:
      ious: float[..., K] with K >= num_clicks.
      num_clicks: static int (default 20).

    Returns:
      float[...], one AuC per instance (aggregate over instances/groups afterwards).
    """
    return normalized_auc(ious, num_clicks)


@functools.partial(jax.jit, static_argnames=("num_clicks", "skip_nan"))
def mean_curve(ious, num_clicks: int | None = None, *, skip_nan: bool = False) -> jnp.ndarray:
    """Mean per-click curve over the instance axis.

    Args:
      ious: float[..., N, K].
      num_clicks: static int in [1, K] (default K).
      skip_nan: drop instances with a NaN among their first ``num_clicks`` entries.

    Returns:
      float[..., num_clicks]; NaN where no instance is left.
    """
    ious = _curves(ious, min_ndim=2)
    num_clicks = _clicks(ious, num_clicks, "num_clicks")
    used = ious[..., :num_clicks]
    if not skip_nan:
        return jnp.mean(used, axis=-2)
    keep = jnp.all(~jnp.isnan(used), axis=-1, keepdims=True)
    count = jnp.sum(keep, axis=-2)
    total = jnp.sum(jnp.where(keep, used, 0.0), axis=-2)
    return jnp.where(count > 0, total / jnp.maximum(count, 1), jnp.nan)


@functools.partial(jax.jit, static_argnames=("num_clicks", "skip_nan"))
def tetris_auc(ious, num_clicks: int = TETRIS_NUM_CLICKS, *, skip_nan: bool = False) -> jnp.ndarray:
    """TETRIS AuC@10: normalised AuC of the mean curve over instances.

    Args:
      ious: float[..., N, K] (IoU or BIoU per click), K >= num_clicks.
      num_clicks: static int (default 10).
      skip_nan: see :func:`mean_curve`.

    Returns:
      float[...].
    """
    return normalized_auc(mean_curve(ious, num_clicks, skip_nan=skip_nan))


class MinMaxDelta(NamedTuple):
    """Robustness summary of a MIN (score-minimising) and a MAX run; each float[...]."""

    min: jnp.ndarray
    max: jnp.ndarray
    delta: jnp.ndarray  # max - min


@functools.partial(jax.jit, static_argnames=("num_clicks", "skip_nan"))
def tetris_min_max_delta(
    ious_min_run, ious_max_run, num_clicks: int = TETRIS_NUM_CLICKS, *, skip_nan: bool = False
) -> MinMaxDelta:
    """TETRIS IoU-Min / IoU-Max / IoU-D (docs/protocols/tetris.md §3.5).

    Args:
      ious_min_run, ious_max_run: float[..., N, K] per-click scores of the MIN
        and MAX attack runs (same instances).
      num_clicks: static int (default 10).
      skip_nan: see :func:`mean_curve` (applied to each run separately).

    Returns:
      MinMaxDelta(min=AuC(mean MIN curve), max=AuC(mean MAX curve), delta=max - min).
    """
    low = tetris_auc(ious_min_run, num_clicks, skip_nan=skip_nan)
    high = tetris_auc(ious_max_run, num_clicks, skip_nan=skip_nan)
    return MinMaxDelta(low, high, high - low)


def _mean_over_instances(values, skip_nan: bool) -> jnp.ndarray:
    values = _curves(values)
    if not skip_nan:
        return jnp.mean(values, axis=-1)
    keep = ~jnp.isnan(values)
    count = jnp.sum(keep, axis=-1)
    total = jnp.sum(jnp.where(keep, values, 0.0), axis=-1)
    return jnp.where(count > 0, total / jnp.maximum(count, 1), jnp.nan)


@functools.partial(jax.jit, static_argnames=("skip_nan",))
def breps_min_max_delta(final_min_run, final_max_run, *, skip_nan: bool = False) -> MinMaxDelta:
    """BREPS IoU-Min@BBox / IoU-Max@BBox / IoU-Δ@BBox (docs/protocols/breps.md §4.6).

    Args:
      final_min_run, final_max_run: float[..., N] final per-instance IoU of the
        MIN and MAX box attacks.
      skip_nan: drop NaN instances from each mean.

    Returns:
      MinMaxDelta of dataset means (float[...]) and their difference.
    """
    low = _mean_over_instances(final_min_run, skip_nan)
    high = _mean_over_instances(final_max_run, skip_nan)
    return MinMaxDelta(low, high, high - low)
