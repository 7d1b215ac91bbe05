"""Benchmark: RClicks ground-truth maps and clicking-group sampling (jaxseg_robust.clicksim) vs numpy/OpenCV/scipy.

On a TETRIS-sized frame (default 1365 x 2048, sigma 5 -> sigma_px 5.59, soft-mask
sigma 17, i.e. a 137-tap scipy kernel) with ``--clicks`` clicks:
  * GT clickability map: ``gt_clickability_map`` under ``jax.jit`` vs the reference
    re-stated (impulses + ``cv2.GaussianBlur`` + ``scipy.ndimage.gaussian_filter``);
  * soft error mask alone, ablation: the library's banded-matrix products vs a
    direct single-channel ``lax.conv_general_dilated`` (both separable), vs scipy;
  * one click per group for the 10 groups on one map: ``sample_group_clicks`` vs
    the reference clicker's numpy band rule (sort, cumsum, searchsorted,
    ``np.random.choice``) run 10 times; ablation: XLA sort of float32 keys vs
    the int32 bit patterns ``band_thresholds`` sorts.
Every pair is first checked to agree (maps to 2e-6; bands exactly). Times are
medians over ``--repeats`` runs in ms, with ``reference / ours`` ratios (> 1 =
faster than the reference). Other processes share the CPU: compare ratios from
one run, not absolute times across runs.

Run: ``python experiments/benchmarks/bench_clicksim.py [--height 1365 --width 2048 --clicks 64 --repeats 5]``.
For fair CPU timings set the allocator as in docs/benchmarking.md
(``MALLOC_MMAP_THRESHOLD_=4294967296 MALLOC_TRIM_THRESHOLD_=68719476736
MALLOC_TOP_PAD_=1073741824``); the script prints what it ran with.
"""

from __future__ import annotations

import argparse
import math
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

from jaxseg_robust.clicksim import clickability as C
from jaxseg_robust.clicksim import groups as G

MALLOC_VARIABLES = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_")


def median_ms(function, repeats: int) -> float:
    function()  # warm-up (compilation)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def make_task(height: int, width: int, clicks: int, seed: int = 0):
    """Elliptic error mask with a soft band and clicks clustered inside it."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[:height, :width].astype(np.float32)
    radius = ((yy - 0.5 * height) / (0.3 * height)) ** 2 + ((xx - 0.45 * width) / (0.25 * width)) ** 2
    error = np.clip(1.5 - radius, 0.0, 1.0).astype(np.float32)
    xs = np.clip(rng.normal(0.45 * width, 0.08 * width, clicks), 0, width - 1).astype(np.int32)
    ys = np.clip(rng.normal(0.5 * height, 0.1 * height, clicks), 0, height - 1).astype(np.int32)
    return error, np.stack([xs, ys], axis=1)


def reference_gt_map(points: np.ndarray, error: np.ndarray, sigma: float) -> np.ndarray:
    height, width = error.shape
    sigma_px = C.scaled_sigma(sigma, height, width)
    impulses = np.zeros((height, width), np.float32)
    for x, y in points:
        impulses[y, x] += 255 * 2 * math.pi * sigma_px ** 2 / len(points)
    size = C.opencv_kernel_size(sigma_px)
    blurred = cv2.GaussianBlur(impulses, (size, size), sigmaX=sigma_px, sigmaY=sigma_px,
                               borderType=cv2.BORDER_CONSTANT)
    return ndi.gaussian_filter(error, sigma=C.soft_mask_sigma(height, width)) * (blurred / blurred.max())


def conv_soft_mask(error: jax.Array, sigma: float) -> jax.Array:
    """Ablation: the same separable reflect-border blur as two direct 1-channel convolutions."""
    kernel = jnp.asarray(C.scipy_gaussian_kernel(sigma), jnp.float32)
    radius = (kernel.shape[0] - 1) // 2
    out = error
    for axis in (0, 1):
        size = out.shape[axis]
        position = np.arange(-radius, size + radius) % (2 * size)
        index = np.where(position >= size, 2 * size - 1 - position, position)
        padded = jnp.take(out, jnp.asarray(index), axis=axis)
        rhs = kernel.reshape((-1, 1, 1, 1)) if axis == 0 else kernel.reshape((1, -1, 1, 1))
        out = lax.conv_general_dilated(padded[None, :, :, None], rhs, (1, 1), "VALID",
                                       dimension_numbers=("NHWC", "HWIO", "NHWC"),
                                       precision=lax.Precision.HIGHEST)[0, :, :, 0]
    return out


def reference_group_clicks(clickability: np.ndarray, bounds: np.ndarray, rng: np.random.Generator):
    """The reference clicker's band rule and draw, once per group (numpy, float32 map)."""
    clicks, bands = [], []
    for q_low, q_high in bounds:
        ordered = np.sort(clickability.ravel())
        cumulative = ordered.cumsum()
        total = ordered.sum()
        low = ordered[min(cumulative.searchsorted(total * q_low, side="left"), ordered.size - 1)]
        high = ordered[min(cumulative.searchsorted(total * q_high, side="right"), ordered.size - 1)]
        band = clickability * (clickability >= low) * (clickability <= high)
        probabilities = (band / band.sum()).ravel()
        clicks.append(np.unravel_index(rng.choice(probabilities.size, p=probabilities), clickability.shape))
        bands.append((low, high))
    return clicks, np.array(bands)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--height", type=int, default=1365)
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--clicks", type=int, default=64)
    parser.add_argument("--sigma", type=float, default=5.0)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    print(f"jax {jax.__version__} ({jax.default_backend()}), numpy {np.__version__}, cv2 {cv2.__version__}, "
          f"{platform.processor() or platform.machine()}, {os.cpu_count()} cpus")
    print("allocator:", {name: os.environ.get(name, "default") for name in MALLOC_VARIABLES})
    error, points = make_task(args.height, args.width, args.clicks)
    soft_sigma = C.soft_mask_sigma(args.height, args.width)
    print(f"frame {args.height}x{args.width}, {args.clicks} clicks, sigma {args.sigma} "
          f"(sigma_px {C.scaled_sigma(args.sigma, args.height, args.width):.3f}), soft-mask sigma {soft_sigma:g}")

    ours_map = jax.jit(lambda p, e: C.gt_clickability_map(p, None, e, sigma=args.sigma))
    reference = reference_gt_map(points, error, args.sigma)
    np.testing.assert_allclose(np.asarray(ours_map(points, error)), reference, atol=2e-6)
    t_ours = median_ms(lambda: ours_map(points, error).block_until_ready(), args.repeats)
    t_ref = median_ms(lambda: reference_gt_map(points, error, args.sigma), args.repeats)
    print(f"GT map        ours {t_ours:9.1f} ms   reference (cv2+scipy) {t_ref:9.1f} ms   ratio {t_ref / t_ours:6.2f}")

    error_j = jnp.asarray(error)
    matmul = jax.jit(lambda e: C.soft_error_mask(e, soft_sigma))
    conv = jax.jit(lambda e: conv_soft_mask(e, soft_sigma))
    expected = ndi.gaussian_filter(error, soft_sigma)
    np.testing.assert_allclose(np.asarray(matmul(error_j)), expected, atol=2e-6)
    np.testing.assert_allclose(np.asarray(conv(error_j)), expected, atol=2e-6)
    t_matmul = median_ms(lambda: matmul(error_j).block_until_ready(), args.repeats)
    t_conv = median_ms(lambda: conv(error_j).block_until_ready(), max(1, args.repeats // 2))
    t_scipy = median_ms(lambda: ndi.gaussian_filter(error, soft_sigma), args.repeats)
    print(f"soft mask     banded matmul {t_matmul:9.1f} ms   direct conv {t_conv:9.1f} ms   scipy {t_scipy:9.1f} ms"
          f"   scipy/matmul {t_scipy / t_matmul:6.2f}   conv/matmul {t_conv / t_matmul:6.2f}")

    clickability = np.asarray(ours_map(points, error))
    bounds = G.group_bounds()
    band = G.band_thresholds(clickability, bounds[:, 0], bounds[:, 1])
    _, reference_bands = reference_group_clicks(clickability, bounds, np.random.default_rng(0))
    ours_bands = np.stack([np.asarray(band.low), np.asarray(band.high)], 1)
    ordered = np.sort(clickability.ravel())
    shift = np.abs(np.searchsorted(ordered, ours_bands) - np.searchsorted(ordered, reference_bands)).max()
    moved = sum(np.sum(((clickability >= lo) & (clickability <= hi)) != ((clickability >= rlo) & (clickability <= rhi)))
                for (lo, hi), (rlo, rhi) in zip(ours_bands, reference_bands))
    print(f"group bands: {np.sum(ours_bands == reference_bands)}/20 thresholds equal to the numpy reference; "
          f"others within {shift} sorted entries; {moved} pixel-group memberships differ in total "
          f"(of {clickability.size * 10}); float32 cumulative-sum rounding, see groups.py")
    sample = jax.jit(G.sample_group_clicks)
    key = jax.random.PRNGKey(0)
    t_ours = median_ms(lambda: jax.block_until_ready(sample(key, clickability, bounds, clickability)), args.repeats)
    rng = np.random.default_rng(0)
    t_ref = median_ms(lambda: reference_group_clicks(clickability, bounds, rng), max(1, args.repeats // 2))
    print(f"10 groups     ours {t_ours:9.1f} ms   reference (numpy) {t_ref:9.1f} ms   ratio {t_ref / t_ours:6.2f}")

    flat = jnp.asarray(clickability.ravel())
    sort_float = jax.jit(jnp.sort)
    sort_bits = jax.jit(lambda v: lax.bitcast_convert_type(
        jnp.sort(lax.bitcast_convert_type(v, jnp.int32)), jnp.float32))
    np.testing.assert_array_equal(np.asarray(sort_bits(flat)), np.asarray(sort_float(flat)))
    t_float = median_ms(lambda: sort_float(flat).block_until_ready(), args.repeats)
    t_bits = median_ms(lambda: sort_bits(flat).block_until_ready(), args.repeats)
    print(f"sort ablation float32 keys {t_float:9.1f} ms   int32 bit keys {t_bits:9.1f} ms   ratio {t_float / t_bits:6.2f}")


if __name__ == "__main__":
    main()
