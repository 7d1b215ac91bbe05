"""TETRIS click grid: positions/s of `attacks.grid.click_grid` vs the best batched torch loop, one process.

Usage (tuned allocator, as docs/benchmarking.md recommends; the script records it):

    MALLOC_MMAP_THRESHOLD_=4294967296 MALLOC_TRIM_THRESHOLD_=68719476736 \\
    MALLOC_TOP_PAD_=1073741824 python experiments/benchmarks/bench_grid.py \\
        --positions 256 --torch-batch 64 --chunk 4 16 64

Quick run: ``--positions 32 --torch-batch 16 --chunk 8 --repeats 1``.

Both sides get the same random-init SAM ViT-B (the official model built without a
checkpoint, every tensor randomised, converted in-process with the key table of
``python -m ports sam``) and the same image embedding, computed once by the
official encoder outside the timings (a grid pays for the image once).
A synthetic ``--image-hw`` image (default 480x640) with an elliptic object; the
grid positions are ``--positions`` distinct pixels drawn with a fixed seed (the
grid cost is per position, so a subset measures the rate; the full-grid time is
extrapolated for H x W and for 1024 x 1024).

Per position, both sides do the whole TETRIS first-click grid step (§5.1): one
positive click, no mask input, multimask + argmax predicted IoU, the selected
low-res mask upsampled as ``postprocess_masks`` (256 -> 1024 -> crop -> H x W),
binarised, IoU and Boundary IoU (d = 2 % of the diagonal) against the GT.

  * torch ("best batched loop"): under ``torch.inference_mode``, batches of
    ``--torch-batch`` clicks through the official ``prompt_encoder`` and
    ``mask_decoder`` (the embedding and dense PE computed once), argmax selection,
    ``sam.postprocess_masks`` of the selected masks only, ``logit > 0``, IoU with
    tensor sums and BIoU with a separable max-pool erosion (far faster than the
    reference's per-mask ``cv2.erode``).
  * ours: ``jax.jit(click_grid)`` with ``region`` = the chosen pixels and
    ``chunk_size`` from ``--chunk`` (positions decoded together by ``vmap``; several values
    can be timed in one run).

Timings: medians of ``--repeats`` runs after one warm-up (jax compile time is
reported separately); process CPU-time ratios are printed too (steadier on a
shared machine). Outputs are cross-checked (share of positions whose IoU agrees
within 1e-5: a differing pixel at the threshold or a near-tied candidate choice
can flip a few).

Devices (`bench_device`): ``--torch-device cuda`` runs the torch side on a GPU
(strict float32 unless ``--torch-tf32``; ``torch.cuda.synchronize()`` before
every clock read of it), ``--precision`` sets JAX's float32 matmul precision of
our side (the agreement line then measures its distance to the reference).
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import platform
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_device import add_device_flags, configure_torch, device_lines, jax_precision, torch_sync  # noqa: E402

TUNED_MALLOC = {"MALLOC_MMAP_THRESHOLD_": "4294967296", "MALLOC_TRIM_THRESHOLD_": "68719476736",
                "MALLOC_TOP_PAD_": "1073741824"}


def randomize_(model, seed: int = 0) -> None:
    """Seeded random values of a sensible scale for every float tensor of a torch model."""
    import torch  # noqa: PLC0415

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, t in model.state_dict().items():
            if not t.is_floating_point():
                continue
            noise = torch.randn(t.shape, generator=gen)
            if t.ndim >= 2 and not name.endswith(("pos_embed", "rel_pos_h", "rel_pos_w")):
                t.copy_(noise / np.sqrt(max(t[0].numel(), 1)))
            elif t.ndim == 1 and name.endswith("weight"):
                t.copy_(1.0 + 0.1 * noise)
            else:
                t.copy_(0.1 * noise)


def timed(fn, repeats: int) -> tuple[float, float, float]:
    """(first call s, median wall s, median process CPU s) over ``repeats`` further calls."""
    start = time.perf_counter()
    fn()
    first = time.perf_counter() - start
    wall, cpu = [], []
    for _ in range(repeats):
        start, start_cpu = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    return first, statistics.median(wall), statistics.median(cpu)


def scene(height: int, width: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A uint8 image [H, W, 3] with a brighter elliptic object, and its bool GT [H, W]."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[:height, :width]
    gt = ((yy - 0.5 * height) / (0.3 * height)) ** 2 + ((xx - 0.45 * width) / (0.25 * width)) ** 2 <= 1
    image = (rng.uniform(0, 90, (height, width, 3)) + 120 * gt[..., None]).astype(np.uint8)
    return image, gt


def torch_grid_scores(sam, embedding, clicks, gt, d, input_size, batch):
    """IoU and BIoU [N] of one positive click per (row, col) in ``clicks`` [N, 2] (torch, batched)."""
    import torch  # noqa: PLC0415
    import torch.nn.functional as F  # noqa: PLC0415, N812

    height, width = gt.shape
    sy, sx = input_size[0] / height, input_size[1] / width
    device = embedding.device
    target = torch.from_numpy(gt)[None].to(device)
    k = 2 * d + 1

    def erode(x):  # 3x3-iterated == (2d+1) square erosion with zeros outside, separable
        x = F.pad(x, (d, d, d, d), value=0.0)
        x = -F.max_pool2d(-x, (1, k), stride=1)
        return -F.max_pool2d(-x, (k, 1), stride=1)

    target_f = target.float()[None]
    target_band = (target_f - erode(target_f))[0] > 0
    dense_pe = sam.prompt_encoder.get_dense_pe()
    ious, bious = [], []
    for start in range(0, len(clicks), batch):
        rc = torch.from_numpy(clicks[start:start + batch].astype(np.float32)).to(device)
        coords = torch.stack([rc[:, 1] * sx, rc[:, 0] * sy], dim=-1)[:, None, :]
        labels = torch.ones((len(rc), 1), dtype=torch.int, device=device)
        sparse, dense = sam.prompt_encoder(points=(coords, labels), boxes=None, masks=None)
        low_res, iou_pred = sam.mask_decoder(image_embeddings=embedding, image_pe=dense_pe,
                                             sparse_prompt_embeddings=sparse, dense_prompt_embeddings=dense,
                                             multimask_output=True)
        best = iou_pred.argmax(dim=1)
        selected = low_res[torch.arange(len(rc), device=device), best][:, None]
        masks = sam.postprocess_masks(selected, input_size, (height, width)) > 0  # [n, 1, H, W]
        pred = masks[:, 0]
        inter = (pred & target).sum(dim=(1, 2)).float()
        union = (pred | target).sum(dim=(1, 2)).float()
        ious.append(torch.where(union > 0, inter / union.clamp(min=1), torch.nan))
        pred_f = masks.float()
        band = (pred_f - erode(pred_f))[:, 0] > 0
        b_inter = (band & target_band).sum(dim=(1, 2)).float()
        b_union = (band | target_band).sum(dim=(1, 2)).float()
        bious.append(torch.where(b_union > 0, b_inter / b_union.clamp(min=1), torch.nan))
    return torch.cat(ious).cpu().numpy(), torch.cat(bious).cpu().numpy()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image-hw", nargs=2, type=int, default=[480, 640], help="image size H W")
    parser.add_argument("--positions", type=int, default=256, help="grid positions timed (random pixels)")
    parser.add_argument("--torch-batch", type=int, default=64, help="clicks per torch decoder call")
    parser.add_argument("--chunk", type=int, nargs="+", default=[4, 16],
                        help="positions per vmapped decode chunk (jax); several values are timed in turn")
    parser.add_argument("--repeats", type=int, default=2, help="timed repetitions (medians)")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    add_device_flags(parser)
    args = parser.parse_args(argv)

    import jax  # noqa: PLC0415
    import jax.numpy as jnp  # noqa: PLC0415
    import torch  # noqa: PLC0415
    from segment_anything import SamPredictor, sam_model_registry  # noqa: PLC0415

    from jaxseg_robust.attacks.grid import click_grid  # noqa: PLC0415
    from jaxseg_robust.metrics.masks import boundary_width  # noqa: PLC0415
    from jaxseg_robust.models import zoo  # noqa: PLC0415
    from jaxseg_robust.models.sam.segmenter import SamFeatures, make_transform  # noqa: PLC0415
    from jaxseg_robust.ops.resize import longest_side_shape  # noqa: PLC0415
    from ports.sam import convert_sam  # noqa: PLC0415

    if args.threads:
        torch.set_num_threads(args.threads)
    device = configure_torch(args)
    malloc = {k: v for k, v in os.environ.items() if k.startswith("MALLOC_")}
    print(f"# bench_grid  {time.strftime('%Y-%m-%d %H:%M:%S')}  host {platform.node()}  "
          f"{platform.processor() or platform.machine()}  cpus {os.cpu_count()}")
    print(f"# jax {jax.__version__} ({jax.default_backend()}), torch {torch.__version__} "
          f"(threads {torch.get_num_threads()}), python {sys.version.split()[0]}")
    print(f"# MALLOC env: {malloc or 'none (glibc defaults)'}"
          + ("" if malloc == TUNED_MALLOC else "  [not the tuned setting of BENCHMARKING.md]"))
    for line in device_lines(args):
        print(line)
    height, width = args.image_hw
    print(f"# SAM ViT-B random init, image {height}x{width}, {args.positions} positions, torch batch "
          f"{args.torch_batch}, jax chunks {args.chunk}, repeats {args.repeats}, "
          f"load average {os.getloadavg()[0]:.2f}", flush=True)

    sam = sam_model_registry["vit_b"]().eval()
    randomize_(sam)
    seg = zoo.segmenter("sam_vit_b")
    state = {k: v.detach().numpy() for k, v in sam.state_dict().items()}
    params = jax.tree.map(jnp.asarray, convert_sam(state, seg.config, what="benchmark weights"))
    del state
    sam.to(device)

    image, gt = scene(height, width)
    predictor = SamPredictor(sam)
    start = time.perf_counter()
    predictor.set_image(image)  # the embedding, once, shared by both sides
    torch_sync(device)
    print(f"# embedding (torch encoder, once): {time.perf_counter() - start:.1f} s", flush=True)
    embedding = predictor.features
    input_size = predictor.input_size
    features = SamFeatures(image_embeddings=jnp.asarray(embedding[0].permute(1, 2, 0).cpu().numpy()))
    transform = make_transform((height, width), longest_side_shape(height, width, seg.config.image_size))
    d = boundary_width(height, width)

    rng = np.random.default_rng(1)
    flat = np.sort(rng.choice(height * width, size=args.positions, replace=False))
    clicks = np.stack([flat // width, flat % width], axis=1)
    region = np.zeros((height, width), bool)
    region[clicks[:, 0], clicks[:, 1]] = True
    gt_int = gt.astype(np.int8)

    holder = {}
    with torch.inference_mode():
        def run_torch():
            holder["torch"] = torch_grid_scores(sam, embedding, clicks, gt, d, input_size, args.torch_batch)
            torch_sync(device)

        _, t_torch, c_torch = timed(run_torch, args.repeats)

    ref_iou, ref_biou = holder["torch"]
    n = args.positions
    rate_torch = n / t_torch
    print(f"{'side':<7} {'s/run':>8} {'pos/s':>8} {'cpu s':>8} {'ratio':>6}  note")
    print(f"{'torch':<7} {t_torch:>8.2f} {rate_torch:>8.1f} {c_torch:>8.2f} {1.0:>6.2f}  batch {args.torch_batch} "
          f"({args.torch_device})", flush=True)
    best = 0.0
    for chunk in args.chunk:
        grid = jax.jit(functools.partial(click_grid, seg, params, chunk_size=chunk))

        def run_jax(grid=grid):
            holder["jax"] = jax.block_until_ready(grid(features, transform, gt_int, np.int32(d), region=region))

        with jax_precision(args):
            compile_s, t_jax, c_jax = timed(run_jax, args.repeats)
        result = holder["jax"]
        ours_iou = np.asarray(result.iou)[clicks[:, 0], clicks[:, 1]]
        ours_biou = np.asarray(result.biou)[clicks[:, 0], clicks[:, 1]]
        agree = np.mean(np.abs(ours_iou - ref_iou) <= 1e-5)
        agree_b = np.mean(np.abs(ours_biou - ref_biou) <= 1e-5)
        rate_jax = n / t_jax
        best = max(best, rate_jax)
        print(f"{'jax':<7} {t_jax:>8.2f} {rate_jax:>8.1f} {c_jax:>8.2f} {rate_jax / rate_torch:>6.2f}  chunk {chunk}, "
              f"precision {args.precision}; "
              f"cpu-time ratio {c_torch / c_jax:.2f}; first call {compile_s:.1f} s (compile + run); IoU agrees "
              f"(|diff| <= 1e-5) at {100 * agree:.1f} % of positions, BIoU at {100 * agree_b:.1f} %, max |IoU diff| "
              f"{np.nanmax(np.abs(ours_iou - ref_iou)):.3g}", flush=True)
    print(f"ratio (best jax chunk) / torch positions/s: {best / rate_torch:.2f} (target >= 1)")
    for label, pixels in ((f"{height}x{width}", height * width), ("1024x1024", 1024 * 1024)):
        print(f"full grid {label}: torch {pixels / rate_torch / 3600:.1f} h, jax {pixels / best / 3600:.1f} h "
              f"(extrapolated from the rates above)")
    return 0 if math.isfinite(best) and best > 0 else 2


if __name__ == "__main__":
    sys.exit(main())
