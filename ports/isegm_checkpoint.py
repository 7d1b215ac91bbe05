"""Reading isegm-style checkpoints (RITM, SimpleClick, CFR-ICL) without running pickled code.

The authors save ``{"state_dict": net.state_dict(), "config": net._config}``
(isegm ``save_checkpoint``). The config is the model's constructor arguments
as recorded by isegm's ``@serialize``: ``{"class": "isegm.model....HRNetModel",
"params": {name: {"type": "builtin" | "class", "value": ..., "specified": bool}}}``.
RITM's values are plain data; SimpleClick's ``head_params`` also holds a
pickled library object (``loss_decode=CrossEntropyLoss()``, an ``nn.Module``);
AdaptiveClick's one ``cfg`` is an ``easydict.EasyDict`` holding ``pathlib``
paths and a ``torch.device``.

`load_isegm_checkpoint` reads such a file with ``torch.load`` and a
restricted unpickler (`restricted_pickle`):

* torch's own tensor-rebuilding globals (the allow-list of torch's
  ``weights_only`` loader), ``collections.OrderedDict``, ``builtins.set`` and
  numpy scalars are resolved to the real, side-effect-free objects;
* globals of the authors' libraries (``isegm.*``, ``torch.nn.*``, ``mmcv.*``,
  ``mmseg.*``, ``easydict.*``, ``fvcore.*``, ``yacs.*``) and ``pathlib``'s path
  classes become inert `OpaqueObject` stand-ins: calling or instantiating one
  only records its arguments, state and items (a dict subclass such as
  ``EasyDict`` pickles its items; `opaque_mapping` reads them back as a plain
  dict), nothing of theirs is imported or run;
* any other global (``os.system``, ``builtins.eval``, ...) is refused with
  `UnsafeCheckpointError` naming it: such a checkpoint would need code
  execution.

Only ``state_dict`` tensors and plain config values are used afterwards.
"""

from __future__ import annotations

import _compat_pickle
import os
import pickle
import re
import types
from collections.abc import Mapping
from typing import Any

import numpy as np

from ports.keytable import PortError, Rule, conv, linear

# Module prefixes whose objects may appear in a config as inert stand-ins.
INERT_PREFIXES = ("isegm.", "torch.nn.", "mmcv.", "mmseg.", "easydict.", "fvcore.", "yacs.", "pathlib.")
INERT_MODULES = ("isegm", "easydict", "pathlib")
# Plain, side-effect-free constructors resolved to the real objects.
_PLAIN_GLOBALS = {
    ("collections", "OrderedDict"), ("builtins", "set"), ("builtins", "frozenset"),
    ("builtins", "slice"), ("builtins", "complex"),
    ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar"),
    ("numpy", "dtype"),
}


class UnsafeCheckpointError(PortError):
    """A checkpoint's pickle refers to code outside the allow-list (it would need execution)."""


class OpaqueObject:
    """Inert stand-in for an object of the authors' libraries found in a pickled config.

    Attributes:
      qualname: "module.name" of the pickled global.
      args: positional arguments it was called with (REDUCE / NEWOBJ), if any.
      state: the state the pickle set on it (BUILD), if any.
      mapping: the items the pickle set on it (SETITEMS of a pickled dict subclass), if any.
    """

    qualname = "<opaque>"

    def __init__(self, *args, **kwargs):
        self.args = args
        self.kwargs = kwargs
        self.state = None
        self.mapping = {}

    def __setstate__(self, state):
        self.state = state

    def __setitem__(self, key, value):
        """A pickled dict subclass's items (SETITEMS) are recorded, not interpreted."""
        self.mapping[key] = value

    def __repr__(self) -> str:
        return f"OpaqueObject({self.qualname})"


def _opaque_class(qualname: str) -> type:
    """A fresh `OpaqueObject` subclass recording ``qualname`` (nothing is imported)."""
    return type("Opaque", (OpaqueObject,), {"qualname": qualname, "__new__": _new_opaque})


def _new_opaque(cls, *args, **kwargs):
    """``cls.__new__`` of a stand-in: an empty record (pickle's NEWOBJ does not call ``__init__``)."""
    obj = object.__new__(cls)
    OpaqueObject.__init__(obj, *args, **kwargs)
    return obj


def _torch_allowed_globals() -> dict:
    """torch's own ``weights_only`` allow-list ("module.name" -> object)."""
    try:
        from torch import _weights_only_unpickler as wou  # noqa: PLC0415

        return dict(wou._get_allowed_globals())
    except Exception:  # pragma: no cover - older/newer torch: a minimal list
        import torch  # noqa: PLC0415

        return {"torch._utils._rebuild_tensor_v2": torch._utils._rebuild_tensor_v2,
                "torch._utils._rebuild_parameter": torch._utils._rebuild_parameter,
                "torch.Size": torch.Size, "collections.OrderedDict": __import__(
                    "collections").OrderedDict}


class RestrictedUnpickler(pickle.Unpickler):
    """``pickle.Unpickler`` that resolves only allow-listed globals (see the module docstring)."""

    _torch_globals: dict | None = None

    def find_class(self, module: str, name: str):
        if RestrictedUnpickler._torch_globals is None:
            RestrictedUnpickler._torch_globals = _torch_allowed_globals()
        if (module, name) in _compat_pickle.NAME_MAPPING:  # Python 2 names (pickle protocol 2)
            module, name = _compat_pickle.NAME_MAPPING[(module, name)]
        module = _compat_pickle.IMPORT_MAPPING.get(module, module)
        qualname = f"{module}.{name}"
        if qualname in RestrictedUnpickler._torch_globals:
            return RestrictedUnpickler._torch_globals[qualname]
        if (module, name) in _PLAIN_GLOBALS:
            return super().find_class(module, name)
        if module.startswith(INERT_PREFIXES) or module in INERT_MODULES:
            return _opaque_class(qualname)
        raise UnsafeCheckpointError(
            f"the checkpoint's pickle refers to '{qualname}', which is not on the allow-list of "
            f"tensor data, plain values and the authors' libraries; loading it would need code "
            f"execution, so it is refused")


# A module object usable as ``torch.load(pickle_module=...)``.
restricted_pickle = types.ModuleType("restricted_pickle")
restricted_pickle.Unpickler = RestrictedUnpickler
restricted_pickle.load = lambda f, **kw: RestrictedUnpickler(f, **kw).load()
restricted_pickle.__name__ = "restricted_pickle"


def load_isegm_checkpoint(path: str | os.PathLike) -> tuple[dict[str, np.ndarray], dict]:
    """Reads an isegm checkpoint safely.

    Args:
      path: the ``.pth`` file.

    Returns:
      (state dict {key: numpy array}, config {"class": str, "params": {name: value}})
      with the ``type``/``specified`` wrappers of isegm's config removed.

    Raises:
      FileNotFoundError: no such file.
      UnsafeCheckpointError: the pickle needs code outside the allow-list.
      PortError: not an isegm checkpoint (no state_dict/config, several models, ...).
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"checkpoint not found: {path}")
    import torch  # noqa: PLC0415

    try:
        obj = torch.load(path, map_location="cpu", pickle_module=restricted_pickle,
                         weights_only=False)
    except UnsafeCheckpointError as err:
        raise UnsafeCheckpointError(f"{path}: {err}") from None
    except Exception as err:  # torch raises many types for corrupt files
        raise PortError(f"{path}: not a readable PyTorch checkpoint (corrupt or truncated "
                        f"file?): {type(err).__name__}: {err}") from None
    if isinstance(obj, list):
        raise PortError(f"{path}: holds {len(obj)} models (a multi-stage isegm checkpoint); "
                        f"only single-model checkpoints are supported")
    if not isinstance(obj, Mapping) or "state_dict" not in obj or "config" not in obj:
        keys = sorted(obj) if isinstance(obj, Mapping) else type(obj).__name__
        raise PortError(f"{path}: not an isegm checkpoint: expected a dict with 'state_dict' "
                        f"and 'config' (isegm save_checkpoint); got {keys}")
    return _state_dict_arrays(obj["state_dict"], path), _plain_config(obj["config"], path)


def _state_dict_arrays(state_dict: Any, path: str) -> dict[str, np.ndarray]:
    """{key: tensor} -> {key: numpy array} (floats as float32)."""
    import torch  # noqa: PLC0415

    if not isinstance(state_dict, Mapping):
        raise PortError(f"{path}: 'state_dict' is a {type(state_dict).__name__}, not a mapping")
    out = {}
    for key, value in state_dict.items():
        if not isinstance(value, torch.Tensor):
            raise PortError(f"{path}: state_dict entry '{key}' is a {type(value).__name__}, "
                            f"not a tensor")
        value = value.detach().to("cpu")
        out[str(key)] = value.float().numpy() if value.is_floating_point() else value.numpy()
    if not out:
        raise PortError(f"{path}: the state_dict holds no tensors")
    return out


def _plain_config(config: Any, path: str) -> dict:
    """isegm's serialized config -> {"class": str, "params": {name: value}}."""
    if not isinstance(config, Mapping) or "class" not in config or "params" not in config:
        raise PortError(f"{path}: 'config' is not an isegm model config (needs 'class' and "
                        f"'params')")
    params = {}
    for name, entry in dict(config["params"]).items():
        if not isinstance(entry, Mapping) or "value" not in entry:
            raise PortError(f"{path}: config parameter '{name}' has no 'value'")
        params[str(name)] = entry["value"]
    return {"class": str(config["class"]), "params": params}


def opaque_mapping(value: Any) -> Any:
    """A config value with its pickled dict subclasses (`OpaqueObject` with items, e.g. ``EasyDict``)
    turned into plain dicts, recursively; other stand-ins and plain values as they are."""
    if isinstance(value, OpaqueObject) and value.mapping:
        return {k: opaque_mapping(v) for k, v in value.mapping.items()}
    if isinstance(value, Mapping):
        return {k: opaque_mapping(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(opaque_mapping(v) for v in value)
    return value


def require_model_class(config: dict, expected: str, family: str, other_families: str, *, what: str) -> None:
    """Checks that the checkpoint's isegm model class (``config["class"]``) is the family's ``expected``.

    Raises:
      PortError: naming the class found and the family's; ``other_families`` says which port
        the checkpoints of the other isegm families take.
    """
    if config["class"] != expected:
        raise PortError(f"{what}: the checkpoint's model class is '{config['class']}', not "
                        f"{family}'s '{expected}' (wrong family? {other_families})")


def require_values(config: dict, expected: Mapping[str, Any], *, what: str) -> None:
    """Checks config values the port does not support changing (absent = isegm's default).

    Raises:
      PortError: naming the parameter, its value and the supported one.
    """
    for name, want in expected.items():
        if name not in config["params"]:
            continue
        got = config["params"][name]
        if isinstance(want, tuple) and isinstance(got, (list, tuple)):
            got = tuple(tuple(g) if isinstance(g, (list, tuple)) else g for g in got)
            want = tuple(tuple(w) if isinstance(w, (list, tuple)) else w for w in want)
        if got != want and not (isinstance(want, float) and isinstance(got, (int, float))
                                and float(got) == want):
            raise PortError(f"{what}: config parameter '{name}' = {got!r} is not supported "
                            f"(the port handles {want!r}, as in the released checkpoints)")


def drop_unused(state_dict: Mapping[str, np.ndarray], unused: Mapping[str, tuple[int, ...]],
                *, what: str) -> dict[str, np.ndarray]:
    """Removes keys the interactive model never reads, each checked present and shaped.

    Args:
      state_dict: key -> array.
      unused: key -> expected shape (e.g. a ViT's classification head).

    Raises:
      PortError: an unused key is missing or has another shape.
    """
    out = dict(state_dict)
    for key, shape in unused.items():
        if key not in out:
            raise PortError(f"{what}: key '{key}' is missing (truncated checkpoint or wrong "
                            f"family?)")
        if tuple(np.shape(out[key])) != tuple(shape):
            raise PortError(f"{what}: key '{key}' has shape {tuple(np.shape(out[key]))}, the "
                            f"official model has {tuple(shape)} (wrong variant?)")
        del out[key]
    return out


class PathRule(Rule):
    """A `Rule` whose target is the torch key with "." replaced by "/" (Flax paths mirror torch's)."""

    def match(self, key: str) -> str | None:
        if re.fullmatch(self.pattern, key) is None:
            return None
        return key.replace(".", "/")


def torch_layout(x: np.ndarray) -> np.ndarray:
    """torch -> our layout by rank: Conv2d [out, in, kh, kw] -> [kh, kw, in, out],
    Linear [out, in] -> [in, out]; other ranks unchanged."""
    if x.ndim == 4:
        return conv(x)
    if x.ndim == 2:
        return linear(x)
    return x
