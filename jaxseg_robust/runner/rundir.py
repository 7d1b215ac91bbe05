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

``config.records_format`` (optional) names the layout of the records a
protocol writes (e.g. the TETRIS records with ``clicks_xy``); a run directory
whose records are in another layout (or predate the key) is refused with one
line by `check_records_format`, even with ``allow_mismatch``: resuming would
mix two layouts in one records file.

``config.matmul_precision`` (optional, `runner.precision`) is the float32
matrix-product precision the records were computed at; a resume at another one
is refused with one line by `check_matmul_precision` (unless ``allow_mismatch``),
and a manifest without the key counts as ``default`` (what every run before the
key ran at).

``instances`` (optional) holds one short fingerprint per instance
(``{"dataset": {"id": "<16 hex>"}}``), so a changed dataset is explained
instance by instance (added, removed, changed, and which of those already
have records); a dataset that only grew resumes without an override.

Whichever process arrives first creates the manifest (atomically: nobody
waits for anybody, and array jobs may start in any order); the others check
it, and only process 0 appends session entries to an existing one.

The lock (``fcntl.flock``, released by the kernel even on SIGKILL) stops two
runs of the same process index from appending to one records file at once;
it is advisory and may not work on every network file system.
"""

from __future__ import annotations

import dataclasses
import datetime
import importlib.metadata
import json
import os
import pathlib
import platform
import socket
import sys
import uuid
import warnings
from collections.abc import Mapping

from jaxseg_robust.runner.precision import CONFIG_KEY as PRECISION_KEY
from jaxseg_robust.runner.precision import recorded_precision
from jaxseg_robust.runner.records import latest_records, read_run_records, to_jsonable

try:
    import fcntl
except ImportError:  # pragma: no cover - non-POSIX systems run without locking
    fcntl = None

MANIFEST_NAME = "manifest.json"
MANIFEST_FORMAT = "jaxseg_robust.run/1"
COMPARED_SECTIONS = ("format", "config", "fingerprints", "engine")
RECORDS_FORMAT_KEY = "records_format"  # config key: the layout of a protocol's records (never overridden)
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


def _probe(directory: pathlib.Path) -> None:
    """Creates and removes a file in ``directory`` (raises OSError when that is impossible)."""
    probe = directory / f".write_probe.{os.getpid()}.{uuid.uuid4().hex[:8]}"
    with open(probe, "w", encoding="utf-8"):
        pass
    probe.unlink()


def check_writable_dir(path, what: str = "directory") -> pathlib.Path:
    """Checks that ``path`` is, or can be created as, a directory files can be written to; creates nothing.

    Call it before any compute, so a run never computes results it cannot
    save. A missing ``path`` is checked at its nearest existing ancestor.

    Args:
      path: the directory.
      what: how messages name it (e.g. ``"--out"``).

    Returns:
      ``path`` as a `pathlib.Path`.

    Raises:
      ValueError: naming ``what`` and the path, when it (or an ancestor) is not
        a directory, or no file can be created there.
    """
    path = pathlib.Path(path)
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        blocker = "it" if existing == path else str(existing)
        raise ValueError(f"{what} {path} cannot be a directory: {blocker} exists and is not a directory")
    try:
        _probe(existing)
    except OSError as error:
        where = "" if existing == path else f" (in {existing})"
        raise ValueError(f"{what} {path} is not writable{where}: {error.strerror or error}") from None
    return path


def check_writable_file(path, what: str = "output file") -> pathlib.Path:
    """Checks that ``path`` can be written (its folder may be missing); creates nothing.

    Raises:
      ValueError: naming ``what`` and the path, when it is a directory or its folder is not writable.
    """
    path = pathlib.Path(path)
    if path.is_dir():
        raise ValueError(f"{what} {path} is a directory")
    try:
        check_writable_dir(path.parent, "folder")
    except ValueError as error:
        raise ValueError(f"{what} {path}: {error}") from None
    if path.exists() and not os.access(path, os.W_OK):
        raise ValueError(f"{what} {path} is not writable")
    return path


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
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
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


def _instance_table(instance_fingerprints) -> dict[str, dict[str, str]]:
    """``{(dataset, id): fp}`` -> the manifest's ``{"dataset": {"id": fp}}`` (sorted, one JSON line per instance)."""
    table: dict[str, dict[str, str]] = {}
    for (dataset, instance_id), fingerprint in sorted(instance_fingerprints.items()):
        table.setdefault(dataset, {})[instance_id] = fingerprint
    return table


def _instance_keys(table: Mapping) -> dict[tuple[str, str], str]:
    return {(dataset, instance_id): fingerprint
            for dataset, members in table.items() for instance_id, fingerprint in members.items()}


@dataclasses.dataclass(frozen=True)
class DatasetChanges:
    """How the instance list differs from the recorded one (keys ``(dataset, id)``, sorted).

    Attributes:
      added: instances new in this run.
      removed: recorded instances no longer given.
      changed: instances whose fingerprint (declared size, file sizes or
        contents, see `fingerprints`) changed.
      invalidated: the removed or changed instances that already have a record
        (their results no longer describe the given data).
    """

    added: tuple = ()
    removed: tuple = ()
    changed: tuple = ()
    invalidated: tuple = ()

    def describe(self, shown: int = 10) -> str:
        """``"2 added (a/x, a/y); 1 changed (a/z, recorded)"``."""
        parts = []
        for label, keys in (("added", self.added), ("removed", self.removed), ("changed", self.changed)):
            if keys:
                names = [f"{d}/{i}" + (" [recorded]" if (d, i) in self.invalidated else "") for d, i in keys[:shown]]
                more = f", ... {len(keys) - shown} more" if len(keys) > shown else ""
                parts.append(f"{len(keys)} {label} ({', '.join(names)}{more})")
        return "; ".join(parts) or "no instance differs"


def dataset_changes(recorded_table: Mapping, instance_fingerprints: Mapping, recorded_keys) -> DatasetChanges:
    """Compares the manifest's per-instance fingerprints with the current ones.

    Args:
      recorded_table: the manifest's ``instances`` section (``{"dataset": {"id": fp}}``).
      instance_fingerprints: ``{(dataset, id): fp}`` of this run (`instance_fingerprints`).
      recorded_keys: keys that have a record in the run directory.
    """
    before = _instance_keys(recorded_table)
    after = dict(instance_fingerprints)
    added = tuple(sorted(set(after) - set(before)))
    removed = tuple(sorted(set(before) - set(after)))
    changed = tuple(sorted(key for key in set(before) & set(after) if before[key] != after[key]))
    recorded_keys = set(recorded_keys)
    invalidated = tuple(key for key in sorted(removed + changed) if key in recorded_keys)
    return DatasetChanges(added, removed, changed, invalidated)


class RecordsFormatError(ManifestMismatchError):
    """The run directory's records are in another layout than this version writes (never overridable)."""


def check_records_format(recorded: Mapping, current: Mapping, path: pathlib.Path) -> None:
    """Raises `RecordsFormatError` (one line) when ``current``'s ``config.records_format`` is set and
    ``recorded``'s differs or is absent (a run directory written before the layout was named).

    Args:
      recorded, current: the manifest found and the one this run would write.
      path: the run directory (named in the message).
    """
    wanted = (current.get("config") or {}).get(RECORDS_FORMAT_KEY)
    was = other_records_format(recorded, wanted)
    if was is not None:
        raise RecordsFormatError(f"{path}: its records are in {was}, this version writes {wanted!r}; resuming "
                                 "would mix the two in one records file, so use a new run directory (--out)")


def other_records_format(manifest: Mapping, wanted: str | None) -> str | None:
    """How a manifest's ``config.records_format`` differs from ``wanted``: ``"an older layout"`` (absent),
    ``"layout 'X'"``, or None when it is ``wanted`` or nothing is wanted."""
    found = (manifest.get("config") or {}).get(RECORDS_FORMAT_KEY)
    if wanted is None or found == wanted:
        return None
    return "an older layout" if found is None else f"layout {found!r}"


def check_matmul_precision(recorded: Mapping, current: Mapping, path: pathlib.Path) -> None:
    """Raises `ManifestMismatchError` (one line) when ``current`` records a ``config.matmul_precision``
    (`runner.precision`) other than ``recorded``'s (a manifest without the key ran at ``default``).

    Args:
      recorded, current: the manifest found and the one this run would write.
      path: the run directory (named in the message).
    """
    current_config = current.get("config") or {}
    if PRECISION_KEY not in current_config:
        return
    was, wanted = recorded_precision(recorded.get("config")), current_config[PRECISION_KEY]
    if was != wanted:
        raise ManifestMismatchError(
            f"{path}: its records were computed at matmul precision {was!r}, this run asks for {wanted!r}; "
            f"rerun with --precision {was} or use a new run directory (--out)")


def _with_recorded_precision(recorded: Mapping, current: Mapping) -> Mapping:
    """``recorded`` with ``config.matmul_precision`` filled in as `recorded_precision` says, when ``current``
    records one and ``recorded`` predates the key (so an older run directory resumes at ``default``)."""
    config = recorded.get("config") or {}
    if PRECISION_KEY not in (current.get("config") or {}) or PRECISION_KEY in config:
        return recorded
    return dict(recorded, config=dict(config, **{PRECISION_KEY: recorded_precision(config)}))


def _only_dataset_differs(recorded: Mapping, current: Mapping) -> bool:
    without = [dict(m, fingerprints={k: v for k, v in (m.get("fingerprints") or {}).items() if k != "dataset"})
               for m in (recorded, current)]
    return not manifest_differences(*without)


def _check_or_raise(recorded: Mapping, current: Mapping, path: pathlib.Path, allow_mismatch: bool,
                    instance_fingerprints: Mapping | None = None) -> tuple[list[str], bool]:
    """Returns (the overridden differences, whether the manifest's dataset should be updated)."""
    check_records_format(recorded, current, path)
    if not allow_mismatch:
        check_matmul_precision(recorded, current, path)
    recorded = _with_recorded_precision(recorded, current)
    differences = manifest_differences(recorded, current)
    if not differences:
        return [], False
    dataset_note = ""
    if instance_fingerprints is not None and "fingerprints.dataset" in " ".join(differences):
        if "instances" in recorded:
            latest = latest_records(read_run_records(path))
            changes = dataset_changes(recorded["instances"], instance_fingerprints, latest)
            if not changes.invalidated and _only_dataset_differs(recorded, current):
                return [], True  # only unrecorded instances were added or changed: no result is invalidated
            differences = [d if not d.startswith("fingerprints.dataset") else
                           f"fingerprints.dataset: the instances differ: {changes.describe()}" for d in differences]
            if changes.invalidated:
                dataset_note = (f"\n{len(changes.invalidated)} instance(s) marked [recorded] already have results "
                                "that no longer describe the given data.")
        else:
            dataset_note = ("\n(this run directory predates per-instance fingerprints, so the instances that "
                            "differ cannot be named)")
    if not allow_mismatch:
        listing = "\n  ".join(differences)
        raise ManifestMismatchError(
            f"{path / MANIFEST_NAME} does not match this run:\n  {listing}{dataset_note}\n"
            "Use a new run directory, or resume anyway with allow_mismatch=True "
            "(CLI: --allow-manifest-mismatch); the overridden differences are logged in the manifest."
        )
    return differences, False


def _create_exclusive(path: pathlib.Path, obj) -> bool:
    """Writes ``obj`` as JSON to ``path`` only if ``path`` does not exist, atomically; False if it existed.

    The content goes to a temporary file first (fsynced), which is then hard-linked to ``path``: the link
    fails if ``path`` exists, so of several processes arriving together exactly one creates it and nobody
    ever reads a half-written manifest. File systems without hard links fall back to a checked rename.
    """
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.create")
    write_json_atomic(temporary, obj)
    try:
        os.link(temporary, path)
        created = True
    except FileExistsError:
        created = False
    except OSError:  # pragma: no cover - no hard links here: a rename after a check (a narrow race)
        created = not path.exists()
        if created:
            os.replace(temporary, path)
    finally:
        if temporary.exists():
            temporary.unlink()
    return created


def open_run_dir(
    path,
    *,
    config: Mapping | None,
    fingerprints: Mapping[str, str | None],
    engine: Mapping,
    session: Mapping | None = None,
    allow_mismatch: bool = False,
    process_index: int = 0,
    instance_fingerprints: Mapping | None = None,
) -> RunDirectory:
    """Creates or reopens a run directory, checks its manifest and takes the lock of ``process_index``.

    Any process may arrive first: the first one to find no manifest creates it
    atomically (`_create_exclusive`), whichever its index; every other one
    checks it against its own. Process 0 appends a session entry to an
    existing manifest (other processes never rewrite it, so no update is lost).

    Args:
      path: the run directory (created if missing).
      config, fingerprints, engine: the compared sections (see `build_manifest`).
      session: extra facts for this session's entry (batch size, devices, ...).
      allow_mismatch: resume even if the compared sections differ (logged).
      process_index: this process's index (multi-process runs).
      instance_fingerprints: ``{(dataset, id): fingerprint}`` of the instances
        (`jaxseg_robust.runner.fingerprints.instance_fingerprints`), stored in
        the manifest's ``instances`` section. With them a changed dataset
        fingerprint is explained instance by instance, and a dataset that only
        gained instances (or changed ones without a record) resumes without
        ``allow_mismatch``; process 0 then records the new instance list.

    Returns:
      The locked `RunDirectory`.

    Raises:
      ManifestMismatchError: the directory holds a different run (unless ``allow_mismatch``).
      RecordsFormatError: its records are in another layout (`check_records_format`; whatever
        ``allow_mismatch`` says).
      RunDirectoryBusyError: another run holds the lock for ``process_index``.
      ValueError: the path exists and is not a directory, or the manifest is corrupt.
    """
    path = pathlib.Path(path)
    if path.exists() and not path.is_dir():
        raise ValueError(f"run directory {path} exists and is not a directory")
    path.mkdir(parents=True, exist_ok=True)
    current = build_manifest(config, fingerprints, engine)
    table = None if instance_fingerprints is None else _instance_table(instance_fingerprints)
    lock_handle = _acquire_lock(path, process_index)
    try:
        manifest_file = path / MANIFEST_NAME
        fresh = dict(current, created=_utc_now(), sessions=[_session_entry(session or {}, [])])
        if table is not None:
            fresh["instances"] = table
        if _create_exclusive(manifest_file, fresh):
            return RunDirectory(path, fresh, process_index, lock_handle)
        manifest = read_manifest(path)
        overridden, update_dataset = _check_or_raise(manifest, current, path, allow_mismatch, instance_fingerprints)
        if process_index == 0:
            _check_versions(manifest, path)
            if update_dataset:
                manifest["fingerprints"] = dict(manifest["fingerprints"], dataset=current["fingerprints"]["dataset"])
                manifest["instances"] = table
            elif table is not None and "instances" not in manifest and not overridden:
                manifest["instances"] = table  # a run directory of an older version gains the table
            manifest.setdefault("sessions", []).append(_session_entry(session or {}, overridden))
            write_json_atomic(manifest_file, manifest)
        return RunDirectory(path, manifest, process_index, lock_handle)
    except BaseException:
        lock_handle.close()
        raise
