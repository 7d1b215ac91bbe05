"""`GpcisSegmenter`: GPCIS behind the Segmenter protocol (docs/models/gpcis.md).

GPCIS is a click-map model (the clicks enter the network as disk maps with the
previous probability map), so it reuses `ClickMapSegmenter`'s protocol, its
decode and the isegm predictor machinery (`jaxseg_robust.models.clickmap.isegm`);
what differs is declared here:

* the network (`network.GpcisNet`) also reads the clicks themselves, as
  feature-pixel indices of its Gaussian-process head, so ``grid_logits`` passes
  them on; ``network_logits`` (maps only, the flip path) is refused: the
  authors' GPCIS predictor has no flip averaging;
* the authors' predictor (`gpcis_options`): isegm's zoom-in cropping at the
  image's resolution (``native_crop``; min crop 10, expansion 1.4, threshold
  0.49, the ROI recomputed at every click) followed by ``ResizeTrans`` to a square network input (384, or 256 on
  SBD for RClicks), no flip, no cascade; the TETRIS authors skip the zoom while
  there is no previous prediction (``skip_clicks=0``), RClicks' scripts skip it
  at the first click (``skip_clicks=1``, ``-1`` on their TETRIS dataset);
* `FamilyRules` as the click-map families (family "gpcis"; the TETRIS step is
  the network input's diagonal; gradients reach the click only through its
  soft disk, never through the GP's indices; docs/protocols/tetris.md,
  "Families").
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from jaxseg_robust.models.clickmap.isegm import ISEGM_THRESHOLD, PREDICTOR_PROTOCOLS, IsegmOptions
from jaxseg_robust.models.clickmap.layers import random_params
from jaxseg_robust.models.clickmap.segmenter import ClickMapSegmenter
from jaxseg_robust.models.clickmap.zoom_in import ZoomInConfig
from jaxseg_robust.models.gpcis.config import GpcisConfig
from jaxseg_robust.models.gpcis.network import GpcisNet

INFER_SIZE = 384
INFER_SIZE_SBD = 256
MIN_CROP_SIZE = 10  # GPCIS's ZoomIn default (RITM's is 200)
# GPCIS's ZoomIn sets ``update_object_roi = True`` before and in every branch of its keep-or-recompute test, so
# the ROI is the current prediction's box at every zoomed click: a box IoU below 1 (any other box) recomputes.
ALWAYS_RECOMPUTE = 1.0


def gpcis_options(protocol: str, dataset: str | None = None) -> IsegmOptions:
    """The authors' GPCIS predictor a protocol runs (docs/models/gpcis.md, "Evaluation").

    Args:
      protocol: "tetris" (image-seg/adv-clicks ``evaluate_model_gpcis.py``: infer size 384,
        ``skip_clicks=0``) or "rclicks" (emb-ai/rclicks ``evaluate_model_gpcis.py``: 256 on SBD,
        else 384; ``skip_clicks`` -1 on their TETRIS dataset, else 1).
      dataset: the run's dataset name, or None.

    Returns:
      `IsegmOptions` with the native-crop zoom-in at the infer size, no flip, no cascade.
    """
    if protocol not in PREDICTOR_PROTOCOLS:
        raise ValueError(f"unknown predictor protocol {protocol!r}; use one of {PREDICTOR_PROTOCOLS}")
    name = (dataset or "").upper()
    size, skip = INFER_SIZE, 0
    if protocol == "rclicks":
        size = INFER_SIZE_SBD if name == "SBD" else INFER_SIZE
        skip = -1 if name == "TETRIS" else 1
    zoom = ZoomInConfig(target_hw=(size, size), skip_clicks=skip, min_crop_size=MIN_CROP_SIZE,
                        recompute_thresh_iou=ALWAYS_RECOMPUTE, prob_thresh=ISEGM_THRESHOLD, native_crop=True)
    return IsegmOptions(zoom_in=zoom, with_flip=False)


@dataclasses.dataclass(frozen=True)
class GpcisSegmenter(ClickMapSegmenter):
    """GPCIS (static configuration; weights are passed as ``params``); fields as `ClickMapSegmenter`
    with ``config`` a `GpcisConfig`."""

    def __post_init__(self):
        super().__post_init__()
        if not isinstance(self.config, GpcisConfig):
            raise ValueError(f"GpcisSegmenter needs a GpcisConfig; got {type(self.config).__name__}")
        if self.evaluation is not None and self.evaluation.with_flip:
            raise ValueError("GPCIS's predictor has no flip averaging (its network reads the clicks as indices)")

    @property
    def network(self) -> GpcisNet:
        """The linen network (image, click maps, clicks, labels) -> logits."""
        return GpcisNet(self.config)

    def param_shapes(self) -> dict:
        """The parameter tree as ShapeDtypeStructs (traced once per config, then cached)."""
        return _param_shapes(self.config)

    def init(self, key) -> dict:
        """Random parameters of a sensible scale (host draws; see `layers.random_params`)."""
        return random_params(self.param_shapes(), key)

    def network_logits(self, params, image, maps):
        """Refused: GPCIS's network also needs the clicks (use `grid_logits`)."""
        raise TypeError("GPCIS's network reads the clicks as indices besides their maps: use grid_logits")

    def grid_logits(self, params, image: jnp.ndarray, points: jnp.ndarray, labels: jnp.ndarray,
                    prev_prob: jnp.ndarray) -> jnp.ndarray:
        """One network run on one grid: image f32[h, w, 3], clicks (x, y) on it, previous
        probability f32[h, w] -> logits f32[h, w] (``GpModel(image, points)["instances"]``)."""
        maps = self.click_features(points, labels, prev_prob)
        out = self.network.apply({"params": params}, image[None], maps[None], points[None], labels[None])
        return out[0]

    def with_predictor(self, use: bool, dataset: str | None = None, protocol: str = "tetris") -> GpcisSegmenter:
        """This segmenter with the authors' GPCIS predictor (`gpcis_options` of ``protocol`` and
        ``dataset``) or without it (the network on the whole frame)."""
        if not use:
            return dataclasses.replace(self, evaluation=None)
        if self.evaluation is not None:
            return self
        return dataclasses.replace(self, evaluation=gpcis_options(protocol, dataset))


@functools.lru_cache(maxsize=8)
def _param_shapes(config: GpcisConfig) -> dict:
    """`GpcisSegmenter.param_shapes` of a config (hashable, frozen)."""
    image = jax.ShapeDtypeStruct((1, 64, 64, 3), jnp.float32)
    maps = jax.ShapeDtypeStruct((1, 64, 64, config.coord_channels), jnp.float32)
    points = jax.ShapeDtypeStruct((1, 2, 2), jnp.float32)
    labels = jax.ShapeDtypeStruct((1, 2), jnp.int32)
    return jax.eval_shape(GpcisNet(config).init, jax.random.key(0), image, maps, points, labels)["params"]
