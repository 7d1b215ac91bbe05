"""Random parameters of sensible scale, drawn on the host (no initialiser to compile).

Compiling a Flax ``init`` costs seconds to minutes (every initialiser becomes
an RNG kernel), which dominates tests and benchmarks that only need *some*
weights. `random_params` fills a tree of shapes with numpy draws chosen by
the leaf name, deterministically from a seed or a JAX key:

  * ``kernel`` (Dense [in, out], Conv [kh, kw, in, out]): uniform
    ±1/sqrt(fan_in), fan_in = prod(shape[:-1]) (torch's default scale);
  * ``bias``: uniform ±0.1;
  * ``scale`` (LayerNorm): 1 + 0.1 N(0, 1);
  * ``pos_embed``, ``rel_pos_h``, ``rel_pos_w``: N(0, 0.02²) (zero in SAM's
    training init; non-zero here so those paths are exercised);
  * ``var``, ``mean`` (TinyViT's frozen BatchNorm statistics): U(0.5, 1.5)
    (a variance must be positive) and N(0, 0.1²);
  * anything else (token/point embeddings, the Fourier matrix): N(0, 1),
    as torch's ``nn.Embedding`` / ``randn``.
"""

from __future__ import annotations

from typing import Mapping

import jax
import numpy as np
from flax import traverse_util


def _seed(key_or_seed) -> int:
    if isinstance(key_or_seed, (int, np.integer)):
        return int(key_or_seed)
    data = np.asarray(jax.random.key_data(key_or_seed)).astype(np.uint64).ravel()
    return int(sum(int(v) << (32 * i) for i, v in enumerate(data)))


def draw_leaf(rng: np.random.Generator, name: str, shape: tuple[int, ...]) -> np.ndarray:
    """One float32 array of ``shape`` for a parameter called ``name`` (rules above)."""
    if name == "kernel":
        bound = 1.0 / np.sqrt(max(int(np.prod(shape[:-1])), 1))
        return rng.uniform(-bound, bound, shape).astype(np.float32)
    if name == "bias":
        return rng.uniform(-0.1, 0.1, shape).astype(np.float32)
    if name == "scale":
        return (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
    if name == "var":
        return rng.uniform(0.5, 1.5, shape).astype(np.float32)
    if name == "mean":
        return (0.1 * rng.standard_normal(shape)).astype(np.float32)
    if name in ("pos_embed", "rel_pos_h", "rel_pos_w"):
        return (0.02 * rng.standard_normal(shape)).astype(np.float32)
    return rng.standard_normal(shape).astype(np.float32)


def random_params(shapes: Mapping, key_or_seed) -> dict:
    """Fills a (nested) tree of arrays/ShapeDtypeStructs with random float32 values.

    Args:
      shapes: nested dict whose leaves have ``.shape`` (e.g. from ``jax.eval_shape``).
      key_or_seed: an int seed or a JAX PRNG key (deterministic either way).

    Returns:
      A nested dict of jax arrays with the same structure.
    """
    rng = np.random.default_rng(_seed(key_or_seed))
    flat = traverse_util.flatten_dict(dict(shapes))
    out = {path: jax.numpy.asarray(draw_leaf(rng, path[-1], tuple(leaf.shape)))
           for path, leaf in sorted(flat.items())}
    return traverse_util.unflatten_dict(out)
