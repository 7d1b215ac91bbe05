"""Where a record's image came from: recorded by the prompt commands, re-loaded by the reports.

A run's records hold numbers, not pixels. So that a report can draw clicks,
boxes and heatmaps over the image, the `tetris` and `grid` commands (and the
demo's BREPS run) add a ``source`` entry to every ok payload
(`with_image_source`)::

    "source": {"image": "/abs/path/to/image.png", "size": [H, W], "gt": "<COCO RLE string>"}

``size`` is the evaluated image's size, which differs from the file's when the
loader capped the longest side (``--tetris-max-side``); `load_source_image`
re-reads the file (`data.datasets.read_image_rgb`, EXIF orientation applied)
and resizes it with the loaders' own bilinear resize when the sizes differ,
so every recorded coordinate lands on the pixel it was computed on.
Instances without a file (in-memory instances) record ``image: null``; their
reports skip the image plots (`load_source_image` returns None).

``gt`` is the evaluated ground truth's object pixels (``gt == 1``, at
``size``) as a COCO compressed RLE string (column-major runs, first run
background; `jaxseg_robust.data.coco_rle.encode_mask`), so the report outlines the exact
mask the protocol scored whatever loader, mask rule or object id made it
(`load_source_gt`; a few hundred bytes for a typical object). Records
written before it existed have no ``gt``: their figures have no outline.
"""

from __future__ import annotations

import pathlib
from collections.abc import Callable, Mapping

import numpy as np

from jaxseg_robust.data.coco_rle import decode_mask, encode_mask

SOURCE_KEY = "source"


def image_source(instance) -> dict:
    """``{"image": absolute path or None, "size": [H, W], "gt": RLE}`` of a loaded `Instance`.

    The image is the first source path; ``gt`` (`coco_rle.encode_mask` of ``instance.gt == 1``)
    is left out when the instance's ground truth is not a mask of its image size.
    """
    paths = tuple(getattr(instance, "source_paths", ()) or ())
    image = str(pathlib.Path(paths[0]).resolve()) if paths else None
    height, width = instance.size
    source = {"image": image, "size": [int(height), int(width)]}
    gt = np.asarray(instance.gt)
    if gt.shape == (int(height), int(width)):
        source["gt"] = encode_mask(gt == 1)
    return source


def with_image_source(finalize: Callable | None = None) -> Callable:
    """A runner ``finalize`` that adds ``payload["source"] = image_source(instance)``.

    Args:
      finalize: the protocol's own ``(instance, outputs) -> payload`` (None: the outputs themselves).

    Returns:
      ``(instance, outputs) -> payload`` with the ``source`` entry.

    Raises:
      ValueError (at call time): the payload already has a ``source`` key.
    """

    def add_source(instance, outputs) -> dict:
        payload = dict(finalize(instance, outputs) if finalize is not None else outputs)
        if SOURCE_KEY in payload:
            raise ValueError(f"payload of {instance.name} already has a {SOURCE_KEY!r} entry")
        payload[SOURCE_KEY] = image_source(instance)
        return payload

    return add_source


def load_source_image(payload: Mapping) -> np.ndarray | None:
    """uint8[H, W, 3] RGB image of a record payload at its evaluated size, or None when not recoverable.

    None when the payload has no ``source`` entry, no image path, or the file
    is gone or unreadable (reports then skip the image plots of that record).
    """
    from jaxseg_robust.data.datasets import read_image_rgb, resize_bilinear_uint8  # noqa: PLC0415

    source = payload.get(SOURCE_KEY) if isinstance(payload, Mapping) else None
    if not isinstance(source, Mapping) or not source.get("image"):
        return None
    path = pathlib.Path(source["image"])
    try:
        image = np.asarray(read_image_rgb(path))
    except Exception:  # noqa: BLE001 - a moved or damaged file only costs the plot
        return None
    height, width = (int(v) for v in source.get("size", image.shape[:2]))
    if image.shape[:2] != (height, width):
        image = resize_bilinear_uint8(np.ascontiguousarray(image), height, width)
    return image


def load_source_gt(payload: Mapping) -> np.ndarray | None:
    """bool[H, W] ground-truth object mask a record payload's ``source`` holds (``gt``), or None.

    None when the payload has no ``source`` or no ``gt`` (records written
    before it was recorded) or the entry does not decode to ``size``.
    """
    source = payload.get(SOURCE_KEY) if isinstance(payload, Mapping) else None
    if not isinstance(source, Mapping) or not source.get("gt") or not source.get("size"):
        return None
    try:
        return decode_mask(source["gt"], source["size"])
    except (ValueError, TypeError):
        return None


__all__ = ["SOURCE_KEY", "image_source", "with_image_source", "load_source_image", "load_source_gt"]
