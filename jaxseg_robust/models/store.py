"""Converted-model directories: orbax parameters plus a JSON config.

Layout of a model directory::

    DIR/config.json   {"format_version", "family", "variant", "config": {...},
                       "source": {"path", "sha256", "bytes"} | null,
                       "jaxseg_robust_version"}
    DIR/params/       orbax-checkpoint (StandardCheckpointer) of the param pytree
    DIR/params.npz    or, instead of params/: one NumPy ``.npz`` archive with one
                      array per parameter, keyed by its "/"-joined path
                      (`save_npz`; small models shipped as package data: one
                      plain file, readable without orbax)

Nothing here needs torch. `load` returns numpy arrays; the caller checks them
against the model it builds from the config (see `check_tree`).
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import sys
from typing import Any, Callable, Mapping

import numpy as np
from flax import traverse_util

from jaxseg_robust.hashing import file_sha256

FORMAT_VERSION = 1
CONFIG_FILE = "config.json"
PARAMS_DIR = "params"
PARAMS_NPZ = "params.npz"


class StoreError(ValueError):
    """A model directory is missing, incomplete or does not match its model."""


def _checkpointer():
    import orbax.checkpoint as ocp  # noqa: PLC0415  (heavy import, only when used)

    return ocp.StandardCheckpointer()


def save(out_dir: str | os.PathLike, params: Mapping, *, family: str, variant: str,
         config: Mapping[str, Any], source_path: str | os.PathLike | None = None,
         overwrite: bool = False) -> str:
    """Writes ``params`` (orbax) and config.json into ``out_dir``.

    Args:
      out_dir: target directory (created; must not hold a model unless ``overwrite``).
      params: nested dict of float arrays.
      family, variant: model family ("sam", ...) and variant ("vit_b", ...).
      config: the JSON-representable model config (``SamConfig.to_dict()``).
      source_path: the checkpoint converted from; its SHA-256 and size are recorded.
      overwrite: replace an existing model (its params/, params.npz and config.json only).

    Returns:
      The absolute output directory.

    Raises:
      StoreError: ``out_dir`` already holds a model and ``overwrite`` is False,
        or it is a file.
    """
    out = _empty_model_directory(out_dir, overwrite)
    source = None
    if source_path is not None:
        source = {"path": os.fspath(source_path), "sha256": file_sha256(source_path),
                  "bytes": os.path.getsize(source_path)}
    ckptr = _checkpointer()
    ckptr.save(out / PARAMS_DIR, traverse_util.unflatten_dict(_float32_leaves(params), sep="/"))
    ckptr.wait_until_finished()
    _write_meta(out, family, variant, config, source)  # config.json appears only once the params are complete
    return os.fspath(out)


def _empty_model_directory(out_dir: str | os.PathLike, overwrite: bool) -> pathlib.Path:
    """The absolute ``out_dir``, created, holding none of a model's files (params/, params.npz,
    config.json): an existing model is removed only with ``overwrite``, else StoreError."""
    out = pathlib.Path(out_dir).expanduser().resolve()
    if out.exists() and not out.is_dir():
        raise StoreError(f"--out {out} exists and is not a directory")
    params_dir, npz, config_file = out / PARAMS_DIR, out / PARAMS_NPZ, out / CONFIG_FILE
    if params_dir.exists() or npz.exists() or config_file.exists():
        if not overwrite:
            raise StoreError(f"{out} already holds a converted model (pass overwrite / --overwrite "
                             f"to replace it)")
        shutil.rmtree(params_dir, ignore_errors=True)
        npz.unlink(missing_ok=True)
        config_file.unlink(missing_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    return out


def _float32_leaves(params: Mapping) -> dict[str, np.ndarray]:
    """The param tree's leaves as float32 numpy arrays, keyed by their "/"-joined paths."""
    return {k: np.asarray(v, np.float32) for k, v in traverse_util.flatten_dict(dict(params), sep="/").items()}


def _write_meta(out: pathlib.Path, family: str, variant: str, config: Mapping[str, Any],
                source: dict | None) -> None:
    from jaxseg_robust import __version__  # noqa: PLC0415

    meta = {"format_version": FORMAT_VERSION, "family": family, "variant": variant,
            "config": dict(config), "source": source, "jaxseg_robust_version": __version__}
    tmp = out / (CONFIG_FILE + ".tmp")
    tmp.write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    tmp.replace(out / CONFIG_FILE)


def save_npz(out_dir: str | os.PathLike, params: Mapping, *, family: str, variant: str,
             config: Mapping[str, Any], overwrite: bool = False) -> str:
    """Writes ``params`` as DIR/params.npz (float32, one array per "/"-joined path) and config.json.

    The single-file alternative to `save` for small models shipped as package
    data (no orbax directory tree, no orbax import to read it back); returns and
    raises as `save` does.
    """
    out = _empty_model_directory(out_dir, overwrite)
    tmp = out / (PARAMS_NPZ + ".tmp")
    with open(tmp, "wb") as f:
        np.savez_compressed(f, **_float32_leaves(params))
    tmp.replace(out / PARAMS_NPZ)
    _write_meta(out, family, variant, config, None)
    return os.fspath(out)


def read_meta(model_dir: str | os.PathLike) -> dict:
    """Reads and validates DIR/config.json.

    Raises:
      StoreError: no such directory, no/invalid config.json, missing fields,
        or an unsupported format version.
    """
    d = pathlib.Path(model_dir).expanduser()
    if not d.is_dir():
        raise StoreError(f"model directory not found: {d}")
    path = d / CONFIG_FILE
    if not path.is_file():
        raise StoreError(f"{d} is not a converted model directory: {CONFIG_FILE} is missing "
                         f"(convert a checkpoint with: python -m ports <family> --checkpoint "
                         f"X.pth --out {d})")
    try:
        meta = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise StoreError(f"{path}: invalid JSON: {err}") from None
    missing = [k for k in ("format_version", "family", "variant", "config") if k not in meta]
    if missing:
        raise StoreError(f"{path}: missing field(s) {missing}")
    if meta["format_version"] != FORMAT_VERSION:
        raise StoreError(f"{path}: format_version {meta['format_version']} is not supported "
                         f"(this version reads {FORMAT_VERSION})")
    return meta


def load(model_dir: str | os.PathLike) -> tuple[dict, dict]:
    """Loads a model directory.

    Returns:
      (params nested dict of float32 numpy arrays, meta dict from config.json).

    Raises:
      StoreError: see `read_meta`; or the params are missing or unreadable.
      DIR/params.npz, when present, is read instead of DIR/params/.
    """
    meta = read_meta(model_dir)
    npz = pathlib.Path(model_dir).expanduser().resolve() / PARAMS_NPZ
    if npz.is_file():
        try:
            with np.load(npz, allow_pickle=False) as data:
                flat = {k: np.asarray(data[k]) for k in data.files}
        except Exception as err:  # zipfile / numpy raise many types for damaged archives
            raise StoreError(f"{npz}: cannot read the parameter archive: "
                             f"{type(err).__name__}: {err}") from None
        return traverse_util.unflatten_dict(flat, sep="/"), meta
    params_dir = pathlib.Path(model_dir).expanduser().resolve() / PARAMS_DIR
    if not params_dir.is_dir():
        raise StoreError(f"{model_dir}: the parameter checkpoint '{PARAMS_DIR}/' is missing")
    checkpointer = _checkpointer()
    previous_hook = sys.unraisablehook
    sys.unraisablehook = quiet_closed_loop_hook(previous_hook)
    try:
        restored = checkpointer.restore(params_dir)
    except Exception as err:  # orbax raises many types for damaged checkpoints
        raise StoreError(damaged_checkpoint_message(params_dir, err)) from None
    finally:
        checkpointer.close()
        sys.unraisablehook = previous_hook
    params = traverse_util.unflatten_dict(
        {k: np.asarray(v) for k, v in traverse_util.flatten_dict(dict(restored), sep="/").items()},
        sep="/")
    return params, meta


_LOCAL_FILE = re.compile(r'local file "([^"]*[^/"])"')  # a file tensorstore names in its errors


def damaged_checkpoint_message(params_dir: pathlib.Path, error: BaseException) -> str:
    """One line naming the damaged file of an orbax checkpoint (the last file the error names, else
    ``params_dir``) and what to do, without the tensorstore spec the error carries."""
    named = _LOCAL_FILE.findall(str(error))
    where = named[-1] if named else os.fspath(params_dir)
    first = str(error).strip().splitlines()[0] if str(error).strip() else ""
    reason = first.split(":", 1)[0] if named else f"{type(error).__name__}: {first}"[:160]
    return (f"{where}: the parameter checkpoint is damaged or incomplete ({reason}); convert the model again "
            f"with `python -m ports`")


def quiet_closed_loop_hook(previous: Callable) -> Callable:
    """A `sys.unraisablehook` that drops asyncio's "Event loop is closed" and passes anything else to ``previous``.

    When a damaged checkpoint stops orbax's restore, tensorstore reads still in
    flight complete into the closed event loop and Python would print their
    tracebacks after the one-line error; `load` and the command line install it.
    """
    def hook(unraisable) -> None:
        error = unraisable.exc_value
        if isinstance(error, RuntimeError) and str(error) == "Event loop is closed":
            return
        previous(unraisable)

    return hook


def check_tree(params: Mapping, expected: Mapping, *, what: str) -> None:
    """Checks that ``params`` has exactly the paths and shapes of ``expected``.

    Raises:
      StoreError: naming the first missing, unexpected or mis-shaped path.
    """
    got = traverse_util.flatten_dict(dict(params), sep="/")
    want = traverse_util.flatten_dict(dict(expected), sep="/")
    missing = sorted(set(want) - set(got))
    extra = sorted(set(got) - set(want))
    if missing:
        raise StoreError(f"{what}: parameter '{missing[0]}' is missing"
                         + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
    if extra:
        raise StoreError(f"{what}: unexpected parameter '{extra[0]}'"
                         + (f" (and {len(extra) - 1} more)" if len(extra) > 1 else ""))
    for path in sorted(want):
        if tuple(np.shape(got[path])) != tuple(want[path].shape):
            raise StoreError(f"{what}: parameter '{path}' has shape {tuple(np.shape(got[path]))}, "
                             f"the model expects {tuple(want[path].shape)}")
