"""SEA / APGD (spec §3): checkpoint tables, a NumPy statement of the APGD loop, schedules, quirks, strength."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import perturb_toy as toy
from jaxseg_robust.attacks.perturb import apgd, instance_keys, losses, sea
from jaxseg_robust.attacks.perturb.apgd import Stage, checkpoint_schedule, progressive_stages, single_stage
from jaxseg_robust.attacks.perturb.common import project_linf, uniform_start
from jaxseg_robust.attacks.perturb.sea import sea_losses

EPSILON = 8 / 255

SPEC_TABLES = {  # spec §3.1, (iteration, window)
    300: [(65, 66), (122, 57), (170, 48), (209, 39), (239, 30), (260, 21), (278, 18), (296, 18)],
    90: [(18, 19), (35, 17), (50, 15), (63, 13), (74, 11), (83, 9)],
    120: [(25, 26), (48, 23), (68, 20), (85, 17), (99, 14), (110, 11), (118, 8)],
}


@pytest.mark.parametrize("n", sorted(SPEC_TABLES))
def test_checkpoint_tables_match_the_spec(n):
    assert checkpoint_schedule(n) == SPEC_TABLES[n]


def test_schedules_and_loss_pairs():
    assert progressive_stages(300) == (Stage(2.0, 90), Stage(1.5, 90), Stage(1.0, 120))
    assert single_stage(300) == (Stage(1.0, 300),)
    assert sea_losses("bce") == ("balanced_ce", "ce")
    assert sea_losses("jsd", "single") == ("jsd", "ce")
    assert sea_losses("msl") == ("masked_spherical", "spherical")
    assert sea_losses("msl", "single") == ("masked_spherical", "masked_spherical")
    assert sea_losses("msl", "progressive", "masked") == ("masked_spherical", "masked_spherical")
    with pytest.raises(ValueError, match="total_iterations"):
        progressive_stages(2)


def numpy_apgd(images, mask, start, evaluate, stages, early_stop, quirks):
    """Spec §3.1-§3.2 in NumPy, image by image; ``evaluate(point, weight) -> (grad, tracked, correct)``."""
    x = np.asarray(images, np.float32)
    valid = mask.reshape(len(x), -1).sum(1)
    num_pixels = mask[0].size
    void = num_pixels - valid
    outputs, forwards = [], []
    for b in range(len(x)):
        best_adv, count = None, 0
        for s, stage in enumerate(stages):
            n, r = stage.num_iterations, np.float32(stage.scale * EPSILON)
            checkpoints = dict(checkpoint_schedule(n))
            point = start[b] if s == 0 else np.asarray(project_linf(best_adv[None], x[b:b + 1], r))[0]
            grad, loss, correct = evaluate(b, point, 0.0)
            count += 1
            xa, xa_prev, g = point, point, grad
            x_best, g_best, loss_best = point, grad, loss
            best_adv = point
            acc_best = (correct / num_pixels) if quirks else correct / max(valid[b], 1)
            step = 2 * r
            last_check_loss, reduced = loss, True
            history = np.zeros(n, np.float32)
            counter = 0
            for i in range(n):
                if early_stop and i > 0 and acc_best <= 0:
                    break
                a = 1.0 if i == 0 else 0.75
                u = np.asarray(project_linf((xa + step * np.sign(g))[None], x[b:b + 1], r))[0]
                new = np.asarray(project_linf((xa + (u - xa) * a + (xa - xa_prev) * (1 - a))[None], x[b:b + 1], r))[0]
                xa_prev, xa = xa, new
                grad, loss, correct = evaluate(b, xa, (i + 1) / 2 / n)
                count += 1
                if i < n - 1:
                    g = grad
                acc = ((correct + void[b]) / num_pixels) if quirks else correct / max(valid[b], 1)
                if acc <= acc_best:
                    best_adv = xa
                acc_best = min(acc_best, acc)
                history[i] = loss
                if loss > loss_best:
                    x_best, g_best, loss_best = xa, g, loss
                counter += 1
                if i in checkpoints:
                    k = checkpoints[i]
                    increases = sum(history[j] > (history[j - 1] if j > 0 else 0.0) for j in range(i - k + 1, i + 1))
                    flag = increases <= 0.75 * k or (not reduced and last_check_loss >= loss_best)
                    reduced, last_check_loss = flag, loss_best
                    if flag:
                        step, xa, g = step / 2, x_best, g_best
        outputs.append(best_adv)
        forwards.append(count)
    return np.stack(outputs), np.array(forwards)


@pytest.mark.parametrize("loss, stages, early_stop", [
    ("balanced_ce", (Stage(1.0, 14),), False),
    ("masked_spherical", (Stage(2.0, 6), Stage(1.5, 6), Stage(1.0, 8)), True),
])
def test_apgd_matches_the_numpy_statement(loss, stages, early_stop):
    params = toy.init_params(jax.random.key(4), width=8)
    images, labels = toy.synthetic_batch(8, 2, 16, 16)
    mask = np.ones(labels.shape, bool)
    mask[1, :5] = False
    keys = instance_keys(jax.random.key(2), np.array([0, 1]))
    track = "spherical" if loss == "masked_spherical" else "ce"
    result = apgd(toy.logits_fn, params, images, labels, jnp.asarray(mask), keys, loss=loss, track_loss=track,
                  epsilon=EPSILON, stages=stages, early_stop=early_stop)

    pixel_loss = {"balanced_ce": lambda z, y, m, w: losses.balanced_cross_entropy(z, y, m, w),
                  "masked_spherical": lambda z, y, m, w: losses.spherical(z, y, m, masked=True)}[loss]
    tracked_loss = {"ce": lambda z, y, m: losses.cross_entropy(z, y),
                    "spherical": lambda z, y, m: losses.spherical(z, y, m, masked=False)}[track]

    @jax.jit
    def evaluate_one(point, y, m, weight):
        def objective(p):
            logits = toy.logits_fn(params, p[None])
            return jnp.sum(losses.image_mean(pixel_loss(logits, y[None], m[None], weight), m[None])), logits
        (_, logits), grad = jax.value_and_grad(objective, has_aux=True)(point)
        tracked = losses.image_mean(tracked_loss(logits, y[None], m[None]), m[None])[0]
        correct = jnp.sum((jnp.argmax(logits[0], -1) == y) & m)
        return grad, tracked, correct

    def evaluate(b, point, weight):
        grad, tracked, correct = evaluate_one(jnp.asarray(point), labels[b], jnp.asarray(mask[b]), weight)
        return np.asarray(grad), np.float32(tracked), int(correct)

    start = np.asarray(uniform_start(keys, images, stages[0].scale * EPSILON))
    expected, forwards = numpy_apgd(images, mask, start, evaluate, stages, early_stop, quirks=True)
    np.testing.assert_allclose(np.asarray(result.images), expected, atol=1e-6)
    np.testing.assert_array_equal(np.asarray(result.forwards), forwards)


def constant_model(params, images):
    """Logits that ignore the input (zero gradient): a model no attack can move."""
    return jnp.broadcast_to(params, images.shape[:3] + params.shape[-1:]) + 0.0 * images[..., :1]


def test_single_schedule_returns_clean_when_accuracy_stays_one_and_progressive_does_not():
    height = width = 8
    images = jnp.full((2, height, width, 3), 0.5)
    logits = jnp.asarray(np.eye(3, dtype=np.float32)[np.arange(height * width).reshape(height, width) % 3])
    labels = jnp.asarray(np.broadcast_to(np.arange(height * width).reshape(height, width) % 3, (2, height, width)))
    mask = jnp.ones((2, height, width), bool)
    keys = instance_keys(jax.random.key(0), np.arange(2))
    single = sea(constant_model, logits, images, labels, mask, keys, loss="mce", schedule="single",
                 total_iterations=9)
    np.testing.assert_array_equal(np.asarray(single.images), np.asarray(images))
    assert not np.asarray(single.info["accepted"]).any()
    progressive = sea(constant_model, logits, images, labels, mask, keys, loss="mce", total_iterations=9)
    assert float(jnp.abs(progressive.images - images).max()) > 0  # the projected random start, not the clean image
    assert float(jnp.abs(progressive.images - images).max()) <= EPSILON + 1e-7


def test_reference_quirk_start_accuracy_counts_void_as_wrong():
    height = width = 8
    images = jnp.full((1, height, width, 3), 0.5)
    params = jnp.array([0.0, 1.0, 0.0])  # predicts class 1 everywhere
    labels = jnp.ones((1, height, width), jnp.int32)
    mask = jnp.asarray(np.arange(height * width).reshape(1, height, width) < 48)  # 16 void pixels
    keys = instance_keys(jax.random.key(0), np.arange(1))
    kwargs = dict(loss="masked_ce", track_loss="ce", epsilon=EPSILON, stages=(Stage(1.0, 6),), early_stop=False)
    quirky = apgd(constant_model, params, images, labels, mask, keys, reference_quirks=True, **kwargs)
    consistent = apgd(constant_model, params, images, labels, mask, keys, reference_quirks=False, **kwargs)
    # Start: 48 correct of N = 64 counted as 0.75; later iterates (48 + 16 void) / 64 = 1 never replace it.
    np.testing.assert_allclose(np.asarray(quirky.info["accuracy"]), [0.75])
    np.testing.assert_allclose(np.asarray(consistent.info["accuracy"]), [1.0])


def test_progressive_early_stop_freezes_an_image_at_zero_accuracy():
    images = jnp.full((1, 4, 4, 3), 0.5)
    params = jnp.array([1.0, 0.0, 0.0])  # predicts class 0; labels are 1: accuracy 0 from the start
    labels = jnp.ones((1, 4, 4), jnp.int32)
    mask = jnp.ones((1, 4, 4), bool)
    keys = instance_keys(jax.random.key(0), np.arange(1))
    result = sea(constant_model, params, images, labels, mask, keys, loss="bce", total_iterations=30)
    # Each of the three stages evaluates its start and its first iteration, then stops.
    np.testing.assert_array_equal(np.asarray(result.forwards), [6])
    np.testing.assert_array_equal(np.asarray(result.backwards), [6])


def test_sea_drives_a_trained_model_near_zero_accuracy():
    params = toy.trained_params()
    images, labels = toy.synthetic_batch(21, 4)
    mask = jnp.ones(labels.shape, bool)
    keys = instance_keys(jax.random.key(0), np.arange(4))
    result = sea(toy.logits_fn, params, images, labels, mask, keys, loss="bce", total_iterations=100)
    assert toy.accuracy(params, result.images, labels) < 0.05
    assert float(jnp.abs(result.images - images).max()) <= EPSILON + 1e-7
    assert np.all(np.asarray(result.forwards) <= 103)
