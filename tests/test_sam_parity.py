"""Numeric parity of the Flax SAM against the official ``segment_anything`` package.

For each variant the official model is built with its builder (no
checkpoint), EVERY tensor is overwritten with seeded random values of a
sensible scale (``pos_embed`` and ``rel_pos_*``, zero in the official init,
included), the state dict is saved with ``torch.save`` and converted with our
CLI (``python -m ports sam``), and both models run on a real image at full
1024 size: image embeddings; low-res logits, upsampled mask logits and IoU
predictions for one point, several points, a box, box + points and mask input,
with and without multimask output; gradients of a Dice loss w.r.t. point and
box coordinates (torch autograd through the same official modules).

Tolerances: logits and embeddings within 1e-4 x their scale (max |value|);
gradients within 1e-3 relative (L2). Each test prints its measured numbers
(run with ``-s`` to see them). ViT-L/H are also marked slow; run them one at
a time (``-k vit_l``) to bound memory.
"""

from __future__ import annotations

import concurrent.futures
import csv
import dataclasses
import gc
import multiprocessing

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytestmark = pytest.mark.parity

torch = pytest.importorskip("torch")
sam_pkg = pytest.importorskip("segment_anything")

from PIL import Image  # noqa: E402

from jaxseg_robust.models import zoo  # noqa: E402
from jaxseg_robust.models.sam.segmenter import SamFeatures  # noqa: E402
from jaxseg_robust.ops.resize import longest_side_shape  # noqa: E402
from jaxseg_robust.prompts.types import make_prompts  # noqa: E402
from ports.__main__ import main as ports_main  # noqa: E402

LOGIT_RTOL = 1e-4
GRAD_RTOL = 1e-3
EMBEDDING_NAMES = ("iou_token.weight", "mask_tokens.weight", "point_embeddings",
                   "not_a_point_embed.weight", "no_mask_embed.weight",
                   "positional_encoding_gaussian_matrix")


def randomize_(model: torch.nn.Module, seed: int) -> None:
    """Overwrites every state-dict tensor with seeded values of a sensible scale."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, t in model.state_dict().items():
            noise = torch.randn(t.shape, generator=gen)
            if any(k in name for k in EMBEDDING_NAMES):
                t.copy_(noise)
            elif name.endswith(("pos_embed", "rel_pos_h", "rel_pos_w")):
                t.copy_(0.2 * noise)
            elif t.ndim >= 2:
                fan_in = t.shape[0] if "output_upscaling" in name else t[0].numel()
                t.copy_(noise / np.sqrt(fan_in))
            elif name.endswith("weight"):  # every 1-D weight in SAM is a norm scale
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
    pts = np.array([[0.5 * w, 0.5 * h], [0.3 * w, 0.65 * h], [0.85 * w, 0.2 * h]], np.float32)
    box = np.array([0.15 * w, 0.1 * h, 0.7 * w, 0.9 * h], np.float32)
    return {
        "one_point": dict(point_coords=pts[:1], point_labels=np.array([1])),
        "points": dict(point_coords=pts, point_labels=np.array([1, 1, 0])),
        "box": dict(box=box),
        "box_points": dict(box=box, point_coords=pts[1:], point_labels=np.array([1, 0])),
    }


def dice(prob, target):
    return 1 - 2 * (prob * target).sum() / max_(prob.sum() + target.sum())


def max_(x):
    return x.clamp(min=1e-7) if isinstance(x, torch.Tensor) else jnp.maximum(x, 1e-7)


def torch_side(variant, image, target, ckpt):
    """Runs the official model; returns numpy results and the state-dict path."""
    model = sam_pkg.sam_model_registry[variant]()
    randomize_(model, seed={"vit_b": 0, "vit_l": 1, "vit_h": 2}[variant])
    torch.save(model.state_dict(), ckpt)
    predictor = sam_pkg.SamPredictor(model)
    with torch.no_grad():
        predictor.set_image(image)
    out = {"embedding": predictor.get_image_embedding()[0].permute(1, 2, 0).numpy().copy()}
    h, w = image.shape[:2]
    for name, kw in prompt_cases(h, w).items():
        for multimask in (True, False):
            out[name, multimask] = predictor.predict(**kw, multimask_output=multimask,
                                                     return_logits=True)
        best = out[name, True][2][np.argmax(out[name, True][1])][None]
        out[name, "mask_input"] = predictor.predict(**kw, mask_input=best, return_logits=True)
        out[name, "mask_input_arg"] = best
    # gradients of Dice(sigmoid(selected logits), target) w.r.t. prompt coordinates
    hr, wr = predictor.input_size
    scale = torch.tensor([wr / w, hr / h], dtype=torch.float32)
    target_t = torch.from_numpy(target.astype(np.float32))
    cases = prompt_cases(h, w)
    for name in ("points", "box", "box_points"):
        kw = cases[name]
        coords = box = None
        points = None
        if "point_coords" in kw:
            coords = torch.tensor(kw["point_coords"][None], requires_grad=True)
            points = (coords * scale, torch.as_tensor(kw["point_labels"][None], dtype=torch.int))
        if "box" in kw:
            box = torch.tensor(kw["box"][None], requires_grad=True)
        boxes = None if box is None else (box.reshape(-1, 2, 2) * scale).reshape(-1, 4)
        sparse, dense = model.prompt_encoder(points=points, boxes=boxes, masks=None)
        low, iou = model.mask_decoder(image_embeddings=predictor.features,
                                      image_pe=model.prompt_encoder.get_dense_pe(),
                                      sparse_prompt_embeddings=sparse,
                                      dense_prompt_embeddings=dense, multimask_output=True)
        masks = model.postprocess_masks(low, predictor.input_size, predictor.original_size)
        j = int(torch.argmax(iou[0]))
        loss = dice(torch.sigmoid(masks[0, j]), target_t)
        leaves = [t for t in (coords, box) if t is not None]
        grads = torch.autograd.grad(loss, leaves)
        it = iter(grads)
        out["grad", name] = (None if coords is None else next(it)[0].numpy(),
                             None if box is None else next(it)[0].numpy(), float(loss))
    del predictor, model
    gc.collect()
    return out


def jax_side(model_dir, image, target, ref):
    """Runs our converted model on the same inputs."""
    predictor = zoo.load(model_dir)
    predictor.set_image(image)
    seg, params = predictor.segmenter, predictor.params
    out = {"embedding": np.asarray(predictor.features.image_embeddings)}
    h, w = image.shape[:2]
    decode = jax.jit(seg.decode, static_argnames="multimask_output")
    decode_low = jax.jit(seg.decode_low_res)
    ref_features = SamFeatures(image_embeddings=jnp.asarray(ref["embedding"]))
    for name, kw in prompt_cases(h, w).items():
        for multimask in (True, False):
            out[name, multimask] = predictor.predict(**kw, multimask_output=multimask,
                                                     return_logits=True)
            # the Segmenter path with padded slots (8) must agree too
            p = make_prompts(kw.get("point_coords"), kw.get("point_labels"), kw.get("box"),
                             num_slots=8)
            pred = decode(params, predictor.features, p, predictor.transform,
                          multimask_output=multimask)
            out[name, multimask, "segmenter"] = (np.asarray(pred.logits),
                                                 np.asarray(pred.scores), int(pred.index))
            low, iou = decode_low(params, ref_features, p, predictor.transform)
            sl = slice(1, None) if multimask else slice(0, 1)
            out[name, multimask, "ref_features"] = (np.asarray(low[sl]), np.asarray(iou[sl]))
        out[name, "mask_input"] = predictor.predict(**kw, mask_input=ref[name, "mask_input_arg"],
                                                    return_logits=True)
    target_j = jnp.asarray(target, jnp.float32)
    cases = prompt_cases(h, w)
    for name in ("points", "box", "box_points"):
        kw = cases[name]
        base = make_prompts(kw.get("point_coords"), kw.get("point_labels"), kw.get("box"),
                            num_slots=4)

        def loss(points, box, base=base):
            pred = seg.decode(params, predictor.features, base.replace(points=points, box=box),
                              predictor.transform)
            return dice(jax.nn.sigmoid(pred.logits), target_j)

        g_pts, g_box = jax.jit(jax.grad(loss, argnums=(0, 1)))(base.points, base.box)
        n = 0 if kw.get("point_coords") is None else len(kw["point_coords"])
        out["grad", name] = (np.asarray(g_pts)[:n] if n else None,
                             np.asarray(g_box) if "box" in kw else None,
                             float(jax.jit(loss)(base.points, base.box)))
    return out


VARIANTS = [
    pytest.param("vit_b", id="vit_b"),
    pytest.param("vit_l", id="vit_l", marks=pytest.mark.slow),
    pytest.param("vit_h", id="vit_h", marks=pytest.mark.slow),
]


@pytest.fixture(scope="module", params=VARIANTS)
def results(request, tmp_path_factory):
    variant = request.param
    image, target, source = load_image_and_target(request)
    tmp = tmp_path_factory.mktemp(f"sam_{variant}")
    ckpt = tmp / f"sam_{variant}_random.pth"
    # The reference runs in a fresh process, so its memory is gone before ours is used.
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        ref = pool.submit(torch_side, variant, image, target, ckpt).result()
    out_dir = tmp / "converted"
    assert ports_main(["sam", "--checkpoint", str(ckpt), "--out", str(out_dir)]) == 0
    ckpt.unlink()
    ours = jax_side(out_dir, image, target, ref)
    gc.collect()
    return variant, source, ref, ours


def _err(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max()), float(np.abs(b).max())


def test_model_inputs_match_both_reference_image_paths(request):
    image, _, _ = load_image_and_target(request)
    from segment_anything.utils.transforms import ResizeLongestSide

    seg = zoo.segmenter("sam_vit_b")
    mean = torch.tensor(seg.config.pixel_mean).view(-1, 1, 1)
    std = torch.tensor(seg.config.pixel_std).view(-1, 1, 1)

    def torch_preprocess(x):
        x = (x - mean) / std
        return torch.nn.functional.pad(x, (0, 1024 - x.shape[-1], 0, 1024 - x.shape[-2]))

    pil = ResizeLongestSide(1024).apply_image(image)
    want_pil = torch_preprocess(torch.as_tensor(pil).permute(2, 0, 1).float())
    got_pil, _ = dataclasses.replace(seg, image_resize="pil").preprocess(image)
    np.testing.assert_allclose(np.asarray(got_pil), want_pil.permute(1, 2, 0).numpy(), atol=1e-6)
    # float path: apply_image_torch's interpolate at SAM's (h', w')
    hw = longest_side_shape(*image.shape[:2], 1024)
    x = torch.as_tensor(image).permute(2, 0, 1)[None].float()
    resized = torch.nn.functional.interpolate(x, hw, mode="bilinear", align_corners=False,
                                              antialias=True)
    want_float = torch_preprocess(resized[0]).permute(1, 2, 0).numpy()
    got_float, _ = seg.preprocess(image)
    err, scale = _err(got_float, want_float)
    print(f"\nPARITY model input (float path): max_abs_err={err:.3g} scale={scale:.3g}")
    assert err <= 1e-5 * scale


def test_image_embeddings(results):
    variant, source, ref, ours = results
    err, scale = _err(ours["embedding"], ref["embedding"])
    print(f"\nPARITY {variant} [{source}] image embeddings: max_abs_err={err:.3g} scale={scale:.3g}")
    assert err <= LOGIT_RTOL * scale


@pytest.mark.parametrize("case", ["one_point", "points", "box", "box_points"])
def test_predictions(results, case):
    variant, _, ref, ours = results
    lines = []
    for key in ((case, True), (case, False), (case, "mask_input")):
        (m_t, s_t, l_t), (m_o, s_o, l_o) = ref[key], ours[key]
        assert m_o.shape == m_t.shape and l_o.shape == l_t.shape and s_o.shape == s_t.shape
        e_mask, sc_mask = _err(m_o, m_t)
        e_low, sc_low = _err(l_o, l_t)
        e_iou, sc_iou = _err(s_o, s_t)
        lines.append(f"{key[1]}: masks {e_mask:.3g}/{sc_mask:.3g} low-res {e_low:.3g}/{sc_low:.3g}"
                     f" iou {e_iou:.3g}/{sc_iou:.3g}")
        assert e_mask <= LOGIT_RTOL * sc_mask and e_low <= LOGIT_RTOL * sc_low
        assert e_iou <= LOGIT_RTOL * max(sc_iou, 1.0)
        if key[1] in (True, False):
            logits, scores, index = ours[key + ("segmenter",)]
            assert index == int(np.argmax(s_t)) if key[1] else index == 0
            e_sel, _ = _err(logits, m_t[index])
            e_sc, _ = _err(scores, s_t)
            assert e_sel <= LOGIT_RTOL * sc_mask and e_sc <= LOGIT_RTOL * max(sc_iou, 1.0)
            low_rf, iou_rf = ours[key + ("ref_features",)]
            e_dec, _ = _err(low_rf, l_t)
            lines.append(f"  decoder on reference embeddings: low-res {e_dec:.3g}")
            assert e_dec <= LOGIT_RTOL * sc_low and _err(iou_rf, s_t)[0] <= LOGIT_RTOL
    print(f"\nPARITY {variant} {case} (max_abs_err/scale): " + "; ".join(lines))


@pytest.mark.parametrize("case", ["points", "box", "box_points"])
def test_dice_gradients_wrt_prompt_coordinates(results, case):
    variant, _, ref, ours = results
    g_pts_t, g_box_t, loss_t = ref["grad", case]
    g_pts_o, g_box_o, loss_o = ours["grad", case]
    assert abs(loss_o - loss_t) <= 1e-5
    want = np.concatenate([g.ravel() for g in (g_pts_t, g_box_t) if g is not None])
    got = np.concatenate([g.ravel() for g in (g_pts_o, g_box_o) if g is not None])
    rel = float(np.linalg.norm(got - want) / np.linalg.norm(want))
    print(f"\nPARITY {variant} Dice gradient ({case}): rel_err={rel:.3g} "
          f"|grad|={np.linalg.norm(want):.3g} loss={loss_t:.6f}")
    assert np.linalg.norm(want) > 0 and rel <= GRAD_RTOL


def test_rel_pos_helpers_match_reference():
    from segment_anything.modeling import image_encoder as ref_enc

    from jaxseg_robust.models.sam.image_encoder import get_rel_pos, window_partition

    rng = np.random.default_rng(0)
    for q, k, length in [(14, 14, 27), (14, 14, 15), (8, 16, 31), (16, 8, 20), (64, 64, 127)]:
        table = rng.normal(size=(length, 8)).astype(np.float32)
        want = ref_enc.get_rel_pos(q, k, torch.from_numpy(table)).numpy()
        got = np.asarray(get_rel_pos(q, k, jnp.asarray(table)))
        np.testing.assert_allclose(got, want, atol=1e-6, err_msg=f"q={q} k={k} L={length}")
    x = rng.normal(size=(2, 10, 13, 4)).astype(np.float32)
    want, pad = ref_enc.window_partition(torch.from_numpy(x), 4)
    got, pad_j = window_partition(jnp.asarray(x), 4)
    assert tuple(pad) == tuple(pad_j)
    np.testing.assert_array_equal(np.asarray(got), want.numpy())

