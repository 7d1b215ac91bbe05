"""Training the clickability network (docs/protocols/rclicks.md §3.7, C-R ``train_click_model.py``).

Recipe: KLD loss between the min-max output and the GT clickability map,
Adam (β 0.9/0.999, eps 1e-8, no weight decay) with lr 0.01 on *all* trainable
parameters, timm ``CosineLRScheduler`` with a 10 % linear warm-up prefix
stepped once per iteration, horizontal flips (p = 0.5) applied jointly to
image, G, E and target *before* letterboxing, batch 16, 20 epochs, model
selection by the best mean validation SIM. Train mode = BatchNorm batch
statistics (running statistics updated with torch's rule), stochastic depth
0.1, Dropout2d 0.1, 6 NMF steps.

Targets: the GT clickability maps of §2 (built elsewhere) are passed in as
float arrays at the original image resolution, one per sample; `make_batch`
letterboxes them with the inputs.

Functional core (jit-safe): `kld_loss`, `similarity`, `correlation`,
`warmup_cosine_schedule`, `make_optimizer`, `train_step`, `eval_step`.
Shell: `TrainState`, `ClickSample`, `make_batch`, `epoch_order`, `fit`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, NamedTuple, Sequence

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxseg_robust.models.clickability.letterbox import letterbox, minmax_per_sample, \
    normalize_image
from jaxseg_robust.models.clickability.model import ClickabilityNet

KLD_EPS = 1e-9
METRIC_EPS = 1e-7


# ---- losses and metrics (per batch, jit-safe) --------------------------------------

def kld_loss(pred: jnp.ndarray, target: jnp.ndarray, eps: float = KLD_EPS) -> jnp.ndarray:
    """KL divergence of the target from the prediction, both sum-normalised per sample.

    ``q = t/(eps + Σt)``, ``p = ŷ/(eps + Σŷ)``, loss ``= mean_b Σ q·log(eps + q/(eps + p))``.

    Args:
      pred: f32[B, H, W] non-negative prediction (the min-max output).
      target: f32[B, H, W] non-negative GT clickability map.
      eps: 1e-9 as the reference.

    Returns:
      f32[] loss.
    """
    if pred.shape != target.shape:
        raise ValueError(f"pred {pred.shape} and target {target.shape} differ in shape")
    axes = tuple(range(1, pred.ndim))
    q = target / (eps + jnp.sum(target, axis=axes, keepdims=True))
    p = pred / (eps + jnp.sum(pred, axis=axes, keepdims=True))
    per_sample = jnp.sum(q * jnp.log(eps + q / (eps + p)), axis=axes)
    return jnp.mean(per_sample)


def similarity(pred: jnp.ndarray, target: jnp.ndarray) -> jnp.ndarray:
    """SIM per sample: Σ min(p̂, q̂) of the min-max-normalised maps, each divided by
    (its sum + 1e-7). pred, target f32[B, H, W] -> f32[B]. A constant map is NaN, as in
    the reference (plain min-max without eps)."""
    axes = tuple(range(1, pred.ndim))
    p = minmax_per_sample(pred, 0.0)
    q = minmax_per_sample(target, 0.0)
    p = p / (jnp.sum(p, axis=axes, keepdims=True) + METRIC_EPS)
    q = q / (jnp.sum(q, axis=axes, keepdims=True) + METRIC_EPS)
    return jnp.sum(jnp.minimum(p, q), axis=axes)


def correlation(pred: jnp.ndarray, target: jnp.ndarray) -> jnp.ndarray:
    """CC per sample: Pearson correlation of the min-max-normalised maps, with the
    reference's eps (1e-7 on both stds and inside the final square root).
    pred, target f32[B, H, W] -> f32[B]."""
    axes = tuple(range(1, pred.ndim))

    def standardise(x):
        x = minmax_per_sample(x, 0.0)
        mean = jnp.mean(x, axis=axes, keepdims=True)
        std = jnp.sqrt(jnp.mean(jnp.square(x - mean), axis=axes, keepdims=True))
        return (x - mean) / (std + METRIC_EPS)

    a, b = standardise(pred), standardise(target)
    return jnp.sum(a * b, axis=axes) / jnp.sqrt(
        jnp.sum(a * a, axis=axes) * jnp.sum(b * b, axis=axes) + METRIC_EPS)


# ---- optimiser --------------------------------------------------------------------

def warmup_cosine_schedule(total_steps: int, peak_lr: float = 0.01,
                           warmup_fraction: float = 0.1) -> optax.Schedule:
    """The learning rate used at each optimiser update (optax count 0, 1, ...).

    timm ``CosineLRScheduler(t_initial=T, warmup_t=W=int(warmup_fraction·T),
    warmup_prefix=True, warmup_lr_init=0, lr_min=0)`` stepped with the
    iteration index after each update: ``lr(t) = peak·t/W`` for ``t < W`` else
    ``peak/2·(1 + cos(π (t − W)/T))``; update ``i`` uses ``lr(i − 1)`` and
    update 0 the initial value (0 with warm-up, ``peak`` without).

    Args:
      total_steps: T = epochs × iterations per epoch (> 0).
      peak_lr: base learning rate (0.01).
      warmup_fraction: warm-up length as a fraction of T (0.1).

    Returns:
      count i32[] -> f32[] learning rate.
    """
    if total_steps <= 0:
        raise ValueError(f"total_steps must be positive; got {total_steps}")
    warmup = int(warmup_fraction * total_steps)

    def lr_at(t):
        t = jnp.asarray(t, jnp.float32)
        cosine = 0.5 * peak_lr * (1.0 + jnp.cos(jnp.pi * (t - warmup) / total_steps))
        if warmup == 0:
            return cosine
        return jnp.where(t < warmup, peak_lr * t / warmup, cosine)

    initial = 0.0 if warmup > 0 else peak_lr

    def schedule(count):
        count = jnp.asarray(count)
        return jnp.where(count == 0, initial, lr_at(count - 1))

    return schedule


def make_optimizer(total_steps: int, peak_lr: float = 0.01,
                   warmup_fraction: float = 0.1) -> optax.GradientTransformation:
    """torch ``Adam(lr=schedule)`` (β1 0.9, β2 0.999, eps 1e-8, no weight decay)."""
    return optax.adam(warmup_cosine_schedule(total_steps, peak_lr, warmup_fraction),
                      b1=0.9, b2=0.999, eps=1e-8)


# ---- state and steps --------------------------------------------------------------

@flax.struct.dataclass
class TrainState:
    """Everything that changes during training.

    Attributes:
      step: i32[] number of updates done.
      params: trainable variables.
      batch_stats: BatchNorm running statistics.
      buffers: fixed NMF bases (carried, never updated).
      opt_state: optax state of ``params``.
    """

    step: jnp.ndarray
    params: Any
    batch_stats: Any
    buffers: Any
    opt_state: Any

    @property
    def variables(self) -> dict:
        """The variables for ``ClickabilityNet.apply``."""
        return {"params": self.params, "batch_stats": self.batch_stats, "buffers": self.buffers}


def create_train_state(variables: dict, tx: optax.GradientTransformation) -> TrainState:
    """A fresh state from variables {"params", "batch_stats", "buffers"}."""
    params = jax.tree.map(jnp.asarray, variables["params"])
    return TrainState(step=jnp.zeros((), jnp.int32), params=params,
                      batch_stats=jax.tree.map(jnp.asarray, variables["batch_stats"]),
                      buffers=jax.tree.map(jnp.asarray, variables["buffers"]),
                      opt_state=tx.init(params))


def train_step(net: ClickabilityNet, tx: optax.GradientTransformation, state: TrainState,
               batch: dict, key: jax.Array) -> tuple[TrainState, jnp.ndarray]:
    """One update in train mode (jit with ``net`` and ``tx`` bound, e.g. `functools.partial`).

    Args:
      net, tx: the network and the optimiser (static).
      state: current `TrainState`.
      batch: {"image": f32[B, S, S, 3], "aux": f32[B, S, S, 2], "target": f32[B, S, S]}.
      key: base PRNG key; the dropout/stochastic-depth key is ``fold_in(key, step)``.

    Returns:
      (new state, f32[] loss of this batch before the update).
    """
    rng = jax.random.fold_in(key, state.step)

    def loss_fn(params):
        out, mutated = net.apply(
            {"params": params, "batch_stats": state.batch_stats, "buffers": state.buffers},
            batch["image"], batch["aux"], train=True, rngs={"dropout": rng},
            mutable=["batch_stats"])
        return kld_loss(out.normalized, batch["target"]), mutated["batch_stats"]

    (loss, batch_stats), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    return state.replace(step=state.step + 1, params=params, batch_stats=batch_stats,
                         opt_state=opt_state), loss


def eval_step(net: ClickabilityNet, variables: dict, batch: dict) -> dict:
    """Validation metrics in eval mode: {"kld": f32[], "cc": f32[B], "sim": f32[B]}."""
    out = net.apply(variables, batch["image"], batch["aux"], train=False)
    return {"kld": kld_loss(out.normalized, batch["target"]),
            "cc": correlation(out.normalized, batch["target"]),
            "sim": similarity(out.normalized, batch["target"])}


# ---- host-side data ------------------------------------------------------------------

class ClickSample(NamedTuple):
    """One training task at the original resolution.

    Attributes:
      image: [H, W, 3] RGB in 0..255.
      gt_mask: [H, W] GT object mask G in [0, 1].
      error_mask: [H, W] error mask E in [0, 1].
      target: [H, W] GT clickability map C (§2), non-negative.
    """

    image: np.ndarray
    gt_mask: np.ndarray
    error_mask: np.ndarray
    target: np.ndarray


def make_batch(samples: Sequence[ClickSample], flips: Sequence[bool],
               size: int) -> dict[str, np.ndarray]:
    """Normalises, flips (before letterboxing, as the reference) and letterboxes samples.

    Args:
      samples: B samples (sizes may differ).
      flips: B booleans: mirror the sample horizontally.
      size: canvas side.

    Returns:
      {"image": f32[B, S, S, 3], "aux": f32[B, S, S, 2], "target": f32[B, S, S]}.
    """
    if len(samples) != len(flips) or not samples:
        raise ValueError(f"need one flip per sample and at least one sample; got "
                         f"{len(samples)} samples, {len(flips)} flips")
    images, auxs, targets = [], [], []
    for i, (s, flip) in enumerate(zip(samples, flips)):
        hw = np.shape(s.image)[:2]
        for name in ("gt_mask", "error_mask", "target"):
            if np.shape(getattr(s, name)) != hw:
                raise ValueError(f"sample {i}: {name} has shape {np.shape(getattr(s, name))}; "
                                 f"the image is {hw}")
        image = normalize_image(s.image)
        arrays = [image, np.asarray(s.gt_mask, np.float32), np.asarray(s.error_mask, np.float32),
                  np.asarray(s.target, np.float32)]
        if flip:
            arrays = [a[:, ::-1] for a in arrays]
        image, gt, err, target = (letterbox(a, size) for a in arrays)
        images.append(image)
        auxs.append(np.stack([gt, err], axis=-1))
        targets.append(target)
    return {"image": np.stack(images), "aux": np.stack(auxs), "target": np.stack(targets)}


def epoch_order(key: jax.Array, num_samples: int, batch_size: int,
                drop_last: bool = False) -> list[np.ndarray]:
    """Shuffled sample indices split into batches (torch ``DataLoader(shuffle=True)``)."""
    if batch_size <= 0:
        raise ValueError(f"batch_size must be positive; got {batch_size}")
    order = np.asarray(jax.random.permutation(key, num_samples))
    batches = [order[i:i + batch_size] for i in range(0, num_samples, batch_size)]
    if drop_last and batches and len(batches[-1]) < batch_size:
        batches = batches[:-1]
    return batches


@dataclasses.dataclass
class FitResult:
    """Outcome of `fit`.

    Attributes:
      best_variables: variables of the epoch with the highest validation SIM (mean
        of per-batch means, as the reference; the last epoch when no validation set
        is given or every SIM is NaN).
      best_epoch: its index.
      state: the final `TrainState`.
      history: per epoch {"train_loss", "val_kld", "val_cc", "val_sim"} (val_* NaN
        without validation data).
    """

    best_variables: dict
    best_epoch: int
    state: TrainState
    history: list[dict]


def fit(net: ClickabilityNet, variables: dict, train_samples: Sequence[ClickSample],
        val_samples: Sequence[ClickSample] = (), *, epochs: int = 20, batch_size: int = 16,
        key: jax.Array, peak_lr: float = 0.01, drop_last: bool = False,
        log: Callable[[str], None] | None = None) -> FitResult:
    """Trains with the reference recipe; keeps the epoch with the best validation SIM.

    Args:
      net: the network (its config's ``input_size`` is the canvas).
      variables: initial {"params", "batch_stats", "buffers"} (random init or ported).
      train_samples, val_samples: `ClickSample`s.
      epochs, batch_size: 20 and 16 in the reference.
      key: PRNG key for shuffling, flips and dropout.
      peak_lr: 0.01.
      drop_last: drop the last incomplete batch (reference: False; an incomplete batch
        has another shape, so the step is compiled a second time for it).
      log: optional callable receiving one line per epoch.

    Returns:
      `FitResult`.
    """
    if not train_samples:
        raise ValueError("train_samples is empty")
    if epochs <= 0:
        raise ValueError(f"epochs must be positive; got {epochs}")
    size = net.config.input_size
    if batch_size <= 0:
        raise ValueError(f"batch_size must be positive; got {batch_size}")
    per_epoch = (len(train_samples) // batch_size if drop_last
                 else -(-len(train_samples) // batch_size))
    if per_epoch == 0:
        raise ValueError(f"no full batch of {batch_size} in {len(train_samples)} samples")
    tx = make_optimizer(epochs * per_epoch, peak_lr)
    state = create_train_state(variables, tx)
    step_fn = jax.jit(lambda st, b, k: train_step(net, tx, st, b, k))
    eval_fn = jax.jit(lambda v, b: eval_step(net, v, b))
    key_shuffle, key_flip, key_dropout = jax.random.split(key, 3)
    history, best_sim, best_epoch, best_variables = [], -math.inf, -1, None
    for epoch in range(epochs):
        losses = []
        for b, idx in enumerate(epoch_order(jax.random.fold_in(key_shuffle, epoch),
                                            len(train_samples), batch_size, drop_last)):
            flips = np.asarray(jax.random.bernoulli(
                jax.random.fold_in(key_flip, epoch * per_epoch + b), 0.5, (len(idx),)))
            batch = make_batch([train_samples[i] for i in idx], flips.tolist(), size)
            state, loss = step_fn(state, batch, key_dropout)
            losses.append(float(loss))
        record = {"train_loss": float(np.mean(losses)), "val_kld": math.nan,
                  "val_cc": math.nan, "val_sim": math.nan}
        if val_samples:
            klds, ccs, sims = [], [], []
            for start in range(0, len(val_samples), batch_size):
                chunk = val_samples[start:start + batch_size]
                metrics = eval_fn(state.variables,
                                  make_batch(chunk, [False] * len(chunk), size))
                klds.append(float(metrics["kld"]))  # the reference averages batch means
                ccs.append(float(np.mean(metrics["cc"])))
                sims.append(float(np.mean(metrics["sim"])))
            record.update(val_kld=float(np.mean(klds)), val_cc=float(np.mean(ccs)),
                          val_sim=float(np.mean(sims)))
        history.append(record)
        if log is not None:
            log(f"epoch {epoch}: " + ", ".join(f"{k} {v:.6g}" for k, v in record.items()))
        improved = (not val_samples) or record["val_sim"] > best_sim
        if improved:
            best_sim = record["val_sim"] if val_samples else best_sim
            best_epoch = epoch
            best_variables = jax.tree.map(np.asarray, state.variables)
    if best_variables is None:  # validation SIM was NaN in every epoch
        best_epoch, best_variables = epochs - 1, jax.tree.map(np.asarray, state.variables)
    return FitResult(best_variables=best_variables, best_epoch=best_epoch, state=state,
                     history=history)
