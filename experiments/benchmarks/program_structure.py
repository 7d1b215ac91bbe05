"""The size and loop structure of every prompt protocol's batch program, and what XLA:CPU takes to compile it.

Usage:

    python experiments/benchmarks/program_structure.py [--protocols tetris,breps,click_grid,box_grid]
        [--model NAME] [--size full|small|tiny] [--no-compile] [--dump DIR]
    python experiments/benchmarks/program_structure.py --encoders sam_vit_b,sam2.1_hiera_base_plus
        [--repeats N] [--no-compile]

For each protocol the script builds the batch program the command line runs
(`runner.program.BatchProgram`, the demo's settings of ``--size``, see
`jaxseg_robust.commands.demo.SIZES`) on ``--model``'s architecture (default the
demonstration model ``sam_demo``) with seeded random weights (``segmenter.init``), a batch of the command's default
size of synthetic 48 x 64 instances in the 64 x 64 bucket frame, and prints:

  stablehlo_cpu / stablehlo_cuda   bytes of the StableHLO text JAX hands XLA for the CPU and, without a GPU,
                                   for CUDA (``jax.jit(f).trace(*args).lower(lowering_platforms=("cuda",))``)
  ops                              StableHLO operations in the CPU text (lines with ``= stablehlo.`` or a
                                   ``stablehlo.`` statement)
  dots / convs                     ``stablehlo.dot_general`` / ``stablehlo.convolution`` operations: copies
                                   of the decoder traced into the program show up here
  dots_in_loops                    the dots inside some while loop (calls followed from ``main``; a
                                   function called from two places counts twice)
  whiles                           ``stablehlo.while`` operations (every ``lax.scan`` / ``fori_loop`` /
                                   ``while_loop``), over the module's functions
  depth                            the deepest nesting of while loops, through calls of private functions
  compile_s                        XLA:CPU seconds of ``lowered.compile()`` (omitted with ``--no-compile``)

``--dump DIR`` writes each program's CPU and CUDA StableHLO text for reading.

``--encoders`` measures the image encoders alone instead (`ENCODERS`: SAM ViT, SAM 2's Hiera,
SimpleClick's ViT), one image, random weights, twice in one process: with the blocks unrolled
(``scan_blocks=False``) and as loops over stacked parameters (the default, `models.block_scan`).
Per variant: the CUDA lowering's bytes, operations and while loops, the XLA:CPU compile seconds,
``run_s`` the fastest of ``--repeats`` calls (0: not run) and ``max_diff`` the largest absolute
difference of the outputs from the unrolled variant's.
The numbers before and after the changes of issue 30 are in docs/benchmarking.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
import re
import sys
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "tests"))

from compiled_hlo import ops_by_while_depth, while_depth  # noqa: E402

PROTOCOLS = ("tetris", "breps", "click_grid", "box_grid")
IMAGE_HW = (48, 64)
FRAME = (64, 64)


# ---- StableHLO text ---------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class ModuleStructure:
    """Counts of one StableHLO module's text (see the module docstring)."""

    text_bytes: int
    ops: int
    dots: int
    dots_in_loops: int
    convs: int
    whiles: int
    depth: int


def module_structure(text: str) -> ModuleStructure:
    """`ModuleStructure` of a StableHLO module's text (loops read by `tests/compiled_hlo.py`)."""
    dots = ops_by_while_depth(text, "dot_general")
    return ModuleStructure(text_bytes=len(text.encode()),
                           ops=len(re.findall(r"(?:= |^\s*)\"?stablehlo\.\w+", text, re.MULTILINE)),
                           dots=sum(dots.values()), dots_in_loops=sum(c for d, c in dots.items() if d > 0),
                           convs=text.count("stablehlo.convolution"),
                           whiles=sum(ops_by_while_depth(text, "while").values()), depth=while_depth(text))


# ---- the programs -----------------------------------------------------------------------------

def synthetic_batch(batch_size: int, seed: int = 0):
    """A `PaddedBatch` of ``batch_size`` random 48 x 64 images with an elliptic object each, frame 64 x 64."""
    from jaxseg_robust.data.buckets import pad_batch  # noqa: PLC0415
    from jaxseg_robust.data.instances import Instance  # noqa: PLC0415

    rng = np.random.default_rng(seed)
    instances = []
    for index in range(batch_size):
        yy, xx = np.mgrid[:IMAGE_HW[0], :IMAGE_HW[1]]
        cy, cx = rng.uniform(0.4, 0.6) * IMAGE_HW[0], rng.uniform(0.4, 0.6) * IMAGE_HW[1]
        gt = (((yy - cy) / (0.3 * IMAGE_HW[0])) ** 2 + ((xx - cx) / (0.25 * IMAGE_HW[1])) ** 2 <= 1).astype(np.int8)
        image = rng.integers(0, 256, (*IMAGE_HW, 3), dtype=np.uint8)
        instances.append(Instance(id=f"i{index}", image=image, gt=gt, dataset="synthetic"))
    return pad_batch(instances, FRAME, batch_size)


def batch_program(protocol: str, segmenter, params, size):
    """(the `BatchProgram` the command builds for ``protocol`` with the demo's ``size`` settings, batch size)."""
    from jaxseg_robust.attacks.boxes import make_breps_batch_fn  # noqa: PLC0415
    from jaxseg_robust.attacks.clicks import ClickProtocol, TetrisConfig  # noqa: PLC0415
    from jaxseg_robust.attacks.grid import make_box_grid_batch_fn, make_click_grid_batch_fn  # noqa: PLC0415
    from jaxseg_robust.commands import demo  # noqa: PLC0415
    from jaxseg_robust.runner.program import BatchProgram  # noqa: PLC0415
    from jaxseg_robust.runs.breps import BrepsSpec  # noqa: PLC0415
    from jaxseg_robust.runs.grid import GridSpec  # noqa: PLC0415
    from jaxseg_robust.runs.tetris import TetrisSpec  # noqa: PLC0415

    if protocol == "tetris":
        attack = TetrisConfig(mode="min", n_clicks=size.n_clicks, n_opt_steps=size.n_opt_steps,
                              lr_mult=demo.DEMO_TETRIS_LR_MULT, return_mask=True)
        baseline = TetrisConfig(mode="baseline", n_clicks=size.baseline_clicks, return_mask=True)
        protocol = ClickProtocol(attack=attack, minmax=True, baseline=baseline)
        return BatchProgram(segmenter, params, protocol, timed=True), TetrisSpec.default_batch_size
    if protocol == "breps":
        return (make_breps_batch_fn(segmenter, params, mode="minmax", n_steps=size.box_steps,
                                    lr_mult=demo.DEMO_BREPS_LR_MULT, return_mask=True), BrepsSpec.default_batch_size)
    if protocol == "click_grid":
        return make_click_grid_batch_fn(segmenter, params, stride=size.click_stride), GridSpec.default_batch_size
    if protocol == "box_grid":
        return make_box_grid_batch_fn(segmenter, params, stride=size.box_stride), GridSpec.default_batch_size
    raise ValueError(f"protocol must be one of {PROTOCOLS}; got {protocol!r}")


def measure(protocol: str, segmenter, params, size, compile_it: bool, dump: pathlib.Path | None) -> dict:
    """The structure of one protocol's batch program (CPU and CUDA lowering) and its XLA:CPU compile seconds."""
    from jaxseg_robust.runner.program import host_arguments  # noqa: PLC0415

    program, batch_size = batch_program(protocol, segmenter, params, size)
    args = (program.params, program.aux_params, *host_arguments(segmenter, program.protocol,
                                                                synthetic_batch(batch_size)))
    jitted = program._device.function.jitted  # noqa: SLF001 - the very program the engine compiles
    start = time.perf_counter()
    traced = jitted.trace(*args)
    trace_seconds = time.perf_counter() - start
    start = time.perf_counter()
    lowered = traced.lower()
    lower_seconds = time.perf_counter() - start
    cpu_text = lowered.as_text()
    cuda_text = jitted.trace(*args).lower(lowering_platforms=("cuda",)).as_text()
    if dump is not None:
        dump.mkdir(parents=True, exist_ok=True)
        (dump / f"{protocol}.cpu.mlir").write_text(cpu_text)
        (dump / f"{protocol}.cuda.mlir").write_text(cuda_text)
    compile_seconds = float("nan")
    if compile_it:
        start = time.perf_counter()
        lowered.compile()
        compile_seconds = time.perf_counter() - start
    cpu, cuda = module_structure(cpu_text), module_structure(cuda_text)
    return {"protocol": protocol, "batch": batch_size, "stablehlo_cpu": cpu.text_bytes,
            "stablehlo_cuda": cuda.text_bytes, "ops": cpu.ops, "dots": cpu.dots,
            "dots_in_loops": cpu.dots_in_loops, "convs": cpu.convs,
            "whiles": cpu.whiles, "depth": cpu.depth, "cuda_whiles": cuda.whiles, "cuda_depth": cuda.depth,
            "trace_s": trace_seconds, "lower_s": lower_seconds, "compile_s": compile_seconds}


# ---- the image encoders alone ------------------------------------------------------------------

ENCODERS = ("sam_vit_b", "sam_vit_h", "sam2.1_hiera_base_plus", "simpleclick_vit_b")


def encoder_module(name: str):
    """(the block-stack module of model ``name``, its example inputs) at the model's own input size."""
    import jax.numpy as jnp  # noqa: PLC0415

    from jaxseg_robust.models import zoo  # noqa: PLC0415

    spec = zoo.get(name)
    if spec.family == "sam":
        module = zoo.segmenter(name).image_encoder
        size = spec.config.encoder.img_size
        return module, (jnp.zeros((1, size, size, 3), jnp.float32),)
    if spec.family == "sam2":
        from jaxseg_robust.models.sam2.hiera import Hiera  # noqa: PLC0415

        size = spec.config.image_size
        return Hiera(spec.config.encoder), (jnp.zeros((1, size, size, 3), jnp.float32),)
    if spec.family == "simpleclick":
        from jaxseg_robust.models.simpleclick.vit import VisionTransformer  # noqa: PLC0415

        cfg = spec.config
        hw = (448, 448)
        grid = cfg.input_grid(hw)
        return VisionTransformer(cfg), (jnp.zeros((1, *hw, 3), jnp.float32),
                                        jnp.zeros((1, grid[0] * grid[1], cfg.embed_dim), jnp.float32))
    raise ValueError(f"--encoders: {name!r} is not a SAM, SAM 2 or SimpleClick model")


def random_like(shapes, seed: int = 0):
    """Seeded N(0, 0.02) arrays of the shapes of a pytree of ShapeDtypeStructs (no forward pass)."""
    import jax  # noqa: PLC0415

    rng = np.random.default_rng(seed)
    return jax.tree.map(lambda s: (0.02 * rng.standard_normal(s.shape)).astype(s.dtype), shapes)


def measure_encoder(name: str, repeats: int, compile_it: bool) -> list[dict]:
    """One row per variant (unrolled, scanned) of model ``name``'s encoder (module docstring)."""
    import jax  # noqa: PLC0415

    module, example = encoder_module(name)
    rng = np.random.default_rng(1)
    inputs = tuple(rng.standard_normal(x.shape).astype(np.float32) for x in example)
    variables = random_like(jax.eval_shape(module.init, jax.random.PRNGKey(0), *example))
    rows, reference = [], None
    for scan in (False, True):
        jitted = jax.jit(module.clone(scan_blocks=scan).apply)
        start = time.perf_counter()
        lowered = jitted.trace(variables, *inputs).lower()
        lower_seconds = time.perf_counter() - start
        cuda = module_structure(jitted.trace(variables, *inputs).lower(lowering_platforms=("cuda",)).as_text())
        row = {"encoder": name, "blocks": "scanned" if scan else "unrolled", "stablehlo_cuda": cuda.text_bytes,
               "ops": cuda.ops, "dots": cuda.dots, "whiles": cuda.whiles, "lower_s": lower_seconds,
               "compile_s": float("nan"), "run_s": float("nan"), "max_diff": float("nan")}
        if compile_it or repeats:
            start = time.perf_counter()
            compiled = lowered.compile()
            row["compile_s"] = time.perf_counter() - start
        if repeats:
            times = []
            for _ in range(repeats):
                start = time.perf_counter()
                out = jax.block_until_ready(compiled(variables, *inputs))
                times.append(time.perf_counter() - start)
            row["run_s"] = min(times)
            leaves = [np.asarray(leaf) for leaf in jax.tree.leaves(out)]
            reference = leaves if reference is None else reference
            row["max_diff"] = max(float(np.abs(a - b).max()) for a, b in zip(leaves, reference))
        rows.append(row)
    return rows


ENCODER_COLUMNS = ("encoder", "blocks", "stablehlo_cuda", "ops", "dots", "whiles", "lower_s", "compile_s",
                   "run_s", "max_diff")


COLUMNS = ("protocol", "batch", "stablehlo_cpu", "stablehlo_cuda", "ops", "dots", "dots_in_loops", "convs",
           "whiles", "depth",
           "cuda_whiles", "cuda_depth", "trace_s", "lower_s", "compile_s")


def _cell(value) -> str:
    if isinstance(value, float) and value and abs(value) < 0.05:
        return f"{value:.1e}"
    return f"{value:.1f}" if isinstance(value, float) else str(value)


def main(argv=None) -> int:
    """Prints one Markdown row per protocol (module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--protocols", default=",".join(PROTOCOLS), help="comma-separated (default: all)")
    parser.add_argument("--size", default="full", choices=("full", "small", "tiny"), help="the demo's --size")
    parser.add_argument("--no-compile", action="store_true", help="lower only (no XLA:CPU compile)")
    parser.add_argument("--model", default=None, help="the protocols' model (default: the demo model)")
    parser.add_argument("--encoders", default=None,
                        help=f"comma-separated models whose encoder to measure alone ({', '.join(ENCODERS)})")
    parser.add_argument("--repeats", type=int, default=3, help="--encoders: timed calls per variant (0: none)")
    parser.add_argument("--dump", type=pathlib.Path, default=None, help="write the StableHLO texts here")
    args = parser.parse_args(argv)
    protocols = [name.strip() for name in args.protocols.split(",") if name.strip()]
    unknown = sorted(set(protocols) - set(PROTOCOLS))
    if unknown:
        parser.error(f"--protocols: unknown {unknown}; known: {', '.join(PROTOCOLS)}")
    import jax  # noqa: PLC0415

    from jaxseg_robust.commands.demo import SIZES  # noqa: PLC0415
    from jaxseg_robust.models import zoo  # noqa: PLC0415

    if args.encoders:
        print(f"# image encoders alone (random weights), jax {jax.__version__}, {jax.default_backend()}")
        print("| " + " | ".join(ENCODER_COLUMNS) + " |")
        print("|" + "---|" * len(ENCODER_COLUMNS), flush=True)
        for name in [name.strip() for name in args.encoders.split(",") if name.strip()]:
            for row in measure_encoder(name, args.repeats, not args.no_compile):
                print("| " + " | ".join(_cell(row[column]) for column in ENCODER_COLUMNS) + " |", flush=True)
        return 0
    model = args.model or zoo.DEFAULT_MODEL
    segmenter = zoo.segmenter(model)
    params = segmenter.init(0)
    print(f"# {model} (random weights), demo size {args.size}, jax {jax.__version__}, "
          f"{jax.default_backend()}", flush=True)
    print("| " + " | ".join(COLUMNS) + " |")
    print("|" + "---|" * len(COLUMNS), flush=True)
    for protocol in protocols:
        row = measure(protocol, segmenter, params, SIZES[args.size], not args.no_compile, args.dump)
        print("| " + " | ".join(_cell(row[name]) for name in COLUMNS) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
