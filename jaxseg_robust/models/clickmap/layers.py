"""Inference layers with PyTorch semantics and PyTorch parameter names (NHWC arrays).

The click-map families (RITM, SimpleClick, CFR-ICL; docs/models/click_models.md)
are ported with Flax parameter paths that mirror the torch module paths
(``feature_extractor/stage2/0/branches/1/0/conv1/weight`` for
``feature_extractor.stage2.0.branches.1.0.conv1.weight``), so their key tables
are short and obviously one-to-one. Leaf names are torch's:

* `Conv2d`: ``weight`` f32[kh, kw, in/groups, out] (torch [out, in, kh, kw]
  transposed), ``bias`` f32[out]; explicit symmetric zero padding, optional
  dilation (the isegm ResNets and ASPP, `models.isegm_resnet`); its input
  gradient in XLA:CPU's fast form inside loops (`jaxseg_robust.ops.conv`: the
  TETRIS attack differentiates through the network inside ``scan``);
* `ConvTranspose2d` (kernel = stride, no padding): ``weight`` f32[in, out, k, k]
  kept in torch's layout, ``bias``;
* `BatchNorm2d` (eval mode: running statistics, eps 1e-5): ``weight``, ``bias``,
  ``running_mean``, ``running_var``;
* `Linear`: ``weight`` f32[in, out] (torch [out, in] transposed), ``bias``;
* `LayerNorm` / `GroupNorm1` (``nn.GroupNorm(1, C)``): ``weight``, ``bias``;
* `imagenet_normalize`: isegm's input ``Normalize`` (ImageNet mean and std), no parameters.

Every module is a plain function of its input (no train mode, no state);
`random_params` draws sensible random values for every leaf name on the host.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax import traverse_util

from jaxseg_robust.models.sam.random_init import _seed
from jaxseg_robust.ops.conv import conv_general_dilated

BATCHNORM_EPS = 1e-5
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def _zeros(key, shape, dtype=jnp.float32):
    return jnp.zeros(shape, dtype)


def _ones(key, shape, dtype=jnp.float32):
    return jnp.ones(shape, dtype)


class Conv2d(nn.Module):
    """torch ``nn.Conv2d`` on NHWC: f32[..., H, W, in] -> f32[..., H', W', out]."""

    in_channels: int
    out_channels: int
    kernel_size: int
    stride: int = 1
    padding: int = 0
    groups: int = 1
    bias: bool = True
    dilation: int = 1

    @nn.compact
    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        k = self.kernel_size
        weight = self.param("weight", _zeros, (k, k, self.in_channels // self.groups,
                                               self.out_channels))
        lead = x.shape[:-3]
        x4 = x.reshape((-1,) + x.shape[-3:])
        p = self.padding
        y = conv_general_dilated(
            x4, weight.astype(x.dtype), (self.stride, self.stride), ((p, p), (p, p)),
            rhs_dilation=(self.dilation, self.dilation), dimension_numbers=("NHWC", "HWIO", "NHWC"), feature_group_count=self.groups)
        if self.bias:
            y = y + self.param("bias", _zeros, (self.out_channels,)).astype(x.dtype)
        return y.reshape(lead + y.shape[1:])


class ConvTranspose2d(nn.Module):
    """torch ``nn.ConvTranspose2d(in, out, k, stride=k)``: f32[..., h, w, in] -> f32[..., kh, kw, out].

    With kernel = stride and no padding every input pixel writes its own k x k
    output patch: ``out[k i + a, k j + b, o] = sum_c x[i, j, c] w[c, o, a, b] + bias[o]``.
    """

    in_channels: int
    out_channels: int
    kernel_size: int = 2

    @nn.compact
    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        k = self.kernel_size
        weight = self.param("weight", _zeros, (self.in_channels, self.out_channels, k, k))
        bias = self.param("bias", _zeros, (self.out_channels,))
        # [in, k, k, out] first (a small copy): the product's output rows are then whole (b, o)
        # runs of the result, and interleaving them into (h, a, w, b, o) moves contiguous blocks of
        # k * out values (forward) and gathers them (the reverse pass), not single values.
        kernel = weight.transpose(0, 2, 3, 1).astype(x.dtype)
        y = jnp.einsum("...hwc,cabo->...hawbo", x, kernel)
        h, w = x.shape[-3], x.shape[-2]
        return y.reshape(x.shape[:-3] + (h * k, w * k, self.out_channels)) + bias.astype(x.dtype)


class BatchNorm2d(nn.Module):
    """torch ``nn.BatchNorm2d`` in eval mode over the last (channel) axis."""

    num_features: int
    eps: float = BATCHNORM_EPS

    @nn.compact
    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        c = self.num_features
        weight = self.param("weight", _ones, (c,))
        bias = self.param("bias", _zeros, (c,))
        mean = self.param("running_mean", _zeros, (c,))
        var = self.param("running_var", _ones, (c,))
        return (x - mean) / jnp.sqrt(var + self.eps) * weight + bias


class Linear(nn.Module):
    """torch ``nn.Linear``: f32[..., in] -> f32[..., out] (``weight`` stored [in, out])."""

    in_features: int
    out_features: int
    bias: bool = True

    @nn.compact
    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        y = x @ self.param("weight", _zeros, (self.in_features, self.out_features)).astype(x.dtype)
        if self.bias:
            y = y + self.param("bias", _zeros, (self.out_features,)).astype(x.dtype)
        return y


def _standardise(x: jnp.ndarray, eps: float, axes: tuple[int, ...]) -> tuple[jnp.ndarray, jnp.ndarray]:
    """((x - mean) / sqrt(var + eps), sqrt(var + eps)) over ``axes`` (biased variance, two passes)."""
    mean = jnp.mean(x, axis=axes, keepdims=True)
    scale = jnp.sqrt(jnp.mean(jnp.square(x - mean), axis=axes, keepdims=True) + eps)
    return (x - mean) / scale, scale


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2))
def standardise(x: jnp.ndarray, eps: float, axes: tuple[int, ...]) -> jnp.ndarray:
    """Normalisation without its affine part over ``axes``: f32[...] -> f32[...], torch's arithmetic.

    ``(x - mean) / sqrt(var + eps)`` with the mean and the biased variance over
    ``axes`` (LayerNorm: the last axis; ``GroupNorm(1, C)``: H, W and C).
    The reverse pass is the closed form ``(g - mean(g) - y mean(g y)) / s``
    (``y`` the output, ``s`` the saved ``sqrt(var + eps)``), two means over
    ``axes``, instead of the transposes of the mean, the variance and the
    division that autodiff derives. On XLA:CPU the derived pass split into
    several fusions over the residual stream inside SimpleClick's blocks, and
    behind a GELU in its neck it took several times the closed form's time
    (docs/benchmarking.md, "Measurements behind design choices"). Reverse mode
    only.
    """
    return _standardise(x, eps, axes)[0]


def _standardise_fwd(x, eps, axes):
    y, scale = _standardise(x, eps, axes)
    return y, (y, scale)


def _standardise_bwd(eps, axes, residuals, g):
    y, scale = residuals
    mean_g = jnp.mean(g, axis=axes, keepdims=True)
    mean_gy = jnp.mean(g * y, axis=axes, keepdims=True)
    return ((g - mean_g - y * mean_gy) / scale,)


standardise.defvjp(_standardise_fwd, _standardise_bwd)


def standardise_last_axis(x: jnp.ndarray, eps: float) -> jnp.ndarray:
    """`standardise` over the last axis (LayerNorm without its affine part): f32[..., C]."""
    return standardise(x, eps, (-1,))


class LayerNorm(nn.Module):
    """torch ``nn.LayerNorm(C, eps)`` over the last axis (biased variance)."""

    num_features: int
    eps: float = 1e-5

    @nn.compact
    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        return standardise_last_axis(x, self.eps) * self.param("weight", _ones, (self.num_features,)) + \
            self.param("bias", _zeros, (self.num_features,))


class GroupNorm1(nn.Module):
    """torch ``nn.GroupNorm(1, C)`` on f32[..., H, W, C] (statistics over H, W and C; `standardise`)."""

    num_channels: int
    eps: float = 1e-5

    @nn.compact
    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        y = standardise(x, self.eps, (-3, -2, -1))
        return y * self.param("weight", _ones, (self.num_channels,)) + \
            self.param("bias", _zeros, (self.num_channels,))


def imagenet_normalize(image: jnp.ndarray) -> jnp.ndarray:
    """isegm's ``ISModel.normalization``: f32[..., 3] in [0, 1] -> (image - mean) / std, float32."""
    mean = jnp.asarray(IMAGENET_MEAN, jnp.float32)
    std = jnp.asarray(IMAGENET_STD, jnp.float32)
    return (image - mean) / std


def gelu(x: jnp.ndarray) -> jnp.ndarray:
    """torch ``nn.GELU()``, exact, in torch's own form ``x/2 (1 + erf(x / sqrt 2))``.

    ``jax.nn.gelu(approximate=False)`` evaluates the same function through
    ``erfc``, a little closer to float64 in the far negative tail (max error
    3.8e-7 against 1.1e-6 on N(0, 4) samples), but slower on the CPU, forward
    and with its derivative (docs/benchmarking.md, "Measurements behind design
    choices"); torch's form is also the reference's arithmetic.
    """
    return x * 0.5 * (1.0 + jax.lax.erf(x * 0.7071067811865476))  # M_SQRT1_2


def leaky_relu(x: jnp.ndarray, slope: float = 0.2) -> jnp.ndarray:
    """torch ``nn.LeakyReLU(slope)``."""
    return jnp.where(x >= 0, x, slope * x)


def _draw(rng: np.random.Generator, path: tuple[str, ...], shape: tuple[int, ...]) -> np.ndarray:
    """One random float32 leaf for a torch-named parameter (see `random_params`)."""
    name = path[-1]
    if name == "running_var":
        return rng.uniform(0.5, 1.5, shape).astype(np.float32)
    if name in ("running_mean", "bias"):
        return (0.1 * rng.standard_normal(shape)).astype(np.float32)
    if name == "pos_embed":
        return (0.2 * rng.standard_normal(shape)).astype(np.float32)
    if name == "scale":  # RITM's ScaleLayer
        return np.full(shape, 0.05, np.float32)
    if name == "weight" and len(shape) == 1:  # norm scales
        return (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
    return (rng.standard_normal(shape)).astype(np.float32)


def random_params(shapes: Mapping, key_or_seed, *, transposed: tuple[str, ...] = ()) -> dict:
    """Random float32 parameters of a sensible scale for a torch-named tree (host numpy draws).

    Weights N(0, 1/fan_in) (fan_in of a [kh, kw, in, out] conv kernel:
    kh*kw*in; of a [in, out] Linear: in; of a transposed conv named in
    ``transposed``: in), norm scales 1 + 0.1 N(0, 1), biases and running
    means 0.1 N(0, 1), running variances U(0.5, 1.5), position embeddings
    0.2 N(0, 1), RITM's ScaleLayer 0.05.

    Args:
      shapes: nested dict of arrays / ShapeDtypeStructs.
      key_or_seed: int seed or JAX key (deterministic).
      transposed: "/"-joined path prefixes of `ConvTranspose2d` modules.

    Returns:
      Nested dict of jax float32 arrays.
    """
    rng = np.random.default_rng(_seed(key_or_seed))
    flat = traverse_util.flatten_dict(dict(shapes))
    out = {}
    for path, leaf in sorted(flat.items()):
        shape = tuple(leaf.shape)
        joined = "/".join(path)
        if path[-1] == "weight" and any(joined.startswith(p + "/") for p in transposed):
            value = (rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32)
        elif path[-1] == "weight" and len(shape) > 1:
            fan_in = int(np.prod(shape[:-1]))
            value = (rng.standard_normal(shape) / np.sqrt(max(fan_in, 1))).astype(np.float32)
        else:
            value = _draw(rng, path, shape)
        out[path] = jnp.asarray(value)
    return traverse_util.unflatten_dict(out)
