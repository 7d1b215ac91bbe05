"""The in-flight journal: which instances a process is evaluating, written before it starts them.

A process killed by SIGKILL (the kernel's out-of-memory killer, ``kill -9``,
a scheduler's hard limit) writes no record for the batch it was running, and
a rerun would pick the same batch first and die on it again. So before a
group of instances is loaded and run, the engine appends their keys to the
journal (flushed and fsynced); a normal end of the group needs no second
line, because its records resolve it. Leaving a group without records for
another reason (an exception, Ctrl-C) appends a ``release`` line.

On the next start (`InflightJournal.open`), every started, unreleased group
member that still has no record was in flight when the process died: its
*kill count* is the number of such groups. The engine then runs an instance
killed once alone (one instance per batch) and records an instance killed
twice as failed without running it (`KILLED_TWICE`); ``--retry-failed``
gives it another chance.

With the engine's prefetching (`jaxseg_robust.runner.pipeline`) a few groups
are in flight at once (one loading, one or two on the device, one being
written); each has its own start line, and a kill counts once against every
member of each of them, so all of them run alone on the next start.

Files (beside the records, one per process): ``inflight.jsonl``,
``inflight.process<k>.jsonl``. Lines: ``{"start": [[dataset, id], ...],
"pid": N}`` and ``{"release": [[dataset, id], ...]}``. Opening rewrites the
file atomically with only the entries of keys that still lack a record, so
it stays small and a key recorded since (e.g. failed, then retried) starts
again from zero kills.
"""

from __future__ import annotations

import itertools
import json
import os
import pathlib
import threading
from collections import Counter
from collections.abc import Iterable, Sequence

from jaxseg_robust.runner.rundir import process_suffix

KILLED_TWICE = ("ProcessKilled: killed the process twice (out of memory?): once in its batch, then alone; "
                "lower the image size guard (--max-side) or the batch size, or free memory, then rerun "
                "with --retry-failed")

Key = tuple[str, str]


def journal_path(run_dir, process_index: int = 0) -> pathlib.Path:
    """Path of process ``process_index``'s in-flight journal."""
    return pathlib.Path(run_dir) / f"inflight{process_suffix(process_index)}.jsonl"


def _read_lines(path: pathlib.Path) -> list[dict]:
    """Complete, parseable lines (a line cut by a kill, or garbage, is skipped: the journal is advisory)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    lines = []
    for raw in data[: data.rfind(b"\n") + 1].splitlines():
        try:
            entry = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError):
            continue
        if isinstance(entry, dict):
            lines.append(entry)
    return lines


def _keys(entry: dict, field: str) -> list[Key]:
    return [(str(k[0]), str(k[1])) for k in entry.get(field, ()) if isinstance(k, list) and len(k) == 2]


def kill_counts(entries: Iterable[dict], recorded: set) -> Counter:
    """``{key: groups it was in when its process died}`` over journal ``entries``, for keys not in ``recorded``."""
    counts: Counter = Counter()
    for entry in entries:
        for key in _keys(entry, "start"):
            counts[key] += 1
        for key in _keys(entry, "release"):
            counts[key] -= 1
    return Counter({key: count for key, count in counts.items() if count > 0 and key not in recorded})


def _encode(entry: dict) -> str:
    return json.dumps(entry, sort_keys=True, separators=(",", ":")) + "\n"


class InflightJournal:
    """One process's in-flight journal (see the module docstring); use as a context manager.

    Thread-safe: the engine's loop starts groups and its record writer finishes them.
    """

    def __init__(self, run_dir, process_index: int = 0):
        self.path = journal_path(run_dir, process_index)
        self._handle = None
        self._lock = threading.Lock()
        self._groups: dict[int, list] = {}
        self._tokens = itertools.count()

    def open(self, recorded: Iterable[Key]) -> Counter:
        """Reads the journal, compacts it to the keys without a record, opens it for appending.

        Args:
          recorded: keys that have a record (any status) in the run directory.

        Returns:
          The kill count of every unrecorded key that was in flight when a process died.
        """
        recorded = set(recorded)
        counts = kill_counts(_read_lines(self.path), recorded)
        temporary = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        with open(temporary, "w", encoding="utf-8") as handle:
            for key, count in sorted(counts.items()):
                handle.write("".join(_encode({"start": [list(key)], "pid": None}) for _ in range(count)))
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, self.path)
        self._handle = open(self.path, "a", encoding="utf-8")
        return counts

    def _append(self, entry: dict) -> None:
        self._handle.write(_encode(entry))
        self._handle.flush()
        os.fsync(self._handle.fileno())

    def start(self, keys: Sequence[Key]) -> int:
        """Records (durably) that ``keys`` are about to be loaded and run; returns the group's token."""
        group = [list(key) for key in keys]
        with self._lock:
            token = next(self._tokens)
            self._groups[token] = group
            self._append({"start": group, "pid": os.getpid()})
        return token

    def finish(self, token: int) -> None:
        """The group ``token`` got its records (nothing is written: the records resolve it)."""
        with self._lock:
            self._groups.pop(token, None)

    def release(self, token: int | None = None) -> None:
        """The group ``token`` (None: every group still in flight) ends without records but without a kill
        (an exception, Ctrl-C)."""
        with self._lock:
            tokens = list(self._groups) if token is None else [token]
            for one in tokens:
                group = self._groups.pop(one, None)
                if group is not None and self._handle is not None and not self._handle.closed:
                    self._append({"release": group})

    def in_flight(self) -> int:
        """How many started groups have neither been finished nor released."""
        with self._lock:
            return len(self._groups)

    def close(self) -> None:
        """Closes the file (idempotent)."""
        if self._handle is not None and not self._handle.closed:
            self._handle.close()

    def __enter__(self) -> InflightJournal:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
