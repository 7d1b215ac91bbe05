"""Parity harness for the click-map models (RITM, SimpleClick, CFR-ICL) against the authors' code.

In a spawned process (one ``isegm`` package per process,
tests/isegm_reference.py) the authors' model is built with seeded random
weights and saved in their checkpoint format; the checkpoint is converted
with ``python -m ports`` and our model runs the same inputs.

* `torch_logits_side`: ``model(image, points)["instances"]`` on a real image
  with several click sets and a previous probability map, at each input size;
* `torch_grad_side`: torch-autograd gradients of a weighted sum of the logits
  w.r.t. the click-map input (maps our soft renderer made), in float32 and in
  float64 (``model.double()``); `soft_maps_and_vjp64` carries them back to the
  click coordinates through our rendering;
* `torch_noc_side`: the authors' ``evaluate_sample`` (their clicker, predictor
  with zoom-in and flip, CFR-ICL's cascade) without early stop, against
  `jaxseg_robust.models.clickmap.noc.noc_trajectory` on the converted weights;
* `torch_zoom_side`: the authors' ``ZoomIn`` on click sequences.

Only imported by parity-marked tests.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import csv
import multiprocessing
import pathlib

import isegm_reference as ir
import numpy as np
import pytest

# the issue's bound (1e-4 of the logits' max |value|, float32, full size); float32 rounding through
# the network measured 1.65e-5 (HRNet-18s, 480x854), 2.2e-6 (ViT-xT, 448 and 672).
LOGIT_RTOL = 1e-4


def load_real(request, size: tuple[int, int] | None = None):
    """(uint8 image, bool mask, source) from the shared DAVIS sample (skips without it)."""
    from PIL import Image  # noqa: PLC0415

    root = request.getfixturevalue("real_data_dir")
    with open(root / "davis" / "index.csv") as f:
        row = next(csv.DictReader(f))
    image = Image.open(root / "davis" / row["image"]).convert("RGB")
    mask = Image.open(root / "davis" / row["mask"])
    if size is not None:
        image = image.resize((size[1], size[0]), Image.BILINEAR)
        mask = mask.resize((size[1], size[0]), Image.NEAREST)
    mask = np.asarray(mask)
    mask = (mask if mask.ndim == 2 else mask[..., 0]) != 0
    return np.asarray(image), mask, f"davis/{row['image']}"


def click_cases(h: int, w: int, seed: int = 0) -> dict:
    """Click sets (row, col, positive) and previous probability maps for an h x w input."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[:h, :w]
    blob = 1 / (1 + np.exp(-((0.35 * min(h, w)) ** 2 - (yy - h / 2) ** 2 - (xx - w / 2) ** 2)
                          / (0.05 * h * w)))
    return {
        "one_click": ([(h // 2, w // 2, True)], np.zeros((h, w), np.float32)),
        "clicks_prev": ([(h // 2, w // 2, True), (int(0.3 * h), int(0.6 * w), True),
                         (int(0.8 * h), int(0.2 * w), False), (3, w - 2, False),
                         (int(0.55 * h), int(0.45 * w), True)],
                        (0.7 * blob + 0.3 * rng.uniform(0, 1, (h, w))).astype(np.float32)),
    }


def _weights(h: int, w: int) -> np.ndarray:
    """Fixed random loss weights on the output grid (the gradient checks' loss)."""
    return np.random.default_rng(7).standard_normal((h, w)).astype(np.float32)


@contextlib.contextmanager
def at_input_size(model, kind: str, hw: tuple[int, int]):
    """The authors' model evaluated at ``hw``: for SimpleClick / CFR-ICL their
    ``interpolate_pos_embed_inference`` (as their evaluation does for its zoom-in
    size), undone on exit so one model serves several sizes; RITM needs nothing."""
    if kind == "ritm":
        yield model
        return
    from isegm.model.modeling.pos_embed import interpolate_pos_embed_inference  # noqa: PLC0415

    backbone = model.backbone
    saved = backbone.pos_embed, backbone.patch_embed.grid_size
    interpolate_pos_embed_inference(backbone, tuple(hw), "cpu")
    try:
        yield model
    finally:
        backbone.pos_embed, backbone.patch_embed.grid_size = saved


def build_reference(kind: str, variant: str, seed: int, ckpt: str):
    """The authors' model (random weights, eval mode), saved to ``ckpt`` in their format."""
    ir.import_reference(kind)
    model = ir.build_ritm(variant) if kind == "ritm" else ir.build_simpleclick(variant)
    ir.randomize_(model, seed)
    model.eval()
    ir.save_isegm_checkpoint(model, ckpt)
    return model


def model_input(image, prev, dtype=None):
    """isegm's network input [1, 4, h, w]: RGB / 255 and the previous probability map ([1, 3, h, w]
    without ``prev``: a model without the previous-mask channel, RITM's baseline).

    With ``dtype`` (torch.float64) the division runs in that precision, as ours does
    for float64 images: dividing in float32 first perturbs the input by ~3e-8, which
    the random HRNet amplifies to ~2e-5 of its float64 click gradient (measured).
    """
    import torch  # noqa: PLC0415

    dtype = torch.float32 if dtype is None else dtype
    rgb = torch.from_numpy(image.copy()).permute(2, 0, 1)[None].to(dtype) / 255
    if prev is None:
        return rgb
    return torch.cat([rgb, torch.from_numpy(np.asarray(prev, np.float32))[None, None].to(dtype)],
                     1)


def torch_logits_side(kind: str, variant: str, seed: int, inputs: list, ckpt: str) -> dict:
    """Spawned: build + randomise + save the authors' model, then run every input.

    Args:
      kind: "ritm", "simpleclick" or "cfricl" (whose repository builds the model).
      inputs: [(name, image uint8[h, w, 3], clicks, prev f32[h, w])].

    Returns:
      {name: ``model(image, points)["instances"]`` f32[h, w]}.
    """
    import torch  # noqa: PLC0415

    model = build_reference(kind, variant, seed, ckpt)
    out = {}
    for name, image, clicks, prev in inputs:
        with at_input_size(model, kind, prev.shape), torch.no_grad():
            previous = prev if model.with_prev_mask else None
            logits = model(model_input(image, previous), ir.points_tensor(clicks))["instances"]
        out[name] = logits[0, 0].numpy().copy()
    return out


def reference_maps_grad(model, image, prev, maps, dtype) -> tuple[np.ndarray, float]:
    """dL/dmaps of the authors' network, L = sum(logits * _weights), in ``dtype``.

    ``model.forward`` from the click maps on (the authors' disks are not
    differentiable): ``maps_transform``, ``backbone_forward``, the
    ``align_corners=True`` upsampling. Returns (f64[C, h, w], L).
    """
    import torch  # noqa: PLC0415

    h, w = prev.shape
    maps = torch.from_numpy(np.asarray(maps))[None].to(dtype).requires_grad_(True)
    img, _ = model.prepare_input(model_input(image, prev, dtype))
    logits = model.backbone_forward(img, model.maps_transform(maps))["instances"]
    logits = torch.nn.functional.interpolate(logits, size=(h, w), mode="bilinear",
                                             align_corners=True)
    loss = (logits[0, 0] * torch.from_numpy(_weights(h, w)).to(dtype)).sum()
    (grad,) = torch.autograd.grad(loss, maps)
    return grad[0].double().numpy().copy(), float(loss.detach())


def torch_grad_side(kind: str, variant: str, seed: int, cases: list, ckpt: str) -> dict:
    """Spawned: build + randomise + save; click-map gradients in float32 and float64.

    Args:
      cases: [(name, image uint8[h, w, 3], prev f32[h, w], maps f64[C, h, w], dtypes)],
        dtypes a subset of ("float32", "float64"); the float64 runs use
        ``model.double()`` (same weights).

    Returns:
      {(name, dtype): (dL/dmaps f64[C, h, w], L)} (`reference_maps_grad`).
    """
    import torch  # noqa: PLC0415

    model = build_reference(kind, variant, seed, ckpt)
    out = {}
    for dtype in ("float32", "float64"):
        if dtype == "float64":
            model = model.double()
        for name, image, prev, maps, dtypes in cases:
            if dtype in dtypes:
                with at_input_size(model, kind, prev.shape):
                    out[name, dtype] = reference_maps_grad(model, image, prev, maps,
                                                           getattr(torch, dtype))
    return out


def spawn(fn, *args):
    """Runs ``fn(*args)`` in a fresh spawned process (its memory is returned afterwards)."""
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        return pool.submit(fn, *args).result()


def require_repo(kind: str) -> None:
    if ir.repo_path(kind) is None:
        pytest.skip(f"${ir.REPO_ENV[kind]} is not set to a checkout of the authors' code")


def port(kind: str, ckpt: pathlib.Path, out: pathlib.Path) -> None:
    """Converts with our CLI."""
    from ports.__main__ import main as ports_main  # noqa: PLC0415

    family = "ritm" if kind == "ritm" else "simpleclick"
    assert ports_main([family, "--checkpoint", str(ckpt), "--out", str(out)]) == 0


def points_of(clicks) -> tuple[np.ndarray, np.ndarray]:
    """(row, col, positive) clicks -> ((x, y) f32[n, 2], labels i32[n])."""
    pts = np.array([[c, r] for r, c, _ in clicks], np.float32)
    labels = np.array([1 if p else 0 for *_, p in clicks], np.int32)
    return pts, labels


def max_err(a, b) -> tuple[float, float]:
    """(max |a - b|, max |b|) in float64."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max()), float(np.abs(b).max())


def rel_l2(a, b) -> float:
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def soft_maps_and_vjp64(seg, clicks, prev):
    """Our soft click features in float64 and the float64 VJP of their rendering.

    Returns (maps f64[C, h, w], chain) with ``chain(g f64[C, h, w]) -> f64[n, 2]``:
    a gradient w.r.t. the click maps carried back to the click coordinates
    (x, y) through our rendering, exactly (float64).
    """
    import jax  # noqa: PLC0415
    import jax.numpy as jnp  # noqa: PLC0415

    pts, labels = points_of(clicks)
    with jax.enable_x64(True):
        def render(p):
            return seg.click_features(p, jnp.asarray(labels), jnp.asarray(prev, jnp.float64))

        maps, vjp = jax.vjp(render, jnp.asarray(pts, jnp.float64))
        maps = np.moveaxis(np.asarray(maps), -1, 0)

    def chain(grad_maps):
        with jax.enable_x64(True):
            (out,) = vjp(jnp.asarray(np.moveaxis(np.asarray(grad_maps, np.float64), 0, -1)))
            return np.asarray(out)

    return maps, chain


def linear_loss(seg):
    """``L(params, image, points, labels, prev, weights) = sum(logits * weights)``.

    Linear in the logits: random RITM networks give logits of magnitude ~30,
    where a sigmoid would saturate and leave no gradient. Everything is an
    argument (a jitted closure over the weights or the image would make XLA
    constant-fold the first convolutions, which takes minutes).
    """
    import jax.numpy as jnp  # noqa: PLC0415

    def loss(params, image, points, labels, prev, weights):
        return jnp.sum(seg.grid_logits(params, image, points, labels, prev) * weights)

    return loss


def central_differences(fn, points: np.ndarray, step: float) -> np.ndarray:
    """(fn(p + step e_k) - fn(p - step e_k)) / (2 step) for every coordinate k of points[n, 2]."""
    out = np.zeros(points.shape, np.float64)
    for index in np.ndindex(*points.shape):
        e = np.zeros(points.shape, points.dtype)
        e[index] = step
        out[index] = (float(fn(points + e)) - float(fn(points - e))) / (2 * step)
    return out



def sharpened_isegm_model(kind: str, variant: str, seed: int, image, target: int):
    """The authors' RITM / SimpleClick network (reference imported), seeded random weights, in eval
    mode, SimpleClick's position embedding re-interpolated to ``target``, clicks sharpened
    (`isegm_reference.sharpen_clicks_`) so the zoom-in moves; run inside a spawned process."""
    model = ir.build_ritm(variant) if kind == "ritm" else ir.build_simpleclick(variant)
    ir.randomize_(model, seed)
    model.eval()
    if kind != "ritm":
        from isegm.model.modeling.pos_embed import interpolate_pos_embed_inference  # noqa: PLC0415
        interpolate_pos_embed_inference(model.backbone, (target, target), "cpu")
    ir.sharpen_clicks_(model, kind, image, target)
    return model

def torch_noc_side(kind: str, variant: str, seed: int, image, gt, target: int, n_clicks: int,
                   cascade: bool, ckpt: str) -> dict:
    """Spawned: the authors' ``evaluate_sample`` (20 clicks, no early stop) on random weights.

    RITM runs in its ``fixed<target>`` mode (zoom-in every click at target x
    target); SimpleClick / CFR-ICL in their default mode (the same zoom at 448,
    position embedding re-interpolated); CFR-ICL with ``--cf-n 4 --acf``.
    """
    ir.import_reference(kind)
    from isegm.inference.evaluation import evaluate_sample  # noqa: PLC0415
    from isegm.inference.predictors import get_predictor  # noqa: PLC0415

    model = sharpened_isegm_model(kind, variant, seed, image, target)
    ir.save_isegm_checkpoint(model, ckpt)
    predictor_params = {}
    if cascade:
        predictor_params = {"cascade_step": 5, "cascade_adaptive": True, "cascade_clicks": 1}
    predictor = get_predictor(model, "NoBRS", "cpu", prob_thresh=0.49,
                              predictor_params=predictor_params,
                              zoom_in_params={"skip_clicks": -1, "target_size": (target, target)})
    clicks, ious, probs = evaluate_sample(image, gt.astype(np.int32), predictor,
                                          max_iou_thr=1.01, pred_thr=0.49, max_clicks=n_clicks)
    return {"clicks": np.array([[int(c.coords[0]), int(c.coords[1]), int(c.is_positive)]
                                for c in clicks]),
            "ious": np.asarray(ious, np.float64), "probs": np.asarray(probs, np.float32)}


def torch_zoom_side(cases: list, target: tuple[int, int]) -> list:
    """Spawned: the authors' ``ZoomIn`` (skip_clicks=-1, fixed target) over click sequences.

    Args:
      cases: [(image f32[H, W, 4] (RGB + previous map channel), steps)] with
        steps = [(clicks [(row, col, positive)], prob f32[th, tw] to paste back)].

    Returns:
      per case, per step: (roi (rmin, rmax, cmin, cmax), crop f32[th, tw, 4],
      transformed clicks f32[n, 2] (row, col), pasted f32[H, W]).
    """
    import torch  # noqa: PLC0415

    ir.import_reference("simpleclick")
    from isegm.inference.clicker import Click  # noqa: PLC0415
    from isegm.inference.transforms import ZoomIn  # noqa: PLC0415

    out = []
    for image, steps in cases:
        zoom = ZoomIn(skip_clicks=-1, target_size=tuple(target))
        zoom.reset()
        x = torch.from_numpy(image).permute(2, 0, 1)[None].contiguous()
        rows = []
        for clicks, prob in steps:
            clist = [Click(is_positive=p, coords=(r, c), indx=i)
                     for i, (r, c, p) in enumerate(clicks)]
            crop, tclicks = zoom.transform(x, [clist])
            pasted = zoom.inv_transform(torch.from_numpy(prob)[None, None])
            rows.append((tuple(int(v) for v in zoom._object_roi),
                         crop[0].permute(1, 2, 0).numpy().copy(),
                         np.array([c.coords for c in tclicks[0]], np.float32),
                         pasted[0, 0].numpy().copy()))
        out.append(rows)
    return out


def torch_rclicks_side(kind: str, variant: str, seed: int, image, gt, target: int, trajectories: list,
                       ckpt: str | None) -> dict:
    """Spawned: the RClicks authors' predictor loop fed given clicks (docs/protocols/rclicks.md §5.5).

    The model is built as in `torch_noc_side` (seeded, clicks sharpened by
    `isegm_reference.sharpen_clicks_`; saved to ``ckpt`` when given). Per trajectory (a list of
    (row, col, positive) clicks), as their ``evaluate_sample``:
    ``set_input_image`` (fresh predictor state), then per round the click is added to the clicker
    and ``get_prediction(clicker)`` (zoom-in ``skip_clicks=-1`` to target x target, flip, the
    previous prediction fed back) gives the probabilities; IoU of ``> 0.49`` with ``get_iou``.

    Returns:
      {"ious": [f64[R_t] per trajectory]}.
    """
    import torch  # noqa: PLC0415

    ir.import_reference(kind)
    from isegm.inference import utils  # noqa: PLC0415
    from isegm.inference.clicker import Click, Clicker  # noqa: PLC0415
    from isegm.inference.predictors import get_predictor  # noqa: PLC0415

    model = sharpened_isegm_model(kind, variant, seed, image, target)
    if ckpt is not None:
        ir.save_isegm_checkpoint(model, ckpt)
    predictor = get_predictor(model, "NoBRS", "cpu", prob_thresh=0.49,
                              zoom_in_params={"skip_clicks": -1, "target_size": (target, target)})
    out = []
    for clicks in trajectories:
        clicker = Clicker(gt_mask=gt.astype(np.int32))
        predictor.set_input_image(image)
        ious = []
        with torch.no_grad():
            for row, col, positive in clicks:
                clicker.add_click(Click(is_positive=bool(positive), coords=(int(row), int(col))))
                probs = predictor.get_prediction(clicker)
                ious.append(utils.get_iou(gt, probs > 0.49))
        out.append(np.asarray(ious, np.float64))
    return {"ious": out}


def torch_tetris_side(kind: str, variant: str, seed: int, image, gt, target: int, n_clicks: int,
                      n_iterates: int, ckpt: str) -> dict:
    """Spawned: the authors' TETRIS loop through their ``ZoomIn`` (``fixed<target>``) and
    ``AddHorizontalFlip`` (experiments/benchmarks/isegm_tetris_reference.py, ``predictor_trajectory``),
    MIN and MAX, on the sharpened random-weight model, saved to ``ckpt`` first."""
    import sys  # noqa: PLC0415

    ir.import_reference(kind)
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "experiments" / "benchmarks"))
    import isegm_tetris_reference as tr  # noqa: PLC0415

    model = sharpened_isegm_model(kind, variant, seed, image, target)
    ir.save_isegm_checkpoint(model, ckpt)
    run = {"target_hw": (target, target), "n_clicks": n_clicks, "n_iterates": n_iterates, "thr": 0.49}
    return {mode: tr.predictor_trajectory(model, image, gt.astype(bool), maximise=mode == "max", **run)
            for mode in ("min", "max")}
