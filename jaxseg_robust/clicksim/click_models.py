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
    wrapper; it lives in the models layer
    (`jaxseg_robust.models.clickability.click_model`, re-exported here).

  * `SaliencyClickModel` ("saliency", §4 "SM"): TranSalNet_Res saliency of the crop around
    the error region, grey outside it, restricted to it and normalised (RClicks' Appendix B.2
    construction; docs/models/transalnet.md); "saliency_image" (§4 "SI") the same on the raw
    crop; it lives in the models layer (`jaxseg_robust.models.saliency.click_model`, re-exported here).

`load_click_model` resolves ``"dt"``, ``"ud"``, ``"saliency"``, ``"saliency_image"``, a converted directory or a
zoo name of a click-model family (`CLICK_MODEL_FAMILIES`); the family ``"clickability"``
and the name ``rclicks_clickability`` (``python -m ports clickability``) are registered by
`jaxseg_robust.models.clickability.registry`, the family ``"transalnet"`` and the names
``transalnet_res`` (``python -m ports transalnet``) and ``transalnet_tiny`` by
`jaxseg_robust.models.saliency.registry`.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Protocol

import jax
import jax.numpy as jnp
import numpy as np

from jaxseg_robust.models import zoo
from jaxseg_robust.models.clickability.click_model import (BENCHMARK_MINMAX_EPS, LoadedClickModel,
                                                           NetworkClickModel, check_frame,
                                                           letterbox_matrices, unletterbox_matrices)
from jaxseg_robust.models.clickability.model import FAMILY as CLICKABILITY_FAMILY
from jaxseg_robust.models.clickability.model import ClickabilityConfig
from jaxseg_robust.models.clickability.registry import ZOO_NAME
from jaxseg_robust.models.saliency.click_model import SaliencyClickModel
from jaxseg_robust.models.saliency.config import FAMILY as SALIENCY_FAMILY
from jaxseg_robust.models.saliency.config import TranSalNetConfig
from jaxseg_robust.models.saliency.registry import ALIAS as SALIENCY_ALIAS
from jaxseg_robust.models.saliency.registry import VARIANTS as SALIENCY_VARIANTS
from jaxseg_robust.models.saliency.registry import saliency_variant
from jaxseg_robust.models.saliency.registry import ZOO_NAME as SALIENCY_ZOO_NAME
from jaxseg_robust.ops.distance import distance_transform_edt

__all__ = [
    "BASELINE_NAMES",
    "BENCHMARK_MINMAX_EPS",
    "CLICK_MODEL_FAMILIES",
    "SALIENCY_ALIAS",
    "SALIENCY_ZOO_NAME",
    "ZOO_NAME",
    "ClickModel",
    "DistanceTransformClickModel",
    "UniformClickModel",
    "NetworkClickModel",
    "SaliencyClickModel",
    "letterbox_matrices",
    "unletterbox_matrices",
    "load_click_model",
    "LoadedClickModel",
    "first_round_program",
]

BASELINE_NAMES = ("dt", "ud")
CLICK_MODEL_FAMILIES = (CLICKABILITY_FAMILY, SALIENCY_FAMILY)  # zoo families whose models are click models


class ClickModel(Protocol):
    """What the simulator needs from a click model (see the module docstring)."""

    name: str

    def prepare(self, image: np.ndarray, gt: np.ndarray, frame_hw: tuple[int, int]) -> dict:
        """Host-side, once per instance: numpy arrays whose shapes depend only on ``frame_hw``."""

    def clickability(self, params, prepared: dict, region: jax.Array, inside: jax.Array) -> jax.Array:
        """f32[Hf, Wf] non-negative map for the error region ``region`` (pure, vmappable)."""


class _MapOnlyClickModel:
    """Base of the baselines, whose map needs nothing from the image: ``prepare`` only validates the shapes."""

    def prepare(self, image, gt, frame_hw) -> dict:
        """No per-instance data (validates the shapes only)."""
        check_frame(image, gt, frame_hw)
        return {}


@dataclasses.dataclass(frozen=True)
class DistanceTransformClickModel(_MapOnlyClickModel):
    """DT baseline (§4): ``EDT(R) / max EDT(R)``, image border not background."""

    name: str = "dt"

    def clickability(self, params, prepared, region, inside) -> jax.Array:
        """Args: region, inside bool[Hf, Wf]. Returns f32[Hf, Wf] in [0, 1] (0 outside ``region``)."""
        region = jnp.asarray(region, bool)
        foreground = region | ~jnp.asarray(inside, bool)  # outside the image is not background
        distance = jnp.where(region, distance_transform_edt(foreground), 0.0)
        peak = jnp.max(distance)
        return jnp.where(peak > 0, distance / jnp.where(peak > 0, peak, 1.0), 0.0)


@dataclasses.dataclass(frozen=True)
class UniformClickModel(_MapOnlyClickModel):
    """UD baseline (§4): ``R / max R`` (every error pixel equally likely)."""

    name: str = "ud"

    def clickability(self, params, prepared, region, inside) -> jax.Array:
        """Args: region, inside bool[Hf, Wf]. Returns f32[Hf, Wf]: 1 on the region, else 0."""
        return (jnp.asarray(region, bool) & jnp.asarray(inside, bool)).astype(jnp.float32)


def _click_model_family(name_or_dir: str) -> str:
    """The zoo family of a click-model name or converted directory (ValueError for any other family)."""
    family_name = zoo.family_of_directory(name_or_dir) if os.path.isdir(name_or_dir) else zoo.get(name_or_dir).family
    if family_name not in CLICK_MODEL_FAMILIES:
        raise ValueError(f"{name_or_dir!r} is a {family_name} model, not a click model (families: "
                         f"{', '.join(CLICK_MODEL_FAMILIES)})")
    return family_name


def load_click_model(spec: str | os.PathLike, *, random_seed: int | None = None,
                     config: ClickabilityConfig | TranSalNetConfig | None = None) -> LoadedClickModel:
    """Resolves ``"dt"``, ``"ud"``, ``"saliency"``, ``"saliency_image"``, a converted directory or a click-model
    zoo name.

    Args:
      spec: ``"dt"`` / ``"ud"`` (baselines), ``"saliency"`` / ``"saliency_image"`` (`SALIENCY_ZOO_NAME`'s
        weights behind RClicks' SM / SI construction), a directory written by ``python -m ports clickability`` or
        ``python -m ports transalnet``, or a zoo name of those families (``"rclicks_clickability"``,
        ``"transalnet_res"``: converted weights under ``$JAXSEG_ROBUST_MODELS``).
      random_seed: with a zoo name: seeded random weights instead (tests, benchmarks).
      config: with ``random_seed``: the network configuration (default: the zoo's).
    Raises:
      ValueError: an unknown name or a model of another family; FileNotFoundError: the named
      weights were not converted (the message gives the port command);
      jaxseg_robust.models.store.StoreError: a damaged directory.
    """
    text = os.fspath(spec)
    if text in BASELINE_NAMES:
        if random_seed is not None:
            raise ValueError(f"random_seed does not apply to the {text!r} baseline")
        return LoadedClickModel(DistanceTransformClickModel() if text == "dt" else UniformClickModel(), None, text)
    variant = text if text in SALIENCY_VARIANTS else None
    text = SALIENCY_ZOO_NAME if variant is not None else text
    if random_seed is not None:
        if os.path.isdir(text):
            raise ValueError("random_seed takes the zoo name, not a converted directory")
        family = zoo.family(_click_model_family(text))
        model = family.segmenter(zoo.get(text).config if config is None else config)
        loaded = LoadedClickModel(model, model.init(int(random_seed)), f"random:{int(random_seed)}")
    else:
        path = zoo.resolve(text)  # a directory, or a known (converted) name
        _click_model_family(os.fspath(path))
        model, params, _ = zoo.load_params(path)
        loaded = LoadedClickModel(model, params, str(path))
    if variant is None:
        return loaded
    return LoadedClickModel(saliency_variant(loaded.model, variant), loaded.params, loaded.source)


@functools.lru_cache(maxsize=8)
def first_round_program(click_model):
    """The jitted first-round map of a click model: ``(params, prepared, region bool[Hf, Wf]) -> f32[Hf, Wf]``,
    ``click_model.clickability`` with the whole frame as the image, zero outside ``region`` (the GT object
    in the first round; rclicks.md §5.2)."""
    def program(params, prepared, region):
        inside = jnp.ones_like(region)
        return click_model.clickability(params, prepared, region, inside) * region

    return jax.jit(program)
