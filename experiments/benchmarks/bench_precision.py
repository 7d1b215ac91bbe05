"""JAX matmul precision (highest / high / default): speed and distance to the torch float32 reference.

Usage (the GPU suite's "precision" step, experiments/gpu_suite/; on a CPU every
precision computes full float32, so the rows agree there):

    python experiments/benchmarks/bench_precision.py --torch-device cuda \\
        --instances 32 --torch-instances 8 --size 480 640 --steps 50 --positions 1024

One process, the same random-weight SAM ViT-B on both sides (`bench_breps`'s
SAM family: the official model randomised, converted with our port) and the
same generated instances. The torch reference runs once, strict float32
(TF32 off unless ``--torch-tf32``, `bench_device`):

  * BREPS MIN on the first ``--torch-instances`` instances, one at a time
    (`bench_breps.run_torch`): the final selection IoU of each;
  * the click grid on ``--positions`` pixels of the first instance
    (`bench_grid.torch_grid_scores`, the torch encoder's embedding).

Then, for each ``--precisions`` entry in turn (`jaxseg_robust.runner.precision`):
our embed and batched BREPS attack on all ``--instances`` (`bench_breps.run_jax`)
and our click grid on the same embedding and positions, each timed after its
compiling call. One line per precision::

  precision P: breps attack X s/instance (batch N), encoder Y s/image; final IoU vs torch fp32 |diff| mean M
  max X over K; tight-box IoU max |diff| T; grid Z positions/s, IoU |diff| <= 1e-5 at Q %, max |diff| R

so the decision in docs/benchmarking.md ("Matmul precision") can be taken on
the accelerator the numbers come from.
"""

from __future__ import annotations

import argparse
import functools
import os
import pathlib
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import bench_breps  # noqa: E402
import bench_grid  # noqa: E402
from bench_device import PRECISIONS, add_device_flags, configure_torch, device_lines, torch_sync  # noqa: E402


def parse_args(argv=None):
    """The flags (BREPS sizes as `bench_breps`, the grid's positions, the precisions compared)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--instances", type=int, default=8, help="instances of our batched BREPS call")
    parser.add_argument("--torch-instances", type=int, default=None,
                        help="instances the reference attacks (the first K; default all)")
    parser.add_argument("--size", nargs=2, type=int, default=[480, 640], metavar=("H", "W"))
    parser.add_argument("--steps", type=int, default=50, help="BREPS evaluated iterates")
    parser.add_argument("--lr-mult", type=float, default=9.0)
    parser.add_argument("--positions", type=int, default=256, help="click-grid positions compared")
    parser.add_argument("--chunk", type=int, default=64, help="click-grid positions decoded together (jax)")
    parser.add_argument("--torch-batch", type=int, default=64, help="click-grid clicks per torch call")
    parser.add_argument("--precisions", nargs="+", choices=PRECISIONS, default=["highest", "high", "default"])
    parser.add_argument("--seed", type=int, default=0)
    add_device_flags(parser)
    args = parser.parse_args(argv)
    args.torch_instances = min(args.torch_instances or args.instances, args.instances)
    if min(args.instances, args.torch_instances, args.steps, args.positions, args.chunk) < 1 or min(args.size) < 8:
        parser.error("--instances, --torch-instances, --steps, --positions, --chunk must be >= 1, --size >= 8")
    # what bench_breps' functions read
    args.family, args.model, args.repeats, args.minmax, args.program = "sam", "sam_vit_b", 1, False, False
    return args


def grid_positions(height: int, width: int, count: int) -> np.ndarray:
    """``count`` distinct (row, col) pixels [count, 2], drawn with a fixed seed."""
    flat = np.sort(np.random.default_rng(1).choice(height * width, size=min(count, height * width), replace=False))
    return np.stack([flat // width, flat % width], axis=1)


def torch_grid(family, model_input, transform, gt, clicks, args) -> dict:
    """The torch click grid on the first instance: its embedding (the torch encoder on our model input, as
    the BREPS reference) and the IoU per position."""
    import torch  # noqa: PLC0415

    from jaxseg_robust.metrics.masks import boundary_width  # noqa: PLC0415

    input_size = tuple(int(v) for v in np.asarray(transform.resized_hw))
    with torch.inference_mode():
        embedding = family.encode(model_input)
        iou, _ = bench_grid.torch_grid_scores(family.torch_model, embedding, clicks, gt.astype(bool),
                                              boundary_width(*gt.shape), input_size, args.torch_batch)
    torch_sync(family.device)
    return {"embedding": embedding[0].permute(1, 2, 0).cpu().numpy(), "iou": iou}


def jax_grid(family, gt, clicks, embedding, args) -> dict:
    """Our click grid on the torch embedding: positions/s (after the compiling call) and IoU per position."""
    import jax  # noqa: PLC0415
    import jax.numpy as jnp  # noqa: PLC0415

    from jaxseg_robust.attacks.grid import click_grid  # noqa: PLC0415
    from jaxseg_robust.metrics.masks import boundary_width  # noqa: PLC0415
    from jaxseg_robust.models.sam.segmenter import SamFeatures, make_transform  # noqa: PLC0415
    from jaxseg_robust.ops.resize import longest_side_shape  # noqa: PLC0415

    height, width = gt.shape
    seg = family.seg
    transform = make_transform((height, width), longest_side_shape(height, width, seg.config.image_size))
    region = np.zeros((height, width), bool)
    region[clicks[:, 0], clicks[:, 1]] = True
    grid = jax.jit(functools.partial(click_grid, seg, family.params, chunk_size=args.chunk))
    features = SamFeatures(image_embeddings=jnp.asarray(embedding))
    call = functools.partial(grid, features, transform, gt.astype(np.int8), np.int32(boundary_width(height, width)),
                             region=region)
    jax.block_until_ready(call())
    start = time.perf_counter()
    result = jax.block_until_ready(call())
    seconds = time.perf_counter() - start
    return {"rate": len(clicks) / seconds, "iou": np.asarray(result.iou)[clicks[:, 0], clicks[:, 1]]}


def precision_line(precision: str, ref: dict, ours: dict, grid_ref: dict, grid_ours: dict, args) -> str:
    """The result line of one precision (see the module docstring)."""
    k = args.torch_instances
    outputs, results = ours["outputs"], ref["results"]
    final = [abs(float(outputs["selection_iou"][i]) - results[i]["iou"]) for i in range(k)]
    tight = max(abs(float(outputs["tight_selection_iou"][i]) - results[i]["tight_iou"]) for i in range(k))
    grid_diff = np.abs(grid_ours["iou"] - grid_ref["iou"])
    return (f"precision {precision}: breps attack {ours['attack'] / args.instances:.4f} s/instance (batch "
            f"{args.instances}), encoder {ours['encoder']:.4f} s/image; final IoU vs torch fp32 |diff| mean "
            f"{statistics.mean(final):.3g} max {max(final):.3g} over {k}; tight-box IoU max |diff| {tight:.2g}; "
            f"grid {grid_ours['rate']:.1f} positions/s, IoU |diff| <= 1e-5 at "
            f"{100 * np.mean(grid_diff <= 1e-5):.1f} % of {len(grid_diff)}, max |diff| {np.nanmax(grid_diff):.3g}")


def main(argv=None) -> int:
    args = parse_args(argv)
    configure_torch(args)
    from jaxseg_robust.runner.precision import matmul_precision  # noqa: PLC0415

    for line in device_lines(args):
        print(line)
    height, width = args.size
    print(f"# SAM ViT-B random weights; BREPS MIN {args.steps} steps on {args.instances} instances of {height}x"
          f"{width} (torch: the first {args.torch_instances}); click grid on {args.positions} positions; "
          f"load average {os.getloadavg()[0]:.2f}", flush=True)
    family = bench_breps.FAMILIES["sam"](args)
    instances = bench_breps.make_instances(args.instances, height, width, args.seed)
    inputs = [family.seg.preprocess(image) for image, _ in instances]
    clicks = grid_positions(height, width, args.positions)
    start = time.perf_counter()
    ref = bench_breps.run_torch(family, instances, inputs, args)
    grid_ref = torch_grid(family, *inputs[0], instances[0][1], clicks, args)
    print(f"torch fp32 reference: breps attack {ref['attack']:.3f} s/instance (median of {args.torch_instances}), "
          f"grid done; {time.perf_counter() - start:.1f} s", flush=True)
    for precision in args.precisions:
        start = time.perf_counter()
        with matmul_precision(precision):
            ours = bench_breps.run_jax(family, instances, inputs, args)
            grid_ours = jax_grid(family, instances[0][1], clicks, grid_ref["embedding"], args)
        print(precision_line(precision, ref, ours, grid_ref, grid_ours, args)
              + f" ({time.perf_counter() - start:.1f} s with compiles)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
