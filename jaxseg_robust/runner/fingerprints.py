"""Fingerprints of models and datasets, recorded in the run manifest.

All fingerprints are ``"sha256:<64 hex digits>"`` strings.

Model:
  * `fingerprint_params(params)` hashes a parameter pytree: for every leaf,
    in tree order, its key path, dtype, shape and raw bytes. Equal for equal
    weights whatever device they live on; any changed value, dtype, shape or
    parameter name changes it. Costs one host copy and one SHA-256 pass over
    the weights (seconds for ViT-H).
  * `fingerprint_path(path)` hashes a converted checkpoint on disk (one file,
    or a directory such as an orbax checkpoint: relative paths and contents
    of every file, in sorted order).

Dataset (`dataset_fingerprint`; per instance: `instance_fingerprints`), computed from the instance list, in key
order, so the order instances are given in does not matter. For each
instance: its key (dataset, id) and (declared) size (H, W), then its content
as one of:
  * mode ``"stat"`` (default): for each source path, the file's base name and
    size in bytes (``missing`` if it cannot be stat'ed). Cheap (no file is
    read) and robust to copying the dataset elsewhere (no absolute paths, no
    modification times); it misses an edit that keeps a file's size, for
    which use
  * mode ``"content"``: for each source path, the SHA-256 of the file's bytes
    (reads the whole dataset once).
  * an in-memory `Instance` without source paths is hashed by its image and
    gt bytes (in either mode); an `InstanceRef` without source paths by its
    caller-supplied ``fingerprint`` token.
"""

from __future__ import annotations

import hashlib
import os
import pathlib
from collections.abc import Iterable

import jax
import numpy as np

from jaxseg_robust import hashing
from jaxseg_robust.data.instances import AnyInstance, Instance, InstanceRef

DATASET_FINGERPRINT_MODES = ("stat", "content")


def _hex(hasher) -> str:
    return f"sha256:{hasher.hexdigest()}"


def fingerprint_params(params) -> str:
    """SHA-256 fingerprint of a parameter pytree (key paths, dtypes, shapes, bytes of every leaf).

    Args:
      params: any pytree of arrays (NumPy or JAX, any device, any dtype
        including bfloat16); Python scalars are hashed as NumPy scalars.

    Returns:
      ``"sha256:<hex>"``.
    """
    hasher = hashlib.sha256()
    leaves, _ = jax.tree_util.tree_flatten_with_path(params)
    hasher.update(f"leaves={len(leaves)}\n".encode())
    for path, leaf in leaves:
        array = np.ascontiguousarray(np.asarray(jax.device_get(leaf)))
        hasher.update(f"{jax.tree_util.keystr(path)}|{array.dtype.str}|{list(array.shape)}\n".encode())
        hasher.update(array.tobytes())
    return _hex(hasher)


def file_sha256(path) -> str:
    """``"sha256:<hex>"`` of one file's bytes (`jaxseg_robust.hashing.file_sha256`)."""
    return f"sha256:{hashing.file_sha256(path)}"


def fingerprint_path(path) -> str:
    """SHA-256 fingerprint of a checkpoint file, or of a directory tree (relative paths + contents).

    Raises:
      FileNotFoundError: ``path`` does not exist.
    """
    path = pathlib.Path(path)
    if path.is_file():
        return file_sha256(path)
    if not path.is_dir():
        raise FileNotFoundError(f"checkpoint path {path} does not exist")
    hasher = hashlib.sha256()
    files = sorted(p for p in path.rglob("*") if p.is_file())
    for file in files:
        relative = file.relative_to(path).as_posix()
        hasher.update(f"{relative}|{file.stat().st_size}\n".encode())
        hashing.update_with_file(hasher, file)
    return _hex(hasher)


def _source_token(source: str, mode: str) -> str:
    name = os.path.basename(source)
    try:
        if mode == "stat":
            return f"{name}:{os.stat(source).st_size}"
        return f"{name}:{file_sha256(source)}"
    except OSError:
        return f"{name}:missing"


def _instance_token(instance: AnyInstance, mode: str) -> str:
    if instance.source_paths:
        return ",".join(_source_token(source, mode) for source in instance.source_paths)
    if isinstance(instance, Instance):
        hasher = hashlib.sha256()
        for array in (instance.image, instance.gt):
            array = np.ascontiguousarray(np.asarray(array))
            hasher.update(f"{array.dtype.str}|{list(array.shape)}\n".encode())
            if array.dtype.kind in "biuf":  # anything else fails validation; hash only its type and shape
                hasher.update(array.tobytes())
        return f"arrays:{hasher.hexdigest()}"
    if isinstance(instance, InstanceRef) and instance.fingerprint:
        return f"token:{instance.fingerprint}"
    raise ValueError(
        f"{instance.name}: cannot fingerprint an InstanceRef with neither source_paths nor a fingerprint token"
    )


def _entries(instances: Iterable[AnyInstance], mode: str) -> list[tuple]:
    if mode not in DATASET_FINGERPRINT_MODES:
        raise ValueError(f"mode must be one of {DATASET_FINGERPRINT_MODES}, got {mode!r}")
    return sorted((instance.key, instance.size, _instance_token(instance, mode)) for instance in instances)


def _entry_line(entry) -> str:
    (dataset, instance_id), (height, width), token = entry
    return f"{dataset}\x00{instance_id}\x00{height}x{width}\x00{token}\n"


def _dataset_hash(entries: list[tuple], mode: str) -> str:
    hasher = hashlib.sha256()
    hasher.update(f"mode={mode}|count={len(entries)}\n".encode())
    for entry in entries:
        hasher.update(_entry_line(entry).encode())
    return _hex(hasher)


def dataset_fingerprint(instances: Iterable[AnyInstance], mode: str = "stat") -> str:
    """SHA-256 fingerprint of an instance list (see the module docstring for what it covers).

    Args:
      instances: `Instance`s and/or `InstanceRef`s.
      mode: ``"stat"`` (file names and sizes) or ``"content"`` (file bytes).

    Returns:
      ``"sha256:<hex>"``; independent of the order of ``instances``.

    Raises:
      ValueError: unknown ``mode``, or an `InstanceRef` without source paths
        or fingerprint token (named).
    """
    return _dataset_hash(_entries(instances, mode), mode)


def instance_fingerprints(instances: Iterable[AnyInstance], mode: str = "stat") -> dict[tuple[str, str], str]:
    """Per-instance fingerprints: ``{(dataset, id): 16 hex digits}`` of what `dataset_fingerprint` hashes.

    Each covers the instance's key, declared size and content token, so a
    resumed run can say which instances were added, removed or changed.

    Raises:
      ValueError: as `dataset_fingerprint`.
    """
    return {entry[0]: hashlib.sha256(_entry_line(entry).encode()).hexdigest()[:16]
            for entry in _entries(instances, mode)}


def fingerprints_of(instances: Iterable[AnyInstance], mode: str = "stat") -> tuple[str, dict[tuple[str, str], str]]:
    """``(dataset_fingerprint, instance_fingerprints)`` from one pass over the files."""
    entries = _entries(instances, mode)
    return _dataset_hash(entries, mode), {
        entry[0]: hashlib.sha256(_entry_line(entry).encode()).hexdigest()[:16] for entry in entries}
