"""`models.block_scan`: cutting a block sequence into repeated units and running it as loops."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxseg_robust.models.block_scan import Run, Segment, run_blocks, runs_of, segments_of


def _cut(kinds):
    return [(s.start, s.period, s.reps, [(r.kind, r.length) for r in s.runs]) for s in segments_of(kinds)]


def test_runs_of_merges_equal_neighbours():
    assert runs_of("WWGWG") == (Run("W", 0, 2), Run("G", 2, 1), Run("W", 3, 1), Run("G", 4, 1))


def test_sam_vit_b_and_h_are_one_repeated_unit():
    assert _cut("WWG" * 4) == [(0, 3, 4, [("W", 2), ("G", 1)])]  # ViT-B: globals at 2, 5, 8, 11
    assert _cut("WWWWWWWG" * 4) == [(0, 8, 4, [("W", 7), ("G", 1)])]  # ViT-H: globals at 7, 15, 23, 31


def test_segments_hold_the_fewest_block_bodies():
    # a stage of six windowed blocks and globals every fourth block after them (Hiera-like): a greedy
    # left-to-right cut would take six W, then G, then (WWWG) x 2 (four bodies); three suffice
    kinds = ["a", "b"] + ["W"] * 6 + ["G"] + ["W", "W", "W", "G"] * 2 + ["c"]
    cut = segments_of(kinds)
    assert sum(len(segment.runs) for segment in cut) == 6  # a, b, W; (W, G); c
    assert [(s.start, s.period, s.reps) for s in cut] == [(0, 5, 1), (5, 4, 3), (17, 1, 1)]
    assert cut[0].runs[-1] == Run("W", 2, 3)
    assert _cut("W") == [(0, 1, 1, [("W", 1)])]
    assert _cut("WWWW") == [(0, 1, 4, [("W", 1)])]


@pytest.mark.parametrize("kinds", ["WWG" * 4, "ab" + "W" * 6 + "G" + "WWWG" * 2 + "c", "GWWW", "W"])
def test_run_blocks_equals_the_blocks_one_after_another(kinds):
    """Toy blocks: x -> tanh(x @ w_kind + b), each kind with its own weight shapes' code; the outputs of
    the emitting kinds (upper case) come back in block order."""
    rng = np.random.default_rng(0)
    params = [{"w": rng.standard_normal((4, 4)).astype(np.float32) / 2,
               "b": rng.standard_normal(4).astype(np.float32)} for _ in kinds]

    def apply_block(kind, p, x):
        scale = 1.0 + (ord(kind) % 7)  # kinds differ in code, not only in weights
        return jnp.tanh(x @ p["w"] * scale + p["b"])

    def unrolled(x):
        emitted = []
        for kind, p in zip(kinds, params):
            x = apply_block(kind, p, x)
            if kind.isupper():
                emitted.append(x)
        return x, emitted

    x = rng.standard_normal((3, 4)).astype(np.float32)
    expected, expected_emitted = jax.jit(unrolled)(x)
    out, emitted = jax.jit(lambda x: run_blocks(apply_block, params, tuple(kinds), x, emits=str.isupper))(x)
    # float32 rounding: XLA may fuse a loop body otherwise than the unrolled chain (tanh's polynomial)
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)
    assert len(emitted) == len(expected_emitted) == sum(k.isupper() for k in kinds)
    for got, want in zip(emitted, expected_emitted):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_run_blocks_holds_each_kind_once_in_the_program():
    """Twelve blocks of two kinds: the lowered program has two block bodies' products, not twelve."""
    params = [{"w": np.eye(4, dtype=np.float32)} for _ in range(12)]

    def apply_block(kind, p, x):
        return x @ p["w"] if kind == "W" else jnp.sin(x @ p["w"])

    text = jax.jit(lambda x: run_blocks(apply_block, params, tuple("WWG" * 4), x)[0]).lower(
        np.ones((2, 4), np.float32)).as_text()
    assert text.count("stablehlo.dot_general") == 2
    assert text.count("stablehlo.while") == 2  # the units, and the windowed pair inside


def test_run_blocks_names_a_count_mismatch():
    with pytest.raises(ValueError, match="2 parameter trees for 3 block kinds"):
        run_blocks(lambda kind, p, x: x, [{}, {}], ("W", "W", "G"), jnp.zeros(2))


def test_segment_is_a_frozen_description():
    segment = Segment(0, 3, 4, runs_of("WWG"))
    with pytest.raises(AttributeError):
        segment.reps = 2  # type: ignore[misc]
