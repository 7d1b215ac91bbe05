"""BREPS box attack throughput: our batched JAX attack vs a reference loop as the BREPS code runs it.

Usage (tuned allocator, as docs/benchmarking.md recommends; the script records it):

    MALLOC_MMAP_THRESHOLD_=4294967296 MALLOC_TRIM_THRESHOLD_=68719476736 \\
    MALLOC_TOP_PAD_=1073741824 python experiments/benchmarks/bench_breps.py \\
        --instances 8 --size 480 640

Quick check: ``--instances 2 --size 240 320 --steps 10``.

Both sides use the same model: the official segment-anything ViT-B built
without a checkpoint, every tensor overwritten with seeded random values and
converted in-process with our port (`bench_sam.randomize_` + `ports.sam.convert_sam`,
the same weights `bench_sam.py` uses), in one process, on the same generated
instances (an elliptic object on a noisy image of ``--size``; random weights
make the IoUs meaningless, the work per step is what is measured).

Reference (``torch``): one instance at a time, as C-B ``forward_optimizable_bbox``
does it (spec prompt-attacks.md §4): the image embedding computed once per
image under ``no_grad`` (the box loop re-uses it), then ``--steps`` iterations
of: official ``prompt_encoder(boxes=b)`` -> ``mask_decoder(multimask_output=True)``
-> ``postprocess_masks`` to the image size -> argmax of the predicted IoU ->
``P = sigmoid`` -> loss ``s * Dice(P, G) - lambda * Gamma(k, 1/theta).log_prob(X)``
with ``X = nan_to_num(torchvision complete_box_iou_loss(relu(b), B*_r))`` (the
realism term skipped at X == 0), selection IoU and Boundary IoU of ``P > 0.5``
on the host (NumPy + OpenCV erosion, as the reference's metrics), best-iterate
bookkeeping, then ``torch.optim.Adam`` step with autograd (lr scaled by the image
diagonal). Both sides get the same preprocessed float model input (our
``SamSegmenter.preprocess``, the attacks' antialiased float path), so the
embeddings agree and the first iterate (tight box) can be cross-checked.

Ours (``jax``): the embedding per image with the jitted ``embed`` (one image
per call, as the CLI's memory-bounded setting on CPU would), then the whole
batch of B instances attacked in ONE jitted call
(`jaxseg_robust.attacks.boxes.breps_attack` vmapped over instances, the
steps a ``lax.scan`` of Optax Adam); ``--minmax`` also times MIN and MAX together
on one embedding (`breps_attack_min_max`), reported per attack.

Encoder time is reported separately from the attack loop; the headline ratio
is the attack loop per instance (reference / ours; target >= 1.5 on CPU). The
compile time of our attack program is reported separately too (paid once per
bucket shape in a run). Other processes share this machine: numbers are noisy.
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import pathlib
import platform
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import bench_sam  # noqa: E402

GAMMA_K = 1.7891955953866256
GAMMA_THETA = 0.12104836378138935


# ---- instances ---------------------------------------------------------------------------

def make_instances(count: int, height: int, width: int, seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    """``count`` (uint8[H, W, 3] image, int8[H, W] gt) pairs: an ellipse on a noisy background."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[:height, :width]
    out = []
    for _ in range(count):
        cy, cx = rng.uniform(0.3, 0.7) * height, rng.uniform(0.3, 0.7) * width
        ry, rx = rng.uniform(0.12, 0.3) * height, rng.uniform(0.12, 0.3) * width
        gt = (((yy - cy) / ry) ** 2 + ((xx - cx) / rx) ** 2 <= 1).astype(np.int8)
        image = rng.integers(0, 80, (height, width, 3)).astype(np.uint8)
        image[gt == 1] += np.uint8(120)
        out.append((image, gt))
    return out


def tight_box(mask: np.ndarray) -> np.ndarray:
    """Inclusive tight box (x1, y1, x2, y2) of a non-empty bool mask."""
    rows, cols = np.flatnonzero(mask.any(1)), np.flatnonzero(mask.any(0))
    return np.array([cols[0], rows[0], cols[-1], rows[-1]], np.float32)


# ---- the reference loop (torch) ----------------------------------------------------------------

def boundary(mask: np.ndarray, width: int) -> np.ndarray:
    """Official Boundary IoU band: mask minus its zero-padded 3x3 erosion iterated ``width`` times."""
    import cv2  # noqa: PLC0415

    padded = cv2.copyMakeBorder(mask.astype(np.uint8), 1, 1, 1, 1, cv2.BORDER_CONSTANT, value=0)
    eroded = cv2.erode(padded, np.ones((3, 3), np.uint8), iterations=width)[1:-1, 1:-1]
    return (mask.astype(np.uint8) - eroded) > 0


def selection_scores(pred: np.ndarray, target: np.ndarray, width: int) -> tuple[float, float]:
    """(IoU, Boundary IoU) of bool masks, 0 on an empty union (the reference's numba metrics)."""
    def ratio(a, b):
        union = np.logical_or(a, b).sum()
        return float(np.logical_and(a, b).sum() / union) if union else 0.0
    return ratio(pred, target), ratio(boundary(pred, width), boundary(target, width))


def torch_breps(model, features, input_size, gt: np.ndarray, *, maximise: bool, steps: int, lr_mult: float,
                lam: float, thr: float = 0.5) -> dict:
    """One BREPS attack, one instance, official modules + autograd + torch Adam (spec §4)."""
    import torch  # noqa: PLC0415
    import torchvision  # noqa: PLC0415

    height, width = gt.shape
    target_np = gt == 1
    target = torch.from_numpy(target_np.astype(np.float32))
    band = max(1, round(0.02 * math.hypot(height, width)))
    sx, sy = input_size[1] / width, input_size[0] / height
    tight_r = torch.from_numpy(tight_box(target_np) * np.float32([sx, sy, sx, sy]))[None]
    box = tight_r.clone().requires_grad_(True)
    lr = lr_mult * math.hypot(height, width) / (1024 * math.sqrt(2))
    optimizer = torch.optim.Adam([box], lr=lr)
    gamma = torch.distributions.Gamma(torch.tensor(GAMMA_K), torch.tensor(1.0 / GAMMA_THETA))
    sign = 1.0 if maximise else -1.0
    best = (-2.0, -2.0) if maximise else (2.0, 2.0)
    first = None
    dense_pe = model.prompt_encoder.get_dense_pe()
    for _ in range(steps):
        sparse, dense = model.prompt_encoder(points=None, boxes=box, masks=None)
        low, iou_pred = model.mask_decoder(image_embeddings=features, image_pe=dense_pe,
                                           sparse_prompt_embeddings=sparse, dense_prompt_embeddings=dense,
                                           multimask_output=True)
        masks = model.postprocess_masks(low, input_size, (height, width))
        index = int(torch.argmax(iou_pred[0]))
        prob = torch.sigmoid(masks[0, index])
        total = prob.sum() + target.sum()
        dice = 1 - 2 * (prob * target).sum() / torch.clamp(total, min=1e-7)
        ciou = torchvision.ops.complete_box_iou_loss(torch.relu(box), tight_r, reduction="none")
        ciou = torch.nan_to_num(ciou)[0]
        loss = sign * dice
        if float(ciou.detach()) != 0.0:
            loss = loss - lam * gamma.log_prob(ciou)
        scores = selection_scores((prob > thr).detach().numpy(), target_np, band)
        if first is None:
            first = scores
        if (scores > best) if maximise else (scores < best):
            best = scores
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return {"tight_iou": first[0], "iou": best[0]}


# ---- the benchmark ---------------------------------------------------------------------------

def _median_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def run(args) -> list[str]:
    """Runs both sides; returns the report lines."""
    import jax  # noqa: PLC0415
    import jax.numpy as jnp  # noqa: PLC0415
    import torch  # noqa: PLC0415

    from jaxseg_robust.attacks.boxes import BrepsConfig, breps_attack, breps_attack_min_max  # noqa: PLC0415
    from jaxseg_robust.metrics.masks import boundary_widths  # noqa: PLC0415
    from jaxseg_robust.models import zoo  # noqa: PLC0415

    spec = bench_sam.BENCH_MODELS["sam_vit_b"]
    official = spec.build_official().eval()
    bench_sam.randomize_(official, args.seed)
    for parameter in official.parameters():
        parameter.requires_grad_(False)  # gradients flow to the box only, as in the reference attack
    seg = zoo.segmenter("sam_vit_b")
    state = {k: v.detach().numpy() for k, v in official.state_dict().items()}
    params = jax.tree.map(jnp.asarray, spec.convert(state, seg.config))
    del state
    height, width = args.size
    instances = make_instances(args.instances, height, width, args.seed)
    inputs = [seg.preprocess(image) for image, _ in instances]
    lines = []

    # -- reference: one instance at a time --
    torch_encoder, torch_attack, torch_results = [], [], []
    for (image, gt), (model_input, transform) in zip(instances, inputs):
        x = torch.from_numpy(np.asarray(model_input)).permute(2, 0, 1)[None].contiguous()
        start = time.perf_counter()
        with torch.no_grad():
            features = official.image_encoder(x)
        torch_encoder.append(time.perf_counter() - start)
        input_size = tuple(int(v) for v in np.asarray(transform.resized_hw))
        start = time.perf_counter()
        result = torch_breps(official, features, input_size, gt, maximise=False, steps=args.steps,
                             lr_mult=args.lr_mult, lam=0.1)
        torch_attack.append(time.perf_counter() - start)
        torch_results.append(result)
        print(f"  torch instance {len(torch_attack)}: encoder {torch_encoder[-1]:.2f} s, "
              f"attack {torch_attack[-1]:.2f} s", flush=True)

    # -- ours: embed per image, attack the batch in one jit call --
    embed = jax.jit(seg.embed)
    start = time.perf_counter()
    jax.block_until_ready(embed(params, inputs[0][0]))
    embed_compile = time.perf_counter() - start
    jax_encoder, features = [], []
    for model_input, _ in inputs:
        start = time.perf_counter()
        features.append(jax.block_until_ready(embed(params, model_input)))
        jax_encoder.append(time.perf_counter() - start)
    features = jax.tree.map(lambda *leaves: jnp.stack(leaves), *features)
    transforms = jax.tree.map(lambda *leaves: jnp.stack(leaves), *[t for _, t in inputs])
    gts = jnp.asarray(np.stack([gt for _, gt in instances]))
    widths = jnp.asarray(boundary_widths([gt.shape for _, gt in instances]))
    config = BrepsConfig(mode="min", n_steps=args.steps, lr_mult=args.lr_mult)
    in_axes = (None, 0, 0, 0, 0)
    attack = jax.jit(jax.vmap(functools.partial(breps_attack, seg, config=config), in_axes=in_axes))
    start = time.perf_counter()
    ours = jax.device_get(attack(params, features, transforms, gts, widths))
    attack_compile = time.perf_counter() - start
    jax_attack = _median_time(lambda: jax.block_until_ready(attack(params, features, transforms, gts, widths)),
                              args.repeats)
    minmax_time = minmax_compile = None
    if args.minmax:
        both = jax.jit(jax.vmap(functools.partial(breps_attack_min_max, seg, config=config), in_axes=in_axes))
        start = time.perf_counter()
        jax.block_until_ready(both(params, features, transforms, gts, widths))
        minmax_compile = time.perf_counter() - start
        minmax_time = _median_time(lambda: jax.block_until_ready(both(params, features, transforms, gts, widths)),
                                   args.repeats)

    # -- report --
    n = args.instances
    torch_enc, torch_att = statistics.median(torch_encoder), statistics.mean(torch_attack)
    jax_enc, jax_att = statistics.median(jax_encoder), jax_attack / n
    tight_diff = max(abs(float(ours.tight_selection_iou[i]) - torch_results[i]["tight_iou"]) for i in range(n))
    final_diff = [abs(float(ours.selection_iou[i]) - torch_results[i]["iou"]) for i in range(n)]
    lines.append(f"instances {n} of {height}x{width}, {args.steps} steps (mode MIN), lr_mult {args.lr_mult}, "
                 f"ViT-B random weights (seed {args.seed})")
    lines.append(f"{'stage':<38} {'torch s':>9} {'jax s':>9} {'torch/jax':>9}")
    lines.append(f"{'encoder, per image (median)':<38} {torch_enc:>9.2f} {jax_enc:>9.2f} {torch_enc / jax_enc:>9.2f}")
    lines.append(f"{'attack loop, per instance':<38} {torch_att:>9.2f} {jax_att:>9.2f} {torch_att / jax_att:>9.2f}"
                 f"   (jax: batch of {n} in one call, median of {args.repeats})")
    total_torch, total_jax = torch_enc + torch_att, jax_enc + jax_att
    lines.append(f"{'encoder + attack, per instance':<38} {total_torch:>9.2f} {total_jax:>9.2f} "
                 f"{total_torch / total_jax:>9.2f}")
    if minmax_time is not None:
        per_attack = minmax_time / (2 * n)
        lines.append(f"{'attack loop, MIN+MAX shared, per attack':<38} {torch_att:>9.2f} {per_attack:>9.2f} "
                     f"{torch_att / per_attack:>9.2f}   (compile {minmax_compile:.1f} s)")
    lines.append(f"jax compile: embed {embed_compile:.1f} s (incl. first run), attack {attack_compile:.1f} s "
                 f"(incl. first run); not in the per-instance numbers")
    lines.append(f"instances/s (attack loop only): torch {1 / torch_att:.3f}, jax {1 / jax_att:.3f}")
    lines.append(f"cross-check: max |tight-box selection IoU diff| {tight_diff:.2g}; final MIN IoU |diff| "
                 f"mean {statistics.mean(final_diff):.3g} max {max(final_diff):.3g} (a large value can be legitimate: "
                 f"tiny float differences can send the two optimisations down different paths)")
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--instances", type=int, default=8, help="instances (B of our batched call)")
    parser.add_argument("--size", nargs=2, type=int, default=[480, 640], metavar=("H", "W"),
                        help="image size (default 480 640, GrabCut/DAVIS-like)")
    parser.add_argument("--steps", type=int, default=50, help="BREPS evaluated iterates (default 50)")
    parser.add_argument("--lr-mult", type=float, default=9.0)
    parser.add_argument("--repeats", type=int, default=1, help="timed repeats of our batched call (median)")
    parser.add_argument("--minmax", action="store_true", help="also time MIN+MAX on one embedding")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    args = parser.parse_args(argv)
    if args.instances < 1 or args.steps < 1 or args.repeats < 1 or min(args.size) < 8:
        parser.error("--instances, --steps, --repeats must be >= 1 and --size >= 8")

    import jax  # noqa: PLC0415
    import torch  # noqa: PLC0415

    if args.threads:
        torch.set_num_threads(args.threads)
    malloc = {k: v for k, v in os.environ.items() if k.startswith("MALLOC_")}
    print(f"# bench_breps  {time.strftime('%Y-%m-%d %H:%M:%S')}  host {platform.node()}  "
          f"{platform.processor() or platform.machine()}  cpus {os.cpu_count()}")
    print(f"# jax {jax.__version__} ({jax.default_backend()}), torch {torch.__version__} "
          f"(threads {torch.get_num_threads()}), python {sys.version.split()[0]}")
    print(f"# MALLOC env: {malloc or 'none (glibc defaults)'}"
          + ("" if malloc == bench_sam.TUNED_MALLOC else "  [not the tuned setting of BENCHMARKING.md]"))
    print(f"# load average {os.getloadavg()[0]:.2f}", flush=True)
    for line in run(args):
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
