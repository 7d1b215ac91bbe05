"""Host side of the prompt-protocol batch functions: a `PaddedBatch` in, model inputs in the bucket frame out.

The batch functions of `jaxseg_robust.attacks.clicks`, `.boxes` and `.grid`
(``PaddedBatch -> dict of arrays [B, ...]`` for `jaxseg_robust.runner.engine.run`)
share this: check the batch (`check_batch`), crop each slot to its size and
run ``SamSegmenter.preprocess(..., frame_hw=bucket frame)`` on it (outputs then
live in the padded frame; `preprocess_slots`), stack the inputs and the
`Transform`s (`stack_trees`), and place the arrays on the batch's devices
(`place_like`). Inside the jitted programs, prompts are given in the model's
resized frame (`unit_scale`) and the previous-mask input has the model's
low-res shape (`low_res_shape`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxseg_robust.models.base import Transform


def check_batch(batch) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The batch's (image uint8[B, Hf, Wf, 3], gt int8[B, Hf, Wf], size int[B, 2]) as host arrays.

    Raises:
      ValueError: the shapes do not fit together (naming all three).
    """
    images = np.asarray(batch.image)
    gts = np.asarray(batch.gt)
    sizes = np.asarray(batch.size)
    if gts.ndim != 3 or images.shape[:3] != gts.shape or sizes.shape != (gts.shape[0], 2):
        raise ValueError(f"batch must hold image [B, Hf, Wf, 3], gt [B, Hf, Wf], size [B, 2]; got "
                         f"{images.shape}, {gts.shape}, {sizes.shape}")
    return images, gts, sizes


def preprocess_slots(segmenter, images: np.ndarray, sizes: np.ndarray, frame: tuple[int, int]):
    """Each slot's image cropped to its size and preprocessed into ``frame``.

    Args:
      segmenter: a Segmenter whose ``preprocess`` takes ``frame_hw``.
      images: uint8[B, Hf, Wf, 3] padded images; sizes: int[B, 2] (H, W) of each.
      frame: (Hf, Wf) bucket frame.

    Returns:
      (model input stacked [B, ...], the B `Transform`s as a list).
    """
    inputs, transforms = [], []
    for slot in range(images.shape[0]):
        height, width = (int(v) for v in sizes[slot])
        model_input, transform = segmenter.preprocess(images[slot, :height, :width], frame_hw=frame)
        inputs.append(model_input)
        transforms.append(transform)
    return jnp.stack(inputs), transforms


def stack_trees(trees):
    """Stacks pytrees of equal structure leaf by leaf on a new leading axis (e.g. B `Transform`s -> one)."""
    return jax.tree.map(lambda *leaves: jnp.stack(leaves), *trees)


def place_like(tree, reference):
    """device_put ``tree`` with ``reference``'s sharding when it is a sharded jax Array."""
    sharding = getattr(reference, "sharding", None)
    if isinstance(sharding, jax.sharding.NamedSharding):
        return jax.device_put(tree, sharding)
    return tree


def low_res_shape(segmenter) -> tuple[int, int]:
    """(h, w) of the segmenter's previous-mask input (SAM: ``config.low_res_size``, 256)."""
    size = getattr(getattr(segmenter, "config", None), "low_res_size", None)
    if size is None:
        raise ValueError("segmenter must expose config.low_res_size (the SAM family does)")
    return (int(size), int(size))


def unit_scale(transform: Transform) -> Transform:
    """The transform with scale (1, 1): prompts are given in the resized frame."""
    return transform.replace(scale_xy=jnp.ones_like(jnp.asarray(transform.scale_xy, jnp.float32)))


__all__ = ["check_batch", "preprocess_slots", "stack_trees", "place_like", "low_res_shape", "unit_scale"]
