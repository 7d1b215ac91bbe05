"""Click models of the simulated user: letterbox matrices, DT/UD baselines, the network wrapper, loading."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxseg_robust.clicksim import click_models as CM
from jaxseg_robust.clicksim.clickability import distance_transform_map
from jaxseg_robust.models.clickability import ClickabilityConfig, benchmark_map, letterbox, prepare_inputs, unletterbox
from jaxseg_robust.models import zoo

TINY = ClickabilityConfig(embed_dims=(8, 16, 16, 32), depths=(1, 1, 1, 1), mlp_ratios=(2, 2, 2, 2),
                          head_channels=16, ham_channels=16, gn_groups=4, nmf_rank=4, input_size=64, variant="tiny")


@pytest.mark.parametrize("size", [(30, 45), (45, 30), (40, 40), (7, 50)])
def test_letterbox_and_unletterbox_matrices(size):
    rng = np.random.default_rng(0)
    frame = (size[0] + 3, size[1] + 5)
    mask = rng.uniform(0, 1, size).astype(np.float32)
    framed = np.full(frame, 7.0, np.float32)  # garbage outside the image must not leak in
    framed[:size[0], :size[1]] = mask
    rows, cols = CM.letterbox_matrices(*size, frame, 64)
    np.testing.assert_allclose(rows @ framed @ cols.T, letterbox(mask, 64), atol=1e-6)
    canvas = rng.uniform(0, 1, (64, 64)).astype(np.float32)
    un_rows, un_cols = CM.unletterbox_matrices(*size, frame, 64)
    back = un_rows @ canvas @ un_cols.T
    np.testing.assert_allclose(back[:size[0], :size[1]], np.asarray(unletterbox(jnp.asarray(canvas), size)),
                               atol=1e-6)
    assert np.all(back[size[0]:] == 0) and np.all(back[:, size[1]:] == 0)


def test_baselines_in_a_padded_frame_equal_the_unpadded_maps():
    region = np.zeros((20, 30), bool)
    region[:12, 5:30] = True  # touches the image border (not background without padding)
    inside = np.zeros((24, 33), bool)
    inside[:20, :30] = True
    framed = np.zeros((24, 33), bool)
    framed[:20, :30] = region
    dt = np.asarray(jax.jit(CM.DistanceTransformClickModel().clickability)(None, {}, framed, inside))
    np.testing.assert_allclose(dt[:20, :30], np.asarray(distance_transform_map(region.astype(np.float32))),
                               rtol=1e-6)
    assert np.all(dt[20:] == 0) and np.all(dt[:, 30:] == 0)
    ud = np.asarray(CM.UniformClickModel().clickability(None, {}, framed, inside))
    np.testing.assert_array_equal(ud, framed.astype(np.float32))
    with pytest.raises(ValueError, match="frame_hw"):
        CM.DistanceTransformClickModel().prepare(np.zeros((20, 30, 3), np.uint8), region, (10, 30))


@pytest.mark.slow  # ~70 s on 2 CPU cores (compiles the letterboxed network path twice)
def test_network_model_equals_the_benchmark_wrapper():
    model = CM.NetworkClickModel(TINY)
    variables = model.init(0)
    rng = np.random.default_rng(1)
    image = rng.integers(0, 256, (30, 47, 3), dtype=np.uint8)
    gt = np.zeros((30, 47), bool)
    gt[5:25, 10:40] = True
    region = gt.copy()
    region[10:15, 15:30] = False
    x, aux = prepare_inputs(image, gt, region, 64)
    expected = np.asarray(benchmark_map(model.net, variables, x[None], aux[None], (30, 47)))[0]
    frame = (32, 48)
    prepared = model.prepare(image, gt, frame)
    framed = np.zeros(frame, bool)
    framed[:30, :47] = region
    got = np.asarray(jax.jit(model.clickability)(variables, prepared, framed, framed))
    np.testing.assert_allclose(got[:30, :47], expected, atol=2e-5)
    assert np.all(got[30:] == 0) and np.all(got[:, 47:] == 0)


def test_load_click_model_and_zoo_entry(tmp_path):
    assert CM.load_click_model("dt").model.name == "dt" and CM.load_click_model("ud").params is None
    assert CM.ZOO_NAME in zoo.known_names() and zoo.get(CM.ZOO_NAME).family == "clickability"
    loaded = CM.load_click_model(CM.ZOO_NAME, random_seed=0, config=TINY)
    assert loaded.source == "random:0" and isinstance(loaded.model, CM.NetworkClickModel)
    with pytest.raises(ValueError, match="unknown model"):
        CM.load_click_model("no_such_model")
    with pytest.raises(ValueError, match="baseline"):
        CM.load_click_model("dt", random_seed=1)
    from jaxseg_robust.models import store
    store.save(tmp_path / "cm", loaded.params, family="clickability", variant="tiny", config=TINY.to_dict())
    from_dir = CM.load_click_model(tmp_path / "cm")
    assert from_dir.model.config == TINY
    jax.tree.map(np.testing.assert_array_equal, from_dir.params, jax.tree.map(np.asarray, loaded.params))
