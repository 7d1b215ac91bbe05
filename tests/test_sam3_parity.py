"""Parity of SAM 3's interactive path with the authors' code (``$JAXSEG_SAM3_REPO``).

The reference (tests/sam3_reference.py: ``SAM3VLBackbone`` + the SAM 2 neck +
``SAM3InteractiveImagePredictor`` over ``Sam3TrackerBase``, at the tiny
config's sizes) gets seeded random weights in every tensor, is saved with
``torch.save`` in the layout of ``sam3.pt`` (``detector.*`` / ``tracker.*``),
read back by the authors' ``model_builder._load_checkpoint``, converted with
``ports.sam3.convert_sam3`` and compared on a real image:

  * the model input (``Sam3Processor.transform`` with torchvision's CUDA
    arithmetic, see `sam3_reference.cuda_transform`) and the image embedding
    (stride-1 level + ``no_mem_embed``) and both high-resolution levels;
  * for one point, several points, a box, box + points and the box with a mask
    input: ``predict_inst``'s logits at the original size (hole filling
    included), its predicted IoUs and low-res logits, with and without
    ``multimask_output``;
  * Dice-loss gradients w.r.t. point and box coordinates (original pixels),
    the candidate chosen by predicted IoU, against torch autograd through the
    same modules.

Tolerances (tests/sam_parity_utils.py): values within 1e-4 of their scale,
gradients within 1e-3 relative (L2).
"""

from __future__ import annotations

import contextlib
import io

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytestmark = pytest.mark.parity

torch = pytest.importorskip("torch")

from sam3_reference import (REPO_ENV, build_reference, decode_with_grad,  # noqa: E402
                            official_state_dict, predict_inst, processor, reference_model,
                            repo_path, set_image)

if repo_path() is None:
    pytest.skip(f"${REPO_ENV} does not name a SAM 3 checkout", allow_module_level=True)

from sam_parity_utils import (GRAD_RTOL, LOGIT_RTOL, dice, load_image_and_target,  # noqa: E402
                              max_err, prompt_cases)

from jaxseg_robust.models.sam3.config import TEST_CONFIG  # noqa: E402
from jaxseg_robust.models.sam3.segmenter import Sam3Segmenter  # noqa: E402
from jaxseg_robust.prompts.types import make_prompts  # noqa: E402
from ports.keytable import PortError  # noqa: E402
from ports.sam3 import convert_sam3  # noqa: E402
from ports.torch_checkpoint import load_state_dict  # noqa: E402

SEED = 30
CASES = ("one_point", "points", "box", "box_points")
GRAD_CASES = ("points", "box", "box_points")


def _np(t) -> np.ndarray:
    return t.detach().numpy().copy()


def reference_side(ref, model, image, target) -> dict:
    h, w = image.shape[:2]
    with torch.no_grad():
        state = set_image(ref, model, image)
    sam2 = state["backbone_out"]["sam2_backbone_out"]
    tracker = model.inst_interactive_predictor.model
    out = {"embedding": _np(sam2["backbone_fpn"][2][0].permute(1, 2, 0) + tracker.no_mem_embed[0]),
           "s0": _np(sam2["backbone_fpn"][0][0].permute(1, 2, 0)),
           "s1": _np(sam2["backbone_fpn"][1][0].permute(1, 2, 0))}
    from PIL import Image  # noqa: PLC0415
    from torchvision.transforms import v2  # noqa: PLC0415

    out["input"] = _np(processor(ref, model).transform(v2.functional.to_image(Image.fromarray(image)))
                       .permute(1, 2, 0))
    cases = prompt_cases(h, w)
    with torch.no_grad():
        for name in CASES:
            for multimask in (True, False):
                out[name, multimask] = predict_inst(ref, model, state, **cases[name],
                                                    multimask_output=multimask, return_logits=True)
        masks, iou, low = out["box", True]
        out["mask_input_arg"] = low[int(np.argmax(iou))][None]
        out["box_mask", False] = predict_inst(ref, model, state, **cases["box"],
                                              mask_input=out["mask_input_arg"],
                                              multimask_output=False, return_logits=True)
    target_t = torch.from_numpy(target.astype(np.float32))
    for name in GRAD_CASES:
        kw, leaves, args = cases[name], [], {}
        if "point_coords" in kw:
            coords = torch.tensor(kw["point_coords"][None], requires_grad=True)
            leaves.append(coords)
            args.update(coords=coords, labels=torch.as_tensor(kw["point_labels"][None]).int())
        if "box" in kw:
            box = torch.tensor(kw["box"][None], requires_grad=True)
            leaves.append(box)
            args["box"] = box
        masks, iou = decode_with_grad(model, state, **args, multimask_output=True)
        j = int(torch.argmax(iou[0]))
        loss = dice(torch.sigmoid(masks[0, j]), target_t)
        grads = torch.autograd.grad(loss, leaves)
        out["grad", name] = (np.concatenate([g[0].numpy().ravel() for g in grads]), float(loss.detach()))
    return out


def jax_side(params, image, target, ref_out) -> dict:
    seg = Sam3Segmenter(TEST_CONFIG)
    x, transform = seg.preprocess(image)
    features = jax.jit(seg.embed)(params, x)
    out = {"input": np.asarray(x), "embedding": np.asarray(features.image_embeddings),
           "s0": None, "s1": None}
    decode = jax.jit(seg.decode, static_argnames=("multimask_output",))
    decode_low = jax.jit(seg.decode_low_res)
    low = (TEST_CONFIG.low_res_size,) * 2
    cases = prompt_cases(*image.shape[:2])
    for name in (*CASES, "box_mask"):
        kw = cases["box"] if name == "box_mask" else cases[name]
        mask = ref_out["mask_input_arg"][0] if name == "box_mask" else None
        prompts = make_prompts(kw.get("point_coords"), kw.get("point_labels"), kw.get("box"), mask,
                               num_slots=8, mask_shape=low)
        for multimask in ((False,) if name == "box_mask" else (True, False)):
            pred = decode(params, features, prompts, transform, multimask_output=multimask)
            every, iou = decode_low(params, features, prompts, transform)
            sel_low, _, _ = seg.select(every, iou, multimask_output=multimask)
            out[name, multimask] = (np.asarray(pred.logits), np.asarray(pred.scores),
                                    int(pred.index), np.asarray(seg.clamp_low_res(sel_low)))
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
    return out, seg, features


@pytest.fixture(scope="module")
def results(request, tmp_path_factory):
    image, target, source = load_image_and_target(request)
    ref, model = build_reference(TEST_CONFIG, SEED)
    ckpt = tmp_path_factory.mktemp("sam3") / "sam3_tiny.pt"
    torch.save({"model": official_state_dict(model)}, ckpt)
    reloaded = reference_model(ref, TEST_CONFIG)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        ref.model_builder._load_checkpoint(reloaded, str(ckpt))
    ref_out = reference_side(ref, model, image, target)
    params, skipped = convert_sam3(load_state_dict(ckpt), TEST_CONFIG, what=str(ckpt))
    ours, seg, features = jax_side(params, image, target, ref_out)
    high = [np.asarray(h) for h in features.high_res_feats]
    return dict(source=source, ref=ref_out, ours=ours, model=model, reloaded=reloaded,
                printed=printed.getvalue(), skipped=skipped, high=high, seg=seg, params=params,
                ckpt=ckpt)


def test_the_authors_loader_reads_the_written_checkpoint(results):
    assert "missing" not in results["printed"], results["printed"]
    want = results["model"].state_dict()
    got = results["reloaded"].state_dict()
    assert set(got) == set(want)
    assert all(torch.equal(got[k], want[k]) for k in want)
    assert set(results["skipped"]) == {"detector neck", "SAM 2 neck level 0.5 (dropped: scalp = 1)",
                                       "tracker video memory"}


def test_model_input_and_image_features(results):
    ref, ours = results["ref"], results["ours"]
    e_in, s_in = max_err(ours["input"], ref["input"])
    print(f"\nPARITY sam3_tiny [{results['source']}] model input: max_abs_err={e_in:.3g} scale={s_in:.3g}")
    assert e_in <= 1e-5 * s_in
    ours = dict(ours, s0=results["high"][0], s1=results["high"][1])
    for key in ("embedding", "s0", "s1"):
        err, scale = max_err(ours[key], ref[key])
        print(f"PARITY sam3_tiny {key}: max_abs_err={err:.3g} scale={scale:.3g} rel={err / scale:.3g}")
        assert ours[key].shape == ref[key].shape and err <= LOGIT_RTOL * scale


@pytest.mark.parametrize("case", (*CASES, "box_mask"))
def test_logits_scores_and_low_res(results, case):
    ref, ours = results["ref"], results["ours"]
    lines = []
    for multimask in ((False,) if case == "box_mask" else (True, False)):
        masks_t, iou_t, low_t = ref[case, multimask]
        logits, scores, index, low = ours[case, multimask]
        assert index == (int(np.argmax(iou_t)) if multimask else 0)
        e_mask, s_mask = max_err(logits, masks_t[index])
        e_low, s_low = max_err(low, low_t)
        e_iou, s_iou = max_err(scores, iou_t)
        lines.append(f"multimask={int(multimask)}: logits {e_mask:.3g}/{s_mask:.3g} "
                     f"low-res {e_low:.3g}/{s_low:.3g} iou {e_iou:.3g}/{s_iou:.3g}")
        assert low.shape == low_t.shape and scores.shape == iou_t.shape
        assert e_mask <= LOGIT_RTOL * s_mask and e_low <= LOGIT_RTOL * s_low
        assert e_iou <= LOGIT_RTOL * max(s_iou, 1.0)
    print(f"\nPARITY sam3_tiny {case} (max_abs_err/scale): " + "; ".join(lines))


@pytest.mark.parametrize("case", GRAD_CASES)
def test_dice_gradients_wrt_prompt_coordinates(results, case):
    want, loss_t = results["ref"]["grad", case]
    got, loss_o = results["ours"]["grad", case]
    rel = float(np.linalg.norm(got - want) / np.linalg.norm(want))
    print(f"\nPARITY sam3_tiny Dice gradient ({case}): rel_err={rel:.3g} "
          f"|grad|={np.linalg.norm(want):.3g} loss={loss_t:.6f}")
    assert abs(loss_o - loss_t) <= 1e-5
    assert np.linalg.norm(want) > 0 and rel <= GRAD_RTOL


def _official_numpy(results) -> dict:
    return {k: v.numpy() for k, v in official_state_dict(results["model"]).items()}


def test_the_command_refuses_a_checkpoint_of_another_size_in_one_line(results, tmp_path, capsys):
    from ports.__main__ import main as ports_main  # noqa: PLC0415

    code = ports_main(["sam3", "--checkpoint", str(results["ckpt"]), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert "trunk.blocks.0.attn.freqs_cis" in err and str(results["ckpt"]) in err
    assert not (tmp_path / "out").exists()


def test_port_names_an_unknown_key(results):
    state = {**_official_numpy(results), "tracker.sam_mask_decoder.extra.weight": np.zeros((2,), np.float32)}
    with pytest.raises(PortError, match="tracker.sam_mask_decoder.extra.weight"):
        convert_sam3(state, TEST_CONFIG)


def test_port_names_a_missing_key(results):
    state = _official_numpy(results)
    del state["tracker.no_mem_embed"]
    with pytest.raises(PortError, match="no_mem_embed"):
        convert_sam3(state, TEST_CONFIG)


def test_port_checks_the_rope_tables_against_the_config(results):
    state = _official_numpy(results)
    key = "detector.backbone.vision_backbone.trunk.blocks.0.attn.freqs_cis"
    state[key] = np.conj(state[key])
    with pytest.raises(PortError, match=r"trunk\.blocks\.0\.attn\.freqs_cis"):
        convert_sam3(state, TEST_CONFIG)


def _click_sequence(target: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Five clicks (x, y) with labels: inside, outside, inside, outside, inside the target."""
    inside, outside = np.argwhere(target), np.argwhere(~target)
    picks = [inside[len(inside) // 2], outside[len(outside) // 3], inside[len(inside) // 5],
             outside[2 * len(outside) // 3], inside[4 * len(inside) // 5]]
    return (np.asarray([[p[1], p[0]] for p in picks], np.float32), np.asarray([1, 0, 1, 0, 1], np.int32))


def test_rclicks_rounds_match_the_authors_wrapper_loop(results, request):
    """RClicks' SAM 2 wrapper (``ISModelSAM2.forward`` of emb-ai/rclicks) on ``predict_inst``: the
    mask input dropped while max(#pos, #neg) <= 1, else the previous round's best low-res logits;
    ``multimask_output=False``; probabilities sigmoid(logits). Ours: `models.base.interactive_step`."""
    from jaxseg_robust.models.base import initial_state, interactive_step, resets_feedback  # noqa: PLC0415

    image, target, _ = load_image_and_target(request)
    clicks, labels = _click_sequence(target)
    ref = pytest.importorskip("sam3_reference").import_reference()
    model = results["model"]
    with torch.no_grad():
        state_t = set_image(ref, model, image)
    seg, params = results["seg"], results["params"]
    x, transform = seg.preprocess(image)
    features = seg.embed(params, x)
    step = jax.jit(lambda pts, lab, st, use, n: interactive_step(seg, params, features, transform, pts, lab,
                                                                  st, use, n, multimask_output=False))
    state, prev, lines = initial_state(seg, image.shape[:2]), None, []
    assert resets_feedback(seg)
    for r in range(len(clicks)):
        pos, neg = int((labels[:r + 1] == 1).sum()), int((labels[:r + 1] == 0).sum())
        if max(pos, neg) <= 1:
            prev = None
        with torch.no_grad():
            masks, scores, low = predict_inst(ref, model, state_t, point_coords=clicks[:r + 1],
                                              point_labels=labels[:r + 1], mask_input=prev,
                                              multimask_output=False, return_logits=True)
        prev = low[int(np.argmax(scores))][None]
        prob_t = 1.0 / (1.0 + np.exp(-masks[0].astype(np.float64)))
        pts = np.zeros((8, 2), np.float32)
        lab = np.full((8,), -1, np.int32)
        pts[:r + 1], lab[:r + 1] = clicks[:r + 1], labels[:r + 1]
        prob, state = step(jnp.asarray(pts), jnp.asarray(lab), state, jnp.asarray(max(pos, neg) > 1),
                           jnp.asarray(r + 1))
        prob = np.asarray(prob)
        iou_t = float(((prob_t > 0.5) & target).sum() / ((prob_t > 0.5) | target).sum())
        iou = float(((prob > 0.5) & target).sum() / ((prob > 0.5) | target).sum())
        err = float(np.abs(prob - prob_t).max())
        lines.append(f"round {r + 1}: IoU {iou:.6f} vs {iou_t:.6f}, max |dprob| {err:.3g}")
        assert err <= 1e-4 and abs(iou - iou_t) <= 1e-3
    print("\nPARITY sam3_tiny RClicks rounds (5 clicks): " + "; ".join(lines))


@pytest.mark.slow
def test_the_released_layout_converts_strictly():
    """The builders' full-size interactive path (``_create_vision_backbone`` with the SAM 2 neck,
    ``build_tracker``) under ``sam3.pt``'s prefixes converts into `OFFICIAL_CONFIG`: every key used
    or skipped by name, every parameter filled with its shape, and the 32 RoPE tables the authors'
    code computes (windows 24 x 24, global blocks 72 x 72 at scale 1/3) equal to ours.

    ``PositionEmbeddingSine``'s cache of precomputed encodings is switched off: the builders fill it
    on CUDA, and it holds no parameter or buffer.
    """
    from jaxseg_robust.models.sam3.config import OFFICIAL_CONFIG  # noqa: PLC0415

    ref = pytest.importorskip("sam3_reference").import_reference()
    builder = ref.model_builder
    original = builder.PositionEmbeddingSine

    class Uncached(original):
        def __init__(self, *args, precompute_resolution=None, **kwargs):
            super().__init__(*args, precompute_resolution=None, **kwargs)

    builder.PositionEmbeddingSine = Uncached
    try:
        vision = builder._create_vision_backbone()
        tracker = builder.build_tracker(apply_temporal_disambiguation=False)
    finally:
        builder.PositionEmbeddingSine = original
    state = {**{"detector.backbone.vision_backbone." + k: v.detach().numpy()
                for k, v in vision.state_dict().items()},
             **{"tracker." + k: v.detach().numpy() for k, v in tracker.state_dict().items()}}
    assert sum(1 for k in state if k.endswith("freqs_cis")) == 32
    params, skipped = convert_sam3(state, OFFICIAL_CONFIG)
    assert {k: len(v) for k, v in skipped.items()} == {
        "detector neck": 22, "SAM 2 neck level 0.5 (dropped: scalp = 1)": 4, "tracker video memory": 160}
    np.testing.assert_array_equal(params["no_mem_embed"], state["tracker.no_mem_embed"].reshape(-1))
    assert params["image_encoder"]["trunk"]["pos_embed"].shape == (1 + 24 * 24, 1024)
