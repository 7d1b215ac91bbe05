"""Drawing pixels from a non-negative weight map, and the per-image random keys.

Reference: docs/protocols/rclicks.md §5.3 (randomness) and §7 (bootstrap sampling).

The reference draws flat pixel indices with ``numpy.random.choice(p=w / sum w)``
from a global MT19937 stream. A JAX port cannot reproduce that stream; it uses
explicit keys (``image_key(seed, image_index)``) and matches the distribution:
every pixel ``i`` is drawn with probability ``w_i / sum w``, and a pixel of
weight 0 is **never** drawn.

Algorithm (inverse CDF): ``c = cumsum(w)``; draw ``r = (1 - u) c[-1]`` with
``u ~ U[0, 1)`` (so ``0 < r <= total``) and take the first index with
``c_i >= r``. ``jnp.cumsum`` is a parallel scan on CPU/GPU whose rounding can
give a zero-weight pixel a cumulative value one ulp above its predecessor; the
search therefore runs on ``cummax(where(w > 0, c, 0))``, which is exactly
constant across zero-weight pixels (max is exact) and monotone, so the first
index reaching ``r`` always has positive weight. Cost: O(H W) per map plus
O(log(H W)) per draw (cheaper than Gumbel-max ``jax.random.categorical``, which
needs H W random numbers per draw).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

__all__ = ["image_key", "sample_flat_indices", "sample_pixels", "flat_to_xy"]


def image_key(seed: int, image_index) -> jax.Array:
    """Random key of one image: ``fold_in(PRNGKey(seed), image_index)`` (§5.3).

    The reference re-seeds at the start of every image, so results are per-image
    deterministic and independent of batching; this key gives the same property.

    Args:
      seed: Python int run seed (reference default 42).
      image_index: int (may be traced) index of the image in the dataset's sample order.
    Returns:
      a ``jax.random.PRNGKey``-style uint32[2] key.
    """
    return jax.random.fold_in(jax.random.PRNGKey(seed), image_index)


def _check_weights(weights: jax.Array) -> jax.Array:
    weights = jnp.asarray(weights)
    if weights.ndim < 1 or weights.size < 1:
        raise ValueError(f"weights must be a non-empty array, got shape {weights.shape}")
    return weights


@functools.partial(jax.jit, static_argnames=("num",))
def sample_flat_indices(key: jax.Array, weights: jax.Array, num: int) -> jax.Array:
    """``num`` i.i.d. flat indices drawn with probability ``weights / sum(weights)``.

    Args:
      key: jax random key.
      weights: float[...] non-negative weights (any shape; flattened row-major).
        NaN or negative entries are treated as 0.
      num: static number of draws.
    Returns:
      int32[num] flat indices into ``weights.ravel()``; never an index of zero
      weight. When every weight is 0 the draws are all 0 (callers check
      ``sum(weights) > 0`` first).
    """
    weights = _check_weights(weights).reshape(-1).astype(jnp.float32)
    if num < 0:
        raise ValueError(f"num must be >= 0, got {num}")
    positive = weights > 0  # False for NaN and negative values
    weights = jnp.where(positive, weights, 0.0)
    cumulative = lax.cummax(jnp.where(positive, jnp.cumsum(weights), 0.0), axis=0)
    total = cumulative[-1]
    uniform = jax.random.uniform(key, (num,), jnp.float32)
    targets = (1.0 - uniform) * total
    index = jnp.searchsorted(cumulative, targets, side="left")
    return jnp.clip(index, 0, weights.shape[0] - 1).astype(jnp.int32)


def flat_to_xy(flat_index: jax.Array, width: int) -> jax.Array:
    """Row-major flat pixel indices to integer (x, y) points.

    Args:
      flat_index: int[...] indices into an ``[H, W]`` map.
      width: static map width ``W``.
    Returns:
      int32[..., 2] points (x = column, y = row).
    """
    flat_index = jnp.asarray(flat_index, jnp.int32)
    return jnp.stack([flat_index % width, flat_index // width], axis=-1)


@functools.partial(jax.jit, static_argnames=("num",))
def sample_pixels(key: jax.Array, weights: jax.Array, num: int) -> jax.Array:
    """``num`` i.i.d. pixels of an ``[H, W]`` weight map, as (x, y) points.

    Args:
      key: jax random key.
      weights: float[H, W] non-negative map (need not sum to 1).
      num: static number of draws.
    Returns:
      int32[num, 2] points (x, y), integer pixel coordinates, no jitter.
    """
    weights = _check_weights(weights)
    if weights.ndim != 2:
        raise ValueError(f"weights must be 2-D [H, W], got shape {weights.shape}")
    return flat_to_xy(sample_flat_indices(key, weights, num), weights.shape[1])
