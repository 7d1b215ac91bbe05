"""chex variants of the pure pieces every prompt protocol relies on: jitted or not, vmapped, same numbers.

`metrics.packed.packed_scores` (every iterate, grid prompt and fixed box),
`attacks.scoring.is_better` (the acceptance rule), the prompt builders of
`prompts.types`, and the grids' `evaluate_candidates` / `heatmap_extremes`
promise to be jit- and vmap-safe; each is checked with and without ``jit``
against NumPy restatements.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import parameterized

from jaxseg_robust.attacks.grid import evaluate_candidates, heatmap_extremes
from jaxseg_robust.attacks.scoring import is_better
from jaxseg_robust.metrics.packed import pack_target, packed_scores
from jaxseg_robust.prompts.types import append_click, box_prompts, empty_prompts

RNG = np.random.default_rng(0)
GT = np.where(RNG.random((3, 20, 37)) < 0.1, -1, RNG.random((3, 20, 37)) < 0.4).astype(np.int8)
PRED = RNG.random((3, 20, 37)) < 0.5
REGION = np.zeros((20, 37), bool)
REGION[:17, :30] = True


def _np_scores(pred, gt, region):
    target = (gt == 1) & region
    pred = pred & region
    labelled = region & (gt != -1)
    inter, union = (pred & target & labelled).sum(), ((pred | target) & labelled).sum()
    selection = (pred & target).sum() / max((pred | target).sum(), 1)
    return np.nan if union == 0 else inter / union, selection


class JitVmapSafety(parameterized.TestCase):

    @chex.variants(with_jit=True, without_jit=True)
    def test_packed_scores_vmapped_equal_numpy(self):
        width = jnp.int32(2)

        def scores(pred, gt):
            return packed_scores(pred, pack_target(gt, REGION, width), width)

        out = self.variant(jax.vmap(scores))(PRED, GT)
        for k in range(3):
            iou, selection = _np_scores(PRED[k], GT[k], REGION)
            np.testing.assert_allclose(out.iou[k], iou, atol=1e-6)
            np.testing.assert_allclose(out.selection_iou[k], selection, atol=1e-6)
        chex.assert_shape([out.iou, out.biou, out.selection_biou, out.iou_reference], (3,))

    @chex.variants(with_jit=True, without_jit=True)
    def test_acceptance_rule_is_lexicographic(self):
        new = packed_scores(PRED[0], pack_target(GT[0], REGION, jnp.int32(1)), jnp.int32(1))
        better = self.variant(jax.vmap(is_better, in_axes=(None, 0, 0, 0)))
        flags = better(new, jnp.array([new.selection_iou, new.selection_iou, 2.0]),
                       jnp.array([new.selection_biou - 0.1, new.selection_biou, 2.0]), jnp.array([True, True, False]))
        assert flags.tolist() == [True, False, True]

    @chex.variants(with_jit=True, without_jit=True)
    def test_prompt_builders_under_vmap(self):
        def build(box, point):
            return append_click(box_prompts(box, (4, 4)), point, 1)

        prompts = self.variant(jax.vmap(build))(jnp.arange(8.0).reshape(2, 4), jnp.ones((2, 2)))
        chex.assert_shape(prompts.points, (2, 2, 2))
        assert prompts.labels.tolist() == [[-1, 1], [-1, 1]] and prompts.has_box.tolist() == [True, True]
        assert not bool(self.variant(lambda: empty_prompts((3, 5)).has_mask)())

    @chex.variants(with_jit=True, without_jit=True)
    def test_candidates_and_extremes(self):
        values = jnp.asarray(RNG.random(23), jnp.float32)
        mask = jnp.asarray(RNG.random(23) < 0.6)

        def run(values, mask):
            out = evaluate_candidates(lambda i: values[i] * 2.0, mask, 4)
            return out, heatmap_extremes(out)

        out, extremes = self.variant(run)(values, mask)
        want = np.where(np.asarray(mask), np.asarray(values) * 2.0, np.nan)
        np.testing.assert_allclose(out, want, rtol=1e-6)
        assert float(extremes.min) == np.nanmin(want) and int(extremes.argmax) == int(np.nanargmax(want))
