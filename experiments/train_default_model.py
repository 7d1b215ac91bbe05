"""Trains the embedded demonstration model ``sam_demo`` on synthetic shapes (CPU-sized).

    python experiments/train_default_model.py --workdir /tmp/sam_demo_run --steps 4000
    python experiments/train_default_model.py --workdir /tmp/sam_demo_run --export-only

Model: `jaxseg_robust.models.sam.demo.DEMO_CONFIG` (our SAM modules at reduced
width/depth), random init (`SamSegmenter.init`). Data: an endless stream of
`jaxseg_robust.data.synthetic` samples (all families and difficulties, the
training sizes plus the demo sizes; seed `TRAIN_SEED`, disjoint from the
evaluation seed), rendered by a producer thread, resized and padded into the
256 px model frame exactly as `SamSegmenter.preprocess` does; the mask is
resized alike (bilinear, ``>= 0.5``).

Prompts, RITM/SAM style, per instance and step (all inside one jitted step):
  * round A (no mask input): with probability ``box_prob`` the tight box of
    the mask with Gaussian jitter (``box_jitter`` x side per coordinate, at
    most ``max_jitter_px``), otherwise one positive click: the RITM baseline
    click (deepest interior point) with probability ``baseline_click_prob``,
    else a pixel of the object drawn with weight ``EDT**2`` (interior-biased);
  * then ``n`` corrective rounds without gradient (``n`` uniform in
    [0, ``max_sim_rounds``], one draw per step): the baseline clicker on the
    error of the previous prediction, every click so far as a prompt, the
    previous selected low-res logits fed back as ``mask_input``;
  * round B (with gradient): one more corrective click with mask feedback.
Loss of a round (on the 4 candidates upsampled to the 256 frame, padding
pixels excluded): BCE + soft Dice for the single-mask candidate 0 plus the
minimum over the 3 multimask candidates (SAM's ambiguity-aware loss), plus
the MSE between the IoU head and each candidate's actual IoU. Total = round A
+ round B. Selection for feedback: argmax predicted IoU over the multimask
candidates (as the evaluation).

Optimiser: AdamW (weight decay 0.05 on kernels), global-norm clipping 1.0,
linear warm-up then cosine decay. Checkpoints (params + optimiser state +
step, a flat ``.npz``) are written every ``--ckpt-every`` steps and training
resumes from the latest one. ``--export`` writes the package-data directory
(``config.json`` + ``params.npz`` via `jaxseg_robust.models.store.save_npz`) and, with
``--eval-instances``, ``metrics.json`` (held-out synthetic instances,
`jaxseg_robust.models.sam.demo.evaluate_instances`).

Threads: run one process; XLA uses the machine's cores (cap with taskset).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import queue
import sys
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import traverse_util

from jaxseg_robust.data.synthetic import DEMO_SIZES, TRAIN_SIZES, SyntheticConfig
from jaxseg_robust.models.sam.demo import (DEMO_CONFIG, DEMO_MODEL_NAME, EVAL_SEED, add_click,
                                           empty_prompts, evaluate_instances)
from jaxseg_robust.models.sam.segmenter import SamFeatures, SamSegmenter, _model_input, make_transform
from jaxseg_robust.ops.boxes import tight_box
from jaxseg_robust.ops.distance import squared_distance_transform
from jaxseg_robust.ops.resize import longest_side_shape, resize_bilinear, resize_bilinear_antialias_host
from jaxseg_robust.prompts.clicker import next_click

TRAIN_SEED = 1
# The small evaluation tests/test_default_model.py repeats (one image size: one compilation).
TEST_SUBSET_SIZES = ((64, 64),)
TEST_SUBSET_INSTANCES = 12
NUM_SLOTS = 8
WEIGHTS_DIR = pathlib.Path(__file__).resolve().parents[1] / "jaxseg_robust" / "models" / "weights"


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Hyper-parameters of a training run (see the module docstring)."""

    steps: int = 4000
    batch_size: int = 8
    learning_rate: float = 8e-4
    warmup_steps: int = 200
    weight_decay: float = 0.05
    box_prob: float = 0.4
    baseline_click_prob: float = 0.5
    box_jitter: float = 0.05
    max_jitter_px: float = 12.0
    max_sim_rounds: int = 4
    iou_loss_weight: float = 1.0
    seed: int = 0
    data_seed: int = TRAIN_SEED


# ---------------------------------------------------------------- data (host)
def frame_sample(image: np.ndarray, mask: np.ndarray, image_size: int, mean, std):
    """One sample in the model frame, as `SamSegmenter.preprocess` (float path) does.

    Args:
      image: uint8[H, W, 3]; mask: bool[H, W].
      image_size: side S of the square model frame (px).

    Returns:
      (x f32[S, S, 3] normalised and zero-padded, gt bool[S, S] (the mask
      resized bilinearly, ``>= 0.5``), valid bool[S, S] (the resized image area)).
    """
    h, w = mask.shape
    rh, rw = longest_side_shape(h, w, image_size)
    x = np.asarray(_model_input(resize_bilinear_antialias_host(image, (rh, rw)), mean, std, image_size))
    m = resize_bilinear_antialias_host(mask.astype(np.float32)[..., None], (rh, rw))[..., 0] >= 0.5
    gt = np.zeros((image_size, image_size), bool)
    gt[:rh, :rw] = m
    valid = np.zeros((image_size, image_size), bool)
    valid[:rh, :rw] = True
    return x, gt, valid


def batch_stream(config: TrainConfig, image_size: int, start_index: int, mean, std, sizes=None):
    """Yields (x f32[B, S, S, 3], gt bool[B, S, S], valid bool[B, S, S]) from synthetic sample
    ``start_index`` on (samples whose resized mask is empty are skipped)."""
    data = SyntheticConfig(seed=config.data_seed, sizes=sizes or (TRAIN_SIZES + DEMO_SIZES))
    index = start_index
    while True:
        xs, gts, valids = [], [], []
        while len(xs) < config.batch_size:
            sample = data.sample(index)
            index += 1
            x, gt, valid = frame_sample(sample.image, sample.mask, image_size, mean, std)
            if gt.any():
                xs.append(x)
                gts.append(gt)
                valids.append(valid)
        yield np.stack(xs), np.stack(gts), np.stack(valids)


class Prefetcher:
    """Runs a generator in a daemon thread with a bounded queue (host rendering overlaps XLA)."""

    def __init__(self, generator, depth: int = 3):
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._thread = threading.Thread(target=self._run, args=(generator,), daemon=True)
        self._thread.start()

    def _run(self, generator):
        for item in generator:
            self._queue.put(item)

    def next(self):
        """The next item (blocks)."""
        return self._queue.get()


# ---------------------------------------------------------------- losses (pure)
def mask_losses(logits: jnp.ndarray, gt: jnp.ndarray, valid: jnp.ndarray) -> tuple[jnp.ndarray, jnp.ndarray]:
    """Per-candidate BCE + soft Dice, and actual IoU, over valid pixels.

    Args:
      logits: f32[K, S, S]; gt, valid: bool[S, S].

    Returns:
      (loss f32[K], iou f32[K] of ``logits > 0``; IoU of two empty masks is 1).
    """
    target = gt.astype(jnp.float32)[None]
    weight = valid.astype(jnp.float32)[None]
    count = jnp.maximum(weight.sum(), 1.0)
    bce = (optax.sigmoid_binary_cross_entropy(logits, jnp.broadcast_to(target, logits.shape))
           * weight).sum(axis=(1, 2)) / count
    prob = jax.nn.sigmoid(logits) * weight
    dice = 1.0 - (2.0 * (prob * target).sum(axis=(1, 2)) + 1.0) / (
        prob.sum(axis=(1, 2)) + (target * weight).sum(axis=(1, 2)) + 1.0)
    hard = (logits > 0) & valid[None]
    inter = (hard & gt[None]).sum(axis=(1, 2))
    union = (hard | gt[None]).sum(axis=(1, 2))
    iou = jnp.where(union > 0, inter / jnp.maximum(union, 1), 1.0)
    return bce + dice, iou.astype(jnp.float32)


def round_loss(low_res, iou_pred, gt, valid, image_size: int, iou_loss_weight: float):
    """SAM's loss of one decoder call: candidate 0 + min over multimask candidates + IoU-head MSE.

    Args:
      low_res: f32[K, L, L] all candidates (0 = single-mask output); iou_pred f32[K].
      gt, valid: bool[S, S] in the model frame.

    Returns:
      (loss f32[], upsampled logits f32[K, S, S]).
    """
    logits = resize_bilinear(low_res, (image_size, image_size))
    losses, ious = mask_losses(logits, gt, valid)
    mask_term = losses[0] + jnp.min(losses[1:])
    iou_term = jnp.mean((iou_pred - jax.lax.stop_gradient(ious)) ** 2)
    return mask_term + iou_loss_weight * iou_term, logits


# ---------------------------------------------------------------- prompts (pure)
def first_prompt(key, gt, valid, config: TrainConfig, num_slots: int, low_res_size: int):
    """Round A's prompt: a jittered tight box or one positive click (module docstring).

    Returns:
      (Prompts, clicks_so_far i32[], not_clicked bool[S, S]).
    """
    k_box, k_jit, k_kind, k_pix = jax.random.split(key, 4)
    use_box = jax.random.bernoulli(k_box, config.box_prob)
    size = gt.shape[0]
    box = tight_box(gt).astype(jnp.float32)
    side = jnp.stack([box[2] - box[0] + 1, box[3] - box[1] + 1] * 2)
    jitter = jnp.clip(jax.random.normal(k_jit, (4,)) * config.box_jitter * side,
                      -config.max_jitter_px, config.max_jitter_px)
    noisy = jnp.clip(box + jitter, 0.0, size - 1.0)
    noisy = jnp.concatenate([jnp.minimum(noisy[:2], noisy[2:]), jnp.maximum(noisy[:2], noisy[2:])])

    not_clicked = jnp.ones(gt.shape, bool)
    _, base_row, base_col = next_click(gt, jnp.zeros(gt.shape, bool), not_clicked, valid)
    depth = squared_distance_transform(gt, pad_border=True).astype(jnp.float32)
    flat = jax.random.categorical(k_pix, jnp.log(depth.reshape(-1) + 1e-12))
    use_baseline = jax.random.bernoulli(k_kind, config.baseline_click_prob)
    row = jnp.where(use_baseline, base_row, flat // size).astype(jnp.int32)
    col = jnp.where(use_baseline, base_col, flat % size).astype(jnp.int32)

    prompts = empty_prompts(num_slots, low_res_size)
    clicked = add_click(prompts, 0, jnp.asarray(True), row, col)
    prompts = jax.tree.map(lambda a, b: jnp.where(use_box, a, b),
                           prompts.replace(box=noisy, has_box=jnp.asarray(True)), clicked)
    hit = (jnp.arange(size)[:, None] == row) & (jnp.arange(size)[None, :] == col)
    not_clicked = jnp.where(use_box, not_clicked, ~hit)
    return prompts, jnp.where(use_box, 0, 1).astype(jnp.int32), not_clicked


def make_train_step(segmenter: SamSegmenter, optimizer, config: TrainConfig, num_slots: int = NUM_SLOTS):
    """The jitted train step ``(params, opt_state, x, gt, valid, key, num_sim) -> (params, opt_state, metrics)``.

    Args of the step:
      x f32[B, S, S, 3], gt / valid bool[B, S, S] (model frame), key a PRNG key,
      num_sim i32[] corrective rounds without gradient (0..max_sim_rounds).
    """
    cfg = segmenter.config
    size, low = cfg.image_size, cfg.low_res_size
    identity = _identity_transform(size)

    def decode(params, embedding, prompts):
        return segmenter.decode_low_res(params, SamFeatures(embedding), prompts, identity)

    def select(low_res, iou_pred):
        best = 1 + jnp.argmax(iou_pred[1:])
        return low_res[best]

    def corrective(params, embedding, gt, valid, state, with_grad: bool):
        prompts, count, not_clicked, pred = state
        is_positive, row, col = next_click(gt, pred, not_clicked, valid)
        prompts = add_click(prompts, jnp.minimum(count, num_slots - 1), is_positive, row, col)
        hit = (jnp.arange(size)[:, None] == row) & (jnp.arange(size)[None, :] == col)
        low_res, iou_pred = decode(params, embedding, prompts)
        return prompts, count + 1, not_clicked & ~hit, low_res, iou_pred

    def instance_loss(params, embedding, gt, valid, key, num_sim):
        prompts, count, not_clicked = first_prompt(key, gt, valid, config, num_slots, low)
        low_a, iou_a = decode(params, embedding, prompts)
        loss_a, logits_a = round_loss(low_a, iou_a, gt, valid, size, config.iou_loss_weight)
        frozen = jax.lax.stop_gradient(params)
        frozen_embedding = jax.lax.stop_gradient(embedding)

        def feedback(prompts, low_res, iou_pred):
            chosen = jax.lax.stop_gradient(select(low_res, iou_pred))
            logits = resize_bilinear(chosen[None], (size, size))[0]
            return prompts.replace(mask_logits=chosen, has_mask=jnp.asarray(True)), (logits > 0) & valid

        prompts, pred = feedback(prompts, low_a, iou_a)

        def sim_round(_, state):
            prompts, count, not_clicked, pred = state
            prompts, count, not_clicked, low_res, iou_pred = corrective(
                frozen, frozen_embedding, gt, valid, state, False)
            prompts, pred = feedback(prompts, low_res, iou_pred)
            return prompts, count, not_clicked, pred

        state = jax.lax.fori_loop(0, num_sim, sim_round, (prompts, count, not_clicked, pred))
        _, _, _, low_b, iou_b = corrective(params, embedding, gt, valid, state, True)
        loss_b, _ = round_loss(low_b, iou_b, gt, valid, size, config.iou_loss_weight)
        _, iou_hard = mask_losses(logits_a[:1], gt, valid)
        return loss_a + loss_b, (loss_a, loss_b, iou_hard[0])

    def batch_loss(params, x, gt, valid, key, num_sim):
        embeddings, _ = segmenter.encode_image(params, x)
        keys = jax.random.split(key, x.shape[0])
        total, (loss_a, loss_b, iou_a) = jax.vmap(instance_loss, in_axes=(None, 0, 0, 0, 0, None))(
            params, embeddings, gt, valid, keys, num_sim)
        return total.mean(), {"loss_a": loss_a.mean(), "loss_b": loss_b.mean(), "iou_a": iou_a.mean()}

    @jax.jit
    def step(params, opt_state, x, gt, valid, key, num_sim):
        (loss, metrics), grads = jax.value_and_grad(batch_loss, has_aux=True)(params, x, gt, valid, key,
                                                                                 num_sim)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        return params, opt_state, {"loss": loss, "grad_norm": optax.tree.norm(grads), **metrics}

    return step


def _identity_transform(size: int):
    """A `Transform` for prompts already in model-frame pixels (scale 1, frame S x S)."""
    return make_transform((size, size), (size, size))


def make_optimizer(config: TrainConfig):
    """AdamW with warm-up + cosine decay, weight decay on kernels only, clipping at norm 1."""
    schedule = optax.warmup_cosine_decay_schedule(0.0, config.learning_rate, config.warmup_steps,
                                                  max(config.steps, config.warmup_steps + 1),
                                                  end_value=config.learning_rate * 0.02)

    def decay_mask(params):
        flat = traverse_util.flatten_dict(params)
        return traverse_util.unflatten_dict({k: k[-1] == "kernel" for k in flat})

    return optax.chain(optax.clip_by_global_norm(1.0),
                       optax.adamw(schedule, weight_decay=config.weight_decay, mask=decay_mask))


# ---------------------------------------------------------------- checkpoints
def save_checkpoint(path: pathlib.Path, params, opt_state, step: int) -> None:
    """Writes params, optimiser state and step into one ``.npz`` (atomically)."""
    leaves = jax.tree.leaves(opt_state)
    arrays = {f"params/{k}": np.asarray(v) for k, v in traverse_util.flatten_dict(params, sep="/").items()}
    arrays.update({f"opt/{i:05d}": np.asarray(v) for i, v in enumerate(leaves)})
    arrays["step"] = np.asarray(step)
    tmp = path.with_suffix(".tmp.npz")
    np.savez(tmp, **arrays)
    os.replace(tmp, path)


def load_checkpoint(path: pathlib.Path, opt_state_like):
    """Inverse of `save_checkpoint`: (params, opt_state, step)."""
    with np.load(path) as data:
        params = traverse_util.unflatten_dict(
            {k[len("params/"):]: jnp.asarray(data[k]) for k in data.files if k.startswith("params/")}, sep="/")
        opt_keys = sorted(k for k in data.files if k.startswith("opt/"))
        treedef = jax.tree.structure(opt_state_like)
        opt_state = jax.tree.unflatten(treedef, [jnp.asarray(data[k]) for k in opt_keys])
        return params, opt_state, int(data["step"])


# ---------------------------------------------------------------- driver
def train(segmenter: SamSegmenter, config: TrainConfig, *, workdir: pathlib.Path | None = None,
          ckpt_every: int = 200, log_every: int = 20, log=print, sizes=None):
    """Trains from scratch (or resumes from ``workdir/checkpoint.npz``).

    Returns:
      (params, list of per-step metric dicts).
    """
    cfg = segmenter.config
    optimizer = make_optimizer(config)
    params = segmenter.init(jax.random.key(config.seed))
    opt_state = optimizer.init(params)
    start = 0
    ckpt = None if workdir is None else pathlib.Path(workdir) / "checkpoint.npz"
    if ckpt is not None and ckpt.is_file():
        params, opt_state, start = load_checkpoint(ckpt, opt_state)
        log(f"resumed from {ckpt} at step {start}")
    step_fn = make_train_step(segmenter, optimizer, config)
    stream = Prefetcher(batch_stream(config, cfg.image_size, start * config.batch_size * 2,
                                     cfg.pixel_mean, cfg.pixel_std, sizes))
    rng = np.random.default_rng([config.seed, start])
    history = []
    t0 = time.time()
    for step in range(start, config.steps):
        x, gt, valid = stream.next()
        num_sim = int(rng.integers(0, config.max_sim_rounds + 1))
        key = jax.random.fold_in(jax.random.key(config.seed), step)
        params, opt_state, metrics = step_fn(params, opt_state, x, gt, valid, key, num_sim)
        metrics = {k: float(v) for k, v in metrics.items()}
        history.append(metrics)
        if (step + 1) % log_every == 0 or step == start:
            recent = history[-log_every:]
            means = {k: np.mean([m[k] for m in recent]) for k in metrics}
            log(f"step {step + 1}/{config.steps} " + " ".join(f"{k}={v:.4f}" for k, v in means.items())
                + f" s/step={(time.time() - t0) / (step + 1 - start):.2f}")
        if ckpt is not None and ((step + 1) % ckpt_every == 0 or step + 1 == config.steps):
            save_checkpoint(ckpt, params, opt_state, step + 1)
    return params, history


def _per_family(records) -> dict:
    """Mean IoUs per synthetic family (ids end in ``_<family>_<difficulty>``)."""
    groups: dict = {}
    for record in records:
        family = record["id"].split("_", 1)[1].rsplit("_", 1)[0]
        groups.setdefault(family, []).append(record)
    return {family: {"num_instances": len(rs),
                     "iou_click1": float(np.mean([r["click1"] for r in rs])),
                     "iou_box": float(np.mean([r["box"] for r in rs])),
                     "iou_click5": float(np.mean([r["clicks"][-1] for r in rs]))}
            for family, rs in sorted(groups.items())}


def export(params, out_dir: pathlib.Path, *, config=DEMO_CONFIG, eval_instances: int = 0,
           eval_seed: int = EVAL_SEED, train_info: dict | None = None, log=print) -> dict:
    """Writes the package-data model directory and (optionally) its ``metrics.json``."""
    from jaxseg_robust.models import store  # noqa: PLC0415
    store.save_npz(out_dir, params, family=config.family, variant=config.variant, config=config.to_dict(),
                   overwrite=True)
    result = {}
    if eval_instances:
        from jaxseg_robust.models import zoo  # noqa: PLC0415
        seg, loaded, _ = zoo.load_params(out_dir)
        samples = SyntheticConfig(seed=eval_seed).sample
        summary = evaluate_instances(seg, loaded, [samples(i) for i in range(eval_instances)])
        test_data = SyntheticConfig(seed=eval_seed, sizes=TEST_SUBSET_SIZES).sample
        test = evaluate_instances(seg, loaded, [test_data(i) for i in range(TEST_SUBSET_INSTANCES)],
                                  num_clicks=1)
        result = {"model": DEMO_MODEL_NAME, "eval_seed": eval_seed,
                  "eval_data": "jaxseg_robust.data.synthetic default config (TRAIN_SIZES, all families "
                               "and difficulties), samples 0..num_instances-1",
                  "protocol": "jaxseg_robust.models.sam.demo.evaluate_instance", **summary.to_dict(),
                  "test_subset": {"eval_seed": eval_seed, "sizes": [list(s) for s in TEST_SUBSET_SIZES],
                                  "num_instances": TEST_SUBSET_INSTANCES, "iou_click1": test.click1,
                                  "iou_box": test.box},
                  "per_family": _per_family(summary.per_instance),
                  "training": train_info or {}}
        (pathlib.Path(out_dir) / "metrics.json").write_text(json.dumps(result, indent=2) + "\n")
        log(json.dumps(result, indent=2))
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workdir", type=pathlib.Path, required=True,
                        help="checkpoints and log (resumes from workdir/checkpoint.npz)")
    parser.add_argument("--steps", type=int, default=TrainConfig.steps)
    parser.add_argument("--batch-size", type=int, default=TrainConfig.batch_size)
    parser.add_argument("--lr", type=float, default=TrainConfig.learning_rate)
    parser.add_argument("--ckpt-every", type=int, default=100)
    parser.add_argument("--export-only", action="store_true", help="export the latest checkpoint")
    parser.add_argument("--out", type=pathlib.Path, default=WEIGHTS_DIR / DEMO_MODEL_NAME,
                        help="package-data directory to export to")
    parser.add_argument("--eval-instances", type=int, default=200)
    args = parser.parse_args(argv)
    config = TrainConfig(steps=args.steps, batch_size=args.batch_size, learning_rate=args.lr)
    segmenter = SamSegmenter(DEMO_CONFIG)
    args.workdir.mkdir(parents=True, exist_ok=True)
    if args.export_only:
        optimizer = make_optimizer(config)
        like = optimizer.init(segmenter.init(0))
        params, _, step = load_checkpoint(args.workdir / "checkpoint.npz", like)
    else:
        params, _ = train(segmenter, config, workdir=args.workdir, ckpt_every=args.ckpt_every,
                          log=lambda s: print(s, flush=True))
        step = config.steps
    info = {**dataclasses.asdict(config), "steps_done": step, "script": "experiments/train_default_model.py"}
    export(params, args.out, eval_instances=args.eval_instances, train_info=info,
           log=lambda s: print(s, flush=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
