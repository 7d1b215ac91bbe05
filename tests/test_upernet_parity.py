"""Parity of the UPerNet-ConvNeXt (CvSt) port with Robust-Segmentation's code (``-m parity``).

The official ``UperNetForSemanticSegmentation`` (loaded from
``$JAXSEG_ROBUST_SEGMENTATION_REPO``, see tests/semseg_reference.py; skipped
without it) is built for ConvNeXt-T and -S with the convolutional stem, with
seeded random weights and randomised LayerNorm / BatchNorm parameters and
statistics, saved as its training script saves it (``model.module.state_dict()``:
a bare state dict), converted with ``python -m ports upernet`` and loaded with
``dense.load_converted``. Both take plain [0, 1] images (no normalisation, as
the SEA-AT code). Compared: the evaluation logits (main head, upsampled with
``align_corners=False``) and the auxiliary FCN head (reached through the
official training-mode call ``model(x, lbl)`` is not possible in eval mode, so
the official ``auxiliary_head`` module is applied to the official backbone
features).

Also: the ``normalize_model`` wrapper of the same code base (``normalize.mean``
/ ``normalize.std`` + ``model.``) ports to a model that normalises identically.

Tolerance: max |diff| <= ``REL_TOL`` x max |official logit| (float32 through
18 / 36 ConvNeXt blocks with exact-erf GELU and two-pass LayerNorms).
Sizes: a small odd one in the parity selection; the paper's PASCAL VOC size
(shorter side 512: 512 x 682) under ``slow``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from semseg_reference import ENV_ROBUST_SEGMENTATION, checkout, load_upernet_modules
from test_semseg_parity import compare

pytestmark = pytest.mark.parity
torch = pytest.importorskip("torch")

REL_TOL = 1e-4
SIZES = {"tiny": ("T_CVST",), "small": ("S_CVST", "S_CVST_ROB")}  # the checkout's names for the variants


@pytest.fixture(scope="module")
def upernet_code():
    root = checkout(ENV_ROBUST_SEGMENTATION, "semseg/models/uperforseg.py")
    return load_upernet_modules(root)


def _variant_key(convnext, size: str) -> str:
    for key in SIZES[size]:
        if key in convnext.CONVNEXT_SETTINGS:
            return key
    pytest.skip(f"the checkout's CONVNEXT_SETTINGS has none of {SIZES[size]}")


def build_official(upernet_code, size: str, num_classes: int = 21, seed: int = 0):
    """``UperNetForSemanticSegmentation('ConvNeXt-<variant>', C, None)`` with random norms, eval()."""
    convnext, uper = upernet_code
    torch.manual_seed(seed)
    model = uper.UperNetForSemanticSegmentation(f"ConvNeXt-{_variant_key(convnext, size)}", num_classes, None)
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("gamma"):
                p.uniform_(0.5, 1.5, generator=generator)  # layer scale (checkpoints: learnt values)
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.normal_(0.0, 0.2, generator=generator)
                m.running_var.uniform_(0.5, 1.5, generator=generator)
                m.num_batches_tracked.fill_(1000)
            if isinstance(m, (torch.nn.BatchNorm2d, convnext.LayerNorm, torch.nn.LayerNorm)):
                m.weight.uniform_(0.5, 1.5, generator=generator)
                m.bias.uniform_(-0.2, 0.2, generator=generator)
            if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear)) and m.bias is not None:
                m.bias.uniform_(-0.1, 0.1, generator=generator)
    return model.eval()


def port_and_load(state_dict, tmp_path, name: str = "model_ckpt.pth"):
    from jaxseg_robust.models import dense
    from ports.__main__ import main

    checkpoint, out = tmp_path / name, tmp_path / (name + ".converted")
    torch.save(state_dict, checkpoint)
    assert main(["upernet", "--checkpoint", str(checkpoint), "--out", str(out)]) == 0
    ours, variables = dense.load_converted(out)
    return ours, jax.tree.map(jnp.asarray, variables)


def official_outputs(model, images: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(eval logits at input size, aux head logits at stride 16), NHWC."""
    x = torch.from_numpy(images.transpose(0, 3, 1, 2).copy())
    with torch.no_grad():
        main = model(x)
        aux = model.auxiliary_head(model.backbone(x))
    return main.numpy().transpose(0, 2, 3, 1), aux.numpy().transpose(0, 2, 3, 1)


def check(upernet_code, size: str, hw: tuple[int, int], tmp_path) -> None:
    official = build_official(upernet_code, size)
    ours, variables = port_and_load(official.state_dict(), tmp_path)
    depths = {"tiny": (3, 3, 9, 3), "small": (3, 3, 27, 3)}[size]
    assert ours.config.depths == depths and ours.config.stem == "conv" and ours.config.pixel_mean is None
    images = np.random.default_rng(0).random((1, *hw, 3)).astype(np.float32)
    want_main, want_aux = official_outputs(official, images)
    with jax.default_matmul_precision("highest"):
        main = jax.jit(ours.apply)(variables, jnp.asarray(images))
        _, aux = jax.jit(lambda v, x: ours.network.apply(v, x, True))(variables, jnp.asarray(images))
    tag = f"UPerNet-ConvNeXt-{size} CvSt {hw[0]}x{hw[1]}"
    compare(f"{tag} eval output", main, want_main)
    compare(f"{tag} auxiliary head (stride 16)", aux, want_aux)
    agreement = np.mean(np.argmax(np.asarray(main), -1) == np.argmax(want_main, -1))
    print(f"{tag}: argmax agreement {agreement:.6f}")
    assert agreement >= 0.999


@pytest.mark.parametrize("size", ["tiny", "small"])
def test_upernet_convnext_matches_at_a_small_size(upernet_code, size, tmp_path):
    check(upernet_code, size, (75, 101), tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("hw", [(512, 682)], ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("size", ["tiny", "small"])
def test_upernet_convnext_matches_at_the_papers_sizes(upernet_code, size, hw, tmp_path):
    check(upernet_code, size, hw, tmp_path)


def test_normalising_wrapper_ports_to_the_same_normalisation(upernet_code, tmp_path):
    official = build_official(upernet_code, "tiny")
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    wrapped = {"normalize.mean": torch.tensor(mean).view(1, 3, 1, 1),
               "normalize.std": torch.tensor(std).view(1, 3, 1, 1),
               **{"model." + k: v for k, v in official.state_dict().items()}}
    ours, variables = port_and_load(wrapped, tmp_path, "wrapped.pth")
    np.testing.assert_allclose(ours.config.pixel_mean, mean, rtol=1e-6)
    np.testing.assert_allclose(ours.config.pixel_std, std, rtol=1e-6)
    images = np.random.default_rng(1).random((1, 41, 57, 3)).astype(np.float32)
    normalised = (images - np.array(mean, np.float32)) / np.array(std, np.float32)
    want, _ = official_outputs(official, normalised)
    with jax.default_matmul_precision("highest"):
        got = jax.jit(ours.apply)(variables, jnp.asarray(images))
    compare("UPerNet-ConvNeXt-tiny with a normalising wrapper 41x57", got, want)
