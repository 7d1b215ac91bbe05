"""The ECCV'24 battery on PSPNet-R50: our jitted attacks vs the authors' / adv-lib loops, one process.

Usage (tuned allocator, docs/benchmarking.md; the script records what it ran with):

    MALLOC_MMAP_THRESHOLD_=4294967296 MALLOC_TRIM_THRESHOLD_=68719476736 \\
    MALLOC_TOP_PAD_=1073741824 JAXSEG_DDCAT_REPO=~/src/Robust-Semantic-Segmentation \\
    JAXSEG_RSE_REPO=~/src/Robust-Segmentation-Evaluation \\
    python experiments/benchmarks/bench_semseg_battery.py --size 512,682 --batch 1 \\
        --iterations 10 --battery-fraction 1.0

Model: semseg's PSPNet-ResNet50 (21 classes) from the official code
(``$JAXSEG_DDCAT_REPO`` or ``$JAXSEG_SEMSEG_REPO``, assert stripped as in
tests/semseg_reference.py) with seeded random weights, converted by our port
(``ports.semseg``), so both sides run the same function of the same weights.
Labels: the model's clean prediction, all pixels valid (the work per
iteration does not depend on the labels).

Per attack, ``--iterations`` iterations on both sides, no early stop (the
min-norm attacks get a success threshold above 1); our first call compiles
(compile time reported apart = first call minus the median steady call):
  * PAdam-CE / PAdam-Cos: ours vs ``padam`` of the authors' code
    (``$JAXSEG_RSE_REPO``: rse/attacks.py);
  * SEA (four losses): ours with ``sea_schedule="single"`` (one APGD run, the
    authors' code's) vs ``apgd_restarts`` of rse/_sea.py;
  * DAG, PDPGD, ALMA prox: ours vs adv-lib 0.2.8 (if importable; it needs
    torchvision).
Whole battery per image: ``--battery-fraction`` of the paper's budgets
(1.0 = PAdam 200, SEA 300, DAG 200, PDPGD 500, ALMA prox 500) for every
attack available on both sides, ours through ``attacks.perturb.ensemble``
(``build_battery`` + ``run_battery``, each family's shared program compiled
on a first warm-up batch, its compile time measured by the program itself,
timed on ``--images`` further images in batches of ``--batch``) against the reference attacks in the
authors' order with the per-image worst case (``composite_attack``'s loop, one
image per call so its selection is per image). Reported: seconds per image
on each side and the ratio (> 1: ours is faster), and our compile seconds.
The reference runs eagerly (adv-lib's ``torch.compile``'d ternary search as
written, as in the parity tests), one image at a time over the same images.
``--iterations 0`` skips the per-attack part. A reference that cannot be
imported is reported as "n/a", never replaced.
``JAX_PLATFORMS`` is respected (``--torch-device cuda`` puts the reference on
the GPU too).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import pathlib
import platform
import statistics
import sys
import tempfile
import time
import types

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "experiments")]

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from jaxseg_robust.attacks.perturb import alma_prox, dag, instance_keys, padam, pdpgd, sea  # noqa: E402
from jaxseg_robust.attacks.perturb.ensemble import (  # noqa: E402
    BatteryConfig,
    battery_compile_summary,
    build_battery,
    run_battery,
)

TUNED_MALLOC = {"MALLOC_MMAP_THRESHOLD_": "4294967296", "MALLOC_TRIM_THRESHOLD_": "68719476736",
                "MALLOC_TOP_PAD_": "1073741824"}
NEVER = 1.01  # a success threshold no image reaches: every iteration runs on both sides
SEA_LOSSES = {"sea_mce": ("mce", "mask-ce-avg", "ce-avg"), "sea_bce": ("bce", "segpgd-loss", "ce-avg"),
              "sea_jsd": ("jsd", "js-avg", "ce-avg"),
              "sea_msl": ("msl", "mask-norm-corrlog-avg", "mask-norm-corrlog-avg")}
ATTACKS = ("padam_ce", "padam_cos", *SEA_LOSSES, "dag_0.001", "dag_0.003", "pdpgd", "alma_prox")


def median_seconds(fn, repeats: int) -> float:
    """Median wall time of ``repeats`` calls of ``fn``."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


# ---------------------------------------------------------------------------- the two sides' model

def build_models(num_classes: int, device: str):
    """(torch model on [0, 1] NCHW -> logits NCHW, our SemsegDense, our params): same weights."""
    import torch

    from semseg_reference import ENV_DDCAT, ENV_SEMSEG, build_official, load_semseg_models, port_and_load

    repo = os.environ.get(ENV_DDCAT) or os.environ.get(ENV_SEMSEG)
    if not repo:
        raise SystemExit(f"set ${ENV_DDCAT} or ${ENV_SEMSEG} to a checkout of the official PSPNet code")
    official = build_official(load_semseg_models(pathlib.Path(repo).expanduser()), "PSPNet", num_classes)
    with tempfile.TemporaryDirectory() as tmp:
        ours, params = port_and_load(official, pathlib.Path(tmp))
    mean = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1) * 255
    std = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1) * 255

    class Normalised(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = official
            self.register_buffer("mean", mean)
            self.register_buffer("std", std)

        def forward(self, x):
            return self.net((x * 255 - self.mean) / self.std)

    model = Normalised().to(device).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model, ours, params


def load_rse(root: pathlib.Path):
    """(padam, apgd_restarts) of the authors' code, without its package __init__ (torchmetrics, adv-lib).

    rse/attacks.py imports adv-lib's attacks by name at module level; without adv-lib,
    empty stand-in modules satisfy that import and are removed again afterwards.
    """
    package = types.ModuleType("rse")
    package.__path__ = [str(root / "rse")]
    sys.modules["rse"] = package
    stand_ins = ()
    if importlib.util.find_spec("adv_lib") is not None:
        from attack_reference import import_with_stand_ins

        import_with_stand_ins("adv_lib.attacks.segmentation")  # visdom / torchvision stand-ins where missing
    else:
        stand_ins = ("adv_lib", "adv_lib.attacks", "adv_lib.attacks.segmentation")
        for name in stand_ins:
            sys.modules[name] = types.ModuleType(name)
        for attr in ("alma_prox", "pdpgd", "dag"):
            setattr(sys.modules["adv_lib.attacks.segmentation"], attr, None)
    try:
        attacks = importlib.import_module("rse.attacks")
    finally:
        for name in stand_ins:
            sys.modules.pop(name, None)
    return attacks.padam, importlib.import_module("rse._sea").apgd_restarts


def load_advlib():
    """adv-lib's segmentation attacks, or None (it needs torchvision)."""
    try:
        from attack_reference import import_with_stand_ins

        return import_with_stand_ins("adv_lib.attacks.segmentation")
    except Exception as err:  # noqa: BLE001 - reported as n/a
        print(f"adv-lib unavailable ({type(err).__name__}: {err}); DAG / PDPGD / ALMA prox: n/a", flush=True)
        return None


# ---------------------------------------------------------------------------- one attack, both sides

def ours_attack(name: str, apply, params, steps: int, epsilon: float, threshold: float):
    """``run(x, y, m, keys) -> images`` for one attack with ``steps`` iterations (jitted inside)."""
    if name.startswith("padam"):
        return lambda x, y, m, k: padam(apply, params, x, y, m, k, loss=name.split("_")[1], epsilon=epsilon,
                                        num_steps=steps).images
    if name in SEA_LOSSES:
        return lambda x, y, m, k: sea(apply, params, x, y, m, k, loss=SEA_LOSSES[name][0], epsilon=epsilon,
                                      schedule="single", total_iterations=steps).images
    if name.startswith("dag"):
        return lambda x, y, m, k: dag(apply, params, x, y, m, gamma=float(name[4:]), max_iterations=steps,
                                      threshold=threshold, epsilon=epsilon).images
    if name == "pdpgd":
        return lambda x, y, m, k: pdpgd(apply, params, x, y, m, num_steps=steps, threshold=threshold,
                                        epsilon=epsilon).images
    return lambda x, y, m, k: alma_prox(apply, params, x, y, m, num_steps=steps, threshold=threshold,
                                        epsilon=epsilon).images


def reference_attack(name: str, refs: dict, steps: int, epsilon: float, threshold: float):
    """``run(model, x, y) -> images`` of the authors' / adv-lib code, or None if unavailable."""
    import torch.nn.functional as F

    padam_ref, apgd_ref, advlib = refs["padam"], refs["apgd"], refs["advlib"]
    if name.startswith("padam") and padam_ref is not None:
        if name == "padam_ce":
            loss = lambda z, y: F.cross_entropy(z, y, reduction="none")
        else:
            loss = lambda z, y: 1 - F.cosine_similarity(z, F.one_hot(y, z.shape[1]).movedim(-1, 1))
        return lambda model, x, y: padam_ref(model, x, y, loss_fn=loss, eps=epsilon, step_size=2 / 255,
                                             num_steps=steps)
    if name in SEA_LOSSES and apgd_ref is not None:
        _, loss, track = SEA_LOSSES[name]
        return lambda model, x, y: apgd_ref(model, x, y, eps=epsilon, n_iter=steps, n_restarts=1, use_rs=True,
                                            loss=loss, track_loss=track)
    if advlib is None or name.startswith(("padam", "sea")):
        return None
    if name.startswith("dag"):
        return lambda model, x, y: advlib.dag(model, x, y, max_iter=steps, γ=float(name[4:]),
                                              adv_threshold=threshold)
    if name == "pdpgd":
        return lambda model, x, y: advlib.pdpgd(model, x, y, norm=float("inf"), num_steps=steps, primal_lr=0.01,
                                                adv_threshold=threshold)
    return lambda model, x, y: advlib.alma_prox(model, x, y, num_steps=steps, lr_init=1e-4,
                                                adv_threshold=threshold)


def budgets(fraction: float) -> dict[str, int]:
    """The paper's iteration budgets scaled by ``fraction`` (at least 2 each)."""
    full = {"padam": 200, "sea": 300, "dag": 200, "pdpgd": 500, "alma": 500}
    return {k: max(2, int(round(v * fraction))) for k, v in full.items()}


def steps_of(name: str, budget: dict[str, int]) -> int:
    """The budget entry of an attack name."""
    key = {"padam": "padam", "sea": "sea", "dag": "dag", "pdpgd": "pdpgd", "alma": "alma"}[name.split("_")[0]]
    return budget[key]


# ---------------------------------------------------------------------------- the benchmark

def per_attack_rows(names, ours_model, params, torch_model, refs, x, y, keys, args, epsilon) -> list[dict]:
    """Iterations per second of each attack on both sides (``args.iterations`` each)."""
    import torch

    m = jnp.ones(y.shape, bool)
    xt = torch.from_numpy(np.ascontiguousarray(np.asarray(x).transpose(0, 3, 1, 2))).to(args.torch_device)
    yt = torch.from_numpy(np.asarray(y, np.int64)).to(args.torch_device)
    rows = []
    for name in names:
        run = ours_attack(name, ours_model.apply, params, args.iterations, epsilon, NEVER)
        call = lambda: jax.block_until_ready(run(x, y, m, keys))
        start = time.perf_counter()
        call()
        first = time.perf_counter() - start
        ours_s = median_seconds(call, args.repeats)
        ref = reference_attack(name, refs, args.iterations, epsilon, NEVER)
        theirs_s = float("nan")
        if ref is not None:
            try:
                ref(torch_model, xt, yt)  # warm-up
                theirs_s = median_seconds(lambda: ref(torch_model, xt, yt), args.repeats)
            except RuntimeError as error:  # e.g. adv-lib's ALMA prox top-k on a batch of tiny images
                print(f"  {name}: the reference failed ({str(error).splitlines()[0]}); its row is n/a", flush=True)
        row = {"attack": name, "ours_it_s": args.iterations / ours_s, "ref_it_s": args.iterations / theirs_s,
               "ratio": theirs_s / ours_s, "compile_s": max(first - ours_s, 0.0)}
        rows.append(row)
        print(f"  {name}: ours {row['ours_it_s']:.3f} it/s, reference {row['ref_it_s']:.3f} it/s, "
              f"ours/reference {row['ratio']:.2f}, our compile {row['compile_s']:.1f} s", flush=True)
    return rows


def battery_row(names, ours_model, params, torch_model, refs, images, labels, args, epsilon) -> dict:
    """Seconds per image of the whole battery (``names``) on both sides, compile apart."""
    import torch

    budget = budgets(args.battery_fraction)
    config = BatteryConfig(num_classes=ours_model.num_classes, epsilon=epsilon, attacks=tuple(names),
                           padam_steps=budget["padam"], sea_iterations=budget["sea"], dag_iterations=budget["dag"],
                           alma_steps=budget["alma"], pdpgd_steps=budget["pdpgd"], sea_schedule="single")
    candidates = build_battery(ours_model.apply, config)
    b = args.batch
    valid = jnp.ones(labels.shape, bool)

    def ours_pass(offset: int) -> float:
        x, y = jnp.asarray(images[offset:offset + b]), jnp.asarray(labels[offset:offset + b])
        keys = instance_keys(jax.random.key(0), jnp.arange(offset, offset + b))
        start = time.perf_counter()
        run_battery(candidates, ours_model.apply, params, x, y, valid[offset:offset + b], keys,
                    num_classes=ours_model.num_classes)
        return time.perf_counter() - start

    count = args.images or b  # images timed on each side (after one warm-up batch of ours)
    ours_pass(0)  # compiles every program (timed apart by the programs themselves)
    steady = sum(ours_pass(offset) for offset in range(b, b + count, b))
    timed = len(range(b, b + count, b)) * b
    refs_runs = [(n, reference_attack(n, refs, steps_of(n, budget), epsilon, 0.99)) for n in names]

    def reference_image(i: int):  # composite_attack's loop, one image: per-image selection
        xt = torch.from_numpy(np.ascontiguousarray(images[i:i + 1].transpose(0, 3, 1, 2))).to(args.torch_device)
        yt = torch.from_numpy(labels[i:i + 1].astype(np.int64)).to(args.torch_device)
        best, best_score = xt, float("inf")
        for name, ref in refs_runs:
            adv = ref(torch_model, xt, yt)
            if not name.startswith(("padam", "sea")):
                adv = torch.minimum(torch.maximum(adv, xt - epsilon), xt + epsilon)
            with torch.no_grad():
                score = float((torch_model(adv).argmax(1) == yt).float().mean())
            if score < best_score:
                best, best_score = adv, score
        return best

    theirs = float("nan")
    if all(ref is not None for _, ref in refs_runs):
        from attack_reference import eager_reference

        start = time.perf_counter()
        with eager_reference():  # adv-lib's torch.compile'd ternary search runs as written
            for i in range(b, b + timed):
                reference_image(i)
        theirs = (time.perf_counter() - start) / timed
    compiled = battery_compile_summary(candidates, ours_model.apply, ours_model.num_classes)
    row = {"ours_s_per_image": steady / timed, "ref_s_per_image": theirs, "ratio": theirs / (steady / timed),
           "images": timed,
           "compile_s": compiled["compile_seconds"], "programs": compiled["programs"], "budget": budget}
    print(f"  battery over {timed} images ({', '.join(names)}; budgets {budget}): ours {row['ours_s_per_image']:.2f} s/image, "
          f"reference {row['ref_s_per_image']:.2f} s/image, ours/reference {row['ratio']:.2f}, "
          f"our compile {row['compile_s']:.1f} s ({row['programs']} programs, measured apart)", flush=True)
    return row


def main(argv: list[str] | None = None) -> dict:
    """Parses flags, runs both parts, prints the tables; returns the rows."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="512,682", help="H,W of the images (the paper's VOC: 512,682)")
    parser.add_argument("--batch", type=int, default=1, help="images per attack call")
    parser.add_argument("--iterations", type=int, default=10,
                        help="iterations per attack (per-attack part; 0 = skip that part)")
    parser.add_argument("--images", type=int, default=0,
                        help="images timed end to end in the battery part (default: one batch)")
    parser.add_argument("--repeats", type=int, default=3, help="timed calls per side (median)")
    parser.add_argument("--attacks", default=",".join(ATTACKS), help=f"comma list of {', '.join(ATTACKS)}")
    parser.add_argument("--battery-fraction", type=float, default=0.02,
                        help="fraction of the paper's budgets for the whole-battery part (1.0 = full; 0 = skip)")
    parser.add_argument("--torch-device", default="cpu", help="device of the reference (cpu, cuda)")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    args = parser.parse_args(argv)
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    malloc = {k: os.environ.get(k, "(default)") for k in TUNED_MALLOC}
    print(f"python {platform.python_version()}, jax {jax.__version__} ({jax.default_backend()}: "
          f"{jax.devices()[0].device_kind}), torch {torch.__version__} on {args.torch_device} "
          f"({torch.get_num_threads()} threads), {os.cpu_count()} CPUs; malloc {malloc}"
          + ("" if all(os.environ.get(k) == v for k, v in TUNED_MALLOC.items())
             else "  [not the tuned allocator of docs/benchmarking.md]"), flush=True)
    height, width = (int(v) for v in args.size.split(","))
    names = tuple(a.strip() for a in args.attacks.split(",") if a.strip())
    unknown = sorted(set(names) - set(ATTACKS))
    if unknown:
        raise SystemExit(f"unknown attacks {unknown}; known: {ATTACKS}")
    epsilon = 8 / 255
    torch_model, ours_model, params = build_models(21, args.torch_device)
    rse = os.environ.get("JAXSEG_RSE_REPO")
    padam_ref, apgd_ref = load_rse(pathlib.Path(rse).expanduser()) if rse else (None, None)
    if rse is None:
        print("$JAXSEG_RSE_REPO is not set: PAdam / SEA references n/a", flush=True)
    refs = {"padam": padam_ref, "apgd": apgd_ref,
            "advlib": load_advlib() if any(n.startswith(("dag", "pdpgd", "alma")) for n in names) else None}
    count = max(3 * args.batch, args.batch + -(-max(args.images, 1) // args.batch) * args.batch)
    images = np.random.default_rng(0).random((count, height, width, 3)).astype(np.float32)
    predict = jax.jit(lambda p, x: jnp.argmax(ours_model.apply(p, x), -1).astype(jnp.int32))
    labels = np.concatenate([np.asarray(predict(params, jnp.asarray(images[i:i + 1]))) for i in range(len(images))])
    x, y = jnp.asarray(images[:args.batch]), jnp.asarray(labels[:args.batch])
    keys = instance_keys(jax.random.key(0), jnp.arange(args.batch))
    print(f"per attack: {args.iterations} iterations, batch {args.batch} x {height}x{width}", flush=True)
    rows = per_attack_rows(names, ours_model, params, torch_model, refs, x, y, keys, args, epsilon) \
        if args.iterations > 0 else []
    battery = None
    if args.battery_fraction > 0:
        battery = battery_row(names, ours_model, params, torch_model, refs, images, labels, args, epsilon)
    print("\n| attack | ours it/s | reference it/s | ours / reference | our compile s |\n|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['attack']} | {r['ours_it_s']:.3f} | {r['ref_it_s']:.3f} | {r['ratio']:.2f} | "
              f"{r['compile_s']:.1f} |")
    if battery is not None:
        print(f"| battery s/image | {battery['ours_s_per_image']:.2f} | {battery['ref_s_per_image']:.2f} | "
              f"{battery['ratio']:.2f} | {battery['compile_s']:.1f} |")
    return {"attacks": rows, "battery": battery}


if __name__ == "__main__":
    main()
