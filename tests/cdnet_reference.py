"""The authors' ClickSEG code (CDNet and its isegm ResNet / DeepLabV3+), for parity tests.

``$JAXSEG_CDNET_REPO`` names a checkout of XavierCHEN34/ClickSEG (the folder
holding ``isegm/``), never copied into the project. `load_source_module` loads
one of its files as a stand-alone module (``resnetv1b.py`` imports only torch),
so the backbone parity needs none of the package's other imports.
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import types

import numpy as np

REPO_ENV = "JAXSEG_CDNET_REPO"
# The papers' CDNet zoom-in: emb-ai/rclicks ``isegm/isegm/inference/transforms/zoom_in_gpcis.py``, the same file
# as the GPCIS authors' ``isegm/inference/transforms/zoom_in.py`` (zmhhmz/GPCIS_CVPR2023; tests/gpcis_reference.py).
ZOOM_IN_SOURCES = (("JAXSEG_RCLICKS_REPO", "isegm/isegm/inference/transforms/zoom_in_gpcis.py"),
                   ("JAXSEG_GPCIS_REPO", "isegm/inference/transforms/zoom_in.py"))


def repo_path() -> pathlib.Path | None:
    """The ClickSEG checkout named by ``$JAXSEG_CDNET_REPO``, or None when not configured."""
    value = os.environ.get(REPO_ENV, "")
    if not value:
        return None
    path = pathlib.Path(value).expanduser()
    return path if (path / "isegm" / "model" / "modeling" / "resnetv1b.py").is_file() else None


def load_source_module(relative: str) -> types.ModuleType:
    """The checkout's file ``relative`` (e.g. "isegm/model/modeling/resnetv1b.py") as a module."""
    path = repo_path()
    if path is None:
        raise RuntimeError(f"${REPO_ENV} does not name a ClickSEG checkout")
    name = "clickseg_ref_" + relative.replace("/", "_").removesuffix(".py")
    spec = importlib.util.spec_from_file_location(name, path / relative)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def zoom_in_path() -> pathlib.Path | None:
    """The papers' ``zoom_in_gpcis.py`` from ``$JAXSEG_RCLICKS_REPO`` (an emb-ai/rclicks checkout) or, the same
    file, GPCIS's ``zoom_in.py`` from ``$JAXSEG_GPCIS_REPO``; None when neither is configured."""
    for env, relative in ZOOM_IN_SOURCES:
        value = os.environ.get(env, "")
        if value and (pathlib.Path(value).expanduser() / relative).is_file():
            return pathlib.Path(value).expanduser() / relative
    return None


def load_zoom_in():
    """The ``ZoomIn`` class of `zoom_in_path`, loaded inside the ClickSEG checkout's ``isegm`` package (call
    `import_isegm` first): it imports ``isegm.inference.clicker``, ``isegm.utils.misc`` (whose bbox helpers
    are the same in ClickSEG, GPCIS and rclicks) and the transforms' ``base``."""
    path = zoom_in_path()
    if path is None:
        raise RuntimeError("neither $JAXSEG_RCLICKS_REPO nor $JAXSEG_GPCIS_REPO names a checkout with the zoom-in")
    name = "isegm.inference.transforms.zoom_in_gpcis"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.ZoomIn


def randomise_(module, seed: int) -> None:
    """Seeded random values in every parameter and BatchNorm statistic of a torch module (in place).

    Conv / linear weights N(0, 1/fan_in), norm scales 1 + 0.1 N, biases and
    running means 0.1 N, running variances U(0.5, 1.5): every layer's output
    stays of order one through a deep ResNet.
    """
    import torch  # noqa: PLC0415

    rng = np.random.default_rng(seed)
    with torch.no_grad():
        for name, tensor in sorted(module.state_dict().items()):
            if not tensor.is_floating_point() or name.endswith(".kernel"):  # PDM's constant shift kernels
                continue
            shape = tuple(tensor.shape)
            leaf = name.rsplit(".", 1)[-1]
            if leaf == "running_var":
                value = rng.uniform(0.5, 1.5, shape)
            elif leaf in ("running_mean", "bias"):
                value = 0.1 * rng.standard_normal(shape)
            elif leaf == "weight" and len(shape) == 1:
                value = 1.0 + 0.1 * rng.standard_normal(shape)
            elif len(shape) > 1:
                value = rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))
            else:
                value = rng.standard_normal(shape)
            tensor.copy_(torch.from_numpy(np.asarray(value, np.float32)))


def import_isegm():
    """The checkout's ``isegm`` package on ``sys.path``, after tests/isegm_reference.py's stand-ins for
    libraries it imports but CDNet does not use (``termcolor``, imported by FDM.py for a print helper,
    gets one too, and ``skimage.measure``, imported by FocalClick's crop helpers). Returns (DeeplabModel, DiffisionPredictor, Click)."""
    import sys  # noqa: PLC0415

    path = repo_path()
    if path is None:
        raise RuntimeError(f"${REPO_ENV} does not name a ClickSEG checkout")
    from isegm_reference import _datasets_stub, install_stubs  # noqa: PLC0415

    install_stubs()
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))
    try:
        import termcolor  # noqa: F401, PLC0415
    except ImportError:
        sys.modules["termcolor"] = types.SimpleNamespace(cprint=print)
    try:
        import skimage.measure  # noqa: F401, PLC0415
    except ImportError:  # FocalClick's crop helpers (imported by the predictors package) only
        sys.modules["skimage"] = types.ModuleType("skimage")
        sys.modules["skimage.measure"] = types.SimpleNamespace(label=None)
    import isegm.data  # noqa: F401, PLC0415  (the real package, before its datasets stub)
    _datasets_stub()
    from isegm.inference.clicker import Click  # noqa: PLC0415
    # predictors/cdnet.py on its own: the package's __init__ imports every other family's predictor.
    DiffisionPredictor = load_source_module("isegm/inference/predictors/cdnet.py").DiffisionPredictor
    from isegm.model.is_deeplab_model import DeeplabModel  # noqa: PLC0415

    return DeeplabModel, DiffisionPredictor, Click


def release_model(DeeplabModel, seed: int):
    """ClickSEG's ``cdnet_res34_cclvs`` / ``_sbd`` network (their ``init_model``) with seeded random weights,
    in eval mode."""
    import torch.nn as nn  # noqa: PLC0415

    model = DeeplabModel(backbone="resnet34", deeplab_ch=128, aspp_dropout=0.20, use_leaky_relu=True,
                         use_rgb_conv=False, use_disks=True, norm_radius=5, with_prev_mask=False,
                         norm_layer=nn.BatchNorm2d)
    randomise_(model, seed)
    return model.eval()
