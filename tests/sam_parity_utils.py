"""Shared full-model parity harness for the SAM family (SAM, MobileSAM, SAM-HQ).

How a parity run works (`run_parity`): the official model is built with its
package's builder (no checkpoint) in a fresh spawned process, EVERY float
tensor is overwritten with seeded random values of a sensible scale
(`randomize_`; ``pos_embed``/``rel_pos_*``/attention biases, zero in the
official init, included; BatchNorm running variances positive), the model is
put in eval mode *after* that (TinyViT caches its attention biases on
``eval()``), its state dict is saved with ``torch.save`` and converted with
our CLI (``python -m ports <family>``), and both models run on a real image
at full 1024 size through their ``SamPredictor``s: image embeddings (and
SAM-HQ's early feature); low-res logits, upsampled mask logits and IoU
predictions for one point, several points, a box, box + points and mask
input, for every output option (``multimask_output``, SAM-HQ's
``hq_token_only``); the same through ``Segmenter.decode`` with padded
prompt slots and through ``decode_low_res`` on the reference's own
features; gradients of a Dice loss w.r.t. point and box coordinates (torch
autograd through the same official modules).

Tolerances: logits and embeddings within ``LOGIT_RTOL`` x their scale
(max |value|); gradients within ``GRAD_RTOL`` relative (L2). The ``check_*``
functions print their measured numbers (run pytest with ``-s``).

Only imported by parity-marked tests (it needs torch and the reference packages).
"""

from __future__ import annotations

import concurrent.futures
import csv
import dataclasses
import gc
import importlib
import multiprocessing
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from PIL import Image

from jaxseg_robust.models import zoo
from jaxseg_robust.models.sam.segmenter import SamFeatures
from jaxseg_robust.prompts.types import make_prompts
from ports.__main__ import main as ports_main

LOGIT_RTOL = 1e-4
GRAD_RTOL = 1e-3
CASES = ("one_point", "points", "box", "box_points")
GRAD_CASES = ("points", "box", "box_points")
EMBEDDING_NAMES = ("iou_token.weight", "mask_tokens.weight", "hf_token.weight",
                   "point_embeddings", "not_a_point_embed.weight", "no_mask_embed.weight",
                   "positional_encoding_gaussian_matrix", "attention_biases")
# ConvTranspose2d weights are [in, out, k, k]: their fan-in is the first axis.
CONV_TRANSPOSE_NAMES = ("output_upscaling", "compress_vit_feat", "embedding_encoder")


@dataclasses.dataclass(frozen=True)
class RefSpec:
    """One official model and how to port it.

    Attributes:
      package: the reference package ("segment_anything", "mobile_sam",
        "segment_anything_hq"), providing ``sam_model_registry`` and ``SamPredictor``.
      registry_key: its builder's name ("vit_b", "vit_t", "vit_tiny", ...).
      port: our port family (``python -m ports <port>``).
      seed: randomisation seed.
      hq: SAM-HQ (decoder signature, early feature, ``hq_token_only``).
    """

    package: str
    registry_key: str
    port: str
    seed: int
    hq: bool = False

    def output_options(self) -> list[dict]:
        """The predict/decode option sets compared (the first one is the default)."""
        if not self.hq:
            return [dict(multimask_output=True), dict(multimask_output=False)]
        return [dict(multimask_output=m, hq_token_only=h)
                for h in (False, True) for m in (True, False)]


def option_key(option: dict) -> tuple:
    return tuple(sorted(option.items()))


def build_reference(spec: RefSpec):
    """The official model (quietly: timm warns on import), randomised, in eval mode."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pkg = importlib.import_module(spec.package)
        model = pkg.sam_model_registry[spec.registry_key]()
    randomize_(model, spec.seed)
    model.eval()  # after randomising: TinyViT caches its attention biases here
    return pkg, model


def randomize_(model: torch.nn.Module, seed: int) -> None:
    """Overwrites every float state-dict tensor with seeded values of a sensible scale.

    Embedding tables, prompt embeddings and attention biases N(0, 1);
    pos_embed / rel_pos 0.2 N(0, 1); weights with >= 2 axes N(0, 1/fan_in);
    1-D weights (norm scales) 1 + 0.1 N(0, 1); BatchNorm running variances
    U(0.5, 1.5); everything else (biases, running means) 0.1 N(0, 1).
    Integer buffers (BatchNorm counters) are left alone.
    """
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, t in model.state_dict().items():
            if not t.is_floating_point():
                continue
            if name.endswith("running_var"):
                t.copy_(0.5 + torch.rand(t.shape, generator=gen))
                continue
            noise = torch.randn(t.shape, generator=gen)
            if any(k in name for k in EMBEDDING_NAMES):
                t.copy_(noise)
            elif name.endswith(("pos_embed", "rel_pos_h", "rel_pos_w")):
                t.copy_(0.2 * noise)
            elif t.ndim >= 2:
                transposed = t.ndim == 4 and any(k in name for k in CONV_TRANSPOSE_NAMES)
                fan_in = t.shape[0] if transposed else t[0].numel()
                t.copy_(noise / np.sqrt(fan_in))
            elif name.endswith("weight"):  # every 1-D weight is a norm scale
                t.copy_(1.0 + 0.1 * noise)
            else:
                t.copy_(0.1 * noise)


def load_image_and_target(request) -> tuple[np.ndarray, np.ndarray, str]:
    """A DAVIS image + its mask from the shared data, else a generated pair."""
    try:
        root = request.getfixturevalue("real_data_dir")
        with open(root / "davis" / "index.csv") as f:
            row = next(csv.DictReader(f))
        image = np.asarray(Image.open(root / "davis" / row["image"]).convert("RGB"))
        mask = np.asarray(Image.open(root / "davis" / row["mask"]))
        mask = (mask if mask.ndim == 2 else mask[..., 0]) != 0
        return image, mask, f"davis/{row['image']}"
    except pytest.skip.Exception:
        rng = np.random.default_rng(0)
        yy, xx = np.mgrid[:480, :854]
        mask = (yy - 240) ** 2 + (xx - 400) ** 2 < 150 ** 2
        image = (rng.uniform(0, 60, (480, 854, 3)) + 150 * mask[..., None]).astype(np.uint8)
        return image, mask, "generated"


def prompt_cases(h: int, w: int) -> dict:
    """The prompt sets compared, in original-image pixels."""
    pts = np.array([[0.5 * w, 0.5 * h], [0.3 * w, 0.65 * h], [0.85 * w, 0.2 * h]], np.float32)
    box = np.array([0.15 * w, 0.1 * h, 0.7 * w, 0.9 * h], np.float32)
    return {
        "one_point": dict(point_coords=pts[:1], point_labels=np.array([1])),
        "points": dict(point_coords=pts, point_labels=np.array([1, 1, 0])),
        "box": dict(box=box),
        "box_points": dict(box=box, point_coords=pts[1:], point_labels=np.array([1, 0])),
    }


def dice(prob, target):
    """Binary Dice loss 1 - 2|P.T| / max(|P| + |T|, 1e-7) (torch or jax arrays)."""
    total = prob.sum() + target.sum()
    total = total.clamp(min=1e-7) if isinstance(total, torch.Tensor) else jnp.maximum(total, 1e-7)
    return 1 - 2 * (prob * target).sum() / total


def max_err(a, b) -> tuple[float, float]:
    """(max |a - b|, max |b|) in float64."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max()), float(np.abs(b).max())


# ---- the two sides ---------------------------------------------------------------


def torch_side(spec: RefSpec, image, target, ckpt):
    """Runs the official model (in a spawned process); saves its state dict to ``ckpt``."""
    pkg, model = build_reference(spec)
    torch.save(model.state_dict(), ckpt)
    predictor = pkg.SamPredictor(model)
    with torch.no_grad():
        predictor.set_image(image)
    out = {"embedding": predictor.get_image_embedding()[0].permute(1, 2, 0).numpy().copy()}
    if spec.hq:
        out["interm"] = predictor.interm_features[0][0].numpy().copy()  # [E, E, D]
    h, w = image.shape[:2]
    cases = prompt_cases(h, w)
    options = spec.output_options()
    for name, kw in cases.items():
        for option in options:
            out[name, option_key(option)] = predictor.predict(**kw, **option, return_logits=True)
        _, scores, low = out[name, option_key(options[0])]
        best = low[np.argmax(scores)][None]
        out[name, "mask_input"] = predictor.predict(**kw, mask_input=best, return_logits=True)
        out[name, "mask_input_arg"] = best
    # gradients of Dice(sigmoid(selected logits), target) w.r.t. prompt coordinates
    hr, wr = predictor.input_size
    scale = torch.tensor([wr / w, hr / h], dtype=torch.float32)
    target_t = torch.from_numpy(target.astype(np.float32))
    for name in GRAD_CASES:
        kw = cases[name]
        coords = box = points = None
        if "point_coords" in kw:
            coords = torch.tensor(kw["point_coords"][None], requires_grad=True)
            points = (coords * scale, torch.as_tensor(kw["point_labels"][None], dtype=torch.int))
        if "box" in kw:
            box = torch.tensor(kw["box"][None], requires_grad=True)
        boxes = None if box is None else (box.reshape(-1, 2, 2) * scale).reshape(-1, 4)
        sparse, dense = model.prompt_encoder(points=points, boxes=boxes, masks=None)
        decoder_args = dict(image_embeddings=predictor.features,
                            image_pe=model.prompt_encoder.get_dense_pe(),
                            sparse_prompt_embeddings=sparse, dense_prompt_embeddings=dense,
                            multimask_output=True)
        if spec.hq:
            low, iou = model.mask_decoder(**decoder_args, hq_token_only=False,
                                          interm_embeddings=predictor.interm_features)
        else:
            low, iou = model.mask_decoder(**decoder_args)
        masks = model.postprocess_masks(low, predictor.input_size, predictor.original_size)
        j = int(torch.argmax(iou[0]))  # SAM: best of 3; SAM-HQ: its single output (j = 0)
        loss = dice(torch.sigmoid(masks[0, j]), target_t)
        leaves = [t for t in (coords, box) if t is not None]
        grads = iter(torch.autograd.grad(loss, leaves))
        out["grad", name] = (None if coords is None else next(grads)[0].numpy(),
                             None if box is None else next(grads)[0].numpy(), float(loss.detach()))
    del predictor, model
    gc.collect()
    return out


def jax_side(spec: RefSpec, model_dir, image, target, ref):
    """Runs our converted model on the same inputs."""
    predictor = zoo.load(model_dir)
    predictor.set_image(image)
    seg, params = predictor.segmenter, predictor.params
    out = {"embedding": np.asarray(predictor.features.image_embeddings)}
    if spec.hq:
        out["interm"] = np.asarray(predictor.features.interm_embeddings[0])
    else:
        assert predictor.features.interm_embeddings == ()  # SAM's features stay light
    h, w = image.shape[:2]
    options = spec.output_options()
    decode = jax.jit(seg.decode, static_argnames=tuple(options[0]))
    decode_low = jax.jit(seg.decode_low_res)
    ref_features = SamFeatures(
        image_embeddings=jnp.asarray(ref["embedding"]),
        interm_embeddings=(jnp.asarray(ref["interm"]),) if spec.hq else ())
    cases = prompt_cases(h, w)
    for name, kw in cases.items():
        p = make_prompts(kw.get("point_coords"), kw.get("point_labels"), kw.get("box"),
                         num_slots=8)
        low_rf, iou_rf = decode_low(params, ref_features, p, predictor.transform)
        for option in options:
            key = (name, option_key(option))
            out[key] = predictor.predict(**kw, **option, return_logits=True)
            # the Segmenter path with padded slots (8) must agree too
            pred = decode(params, predictor.features, p, predictor.transform, **option)
            out[key + ("segmenter",)] = (np.asarray(pred.logits), np.asarray(pred.scores),
                                         int(pred.index))
            sel_low, sel_iou, _ = seg.select(low_rf, iou_rf, **option)
            out[key + ("ref_features",)] = (np.asarray(sel_low), np.asarray(sel_iou))
        out[name, "mask_input"] = predictor.predict(**kw, mask_input=ref[name, "mask_input_arg"],
                                                    return_logits=True)
    target_j = jnp.asarray(target, jnp.float32)
    for name in GRAD_CASES:
        kw = cases[name]
        base = make_prompts(kw.get("point_coords"), kw.get("point_labels"), kw.get("box"),
                            num_slots=4)

        def loss(points, box, base=base):
            pred = seg.decode(params, predictor.features, base.replace(points=points, box=box),
                              predictor.transform)
            return dice(jax.nn.sigmoid(pred.logits), target_j)

        value, (g_pts, g_box) = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))(
            base.points, base.box)
        n = 0 if kw.get("point_coords") is None else len(kw["point_coords"])
        out["grad", name] = (np.asarray(g_pts)[:n] if n else None,
                             np.asarray(g_box) if "box" in kw else None, float(value))
    return out


def run_parity(spec: RefSpec, request, tmp_path_factory, name: str):
    """Reference in a spawned process, port through the CLI, then ours.

    Returns:
      (spec, name, image source, reference results, our results).
    """
    image, target, source = load_image_and_target(request)
    tmp = tmp_path_factory.mktemp(name)
    ckpt = tmp / f"{name}_random.pth"
    # The reference runs in a fresh process, so its memory is gone before ours is used.
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        ref = pool.submit(torch_side, spec, image, target, ckpt).result()
    out_dir = tmp / "converted"
    assert ports_main([spec.port, "--checkpoint", str(ckpt), "--out", str(out_dir)]) == 0
    ckpt.unlink()
    ours = jax_side(spec, out_dir, image, target, ref)
    gc.collect()
    return spec, name, source, ref, ours


# ---- checks ----------------------------------------------------------------------


def check_embeddings(results) -> None:
    """Image embeddings (and SAM-HQ's early feature) within LOGIT_RTOL x scale."""
    spec, name, source, ref, ours = results
    keys = ("embedding", "interm") if spec.hq else ("embedding",)
    for key in keys:
        err, scale = max_err(ours[key], ref[key])
        print(f"\nPARITY {name} [{source}] {key}: max_abs_err={err:.3g} scale={scale:.3g} "
              f"rel={err / scale:.3g}")
        assert ours[key].shape == ref[key].shape
        assert err <= LOGIT_RTOL * scale


def check_predictions(results, case: str) -> None:
    """Predictor, Segmenter and decoder-on-reference-features outputs for one prompt case."""
    spec, name, _, ref, ours = results
    lines = []
    keys = [(case, option_key(o)) for o in spec.output_options()] + [(case, "mask_input")]
    for key in keys:
        (m_t, s_t, l_t), (m_o, s_o, l_o) = ref[key], ours[key]
        assert m_o.shape == m_t.shape and l_o.shape == l_t.shape and s_o.shape == s_t.shape
        e_mask, sc_mask = max_err(m_o, m_t)
        e_low, sc_low = max_err(l_o, l_t)
        e_iou, sc_iou = max_err(s_o, s_t)
        label = key[1] if key[1] == "mask_input" else ",".join(f"{k}={int(v)}" for k, v in key[1])
        lines.append(f"{label}: masks {e_mask:.3g}/{sc_mask:.3g} low-res {e_low:.3g}/{sc_low:.3g}"
                     f" iou {e_iou:.3g}/{sc_iou:.3g}")
        assert e_mask <= LOGIT_RTOL * sc_mask and e_low <= LOGIT_RTOL * sc_low
        assert e_iou <= LOGIT_RTOL * max(sc_iou, 1.0)
        if key[1] == "mask_input":
            continue
        logits, scores, index = ours[key + ("segmenter",)]
        assert index == (int(np.argmax(s_t)) if len(s_t) > 1 else 0)
        e_sel, _ = max_err(logits, m_t[index])
        e_sc, _ = max_err(scores, s_t)
        assert e_sel <= LOGIT_RTOL * sc_mask and e_sc <= LOGIT_RTOL * max(sc_iou, 1.0)
        low_rf, iou_rf = ours[key + ("ref_features",)]
        e_dec, _ = max_err(low_rf, l_t)
        lines.append(f"  decoder on reference features: low-res {e_dec:.3g}")
        assert e_dec <= LOGIT_RTOL * sc_low and max_err(iou_rf, s_t)[0] <= LOGIT_RTOL
    print(f"\nPARITY {name} {case} (max_abs_err/scale): " + "; ".join(lines))


def check_gradients(results, case: str) -> None:
    """Dice-loss gradients w.r.t. point and box coordinates within GRAD_RTOL (L2)."""
    _, name, _, ref, ours = results
    g_pts_t, g_box_t, loss_t = ref["grad", case]
    g_pts_o, g_box_o, loss_o = ours["grad", case]
    assert abs(loss_o - loss_t) <= 1e-5
    want = np.concatenate([g.ravel() for g in (g_pts_t, g_box_t) if g is not None])
    got = np.concatenate([g.ravel() for g in (g_pts_o, g_box_o) if g is not None])
    rel = float(np.linalg.norm(got - want) / np.linalg.norm(want))
    print(f"\nPARITY {name} Dice gradient ({case}): rel_err={rel:.3g} "
          f"|grad|={np.linalg.norm(want):.3g} loss={loss_t:.6f}")
    assert np.linalg.norm(want) > 0 and rel <= GRAD_RTOL
