"""Flax SAM vs the official PyTorch SAM: image encoder and batched decoding, one process.

Usage (tuned allocator, as docs/benchmarking.md recommends; the script records it):

    MALLOC_MMAP_THRESHOLD_=4294967296 MALLOC_TRIM_THRESHOLD_=68719476736 \\
    MALLOC_TOP_PAD_=1073741824 python experiments/benchmarks/bench_sam.py \\
        --models sam_vit_b --prompts 1 64 256

Both frameworks get the same random weights (the official model is built
without a checkpoint, every tensor randomised, and converted in-process with
the same key table as ``python -m ports``). Reported per model:

  * image encoder at 1024x1024: median ms per image (torch ``image_encoder``
    under ``inference_mode`` vs our jitted ``embed``), ratio jax/torch
    (target on CPU: <= 1.3);
  * decoding N one-click prompts on one cached embedding: torch's batched
    ``SamPredictor.predict_torch`` (multimask, boolean masks at the original
    size, all 3 candidates upsampled) vs our jitted, vmapped
    ``SamSegmenter.decode`` (multimask + argmax, the selected mask's logits at
    the original size: what the attacks consume), chunked with
    ``lax.map(batch_size=...)`` to bound memory; prompts/s and the throughput
    ratio jax/torch (target >= 1).

Memory: torch's batched decode holds N x 3 float masks at the original size
plus N copies of the upscaled embedding (N = 256 at 1024x1024 peaked at
~20 GB with the tuned allocator, which never returns memory); the default
original size is 480x854 (DAVIS), use ``--image-hw 1024 1024`` with care.

Each timing is the median of ``--repeats`` runs after one warm-up (compile
time is reported separately); the process CPU-time ratio is printed too,
which is steadier than wall time on a shared machine. On an oversubscribed
machine, also compare single-threaded: ``--threads 1`` with
``XLA_FLAGS="--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"``.
Outputs are cross-checked (max |embedding diff|, max |IoU prediction diff|).
MobileSAM (TinyViT encoder) is the entry ``mobile_sam``; its reference is MobileSAM's own code.

Devices (`bench_device`): ``--torch-device cuda`` runs the reference on a GPU
(strict float32 unless ``--torch-tf32``; ``torch.cuda.synchronize()`` before
every clock read of it), ``--precision`` sets JAX's float32 matmul precision of
our side (the max |diff| columns then measure its distance to the reference).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import os
import platform
import statistics
import sys
import time
from typing import Callable

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_device import add_device_flags, configure_torch, device_lines, jax_precision, torch_sync  # noqa: E402

TUNED_MALLOC = {"MALLOC_MMAP_THRESHOLD_": "4294967296", "MALLOC_TRIM_THRESHOLD_": "68719476736",
                "MALLOC_TOP_PAD_": "1073741824"}


@dataclasses.dataclass(frozen=True)
class BenchModel:
    """How to build the official model and convert its weights for one zoo name."""

    zoo_name: str
    build_official: Callable[[], object]
    convert: Callable[[dict, object], dict]
    package: str = "segment_anything"  # provides the reference ``SamPredictor``


def _sam_official(variant: str):
    def build():
        from segment_anything import sam_model_registry  # noqa: PLC0415

        return sam_model_registry[variant]()

    return build


def _sam_convert(state_dict, config):
    from ports.sam import convert_sam  # noqa: PLC0415

    return convert_sam(state_dict, config, what="benchmark weights")


def _mobile_sam_official():
    from mobile_sam import sam_model_registry  # noqa: PLC0415

    return sam_model_registry["vit_t"]()


def _mobile_sam_convert(state_dict, config):
    from ports.mobile_sam import convert_mobile_sam  # noqa: PLC0415

    return convert_mobile_sam(state_dict, config, what="benchmark weights")


BENCH_MODELS = {
    **{f"sam_{v}": BenchModel(f"sam_{v}", _sam_official(v), _sam_convert)
       for v in ("vit_b", "vit_l", "vit_h")},
    "mobile_sam": BenchModel("mobile_sam", _mobile_sam_official, _mobile_sam_convert,
                             package="mobile_sam"),
}


def randomize_(model, seed: int = 0) -> None:
    """Seeded random values of a sensible scale for every tensor of a torch model."""
    import torch  # noqa: PLC0415

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, t in model.state_dict().items():
            if not t.is_floating_point():
                continue
            if name.endswith("running_var"):  # BatchNorm (TinyViT): must stay positive
                t.copy_(0.5 + torch.rand(t.shape, generator=gen))
                continue
            noise = torch.randn(t.shape, generator=gen)
            if t.ndim >= 2 and not name.endswith(("pos_embed", "rel_pos_h", "rel_pos_w")):
                t.copy_(noise / np.sqrt(max(t[0].numel(), 1)))
            elif t.ndim == 1 and name.endswith("weight"):
                t.copy_(1.0 + 0.1 * noise)
            else:
                t.copy_(0.1 * noise)


def timed(fn, repeats: int) -> tuple[float, float, float]:
    """(first call s, median wall s, median process CPU s) over ``repeats`` further calls.

    Process CPU time (all threads) is steadier than wall time on a shared machine.
    """
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


def bench_model(name: str, args) -> list[dict]:
    """Times one model (encoder, then decoding for each N in ``args.prompts``).

    Returns:
      One dict per row: model, stage, torch_ms, jax_ms (median wall ms), ratio,
      target, note.
    """
    import jax  # noqa: PLC0415
    import jax.numpy as jnp  # noqa: PLC0415
    import torch  # noqa: PLC0415
    from jaxseg_robust.models import zoo  # noqa: PLC0415
    from jaxseg_robust.models.sam.segmenter import SamFeatures, make_transform  # noqa: PLC0415
    from jaxseg_robust.ops.resize import longest_side_shape  # noqa: PLC0415
    from jaxseg_robust.prompts.types import make_prompts  # noqa: PLC0415

    spec = BENCH_MODELS[name]
    TorchPredictor = importlib.import_module(spec.package).SamPredictor  # noqa: N806
    official = spec.build_official()
    randomize_(official)
    # eval() after randomising: TinyViT's attention caches its offset biases on eval()
    official.eval()
    seg = zoo.segmenter(spec.zoo_name)
    state = {k: v.detach().numpy() for k, v in official.state_dict().items()}
    params = jax.tree.map(jnp.asarray, spec.convert(state, seg.config))
    del state
    device = configure_torch(args)
    official.to(device)
    rows = []
    rng = np.random.default_rng(0)
    size = seg.config.image_size
    x = rng.normal(size=(size, size, 3)).astype(np.float32)
    x_torch = torch.from_numpy(x).permute(2, 0, 1)[None].contiguous().to(device)

    with torch.inference_mode():
        if not args.skip_encoder:
            ref_holder = {}

            def run_torch():
                ref_holder["emb"] = official.image_encoder(x_torch)
                torch_sync(device)

            _, t_torch, c_torch = timed(run_torch, args.repeats)
            embed = jax.jit(seg.embed)
            out_holder = {}

            def run_jax():
                out_holder["f"] = jax.block_until_ready(embed(params, jnp.asarray(x)))

            compile_s, t_jax, c_jax = timed(run_jax, args.repeats)
            emb_t = ref_holder["emb"][0].permute(1, 2, 0).cpu().numpy()
            err = float(np.abs(np.asarray(out_holder["f"].image_embeddings) - emb_t).max())
            rows.append(dict(model=name, stage=f"encoder {size}x{size}", torch_ms=1e3 * t_torch,
                             jax_ms=1e3 * t_jax, ratio=t_jax / t_torch, target="<= 1.3",
                             note=f"cpu-time ratio {c_jax / c_torch:.2f}; jax first call "
                                  f"{compile_s:.1f}s; max|emb diff| {err:.2g}"))
            emb = emb_t
        else:
            emb = rng.normal(size=(seg.config.embedding_size, seg.config.embedding_size,
                                   seg.config.prompt_embed_dim)).astype(np.float32)

        h, w = args.image_hw
        predictor = TorchPredictor(official)
        predictor.features = torch.from_numpy(emb).permute(2, 0, 1)[None].contiguous().to(device)
        predictor.original_size = (h, w)
        hr, wr = longest_side_shape(h, w, size)
        predictor.input_size = (hr, wr)
        predictor.is_image_set = True
        features = SamFeatures(image_embeddings=jnp.asarray(emb))
        transform = make_transform((h, w), (hr, wr))
        low = seg.config.low_res_size

        for n in args.prompts:
            pts = rng.uniform(0, 1, (n, 1, 2)) * np.array([w, h])
            pts = pts.astype(np.float32)
            coords = torch.from_numpy(pts * np.array([wr / w, hr / h], np.float32)).to(device)
            labels = torch.ones((n, 1), dtype=torch.int, device=device)
            holder = {}

            def run_torch(coords=coords, labels=labels):
                holder["t"] = predictor.predict_torch(coords, labels, multimask_output=True)
                torch_sync(device)

            _, t_torch, c_torch = timed(run_torch, args.repeats)
            prompts = jax.tree.map(lambda *v: jnp.stack(v),
                                   *[make_prompts(p, [1], mask_shape=(low, low)) for p in pts])
            chunk = min(n, args.chunk)

            @jax.jit
            def decode_many(batch):
                return jax.lax.map(lambda p: seg.decode(params, features, p, transform), batch,
                                   batch_size=chunk)

            def run_jax(prompts=prompts):
                holder["j"] = jax.block_until_ready(decode_many(prompts))

            compile_s, t_jax, c_jax = timed(run_jax, args.repeats)
            iou_err = float(np.abs(np.asarray(holder["j"].scores) - holder["t"][1].cpu().numpy()).max())
            rows.append(dict(model=name, stage=f"decode N={n}", torch_ms=1e3 * t_torch,
                             jax_ms=1e3 * t_jax, ratio=t_torch / t_jax, target=">= 1",
                             note=f"prompts/s torch {n / t_torch:.1f} jax {n / t_jax:.1f}; "
                                  f"cpu-time ratio {c_torch / c_jax:.2f}; chunk {chunk}; "
                                  f"jax first call {compile_s:.1f}s; "
                                  f"max|iou diff| {iou_err:.2g}"))
            del holder
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["sam_vit_b"], choices=sorted(BENCH_MODELS))
    parser.add_argument("--prompts", nargs="+", type=int, default=[1, 64, 256])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--chunk", type=int, default=4,
                        help="prompts decoded together inside jax (memory bound)")
    parser.add_argument("--image-hw", nargs=2, type=int, default=[480, 854],
                        help="original image size the masks are upsampled to (H W); torch "
                             "holds N x 3 float masks of this size at once")
    parser.add_argument("--skip-encoder", action="store_true")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    add_device_flags(parser)
    args = parser.parse_args(argv)

    import jax  # noqa: PLC0415
    import torch  # noqa: PLC0415

    if args.threads:
        torch.set_num_threads(args.threads)
    malloc = {k: v for k, v in os.environ.items() if k.startswith("MALLOC_")}
    print(f"# bench_sam  {time.strftime('%Y-%m-%d %H:%M:%S')}  host {platform.node()}  "
          f"{platform.processor() or platform.machine()}  cpus {os.cpu_count()}")
    print(f"# jax {jax.__version__} ({jax.default_backend()}), torch {torch.__version__} "
          f"(threads {torch.get_num_threads()}), python {sys.version.split()[0]}")
    print(f"# MALLOC env: {malloc or 'none (glibc defaults)'}"
          + ("" if malloc == TUNED_MALLOC else "  [not the tuned setting of BENCHMARKING.md]"))
    print(f"# repeats {args.repeats} (median), image {args.image_hw[0]}x{args.image_hw[1]}, "
          f"load average {os.getloadavg()[0]:.2f}")
    configure_torch(args)
    for line in device_lines(args):
        print(line)
    print("# ratio: encoder = jax time / torch time; decode = jax throughput / torch throughput")
    header = f"{'model':<10} {'stage':<20} {'torch ms':>10} {'jax ms':>10} {'ratio':>7} " \
             f"{'target':>7}  note"
    print(header)
    for name in args.models:
        with jax_precision(args):
            rows = bench_model(name, args)
        for row in rows:
            print(f"{row['model']:<10} {row['stage']:<20} {row['torch_ms']:>10.1f} "
                  f"{row['jax_ms']:>10.1f} {row['ratio']:>7.2f} {row['target']:>7}  {row['note']}",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
