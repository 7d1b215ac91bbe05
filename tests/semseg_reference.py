"""Loading the official semantic-segmentation model code from local checkouts (parity tests).

The official repositories are not packages on PyPI and are never copied into
this project: the parity tests import them from checkouts named by
environment variables and skip cleanly without them.

* ``JAXSEG_SEMSEG_REPO``: hszhao/semseg (``model/pspnet.py``: PSPNet);
* ``JAXSEG_DDCAT_REPO``: dvlab-research/Robust-Semantic-Segmentation, the DDC-AT
  code (``model/pspnet.py``: PSPNet, DeepLabV3, PSPNet_DDCAT, DeepLabV3_DDCAT);
* ``JAXSEG_ROBUST_SEGMENTATION_REPO``: nmndeep/Robust-Segmentation (SEA-AT:
  ``semseg/models/uperforseg.py`` and ``semseg/models/backbones/convnext_orig.py``).

semseg's forward asserts ``(H - 1) % 8 == 0``, which the ECCV'24 paper's input
sizes violate. `load_semseg_models` therefore compiles ``model/pspnet.py``
with Python's optimiser flag (``compile(..., optimize=1)``, i.e. ``python -O``),
which removes ``assert`` statements and nothing else.

The Robust-Segmentation package's ``__init__`` imports its whole training stack
(timm's ViT registry, datasets); only the two model files are loaded, through
namespace stubs for ``semseg``, ``semseg.models`` and ``semseg.models.backbones``.
`build_official` / `save_official_checkpoint` / `port_and_load` make a semseg
model with seeded random weights, save it as the training scripts do and
convert it with ``python -m ports semseg`` (parity tests and
experiments/benchmarks/bench_semseg_battery.py).

``convnext_orig.py`` imports ``trunc_normal_`` and ``DropPath`` from timm; when
timm is not importable (it needs torchvision) a stand-in module provides
``torch.nn.init.trunc_normal_`` (only used to initialise weights the tests
overwrite) and a ``DropPath`` that is the identity (timm's DropPath is the
identity in eval mode, the only mode compared).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import pathlib
import sys
import types

import pytest

ENV_SEMSEG = "JAXSEG_SEMSEG_REPO"
ENV_DDCAT = "JAXSEG_DDCAT_REPO"
ENV_ROBUST_SEGMENTATION = "JAXSEG_ROBUST_SEGMENTATION_REPO"


def checkout(env: str, marker: str) -> pathlib.Path:
    """The checkout named by ``$env`` (must contain ``marker``), or pytest.skip."""
    value = os.environ.get(env)
    if not value:
        pytest.skip(f"${env} is not set (a local checkout of the official code)")
    root = pathlib.Path(value).expanduser()
    if not (root / marker).is_file():
        pytest.skip(f"${env}={root} has no {marker}")
    return root


@contextlib.contextmanager
def _isolated(prefixes: tuple[str, ...], path: pathlib.Path):
    """Puts ``path`` first on sys.path; restores sys.modules entries under ``prefixes`` afterwards."""
    def owned(name):
        return any(name == p or name.startswith(p + ".") for p in prefixes)

    saved = {k: sys.modules.pop(k) for k in list(sys.modules) if owned(k)}
    sys.path.insert(0, str(path))
    try:
        yield
    finally:
        sys.path.remove(str(path))
        for k in [k for k in sys.modules if owned(k)]:
            del sys.modules[k]
        sys.modules.update(saved)


def _exec_without_asserts(name: str, path: pathlib.Path) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__file__ = str(path)
    sys.modules[name] = module
    exec(compile(path.read_text(), str(path), "exec", optimize=1), module.__dict__)  # noqa: S102
    return module


def load_semseg_models(root: pathlib.Path) -> types.ModuleType:
    """``model/pspnet.py`` of a semseg-layout checkout, its asserts stripped (see module doc)."""
    pytest.importorskip("torch")
    with _isolated(("model",), root):
        importlib.import_module("model.resnet")
        return _exec_without_asserts("model.pspnet", root / "model" / "pspnet.py")


def _timm_stand_in() -> types.ModuleType:
    import torch  # noqa: PLC0415

    class DropPath(torch.nn.Module):
        def __init__(self, drop_prob=0.0):
            super().__init__()
            self.drop_prob = drop_prob

        def forward(self, x):
            if self.training and self.drop_prob > 0:
                raise RuntimeError("the timm stand-in only supports eval mode")
            return x

    layers = types.ModuleType("timm.models.layers")
    layers.trunc_normal_ = torch.nn.init.trunc_normal_
    layers.DropPath = DropPath
    return layers


def load_upernet_modules(root: pathlib.Path) -> tuple[types.ModuleType, types.ModuleType]:
    """(convnext_orig, uperforseg) modules of a Robust-Segmentation checkout."""
    pytest.importorskip("torch")
    try:
        importlib.import_module("timm.models.layers")
        stand_in = None
    except Exception:  # noqa: BLE001 - timm absent or broken without torchvision
        stand_in = _timm_stand_in()
    prefixes = ("semseg",) + (("timm",) if stand_in is not None else ())
    with _isolated(prefixes, root):
        if stand_in is not None:
            for name in ("timm", "timm.models"):
                sys.modules[name] = types.ModuleType(name)
            sys.modules["timm.models.layers"] = stand_in
        for name in ("semseg", "semseg.models", "semseg.models.backbones"):
            stub = types.ModuleType(name)
            stub.__path__ = [str(root.joinpath(*name.split(".")))]
            sys.modules[name] = stub
        convnext = importlib.import_module("semseg.models.backbones.convnext_orig")
        sys.modules["semseg.models.backbones"].ConvNeXt = convnext.ConvNeXt
        uper = importlib.import_module("semseg.models.uperforseg")
    return convnext, uper


# ---- semseg models with random weights in the released checkpoint format ----------------

def _randomise(model, seed: int) -> None:
    """Random BatchNorm affine parameters and running statistics (eval-mode BN is exercised)."""
    import torch  # noqa: PLC0415

    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.weight.uniform_(0.5, 1.5, generator=generator)
                m.bias.uniform_(-0.2, 0.2, generator=generator)
                m.running_mean.normal_(0.0, 0.2, generator=generator)
                m.running_var.uniform_(0.5, 1.5, generator=generator)
                m.num_batches_tracked.fill_(1000)


def build_official(code, class_name: str, num_classes: int, seed: int = 0):
    """The official model (built in training mode, as the training scripts do), then eval()."""
    import torch  # noqa: PLC0415

    torch.manual_seed(seed)
    model = getattr(code, class_name)(layers=50, classes=num_classes, zoom_factor=8, pretrained=False)
    _randomise(model, seed + 1)
    return model.eval()


def save_official_checkpoint(model, path) -> None:
    """semseg's training checkpoint: DataParallel keys under "state_dict", plus epoch and optimizer."""
    import torch  # noqa: PLC0415

    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
    state = {"module." + k: v for k, v in model.state_dict().items()}
    torch.save({"epoch": 50, "state_dict": state, "optimizer": optimizer.state_dict()}, path)


def port_and_load(model, tmp_path):
    """Saves ``model`` in the released format, runs ``python -m ports semseg``, loads the result."""
    import jax  # noqa: PLC0415
    import jax.numpy as jnp  # noqa: PLC0415

    from jaxseg_robust.models import dense  # noqa: PLC0415
    from ports.__main__ import main  # noqa: PLC0415

    checkpoint, out = tmp_path / "train_epoch_50.pth", tmp_path / "converted"
    save_official_checkpoint(model, checkpoint)
    if main(["semseg", "--checkpoint", str(checkpoint), "--out", str(out)]) != 0:
        raise RuntimeError(f"python -m ports semseg failed on {checkpoint}")
    ours, variables = dense.load_converted(out)
    return ours, jax.tree.map(jnp.asarray, variables)
