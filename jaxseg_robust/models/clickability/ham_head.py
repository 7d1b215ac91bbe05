"""LightHamHead (SegNeXt decode head) with NMF matrix decomposition, NHWC.

Behaviour of mmseg 1.2.2 ``mmseg/models/decode_heads/ham_head.py`` as
configured by RClicks (docs/protocols/rclicks.md §3.4): all four stages are resized
to the stage-1 grid (bilinear, align_corners=False), concatenated, squeezed
(Conv1x1 -> GN -> ReLU), passed through the "hamburger" (Conv1x1 + ReLU ->
NMF -> Conv1x1 -> GN, residual, ReLU), aligned (Conv1x1 -> GN -> ReLU) and
classified (Dropout2d -> Conv1x1).

The NMF bases are a fixed buffer (never trained): they live in the
``buffers`` collection as ``bases`` f32[1, D, R] (torch's ``(B*S, D, R)``
buffer with S = 1), initialised like mmseg (uniform [0, 1), L2-normalised
over D) from the 'params' RNG.
"""

from __future__ import annotations

from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxseg_robust.models.clickability.layers import conv2d
from jaxseg_robust.ops.resize import apply_taps, linear_taps

_HIGHEST = jax.lax.Precision.HIGHEST
NMF_EPS = 1e-6


def nmf_bases_init(key: jax.Array, depth: int, rank: int) -> jnp.ndarray:
    """mmseg ``NMF2D._build_bases``: f32[1, depth, rank], uniform [0, 1) columns
    L2-normalised over ``depth`` (``F.normalize``, eps 1e-12)."""
    bases = jax.random.uniform(key, (1, depth, rank), jnp.float32)
    norm = jnp.sqrt(jnp.sum(jnp.square(bases), axis=1, keepdims=True))
    return bases / jnp.maximum(norm, 1e-12)


def _update_coef(x: jnp.ndarray, bases: jnp.ndarray, coef: jnp.ndarray) -> jnp.ndarray:
    """Multiplicative update of the coefficients: C ⊙ (Xᵀ B) / (C (Bᵀ B) + 1e-6)."""
    numerator = jnp.einsum("bnd,bdr->bnr", x, bases, precision=_HIGHEST)
    gram = jnp.einsum("bdr,bds->brs", bases, bases, precision=_HIGHEST)
    denominator = jnp.einsum("bnr,brs->bns", coef, gram, precision=_HIGHEST)
    return coef * numerator / (denominator + NMF_EPS)


def _update_bases(x: jnp.ndarray, bases: jnp.ndarray, coef: jnp.ndarray) -> jnp.ndarray:
    """Multiplicative update of the bases: B ⊙ (X C) / (B (Cᵀ C) + 1e-6)."""
    numerator = jnp.einsum("bnd,bnr->bdr", x, coef, precision=_HIGHEST)
    gram = jnp.einsum("bnr,bns->brs", coef, coef, precision=_HIGHEST)
    denominator = jnp.einsum("bdr,brs->bds", bases, gram, precision=_HIGHEST)
    return bases * numerator / (denominator + NMF_EPS)


def nmf_reconstruct(x: jnp.ndarray, bases: jnp.ndarray, steps: int,
                    inv_t: float = 1.0) -> jnp.ndarray:
    """NMF by multiplicative updates, returning the low-rank reconstruction.

    mmseg ``NMF2D`` with S = 1: ``C = softmax_R(inv_t · Xᵀ B)``; ``steps`` times
    update C then B; a final update of C; return ``B Cᵀ``. Gradients flow
    through every iteration (no one-step-gradient trick in this version).

    Args:
      x: f32[B, N, D] non-negative data, one row per pixel (torch's X is [B, D, N]).
      bases: f32[B, D, R] initial bases.
      steps: static number of iterations (6 in training, 7 in evaluation).
      inv_t: softmax inverse temperature (NMF2D overrides the config's 100 with 1).

    Returns:
      f32[B, N, D] reconstruction.
    """
    coef = jnp.einsum("bnd,bdr->bnr", x, bases, precision=_HIGHEST)
    coef = jax.nn.softmax(inv_t * coef, axis=-1)

    def step(carry, _):
        b, c = carry
        c = _update_coef(x, b, c)
        b = _update_bases(x, b, c)
        return (b, c), None

    (bases, coef), _ = jax.lax.scan(step, (bases, coef), None, length=steps)
    coef = _update_coef(x, bases, coef)
    return jnp.einsum("bdr,bnr->bnd", bases, coef, precision=_HIGHEST)


class NMF2D(nn.Module):
    """The "ham": NMF of the [B, H·W, D] feature matrix with fixed initial bases."""

    rank: int = 16
    train_steps: int = 6
    eval_steps: int = 7
    inv_t: float = 1.0

    @nn.compact
    def __call__(self, x: jnp.ndarray, train: bool) -> jnp.ndarray:
        """x f32[B, H, W, D] (non-negative) -> f32[B, H, W, D]."""
        b, h, w, d = x.shape
        bases = self.variable("buffers", "bases",
                              lambda: nmf_bases_init(self.make_rng("params"), d, self.rank))
        initial = jnp.broadcast_to(bases.value, (b, d, self.rank))
        steps = self.train_steps if train else self.eval_steps
        out = nmf_reconstruct(x.reshape(b, h * w, d), initial, steps, self.inv_t)
        return out.reshape(b, h, w, d)


class ConvGN(nn.Module):
    """mmcv ``ConvModule`` with GroupNorm: Conv1x1 (no bias) -> GN [-> ReLU]."""

    features: int
    in_features: int
    groups: int = 32
    relu: bool = True

    @nn.compact
    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        """f32[B, H, W, Cin] -> f32[B, H, W, features]."""
        x = conv2d(self.features, self.in_features, (1, 1), use_bias=False, init="conv_module",
                   name="conv")(x)
        x = nn.GroupNorm(num_groups=self.groups, epsilon=1e-5, use_fast_variance=False,
                         name="gn")(x)
        return jax.nn.relu(x) if self.relu else x


class Hamburger(nn.Module):
    """ham_in (Conv1x1 + bias) -> ReLU -> NMF -> ham_out (ConvGN, no ReLU); ReLU(x + ·)."""

    channels: int = 512
    groups: int = 32
    rank: int = 16
    train_steps: int = 6
    eval_steps: int = 7
    inv_t: float = 1.0

    @nn.compact
    def __call__(self, x: jnp.ndarray, train: bool) -> jnp.ndarray:
        """f32[B, H, W, C] -> f32[B, H, W, C]."""
        c = self.channels
        y = conv2d(c, c, (1, 1), init="conv_module", name="ham_in")(x)
        y = jax.nn.relu(y)
        y = NMF2D(self.rank, self.train_steps, self.eval_steps, self.inv_t, name="ham")(y, train)
        y = ConvGN(c, c, self.groups, relu=False, name="ham_out")(y)
        return jax.nn.relu(x + y)


def resize_to(x: jnp.ndarray, out_hw: tuple[int, int]) -> jnp.ndarray:
    """Bilinear resize of f32[B, h, w, C] to f32[B, H, W, C], torch
    ``interpolate(align_corners=False)`` without antialias (identity if equal)."""
    h, w = x.shape[1], x.shape[2]
    if (h, w) == tuple(out_hw):
        return x
    x = apply_taps(x, linear_taps(w, int(out_hw[1])), axis=2)
    return apply_taps(x, linear_taps(h, int(out_hw[0])), axis=1)


class LightHamHead(nn.Module):
    """The decode head; returns the raw (unbounded) per-class map at stride 4.

    Attributes:
      in_channels: widths of the input stages (all four are used).
      channels: width after ``align`` (512).
      ham_channels: width of ``squeeze`` and the hamburger (512).
      num_classes: output channels (1).
      groups: GroupNorm groups (32).
      rank, train_steps, eval_steps, inv_t: NMF settings.
      dropout_ratio: Dropout2d rate before ``conv_seg`` (0.1).
    """

    in_channels: Sequence[int] = (64, 128, 320, 512)
    channels: int = 512
    ham_channels: int = 512
    num_classes: int = 1
    groups: int = 32
    rank: int = 16
    train_steps: int = 6
    eval_steps: int = 7
    inv_t: float = 1.0
    dropout_ratio: float = 0.1

    @nn.compact
    def __call__(self, features: Sequence[jnp.ndarray], train: bool) -> jnp.ndarray:
        """Four f32[B, H_s, W_s, C_s] -> f32[B, H_1, W_1, num_classes]."""
        if len(features) != len(self.in_channels):
            raise ValueError(f"expected {len(self.in_channels)} feature maps; "
                             f"got {len(features)}")
        size = features[0].shape[1:3]
        x = jnp.concatenate([resize_to(f, size) for f in features], axis=-1)
        x = ConvGN(self.ham_channels, int(sum(self.in_channels)), self.groups,
                   name="squeeze")(x)
        x = Hamburger(self.ham_channels, self.groups, self.rank, self.train_steps,
                      self.eval_steps, self.inv_t, name="hamburger")(x, train)
        x = ConvGN(self.channels, self.ham_channels, self.groups, name="align")(x)
        x = nn.Dropout(self.dropout_ratio, broadcast_dims=(1, 2), deterministic=not train)(x)
        return conv2d(self.num_classes, self.channels, (1, 1), name="conv_seg")(x)
