"""Benchmark: COCO mask AP, Boundary AP, PQ and Boundary PQ, jaxseg_robust against the other evaluators.

Two modes (docs/benchmarking.md, "COCO evaluators").

**Peers (the default).** A seeded synthetic set the size of COCO val2017
(experiments/coco_scale_data.py: 5,000 images, 36,781 ground truths, 500,000
compressed-RLE detections with boxes; for the ``pq`` / ``boundary-pq`` tasks
its panoptic variant in panopticapi's PNG + JSON format; ``--scale`` makes a
smaller one, images scaled, counts per image kept) written to ``--folder``
(or a temporary folder), then every installed evaluator run on the same
files, each in its own child process, one after the other:

* jaxseg_robust: the CLI ``jaxseg-robust coco-eval`` / ``panoptic-eval``, cold
  (an empty compilation cache) and warm (the same command again, its programs
  from the cache the cold run filled);
* vernier (``parity_mode="strict"``: ``vernier.instance.Evaluator``; for PQ
  ``vernier.panoptic.Evaluator`` on PNGs decoded here, 250 images per
  ``evaluate_to_partial``, merged by ``from_partials``) with one thread and
  with one per CPU;
* hotcoco (``hotcoco.COCOeval`` for mask AP, ``hotcoco.panoptic.PanopticEval``
  for PQ; its own thread pool);
* faster-coco-eval (``COCOeval_faster``, mask AP and Boundary AP; its boundary
  step on up to 4 CPUs);
* pycocotools (``COCOeval``, mask AP);
* boundary-iou-api (``$JAXSEG_BOUNDARY_IOU_API_REPO``, loaded as
  experiments/coco_eval_data.py does: its COCOeval and ``pq_compute``, their
  boundary and panoptic steps in a pool over every CPU).

For each it prints the wall seconds of the child process (interpreter
start, imports, reading the files, evaluation: what a user waits for), its
peak resident memory (``ru_maxrss`` from ``os.wait4`` in a small launcher
process, so that this process's memory does not count: the largest single
process of the evaluator's tree, workers it waited for included) and the
largest difference of its 12 (PQ: 9) numbers from the reference: pycocotools
for mask AP; boundary-iou-api for the other tasks, or vernier (one thread)
when the checkout is absent. Each table says which reference it used.

**Stages** (``--stages``). One process, the Boundary IoU authors' evaluator
against ours stage by stage on the real masks (experiments/coco_eval_data.py:
perturbed copies of every ground-truth mask, spurious and empty masks, ties in
scores):

* official (bowenc0221/boundary-iou-api, ``$JAXSEG_BOUNDARY_IOU_API_REPO``):
  ``COCO(..., get_boundary=True)`` and ``loadRes`` (the per-annotation boundary
  precomputation with its multiprocessing pool over all cores), then
  ``COCOeval.evaluate`` and ``accumulate``;
* ours (`jaxseg_robust.evaluation.instances`): reading and checking the files
  (``prepare_instances``), the pixel counts (``count_pairs``: for Boundary AP
  each mask decoded from its runs into packed bits on the tight crop of its
  box, the bands eroded on the device in chunks of crops of many images (the
  first run including XLA compilation), the band intersections of the pairs
  read on the host where their crops overlap and the mask intersections from
  the run lengths (evaluation/crop_counts.py); for mask AP on a CPU the
  intersections of the run lengths on the host), then similarities, matching
  and accumulation (``finish_instances``).

Both stages and the ratios ``official / ours`` are printed for a cold run
(compilation included) and a warm one; the 12 numbers of both are checked to
agree within 1e-6 first. Respects ``JAX_PLATFORMS``; ``--batch-size`` = masks
per device call (Boundary AP: chunks of ``--batch-size`` x 4,096 crop words). For fair CPU timings set the allocator as in
docs/benchmarking.md; the script prints the ``MALLOC_*`` settings it ran with.

Run: ``python experiments/benchmarks/bench_coco_eval.py [--scale 0.1] [--tasks segm boundary pq boundary-pq]
[--folder DIR [--reuse]] [--evaluators NAME ...]`` (peers; ``pip install -e ".[benchmark]"``), or
``JAXSEG_BOUNDARY_IOU_API_REPO=/path/to/boundary-iou-api JAXSEG_REAL_DATA=/path/to/real python
experiments/benchmarks/bench_coco_eval.py --stages [--iou-type segm|boundary] [--copies 6] [--batch-size 64]
[--mask-path auto|runs|device]``. In the stages mode mask AP counts come from the run lengths on the host
(``--mask-path auto`` or ``runs``); ``--mask-path device`` times the packed-bit device path instead.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import dataclasses
import importlib.metadata
import io
import json
import os
import pathlib
import platform
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "experiments"))

import coco_eval_data  # noqa: E402
import coco_scale_data  # noqa: E402

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


def stages_main(args) -> None:
    """The stages mode: official against ours on the real masks, cold and warm, in this process."""
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



# ---- peers: one child process per evaluator ------------------------------------------------------------

TASK_TITLES = {"segm": "mask AP", "boundary": "Boundary AP", "pq": "PQ", "boundary-pq": "Boundary PQ"}
PANOPTIC_TASKS = ("pq", "boundary-pq")
# panopticapi's 9 numbers, in the order every table and comparison uses
PANOPTIC_NAMES = ("PQ_all", "SQ_all", "RQ_all", "PQ_things", "SQ_things", "RQ_things", "PQ_stuff", "SQ_stuff",
                  "RQ_stuff")
GiB = 1024 ** 3


@dataclasses.dataclass(frozen=True)
class Peer:
    """One evaluator of the peers mode.

    ``tasks``: what it evaluates (`TASK_TITLES` keys); ``launch``: ``"cli"``
    (a ``jaxseg-robust`` command, numbers read from its ``--out`` CSV) or
    ``"worker"`` (this script with ``--worker worker``, numbers written as
    JSON); ``package``: the distribution whose version the header prints and
    whose absence skips the peer (``None``: the boundary-iou-api checkout);
    ``cache``: ``"cold"`` empties the CLI's compilation cache first,
    ``"warm"`` reuses the cold run's.
    """

    name: str
    key: str
    package: str | None
    tasks: tuple[str, ...]
    launch: str = "worker"
    worker: str = ""
    threads: int | None = None
    cache: str = ""


def declared_peers(cpus: int) -> tuple[Peer, ...]:
    """Every evaluator the peers mode knows, in the order they run."""
    every = tuple(TASK_TITLES)
    return (
        Peer("jaxseg_robust (CLI, cold)", "jaxseg-cold", "jaxseg_robust", every, launch="cli", cache="cold"),
        Peer("jaxseg_robust (CLI, warm)", "jaxseg-warm", "jaxseg_robust", every, launch="cli", cache="warm"),
        Peer("vernier (1 thread)", "vernier-1", "vernier", every, worker="vernier", threads=1),
        Peer(f"vernier ({cpus} threads)", f"vernier-{cpus}", "vernier", every, worker="vernier", threads=cpus),
        Peer("hotcoco", "hotcoco", "hotcoco", ("segm", "pq"), worker="hotcoco"),
        Peer("faster-coco-eval", "faster-coco-eval", "faster-coco-eval", ("segm", "boundary"),
             worker="faster-coco-eval"),
        Peer("pycocotools", "pycocotools", "pycocotools", ("segm",), worker="pycocotools"),
        Peer("boundary-iou-api", "boundary-iou-api", None, every, worker="boundary-iou-api"),
    )


def reference_key(task: str, available: set[str]) -> str | None:
    """The peer whose numbers the others are compared with (None when it is not installed)."""
    order = ("pycocotools",) if task == "segm" else ("boundary-iou-api", "vernier-1")
    return next((key for key in order if key in available), None)


def installed_version(peer: Peer) -> str | None:
    """The peer's installed version ("checkout" for boundary-iou-api), or None when it is absent."""
    if peer.package is None:
        return "checkout" if coco_eval_data.reference_repo() is not None else None
    try:
        return importlib.metadata.version(peer.package)
    except importlib.metadata.PackageNotFoundError:
        return None


# ---- the child side: one evaluator on the set's files, its 12 (AP) or 9 (PQ) numbers --------------------

def instance_paths(folder: pathlib.Path) -> tuple[str, str]:
    """(ground truth, results) of the instance set in ``folder``."""
    return tuple(str(folder / coco_scale_data.INSTANCE_FILES[key]) for key in ("gt", "results"))


def panoptic_paths(folder: pathlib.Path) -> dict[str, str]:
    """gt_json, gt_folder, pred_json, pred_folder of the panoptic set in ``folder``."""
    return {key: str(folder / name) for key, name in coco_scale_data.PANOPTIC_FILES.items()}


def pycocotools_stats(evaluator_class, gt, dt, iou_type: str) -> list[float]:
    """``evaluate``, ``accumulate``, ``summarize`` of a pycocotools-style COCOeval; its 12 numbers."""
    evaluator = evaluator_class(gt, dt, iouType=iou_type)
    evaluator.evaluate()
    evaluator.accumulate()
    evaluator.summarize()
    return [float(v) for v in evaluator.stats]


def vernier_panoptic_images(paths: dict, chunk: int):
    """Chunks of ``(image id, gt id map, gt segments_info, pred id map, pred segments_info)`` (vernier's input)."""
    from vernier.panoptic import decode_label_map_png  # noqa: PLC0415

    documents = {name: json.loads(pathlib.Path(paths[f"{name}_json"]).read_text(encoding="utf-8"))
                 for name in ("gt", "pred")}
    predictions = {entry["image_id"]: entry for entry in documents["pred"]["annotations"]}
    entries = documents["gt"]["annotations"]
    for start in range(0, len(entries), chunk):
        yield [(entry["image_id"],
                decode_label_map_png(pathlib.Path(paths["gt_folder"]) / entry["file_name"]).astype(np.uint32),
                json.dumps(entry["segments_info"]).encode(),
                decode_label_map_png(pathlib.Path(paths["pred_folder"]) / predictions[entry["image_id"]]["file_name"]
                                     ).astype(np.uint32),
                json.dumps(predictions[entry["image_id"]]["segments_info"]).encode())
               for entry in entries[start:start + chunk]]


def vernier_stats(folder: pathlib.Path, task: str, threads: int | None) -> list:
    """vernier in strict (pycocotools / panopticapi / boundary-iou-api) parity mode.

    Instances: the native ``vernier.instance.Evaluator`` on the two files.
    Panoptic: vernier reads no PNG files itself, so the id maps are decoded
    (its ``decode_label_map_png``) and evaluated 250 images at a time
    (``evaluate_to_partial``, one rank per chunk, per-image deltas kept as
    strict mode needs them), then merged (``from_partials``).
    """
    if task in PANOPTIC_TASKS:
        from vernier.panoptic import Evaluator as PanopticEvaluator  # noqa: PLC0415

        boundary = task == "boundary-pq"
        paths = panoptic_paths(folder)
        categories = json.dumps(json.loads(pathlib.Path(paths["gt_json"]).read_text())["categories"]).encode()
        evaluator = PanopticEvaluator(parity_mode="strict", boundary=boundary)
        partials = [evaluator.evaluate_to_partial(images, categories=categories, rank_id=rank,
                                                  retain_per_image_deltas=True, num_threads=threads)
                    for rank, images in enumerate(vernier_panoptic_images(paths, 250))]
        summary = PanopticEvaluator.from_partials(categories, partials, parity_mode="strict", boundary=boundary,
                                                  retain_per_image_deltas=True)
        return [float(v) for v in (summary.pq, summary.sq, summary.rq, summary.pq_things, summary.sq_things,
                                   summary.rq_things, summary.pq_stuff, summary.sq_stuff, summary.rq_stuff)]
    from vernier.instance import Boundary, CocoDataset, Evaluator, Segm  # noqa: PLC0415

    gt, results = (pathlib.Path(path) for path in instance_paths(folder))
    evaluator = Evaluator(iou=Boundary() if task == "boundary" else Segm(), parity_mode="strict")
    summary = evaluator.evaluate(CocoDataset.from_json(gt.read_bytes()), results.read_bytes(), num_threads=threads)
    return [float(v) for v in summary.stats]


def hotcoco_stats(folder: pathlib.Path, task: str, threads: int | None) -> list:
    """hotcoco's COCOeval (mask AP) or PanopticEval (PQ)."""
    import hotcoco  # noqa: PLC0415

    if task == "pq":
        from hotcoco.panoptic import PanopticEval  # noqa: PLC0415

        paths = panoptic_paths(folder)
        evaluator = PanopticEval(paths["gt_json"], paths["pred_json"], gt_folder=paths["gt_folder"],
                                 pred_folder=paths["pred_folder"])
        evaluator.evaluate()
        return [float(v) for v in evaluator.stats]
    gt_path, results = instance_paths(folder)
    gt = hotcoco.COCO(gt_path)
    return pycocotools_stats(hotcoco.COCOeval, gt, gt.load_res(results), task)


def faster_coco_eval_stats(folder: pathlib.Path, task: str, threads: int | None) -> list:
    """faster-coco-eval's ``COCOeval_faster`` (its C++ matching and accumulation)."""
    from faster_coco_eval import COCO, COCOeval_faster  # noqa: PLC0415

    gt_path, results = instance_paths(folder)
    gt = COCO(gt_path)
    return pycocotools_stats(COCOeval_faster, gt, gt.loadRes(results), task)


def plain_pycocotools_stats(folder: pathlib.Path, task: str, threads: int | None) -> list:
    """pycocotools' COCOeval (mask AP)."""
    from pycocotools.coco import COCO  # noqa: PLC0415
    from pycocotools.cocoeval import COCOeval  # noqa: PLC0415

    gt_path, results = instance_paths(folder)
    gt = COCO(gt_path)
    return pycocotools_stats(COCOeval, gt, gt.loadRes(results), task)


def boundary_iou_api_stats(folder: pathlib.Path, task: str, threads: int | None) -> list:
    """The Boundary IoU authors' evaluators: COCO (boundaries precomputed on load) and panoptic ``pq_compute``."""
    reference = coco_eval_data.load_reference(coco_eval_data.reference_repo())
    if task in PANOPTIC_TASKS:
        paths = panoptic_paths(folder)
        result = reference.panoptic.pq_compute(paths["gt_json"], paths["pred_json"], paths["gt_folder"],
                                               paths["pred_folder"], iou_type="boundary" if task == "boundary-pq"
                                               else "segm")
        return [float(result[group][metric]) for group in ("All", "Things", "Stuff") for metric in ("pq", "sq", "rq")]
    gt_path, results = instance_paths(folder)
    gt = reference.coco.COCO(gt_path, get_boundary=task == "boundary")
    return pycocotools_stats(reference.cocoeval.COCOeval, gt, gt.loadRes(results), task)


WORKERS = {"vernier": vernier_stats, "hotcoco": hotcoco_stats, "faster-coco-eval": faster_coco_eval_stats,
           "pycocotools": plain_pycocotools_stats, "boundary-iou-api": boundary_iou_api_stats}


def worker_main(args) -> None:
    """The child side: one evaluator's numbers written to ``--stats-out`` as JSON."""
    stats = WORKERS[args.worker](pathlib.Path(args.folder), args.task, args.threads)
    pathlib.Path(args.stats_out).write_text(json.dumps(stats), encoding="utf-8")


# ---- the parent side ------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class ChildRun:
    """One evaluator's run: wall seconds, peak RSS (bytes), exit code, its 12 numbers (None if it failed)."""

    seconds: float
    peak_rss: int
    exit_code: int
    stats: np.ndarray | None
    log: pathlib.Path


# The launcher between this process and each evaluator: a process that exec'd a small interpreter and imports
# only os / sys / json / time, so the peak RSS the kernel carries into its child across fork and exec (the
# forking process's high-water mark) is a few MiB, not this process's (which held the set's ground truth).
LAUNCHER = """
import json, os, sys, time
report, command = sys.argv[1], sys.argv[2:]
start = time.perf_counter()
pid = os.fork()
if pid == 0:
    try:
        os.execv(command[0], command)
    finally:
        os._exit(127)
_, status, usage = os.wait4(pid, 0)
seconds = time.perf_counter() - start
with open(report, "w") as handle:
    json.dump({"seconds": seconds, "peak_rss_kib": usage.ru_maxrss, "exit_code": os.waitstatus_to_exitcode(status)},
              handle)
"""


def timed_child(command: list[str], log: pathlib.Path) -> tuple[float, int, int]:
    """Runs ``command`` (stdout and stderr to ``log``) under `LAUNCHER`; (wall s, peak RSS bytes, exit code).

    The seconds run from the launcher's fork to the evaluator's exit; the peak
    RSS is ``ru_maxrss`` of ``os.wait4`` on the evaluator's process (KiB on
    Linux): its own high-water mark or that of the largest child it waited for.
    """
    report = log.with_suffix(".usage.json")
    with open(log, "wb") as handle:
        subprocess.run([sys.executable, "-c", LAUNCHER, str(report), *command], stdout=handle,
                       stderr=subprocess.STDOUT, check=True)
    usage = json.loads(report.read_text(encoding="utf-8"))
    return usage["seconds"], usage["peak_rss_kib"] * 1024, usage["exit_code"]


def cli_executable() -> str:
    """The ``jaxseg-robust`` console script beside this interpreter (else the one on PATH)."""
    beside = pathlib.Path(sys.executable).with_name("jaxseg-robust")
    found = str(beside) if beside.is_file() else shutil.which("jaxseg-robust")
    if found is None:
        sys.exit("bench_coco_eval: no jaxseg-robust command beside the interpreter or on PATH (pip install -e .)")
    return found


def cli_stats(csv_path: pathlib.Path, task: str) -> np.ndarray:
    """The numbers of a ``coco-eval`` / ``panoptic-eval`` ``--out`` CSV, in COCOeval's / panopticapi's order."""
    from jaxseg_robust.metrics.coco_ap import COCO_SUMMARY_NAMES  # noqa: PLC0415

    with open(csv_path, newline="", encoding="utf-8") as handle:
        values = {row["metric"]: float(row["value"]) for row in csv.DictReader(handle)}
    return np.array([values[name] for name in (PANOPTIC_NAMES if task in PANOPTIC_TASKS else COCO_SUMMARY_NAMES)])


def cli_command(task: str, folder: pathlib.Path, cache: pathlib.Path, out: pathlib.Path) -> list[str]:
    """The ``jaxseg-robust`` command line of one task on the set in ``folder``, numbers to ``out``."""
    head = [cli_executable(), "--compile-cache", str(cache)]
    tail = ["--progress", "none", "--out", str(out)]
    if task in PANOPTIC_TASKS:
        paths = panoptic_paths(folder)
        return head + ["panoptic-eval", "--gt-json", paths["gt_json"], "--gt-folder", paths["gt_folder"],
                       "--pred-json", paths["pred_json"], "--pred-folder", paths["pred_folder"],
                       "--iou-type", "boundary" if task == "boundary-pq" else "segm"] + tail
    gt, results = instance_paths(folder)
    return head + ["coco-eval", "--gt", gt, "--results", results, "--iou-type", task] + tail


def run_peer(peer: Peer, task: str, folder: pathlib.Path, work: pathlib.Path) -> ChildRun:
    """Runs one peer on the set in ``folder`` in its own child process and reads its numbers back."""
    stem = work / f"{peer.key}-{task}"
    if peer.launch == "cli":
        cache = work / f"compile-cache-{task}"
        if peer.cache == "cold":
            shutil.rmtree(cache, ignore_errors=True)
        out = stem.with_suffix(".csv")
        command = cli_command(task, folder, cache, out)
    else:
        out = stem.with_suffix(".json")
        command = [sys.executable, str(pathlib.Path(__file__).resolve()), "--worker", peer.worker, "--task", task,
                   "--folder", str(folder), "--stats-out", str(out)]
        command += [] if peer.threads is None else ["--threads", str(peer.threads)]
    log = stem.with_suffix(".log")
    seconds, peak_rss, exit_code = timed_child(command, log)
    stats = None
    if exit_code == 0:
        stats = (cli_stats(out, task) if peer.launch == "cli"
                 else np.array(json.loads(out.read_text(encoding="utf-8"))))
    return ChildRun(seconds, peak_rss, exit_code, stats, log)


def last_line(path: pathlib.Path) -> str:
    """The last non-empty line of a child's log (why it failed)."""
    lines = [line for line in path.read_text(encoding="utf-8", errors="replace").splitlines() if line.strip()]
    return lines[-1].strip() if lines else "(no output)"


def difference_text(stats: np.ndarray | None, reference: np.ndarray | None) -> str:
    """The largest |difference| of the numbers from the reference's: "0 (bit-identical)", a number, or "n/a"."""
    if stats is None or reference is None:
        return "n/a"
    largest = float(np.abs(stats - reference).max())
    return "0 (bit-identical)" if np.array_equal(stats, reference) else f"{largest:.3g}"


def peer_table(task: str, runs: dict, peers: dict, reference: str | None) -> str:
    """The Markdown table of one task: a row per peer that ran."""
    reference_stats = runs[reference].stats if reference in runs else None
    reference_name = peers[reference].name if reference in peers else "none installed"
    count, first = (9, "PQ") if task in PANOPTIC_TASKS else (12, "AP")
    lines = [f"{TASK_TITLES[task]} (reference: {reference_name})", "",
             f"| evaluator | time (s) | peak RSS (GiB) | max abs diff of the {count} numbers | {first} |",
             "|---|---|---|---|---|"]
    for key, run in runs.items():
        if run.stats is None:
            lines.append(f"| {peers[key].name} | failed (exit code {run.exit_code}: {last_line(run.log)}) | | | |")
            continue
        lines.append(f"| {peers[key].name} | {run.seconds:.1f} | {run.peak_rss / GiB:.2f} | "
                     f"{difference_text(run.stats, reference_stats)} | {run.stats[0]:.4f} |")
    return "\n".join(lines)


def cpu_model() -> str:
    """The CPU's model name, family and model from /proc/cpuinfo (docs/benchmarking.md: record the CPU)."""
    fields = {}
    with contextlib.suppress(OSError):
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            fields.setdefault(key.strip(), value.strip())
    return f"{fields.get('model name', 'unknown CPU')} (family {fields.get('cpu family', '?')}, " \
           f"model {fields.get('model', '?')})"


def set_folder(args, folder: pathlib.Path) -> None:
    """Writes (and times) the sets the tasks need into ``folder``, unless ``--reuse`` finds them there."""
    spec = coco_scale_data.scaled_spec(args.scale, args.seed)
    needed = []
    if any(task not in PANOPTIC_TASKS for task in args.tasks):
        needed.append(("instance", coco_scale_data.INSTANCE_FILES, coco_scale_data.write_instance_set))
    if any(task in PANOPTIC_TASKS for task in args.tasks):
        needed.append(("panoptic", coco_scale_data.PANOPTIC_FILES, coco_scale_data.write_panoptic_set))
    for kind, names, write in needed:
        if args.reuse and all((folder / name).exists() for name in names.values()):
            print(f"reusing the {kind} set in {folder}")
            continue
        start = time.perf_counter()
        written = write(folder, spec)
        counts = ", ".join(f"{value} {key}" for key, value in written.items() if isinstance(value, int))
        print(f"{kind} set (scale {args.scale}, seed {args.seed}): {counts}, written in "
              f"{time.perf_counter() - start:.1f} s", flush=True)


def selected_peers(args) -> dict:
    """The peers asked for (``--evaluators``) that are installed, by key; prints the skipped ones."""
    peers = {}
    for peer in declared_peers(os.cpu_count() or 1):
        if args.evaluators and not any(peer.key.startswith(name) for name in args.evaluators):
            continue
        version = installed_version(peer)
        if version is None:
            print(f"skipped {peer.name}: not installed"
                  + (f" (set {coco_eval_data.REFERENCE_ENV})" if peer.package is None else ""))
            continue
        print(f"{peer.name}: {version}")
        peers[peer.key] = peer
    return peers


def peers_main(args) -> None:
    """The peers mode: the sets, then every installed evaluator in a child process, a table per task."""
    malloc = {key: os.environ.get(key) for key in MALLOC_VARIABLES}
    print(f"python {platform.python_version()}, {os.cpu_count()} CPUs: {cpu_model()}")
    print(f"allocator: {malloc}{'' if malloc == TUNED_MALLOC else '  (NOT the tuned setting of docs/benchmarking.md)'}")
    peers = selected_peers(args)
    with tempfile.TemporaryDirectory() as tmp:
        folder = pathlib.Path(args.folder or tmp)
        set_folder(args, folder)
        work = pathlib.Path(tmp) / "runs"
        work.mkdir()
        tables = []
        for task in args.tasks:
            print(f"load average before {task}: {' '.join(f'{v:.2f}' for v in os.getloadavg())}", flush=True)
            runs = {}
            for key, peer in peers.items():
                if task in peer.tasks:
                    runs[key] = run_peer(peer, task, folder, work)
                    print(f"  {task:11s} {peer.name:28s} {runs[key].seconds:8.1f} s  exit {runs[key].exit_code}",
                          flush=True)
            tables.append(peer_table(task, runs, peers, reference_key(task, set(runs))))
        print(f"load average at the end: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
        print("\n" + "\n\n".join(tables))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--stages", action="store_true",
                        help="stage-by-stage against boundary-iou-api on the real masks (default: the peers mode)")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of the synthetic sets (peers) or of the detections (stages; default %(default)s)")
    peers = parser.add_argument_group("peers mode")
    peers.add_argument("--scale", type=float, default=1.0,
                       help="size of the synthetic sets, 1 = COCO val2017's (default %(default)s)")
    peers.add_argument("--tasks", nargs="+", choices=tuple(TASK_TITLES), default=["segm", "boundary"],
                       help="mask AP, Boundary AP, PQ, Boundary PQ (default: %(default)s)")
    peers.add_argument("--folder", help="write (or with --reuse, read) the sets here (default: a temporary folder)")
    peers.add_argument("--reuse", action="store_true", help="use the sets already in --folder")
    peers.add_argument("--evaluators", nargs="+", metavar="NAME",
                       help="only these (jaxseg, vernier, hotcoco, faster, pycocotools, boundary; default: all)")
    stages = parser.add_argument_group("stages mode")
    stages.add_argument("--iou-type", choices=("segm", "boundary"), default="boundary")
    stages.add_argument("--copies", type=int, default=6, help="up to this many detections per ground truth")
    stages.add_argument("--batch-size", type=int, default=64, help="masks per device call")
    stages.add_argument("--mask-path", choices=("auto", "runs", "device"), default="auto",
                        help="where mask AP counts are taken (auto = runs: from the run lengths on the host)")
    stages.add_argument("--real-data",
                        default=os.environ.get("JAXSEG_REAL_DATA", str(ROOT.parent / "shared" / "data" / "real")))
    worker = parser.add_argument_group("child process (internal)")
    worker.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    worker.add_argument("--task", choices=tuple(TASK_TITLES), help=argparse.SUPPRESS)
    worker.add_argument("--stats-out", help=argparse.SUPPRESS)
    worker.add_argument("--threads", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not args.scale > 0:
        parser.error(f"--scale must be positive, got {args.scale}")
    if args.reuse and not args.folder:
        parser.error("--reuse needs --folder (the folder that holds the sets)")
    if args.worker:
        worker_main(args)
    elif args.stages:
        stages_main(args)
    else:
        peers_main(args)


if __name__ == "__main__":
    main()
