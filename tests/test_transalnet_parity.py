"""TranSalNet_Res parity with the authors' code (LJOVO/TranSalNet), seeded random weights.

The reference is the authors' ``TranSalNet_Res.py`` (with ``utils/resnet.py`` and
``utils/TransformerEncoder.py``) imported from the checkout named by
``$JAXSEG_TRANSALNET_REPO`` (never copied into the project; skipped without it). Its
ResNet-50 is built without the ImageNet file it would load (``pretrained=False``); every
weight is then seeded random, the position embeddings and BatchNorm statistics included
(their defaults are zeros / ones), the last conv scaled up (`CONV7_GAIN`) so that the
saliency is not ~0.5 everywhere, saved with ``torch.save`` in the official state-dict
format, converted with ``ports.transalnet.port_transalnet`` and loaded with
``load_converted``. The modules the file imports but the network does not use
(``skimage``, ``pandas``) are stood in for while it is imported when they are missing.

Tolerances: the pre-sigmoid map (``conv7``) within 1e-4 of its largest magnitude and the
saliency (sigmoid) within 1e-4 absolute (its scale is 1): float32 through ~60 layers.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import pathlib
import sys
import types

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchvision")

import jax  # noqa: E402

from jaxseg_robust.models.saliency import TRANSALNET_RES, TranSalNet, load_converted  # noqa: E402
from ports.transalnet import convert_transalnet, port_transalnet  # noqa: E402
from ports.torch_checkpoint import load_state_dict  # noqa: E402

pytestmark = pytest.mark.parity

REPO_ENV = "JAXSEG_TRANSALNET_REPO"
LOGIT_TOLERANCE = 1e-4  # of the largest |logit|
SALIENCY_TOLERANCE = 1e-4  # absolute, saliency in (0, 1)
CONV7_GAIN = 200.0


def repo_path() -> pathlib.Path | None:
    """The TranSalNet checkout of ``$JAXSEG_TRANSALNET_REPO``, or None when not configured."""
    value = os.environ.get(REPO_ENV, "")
    path = pathlib.Path(value).expanduser() if value else None
    return path if path is not None and (path / "TranSalNet_Res.py").is_file() else None


@contextlib.contextmanager
def _reference_imports(repo: pathlib.Path):
    """``sys.path`` / ``sys.modules`` as the authors' top-level imports need them, restored afterwards."""
    saved = {k: v for k, v in sys.modules.items() if k == "utils" or k.startswith("utils.")}
    for name in [k for k in saved]:
        del sys.modules[name]
    stubs = [name for name in ("skimage", "pandas") if importlib.util.find_spec(name) is None]
    for name in stubs:
        module = types.ModuleType(name)
        module.io = module.transform = None
        sys.modules[name] = module
    sys.path.insert(0, str(repo))
    try:
        yield
    finally:
        sys.path.remove(str(repo))
        for name in stubs:
            sys.modules.pop(name, None)
        for name in [k for k in sys.modules if k == "utils" or k.startswith("utils.")]:
            del sys.modules[name]
        sys.modules.update(saved)


def build_reference(seed: int):
    """The authors' TranSalNet (eval mode) with seeded random weights, statistics and embeddings."""
    repo = repo_path()
    if repo is None:
        pytest.skip(f"set ${REPO_ENV} to a checkout of LJOVO/TranSalNet")
    with _reference_imports(repo):
        spec = importlib.util.spec_from_file_location("transalnet_res_reference", repo / "TranSalNet_Res.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        resnet50 = module.resnet.resnet50
        module.resnet.resnet50 = lambda pretrained=True, **kw: resnet50(pretrained=False, **kw)
        try:
            torch.manual_seed(seed)
            net = module.TranSalNet()
        finally:
            module.resnet.resnet50 = resnet50
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, tensor in net.state_dict().items():
            if name.endswith("position_embeddings"):
                tensor.copy_(0.02 * torch.randn(tensor.shape, generator=generator))
            elif name.endswith("running_mean"):
                tensor.copy_(0.1 * torch.randn(tensor.shape, generator=generator))
            elif name.endswith("running_var"):
                tensor.copy_(0.5 + torch.rand(tensor.shape, generator=generator))
            elif "batchnorm" in name or ".bn" in name or "downsample.1" in name or name.startswith("encoder.encoder.1."):
                if name.endswith("weight") or name.endswith("bias"):
                    offset = 1.0 if name.endswith("weight") else 0.0
                    tensor.copy_(offset + 0.1 * torch.randn(tensor.shape, generator=generator))
        # Default-initialised, the last conv gives logits of ~0.05 (saliency ~0.51 everywhere):
        # scaled up, the saliency spans most of (0, 1) and the comparison sees the sigmoid's range.
        net.decoder.conv7.weight.mul_(CONV7_GAIN)
    return net.eval()


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """(reference net, checkpoint path, converted config, converted variables)."""
    net = build_reference(seed=0)
    folder = tmp_path_factory.mktemp("transalnet")
    checkpoint = folder / "TranSalNet_Res.pth"
    torch.save(net.state_dict(), checkpoint)
    out = port_transalnet(checkpoint, folder / "converted")
    config, variables = load_converted(out)
    return net, checkpoint, config, variables


def _reference_outputs(net, image: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    captured = {}
    hook = net.decoder.conv7.register_forward_hook(lambda mod, inp, out: captured.setdefault("logits", out))
    try:
        with torch.no_grad():
            saliency = net(torch.from_numpy(image.transpose(0, 3, 1, 2)).float())
    finally:
        hook.remove()
    return captured["logits"][:, 0].numpy(), saliency[:, 0].numpy()


def test_saliency_matches_the_authors_network(converted):
    net, _, config, variables = converted
    assert config == TRANSALNET_RES
    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, (2, *config.input_hw, 3)).astype(np.float32) / 255.0
    ref_logits, ref_saliency = _reference_outputs(net, image)
    model = TranSalNet(config)
    saliency, state = jax.jit(lambda v, x: model.apply(
        v, x, capture_intermediates=lambda mdl, _: mdl.name == "conv7"))(variables, image)
    logits = np.asarray(state["intermediates"]["decoder"]["conv7"]["__call__"][0])[..., 0]
    scale = float(np.abs(ref_logits).max())
    logit_error = float(np.abs(logits - ref_logits).max())
    saliency_error = float(np.abs(np.asarray(saliency) - ref_saliency).max())
    print(f"TranSalNet_Res parity: logits max abs {logit_error:.3g} (scale {scale:.3g}, relative "
          f"{logit_error / scale:.3g}); saliency max abs {saliency_error:.3g}; saliency range "
          f"[{ref_saliency.min():.3g}, {ref_saliency.max():.3g}], std {ref_saliency.std():.3g}")
    assert ref_saliency.std() > 0.01 and ref_saliency.max() - ref_saliency.min() > 0.3, \
        "the random weights must not saturate the sigmoid (the comparison would be vacuous)"
    assert logit_error <= LOGIT_TOLERANCE * scale
    assert saliency_error <= SALIENCY_TOLERANCE


def test_official_state_dict_keys_all_convert(converted):
    net, checkpoint, config, variables = converted
    state_dict = load_state_dict(checkpoint)
    assert set(state_dict) == set(net.state_dict())
    again = convert_transalnet(state_dict, config)
    jax.tree.map(np.testing.assert_array_equal, again, jax.tree.map(np.asarray, variables))
