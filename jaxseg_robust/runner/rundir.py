"""Run directories: a manifest that pins what was run, records, and a lock.

Layout of a run directory::

  manifest.json              what the run is (written atomically, see below)
  records.jsonl              per-instance records of process 0 (`records`)
  records.process<k>.jsonl   records of process k > 0 (multi-process runs)
  .lock, .lock.process<k>    advisory locks held while a process runs

``manifest.json`` holds:
  ``format``        the run-directory format version;
  ``config``        the caller's configuration (any JSON-able mapping);
  ``fingerprints``  ``model`` and ``dataset`` fingerprints (see `fingerprints`);
  ``engine``        settings that change results (the frame policy);
  ``created``       UTC time of creation;
  ``sessions``      one entry per start: UTC time, package versions (python,
                    jax, jaxlib, flax, numpy, this package, ...), host, backend,
                    device kind and count, batch size, and any mismatch that
                    was overridden.

Reopening an existing directory compares ``format``, ``config``,
``fingerprints`` and ``engine`` with what the caller passes; any difference
raises `ManifestMismatchError` listing each differing key with the recorded
and the new value, unless ``allow_mismatch`` is set (then the differences are
logged in the new session entry and the run resumes). Changed package versions
only warn (`RuntimeWarning`): they are recorded per session.

Only process 0 writes the manifest; other processes wait for it to appear and
check it. The lock (``fcntl.flock``, released by the kernel even on SIGKILL)
stops two runs of the same process index from appending to one records file
at once; it is advisory and may not work on every network file system.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import os
import pathlib
import platform
import socket
import sys
import time
import warnings
from collections.abc import Mapping

from jaxseg_robust.runner.records import to_jsonable

try:
    import fcntl
except ImportError:  # pragma: no cover - non-POSIX systems run without locking
    fcntl = None

MANIFEST_NAME = "manifest.json"
MANIFEST_FORMAT = "jaxseg_robust.run/1"
COMPARED_SECTIONS = ("format", "config", "fingerprints", "engine")
VERSIONED_PACKAGES = ("jax", "jaxlib", "flax", "numpy", "optax", "orbax-checkpoint", "chex", "jaxseg_robust")
_SHOWN_CHARS = 160


class ManifestMismatchError(ValueError):
    """The run directory was created with a different config, fingerprint or engine setting."""


class RunDirectoryBusyError(RuntimeError):
    """Another process holds this run directory's lock for the same process index."""


def process_suffix(process_index: int) -> str:
    """File-name suffix of one process's files: ``""`` for process 0, ``".process<k>"`` otherwise."""
    return "" if process_index == 0 else f".process{process_index}"


def records_path(run_dir, process_index: int = 0) -> pathlib.Path:
    """Path of the records file process ``process_index`` appends to."""
    return pathlib.Path(run_dir) / f"records{process_suffix(process_index)}.jsonl"


def package_versions() -> dict[str, str]:
    """Versions of python and of the packages results depend on (``"absent"`` when not installed)."""
    versions = {"python": platform.python_version()}
    for package in VERSIONED_PACKAGES:
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = "absent"
    return versions


def _utc_now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def build_manifest(config: Mapping | None, fingerprints: Mapping[str, str | None], engine: Mapping) -> dict:
    """The compared part of a manifest, in canonical JSON form.

    Args:
      config: the caller's configuration (JSON-able: str keys, numbers,
        strings, bools, None, lists, arrays).
      fingerprints: e.g. ``{"model": "sha256:...", "dataset": "sha256:..."}``
        (None where unknown).
      engine: result-relevant engine settings (e.g. ``{"frame_policy": "exact"}``).

    Raises:
      RecordsError (a ValueError): naming the key of a value that is not JSON-able.
    """
    manifest = {
        "format": MANIFEST_FORMAT,
        "config": to_jsonable(dict(config or {}), "config"),
        "fingerprints": to_jsonable(dict(fingerprints), "fingerprints"),
        "engine": to_jsonable(dict(engine), "engine"),
    }
    return json.loads(json.dumps(manifest, sort_keys=True, allow_nan=True))


def _short(value) -> str:
    text = json.dumps(value, sort_keys=True, allow_nan=True)
    return text if len(text) <= _SHOWN_CHARS else text[: _SHOWN_CHARS - 3] + "..."


def _diff(recorded, current, path: str, out: list[str]) -> None:
    if isinstance(recorded, dict) and isinstance(current, dict):
        for key in sorted(set(recorded) | set(current)):
            child = f"{path}.{key}"
            if key not in recorded:
                out.append(f"{child}: not recorded, now {_short(current[key])}")
            elif key not in current:
                out.append(f"{child}: recorded {_short(recorded[key])}, now absent")
            else:
                _diff(recorded[key], current[key], child, out)
    elif recorded != current:
        out.append(f"{path}: recorded {_short(recorded)}, now {_short(current)}")


def manifest_differences(recorded: Mapping, current: Mapping) -> list[str]:
    """Human-readable differences of the compared sections (empty when they agree)."""
    out: list[str] = []
    for section in COMPARED_SECTIONS:
        _diff(recorded.get(section), current.get(section), section, out)
    return out


def write_json_atomic(path, obj) -> None:
    """Writes ``obj`` as JSON to ``path`` via a temporary file, fsync and rename (never half-written)."""
    path = pathlib.Path(path)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(temporary, "w", encoding="utf-8") as handle:
        json.dump(obj, handle, indent=2, sort_keys=True, allow_nan=True)
        handle.write("\n")
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)
    if hasattr(os, "O_DIRECTORY"):
        directory = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)


def read_manifest(run_dir) -> dict:
    """The manifest of a run directory.

    Raises:
      FileNotFoundError: no manifest.
      ValueError: naming the file, when it is not valid JSON.
    """
    path = pathlib.Path(run_dir) / MANIFEST_NAME
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}: not valid JSON ({error})") from None


class RunDirectory:
    """An opened, locked run directory (use as a context manager or call `close`).

    Attributes:
      path: the directory.
      manifest: the manifest as written (or found, for processes > 0).
      process_index: this process's index.
      records_path: the records file this process appends to.
    """

    def __init__(self, path: pathlib.Path, manifest: dict, process_index: int, lock_handle):
        self.path = path
        self.manifest = manifest
        self.process_index = process_index
        self.records_path = records_path(path, process_index)
        self._lock_handle = lock_handle

    def close(self) -> None:
        """Releases the lock (idempotent)."""
        if self._lock_handle is not None:
            self._lock_handle.close()
            self._lock_handle = None

    def __enter__(self) -> RunDirectory:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _acquire_lock(path: pathlib.Path, process_index: int):
    handle = open(path / f".lock{process_suffix(process_index)}", "a+")
    if fcntl is None:  # pragma: no cover
        return handle
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.close()
        raise RunDirectoryBusyError(
            f"run directory {path} is in use by another run (process index {process_index}); "
            "wait for it to finish or use another directory"
        ) from None
    return handle


def _session_entry(session: Mapping, overridden: list[str]) -> dict:
    entry = {
        "started": _utc_now(),
        "versions": package_versions(),
        "host": socket.gethostname(),
        "argv": list(sys.argv),
    }
    entry.update(to_jsonable(dict(session), "session"))
    if overridden:
        entry["overridden_mismatches"] = overridden
    return entry


def _check_versions(manifest: Mapping, path: pathlib.Path) -> None:
    sessions = manifest.get("sessions") or []
    if not sessions:
        return
    before = sessions[-1].get("versions", {})
    now = package_versions()
    changed = [f"{name} {before.get(name)} -> {now[name]}" for name in now if before.get(name) != now[name]]
    if changed:
        warnings.warn(
            f"{path}: package versions changed since the last session ({', '.join(changed)}); "
            "new records may differ numerically from earlier ones",
            RuntimeWarning,
            stacklevel=3,
        )


def _check_or_raise(recorded: Mapping, current: Mapping, path: pathlib.Path, allow_mismatch: bool) -> list[str]:
    differences = manifest_differences(recorded, current)
    if differences and not allow_mismatch:
        listing = "\n  ".join(differences)
        raise ManifestMismatchError(
            f"{path / MANIFEST_NAME} does not match this run:\n  {listing}\n"
            "Use a new run directory, or resume anyway with allow_mismatch=True "
            "(CLI: --allow-manifest-mismatch); the overridden differences are logged in the manifest."
        )
    return differences


def open_run_dir(
    path,
    *,
    config: Mapping | None,
    fingerprints: Mapping[str, str | None],
    engine: Mapping,
    session: Mapping | None = None,
    allow_mismatch: bool = False,
    process_index: int = 0,
    manifest_wait_s: float = 600.0,
) -> RunDirectory:
    """Creates or reopens a run directory and locks it for this process.

    Args:
      path: the run directory (created with parents if missing).
      config, fingerprints, engine: the compared manifest sections (see
        `build_manifest`).
      session: extra facts about this start recorded in its session entry
        (batch size, devices, ...), not compared.
      allow_mismatch: resume even if the compared sections differ (the
        differences are logged in the session entry).
      process_index: this process's index; only process 0 writes the manifest.
      manifest_wait_s: how long a process > 0 waits for process 0's manifest.

    Returns:
      The locked `RunDirectory`.

    Raises:
      ManifestMismatchError: the directory holds a different run (unless ``allow_mismatch``).
      RunDirectoryBusyError: another run holds the lock for ``process_index``.
      TimeoutError: a process > 0 found no manifest within ``manifest_wait_s``.
      ValueError: the path exists and is not a directory, or the manifest is corrupt.
    """
    path = pathlib.Path(path)
    if path.exists() and not path.is_dir():
        raise ValueError(f"run directory {path} exists and is not a directory")
    path.mkdir(parents=True, exist_ok=True)
    current = build_manifest(config, fingerprints, engine)
    lock_handle = _acquire_lock(path, process_index)
    try:
        manifest_file = path / MANIFEST_NAME
        if process_index != 0:
            deadline = time.monotonic() + manifest_wait_s
            while not manifest_file.exists():
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{manifest_file} did not appear within {manifest_wait_s} s (process 0 writes it)")
                time.sleep(0.5)
            manifest = read_manifest(path)
            _check_or_raise(manifest, current, path, allow_mismatch)
            return RunDirectory(path, manifest, process_index, lock_handle)
        if manifest_file.exists():
            manifest = read_manifest(path)
            overridden = _check_or_raise(manifest, current, path, allow_mismatch)
            _check_versions(manifest, path)
            manifest.setdefault("sessions", []).append(_session_entry(session or {}, overridden))
        else:
            manifest = dict(current, created=_utc_now(), sessions=[_session_entry(session or {}, [])])
        write_json_atomic(manifest_file, manifest)
        return RunDirectory(path, manifest, process_index, lock_handle)
    except BaseException:
        lock_handle.close()
        raise
