"""The size guard of every command: images larger than ``max_side`` are downsized on load, and the record says so.

`guard_size` wraps the `InstanceRef`s of a dataset listing: an instance whose
longest side exceeds ``max_side`` is loaded downsized (Pillow bilinear for the
image, nearest neighbour for the ground truth), keeping its aspect; its
``resize_note`` (original size, scale, how results map back) becomes the
record's ``"resized"`` field. The TETRIS dataset's own cap is applied when
listing (`jaxseg_robust.data.datasets`, OpenCV ``INTER_LINEAR``).
"""

from __future__ import annotations

import dataclasses

import numpy as np
from PIL import Image

from jaxseg_robust.data.instances import (
    Instance,
    InstanceRef,
    make_instance,
)
from jaxseg_robust.data.image_files import capped_size


# ----------------------------------------------------------------------------- size guard (every command)

DEFAULT_MAX_SIDE = 2048  # memory guard: ~550 bytes per pixel (tetris, 4000x3000 image: 3.0 GB peak, 7.8 unguarded)
SIZE_GUARD_METHOD = "Pillow bilinear (image), nearest neighbour (ground truth)"
MAP_BACK = ("results (clicks, boxes, masks, metrics) are in the resized frame of size [h, w]; a point (x, y) maps "
            "back to x0 = (x + 0.5) * W0 / w - 0.5, y0 = (y + 0.5) * H0 / h - 0.5, a mask by nearest-neighbour "
            "resize to [H0, W0]")


@dataclasses.dataclass(frozen=True, eq=False)
class ResizedInstanceRef(InstanceRef):
    """An `InstanceRef` whose loader returns a downsized image (declared size = the resized size).

    Attributes (beyond `InstanceRef`'s):
      original_height, original_width: the size of the image on disk (H0, W0).
      max_side: the longest-side cap that caused the resize.
      method: how the image and the ground truth were resized.
    """

    original_height: int = 0
    original_width: int = 0
    max_side: int = 0
    method: str = SIZE_GUARD_METHOD

    @property
    def resize_note(self) -> dict:
        """What a run records in the instance's record (``"resized"``): sizes, scale, method, how to map back."""
        return {"original_size": [int(self.original_height), int(self.original_width)],
                "size": [int(self.height), int(self.width)],
                "scale": [self.height / self.original_height, self.width / self.original_width],
                "max_side": int(self.max_side), "method": self.method, "map_back": MAP_BACK}


def _guarded_loader(ref: InstanceRef, height: int, width: int):
    def load() -> Instance:
        instance = ref.load()
        image = np.asarray(Image.fromarray(instance.image).resize((width, height), Image.BILINEAR))
        shifted = Image.fromarray((instance.gt.astype(np.int16) + 1).astype(np.uint8))  # {-1, 0, 1} -> {0, 1, 2}
        gt = np.asarray(shifted.resize((width, height), Image.NEAREST)).astype(np.int8) - 1
        return make_instance(instance.id, image, gt, dataset=instance.dataset, source_paths=instance.source_paths)

    return load


def guard_size(refs, max_side: int | None) -> list:
    """The size guard: instances whose longest side exceeds ``max_side`` are downsized on load.

    The cap follows `capped_size` (aspect kept, never enlarged); images are
    resized with Pillow's bilinear filter, ground truth (including the ignore
    label) with nearest neighbour. Each downsized instance becomes a
    `ResizedInstanceRef`, whose ``resize_note`` the runner stores in its
    record. Nothing is decoded here: the declared sizes decide.

    Args:
      refs: `InstanceRef`s (anything else is passed through unchanged).
      max_side: the cap in pixels; None or 0: no guard.

    Returns:
      The refs, downsized ones replaced.

    Raises:
      ValueError: a negative or non-integer ``max_side``.
    """
    capped_size(1, 1, max_side)  # validates max_side
    if not max_side:
        return list(refs)
    out = []
    for ref in refs:
        if not isinstance(ref, InstanceRef) or max(ref.height, ref.width) <= max_side:
            out.append(ref)
            continue
        height, width = capped_size(ref.height, ref.width, max_side)
        original, method = ref.size, SIZE_GUARD_METHOD
        if isinstance(ref, ResizedInstanceRef):  # resized before (the TETRIS cap): keep the size on disk
            original, method = (ref.original_height, ref.original_width), f"{ref.method}, then {method}"
        out.append(ResizedInstanceRef(ref.id, height, width, _guarded_loader(ref, height, width), ref.dataset,
                                      tuple(ref.source_paths), ref.fingerprint, original_height=original[0],
                                      original_width=original[1], max_side=int(max_side), method=method))
    return out


TETRIS_CAP_METHOD = "OpenCV INTER_LINEAR (image and each object's mask), the TETRIS protocol's cap"


def _capped_ref(ref: InstanceRef, original_size: tuple[int, int], max_side: int) -> InstanceRef:
    """``ref`` as a `ResizedInstanceRef` when the TETRIS cap shrank it (so its record says so), else ``ref``."""
    if ref.size == tuple(original_size):
        return ref
    return ResizedInstanceRef(ref.id, ref.height, ref.width, ref.loader, ref.dataset, ref.source_paths,
                              ref.fingerprint, original_height=int(original_size[0]),
                              original_width=int(original_size[1]), max_side=int(max_side), method=TETRIS_CAP_METHOD)
