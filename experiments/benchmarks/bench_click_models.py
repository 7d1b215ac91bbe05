"""Click-map models (RITM-H18, SimpleClick ViT-B) vs the authors' PyTorch code, one run.

Usage (CPU: under the lock, tuned allocator, as docs/benchmarking.md recommends; the
script records it):

    flock /tmp/cpu.lock env MALLOC_MMAP_THRESHOLD_=4294967296 \\
        MALLOC_TRIM_THRESHOLD_=68719476736 MALLOC_TOP_PAD_=1073741824 \\
        python experiments/benchmarks/bench_click_models.py \\
        --models ritm_h18 simpleclick_vit_b --stages noc20 tetris \\
        --batch-size 1 --ref-instances 1 --repeats 1

The checkouts of the authors' repositories come from ``--ritm-repo`` /
``--simpleclick-repo`` (default: $JAXSEG_RITM_REPO / $JAXSEG_SIMPLECLICK_REPO);
paths may be relative to the current directory (e.g. a git-ignored
``.bench_ref/`` folder inside this repository). The image and its object mask
come from ``--image`` / ``--mask`` (default: the DAVIS samples of
$JAXSEG_REAL_DATA or ../shared/data/real, else a generated disk image).

Both sides get the same random weights: the authors' model is built from
their repository (tests/isegm_reference.py; one ``isegm`` package per process,
so each reference runs in its own spawned process), randomised, made to
follow its clicks (`isegm_reference.sharpen_clicks_`, so the zoom-in moves as
on real predictions), saved in their checkpoint format and converted with
``python -m ports``. ``--order``: on a GPU (``grouped``) all reference runs
happen before JAX starts, so the two never hold device memory at the same
time; on a CPU (``stagewise``) each stage runs on the reference (a fresh
process, the same seeded build) and then on ours, so the two timings of a
stage are minutes apart, not an hour: this machine's speed drifts by more
than 10 % within an hour (docs/benchmarking.md). Per model, at the authors'
evaluation input size (RITM 400 x 400, its ``fixed400`` zoom; SimpleClick
448 x 448), the stages (``--stages``):

  * ``forward``: ``model(image, points)["instances"]`` (torch, batch B, no
    grad) vs our jitted ``grid_logits`` vmapped over B instances;
  * ``fwd_bwd``: the gradient of ``sum(sigmoid(logits) * W)`` w.r.t. the
    click input: torch autograd w.r.t. the click maps (the authors' rendering
    is not differentiable), batch B, vs ours w.r.t. the click coordinates
    through the soft disk rendering, vmapped over B;
  * ``noc20``: the baseline NoC loop: the authors' ``evaluate_sample`` (their
    clicker, predictor with zoom-in and flip, 20 clicks, no early stop) on the
    full image, one instance at a time, vs our jitted ``noc_trajectory``
    vmapped over B instances. The first instance's IoUs per click are
    compared (``max|dIoU|``) so both sides are seen doing the same work;
  * ``tetris``: the TETRIS attack, MIN + MAX, ``--tetris-clicks`` (10) clicks
    x ``--tetris-iterates`` (11) evaluated iterates, on DAVIS images resized
    to 400 / 448 squares, both sides through the authors' predictor (zoom-in
    ``fixed400`` / ``fixed448`` and flip): the authors' loop for RITM-style
    models restated in torch on their own ``ZoomIn`` / ``AddHorizontalFlip``
    one instance and one mode at a time (``isegm_tetris_reference.py``,
    ``predictor_trajectory``, which says how and why it is restated) vs the
    library's ``make_click_batch_fn(mode="minmax", predictor="authors")``
    (the `runner.program.BatchProgram` the ``tetris`` command runs, with the
    click-map family's settings: disks rendered differentiably, the step from
    the crop's diagonal, threshold 0.49) on one `PaddedBatch` of B
    instances. Cross-check: click 1's iterate-0 IoU of both sides (MIN and
    MAX) on the first instance must agree within 1e-3.

The reference runs on ``--ref-instances`` instances (one at a time), ours on
one batch of ``--batch-size``; both are reported per instance. Reported:
milliseconds, instances/s, and the ratio torch time / jax time (> 1:
jaxseg_robust is faster); the jax first call (compile + one run) is reported
apart. Each timing is the median of ``--repeats`` runs after one warm-up
(``noc20``: ``max(1, repeats // 2)``; ``tetris``: ``--tetris-repeats`` on our
side, or with ``--tetris-repeats 0`` the first call's compiled run alone, its
compile excluded, which halves a long run; the reference after an untimed
1-click x 2-iterate warm-up). Every
phase (model build, sharpening, each stage, port, compiles) is logged with its
wall time as it ends, so a run that is cut off still shows where the time
went. JAX uses its default backend (``JAX_PLATFORMS`` respected); torch uses
``--torch-device`` (default: CUDA when available), so the same command runs on
a GPU machine, where ``--batch-size`` sets the instances per call that fill it.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import multiprocessing
import os
import pathlib
import platform
import statistics
import sys
import tempfile
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
# JAX must not grab the GPU before the reference runs (and leaves memory to it); harmless on CPU.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

TUNED_MALLOC = {"MALLOC_MMAP_THRESHOLD_": "4294967296", "MALLOC_TRIM_THRESHOLD_": "68719476736",
                "MALLOC_TOP_PAD_": "1073741824"}
MODELS = {  # name -> (repository, variant, input size, options family)
    "ritm_h18": ("ritm", "hrnet18", 400, "ritm"),
    "simpleclick_vit_b": ("simpleclick", "vit_b", 448, "simpleclick"),
    "simpleclick_vit_xt": ("simpleclick", "vit_xt", 448, "simpleclick"),
}
REPO_ENV = {"ritm": "JAXSEG_RITM_REPO", "simpleclick": "JAXSEG_SIMPLECLICK_REPO"}
STAGES = ("forward", "fwd_bwd", "noc20", "tetris")
CLICKS = [(200, 210, True), (120, 300, True), (330, 90, False), (60, 60, False)]
N_CLICKS = 20
SEED = 0
TETRIS_THRESHOLD = 0.49  # the click-map family's probability_threshold (docs/protocols/tetris.md)


def log(message: str, start: float | None = None) -> None:
    """A progress line on stderr (with the seconds since ``start``), flushed at once."""
    suffix = "" if start is None else f" ({time.perf_counter() - start:.1f} s)"
    print(f"[{time.strftime('%H:%M:%S')}] {message}{suffix}", file=sys.stderr, flush=True)


def timed(fn, repeats: int) -> tuple[float, float]:
    """(first call s, median s of ``repeats`` further calls)."""
    start = time.perf_counter()
    fn()
    first = time.perf_counter() - start
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return first, statistics.median(times)


def cpu_description() -> str:
    """The CPU's model name, family / model numbers and widest vector extension (Linux), e.g.
    ``AMD EPYC, family 26 model 2, avx512``: machines of one name differ by a factor of 2 in
    both libraries' speed, and not by the same factor (docs/models/click_models.md)."""
    try:
        text = pathlib.Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or "unknown"
    fields = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    flags = fields.get("flags", "").split()
    vector = "avx512" if "avx512f" in flags else "avx2" if "avx2" in flags else "no avx2"
    return (f"{fields.get('model name', 'unknown')}, family {fields.get('cpu family', '?')} "
            f"model {fields.get('model', '?')}, {vector}")


def davis_pairs(root: pathlib.Path) -> list[tuple[str, str]]:
    """(image, mask) paths of the shared DAVIS samples, sorted; empty when absent."""
    images = sorted((root / "davis" / "images").glob("*.jpg"))
    return [(str(p), str(root / "davis" / "masks" / f"{p.stem}.png")) for p in images
            if (root / "davis" / "masks" / f"{p.stem}.png").is_file()]


def load_pair(image_path: str | None, mask_path: str | None, size: int | None = None):
    """(uint8 image [H, W, 3], bool mask [H, W]), optionally resized to size x size.

    Without ``image_path``: a generated disk on noise.
    """
    from PIL import Image  # noqa: PLC0415

    if image_path is None:
        yy, xx = np.mgrid[:480, :854]
        obj = (yy - 240) ** 2 + (xx - 400) ** 2 < 150 ** 2
        rng = np.random.default_rng(0)
        image = Image.fromarray((rng.uniform(0, 60, (480, 854, 3)) + 150 * obj[..., None])
                                .astype(np.uint8))
        mask = Image.fromarray(obj.astype(np.uint8))
    else:
        if mask_path is None:
            raise SystemExit(f"--image {image_path} needs --mask (the object mask of the NoC loop)")
        image = Image.open(image_path).convert("RGB")
        mask = Image.open(mask_path)
        if mask.size != image.size:
            raise SystemExit(f"--mask {mask_path} is {mask.size}, the image {image.size}")
    if size is not None:
        image = image.resize((size, size), Image.BILINEAR)
        mask = mask.resize((size, size), Image.NEAREST)
    m = np.asarray(mask)
    return np.asarray(image), (m if m.ndim == 2 else m[..., 0]) != 0


def instance_sources(args) -> list[tuple[str | None, str | None]]:
    """(image, mask) paths of the instances: ``--image``, else the DAVIS samples, else generated."""
    if args.image is not None:
        return [(args.image, args.mask)]
    root = pathlib.Path(os.environ.get("JAXSEG_REAL_DATA", ROOT.parent / "shared/data/real"))
    return davis_pairs(root) or [(None, None)]


def square_instances(sources, count: int, size: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """``count`` TETRIS instances: the sources (cycled) resized to size x size, non-empty masks."""
    pairs = [load_pair(image, mask, size) for image, mask in sources]
    pairs = [pair for pair in pairs if pair[1].any()] or pairs
    return [pairs[i % len(pairs)] for i in range(count)]


def torch_device(requested: str) -> str:
    """"cpu" or "cuda" ("auto": CUDA when available); refuses CUDA without a GPU."""
    import torch  # noqa: PLC0415

    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--torch-device cuda: torch sees no CUDA device")
    return requested


def torch_stages(model, size: int, batch: int, repeats: int, pair: tuple, device: str,
                 stages) -> dict:
    """The authors' model timed on ``forward`` / ``fwd_bwd`` / ``noc20`` (those asked for)."""
    import isegm_reference as ir  # noqa: PLC0415
    import torch  # noqa: PLC0415
    from isegm.inference.evaluation import evaluate_sample  # noqa: PLC0415
    from isegm.inference.predictors import get_predictor  # noqa: PLC0415
    from PIL import Image  # noqa: PLC0415

    full, gt = pair
    image = np.asarray(Image.fromarray(full).resize((size, size), Image.BILINEAR))
    x = torch.cat([torch.from_numpy(image.copy()).permute(2, 0, 1)[None].float() / 255,
                   torch.zeros(1, 1, size, size)], 1).repeat(batch, 1, 1, 1).to(device)
    points = ir.points_tensor(CLICKS).repeat(batch, 1, 1).to(device)
    weights = torch.from_numpy(np.random.default_rng(7).standard_normal((size, size))
                               .astype(np.float32)).to(device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    out = {}

    def forward():
        with torch.no_grad():
            model(x, points)["instances"].cpu()
        sync()

    def fwd_bwd():
        with torch.no_grad():
            img0, prev0 = model.prepare_input(x)
            maps0 = model.get_coord_features(img0, prev0, points)
        maps = maps0.clone().requires_grad_(True)
        img, _ = model.prepare_input(x)
        logits = model.backbone_forward(img, model.maps_transform(maps))["instances"]
        logits = torch.nn.functional.interpolate(logits, size=(size, size), mode="bilinear",
                                                 align_corners=True)
        loss = (torch.sigmoid(logits[:, 0]) * weights).sum()
        torch.autograd.grad(loss, maps)
        sync()

    for stage, fn in (("forward", forward), ("fwd_bwd", fwd_bwd)):
        if stage in stages:
            start = time.perf_counter()
            out[stage] = timed(fn, repeats)
            log(f"torch {stage} (batch {batch})", start)
    if "noc20" in stages:
        predictor = get_predictor(model, "NoBRS", device, prob_thresh=0.49,
                                  zoom_in_params={"skip_clicks": -1, "target_size": (size, size)})
        result = {}

        def noc():
            result["clicks"], result["ious"], _ = evaluate_sample(
                full, gt.astype(np.int32), predictor, max_iou_thr=1.01, pred_thr=0.49,
                max_clicks=N_CLICKS)
            sync()

        start = time.perf_counter()
        out["noc20"] = timed(noc, max(1, repeats // 2))
        out["noc20_ious"] = np.asarray(result["ious"], np.float64)
        log("torch noc20 (one instance)", start)
    return out


def torch_tetris(model, instances, device: str, n_clicks: int, n_iterates: int, size: int) -> dict:
    """The restated authors' TETRIS loop through their zoom-in (``fixed<size>``) and flip, MIN then
    MAX, one instance at a time; s per instance."""
    import isegm_tetris_reference as tr  # noqa: PLC0415

    run = {"n_clicks": n_clicks, "n_iterates": n_iterates, "thr": TETRIS_THRESHOLD, "device": device,
           "target_hw": (size, size)}
    image, gt = instances[0]
    start = time.perf_counter()
    tr.predictor_trajectory(model, image, gt, maximise=True, **{**run, "n_clicks": 1, "n_iterates": 2})
    log("torch tetris warm-up (1 click x 2 iterates)", start)
    start = time.perf_counter()
    first = {}
    for index, (image, gt) in enumerate(instances):
        for mode in ("min", "max"):
            result = tr.predictor_trajectory(model, image, gt, maximise=mode == "max", **run)
            if index == 0:
                first[mode] = result
    seconds = (time.perf_counter() - start) / len(instances)
    log(f"torch tetris ({len(instances)} instances, MIN + MAX, {seconds:.2f} s per instance)", start)
    return {"tetris": seconds, "tetris_first": first}


def torch_side(repo: str, variant: str, size: int, batch: int, repeats: int, pair: tuple,
               ckpt: str, stages, device: str, tetris_instances, tetris_shape) -> dict:
    """Spawned: builds, randomises, sharpens and saves the authors' model, then times it."""
    import isegm_reference as ir  # noqa: PLC0415
    import torch  # noqa: PLC0415

    start = time.perf_counter()
    ir.import_reference(repo)
    device = torch_device(device)
    model = ir.build_ritm(variant) if repo == "ritm" else ir.build_simpleclick(variant)
    ir.randomize_(model, SEED)
    model.eval()
    if repo != "ritm":
        from isegm.model.modeling.pos_embed import interpolate_pos_embed_inference  # noqa: PLC0415
        interpolate_pos_embed_inference(model.backbone, (size, size), "cpu")
    full, _ = pair
    ir.sharpen_clicks_(model, repo, full, size)
    ir.save_isegm_checkpoint(model, ckpt)
    model.to(device)
    log(f"torch {repo} {variant}: built, randomised, sharpened, saved", start)
    out = {"device": device if device == "cpu" else torch.cuda.get_device_name(),
           "threads": torch.get_num_threads()}
    out.update(torch_stages(model, size, batch, repeats, pair, device, stages))
    if "tetris" in stages:
        out.update(torch_tetris(model, tetris_instances, device, *tetris_shape, size))
    return out


def jax_stages(seg, params, size: int, family: str, batch: int, repeats: int, pair: tuple,
               stages) -> dict:
    """Times our converted model on ``forward`` / ``fwd_bwd`` / ``noc20`` (parameters are arguments)."""
    import dataclasses  # noqa: PLC0415

    import jax  # noqa: PLC0415
    import jax.numpy as jnp  # noqa: PLC0415
    from PIL import Image  # noqa: PLC0415

    from jaxseg_robust.models.clickmap.isegm import authors_options  # noqa: PLC0415
    from jaxseg_robust.models.clickmap.noc import NocConfig, noc_trajectory  # noqa: PLC0415

    soft = dataclasses.replace(seg, click_encoding="soft")
    full, gt = pair
    image = np.asarray(Image.fromarray(full).resize((size, size), Image.BILINEAR))
    x = jnp.broadcast_to(jnp.asarray(image, jnp.float32) / 255, (batch, size, size, 3))
    pts = jnp.broadcast_to(jnp.asarray([[c, r] for r, c, _ in CLICKS], jnp.float32),
                           (batch, len(CLICKS), 2))
    labels = jnp.asarray([1 if p else 0 for *_, p in CLICKS], jnp.int32)
    prev = jnp.zeros((size, size))
    weights = jnp.asarray(np.random.default_rng(7).standard_normal((size, size)), jnp.float32)
    fwd = jax.jit(jax.vmap(lambda prm, im, p: seg.grid_logits(prm, im, p, labels, prev),
                           in_axes=(None, 0, 0)))

    def loss(prm, im, p):
        return jnp.sum(jax.nn.sigmoid(soft.grid_logits(prm, im, p, labels, prev)) * weights)

    grad = jax.jit(jax.vmap(jax.grad(loss, argnums=2), in_axes=(None, 0, 0)))
    out = {}
    for stage, fn in (("forward", lambda: jax.block_until_ready(fwd(params, x, pts))),
                      ("fwd_bwd", lambda: jax.block_until_ready(grad(params, x, pts)))):
        if stage in stages:
            start = time.perf_counter()
            out[stage] = timed(fn, repeats)
            log(f"jax {stage} (batch {batch}; first call {out[stage][0]:.1f} s)", start)
    if "noc20" in stages:
        xf, tr = seg.preprocess(full)
        config = NocConfig(n_clicks=N_CLICKS, options=authors_options(family))
        noc = jax.jit(jax.vmap(lambda prm, im, g: noc_trajectory(seg, prm, im, tr.original_hw, g,
                                                                 jnp.ones_like(g), config),
                               in_axes=(None, 0, 0)))
        xb = jnp.broadcast_to(xf, (batch,) + xf.shape)
        gb = jnp.broadcast_to(jnp.asarray(gt), (batch,) + gt.shape)
        result = {}

        def run_noc():
            result["out"] = jax.block_until_ready(noc(params, xb, gb))

        start = time.perf_counter()
        out["noc20"] = timed(run_noc, max(1, repeats // 2))
        out["noc20_ious"] = np.asarray(result["out"]["ious"][0], np.float64)
        log(f"jax noc20 (batch {batch}; first call {out['noc20'][0]:.1f} s)", start)
    return out


def jax_tetris(seg, params, instances, repeats: int, n_clicks: int, n_iterates: int, size: int) -> dict:
    """The library's TETRIS MIN + MAX program on one `PaddedBatch` of the instances, through the
    authors' predictor (zoom-in ``fixed<size>`` and flip, as the reference side)."""
    import dataclasses  # noqa: PLC0415

    import jax  # noqa: PLC0415

    from jaxseg_robust.models.clickmap.isegm import IsegmOptions  # noqa: PLC0415
    from jaxseg_robust.models.clickmap.zoom_in import ZoomInConfig  # noqa: PLC0415

    from jaxseg_robust.attacks.clicks import make_click_batch_fn  # noqa: PLC0415
    from jaxseg_robust.data.buckets import pad_batch  # noqa: PLC0415
    from jaxseg_robust.data.instances import make_instance  # noqa: PLC0415

    seg = dataclasses.replace(seg, evaluation=IsegmOptions(zoom_in=ZoomInConfig(target_hw=(size, size)),
                                                           with_flip=True))
    program = make_click_batch_fn(seg, params, mode="minmax", n_clicks=n_clicks,
                                  n_opt_steps=n_iterates, predictor="authors")
    items = [make_instance(f"bench{i}", image, gt.astype(np.int8), dataset="bench")
             for i, (image, gt) in enumerate(instances)]
    batch = pad_batch(items, instances[0][1].shape, len(items))
    result = {}

    def run():
        result["out"] = jax.device_get(program(batch))

    start = time.perf_counter()
    run()
    first, first_run = time.perf_counter() - start, program.last_seconds
    if repeats > 0:
        _, seconds = timed(run, repeats)
    else:  # the first call's compiled run (compile excluded) is the timing
        seconds = first_run
    log(f"jax tetris (batch {len(items)}; first call {first:.1f} s, its compiled run "
        f"{first_run:.2f} s; timed {seconds:.2f} s)", start)
    out = result["out"]
    return {"tetris": (first, seconds), "tetris_first": {
        mode: {"iou": np.asarray(out[mode]["iou"][0], np.float64),
               "start_iou": np.asarray(out[mode]["start_iou"][0], np.float64)}
        for mode in ("min", "max")}, "traces": program.traces}


def run_reference(name: str, args, stages, pair: tuple, tetris_instances,
                  tmp: str) -> tuple[dict, str]:
    """The authors' side of one model on ``stages`` in a spawned process; returns (timings,
    checkpoint). The build is seeded, so every call saves the same checkpoint."""
    repo, variant, size, _ = MODELS[name]
    ckpt = os.path.join(tmp, f"{name}.pth")
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        ref = pool.submit(torch_side, repo, variant, size, args.batch_size, args.repeats, pair,
                          ckpt, tuple(stages), args.torch_device, tetris_instances,
                          (args.tetris_clicks, args.tetris_iterates)).result()
    return ref, ckpt


def stage_groups(args) -> list[tuple[str, ...]]:
    """The stages each reference process runs, in order: all at once (``grouped``) or one
    at a time, each followed by ours (``stagewise``)."""
    stages = [stage for stage in STAGES if stage in args.stages]
    return [tuple(stages)] if args.order == "grouped" else [(stage,) for stage in stages]


def row(name: str, stage: str, torch_per: float, jax_per: float, note: str) -> str:
    """One table row: ms and instances/s per instance, ratio torch / jax."""
    return (f"{name:<18} {stage:<8} {torch_per * 1e3:>10.1f} {jax_per * 1e3:>10.1f} "
            f"{1 / torch_per:>9.3f} {1 / jax_per:>9.3f} {torch_per / jax_per:>7.2f}  {note}")


def rows_of(name: str, ref: dict, ours: dict, args) -> list[str]:
    """Table rows of one model (stages that ran) and the TETRIS cross-check line."""
    batch, rows = args.batch_size, []
    for stage in ("forward", "fwd_bwd", "noc20"):
        if stage not in args.stages:
            continue
        torch_per = ref[stage][1] if stage == "noc20" else ref[stage][1] / batch  # one at a time
        note = f"jax first call {ours[stage][0]:.1f} s"
        if stage == "noc20":
            d_iou = np.nanmax(np.abs(ref["noc20_ious"] - ours["noc20_ious"]))
            note += f"; torch one instance per call; max|dIoU| first instance {d_iou:.2g}"
        rows.append(row(name, stage, torch_per, ours[stage][1] / batch, note))
    if "tetris" in args.stages:
        first, seconds = ours["tetris"]
        rows.append(row(name, "tetris", ref["tetris"], seconds / batch,
                        f"jax first call {first:.1f} s; torch {args.ref_instances} instance(s) one "
                        f"at a time; {args.tetris_clicks} clicks x {args.tetris_iterates} iterates, "
                        f"MIN + MAX; traces {ours['traces']}"))
        for mode in ("min", "max"):
            theirs, mine = ref["tetris_first"][mode], ours["tetris_first"][mode]
            rows.append(f"#   {name} tetris {mode}: click-1 iterate-0 IoU torch "
                        f"{theirs['start_iou'][0]:.5f} ours {mine['start_iou'][0]:.5f} "
                        f"(|d| {abs(theirs['start_iou'][0] - mine['start_iou'][0]):.1e}); "
                        f"per-click IoU torch {np.round(theirs['iou'], 4).tolist()} "
                        f"ours {np.round(mine['iou'], 4).tolist()}")
    return rows


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["ritm_h18", "simpleclick_vit_b"],
                        choices=sorted(MODELS))
    parser.add_argument("--stages", nargs="+", default=list(STAGES), choices=STAGES)
    parser.add_argument("--batch-size", type=int, default=1,
                        help="instances per call: torch batch for forward / fwd_bwd; our vmap "
                             "and our TETRIS batch")
    parser.add_argument("--ref-instances", type=int, default=1,
                        help="TETRIS instances the reference runs (one at a time; <= batch size)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tetris-repeats", type=int, default=1,
                        help="timed runs of our TETRIS batch after the first (compiling) call; "
                             "0: time the first call's compiled run (compile excluded)")
    parser.add_argument("--tetris-clicks", type=int, default=10)
    parser.add_argument("--tetris-iterates", type=int, default=11,
                        help="evaluated iterates per click (11 = the baseline click + 10 updates)")
    parser.add_argument("--torch-device", default="auto", choices=["auto", "cpu", "cuda"])
    parser.add_argument("--order", default="auto", choices=["auto", "grouped", "stagewise"],
                        help="grouped: all reference stages, then ours (GPU: the two never hold "
                             "its memory at once); stagewise: each stage on the reference, then "
                             "on ours, so that both run minutes apart, not an hour (CPU, whose "
                             "speed drifts); auto: grouped when torch runs on CUDA")
    parser.add_argument("--ritm-repo", default=os.environ.get(REPO_ENV["ritm"]),
                        help="checkout of SamsungLabs/ritm_interactive_segmentation")
    parser.add_argument("--simpleclick-repo", default=os.environ.get(REPO_ENV["simpleclick"]),
                        help="checkout of uncbiag/SimpleClick")
    parser.add_argument("--image", help="RGB image (default: the shared DAVIS samples)")
    parser.add_argument("--mask", help="its object mask (non-zero = object)")
    args = parser.parse_args(argv)
    if args.order == "auto":
        args.order = "grouped" if torch_device(args.torch_device) == "cuda" else "stagewise"
    if args.tetris_repeats < 0:
        parser.error(f"--tetris-repeats must be >= 0; got {args.tetris_repeats}")
    if not 1 <= args.ref_instances <= args.batch_size:
        parser.error(f"--ref-instances must be in [1, --batch-size]; got {args.ref_instances}")
    for repo, path in (("ritm", args.ritm_repo), ("simpleclick", args.simpleclick_repo)):
        needed = any(MODELS[m][0] == repo for m in args.models)
        if needed and not (path and (pathlib.Path(path) / "isegm").is_dir()):
            parser.error(f"--{repo}-repo (or ${REPO_ENV[repo]}) must name a checkout with an "
                         f"isegm package; got {path!r}")
        if path:  # the spawned reference processes read it from the environment
            os.environ[REPO_ENV[repo]] = str(pathlib.Path(path).resolve())
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    sources = instance_sources(args)
    pair = load_pair(*sources[0])
    squares = {name: square_instances(sources, args.batch_size, MODELS[name][2])
               for name in args.models} if "tetris" in args.stages else {}
    malloc = {k: v for k, v in os.environ.items() if k.startswith("MALLOC_")}
    load_start = os.getloadavg()[0]
    groups = stage_groups(args)
    with tempfile.TemporaryDirectory() as tmp:
        def reference(name, stages):
            return run_reference(name, args, stages, pair,
                                 squares.get(name, [])[:args.ref_instances], tmp)

        # grouped: every reference run ends before JAX starts (a GPU's memory is never shared)
        early = ({name: reference(name, groups[0]) for name in args.models}
                 if args.order == "grouped" else {})
        import jax  # noqa: PLC0415
        import torch  # noqa: PLC0415

        from jaxseg_robust.models import zoo  # noqa: PLC0415
        from ports.__main__ import main as ports_main  # noqa: PLC0415

        rows, refs = [], {}
        for name in args.models:
            repo, _, size, family = MODELS[name]
            ref, ours, model = {}, {}, None
            for stages in groups:
                part, ckpt = early[name] if name in early else reference(name, stages)
                ref.update(part)
                if model is None:
                    out = os.path.join(tmp, name)
                    start = time.perf_counter()
                    assert ports_main(["ritm" if repo == "ritm" else "simpleclick", "--checkpoint",
                                       ckpt, "--out", out]) == 0
                    model = zoo.load_params(out)[:2]
                    log(f"ported {name}", start)
                seg, params = model
                ours.update(jax_stages(seg, params, size, family, args.batch_size, args.repeats,
                                       pair, stages))
                if "tetris" in stages:
                    ours.update(jax_tetris(seg, params, squares[name], args.tetris_repeats,
                                           args.tetris_clicks, args.tetris_iterates, size))
            refs[name] = ref
            rows += rows_of(name, ref, ours, args)
        first = refs[args.models[0]]
        header = [
            (f"# bench_click_models  {time.strftime('%Y-%m-%d %H:%M:%S')}  host {platform.node()}  "
             f"cpus {os.cpu_count()} ({cpu_description()})  load at start {load_start:.2f}"),
            (f"# jax {jax.__version__} ({jax.default_backend()}: {jax.devices()[0].device_kind}), "
             f"torch {torch.__version__} ({first['device']}, {first['threads']} threads)"),
            (f"# MALLOC env: {malloc or 'none (glibc defaults)'}"
             + ("" if malloc == TUNED_MALLOC else "  [not the tuned setting of BENCHMARKING.md]")),
            (f"# image {args.image or sources[0][0] or 'generated'} {pair[0].shape[1]}x"
             f"{pair[0].shape[0]}; batch {args.batch_size}, repeats {args.repeats} (median); "
             f"per instance; ratio = torch / jax (> 1: faster); order {args.order}"),
            (f"{'model':<18} {'stage':<8} {'torch ms':>10} {'jax ms':>10} {'torch i/s':>9} "
             f"{'jax i/s':>9} {'ratio':>7}"),
        ]
        print("\n".join(header + rows + [f"# load at end {os.getloadavg()[0]:.2f}"]), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
