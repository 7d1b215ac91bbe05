"""Click-map models (RITM-H18, SimpleClick ViT-B) vs the authors' PyTorch code, one run.

Usage (tuned allocator, as docs/benchmarking.md recommends; the script records it):

    MALLOC_MMAP_THRESHOLD_=4294967296 MALLOC_TRIM_THRESHOLD_=68719476736 \\
    MALLOC_TOP_PAD_=1073741824 python experiments/benchmarks/bench_click_models.py \\
        --ritm-repo PATH --simpleclick-repo PATH --image IMAGE.jpg --mask MASK.png \\
        --models ritm_h18 simpleclick_vit_b --batch-size 1 --repeats 3

The checkouts of the authors' repositories come from ``--ritm-repo`` /
``--simpleclick-repo`` (default: $JAXSEG_RITM_REPO / $JAXSEG_SIMPLECLICK_REPO);
paths may be relative to the current directory (e.g. a git-ignored
``.bench_ref/`` folder inside this repository). The image and its object mask
come from ``--image`` / ``--mask`` (default: the first DAVIS sample of
$JAXSEG_REAL_DATA or ../shared/data/real, else a generated disk image).

Both sides get the same random weights: the authors' model is built from
their repository (tests/isegm_reference.py; one ``isegm`` package per process,
so each reference runs in its own spawned process), randomised, made to
follow its clicks (`isegm_reference.sharpen_clicks_`, so the zoom-in moves as
on real predictions), saved in their checkpoint format and converted with
``python -m ports``. All reference runs happen before JAX starts, so on a GPU
the two never hold device memory at the same time. Per model, at the authors'
evaluation input size (RITM 400 x 400, its ``fixed400`` zoom; SimpleClick
448 x 448):

  * ``forward``: ``model(image, points)["instances"]`` (torch, batch B, no
    grad) vs our jitted ``grid_logits`` vmapped over B instances;
  * ``fwd+bwd``: the gradient of ``sum(sigmoid(logits) * W)`` w.r.t. the
    click input: torch autograd w.r.t. the click maps (the authors' rendering
    is not differentiable), batch B, vs ours w.r.t. the click coordinates
    through the soft disk rendering, vmapped over B;
  * ``noc20``: the authors' ``evaluate_sample`` (their clicker, predictor with
    zoom-in and flip, 20 clicks, no early stop) on one instance at a time vs
    our jitted ``noc_trajectory`` vmapped over B instances. The first
    instance's IoUs per click are compared (``max|dIoU|``) so both sides are
    seen doing the same work.

Reported per instance: milliseconds, instances/s, and the ratio torch time /
jax time (> 1: jaxseg_robust is faster); compile time (jax first call) is
reported separately. Each timing is the median of ``--repeats`` runs after one
warm-up (``noc20``: ``max(1, repeats // 2)``). JAX uses its default backend
(``JAX_PLATFORMS`` respected); torch uses CUDA when available, so the same
command runs on a GPU machine, where ``--batch-size`` sets the instances per
call that fill it.
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
STAGES = ("forward", "fwd_bwd", "noc20")
CLICKS = [(200, 210, True), (120, 300, True), (330, 90, False), (60, 60, False)]
N_CLICKS = 20
SEED = 0


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


def load_pair(image_path: str | None, mask_path: str | None, size: int | None = None):
    """(uint8 image [H, W, 3], bool mask [H, W]), optionally resized to size x size.

    Without ``image_path``: the first DAVIS sample of the shared real data, or
    a generated disk on noise when that is absent.
    """
    from PIL import Image  # noqa: PLC0415

    if image_path is None:
        root = pathlib.Path(os.environ.get("JAXSEG_REAL_DATA", ROOT.parent / "shared/data/real"))
        if (root / "davis" / "images" / "001.jpg").is_file():
            image_path = str(root / "davis" / "images" / "001.jpg")
            mask_path = mask_path or str(root / "davis" / "masks" / "001.png")
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
        image, mask = image.resize((size, size), Image.BILINEAR), mask.resize((size, size))
    m = np.asarray(mask)
    return np.asarray(image), (m if m.ndim == 2 else m[..., 0]) != 0


def torch_side(repo: str, variant: str, size: int, batch: int, repeats: int, pair: tuple,
               ckpt: str) -> dict:
    """Spawned: builds, randomises, sharpens and saves the authors' model, then times it."""
    import isegm_reference as ir  # noqa: PLC0415
    import torch  # noqa: PLC0415
    from PIL import Image  # noqa: PLC0415

    ir.import_reference(repo)
    from isegm.inference.evaluation import evaluate_sample  # noqa: PLC0415
    from isegm.inference.predictors import get_predictor  # noqa: PLC0415

    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = ir.build_ritm(variant) if repo == "ritm" else ir.build_simpleclick(variant)
    ir.randomize_(model, SEED)
    model.eval()
    if repo != "ritm":
        from isegm.model.modeling.pos_embed import interpolate_pos_embed_inference  # noqa: PLC0415
        interpolate_pos_embed_inference(model.backbone, (size, size), "cpu")
    full, gt = pair
    ir.sharpen_clicks_(model, repo, full, size)
    ir.save_isegm_checkpoint(model, ckpt)
    model.to(device)
    image = np.asarray(Image.fromarray(full).resize((size, size), Image.BILINEAR))
    x = torch.cat([torch.from_numpy(image.copy()).permute(2, 0, 1)[None].float() / 255,
                   torch.zeros(1, 1, size, size)], 1).repeat(batch, 1, 1, 1).to(device)
    points = ir.points_tensor(CLICKS).repeat(batch, 1, 1).to(device)
    weights = torch.from_numpy(np.random.default_rng(7).standard_normal((size, size))
                               .astype(np.float32)).to(device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    out = {"device": device if device == "cpu" else torch.cuda.get_device_name(),
           "threads": torch.get_num_threads()}

    def forward():
        with torch.no_grad():
            model(x, points)["instances"].cpu()
        sync()

    img0, prev0 = model.prepare_input(x)
    maps0 = model.get_coord_features(img0, prev0, points).detach()

    def fwd_bwd():
        maps = maps0.clone().requires_grad_(True)
        img, _ = model.prepare_input(x)
        logits = model.backbone_forward(img, model.maps_transform(maps))["instances"]
        logits = torch.nn.functional.interpolate(logits, size=(size, size), mode="bilinear",
                                                 align_corners=True)
        loss = (torch.sigmoid(logits[:, 0]) * weights).sum()
        torch.autograd.grad(loss, maps)
        sync()

    out["forward"] = timed(forward, repeats)
    out["fwd_bwd"] = timed(fwd_bwd, repeats)
    predictor = get_predictor(model, "NoBRS", device, prob_thresh=0.49,
                              zoom_in_params={"skip_clicks": -1, "target_size": (size, size)})
    result = {}

    def noc():
        result["clicks"], result["ious"], _ = evaluate_sample(
            full, gt.astype(np.int32), predictor, max_iou_thr=1.01, pred_thr=0.49,
            max_clicks=N_CLICKS)

    out["noc20"] = timed(noc, max(1, repeats // 2))
    out["ious"] = np.asarray(result["ious"], np.float64)
    return out


def jax_side(size: int, family: str, batch: int, repeats: int, pair: tuple,
             model_dir: str) -> dict:
    """Times our converted model on the same inputs (parameters are arguments, not constants)."""
    import dataclasses  # noqa: PLC0415

    import jax  # noqa: PLC0415
    import jax.numpy as jnp  # noqa: PLC0415
    from PIL import Image  # noqa: PLC0415

    from jaxseg_robust.models import zoo  # noqa: PLC0415
    from jaxseg_robust.models.clickmap.isegm import authors_options  # noqa: PLC0415
    from jaxseg_robust.models.clickmap.noc import NocConfig, noc_trajectory  # noqa: PLC0415

    seg, params, _ = zoo.load_params(model_dir)
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

    return {"forward": timed(lambda: jax.block_until_ready(fwd(params, x, pts)), repeats),
            "fwd_bwd": timed(lambda: jax.block_until_ready(grad(params, x, pts)), repeats),
            "noc20": timed(run_noc, max(1, repeats // 2)),
            "ious": np.asarray(result["out"]["ious"][0], np.float64)}


def run_reference(name: str, args, pair: tuple, tmp: str) -> tuple[dict, str]:
    """The authors' side of one model in a spawned process; returns (timings, checkpoint)."""
    repo, variant, size, _ = MODELS[name]
    ckpt = os.path.join(tmp, f"{name}.pth")
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        ref = pool.submit(torch_side, repo, variant, size, args.batch_size, args.repeats, pair,
                          ckpt).result()
    return ref, ckpt


def rows_of(name: str, ref: dict, ours: dict, batch: int) -> list[str]:
    """Table rows of one model: ms and instances/s per instance, ratio torch / jax."""
    rows = []
    d_iou = np.nanmax(np.abs(ref["ious"] - ours["ious"]))
    for stage in STAGES:
        torch_total, jax_total = ref[stage][1], ours[stage][1]
        torch_per = torch_total if stage == "noc20" else torch_total / batch  # one at a time
        jax_per = jax_total / batch
        note = f"jax first call {ours[stage][0]:.1f} s"
        if stage == "noc20":
            note += f"; torch one instance per call; max|dIoU| first instance {d_iou:.2g}"
        rows.append(f"{name:<18} {stage:<8} {torch_per * 1e3:>10.1f} {jax_per * 1e3:>10.1f} "
                    f"{1 / torch_per:>9.3f} {1 / jax_per:>9.3f} {torch_per / jax_per:>7.2f}  "
                    f"{note}")
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["ritm_h18", "simpleclick_vit_b"],
                        choices=sorted(MODELS))
    parser.add_argument("--batch-size", type=int, default=1,
                        help="instances per call (torch batch for forward / fwd+bwd; jax vmap)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--ritm-repo", default=os.environ.get(REPO_ENV["ritm"]),
                        help="checkout of SamsungLabs/ritm_interactive_segmentation")
    parser.add_argument("--simpleclick-repo", default=os.environ.get(REPO_ENV["simpleclick"]),
                        help="checkout of uncbiag/SimpleClick")
    parser.add_argument("--image", help="RGB image (default: the first shared DAVIS sample)")
    parser.add_argument("--mask", help="its object mask (non-zero = object)")
    args = parser.parse_args(argv)
    for repo, path in (("ritm", args.ritm_repo), ("simpleclick", args.simpleclick_repo)):
        needed = any(MODELS[m][0] == repo for m in args.models)
        if needed and not (path and (pathlib.Path(path) / "isegm").is_dir()):
            parser.error(f"--{repo}-repo (or ${REPO_ENV[repo]}) must name a checkout with an "
                         f"isegm package; got {path!r}")
        if path:  # the spawned reference processes read it from the environment
            os.environ[REPO_ENV[repo]] = str(pathlib.Path(path).resolve())
    pair = load_pair(args.image, args.mask)
    malloc = {k: v for k, v in os.environ.items() if k.startswith("MALLOC_")}
    with tempfile.TemporaryDirectory() as tmp:
        refs = {name: run_reference(name, args, pair, tmp) for name in args.models}
        import jax  # noqa: PLC0415  (after the reference runs: see the module docstring)
        import torch  # noqa: PLC0415

        from ports.__main__ import main as ports_main  # noqa: PLC0415

        print(f"# bench_click_models  {time.strftime('%Y-%m-%d %H:%M:%S')}  host "
              f"{platform.node()}  cpus {os.cpu_count()}  load {os.getloadavg()[0]:.2f}")
        first = refs[args.models[0]][0]
        print(f"# jax {jax.__version__} ({jax.default_backend()}: "
              f"{jax.devices()[0].device_kind}), torch {torch.__version__} ({first['device']}, "
              f"{first['threads']} threads)")
        print(f"# MALLOC env: {malloc or 'none (glibc defaults)'}"
              + ("" if malloc == TUNED_MALLOC else "  [not the tuned setting of BENCHMARKING.md]"))
        print(f"# image {args.image or 'default'} {pair[0].shape[1]}x{pair[0].shape[0]}; batch "
              f"{args.batch_size}, repeats {args.repeats} (median); per instance; ratio = torch "
              f"/ jax (> 1: faster)")
        print(f"{'model':<18} {'stage':<8} {'torch ms':>10} {'jax ms':>10} {'torch i/s':>9} "
              f"{'jax i/s':>9} {'ratio':>7}")
        for name in args.models:
            ref, ckpt = refs[name]
            repo, _, size, family = MODELS[name]
            port = "ritm" if repo == "ritm" else "simpleclick"
            out = os.path.join(tmp, name)
            assert ports_main([port, "--checkpoint", ckpt, "--out", out]) == 0
            ours = jax_side(size, family, args.batch_size, args.repeats, pair, out)
            for row in rows_of(name, ref, ours, args.batch_size):
                print(row, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
