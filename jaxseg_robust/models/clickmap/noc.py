"""The authors' NoC evaluation loop for click-map models, as one pure function.

isegm's ``evaluate_sample`` (RITM, SimpleClick, CFR-ICL;
docs/models/click_models.md, "The NoC loop"): starting from an empty
prediction, ``n_clicks`` times

1. the RITM clicker (`jaxseg_robust.prompts.clicker.next_click`) places the
   next click from ``pred > threshold`` (0.49),
2. the predictor (`jaxseg_robust.models.clickmap.isegm.predict_click`: zoom-in,
   flip averaging, CFR-ICL's cascade at the first click) predicts from all
   clicks so far and its own previous probability map,
3. the IoU of ``prob > threshold`` against the ground truth (ignore pixels
   excluded; NaN on an empty union) is recorded.

No early stop: every run records ``n_clicks`` IoUs (the authors stop at the
target IoU; NoC / NoF follow from the curve with
`jaxseg_robust.metrics.interactive`). `noc_trajectory` is for one instance
(vmap it over a batch of instances sharing a frame); the image may be padded
into a larger frame when the options include the zoom-in.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxseg_robust.models.clickmap.isegm import IsegmOptions, IsegmState, predict_click
from jaxseg_robust.prompts.clicker import mark_clicked, next_click
from jaxseg_robust.prompts.types import NEGATIVE_LABEL, PADDING_LABEL, POSITIVE_LABEL


@dataclasses.dataclass(frozen=True)
class NocConfig:
    """Static settings of the loop.

    Attributes:
      n_clicks: clicks per instance (20).
      options: the predictor's `IsegmOptions` (the family's `authors_options`).
    """

    n_clicks: int = 20
    options: IsegmOptions = dataclasses.field(default_factory=IsegmOptions)

    def __post_init__(self):
        if self.n_clicks < 1:
            raise ValueError(f"n_clicks must be >= 1; got {self.n_clicks}")


def mask_iou(gt: jnp.ndarray, pred: jnp.ndarray, valid: jnp.ndarray) -> jnp.ndarray:
    """isegm ``get_iou``: |gt & pred & valid| / |(gt | pred) & valid| (NaN when the union is empty)."""
    inter = jnp.sum(gt & pred & valid)
    union = jnp.sum((gt | pred) & valid)
    return jnp.where(union > 0, inter / jnp.maximum(union, 1), jnp.nan).astype(jnp.float32)


def noc_trajectory(segmenter, params, image: jnp.ndarray, original_hw: jnp.ndarray,
                   gt: jnp.ndarray, valid: jnp.ndarray, config: NocConfig) -> dict:
    """The authors' evaluation of one instance.

    Args:
      segmenter: a `ClickMapSegmenter` (hard click encoding for the authors' numbers).
      params: its parameters.
      image: f32[Hf, Wf, 3] in [0, 1] (`ClickMapSegmenter.preprocess`).
      original_hw: i32[2] image size inside the frame.
      gt: bool[Hf, Wf] object mask (False outside the image).
      valid: bool[Hf, Wf] non-ignored pixels inside the image.
      config: `NocConfig` (static).

    Returns:
      {"ious": f32[n], "clicks": i32[n, 2] (row, col), "positive": bool[n],
       "prob": f32[Hf, Wf] the last probability map}.
    """
    n = config.n_clicks
    options = config.options
    frame = image.shape[:2]
    inside = (jnp.arange(frame[0])[:, None] < original_hw[0]) & \
        (jnp.arange(frame[1])[None, :] < original_hw[1])
    gt = gt & inside
    valid = valid & inside
    carry = dict(pred=jnp.zeros(frame, bool), not_clicked=jnp.ones(frame, bool),
                 points=jnp.zeros((n, 2), jnp.float32),
                 labels=jnp.full((n,), PADDING_LABEL, jnp.int32),
                 state=IsegmState.initial(frame))

    def click(carry, k, num_clicks):
        is_pos, row, col = next_click(gt, carry["pred"], carry["not_clicked"], valid)
        points = carry["points"].at[k].set(jnp.stack([col, row]).astype(jnp.float32))
        labels = carry["labels"].at[k].set(jnp.where(is_pos, POSITIVE_LABEL, NEGATIVE_LABEL))
        prob, state = predict_click(segmenter, params, image, original_hw, points, labels,
                                    num_clicks, carry["state"], options)
        pred = (prob > options.threshold) & inside
        new = dict(pred=pred, not_clicked=mark_clicked(carry["not_clicked"], row, col),
                   points=points, labels=labels, state=state)
        out = dict(ious=mask_iou(gt, pred, valid), clicks=jnp.stack([row, col]),
                   positive=is_pos)
        return new, out

    peeled = 0 if options.cascade is None else min(options.cascade.clicks, n)
    outs = []
    for k in range(peeled):  # the cascade's clicks, decided statically
        carry, out = click(carry, k, k + 1)
        outs.append(jax.tree.map(lambda v: v[None], out))
    if n > peeled:
        def body(c, k):
            return click(c, k, n + 1)  # past the cascade's clicks: plain steps

        carry, rest = jax.lax.scan(body, carry, jnp.arange(peeled, n))
        outs.append(rest)
    result = jax.tree.map(lambda *xs: jnp.concatenate(xs, axis=0), *outs)
    result["prob"] = carry["state"].prev_prob
    return result
