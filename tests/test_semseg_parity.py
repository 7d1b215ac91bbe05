"""Parity of the semseg / DDC-AT PSPNet and DeepLabv3 ports with the official code (``-m parity``).

For each architecture the official PyTorch model (from a local checkout, see
tests/semseg_reference.py; skipped without it) is built with seeded random
weights and randomised BatchNorm statistics, saved in the released checkpoint
format (``{"epoch", "state_dict": {"module." + key: tensor}, "optimizer"}``, as
semseg's and DDC-AT's training scripts write it), converted with
``python -m ports semseg`` and loaded with ``dense.load_converted``. Compared:

* the evaluation output (``model(x)`` in eval mode: the ``cls`` head, or
  DDC-AT's normal branch ``cls1``, upsampled with ``align_corners=True`` by
  semseg's size rule) with `SemsegDense.apply` on the same [0, 1] image;
* every other head at stride 8 (auxiliary head, DDC-AT's adversarial branch
  ``cls2`` and selector ``mask1``): the official head modules applied to the
  official features (captured with forward hooks) against ``Semseg`` heads.

Tolerance: max |diff| <= ``REL_TOL`` x max |official logit| (float32 through a
dilated ResNet-50 and the context module; XLA and torch sum convolutions in
different orders). Sizes: small odd ones in the parity selection; the paper's
(PASCAL VOC with the shorter side at 512: 512 x 682; Cityscapes at half size,
512 x 1024) under ``slow`` too.
Every comparison prints its numbers (run with ``-s``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from semseg_reference import ENV_DDCAT, ENV_SEMSEG, build_official, checkout, load_semseg_models, port_and_load

pytestmark = pytest.mark.parity
torch = pytest.importorskip("torch")

REL_TOL = 1e-4
MODELS = {  # id -> (official class, head kind, DDC-AT)
    "pspnet": ("PSPNet", "psp", False),
    "pspnet_ddcat": ("PSPNet_DDCAT", "psp", True),
    "deeplabv3": ("DeepLabV3", "aspp", False),
    "deeplabv3_ddcat": ("DeepLabV3_DDCAT", "aspp", True),
}
SMALL_SIZES = [(57, 81), (65, 65)]
PAPER_SIZES = [(512, 682, 21), (512, 1024, 19)]


@pytest.fixture(scope="module")
def ddcat_code():
    return load_semseg_models(checkout(ENV_DDCAT, "model/pspnet.py"))


@pytest.fixture(scope="module")
def semseg_code():
    return load_semseg_models(checkout(ENV_SEMSEG, "model/pspnet.py"))


def official_outputs(model, images: np.ndarray, ddcat: bool) -> dict:
    """{"eval": upsampled eval output, head: stride-8 logits of every other head}, NHWC numpy."""
    captured = {}
    context = model.ppm if hasattr(model, "ppm") else model.aspp
    hooks = [model.layer3.register_forward_hook(lambda m, i, o: captured.__setitem__("layer3", o)),
             context.register_forward_hook(lambda m, i, o: captured.__setitem__("context", o))]
    x = torch.from_numpy(images.transpose(0, 3, 1, 2).copy())
    mean = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1) * 255
    std = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1) * 255
    with torch.no_grad():
        out = {"eval": model((x * 255 - mean) / std)}  # semseg normalises 0..255 pixels
        heads = ("cls1", "cls2", "mask1", "aux_cls1") if ddcat else ("cls", "aux")
        for name in heads:
            source = captured["layer3"] if name.startswith("aux") else captured["context"]
            out[name] = getattr(model, name)(source)
    for h in hooks:
        h.remove()
    return {k: v.numpy().transpose(0, 2, 3, 1) for k, v in out.items()}


def compare(label: str, got, want) -> float:
    """Asserts max |got - want| <= REL_TOL x max |want|; prints and returns the relative error."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, f"{label}: shape {got.shape} vs {want.shape}"
    scale = float(np.abs(want).max())
    diff = float(np.abs(got - want).max())
    print(f"{label}: max |diff| {diff:.3e}, max |logit| {scale:.3e}, relative {diff / scale:.2e}")
    assert diff <= REL_TOL * scale, f"{label}: max |diff| {diff:.3e} > {REL_TOL} x {scale:.3e}"
    return diff / scale


def check_model(code, model_id: str, size: tuple[int, int], num_classes: int, tmp_path) -> None:
    class_name, head, ddcat = MODELS[model_id]
    official = build_official(code, class_name, num_classes)
    ours, variables = port_and_load(official, tmp_path)
    assert (ours.config.head, ours.config.ddcat, ours.num_classes) == (head, ddcat, num_classes)
    assert ours.config.aux  # the training-mode checkpoint carries the auxiliary head
    images = np.random.default_rng(0).random((1, *size, 3)).astype(np.float32)
    want = official_outputs(official, images, ddcat)
    from jaxseg_robust.models.dense.base import normalise

    with jax.default_matmul_precision("highest"):
        logits = jax.jit(ours.apply)(variables, jnp.asarray(images))
        x = normalise(jnp.asarray(images), ours.config.pixel_mean, ours.config.pixel_std)
        heads = jax.jit(ours.network.apply)(variables, x)
    tag = f"{model_id} {size[0]}x{size[1]} C={num_classes}"
    compare(f"{tag} eval output", logits, want["eval"])
    for name, value in heads.items():
        compare(f"{tag} head {name} (stride 8)", value, want[name])
    agreement = np.mean(np.argmax(np.asarray(logits), -1) == np.argmax(want["eval"], -1))
    print(f"{tag}: argmax agreement {agreement:.6f}")
    assert agreement >= 0.999


@pytest.mark.parametrize("size", SMALL_SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("model_id", list(MODELS))
def test_ddcat_code_models_match_at_small_sizes(ddcat_code, model_id, size, tmp_path):
    check_model(ddcat_code, model_id, size, 21, tmp_path)


@pytest.mark.parametrize("size", SMALL_SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_hszhao_semseg_pspnet_matches(semseg_code, size, tmp_path):
    check_model(semseg_code, "pspnet", size, 21, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("case", PAPER_SIZES, ids=lambda c: f"{c[0]}x{c[1]}_C{c[2]}")
@pytest.mark.parametrize("model_id", list(MODELS))
def test_ddcat_code_models_match_at_the_papers_sizes(ddcat_code, model_id, case, tmp_path):
    check_model(ddcat_code, model_id, case[:2], case[2], tmp_path)


@pytest.mark.slow
def test_hszhao_semseg_pspnet_matches_at_the_voc_size(semseg_code, tmp_path):
    check_model(semseg_code, "pspnet", (512, 682), 21, tmp_path)
