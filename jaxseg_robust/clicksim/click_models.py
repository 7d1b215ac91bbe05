"""Click models of the simulated benchmark user: the clickability network and the DT / UD baselines.

Reference: docs/protocols/rclicks.md §3.6 (the benchmark wrapper ``SegNeXtSaliencyApply``),
§4 (baselines), §5.2 step 4 (``M = Apply(I, gt, R)``).

A click model turns the error region ``R`` of a round into a non-negative map ``M``
on the evaluation frame; the simulator then restricts it to ``R`` and the
not-clicked pixels and samples inside a clicking group's band. Interface (host
preparation once per instance, a pure device function per round)::

    prepared = model.prepare(image uint8[H, W, 3], gt bool[H, W], frame_hw)   # numpy pytree
    M = model.clickability(params, prepared, region bool[Hf, Wf], inside bool[Hf, Wf])

``prepared`` has the same shapes for every instance of a frame, so a bucket
stacks it and vmaps the round function. ``inside`` marks the image's own pixels
of the (possibly padded) frame.

Models:
  * `DistanceTransformClickModel` ("dt", §4): exact EDT of ``R`` divided by its
    maximum, **without** border padding (§8.2 #21). In a padded frame the pixels
    outside the image are treated as foreground for the transform (they are not
    background), so the map equals the unpadded image's.
  * `UniformClickModel` ("ud", §4): ``R / max R`` (= ``R`` as float).
  * `NetworkClickModel`: the RClicks clickability network through the benchmark
    wrapper: ``G`` and ``R`` letterboxed (OpenCV ``INTER_LINEAR``, soft edges kept),
    network forward with min-max over the 416² canvas (eps 1e-8), crop and
    bilinear resize back (torchvision 0.16, no antialias), no second
    normalisation. The image canvas and ``G`` are letterboxed on the host exactly
    as `models.clickability.letterbox`; the per-round letterbox of ``R`` and the
    un-letterbox are matrix products with interpolation matrices built on the
    host from the same tap rules (so both are exact linear maps of those
    resizes; float32 products, ``Precision.HIGHEST``). Only the image stem could
    be shared across rounds (§3.6 design note); the whole network runs per round.

`load_click_model` resolves ``"dt"``, ``"ud"``, a converted directory or a zoo
name; importing this module registers the zoo family ``"clickability"`` and the
name ``rclicks_clickability`` (converted by ``python -m ports clickability``).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Protocol

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxseg_robust.models import zoo
from jaxseg_robust.models.clickability.letterbox import (letterbox, letterbox_geometry,
                                                         normalize_image, resize_linear)
from jaxseg_robust.models.clickability.model import (FAMILY, SEGNEXT_B, ClickabilityConfig,
                                                     ClickabilityNet, load_converted)
from jaxseg_robust.ops.distance import distance_transform_edt
from jaxseg_robust.ops.resize import linear_taps

__all__ = [
    "BASELINE_NAMES",
    "ZOO_NAME",
    "ClickModel",
    "DistanceTransformClickModel",
    "UniformClickModel",
    "NetworkClickModel",
    "letterbox_matrices",
    "unletterbox_matrices",
    "load_click_model",
    "LoadedClickModel",
]

BASELINE_NAMES = ("dt", "ud")
ZOO_NAME = "rclicks_clickability"
BENCHMARK_MINMAX_EPS = 1e-8  # SegNeXtSaliencyApply.apply (§3.6, second wrapper)


class ClickModel(Protocol):
    """What the simulator needs from a click model (see the module docstring)."""

    name: str

    def prepare(self, image: np.ndarray, gt: np.ndarray, frame_hw: tuple[int, int]) -> dict:
        """Host-side, once per instance: numpy arrays whose shapes depend only on ``frame_hw``."""

    def clickability(self, params, prepared: dict, region: jax.Array, inside: jax.Array) -> jax.Array:
        """f32[Hf, Wf] non-negative map for the error region ``region`` (pure, vmappable)."""


def _check_frame(image: np.ndarray, gt: np.ndarray, frame_hw) -> tuple[int, int, int, int]:
    image, gt = np.asarray(image), np.asarray(gt)
    if image.ndim != 3 or image.shape[2] != 3 or min(image.shape[:2]) < 1:
        raise ValueError(f"image must have shape [H, W, 3]; got {image.shape}")
    if gt.shape != image.shape[:2]:
        raise ValueError(f"gt shape {gt.shape} differs from the image size {image.shape[:2]}")
    frame_h, frame_w = (int(v) for v in frame_hw)
    if frame_h < image.shape[0] or frame_w < image.shape[1]:
        raise ValueError(f"frame_hw {tuple(frame_hw)} is smaller than the image {image.shape[:2]}")
    return image.shape[0], image.shape[1], frame_h, frame_w


@dataclasses.dataclass(frozen=True)
class DistanceTransformClickModel:
    """DT baseline (§4): ``EDT(R) / max EDT(R)``, image border not background."""

    name: str = "dt"

    def prepare(self, image, gt, frame_hw) -> dict:
        """No per-instance data (validates the shapes only)."""
        _check_frame(image, gt, frame_hw)
        return {}

    def clickability(self, params, prepared, region, inside) -> jax.Array:
        """Args: region, inside bool[Hf, Wf]. Returns f32[Hf, Wf] in [0, 1] (0 outside ``region``)."""
        region = jnp.asarray(region, bool)
        foreground = region | ~jnp.asarray(inside, bool)  # outside the image is not background
        distance = jnp.where(region, distance_transform_edt(foreground), 0.0)
        peak = jnp.max(distance)
        return jnp.where(peak > 0, distance / jnp.where(peak > 0, peak, 1.0), 0.0)


@dataclasses.dataclass(frozen=True)
class UniformClickModel:
    """UD baseline (§4): ``R / max R`` (every error pixel equally likely)."""

    name: str = "ud"

    def prepare(self, image, gt, frame_hw) -> dict:
        """No per-instance data (validates the shapes only)."""
        _check_frame(image, gt, frame_hw)
        return {}

    def clickability(self, params, prepared, region, inside) -> jax.Array:
        """Args: region, inside bool[Hf, Wf]. Returns f32[Hf, Wf]: 1 on the region, else 0."""
        return (jnp.asarray(region, bool) & jnp.asarray(inside, bool)).astype(jnp.float32)


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


@dataclasses.dataclass(frozen=True)
class NetworkClickModel:
    """The RClicks clickability network behind the benchmark wrapper (§3.6, second wrapper).

    Params are the network's variables ``{"params", "batch_stats", "buffers"}``
    (`models.clickability.load_converted` or ``init``).
    """

    config: ClickabilityConfig = SEGNEXT_B
    name: str = "clickability"

    @property
    def net(self) -> ClickabilityNet:
        """The linen network (static)."""
        return ClickabilityNet(self.config)

    def param_shapes(self) -> dict:
        """ShapeDtypeStruct tree of the variables (zoo protocol)."""
        return self.net.variable_shapes()

    def init(self, key) -> dict:
        """Random variables (torch default init), for tests and benchmarks."""
        key = jax.random.PRNGKey(key) if isinstance(key, int) else key
        return self.net.init_variables(key)

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
        height, width, frame_h, frame_w = _check_frame(image, gt, frame_hw)
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


def load_click_model(spec: str | os.PathLike, *, random_seed: int | None = None,
                     config: ClickabilityConfig | None = None) -> LoadedClickModel:
    """Resolves ``"dt"``, ``"ud"``, a converted directory or the zoo name `ZOO_NAME`.

    Args:
      spec: ``"dt"`` / ``"ud"`` (baselines), a directory written by
        ``python -m ports clickability``, or ``"rclicks_clickability"`` (converted
        weights under ``$JAXSEG_ROBUST_MODELS``).
      random_seed: with the zoo name: seeded random weights instead (tests, benchmarks).
      config: with ``random_seed``: the network configuration (default: the zoo's).
    Raises:
      ValueError: an unknown name; FileNotFoundError: the named weights were not
      converted (the message gives the port command); jaxseg_robust.models.store.StoreError: a
      damaged directory.
    """
    text = os.fspath(spec)
    if text in BASELINE_NAMES:
        if random_seed is not None:
            raise ValueError(f"random_seed does not apply to the {text!r} baseline")
        return LoadedClickModel(DistanceTransformClickModel() if text == "dt" else UniformClickModel(), None, text)
    if random_seed is not None:
        if os.path.isdir(text):
            raise ValueError("random_seed takes the zoo name, not a converted directory")
        spec_config = zoo.get(text).config if config is None else config
        if zoo.get(text).family != FAMILY:
            raise ValueError(f"{text!r} is a {zoo.get(text).family} model, not a clickability model")
        model = NetworkClickModel(spec_config)
        return LoadedClickModel(model, model.init(int(random_seed)), f"random:{int(random_seed)}")
    path = zoo.resolve(text)  # a directory, or a known (converted) name
    loaded_config, variables = load_converted(path)
    return LoadedClickModel(NetworkClickModel(loaded_config), jax.tree.map(jnp.asarray, variables), str(path))


def _with_compute_dtype(config: ClickabilityConfig, compute_dtype: str) -> ClickabilityConfig:
    if compute_dtype != "float32":
        raise ValueError(f"the clickability model computes in float32 only; got compute_dtype={compute_dtype!r}")
    return config


def _predictor(model: NetworkClickModel, params, name: str) -> LoadedClickModel:
    return LoadedClickModel(model, params, name)


zoo.register_family(zoo.FamilySpec(
    name=FAMILY,
    config_from_dict=ClickabilityConfig.from_dict,
    with_compute_dtype=_with_compute_dtype,
    segmenter=NetworkClickModel,
    predictor=_predictor,
))
zoo.register_model(ZOO_NAME, FAMILY, SEGNEXT_B, checkpoint_hint="clickability_model.pth",
                   description="RClicks clickability model (SegNeXt-B saliency, CM_5), benchmark click model")
