"""The clickability evaluation (RClicks Table 3): click models' maps of a task and their metrics on real clicks.

Reference: docs/protocols/rclicks.md, "Clickability evaluation" (C-R ``scripts/evaluate_click_models.py``;
the metrics are §7's, `jaxseg_robust.metrics.clicks`).

Per task of the clicks CSV (a runner instance whose ``gt`` holds task labels,
`jaxseg_robust.clicksim.task_instances`: the object ``G`` and the round's error region ``R``):

  device   one compiled program for a batch and every click model (`ClickMapsProtocol`):
           ``M_m = model_m.clickability(params_m, prepare_m(image, G), R, inside)`` f32[Hf, Wf] for each model
           m (first round: ``R = G = gt == 1``, ignore pixels as background; fn / fp: the error region of the
           previous mask)
  host     ``metric_map``: ``M_m`` on the image, min-max rescaled over it (the authors' metric wrapper of
           the clickability network, §3.6; the baselines' maps already span [0, 1] and are unchanged),
           then PL1, KS, WD (bootstrapped, each from its own sets), NSS and PDE of the real clicks
           (`task_metrics`; the authors' per-image CSV names them ``l1, ks2d, wasserstien, nss, pde``).

The bootstrap key of one task and model is `task_key` (the run seed, the instance key and the model's
name), so adding a model to a run changes no other model's numbers.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
from collections.abc import Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxseg_robust.clicksim.task_instances import task_object, task_region
from jaxseg_robust.hashing import instance_seed
from jaxseg_robust.metrics.clicks import DEFAULT_NUM_SETS, KS_ALPHA, evaluate_click_map
from jaxseg_robust.runner.program import CompiledFunction, check_batch

__all__ = ["METRIC_COLUMNS", "MAPS_KEY", "ClickMapsProtocol", "maps_program", "metric_map", "model_seed", "task_key",
           "task_metrics"]

# The authors' per-image CSV columns of the five metrics, in their order, and the ClickMetrics field of each.
METRIC_COLUMNS = (("l1", "pl1"), ("ks2d", "ks"), ("wasserstien", "wd"), ("nss", "nss"), ("pde", "pde"))
MAPS_KEY = "maps"  # program output: f32[B, M, Hf, Wf], model m's map of the slot's task


def metric_map(click_map: np.ndarray) -> np.ndarray:
    """A click model's map as the metrics read it: min-max rescaled over the image (float32[H, W]).

    The authors' metric wrapper of the clickability network min-max normalises its un-letterboxed map
    over the image (§3.6); the UD / DT maps already span [0, 1] and a sum-normalised saliency map is
    only rescaled, which no metric sees. A constant map is returned as it is.
    """
    click_map = np.asarray(click_map, np.float32)
    low, high = float(click_map.min()), float(click_map.max())
    if not high > low:
        return click_map
    return (click_map - np.float32(low)) / np.float32(high - low)


def model_seed(name: str) -> int:
    """A uint32 that depends only on a click model's name (first 4 bytes of its SHA-256, little-endian)."""
    return int.from_bytes(hashlib.sha256(str(name).encode("utf-8")).digest()[:4], "little")


def task_key(seed: int, key: tuple[str, str], name: str) -> jax.Array:
    """The bootstrap key of one task (instance ``key``) and click model ``name`` under the run ``seed``."""
    base = jax.random.fold_in(jax.random.key(int(seed)), instance_seed(key))
    return jax.random.fold_in(base, model_seed(name))


def task_metrics(key: jax.Array, click_map: np.ndarray, clicks_xy: np.ndarray, object_mask: np.ndarray, *,
                 num_sets: int = DEFAULT_NUM_SETS, alpha: float = KS_ALPHA) -> dict[str, float]:
    """The five metrics of one task as the authors' per-image CSV names them.

    Args:
      key: `task_key` of the task and model.
      click_map: float[H, W] the model's map on the image (`metric_map` is applied here).
      clicks_xy: int[n, 2] the real clicks (x, y), n >= 1.
      object_mask: bool[H, W] the object ``G`` (its box normalises PL1 and WD, also for fn / fp tasks).
      num_sets: bootstrap sets of PL1, KS and WD each (100); alpha: the KS level (0.05).

    Returns:
      ``{"l1", "ks2d", "wasserstien", "nss", "pde"}`` floats.

    Raises:
      ValueError: a map without positive mass, no clicks or an empty object.
    """
    clicks_xy = np.asarray(clicks_xy)
    values = evaluate_click_map(key, metric_map(click_map), clicks_xy[:, 0], clicks_xy[:, 1],
                                np.asarray(object_mask, bool),
                                num_sets=num_sets, alpha=alpha)
    return {column: float(getattr(values, field)) for column, field in METRIC_COLUMNS}


def _inside(sizes: np.ndarray, frame: tuple[int, int]) -> np.ndarray:
    rows = np.arange(frame[0])[None, :, None] < sizes[:, 0, None, None]
    cols = np.arange(frame[1])[None, None, :] < sizes[:, 1, None, None]
    return rows & cols


@functools.lru_cache(maxsize=8)
def maps_program(models: tuple) -> CompiledFunction:
    """The one compiled program of a tuple of click models (static, hashable; one per process, so a resumed or
    repeated run in the process compiles nothing new)::

        (params tuple, prepared tuple of [B, ...], region bool[B, Hf, Wf], inside bool[B, Hf, Wf])
            -> f32[B, M, Hf, Wf]
    """

    def maps(params, prepared, region, inside):
        out = []
        for model, model_params, model_prepared in zip(models, params, prepared):
            one = lambda p, r, i, m=model, w=model_params: m.clickability(w, p, r, i)  # noqa: E731
            out.append(jax.vmap(one)(model_prepared, region, inside))
        return jnp.stack(out, axis=1)

    return CompiledFunction("clickability maps program", maps)


@dataclasses.dataclass(frozen=True, eq=False)
class ClickMapsProtocol:
    """Every click model's map of a batch of tasks, one compiled program (a `runner.program.HostDrivenProtocol`).

    Attributes:
      names: the models' names (output order).
      models: their `clicksim.click_models.LoadedClickModel`s (``params`` replicated where the run shards).
    """

    names: tuple[str, ...]
    models: tuple
    name: str = "clickability maps"

    def __post_init__(self):
        if len(self.names) != len(self.models) or not self.names:
            raise ValueError(f"names {self.names} and models must be non-empty and of one length")

    @property
    def function(self) -> CompiledFunction:
        """`maps_program` of the models."""
        return maps_program(tuple(loaded.model for loaded in self.models))

    def functions(self) -> Sequence[CompiledFunction]:
        """The one program (its compile and run seconds time the batch)."""
        return (self.function,)

    def prepared(self, images: np.ndarray, objects: np.ndarray, sizes: np.ndarray) -> tuple:
        """Each model's ``prepare`` of every slot, stacked (host): a tuple of pytrees [B, ...]."""
        frame = objects.shape[1:]
        out = []
        for loaded in self.models:
            slots = [loaded.model.prepare(images[b, :h, :w], objects[b, :h, :w], frame)
                     for b, (h, w) in enumerate(sizes.tolist())]
            out.append(jax.tree.map(lambda *leaves: np.stack([np.asarray(leaf) for leaf in leaves]), *slots)
                       if jax.tree.leaves(slots[0]) else {})
        return tuple(out)

    def maps_of(self, images: Sequence[np.ndarray], gts: Sequence[np.ndarray], multiple: int = 64) -> list[np.ndarray]:
        """Every model's map of a few tasks (``gts``: task labels) at their own sizes (one batch, padded to a
        frame rounded up to ``multiple``): a list of f32[M, H, W]."""
        sizes = np.array([np.shape(gt) for gt in gts], np.int64)
        frame = tuple(int(-(-side // multiple) * multiple) for side in sizes.max(axis=0))
        padded_images = np.zeros((len(gts), *frame, 3), np.uint8)
        labels = np.zeros((len(gts), *frame), np.int8)
        for slot, (image, gt) in enumerate(zip(images, gts)):
            height, width = np.shape(gt)
            padded_images[slot, :height, :width] = image
            labels[slot, :height, :width] = gt
        params = tuple(loaded.params for loaded in self.models)
        maps = self.function(params, self.prepared(padded_images, task_object(labels), sizes),
                             jnp.asarray(task_region(labels)), jnp.asarray(_inside(sizes, frame)))
        maps = np.asarray(maps, np.float32)
        return [maps[slot, :, :height, :width] for slot, (height, width) in enumerate(sizes.tolist())]

    def run_batch(self, batch) -> Mapping:
        """``{MAPS_KEY: f32[B, M, Hf, Wf]}`` of a `PaddedBatch` of task labels (zero outside each image for the
        built-in models)."""
        images, gts, sizes = check_batch(batch)
        sizes = sizes.astype(np.int64)
        inside = _inside(sizes, gts.shape[1:])
        params = tuple(loaded.params for loaded in self.models)
        maps = self.function(params, self.prepared(images, task_object(gts), sizes), jnp.asarray(task_region(gts)),
                             jnp.asarray(inside))
        return {MAPS_KEY: np.asarray(maps, np.float32)}
