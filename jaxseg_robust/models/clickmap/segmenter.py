"""`ClickMapSegmenter`: RITM / SimpleClick / CFR-ICL behind the Segmenter protocol.

For these models the image and the clicks enter the network together, so
``embed`` is cheap (it keeps the image in [0, 1]) and ``decode`` runs the
whole network on the image with the clicks rendered as maps
(docs/models/click_models.md)::

    seg = ClickMapSegmenter(config)             # RitmConfig or SimpleClickConfig
    x, transform = seg.preprocess(image)        # uint8[H, W, 3] -> f32[H, W, 3] in [0, 1]
    features = seg.embed(params, x)
    pred = seg.decode(params, features, prompts, transform)   # logits f32[H, W]

Conventions of this family (the Segmenter contract's family-specific parts):

* ``Prompts.mask_logits`` carries the previous **probability** map in [0, 1]
  at the frame resolution (``feedback_shape(frame_hw) == frame_hw``), not
  logits: the network's third input channel is that probability map
  (isegm's ``prev_prediction``). ``has_mask`` false means zeros (isegm's
  state before the first click). `feedback` returns ``sigmoid(logits)``.
* ``probability_threshold`` is 0.49 (isegm's ``pred_thr``).
* ``frame_policy`` is ``"exact"``: the network sees the frame itself, so an
  image padded into a larger bucket gives different outputs near its border
  (and everywhere, through OCR's global context and the ViT's attention);
  run these models in exact-size buckets, or through the zoom-in of
  `jaxseg_robust.models.clickmap.isegm`, which resizes a crop of the image to
  a fixed size and works in any frame.
* ``evaluation``: the authors' evaluation machinery (`IsegmOptions`: zoom-in,
  flip averaging, CFR-ICL's cascade) for interactive protocols. When set, the
  segmenter owns an `IsegmState` between rounds (``interactive_state`` /
  ``interactive_predict``, its `models.base.InteractivePredictor` members that
  `jaxseg_robust.models.base.interactive_step` calls), and with a zoom-in its
  ``frame_policy`` is ``"any"`` for those protocols.
* ``rules``: the family's `models.base.FamilyRules`, computed from the fields
  (``family`` "ritm", "simpleclick" or, where the converted config says
  ``cfr_icl``, "cfr_icl"; docs/ARCHITECTURE.md, "The Segmenter seam"). ``decode`` itself is
  unchanged (the network on the whole frame). None (default): protocols feed
  ``feedback`` back through ``decode`` as before.
* clicks: (x, y) pixels of the original image, rendered with isegm's hard
  disks (``click_encoding="hard"``, exact) or with differentiable soft disks
  (``"soft"``, what gradient-based protocols use).

``decode`` returns ``Prediction(logits f32[Hf, Wf] (-1e4 outside the image),
low_res_logits = logits[None], scores = [0.], index = 0)``: one candidate, no
predicted quality.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from jaxseg_robust.models.base import (
    CLICK_STEP_RESIZED,
    FRAME_POLICY_ANY,
    FRAME_POLICY_EXACT,
    FamilyRules,
    Prediction,
    SegmenterBase,
    Transform,
)
from jaxseg_robust.models.clickmap.attack_view import PredictorView
from jaxseg_robust.models.clickmap.encoding import ENCODINGS, coord_features
from jaxseg_robust.models.clickmap.isegm import IsegmOptions, IsegmState, interactive_predict, predictor_options
from jaxseg_robust.models.clickmap.layers import random_params
from jaxseg_robust.models.ritm.config import RitmConfig
from jaxseg_robust.models.simpleclick.config import SimpleClickConfig
from jaxseg_robust.ops.render import COVERAGE_AREA, COVERAGE_RAMP
from jaxseg_robust.prompts.types import Prompts, click_prompts

OUTSIDE_LOGIT = -1e4
ISEGM_THRESHOLD = 0.49
# Transposed convolutions of SimpleClick's neck (their weights keep torch's [in, out, k, k]).
SIMPLECLICK_TRANSPOSED = ("neck/down_4/0", "neck/down_4/3", "neck/down_8/0")


@flax.struct.dataclass
class ClickMapFeatures:
    """What `ClickMapSegmenter.embed` caches: the image itself.

    Attributes:
      image: f32[Hf, Wf, 3] RGB in [0, 1] (zeros outside the original image).
    """

    image: jnp.ndarray


def build_network(config):
    """The linen network of a config (RITM or SimpleClick)."""
    if isinstance(config, RitmConfig):
        from jaxseg_robust.models.ritm.network import RitmNet  # noqa: PLC0415

        return RitmNet(config)
    if isinstance(config, SimpleClickConfig):
        from jaxseg_robust.models.simpleclick.network import SimpleClickNet  # noqa: PLC0415

        return SimpleClickNet(config)
    raise TypeError(f"not a click-map model config: {type(config).__name__}")


@dataclasses.dataclass(frozen=True)
class ClickMapSegmenter(SegmenterBase):
    """A click-map interactive model (static configuration; weights are passed as ``params``).

    Attributes:
      config: `RitmConfig` or `SimpleClickConfig`.
      click_encoding: "hard" (isegm's binary disks) or "soft" (differentiable).
      coverage: soft-disk coverage model ("area" exact area, or "ramp").
      evaluation: the authors' predictor options for interactive protocols
        (`IsegmOptions`, e.g. `isegm.rclicks_options`), or None for the network on
        the whole frame (see the module docstring).
    """

    config: Any
    click_encoding: str = "hard"
    coverage: str = COVERAGE_AREA
    evaluation: IsegmOptions | None = None

    probability_threshold = ISEGM_THRESHOLD

    def __post_init__(self):
        if self.click_encoding not in ENCODINGS:
            raise ValueError(f"click_encoding must be one of {ENCODINGS}; "
                             f"got {self.click_encoding!r}")
        if self.coverage not in (COVERAGE_AREA, COVERAGE_RAMP):
            raise ValueError(f"coverage must be 'area' or 'ramp'; got {self.coverage!r}")
        if self.evaluation is not None and not isinstance(self.evaluation, IsegmOptions):
            raise ValueError(f"evaluation must be IsegmOptions or None; got {type(self.evaluation).__name__}")

    @property
    def predictor_family(self) -> str:
        """The family whose authors' predictor runs these weights: "ritm", "simpleclick" or "cfr_icl"
        (recorded in the converted model's config, `SimpleClickConfig.cfr_icl`)."""
        return self.config.predictor_family

    @property
    def rules(self) -> FamilyRules:
        """The family's rules (docs/protocols/tetris.md, "Families"): isegm feeds the previous prediction
        at every click, clicks only, the TETRIS step of the network input (the zoom-in's crop with
        ``evaluation``'s zoom-in), soft disks for gradients, and the exact frame unless zooming in."""
        zoom = None if self.evaluation is None else self.evaluation.target_hw
        return FamilyRules(family=self.predictor_family, click_step=CLICK_STEP_RESIZED,
                           click_step_hw=zoom,
                           resets_feedback_on_two_slots=False, accepts_boxes=False, authors_predictor=True,
                           differentiable_clicks=self.click_encoding == "soft",
                           frame_policy=FRAME_POLICY_EXACT if zoom is None else FRAME_POLICY_ANY)

    @property
    def frame_policy(self) -> str:
        """"exact" (the network sees the frame) unless the evaluation machinery zooms in ("any")."""
        return self.rules.frame_policy

    # ---- network and parameters --------------------------------------------
    @property
    def network(self):
        """The linen network (image, click maps) -> logits."""
        return build_network(self.config)

    def param_shapes(self) -> dict:
        """The parameter tree as ShapeDtypeStructs (traced once per config, then cached)."""
        return _param_shapes(self.config)

    def init(self, key) -> dict:
        """Random parameters of a sensible scale (host draws; see `layers.random_params`)."""
        transposed = SIMPLECLICK_TRANSPOSED if isinstance(self.config, SimpleClickConfig) else ()
        return random_params(self.param_shapes(), key, transposed=transposed)

    # ---- contract extras -----------------------------------------------------
    def feedback_shape(self, frame_hw: tuple[int, int]) -> tuple[int, int]:
        """The previous-prediction map is at the frame resolution."""
        return (int(frame_hw[0]), int(frame_hw[1]))

    def feedback(self, prediction: Prediction) -> jnp.ndarray:
        """f32[Hf, Wf] probability map fed back as ``Prompts.mask_logits`` next round."""
        return jax.nn.sigmoid(prediction.logits)

    def interactive_state(self, frame_hw: tuple[int, int]):
        """The state before the first click: f32[Hf, Wf] zeros (the feedback map), or with
        ``evaluation`` the authors' predictor state `IsegmState` after ``set_input_image``."""
        if self.evaluation is None:
            return jnp.zeros(self.feedback_shape(frame_hw), jnp.float32)
        return IsegmState.initial(frame_hw)

    def interactive_predict(self, params, features: ClickMapFeatures, transform: Transform, points, labels,
                            state, use_state, num_clicks, *, multimask_output: bool = True):
        """One round: (probability f32[Hf, Wf], next state); `models.base.interactive_step`'s member.

        Without ``evaluation``: ``decode`` with ``state`` as the previous
        probability map (read where ``use_state``), the state becomes
        ``feedback`` (the contract's fallback). With it: one ``get_prediction`` of
        the authors' predictor (`isegm.predict_click`: zoom-in, flip, cascade while
        ``num_clicks`` <= its click count) on the clicks so far, from ``state`` or,
        where ``use_state`` is false, from a fresh predictor (``set_input_image``).
        """
        if self.evaluation is None:
            prompts = click_prompts(points, labels, state, use_state)
            prediction = self.decode(params, features, prompts, transform, multimask_output=multimask_output)
            return jax.nn.sigmoid(prediction.logits), self.feedback(prediction)
        return interactive_predict(self, params, features.image, transform.original_hw, points, labels,
                                   state, use_state, num_clicks, self.evaluation)

    def predictor_view(self) -> PredictorView | None:
        """The authors' predictor as a click attack sees it (`attack_view.PredictorView`), or None
        without ``evaluation`` (the attack then runs ``decode`` on the whole frame)."""
        return None if self.evaluation is None else PredictorView(self, self.evaluation)

    def with_predictor(self, use: bool, dataset: str | None = None, protocol: str = "tetris") -> ClickMapSegmenter:
        """This segmenter with the authors' predictor (``use``) or without it (`models.base.with_predictor`).

        With it, ``evaluation`` unless already set is the options of ``protocol`` for the weights'
        family (`predictor_family`: CFR-ICL gets its cascade) and ``dataset`` ("DAVIS" zooms larger):
        `isegm.authors_options` for "tetris", `isegm.rclicks_options` for "rclicks".
        """
        if not use:
            return dataclasses.replace(self, evaluation=None)
        if self.evaluation is not None:
            return self
        return dataclasses.replace(self, evaluation=predictor_options(protocol, self.predictor_family, dataset))

    def with_differentiable_clicks(self) -> ClickMapSegmenter:
        """This segmenter with soft disks: ``decode`` differentiable w.r.t. the click coordinates."""
        return self if self.click_encoding == "soft" else dataclasses.replace(self, click_encoding="soft")

    # ---- protocol ------------------------------------------------------------
    def preprocess(self, image, *, frame_hw: tuple[int, int] | None = None):
        """uint8[H, W, 3] -> (f32[Hf, Wf, 3] in [0, 1], zero-padded; `Transform` with scale 1).

        isegm's ``ToTensor``: ``image / 255`` (float images are taken as 0..255).
        """
        image = np.asarray(image)
        if image.ndim != 3 or image.shape[2] != 3 or min(image.shape[:2]) < 1:
            raise ValueError(f"image must have shape [H, W, 3]; got {image.shape}")
        if not (image.dtype == np.uint8 or np.issubdtype(image.dtype, np.floating)):
            raise ValueError(f"image must be uint8 or float; got {image.dtype}")
        h, w = int(image.shape[0]), int(image.shape[1])
        frame = (h, w) if frame_hw is None else (int(frame_hw[0]), int(frame_hw[1]))
        if frame[0] < h or frame[1] < w:
            raise ValueError(f"frame_hw {frame} is smaller than the image ({h}, {w})")
        x = np.zeros(frame + (3,), np.float32)
        x[:h, :w] = np.asarray(image, np.float32) / np.float32(255.0)
        transform = Transform(original_hw=jnp.asarray([h, w], jnp.int32),
                              resized_hw=jnp.asarray([h, w], jnp.int32),
                              scale_xy=jnp.ones((2,), jnp.float32), frame_hw=frame)
        return jnp.asarray(x), transform

    def embed(self, params, model_input: jnp.ndarray) -> ClickMapFeatures:
        """Keeps the image (f32[Hf, Wf, 3] or [B, Hf, Wf, 3]); the network runs in `decode`."""
        if model_input.ndim not in (3, 4) or model_input.shape[-1] != 3:
            raise ValueError(f"model_input must be [H, W, 3] or [B, H, W, 3]; "
                             f"got {model_input.shape}")
        return ClickMapFeatures(image=jnp.asarray(model_input, jnp.float32))

    def network_logits(self, params, image: jnp.ndarray, maps: jnp.ndarray) -> jnp.ndarray:
        """The network on images f32[..., h, w, 3] and click maps f32[..., h, w, C] -> f32[..., h, w]."""
        lead = image.shape[:-3]
        x = image.reshape((-1,) + image.shape[-3:])
        m = maps.reshape((-1,) + maps.shape[-3:])
        out = self.network.apply({"params": params}, x, m)
        return out.reshape(lead + out.shape[-2:])

    def click_features(self, points: jnp.ndarray, labels: jnp.ndarray,
                       prev_prob: jnp.ndarray) -> jnp.ndarray:
        """[prev, pos, neg] maps f32[h, w, C] of clicks (x, y) on the grid of ``prev_prob`` f32[h, w]."""
        return coord_features(points, labels, prev_prob, self.config.norm_radius,
                              with_prev_mask=self.config.with_prev_mask,
                              encoding=self.click_encoding, coverage=self.coverage)

    def grid_logits(self, params, image: jnp.ndarray, points: jnp.ndarray, labels: jnp.ndarray,
                    prev_prob: jnp.ndarray) -> jnp.ndarray:
        """One network run on one grid: image f32[h, w, 3], clicks (x, y) on it, previous
        probability f32[h, w] -> logits f32[h, w] (isegm ``model(image, points)["instances"]``)."""
        maps = self.click_features(points, labels, prev_prob)
        return self.network_logits(params, image, maps)

    def decode(self, params, features: ClickMapFeatures, prompts: Prompts, transform: Transform,
               *, multimask_output: bool = True) -> Prediction:
        """Runs the network once on the frame for one prompt set.

        Args:
          params: the model's parameters.
          features: `ClickMapFeatures` of one image (image f32[Hf, Wf, 3]).
          prompts: one `Prompts`; points (x, y) original-image pixels;
            ``mask_logits`` f32[Hf, Wf] previous probability map (used when
            ``has_mask``); boxes are not supported (``has_box`` must be false:
            ignored).
          transform: the image's `Transform` (``frame_hw`` = the frame of
            ``features``).
          multimask_output: ignored (one output).

        Returns:
          `Prediction` (see the module docstring).
        """
        image = features.image
        if image.ndim != 3:
            raise ValueError(f"features.image must be [H, W, 3] for one image (vmap over "
                             f"batches); got {image.shape}")
        frame = image.shape[:2]
        if prompts.mask_logits.shape != frame:
            raise ValueError(f"prompts.mask_logits must be the previous probability map at the "
                             f"frame size {frame}; got {prompts.mask_logits.shape}")
        prev = jnp.where(prompts.has_mask, prompts.mask_logits, 0.0)
        points = prompts.points * jnp.asarray(transform.scale_xy, jnp.float32)
        logits = self.grid_logits(params, image, points, prompts.labels, prev)
        inside = inside_mask(transform, frame)
        logits = jnp.where(inside, logits, OUTSIDE_LOGIT)
        return Prediction(logits=logits, low_res_logits=logits[None],
                          scores=jnp.zeros((1,), jnp.float32), index=jnp.zeros((), jnp.int32))


@functools.lru_cache(maxsize=16)
def _param_shapes(config) -> dict:
    """`ClickMapSegmenter.param_shapes` of a config (hashable, frozen)."""
    h, w = config.train_size if isinstance(config, SimpleClickConfig) else (64, 64)
    image = jax.ShapeDtypeStruct((1, h, w, 3), jnp.float32)
    maps = jax.ShapeDtypeStruct((1, h, w, config.coord_channels), jnp.float32)
    return jax.eval_shape(build_network(config).init, jax.random.key(0), image, maps)["params"]


def inside_mask(transform: Transform, frame: tuple[int, int]) -> jnp.ndarray:
    """bool[Hf, Wf]: pixels inside the original image."""
    h, w = transform.original_hw[0], transform.original_hw[1]
    return (jnp.arange(frame[0])[:, None] < h) & (jnp.arange(frame[1])[None, :] < w)


def with_compute_dtype(config, compute_dtype: str):
    """``config`` with the network computing in ``compute_dtype``."""
    return dataclasses.replace(config, dtype=compute_dtype)
