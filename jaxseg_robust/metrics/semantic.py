"""Semantic-segmentation metrics: confusion matrix, pixel accuracy, per-class IoU, CmIoU, NmIoU.

Follows docs/protocols/perturbation.md §6 (P-H Eqs. 6-7):

  * Counted pixels ``V``: ``valid`` (optional mask) AND ``0 <= label < C`` AND
    ``label != ignore_index``; predictions outside ``V`` never count.
    Predictions must be class indices in ``[0, C)`` (an argmax always is);
    a pixel whose prediction lies outside that range is not counted either.
  * ``confusion[i, j]`` = number of counted pixels with GT ``i`` predicted ``j``.
    Per class: ``I_c = confusion[c, c]``, ``U_c = row_c + column_c - I_c``.
  * Without background (``with_background=False``; PASCAL VOC's class 0):
    GT-background pixels are removed from ``V`` (row 0 is dropped), a
    foreground pixel predicted as background still counts against its class,
    and the background IoU is not averaged (torchmetrics ``ignore_index=0``).
  * Per-image mIoU: mean of ``I_c / U_c`` over classes with ``U_c > 0`` (present
    in GT or prediction); NaN when no pixel is counted.
  * CmIoU: sum the confusion matrices over the dataset, then mIoU (classes with
    zero dataset union skipped). NmIoU: mean over images of the per-image mIoU,
    NaN images skipped. (The reference code's "NmIoU" is a micro-averaged
    Jaccard, ~acc/(2-acc); the spec says not to copy it, and we do not.)
  * Accuracy: ``sum_c I_c / |V|``; :func:`dataset_pixel_accuracy` pools pixels
    over images (torchmetrics micro = the reported Accuracy),
    :func:`mean_image_pixel_accuracy` averages per-image accuracies.

Counts are int32 per image. Dataset totals (CmIoU, pooled accuracy) are
summed in float32 inside these functions: exact up to 2**24 per entry, a
relative error of order 1e-7 beyond. For bit-exact totals, sum the per-image
matrices on the host in int64 and pass the total (as a [C, C] matrix) to
:func:`mean_iou` / :func:`pixel_accuracy`.

All functions are pure jnp and wrapped in ``jax.jit`` (``num_classes``,
``ignore_index``, ``with_background``, ``background_class`` static); they
compose with ``jit`` and ``vmap``.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from jaxseg_robust.ops.morphology import check_radius

BACKGROUND_CLASS = 0


@functools.partial(jax.jit, static_argnames=("num_classes", "ignore_index"))
def confusion_matrix(labels, preds, valid=None, *, num_classes: int, ignore_index: int | None = None) -> jnp.ndarray:
    """Confusion matrix of one image (all axes of ``labels`` are pixels).

    Args:
      labels: integer [...] ground-truth class per pixel (e.g. [H, W]); values
        outside [0, num_classes) (e.g. void 255) are not counted.
      preds: integer [...] predicted class per pixel (same shape).
      valid: optional bool [...]; False pixels are not counted.
      num_classes: static int C >= 1 (keyword).
      ignore_index: optional label value that is not counted (e.g. -1 or 255).

    Returns:
      int32[C, C]; rows = GT class, columns = predicted class. vmap for batches.
    """
    num_classes = check_radius(num_classes, "num_classes")
    if num_classes < 1:
        raise ValueError(f"num_classes must be >= 1, got {num_classes}")
    labels = jnp.asarray(labels)
    preds = jnp.asarray(preds)
    for name, array in (("labels", labels), ("preds", preds)):
        if not jnp.issubdtype(array.dtype, jnp.integer):
            raise ValueError(f"{name} must be an integer class map, got dtype {array.dtype}")
    if labels.shape != preds.shape:
        raise ValueError(f"labels and preds must have the same shape, got {labels.shape} and {preds.shape}")
    counted = (labels >= 0) & (labels < num_classes) & (preds >= 0) & (preds < num_classes)
    if ignore_index is not None:
        counted &= labels != ignore_index
    if valid is not None:
        valid = jnp.asarray(valid)
        if valid.dtype != jnp.bool_ or valid.shape != labels.shape:
            raise ValueError(f"valid must be a bool mask of shape {labels.shape}, got {valid.dtype} {valid.shape}")
        counted &= valid
    index = jnp.where(counted, labels.astype(jnp.int32) * num_classes + preds.astype(jnp.int32), 0)
    counts = jnp.zeros(num_classes * num_classes, jnp.int32).at[index.ravel()].add(counted.ravel().astype(jnp.int32))
    return counts.reshape(num_classes, num_classes)


def _check_confusion(confusion, min_ndim: int = 2) -> jnp.ndarray:
    confusion = jnp.asarray(confusion)
    if confusion.ndim < min_ndim or confusion.shape[-1] != confusion.shape[-2]:
        raise ValueError(f"confusion must have shape [..., C, C] (at least {min_ndim}-D), got {confusion.shape}")
    return confusion


def _drop_background(confusion, with_background: bool, background_class: int) -> jnp.ndarray:
    """Removes the GT-background row when ``with_background`` is False."""
    if with_background:
        return confusion
    num_classes = confusion.shape[-1]
    if not 0 <= background_class < num_classes:
        raise ValueError(f"background_class must be in [0, {num_classes}), got {background_class}")
    keep_row = jnp.arange(num_classes) != background_class
    return jnp.where(keep_row[:, None], confusion, 0)


def _safe_ratio(numerator, denominator) -> jnp.ndarray:
    numerator = numerator.astype(jnp.float32)
    denominator = denominator.astype(jnp.float32)
    return jnp.where(denominator > 0, numerator / jnp.where(denominator > 0, denominator, 1.0), jnp.nan)


@functools.partial(jax.jit, static_argnames=("with_background", "background_class"))
def class_iou(confusion, *, with_background: bool = True, background_class: int = BACKGROUND_CLASS) -> jnp.ndarray:
    """Per-class IoU ``I_c / U_c`` from a confusion matrix.

    Args:
      confusion: int or float [..., C, C] (rows GT, columns prediction).
      with_background: False drops GT-background pixels and the background class.
      background_class: index of the background class (default 0).

    Returns:
      float32[..., C]; NaN for classes with ``U_c = 0`` and for the excluded
      background class.
    """
    confusion = _drop_background(_check_confusion(confusion), with_background, background_class)
    intersection = jnp.diagonal(confusion, axis1=-2, axis2=-1)
    union = jnp.sum(confusion, axis=-1) + jnp.sum(confusion, axis=-2) - intersection
    iou = _safe_ratio(intersection, union)
    if not with_background:
        iou = jnp.where(jnp.arange(confusion.shape[-1]) == background_class, jnp.nan, iou)
    return iou


def _nan_mean(values, axis: int) -> jnp.ndarray:
    present = ~jnp.isnan(values)
    count = jnp.sum(present, axis=axis)
    total = jnp.sum(jnp.where(present, values, 0.0), axis=axis)
    return jnp.where(count > 0, total / jnp.maximum(count, 1), jnp.nan)


@functools.partial(jax.jit, static_argnames=("with_background", "background_class"))
def mean_iou(confusion, *, with_background: bool = True, background_class: int = BACKGROUND_CLASS) -> jnp.ndarray:
    """mIoU over classes with a non-empty union (per-image mIoU for one image's matrix).

    Args:
      confusion: [..., C, C]; see :func:`class_iou`.

    Returns:
      float32[...]; NaN when no pixel is counted.
    """
    return _nan_mean(class_iou(confusion, with_background=with_background, background_class=background_class), -1)


@functools.partial(jax.jit, static_argnames=("with_background", "background_class"))
def pixel_accuracy(confusion, *, with_background: bool = True, background_class: int = BACKGROUND_CLASS) -> jnp.ndarray:
    """Pixel accuracy ``sum_c I_c / |V|``.

    Args:
      confusion: [..., C, C]; see :func:`class_iou`.

    Returns:
      float32[...]; NaN when no pixel is counted.
    """
    confusion = _drop_background(_check_confusion(confusion), with_background, background_class)
    correct = jnp.sum(jnp.diagonal(confusion, axis1=-2, axis2=-1), axis=-1)
    return _safe_ratio(correct, jnp.sum(confusion, axis=(-2, -1)))


def _dataset_total(confusions) -> jnp.ndarray:
    confusions = _check_confusion(confusions, min_ndim=3)
    return jnp.sum(confusions.astype(jnp.float32), axis=-3)


def _mean_over_images(per_image_metric, confusions, with_background: bool, background_class: int) -> jnp.ndarray:
    """Mean over images of ``per_image_metric`` (`mean_iou` or `pixel_accuracy`) of [..., N, C, C]
    confusions, NaN images skipped: float32[...]."""
    confusions = _check_confusion(confusions, min_ndim=3)
    per_image = per_image_metric(confusions, with_background=with_background, background_class=background_class)
    return _nan_mean(per_image, -1)


@functools.partial(jax.jit, static_argnames=("with_background", "background_class"))
def cmiou(
    confusions, *, with_background: bool = True, background_class: int = BACKGROUND_CLASS
) -> jnp.ndarray:
    """CmIoU (P-H Eq. 6): mIoU of the confusion matrix summed over images.

    Args:
      confusions: [..., N, C, C] per-image confusion matrices.

    Returns:
      float32[...].
    """
    return mean_iou(_dataset_total(confusions), with_background=with_background, background_class=background_class)


@functools.partial(jax.jit, static_argnames=("with_background", "background_class"))
def nmiou(
    confusions, *, with_background: bool = True, background_class: int = BACKGROUND_CLASS
) -> jnp.ndarray:
    """NmIoU (P-H Eq. 7): mean over images of the per-image mIoU, NaN images skipped.

    Args:
      confusions: [..., N, C, C] per-image confusion matrices.

    Returns:
      float32[...]; NaN when every image is NaN.
    """
    return _mean_over_images(mean_iou, confusions, with_background, background_class)


@functools.partial(jax.jit, static_argnames=("with_background", "background_class"))
def dataset_pixel_accuracy(
    confusions, *, with_background: bool = True, background_class: int = BACKGROUND_CLASS
) -> jnp.ndarray:
    """Accuracy pooled over all pixels of all images (the reported dataset Accuracy).

    Args:
      confusions: [..., N, C, C] per-image confusion matrices.

    Returns:
      float32[...].
    """
    total = _dataset_total(confusions)
    return pixel_accuracy(total, with_background=with_background, background_class=background_class)


@functools.partial(jax.jit, static_argnames=("with_background", "background_class"))
def mean_image_pixel_accuracy(
    confusions, *, with_background: bool = True, background_class: int = BACKGROUND_CLASS
) -> jnp.ndarray:
    """Mean over images of the per-image accuracy (NaN images skipped).

    Args:
      confusions: [..., N, C, C] per-image confusion matrices.

    Returns:
      float32[...].
    """
    return _mean_over_images(pixel_accuracy, confusions, with_background, background_class)
