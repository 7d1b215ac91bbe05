"""Click-map models (RITM-H18, SimpleClick ViT-B) vs the authors' PyTorch code, one process.

Usage (tuned allocator, as docs/benchmarking.md recommends; the script records it):

    MALLOC_MMAP_THRESHOLD_=4294967296 MALLOC_TRIM_THRESHOLD_=68719476736 \\
    MALLOC_TOP_PAD_=1073741824 JAXSEG_RITM_REPO=... JAXSEG_SIMPLECLICK_REPO=... \\
    python experiments/benchmarks/bench_click_models.py --models ritm_h18 simpleclick_vit_b \\
        --batch-size 1 --repeats 3

Both sides get the same random weights: the authors' model is built from
their repository (tests/isegm_reference.py; one ``isegm`` package per process,
so each model runs in its own spawned process), randomised, saved in their
checkpoint format and converted with ``python -m ports``. Per model, at the
authors' evaluation input size (RITM 400 x 400, the ``fixed400`` zoom;
SimpleClick 448 x 448):

  * ``forward``: ``model(image, points)["instances"]`` (torch, batch B, no grad)
    vs our jitted ``grid_logits`` vmapped over B instances;
  * ``fwd+bwd``: the gradient of a weighted sum of ``sigmoid(logits)`` w.r.t.
    the click input: torch autograd w.r.t. the click maps (the authors'
    rendering is not differentiable) vs ours w.r.t. the click coordinates
    through the soft disk rendering, B instances;
  * ``noc20``: the authors' ``evaluate_sample`` (clicker, zoom-in, flip, 20
    clicks, no early stop) one instance at a time vs our jitted
    ``noc_trajectory`` vmapped over B instances (the same real image).

Ratios are torch time / jax time per instance (> 1: jaxseg_robust is faster);
compile time is reported separately. JAX uses its default backend
(``JAX_PLATFORMS`` respected; the same command runs on a GPU machine, where
torch also uses CUDA when available). Each timing is the median of
``--repeats`` runs after one warm-up.
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

TUNED_MALLOC = {"MALLOC_MMAP_THRESHOLD_": "4294967296", "MALLOC_TRIM_THRESHOLD_": "68719476736",
                "MALLOC_TOP_PAD_": "1073741824"}
MODELS = {  # name -> (repository, variant, input size, options family)
    "ritm_h18": ("ritm", "hrnet18", 400, "ritm"),
    "simpleclick_vit_b": ("simpleclick", "vit_b", 448, "simpleclick"),
    "simpleclick_vit_xt": ("simpleclick", "vit_xt", 448, "simpleclick"),
}


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


def load_image(size: int | None = None):
    """The first shared DAVIS image and mask (or a generated pair), optionally resized."""
    from PIL import Image  # noqa: PLC0415

    root = pathlib.Path(os.environ.get("JAXSEG_REAL_DATA", ROOT.parent / "shared/data/real"))
    if (root / "davis" / "images" / "001.jpg").is_file():
        image = Image.open(root / "davis" / "images" / "001.jpg").convert("RGB")
        mask = Image.open(root / "davis" / "masks" / "001.png")
    else:
        yy, xx = np.mgrid[:480, :854]
        obj = (yy - 240) ** 2 + (xx - 400) ** 2 < 150 ** 2
        rng = np.random.default_rng(0)
        image = Image.fromarray((rng.uniform(0, 60, (480, 854, 3)) + 150 * obj[..., None])
                                .astype(np.uint8))
        mask = Image.fromarray(obj.astype(np.uint8))
    if size is not None:
        image, mask = image.resize((size, size), Image.BILINEAR), mask.resize((size, size))
    m = np.asarray(mask)
    return np.asarray(image), (m if m.ndim == 2 else m[..., 0]) != 0


CLICKS = [(200, 210, True), (120, 300, True), (330, 90, False), (60, 60, False)]


def torch_side(repo: str, variant: str, size: int, batch: int, repeats: int, ckpt: str) -> dict:
    """Spawned: builds, randomises and saves the authors' model, then times it."""
    import isegm_reference as ir  # noqa: PLC0415
    import torch  # noqa: PLC0415

    ir.import_reference(repo)
    from isegm.inference.evaluation import evaluate_sample  # noqa: PLC0415
    from isegm.inference.predictors import get_predictor  # noqa: PLC0415

    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = ir.build_ritm(variant) if repo == "ritm" else ir.build_simpleclick(variant)
    ir.randomize_(model, 0)
    model.eval()
    ir.save_isegm_checkpoint(model, ckpt)
    if repo != "ritm":
        from isegm.model.modeling.pos_embed import interpolate_pos_embed_inference  # noqa: PLC0415
        interpolate_pos_embed_inference(model.backbone, (size, size), "cpu")
    model.to(device)
    image, _ = load_image(size)
    x = torch.cat([torch.from_numpy(image.copy()).permute(2, 0, 1)[None].float() / 255,
                   torch.zeros(1, 1, size, size)], 1).repeat(batch, 1, 1, 1).to(device)
    points = ir.points_tensor(CLICKS).repeat(batch, 1, 1).to(device)
    weights = torch.from_numpy(np.random.default_rng(7).standard_normal((size, size))
                               .astype(np.float32)).to(device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    out = {"device": device, "threads": torch.get_num_threads()}

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
    full, gt = load_image()
    predictor = get_predictor(model, "NoBRS", device, prob_thresh=0.49,
                              zoom_in_params={"skip_clicks": -1, "target_size": (size, size)})

    def noc():
        evaluate_sample(full, gt.astype(np.int32), predictor, max_iou_thr=1.01, pred_thr=0.49,
                        max_clicks=20)

    out["noc20"] = timed(noc, max(1, repeats // 2))
    return out


def jax_side(repo: str, size: int, family: str, batch: int, repeats: int, model_dir: str) -> dict:
    """Times our converted model on the same inputs."""
    import dataclasses  # noqa: PLC0415

    import jax  # noqa: PLC0415
    import jax.numpy as jnp  # noqa: PLC0415

    from jaxseg_robust.models import zoo  # noqa: PLC0415
    from jaxseg_robust.models.clickmap.isegm import authors_options  # noqa: PLC0415
    from jaxseg_robust.models.clickmap.noc import NocConfig, noc_trajectory  # noqa: PLC0415

    seg, params, _ = zoo.load_params(model_dir)
    soft = dataclasses.replace(seg, click_encoding="soft")
    image, _ = load_image(size)
    x = jnp.broadcast_to(jnp.asarray(image, jnp.float32) / 255, (batch, size, size, 3))
    pts = jnp.broadcast_to(jnp.asarray([[c, r] for r, c, _ in CLICKS], jnp.float32),
                           (batch, len(CLICKS), 2))
    labels = jnp.asarray([1 if p else 0 for *_, p in CLICKS], jnp.int32)
    prev = jnp.zeros((size, size))
    weights = jnp.asarray(np.random.default_rng(7).standard_normal((size, size)), jnp.float32)
    fwd = jax.jit(jax.vmap(lambda im, p: seg.grid_logits(params, im, p, labels, prev)))

    def loss(im, p):
        return jnp.sum(jax.nn.sigmoid(soft.grid_logits(params, im, p, labels, prev)) * weights)

    grad = jax.jit(jax.vmap(jax.grad(loss, argnums=1)))
    full, gt = load_image()
    xf, tr = seg.preprocess(full)
    config = NocConfig(n_clicks=20, options=authors_options(family))
    noc = jax.jit(jax.vmap(lambda im, g: noc_trajectory(seg, params, im, tr.original_hw, g,
                                                        jnp.ones_like(g), config)))
    xb = jnp.broadcast_to(xf, (batch,) + xf.shape)
    gb = jnp.broadcast_to(jnp.asarray(gt), (batch,) + gt.shape)
    return {"backend": jax.default_backend(),
            "forward": timed(lambda: jax.block_until_ready(fwd(x, pts)), repeats),
            "fwd_bwd": timed(lambda: jax.block_until_ready(grad(x, pts)), repeats),
            "noc20": timed(lambda: jax.block_until_ready(noc(xb, gb)), max(1, repeats // 2))}


def bench(name: str, args) -> list[str]:
    """Runs one model on both sides; returns table rows."""
    from ports.__main__ import main as ports_main  # noqa: PLC0415

    repo, variant, size, family = MODELS[name]
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = os.path.join(tmp, "random.pth")
        context = multiprocessing.get_context("spawn")
        with concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
            ref = pool.submit(torch_side, repo, variant, size, args.batch_size, args.repeats,
                              ckpt).result()
        port = "ritm" if repo == "ritm" else "simpleclick"
        assert ports_main([port, "--checkpoint", ckpt, "--out", os.path.join(tmp, "m")]) == 0
        ours = jax_side(repo, size, family, args.batch_size, args.repeats,
                        os.path.join(tmp, "m"))
    rows = []
    for stage, per_batch in (("forward", True), ("fwd_bwd", True), ("noc20", False)):
        _, t_med = ref[stage]
        j_first, j_med = ours[stage]
        torch_per = t_med / args.batch_size if per_batch else t_med
        jax_per = j_med / args.batch_size
        rows.append(f"{name:<18} {stage:<8} {torch_per * 1e3:>11.1f} {jax_per * 1e3:>11.1f} "
                    f"{torch_per / jax_per:>7.2f}  torch {ref['device']}, jax {ours['backend']}, "
                    f"jax first call {j_first:.1f} s")
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["ritm_h18", "simpleclick_vit_b"],
                        choices=sorted(MODELS))
    parser.add_argument("--batch-size", type=int, default=1,
                        help="instances per call (torch batch / jax vmap)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    import jax  # noqa: PLC0415
    import torch  # noqa: PLC0415

    malloc = {k: v for k, v in os.environ.items() if k.startswith("MALLOC_")}
    print(f"# bench_click_models  {time.strftime('%Y-%m-%d %H:%M:%S')}  host {platform.node()}  "
          f"cpus {os.cpu_count()}  load {os.getloadavg()[0]:.2f}")
    print(f"# jax {jax.__version__} ({jax.default_backend()}), torch {torch.__version__}")
    print(f"# MALLOC env: {malloc or 'none (glibc defaults)'}"
          + ("" if malloc == TUNED_MALLOC else "  [not the tuned setting of BENCHMARKING.md]"))
    print(f"# batch {args.batch_size}, repeats {args.repeats} (median); ms per instance; "
          f"ratio = torch / jax (> 1: faster)")
    print(f"{'model':<18} {'stage':<8} {'torch ms':>11} {'jax ms':>11} {'ratio':>7}")
    for name in args.models:
        for row in bench(name, args):
            print(row, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
