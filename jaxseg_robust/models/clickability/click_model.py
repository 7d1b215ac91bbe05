"""The RClicks clickability network as a click model of the simulated user (docs/protocols/rclicks.md §3.6).

A click model turns the error region ``R`` of a round into a non-negative map
``M`` on the evaluation frame (the interface is in `jaxseg_robust.clicksim.click_models`;
host preparation once per instance, a pure device function per round)::

    prepared = model.prepare(image uint8[H, W, 3], gt bool[H, W], frame_hw)   # numpy pytree
    M = model.clickability(params, prepared, region bool[Hf, Wf], inside bool[Hf, Wf])

`NetworkClickModel` runs the network through the benchmark wrapper
(``SegNeXtSaliencyApply``): ``G`` and ``R`` letterboxed (OpenCV ``INTER_LINEAR``,
soft edges kept), network forward with min-max over the 416² canvas (eps 1e-8),
crop and bilinear resize back (torchvision 0.16, no antialias), no second
normalisation. The image canvas and ``G`` are letterboxed on the host exactly as
`letterbox`; the per-round letterbox of ``R`` and the un-letterbox are matrix
products with interpolation matrices built on the host from the same tap rules
(so both are exact linear maps of those resizes; float32 products,
``Precision.HIGHEST``). Only the image stem could be shared across rounds (§3.6
design note); the whole network runs per round.

It lives in the models layer so that the zoo's registration of the family
(`jaxseg_robust.models.clickability.registry`) imports only downwards.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxseg_robust.models.clickability.letterbox import (letterbox, letterbox_geometry,
                                                         normalize_image, resize_linear)
from jaxseg_robust.models.clickability.model import SEGNEXT_B, ClickabilityConfig, ClickabilityNet
from jaxseg_robust.ops.resize import linear_taps

__all__ = ["BENCHMARK_MINMAX_EPS", "LoadedClickModel", "NetworkClickModel", "check_frame",
           "letterbox_matrices", "unletterbox_matrices"]

BENCHMARK_MINMAX_EPS = 1e-8  # SegNeXtSaliencyApply.apply (§3.6, second wrapper)


def check_frame(image: np.ndarray, gt: np.ndarray, frame_hw) -> tuple[int, int, int, int]:
    """Validates one instance against its evaluation frame; returns (H, W, Hf, Wf).

    Raises:
      ValueError: a wrong image or mask shape, or a frame smaller than the image.
    """
    image, gt = np.asarray(image), np.asarray(gt)
    if image.ndim != 3 or image.shape[2] != 3 or min(image.shape[:2]) < 1:
        raise ValueError(f"image must have shape [H, W, 3]; got {image.shape}")
    if gt.shape != image.shape[:2]:
        raise ValueError(f"gt shape {gt.shape} differs from the image size {image.shape[:2]}")
    frame_h, frame_w = (int(v) for v in frame_hw)
    if frame_h < image.shape[0] or frame_w < image.shape[1]:
        raise ValueError(f"frame_hw {tuple(frame_hw)} is smaller than the image {image.shape[:2]}")
    return image.shape[0], image.shape[1], frame_h, frame_w


def letterbox_matrices(height: int, width: int, frame_hw: tuple[int, int],
                       size: int) -> tuple[np.ndarray, np.ndarray]:
    """Linear maps of the RClicks letterbox of an ``height x width`` mask in a padded frame (host).

    ``letterbox(X) = Ry @ X_frame @ Rx.T`` for any ``X_frame`` f32[Hf, Wf] whose
    image part is ``X`` (the rest is ignored: its columns are zero). The rows
    are OpenCV ``INTER_LINEAR`` taps (`models.clickability.letterbox.resize_linear`).

    Returns:
      (Ry f32[size, Hf], Rx f32[size, Wf]).
    """
    frame_h, frame_w = (int(v) for v in frame_hw)
    g = letterbox_geometry(height, width, size)
    rows = np.zeros((size, frame_h), np.float32)
    cols = np.zeros((size, frame_w), np.float32)
    # Resizing the identity along one axis (the other axis keeps its size: identity taps)
    # gives the interpolation matrix of that axis.
    rows[g.top:g.top + g.resized_h, :height] = resize_linear(np.eye(height, dtype=np.float32), g.resized_h, height)
    cols[g.left:g.left + g.resized_w, :width] = resize_linear(np.eye(width, dtype=np.float32), g.resized_w, width)
    return rows, cols


def unletterbox_matrices(height: int, width: int, frame_hw: tuple[int, int],
                         size: int) -> tuple[np.ndarray, np.ndarray]:
    """Linear maps of the un-letterbox (crop the pasted region, bilinear resize to H x W) (host).

    ``unletterbox(C)`` placed in the frame ``= Uy @ C @ Ux.T`` for a canvas f32[size, size];
    rows/columns outside the image are zero. Taps: torch ``interpolate(bilinear,
    align_corners=False)`` without antialias (`ops.resize.linear_taps`).

    Returns:
      (Uy f32[Hf, size], Ux f32[Wf, size]).
    """
    frame_h, frame_w = (int(v) for v in frame_hw)
    g = letterbox_geometry(height, width, size)
    out = []
    for out_len, frame_len, crop_len, offset in ((height, frame_h, g.resized_h, g.top),
                                                 (width, frame_w, g.resized_w, g.left)):
        matrix = np.zeros((frame_len, size), np.float32)
        index, weight = linear_taps(crop_len, out_len)
        for k in range(index.shape[1]):
            np.add.at(matrix, (np.arange(out_len), offset + index[:, k]), weight[:, k])
        out.append(matrix)
    return out[0], out[1]


def _matmul(a, b):
    return jnp.matmul(a, b, precision=lax.Precision.HIGHEST)


class NetworkBackedClickModel:
    """Base of the click models whose map comes from a linen network of their ``config``: the network
    (``network_type(config)``, with ``variable_shapes`` and ``init_variables``), its variable shapes (zoo
    protocol) and random variables. Subclasses declare ``network_type`` and the ``config`` field."""

    network_type: ClassVar[type]

    @property
    def net(self):
        """The linen network (static)."""
        return self.network_type(self.config)

    def param_shapes(self) -> dict:
        """ShapeDtypeStruct tree of the variables (zoo protocol)."""
        return self.net.variable_shapes()

    def init(self, key) -> dict:
        """Random variables (the network's own initialisers), for tests and benchmarks."""
        key = jax.random.PRNGKey(key) if isinstance(key, int) else key
        return self.net.init_variables(key)


@dataclasses.dataclass(frozen=True)
class NetworkClickModel(NetworkBackedClickModel):
    """The RClicks clickability network behind the benchmark wrapper (§3.6, second wrapper).

    Params are the network's variables ``{"params", "batch_stats", "buffers"}``
    (`models.clickability.load_converted` or ``init``).
    """

    network_type: ClassVar[type] = ClickabilityNet
    config: ClickabilityConfig = SEGNEXT_B
    name: str = "clickability"

    def prepare(self, image, gt, frame_hw) -> dict:
        """Letterboxed image and ``G``, and the interpolation matrices of one instance (host).

        Args:
          image: uint8[H, W, 3] RGB.
          gt: bool[H, W] GT object mask (ignore pixels as background).
          frame_hw: (Hf, Wf) evaluation frame.
        Returns:
          {"image" f32[S, S, 3], "gt" f32[S, S], "letterbox_rows" f32[S, Hf],
           "letterbox_cols" f32[S, Wf], "unletterbox_rows" f32[Hf, S], "unletterbox_cols" f32[Wf, S]}.
        """
        height, width, frame_h, frame_w = check_frame(image, gt, frame_hw)
        size = self.config.input_size
        rows, cols = letterbox_matrices(height, width, (frame_h, frame_w), size)
        un_rows, un_cols = unletterbox_matrices(height, width, (frame_h, frame_w), size)
        return {
            "image": letterbox(normalize_image(image, self.config.pixel_mean, self.config.pixel_std), size),
            "gt": letterbox(np.asarray(gt, np.float32), size),
            "letterbox_rows": rows, "letterbox_cols": cols,
            "unletterbox_rows": un_rows, "unletterbox_cols": un_cols,
        }

    def clickability(self, params, prepared, region, inside) -> jax.Array:
        """``Apply(I, G, R)`` on the frame: f32[Hf, Wf] in [0, 1] (0 outside the image).

        Args:
          params: network variables.
          prepared: one instance's `prepare` output (as jax arrays).
          region: bool[Hf, Wf] error region R of the round.
          inside: bool[Hf, Wf] (unused: the un-letterbox matrices are zero outside the image).
        """
        error = jnp.asarray(region, jnp.float32)
        error_canvas = _matmul(_matmul(prepared["letterbox_rows"], error), prepared["letterbox_cols"].T)
        aux = jnp.stack([prepared["gt"], error_canvas], axis=-1)[None]
        out = self.net.apply(params, prepared["image"][None], aux, train=False,
                             minmax_eps=BENCHMARK_MINMAX_EPS)
        return _matmul(_matmul(prepared["unletterbox_rows"], out.normalized[0]), prepared["unletterbox_cols"].T)


@dataclasses.dataclass(frozen=True)
class LoadedClickModel:
    """A resolved ``--clickability`` choice.

    Attributes:
      model: the click model (static).
      params: its variables (None for the baselines).
      source: ``"dt"``, ``"ud"``, ``"random:<seed>"`` or the converted directory.
    """

    model: Any
    params: Any
    source: str
