"""Full-model parity of RobustSAM with the authors' code (``$JAXSEG_ROBUSTSAM_REPO``).

The reference ``Sam`` (tests/robustsam_reference.py) gets seeded random weights
in every tensor (RobustSAM's modules and BatchNorm statistics included), is
saved with ``torch.save`` in the official flat layout, converted with
``python -m ports robustsam`` (ViT-B/L/H; the tiny config through
``convert_robustsam``) and compared on a real image (tests/sam_parity_utils.py's
image and Dice loss), on both decoder paths ("clear": the reference
predictor's and BREPS's, "robust": ``clear=False``):

  * image embeddings, and on the robust path the prompt-independent Fourier
    features of the first global-attention block output and of the embedding;
  * for one point, several points, a box, box + points, and the box with a mask
    input: logits at the original size of the selected candidate, predicted
    IoUs and every low-res candidate, with and without ``multimask_output``;
  * Dice-loss gradients w.r.t. box and point coordinates (original pixels)
    against torch autograd through the reference predictor's decoder call,
    the candidate chosen by predicted IoU as the BREPS wrapper does.

Tolerances (tests/sam_parity_utils.py): logits, embeddings and IoUs within 1e-4
of their scale (max |value|; IoUs of scale at least 1), float32 summation
order being the only expected difference; gradients within 1e-3 relative (L2)
on the clear path, 2e-3 on the robust path (the reference's own float32
gradient is up to 1.04e-3 from float64 there, see `GRAD_RTOL_BY_PATH`).
ViT-B runs by default (``-m parity``); ViT-L/H are also slow.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytestmark = pytest.mark.parity

torch = pytest.importorskip("torch")

from robustsam_reference import REPO_ENV, build_reference, reference_decode, repo_path  # noqa: E402

if repo_path() is None:
    pytest.skip(f"${REPO_ENV} does not name a RobustSAM checkout", allow_module_level=True)

from sam_parity_utils import (GRAD_RTOL, LOGIT_RTOL, dice, load_image_and_target,  # noqa: E402
                              max_err, prompt_cases)

from jaxseg_robust.models import store, zoo  # noqa: E402
from jaxseg_robust.models.robustsam.registry import (ROBUSTSAM_CONFIGS, TINY_CONFIG,  # noqa: E402
                                                     with_decoder_path)
from jaxseg_robust.models.robustsam.segmenter import RobustSamSegmenter  # noqa: E402
from jaxseg_robust.prompts.types import make_prompts  # noqa: E402
from ports.__main__ import main as ports_main  # noqa: E402
from ports.robustsam import convert_robustsam, official_robustsam_shapes  # noqa: E402
from ports.torch_checkpoint import load_state_dict  # noqa: E402

PATHS = ("clear", "robust")
CASES = ("one_point", "points", "box", "box_points")
GRAD_CASES = ("box", "points", "box_points")
VARIANTS = [
    pytest.param("tiny", id="tiny"),
    pytest.param("vit_b", id="vit_b"),
    pytest.param("vit_l", id="vit_l", marks=pytest.mark.slow),
    pytest.param("vit_h", id="vit_h", marks=pytest.mark.slow),
]
SEEDS = {"tiny": 40, "vit_b": 41, "vit_l": 42, "vit_h": 43}
# The robust path's gradients run back through the FFT magnitude and phase of the mask features,
# where the reference's own float32 result is up to 1.04e-3 (relative L2) from the same model in
# float64 (ViT-H, box + points; ours: 5.6e-5 from it), docs/models/robustsam.md: its budget is
# twice the clear path's.
GRAD_RTOL_BY_PATH = {"clear": GRAD_RTOL, "robust": 2 * GRAD_RTOL}


def config_of(variant: str):
    return TINY_CONFIG if variant == "tiny" else ROBUSTSAM_CONFIGS[variant]


def port(variant: str, ckpt, out_dir):
    """The reference's saved state dict, converted: by the CLI for named variants."""
    if variant == "tiny":
        params = convert_robustsam(load_state_dict(ckpt), TINY_CONFIG, what=str(ckpt))
        store.save(out_dir, params, family=TINY_CONFIG.family, variant="tiny",
                   config=TINY_CONFIG.to_dict(), source_path=str(ckpt))
    else:
        assert ports_main(["robustsam", "--checkpoint", str(ckpt), "--out", str(out_dir)]) == 0
    return zoo.load(out_dir).params


def torch_prompts(predictor, kw: dict, size_hw):
    """Prompts of a case in the reference predictor's resized frame (as ``predict`` maps them)."""
    coords = labels = boxes = None
    if "point_coords" in kw:
        coords = torch.as_tensor(predictor.transform.apply_coords(kw["point_coords"], size_hw))[None]
        labels = torch.as_tensor(kw["point_labels"], dtype=torch.int)[None]
    if "box" in kw:
        boxes = torch.as_tensor(predictor.transform.apply_boxes(kw["box"], size_hw))
    return dict(coords=coords, labels=labels, boxes=boxes)


def selectable(out, clear: bool, multimask: bool):
    """The reference's channels a selection by predicted IoU can return (robust multimask: 0..2 of 15)."""
    masks, iou, low = out
    if not clear and multimask:
        masks, low = masks[:, :iou.shape[1]], low[:, :iou.shape[1]]
    return masks[0].detach().numpy(), iou[0].detach().numpy(), low[0].detach().numpy()


def torch_gradient(model, predictor, kw, target, clear: bool, size_hw):
    """Dice-loss gradient w.r.t. original-pixel prompt coordinates (the BREPS wrapper's selection)."""
    h, w = size_hw
    hr, wr = predictor.input_size
    scale = torch.tensor([wr / w, hr / h], dtype=torch.float32)
    leaves, args = [], {}
    if "point_coords" in kw:
        coords = torch.tensor(kw["point_coords"][None], requires_grad=True)
        leaves.append(coords)
        args.update(coords=coords * scale, labels=torch.as_tensor(kw["point_labels"][None]).int())
    if "box" in kw:
        box = torch.tensor(kw["box"][None], requires_grad=True)
        leaves.append(box)
        args["boxes"] = (box.reshape(-1, 2, 2) * scale).reshape(-1, 4)
    masks, iou, _ = reference_decode(model, predictor, **args, multimask_output=True, clear=clear)
    j = int(torch.argmax(iou[0]))
    loss = dice(torch.sigmoid(masks[0, j]), torch.from_numpy(target.astype(np.float32)))
    grads = torch.autograd.grad(loss, leaves)
    return np.concatenate([g[0].numpy().ravel() for g in grads]), float(loss.detach())


def robust_features(model, predictor) -> np.ndarray:
    """The reference's prompt-independent robust features [4E, 4E, C/8] (``clear=False``)."""
    decoder = model.mask_decoder
    early = predictor.features[1][0].permute(0, 3, 1, 2)
    with torch.no_grad():
        both = (decoder.fourier_first_layer_features(early, clear=False)
                + decoder.fourier_last_layer_features(predictor.features[0], clear=False))
    return both[0].permute(1, 2, 0).numpy().copy()


def reference_side(pkg, model, image, target):
    predictor = pkg.SamPredictor(model)
    predictor.set_image(image)
    size_hw = image.shape[:2]
    out = {"embedding": predictor.features[0][0].permute(1, 2, 0).numpy().copy(),
           "robust_features": robust_features(model, predictor)}
    cases = prompt_cases(*size_hw)
    for path in PATHS:
        clear = path == "clear"
        with torch.no_grad():
            for name in CASES:
                args = torch_prompts(predictor, cases[name], size_hw)
                for multimask in (True, False):
                    raw = reference_decode(model, predictor, **args, multimask_output=multimask,
                                           clear=clear)
                    out[path, name, multimask] = selectable(raw, clear, multimask)
            masks, iou, low = out[path, "box", True]
            best = low[int(np.argmax(iou))][None]
            out[path, "mask_input_arg"] = best
            raw = reference_decode(model, predictor, **torch_prompts(predictor, cases["box"], size_hw),
                                   mask_input=torch.from_numpy(best)[None], multimask_output=False,
                                   clear=clear)
            out[path, "box_mask", False] = selectable(raw, clear, False)
        for name in GRAD_CASES:
            out[path, "grad", name] = torch_gradient(model, predictor, cases[name], target, clear,
                                                     size_hw)
    return out


def jax_path_side(config, params, image, target, ref, path: str) -> dict:
    seg = RobustSamSegmenter(with_decoder_path(config, path), image_resize="pil")
    x, transform = seg.preprocess(image)
    features = jax.jit(seg.embed)(params, x)
    out = {"embedding": np.asarray(features.image_embeddings)}
    if path == "robust":
        out["robust_features"] = np.asarray(features.interm_embeddings[0])
    decode = jax.jit(seg.decode, static_argnames=("multimask_output",))
    decode_low = jax.jit(seg.decode_low_res)
    low = (config.low_res_size, config.low_res_size)
    cases = {**prompt_cases(*image.shape[:2]), "box_mask": None}
    for name in (*CASES, "box_mask"):
        kw = cases["box"] if name == "box_mask" else cases[name]
        mask = ref[path, "mask_input_arg"][0] if name == "box_mask" else None
        prompts = make_prompts(kw.get("point_coords"), kw.get("point_labels"), kw.get("box"), mask,
                               num_slots=8, mask_shape=low)
        for multimask in ((False,) if name == "box_mask" else (True, False)):
            pred = decode(params, features, prompts, transform, multimask_output=multimask)
            every, iou = decode_low(params, features, prompts, transform)
            sel_low, sel_iou, _ = seg.select(every, iou, multimask_output=multimask)
            out[name, multimask] = (np.asarray(pred.logits), np.asarray(pred.scores), int(pred.index),
                                    np.asarray(sel_low))
    target_j = jnp.asarray(target, jnp.float32)

    def loss(points, box, base):
        pred = seg.decode(params, features, base.replace(points=points, box=box), transform)
        return dice(jax.nn.sigmoid(pred.logits), target_j)

    grad = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))
    for name in GRAD_CASES:
        kw = cases[name]
        base = make_prompts(kw.get("point_coords"), kw.get("point_labels"), kw.get("box"),
                            num_slots=4, mask_shape=low)
        value, (g_pts, g_box) = grad(base.points, base.box, base)
        n = 0 if kw.get("point_coords") is None else len(kw["point_coords"])
        parts = ([np.asarray(g_pts)[:n].ravel()] if n else []) + \
                ([np.asarray(g_box).ravel()] if "box" in kw else [])
        out["grad", name] = (np.concatenate(parts), float(value))
    return out


@pytest.fixture(scope="module", params=VARIANTS)
def results(request, tmp_path_factory):
    variant = request.param
    config = config_of(variant)
    image, target, source = load_image_and_target(request)
    pkg, model = build_reference(config, SEEDS[variant])
    tmp = tmp_path_factory.mktemp(f"robustsam_{variant}")
    ckpt = tmp / "random.pth"
    torch.save(model.state_dict(), ckpt)
    ref = reference_side(pkg, model, image, target)
    del model
    params = port(variant, ckpt, tmp / "converted")
    ours = {path: jax_path_side(config, params, image, target, ref, path) for path in PATHS}
    return variant, source, ref, ours


@pytest.mark.parametrize("path", PATHS)
def test_image_embeddings_and_robust_features(results, path):
    variant, source, ref, ours = results
    for key in ("embedding", "robust_features") if path == "robust" else ("embedding",):
        err, scale = max_err(ours[path][key], ref[key])
        print(f"\nPARITY robustsam_{variant} [{source}] {path} {key}: max_abs_err={err:.3g} "
              f"scale={scale:.3g} rel={err / scale:.3g}")
        assert ours[path][key].shape == ref[key].shape and err <= LOGIT_RTOL * scale


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("case", (*CASES, "box_mask"))
def test_logits_and_scores(results, path, case):
    variant, _, ref, ours = results
    lines = []
    for multimask in ((False,) if case == "box_mask" else (True, False)):
        masks_t, iou_t, low_t = ref[path, case, multimask]
        logits, scores, index, low = ours[path][case, multimask]
        assert index == (int(np.argmax(iou_t)) if multimask else 0)
        e_mask, s_mask = max_err(logits, masks_t[index])
        e_low, s_low = max_err(low, low_t)
        e_iou, s_iou = max_err(scores, iou_t)
        lines.append(f"multimask={int(multimask)}: logits {e_mask:.3g}/{s_mask:.3g} "
                     f"low-res {e_low:.3g}/{s_low:.3g} iou {e_iou:.3g}/{s_iou:.3g}")
        assert low.shape == low_t.shape and scores.shape == iou_t.shape
        assert e_mask <= LOGIT_RTOL * s_mask and e_low <= LOGIT_RTOL * s_low
        assert e_iou <= LOGIT_RTOL * max(s_iou, 1.0)
    print(f"\nPARITY robustsam_{variant} {path} {case} (max_abs_err/scale): " + "; ".join(lines))


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("case", GRAD_CASES)
def test_dice_gradients_wrt_prompt_coordinates(results, path, case):
    variant, _, ref, ours = results
    want, loss_t = ref[path, "grad", case]
    got, loss_o = ours[path]["grad", case]
    rel = float(np.linalg.norm(got - want) / np.linalg.norm(want))
    print(f"\nPARITY robustsam_{variant} {path} Dice gradient ({case}): rel_err={rel:.3g} "
          f"|grad|={np.linalg.norm(want):.3g} loss={loss_t:.6f}")
    assert abs(loss_o - loss_t) <= 1e-5
    assert np.linalg.norm(want) > 0 and rel <= GRAD_RTOL_BY_PATH[path]


@pytest.mark.parametrize("variant", ["vit_b", "vit_l", "vit_h"])
def test_official_shapes_match_the_reference_builders(variant):
    pkg = pytest.importorskip("robustsam_reference").import_reference()
    with torch.device("meta"):
        model = pkg.sam_model_registry[variant](None)
    got = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    assert got == official_robustsam_shapes(ROBUSTSAM_CONFIGS[variant])
