"""The embedded demonstration model ("sam_demo"): its configuration and its interactive evaluation.

``sam_demo`` is a small SAM-architecture model (our ViT image encoder, prompt
encoder and two-way mask decoder at reduced widths and depths) trained by
``experiments/train_default_model.py`` on the synthetic shapes of
`jaxseg_robust.data.synthetic` with point and box prompts. Its weights ship as
package data in ``jaxseg_robust/models/weights/sam_demo/`` (``config.json`` +
``params.npz``, see `jaxseg_robust.models.store`). It is a **demonstration model**: it lets
the tool run out of the box, on CPU, in seconds; real evaluations use ported
official checkpoints (``python -m ports ...``).

Shape (`DEMO_CONFIG`): 256 px input, patch-16 ViT (width 96, depth 4, 3 heads,
windows of 8 with global attention in blocks 1 and 3) -> 16 x 16 x 64 image
embedding; SAM's prompt encoder (64 channels) and mask decoder (two-way
transformer of depth 2, MLP 256, 4 heads; 3 multimask outputs + 1), low-res
logits 64 x 64.

Evaluation protocol of the reported numbers (`evaluate_instance`), per instance
in its original resolution, SAM-family conventions of `jaxseg_robust.clicksim`:
  * ``click1``: the RITM baseline click on an empty prediction
    (`prompts.clicker.next_click`), ``multimask_output=True`` (argmax of the
    predicted IoU), mask ``logits > 0``;
  * ``box``: the tight box of the ground truth (inclusive pixel indices,
    `ops.boxes.tight_box`), ``multimask_output=True``; ``box_single`` the same
    with ``multimask_output=False`` (BREPS' scoring);
  * ``clicks_k``: k rounds of the baseline clicker on the previous prediction,
    every click so far as a prompt, the previous round's selected low-res
    logits fed back as ``mask_input`` from round 2 on (``mask_feedback=
    "always"`` in clicksim's terms).
IoU is `metrics.masks.mask_iou` over the whole image.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from jaxseg_robust.metrics.masks import mask_iou
from jaxseg_robust.models.sam.config import MaskDecoderConfig, SamConfig
from jaxseg_robust.models.sam.image_encoder import ViTConfig
from jaxseg_robust.ops.boxes import tight_box
from jaxseg_robust.prompts.clicker import mark_clicked, next_click
from jaxseg_robust.prompts.types import PADDING_LABEL, Prompts

DEMO_MODEL_NAME = "sam_demo"
# Evaluation set of the reported numbers: held-out synthetic instances (training uses other seeds).
EVAL_SEED = 20240
DEMO_CONFIG = SamConfig(
    encoder=ViTConfig(img_size=256, patch_size=16, embed_dim=96, depth=4, num_heads=3,
                      out_chans=64, window_size=8, global_attn_indexes=(1, 3)),
    variant="demo", image_size=256, embedding_size=16, prompt_embed_dim=64, mask_in_chans=8,
    decoder=MaskDecoderConfig(transformer_depth=2, transformer_mlp_dim=256, transformer_num_heads=4,
                              iou_head_hidden_dim=64),
)


def empty_prompts(num_slots: int, low_res_size: int) -> Prompts:
    """A `Prompts` with no point, no box and no mask (``num_slots`` padding slots)."""
    return Prompts(points=jnp.zeros((num_slots, 2), jnp.float32),
                   labels=jnp.full((num_slots,), PADDING_LABEL, jnp.int32),
                   box=jnp.zeros((4,), jnp.float32), has_box=jnp.asarray(False),
                   mask_logits=jnp.zeros((low_res_size, low_res_size), jnp.float32),
                   has_mask=jnp.asarray(False))


def add_click(prompts: Prompts, slot, is_positive, row, col) -> Prompts:
    """``prompts`` with slot ``slot`` set to the click (x, y) = (col, row), label 1/0 (pure)."""
    point = jnp.stack([col, row]).astype(jnp.float32)
    return prompts.replace(points=prompts.points.at[slot].set(point),
                           labels=prompts.labels.at[slot].set(is_positive.astype(jnp.int32)))


@functools.partial(jax.jit, static_argnames=("segmenter",))
def _embed(segmenter, params, model_input):
    return segmenter.embed(params, model_input)


@functools.partial(jax.jit, static_argnames=("segmenter", "num_clicks"))
def _evaluate_embedded(segmenter, params, features, transform, gt, *, num_clicks: int):
    """IoUs of one embedded instance: (click1 f32[], box f32[], box_single f32[], clicks f32[num_clicks])."""
    low = segmenter.config.low_res_size
    base = empty_prompts(max(num_clicks, 1), low)

    def predict(prompts, multimask):
        pred = segmenter.decode(params, features, prompts, transform, multimask_output=multimask)
        return pred.logits > 0, pred.selected_low_res

    box_prompts = base.replace(box=tight_box(gt).astype(jnp.float32), has_box=jnp.asarray(True))
    iou_box = mask_iou(gt, predict(box_prompts, True)[0], empty_value=0.0)
    iou_box_single = mask_iou(gt, predict(box_prompts, False)[0], empty_value=0.0)

    def round_fn(state, index):
        prompts, pred, not_clicked = state
        is_positive, row, col = next_click(gt, pred, not_clicked)
        prompts = add_click(prompts, index, is_positive, row, col)
        pred, low_res = predict(prompts, True)
        prompts = prompts.replace(mask_logits=low_res, has_mask=jnp.asarray(True))
        return (prompts, pred, mark_clicked(not_clicked, row, col)), mask_iou(gt, pred, empty_value=0.0)

    state = (base, jnp.zeros(gt.shape, bool), jnp.ones(gt.shape, bool))
    _, ious = jax.lax.scan(round_fn, state, jnp.arange(max(num_clicks, 1)))
    return ious[0], iou_box, iou_box_single, ious[:num_clicks]


def evaluate_instance(segmenter, params, image: np.ndarray, gt: np.ndarray, *, num_clicks: int = 5,
                      frame_hw: tuple[int, int] | None = None) -> dict:
    """Interactive IoUs of one instance (protocol in the module docstring).

    Args:
      segmenter: a SAM-family segmenter (`SamSegmenter`).
      params: its parameters.
      image: uint8[H, W, 3].
      gt: [H, W] object mask (non-zero = object; must not be empty).
      num_clicks: rounds of the clicker (>= 1).
      frame_hw: optional common frame (Hf, Wf) >= (H, W) to pad into, so that
        instances of different sizes share one compilation. The results do
        not depend on it: outside the image the prediction is empty and the
        padded ground truth is background, which is exactly the one-pixel
        background border the clicker adds (`next_click` pads the border).

    Returns:
      {"click1": float, "box": float, "box_single": float, "clicks": list of
      ``num_clicks`` floats (IoU after 1..num_clicks clicks)}.

    Raises:
      ValueError: mismatched shapes, an empty mask, or ``num_clicks < 1``.
    """
    gt = np.asarray(gt) > 0
    if gt.shape != np.asarray(image).shape[:2]:
        raise ValueError(f"gt has shape {gt.shape}, the image {np.asarray(image).shape[:2]}")
    if not gt.any():
        raise ValueError("gt is empty: nothing to segment")
    if num_clicks < 1:
        raise ValueError(f"num_clicks must be >= 1, got {num_clicks}")
    x, transform = segmenter.preprocess(image, frame_hw=frame_hw)
    if frame_hw is not None:
        gt = np.pad(gt, ((0, frame_hw[0] - gt.shape[0]), (0, frame_hw[1] - gt.shape[1])))
    features = _embed(segmenter, params, x)
    click1, box, box_single, clicks = _evaluate_embedded(segmenter, params, features, transform,
                                                         jnp.asarray(gt), num_clicks=num_clicks)
    return {"click1": float(click1), "box": float(box), "box_single": float(box_single),
            "clicks": [float(v) for v in np.asarray(clicks)]}


@dataclasses.dataclass(frozen=True)
class EvaluationSummary:
    """Mean IoUs over instances (see `evaluate_instances`)."""

    click1: float
    box: float
    box_single: float
    clicks: tuple[float, ...]
    num_instances: int
    per_instance: tuple[dict, ...]

    def to_dict(self) -> dict:
        """JSON-ready means (without the per-instance records)."""
        return {"iou_click1": self.click1, "iou_box": self.box, "iou_box_single": self.box_single,
                "miou_per_click": list(self.clicks), "iou_click5": self.clicks[-1],
                "num_instances": self.num_instances}


def evaluate_instances(segmenter, params, samples, *, num_clicks: int = 5) -> EvaluationSummary:
    """Means of `evaluate_instance` over synthetic samples (``.image``, ``.mask``, ``.id``).

    Every instance is padded into the largest height and width of the set
    (one compilation; the IoUs do not depend on it, see `evaluate_instance`).
    """
    samples = list(samples)
    if not samples:
        raise ValueError("samples is empty")
    frame_hw = (max(s.mask.shape[0] for s in samples), max(s.mask.shape[1] for s in samples))
    records = []
    for sample in samples:
        result = evaluate_instance(segmenter, params, sample.image, sample.mask, num_clicks=num_clicks,
                                   frame_hw=frame_hw)
        records.append({"id": sample.id, **result})
    mean = lambda key: float(np.mean([r[key] for r in records]))  # noqa: E731
    clicks = tuple(float(v) for v in np.mean([r["clicks"] for r in records], axis=0))
    return EvaluationSummary(mean("click1"), mean("box"), mean("box_single"), clicks, len(records),
                             tuple(records))
