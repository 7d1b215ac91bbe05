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
            if not tensor.is_floating_point():
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
