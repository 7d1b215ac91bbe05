"""Attack iterations per second: our jitted DAG / PDPGD / ALMA prox vs adv-lib 0.2.8, same model, one process.

Usage (tuned allocator, as docs/benchmarking.md recommends; the script records it):

    MALLOC_MMAP_THRESHOLD_=4294967296 MALLOC_TRIM_THRESHOLD_=68719476736 \\
    MALLOC_TOP_PAD_=1073741824 python experiments/benchmarks/bench_perturb.py \\
        --models u2netp,deeplabv3 --batch 2 --size 96 --iterations 10

Models (``experiments/perturb_reference.py``): the real U²-Net-p (2 classes, so no ALMA prox)
and torchvision DeepLabV3-ResNet50 with random weights, each the same function of the same
weights on both sides. Every attack runs exactly ``--iterations`` iterations on both sides
(DAG's success threshold is set above 1 so neither side stops early; PDPGD and ALMA prox always
run their budget). Ours is compiled first (one warm-up call with the same static budget, compile
time reported separately), adv-lib gets one short warm-up call; then each side is timed over
``--repeats`` calls (median). Reported: iterations/s of each side and the ratio ours / adv-lib
(> 1: ours is faster), plus, for context, one forward+backward pass of the bare model on each side
outside any attack loop (ours jitted, torch eager).

Known CPU effect (measured, see the report): XLA:CPU runs the input-gradient convolution of a
Flax ``nn.Conv`` about 3-4x slower inside ``lax.while_loop``/``fori_loop`` than outside (it lowers
it with a kernel layout it cannot re-layout inside the loop; tests/perturb_toy.py works around it
with a custom VJP that writes the transposed convolution explicitly). The dense models use plain
``nn.Conv`` (models/dense/layers.py), so the attack loops pay that factor on CPU; the
"model fwd+bwd" rows show the per-iteration cost a fix would approach. GPUs are not affected.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import platform
import statistics
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import perturb_reference as ref  # noqa: E402
from jaxseg_robust.attacks.perturb import alma_prox, dag, pdpgd  # noqa: E402

TUNED_MALLOC = {"MALLOC_MMAP_THRESHOLD_": "4294967296", "MALLOC_TRIM_THRESHOLD_": "68719476736",
                "MALLOC_TOP_PAD_": "1073741824"}
NEVER = 1.01  # success threshold no image can reach: every iteration runs on both sides


def _median_seconds(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def ours_call(pair: ref.ModelPair, attack: str, iterations: int, x, y, m, epsilon: float):
    """A zero-argument callable running our attack to completion (blocks on the result)."""
    apply = pair.model.apply
    if attack == "dag":
        run = lambda: dag(apply, pair.params, x, y, m, gamma=0.003, max_iterations=iterations, threshold=NEVER,
                          epsilon=epsilon)
    elif attack == "pdpgd":
        run = lambda: pdpgd(apply, pair.params, x, y, m, num_steps=iterations, threshold=NEVER, epsilon=epsilon)
    else:
        run = lambda: alma_prox(apply, pair.params, x, y, m, num_steps=iterations, threshold=NEVER,
                                epsilon=epsilon)
    return lambda: jax.block_until_ready(run().images)


def advlib_call(pair: ref.ModelPair, attack: str, iterations: int, x, y, m):
    """A zero-argument callable running adv-lib's attack (same budget, no early success)."""
    import torch

    segmentation = ref.import_advlib_segmentation()
    xt = torch.from_numpy(np.ascontiguousarray(np.asarray(x).transpose(0, 3, 1, 2)))
    yt, mt = torch.from_numpy(np.array(y, np.int64)), torch.from_numpy(np.array(m, bool))
    if attack == "dag":
        return lambda: segmentation.dag(pair.torch_model, xt, yt, masks=mt, max_iter=iterations, γ=0.003,
                                        adv_threshold=NEVER)
    if attack == "pdpgd":
        return lambda: segmentation.pdpgd(pair.torch_model, xt, yt, norm=float("inf"), masks=mt,
                                          num_steps=iterations, primal_lr=0.01, adv_threshold=NEVER)
    return lambda: segmentation.alma_prox(pair.torch_model, xt, yt, masks=mt, num_steps=iterations, lr_init=1e-4,
                                          adv_threshold=NEVER)


def model_pass_seconds(pair: ref.ModelPair, x, repeats: int) -> tuple[float, float]:
    """(ours jitted, torch eager) seconds of one forward + input-gradient pass of the bare model."""
    import torch

    grad = jax.jit(jax.grad(lambda images: jnp.sum(pair.model.apply(pair.params, images)[..., 0])))
    jax.block_until_ready(grad(x))
    ours = _median_seconds(lambda: jax.block_until_ready(grad(x)), repeats)
    xt = torch.from_numpy(np.ascontiguousarray(np.asarray(x).transpose(0, 3, 1, 2)))

    def torch_pass():
        leaf = xt.clone().requires_grad_(True)
        torch.autograd.grad(pair.torch_model(leaf)[:, 0].sum(), leaf)

    torch_pass()
    return ours, _median_seconds(torch_pass, repeats)


def main(argv: list[str] | None = None) -> list[dict]:
    """Parses flags, runs the benchmark, prints the table; returns its rows."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="u2netp,deeplabv3", help="comma list of u2netp, deeplabv3")
    parser.add_argument("--attacks", default="dag,pdpgd,alma_prox", help="comma list of dag, pdpgd, alma_prox")
    parser.add_argument("--batch", type=int, default=2, help="images per attack call")
    parser.add_argument("--size", type=int, default=96, help="image side (square, pixels)")
    parser.add_argument("--iterations", type=int, default=10, help="attack iterations per call")
    parser.add_argument("--repeats", type=int, default=3, help="timed calls per side (median)")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--data", default=str(ref.DEFAULT_REAL_DATA), help="shared real data (random images if absent)")
    args = parser.parse_args(argv)
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    malloc = {k: os.environ.get(k, "(default)") for k in TUNED_MALLOC}
    print(f"python {platform.python_version()}, jax {jax.__version__} ({jax.default_backend()}), torch "
          f"{torch.__version__} ({torch.get_num_threads()} threads), {os.cpu_count()} CPUs; malloc {malloc}"
          + ("" if all(os.environ.get(k) == v for k, v in TUNED_MALLOC.items())
             else "  [not the tuned allocator of BENCHMARKING.md]"), flush=True)
    try:
        images = ref.real_batch(args.data, max(1, -(-args.batch // 4)), args.size).images[:args.batch]
    except FileNotFoundError:
        images = np.random.default_rng(0).random((args.batch, args.size, args.size, 3)).astype(np.float32)
    if images.shape[0] < args.batch:
        images = np.concatenate([images] * args.batch)[:args.batch]
    epsilon = 8 / 255
    rows = []
    for name in [n.strip() for n in args.models.split(",") if n.strip()]:
        pair = ref.model_pair(name)
        # Labels: the model's clean prediction (the attacked work is the same for any labels).
        batch = ref.with_model_labels(pair, ref.Batch(images, np.zeros(images.shape[:3], np.int32),
                                                      np.ones(images.shape[:3], bool), ()))
        y, m = ref.targets(pair, batch)
        x = jnp.asarray(batch.images)
        ours_pass, torch_pass = model_pass_seconds(pair, x, args.repeats)
        rows.append({"model": name, "attack": "model fwd+bwd", "ours_it_s": 1 / ours_pass,
                     "advlib_it_s": 1 / torch_pass, "ratio": torch_pass / ours_pass, "compile_s": float("nan")})
        print(f"  {name} model fwd+bwd: ours {ours_pass * 1e3:.0f} ms, torch {torch_pass * 1e3:.0f} ms", flush=True)
        for attack in [a.strip() for a in args.attacks.split(",") if a.strip()]:
            if attack == "alma_prox" and pair.num_classes < 3:
                continue
            ours = ours_call(pair, attack, args.iterations, x, jnp.asarray(y), jnp.asarray(m), epsilon)
            start = time.perf_counter()
            ours()
            compile_s = time.perf_counter() - start
            ours_s = _median_seconds(ours, args.repeats)
            advlib_call(pair, attack, 2, x, y, m)()  # warm-up (allocator, kernels)
            theirs_s = _median_seconds(advlib_call(pair, attack, args.iterations, x, y, m), args.repeats)
            row = {"model": name, "attack": attack, "ours_it_s": args.iterations / ours_s,
                   "advlib_it_s": args.iterations / theirs_s, "ratio": theirs_s / ours_s,
                   "compile_s": compile_s - ours_s}
            rows.append(row)
            print(f"  {name} {attack}: ours {row['ours_it_s']:.2f} it/s, adv-lib {row['advlib_it_s']:.2f} it/s, "
                  f"ratio {row['ratio']:.2f} (compile {row['compile_s']:.0f} s)", flush=True)
    print(f"\nbatch {args.batch} x {args.size}x{args.size}, {args.iterations} iterations, median of {args.repeats}")
    print("| model | attack | ours it/s | adv-lib it/s | ours / adv-lib | our compile s |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['attack']} | {r['ours_it_s']:.2f} | {r['advlib_it_s']:.2f} | {r['ratio']:.2f} | "
              f"{r['compile_s']:.0f} |")
    return rows


if __name__ == "__main__":
    main()
