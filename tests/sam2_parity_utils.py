"""Full-model parity harness for SAM 2 / SAM 2.1 against the official ``sam2`` code.

How a run works (`run_parity`): in a fresh spawned process the official
model is built with ``sam2.build_sam.build_sam2`` and the official yaml
config (build_sam2's dynamic-multimask overrides included; the tiny test
configuration adds hydra overrides), EVERY float tensor is overwritten with
seeded random values of a sensible scale (`randomize_`), the state dict is
saved as the released checkpoints are (``{"model": state_dict}``) and
converted with our CLI (``python -m ports sam2``), and both sides run the
official ``SAM2ImagePredictor`` path on a real image: image embeddings and
high-resolution features; low-res logits, upsampled logits and IoU
predictions for one point, several points, a box, box + points, each also
with a mask input, for multimask on and off; single-mask output with the
official stability threshold and with the threshold forced to 0 and to 2
(so both sides of the dynamic fallback are compared whatever the weights);
object-score logits; the same through ``Segmenter.decode`` with padded
prompt slots and through the decoder on the reference's own features;
gradients of a Dice loss w.r.t. point and box coordinates (torch autograd
through the official ``SAM2ImagePredictor._predict``).

Reference location: ``$JAXSEG_SAM2_REPO`` (a checkout of
facebookresearch/sam2; needs hydra-core and iopath). HQ-SAM 2 (SysCV/sam-hq,
folder ``sam-hq2``) ships a package of the same name, ``sam2``: a spec names
its checkout's variable (``$JAXSEG_SAM_HQ2_REPO``, `Sam2Spec.repo_env`), and
the spawned reference process imports ``sam2`` from that checkout alone
(`import_reference` drops any other ``sam2`` module first and checks where
the package came from). The official transforms
import torchvision; where the installed torchvision cannot load its compiled
operators (a CUDA wheel beside a CPU torch), only its pure-Python package is
imported (`import_reference`), which is all ``SAM2Transforms`` uses.

Tolerances: logits and features within ``LOGIT_RTOL`` x their scale (max
|value|); gradients within ``GRAD_RTOL`` relative (L2).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import gc
import importlib.util
import multiprocessing
import os
import sys
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from sam_parity_utils import dice, load_image_and_target, max_err, prompt_cases

from jaxseg_robust.models import zoo
from jaxseg_robust.models.base import Prediction
from jaxseg_robust.models.sam2.segmenter import Sam2Features, stability_score
from jaxseg_robust.prompts.types import make_prompts
from ports.__main__ import main as ports_main

LOGIT_RTOL = 1e-4
GRAD_RTOL = 1e-3
ENV_REPO = "JAXSEG_SAM2_REPO"
CASES = ("one_point", "points", "box", "box_points")
# (name, multimask_output, stability threshold override or None)
OPTIONS = (("multimask", True, None), ("single", False, None),
           ("single_stable", False, 0.0), ("single_fallback", False, 2.0))
GRAD_CASES = (("points", False), ("box", False), ("box_points", False), ("points", True))
EMBEDDING_NAMES = ("iou_token", "mask_tokens", "obj_score_token", "hf_token", "point_embeddings",
                   "not_a_point_embed", "no_mask_embed", "positional_encoding_gaussian_matrix")
TABLE_NAMES = ("pos_embed", "pos_embed_window", "no_mem_embed", "no_mem_pos_enc")
CONV_TRANSPOSE_NAMES = ("output_upscaling",)
YAML = {"hiera_tiny": "t", "hiera_small": "s", "hiera_base_plus": "b+", "hiera_large": "l"}
# The tiny test model (zoo "sam2_test") as hydra overrides of the official tiny yaml.
TEST_OVERRIDES = (
    "++model.image_size=128",
    "++model.image_encoder.trunk.embed_dim=8",
    "++model.image_encoder.trunk.num_heads=1",
    "++model.image_encoder.trunk.stages=[1,1,3,2]",
    "++model.image_encoder.trunk.global_att_blocks=[4]",
    "++model.image_encoder.trunk.window_pos_embed_bkg_spatial_size=[3,3]",
    "++model.image_encoder.trunk.window_spec=[4,2,6,3]",
    "++model.image_encoder.neck.d_model=32",
    "++model.image_encoder.neck.backbone_channel_list=[64,32,16,8]",
)


@dataclasses.dataclass(frozen=True)
class Sam2Spec:
    """One official configuration: zoo name, yaml, hydra overrides, seed.

    ``repo_env`` names the variable holding the reference checkout; ``port``
    the ``python -m ports`` family that converts it (``sam2`` or ``sam2_hq``,
    whose decoder adds the HQ mask to every output and also answers
    ``hq_token_only``).
    """

    name: str
    yaml: str
    overrides: tuple[str, ...] = ()
    seed: int = 0
    repo_env: str = ENV_REPO
    port: str = "sam2"

    @property
    def hq(self) -> bool:
        """Whether the model is HQ-SAM 2 (the predictor takes ``hq_token_only``)."""
        return self.port == "sam2_hq"


def official_spec(variant: str, version: str, seed: int) -> Sam2Spec:
    """The spec of an official checkpoint configuration."""
    tag = "sam2" if version == "2" else "sam2.1"
    return Sam2Spec(f"{tag}_{variant}", f"configs/{tag}/{tag}_hiera_{YAML[variant]}.yaml",
                    seed=seed)


TEST_SPEC = Sam2Spec("sam2_test", "configs/sam2.1/sam2.1_hiera_t.yaml", TEST_OVERRIDES, seed=11)


def reference_repo(env: str = ENV_REPO, what: str = "facebookresearch/sam2") -> str:
    """``$<env>`` (default ``$JAXSEG_SAM2_REPO``), or a clean pytest skip."""
    repo = os.environ.get(env, "")
    if not repo or not os.path.isfile(os.path.join(repo, "sam2", "build_sam.py")):
        pytest.skip(f"the official code is not available: set {env} to a checkout "
                    f"of {what} (got {repo!r})")
    for module in ("hydra", "iopath", "omegaconf"):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"the official SAM 2 code needs '{module}' (pip install hydra-core iopath)")
    if importlib.util.find_spec("torchvision") is None:
        pytest.skip("the official SAM 2 transforms need torchvision")
    return repo


def import_reference(repo: str):
    """Imports the official ``sam2`` package from ``repo``; returns (build_sam2, SAM2ImagePredictor).

    Any ``sam2`` module already imported (another checkout's) is dropped first,
    and the package must come from ``repo``.
    """
    for name in [m for m in sys.modules if m == "sam2" or m.startswith("sam2.")]:
        del sys.modules[name]
    if repo not in sys.path:
        sys.path.insert(0, repo)
    try:
        import torchvision  # noqa: F401, PLC0415
    except (ImportError, RuntimeError):
        # A torchvision whose compiled operators cannot load: keep its Python package only.
        for name in [m for m in sys.modules if m.startswith("torchvision")]:
            del sys.modules[name]
        spec = importlib.util.find_spec("torchvision")
        package = types.ModuleType("torchvision")
        package.__path__ = list(spec.submodule_search_locations)
        sys.modules["torchvision"] = package
        importlib.import_module("torchvision.transforms")
    import sam2  # noqa: PLC0415
    from sam2.build_sam import build_sam2  # noqa: PLC0415
    from sam2.sam2_image_predictor import SAM2ImagePredictor  # noqa: PLC0415

    origin = os.path.realpath(os.path.dirname(sam2.__file__))
    if origin != os.path.realpath(os.path.join(repo, "sam2")):
        raise RuntimeError(f"'sam2' was imported from {origin}, not from the checkout {repo}")
    return build_sam2, SAM2ImagePredictor


def randomize_(model: torch.nn.Module, seed: int) -> None:
    """Overwrites every float state-dict tensor with seeded values of a sensible scale.

    Tokens, prompt embeddings and the Fourier matrix N(0, 1); position tables
    and ``no_mem_*`` 0.2 N(0, 1); weights with >= 2 axes N(0, 1/fan_in)
    (ConvTranspose2d: fan-in on the first axis); 1-D weights (norm scales)
    1 + 0.1 N(0, 1); biases 0.1 N(0, 1).
    """
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, t in model.state_dict().items():
            if not t.is_floating_point():
                continue
            noise = torch.randn(t.shape, generator=gen)
            leaf = name.rsplit(".", 1)[-1]
            if any(k in name for k in EMBEDDING_NAMES):
                t.copy_(noise)
            elif leaf in TABLE_NAMES or name in TABLE_NAMES:
                t.copy_(0.2 * noise)
            elif t.ndim >= 2:
                transposed = t.ndim == 4 and any(k in name for k in CONV_TRANSPOSE_NAMES)
                fan_in = t.shape[0] if transposed else t[0].numel()
                t.copy_(noise / np.sqrt(fan_in))
            elif name.endswith("weight"):
                t.copy_(1.0 + 0.1 * noise)
            else:
                t.copy_(0.1 * noise)


def _build(spec: Sam2Spec, repo: str):
    build_sam2, predictor_cls = import_reference(repo)
    model = build_sam2(spec.yaml, None, device="cpu", hydra_overrides_extra=list(spec.overrides))
    randomize_(model, spec.seed)
    model.eval()
    predictor = predictor_cls(model)
    s = model.image_size
    predictor._bb_feat_sizes = [(s // 4, s // 4), (s // 8, s // 8), (s // 16, s // 16)]
    return model, predictor, predictor_cls


def _case_prompts(h: int, w: int) -> dict:
    return prompt_cases(h, w)


def torch_side(spec: Sam2Spec, repo: str, image, target, ckpt):
    """Runs the official model (in a spawned process); saves its checkpoint to ``ckpt``."""
    model, predictor, predictor_cls = _build(spec, repo)
    state = model.state_dict()
    torch.save({"model": state}, ckpt)
    out = {"official_shapes": {k: tuple(v.shape) for k, v in state.items()}}
    decoder = model.sam_mask_decoder
    recorded = {}
    decoder.register_forward_hook(lambda m, i, o: recorded.__setitem__("obj", o[3]))
    predict_masks = decoder.predict_masks

    def recording_predict_masks(**kwargs):  # every candidate, before the selection
        result = predict_masks(**kwargs)
        recorded["all"] = result[0].detach()
        return result

    decoder.predict_masks = recording_predict_masks
    with torch.no_grad():
        predictor.set_image(image)
    feats = predictor._features
    out["embedding"] = feats["image_embed"][0].permute(1, 2, 0).numpy().copy()
    out["high_res"] = tuple(f[0].permute(1, 2, 0).numpy().copy() for f in feats["high_res_feats"])
    official_thresh = decoder.dynamic_multimask_stability_thresh
    for name, kw in _case_prompts(*image.shape[:2]).items():
        for option, multimask, thresh in OPTIONS:
            decoder.dynamic_multimask_stability_thresh = official_thresh if thresh is None \
                else thresh
            out[name, option] = predictor.predict(**kw, multimask_output=multimask,
                                                  return_logits=True)
            out[name, option, "obj"] = recorded["obj"][0].numpy().copy()
            if option == "single_stable":  # SAM candidate 0 alone (HQ-SAM 2 returns it + HQ)
                out[name, "stability"] = float(
                    decoder._get_stability_scores(recorded["all"][:, 0:1])[0])
        decoder.dynamic_multimask_stability_thresh = official_thresh
        if spec.hq:
            out[name, "hq_token_only"] = predictor.predict(**kw, multimask_output=False,
                                                           hq_token_only=True, return_logits=True)
        _, scores, low = out[name, "multimask"]
        best = low[np.argmax(scores)][None]
        out[name, "mask_input_arg"] = best
        for option, multimask in (("mask_input_single", False), ("mask_input_multi", True)):
            out[name, option] = predictor.predict(**kw, mask_input=best,
                                                  multimask_output=multimask, return_logits=True)
    out["grad"] = _torch_gradients(predictor, predictor_cls, image, target)
    del predictor, model
    gc.collect()
    return out


def _torch_gradients(predictor, predictor_cls, image, target) -> dict:
    """Dice-loss gradients through the official ``_predict`` (its no_grad wrapper removed)."""
    predict = predictor_cls._predict.__wrapped__
    target_t = torch.from_numpy(target.astype(np.float32))
    cases = _case_prompts(*image.shape[:2])
    out = {}
    for name, multimask in GRAD_CASES:
        kw = cases[name]
        coords = box = None
        if "point_coords" in kw:
            coords = torch.tensor(kw["point_coords"], requires_grad=True)
        if "box" in kw:
            box = torch.tensor(kw["box"], requires_grad=True)
        _, unnorm_coords, labels, unnorm_box = predictor._prep_prompts(
            coords, kw.get("point_labels"), box, None, True)
        masks, iou, _ = predict(predictor, unnorm_coords, labels, unnorm_box, None,
                                multimask_output=multimask, return_logits=True)
        j = int(torch.argmax(iou[0])) if multimask else 0
        loss = dice(torch.sigmoid(masks[0, j]), target_t)
        leaves = [t for t in (coords, box) if t is not None]
        grads = iter(torch.autograd.grad(loss, leaves))
        out[name, multimask] = (None if coords is None else next(grads).numpy(),
                                None if box is None else next(grads).numpy(), float(loss))
    return out


def jax_side(spec: Sam2Spec, model_dir, image, target, ref):
    """Runs our converted model on the same inputs."""
    predictor = zoo.load(model_dir)
    predictor.set_image(image)
    seg, params = predictor.segmenter, predictor.params
    out = {"embedding": np.asarray(predictor.features.image_embeddings),
           "high_res": tuple(np.asarray(f) for f in predictor.features.high_res_feats)}
    ref_features = Sam2Features(image_embeddings=jnp.asarray(ref["embedding"]),
                                high_res_feats=tuple(jnp.asarray(f) for f in ref["high_res"]))
    heads = jax.jit(seg.decode_heads)
    decode = jax.jit(seg.decode, static_argnames="multimask_output")
    upsample = jax.jit(seg.upsample)
    low = seg.config.low_res_size
    for name, kw in _case_prompts(*image.shape[:2]).items():
        p = make_prompts(kw.get("point_coords"), kw.get("point_labels"), kw.get("box"),
                         num_slots=8, mask_shape=(low, low))
        all_low, all_iou, obj = heads(params, predictor.features, p, predictor.transform)
        rf_low, rf_iou, _ = heads(params, ref_features, p, predictor.transform)
        for option, multimask, thresh in OPTIONS:
            option_seg = seg if thresh is None else dataclasses.replace(
                seg, config=dataclasses.replace(seg.config,
                                                dynamic_multimask_stability_thresh=thresh))
            out[name, option, "obj"] = np.asarray(obj)
            predictor.segmenter = option_seg
            out[name, option] = predictor.predict(**kw, multimask_output=multimask,
                                                  return_logits=True)
            if thresh is None:  # the Segmenter's own decode (padded slots)
                pred = decode(params, predictor.features, p, predictor.transform,
                              multimask_output=multimask)
            else:  # the same pieces with the threshold overridden (select is static config)
                sel, scores, index = option_seg.select(all_low, all_iou,
                                                       multimask_output=multimask)
                pred = Prediction(upsample(sel[index], predictor.transform),
                                  option_seg.clamp_low_res(sel), scores, index)
            out[name, option, "segmenter"] = (np.asarray(pred.logits), np.asarray(pred.scores),
                                              np.asarray(pred.low_res_logits), int(pred.index))
            sel_low, sel_iou, _ = option_seg.select(rf_low, rf_iou, multimask_output=multimask)
            out[name, option, "ref_features"] = (np.asarray(option_seg.clamp_low_res(sel_low)),
                                                 np.asarray(sel_iou))
        predictor.segmenter = seg
        for option, multimask in (("mask_input_single", False), ("mask_input_multi", True)):
            out[name, option] = predictor.predict(**kw, mask_input=ref[name, "mask_input_arg"],
                                                  multimask_output=multimask, return_logits=True)
        if spec.hq:
            out[name, "hq_token_only"] = predictor.predict(**kw, multimask_output=False,
                                                           hq_token_only=True, return_logits=True)
        out[name, "stability"] = float(stability_score(
            all_low[0], seg.config.dynamic_multimask_stability_delta))
    out["grad"] = _jax_gradients(seg, params, predictor, image, target)
    return out


def _jax_gradients(seg, params, predictor, image, target) -> dict:
    target_j = jnp.asarray(target, jnp.float32)
    cases = _case_prompts(*image.shape[:2])
    low = seg.config.low_res_size

    def loss(points, box, base, multimask):
        pred = seg.decode(params, predictor.features, base.replace(points=points, box=box),
                          predictor.transform, multimask_output=multimask)
        return dice(jax.nn.sigmoid(pred.logits), target_j)

    grad = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)), static_argnames="multimask")
    out = {}
    for name, multimask in GRAD_CASES:
        kw = cases[name]
        base = make_prompts(kw.get("point_coords"), kw.get("point_labels"), kw.get("box"),
                            num_slots=4, mask_shape=(low, low))
        value, (g_pts, g_box) = grad(base.points, base.box, base, multimask=multimask)
        n = 0 if kw.get("point_coords") is None else len(kw["point_coords"])
        out[name, multimask] = (np.asarray(g_pts)[:n] if n else None,
                                np.asarray(g_box) if "box" in kw else None, float(value))
    return out


def run_parity(spec: Sam2Spec, request, tmp_path_factory):
    """Reference in a spawned process, port through the CLI, then ours.

    Returns:
      (spec, image source, reference results, our results, port output dir).
    """
    repo = reference_repo(spec.repo_env, "SysCV/sam-hq's sam-hq2" if spec.hq
                          else "facebookresearch/sam2")
    image, target, source = load_image_and_target(request)
    tmp = tmp_path_factory.mktemp(spec.name.replace(".", "_"))
    ckpt = tmp / f"{spec.name}_random.pt"
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        ref = pool.submit(torch_side, spec, repo, image, target, ckpt).result()
    out_dir = tmp / "converted"
    args = [spec.port, "--checkpoint", str(ckpt), "--out", str(out_dir)]
    if spec.overrides:  # the test model is not an official variant: port its params directly
        _port_test_model(spec, ckpt, out_dir)
    else:
        assert ports_main(args) == 0
    ckpt.unlink()
    ours = jax_side(spec, out_dir, image, target, ref)
    gc.collect()
    return spec, source, ref, ours, out_dir


def _port_test_model(spec: Sam2Spec, ckpt, out_dir) -> None:
    """The tiny test configuration through the same strict converter (no official variant name)."""
    from jaxseg_robust.models import store
    from jaxseg_robust.models.sam2.config import HQ_TEST_CONFIG, TEST_CONFIG
    from ports.sam2 import convert_sam2
    from ports.sam2_hq import convert_sam2_hq
    from ports.torch_checkpoint import load_state_dict

    convert, config = (convert_sam2_hq, HQ_TEST_CONFIG) if spec.hq else (convert_sam2, TEST_CONFIG)
    params, _ = convert(load_state_dict(ckpt), config, what=str(ckpt))
    store.save(out_dir, params, family=config.family, variant="test", config=config.to_dict())


# ---- checks ----------------------------------------------------------------------


def check_features(results) -> list[str]:
    """Image embedding and projected high-res features within LOGIT_RTOL x scale."""
    spec, source, ref, ours, _ = results
    lines = []
    pairs = [("embedding", ours["embedding"], ref["embedding"])] + [
        (f"high_res_{i}", o, r) for i, (o, r) in enumerate(zip(ours["high_res"], ref["high_res"]))]
    for name, got, want in pairs:
        assert got.shape == want.shape, (name, got.shape, want.shape)
        err, scale = max_err(got, want)
        lines.append(f"{name} {err:.3g}/{scale:.3g} (rel {err / scale:.2g})")
        assert err <= LOGIT_RTOL * scale, name
    print(f"\nPARITY {spec.name} [{source}] features (max_abs_err/scale): " + "; ".join(lines))
    return lines


def check_predictions(results, case: str) -> None:
    """Predictor, Segmenter and decoder-on-reference-features outputs for one prompt case."""
    spec, _, ref, ours, _ = results
    lines = [f"stability ref {ref[case, 'stability']:.4f} ours {ours[case, 'stability']:.4f}"]
    worst = 0.0
    options = [o[0] for o in OPTIONS] + ["mask_input_single", "mask_input_multi"]
    for option in options:
        (m_t, s_t, l_t), (m_o, s_o, l_o) = ref[case, option], ours[case, option]
        assert m_o.shape == m_t.shape and l_o.shape == l_t.shape and s_o.shape == s_t.shape
        e_mask, sc_mask = max_err(m_o, m_t)
        e_low, sc_low = max_err(l_o, l_t)
        e_iou, _ = max_err(s_o, s_t)
        worst = max(worst, e_mask / sc_mask, e_low / sc_low, e_iou)
        lines.append(f"{option}: masks {e_mask:.3g}/{sc_mask:.3g} low-res {e_low:.3g}/{sc_low:.3g}"
                     f" iou {e_iou:.3g}")
        assert e_mask <= LOGIT_RTOL * sc_mask and e_low <= LOGIT_RTOL * sc_low, option
        assert e_iou <= LOGIT_RTOL, option
        if option.startswith("mask_input"):
            continue
        e_obj, sc_obj = max_err(ours[case, option, "obj"], ref[case, option, "obj"])
        assert e_obj <= LOGIT_RTOL * max(sc_obj, 1.0), option
        logits, scores, low_res, index = ours[case, option, "segmenter"]
        assert index == (int(np.argmax(s_t)) if len(s_t) > 1 else 0)
        assert max_err(logits, m_t[index])[0] <= LOGIT_RTOL * sc_mask
        assert max_err(low_res, l_t)[0] <= LOGIT_RTOL * sc_low
        assert max_err(scores, s_t)[0] <= LOGIT_RTOL
        rf_low, rf_iou = ours[case, option, "ref_features"]
        e_dec, _ = max_err(rf_low, l_t)
        lines.append(f"  obj {e_obj:.3g}/{sc_obj:.3g}; decoder on reference features {e_dec:.3g}")
        assert e_dec <= LOGIT_RTOL * sc_low and max_err(rf_iou, s_t)[0] <= LOGIT_RTOL
    print(f"\nPARITY {spec.name} {case} worst rel {worst:.3g} (max_abs_err/scale): "
          + "; ".join(lines))


def check_gradients(results, case: str, multimask: bool) -> None:
    """Dice-loss gradients w.r.t. point and box coordinates within GRAD_RTOL (L2)."""
    spec, _, ref, ours, _ = results
    g_pts_t, g_box_t, loss_t = ref["grad"][case, multimask]
    g_pts_o, g_box_o, loss_o = ours["grad"][case, multimask]
    assert abs(loss_o - loss_t) <= 1e-5
    want = np.concatenate([g.ravel() for g in (g_pts_t, g_box_t) if g is not None])
    got = np.concatenate([g.ravel() for g in (g_pts_o, g_box_o) if g is not None])
    rel = float(np.linalg.norm(got - want) / np.linalg.norm(want))
    print(f"\nPARITY {spec.name} Dice gradient ({case}, multimask={multimask}): rel_err={rel:.3g}"
          f" |grad|={np.linalg.norm(want):.3g} loss={loss_t:.6f}")
    assert np.linalg.norm(want) > 0 and rel <= GRAD_RTOL


def check_hq_token_only(results, case: str) -> None:
    """HQ-SAM 2's ``hq_token_only`` output (single-mask mode): the HQ mask alone and its score."""
    spec, _, ref, ours, _ = results
    (m_t, s_t, l_t), (m_o, s_o, l_o) = ref[case, "hq_token_only"], ours[case, "hq_token_only"]
    assert m_o.shape == m_t.shape and l_o.shape == l_t.shape and s_o.shape == s_t.shape
    e_mask, sc_mask = max_err(m_o, m_t)
    e_low, sc_low = max_err(l_o, l_t)
    e_iou, _ = max_err(s_o, s_t)
    print(f"\nPARITY {spec.name} {case} hq_token_only (max_abs_err/scale): masks {e_mask:.3g}/"
          f"{sc_mask:.3g} low-res {e_low:.3g}/{sc_low:.3g} iou {e_iou:.3g}")
    assert e_mask <= LOGIT_RTOL * sc_mask and e_low <= LOGIT_RTOL * sc_low and e_iou <= LOGIT_RTOL
