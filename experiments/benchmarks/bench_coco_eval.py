"""Benchmark: Boundary AP (and mask AP) with jaxseg_robust vs the Boundary IoU authors' COCO evaluator.

One process, one results file with thousands of detections made from the real
masks (experiments/coco_eval_data.py: perturbed copies of every ground-truth
mask, spurious and empty masks, ties in scores):

* official (bowenc0221/boundary-iou-api, ``$JAXSEG_BOUNDARY_IOU_API_REPO``):
  ``COCO(..., get_boundary=True)`` and ``loadRes`` (the per-annotation boundary
  precomputation with its multiprocessing pool over all cores), then
  ``COCOeval.evaluate`` and ``accumulate``;
* ours (`jaxseg_robust.evaluation.instances`): reading and checking the files
  (``prepare_instances``), the pixel counts (``count_pairs``: for Boundary AP
  RLE decode into packed bits, bands and pair counts on the device, the first
  run including XLA compilation; for mask AP on a CPU the intersections of the
  run lengths on the host), then similarities, matching and accumulation
  (``finish_instances``).

Both stages and the ratios ``official / ours`` are printed for a cold run
(compilation included) and a warm one; the 12 numbers of both are checked to
agree within 1e-6 first. Respects ``JAX_PLATFORMS``; ``--batch-size`` = masks
per device call. For fair CPU timings set the allocator as in
docs/benchmarking.md; the script prints the ``MALLOC_*`` settings it ran with.

Run: ``JAXSEG_BOUNDARY_IOU_API_REPO=/path/to/boundary-iou-api JAXSEG_REAL_DATA=/path/to/real python
experiments/benchmarks/bench_coco_eval.py [--iou-type segm|boundary] [--copies 6] [--batch-size 64]
[--mask-path auto|runs|device]``. Mask AP counts come from the run lengths on the host
(``--mask-path auto`` or ``runs``); ``--mask-path device`` times the packed-bit device path instead.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import pathlib
import platform
import sys
import tempfile
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "experiments"))

import coco_eval_data  # noqa: E402

MALLOC_VARIABLES = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_")
TUNED_MALLOC = {"MALLOC_MMAP_THRESHOLD_": "4294967296", "MALLOC_TRIM_THRESHOLD_": "68719476736",
                "MALLOC_TOP_PAD_": "1073741824"}


def official_run(reference, folder: pathlib.Path, iou_type: str) -> tuple[dict, np.ndarray]:
    """Stage times (s) and the 12 numbers of the official evaluator."""
    times = {}
    with contextlib.redirect_stdout(io.StringIO()):
        start = time.perf_counter()
        gt = reference.coco.COCO(str(folder / "gt.json"), get_boundary=iou_type == "boundary")
        dt = gt.loadRes(str(folder / "res.json"))
        evaluator = reference.cocoeval.COCOeval(gt, dt, iouType=iou_type)
        times["load + boundaries"] = time.perf_counter() - start
        start = time.perf_counter()
        evaluator.evaluate()
        times["evaluate"] = time.perf_counter() - start
        start = time.perf_counter()
        evaluator.accumulate()
        times["accumulate"] = time.perf_counter() - start
        evaluator.summarize()
    return times, np.asarray(evaluator.stats)


def ours_run(folder: pathlib.Path, iou_type: str, batch_size: int, mask_path: str) -> tuple[dict, np.ndarray]:
    """Stage times (s) and the 12 numbers of jaxseg_robust (the three stages of evaluate_instances)."""
    import jax  # noqa: PLC0415

    from jaxseg_robust.evaluation import instances as ev  # noqa: PLC0415
    from jaxseg_robust.evaluation.mask_counts import count_pairs  # noqa: PLC0415

    config = ev.InstanceEvalConfig(iou_type=iou_type, chunk_masks=batch_size, progress="none", mask_path=mask_path)
    times = {}
    start = time.perf_counter()
    prepared = ev.prepare_instances(folder / "gt.json", folder / "res.json", config, warn=lambda message: None)
    times["load + checks"] = time.perf_counter() - start
    start = time.perf_counter()
    counts = count_pairs(prepared.works, config.count_settings)
    jax.effects_barrier()
    times["pixel counts"] = time.perf_counter() - start
    start = time.perf_counter()
    evaluation = ev.finish_instances(prepared, counts, config)
    times["match + accumulate"] = time.perf_counter() - start
    return times, np.array(list(evaluation.summary.values()))


def report(name: str, official: dict, ours: dict) -> None:
    total_official, total_ours = sum(official.values()), sum(ours.values())
    print(f"\n{name}")
    for stage, seconds in official.items():
        print(f"  official {stage:<32s} {seconds:8.2f} s")
    for stage, seconds in ours.items():
        print(f"  ours     {stage:<32s} {seconds:8.2f} s")
    first_official = official["load + boundaries"]
    first_ours = ours["load + checks"] + ours["pixel counts"]
    second_official = official["evaluate"] + official["accumulate"]
    second_ours = ours["match + accumulate"]
    print(f"  stage 1, files + masks/boundaries/IoU counts: official {first_official:.2f} s (load + boundaries), "
          f"ours {first_ours:.2f} s (load + counts): {first_official / first_ours:.2f}x")
    print(f"  stage 2, matching + accumulation: official {second_official:.2f} s (evaluate, which also takes the RLE "
          f"IoUs, + accumulate), ours {second_ours:.2f} s: {second_official / second_ours:.2f}x")
    print(f"  end to end: official {total_official:.2f} s, ours {total_ours:.2f} s, "
          f"ratio {total_official / total_ours:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--iou-type", choices=("segm", "boundary"), default="boundary")
    parser.add_argument("--copies", type=int, default=6, help="up to this many detections per ground truth")
    parser.add_argument("--batch-size", type=int, default=64, help="masks per device call")
    parser.add_argument("--mask-path", choices=("auto", "runs", "device"), default="auto",
                        help="where mask AP counts are taken (auto = runs: from the run lengths on the host)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--real-data",
                        default=os.environ.get("JAXSEG_REAL_DATA", str(ROOT.parent / "shared" / "data" / "real")))
    args = parser.parse_args()
    repo = coco_eval_data.reference_repo()
    if repo is None:
        sys.exit(f"set {coco_eval_data.REFERENCE_ENV} to a checkout of bowenc0221/boundary-iou-api")
    malloc = {key: os.environ.get(key) for key in MALLOC_VARIABLES}
    print(f"python {platform.python_version()}, {os.cpu_count()} CPUs, JAX_PLATFORMS={os.environ.get('JAX_PLATFORMS')}")
    print(f"allocator: {malloc}{'' if malloc == TUNED_MALLOC else '  (NOT the tuned setting of docs/benchmarking.md)'}")
    gt, results = coco_eval_data.instance_dataset(args.real_data, seed=args.seed, copies=args.copies)
    if not gt["images"]:
        sys.exit(f"no real masks under {args.real_data}: set JAXSEG_REAL_DATA or --real-data")
    print(f"load average at the start: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    print(f"{len(gt['images'])} images, {len(gt['annotations'])} ground truths, {len(results)} detections, "
          f"iou_type={args.iou_type}, batch size {args.batch_size}")
    reference = coco_eval_data.load_reference(repo)
    with tempfile.TemporaryDirectory() as tmp:
        folder = pathlib.Path(tmp)
        (folder / "gt.json").write_text(json.dumps(gt))
        (folder / "res.json").write_text(json.dumps(results))
        official_times, official_stats = official_run(reference, folder, args.iou_type)  # before JAX starts threads
        cold_times, cold_stats = ours_run(folder, args.iou_type, args.batch_size, args.mask_path)
        warm_times, warm_stats = ours_run(folder, args.iou_type, args.batch_size, args.mask_path)
    import jax  # noqa: PLC0415

    from jaxseg_robust.evaluation.instances import InstanceEvalConfig  # noqa: PLC0415
    from jaxseg_robust.evaluation.mask_counts import uses_runs  # noqa: PLC0415

    settings = InstanceEvalConfig(iou_type=args.iou_type, mask_path=args.mask_path).count_settings
    print(f"device: {jax.devices()[0].device_kind} ({jax.devices()[0].platform}); pixel counts "
          f"{'from the run lengths on the host' if uses_runs(settings) else 'on the device'}")
    print(f"load average at the end: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    for stats in (cold_stats, warm_stats):
        difference = np.abs(stats - official_stats).max()
        assert difference <= 1e-6, f"summaries differ by {difference}"
    print(f"12 numbers: max |ours - official| = {np.abs(cold_stats - official_stats).max():.3g}; "
          f"AP = {official_stats[0]:.4f}")
    report("cold (XLA compilation included)", official_times, cold_times)
    report("warm (programs compiled)", official_times, warm_times)


if __name__ == "__main__":
    main()
