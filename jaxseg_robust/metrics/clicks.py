"""Click-distribution metrics: PL1, Wasserstein distance, 2-D KS test, NSS, PDE (RClicks).

Reference: docs/protocols/rclicks.md §7 and §8.2 rows 10-11 (C-R
``scripts/evaluate_click_models.py``, ``rclicks/ndtest.py``).

Inputs per task: ground-truth clicks ``(x_k, y_k)``, ``k = 1..n`` (integer pixels,
clipped, §1.2), a predicted click map ``M`` on the full ``H x W`` image, and the
height and width ``h_o, w_o`` of the bounding box of the **GT object** ``G == 1``
(also for fn/fp tasks). ``P = M / sum M``.

=========  ==================================================================
PL1 (low)  per bootstrap set: mean over the n x n cross pairs (GT k, sample l) of
           ``|x_k - x^_l| / w_o + |y_k - y^_l| / h_o`` (GT-GT and sample-sample
           pairs are not included); mean over the sets.
WD (low)   per set: exact 1-Wasserstein (EMD) between the two equal-weight point
           sets, Euclidean ground distance, divided by ``sqrt(h_o**2 + w_o**2)``
           (``wd_normalization="diagonal"``, code, §8.2 #11) -- or computed on
           ``(x / w_o, y / h_o)`` (``"axes"``, the paper's wording); mean over sets.
KS (high)  per set: 2-sample 2-D KS test (Fasano-Franceschini variant of Peacock's
           test, Numerical-Recipes p-value, reference ``ndtest.ks2d2s``); KS = the
           fraction of sets with ``p > 0.05``. A NaN p (constant x or y in a sample)
           counts as "different".
NSS (high) ``Z = (P - mean P) / (std P + 1e-9)`` with ``P = M / (sum M + 1e-9)``;
           mean of ``Z[y_k, x_k]`` over GT clicks.
PDE (high) mean of ``P[y_k, x_k]`` over GT clicks (probability mass, not a log-likelihood).
=========  ==================================================================

Bootstrap (``bootstrap_click_sets``): ``num_sets`` (reference: 100) sets of ``n``
pixels drawn i.i.d. from ``P``; each of PL1, KS and WD draws its own sets. The
reference uses numpy's global stream seeded with 42; here explicit keys, so
bootstrap metrics agree with the reference in distribution (dataset means within
Monte-Carlo error), while NSS and PDE are deterministic and match to float32
rounding.

Padding: every jitted function takes optional ``valid`` masks so tasks with
different click counts share one compiled function (``clicksim.clicks_csv.pad_clicks``).
Everything except the Wasserstein distance is pure ``jnp`` (jit / vmap safe);
the EMD runs on the host with a maintained exact solver (scipy's assignment /
linear-programming solvers, or POT's network simplex).
"""

from __future__ import annotations

import functools
import math
from typing import Literal, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxseg_robust.ops.sampling import sample_pixels

__all__ = [
    "NSS_EPS",
    "PDE_EPS",
    "KS_ALPHA",
    "DEFAULT_NUM_SETS",
    "object_box_size",
    "click_probability",
    "nss",
    "pde",
    "pl1",
    "pl1_bootstrap",
    "kolmogorov_survival",
    "KS2DResult",
    "ks2d_statistic",
    "ks2d_test",
    "ks2d_bootstrap_rate",
    "wasserstein_distance",
    "wasserstein_bootstrap",
    "bootstrap_click_sets",
    "ClickMetrics",
    "evaluate_click_map",
    "mean_click_metrics",
]

NSS_EPS = 1e-9
PDE_EPS = 1e-9
KS_ALPHA = 0.05
DEFAULT_NUM_SETS = 100
# Terms of the two series of the Kolmogorov survival function (both converge geometrically fast).
_KOLMOGOROV_TERMS = 12


# ---- helpers ---------------------------------------------------------------------------

def _check_points(points: jax.Array, name: str) -> jax.Array:
    points = jnp.asarray(points)
    if points.ndim != 2 or points.shape[-1] != 2:
        raise ValueError(f"{name} must have shape [N, 2] (x, y), got {points.shape}; use jax.vmap for batches")
    return points


def _check_valid(valid: jax.Array | None, points: jax.Array, name: str) -> jax.Array:
    if valid is None:
        return jnp.ones(points.shape[:1], bool)
    valid = jnp.asarray(valid)
    if valid.shape != points.shape[:1]:
        raise ValueError(f"{name} must have shape {points.shape[:1]}, got {valid.shape}")
    return valid.astype(bool)


def _check_map(click_map: jax.Array) -> jax.Array:
    click_map = jnp.asarray(click_map)
    if click_map.ndim != 2 or click_map.size < 1:
        raise ValueError(f"click_map must be a non-empty 2-D array [H, W], got shape {click_map.shape}")
    return click_map.astype(jnp.float32)


def _masked_mean(values: jax.Array, weights: jax.Array) -> jax.Array:
    count = jnp.sum(weights)
    return jnp.where(count > 0, jnp.sum(jnp.where(weights, values, 0.0)) / jnp.maximum(count, 1), jnp.nan)


def _values_at(array: jax.Array, points: jax.Array) -> jax.Array:
    height, width = array.shape
    xs = jnp.clip(points[:, 0].astype(jnp.int32), 0, width - 1)
    ys = jnp.clip(points[:, 1].astype(jnp.int32), 0, height - 1)
    return array[ys, xs]


# ---- map-based metrics -------------------------------------------------------------------

@jax.jit
def object_box_size(gt_mask: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Height and width of the bounding box of ``gt_mask == 1`` (reference ``get_height_width``).

    Args:
      gt_mask: bool or numeric [H, W] GT object mask.
    Returns:
      ``(h_o, w_o)`` int32 scalars in pixels (``max - min + 1``); ``(0, 0)`` when empty.
    """
    gt_mask = jnp.asarray(gt_mask)
    if gt_mask.ndim != 2:
        raise ValueError(f"gt_mask must be 2-D [H, W], got shape {gt_mask.shape}")
    inside = gt_mask == 1
    rows, cols = jnp.any(inside, axis=1), jnp.any(inside, axis=0)

    def extent(flags):
        index = jnp.arange(flags.shape[0])
        first = jnp.min(jnp.where(flags, index, flags.shape[0]))
        last = jnp.max(jnp.where(flags, index, -1))
        return jnp.where(jnp.any(flags), last - first + 1, 0).astype(jnp.int32)

    return extent(rows), extent(cols)


@jax.jit
def click_probability(click_map: jax.Array, eps: float = NSS_EPS) -> jax.Array:
    """``P = M / (sum M + eps)`` as float32[H, W] (the normalisation of NSS and PDE)."""
    click_map = _check_map(click_map)
    return click_map / (jnp.sum(click_map) + eps)


@jax.jit
def nss(click_map: jax.Array, points_xy: jax.Array, valid: jax.Array | None = None,
        eps: float = NSS_EPS) -> jax.Array:
    """Normalised scanpath saliency of GT clicks under a click map (§7).

    Args:
      click_map: float[H, W] non-negative predicted map ``M`` (any scale).
      points_xy: int[N, 2] GT clicks (x, y); clipped into the image.
      valid: optional bool[N] (padding slots False).
      eps: added to the sum and to the (population) std, 1e-9 as in the reference.
    Returns:
      float32 scalar; NaN when no slot is valid; 0 for a constant map (exact value,
      where float32 rounding noise would otherwise be divided by ``eps``).
    """
    points_xy = _check_points(points_xy, "points_xy")
    valid = _check_valid(valid, points_xy, "valid")
    probability = click_probability(click_map, eps)
    standardised = (probability - jnp.mean(probability)) / (jnp.std(probability) + eps)
    # A constant map has P - mean P = 0 exactly; float32 rounding of the mean would
    # otherwise be amplified by the 1e-9 denominator.
    standardised = jnp.where(jnp.max(probability) > jnp.min(probability), standardised, 0.0)
    return _masked_mean(_values_at(standardised, points_xy), valid)


@jax.jit
def pde(click_map: jax.Array, points_xy: jax.Array, valid: jax.Array | None = None,
        eps: float = PDE_EPS) -> jax.Array:
    """Mean probability mass ``P[y_k, x_k]`` of the GT clicks (§7 PDE; ``P = M / (sum M + eps)``).

    Args:
      click_map: float[H, W] non-negative predicted map.
      points_xy: int[N, 2] GT clicks (x, y); clipped into the image.
      valid: optional bool[N].
      eps: 1e-9 as in the reference.
    Returns:
      float32 scalar; NaN when no slot is valid.
    """
    points_xy = _check_points(points_xy, "points_xy")
    valid = _check_valid(valid, points_xy, "valid")
    return _masked_mean(_values_at(click_probability(click_map, eps), points_xy), valid)


# ---- PL1 ------------------------------------------------------------------------------------

@jax.jit
def pl1(gt_xy: jax.Array, sample_xy: jax.Array, box_height, box_width,
        gt_valid: jax.Array | None = None, sample_valid: jax.Array | None = None) -> jax.Array:
    """Mean normalised L1 distance over all (GT, sample) cross pairs of one set (§7 PL1, §8.2 #10).

    Args:
      gt_xy: int or float[N, 2] GT clicks (x, y).
      sample_xy: [M, 2] sampled clicks (x, y).
      box_height, box_width: GT object bbox size ``h_o, w_o`` in pixels (> 0).
      gt_valid, sample_valid: optional bool masks of the slots.
    Returns:
      float32 scalar ``mean_{k,l} |dx| / w_o + |dy| / h_o``; NaN without valid pairs.
    """
    gt_xy = _check_points(gt_xy, "gt_xy").astype(jnp.float32)
    sample_xy = _check_points(sample_xy, "sample_xy").astype(jnp.float32)
    gt_valid = _check_valid(gt_valid, gt_xy, "gt_valid")
    sample_valid = _check_valid(sample_valid, sample_xy, "sample_valid")
    scale = jnp.stack([1.0 / jnp.asarray(box_width, jnp.float32), 1.0 / jnp.asarray(box_height, jnp.float32)])
    distance = jnp.sum(jnp.abs(gt_xy[:, None, :] - sample_xy[None, :, :]) * scale, axis=-1)
    return _masked_mean(distance, gt_valid[:, None] & sample_valid[None, :])


@jax.jit
def pl1_bootstrap(gt_xy: jax.Array, sample_sets: jax.Array, box_height, box_width,
                  gt_valid: jax.Array | None = None, sample_valid: jax.Array | None = None) -> jax.Array:
    """PL1 averaged over bootstrap sets.

    Args:
      gt_xy: [N, 2] GT clicks; sample_sets: [B, M, 2] sampled sets; box size as in :func:`pl1`.
      gt_valid: optional bool[N]; sample_valid: optional bool[M] (same for every set).
    Returns:
      float32 scalar, mean over the B sets of :func:`pl1`.
    """
    return jnp.mean(jax.vmap(lambda s: pl1(gt_xy, s, box_height, box_width, gt_valid, sample_valid))(
        jnp.asarray(sample_sets)))


# ---- 2-D Kolmogorov-Smirnov ----------------------------------------------------------------

@jax.jit
def kolmogorov_survival(d: jax.Array) -> jax.Array:
    """Survival function of the Kolmogorov distribution, ``Q_KS(d) = 2 sum_j (-1)^(j-1) exp(-2 j^2 d^2)``.

    Equals ``scipy.stats.kstwobign.sf``. For ``d < 1`` the equivalent theta-function
    form ``1 - sqrt(2 pi) / d sum_j exp(-(2j-1)^2 pi^2 / (8 d^2))`` is used (it
    converges fast there); both series are truncated after 12 terms.

    Args:
      d: float array, statistic values.
    Returns:
      float32 array in [0, 1] (1 for ``d <= 0``; NaN propagates).
    """
    d = jnp.asarray(d, jnp.float32)
    j = jnp.arange(1, _KOLMOGOROV_TERMS + 1, dtype=jnp.float32)
    safe = jnp.maximum(d, 1e-3)[..., None]
    odd = 2.0 * j - 1.0
    small = 1.0 - jnp.sqrt(2.0 * jnp.pi) / safe[..., 0] * jnp.sum(
        jnp.exp(-(odd * odd) * (jnp.pi ** 2) / (8.0 * safe * safe)), axis=-1)
    signs = jnp.where(j % 2 == 1, 1.0, -1.0)
    large = 2.0 * jnp.sum(signs * jnp.exp(-2.0 * j * j * safe * safe), axis=-1)
    value = jnp.where(d < 1.0, small, large)
    value = jnp.where(d <= 0.0, 1.0, value)
    return jnp.where(jnp.isnan(d), jnp.nan, jnp.clip(value, 0.0, 1.0))


def _quadrant_fractions(origins: jax.Array, points: jax.Array, valid: jax.Array) -> jax.Array:
    """Fractions of valid ``points`` in the 4 quadrants around each origin: float32[No, 4] (a, b, c, d).

    a: x <= ox and y <= oy; b: x <= ox and y > oy; c: x > ox and y <= oy; d = 1 - a - b - c.
    """
    left = points[None, :, 0] <= origins[:, None, 0]
    below = points[None, :, 1] <= origins[:, None, 1]
    weight = valid[None, :]
    count = jnp.maximum(jnp.sum(valid), 1).astype(jnp.float32)
    a = jnp.sum(left & below & weight, axis=1) / count
    b = jnp.sum(left & ~below & weight, axis=1) / count
    c = jnp.sum(~left & below & weight, axis=1) / count
    return jnp.stack([a, b, c, 1.0 - a - b - c], axis=-1)


def _max_distance(xy1: jax.Array, valid1: jax.Array, xy2: jax.Array, valid2: jax.Array) -> jax.Array:
    """Reference ``maxdist``: largest quadrant-fraction difference over origins of sample 1."""
    n1 = jnp.maximum(jnp.sum(valid1), 1).astype(jnp.float32)
    diff = _quadrant_fractions(xy1, xy1, valid1) - _quadrant_fractions(xy1, xy2, valid2)
    diff = diff.at[:, 0].add(-1.0 / n1)  # the origin itself sits in quadrant a of sample 1
    rows = valid1[:, None]
    lowest = jnp.min(jnp.where(rows, diff, jnp.inf))
    highest = jnp.max(jnp.where(rows, diff, -jnp.inf))
    return jnp.maximum(-lowest, highest + 1.0 / n1)


@jax.jit
def ks2d_statistic(xy1: jax.Array, xy2: jax.Array, valid1: jax.Array | None = None,
                   valid2: jax.Array | None = None) -> jax.Array:
    """Fasano-Franceschini statistic ``D = (maxdist(S1, S2) + maxdist(S2, S1)) / 2`` (reference ``avgmaxdist``).

    Args:
      xy1: [N1, 2] sample 1 (x, y); xy2: [N2, 2] sample 2.
      valid1, valid2: optional bool slot masks.
    Returns:
      float32 scalar in [0, 1]; ties count as ``<=`` on both axes.
    """
    xy1 = _check_points(xy1, "xy1").astype(jnp.float32)
    xy2 = _check_points(xy2, "xy2").astype(jnp.float32)
    valid1 = _check_valid(valid1, xy1, "valid1")
    valid2 = _check_valid(valid2, xy2, "valid2")
    return 0.5 * (_max_distance(xy1, valid1, xy2, valid2) + _max_distance(xy2, valid2, xy1, valid1))


def _pearson(xy: jax.Array, valid: jax.Array) -> jax.Array:
    """Pearson correlation of x and y over the valid points; NaN when x or y is constant."""
    count = jnp.maximum(jnp.sum(valid), 1).astype(jnp.float32)
    mean = jnp.sum(jnp.where(valid[:, None], xy, 0.0), axis=0) / count
    centred = jnp.where(valid[:, None], xy - mean, 0.0)
    cov = jnp.sum(centred[:, 0] * centred[:, 1])
    var = jnp.sum(centred * centred, axis=0)
    lo = jnp.min(jnp.where(valid[:, None], xy, jnp.inf), axis=0)
    hi = jnp.max(jnp.where(valid[:, None], xy, -jnp.inf), axis=0)
    constant = jnp.any(lo >= hi)  # also True with fewer than two valid points
    r = cov / jnp.sqrt(jnp.maximum(var[0] * var[1], jnp.finfo(jnp.float32).tiny))
    return jnp.where(constant, jnp.nan, jnp.clip(r, -1.0, 1.0))


class KS2DResult(NamedTuple):
    """Two-sample 2-D KS test outcome."""

    statistic: jax.Array  # float32, D
    pvalue: jax.Array     # float32, Q_KS(d); NaN when a sample has constant x or y


@jax.jit
def ks2d_test(xy1: jax.Array, xy2: jax.Array, valid1: jax.Array | None = None,
              valid2: jax.Array | None = None) -> KS2DResult:
    """Two-sample 2-D KS test of reference ``ndtest.ks2d2s`` (analytic p-value, no bootstrap).

    ``Ne = n1 n2 / (n1 + n2)``, ``r = sqrt(1 - (r1^2 + r2^2) / 2)`` with the Pearson
    correlations ``r_i`` of each sample, ``d = D sqrt(Ne) / (1 + r (0.25 - 0.75 / sqrt(Ne)))``,
    ``p = Q_KS(d)``. Axis order does not matter.

    Args:
      xy1: [N1, 2] sample 1 (x, y); xy2: [N2, 2] sample 2.
      valid1, valid2: optional bool slot masks.
    Returns:
      KS2DResult(statistic, pvalue) float32 scalars.
    """
    xy1 = _check_points(xy1, "xy1").astype(jnp.float32)
    xy2 = _check_points(xy2, "xy2").astype(jnp.float32)
    valid1 = _check_valid(valid1, xy1, "valid1")
    valid2 = _check_valid(valid2, xy2, "valid2")
    statistic = ks2d_statistic(xy1, xy2, valid1, valid2)
    n1 = jnp.sum(valid1).astype(jnp.float32)
    n2 = jnp.sum(valid2).astype(jnp.float32)
    root_ne = jnp.sqrt(n1 * n2 / jnp.maximum(n1 + n2, 1.0))
    r1, r2 = _pearson(xy1, valid1), _pearson(xy2, valid2)
    r = jnp.sqrt(jnp.maximum(1.0 - 0.5 * (r1 * r1 + r2 * r2), 0.0))
    d = statistic * root_ne / (1.0 + r * (0.25 - 0.75 / jnp.maximum(root_ne, 1e-30)))
    pvalue = jnp.where((n1 > 0) & (n2 > 0), kolmogorov_survival(d), jnp.nan)
    return KS2DResult(statistic, pvalue)


@jax.jit
def ks2d_bootstrap_rate(gt_xy: jax.Array, sample_sets: jax.Array, gt_valid: jax.Array | None = None,
                        sample_valid: jax.Array | None = None, alpha: float = KS_ALPHA) -> jax.Array:
    """Fraction of bootstrap sets not significantly different from the GT clicks (§7 KS).

    Args:
      gt_xy: [N, 2] GT clicks; sample_sets: [B, M, 2] sampled sets.
      gt_valid: optional bool[N]; sample_valid: optional bool[M] (same for every set).
      alpha: significance level (0.05); a set counts when ``p > alpha`` (NaN p does not).
    Returns:
      float32 scalar in [0, 1] (multiples of 1/B).
    """
    pvalues = jax.vmap(lambda s: ks2d_test(gt_xy, s, gt_valid, sample_valid).pvalue)(jnp.asarray(sample_sets))
    return jnp.mean((pvalues > alpha).astype(jnp.float32))


# ---- Wasserstein distance (host) ------------------------------------------------------------

def _as_host_points(points, name: str) -> np.ndarray:
    points = np.asarray(points, np.float64)
    if points.ndim != 2 or points.shape[1] != 2 or points.shape[0] < 1:
        raise ValueError(f"{name} must have shape [N, 2] with N >= 1, got {points.shape}")
    if not np.all(np.isfinite(points)):
        raise ValueError(f"{name} must be finite")
    return points


def _as_host_weights(weights, count: int, name: str) -> np.ndarray | None:
    if weights is None:
        return None
    weights = np.asarray(weights, np.float64)
    if weights.shape != (count,) or np.any(weights < 0) or not np.all(np.isfinite(weights)) or weights.sum() <= 0:
        raise ValueError(f"{name} must be {count} finite non-negative weights with a positive sum")
    return weights / weights.sum()


def wasserstein_distance(points_a, points_b, weights_a=None, weights_b=None, *,
                         solver: Literal["scipy", "pot"] = "scipy") -> float:
    """Exact 1-Wasserstein distance (earth mover's distance) between two weighted 2-D point sets.

    Ground distance: Euclidean. Equal weights by default (the metric of §7 compares
    two sets of n points each, where the EMD equals the mean cost of the optimal
    one-to-one assignment).

    Args:
      points_a: float[Na, 2]; points_b: float[Nb, 2] (host arrays; any units).
      weights_a, weights_b: optional non-negative weights (normalised to sum 1).
      solver: ``"scipy"`` (default): ``scipy.optimize.linear_sum_assignment`` for equal
        sizes without weights, else ``scipy.stats.wasserstein_distance_nd`` (the
        reference's function, scipy >= 1.13); ``"pot"``: ``ot.emd2`` (exact network
        simplex) from the optional POT package.
    Returns:
      Python float, in the units of the points.
    Raises:
      ImportError with an install hint when the chosen solver is missing.
    """
    a = _as_host_points(points_a, "points_a")
    b = _as_host_points(points_b, "points_b")
    wa = _as_host_weights(weights_a, a.shape[0], "weights_a")
    wb = _as_host_weights(weights_b, b.shape[0], "weights_b")
    if solver == "scipy":
        if wa is None and wb is None and a.shape[0] == b.shape[0]:
            from scipy.optimize import linear_sum_assignment
            cost = np.sqrt(np.sum((a[:, None, :] - b[None, :, :]) ** 2, axis=-1))
            rows, cols = linear_sum_assignment(cost)
            return float(cost[rows, cols].mean())
        try:
            from scipy.stats import wasserstein_distance_nd
        except ImportError as error:
            raise ImportError("unequal or weighted point sets need scipy >= 1.13 "
                              "(scipy.stats.wasserstein_distance_nd), or solver='pot'") from error
        return float(wasserstein_distance_nd(a, b, wa, wb))
    if solver == "pot":
        try:
            import ot
        except ImportError as error:
            raise ImportError("solver='pot' needs the POT package: pip install 'pot>=0.9' "
                              "(or the jaxseg_robust 'rclicks' extra)") from error
        ua = np.full(a.shape[0], 1.0 / a.shape[0]) if wa is None else wa
        ub = np.full(b.shape[0], 1.0 / b.shape[0]) if wb is None else wb
        cost = ot.dist(a, b, metric="euclidean")
        return float(ot.emd2(ua, ub, cost, numItermax=10_000_000))
    raise ValueError(f"solver must be 'scipy' or 'pot', got {solver!r}")


def wasserstein_bootstrap(gt_xy, sample_sets, box_height, box_width, *, gt_count: int | None = None,
                          normalization: Literal["diagonal", "axes"] = "diagonal",
                          solver: Literal["scipy", "pot"] = "scipy") -> float:
    """Normalised Wasserstein distance averaged over bootstrap sets (§7 WD).

    Args:
      gt_xy: [N, 2] GT clicks (x, y); sample_sets: [B, M, 2] sampled sets.
      box_height, box_width: GT object bbox size (> 0).
      gt_count: use only the first ``gt_count`` GT points and sample points of each
        set (padding slots beyond); None = all.
      normalization: ``"diagonal"`` (code): EMD / ``sqrt(h_o^2 + w_o^2)``; ``"axes"``
        (paper wording): EMD of the points scaled to ``(x / w_o, y / h_o)``.
      solver: see :func:`wasserstein_distance`.
    Returns:
      Python float.
    """
    gt = np.asarray(gt_xy, np.float64)
    sets = np.asarray(sample_sets, np.float64)
    if sets.ndim != 3 or sets.shape[-1] != 2 or sets.shape[0] < 1:
        raise ValueError(f"sample_sets must have shape [B, M, 2] with B >= 1, got {sets.shape}")
    if gt_count is not None:
        gt, sets = gt[:gt_count], sets[:, :gt_count]
    box_height, box_width = float(box_height), float(box_width)
    if box_height <= 0 or box_width <= 0:
        raise ValueError(f"box size must be positive, got {box_height}x{box_width}")
    if normalization == "diagonal":
        scale, divisor = np.ones(2), math.hypot(box_height, box_width)
    elif normalization == "axes":
        scale, divisor = np.array([1.0 / box_width, 1.0 / box_height]), 1.0
    else:
        raise ValueError(f"normalization must be 'diagonal' or 'axes', got {normalization!r}")
    values = [wasserstein_distance(gt * scale, one * scale, solver=solver) / divisor for one in sets]
    return float(np.mean(values))


# ---- bootstrap and the per-task driver -----------------------------------------------------

@functools.partial(jax.jit, static_argnames=("num_points", "num_sets"))
def bootstrap_click_sets(key: jax.Array, click_map: jax.Array, num_points: int,
                         num_sets: int = DEFAULT_NUM_SETS) -> jax.Array:
    """``num_sets`` sets of ``num_points`` pixels drawn i.i.d. from ``P = M / sum M`` (reference ``sample_from_dist``).

    Args:
      key: jax random key.
      click_map: float[H, W] non-negative map with a positive sum.
      num_points: static points per set (the task's GT click count, or a padded slot count).
      num_sets: static number of sets (reference ``BNUM = 100``).
    Returns:
      int32[num_sets, num_points, 2] integer pixel points (x, y), no jitter.
    """
    points = sample_pixels(key, _check_map(click_map), num_sets * num_points)
    return points.reshape(num_sets, num_points, 2)


class ClickMetrics(NamedTuple):
    """Click-distribution metrics of one task (Python floats)."""

    pl1: float
    ks: float
    wd: float
    nss: float
    pde: float


def mean_click_metrics(per_task, *, skip_nan: bool = True) -> ClickMetrics:
    """Dataset value of each metric: the plain mean over tasks (§7; click types pooled, tasks weighted equally).

    Args:
      per_task: non-empty sequence of ClickMetrics.
      skip_nan: True (default) skips NaN task values per metric, as the reference's
        pandas ``groupby(...).mean()`` does; False propagates them.
    Returns:
      ClickMetrics of Python floats (NaN for a metric with no finite task value).
    """
    per_task = list(per_task)
    if not per_task:
        raise ValueError("per_task must hold at least one ClickMetrics")
    values = np.array([tuple(m) for m in per_task], np.float64)
    if not skip_nan:
        return ClickMetrics(*(float(v) for v in values.mean(axis=0)))
    counts = np.sum(~np.isnan(values), axis=0)
    sums = np.nansum(values, axis=0)
    return ClickMetrics(*(float(t / c) if c else float("nan") for t, c in zip(sums, counts)))


def _slot_count(count: int) -> int:
    """Bucketed slot count (next power of two, at least 8) so tasks share compiled functions."""
    return max(8, 1 << (int(count) - 1).bit_length())


def evaluate_click_map(key: jax.Array, click_map, gt_xs, gt_ys, gt_mask, *,
                       num_sets: int = DEFAULT_NUM_SETS, alpha: float = KS_ALPHA,
                       wd_normalization: Literal["diagonal", "axes"] = "diagonal",
                       wd_solver: Literal["scipy", "pot"] = "scipy") -> ClickMetrics:
    """All five metrics of one task (§7): PL1, KS and WD bootstrapped, each with its own sets.

    Args:
      key: jax random key of the task; split into three (PL1, KS, WD sets).
      click_map: float[H, W] predicted map (positive sum).
      gt_xs, gt_ys: int[n] GT clicks (clipped, §1.2), n >= 1.
      gt_mask: [H, W] GT object mask (its bounding box normalises PL1 and WD).
      num_sets: bootstrap sets per metric (100).
      alpha: KS significance level (0.05).
      wd_normalization, wd_solver: see :func:`wasserstein_bootstrap`.
    Returns:
      ClickMetrics of Python floats.
    Raises:
      ValueError for no clicks, an empty GT mask, a map of zero sum or mismatched shapes.
    """
    click_map = np.asarray(click_map, np.float32)
    gt_mask = np.asarray(gt_mask)
    if click_map.ndim != 2 or gt_mask.shape != click_map.shape:
        raise ValueError(f"click_map {click_map.shape} and gt_mask {gt_mask.shape} must be 2-D of one shape")
    if not np.isfinite(click_map).all() or not click_map.sum() > 0 or (click_map < 0).any():
        raise ValueError("click_map must be finite, non-negative, with a positive sum")
    gt_xs, gt_ys = np.asarray(gt_xs), np.asarray(gt_ys)
    count = int(gt_xs.shape[0]) if gt_xs.ndim == 1 else 0
    if count < 1 or gt_ys.shape != gt_xs.shape:
        raise ValueError(f"gt_xs and gt_ys must be 1-D of one length >= 1, got {gt_xs.shape} and {gt_ys.shape}")
    box_height, box_width = (int(v) for v in object_box_size(gt_mask))
    if box_height == 0:
        raise ValueError("gt_mask has no pixel equal to 1 (the object box normalises PL1 and WD)")
    slots = _slot_count(count)
    gt_points = np.zeros((slots, 2), np.int32)
    gt_points[:count, 0], gt_points[:count, 1] = gt_xs, gt_ys
    valid = np.arange(slots) < count
    key_pl1, key_ks, key_wd = jax.random.split(key, 3)
    pl1_sets = bootstrap_click_sets(key_pl1, click_map, slots, num_sets)
    ks_sets = bootstrap_click_sets(key_ks, click_map, slots, num_sets)
    wd_sets = np.asarray(bootstrap_click_sets(key_wd, click_map, slots, num_sets))
    return ClickMetrics(
        pl1=float(pl1_bootstrap(gt_points, pl1_sets, box_height, box_width, valid, valid)),
        ks=float(ks2d_bootstrap_rate(gt_points, ks_sets, valid, valid, alpha)),
        wd=wasserstein_bootstrap(gt_points, wd_sets, box_height, box_width, gt_count=count,
                                 normalization=wd_normalization, solver=wd_solver),
        nss=float(nss(click_map, gt_points, valid)),
        pde=float(pde(click_map, gt_points, valid)),
    )
