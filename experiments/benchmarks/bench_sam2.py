"""Flax SAM 2 vs the official PyTorch SAM 2: image encoder and batched decoding, one process.

Usage (tuned allocator, as docs/benchmarking.md recommends; the script records it):

    JAXSEG_SAM2_REPO=/path/to/facebookresearch/sam2 \\
    MALLOC_MMAP_THRESHOLD_=4294967296 MALLOC_TRIM_THRESHOLD_=68719476736 \\
    MALLOC_TOP_PAD_=1073741824 python experiments/benchmarks/bench_sam2.py \\
        --models sam2.1_hiera_tiny sam2.1_hiera_base_plus --prompts 1 64 256

On a GPU (JAX_PLATFORMS is respected; torch runs on CUDA when it has it):

    python experiments/benchmarks/bench_sam2.py --dtype bfloat16 --batch 4 --torch-device cuda

Both frameworks get the same random weights: the official model is built with
``build_sam2`` and its yaml config (no checkpoint), every tensor randomised,
and converted in-process with the key table of ``python -m ports sam2``.
Reported per model:

  * image encoder at 1024 x 1024 (``--batch`` images per call): torch
    ``forward_image`` + ``no_mem_embed`` (what ``set_image`` runs after its
    transforms) under ``inference_mode`` vs our jitted ``embed``; ms per image
    and the ratio jax/torch (target on CPU: <= 1.3);
  * decoding N one-click prompts on one cached image: the official batched
    ``SAM2ImagePredictor._predict`` (N point sets at once, logits at the
    original size) vs our jitted ``Sam2Segmenter.decode`` mapped over the N
    prompt sets (``lax.map`` in chunks of ``--chunk``), both with
    ``multimask_output=False`` and the dynamic fallback (``--multimask`` for
    three candidates); prompts/s and the throughput ratio jax/torch (target
    on CPU: >= 1.5).

Memory: the official batched decode repeats the image embedding and both
high-resolution feature maps once per prompt set (N = 256: about 4 GB) and,
with the tuned allocator, never returns memory; a two-model run with N = 256
peaked at 14 GB on the 2-core machine (killed there). Run one model per process
on small machines.

``--dtype bfloat16`` runs our image encoder in bfloat16 (parameters and the
decoder stay float32) and torch's under ``autocast(bfloat16)``. Each timing is
the median of ``--repeats`` runs after one warm-up (compile time reported
separately); process CPU time ratios are printed too. Outputs are
cross-checked (max |embedding diff|, max |IoU prediction diff|).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import os
import platform
import statistics
import sys
import time
import types

import numpy as np

TUNED_MALLOC = {"MALLOC_MMAP_THRESHOLD_": "4294967296", "MALLOC_TRIM_THRESHOLD_": "68719476736",
                "MALLOC_TOP_PAD_": "1073741824"}
YAML = {"hiera_tiny": "t", "hiera_small": "s", "hiera_base_plus": "b+", "hiera_large": "l"}


def import_torchvision() -> None:
    """Imports torchvision; one whose compiled operators cannot load (a CUDA wheel beside a CPU
    torch) is imported as its pure-Python package (SAM2Transforms and ``torchvision.ops``' box
    losses need nothing else)."""
    try:
        import torchvision  # noqa: F401, PLC0415
    except (ImportError, RuntimeError):
        for name in [m for m in sys.modules if m.startswith("torchvision")]:
            del sys.modules[name]
        spec = importlib.util.find_spec("torchvision")
        if spec is None:
            raise SystemExit("torchvision is not importable: install it or put its package on PYTHONPATH")
        package = types.ModuleType("torchvision")
        package.__path__ = list(spec.submodule_search_locations)
        sys.modules["torchvision"] = package
        importlib.import_module("torchvision.transforms")


def load_official(repo: str):
    """(build_sam2, SAM2ImagePredictor) from a checkout of facebookresearch/sam2 (`import_torchvision`)."""
    if not repo or not os.path.isfile(os.path.join(repo, "sam2", "build_sam.py")):
        raise SystemExit(f"set JAXSEG_SAM2_REPO (or --repo) to a checkout of "
                         f"facebookresearch/sam2; got {repo!r}")
    sys.path.insert(0, repo)
    import_torchvision()
    from sam2.build_sam import build_sam2  # noqa: PLC0415
    from sam2.sam2_image_predictor import SAM2ImagePredictor  # noqa: PLC0415

    return build_sam2, SAM2ImagePredictor


def randomize_(model, seed: int = 0) -> None:
    """Seeded random values of a sensible scale for every tensor of a torch model."""
    import torch  # noqa: PLC0415

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, t in model.state_dict().items():
            if not t.is_floating_point():
                continue
            noise = torch.randn(t.shape, generator=gen)
            if name.endswith(("pos_embed", "pos_embed_window", "no_mem_embed")):
                t.copy_(0.2 * noise)
            elif t.ndim >= 2:
                t.copy_(noise / np.sqrt(max(t[0].numel(), 1)))
            elif t.ndim == 1 and name.endswith("weight"):
                t.copy_(1.0 + 0.1 * noise)
            else:
                t.copy_(0.1 * noise)


def official_features(model, predictor, model_input) -> dict:
    """``SAM2ImagePredictor.set_image`` after its transforms, on a given model input f32[1, 3, S, S].

    Returns the predictor's ``_features`` dict (``image_embed`` [1, C, E, E] with ``no_mem_embed``,
    ``high_res_feats``: the conv_s0 / conv_s1 levels), as the official code computes it.
    """
    backbone_out = model.forward_image(model_input)
    _, vision_feats, _, _ = model._prepare_backbone_features(backbone_out)
    if model.directly_add_no_mem_embed:
        vision_feats[-1] = vision_feats[-1] + model.no_mem_embed
    feats = [feat.permute(1, 2, 0).view(1, -1, *feat_size)
             for feat, feat_size in zip(vision_feats[::-1], predictor._bb_feat_sizes[::-1])][::-1]
    return {"image_embed": feats[-1], "high_res_feats": feats[:-1]}


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


def _sync(torch, device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def bench_encoder(ctx, args) -> dict:
    """One row: the image encoder on ``args.batch`` images."""
    jax, jnp, torch = ctx["jax"], ctx["jnp"], ctx["torch"]
    model, seg, params, device = ctx["official"], ctx["seg"], ctx["params"], ctx["device"]
    size = seg.config.image_size
    x = np.random.default_rng(0).normal(size=(args.batch, size, size, 3)).astype(np.float32)
    x_torch = torch.from_numpy(x).permute(0, 3, 1, 2).contiguous().to(device)
    holder = {}

    def run_torch():
        with torch.inference_mode(), ctx["autocast"]():
            out = model.forward_image(x_torch)
            _, feats, _, _ = model._prepare_backbone_features(out)
            holder["emb"] = feats[-1] + model.no_mem_embed
        _sync(torch, device)

    _, t_torch, c_torch = timed(run_torch, args.repeats)
    embed = jax.jit(seg.embed)
    x_jax = jnp.asarray(x)

    def run_jax():
        holder["f"] = jax.block_until_ready(embed(params, x_jax))

    compile_s, t_jax, c_jax = timed(run_jax, args.repeats)
    e = seg.config.embedding_size
    emb_t = holder["emb"].float().cpu().reshape(e, e, args.batch, -1).permute(2, 0, 1, 3).numpy()
    emb_j = np.asarray(holder["f"].image_embeddings, np.float32)
    err = float(np.abs(emb_j - emb_t).max() / max(np.abs(emb_t).max(), 1e-12))
    per = 1e3 / args.batch
    return dict(stage=f"encoder {size}^2 x{args.batch}", torch_ms=per * t_torch,
                jax_ms=per * t_jax, ratio=t_jax / t_torch, target="<= 1.3",
                note=f"ms/image; cpu-time ratio {c_jax / c_torch:.2f}; jax first call "
                     f"{compile_s:.1f}s; max rel emb diff {err:.2g}")


def bench_decode(ctx, args, n: int) -> dict:
    """One row: N one-click prompt sets decoded on one cached image."""
    jax, jnp, torch = ctx["jax"], ctx["jnp"], ctx["torch"]
    from jaxseg_robust.models.sam2.segmenter import Sam2Features  # noqa: PLC0415
    from jaxseg_robust.models.sam.segmenter import make_transform  # noqa: PLC0415
    from jaxseg_robust.prompts.types import make_prompts  # noqa: PLC0415

    seg, params, predictor, device = ctx["seg"], ctx["params"], ctx["predictor"], ctx["device"]
    h, w = args.image_hw
    rng = np.random.default_rng(n)
    pts = (rng.uniform(0, 1, (n, 1, 2)) * np.array([w, h])).astype(np.float32)
    size = seg.config.image_size
    coords = torch.from_numpy(pts / np.array([w, h], np.float32) * size).to(device)
    labels = torch.ones((n, 1), dtype=torch.int, device=device)
    holder = {}

    def run_torch():
        with torch.inference_mode():
            holder["t"] = predictor._predict(coords, labels, multimask_output=args.multimask,
                                             return_logits=True)
        _sync(torch, device)

    _, t_torch, c_torch = timed(run_torch, args.repeats)
    feats = predictor._features
    features = Sam2Features(
        image_embeddings=jnp.asarray(feats["image_embed"][0].permute(1, 2, 0).float().cpu().numpy()),
        high_res_feats=tuple(jnp.asarray(f[0].permute(1, 2, 0).float().cpu().numpy())
                             for f in feats["high_res_feats"]))
    transform = make_transform((h, w), (size, size))
    low = seg.config.low_res_size
    prompts = jax.tree.map(lambda *v: jnp.stack(v),
                           *[make_prompts(p, [1], mask_shape=(low, low)) for p in pts])
    chunk = min(n, args.chunk)

    @jax.jit
    def decode_many(batch):
        return jax.lax.map(lambda p: seg.decode(params, features, p, transform,
                                                multimask_output=args.multimask),
                           batch, batch_size=chunk)

    def run_jax():
        holder["j"] = jax.block_until_ready(decode_many(prompts))

    compile_s, t_jax, c_jax = timed(run_jax, args.repeats)
    iou_err = float(np.abs(np.asarray(holder["j"].scores) - holder["t"][1].float().cpu().numpy()).max())
    return dict(stage=f"decode N={n}", torch_ms=1e3 * t_torch, jax_ms=1e3 * t_jax,
                ratio=t_torch / t_jax, target=">= 1.5",
                note=f"prompts/s torch {n / t_torch:.1f} jax {n / t_jax:.1f}; cpu-time ratio "
                     f"{c_torch / c_jax:.2f}; chunk {chunk}; jax first call {compile_s:.1f}s; "
                     f"max|iou diff| {iou_err:.2g}")


def setup_model(name: str, args) -> dict:
    """Builds the official model, randomises it, converts it; returns the shared context."""
    import jax  # noqa: PLC0415
    import jax.numpy as jnp  # noqa: PLC0415
    import torch  # noqa: PLC0415

    from jaxseg_robust.models import zoo  # noqa: PLC0415
    from ports.sam2 import convert_sam2  # noqa: PLC0415

    build_sam2, predictor_cls = load_official(args.repo)
    config = zoo.get(name).config
    tag = "sam2" if config.version == "2" else "sam2.1"
    device = torch.device(args.torch_device)
    official = build_sam2(f"configs/{tag}/{tag}_hiera_{YAML[config.variant]}.yaml", None,
                          device="cpu")
    randomize_(official, getattr(args, "seed", 0))
    official.eval()
    state = {k: v.detach().numpy() for k, v in official.state_dict().items()}
    seg = zoo.segmenter(name, compute_dtype=args.dtype)
    params, _ = convert_sam2(state, seg.config, what="benchmark weights")
    params = jax.tree.map(jnp.asarray, params)
    del state
    official = official.to(device)
    predictor = predictor_cls(official)
    h, w = args.image_hw
    image = np.random.default_rng(1).integers(0, 256, (h, w, 3)).astype(np.uint8)
    with torch.inference_mode():
        predictor.set_image(image)

    def autocast():
        if args.dtype == "bfloat16":
            return torch.autocast(device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    return dict(jax=jax, jnp=jnp, torch=torch, official=official, predictor=predictor, seg=seg,
                params=params, device=device, autocast=autocast)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+",
                        default=["sam2.1_hiera_tiny", "sam2.1_hiera_base_plus"])
    parser.add_argument("--prompts", nargs="+", type=int, default=[1, 64, 256])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch", type=int, default=1, help="images per encoder call")
    parser.add_argument("--chunk", type=int, default=8,
                        help="prompt sets decoded together inside jax (memory bound)")
    parser.add_argument("--image-hw", nargs=2, type=int, default=[480, 854],
                        help="original image size the masks are upsampled to (H W)")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--multimask", action="store_true",
                        help="decode 3 candidates (default: single mask with the fallback)")
    parser.add_argument("--skip-encoder", action="store_true")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    parser.add_argument("--torch-device", default=None,
                        help="torch device (default: cuda when torch has it, else cpu)")
    parser.add_argument("--repo", default=os.environ.get("JAXSEG_SAM2_REPO", ""),
                        help="checkout of facebookresearch/sam2 (default $JAXSEG_SAM2_REPO)")
    args = parser.parse_args(argv)

    import jax  # noqa: PLC0415
    import torch  # noqa: PLC0415

    if args.torch_device is None:
        args.torch_device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.threads:
        torch.set_num_threads(args.threads)
    malloc = {k: v for k, v in os.environ.items() if k.startswith("MALLOC_")}
    print(f"# bench_sam2  {time.strftime('%Y-%m-%d %H:%M:%S')}  host {platform.node()}  "
          f"{platform.processor() or platform.machine()}  cpus {os.cpu_count()}")
    print(f"# jax {jax.__version__} ({jax.default_backend()}: {jax.devices()[0].device_kind}), "
          f"torch {torch.__version__} ({args.torch_device}, threads {torch.get_num_threads()}), "
          f"python {sys.version.split()[0]}")
    print(f"# MALLOC env: {malloc or 'none (glibc defaults)'}"
          + ("" if malloc == TUNED_MALLOC else "  [not the tuned setting of BENCHMARKING.md]"))
    print(f"# dtype {args.dtype}, repeats {args.repeats} (median), image {args.image_hw[0]}x"
          f"{args.image_hw[1]}, multimask {args.multimask}, load average {os.getloadavg()[0]:.2f}")
    print("# ratio: encoder = jax time / torch time; decode = jax throughput / torch throughput")
    print(f"{'model':<24} {'stage':<20} {'torch ms':>10} {'jax ms':>10} {'ratio':>7} "
          f"{'target':>7}  note")
    for name in args.models:
        ctx = setup_model(name, args)
        if not args.skip_encoder:
            print_row(name, bench_encoder(ctx, args))
        for n in args.prompts:
            print_row(name, bench_decode(ctx, args, n))
        del ctx
    return 0


def print_row(name: str, row: dict) -> None:
    print(f"{name:<24} {row['stage']:<20} {row['torch_ms']:>10.1f} {row['jax_ms']:>10.1f} "
          f"{row['ratio']:>7.2f} {row['target']:>7}  {row['note']}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
