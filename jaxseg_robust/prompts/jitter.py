"""The BREPS jitter baseline: tight boxes translated at random (docs/protocols/breps.md §4.8).

The reference (C-B ``scripts/evaluate_jitters.py``) reseeds Python's global
``random`` with 42 for *every image*, so every image gets the same sequence of
relative shifts. Each draw is ``dx = U(-f, f) * w`` then ``dy = U(-f, f) * h``
(``w = x2 - x1``, ``h = y2 - y1`` of the tight box, ``f = 0.3``), the box is
translated (size unchanged), its x clamped to ``[0, W - 1]`` and y to
``[0, H - 1]``, and it is kept when its continuous box IoU with the tight box
exceeds 0.5; at most 75 draws, stop at 15 kept, use the first 10, and fall back
to the tight box when nothing is kept.

The boxes are *data*, not part of any traced computation, so they are drawn on
the host with ``random.Random(seed)`` — the same Mersenne-Twister stream and the
same ``uniform(a, b) = a + (b - a) * random()`` as the reference's global
``random`` after ``random.seed(42)``, hence the exact reference sequence,
without global state. The arithmetic follows the reference's dtypes: the
translated coordinates are formed in float64 (Python floats) and rounded to
float32 (``torch.tensor`` of Python floats), clamped in float32, and the box IoU
is torchvision's ``box_iou`` formula in float32.

Frames: the reference works in SAM's 1024 resized frame with the tight box of
the resized, *unthresholded* GT (interpolation tails included). Which frame a
caller draws in is its choice (``tight_box`` and ``image_hw`` must be in the
same frame); see `jaxseg_robust.attacks.boxes.make_box_batch_fn`
(``box_frame``).
"""

from __future__ import annotations

import random

import numpy as np

JITTER_SEED = 42
JITTER_MAX_SHIFT_FRAC = 0.3  # the reference's --jitter_pow
JITTER_MIN_IOU = 0.5
JITTER_ACCEPTED = 15  # N_jitters: stop after this many kept boxes
JITTER_USED = 10  # the first ten kept boxes are evaluated
JITTER_DRAWS_PER_ACCEPTED = 5  # up to 15 * 5 = 75 draws


def box_iou_float32(box1, box2) -> np.float32:
    """Continuous IoU of two boxes exactly as torchvision ``box_iou`` in float32 (no eps).

    ``inter = max(0, min x2 - max x1) * max(0, min y2 - max y1)``,
    ``IoU = inter / (area1 + area2 - inter)`` with ``area = (x2 - x1)(y2 - y1)``;
    0/0 gives NaN (which never passes an ``>`` test).

    Args:
      box1, box2: array-like [4] (x1, y1, x2, y2), cast to float32.

    Returns:
      np.float32 IoU.
    """
    a = np.asarray(box1, np.float32).reshape(4)
    b = np.asarray(box2, np.float32).reshape(4)
    with np.errstate(invalid="ignore", divide="ignore"):
        area_a = (a[2] - a[0]) * (a[3] - a[1])
        area_b = (b[2] - b[0]) * (b[3] - b[1])
        width = max(np.float32(0), np.minimum(a[2], b[2]) - np.maximum(a[0], b[0]))
        height = max(np.float32(0), np.minimum(a[3], b[3]) - np.maximum(a[1], b[1]))
        inter = np.float32(width * height)
        union = np.float32(area_a + area_b - inter)
        return np.float32(inter / union)


def jitter_boxes(
    tight_box,
    image_hw: tuple[int, int],
    *,
    max_shift_frac: float = JITTER_MAX_SHIFT_FRAC,
    min_iou: float = JITTER_MIN_IOU,
    n_accepted: int = JITTER_ACCEPTED,
    n_used: int = JITTER_USED,
    draws_per_accepted: int = JITTER_DRAWS_PER_ACCEPTED,
    seed: int = JITTER_SEED,
) -> np.ndarray:
    """The reference's jittered boxes for one image (host, deterministic).

    Args:
      tight_box: array-like [4] (x1, y1, x2, y2) tight box (float32 values),
        in the frame of ``image_hw``.
      image_hw: (H, W) of that frame; x is clamped to [0, W - 1], y to [0, H - 1].
      max_shift_frac: f, shifts are ``U(-f, f)`` times the box width / height.
      min_iou: a translated box is kept iff its box IoU with the tight box is > this.
      n_accepted: stop drawing after this many kept boxes.
      n_used: return the first ``n_used`` kept boxes.
      draws_per_accepted: at most ``n_accepted * draws_per_accepted`` draws.
      seed: the Python ``random`` seed, reset for every call (reference: 42 per image).

    Returns:
      float32[n, 4] boxes, 1 <= n <= n_used; ``[tight_box]`` when no draw was kept
      (e.g. an empty or zero-area tight box, whose IoU is NaN).

    Raises:
      ValueError: a malformed box, size or count.
    """
    tight = np.asarray(tight_box, np.float32)
    if tight.shape != (4,) or not np.isfinite(tight).all():
        raise ValueError(f"tight_box must be 4 finite numbers (x1, y1, x2, y2); got {tight_box!r}")
    height, width = (int(v) for v in image_hw)
    if height < 1 or width < 1:
        raise ValueError(f"image_hw must be positive; got {image_hw!r}")
    for name, value in (("n_accepted", n_accepted), ("n_used", n_used),
                        ("draws_per_accepted", draws_per_accepted)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int; got {value!r}")
    if not max_shift_frac >= 0:
        raise ValueError(f"max_shift_frac must be >= 0; got {max_shift_frac!r}")
    rng = random.Random(seed)
    x1, y1, x2, y2 = (float(v) for v in tight)  # tensor.tolist(): Python floats of float32 values
    box_w, box_h = x2 - x1, y2 - y1
    kept = []
    for _ in range(n_accepted * draws_per_accepted):
        dx = rng.uniform(-max_shift_frac, max_shift_frac) * box_w
        dy = rng.uniform(-max_shift_frac, max_shift_frac) * box_h
        candidate = np.array([x1 + dx, y1 + dy, x2 + dx, y2 + dy], np.float64).astype(np.float32)
        candidate[0::2] = np.clip(candidate[0::2], np.float32(0), np.float32(width - 1))
        candidate[1::2] = np.clip(candidate[1::2], np.float32(0), np.float32(height - 1))
        if box_iou_float32(candidate, tight) > min_iou:
            kept.append(candidate)
        if len(kept) >= n_accepted:
            break
    if not kept:
        kept = [tight]
    return np.stack(kept[:n_used]).astype(np.float32)


def pad_boxes(boxes, slots: int) -> tuple[np.ndarray, np.ndarray]:
    """Pads [n, 4] boxes to a fixed number of slots for batching.

    Args:
      boxes: array-like [n, 4], 1 <= n <= slots.
      slots: static slot count.

    Returns:
      (float32[slots, 4] boxes, unused slots repeating the first box;
       bool[slots] validity, true for the first n).
    """
    boxes = np.asarray(boxes, np.float32)
    if boxes.ndim != 2 or boxes.shape[1] != 4 or not 1 <= boxes.shape[0] <= slots:
        raise ValueError(f"boxes must have shape [n, 4] with 1 <= n <= {slots}; got {boxes.shape}")
    n = boxes.shape[0]
    padded = np.concatenate([boxes, np.repeat(boxes[:1], slots - n, axis=0)], axis=0)
    return padded, np.arange(slots) < n


__all__ = [
    "JITTER_SEED", "JITTER_MAX_SHIFT_FRAC", "JITTER_MIN_IOU", "JITTER_ACCEPTED", "JITTER_USED",
    "JITTER_DRAWS_PER_ACCEPTED", "box_iou_float32", "jitter_boxes", "pad_boxes",
]
