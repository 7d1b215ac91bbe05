"""Benchmark: exact EDT, connected components and the baseline clicker (jaxseg_robust)
vs scipy / OpenCV, on 1024x1024 masks.

Masks (all 1024x1024 bool):
  * ``blobs20`` / ``blobs60``: Gaussian-smoothed noise (sigma 20 / 60 px) > 0,
    many / few medium-size components;
  * ``far_region``: ones except a 10x10 zero block near a corner (the "distance to a
    small region" map of the location loss: distances up to ~1400 px);
  * ``error_map``: XOR of a smooth GT and the same GT shifted by (7, -5) px (thin
    error bands, what the clicker sees after a few clicks);
  * ``davis``: the first DAVIS mask of ../shared/data/real, nearest-resized to 1024x1024
    (skipped when the folder is absent).

Timed, per mask, medians over ``--repeats`` runs, reported in ms/mask with the
ratio ``reference / ours`` (> 1 = ours faster):
  * EDT: ``scipy.ndimage.distance_transform_edt`` vs, for each ``--variant``, one mask
    per jitted call and a ``jax.vmap`` over a batch of ``--batch`` copies (batched
    time divided by the batch size):
      - ``platform``: ``distance_transform_edt``, the algorithm the platform gets
        (rows ``ours jit`` / ``ours vmap``);
      - ``cpu``: ``squared_distance_transform_cpu``, the CPU algorithm (windowed search and
        Meijster's envelope) on whatever platform runs the benchmark (rows ``cpu alg ...``);
      - ``accelerator``: ``squared_distance_transform_accelerator``, the GPU algorithm
        (prefix-scan column pass, blocked brute-force row pass; ``--offset-block``) on
        whatever platform runs the benchmark (rows ``accel ...``).
    The two variant rows time the int32 squared transform, the platform rows the float
    distance. docs/ARCHITECTURE.md (ops) says why the platforms differ; the choice is
    made once, by ``lax.platform_dependent`` in ``jaxseg_robust/ops/distance.py``.
    Before timing, the script prints how many ``while`` loops the StableHLO lowered for
    CUDA and for the CPU keeps for each variant (no GPU needed for that): on a GPU every
    loop iteration is a kernel launch and a predicate copied to the host;
  * CC: ``scipy.ndimage.label`` (4- and 8-connectivity) vs ``label_components``
    (jit, single and vmapped batch) and vs each of its variants forced on this platform
    (``components_variant_rows``: the CPU sweeps, the accelerator's rounds);
  * clicker: one baseline click (two padded EDTs + argmax) re-stated with OpenCV as in
    the RITM code vs ``next_click`` (jit).
Every result is first checked to be identical to the reference (exact squared
distances, identical label maps and clicks).

Run: ``python experiments/benchmarks/bench_distance_components.py [--batch 16]
[--repeats 5] [--cpus N] [--only edt,cc,click] [--variant platform,cpu,accelerator]
[--offset-block N]``. ``--cpus N`` pins the process to N
cores before JAX starts (scipy/OpenCV are single-threaded; XLA splits large loop
bodies over its thread pool, which on a busy machine can cost more than it gains).
For fair CPU timings set the allocator as in docs/benchmarking.md; the
script prints what it ran with. The batch default is 16, not 64: with ``--batch 64``
the process peaked at ~4 GB RSS (the vmapped transforms fold the batch into one
stack of 64M pixels and keep several int32 copies of it); per-mask batched times were
no better than single-mask times on the 2-core CPU.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import platform
import statistics
import sys
import time

MALLOC_VARIABLES = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_")
SIZE = 1024
EDT_VARIANTS = ("platform", "cpu", "accelerator")
REAL_DATA = pathlib.Path(__file__).resolve().parents[2].parent / "shared" / "data" / "real"


def make_masks(size: int = SIZE, seed: int = 0, real_data: pathlib.Path = REAL_DATA) -> dict:
    """Named bool[size, size] numpy masks (see module docstring)."""
    import numpy as np
    import scipy.ndimage as ndi

    rng = np.random.default_rng(seed)
    masks = {
        "blobs20": ndi.gaussian_filter(rng.standard_normal((size, size)), 20) > 0,
        "blobs60": ndi.gaussian_filter(rng.standard_normal((size, size)), 60) > 0,
    }
    far = np.ones((size, size), bool)
    far[20:30, 40:50] = False
    masks["far_region"] = far
    gt = ndi.gaussian_filter(rng.standard_normal((size, size)), 80) > 0.002
    masks["error_map"] = gt ^ np.roll(gt, (7, -5), axis=(0, 1))
    davis = sorted((real_data / "davis" / "masks").glob("*.png"))
    if davis:
        import cv2
        raw = cv2.imread(str(davis[0]), cv2.IMREAD_UNCHANGED)
        fg = raw.reshape(raw.shape[0], raw.shape[1], -1).any(axis=-1).astype(np.uint8)
        masks["davis"] = cv2.resize(fg, (size, size), interpolation=cv2.INTER_NEAREST) > 0
    return masks


def median_ms(fn, repeats: int) -> float:
    """Median wall time of ``fn()`` in milliseconds (one warm-up call first)."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def reference_click(gt, pred, not_clicked):
    """The RITM clicker step with OpenCV (prompt-attacks.md §1)."""
    import cv2
    import numpy as np

    def dt(region):
        padded = np.pad(region, 1).astype(np.uint8)
        return cv2.distanceTransform(padded, cv2.DIST_L2, 0)[1:-1, 1:-1] * not_clicked

    fn_dt, fp_dt = dt(gt & ~pred), dt(~gt & pred)
    positive = fn_dt.max() > fp_dt.max()
    chosen = fn_dt if positive else fp_dt
    row, col = np.unravel_index(np.argmax(chosen), chosen.shape)
    return bool(positive), int(row), int(col)


def edt_variants(names, offset_block: int | None = None) -> dict:
    """{row label: (squared int32 transform, timed transform)} of the chosen ``--variant`` names.

    ``offset_block``: the accelerator row pass's offsets per iteration (None: the library default).
    """
    import functools

    from jaxseg_robust.ops.distance import (DEFAULT_OFFSET_BLOCK, distance_transform_edt,
                                            squared_distance_transform, squared_distance_transform_accelerator,
                                            squared_distance_transform_cpu)

    offset_block = DEFAULT_OFFSET_BLOCK if offset_block is None else offset_block
    accelerator = functools.partial(squared_distance_transform_accelerator, offset_block=offset_block)
    table = {"platform": ("ours", squared_distance_transform, distance_transform_edt),
             "cpu": ("cpu alg", squared_distance_transform_cpu, squared_distance_transform_cpu),
             "accelerator": ("accel", accelerator, accelerator)}
    unknown = [name for name in names if name not in table]
    if unknown:
        raise ValueError(f"--variant: unknown {', '.join(unknown)}; choose from {', '.join(EDT_VARIANTS)}")
    return {table[name][0]: table[name][1:] for name in names}


def while_loop_counts(variants: dict, size: int = SIZE, report=print) -> dict:
    """Reports, per variant, the ``stablehlo.while`` ops of its lowering for CUDA and for the CPU."""
    import jax
    import jax.numpy as jnp

    mask = jax.ShapeDtypeStruct((size, size), jnp.bool_)
    counts = {}
    for label, (squared, _) in variants.items():
        for platform_name in ("cuda", "cpu"):
            text = jax.jit(squared).trace(mask).lower(lowering_platforms=(platform_name,)).as_text()
            counts[(label, platform_name)] = text.count("stablehlo.while")
        report(f"edt {label:<8} while loops in the lowering: cuda {counts[(label, 'cuda')]}, "
               f"cpu {counts[(label, 'cpu')]}")
    return counts


def run_benchmark(batch: int = 16, repeats: int = 5, parts=("edt", "cc", "click"),
                  report=print, variants=("platform", "accelerator"), offset_block: int | None = None) -> dict:
    """Times every part on every mask; returns {(part, mask, impl): ms per mask}."""
    import jax
    import numpy as np
    import scipy.ndimage as ndi

    from jaxseg_robust.ops.components import label_components
    from jaxseg_robust.prompts.clicker import next_click

    masks = make_masks()
    results = {}

    def record(part, name, impl, ms, ref_ms):
        results[(part, name, impl)] = ms
        report(f"{part:<6}{name:<12}{impl:<22}{ms:>10.2f}{ref_ms / ms:>10.2f}")

    if "edt" in parts:
        chosen = edt_variants(variants, offset_block)
        while_loop_counts(chosen, report=report)
    report(f"{'part':<6}{'mask':<12}{'implementation':<22}{'ms/mask':>10}{'ref/ours':>10}")
    if "edt" in parts:
        programs = {label: (jax.jit(squared), jax.jit(timed), jax.jit(jax.vmap(timed)))
                    for label, (squared, timed) in chosen.items()}
        for name, mask in masks.items():
            ref = ndi.distance_transform_edt(mask)
            for label, (squared, _, _) in programs.items():
                if not np.array_equal(np.asarray(squared(mask)), np.rint(ref ** 2)):
                    raise AssertionError(f"EDT mismatch on {name} ({label})")
            ref_ms = median_ms(lambda: ndi.distance_transform_edt(mask), repeats)
            record("edt", name, "scipy", ref_ms, ref_ms)
            stack = np.broadcast_to(mask, (batch,) + mask.shape)
            for label, (_, single, batched) in programs.items():
                record("edt", name, f"{label} jit", median_ms(lambda: single(mask).block_until_ready(), repeats),
                       ref_ms)
                ms = median_ms(lambda: batched(stack).block_until_ready(), max(1, repeats // 2)) / batch
                record("edt", name, f"{label} vmap B={batch}", ms, ref_ms)
    if "cc" in parts:
        for connectivity, structure in ((4, None), (8, np.ones((3, 3), bool))):
            label = jax.jit(lambda m, c=connectivity: label_components(m, c))
            label_batch = jax.jit(jax.vmap(lambda m, c=connectivity: label_components(m, c)))
            for name, mask in masks.items():
                ref, num = ndi.label(mask, structure)
                got, got_num = label(mask)
                if not (np.array_equal(np.asarray(got), ref) and int(got_num) == num):
                    raise AssertionError(f"label mismatch on {name}, connectivity {connectivity}")
                ref_ms = median_ms(lambda: ndi.label(mask, structure), repeats)
                record(f"cc{connectivity}", name, "scipy", ref_ms, ref_ms)
                record(f"cc{connectivity}", name, "ours jit",
                       median_ms(lambda: label(mask)[0].block_until_ready(), repeats), ref_ms)
                stack = np.broadcast_to(mask, (batch,) + mask.shape)
                ms = median_ms(lambda: label_batch(stack)[0].block_until_ready(), max(1, repeats // 2)) / batch
                record(f"cc{connectivity}", name, f"ours vmap B={batch}", ms, ref_ms)
        results.update(components_variant_rows(masks, repeats, report))
    if "click" in parts:
        click = jax.jit(next_click)
        gt = masks["blobs60"]
        rng = np.random.default_rng(1)
        preds = {"empty_pred": np.zeros_like(gt), "shifted_pred": np.roll(gt, (9, -6), axis=(0, 1)),
                 "noisy_pred": gt ^ (rng.random(gt.shape) < 0.01)}
        not_clicked = np.ones_like(gt)
        for name, pred in preds.items():
            got = tuple(int(v) for v in click(gt, pred, not_clicked))
            if got != tuple(int(v) for v in reference_click(gt, pred, not_clicked)):
                raise AssertionError(f"click mismatch on {name}")
            ref_ms = median_ms(lambda: reference_click(gt, pred, not_clicked), repeats)
            record("click", name, "cv2 reference", ref_ms, ref_ms)
            record("click", name, "ours jit",
                   median_ms(lambda: click(gt, pred, not_clicked)[1].block_until_ready(), repeats), ref_ms)
    return results


def describe_environment() -> str:
    """One line: platform, CPUs in use, jax version, allocator variables."""
    import jax

    malloc = {k: os.environ.get(k, "default") for k in MALLOC_VARIABLES}
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return (f"{platform.platform()} | cpus in use {cpus} of {os.cpu_count()} | jax {jax.__version__} "
            f"{jax.devices()[0].platform} | malloc {malloc} | XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}")


def main(argv: list[str] | None = None) -> dict:
    """Parses arguments, runs the benchmark, prints a table; returns the results dict."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--cpus", type=int, default=0, help="pin to this many cores (0 = leave as is)")
    parser.add_argument("--only", default="edt,cc,click", help="comma-separated subset of edt,cc,click")
    parser.add_argument("--variant", default="platform,accelerator",
                        help=f"EDT algorithms to time, comma-separated subset of {','.join(EDT_VARIANTS)}")
    parser.add_argument("--offset-block", type=int, default=None,
                        help="column offsets per row-pass iteration of the accelerator EDT (default: the library's)")
    args = parser.parse_args(argv)
    if args.cpus > 0:
        if "jax" in sys.modules:
            print("warning: jax already imported; --cpus may not limit XLA's thread pool")
        available = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, set(available[: args.cpus]))
    print(describe_environment())
    print(f"masks {SIZE}x{SIZE}, batch {args.batch}, repeats {args.repeats}; times are noisy on a shared machine")
    return run_benchmark(args.batch, args.repeats, tuple(args.only.split(",")),
                         variants=tuple(args.variant.split(",")), offset_block=args.offset_block)


def components_variant_rows(masks: dict, repeats: int, report=print) -> dict:
    """Rows of ``label_components``'s two variants, each forced on this platform (ops/components.py).

    The ``accelerator`` row is what GPUs run; on the CPU it only shows that variant's cost there.
    Its impl column names the rounds it needed (one host-synchronised loop step each on a GPU).
    Both are first checked equal to ``scipy.ndimage.label``. Returns {(part, mask, impl): ms per mask}.
    """
    import jax
    import numpy as np
    import scipy.ndimage as ndi

    from jaxseg_robust.ops.components import accelerator_rounds, label_components_accelerator, label_components_cpu

    results = {}
    for connectivity, structure in ((4, None), (8, np.ones((3, 3), bool))):
        variants = {"cpu variant": jax.jit(lambda m, c=connectivity: label_components_cpu(m, c)),
                    "accelerator variant": jax.jit(lambda m, c=connectivity: label_components_accelerator(m, c))}
        rounds = jax.jit(lambda m, c=connectivity: accelerator_rounds(m, c))
        for name, mask in masks.items():
            ref, num = ndi.label(mask, structure)
            ref_ms = median_ms(lambda: ndi.label(mask, structure), repeats)
            for impl, label in variants.items():
                got, got_num = label(mask)
                if not (np.array_equal(np.asarray(got), ref) and int(got_num) == num):
                    raise AssertionError(f"{impl} label mismatch on {name}, connectivity {connectivity}")
                ms = median_ms(lambda: label(mask)[0].block_until_ready(), repeats)
                if impl == "accelerator variant":
                    impl = f"accel. ({int(rounds(mask))} rounds)"
                results[(f"cc{connectivity}", name, impl)] = ms
                report(f"{'cc' + str(connectivity):<6}{name:<12}{impl:<22}{ms:>10.2f}{ref_ms / ms:>10.2f}")
    return results


if __name__ == "__main__":
    main()
