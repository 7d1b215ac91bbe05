"""`CdnetSegmenter`: CDNet behind the Segmenter seam, a click-map model (docs/models/cdnet.md).

CDNet is a click-map model like RITM (`ClickMapSegmenter`: ``embed`` keeps
the image, ``decode`` runs the network on the frame with the clicks rendered
as maps); what differs is declared here:

* its click maps: [pos, neg] disks of radius 5 (the network input and the
  pixel diffusion) and of radius 24 (the FDM), four channels, no previous
  mask (`click_features`);
* its network (`network.CdnetNet`);
* its authors' predictor as both papers' scripts build it
  (``scripts/evaluate_model_cdnet.py`` of adv-clicks and of rclicks):
  GPCIS's native-resolution zoom-in (`gpcis_options`' ``ZoomInConfig``:
  the same ``zoom_in_gpcis.py`` with the same settings), then ClickSEG's
  ``DiffisionPredictor``: the crop resized to ``infer_size`` squared,
  horizontal-flip averaging of the logits, the pixel diffusion (`pdm`) and a
  sigmoid, resized back and pasted, binarised at 0.5 (`cdnet_options`;
  ``probability_threshold`` 0.5); ClickSEG's own predictor without the
  zoom-in is `clickseg_options`;
* its rules: family "cdnet"; the TETRIS step of the 384 x 384 network input.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from jaxseg_robust.models.cdnet.config import CdnetConfig
from jaxseg_robust.models.cdnet.network import CdnetNet
from jaxseg_robust.models.clickmap.encoding import click_maps
from jaxseg_robust.models.clickmap.isegm import IsegmOptions
from jaxseg_robust.models.clickmap.segmenter import ClickMapSegmenter
from jaxseg_robust.models.gpcis.segmenter import gpcis_options

CDNET_THRESHOLD = 0.5  # DiffisionPredictor.get_prediction: prediction > 0.5


def clickseg_options(infer_size: int) -> IsegmOptions:
    """ClickSEG's own ``DiffisionPredictor`` (no zoom-in): ``ResizeTrans(infer_size)`` of the whole image,
    flip (always on), PDM, threshold 0.5."""
    return IsegmOptions(resize_hw=(infer_size, infer_size), with_flip=True, pixel_diffusion=True,
                        threshold=CDNET_THRESHOLD)


def cdnet_options(protocol: str, dataset: str | None = None, infer_size: int = 384) -> IsegmOptions:
    """The CDNet predictor a protocol's authors run (docs/models/cdnet.md, "Evaluation rules").

    Both papers' ``evaluate_model_cdnet.py`` give ClickSEG's ``DiffisionPredictor`` the ``ZoomIn`` of
    ``zoom_in_gpcis.py`` with the parameters their GPCIS script uses in ``cvpr`` mode, so the zoom-in is
    `gpcis_options`' (native-resolution crop, min crop 10, expansion 1.4, ROI threshold 0.49, the ROI
    recomputed at every click; ``skip_clicks`` 0 for "tetris", 1 for "rclicks", -1 on their TETRIS set).
    The predictor's ``ResizeTrans(384)`` is hard-coded (its ``infer_size`` argument is unused), so the crop
    is resized to ``infer_size`` squared on every dataset (SBD included, where GPCIS uses 256).

    Args:
      protocol: "tetris" or "rclicks".
      dataset: the run's dataset name, or None.
      infer_size: the square network input (``CdnetConfig.infer_size``: 384 for the releases).

    Returns:
      `IsegmOptions`: that zoom-in resized to ``infer_size``, flip averaging, PDM, threshold 0.5.
    """
    zoom = dataclasses.replace(gpcis_options(protocol, dataset).zoom_in, target_hw=(infer_size, infer_size))
    return IsegmOptions(zoom_in=zoom, with_flip=True, pixel_diffusion=True, threshold=CDNET_THRESHOLD)


@dataclasses.dataclass(frozen=True)
class CdnetSegmenter(ClickMapSegmenter):
    """CDNet (``config`` a `CdnetConfig`); the other fields as `ClickMapSegmenter`'s."""

    probability_threshold = CDNET_THRESHOLD

    def __post_init__(self):
        super().__post_init__()
        if not isinstance(self.config, CdnetConfig):
            raise ValueError(f"CdnetSegmenter needs a CdnetConfig; got {type(self.config).__name__}")

    @property
    def network(self):
        """The linen network (image, four click maps) -> logits before the pixel diffusion."""
        return CdnetNet(self.config)

    def param_shapes(self) -> dict:
        """The parameter tree as ShapeDtypeStructs (cached per config)."""
        return _param_shapes(self.config)

    def click_features(self, points: jnp.ndarray, labels: jnp.ndarray, prev_prob: jnp.ndarray) -> jnp.ndarray:
        """f32[h, w, 4]: [pos, neg] disks of ``norm_radius``, then of ``fdm_radius``, of clicks (x, y) on the
        grid of ``prev_prob`` f32[h, w] (whose values CDNet does not read)."""
        shape = prev_prob.shape
        cfg = self.config
        near = click_maps(points, labels, shape, cfg.norm_radius, encoding=self.click_encoding,
                          coverage=self.coverage)
        wide = click_maps(points, labels, shape, cfg.fdm_radius, encoding=self.click_encoding,
                          coverage=self.coverage)
        return jnp.concatenate([near, wide], axis=-1)

    def with_predictor(self, use: bool, dataset: str | None = None, protocol: str = "tetris") -> CdnetSegmenter:
        """With the authors' predictor (``use``): `cdnet_options` of ``protocol`` and ``dataset`` at
        ``config.infer_size``; without it the network on the whole frame."""
        if not use:
            return dataclasses.replace(self, evaluation=None)
        if self.evaluation is not None:
            return self
        return dataclasses.replace(self, evaluation=cdnet_options(protocol, dataset, self.config.infer_size))


@functools.lru_cache(maxsize=8)
def _param_shapes(config: CdnetConfig) -> dict:
    """`CdnetSegmenter.param_shapes` of a config."""
    image = jax.ShapeDtypeStruct((1, 64, 64, 3), jnp.float32)
    maps = jax.ShapeDtypeStruct((1, 64, 64, config.coord_channels), jnp.float32)
    return jax.eval_shape(CdnetNet(config).init, jax.random.key(0), image, maps)["params"]
