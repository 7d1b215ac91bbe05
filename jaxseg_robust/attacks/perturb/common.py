"""Shared pieces of the perturbation attacks: result type, void policy, projection, statistics.

Conventions (docs/protocols/perturbation.md, notation of §0):

  * A model is a plain function ``logits_fn(params, images) -> logits`` with
    ``images`` f32[B, H, W, 3] RGB in [0, 1] and ``logits`` f32[B, H, W, C] at the
    input resolution; the wrapper does its own normalisation and upsampling.
    Every attack assumes the model treats the images of a batch independently
    (inference-mode BatchNorm, no batch statistics): per-image results then do
    not depend on batch composition.
  * Attacks see ``labels`` int[B, H, W] with values in [0, C) and an attack mask
    ``mask`` bool[B, H, W] (``m`` of the spec; False = pixel does not take part).
    :func:`attack_targets` derives both from a dataset's labels and validity
    according to the attack family and the void policy of §1.2.
  * Radii and budgets are in image units (1.0 = full intensity range),
    e.g. ``epsilon = 8 / 255``.
  * Per-image randomness: ``keys`` is a typed PRNG key array [B];
    :func:`instance_keys` folds the dataset index into a base key so that the
    result of an image does not depend on the batch it was run in.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxseg_robust.metrics.semantic import confusion_matrix, mean_iou, pixel_accuracy

LogitsFn = Callable[[Any, jnp.ndarray], jnp.ndarray]

MAX_DAMAGE = "max_damage"
MIN_NORM = "min_norm"
ATTACK_FAMILIES = (MAX_DAMAGE, MIN_NORM)
# §1.2 / §8.2 #8: what max-damage attacks do with void pixels.
VOID_AS_BACKGROUND = "as_background"
VOID_IGNORE = "ignore"
VOID_POLICIES = (VOID_AS_BACKGROUND, VOID_IGNORE)
DEFAULT_EPSILON = 8.0 / 255.0


class AttackResult(NamedTuple):
    """What every attack returns (a pytree; every leaf has leading axis B).

    Attributes:
      images: f32[B, H, W, 3] adversarial images in [0, 1].
      forwards: int32[B] forward passes the algorithm spent on the instance, as
        the reference code does it at batch size 1 (frozen / finished instances
        stop counting; forwards the JAX code runs for a frozen instance in a
        mixed batch are not counted).
      backwards: int32[B] backward passes likewise (gradients the reference
        skips, e.g. APGD's last step, are not counted).
      info: per-image diagnostics, name -> array with leading axis B (best
        tracked values, success flags, ...); documented by each attack.
    """

    images: jnp.ndarray
    forwards: jnp.ndarray
    backwards: jnp.ndarray
    info: Mapping[str, jnp.ndarray]


def check_attack_inputs(images, labels, mask) -> None:
    """Raises ValueError on inconsistent shapes or dtypes (static checks, jit-safe).

    Args:
      images: float [B, H, W, 3].
      labels: integer [B, H, W].
      mask: bool [B, H, W].
    """
    if images.ndim != 4 or images.shape[-1] != 3:
        raise ValueError(f"images must have shape [B, H, W, 3], got {images.shape}")
    if not jnp.issubdtype(images.dtype, jnp.floating):
        raise ValueError(f"images must be floating point in [0, 1], got dtype {images.dtype}")
    if labels.shape != images.shape[:3]:
        raise ValueError(f"labels must have shape {images.shape[:3]}, got {labels.shape}")
    if not jnp.issubdtype(labels.dtype, jnp.integer):
        raise ValueError(f"labels must be an integer class map, got dtype {labels.dtype}")
    if mask.shape != images.shape[:3] or mask.dtype != jnp.bool_:
        raise ValueError(f"mask must be bool of shape {images.shape[:3]}, got {mask.dtype} {mask.shape}")


def check_positive(value, name: str) -> float:
    """Returns ``float(value)``; ValueError naming ``name`` unless finite and > 0."""
    value = float(value)
    if not np.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite positive number, got {value}")
    return value


def check_steps(value, name: str, minimum: int = 1) -> int:
    """Returns ``value`` as int; ValueError naming ``name`` unless an int >= ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return int(value)


def attack_targets(labels, valid, *, num_classes: int, family: str, void_policy: str = VOID_AS_BACKGROUND,
                   background_class: int = 0, region=None) -> tuple[jnp.ndarray, jnp.ndarray]:
    """The labels ``y`` and attack mask ``m`` an attack family sees (§1.2, §8.2 #8).

    A pixel is *labelled* when ``valid`` and ``0 <= labels < num_classes``;
    everything else (void 255, -1, padding) is void.

      * ``family="min_norm"`` (DAG, ALMA prox, PDPGD): void masked (adv-lib's
        ``y < C`` default), whatever the policy.
      * ``family="max_damage"`` (PAdam, SEA):
        ``void_policy="as_background"`` (PASCAL VOC default): void pixels are
        attacked as ``background_class`` (C-S2 maps 255 -> 0), ``m`` all True;
        ``void_policy="ignore"`` (Cityscapes): void masked.

    Args:
      labels: integer [..., H, W] dataset labels (void may be any out-of-range value).
      valid: bool [..., H, W]; False pixels are void (e.g. batch padding).
      num_classes: C >= 1.
      family: ``"max_damage"`` or ``"min_norm"``.
      void_policy: ``"as_background"`` or ``"ignore"``.
      background_class: class that void pixels become under ``as_background``.
      region: bool [..., H, W] the image's own pixels in a spatially padded
        frame (§10.6), or None (no spatial padding). Pixels outside it are
        never attacked, whatever the policy.

    Returns:
      ``(y, m)``: int32 [..., H, W] labels in [0, C) (void pixels set to
      ``background_class`` or 0) and bool [..., H, W] attack mask.
    """
    if family not in ATTACK_FAMILIES:
        raise ValueError(f"family must be one of {ATTACK_FAMILIES}, got {family!r}")
    if void_policy not in VOID_POLICIES:
        raise ValueError(f"void_policy must be one of {VOID_POLICIES}, got {void_policy!r}")
    num_classes = check_steps(num_classes, "num_classes")
    if not 0 <= background_class < num_classes:
        raise ValueError(f"background_class must be in [0, {num_classes}), got {background_class}")
    labels = jnp.asarray(labels)
    valid = jnp.asarray(valid)
    if valid.shape != labels.shape or valid.dtype != jnp.bool_:
        raise ValueError(f"valid must be bool of shape {labels.shape}, got {valid.dtype} {valid.shape}")
    labelled = valid & (labels >= 0) & (labels < num_classes)
    if region is not None:
        labelled = labelled & jnp.asarray(region, bool)
    if family == MAX_DAMAGE and void_policy == VOID_AS_BACKGROUND:
        y = jnp.where(labelled, labels, background_class).astype(jnp.int32)
        return y, jnp.ones_like(labelled) if region is None else jnp.asarray(region, bool)
    return jnp.where(labelled, labels, 0).astype(jnp.int32), labelled


def instance_keys(base_key, indices) -> jnp.ndarray:
    """Per-instance PRNG keys ``fold_in(base_key, index)`` (§10.5).

    Args:
      base_key: a typed PRNG key (``jax.random.key(seed)``).
      indices: int [B] dataset indices (or per-instance seeds), < 2**32.

    Returns:
      Typed key array [B].
    """
    indices = jnp.asarray(indices).astype(jnp.uint32)
    return jax.vmap(lambda index: jax.random.fold_in(base_key, index))(indices)


def batch_view(values, ndim: int) -> jnp.ndarray:
    """Reshapes per-image values [B] to broadcast against an [B, ...] array of rank ``ndim``."""
    return jnp.reshape(values, values.shape + (1,) * (ndim - values.ndim))


def project_linf(points, clean, radius) -> jnp.ndarray:
    """``clip(clip(points, clean - r, clean + r), 0, 1)``: the L∞ ball of radius r intersected with the box.

    Args:
      points, clean: f32[B, H, W, 3].
      radius: scalar or f32[B] radius r >= 0 in image units.

    Returns:
      f32[B, H, W, 3].
    """
    radius = batch_view(jnp.asarray(radius, points.dtype), points.ndim)
    return jnp.clip(jnp.clip(points, clean - radius, clean + radius), 0.0, 1.0)


def clip_to_ball(points, clean, epsilon) -> jnp.ndarray:
    """``clip(points, clean - ε, clean + ε)``, the final clip of the min-norm attacks (§1.1).

    The min-norm attacks' outputs are already in [0, 1], so the result stays
    there. Args/returns as :func:`project_linf`.
    """
    radius = batch_view(jnp.asarray(epsilon, points.dtype), points.ndim)
    return jnp.clip(points, clean - radius, clean + radius)


@jax.custom_jvp
def clamp_unit(values) -> jnp.ndarray:
    """``clip(values, 0, 1)`` with ``torch.clamp``'s gradient (§4.1).

    torch's clamp passes the gradient where ``0 <= x <= 1`` (both bounds
    included) and 0 elsewhere; ``jnp.clip`` passes 1/2 at a pixel exactly on a
    bound (its max/min split ties), which changes DAG's first step on
    saturated pixels (0 or 255 in the 8-bit image).
    """
    return jnp.clip(values, 0.0, 1.0)


@clamp_unit.defjvp
def _clamp_unit_jvp(primals, tangents):
    (values,), (tangent,) = primals, tangents
    inside = (values >= 0.0) & (values <= 1.0)
    return jnp.clip(values, 0.0, 1.0), jnp.where(inside, tangent, jnp.zeros_like(tangent))


def member_keys(keys, attack_index: int) -> jnp.ndarray:
    """Per-member keys ``fold_in(key, attack_index)`` for every image key (§5: each member's own start).

    Args:
      keys: typed key array [B] (from :func:`instance_keys`).
      attack_index: the member's index in the battery's candidate order.

    Returns:
      Typed key array [B].
    """
    return jax.vmap(lambda key: jax.random.fold_in(key, attack_index))(keys)


def linf_norm(values) -> jnp.ndarray:
    """Per-image L∞ norm of f32[B, ...] -> f32[B]."""
    return jnp.max(jnp.abs(values).reshape(values.shape[0], -1), axis=1)


def uniform_start(keys, images, radius) -> jnp.ndarray:
    """``clip(x + U(-r, r), 0, 1)`` with one key per image (PAdam, SEA random starts).

    Args:
      keys: typed key array [B].
      images: f32[B, H, W, 3].
      radius: python float or f32 scalar r.

    Returns:
      f32[B, H, W, 3] start points.
    """
    noise = jax.vmap(lambda key: jax.random.uniform(key, images.shape[1:], images.dtype, -1.0, 1.0))(keys)
    return jnp.clip(images + radius * noise, 0.0, 1.0)


def correct_pixels(logits, labels, mask) -> jnp.ndarray:
    """``argmax(logits) == labels`` on attacked pixels: bool[B, H, W] (False where ``mask`` is False)."""
    return (jnp.argmax(logits, axis=-1) == labels) & mask


def count_pixels(flags) -> jnp.ndarray:
    """Per-image count of True pixels in bool[B, H, W] -> int32[B]."""
    return jnp.sum(flags.reshape(flags.shape[0], -1), axis=1, dtype=jnp.int32)


def image_confusions(logits, labels, valid, *, num_classes: int) -> jnp.ndarray:
    """Per-image confusion matrices of the argmax prediction (the §5/§6 statistics).

    Args:
      logits: f32[B, H, W, C].
      labels: integer [B, H, W] dataset labels; values outside [0, C) are void.
      valid: bool [B, H, W]; False pixels are not counted.
      num_classes: C.

    Returns:
      int32[B, C, C]; rows GT class, columns predicted class. With
      ``metrics.semantic.pixel_accuracy`` / ``mean_iou`` (``with_background``
      on or off) these give every per-image score and dataset metric.
    """
    preds = jnp.argmax(logits, axis=-1).astype(jnp.int32)
    return jax.vmap(lambda y, p, v: confusion_matrix(y, p, v, num_classes=num_classes))(labels, preds, valid)


SCORE_METRICS = ("accuracy", "miou")


def per_image_scores(confusions, *, metric: str, with_background: bool = True,
                     background_class: int = 0) -> jnp.ndarray:
    """Per-image selection score of §5 (lower = more successful attack).

    Args:
      confusions: int [..., C, C] per-image confusion matrices.
      metric: ``"accuracy"`` (pixel accuracy) or ``"miou"`` (per-image mIoU; the
        score used for CmIoU and NmIoU).
      with_background: False scores without the background class (§6.1).
      background_class: index of background.

    Returns:
      f32[...]; NaN for an image with no counted pixel.
    """
    if metric not in SCORE_METRICS:
        raise ValueError(f"metric must be one of {SCORE_METRICS}, got {metric!r}")
    score = pixel_accuracy if metric == "accuracy" else mean_iou
    return score(confusions, with_background=with_background, background_class=background_class)


def table(values, dtype=np.float32) -> jnp.ndarray:
    """A per-iteration schedule computed in float64 on the host, rounded once to ``dtype``.

    This mirrors PyTorch reference code that computes Python-float scalars
    (e.g. ``lr * 0.01 ** (i / N)``) and applies them to float32 tensors.
    """
    return jnp.asarray(np.asarray(values, np.float64).astype(dtype))
