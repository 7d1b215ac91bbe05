"""RITM baseline clicker vs an independent numpy restatement of prompt-attacks.md §1
(OpenCV precise DT, as in the reference), plus hand-checked cases."""

from __future__ import annotations

import cv2
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from jaxseg_robust.prompts.clicker import error_masks, mark_clicked, next_click
from lowered_loops import lowered_text, while_condition_constants
from mask_patterns import make_mask, mask_strategy

SHAPE = (23, 31)
_next_click = jax.jit(next_click)
_mark_clicked = jax.jit(mark_clicked)


def reference_click(gt, pred, not_clicked, valid=None):
    """Spec §1 step by step: padded cv2 DT, times not_clicked, strict '>' , first argmax."""
    valid = np.ones_like(gt, bool) if valid is None else valid
    fn = gt & ~pred & valid
    fp = ~gt & pred & valid

    def dt(region):
        padded = np.pad(region, 1).astype(np.uint8)
        return cv2.distanceTransform(padded, cv2.DIST_L2, 0)[1:-1, 1:-1] * not_clicked

    fn_dt, fp_dt = dt(fn), dt(fp)
    positive = fn_dt.max() > fp_dt.max()
    chosen = fn_dt if positive else fp_dt
    row, col = np.unravel_index(np.argmax(chosen), chosen.shape)
    return bool(positive), int(row), int(col)


def reference_mark(not_clicked, row, col):
    out = not_clicked.copy()
    out[min(round(row), out.shape[0] - 1), min(round(col), out.shape[1] - 1)] = False
    return out


def _click(gt, pred, not_clicked, valid=None):
    positive, row, col = _next_click(gt, pred, not_clicked, valid)
    assert positive.dtype == jnp.bool_ and row.dtype == jnp.int32 and col.dtype == jnp.int32
    return bool(positive), int(row), int(col)


@given(mask_strategy(SHAPE), mask_strategy(SHAPE), st.integers(0, 2 ** 32 - 1), st.booleans())
def test_matches_reference_on_random_pairs(gt, pred, seed, use_valid):
    rng = np.random.default_rng(seed)
    not_clicked = rng.random(SHAPE) > 0.05
    valid = (rng.random(SHAPE) > 0.1) if use_valid else np.ones(SHAPE, bool)
    assert _click(gt, pred, not_clicked, valid) == reference_click(gt, pred, not_clicked, valid)


def test_matches_reference_along_a_trajectory():
    # Perturbed predictions, clicking as the protocol does (state carried between rounds).
    rng = np.random.default_rng(0)
    gt = make_mask("blobs", SHAPE, 0.6, 4)
    not_clicked = np.ones(SHAPE, bool)
    pred = np.zeros(SHAPE, bool)
    for _ in range(5):
        got = _click(gt, pred, not_clicked)
        assert got == reference_click(gt, pred, not_clicked)
        not_clicked = np.asarray(_mark_clicked(not_clicked, got[1], got[2]))
        pred = gt ^ (rng.random(SHAPE) < 0.08)


def test_first_click_is_deepest_interior_point():
    gt = np.zeros(SHAPE, bool)
    gt[5:15, 3:20] = True   # rows 5..14: depth 5 at rows 9 and 10; cols 7..15 reach depth >= 5
    assert _click(gt, np.zeros(SHAPE, bool), np.ones(SHAPE, bool)) == (True, 9, 7)
    # The image border counts as background: a full object's deepest point is central.
    full = np.ones(SHAPE, bool)
    assert _click(full, np.zeros(SHAPE, bool), np.ones(SHAPE, bool)) == (True, 11, 11)


def test_tie_gives_negative_click():
    gt = np.zeros(SHAPE, bool)
    pred = np.zeros(SHAPE, bool)
    gt[2:5, 2:5] = True           # FN square, depth 2 at (3, 3)
    pred[15:18, 20:23] = True     # FP square of the same size, depth 2 at (16, 21)
    assert _click(gt, pred, np.ones(SHAPE, bool)) == (False, 16, 21)
    gt[2:6, 2:6] = True           # 4x4 FN: still depth 2 -> still a tie -> negative
    assert _click(gt, pred, np.ones(SHAPE, bool)) == (False, 16, 21)
    gt[2:7, 2:7] = True           # 5x5 FN: depth 3 > 2 -> positive at its centre
    assert _click(gt, pred, np.ones(SHAPE, bool)) == (True, 4, 4)


def test_clicked_pixel_is_never_chosen_again():
    gt = np.zeros(SHAPE, bool)
    gt[4:11, 4:11] = True         # unique deepest pixel (7, 7)
    pred = np.zeros(SHAPE, bool)
    not_clicked = np.ones(SHAPE, bool)
    seen = set()
    for _ in range(6):
        positive, row, col = _click(gt, pred, not_clicked)
        assert positive and gt[row, col] and (row, col) not in seen
        seen.add((row, col))
        not_clicked = np.asarray(_mark_clicked(not_clicked, row, col))
    assert (7, 7) in seen


def test_no_error_gives_negative_click_at_origin_even_if_clicked():
    gt = make_mask("blobs", SHAPE, 0.5, 1)
    not_clicked = np.ones(SHAPE, bool)
    not_clicked[0, 0] = False
    assert _click(gt, gt, not_clicked) == (False, 0, 0)
    # Errors only on ignored pixels count as no error.
    valid = np.ones(SHAPE, bool)
    valid[10:, :] = False
    pred = gt.copy()
    pred[12:20, 5:9] = ~gt[12:20, 5:9]
    assert _click(gt, pred, not_clicked, valid) == (False, 0, 0)
    # Every error pixel already clicked: all maps are 0 -> (0, 0) negative.
    fn_only = np.zeros(SHAPE, bool)
    fn_only[8, 8] = True
    clicked = np.ones(SHAPE, bool)
    clicked[8, 8] = False
    assert _click(fn_only, np.zeros(SHAPE, bool), clicked) == (False, 0, 0)


def test_error_masks():
    gt = make_mask("blobs", SHAPE, 0.3, 2)
    pred = make_mask("blobs", SHAPE, 0.3, 3)
    valid = make_mask("noise", SHAPE, 0.8, 4)
    fn, fp = error_masks(gt.astype(np.uint8) * 255, pred, valid)
    np.testing.assert_array_equal(np.asarray(fn), gt & ~pred & valid)
    np.testing.assert_array_equal(np.asarray(fp), ~gt & pred & valid)


@pytest.mark.parametrize("row, col", [(2.5, 3.5), (3.5, 0.49), (2.0, 7.0), (22.4, 30.6), (100.0, 100.0),
                                      (0.5, 1.5), (4, 9)])
def test_mark_clicked_rounds_half_to_even_and_clamps(row, col):
    not_clicked = np.ones(SHAPE, bool)
    got = np.asarray(_mark_clicked(not_clicked, row, col))
    np.testing.assert_array_equal(got, reference_mark(not_clicked, row, col))
    assert got.sum() == not_clicked.size - 1


def test_mark_clicked_matches_numpy_negative_indexing_and_ignores_far_out():
    not_clicked = np.ones(SHAPE, bool)
    np.testing.assert_array_equal(np.asarray(mark_clicked(not_clicked, -1.0, 2.0)),
                                  reference_mark(not_clicked, -1.0, 2.0))
    assert np.asarray(mark_clicked(not_clicked, -100.0, 2.0)).all()


def test_vmap_over_instances():
    gts = np.stack([make_mask("blobs", SHAPE, d, i) for i, d in enumerate((0.2, 0.5, 0.8))])
    preds = np.stack([make_mask("rects", SHAPE, 0.3, 10 + i) for i in range(3)])
    not_clicked = np.ones_like(gts)
    not_clicked[1, 5:9, 5:9] = False
    positive, rows, cols = jax.jit(jax.vmap(next_click))(gts, preds, not_clicked)
    for i in range(3):
        assert (bool(positive[i]), int(rows[i]), int(cols[i])) == reference_click(gts[i], preds[i], not_clicked[i])


def test_bad_input_raises():
    with pytest.raises(ValueError, match="pred"):
        next_click(np.zeros((4, 5)), np.zeros((5, 4)), np.ones((4, 5), bool))
    with pytest.raises(ValueError, match="not_clicked"):
        next_click(np.zeros((4, 5)), np.zeros((4, 5)), np.ones((4, 4), bool))
    with pytest.raises(ValueError, match="gt"):
        next_click(np.zeros((2, 4, 5)), np.zeros((4, 5)), np.ones((4, 5), bool))
    with pytest.raises(ValueError, match="scalars"):
        mark_clicked(np.ones((4, 5), bool), np.zeros(2), 1.0)


def test_cuda_lowering_runs_both_error_maps_in_one_loop_without_row_loops():
    # On a GPU both padded EDTs are one stack through the accelerator EDT: one row-pass
    # loop over (padded) columns, no loop over the 23 (25 padded) rows, also under vmap.
    mask = jax.ShapeDtypeStruct(SHAPE, jnp.bool_)
    batch = jax.ShapeDtypeStruct((5,) + SHAPE, jnp.bool_)
    for fn, arg in ((next_click, mask), (jax.vmap(next_click), batch)):
        loops = while_condition_constants(lowered_text(fn, arg, arg, arg, platform="cuda"))
        assert len(loops) == 1
        assert not loops[0] & {23, 25}
        assert 33 in loops[0]  # stops when no column of the padded 31 + 2 is left
