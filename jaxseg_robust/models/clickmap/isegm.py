"""The isegm evaluation machinery as pure functions (docs/models/click_models.md).

What the authors' ``BasePredictor.get_prediction`` (RITM, SimpleClick, CFR-ICL)
does around the network for one click, as a jit/vmap-safe step:

1. the previous probability map is the network's previous-mask channel;
2. optional zoom-in (`zoom_in`): image, previous map and clicks are cropped
   around the previous prediction and resized to a fixed size;
3. optional horizontal-flip test-time augmentation: the network runs on the
   input and its mirror (clicks at ``w - x - 1``) and the two **logit** maps
   are averaged (``AddHorizontalFlip.inv_transform`` runs before the sigmoid);
4. sigmoid, then the zoom-in's paste back into the frame;
5. CDNet instead resizes the whole image to a fixed size (``resize_hw``)
   and runs its pixel diffusion on the flip-averaged logits before the
   sigmoid (``pixel_diffusion``; docs/models/cdnet.md);
6. CFR-ICL's cascade-forward refinement (`CascadeConfig`): while the click
   count is at most ``clicks`` (1), the step is repeated feeding its own
   prediction back, up to ``steps`` (5) times, stopping early (adaptive) once
   at most ``max_changed`` (20) pixels change at threshold 0.49.

`IsegmOptions` bundles these; `authors_options` gives each family's defaults
(RITM: flip and the fixed 400 zoom of its ``fixed400`` mode; SimpleClick:
flip and the 448 (672 on DAVIS) zoom; CFR-ICL: SimpleClick's plus the
adaptive 5-step cascade). `predict_step` / `predict_click` take a
`ClickMapSegmenter`, the image in its frame, the clicks so far and an
`IsegmState`, and return the probability map and the new state.
"""

from __future__ import annotations

import dataclasses

import flax.struct
import jax
import jax.numpy as jnp

from jaxseg_robust.models.clickmap.zoom_in import (
    ZoomInConfig,
    ZoomState,
    crop_clicks,
    crop_resize,
    paste_back,
    update_roi,
)

ISEGM_THRESHOLD = 0.49


@dataclasses.dataclass(frozen=True)
class CascadeConfig:
    """CFR-ICL's cascade-forward refinement at inference (``--cf-n 4 --acf``).

    Attributes:
      steps: forward passes per refined click (``cf_n + 1``).
      adaptive: stop once at most ``max_changed`` pixels change between passes.
      clicks: refine while the click count is at most this (``--cf-click``).
      max_changed: the adaptive stopping count.
      threshold: the probability threshold of the change count (0.49).
    """

    steps: int = 5
    adaptive: bool = True
    clicks: int = 1
    max_changed: int = 20
    threshold: float = ISEGM_THRESHOLD

    def __post_init__(self):
        if self.steps < 1:
            raise ValueError(f"CascadeConfig.steps must be >= 1; got {self.steps}")


@dataclasses.dataclass(frozen=True)
class IsegmOptions:
    """Inference options around the network (all static).

    Attributes:
      zoom_in: `ZoomInConfig`, or None to run on the frame itself (exact-size frames).
      with_flip: horizontal-flip averaging of the logits.
      cascade: `CascadeConfig` (CFR-ICL), or None.
      threshold: the probability threshold of the predicted mask (0.49).
      resize_hw: CDNet's ``ResizeTrans``: the whole image resized to this (h, w) (bilinear,
        ``align_corners=True``; clicks scaled by ``h / H``, ``w / W``), the prediction resized
        back: the zoom-in's machinery with the whole image as a fixed ROI. Not with ``zoom_in``.
      pixel_diffusion: CDNet's PDM refines the flip-averaged logits before the sigmoid
        (`jaxseg_robust.models.cdnet.pdm`; the click maps' channels 0-1 are its radius-5 disks).
    """

    zoom_in: ZoomInConfig | None = None
    with_flip: bool = False
    cascade: CascadeConfig | None = None
    threshold: float = ISEGM_THRESHOLD
    resize_hw: tuple[int, int] | None = None
    pixel_diffusion: bool = False

    def __post_init__(self):
        if self.zoom_in is not None and self.resize_hw is not None:
            raise ValueError("IsegmOptions: zoom_in and resize_hw cannot both be set")

    @property
    def target_hw(self) -> tuple[int, int] | None:
        """The (h, w) grid the network runs on: the zoom-in's crop or the resize, None for the frame."""
        if self.zoom_in is not None:
            return tuple(self.zoom_in.target_hw)
        return None if self.resize_hw is None else tuple(self.resize_hw)


def authors_options(family: str, dataset: str | None = None) -> IsegmOptions:
    """The authors' evaluation defaults.

    Args:
      family: "ritm", "simpleclick", "cfr_icl" or "adaptiveclick".
      dataset: a dataset name; "DAVIS" selects the larger zoom size.

    Returns:
      RITM: flip, zoom 400 x 400 (600 on DAVIS), the ``fixed<N>`` reading of
      its ``cvpr`` mode (see the docs); SimpleClick and AdaptiveClick (whose
      ``evaluate_model.py`` builds the same predictor): flip, zoom 448 x 448
      (672 on DAVIS); CFR-ICL: SimpleClick's plus the adaptive 5-step cascade.
    """
    davis = (dataset or "").upper() == "DAVIS"
    if family == "ritm":
        size = 600 if davis else 400
        return IsegmOptions(zoom_in=ZoomInConfig(target_hw=(size, size)), with_flip=True)
    if family in ("simpleclick", "cfr_icl", "adaptiveclick"):
        size = 672 if davis else 448
        cascade = CascadeConfig() if family == "cfr_icl" else None
        return IsegmOptions(zoom_in=ZoomInConfig(target_hw=(size, size)), with_flip=True,
                            cascade=cascade)
    raise ValueError(f"unknown click-map family {family!r}; use 'ritm', 'simpleclick', 'cfr_icl' or "
                     f"'adaptiveclick'")


def rclicks_options(family: str, dataset: str | None = None) -> IsegmOptions:
    """The predictor the RClicks authors evaluate each family with (docs/protocols/rclicks.md §5.4).

    Their scripts build isegm's predictor with flip averaging and a zoom-in for
    every family; SimpleClick and AdaptiveClick as `authors_options` (448 x 448, 672 x 672 on
    DAVIS); CFR-ICL with ``--cf-n=1`` and no ``--acf``: two cascade passes at
    the first click, not adaptive; RITM in its ``cvpr`` mode, whose
    aspect-preserving crops (and native-size first click) have data-dependent
    shapes: the fixed-size ``fixed<N>`` zoom (400 x 400, 600 x 600 on DAVIS)
    stands in for it, as in `authors_options`.

    Args:
      family: "ritm", "simpleclick", "cfr_icl" or "adaptiveclick".
      dataset: a dataset name; "DAVIS" selects the larger zoom size.
    """
    options = authors_options(family, dataset)
    if family == "cfr_icl":
        return dataclasses.replace(options, cascade=CascadeConfig(steps=2, adaptive=False, clicks=1))
    return options


PREDICTOR_PROTOCOLS = ("tetris", "rclicks")


def predictor_options(protocol: str, family: str, dataset: str | None = None) -> IsegmOptions:
    """The authors' predictor a protocol runs ``family`` with: `authors_options` for "tetris"
    (docs/protocols/tetris.md "Families"), `rclicks_options` for "rclicks" (docs/protocols/rclicks.md §5.5)."""
    if protocol == "tetris":
        return authors_options(family, dataset)
    if protocol == "rclicks":
        return rclicks_options(family, dataset)
    raise ValueError(f"unknown predictor protocol {protocol!r}; use one of {PREDICTOR_PROTOCOLS}")


@flax.struct.dataclass
class IsegmState:
    """The predictor's memory between clicks (one instance; add axes to batch).

    Attributes:
      prev_prob: f32[Hf, Wf] the last probability map (zeros before the first click).
      has_prev: bool[] whether a prediction was made since the image was set.
      zoom: `ZoomState` of the zoom-in.
    """

    prev_prob: jnp.ndarray
    has_prev: jnp.ndarray
    zoom: ZoomState

    @classmethod
    def initial(cls, frame_hw: tuple[int, int]) -> IsegmState:
        """The state after ``set_input_image``: no prediction, no ROI."""
        return cls(prev_prob=jnp.zeros(tuple(frame_hw), jnp.float32),
                   has_prev=jnp.asarray(False), zoom=ZoomState.empty())


def _flip_x(points: jnp.ndarray, width) -> jnp.ndarray:
    """Clicks mirrored in a grid of ``width`` columns: x -> width - x - 1."""
    return points.at[:, 0].set(width - points[:, 0] - 1)


def predictor_logits(options: IsegmOptions, image: jnp.ndarray, logits: jnp.ndarray, maps: jnp.ndarray) -> jnp.ndarray:
    """The logits the predictor's sigmoid reads: the (flip-averaged) network logits f32[h, w], through
    CDNet's pixel diffusion with ``options.pixel_diffusion`` (image f32[h, w, 3] the grid's image, maps
    f32[h, w, C] the unflipped click maps, channels 0-1 the radius-5 [pos, neg] disks)."""
    if not options.pixel_diffusion:
        return logits
    from jaxseg_robust.models.cdnet.pdm import pixel_diffusion  # noqa: PLC0415

    return pixel_diffusion(image, logits, maps[..., :2])


def _network_prob(segmenter, params, image, prev, points, labels, options: IsegmOptions):
    """sigmoid of the (flip-averaged) network logits on one grid: f32[h, w]."""
    maps = segmenter.click_features(points, labels, prev)
    if not options.with_flip:
        logits = segmenter.grid_logits(params, image, points, labels, prev)
    else:
        w = image.shape[1]
        both = jnp.stack([maps, segmenter.click_features(_flip_x(points, w), labels, prev[:, ::-1])])
        pair = segmenter.network_logits(params, jnp.stack([image, image[:, ::-1]]), both)
        logits = 0.5 * (pair[0] + pair[1][:, ::-1])
    return jax.nn.sigmoid(predictor_logits(options, image, logits, maps))


def _crop_points_flipped(points, roi, target_hw):
    """Crop coordinates of mirrored clicks, one rounding: ((tw-1) w_roi - tw (x - cmin)) / w_roi."""
    tw = target_hw[1]
    crop = crop_clicks(points, roi, target_hw)
    w = (roi[3] - roi[2] + 1).astype(jnp.float32)
    x = ((tw - 1) * w - tw * (points[:, 0] - roi[2].astype(jnp.float32))) / w
    return crop.at[:, 0].set(x)


def zoomed_probability(segmenter, params, image, prev, points, labels, roi,
                       options: IsegmOptions):
    """Steps 2-4 with the zoom-in for a given ROI: f32[Hf, Wf] probability pasted into the frame.

    Differentiable w.r.t. ``points`` (their crop coordinates are affine in
    them) with a soft-encoding segmenter; the ROI is data (i32[4]), so a
    protocol can fix it from a baseline click and optimise the click (the
    TETRIS RITM path).

    Args:
      image: f32[Hf, Wf, 3]; prev: f32[Hf, Wf] previous probability map;
      points: f32[N, 2] (x, y) original pixels; labels: i32[N];
      roi: i32[4] (rmin, rmax, cmin, cmax); options: with ``zoom_in`` set.
    """
    target = options.target_hw
    stacked = jnp.concatenate([image, prev[..., None]], axis=-1)
    crop = crop_resize(stacked, roi, target)
    crop_image, crop_prev = crop[..., :3], crop[..., 3]
    crop_pts = crop_clicks(points, roi, target)
    maps = segmenter.click_features(crop_pts, labels, crop_prev)
    if not options.with_flip:
        logits = segmenter.grid_logits(params, crop_image, crop_pts, labels, crop_prev)
    else:
        flip_pts = _crop_points_flipped(points, roi, target)
        both = jnp.stack([maps, segmenter.click_features(flip_pts, labels, crop_prev[:, ::-1])])
        images = jnp.stack([crop_image, crop_image[:, ::-1]])
        pair = segmenter.network_logits(params, images, both)
        logits = 0.5 * (pair[0] + pair[1][:, ::-1])
    prob = jax.nn.sigmoid(predictor_logits(options, crop_image, logits, maps))
    return paste_back(prob, roi, image.shape[:2])


def whole_image_roi(original_hw: jnp.ndarray) -> jnp.ndarray:
    """i32[4] (0, H - 1, 0, W - 1): the ROI of CDNet's ``ResizeTrans`` (the whole image)."""
    h, w = original_hw[0], original_hw[1]
    return jnp.stack([0, h - 1, 0, w - 1]).astype(jnp.int32)


def predict_step(segmenter, params, image: jnp.ndarray, original_hw: jnp.ndarray,
                 points: jnp.ndarray, labels: jnp.ndarray, state: IsegmState,
                 options: IsegmOptions):
    """One ``get_prediction`` of the authors' predictor (no cascade).

    Args:
      segmenter: a `ClickMapSegmenter`.
      params: its parameters.
      image: f32[Hf, Wf, 3] in [0, 1] (`ClickMapSegmenter.preprocess`).
      original_hw: i32[2] the image's size inside the frame.
      points: f32[N, 2] clicks so far, (x, y) original pixels; labels i32[N] (-1 = unused).
      state: the `IsegmState` before this prediction.
      options: `IsegmOptions` (static).

    Returns:
      (prob f32[Hf, Wf] in [0, 1], zero outside the image; the new `IsegmState`).
    """
    frame = image.shape[:2]
    inside = (jnp.arange(frame[0])[:, None] < original_hw[0]) & \
        (jnp.arange(frame[1])[None, :] < original_hw[1])
    if options.resize_hw is not None:
        zoom = state.zoom
        prob = zoomed_probability(segmenter, params, image, state.prev_prob, points, labels,
                                  whole_image_roi(original_hw), options)
    elif options.zoom_in is None:
        prob = _network_prob(segmenter, params, image, state.prev_prob, points, labels, options)
        zoom = state.zoom
    else:
        zoom = update_roi(state.zoom, state.prev_prob, state.has_prev, points, labels,
                          original_hw, options.zoom_in)
        prob = zoomed_probability(segmenter, params, image, state.prev_prob, points, labels,
                                  zoom.roi, options)
    prob = jnp.where(inside, prob, 0.0)
    return prob, IsegmState(prev_prob=prob, has_prev=jnp.asarray(True), zoom=zoom)


def predict_click(segmenter, params, image: jnp.ndarray, original_hw: jnp.ndarray,
                  points: jnp.ndarray, labels: jnp.ndarray, num_clicks, state: IsegmState,
                  options: IsegmOptions):
    """`predict_step`, with CFR-ICL's cascade while ``num_clicks <= cascade.clicks``.

    The cascade repeats the step (each pass reads the previous pass's
    prediction and zoom state) up to ``steps`` times; adaptive: from the
    second pass on it stops when at most ``max_changed`` pixels differ
    between consecutive passes at ``threshold`` (the authors compare the
    returned maps: the first pass is never compared).

    Args:
      num_clicks: the number of clicks so far: a Python int (the cascade is
        decided statically) or an i32[] (decided in the program).
      others: as `predict_step`.

    Returns:
      (prob f32[Hf, Wf], new `IsegmState`).
    """
    def step(st):
        return predict_step(segmenter, params, image, original_hw, points, labels, st, options)

    prob, state1 = step(state)
    return cascade_refine(segmenter, params, image, original_hw, points, labels, num_clicks, prob, state1,
                          options)


def cascade_refine(segmenter, params, image: jnp.ndarray, original_hw: jnp.ndarray, points: jnp.ndarray,
                   labels: jnp.ndarray, num_clicks, prob: jnp.ndarray, state: IsegmState,
                   options: IsegmOptions):
    """CFR-ICL's cascade passes after a first pass that returned ``prob`` f32[Hf, Wf] and ``state``.

    Up to ``steps - 1`` more `predict_step` passes while ``num_clicks <=
    cascade.clicks``, adaptive as `predict_click` says; the identity without
    a cascade. Also what a click attack runs after its accepted (optimised)
    first pass (docs/protocols/tetris.md, "Families").

    Returns:
      (prob f32[Hf, Wf], `IsegmState`).
    """
    cascade = options.cascade
    if cascade is None or cascade.steps == 1:
        return prob, state
    if isinstance(num_clicks, int):
        if num_clicks > cascade.clicks:
            return prob, state
        refine = jnp.asarray(True)
    else:
        refine = jnp.asarray(num_clicks) <= cascade.clicks

    def cond(carry):
        i, _, _, done = carry
        return (i < cascade.steps - 1) & ~done & refine

    def body(carry):
        i, prob_prev, st, _ = carry
        prob_new, st_new = predict_step(segmenter, params, image, original_hw, points, labels, st, options)
        changed = jnp.sum((prob_new > cascade.threshold) != (prob_prev > cascade.threshold))
        done = jnp.asarray(cascade.adaptive) & (changed <= cascade.max_changed)
        return i + 1, prob_new, st_new, done

    _, prob, state_out, _ = jax.lax.while_loop(
        cond, body, (jnp.int32(0), prob, state, jnp.asarray(False)))
    return prob, state_out


def interactive_predict(segmenter, params, image: jnp.ndarray, original_hw: jnp.ndarray,
                        points: jnp.ndarray, labels: jnp.ndarray, state: IsegmState, use_state,
                        num_clicks, options: IsegmOptions):
    """One round of an interactive protocol through the authors' predictor (the Segmenter
    contract's ``interactive_predict`` of click-map models; `models.base.interactive_step`).

    ``use_state`` false (a protocol's feedback rule) starts from a fresh
    predictor, `IsegmState.initial` (isegm's ``set_input_image``); otherwise
    `predict_click` continues from ``state``. Any segmenter with
    ``grid_logits`` / ``click_features`` / ``network_logits`` can use it.

    Returns:
      (prob f32[Hf, Wf], the next `IsegmState`).
    """
    fresh = IsegmState.initial(state.prev_prob.shape)
    use_state = jnp.asarray(use_state, bool)
    state = jax.tree.map(lambda kept, new: jnp.where(use_state, kept, new), state, fresh)
    return predict_click(segmenter, params, image, original_hw, points, labels, num_clicks, state,
                         options)
