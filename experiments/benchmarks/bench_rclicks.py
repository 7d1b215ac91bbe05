"""Benchmark: RClicks simulated rounds per second, jaxseg_robust vs a reference-style loop.

Same model on both sides: the official segment-anything SAM ViT-B (random init,
``torch.manual_seed``) and its port (``ports.sam.convert_sam``). One image
(``--height`` x ``--width``, an elliptic object), the image embedding computed
once per side and excluded; then Base + ``--groups`` clicking-group trajectories
of ``--rounds`` rounds with the DT click model (§4, §5.2):

  * reference style (the RClicks evaluator): one trajectory and one click at a
    time: numpy/OpenCV clicker (padded ``cv2.distanceTransform`` for FN/FP,
    DT click map, sorted-cumsum band rule, ``np.random.choice``), then the
    official ``SamPredictor.predict`` (multimask, best score, low-res logits fed
    back with the §5.4 reset rule), IoU in numpy;
  * ours: `clicksim.evaluation.simulate_trajectories` under one ``jit``
    (``lax.scan`` over rounds, ``vmap`` over the trajectories) on the cached features.

Reported: rounds/s of each and the ratio ours/reference (> 1 = faster), plus the
mean IoU of the Base trajectory on both sides (same model and clicker: they must
agree closely; the group trajectories are random on both sides).
Other processes share the CPU: compare the ratio of one run.

Run: ``python experiments/benchmarks/bench_rclicks.py [--rounds 20 --groups 10 --repeats 2]``
(allocator as in docs/benchmarking.md; the script prints what it ran with).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
import warnings

import cv2
import jax
import jax.numpy as jnp
import numpy as np
import torch

from jaxseg_robust.clicksim import evaluation as E
from jaxseg_robust.clicksim.click_models import DistanceTransformClickModel
from jaxseg_robust.models.sam.registry import SAM_CONFIGS
from jaxseg_robust.models.sam.segmenter import SamSegmenter
from ports.sam import convert_sam

MALLOC_VARIABLES = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_")


def make_instance(height: int, width: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    image = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
    yy, xx = np.mgrid[:height, :width]
    gt = (((yy - 0.5 * height) / (0.3 * height)) ** 2 + ((xx - 0.45 * width) / (0.25 * width)) ** 2 <= 1)
    image[gt] = image[gt] // 2 + 100
    return image, gt


def padded_dt(region, not_clicked):
    return cv2.distanceTransform(np.pad(region, 1).astype(np.uint8), cv2.DIST_L2, 0)[1:-1, 1:-1] * not_clicked


def reference_trajectory(predictor, gt, rounds, bounds, rng):
    """One trajectory, one click at a time (the reference evaluator's structure)."""
    pred = np.zeros_like(gt)
    not_clicked = np.ones_like(gt)
    points, labels, ious, previous = [], [], [], None
    for r in range(rounds):
        fn, fp = gt & ~pred, ~gt & pred
        fn_dt, fp_dt = padded_dt(fn, not_clicked), padded_dt(fp, not_clicked)
        positive = fn_dt.max() > fp_dt.max()
        chosen = fn_dt if positive else fp_dt
        row, col = np.unravel_index(np.argmax(chosen), chosen.shape)
        if bounds is not None:
            region = fn if positive else fp
            dt = cv2.distanceTransform(region.astype(np.uint8), cv2.DIST_L2, 0)
            masked = (dt / max(dt.max(), 1e-12)).astype(np.float32) * region * not_clicked
            ordered = np.sort(masked.ravel())
            cumulative = ordered.cumsum()
            total = ordered.sum()
            low = ordered[min(cumulative.searchsorted(total * bounds[0], side="left"), ordered.size - 1)]
            high = ordered[min(cumulative.searchsorted(total * bounds[1], side="right"), ordered.size - 1)]
            band = masked * (masked >= low) * (masked <= high)
            if band.sum() > 0:
                p = (band / band.sum()).ravel().astype(np.float64)
                row, col = np.unravel_index(rng.choice(p.size, p=p / p.sum()), gt.shape)
        points.append((col, row))
        labels.append(int(positive))
        not_clicked[row, col] = False
        feedback = r >= 1 and not (r == 1 and not positive)
        masks, scores, low_res = predictor.predict(point_coords=np.array(points, np.float32),
                                                   point_labels=np.array(labels),
                                                   mask_input=previous if feedback else None,
                                                   multimask_output=True)
        best = int(np.argmax(scores))
        pred, previous = masks[best], low_res[best][None]
        ious.append((gt & pred).sum() / (gt | pred).sum())
    return ious


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--height", type=int, default=480)
    parser.add_argument("--width", type=int, default=640)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--groups", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    print(f"jax {jax.__version__} ({jax.default_backend()}), torch {torch.__version__}, cv2 {cv2.__version__}, "
          f"{platform.processor() or platform.machine()}, {os.cpu_count()} cpus, torch threads "
          f"{torch.get_num_threads()}")
    print("allocator:", {name: os.environ.get(name, "default") for name in MALLOC_VARIABLES})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from segment_anything import SamPredictor, sam_model_registry
    torch.manual_seed(0)
    model = sam_model_registry["vit_b"]().eval()
    state = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    segmenter = SamSegmenter(SAM_CONFIGS["vit_b"], image_resize="pil")
    params = jax.tree.map(jnp.asarray, convert_sam(state, SAM_CONFIGS["vit_b"]))
    image, gt = make_instance(args.height, args.width)
    trajectories = args.groups + 1
    total_rounds = trajectories * args.rounds
    print(f"image {args.height}x{args.width}, Base + {args.groups} groups x {args.rounds} rounds = "
          f"{total_rounds} rounds per instance, DT click model, SAM ViT-B (random weights)")

    predictor = SamPredictor(model)
    with torch.inference_mode():
        predictor.set_image(image)
        bounds = [None] + [(g / args.groups, (g + 1) / args.groups) for g in range(args.groups)]

        def reference():
            rng = np.random.default_rng(42)
            return [reference_trajectory(predictor, gt, args.rounds, b, rng) for b in bounds]

        reference_ious = reference()  # warm-up
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            reference()
            times.append(time.perf_counter() - start)
    t_reference = statistics.median(times)

    config = E.RClicksConfig(num_rounds=args.rounds, num_groups=args.groups)
    model_input, transform = segmenter.preprocess(image)
    features = jax.jit(segmenter.embed)(params, model_input)
    framed_gt = gt.astype(np.int8)
    click_model = DistanceTransformClickModel()
    ours = jax.jit(lambda p, f, k: E.simulate_trajectories(segmenter, p, f, transform, framed_gt, click_model,
                                                           None, {}, k, config=config))
    key = E.instance_key(42, 0)
    base, _ = jax.block_until_ready(ours(params, features, key))  # compile + warm-up
    times = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        jax.block_until_ready(ours(params, features, key))
        times.append(time.perf_counter() - start)
    t_ours = statistics.median(times)
    print(f"Base mean IoU: reference {np.mean(reference_ious[0]):.4f}   ours {float(np.mean(base.iou)):.4f}")
    print(f"reference-style loop {t_reference:8.2f} s = {total_rounds / t_reference:7.2f} rounds/s")
    print(f"jaxseg_robust        {t_ours:8.2f} s = {total_rounds / t_ours:7.2f} rounds/s")
    print(f"ratio ours / reference: {t_reference / t_ours:.2f}x")


if __name__ == "__main__":
    main()
