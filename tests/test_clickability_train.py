"""Clickability training: KLD, metrics, schedule, batching with flips, and a short fit."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxseg_robust.models.clickability import ClickabilityConfig, ClickabilityNet, letterbox
from jaxseg_robust.models.clickability import train as T


def rbg_key(seed: int) -> jax.Array:
    return jax.random.key(seed, impl="rbg")


def kld_numpy(pred, target, eps=1e-9):
    """The reference ``kld`` re-stated in float64."""
    pred, target = np.asarray(pred, np.float64), np.asarray(target, np.float64)
    q = target / (eps + target.sum(axis=(1, 2), keepdims=True))
    p = pred / (eps + pred.sum(axis=(1, 2), keepdims=True))
    return np.mean(np.sum(q * np.log(eps + q / (eps + p)), axis=(1, 2)))


def test_kld_matches_numpy_and_vanishes_on_equal_maps():
    rng = np.random.default_rng(0)
    pred = rng.uniform(size=(3, 9, 7)).astype(np.float32)
    target = rng.uniform(size=(3, 9, 7)).astype(np.float32) * (rng.uniform(size=(3, 9, 7)) > 0.6)
    got = jax.jit(T.kld_loss)(pred, target)
    np.testing.assert_allclose(got, kld_numpy(pred, target), rtol=1e-5)
    assert abs(float(T.kld_loss(target, target))) < 1e-5
    grad = jax.grad(T.kld_loss)(jnp.asarray(pred), jnp.asarray(target))
    assert np.isfinite(grad).all()
    with pytest.raises(ValueError, match="shape"):
        T.kld_loss(pred, target[:, :5])


def test_similarity_and_correlation_match_reference_formulas():
    rng = np.random.default_rng(1)
    pred = rng.uniform(size=(2, 8, 6)).astype(np.float32)
    target = rng.uniform(size=(2, 8, 6)).astype(np.float32)
    sim, cc = np.asarray(T.similarity(pred, target)), np.asarray(T.correlation(pred, target))
    for b in range(2):
        p = (pred[b] - pred[b].min()) / (pred[b].max() - pred[b].min())
        q = (target[b] - target[b].min()) / (target[b].max() - target[b].min())
        want_sim = np.minimum(p / (p.sum() + 1e-7), q / (q.sum() + 1e-7)).sum()
        a = (p - p.mean()) / (p.std() + 1e-7)
        c = (q - q.mean()) / (q.std() + 1e-7)
        want_cc = (a * c).sum() / math.sqrt((a * a).sum() * (c * c).sum() + 1e-7)
        np.testing.assert_allclose(sim[b], want_sim, rtol=1e-5)
        np.testing.assert_allclose(cc[b], want_cc, rtol=1e-5)
    np.testing.assert_allclose(T.similarity(pred, pred), 1.0, rtol=1e-5)


def test_schedule_golden_values():
    schedule = T.warmup_cosine_schedule(1000)
    # Spec §3.7: lr(t) for t = 0, 50, 100, 550, 999; update i uses lr(i - 1), update 0 uses 0.
    for t, want in [(0, 0.0), (50, 0.005), (100, 0.01), (550, 0.005782), (999, 0.00025)]:
        np.testing.assert_allclose(schedule(t + 1), want, rtol=2e-3, atol=1e-9)
    assert float(schedule(0)) == 0.0
    no_warmup = T.warmup_cosine_schedule(5)
    np.testing.assert_allclose(no_warmup(0), 0.01)
    with pytest.raises(ValueError, match="total_steps"):
        T.warmup_cosine_schedule(0)


def disk_sample(rng: np.random.Generator, h: int, w: int) -> T.ClickSample:
    """A synthetic task: an elliptic object, clicks near its centre, blurred into a map."""
    yy, xx = np.mgrid[:h, :w].astype(np.float32)
    cy, cx = rng.uniform(0.35, 0.65) * h, rng.uniform(0.35, 0.65) * w
    ry, rx = rng.uniform(0.2, 0.3) * h, rng.uniform(0.2, 0.3) * w
    gt = (((yy - cy) / ry) ** 2 + ((xx - cx) / rx) ** 2 <= 1.0).astype(np.float32)
    image = np.where(gt[..., None] > 0, rng.uniform(150, 255, 3), rng.uniform(0, 100, 3))
    image = np.clip(image + rng.normal(0, 10, (h, w, 3)), 0, 255).astype(np.uint8)
    sigma = 0.25 * min(ry, rx)
    target = np.exp(-((yy - cy) ** 2 + (xx - cx) ** 2) / (2 * sigma**2)) * gt
    return T.ClickSample(image, gt, gt, target.astype(np.float32))


def test_make_batch_flips_before_letterboxing():
    rng = np.random.default_rng(2)
    sample = disk_sample(rng, 45, 22)       # portrait: 15 columns, 17 padding columns at 32
    batch = T.make_batch([sample, sample], [False, True], 32)
    assert batch["image"].shape == (2, 32, 32, 3) and batch["aux"].shape == (2, 32, 32, 2)
    np.testing.assert_allclose(batch["target"][1], letterbox(sample.target[:, ::-1], 32))
    np.testing.assert_allclose(batch["aux"][1, ..., 0], letterbox(sample.gt_mask[:, ::-1], 32))
    # Flipping after letterboxing would be off by one column here.
    assert not np.allclose(batch["target"][1], batch["target"][0][:, ::-1])
    with pytest.raises(ValueError, match="flip"):
        T.make_batch([sample], [True, False], 32)


def test_epoch_order_covers_every_sample_once():
    batches = T.epoch_order(rbg_key(0), 10, 4)
    assert [len(b) for b in batches] == [4, 4, 2]
    assert sorted(np.concatenate(batches).tolist()) == list(range(10))
    assert [len(b) for b in T.epoch_order(rbg_key(0), 10, 4, drop_last=True)] == [4, 4]


# Stages 2-4 without blocks keep the compile time of the training step down (XLA on
# busy CPUs); the slow test below trains a model with a block in every stage.
SMALL = ClickabilityConfig(embed_dims=(8, 16, 16, 32), depths=(1, 0, 0, 0),
                           mlp_ratios=(2, 2, 2, 2), head_channels=16, ham_channels=16,
                           gn_groups=4, nmf_rank=4, input_size=32, drop_path_rate=0.0,
                           dropout_ratio=0.0, variant="small")


def synthetic_clicks(seed: int, count: int) -> list[T.ClickSample]:
    rng = np.random.default_rng(seed)
    return [disk_sample(rng, int(rng.integers(28, 48)), int(rng.integers(28, 48)))
            for _ in range(count)]


def random_variables(config: ClickabilityConfig, seed: int) -> dict:
    """Random variables without compiling ``init`` (slow on busy CPUs): conv kernels with
    torch-default-like scale, unit norms, fresh BatchNorm statistics, NMF bases."""
    rng = np.random.default_rng(seed)
    shapes = ClickabilityNet(config).variable_shapes()

    def fill(path, leaf):
        name = path[-1].key
        if name == "kernel":
            fan_in = int(np.prod(leaf.shape[:-1]))
            return rng.uniform(-1, 1, leaf.shape).astype(np.float32) / np.sqrt(fan_in)
        if name in ("scale", "var"):
            return np.ones(leaf.shape, np.float32) * (0.05 if path[-2].key == "maps_transform"
                                                       else 1.0)
        if name.startswith("layer_scale"):
            return np.full(leaf.shape, 1e-2, np.float32)
        if name == "bases":
            b = rng.uniform(size=leaf.shape).astype(np.float32)
            return b / np.linalg.norm(b, axis=1, keepdims=True)
        return np.zeros(leaf.shape, np.float32)

    return jax.tree_util.tree_map_with_path(fill, shapes)


def test_training_reduces_the_loss_on_synthetic_clicks():
    samples = synthetic_clicks(3, 8)
    net = ClickabilityNet(SMALL)
    variables = random_variables(SMALL, 0)
    result = T.fit(net, variables, samples, epochs=6, batch_size=4, key=rbg_key(1))
    losses = [h["train_loss"] for h in result.history]
    print("train loss per epoch:", losses)
    assert losses[-1] < 0.8 * losses[0]     # measured 2.99 -> 2.17
    assert int(result.state.step) == 12
    assert result.best_epoch == 5 and math.isnan(result.history[-1]["val_sim"])
    # BatchNorm running statistics were updated; the NMF bases were not.
    before = variables["batch_stats"]["backbone"]["patch_embed2"]["norm"]["mean"]
    after = result.state.batch_stats["backbone"]["patch_embed2"]["norm"]["mean"]
    assert np.abs(np.asarray(after) - np.asarray(before)).max() > 0
    np.testing.assert_array_equal(result.state.buffers["decode_head"]["hamburger"]["ham"]["bases"],
                                  variables["buffers"]["decode_head"]["hamburger"]["ham"]["bases"])


@pytest.mark.slow
def test_full_recipe_from_torch_default_init_with_validation():
    """init_variables (torch default init), stochastic depth, Dropout2d, validation SIM."""
    config = ClickabilityConfig(**{**SMALL.__dict__, "depths": (1, 1, 1, 1),
                                   "drop_path_rate": 0.1, "dropout_ratio": 0.1})
    net = ClickabilityNet(config)
    variables = net.init_variables(rbg_key(0))
    params = variables["params"]
    np.testing.assert_array_equal(params["backbone"]["block3_0"]["layer_scale_2"], np.float32(1e-2))
    np.testing.assert_allclose(params["maps_transform"]["scale"], [0.05])
    kernel = np.asarray(params["backbone"]["block1_0"]["mlp"]["fc1"]["kernel"])  # fan_in 8
    assert np.abs(kernel).max() <= 1 / np.sqrt(8) and kernel.std() > 0.1
    samples = synthetic_clicks(4, 8)
    result = T.fit(net, variables, samples, samples[:4], epochs=6, batch_size=4,
                   key=rbg_key(1))
    losses = [h["train_loss"] for h in result.history]
    assert losses[-1] < 0.9 * losses[0]    # measured 3.18 -> 2.55
    sims = [h["val_sim"] for h in result.history]
    assert all(0 < s <= 1 for s in sims)
    assert result.best_epoch == int(np.argmax(sims))
