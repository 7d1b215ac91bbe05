"""BREPS box attack throughput: our batched JAX attack vs a reference loop as the BREPS code runs it.

Usage (tuned allocator, as docs/benchmarking.md recommends; the script records it):

    MALLOC_MMAP_THRESHOLD_=4294967296 MALLOC_TRIM_THRESHOLD_=68719476736 \\
    MALLOC_TOP_PAD_=1073741824 python experiments/benchmarks/bench_breps.py \\
        --instances 8 --size 480 640                       # SAM ViT-B
    ... bench_breps.py --family sam2 --model sam2.1_hiera_tiny --instances 4   # SAM 2 (JAXSEG_SAM2_REPO)

Quick check: ``--instances 2 --size 240 320 --steps 10``. On a GPU (JAX_PLATFORMS
is respected): ``--torch-device cuda --instances 64 --torch-instances 8``.

Both sides use the same model, built by the official code without a checkpoint,
every tensor overwritten with seeded random values and converted in-process with
our port: ``--family sam`` the segment-anything model of ``--model`` (default
ViT-B; `bench_sam.randomize_` + `ports.sam.convert_sam`), ``--family sam2`` the
official SAM 2 / 2.1 of ``--model`` (`bench_sam2.setup_model`, the weights
`bench_sam2.py` uses). One process, the same generated instances (an elliptic
object on a noisy image of ``--size``; random weights make the IoUs
meaningless, the work per step is what is measured).

Reference (``torch``): one instance at a time, as C-B ``forward_optimizable_bbox``
does it (docs/protocols/breps.md §4): the image features computed once per
image under ``no_grad``, then ``--steps`` iterations of the family's decode ->
``P = sigmoid`` of the candidate with the highest predicted IoU -> loss
``s * Dice(P, G) - lambda * Gamma(k, 1/theta).log_prob(X)`` with ``X =
nan_to_num(torchvision complete_box_iou_loss(relu(b), B*_r))`` (the realism
term skipped at X == 0), selection IoU and Boundary IoU of ``P > 0.5`` on the
host (NumPy + OpenCV erosion, as the reference's metrics), best-iterate
bookkeeping, then a ``torch.optim.Adam`` step with autograd (lr scaled by the
image diagonal). The family's decode:

  * SAM (C-B's SAM wrapper): ``prompt_encoder(boxes=b)`` ->
    ``mask_decoder(multimask_output=True)`` -> ``postprocess_masks`` to the
    image size -> the candidate's sigmoid;
  * SAM 2 (C-B ``isegm/model/is_sam2_model.py``): the box variable lives in
    the square 1024 frame (``b = B* * (1024 / W, 1024 / H)``) and goes through
    the body of the official ``SAM2ImagePredictor._predict`` with autograd on
    (the authors' predictor keeps gradients; the released one is
    ``no_grad``): the box as two points labelled 2/3 into
    ``sam_prompt_encoder`` -> ``sam_mask_decoder(multimask_output=True,
    high_res_features=...)`` -> ``_transforms.postprocess_masks`` of all three
    candidates to the image size -> sigmoid of the three -> the best by
    predicted IoU. The box is mapped to the 1024 frame once (the project's
    reading, docs/protocols/breps.md: the authors' ``predict`` call maps it a
    second time with ``normalize_coords=True``; the work is the same).

Both sides get the same preprocessed float model input (our segmenter's
``preprocess``), so the features agree and the first iterate (tight box) is
cross-checked: the tight-box selection IoU of both sides.

Ours (``jax``): the features per image with the jitted ``embed`` (one image per
call), then the whole batch of B instances attacked in ONE jitted call of the
per-instance function the CLI's batch program vmaps
(``make_breps_batch_fn(...).protocol.instance``: `jaxseg_robust.attacks.boxes`,
the steps a ``lax.scan`` of Optax Adam, the threshold the family's
``probability_threshold``); ``--minmax`` also times MIN and MAX together on one
embedding (``mode="minmax"``), reported per attack; ``--program`` also times
the CLI's whole batch program (``BatchProgram`` on a ``PaddedBatch``: embed the
batch + attack in one compiled call, what ``runner.engine.run`` calls).

Encoder time is reported separately from the attack loop; the headline ratio
is the attack loop per instance (reference / ours; target >= 1.5 on CPU).
Compile times are reported separately (paid once per bucket shape in a run).
``--precision`` sets JAX's float32 matmul precision of our side and
``--torch-tf32`` lets the reference use TF32 on a GPU (default strict float32;
`bench_device`), so the cross-check line measures a precision's distance to
torch float32.
``--torch-instances K`` runs the reference on the first K instances only (its
per-instance time is a mean; a GPU batch of ours can be far larger than the
reference needs). Other processes share this machine: numbers are noisy.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import pathlib
import platform
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import bench_sam  # noqa: E402
from bench_device import add_device_flags, configure_torch, device_lines, jax_precision  # noqa: E402
import bench_sam2  # noqa: E402

GAMMA_K = 1.7891955953866256
GAMMA_THETA = 0.12104836378138935
DEFAULT_MODELS = {"sam": "sam_vit_b", "sam2": "sam2.1_hiera_tiny"}


# ---- instances ---------------------------------------------------------------------------

def make_instances(count: int, height: int, width: int, seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    """``count`` (uint8[H, W, 3] image, int8[H, W] gt) pairs: an ellipse on a noisy background."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[:height, :width]
    out = []
    for _ in range(count):
        cy, cx = rng.uniform(0.3, 0.7) * height, rng.uniform(0.3, 0.7) * width
        ry, rx = rng.uniform(0.12, 0.3) * height, rng.uniform(0.12, 0.3) * width
        gt = (((yy - cy) / ry) ** 2 + ((xx - cx) / rx) ** 2 <= 1).astype(np.int8)
        image = rng.integers(0, 80, (height, width, 3)).astype(np.uint8)
        image[gt == 1] += np.uint8(120)
        out.append((image, gt))
    return out


def tight_box(mask: np.ndarray) -> np.ndarray:
    """Inclusive tight box (x1, y1, x2, y2) of a non-empty bool mask."""
    rows, cols = np.flatnonzero(mask.any(1)), np.flatnonzero(mask.any(0))
    return np.array([cols[0], rows[0], cols[-1], rows[-1]], np.float32)


# ---- the models of both frameworks ----------------------------------------------------------

@dataclasses.dataclass
class Family:
    """One model in both frameworks, on the same weights.

    Attributes:
      label: what the report calls it.
      seg, params: our segmenter and its parameters.
      device: the torch device.
      encode: ``model_input f32[S, S, 3] (ours) -> torch features`` (the official encoder, no grad).
      decoder: ``(features, our Transform) -> decode``; ``decode(box f32[1, 4] model frame, requires_grad)
        -> (P f32[H, W] sigmoid of the selected candidate, differentiable in box)``.
      torch_model: the official torch model (the SAM family; `bench_precision`'s click grid reads it).
    """

    label: str
    seg: Any
    params: Any
    device: Any
    encode: Callable
    decoder: Callable
    torch_model: Any = None


def _freeze(model) -> None:
    for parameter in model.parameters():
        parameter.requires_grad_(False)  # gradients flow to the box only, as in the reference attack


def _sizes(transform, name: str) -> tuple[int, int]:
    return tuple(int(v) for v in np.asarray(getattr(transform, name)))


def _to_torch_input(torch, model_input, device):
    return torch.from_numpy(np.array(model_input)).permute(2, 0, 1)[None].contiguous().to(device)


def sam_family(args) -> Family:
    """segment-anything ``args.model`` with `bench_sam`'s random weights; C-B's SAM decode."""
    import jax  # noqa: PLC0415
    import jax.numpy as jnp  # noqa: PLC0415
    import torch  # noqa: PLC0415

    from jaxseg_robust.models import zoo  # noqa: PLC0415

    bench_sam2.import_torchvision()
    spec = bench_sam.BENCH_MODELS[args.model]
    official = spec.build_official().eval()
    bench_sam.randomize_(official, args.seed)
    _freeze(official)
    seg = zoo.segmenter(spec.zoo_name)
    state = {k: v.detach().numpy() for k, v in official.state_dict().items()}
    params = jax.tree.map(jnp.asarray, spec.convert(state, seg.config))
    del state
    device = torch.device(args.torch_device)
    official = official.to(device)

    def encode(model_input):
        with torch.no_grad():
            return official.image_encoder(_to_torch_input(torch, model_input, device))

    def decoder(features, transform):
        input_size, image_hw = _sizes(transform, "resized_hw"), _sizes(transform, "original_hw")
        dense_pe = official.prompt_encoder.get_dense_pe()

        def decode(box):
            sparse, dense = official.prompt_encoder(points=None, boxes=box, masks=None)
            low, iou_pred = official.mask_decoder(image_embeddings=features, image_pe=dense_pe,
                                                  sparse_prompt_embeddings=sparse, dense_prompt_embeddings=dense,
                                                  multimask_output=True)
            masks = official.postprocess_masks(low, input_size, image_hw)
            return torch.sigmoid(masks[0, int(torch.argmax(iou_pred[0]))])

        return decode

    return Family(f"{args.model} (segment-anything)", seg, params, device, encode, decoder, official)


def sam2_family(args) -> Family:
    """Official SAM 2 ``args.model`` with `bench_sam2`'s random weights; C-B's SAM 2 decode."""
    import torch  # noqa: PLC0415

    ctx = bench_sam2.setup_model(args.model, argparse.Namespace(
        repo=args.repo, torch_device=args.torch_device, dtype="float32", image_hw=args.size, seed=args.seed))
    official, predictor, device = ctx["official"], ctx["predictor"], ctx["device"]
    _freeze(official)
    box_labels = torch.tensor([[2, 3]], dtype=torch.int, device=device)

    def encode(model_input):
        with torch.no_grad():
            return bench_sam2.official_features(official, predictor, _to_torch_input(torch, model_input, device))

    def decoder(features, transform):
        image_hw = _sizes(transform, "original_hw")
        dense_pe = official.sam_prompt_encoder.get_dense_pe()

        def decode(box):  # SAM2ImagePredictor._predict with a box, autograd on
            sparse, dense = official.sam_prompt_encoder(points=(box.reshape(-1, 2, 2), box_labels), boxes=None,
                                                        masks=None)
            low, iou_pred, _, _ = official.sam_mask_decoder(
                image_embeddings=features["image_embed"], image_pe=dense_pe, sparse_prompt_embeddings=sparse,
                dense_prompt_embeddings=dense, multimask_output=True, repeat_image=False,
                high_res_features=features["high_res_feats"])
            masks = predictor._transforms.postprocess_masks(low, image_hw)
            return torch.sigmoid(masks[0])[int(torch.argmax(iou_pred[0]))]

        return decode

    return Family(f"{args.model} (official sam2)", ctx["seg"], ctx["params"], device, encode, decoder)


FAMILIES = {"sam": sam_family, "sam2": sam2_family}


# ---- the reference loop (torch) ----------------------------------------------------------------

def boundary(mask: np.ndarray, width: int) -> np.ndarray:
    """Official Boundary IoU band: mask minus its zero-padded 3x3 erosion iterated ``width`` times."""
    import cv2  # noqa: PLC0415

    padded = cv2.copyMakeBorder(mask.astype(np.uint8), 1, 1, 1, 1, cv2.BORDER_CONSTANT, value=0)
    eroded = cv2.erode(padded, np.ones((3, 3), np.uint8), iterations=width)[1:-1, 1:-1]
    return (mask.astype(np.uint8) - eroded) > 0


def selection_scores(pred: np.ndarray, target: np.ndarray, width: int) -> tuple[float, float]:
    """(IoU, Boundary IoU) of bool masks, 0 on an empty union (the reference's numba metrics)."""
    def ratio(a, b):
        union = np.logical_or(a, b).sum()
        return float(np.logical_and(a, b).sum() / union) if union else 0.0
    return ratio(pred, target), ratio(boundary(pred, width), boundary(target, width))


def torch_breps(decode, scale_xy, gt: np.ndarray, *, maximise: bool, steps: int, lr_mult: float,
                lam: float, thr: float = 0.5, device="cpu") -> dict:
    """One BREPS attack, one instance, official modules + autograd + torch Adam (docs/protocols/breps.md §4).

    Args:
      decode: ``box f32[1, 4] (model frame) -> P f32[H, W]`` (`Family.decoder`).
      scale_xy: (sx, sy) evaluation frame -> model frame.
      gt: int8[H, W] 1 object.

    Returns:
      {"tight_iou": selection IoU of iterate 0, "iou": the best one}.
    """
    import torch  # noqa: PLC0415
    from torchvision.ops import complete_box_iou_loss  # noqa: PLC0415

    height, width = gt.shape
    target_np = gt == 1
    target = torch.from_numpy(target_np.astype(np.float32)).to(device)
    band = max(1, round(0.02 * math.hypot(height, width)))
    sx, sy = (float(v) for v in scale_xy)
    tight_r = torch.from_numpy(tight_box(target_np) * np.float32([sx, sy, sx, sy]))[None].to(device)
    box = tight_r.clone().requires_grad_(True)
    lr = lr_mult * math.hypot(height, width) / (1024 * math.sqrt(2))
    optimizer = torch.optim.Adam([box], lr=lr)
    gamma = torch.distributions.Gamma(torch.tensor(GAMMA_K, device=device),
                                      torch.tensor(1.0 / GAMMA_THETA, device=device))
    sign = 1.0 if maximise else -1.0
    best = (-2.0, -2.0) if maximise else (2.0, 2.0)
    first = None
    for _ in range(steps):
        prob = decode(box)
        total = prob.sum() + target.sum()
        dice = 1 - 2 * (prob * target).sum() / torch.clamp(total, min=1e-7)
        ciou = complete_box_iou_loss(torch.relu(box), tight_r, reduction="none")
        ciou = torch.nan_to_num(ciou)[0]
        loss = sign * dice
        if float(ciou.detach()) != 0.0:
            loss = loss - lam * gamma.log_prob(ciou)
        scores = selection_scores((prob > thr).detach().cpu().numpy(), target_np, band)
        if first is None:
            first = scores
        if (scores > best) if maximise else (scores < best):
            best = scores
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return {"tight_iou": first[0], "iou": best[0]}


def run_torch(family: Family, instances, inputs, args) -> dict:
    """The reference on the first ``args.torch_instances`` instances: median encoder and attack seconds."""
    import torch  # noqa: PLC0415

    def sync():
        if family.device.type == "cuda":
            torch.cuda.synchronize()

    encoder, attack, results = [], [], []
    for (image, gt), (model_input, transform) in list(zip(instances, inputs))[:args.torch_instances]:
        start = time.perf_counter()
        features = family.encode(model_input)
        sync()
        encoder.append(time.perf_counter() - start)
        resized_h, resized_w = (int(v) for v in np.asarray(transform.resized_hw))
        scale_xy = (resized_w / gt.shape[1], resized_h / gt.shape[0])
        start = time.perf_counter()
        results.append(torch_breps(family.decoder(features, transform), scale_xy, gt, maximise=False,
                                   steps=args.steps, lr_mult=args.lr_mult, lam=0.1, device=family.device))
        sync()
        attack.append(time.perf_counter() - start)
        print(f"  torch instance {len(attack)}: encoder {encoder[-1]:.2f} s, attack {attack[-1]:.2f} s", flush=True)
    return {"encoder": statistics.median(encoder), "attack": statistics.median(attack), "results": results,
            "attack_all": attack}


# ---- ours (jax) ---------------------------------------------------------------------------

def attack_function(seg, params, mode: str, args):
    """jit of the CLI's per-instance BREPS function vmapped over a batch: ``(features, transforms, gt, widths)
    -> outputs``, and its protocol."""
    import jax  # noqa: PLC0415
    import jax.numpy as jnp  # noqa: PLC0415

    from jaxseg_robust.attacks.boxes import make_breps_batch_fn  # noqa: PLC0415
    from jaxseg_robust.runner.program import InstanceInputs  # noqa: PLC0415

    protocol = make_breps_batch_fn(seg, params, mode=mode, n_steps=args.steps, lr_mult=args.lr_mult).protocol

    def batch(params, features, transforms, gts, widths):
        inputs = InstanceInputs(features=features, transform=transforms, gt=gts, width=widths,
                                seed=jnp.zeros(gts.shape[:1], jnp.uint32), extras={})
        return jax.vmap(lambda one: protocol.instance(seg, params, None, one))(inputs)

    return jax.jit(batch), protocol


def run_jax(family: Family, instances, inputs, args) -> dict:
    """Our side: per-image embed, the batched attack (and MIN+MAX, the whole program when asked)."""
    import jax  # noqa: PLC0415

    from jaxseg_robust.metrics.masks import boundary_widths  # noqa: PLC0415
    from jaxseg_robust.runner.program import stack_trees  # noqa: PLC0415

    seg, params = family.seg, family.params
    embed = jax.jit(seg.embed)
    start = time.perf_counter()
    jax.block_until_ready(embed(params, inputs[0][0]))
    embed_compile = time.perf_counter() - start
    encoder, features = [], []
    for model_input, _ in inputs:
        start = time.perf_counter()
        features.append(jax.block_until_ready(embed(params, model_input)))
        encoder.append(time.perf_counter() - start)
    attack, protocol = attack_function(seg, params, "min", args)
    arguments = (params, stack_trees(features), stack_trees([t for _, t in inputs]),
                 jax.numpy.asarray(np.stack([gt for _, gt in instances])),
                 jax.numpy.asarray(boundary_widths([gt.shape for _, gt in instances], protocol.dilation_ratio)))
    out = {"encoder": statistics.median(encoder), "embed_compile": embed_compile}

    def call_attack():
        out["outputs"] = jax.device_get(attack(*arguments))

    out["attack_compile"], out["attack"], _ = bench_sam2.timed(call_attack, args.repeats)
    if args.minmax:
        both, _ = attack_function(seg, params, "minmax", args)
        out["minmax_compile"], out["minmax"], _ = bench_sam2.timed(
            lambda: jax.block_until_ready(both(*arguments)), args.repeats)
    if args.program:
        out.update(run_program(seg, params, instances, args))
    return out


def run_program(seg, params, instances, args) -> dict:
    """The CLI's whole batch program (embed the batch + MIN attack, one compiled call) on one `PaddedBatch`."""
    from jaxseg_robust.attacks.boxes import make_breps_batch_fn  # noqa: PLC0415
    from jaxseg_robust.data.buckets import PaddedBatch  # noqa: PLC0415

    n, (height, width) = len(instances), instances[0][1].shape
    batch = PaddedBatch(image=np.stack([image for image, _ in instances]), gt=np.stack([gt for _, gt in instances]),
                        valid=np.ones((n, height, width), bool), size=np.tile(np.int32([height, width]), (n, 1)),
                        instance_valid=np.ones(n, bool), seed=np.zeros(n, np.uint32))
    program = make_breps_batch_fn(seg, params, mode="min", n_steps=args.steps, lr_mult=args.lr_mult)
    first, median, _ = bench_sam2.timed(lambda: program(batch), args.repeats)
    return {"program_first": first, "program": median}


# ---- the benchmark ---------------------------------------------------------------------------

def report(family: Family, ref: dict, ours: dict, args) -> list[str]:
    """The report lines of one run (times per instance; ratios reference / ours)."""
    n, k = args.instances, args.torch_instances
    height, width = args.size
    jax_att = ours["attack"] / n
    torch_enc, torch_att, jax_enc = ref["encoder"], ref["attack"], ours["encoder"]
    results, outputs = ref["results"], ours["outputs"]
    tight_diff = max(abs(float(outputs["tight_selection_iou"][i]) - results[i]["tight_iou"]) for i in range(k))
    final_diff = [abs(float(outputs["selection_iou"][i]) - results[i]["iou"]) for i in range(k)]

    def row(stage, t_torch, t_jax, note=""):
        return f"{stage:<40} {t_torch:>9.3f} {t_jax:>9.3f} {t_torch / t_jax:>9.2f}{note}"

    lines = [(f"{family.label}: {n} instances of {height}x{width} (torch: the first {k}), {args.steps} steps "
              f"(mode MIN), lr_mult {args.lr_mult}, random weights (seed {args.seed})"),
             f"{'stage (s per instance)':<40} {'torch s':>9} {'jax s':>9} {'torch/jax':>9}",
             row("encoder, per image (median)", torch_enc, jax_enc),
             row("attack loop, per instance", torch_att, jax_att,
                 f"   (torch: median of {k}, min {min(ref['attack_all']):.3f}; jax: batch of {n} in one call, "
                 f"median of {args.repeats})"),
             row("encoder + attack, per instance", torch_enc + torch_att, jax_enc + jax_att)]
    if "minmax" in ours:
        lines.append(row("attack loop, MIN+MAX shared, per attack", torch_att, ours["minmax"] / (2 * n),
                         f"   (compile {ours['minmax_compile']:.1f} s)"))
    if "program" in ours:
        lines.append(row("CLI program (embed + attack), per inst.", torch_enc + torch_att, ours["program"] / n,
                         f"   (first call incl. compile {ours['program_first']:.1f} s)"))
    lines += [(f"ms per attack: torch {1e3 * torch_att:.1f}, jax {1e3 * jax_att:.1f} (batch {n}); "
               f"instances/s (attack loop): torch {1 / torch_att:.3f}, jax {1 / jax_att:.3f}"),
              (f"jax compile (incl. first run, not in the numbers above): embed {ours['embed_compile']:.1f} s, "
               f"attack {ours['attack_compile']:.1f} s"),
              (f"cross-check over {k} instances: max |tight-box selection IoU diff| {tight_diff:.2g}; final MIN IoU "
               f"|diff| mean {statistics.mean(final_diff):.3g} max {max(final_diff):.3g} (a large value can be "
               f"legitimate: tiny float differences can send the two optimisations down different paths)")]
    return lines


def run(args) -> list[str]:
    """Runs both sides; returns the report lines."""
    family = FAMILIES[args.family](args)
    height, width = args.size
    instances = make_instances(args.instances, height, width, args.seed)
    inputs = [family.seg.preprocess(image) for image, _ in instances]
    ref = run_torch(family, instances, inputs, args)
    with jax_precision(args):
        ours = run_jax(family, instances, inputs, args)
    return report(family, ref, ours, args)


def parse_args(argv=None):
    """The flags (``--model`` defaults by ``--family``; ``--torch-instances`` to at most ``--instances``)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", choices=sorted(FAMILIES), default="sam")
    parser.add_argument("--model", default=None,
                        help=f"zoo name (default {DEFAULT_MODELS}; sam: {sorted(bench_sam.BENCH_MODELS)})")
    parser.add_argument("--instances", type=int, default=8, help="instances = B of our batched call")
    parser.add_argument("--torch-instances", type=int, default=None,
                        help="instances the reference runs (the first K; default all)")
    parser.add_argument("--size", nargs=2, type=int, default=[480, 640], metavar=("H", "W"),
                        help="image size (default 480 640, GrabCut/DAVIS-like)")
    parser.add_argument("--steps", type=int, default=50, help="BREPS evaluated iterates (default 50)")
    parser.add_argument("--lr-mult", type=float, default=9.0)
    parser.add_argument("--repeats", type=int, default=1, help="timed repeats of our batched call (median)")
    parser.add_argument("--minmax", action="store_true", help="also time MIN+MAX on one embedding")
    parser.add_argument("--program", action="store_true",
                        help="also time the CLI's batch program (embed + attack in one compiled call)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    add_device_flags(parser)
    parser.add_argument("--repo", default=os.environ.get("JAXSEG_SAM2_REPO", ""),
                        help="checkout of facebookresearch/sam2 for --family sam2 (default $JAXSEG_SAM2_REPO)")
    args = parser.parse_args(argv)
    args.model = args.model or DEFAULT_MODELS[args.family]
    args.torch_instances = min(args.torch_instances or args.instances, args.instances)
    if args.instances < 1 or args.torch_instances < 1 or args.steps < 1 or args.repeats < 1 or min(args.size) < 8:
        parser.error("--instances, --torch-instances, --steps, --repeats must be >= 1 and --size >= 8")
    if args.family == "sam" and args.model not in bench_sam.BENCH_MODELS:
        parser.error(f"--family sam takes --model in {sorted(bench_sam.BENCH_MODELS)}; got {args.model!r}")
    if args.family == "sam2" and not args.model.startswith("sam2"):
        parser.error(f"--family sam2 takes a SAM 2 zoo name (sam2.1_hiera_tiny, ...); got {args.model!r}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)

    import jax  # noqa: PLC0415
    import torch  # noqa: PLC0415

    if args.threads:
        torch.set_num_threads(args.threads)
    configure_torch(args)
    malloc = {k: v for k, v in os.environ.items() if k.startswith("MALLOC_")}
    print(f"# bench_breps  {time.strftime('%Y-%m-%d %H:%M:%S')}  host {platform.node()}  "
          f"{platform.processor() or platform.machine()}  cpus {os.cpu_count()}")
    print(f"# jax {jax.__version__} ({jax.default_backend()}: {jax.devices()[0].device_kind}), torch "
          f"{torch.__version__} ({args.torch_device}, threads {torch.get_num_threads()}), "
          f"python {sys.version.split()[0]}")
    print(f"# MALLOC env: {malloc or 'none (glibc defaults)'}"
          + ("" if malloc == bench_sam.TUNED_MALLOC else "  [not the tuned setting of BENCHMARKING.md]"))
    for line in device_lines(args):
        print(line)
    print(f"# load average {os.getloadavg()[0]:.2f}", flush=True)
    for line in run(args):
        print(line, flush=True)
    print(f"# load average at the end {os.getloadavg()[0]:.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
