"""Benchmark: jitted Boundary IoU (jaxseg_robust) vs the official OpenCV pipeline and scipy.

Pairs of 1024x1024 masks (d = round(0.02 * 1024 * sqrt 2) = 29 px) are scored
  * by ``jaxseg_robust.metrics.masks.boundary_iou`` under ``jax.jit``, one pair
    per call and as one vmapped batch (default B = 64);
  * by the official pipeline re-stated with OpenCV (1-px zero pad, ``cv2.erode``
    3x3 with ``iterations=d``, crop, subtract; the RITM wrapper's counting),
    one pair at a time - reference figure on the project CPU: ~2.1 ms/pair;
  * by a scipy variant (separable ``minimum_filter`` with a zero border), on a
    few pairs only.
Every implementation is first checked to give the same BIoU on every pair.
Times are medians over ``--repeats`` runs, reported in ms per pair, with the
ratio ``cv2 time / time`` (> 1 = faster than OpenCV). ``--ablation`` adds two
unpacked (one byte per pixel) JAX variants of the erosion: the doubling scheme
and a van Herk / Gil-Werman block scan via ``lax.associative_scan``, which is
why the library uses bit-packed doubling (see jaxseg_robust/ops/morphology.py).

Run: ``python experiments/benchmarks/bench_boundary_iou.py [--batch 64] [--repeats 5] [--ablation]``.
For fair CPU timings set the allocator as in docs/benchmarking.md
(``MALLOC_MMAP_THRESHOLD_=4294967296 MALLOC_TRIM_THRESHOLD_=68719476736
MALLOC_TOP_PAD_=1073741824``); the script prints what it ran with.
"""

from __future__ import annotations

import argparse
import functools
import os
import platform
import statistics
import time

import cv2
import jax
import jax.numpy as jnp
import numpy as np
import scipy.ndimage as ndi
from jax import lax

from jaxseg_robust.metrics.masks import boundary_iou, boundary_width

SIZE = 1024
MALLOC_VARIABLES = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_")


# ---- data -------------------------------------------------------------------------------

def make_pairs(batch: int, size: int = SIZE, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(gt, pred) bool[batch, size, size]: unions of random ellipses; pred = GT shifted, with boundary noise."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[:size, :size].astype(np.float32)
    gts, preds = [], []
    for _ in range(batch):
        gt = np.zeros((size, size), bool)
        for _ in range(rng.integers(1, 4)):
            cy, cx = rng.uniform(0.1, 0.9, 2) * size
            ry, rx = rng.uniform(0.05, 0.3, 2) * size
            gt |= ((yy - cy) / ry) ** 2 + ((xx - cx) / rx) ** 2 <= 1.0
        dy, dx = rng.integers(-12, 13, 2)
        pred = np.roll(gt, (int(dy), int(dx)), axis=(0, 1))
        noise = rng.random((size // 16, size // 16)) < 0.1
        pred ^= np.kron(noise, np.ones((16, 16), bool)) & (gt ^ pred)
        gts.append(gt)
        preds.append(pred)
    return np.stack(gts), np.stack(preds)


# ---- references --------------------------------------------------------------------------

def cv2_boundary(mask: np.ndarray, d: int) -> np.ndarray:
    """Official ``mask_to_boundary`` re-stated with OpenCV (uint8 in, uint8 {0,1} out)."""
    mask = mask.astype(np.uint8)
    padded = cv2.copyMakeBorder(mask, 1, 1, 1, 1, cv2.BORDER_CONSTANT, value=0)
    eroded = cv2.erode(padded, np.ones((3, 3), np.uint8), iterations=d)[1:-1, 1:-1]
    return mask - eroded


def cv2_boundary_iou(gt: np.ndarray, pred: np.ndarray, d: int) -> float:
    """RITM-wrapper Boundary IoU on the OpenCV boundaries."""
    boundary_gt, boundary_pred = cv2_boundary(gt, d), cv2_boundary(pred, d)
    inter = np.count_nonzero(boundary_gt & boundary_pred)
    union = np.count_nonzero(boundary_gt | boundary_pred)
    return inter / union if union else float("nan")


def scipy_boundary_iou(gt: np.ndarray, pred: np.ndarray, d: int) -> float:
    """The same with scipy's separable minimum filter and a zero border."""
    size = 2 * d + 1
    boundary_gt = gt & ~ndi.minimum_filter(gt, size, mode="constant", cval=0)
    boundary_pred = pred & ~ndi.minimum_filter(pred, size, mode="constant", cval=0)
    inter = np.count_nonzero(boundary_gt & boundary_pred)
    union = np.count_nonzero(boundary_gt | boundary_pred)
    return inter / union if union else float("nan")


# ---- ablation: unpacked (uint8) JAX erosions ----------------------------------------------

def _doubling_min(x, radius: int, axis: int):
    axis %= x.ndim
    n, window = x.shape[axis], 2 * radius + 1
    pad = [(0, 0)] * x.ndim
    pad[axis] = (radius, radius)
    m = jnp.pad(x, pad)
    span = 1
    while 2 * span <= window:
        size = m.shape[axis]
        m = jnp.minimum(lax.slice_in_dim(m, 0, size - span, axis=axis), lax.slice_in_dim(m, span, size, axis=axis))
        span *= 2
    return jnp.minimum(lax.slice_in_dim(m, 0, n, axis=axis),
                       lax.slice_in_dim(m, window - span, window - span + n, axis=axis))


def _van_herk_min(x, radius: int, axis: int):
    axis %= x.ndim
    n, window = x.shape[axis], 2 * radius + 1
    length = -(-(n + 2 * radius) // window) * window
    pad = [(0, 0)] * x.ndim
    pad[axis] = (radius, length - n - radius)
    padded = jnp.pad(x, pad)
    blocks = padded.reshape(x.shape[:axis] + (length // window, window) + x.shape[axis + 1:])
    prefix = lax.associative_scan(jnp.minimum, blocks, axis=axis + 1).reshape(padded.shape)
    suffix = lax.associative_scan(jnp.minimum, blocks, axis=axis + 1, reverse=True).reshape(padded.shape)
    return jnp.minimum(lax.slice_in_dim(suffix, 0, n, axis=axis),
                       lax.slice_in_dim(prefix, window - 1, window - 1 + n, axis=axis))


def _unpacked_boundary_iou(gt, pred, d: int, min_filter):
    def boundary(mask):
        eroded = min_filter(min_filter(mask.astype(jnp.uint8), d, -2), d, -1)
        return mask & (eroded == 0)

    boundary_gt, boundary_pred = boundary(gt), boundary(pred)
    inter = jnp.sum(boundary_gt & boundary_pred, axis=(-2, -1))
    union = jnp.sum(boundary_gt | boundary_pred, axis=(-2, -1))
    return inter / union


# ---- timing ---------------------------------------------------------------------------------

def median_seconds(fn, repeats: int) -> float:
    """Median wall time of ``fn()`` over ``repeats`` runs (after one warm-up call)."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def run_benchmark(batch: int = 64, repeats: int = 5, scipy_pairs: int = 4, ablation: bool = False,
                  size: int = SIZE) -> dict[str, float]:
    """Checks every implementation against OpenCV, then times them.

    Returns:
      {name: milliseconds per pair}; names: cv2, scipy, jax_single, jax_batched
      (+ ablation_doubling_u8, ablation_van_herk_u8 with ``ablation``).
    """
    d = boundary_width(size, size)
    gt, pred = make_pairs(batch, size)
    gt_device, pred_device = jax.device_put(gt), jax.device_put(pred)
    reference = np.array([cv2_boundary_iou(gt[i], pred[i], d) for i in range(batch)])

    single = jax.jit(boundary_iou)
    batched = jax.jit(jax.vmap(boundary_iou))
    np.testing.assert_allclose(np.asarray(batched(gt_device, pred_device)), reference, rtol=1e-6)
    np.testing.assert_allclose(float(single(gt_device[0], pred_device[0])), reference[0], rtol=1e-6)
    scipy_reference = [scipy_boundary_iou(gt[i], pred[i], d) for i in range(scipy_pairs)]
    np.testing.assert_allclose(scipy_reference, reference[:scipy_pairs], rtol=1e-12)

    results = {
        "cv2": median_seconds(lambda: [cv2_boundary_iou(gt[i], pred[i], d) for i in range(batch)], repeats) / batch,
        "scipy": median_seconds(lambda: [scipy_boundary_iou(gt[i], pred[i], d) for i in range(scipy_pairs)],
                                max(1, repeats // 2)) / scipy_pairs,
        "jax_single": median_seconds(
            lambda: [single(gt_device[i], pred_device[i]).block_until_ready() for i in range(batch)], repeats) / batch,
        "jax_batched": median_seconds(lambda: batched(gt_device, pred_device).block_until_ready(), repeats) / batch,
    }
    if ablation:
        for name, min_filter in (("ablation_doubling_u8", _doubling_min), ("ablation_van_herk_u8", _van_herk_min)):
            fn = jax.jit(jax.vmap(functools.partial(_unpacked_boundary_iou, d=d, min_filter=min_filter)))
            np.testing.assert_allclose(np.asarray(fn(gt_device, pred_device)), reference, rtol=1e-6)
            results[name] = median_seconds(lambda: fn(gt_device, pred_device).block_until_ready(), repeats) / batch
    return {name: seconds * 1e3 for name, seconds in results.items()}


def describe_environment() -> str:
    """One line: devices, CPU count, library versions and the MALLOC_* settings."""
    malloc = ", ".join(f"{name}={os.environ.get(name, 'unset')}" for name in MALLOC_VARIABLES)
    return (f"jax {jax.__version__} on {jax.devices()[0].platform} ({os.cpu_count()} CPUs, {platform.machine()}), "
            f"opencv {cv2.__version__} ({cv2.getNumThreads()} threads), numpy {np.__version__}; {malloc}")


def main(argv: list[str] | None = None) -> dict[str, float]:
    """Parses arguments, runs the benchmark, prints a table; returns {name: ms per pair}."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=64, help="pairs per batch (default %(default)s)")
    parser.add_argument("--repeats", type=int, default=5, help="timed repetitions (default %(default)s)")
    parser.add_argument("--scipy-pairs", type=int, default=4, help="pairs timed with scipy (default %(default)s)")
    parser.add_argument("--size", type=int, default=SIZE, help="mask side in pixels (default %(default)s)")
    parser.add_argument("--ablation", action="store_true", help="also time unpacked doubling / van Herk erosions")
    args = parser.parse_args(argv)
    print(describe_environment())
    print(f"masks {args.size}x{args.size}, d = {boundary_width(args.size, args.size)} px, batch {args.batch}, "
          f"median of {args.repeats}")
    results = run_benchmark(args.batch, args.repeats, args.scipy_pairs, args.ablation, args.size)
    print(f"{'implementation':<24}{'ms/pair':>10}{'cv2/x':>9}")
    for name, milliseconds in results.items():
        print(f"{name:<24}{milliseconds:>10.3f}{results['cv2'] / milliseconds:>9.2f}")
    return results


if __name__ == "__main__":
    main()
