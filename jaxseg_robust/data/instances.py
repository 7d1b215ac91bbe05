"""The evaluation `Instance`: one image, one ground-truth object mask, an id.

An instance is the unit the runner records results for. It is a host-side
record of NumPy arrays (not a pytree): the runner pads instances of one size
class into a batch (see `jaxseg_robust.data.buckets`) and only the padded batch
goes to the device.

Conventions:
  * ``image`` is uint8[H, W, 3] RGB;
  * ``gt`` is int8[H, W] with 1 = object, 0 = background, -1 = ignore
    (unlabelled pixels, e.g. the GrabCut/Berkeley boundary band; they count
    neither as object nor as background in any metric);
  * a *multi-class* instance (``num_classes`` > 2, the semantic datasets of
    `jaxseg_robust.data.semantic`) holds class indices 0..C-1 in ``gt``,
    with -1 = void; int8 limits C to `MAX_CLASSES` (127);
  * an instance is identified by its *key* ``(dataset, id)``; ids must be
    unique within a dataset, the runner rejects duplicate keys.

Two kinds of instance are accepted wherever instances are:
  * `Instance` holds its arrays in memory;
  * `InstanceRef` holds only the declared size and a ``loader`` that builds the
    `Instance` on demand, so that a long run keeps one batch of images in
    memory, and a file that fails to decode fails only its own instance.
Both expose ``key``, ``size``, ``dataset``, ``id``, ``source_paths`` and
``load()``.

Construction does not check array contents (it is cheap and never raises on
data); `validate_instance` does, and the runner calls it on every instance it
loads, recording a failing one as failed (the error names the instance) and
going on. `make_instance` converts common inputs and validates in one step.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Union

import numpy as np

from jaxseg_robust.ops.labels import IGNORE_LABEL

BACKGROUND_LABEL = 0
OBJECT_LABEL = 1
_GT_VALUES = (IGNORE_LABEL, BACKGROUND_LABEL, OBJECT_LABEL)
BINARY_CLASSES = 2
MAX_CLASSES = int(np.iinfo(np.int8).max)


class InstanceError(ValueError):
    """An instance is malformed; the message starts with the instance's name."""


def instance_name(dataset: str, instance_id: str) -> str:
    """Human-readable name of the key ``(dataset, id)``: ``"dataset/id"`` (``"id"`` if no dataset)."""
    return f"{dataset}/{instance_id}" if dataset else str(instance_id)


class DatasetKeyed:
    """Base of a dataset item with ``dataset`` and ``id`` attributes: its record key and its name."""

    @property
    def key(self) -> tuple[str, str]:
        """The record key ``(dataset, id)``."""
        return (self.dataset, self.id)

    @property
    def name(self) -> str:
        """``"dataset/id"``, used in error messages (`instance_name`)."""
        return instance_name(self.dataset, self.id)


@dataclasses.dataclass(frozen=True, eq=False)
class Instance(DatasetKeyed):
    """One evaluation instance held in memory.

    Attributes:
      id: identifier, unique within ``dataset`` (e.g. the image file stem plus
        an object index).
      image: uint8[H, W, 3] RGB image.
      gt: int8[H, W] ground truth: 1 object, 0 background, -1 ignore.
      dataset: name of the dataset the instance belongs to ("" if none).
      source_paths: files the instance was read from (image first, then masks);
        used for the dataset fingerprint and in error messages.
      num_classes: 2 for a binary object mask (the default); C > 2 for a
        class-label map with values in [-1, C) (-1 = void).
    """

    id: str
    image: np.ndarray
    gt: np.ndarray
    dataset: str = ""
    source_paths: tuple[str, ...] = ()
    num_classes: int = BINARY_CLASSES

    @property
    def size(self) -> tuple[int, int]:
        """(H, W) of the image in pixels (from the array shape, unchecked)."""
        shape = np.shape(self.image)
        return (int(shape[0]), int(shape[1])) if len(shape) >= 2 else (0, 0)

    def load(self) -> Instance:
        """Returns the instance itself (it is already in memory)."""
        return self


@dataclasses.dataclass(frozen=True, eq=False)
class InstanceRef(DatasetKeyed):
    """A lazily loaded instance: its key, its declared size and a loader.

    Attributes:
      id: identifier, unique within ``dataset``.
      height, width: declared image size in pixels (e.g. read from the image
        header); used for bucketing before anything is decoded. The loaded
        instance must have exactly this size.
      loader: zero-argument callable returning the `Instance`; may raise (the
        runner records the instance as failed with the error).
      dataset: dataset name ("" if none).
      source_paths: files the loader reads (image first); the dataset
        fingerprint is computed from them.
      fingerprint: optional caller-supplied token that changes whenever the
        content changes (e.g. a dataset version plus an index); used by the
        dataset fingerprint when there are no ``source_paths``.
    """

    id: str
    height: int
    width: int
    loader: Callable[[], Instance]
    dataset: str = ""
    source_paths: tuple[str, ...] = ()
    fingerprint: str = ""

    @property
    def size(self) -> tuple[int, int]:
        """Declared (H, W) in pixels."""
        return (int(self.height), int(self.width))

    def load(self) -> Instance:
        """Calls the loader and checks that it returned this key at the declared size.

        Raises:
          InstanceError: the loader returned something other than an `Instance`,
            or one with a different key or size. Exceptions of the loader
            propagate unchanged.
        """
        instance = self.loader()
        if not isinstance(instance, Instance):
            raise InstanceError(f"{self.name}: loader returned {type(instance).__name__}, expected Instance")
        if instance.key != self.key:
            raise InstanceError(f"{self.name}: loader returned instance {instance.name!r}")
        if instance.size != self.size:
            raise InstanceError(
                f"{self.name}: declared size (H, W) = {self.size} but the loaded image is {instance.size}"
            )
        return instance


AnyInstance = Union[Instance, InstanceRef]


def validate_key(instance: AnyInstance) -> None:
    """Checks the key of an `Instance` or `InstanceRef` (no arrays touched).

    Raises:
      InstanceError: not an instance, ``id`` not a non-empty str, ``dataset``
        not a str, or ``source_paths`` not a tuple of str.
    """
    if not isinstance(instance, (Instance, InstanceRef)):
        raise InstanceError(f"expected an Instance or InstanceRef, got {type(instance).__name__}")
    if not isinstance(instance.id, str) or not instance.id:
        raise InstanceError(f"instance id must be a non-empty str, got {instance.id!r}")
    if not isinstance(instance.dataset, str):
        raise InstanceError(f"{instance.id}: dataset must be a str, got {type(instance.dataset).__name__}")
    if not isinstance(instance.source_paths, tuple) or not all(isinstance(p, str) for p in instance.source_paths):
        raise InstanceError(f"{instance.name}: source_paths must be a tuple of str, got {instance.source_paths!r}")


def validate_declared_size(instance: AnyInstance) -> None:
    """Checks that an `InstanceRef`'s declared size is two positive ints (an `Instance` passes).

    Raises:
      InstanceError: naming the instance.
    """
    if isinstance(instance, InstanceRef):
        for field in ("height", "width"):
            value = getattr(instance, field)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
                raise InstanceError(f"{instance.name}: declared {field} must be a positive int, got {value!r}")


def validate_instance(instance: Instance) -> None:
    """Checks that an in-memory instance is well-formed.

    Args:
      instance: the `Instance` to check.

    Raises:
      InstanceError: naming the instance, when the key is malformed, ``image``
        is not a uint8[H, W, 3] array with H, W > 0, ``gt`` is not an
        int8[H, W] array of the same H, W, or ``gt`` holds a value outside
        {-1, 0, 1} (binary) or [-1, num_classes) (multi-class).
    """
    validate_key(instance)
    if not isinstance(instance, Instance):
        raise InstanceError(f"{instance.name}: expected a loaded Instance, got {type(instance).__name__}")
    name = instance.name
    image, gt = instance.image, instance.gt
    if not isinstance(image, np.ndarray):
        raise InstanceError(f"{name}: image must be a numpy array, got {type(image).__name__}")
    if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3:
        raise InstanceError(f"{name}: image must be uint8[H, W, 3], got {image.dtype}{list(image.shape)}")
    if image.shape[0] == 0 or image.shape[1] == 0:
        raise InstanceError(f"{name}: image is empty, shape {list(image.shape)}")
    if not isinstance(gt, np.ndarray):
        raise InstanceError(f"{name}: gt must be a numpy array, got {type(gt).__name__}")
    if gt.dtype != np.int8 or gt.ndim != 2:
        raise InstanceError(f"{name}: gt must be int8[H, W], got {gt.dtype}{list(gt.shape)}")
    if gt.shape != image.shape[:2]:
        raise InstanceError(f"{name}: gt shape {list(gt.shape)} differs from image size {list(image.shape[:2])}")
    classes = instance.num_classes
    if isinstance(classes, bool) or not isinstance(classes, (int, np.integer)) or not 2 <= classes <= MAX_CLASSES:
        raise InstanceError(f"{name}: num_classes must be an int in [2, {MAX_CLASSES}], got {classes!r}")
    if classes == BINARY_CLASSES:
        bad = ~np.isin(gt, _GT_VALUES)
        allowed = "{-1, 0, 1}"
    else:
        bad = (gt < IGNORE_LABEL) | (gt >= classes)
        allowed = f"[-1, {classes}) (-1 = void)"
    if bad.any():
        values = np.unique(gt[bad])[:5].tolist()
        raise InstanceError(f"{name}: gt holds values {values} outside {allowed}")


def require_object(instance: Instance) -> None:
    """Check for protocols that need an object: ``gt`` has at least one pixel equal to 1.

    Pass it to the runner (``check=require_object``) where an empty object
    makes an instance meaningless (clicks and boxes need a target).

    Raises:
      InstanceError: naming the instance, when ``gt`` has no object pixel.
    """
    if not np.any(np.asarray(instance.gt) == OBJECT_LABEL):
        raise InstanceError(f"{instance.name}: gt has no object pixel (value 1)")


def make_instance(
    instance_id: str,
    image,
    gt,
    *,
    dataset: str = "",
    source_paths: Sequence[str] = (),
    ignore=None,
) -> Instance:
    """Builds a validated `Instance` from array-likes.

    Args:
      instance_id: identifier, unique within ``dataset``.
      image: uint8[H, W, 3] RGB image (array-like; not converted, so a float
        or grey image is rejected rather than silently rescaled).
      gt: [H, W] bool or integer array with values in {-1, 0, 1}.
      dataset: dataset name.
      source_paths: files the instance was read from.
      ignore: optional bool[H, W]; where true, ``gt`` becomes -1.

    Returns:
      The `Instance` with ``gt`` as int8.

    Raises:
      InstanceError: naming the instance, on any malformed input (see
        `validate_instance`), a non-integer ``gt``, or an ``ignore`` mask of
        the wrong shape.
    """
    name = instance_name(dataset, instance_id) if isinstance(dataset, str) else str(instance_id)
    image_array = np.asarray(image)
    gt_array = np.asarray(gt)
    if gt_array.dtype == bool:
        gt_array = gt_array.astype(np.int8)
    elif np.issubdtype(gt_array.dtype, np.integer):
        bad = ~np.isin(gt_array, _GT_VALUES)
        if bad.any():
            values = np.unique(gt_array[bad])[:5].tolist()
            raise InstanceError(f"{name}: gt holds values {values} outside {{-1, 0, 1}}")
        gt_array = gt_array.astype(np.int8)
    else:
        raise InstanceError(f"{name}: gt must be bool or integer, got {gt_array.dtype}")
    if ignore is not None:
        ignore_array = np.asarray(ignore)
        if ignore_array.dtype != bool or ignore_array.shape != gt_array.shape:
            raise InstanceError(
                f"{name}: ignore must be bool{list(gt_array.shape)}, got {ignore_array.dtype}{list(ignore_array.shape)}"
            )
        gt_array = np.where(ignore_array, np.int8(IGNORE_LABEL), gt_array)
    instance = Instance(
        id=instance_id,
        image=image_array,
        gt=np.ascontiguousarray(gt_array),
        dataset=dataset,
        source_paths=tuple(str(p) for p in source_paths),
    )
    validate_instance(instance)
    return instance
