"""Declarative, strict mapping of PyTorch state-dict keys to Flax parameter paths.

A port is a list of `Rule`s. Each rule matches torch keys with a regular
expression (anchored at both ends) and names the Flax parameter path with
``\\1``-style back-references, plus a transform that turns the torch tensor
layout into the Flax one (e.g. transposing a Linear weight).

`convert` is strict:
  * every source key must be matched by exactly one rule (an unmapped or an
    ambiguously mapped key is an error that names the key);
  * two source keys may not land on the same target path;
  * every target parameter must be filled, with exactly its expected shape
    and a floating dtype.
Nothing is ever filled or skipped silently.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Callable, Mapping

import numpy as np
from flax import traverse_util

ArrayTransform = Callable[[np.ndarray], np.ndarray]


class PortError(ValueError):
    """A checkpoint does not fit the target model; the message names the key."""


# ---- tensor layout transforms (torch layout -> flax layout) -----------------

def identity(x: np.ndarray) -> np.ndarray:
    """Unchanged (biases, norms, embeddings, free parameters)."""
    return x


def linear(x: np.ndarray) -> np.ndarray:
    """torch Linear weight [out, in] -> flax Dense kernel [in, out]."""
    if x.ndim != 2:
        raise PortError(f"a Linear weight must be 2-D, got shape {x.shape}")
    return x.T


def conv(x: np.ndarray) -> np.ndarray:
    """torch Conv2d weight [out, in/groups, kh, kw] -> flax Conv [kh, kw, in/groups, out]."""
    if x.ndim != 4:
        raise PortError(f"a Conv2d weight must be 4-D, got shape {x.shape}")
    return np.transpose(x, (2, 3, 1, 0))


def conv_transpose(x: np.ndarray) -> np.ndarray:
    """torch ConvTranspose2d weight [in, out, kh, kw] -> flax ConvTranspose kernel.

    Returns [kh, kw, in, out] flipped spatially, which is what
    ``nn.ConvTranspose(..., transpose_kernel=False)`` needs to reproduce
    torch's transposed convolution (stride s, kernel s, no padding).
    """
    if x.ndim != 4:
        raise PortError(f"a ConvTranspose2d weight must be 4-D, got shape {x.shape}")
    return np.transpose(x, (2, 3, 0, 1))[::-1, ::-1].copy()


@dataclasses.dataclass(frozen=True)
class Rule:
    """torch key regex -> flax path template (``/``-separated), with a transform."""

    pattern: str
    target: str
    transform: ArrayTransform = identity

    def match(self, key: str) -> str | None:
        """Returns the flax path for ``key`` or None when the rule does not apply."""
        m = re.fullmatch(self.pattern, key)
        if m is None:
            return None
        return m.expand(self.target)


def convert(
    state_dict: Mapping[str, np.ndarray],
    rules: list[Rule],
    expected: Mapping,
    *,
    what: str = "checkpoint",
) -> dict:
    """Maps a torch state dict onto a Flax parameter tree, strictly.

    Args:
      state_dict: torch key -> numpy array (already detached, on CPU).
      rules: the declarative key table.
      expected: a (nested) pytree of arrays or ShapeDtypeStructs giving every
        target parameter and its shape, e.g. ``jax.eval_shape(model.init, ...)``.
      what: a name for error messages (the checkpoint path, the family).

    Returns:
      A nested dict with the structure of ``expected`` holding float32 numpy
      arrays.

    Raises:
      PortError: naming the offending key, for an unmapped, ambiguous,
        duplicated, unexpected, mis-shaped, non-float or missing entry.
    """
    flat_expected = traverse_util.flatten_dict(dict(expected), sep="/")
    out: dict[str, np.ndarray] = {}
    source_of: dict[str, str] = {}
    for key, value in state_dict.items():
        hits = [(r, r.match(key)) for r in rules]
        hits = [(r, t) for r, t in hits if t is not None]
        if not hits:
            raise PortError(f"{what}: key '{key}' is not used by any rule of this model family "
                            f"(wrong family or a corrupt checkpoint?)")
        if len(hits) > 1:
            raise PortError(f"{what}: key '{key}' matches {len(hits)} rules "
                            f"({[r.pattern for r, _ in hits]}); the key table is ambiguous")
        rule, target = hits[0]
        if target in source_of:
            raise PortError(f"{what}: keys '{source_of[target]}' and '{key}' both map to '{target}'")
        if target not in flat_expected:
            raise PortError(f"{what}: key '{key}' maps to '{target}', which the model does not have")
        array = np.asarray(value)
        if not np.issubdtype(array.dtype, np.floating):
            raise PortError(f"{what}: key '{key}' has dtype {array.dtype}, expected a float tensor")
        try:
            array = rule.transform(array)
        except PortError as err:
            raise PortError(f"{what}: key '{key}': {err}") from None
        want = tuple(flat_expected[target].shape)
        if tuple(array.shape) != want:
            raise PortError(f"{what}: key '{key}' -> '{target}' has shape {tuple(array.shape)} "
                            f"after transform, the model expects {want}")
        if not np.isfinite(array).all():
            raise PortError(f"{what}: key '{key}' contains non-finite values")
        out[target] = np.ascontiguousarray(array, dtype=np.float32)
        source_of[target] = key
    missing = sorted(set(flat_expected) - set(out))
    if missing:
        shown = ", ".join(f"'{m}'" for m in missing[:8])
        more = f" and {len(missing) - 8} more" if len(missing) > 8 else ""
        raise PortError(f"{what}: no checkpoint key fills the model parameter(s) {shown}{more} "
                        f"(truncated checkpoint or wrong family?)")
    return traverse_util.unflatten_dict(out, sep="/")


# ---- rule builders for common torch modules -----------------------------------

def conv_rules(torch_prefix: str, flax_prefix: str, *, bias: bool = False) -> list[Rule]:
    """Rules of a torch ``Conv2d`` (regex prefix) -> Flax ``params/<flax_prefix>/{kernel,bias}``."""
    rules = [Rule(torch_prefix + r"\.weight", f"params/{flax_prefix}/kernel", conv)]
    if bias:
        rules.append(Rule(torch_prefix + r"\.bias", f"params/{flax_prefix}/bias"))
    return rules


def batch_norm_rules(torch_prefix: str, flax_prefix: str) -> list[Rule]:
    """Rules of a torch ``BatchNorm2d`` -> Flax ``params/.../{scale,bias}`` and ``batch_stats/.../{mean,var}``.

    The ``num_batches_tracked`` counters are not mapped: drop them first
    (``ports.torch_checkpoint.drop_batchnorm_counters``).
    """
    return [Rule(torch_prefix + r"\.weight", f"params/{flax_prefix}/scale"),
            Rule(torch_prefix + r"\.bias", f"params/{flax_prefix}/bias"),
            Rule(torch_prefix + r"\.running_mean", f"batch_stats/{flax_prefix}/mean"),
            Rule(torch_prefix + r"\.running_var", f"batch_stats/{flax_prefix}/var")]


def layer_norm_rules(torch_prefix: str, flax_prefix: str) -> list[Rule]:
    """Rules of a torch LayerNorm or GroupNorm (``weight``, ``bias``) -> Flax ``params/.../{scale,bias}``."""
    return [Rule(torch_prefix + r"\.weight", f"params/{flax_prefix}/scale"),
            Rule(torch_prefix + r"\.bias", f"params/{flax_prefix}/bias")]
