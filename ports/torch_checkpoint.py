"""Reading official PyTorch checkpoints safely (torch is an optional extra).

Checkpoints are read with ``torch.load(weights_only=True)``: no arbitrary code
from a pickle runs. The result is a flat ``{key: float32/any numpy array}``.
"""

from __future__ import annotations

import os
from typing import Mapping

import numpy as np

from ports.keytable import PortError

# Key suffix of a torch BatchNorm's step counter (kept in state dicts, unused at inference).
BATCHNORM_COUNTER_SUFFIX = ".num_batches_tracked"
# Wrapper keys under which some training codes nest the state dict.
_NESTED_KEYS = ("model", "state_dict", "model_state_dict")


def _import_torch():
    try:
        import torch  # noqa: PLC0415  (optional dependency)
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError(
            "Converting PyTorch checkpoints needs torch: pip install 'jaxseg_robust[port]'"
        ) from err
    return torch


def load_state_dict(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Loads a ``.pth``/``.pt`` checkpoint as ``{key: numpy array}``.

    Accepts a bare state dict or one nested under ``model``/``state_dict``.

    Raises:
      FileNotFoundError: the path does not exist.
      PortError: the file is not a readable torch checkpoint (corrupt,
        truncated, or it needs arbitrary code to unpickle), or holds no tensors.
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"checkpoint not found: {path}")
    torch = _import_torch()
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises many types for corrupt files
        raise PortError(f"{path}: not a readable PyTorch checkpoint "
                        f"(corrupt or truncated file?): {type(err).__name__}: {err}") from None
    if isinstance(obj, Mapping):
        for nested in _NESTED_KEYS:
            if nested in obj and isinstance(obj[nested], Mapping):
                obj = obj[nested]
                break
    if not isinstance(obj, Mapping):
        raise PortError(f"{path}: expected a state dict (mapping of tensors), got {type(obj).__name__}")
    out = {}
    for key, value in obj.items():
        if not isinstance(value, torch.Tensor):
            raise PortError(f"{path}: entry '{key}' is a {type(value).__name__}, not a tensor")
        out[str(key)] = value.detach().to("cpu").float().numpy() if value.is_floating_point() \
            else value.detach().to("cpu").numpy()
    if not out:
        raise PortError(f"{path}: the checkpoint holds no tensors")
    return out


def drop_batchnorm_counters(state_dict: Mapping[str, np.ndarray], *,
                            what: str = "checkpoint") -> dict[str, np.ndarray]:
    """Validates and removes every ``<bn>.num_batches_tracked`` (unused at inference).

    Each counter must be an integer scalar of a module that also has
    ``running_mean`` and ``running_var``, and every module with running
    statistics must have its counter. Running variances must be >= 0.

    Raises:
      PortError: naming the offending key.
    """
    out: dict[str, np.ndarray] = {}
    counters: set[str] = set()
    for key, value in state_dict.items():
        if key.endswith(BATCHNORM_COUNTER_SUFFIX):
            module = key[: -len(BATCHNORM_COUNTER_SUFFIX)]
            missing = [s for s in ("running_mean", "running_var")
                       if f"{module}.{s}" not in state_dict]
            if missing:
                raise PortError(f"{what}: '{key}' is a BatchNorm counter, but '{module}' has no "
                                f"{' / '.join(missing)}")
            array = np.asarray(value)
            if array.ndim != 0 or not np.issubdtype(array.dtype, np.integer):
                raise PortError(f"{what}: '{key}' must be an integer scalar; got dtype "
                                f"{array.dtype}, shape {array.shape}")
            counters.add(module)
            continue
        out[key] = value
    for key, value in out.items():
        if key.endswith(".running_var"):
            module = key[: -len(".running_var")]
            if module not in counters:
                raise PortError(f"{what}: BatchNorm '{module}' has no '{module}{BATCHNORM_COUNTER_SUFFIX}'")
            if np.any(np.asarray(value) < 0):
                raise PortError(f"{what}: '{key}' has negative running variances")
    return out


def strip_wrapper_prefix(state_dict: Mapping[str, np.ndarray], prefix: str = "module.", *,
                         what: str = "checkpoint") -> dict[str, np.ndarray]:
    """Removes a (Distributed)DataParallel ``module.`` prefix that every key carries.

    A state dict where no key has the prefix is returned unchanged; one where
    only some keys have it is rejected (a merge of two models?).

    Raises:
      PortError: naming a key with and a key without the prefix.
    """
    keys = list(state_dict)
    with_prefix = [k for k in keys if k.startswith(prefix)]
    if not with_prefix:
        return dict(state_dict)
    if len(with_prefix) != len(keys):
        without = next(k for k in keys if not k.startswith(prefix))
        raise PortError(f"{what}: key '{with_prefix[0]}' carries the wrapper prefix '{prefix}' but "
                        f"'{without}' does not")
    return {k[len(prefix):]: v for k, v in state_dict.items()}
