"""Benchmark: COCO mask AP and Boundary AP, jaxseg_robust against the other evaluators (docs/benchmarking.md).

Two modes.

**Peers (the default).** A seeded synthetic set the size of COCO val2017
(experiments/coco_scale_data.py: 5,000 images, 36,781 ground truths, 500,000
compressed-RLE detections with boxes; ``--scale`` makes a smaller one, images
scaled, counts per image kept) written to ``--folder`` (or a temporary
folder), then every installed evaluator run on the same two files, each in
its own child process, one after the other:

* jaxseg_robust: the CLI ``jaxseg-robust coco-eval``, cold (an empty
  compilation cache) and warm (the same command again, its programs from the
  cache the cold run filled);
* vernier (``vernier.instance.Evaluator``, ``parity_mode="strict"``) with one
  thread and with one per CPU;
* hotcoco (``hotcoco.COCOeval``, mask AP only; its own thread pool);
* faster-coco-eval (``COCOeval_faster``; its boundary step on up to 4 CPUs);
* pycocotools (``COCOeval``, mask AP only);
* boundary-iou-api (``$JAXSEG_BOUNDARY_IOU_API_REPO``, loaded as
  experiments/coco_eval_data.py does; its boundary step on every CPU).

For each it prints the wall seconds of the child process (interpreter
start, imports, reading the files, evaluation: what a user waits for), its
peak resident memory (``ru_maxrss`` from ``os.wait4`` in a small launcher
process, so that this process's memory does not count: the largest single
process of the evaluator's tree, workers it waited for included) and the
largest difference of its 12 numbers from the reference: pycocotools for
mask AP; boundary-iou-api for Boundary AP, or vernier (one thread) when the
checkout is absent. The table says which reference it used.

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
  RLE decode into packed bits, bands and pair counts on the device, the first
  run including XLA compilation; for mask AP on a CPU the intersections of the
  run lengths on the host), then similarities, matching and accumulation
  (``finish_instances``).

Both stages and the ratios ``official / ours`` are printed for a cold run
(compilation included) and a warm one; the 12 numbers of both are checked to
agree within 1e-6 first. Respects ``JAX_PLATFORMS``; ``--batch-size`` = masks
per device call. For fair CPU timings set the allocator as in
docs/benchmarking.md; the script prints the ``MALLOC_*`` settings it ran with.

Run: ``python experiments/benchmarks/bench_coco_eval.py [--scale 0.1] [--iou-types segm boundary]
[--folder DIR] [--evaluators NAME ...]`` (peers; ``pip install -e ".[benchmark]"``), or
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
import importlib.util
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

IOU_TYPE_TITLES = {"segm": "mask AP", "boundary": "Boundary AP"}
GiB = 1024 ** 3


@dataclasses.dataclass(frozen=True)
class Peer:
    """One evaluator of the peers mode.

    ``launch``: ``"cli"`` (the ``jaxseg-robust coco-eval`` command, numbers read
    from its ``--out`` CSV) or ``"worker"`` (this script with ``--worker
    worker``, numbers written as JSON); ``package``: the distribution whose
    version the header prints and whose absence skips the peer (``None``:
    the boundary-iou-api checkout); ``cache``: ``"cold"`` empties the CLI's
    compilation cache first, ``"warm"`` reuses the cold run's.
    """

    name: str
    key: str
    package: str | None
    iou_types: tuple[str, ...]
    launch: str = "worker"
    worker: str = ""
    threads: int | None = None
    cache: str = ""


def declared_peers(cpus: int) -> tuple[Peer, ...]:
    """Every evaluator the peers mode knows, in the order they run."""
    both = ("segm", "boundary")
    return (
        Peer("jaxseg_robust (CLI, cold)", "jaxseg-cold", "jaxseg_robust", both, launch="cli", cache="cold"),
        Peer("jaxseg_robust (CLI, warm)", "jaxseg-warm", "jaxseg_robust", both, launch="cli", cache="warm"),
        Peer("vernier (1 thread)", "vernier-1", "vernier", both, worker="vernier", threads=1),
        Peer(f"vernier ({cpus} threads)", f"vernier-{cpus}", "vernier", both, worker="vernier", threads=cpus),
        Peer("hotcoco", "hotcoco", "hotcoco", ("segm",), worker="hotcoco"),
        Peer("faster-coco-eval", "faster-coco-eval", "faster-coco-eval", both, worker="faster-coco-eval"),
        Peer("pycocotools", "pycocotools", "pycocotools", ("segm",), worker="pycocotools"),
        Peer("boundary-iou-api", "boundary-iou-api", None, both, worker="boundary-iou-api"),
    )


def reference_key(iou_type: str, available: set[str]) -> str | None:
    """The peer whose numbers the others are compared with (None when it is not installed)."""
    order = ("pycocotools",) if iou_type == "segm" else ("boundary-iou-api", "vernier-1")
    return next((key for key in order if key in available), None)


def installed_version(peer: Peer) -> str | None:
    """The peer's installed version ("checkout" for boundary-iou-api), or None when it is absent."""
    if peer.package is None:
        return "checkout" if coco_eval_data.reference_repo() is not None else None
    try:
        return importlib.metadata.version(peer.package)
    except importlib.metadata.PackageNotFoundError:
        return None


# ---- the child side: one evaluator on two files, its 12 numbers -----------------------------------------

def pycocotools_stats(evaluator_class, gt, dt, iou_type: str) -> list[float]:
    """``evaluate``, ``accumulate``, ``summarize`` of a pycocotools-style COCOeval; its 12 numbers."""
    evaluator = evaluator_class(gt, dt, iouType=iou_type)
    evaluator.evaluate()
    evaluator.accumulate()
    evaluator.summarize()
    return [float(v) for v in evaluator.stats]


def vernier_stats(gt_path: pathlib.Path, results_path: pathlib.Path, iou_type: str, threads: int | None) -> list:
    """vernier's native evaluator in strict (pycocotools / boundary-iou-api) parity mode."""
    from vernier.instance import Boundary, CocoDataset, Evaluator, Segm  # noqa: PLC0415

    evaluator = Evaluator(iou=Boundary() if iou_type == "boundary" else Segm(), parity_mode="strict")
    summary = evaluator.evaluate(CocoDataset.from_json(gt_path.read_bytes()), results_path.read_bytes(),
                                 num_threads=threads)
    return [float(v) for v in summary.stats]


def hotcoco_stats(gt_path: pathlib.Path, results_path: pathlib.Path, iou_type: str, threads: int | None) -> list:
    """hotcoco's COCOeval (mask AP)."""
    import hotcoco  # noqa: PLC0415

    gt = hotcoco.COCO(str(gt_path))
    return pycocotools_stats(hotcoco.COCOeval, gt, gt.load_res(str(results_path)), iou_type)


def faster_coco_eval_stats(gt_path: pathlib.Path, results_path: pathlib.Path, iou_type: str,
                           threads: int | None) -> list:
    """faster-coco-eval's ``COCOeval_faster`` (its C++ matching and accumulation)."""
    from faster_coco_eval import COCO, COCOeval_faster  # noqa: PLC0415

    gt = COCO(str(gt_path))
    return pycocotools_stats(COCOeval_faster, gt, gt.loadRes(str(results_path)), iou_type)


def plain_pycocotools_stats(gt_path: pathlib.Path, results_path: pathlib.Path, iou_type: str,
                            threads: int | None) -> list:
    """pycocotools' COCOeval (mask AP)."""
    from pycocotools.coco import COCO  # noqa: PLC0415
    from pycocotools.cocoeval import COCOeval  # noqa: PLC0415

    gt = COCO(str(gt_path))
    return pycocotools_stats(COCOeval, gt, gt.loadRes(str(results_path)), iou_type)


def boundary_iou_api_stats(gt_path: pathlib.Path, results_path: pathlib.Path, iou_type: str,
                           threads: int | None) -> list:
    """The Boundary IoU authors' COCO evaluator (boundaries precomputed on load, ``get_boundary``)."""
    reference = coco_eval_data.load_reference(coco_eval_data.reference_repo())
    gt = reference.coco.COCO(str(gt_path), get_boundary=iou_type == "boundary")
    return pycocotools_stats(reference.cocoeval.COCOeval, gt, gt.loadRes(str(results_path)), iou_type)


WORKERS = {"vernier": vernier_stats, "hotcoco": hotcoco_stats, "faster-coco-eval": faster_coco_eval_stats,
           "pycocotools": plain_pycocotools_stats, "boundary-iou-api": boundary_iou_api_stats}


def worker_main(args) -> None:
    """The child side: one evaluator's 12 numbers written to ``--stats-out`` as JSON."""
    stats = WORKERS[args.worker](pathlib.Path(args.gt), pathlib.Path(args.results), args.iou_type, args.threads)
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


def cli_stats(csv_path: pathlib.Path) -> np.ndarray:
    """The 12 numbers of a ``coco-eval --out`` CSV, in COCOeval's order."""
    from jaxseg_robust.metrics.coco_ap import COCO_SUMMARY_NAMES  # noqa: PLC0415

    with open(csv_path, newline="", encoding="utf-8") as handle:
        values = {row["metric"]: float(row["value"]) for row in csv.DictReader(handle)}
    return np.array([values[name] for name in COCO_SUMMARY_NAMES])


def run_peer(peer: Peer, iou_type: str, files: dict, work: pathlib.Path) -> ChildRun:
    """Runs one peer on the set in its own child process and reads its numbers back."""
    stem = work / f"{peer.key}-{iou_type}"
    if peer.launch == "cli":
        cache = work / f"compile-cache-{iou_type}"
        if peer.cache == "cold":
            shutil.rmtree(cache, ignore_errors=True)
        out = stem.with_suffix(".csv")
        command = [cli_executable(), "--compile-cache", str(cache), "coco-eval", "--gt", str(files["gt"]),
                   "--results", str(files["results"]), "--iou-type", iou_type, "--progress", "none",
                   "--out", str(out)]
    else:
        out = stem.with_suffix(".json")
        command = [sys.executable, str(pathlib.Path(__file__).resolve()), "--worker", peer.worker,
                   "--iou-type", iou_type, "--gt", str(files["gt"]), "--results", str(files["results"]),
                   "--stats-out", str(out)] + ([] if peer.threads is None else ["--threads", str(peer.threads)])
    log = stem.with_suffix(".log")
    seconds, peak_rss, exit_code = timed_child(command, log)
    stats = None
    if exit_code == 0:
        stats = cli_stats(out) if peer.launch == "cli" else np.array(json.loads(out.read_text(encoding="utf-8")))
    return ChildRun(seconds, peak_rss, exit_code, stats, log)


def last_line(path: pathlib.Path) -> str:
    """The last non-empty line of a child's log (why it failed)."""
    lines = [line for line in path.read_text(encoding="utf-8", errors="replace").splitlines() if line.strip()]
    return lines[-1].strip() if lines else "(no output)"


def difference_text(stats: np.ndarray | None, reference: np.ndarray | None) -> str:
    """The largest |difference| of 12 numbers from the reference's: "0 (bit-identical)", a number, or "n/a"."""
    if stats is None or reference is None:
        return "n/a"
    largest = float(np.abs(stats - reference).max())
    return "0 (bit-identical)" if np.array_equal(stats, reference) else f"{largest:.3g}"


def peer_table(iou_type: str, runs: dict, peers: dict, reference: str | None) -> str:
    """The Markdown table of one IoU type: a row per peer that ran."""
    reference_stats = runs[reference].stats if reference in runs else None
    reference_name = peers[reference].name if reference in peers else "none installed"
    lines = [f"{IOU_TYPE_TITLES[iou_type]} (reference: {reference_name})", "",
             "| evaluator | time (s) | peak RSS (GiB) | max abs diff of the 12 numbers | AP |",
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


def instance_files(args, folder: pathlib.Path) -> dict:
    """The set's files: written (and timed) unless ``--reuse`` finds them in the folder already."""
    if args.reuse and (folder / "gt.json").is_file() and (folder / "results.json").is_file():
        print(f"reusing {folder}/gt.json and results.json")
        return {"gt": folder / "gt.json", "results": folder / "results.json"}
    spec = coco_scale_data.scaled_spec(args.scale, args.seed)
    start = time.perf_counter()
    files = coco_scale_data.write_instance_set(folder, spec)
    print(f"set (scale {args.scale}, seed {args.seed}): {files['images']} images, {files['ground_truths']} ground "
          f"truths, {files['detections']} detections, written in {time.perf_counter() - start:.1f} s "
          f"({files['results'].stat().st_size / 1e6:.0f} MB of results)")
    return files


def selected_peers(args) -> dict:
    """The peers asked for (``--evaluators``) that are installed, by key; prints the skipped ones."""
    peers = {}
    for peer in declared_peers(os.cpu_count() or 1):
        if args.evaluators and peer.key.split("-")[0] not in args.evaluators and peer.key not in args.evaluators:
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
    """The peers mode: the set, then every installed evaluator in a child process, a table per IoU type."""
    malloc = {key: os.environ.get(key) for key in MALLOC_VARIABLES}
    print(f"python {platform.python_version()}, {os.cpu_count()} CPUs: {cpu_model()}")
    print(f"allocator: {malloc}{'' if malloc == TUNED_MALLOC else '  (NOT the tuned setting of docs/benchmarking.md)'}")
    peers = selected_peers(args)
    with tempfile.TemporaryDirectory() as tmp:
        folder = pathlib.Path(args.folder or tmp)
        files = instance_files(args, folder)
        work = pathlib.Path(tmp) / "runs"
        work.mkdir()
        tables = []
        for iou_type in args.iou_types:
            print(f"load average before {iou_type}: {' '.join(f'{v:.2f}' for v in os.getloadavg())}", flush=True)
            runs = {}
            for key, peer in peers.items():
                if iou_type in peer.iou_types:
                    runs[key] = run_peer(peer, iou_type, files, work)
                    print(f"  {iou_type:8s} {peer.name:28s} {runs[key].seconds:8.1f} s  exit {runs[key].exit_code}",
                          flush=True)
            tables.append(peer_table(iou_type, runs, peers, reference_key(iou_type, set(runs))))
        print(f"load average at the end: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
        print("\n" + "\n\n".join(tables))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--stages", action="store_true",
                        help="stage-by-stage against boundary-iou-api on the real masks (default: the peers mode)")
    peers = parser.add_argument_group("peers mode")
    peers.add_argument("--scale", type=float, default=1.0,
                       help="size of the synthetic set, 1 = COCO val2017's (default %(default)s)")
    peers.add_argument("--iou-types", nargs="+", choices=("segm", "boundary"), default=["segm", "boundary"])
    peers.add_argument("--folder", help="write (or with --reuse, read) gt.json and results.json here "
                                        "(default: a temporary folder)")
    peers.add_argument("--reuse", action="store_true", help="use the set already in --folder")
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
    parser.add_argument("--seed", type=int, default=0)
    worker = parser.add_argument_group("child process (internal)")
    worker.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    worker.add_argument("--gt", help=argparse.SUPPRESS)
    worker.add_argument("--results", help=argparse.SUPPRESS)
    worker.add_argument("--stats-out", help=argparse.SUPPRESS)
    worker.add_argument("--threads", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker_main(args)
    elif args.stages:
        stages_main(args)
    else:
        peers_main(args)


if __name__ == "__main__":
    main()
