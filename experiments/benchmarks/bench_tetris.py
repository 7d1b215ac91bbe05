"""TETRIS click attack (MIN and MAX, K clicks x S iterates) throughput: jaxseg_robust vs a papers'-style torch loop.

Usage (tuned allocator, as docs/benchmarking.md recommends; the script records it):

    MALLOC_MMAP_THRESHOLD_=4294967296 MALLOC_TRIM_THRESHOLD_=68719476736 \\
    MALLOC_TOP_PAD_=1073741824 python experiments/benchmarks/bench_tetris.py \\
        --instances 2 --size 640

Both sides use the same random-init SAM ViT-B (the official model is built
without a checkpoint, every tensor randomised, converted in-process with the
key table of ``python -m ports``), the same synthetic instances (random image,
elliptic object, ``3/4 size x size``), 10 clicks, 11 evaluated iterates per
click (baseline click + 10 Adam updates), MIN and MAX.

* jaxseg_robust: ``make_click_batch_fn(mode="minmax")`` on one `PaddedBatch`
  of ``--batch`` instances: one jitted program embeds the batch once and runs
  both attacks (scan over clicks and steps, vmap over instances and modes).
* reference: the loop the TETRIS code runs (spec prompt-attacks §3), one
  instance and one mode at a time, through the official ``segment_anything``
  modules with torch autograd: RITM clicker on OpenCV distance transforms,
  location-loss DTs resized with ``align_corners=True``, a rendered disk
  (the spec's ramp surrogate on the full resized grid; the papers' pydiffvg is
  not available and would be slower), prompt encoder + mask decoder +
  ``postprocess_masks`` with gradients, Dice, IoU and Boundary IoU (OpenCV
  erosion) per iterate, fresh ``torch.optim.Adam`` per click, a backward pass
  after every iterate (the last one included, as the reference). Favourable
  to the reference: the image embedding is computed once per instance and
  shared by MIN and MAX (the reference recomputes it at every click).

Reported: seconds per instance (both modes, embedding included) for each side,
the encoder's share, and the ratio reference / ours (> 1: ours is faster;
target on CPU >= 1.5). A sanity line compares click 1's iterate-0 IoU of the two,
and the final IoU (after the last click) of each trajectory of the instances
both sides ran.

Devices (`bench_device`): ``--torch-device cuda`` runs the reference on a GPU
(strict float32 unless ``--torch-tf32``; ``torch.cuda.synchronize()`` before
every clock read), ``--torch-instances K`` times it on the first K instances
only (default all: ours runs ``--instances``), ``--precision`` sets JAX's float32
matmul precision of our side.
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import pathlib
import platform
import sys
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from bench_device import add_device_flags, configure_torch, device_lines, jax_precision, torch_sync  # noqa: E402
from bench_sam import TUNED_MALLOC, randomize_  # noqa: E402


def make_instances(count: int, height: int, width: int, seed: int = 0):
    """Synthetic (image uint8[H, W, 3], gt int8[H, W]) pairs with one elliptic object each."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        image = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
        yy, xx = np.mgrid[:height, :width]
        cy, cx = rng.uniform(0.35, 0.65) * height, rng.uniform(0.35, 0.65) * width
        gt = (((yy - cy) / (0.3 * height)) ** 2 + ((xx - cx) / (0.25 * width)) ** 2 <= 1).astype(np.int8)
        image[gt == 1] = (image[gt == 1] // 2 + 100).astype(np.uint8)
        out.append((image, gt))
    return out


# ---- the papers'-style reference loop (torch, one instance and one mode at a time) ---------------

class TorchTetris:
    """TETRIS as the reference code runs it, on the official SAM modules (spec §3.1-3.3)."""

    def __init__(self, sam, n_clicks: int, n_steps: int, lr_mult: float = 1.0, thr: float = 0.5, device=None):
        self.sam, self.n_clicks, self.n_steps, self.lr_mult, self.thr = sam, n_clicks, n_steps, lr_mult, thr
        self.device = device or next(sam.parameters()).device

    def embed(self, image):
        import torch  # noqa: PLC0415
        import torch.nn.functional as F  # noqa: PLC0415

        h, w = image.shape[:2]
        scale = 1024 / max(h, w)
        self.resized = (int(h * scale + 0.5), int(w * scale + 0.5))
        x = torch.from_numpy(image).permute(2, 0, 1)[None].float().to(self.device)
        x = F.interpolate(x, self.resized, mode="bilinear", align_corners=False, antialias=True)
        with torch.no_grad():
            return self.sam.image_encoder(self.sam.preprocess(x))

    @staticmethod
    def _clicker(gt, pred, not_clicked):
        import cv2  # noqa: PLC0415

        fn = np.pad(gt & ~pred, 1).astype(np.uint8)
        fp = np.pad(~gt & pred, 1).astype(np.uint8)
        dt_fn = cv2.distanceTransform(fn, cv2.DIST_L2, 0)[1:-1, 1:-1] * not_clicked
        dt_fp = cv2.distanceTransform(fp, cv2.DIST_L2, 0)[1:-1, 1:-1] * not_clicked
        positive = dt_fn.max() > dt_fp.max()
        chosen = dt_fn if positive else dt_fp
        row, col = np.unravel_index(int(np.argmax(chosen)), chosen.shape)
        return bool(positive), int(row), int(col)

    @staticmethod
    def _boundary(mask, d):
        import cv2  # noqa: PLC0415

        padded = cv2.copyMakeBorder(mask.astype(np.uint8), 1, 1, 1, 1, cv2.BORDER_CONSTANT, value=0)
        eroded = cv2.erode(padded, np.ones((3, 3), np.uint8), iterations=d)[1:-1, 1:-1]
        return mask.astype(np.uint8) - eroded

    def _scores(self, pred, gt, d):
        union = (pred | gt).sum()
        iou = (pred & gt).sum() / union if union else 0.0
        bp, bg = self._boundary(pred, d) > 0, self._boundary(gt, d) > 0
        bunion = (bp | bg).sum()
        return float(iou), float((bp & bg).sum() / bunion if bunion else 0.0)

    def attack(self, embedding, gt, maximise: bool):
        """One MIN or MAX trajectory; returns (per-click IoU, click-1 iterate-0 IoU)."""
        import cv2  # noqa: PLC0415
        import torch  # noqa: PLC0415
        import torch.nn.functional as F  # noqa: PLC0415

        sam, device = self.sam, self.device
        height, width = gt.shape
        rh, rw = self.resized
        sx, sy = rw / width, rh / height
        target = gt == 1
        target_t = torch.from_numpy(target.astype(np.float32)).to(device)
        d = max(1, round(0.02 * math.hypot(height, width)))
        lr = self.lr_mult * 5 * math.hypot(height, width) / (400 * math.sqrt(2))
        sign = 1.0 if maximise else -1.0
        grid_y = torch.arange(rh, dtype=torch.float32, device=device)[:, None] + 0.5
        grid_x = torch.arange(rw, dtype=torch.float32, device=device)[None, :] + 0.5
        dense_pe = sam.prompt_encoder.get_dense_pe()
        prob = np.zeros((height, width), np.float32)
        low_res = None
        not_clicked = np.ones((height, width), np.float32)
        points, labels, ious, first_iou = [], [], [], None
        for _ in range(self.n_clicks):
            positive, row, col = self._clicker(target, prob > self.thr, not_clicked)
            prev = prob > 0.5
            region = (target & ~prev) if positive else (~target & prev)
            dt = cv2.distanceTransform((~region).astype(np.uint8), cv2.DIST_L2, 0)
            dt = F.interpolate(torch.from_numpy(dt)[None, None].to(device), (rh, rw), mode="bilinear",
                               align_corners=True)[0, 0]
            labels_now = labels + [int(positive)]
            use_mask = max(sum(labels_now), len(labels_now) - sum(labels_now)) > 1
            q = torch.tensor([[col * sx, row * sy]], dtype=torch.float32, device=device, requires_grad=True)
            optimizer = torch.optim.Adam([q], lr=lr)
            best, best_loc = (-2.0, -2.0) if maximise else (2.0, 2.0), 1e50
            stored = None
            for step in range(self.n_steps):
                optimizer.zero_grad()
                cx = torch.clamp(q[0, 0] + 0.5, 0, rw - 1)
                cy = torch.clamp(q[0, 1] + 0.5, 0, rh - 1)
                disk = torch.clamp(5.5 - torch.sqrt((grid_x - cx) ** 2 + (grid_y - cy) ** 2 + 1e-12), 0, 1)
                loc = (disk * dt).mean()
                previous = torch.tensor(points, dtype=torch.float32, device=device).reshape(-1, 2)
                coords = torch.cat([previous, q])[None]
                label_t = torch.tensor(labels_now, dtype=torch.int, device=device)[None]
                sparse, dense = sam.prompt_encoder(points=(coords, label_t), boxes=None,
                                                   masks=low_res if use_mask else None)
                low, iou_pred = sam.mask_decoder(image_embeddings=embedding, image_pe=dense_pe,
                                                 sparse_prompt_embeddings=sparse,
                                                 dense_prompt_embeddings=dense, multimask_output=True)
                j = int(torch.argmax(iou_pred[0]))
                logits = sam.postprocess_masks(low[:, j:j + 1], (rh, rw), (height, width))[0, 0]
                p = torch.sigmoid(logits)
                inter = (p * target_t).sum()
                dice = (1 - 2 * inter / torch.clamp(p.sum() + target_t.sum(), min=1e-7)) * float(target.any())
                loss = loc + sign * dice / 1000
                p_np = p.detach().cpu().numpy()
                scores = self._scores(p_np > self.thr, target, d)
                if step == 0 and first_iou is None:
                    first_iou = scores[0]
                better = scores > best if maximise else scores < best
                loc_value = float(loc.detach())
                if loc_value <= 1.05 * best_loc and better:
                    best, best_loc = scores, loc_value
                    qx, qy = (float(v) for v in q.detach()[0])
                    r = (min(max(qy / sy, 0), height - 1), min(max(qx / sx, 0), width - 1))
                    stored = (p_np, low[:, j:j + 1].detach(), r)
                loss.backward()
                optimizer.step()
            prob, low_res, r = stored
            points.append([r[1] * sx, r[0] * sy])
            labels = labels_now
            not_clicked[min(round(r[0]), height - 1), min(round(r[1]), width - 1)] = 0
            ious.append(best[0])
        return ious, first_iou


# ---- main -------------------------------------------------------------------------------------

def parse_args(argv=None):
    """The flags (``--torch-instances`` at most ``--instances``; default all of them)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--instances", type=int, default=2, help="instances timed on our side")
    parser.add_argument("--torch-instances", type=int, default=None,
                        help="instances the reference runs (the first K; default --instances)")
    parser.add_argument("--batch", type=int, default=None, help="jax batch size (default: --instances)")
    parser.add_argument("--size", type=int, default=640, help="longest image side W (H = 3/4 W)")
    parser.add_argument("--clicks", type=int, default=10)
    parser.add_argument("--steps", type=int, default=11, help="evaluated iterates per click (11 = 1 + 10 updates)")
    parser.add_argument("--model", default="sam_vit_b", choices=["sam_vit_b", "sam_vit_l", "sam_vit_h"])
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    add_device_flags(parser)
    args = parser.parse_args(argv)
    args.torch_instances = min(args.torch_instances or args.instances, args.instances)
    if min(args.instances, args.torch_instances, args.clicks, args.steps, args.batch or 1) < 1 or args.size < 16:
        parser.error("--instances, --torch-instances, --batch, --clicks, --steps must be >= 1 and --size >= 16")
    return args


def run_reference(official, data, args, device) -> dict:
    """The torch loop on the first ``args.torch_instances`` instances, both modes; seconds per instance."""
    reference = TorchTetris(official, args.clicks, args.steps, device=device)
    warm = TorchTetris(official, 1, 2, device=device)  # warm-up (allocator, kernels), untimed
    warm.attack(warm.embed(data[0][0]), data[0][1], True)
    torch_sync(device)
    start = time.perf_counter()
    encoder_s, first, final = 0.0, [], []
    for image, gt in data[:args.torch_instances]:
        t0 = time.perf_counter()
        embedding = reference.embed(image)
        torch_sync(device)
        encoder_s += time.perf_counter() - t0
        for maximise in (False, True):
            ious, first_iou = reference.attack(embedding, gt, maximise)
            first.append(first_iou)
            final.append(ious[-1])
    torch_sync(device)
    per_instance = (time.perf_counter() - start) / args.torch_instances
    return {"s": per_instance, "encoder": encoder_s / args.torch_instances, "first": first, "final": final}


def run_ours(seg, params, data, args) -> dict:
    """Our batched program end to end, then encoder and attack timed apart; the outputs of the first."""
    import jax  # noqa: PLC0415

    from jaxseg_robust.attacks.clicks import TetrisConfig, make_click_batch_fn, tetris_min_max  # noqa: PLC0415
    from jaxseg_robust.data.buckets import pad_batch  # noqa: PLC0415
    from jaxseg_robust.data.instances import make_instance  # noqa: PLC0415
    from jaxseg_robust.metrics.masks import boundary_widths  # noqa: PLC0415

    height, width = data[0][1].shape
    batch_size = args.batch or args.instances
    fn = make_click_batch_fn(seg, params, mode="minmax", n_clicks=args.clicks, n_opt_steps=args.steps)
    instances = [make_instance(f"im{i}", image, gt, dataset="bench") for i, (image, gt) in enumerate(data)]
    batches = [pad_batch(instances[i:i + batch_size], (height, width), batch_size)
               for i in range(0, len(instances), batch_size)]
    t0 = time.perf_counter()
    jax.block_until_ready(fn(batches[0]))
    first_call = time.perf_counter() - t0
    start = time.perf_counter()
    outputs = [jax.device_get(fn(b)) for b in batches]
    ours_s = (time.perf_counter() - start) / args.instances
    # the two phases of the program timed apart (the attack on precomputed features)
    embed = jax.jit(seg.embed)
    prepared = [seg.preprocess(image) for image, _ in data[:batch_size]]
    model_input = jax.numpy.stack([x for x, _ in prepared])
    transform = jax.tree.map(lambda *leaves: jax.numpy.stack(leaves), *[t for _, t in prepared])
    gts = np.stack([gt for _, gt in data[:batch_size]])
    widths = boundary_widths([gt.shape for gt in gts])
    features = jax.block_until_ready(embed(params, model_input))
    t0 = time.perf_counter()
    features = jax.block_until_ready(embed(params, model_input))
    encoder = (time.perf_counter() - t0) / len(prepared)
    config = TetrisConfig(mode="min", n_clicks=args.clicks, n_opt_steps=args.steps)
    attack = jax.jit(jax.vmap(functools.partial(tetris_min_max, seg, config=config), in_axes=(None, 0, 0, 0, 0)))
    jax.block_until_ready(attack(params, features, transform, gts, widths))
    t0 = time.perf_counter()
    jax.block_until_ready(attack(params, features, transform, gts, widths))
    attack_s = (time.perf_counter() - t0) / len(prepared)

    def per_trajectory(name, column):  # [instance, mode] flattened as the reference's order (MIN, MAX)
        return np.concatenate([np.stack([o["min"][name][:, column], o["max"][name][:, column]], 1)
                               for o in outputs])[:args.instances].reshape(-1)

    return {"s": ours_s, "encoder": encoder, "attack": attack_s, "first_call": first_call, "traces": fn.traces,
            "batch": batch_size, "first": per_trajectory("start_iou", 0), "final": per_trajectory("iou", -1)}


def report(ref: dict, ours: dict, args) -> list[str]:
    """The result lines (times per instance, ratios reference / ours, IoU cross-checks)."""
    k = args.torch_instances
    ref_attack = ref["s"] - ref["encoder"]
    final_diff = np.abs(np.asarray(ref["final"]) - ours["final"][:2 * k])
    return [
        (f"reference (torch {args.torch_device}, one instance and mode at a time, first {k} instances): "
         f"{ref['s']:.2f} s/instance (encoder {ref['encoder']:.2f} s, attack {ref_attack:.2f} s)"),
        (f"jaxseg_robust (batch {ours['batch']}, one jit call per batch, precision {args.precision}): "
         f"{ours['s']:.2f} s/instance end to end; apart: encoder {ours['encoder']:.2f} s + attack "
         f"{ours['attack']:.2f} s; first call incl. compile {ours['first_call']:.1f} s; traces {ours['traces']}"),
        (f"ratio reference/ours: end to end {ref['s'] / ours['s']:.2f}x; attack only "
         f"{ref_attack / ours['attack']:.2f}x (target >= 1.5); encoder {ref['encoder'] / ours['encoder']:.2f}x"),
        (f"sanity: click-1 iterate-0 IoU torch {np.round(ref['first'], 4).tolist()} "
         f"ours {np.round(ours['first'][:2 * k], 4).tolist()}"),
        (f"final IoU (last click) vs torch over {2 * k} trajectories (precision {args.precision}): |diff| mean "
         f"{final_diff.mean():.3g} max {final_diff.max():.3g}; torch {np.round(ref['final'], 4).tolist()} "
         f"ours {np.round(ours['final'][:2 * k], 4).tolist()}"),
    ]


def main(argv=None) -> int:
    args = parse_args(argv)

    import jax  # noqa: PLC0415
    import torch  # noqa: PLC0415
    from segment_anything import sam_model_registry  # noqa: PLC0415

    from jaxseg_robust.models import zoo  # noqa: PLC0415
    from ports.sam import convert_sam  # noqa: PLC0415

    if args.threads:
        torch.set_num_threads(args.threads)
    device = configure_torch(args)
    malloc = {k: v for k, v in os.environ.items() if k.startswith("MALLOC_")}
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} cpus, jax {jax.__version__} "
          f"({jax.default_backend()}), torch {torch.__version__} ({torch.get_num_threads()} threads)")
    for line in device_lines(args):
        print(line)
    print(f"# MALLOC env: {malloc or 'none (glibc defaults)'}"
          + ("" if malloc == TUNED_MALLOC else "  [not the tuned setting of BENCHMARKING.md]"))
    width = args.size
    height = (3 * width) // 4
    print(f"# {args.model}, {args.instances} instances of {height}x{width} (torch: the first "
          f"{args.torch_instances}), {args.clicks} clicks x {args.steps} iterates, MIN + MAX", flush=True)

    official = sam_model_registry[args.model.removeprefix("sam_")]()
    randomize_(official)
    official.eval()
    seg = zoo.segmenter(args.model)
    state = {k: v.detach().numpy() for k, v in official.state_dict().items()}
    params = jax.tree.map(jax.numpy.asarray, convert_sam(state, seg.config, what="benchmark weights"))
    del state
    official.to(device)
    data = make_instances(args.instances, height, width)
    ref = run_reference(official, data, args, device)
    print(f"reference done: {ref['s']:.2f} s/instance", flush=True)
    with jax_precision(args):
        ours = run_ours(seg, params, data, args)
    for line in report(ref, ours, args):
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
