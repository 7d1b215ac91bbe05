"""The calling convention of ``segment_anything.SamPredictor``, shared by the promptable families' predictors.

`ImagePredictor` is what ``zoo.load(...)`` returns for a promptable model: it holds a segmenter and its
parameters, takes one image at a time (`set_image`, or a 3-D first argument of
``predict``) and answers ``predict(point_coords, point_labels, box, mask_input,
multimask_output, return_logits)`` with numpy arrays. Each family's subclass
says what it caches for an image and how it predicts (`SamPredictor`,
`Sam2Predictor`, `ClickMapPredictor`; docs/ARCHITECTURE.md, "Packages").
"""

from __future__ import annotations

import abc

import numpy as np

IMAGE_FORMATS = ("RGB", "BGR")


def prompt_slots(n: int) -> int:
    """Point slots for ``n`` points: the next power of two (at least 1), so that a few
    compiled programs serve every call."""
    return 1 << max(0, int(np.ceil(np.log2(max(n, 1)))))


def rgb_image(image: np.ndarray, image_format: str) -> np.ndarray:
    """uint8[H, W, 3] in RGB channel order, from an image in ``image_format`` ("RGB" or "BGR")."""
    if image_format not in IMAGE_FORMATS:
        raise ValueError(f"image_format must be 'RGB' or 'BGR'; got {image_format!r}")
    image = np.asarray(image)
    if image_format == "BGR":
        image = np.ascontiguousarray(image[..., ::-1])
    return image


class ImagePredictor(abc.ABC):
    """An image-at-a-time predictor over a segmenter and its parameters.

    Attributes:
      segmenter: the family's segmenter (static config).
      params: the parameter pytree.
      name: the model name or directory it was loaded from.
    """

    def __init__(self, segmenter, params, name: str = ""):
        self.segmenter = segmenter
        self.params = params
        self.name = name
        self.reset_image()

    @property
    def config(self):
        """The model's config."""
        return self.segmenter.config

    @abc.abstractmethod
    def reset_image(self) -> None:
        """Forgets the current image and what was computed for it."""

    @abc.abstractmethod
    def set_image(self, image: np.ndarray, image_format: str = "RGB") -> None:
        """Takes a uint8[H, W, 3] image ("RGB" or "BGR") for the next predictions."""

    @abc.abstractmethod
    def _predict(self, *args, **kwargs):
        """`predict` with the family's parameters (after a positional image is moved to ``image=``)."""

    def predict(self, *args, **kwargs):
        """Predicts masks on the current image, or on a given one: ``predict(image, **prompts)``
        (a 3-D first argument, or ``image=``) sets the image first. The prompts and outputs are
        the family's `_predict`'s."""
        if args and np.ndim(args[0]) == 3:
            if "image" in kwargs:
                raise TypeError("image given both positionally and as image=")
            kwargs["image"], args = args[0], args[1:]
        return self._predict(*args, **kwargs)

    def __call__(self, image, **kwargs):
        """``set_image(image)`` then ``predict(**kwargs)``."""
        return self.predict(image=image, **kwargs)

    def _require_image(self) -> None:
        if not self.is_image_set:
            raise RuntimeError("An image must be set with .set_image(...) before mask prediction.")


__all__ = ["IMAGE_FORMATS", "prompt_slots", "rgb_image", "ImagePredictor"]
