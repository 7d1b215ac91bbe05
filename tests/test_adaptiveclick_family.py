"""AdaptiveClick's pieces (docs/models/adaptiveclick.md): the decoder's ops against direct formulas, the
family's registration and rules, and the tiny network behind the click-map segmenter."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxseg_robust.models import zoo
from jaxseg_robust.models.adaptiveclick.config import TINY, VIT_B, AdaptiveClickConfig, pooling_steps
from jaxseg_robust.models.adaptiveclick.decoder import attention_blocked, max_pool_3x3_s2
from jaxseg_robust.models.adaptiveclick.pixel_decoder import bilinear_sample, sine_position_embedding
from jaxseg_robust.models.base import family_rules, with_predictor
from jaxseg_robust.models.clickmap.segmenter import ClickMapSegmenter
from jaxseg_robust.prompts.types import click_prompts


def test_sine_position_embedding_is_detr_normalised_sine():
    h, w, n = 3, 5, 8
    pos = sine_position_embedding((h, w), n)
    assert pos.shape == (h, w, 2 * n) and pos.dtype == np.float32
    for y in range(h):
        for x in range(w):
            for half, (i, size) in enumerate(((y, h), (x, w))):
                v = (i + 1) / (size + 1e-6) * 2 * math.pi
                for k in range(n):
                    t = v / 10000 ** (2 * (k // 2) / n)
                    want = math.sin(t) if k % 2 == 0 else math.cos(t)
                    assert pos[y, x, half * n + k] == pytest.approx(want, abs=1e-5)


def _grid_sample_reference(value, h, w, loc):
    """torch grid_sample(bilinear, zeros, align_corners=False) of one channel map value[h, w] at (x, y) in [0, 1]."""
    px, py = loc[0] * w - 0.5, loc[1] * h - 0.5
    x0, y0 = math.floor(px), math.floor(py)
    out = 0.0
    for yy, wy in ((y0, 1 - (py - y0)), (y0 + 1, py - y0)):
        for xx, wx in ((x0, 1 - (px - x0)), (x0 + 1, px - x0)):
            if 0 <= xx < w and 0 <= yy < h:
                out += wx * wy * value[yy, xx]
    return out


def test_bilinear_sample_matches_grid_sample_with_zeros_outside():
    rng = np.random.default_rng(0)
    h, w = 4, 6
    value = rng.standard_normal((h, w)).astype(np.float32)
    locs = np.concatenate([rng.uniform(-0.3, 1.3, (40, 2)), [[0.0, 0.0], [1.0, 1.0], [0.5, 0.5]]]).astype(np.float32)
    got = bilinear_sample(jnp.asarray(value.reshape(1, 1, h * w, 1)), (h, w), jnp.asarray(locs[None, None]))
    want = [_grid_sample_reference(value, h, w, loc) for loc in locs]
    np.testing.assert_allclose(np.asarray(got)[0, 0, :, 0], want, atol=1e-5)


def test_max_pool_pads_with_minus_infinity():
    x = -np.arange(1, 26, dtype=np.float32).reshape(5, 5)  # all negative: a zero padding would show
    got = np.asarray(max_pool_3x3_s2(jnp.asarray(x)))
    want = np.array([[x[max(r - 1, 0):r + 2, max(c - 1, 0):c + 2].max() for c in (0, 2, 4)] for r in (0, 2, 4)])
    np.testing.assert_array_equal(got, want)
    assert pooling_steps(448, 14) == 5 and pooling_steps(448, 56) == 3


def test_a_click_unblocks_attention_only_for_click_queries():
    masks = jnp.full((1, 2, 8, 8), -5.0)  # every query's mask is background: all blocked
    positive = jnp.zeros((1, 16, 16)).at[0, 4:8, 4:8].set(1.0)
    blocked = np.asarray(attention_blocked(masks, jnp.asarray([[1.0, 0.0]]), positive, (4, 4), heads=2))
    assert blocked.shape == (1, 2, 2, 16)
    assert blocked[0, :, 1].all()  # class argmax 0: the click map does not apply
    click_cells = ~blocked[0, 0, 0].reshape(4, 4)
    assert click_cells.any() and not click_cells[3, 3]  # near the click only
    np.testing.assert_array_equal(blocked[0, 0], blocked[0, 1])  # the same for every head


def test_zoo_names_and_the_family_rules():
    for name in ("adaptiveclick_vit_base_cocolvis", "adaptiveclick_vit_base_sbd"):
        spec = zoo.get(name)
        assert spec.family == "adaptiveclick" and spec.config == VIT_B
    assert zoo.get("adaptiveclick_tiny").config == TINY
    seg = ClickMapSegmenter(TINY)
    rules = family_rules(seg)
    assert rules.family == "adaptiveclick" and not rules.accepts_boxes and not rules.resets_feedback_on_two_slots
    for protocol in ("tetris", "rclicks"):
        options = with_predictor(seg, True, "DAVIS", protocol).evaluation
        assert options.zoom_in.target_hw == (672, 672) and options.with_flip and options.cascade is None
    assert AdaptiveClickConfig.from_dict(TINY.to_dict()) == TINY
    with pytest.raises(ValueError, match="unknown field"):
        AdaptiveClickConfig.from_dict({**TINY.to_dict(), "extra": 1})


def test_input_sides_must_be_multiples_of_32():
    with pytest.raises(ValueError, match=r"AdaptiveClick \(tiny\) needs input sides that are positive multiples of 32; got 48x64"):
        TINY.input_grid((48, 64))
    assert TINY.input_grid((64, 96)) == (4, 6)


def test_tiny_network_decodes_and_follows_a_positive_click():
    seg = ClickMapSegmenter(TINY)
    params = zoo.init("adaptiveclick_tiny", jax.random.key(0)).params
    image = np.random.default_rng(1).integers(0, 255, (64, 96, 3), dtype=np.uint8)
    x, transform = seg.preprocess(image)
    features = seg.embed(params, x)

    @jax.jit
    def logits(points, labels):
        prompts = click_prompts(points, labels, jnp.zeros((64, 96)), False)
        return seg.decode(params, features, prompts, transform).logits

    one = np.asarray(logits(jnp.asarray([[30.0, 20.0], [0.0, 0.0]]), jnp.asarray([1, -1])))
    two = np.asarray(logits(jnp.asarray([[30.0, 20.0], [70.0, 40.0]]), jnp.asarray([1, 1])))
    assert one.shape == (64, 96) and np.isfinite(one).all()
    assert np.abs(two - one).max() > 1e-3  # the second click changes the prediction
