"""Parity harness for the click-map models (RITM, SimpleClick, CFR-ICL) against the authors' code.

`run_model_parity`: in a spawned process (one ``isegm`` package per process,
tests/isegm_reference.py) the authors' model is built with seeded random
weights, saved in their checkpoint format and run on a real image with
several click sets and a previous probability map (``model(image,
points)["instances"]``); it also returns torch-autograd gradients of a
weighted sum of the logits w.r.t. the click-map input, for maps our
soft renderer made. The checkpoint is converted with ``python -m ports`` and
our model runs the same inputs.

`run_noc_parity`: the authors' ``evaluate_sample`` (their clicker, predictor
with zoom-in and flip, CFR-ICL's cascade) for 20 clicks without early stop,
against `jaxseg_robust.models.clickmap.noc.noc_trajectory` on the converted
weights.

Only imported by parity-marked tests.
"""

from __future__ import annotations

import concurrent.futures
import csv
import multiprocessing
import pathlib

import isegm_reference as ir
import numpy as np
import pytest

LOGIT_RTOL = 1e-4
GRAD_RTOL = 1e-3


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


def torch_model_side(kind: str, variant: str, seed: int, inputs: list, ckpt: str) -> dict:
    """Spawned: build + randomise the authors' model, save it, run every input.

    Args:
      kind: "ritm", "simpleclick" or "cfricl" (whose repository builds the model).
      inputs: [(name, image uint8[h, w, 3], clicks, prev f32[h, w], soft_maps or None)].

    Returns:
      {name: logits f32[h, w]} and {(name, "grad"): dL/dmaps f32[C, h, w]} for inputs
      with soft maps, L = sum(logits * _weights).
    """
    import torch  # noqa: PLC0415

    ir.import_reference(kind)
    model = ir.build_ritm(variant) if kind == "ritm" else ir.build_simpleclick(variant)
    ir.randomize_(model, seed)
    model.eval()
    ir.save_isegm_checkpoint(model, ckpt)
    out = {}
    for name, image, clicks, prev, soft in inputs:
        h, w = prev.shape
        if kind != "ritm":
            from isegm.model.modeling.pos_embed import interpolate_pos_embed_inference  # noqa: PLC0415
            fresh = ir.build_simpleclick(variant)
            fresh.load_state_dict(model.state_dict())
            fresh.eval()
            interpolate_pos_embed_inference(fresh.backbone, (h, w), "cpu")
            net = fresh
        else:
            net = model
        x = torch.cat([torch.from_numpy(image.copy()).permute(2, 0, 1)[None].float() / 255,
                       torch.from_numpy(prev)[None, None]], 1)
        with torch.no_grad():
            out[name] = net(x, ir.points_tensor(clicks))["instances"][0, 0].numpy().copy()
        if soft is not None:
            maps = torch.from_numpy(soft)[None].requires_grad_(True)
            img, _ = net.prepare_input(x)
            feats = net.maps_transform(maps)
            logits = net.backbone_forward(img, feats)["instances"]
            logits = torch.nn.functional.interpolate(logits, size=(h, w), mode="bilinear",
                                                     align_corners=True)
            loss = (logits[0, 0] * torch.from_numpy(_weights(h, w))).sum()
            out[name, "grad"] = torch.autograd.grad(loss, maps)[0][0].numpy().copy()
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


def soft_maps_and_vjp(seg, clicks, prev):
    """Our soft click features (numpy [C, h, w]) and the VJP of their rendering w.r.t. points."""
    import jax  # noqa: PLC0415
    import jax.numpy as jnp  # noqa: PLC0415

    pts, labels = points_of(clicks)

    def render(p):
        return seg.click_features(p, jnp.asarray(labels), jnp.asarray(prev))

    maps, vjp = jax.vjp(render, jnp.asarray(pts))
    return np.moveaxis(np.asarray(maps), -1, 0), vjp


def loss_grad(seg, params, image, clicks, prev):
    """Our end-to-end dL/dpoints (soft encoding) and L, L = sum(logits * _weights).

    The loss is linear in the logits: random RITM networks give logits of
    magnitude ~30, where a sigmoid would saturate and leave no gradient.
    """
    import jax  # noqa: PLC0415
    import jax.numpy as jnp  # noqa: PLC0415

    pts, labels = points_of(clicks)
    h, w = prev.shape
    weights = jnp.asarray(_weights(h, w))
    x = jnp.asarray(image, jnp.float32) / 255.0

    def loss(p):
        logits = seg.grid_logits(params, x, p, jnp.asarray(labels), jnp.asarray(prev))
        return jnp.sum(logits * weights)

    value, grad = jax.jit(jax.value_and_grad(loss))(jnp.asarray(pts))
    return float(value), np.asarray(grad), jax.jit(loss)


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

    model = ir.build_ritm(variant) if kind == "ritm" else ir.build_simpleclick(variant)
    ir.randomize_(model, seed)
    model.eval()
    if kind != "ritm":
        from isegm.model.modeling.pos_embed import interpolate_pos_embed_inference  # noqa: PLC0415
        interpolate_pos_embed_inference(model.backbone, (target, target), "cpu")
    sharpen_clicks_(model, kind, image, target)
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


def sharpen_clicks_(model, kind: str, image, target: int) -> None:
    """Makes a random network follow its clicks, so the NoC loop's zoom-in moves.

    With plain random weights the prediction hardly depends on the clicks
    (covering all or none of the image), so every ROI would be the whole
    image. The click input's weights are scaled up (RITM: ``ScaleLayer`` to 1;
    SimpleClick: the click patch embedding x 8) and the output bias shifted so
    that 15 % of the zoomed first-click prediction is foreground.
    """
    import torch  # noqa: PLC0415

    with torch.no_grad():
        if kind == "ritm":
            model.maps_transform[3].scale.fill_(1.0)
            bias = model.feature_extractor.cls_head.bias
        else:
            model.patch_embed_coords.proj.weight.mul_(8.0)
            bias = model.head.conv_seg.bias
        x = torch.from_numpy(image.copy()).permute(2, 0, 1)[None].float() / 255
        x = torch.nn.functional.interpolate(x, size=(target, target), mode="bilinear",
                                            align_corners=True)
        x = torch.cat([x, torch.zeros_like(x[:, :1])], 1)
        points = torch.tensor([[[target // 2, target // 2, 0], [-1, -1, -1]]],
                              dtype=torch.float32)
        logits = model(x, points)["instances"]
        bias.sub_(torch.quantile(logits.flatten(), 0.85))


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
