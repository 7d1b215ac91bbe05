"""Size bucketing and padding: instances of one size class become one fixed-shape batch.

A *frame policy* maps an image size (H, W) to the frame (Hf, Wf) >= (H, W) it is
padded into; instances with the same frame form a *bucket*. Every batch of a
bucket has the same shape (the batch size is fixed and the ragged tail is
padded with placeholder slots), so one compiled batch function serves the
whole bucket.

Policies:
  * `ExactFrame()` (default): the frame is the image size itself, so there is
    no spatial padding at all and results are bit-identical to evaluating each
    image unpadded. Datasets with many sizes compile once per size.
  * `RoundUpFrame(multiple)`: H and W rounded up to a multiple (fewer
    compiles; the batch function must honour the ``valid`` mask, and a model
    that resizes its input must resize the ``size`` region, not the frame).
  * `FixedFrame(height, width)`: one frame for every instance (an instance
    larger than the frame is an error naming it).

A `PaddedBatch` holds, for B slots:
  image uint8[B, Hf, Wf, 3]  zero outside the image;
  gt int8[B, Hf, Wf]         -1 (ignore) outside the image;
  valid bool[B, Hf, Wf]      true exactly on the image's own H x W pixels;
  size int32[B, 2]           (H, W) of each slot's image;
  instance_valid bool[B]     false for placeholder slots of a ragged tail;
  seed uint32[B]             a per-instance seed derived from the key only.
Placeholder slots repeat the batch's first instance (well-formed data, so no
NaN or empty-mask special cases are triggered) and are flagged by
``instance_valid``; their outputs are discarded by the runner. ``seed``
depends on the instance key alone, so randomised batch functions
(``jax.random.fold_in(key, seed)``) give the same result for an instance in
whatever batch, slot or device it lands in — a resumed run reproduces an
uninterrupted one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import Protocol

import flax.struct
import numpy as np

from jaxseg_robust.data.instances import (
    IGNORE_LABEL,
    AnyInstance,
    Instance,
    InstanceError,
    validate_declared_size,
)
from jaxseg_robust.hashing import instance_seed

Frame = tuple[int, int]


class FramePolicy(Protocol):
    """Maps an image size (H, W) to its padded frame (Hf, Wf) >= (H, W)."""

    description: str

    def __call__(self, size: Frame) -> Frame: ...


@dataclasses.dataclass(frozen=True)
class ExactFrame:
    """Frame = the image size (no spatial padding; bit-identical to unpadded evaluation)."""

    @property
    def description(self) -> str:
        """Stable text recorded in the run manifest."""
        return "exact"

    def __call__(self, size: Frame) -> Frame:
        """Returns ``size`` unchanged."""
        return (int(size[0]), int(size[1]))


@dataclasses.dataclass(frozen=True)
class RoundUpFrame:
    """Frame = H and W each rounded up to a multiple of ``multiple`` pixels."""

    multiple: int

    def __post_init__(self):
        if isinstance(self.multiple, bool) or not isinstance(self.multiple, int) or self.multiple < 1:
            raise ValueError(f"multiple must be a positive int, got {self.multiple!r}")

    @property
    def description(self) -> str:
        """Stable text recorded in the run manifest."""
        return f"round_up:{self.multiple}"

    def __call__(self, size: Frame) -> Frame:
        """Returns (ceil(H / m) * m, ceil(W / m) * m)."""
        m = self.multiple
        return (-(-int(size[0]) // m) * m, -(-int(size[1]) // m) * m)


@dataclasses.dataclass(frozen=True)
class FixedFrame:
    """Frame = (height, width) for every instance."""

    height: int
    width: int

    def __post_init__(self):
        for field in ("height", "width"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{field} must be a positive int, got {value!r}")

    @property
    def description(self) -> str:
        """Stable text recorded in the run manifest."""
        return f"fixed:{self.height}x{self.width}"

    def __call__(self, size: Frame) -> Frame:
        """Returns (height, width)."""
        return (self.height, self.width)


def policy_description(policy: FramePolicy) -> str:
    """The policy's ``description`` (its repr for a policy without one)."""
    return str(getattr(policy, "description", repr(policy)))


def frame_of(instance: AnyInstance, policy: FramePolicy) -> Frame:
    """The padded frame of one instance under ``policy``.

    Raises:
      InstanceError: naming the instance, when its declared size is not
        positive or the policy returns a frame smaller than its size.
    """
    validate_declared_size(instance)
    size = instance.size
    frame = tuple(int(v) for v in policy(size))
    if len(frame) != 2 or frame[0] < size[0] or frame[1] < size[1]:
        raise InstanceError(
            f"{instance.name}: size (H, W) = {size} does not fit the frame {frame} of policy "
            f"{policy_description(policy)!r}"
        )
    return frame


@dataclasses.dataclass(frozen=True, eq=False)
class Bucket:
    """Instances sharing one padded frame, in input order.

    Attributes:
      frame: (Hf, Wf) padded frame in pixels.
      members: the instances (or refs) of the bucket.
    """

    frame: Frame
    members: tuple[AnyInstance, ...]


def bucket_instances(
    instances: Iterable[AnyInstance], policy: FramePolicy
) -> tuple[list[Bucket], list[tuple[AnyInstance, Exception]]]:
    """Groups instances by padded frame.

    Args:
      instances: `Instance`s or `InstanceRef`s (only their sizes are read).
      policy: the frame policy.

    Returns:
      (buckets sorted by frame (Hf, Wf), members in input order;
       (instance, error) for each instance whose frame could not be formed).
    """
    groups: dict[Frame, list[AnyInstance]] = {}
    rejected: list[tuple[AnyInstance, Exception]] = []
    for instance in instances:
        try:
            frame = frame_of(instance, policy)
        except Exception as error:  # noqa: BLE001 - a policy error fails only this instance
            rejected.append((instance, error))
            continue
        groups.setdefault(frame, []).append(instance)
    return [Bucket(frame, tuple(groups[frame])) for frame in sorted(groups)], rejected


def chunks(members: Sequence, batch_size: int) -> list[tuple]:
    """Splits ``members`` into consecutive tuples of at most ``batch_size`` items (the last may be short)."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    return [tuple(members[i: i + batch_size]) for i in range(0, len(members), batch_size)]


@flax.struct.dataclass
class PaddedBatch:
    """B slots of instances padded into one frame (see the module docstring).

    Attributes:
      image: uint8[B, Hf, Wf, 3], zero outside each image.
      gt: int8[B, Hf, Wf], 1 object / 0 background / -1 ignore and outside the image.
      valid: bool[B, Hf, Wf], true on each image's own pixels.
      size: int32[B, 2], (H, W) of each slot's image.
      instance_valid: bool[B], false for placeholder slots.
      seed: uint32[B], per-instance seed from the key.
    """

    image: np.ndarray
    gt: np.ndarray
    valid: np.ndarray
    size: np.ndarray
    instance_valid: np.ndarray
    seed: np.ndarray

    @property
    def batch_size(self) -> int:
        """Number of slots B (static)."""
        return self.instance_valid.shape[0]

    @property
    def frame(self) -> Frame:
        """(Hf, Wf) of the batch (static)."""
        return (self.gt.shape[-2], self.gt.shape[-1])


def pad_batch(instances: Sequence[Instance], frame: Frame, batch_size: int) -> PaddedBatch:
    """Pads 1..batch_size loaded instances into a `PaddedBatch` of ``batch_size`` slots.

    Args:
      instances: validated `Instance`s, each no larger than ``frame``.
      frame: (Hf, Wf) padded frame in pixels.
      batch_size: number of slots B >= len(instances); slots past the
        instances repeat the first instance with ``instance_valid`` false.

    Returns:
      A `PaddedBatch` of NumPy arrays.

    Raises:
      ValueError: no instances, more instances than slots, or a non-positive frame.
      InstanceError: naming the instance that does not fit the frame.
    """
    if not instances:
        raise ValueError("instances must not be empty")
    if len(instances) > batch_size:
        raise ValueError(f"got {len(instances)} instances for batch_size {batch_size}")
    frame_h, frame_w = (int(v) for v in frame)
    if frame_h < 1 or frame_w < 1:
        raise ValueError(f"frame must be positive, got {frame}")
    image = np.zeros((batch_size, frame_h, frame_w, 3), np.uint8)
    gt = np.full((batch_size, frame_h, frame_w), IGNORE_LABEL, np.int8)
    valid = np.zeros((batch_size, frame_h, frame_w), bool)
    size = np.zeros((batch_size, 2), np.int32)
    seed = np.zeros((batch_size,), np.uint32)
    instance_valid = np.arange(batch_size) < len(instances)
    for slot in range(batch_size):
        instance = instances[slot] if slot < len(instances) else instances[0]
        height, width = instance.gt.shape
        if height > frame_h or width > frame_w:
            raise InstanceError(f"{instance.name}: size {(height, width)} does not fit the frame {(frame_h, frame_w)}")
        image[slot, :height, :width] = instance.image
        gt[slot, :height, :width] = instance.gt
        valid[slot, :height, :width] = True
        size[slot] = (height, width)
        seed[slot] = instance_seed(instance.key)
    return PaddedBatch(image=image, gt=gt, valid=valid, size=size, instance_valid=instance_valid, seed=seed)


def crop_to_size(array: np.ndarray, size: Frame) -> np.ndarray:
    """Crops a per-instance frame-shaped array [Hf, Wf, ...] to its image size [H, W, ...].

    Args:
      array: [Hf, Wf, ...] array (one slot of a batch output).
      size: (H, W) with H <= Hf, W <= Wf.

    Raises:
      ValueError: ``array`` has rank < 2 or is smaller than ``size``.
    """
    array = np.asarray(array)
    height, width = (int(v) for v in size)
    if array.ndim < 2 or array.shape[0] < height or array.shape[1] < width:
        raise ValueError(f"array of shape {list(array.shape)} cannot be cropped to size {(height, width)}")
    return array[:height, :width]
