"""The `Prompts` pytree: a fixed-shape, padded description of one prompt set.

Fixed shapes let one compiled function serve every prompt mix (clicks only,
box only, box + clicks, with or without a previous mask): unused point slots
carry label -1 and are masked out inside the model, and the box and the mask
input are switched on and off with boolean flags.

Conventions (see docs/ARCHITECTURE.md, "The Segmenter seam"):
  * coordinates are (x, y) in pixels of the *original* image; the model adds
    any pixel-centre offset its reference adds (SAM: +0.5);
  * labels: 1 positive click, 0 negative click, -1 an unused (padding) slot;
  * boxes are (x1, y1, x2, y2) in original-image pixels;
  * ``mask_logits`` is the model's own feedback map from the previous round
    (``Segmenter.feedback`` of the previous `Prediction`, of shape
    ``Segmenter.feedback_shape(frame)``: SAM's selected 256x256 low-res
    logits, a click-map model's previous logits at the frame), used only where
    ``has_mask`` is true.
"""

from __future__ import annotations

import flax.struct
import jax.numpy as jnp
import numpy as np

from jaxseg_robust.ops.labels import NEGATIVE_LABEL, PADDING_LABEL, POSITIVE_LABEL


@flax.struct.dataclass
class Prompts:
    """One padded prompt set. Add leading axes to batch it (vmap over them).

    Attributes:
      points: f32[N, 2] click coordinates (x, y), original-image pixels.
      labels: i32[N] 1 positive, 0 negative, -1 unused slot.
      box: f32[4] (x1, y1, x2, y2), original-image pixels; ignored unless
        ``has_box``.
      has_box: bool[] whether ``box`` is part of the prompt.
      mask_logits: f32[h, w] the model's own feedback map from the previous
        round (``Segmenter.feedback``; h, w = ``Segmenter.feedback_shape``);
        ignored unless ``has_mask``.
      has_mask: bool[] whether ``mask_logits`` is part of the prompt.
    """

    points: jnp.ndarray
    labels: jnp.ndarray
    box: jnp.ndarray
    has_box: jnp.ndarray
    mask_logits: jnp.ndarray
    has_mask: jnp.ndarray

    @property
    def num_slots(self) -> int:
        """Number of point slots N (static)."""
        return self.points.shape[-2]


def make_prompts(
    points=None,
    labels=None,
    box=None,
    mask_logits=None,
    *,
    num_slots: int | None = None,
    mask_shape: tuple[int, int] = (256, 256),
) -> Prompts:
    """Builds a padded `Prompts` from optional, unpadded host inputs.

    Args:
      points: array-like [n, 2] of (x, y) original-image pixels, or None.
      labels: array-like [n] of 0/1, or None (then all points are positive).
      box: array-like [4] (x1, y1, x2, y2), or None.
      mask_logits: array-like ``mask_shape`` feedback map of the previous round, or None.
      num_slots: point slots N >= n (default: n, at least 1).
      mask_shape: (h, w) of the model's feedback map (``Segmenter.feedback_shape``;
        default SAM's 256 x 256).

    Returns:
      A `Prompts` with N slots; slots n..N-1 carry label -1.

    Raises:
      ValueError: on wrong ranks, mismatched lengths, labels outside {0, 1},
        non-finite coordinates, or more points than slots.
    """
    if points is None:
        points = np.zeros((0, 2), np.float32)
    points = np.asarray(points, np.float32)
    if points.ndim != 2 or points.shape[1] != 2:
        raise ValueError(f"points must have shape [n, 2] (x, y); got {points.shape}")
    n = points.shape[0]
    if labels is None:
        labels = np.ones((n,), np.int32)
    labels = np.asarray(labels)
    if labels.shape != (n,):
        raise ValueError(f"labels must have shape [{n}] to match points; got {labels.shape}")
    if n and not np.isin(labels, (NEGATIVE_LABEL, POSITIVE_LABEL)).all():
        raise ValueError(f"labels must be 0 (negative) or 1 (positive); got {np.unique(labels)}")
    if not np.isfinite(points).all():
        raise ValueError("points contain non-finite coordinates")
    slots = max(n, 1) if num_slots is None else num_slots
    if slots < n:
        raise ValueError(f"{n} points do not fit in num_slots={slots}")
    padded_points = np.zeros((slots, 2), np.float32)
    padded_points[:n] = points
    padded_labels = np.full((slots,), PADDING_LABEL, np.int32)
    padded_labels[:n] = labels.astype(np.int32)

    has_box = box is not None
    box_arr = np.zeros((4,), np.float32)
    if has_box:
        box_arr = np.asarray(box, np.float32).reshape(-1)
        if box_arr.shape != (4,):
            raise ValueError(f"box must have 4 numbers (x1, y1, x2, y2); got shape {np.shape(box)}")
        if not np.isfinite(box_arr).all():
            raise ValueError("box contains non-finite coordinates")

    has_mask = mask_logits is not None
    mask_arr = np.zeros(mask_shape, np.float32)
    if has_mask:
        mask_arr = np.asarray(mask_logits, np.float32)
        if mask_arr.shape != tuple(mask_shape):
            raise ValueError(f"mask_logits must have shape {tuple(mask_shape)}; got {mask_arr.shape}")
    return Prompts(
        points=jnp.asarray(padded_points),
        labels=jnp.asarray(padded_labels),
        box=jnp.asarray(box_arr),
        has_box=jnp.asarray(has_box),
        mask_logits=jnp.asarray(mask_arr),
        has_mask=jnp.asarray(has_mask),
    )


# ---- builders inside jitted protocols (pure; every argument may be traced) -------------------

def empty_prompts(mask_shape: tuple[int, int], num_slots: int = 0) -> Prompts:
    """No click (``num_slots`` padding slots), no box, no mask input; ``mask_shape`` = ``Segmenter.feedback_shape``."""
    return Prompts(points=jnp.zeros((num_slots, 2), jnp.float32),
                   labels=jnp.full((num_slots,), PADDING_LABEL, jnp.int32),
                   box=jnp.zeros((4,), jnp.float32), has_box=jnp.asarray(False),
                   mask_logits=jnp.zeros(mask_shape, jnp.float32), has_mask=jnp.asarray(False))


def click_prompts(points, labels, mask_logits, has_mask) -> Prompts:
    """Clicks-only `Prompts`: points f32[N, 2] (x, y), labels i32[N] (-1 unused), the feedback map and its switch."""
    return Prompts(points=points, labels=labels, box=jnp.zeros((4,), jnp.float32), has_box=jnp.asarray(False),
                   mask_logits=mask_logits, has_mask=jnp.asarray(has_mask, bool))


def box_prompts(box, mask_shape: tuple[int, int]) -> Prompts:
    """A box-only `Prompts`: one padding point slot (label -1), ``has_box``, no mask input.

    Args:
      box: f32[4] (x1, y1, x2, y2).
      mask_shape: static (h, w) of the model's feedback map (``Segmenter.feedback_shape``).
    """
    return empty_prompts(mask_shape, 1).replace(box=jnp.asarray(box, jnp.float32), has_box=jnp.asarray(True))


def append_click(prefix: Prompts, point, label) -> Prompts:
    """``prefix`` with one more point slot holding ``point`` (x, y) and ``label``; box and mask input kept.

    The new click is the last point (SAM: the current click is the last point).
    """
    point = jnp.asarray(point, jnp.float32).reshape(1, 2)
    label = jnp.asarray(label, jnp.int32).reshape(1)
    return prefix.replace(points=jnp.concatenate([prefix.points, point], axis=0),
                          labels=jnp.concatenate([prefix.labels, label], axis=0))


__all__ = ["PADDING_LABEL", "POSITIVE_LABEL", "NEGATIVE_LABEL", "Prompts", "make_prompts", "empty_prompts",
           "click_prompts", "box_prompts", "append_click"]
