"""Toy instances and batch functions shared by the runner tests (and their subprocesses).

Not a test module (no ``test_`` prefix). The toy batch function uses padding
and the validity mask everywhere a padding mistake would change a number:

  pred = image[..., 0] <= 127   (true on zero padding, so an unmasked frame shows)
  iou        = |pred & gt==1 & valid| / |(pred | gt==1) & gt>=0 & valid|
  pred_area  = |pred & valid|
  gt_counts  = [|gt==-1 & valid|, |gt==0 & valid|, |gt==1 & valid|]
  mean_red   = mean of image[..., 0] over valid pixels
  seed       = the slot's per-instance seed (must follow the instance into any slot)

`reference_payload` computes the same numbers with NumPy on the unpadded instance.
"""

from __future__ import annotations

import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxseg_robust.data.instances import Instance, make_instance

POISON_RED = 13  # an instance whose image[0, 0, 0] == POISON_RED makes the raising batch fn fail


def toy_instances(count: int, sizes=((7, 9), (12, 5), (7, 9), (4, 4)), seed: int = 0, dataset: str = "toy"):
    """``count`` deterministic instances cycling through ``sizes`` (H, W); gts include ignore pixels."""
    rng = np.random.default_rng(seed)
    instances = []
    for index in range(count):
        height, width = sizes[index % len(sizes)]
        image = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
        image[0, 0, 0] = (image[0, 0, 0] + 1) % 256 if image[0, 0, 0] == POISON_RED else image[0, 0, 0]
        gt = rng.integers(-1, 2, (height, width)).astype(np.int8)
        instances.append(make_instance(f"im{index:03d}", image, gt, dataset=dataset))
    return instances


def poison(instance: Instance) -> Instance:
    """A copy of ``instance`` that the raising batch function fails on."""
    image = instance.image.copy()
    image[0, 0, 0] = POISON_RED
    return Instance(instance.id, image, instance.gt, instance.dataset, instance.source_paths)


def _per_instance(image, gt, valid, seed):
    pred = image[..., 0] <= 127
    obj = gt == 1
    labelled = gt >= 0
    inter = jnp.sum(pred & obj & valid)
    union = jnp.sum((pred | obj) & labelled & valid)
    counts = jnp.stack([jnp.sum((gt == value) & valid) for value in (-1, 0, 1)])
    red = jnp.sum(jnp.where(valid, image[..., 0].astype(jnp.int32), 0))
    return {
        "iou": inter.astype(jnp.float32) / jnp.maximum(union, 1).astype(jnp.float32),
        "pred_area": jnp.sum(pred & valid).astype(jnp.int32),
        "gt_counts": counts.astype(jnp.int32),
        "mean_red": red.astype(jnp.float32) / jnp.sum(valid).astype(jnp.float32),
        "seed": seed,
    }


def make_toy_batch_fn():
    """A fresh jitted toy batch function (own compile cache) and its trace counter ``{"n": traces}``."""
    counter = {"n": 0}

    @jax.jit
    def batch_fn(batch):
        counter["n"] += 1  # runs once per trace
        return jax.vmap(_per_instance)(batch.image, batch.gt, batch.valid, batch.seed)

    return batch_fn, counter


toy_batch_fn, _toy_traces = make_toy_batch_fn()


def make_raising_batch_fn(inner=toy_batch_fn):
    """``inner``, but raising ValueError for a batch holding a valid poisoned instance (host-side check)."""

    def raising(batch):
        red = np.asarray(batch.image[:, 0, 0, 0])
        live = np.asarray(batch.instance_valid)
        if np.any((red == POISON_RED) & live):
            raise ValueError(f"poisoned instance in slots {np.flatnonzero((red == POISON_RED) & live).tolist()}")
        return inner(batch)

    return raising


def make_sleepy_batch_fn(seconds: float):
    """`toy_batch_fn` that checks the batch is spread over all devices and sleeps ``seconds`` per batch."""

    def sleepy(batch):
        devices = batch.image.sharding.device_set
        if len(devices) != jax.device_count():
            raise AssertionError(f"batch on {len(devices)} of {jax.device_count()} devices")
        out = jax.device_get(toy_batch_fn(batch))
        time.sleep(seconds)
        return out

    return sleepy


def reference_payload(instance: Instance) -> dict:
    """The toy outputs computed with NumPy on the unpadded instance (as stored in a record)."""
    image, gt = instance.image, instance.gt
    pred = image[..., 0] <= 127
    inter = np.sum(pred & (gt == 1))
    union = np.sum((pred | (gt == 1)) & (gt >= 0))
    payload = {
        "iou": float(np.float32(inter) / np.float32(max(union, 1))),
        "pred_area": int(pred.sum()),
        "gt_counts": [int(np.sum(gt == v)) for v in (-1, 0, 1)],
        "mean_red": float(np.float32(image[..., 0].astype(np.int64).sum()) / np.float32(gt.size)),
        "seed": _seed(instance),
    }
    return payload


def _seed(instance: Instance) -> int:
    from jaxseg_robust.data.buckets import instance_seed  # noqa: PLC0415

    return instance_seed(instance.key)


def main(argv: list[str]) -> int:
    """Subprocess entry: ``python runner_toy.py RUN_DIR COUNT BATCH SLEEP_S`` runs the toy evaluation."""
    from jaxseg_robust.runner.engine import run  # noqa: PLC0415

    run_dir, count, batch_size, sleep_s = argv[0], int(argv[1]), int(argv[2]), float(argv[3])
    instances = toy_instances(count)
    batch_fn = make_sleepy_batch_fn(sleep_s)
    summary = run(instances, batch_fn, run_dir, batch_size, config={"toy": 1}, progress="none")
    print(f"DEVICES {jax.device_count()}")
    print(summary)
    return summary.exit_code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
