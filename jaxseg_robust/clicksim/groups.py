"""Clicking groups G1..G10: probability-mass bands of a clickability map, and sampling in a band.

Reference: docs/protocols/rclicks.md §5.2 steps 4-6 and §5.3 (C-R ``isegm/inference/clicker.py``).

Band rule (one group with mass bounds ``q_lo < q_hi``, default ``(g-1)/10, g/10``)::

    s = sort(M.ravel())  (ascending, zeros included),  c = cumsum(s),  S = total
    i_lo = first i with c[i] >= q_lo S      (searchsorted 'left')
    i_hi = first i with c[i] >  q_hi S      (searchsorted 'right'), clamped to n - 1
    band = { t_lo <= M <= t_hi },  t_lo = s[i_lo], t_hi = s[i_hi]     (both inclusive)

so adjacent groups share their boundary value, a band always carries at least its
nominal mass ``(q_hi - q_lo) S``, and the values strictly inside it carry at most
that mass. G1 holds the low-probability pixels of the first 10 % of the mass,
G10 the high-probability pixels of the last 10 %. One click is then drawn inside
the band **with probability proportional to M** (not uniformly; exact inverse-CDF
draw of ``sampling.sample_flat_indices``, zero-weight pixels are never drawn); if the band has
no mass (the reference's ``NaN`` check) the click falls back to the baseline
click, the first row-major maximum of the fallback (distance-transform) map.

Precision: the reference sorts and sums in float32 (``S`` by numpy's pairwise
sum, ``c`` by a sequential cumsum) and compares against ``q S`` in float64. Here
everything is float32, ``S`` is the last cumulative value (so ``q_hi = 1``
always reaches the maximum and ``q_lo = 0`` the minimum), and the indices are
found by counting cumulative values below the target (equal to the searchsorted
index for a monotone cumulative sum); thresholds can differ from the reference
only when a cumulative value is within float32 rounding of ``q S``.

All functions are pure ``jnp``, take explicit keys, and vmap over instances and
over groups (bounds may be traced).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxseg_robust.ops.sampling import flat_to_xy, sample_flat_indices

__all__ = [
    "DEFAULT_NUM_GROUPS",
    "group_bounds",
    "GroupBand",
    "band_thresholds",
    "band_mask",
    "band_weights",
    "masked_clickability",
    "first_argmax_xy",
    "GroupClick",
    "sample_group_click",
    "sample_group_clicks",
]

DEFAULT_NUM_GROUPS = 10


def group_bounds(num_groups: int = DEFAULT_NUM_GROUPS) -> np.ndarray:
    """Mass bounds of equal-mass clicking groups: ``[(0, 1/G), (1/G, 2/G), ..., ((G-1)/G, 1)]``.

    Args:
      num_groups: number of groups G >= 1 (benchmark: 10; G = 1 gives the full map,
        the ``SamplingUsersCount`` mode of §5.1).
    Returns:
      float64[G, 2] (``i / G`` equals the decimal literals the reference passes, e.g. 0.3).
    """
    num_groups = int(num_groups)
    if num_groups < 1:
        raise ValueError(f"num_groups must be >= 1, got {num_groups}")
    edges = [i / num_groups for i in range(num_groups + 1)]
    return np.array([edges[:-1], edges[1:]], np.float64).T


class GroupBand(NamedTuple):
    """Inclusive value thresholds of a band: pixels with ``low <= M <= high``."""

    low: jax.Array   # float32[...], t_lo
    high: jax.Array  # float32[...], t_hi


def _check_map(values: jax.Array, name: str) -> jax.Array:
    values = jnp.asarray(values)
    if values.ndim != 2 or values.size < 1:
        raise ValueError(f"{name} must be a non-empty 2-D array [H, W], got shape {values.shape}; "
                         "use jax.vmap for batches")
    return values


def _non_negative(values: jax.Array) -> jax.Array:
    values = values.astype(jnp.float32)
    return jnp.where(values > 0, values, 0.0)  # NaN and negatives -> 0


@jax.jit
def band_thresholds(clickability: jax.Array, q_low, q_high) -> GroupBand:
    """Value thresholds ``(t_lo, t_hi)`` of the mass band ``[q_low, q_high]`` (module doc).

    Args:
      clickability: float[H, W] non-negative map ``M`` (NaN / negative -> 0).
      q_low, q_high: float mass bounds in [0, 1] (scalars or arrays of one shape,
        e.g. ``group_bounds()[:, 0]`` and ``[:, 1]`` for all groups at once).
    Returns:
      GroupBand of float32 arrays with the shape of ``q_low``.
    """
    values = _non_negative(_check_map(clickability, "clickability")).reshape(-1)
    # Non-negative floats sort like their int32 bit patterns; XLA on CPU sorts int32 keys
    # faster than float32 keys (no NaN-aware comparator; experiments/benchmarks/bench_clicksim.py).
    ordered = lax.bitcast_convert_type(jnp.sort(lax.bitcast_convert_type(values, jnp.int32)), jnp.float32)
    cumulative = jnp.cumsum(ordered)
    total = cumulative[-1]
    q_low = jnp.asarray(q_low, jnp.float32)
    q_high = jnp.asarray(q_high, jnp.float32)
    # First index with c >= q S (resp. c > q S) = number of entries below (resp. not above) q S
    # for a monotone c; counting stays well defined if the parallel cumsum is off by an ulp.
    low_target, high_target = (q_low * total)[..., None], (q_high * total)[..., None]
    last = ordered.shape[0] - 1
    low_index = jnp.minimum(jnp.sum(cumulative < low_target, axis=-1), last)
    high_index = jnp.minimum(jnp.sum(cumulative <= high_target, axis=-1), last)
    return GroupBand(ordered[low_index], ordered[high_index])


@jax.jit
def band_mask(clickability: jax.Array, q_low, q_high) -> jax.Array:
    """Pixels of the mass band ``[q_low, q_high]``: ``t_lo <= M <= t_hi`` (both inclusive).

    Args:
      clickability: float[H, W] non-negative map.
      q_low, q_high: scalar mass bounds in [0, 1].
    Returns:
      bool[H, W] (zero-valued pixels belong to a band whose ``t_lo`` is 0; they carry no mass).
    """
    values = _non_negative(_check_map(clickability, "clickability"))
    band = band_thresholds(values, q_low, q_high)
    return (values >= band.low) & (values <= band.high)


@jax.jit
def band_weights(clickability: jax.Array, q_low, q_high) -> jax.Array:
    """Unnormalised sampling weights of one group: ``M`` inside the band, 0 outside.

    Args:
      clickability: float[H, W] non-negative map.
      q_low, q_high: scalar mass bounds in [0, 1].
    Returns:
      float32[H, W]; ``p = weights / sum(weights)`` is the group's click distribution.
    """
    values = _non_negative(_check_map(clickability, "clickability"))
    return jnp.where(band_mask(values, q_low, q_high), values, 0.0)


@jax.jit
def masked_clickability(clickability: jax.Array, region: jax.Array, not_clicked: jax.Array) -> jax.Array:
    """``M * R * not_clicked`` (§5.2 step 4): clickability restricted to the error region.

    Args:
      clickability: float[H, W] map from the clickability model.
      region: bool[H, W] error region of the round (whole FN or FP mask).
      not_clicked: bool[H, W], False at pixels already clicked.
    Returns:
      float32[H, W].
    """
    clickability = _check_map(clickability, "clickability").astype(jnp.float32)
    for name, mask in (("region", region), ("not_clicked", not_clicked)):
        if jnp.shape(mask) != clickability.shape:
            raise ValueError(f"{name} shape {jnp.shape(mask)} differs from clickability shape {clickability.shape}")
    keep = jnp.asarray(region).astype(bool) & jnp.asarray(not_clicked).astype(bool)
    return jnp.where(keep, clickability, 0.0)


@jax.jit
def first_argmax_xy(values: jax.Array) -> jax.Array:
    """(x, y) of the first row-major maximum of a map (the reference's ``np.where(dt == max)[0]``).

    Args:
      values: float[H, W].
    Returns:
      int32[2] point (x, y).
    """
    values = _check_map(values, "values")
    return flat_to_xy(jnp.argmax(values.reshape(-1)), values.shape[1])


class GroupClick(NamedTuple):
    """One simulated click of a clicking group."""

    xy: jax.Array             # int32[..., 2] pixel (x = column, y = row)
    used_fallback: jax.Array  # bool[...], True when the band had no mass and the baseline click was used


def _draw(key: jax.Array, weights: jax.Array, fallback_map: jax.Array) -> GroupClick:
    """One pixel with probability ``weights / sum(weights)`` (exact inverse CDF; zero weights never drawn)."""
    has_mass = jnp.sum(weights) > 0
    drawn = flat_to_xy(sample_flat_indices(key, weights, 1)[0], weights.shape[1])
    fallback = first_argmax_xy(fallback_map)
    return GroupClick(jnp.where(has_mass, drawn, fallback), ~has_mass)


def _check_fallback(fallback_map: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    fallback_map = jnp.asarray(fallback_map)
    if fallback_map.shape != shape:
        raise ValueError(f"fallback_map shape {fallback_map.shape} differs from clickability shape {shape}")
    return fallback_map


@jax.jit
def sample_group_click(key: jax.Array, clickability: jax.Array, q_low, q_high,
                       fallback_map: jax.Array) -> GroupClick:
    """One click of the group ``[q_low, q_high]`` drawn with probability proportional to ``M`` in the band.

    Args:
      key: jax random key (one per group and round).
      clickability: float[H, W] map already restricted to the error region and the
        not-clicked pixels (:func:`masked_clickability`).
      q_low, q_high: scalar mass bounds (may be traced; vmap over groups).
      fallback_map: float[H, W] map whose first row-major maximum is the fallback
        click (the chosen error's distance transform, ``error_region.choose_error_region``).
    Returns:
      GroupClick with ``xy`` int32[2] and ``used_fallback`` bool[].
    """
    clickability = _check_map(clickability, "clickability")
    fallback_map = _check_fallback(fallback_map, clickability.shape)
    return _draw(key, band_weights(clickability, q_low, q_high), fallback_map)


@jax.jit
def sample_group_clicks(key: jax.Array, clickability: jax.Array, bounds: jax.Array,
                        fallback_map: jax.Array) -> GroupClick:
    """One click per group on a shared map (e.g. round 1, or ``SamplingUsersCount``), sorting once.

    Args:
      key: jax random key; group ``g`` uses ``jax.random.split(key, G)[g]``.
      clickability: float[H, W] masked map (as in :func:`sample_group_click`).
      bounds: float[G, 2] mass bounds (``group_bounds()``).
      fallback_map: float[H, W] fallback map.
    Returns:
      GroupClick with ``xy`` int32[G, 2] and ``used_fallback`` bool[G]. Group g's
      draw equals ``sample_group_click(split(key, G)[g], M, *bounds[g], fallback_map)``.
    """
    values = _non_negative(_check_map(clickability, "clickability"))
    fallback_map = _check_fallback(fallback_map, values.shape)
    bounds = jnp.asarray(bounds, jnp.float32)
    if bounds.ndim != 2 or bounds.shape[1] != 2 or bounds.shape[0] < 1:
        raise ValueError(f"bounds must have shape [G, 2], got {bounds.shape}")
    bands = band_thresholds(values, bounds[:, 0], bounds[:, 1])
    keys = jax.random.split(key, bounds.shape[0])

    def one_group(group_key, low, high):
        weights = jnp.where((values >= low) & (values <= high), values, 0.0)
        return _draw(group_key, weights, fallback_map)

    return jax.vmap(one_group)(keys, bands.low, bands.high)
