"""Per-pixel attack losses and margins (§2.1, §3.4, §4).

Section numbers (§) refer to docs/protocols/perturbation.md.

All functions take ``logits`` f32[B, H, W, C] (raw, pre-softmax) and ``labels``
int[B, H, W] in [0, C), and return per-pixel values f32[B, H, W]; masking
with the attack mask ``m`` is explicit (``mask`` bool[B, H, W]). The
correctness mask ``c = [argmax z = y]`` is always a constant (no gradient), as
in every reference. :func:`image_mean` reduces to the per-image value
``(1/N) Σ_p m_p ℓ_p`` with N = H·W (masked pixels counted in N).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax import lax

LOG2 = math.log(2.0)


def _label_logit(logits, labels) -> jnp.ndarray:
    return jnp.take_along_axis(logits, labels[..., None].astype(jnp.int32), axis=-1)[..., 0]


def _log_prob(logits, labels) -> jnp.ndarray:
    return _label_logit(jax.nn.log_softmax(logits, axis=-1), labels)


def correct_constant(logits, labels, mask) -> jnp.ndarray:
    """``c_p = 1[argmax z_p = y_p] · m_p`` as f32[B, H, W], gradient stopped."""
    correct = (jnp.argmax(logits, axis=-1) == labels) & mask
    return lax.stop_gradient(correct.astype(logits.dtype))


def cross_entropy(logits, labels) -> jnp.ndarray:
    """``CE_p = -log softmax(z_p)_{y_p}`` -> f32[B, H, W]."""
    return -_log_prob(logits, labels)


def balanced_cross_entropy(logits, labels, mask, weight) -> jnp.ndarray:
    """SegPGD's balanced CE (SEA-BCE): ``[(1-λ)c + λ(1-c)]·CE`` on attacked pixels.

    Args:
      weight: λ_t = t / (2T), scalar (traced ok).

    Returns:
      f32[B, H, W]; 0 where ``mask`` is False.
    """
    correct = correct_constant(logits, labels, mask)
    maskf = mask.astype(logits.dtype)
    pixel_weight = (1.0 - weight) * correct + weight * (maskf - correct)
    return pixel_weight * cross_entropy(logits, labels)


def masked_cross_entropy(logits, labels, mask) -> jnp.ndarray:
    """SEA-MCE: ``c·CE`` (only currently correct attacked pixels) -> f32[B, H, W]."""
    return correct_constant(logits, labels, mask) * cross_entropy(logits, labels)


def jensen_shannon_one_hot(logits, labels) -> jnp.ndarray:
    """JS(softmax(z_p) || e_{y_p}) in closed form (natural log), f32[B, H, W].

    With ``q = s_{p,y}``: ``JS = ½[(1-q)·ln2 + q·ln(2q/(1+q)) + ln(2/(1+q))]``
    (§3.4), ``ln q`` from ``log_softmax``; finite where the two-KL form of
    the reference (:func:`jensen_shannon_kl_form`) gives NaN.
    """
    log_q = _log_prob(logits, labels)
    q = jnp.exp(log_q)
    log1p_q = jnp.log1p(q)
    return 0.5 * ((1.0 - q) * LOG2 + q * (LOG2 + log_q - log1p_q) + (LOG2 - log1p_q))


def jensen_shannon_kl_form(logits, labels) -> jnp.ndarray:
    """The reference's two-KL form ``½[KL(p||m) + KL(e_y||m)]``, ``m = (p + e_y)/2`` (tests only).

    NaN where a softmax entry underflows to exactly 0 (as in the reference).
    """
    probs = jax.nn.softmax(logits, axis=-1)
    one_hot = jax.nn.one_hot(labels, logits.shape[-1], dtype=logits.dtype)
    log_mid = jnp.log((probs + one_hot) / 2.0)
    kl_p = jnp.sum(probs * (jnp.log(probs) - log_mid), axis=-1)
    kl_y = jnp.sum(jnp.where(one_hot > 0, one_hot * (jnp.log(jnp.where(one_hot > 0, one_hot, 1.0)) - log_mid), 0.0),
                   axis=-1)
    return 0.5 * (kl_p + kl_y)


def normalized_label_logit(logits, labels, floor: float = 1e-12) -> jnp.ndarray:
    """``z_{p,y} / max(‖z_p‖₂, floor)`` (gradient through the norm) -> f32[B, H, W].

    Computed as ``sqrt(max(Σ z², floor²))`` so the gradient stays finite at z = 0.
    """
    norm = jnp.sqrt(jnp.maximum(jnp.sum(jnp.square(logits), axis=-1), floor * floor))
    return _label_logit(logits, labels) / norm


def spherical(logits, labels, mask, *, masked: bool) -> jnp.ndarray:
    """SEA-MSL: ``-c·z_y/‖z‖₂`` (``masked=True``) or the unmasked ``-z_y/‖z‖₂`` on attacked pixels.

    The reference has no floor in the norm; ``max(‖z‖₂, 1e-12)`` (§3.4).
    """
    weight = correct_constant(logits, labels, mask) if masked else mask.astype(logits.dtype)
    return -weight * normalized_label_logit(logits, labels, 1e-12)


def cosine_loss(logits, labels) -> jnp.ndarray:
    """PAdam-Cos: ``1 - z_y / max(‖z‖₂, 1e-8)`` (1 - cosine to the one-hot label; torch eps 1e-8)."""
    return 1.0 - normalized_label_logit(logits, labels, 1e-8)


def logit_margin(logits, labels) -> jnp.ndarray:
    """``z_y - max_{k≠y} z_k`` (adv-lib ``difference_of_logits``) -> f32[B, H, W]; < 0 = misclassified."""
    one_hot = jax.nn.one_hot(labels, logits.shape[-1], dtype=jnp.bool_)
    other = jnp.max(jnp.where(one_hot, -jnp.inf, logits), axis=-1)
    return _label_logit(logits, labels) - other


def difference_of_logits_ratio(logits, labels, tolerance: float) -> jnp.ndarray:
    """ALMA's constraint ``(z_y - max_{k≠y} z_k + κ) / (z_(1) - z_(3) + 1e-8)`` -> f32[B, H, W].

    Needs C >= 3 (top-3 logits). Positive while the pixel is correctly classified.
    """
    if logits.shape[-1] < 3:
        raise ValueError(f"the difference of logits ratio needs >= 3 classes, got {logits.shape[-1]}")
    top3 = lax.top_k(logits, 3)[0]
    return (logit_margin(logits, labels) + tolerance) / (top3[..., 0] - top3[..., 2] + 1e-8)


def image_mean(per_pixel, mask) -> jnp.ndarray:
    """``(1/N) Σ_p m_p ℓ_p`` with N = H·W: f32[B, H, W] -> f32[B]."""
    masked = jnp.where(mask, per_pixel, 0.0)
    return jnp.mean(masked.reshape(masked.shape[0], -1), axis=1)
