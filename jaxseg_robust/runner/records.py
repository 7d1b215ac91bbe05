"""Append-only per-instance records in JSON Lines.

One line per instance and attempt, a JSON object with these fields:

  ``dataset`` str, ``id`` str      the instance key;
  ``status`` ``"ok"`` | ``"failed"``;
  ``error`` str | null             ``"ExceptionType: message"`` when failed;
  ``traceback`` str                (failed only) the last frames of the traceback;
  ``payload`` object               what the batch function produced for the
                                   instance: nested objects of numbers, bools,
                                   strings and lists (arrays become nested
                                   lists; NaN and infinities are written as
                                   Python's json writes them: ``NaN``,
                                   ``Infinity``).

Records hold no timestamps or batch positions: the same instance gives the
same line whether it ran in an uninterrupted run or after a resume.

Durability: a batch's lines are written with one ``write``, then flushed and
``fsync``ed. A line counts only once its terminating newline is on disk; after
a kill, an unterminated last line is ignored by `read_records` and cut off by
`RecordWriter` before it appends (that line belonged to the batch in flight,
whose instances are not done). If an instance appears more than once (it was
retried with ``retry_failed``), the last line wins (`latest_records`).
"""

from __future__ import annotations

import json
import os
import pathlib
from collections.abc import Iterable, Mapping

import jax.numpy as jnp
import numpy as np

STATUS_OK = "ok"
STATUS_FAILED = "failed"
_STATUSES = (STATUS_OK, STATUS_FAILED)
RECORDS_GLOB = "records*.jsonl"
Key = tuple[str, str]


class RecordsError(ValueError):
    """A records file or a payload is malformed; the message names the file and line or the payload key."""


def to_jsonable(value, path: str = "payload"):
    """Converts a payload to plain JSON types.

    Args:
      value: a mapping with str keys, list/tuple, NumPy or JAX array (bool,
        integer or floating, bfloat16 included), NumPy scalar, Python
        bool/int/float/str, or None (nested freely).
      path: name of ``value`` used in error messages.

    Returns:
      The same structure of dict / list / bool / int / float / str / None;
      arrays become nested lists of Python scalars (float32 values are
      widened to float exactly).

    Raises:
      RecordsError: naming the offending path, on a non-str mapping key or an
        unsupported type.
    """
    if isinstance(value, np.generic) and value.dtype.kind in "biuf":
        return value.item()
    if value is None or isinstance(value, (bool, str, int, float)):
        return value
    if isinstance(value, Mapping):
        out = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise RecordsError(f"{path}: mapping keys must be str, got {key!r}")
            out[key] = to_jsonable(item, f"{path}.{key}")
        return out
    if isinstance(value, (list, tuple)):
        return [to_jsonable(item, f"{path}[{i}]") for i, item in enumerate(value)]
    if hasattr(value, "__array__") and hasattr(value, "dtype"):
        array = np.asarray(value)
        if array.dtype.kind not in "biuf" and jnp.issubdtype(array.dtype, jnp.floating):
            array = array.astype(np.float32)  # bfloat16 and other ml_dtypes floats widen exactly
        if array.dtype.kind not in "biuf":
            raise RecordsError(f"{path}: arrays must be bool, integer or float, got {array.dtype}")
        return array.tolist()
    raise RecordsError(f"{path}: cannot store a {type(value).__name__} as JSON")


def make_record(
    key: Key,
    status: str,
    payload: Mapping | None = None,
    error: str | None = None,
    traceback_text: str | None = None,
) -> dict:
    """Builds one record (a plain dict ready for `encode_record`).

    Args:
      key: (dataset, id) of the instance.
      status: ``"ok"`` or ``"failed"``.
      payload: per-instance results (converted with `to_jsonable`); empty for a failure.
      error: ``"ExceptionType: message"`` for a failure, else None.
      traceback_text: traceback excerpt for a failure, else None.

    Raises:
      RecordsError: on an unknown status or an unconvertible payload.
    """
    if status not in _STATUSES:
        raise RecordsError(f"status must be one of {_STATUSES}, got {status!r}")
    record = {
        "dataset": key[0],
        "id": key[1],
        "status": status,
        "error": error,
        "payload": to_jsonable(dict(payload or {})),
    }
    if traceback_text is not None:
        record["traceback"] = traceback_text
    return record


def encode_record(record: Mapping) -> str:
    """One JSON line (with trailing newline) for ``record``; keys sorted so lines are byte-stable."""
    return json.dumps(record, sort_keys=True, separators=(",", ":"), allow_nan=True) + "\n"


def _check_record(record, where: str) -> dict:
    if not isinstance(record, dict):
        raise RecordsError(f"{where}: a record must be a JSON object")
    for field, kind in (("dataset", str), ("id", str), ("status", str), ("payload", dict)):
        if not isinstance(record.get(field), kind):
            raise RecordsError(f"{where}: field {field!r} missing or not a {kind.__name__}")
    if record["status"] not in _STATUSES:
        raise RecordsError(f"{where}: unknown status {record['status']!r}")
    return record


def read_records(path) -> list[dict]:
    """Reads every complete record of one JSON Lines file, in file order.

    An unterminated last line (a write cut by a kill) is ignored; a missing
    file reads as empty.

    Raises:
      RecordsError: naming ``file:line``, when a complete (newline-terminated)
        line is not a valid record — that is corruption, not an interruption.
    """
    path = pathlib.Path(path)
    if not path.exists():
        return []
    data = path.read_bytes()
    end = data.rfind(b"\n") + 1  # bytes after the last newline are an unfinished write
    records = []
    for number, line in enumerate(data[:end].splitlines(), start=1):
        where = f"{path}:{number}"
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise RecordsError(f"{where}: not valid JSON ({error})") from None
        records.append(_check_record(record, where))
    return records


def read_run_records(run_dir) -> list[dict]:
    """All records of a run directory: every ``records*.jsonl`` file (one per process), in name order."""
    records = []
    for path in sorted(pathlib.Path(run_dir).glob(RECORDS_GLOB)):
        records.extend(read_records(path))
    return records


def latest_records(records: Iterable[Mapping]) -> dict[Key, dict]:
    """Maps each key (dataset, id) to its last record (a retry supersedes an earlier failure)."""
    latest = {}
    for record in records:
        latest[(record["dataset"], record["id"])] = record
    return latest


def done_keys(latest: Mapping[Key, Mapping], include_failed: bool = True) -> set[Key]:
    """Keys a resumed run skips: every recorded key, or only the ``ok`` ones when ``include_failed`` is false."""
    return {key for key, record in latest.items() if include_failed or record["status"] == STATUS_OK}


def _cut_unterminated_tail(path: pathlib.Path) -> int:
    """Truncates ``path`` after its last newline; returns the number of bytes removed."""
    with open(path, "r+b") as handle:
        size = handle.seek(0, os.SEEK_END)
        position = size
        block = 1 << 16
        while position > 0:
            start = max(0, position - block)
            handle.seek(start)
            chunk = handle.read(position - start)
            newline = chunk.rfind(b"\n")
            if newline >= 0:
                keep = start + newline + 1
                break
            position = start
        else:
            keep = 0
        if keep < size:
            handle.truncate(keep)
            handle.flush()
            os.fsync(handle.fileno())
        return size - keep


class RecordWriter:
    """Appends batches of records to one JSON Lines file, durably.

    Opening cuts off an unterminated last line left by a killed writer, so new
    lines never merge into it. Use as a context manager or call `close`.
    """

    def __init__(self, path):
        """Opens (creating if needed) ``path`` for appending."""
        self.path = pathlib.Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.touch(exist_ok=True)
        self.repaired_bytes = _cut_unterminated_tail(self.path)
        self._handle = open(self.path, "a", encoding="utf-8")

    def write_batch(self, records: Iterable[Mapping]) -> int:
        """Appends ``records`` in one write, then flushes and fsyncs; returns how many were written."""
        lines = [encode_record(record) for record in records]
        if lines:
            self._handle.write("".join(lines))
            self._handle.flush()
            os.fsync(self._handle.fileno())
        return len(lines)

    def close(self) -> None:
        """Closes the file (idempotent)."""
        if not self._handle.closed:
            self._handle.close()

    def __enter__(self) -> RecordWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

