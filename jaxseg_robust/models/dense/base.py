"""The dense-model protocol: images in [0, 1] -> per-pixel class logits.

This is the seam between the image-perturbation attacks (described in
docs/protocols/perturbation.md, notation ``f(x) = z``) and the models they attack:

    model.apply(params, images f32[B, H, W, 3] in [0, 1]) -> logits f32[B, H, W, C]

A `DenseModel` carries only static configuration (a frozen, hashable
dataclass), so it can be closed over by ``jit`` or passed as a static
argument; the weights travel as the explicit ``params`` pytree (the Flax
variables ``{"params", "batch_stats"}``). ``apply`` does the model's own input
normalisation, any resizing to the network's working resolution, and the
upsampling of the logits back to ``H x W`` (§7), in inference mode
(BatchNorm running statistics, dropout off). It is pure, differentiable with
respect to ``images``, and works for any static ``(B, H, W)``.

Binary (salient-object / single-mask) models expose two classes,
``[background, foreground]``, through `binary_logits`:

    logits = [log sigmoid(-z), log sigmoid(z)]        (z: the model's mask logit)

i.e. the log-probabilities of the model's own sigmoid. Why this choice:
  * ``softmax(logits) = [1 - sigmoid(z), sigmoid(z)]`` exactly, so the
    cross-entropy of the attacks (PAdam-CE, SEA-MCE/BCE/JSD) is the binary
    cross-entropy the model was trained with;
  * the margin ``z_y - z_other = +-z``, so DAG / ALMA / PDPGD see the mask
    logit itself, and ``argmax = 1[z > 0] = 1[sigmoid(z) > 0.5]``, the usual
    0.5 threshold (accuracy, CmIoU and NmIoU with background class 0), except
    for ``|z| < ~1e-7``, where both entries round to ``-ln 2`` in float32 and
    the tie goes to background;
  * the logit-direction losses (PAdam-Cos, SEA-MSL: ``z_y / ||z||``) stay
    informative: ``z_y / ||z||`` rises monotonically from -1 (confidently
    wrong) to 0 (confidently right). With ``[0, z]`` or ``[-z, z]`` that ratio
    depends only on ``sign(z)`` and its gradient is zero almost everywhere;
    ``[-z, z]`` would moreover double the temperature of the softmax.
A SAM-family model with fixed prompts becomes a dense model the same way:
`MaskLogitModel` wraps any ``(params, images) -> f32[B, H, W]`` mask-logit
function (e.g. resize/normalise/pad, embed, decode the fixed prompts).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Mapping, Protocol, runtime_checkable

import jax
import jax.numpy as jnp
import numpy as np
from flax import traverse_util

Params = Any
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


@runtime_checkable
class DenseModel(Protocol):
    """A dense (per-pixel) classifier used functionally by the perturbation attacks.

    Attributes:
      num_classes: C, the size of the logits' last axis (2 for binary models).
      background_class: index of the background class (0 for PASCAL VOC and
        the binary models here), or None when the label set has none
        (Cityscapes); used by the "without background" metrics.
    """

    num_classes: int
    background_class: int | None

    def apply(self, params: Params, images: jnp.ndarray) -> jnp.ndarray:
        """f32[B, H, W, 3] RGB in [0, 1] -> f32[B, H, W, C] logits at the input resolution."""

    def init(self, key: jax.Array) -> Params:
        """Random parameters of the right structure (tests, smoke runs)."""


def check_images(images: jnp.ndarray, *, name: str = "images") -> None:
    """Raises ValueError unless ``images`` is a float array of shape [B, H, W, 3].

    Only static properties (rank, shape, dtype) are checked, so it is safe
    inside ``jit``; the value range [0, 1] is the caller's contract.
    """
    shape = getattr(images, "shape", None)
    if shape is None or len(shape) != 4 or shape[-1] != 3:
        raise ValueError(f"{name} must have shape [B, H, W, 3]; got {shape}")
    if min(shape[:3]) <= 0:
        raise ValueError(f"{name} must be non-empty; got shape {shape}")
    if not jnp.issubdtype(images.dtype, jnp.floating):
        raise ValueError(f"{name} must be a float array in [0, 1]; got dtype {images.dtype}")


def normalise(images: jnp.ndarray, mean: tuple[float, float, float],
              std: tuple[float, float, float]) -> jnp.ndarray:
    """Per-channel ``(x - mean) / std`` of f32[..., 3] images on a 0..1 scale."""
    return (images - jnp.asarray(mean, images.dtype)) / jnp.asarray(std, images.dtype)


def _seed(key: jax.Array) -> int:
    data = np.asarray(jax.random.key_data(key)).astype(np.uint64).ravel()
    return int(sum(int(v) << (32 * i) for i, v in enumerate(data)))


def random_variables(shapes: Mapping, key: jax.Array) -> dict:
    """Random Flax variables of sensible scale, drawn on the host (nothing to compile).

    Compiling a Flax ``init`` of a network with ~100 convs takes 10+ s on a
    CPU; tests and smoke runs only need *some* weights. Leaves are drawn by
    name, deterministically from ``key``:
      * ``kernel`` [..., fan_in-axes, out]: uniform +-sqrt(6 / fan_in) (He
        uniform: keeps ReLU activations of order 1);
      * ``bias``: uniform +-0.1; BatchNorm ``scale``: uniform [0.5, 1.5];
      * BatchNorm ``mean``: N(0, 0.1^2); ``var``: uniform [0.5, 1.5]
        (non-trivial running statistics, so eval-mode BN is exercised).

    Args:
      shapes: nested dict of arrays / ShapeDtypeStructs (``variable_shapes()``).
      key: a JAX PRNG key.

    Returns:
      Nested dict of the same structure holding float32 jax arrays.

    Raises:
      ValueError: a leaf name none of the rules covers.
    """
    rng = np.random.default_rng(_seed(key))
    out = {}
    for path, leaf in sorted(traverse_util.flatten_dict(dict(shapes)).items()):
        shape, name = tuple(leaf.shape), path[-1]
        if name == "kernel":
            bound = np.sqrt(6.0 / max(int(np.prod(shape[:-1])), 1))
            value = rng.uniform(-bound, bound, shape)
        elif name == "bias":
            value = rng.uniform(-0.1, 0.1, shape)
        elif name in ("scale", "var"):
            value = rng.uniform(0.5, 1.5, shape)
        elif name == "mean":
            value = 0.1 * rng.standard_normal(shape)
        else:
            raise ValueError(f"random_variables: no rule for the variable '{'/'.join(path)}'")
        out[path] = jnp.asarray(value, jnp.float32)
    return traverse_util.unflatten_dict(out)


@functools.lru_cache(maxsize=32)
def network_variable_shapes(network_cls: type, config: Any, probe_hw: tuple[int, int]) -> dict:
    """Cached ShapeDtypeStruct tree of ``network_cls(config)``'s variables.

    Traced once per (network, config) on a zero image of ``probe_hw`` (tracing a
    ResNet / ConvNeXt takes seconds); ``config`` must be hashable (a frozen dataclass).
    """
    x = jnp.zeros((1, *probe_hw, 3), jnp.float32)
    return dict(jax.eval_shape(lambda k, i: network_cls(config).init(k, i), jax.random.key(0), x))


class ConfiguredDense:
    """Members shared by the dense wrappers around a frozen ``config`` (PSPNet / DeepLabv3, UPerNet,
    torchvision DeepLabV3): the class count, the background class and host-drawn random variables.

    A subclass is a frozen dataclass whose ``config`` has ``num_classes`` and ``background_class``,
    and it implements ``variable_shapes()``.
    """

    @property
    def num_classes(self) -> int:
        """C."""
        return self.config.num_classes

    @property
    def background_class(self) -> int | None:
        """The background class index (0 for PASCAL VOC labels) or None (Cityscapes)."""
        return self.config.background_class

    def init(self, key: jax.Array) -> dict:
        """Random variables of the right structure (`random_variables`, drawn on the host)."""
        return random_variables(self.variable_shapes(), key)


def binary_logits(mask_logit: jnp.ndarray) -> jnp.ndarray:
    """Two-class logits ``[log sigmoid(-z), log sigmoid(z)]`` of a binary mask logit.

    Args:
      mask_logit: f32[...] the model's foreground logit ``z`` (pre-sigmoid).

    Returns:
      f32[..., 2]: class 0 = background, class 1 = foreground; their softmax is
      ``[1 - sigmoid(z), sigmoid(z)]`` and their difference is ``z`` (see the
      module docstring for why). Finite for every finite ``z``.
    """
    return jnp.stack([jax.nn.log_sigmoid(-mask_logit), jax.nn.log_sigmoid(mask_logit)], axis=-1)


@dataclasses.dataclass(frozen=True)
class MaskLogitModel:
    """A binary `DenseModel` built from a mask-logit function.

    Attributes:
      logit_fn: pure ``(params, images f32[B, H, W, 3] in [0, 1]) -> f32[B, H, W]``
        foreground logits at the input resolution (it must be hashable, e.g.
        a module-level function or a frozen dataclass, for ``jit`` caching).
      init_fn: ``key -> params``, random parameters for `init`.
      name: a label for reports.
    """

    logit_fn: Callable[[Params, jnp.ndarray], jnp.ndarray]
    init_fn: Callable[[jax.Array], Params]
    name: str = "mask_logit_model"
    num_classes: int = dataclasses.field(default=2, init=False)
    background_class: int | None = dataclasses.field(default=0, init=False)

    def apply(self, params: Params, images: jnp.ndarray) -> jnp.ndarray:
        """f32[B, H, W, 3] in [0, 1] -> f32[B, H, W, 2] logits (`binary_logits`)."""
        check_images(images)
        z = self.logit_fn(params, images)
        if z.shape != images.shape[:3]:
            raise ValueError(f"{self.name}: logit_fn returned shape {z.shape}; expected "
                             f"{images.shape[:3]} (one logit per input pixel)")
        return binary_logits(z)

    def init(self, key: jax.Array) -> Params:
        """Random parameters from ``init_fn``."""
        return self.init_fn(key)
