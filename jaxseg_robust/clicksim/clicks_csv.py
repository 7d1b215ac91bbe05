"""Reader and validator of the RClicks clicks CSV (``datasets/clicks.csv``, ``previews.csv``).

Reference: docs/protocols/rclicks.md §1.1 (schema), §1.2 (loading a task), §1.3 (size cap).

One row is one real-user click. Required columns (any order; extra columns are
ignored)::

    dataset, image_stem, object_stem, model_type, click_type, full_stem, device, x, y, w, h

Empty strings are kept as ``''`` (the reference reads with ``keep_default_na=False``).
``x, y`` are integer pixel coordinates (column, row) in the frame of a ``w x h``
image; they may lie outside it and are clipped when a task is loaded.

Validation (every error is a :class:`ClicksCsvError` naming the source, the file
line, the data row and the column):

* always: header has every required column once; every row has as many fields
  as the header; ``dataset``, ``image_stem``, ``full_stem`` non-empty;
  ``click_type`` in ``first|fn|fp``; ``device`` in ``pc|mobile``; ``x, y`` integers;
  ``w, h`` integers >= 1.
* ``strict=True`` (default) adds the schema's cross-field rules: ``model_type`` in
  ``'' | ritm | sam | simple | mivos``, empty exactly for ``first`` clicks;
  ``object_stem`` empty or a non-negative integer (TETRIS object code);
  the image stem recovered from ``full_stem`` (cut at the first ``_ritm`` /
  ``_sam`` / ``_simple`` / ``_mivos``, then at ``_______``) equals ``image_stem``,
  and the object part equals ``object_stem``; all rows of one ``full_stem``
  agree on ``dataset, image_stem, object_stem, model_type, click_type, w, h``.
  The reference silently uses the first row of a task for those; pass
  ``strict=False`` to accept such files and get the reference behaviour.

Tasks are the unique ``full_stem`` values in order of first appearance (pandas
``unique``); :func:`task_clicks` applies §1.2 step 3 (device filter, clip, size cap).
"""

from __future__ import annotations

import csv
import dataclasses
import functools
import io
import os
import pathlib
import re
from typing import Iterable, NamedTuple, Sequence, TextIO, Union

import numpy as np

__all__ = [
    "CLICKS_COLUMNS",
    "CLICK_TYPES",
    "DEVICES",
    "MODEL_TYPES",
    "OBJECT_SEPARATOR",
    "TETRIS_MAX_SIDE",
    "ClicksCsvError",
    "ClicksTable",
    "TaskClicks",
    "read_clicks_csv",
    "parse_clicks_csv",
    "image_object_stem_of",
    "image_stem_of",
    "object_code",
    "limited_image_size",
    "task_stems",
    "task_clicks",
    "read_split_file",
    "pad_clicks",
]

CLICKS_COLUMNS = ("dataset", "image_stem", "object_stem", "model_type", "click_type", "full_stem",
                  "device", "x", "y", "w", "h")
_TEXT_COLUMNS = CLICKS_COLUMNS[:7]
_INT_COLUMNS = ("x", "y", "w", "h")
CLICK_TYPES = ("first", "fn", "fp")
DEVICES = ("pc", "mobile")
MODEL_TYPES = ("ritm", "sam", "simple", "mivos")
# Separator between image stem and object code in first-round full stems of multi-instance images.
OBJECT_SEPARATOR = "_______"
# TETRIS loader caps the longest image side at 2048 pixels (§1.3).
TETRIS_MAX_SIDE = 2048
# Per-task columns that every row of one full_stem must share (strict mode).
_TASK_COLUMNS = ("dataset", "image_stem", "object_stem", "model_type", "click_type", "w", "h")
_INT_PATTERN = re.compile(r"^[+-]?\d+$")

PathOrFile = Union[str, os.PathLike, TextIO]


class ClicksCsvError(ValueError):
    """The clicks CSV violates the schema; the message names source, line, row and column."""


@dataclasses.dataclass(frozen=True, eq=False)
class ClicksTable:
    """Columnar clicks table (one entry per CSV row, file order).

    Text columns are numpy ``str`` arrays, ``x, y, w, h`` int64 arrays; ``line``
    holds the 1-based file line of each row (for messages).
    """

    source: str
    dataset: np.ndarray
    image_stem: np.ndarray
    object_stem: np.ndarray
    model_type: np.ndarray
    click_type: np.ndarray
    full_stem: np.ndarray
    device: np.ndarray
    x: np.ndarray
    y: np.ndarray
    w: np.ndarray
    h: np.ndarray
    line: np.ndarray

    def __len__(self) -> int:
        return int(self.x.shape[0])

    def select(self, rows: np.ndarray) -> "ClicksTable":
        """Sub-table of the given rows (bool mask or integer indices, order kept)."""
        fields = {f.name: getattr(self, f.name)[rows] for f in dataclasses.fields(self) if f.name != "source"}
        return ClicksTable(source=self.source, **fields)

    def filter(self, *, dataset: str | None = None, image_stems: Iterable[str] | None = None,
               click_type: str | None = None, device: str | None = None) -> "ClicksTable":
        """Rows of one dataset / split (``image_stem`` in ``image_stems``) / click type / device.

        Args:
          dataset: value of the ``dataset`` column (e.g. ``"TETRIS"``), None = all.
          image_stems: iterable of image stems (a split file), None = all.
          click_type: ``first``, ``fn`` or ``fp``, None = all.
          device: ``pc`` or ``mobile``, None = both.
        Returns:
          ClicksTable with the matching rows in file order.
        """
        keep = np.ones(len(self), bool)
        if dataset is not None:
            keep &= self.dataset == dataset
        if image_stems is not None:
            keep &= np.isin(self.image_stem, np.array(sorted(set(image_stems)), dtype=str))
        if click_type is not None:
            if click_type not in CLICK_TYPES:
                raise ValueError(f"click_type must be one of {CLICK_TYPES}, got {click_type!r}")
            keep &= self.click_type == click_type
        if device is not None:
            if device not in DEVICES:
                raise ValueError(f"device must be one of {DEVICES} or None, got {device!r}")
            keep &= self.device == device
        return self.select(keep)

    @functools.cached_property
    def rows_by_task(self) -> dict[str, np.ndarray]:
        """``full_stem -> int64[k]`` row indices (file order), tasks in order of first appearance."""
        stems, first, inverse = np.unique(self.full_stem, return_index=True, return_inverse=True)
        order = np.argsort(inverse, kind="stable")
        bounds = np.cumsum(np.bincount(inverse, minlength=len(stems)))
        groups = np.split(order, bounds[:-1])
        return {str(stems[i]): groups[i] for i in np.argsort(first)}


class TaskClicks(NamedTuple):
    """Clicks of one task (§1.2 step 3): positions in the (possibly capped) ``width x height`` frame."""

    full_stem: str
    dataset: str
    image_stem: str
    object_stem: str
    model_type: str
    click_type: str
    xs: np.ndarray       # int64[n] columns in [0, width)
    ys: np.ndarray       # int64[n] rows in [0, height)
    devices: np.ndarray  # str[n]
    width: int
    height: int


def image_object_stem_of(full_stem: str) -> str:
    """``full_stem`` cut before the first ``_ritm``, ``_sam``, ``_simple`` or ``_mivos`` (first-round stem).

    Replicates the reference's sequential ``split(marker)[0]`` (an image stem that
    itself contains a marker, e.g. ``dog_sample``, is cut there too).
    """
    stem = str(full_stem)
    for marker in ("_ritm", "_sam", "_simple", "_mivos"):
        stem = stem.split(marker)[0]
    return stem


def image_stem_of(full_stem: str) -> str:
    """Image stem of a task: :func:`image_object_stem_of` cut before ``_______``."""
    return image_object_stem_of(full_stem).split(OBJECT_SEPARATOR)[0]


def object_code(object_stem: str) -> int | None:
    """TETRIS object code of ``object_stem`` (``B*65536 + G*256 + R`` of the mask PNG); None for ``''``."""
    if object_stem == "":
        return None
    if not _INT_PATTERN.match(object_stem) or int(object_stem) < 0:
        raise ValueError(f"object_stem must be '' or a non-negative integer, got {object_stem!r}")
    return int(object_stem)


def limited_image_size(width: int, height: int, max_side: int | None) -> tuple[int, int]:
    """Image size after capping the longest side (TETRIS loader, §1.3).

    Args:
      width, height: original size in pixels.
      max_side: cap (TETRIS: 2048) or None for no cap.
    Returns:
      ``(w', h')``: if ``height > width``: ``h' = min(height, max_side)``,
      ``w' = int(width / height * h' + 0.5)``; else symmetric.
    """
    width, height = int(width), int(height)
    if width < 1 or height < 1:
        raise ValueError(f"width and height must be >= 1, got {width}x{height}")
    if max_side is None:
        return width, height
    if int(max_side) < 1:
        raise ValueError(f"max_side must be >= 1 or None, got {max_side}")
    if height > width:
        capped_height = min(height, int(max_side))
        return int(width / height * capped_height + 0.5), capped_height
    capped_width = min(width, int(max_side))
    return capped_width, int(height / width * capped_width + 0.5)


class _Location(NamedTuple):
    source: str
    line: int
    row: int

    def error(self, column: str | None, problem: str) -> ClicksCsvError:
        where = f"{self.source}: line {self.line} (data row {self.row})"
        if column is not None:
            where += f", column {column!r}"
        return ClicksCsvError(f"{where}: {problem}")


def _parse_int(text: str, location: _Location, column: str, minimum: int | None) -> int:
    if not _INT_PATTERN.match(text.strip()):
        raise location.error(column, f"expected an integer, got {text!r}")
    value = int(text)
    if minimum is not None and value < minimum:
        raise location.error(column, f"must be >= {minimum}, got {value}")
    return value


def _check_row_strict(values: dict[str, str], location: _Location) -> None:
    model_type, click_type = values["model_type"], values["click_type"]
    if model_type not in ("",) + MODEL_TYPES:
        raise location.error("model_type", f"must be '' or one of {MODEL_TYPES}, got {model_type!r} "
                                           "(strict=False accepts unknown values)")
    if (click_type == "first") != (model_type == ""):
        raise location.error("model_type", f"must be '' exactly for 'first' clicks, got {model_type!r} "
                                           f"with click_type {click_type!r}")
    object_stem = values["object_stem"]
    if object_stem and not (_INT_PATTERN.match(object_stem) and int(object_stem) >= 0):
        raise location.error("object_stem", f"must be '' or a non-negative integer, got {object_stem!r}")
    full_stem = values["full_stem"]
    derived = image_object_stem_of(full_stem)
    expected = values["image_stem"] + (OBJECT_SEPARATOR + object_stem if object_stem else "")
    if derived != expected:
        raise location.error("full_stem", f"{full_stem!r} names image/object {derived!r}, but the row's "
                                          f"image_stem/object_stem give {expected!r} (strict=False "
                                          "keeps the reference behaviour: the task maps to the image "
                                          "named by full_stem)")


def _check_tasks_consistent(table: ClicksTable) -> None:
    for full_stem, rows in table.rows_by_task.items():
        first_row = rows[0]
        for column in _TASK_COLUMNS:
            values = getattr(table, column)[rows]
            differs = np.nonzero(values != values[0])[0]
            if differs.size:
                bad = rows[differs[0]]
                location = _Location(table.source, int(table.line[bad]), int(bad) + 1)
                raise location.error(column, f"task {full_stem!r} has {values[differs[0]]!r} here but "
                                             f"{values[0]!r} on line {int(table.line[first_row])}; all rows "
                                             "of a task must agree (strict=False uses the first row, as "
                                             "the reference does)")


def parse_clicks_csv(stream: TextIO, *, source: str = "<clicks csv>", strict: bool = True) -> ClicksTable:
    """Parses and validates a clicks CSV from an open text stream (see module doc).

    Args:
      stream: text stream positioned at the header line.
      source: name used in error messages (a path).
      strict: apply the cross-field rules of the module doc.
    Returns:
      ClicksTable with every row, in file order.
    Raises:
      ClicksCsvError naming the line, data row and column of the first problem.
    """
    reader = csv.reader(stream)
    try:
        header = next(reader)
    except StopIteration:
        raise ClicksCsvError(f"{source}: empty file, expected a header with columns {CLICKS_COLUMNS}") from None
    header = [name.strip() for name in header]
    if header and header[0].startswith("\ufeff"):
        header[0] = header[0][1:]
    for name in set(header):
        if name in CLICKS_COLUMNS and header.count(name) > 1:
            raise ClicksCsvError(f"{source}: line 1 (header), column {name!r}: appears {header.count(name)} times")
    missing = [name for name in CLICKS_COLUMNS if name not in header]
    if missing:
        raise ClicksCsvError(f"{source}: line 1 (header): missing required column(s) {missing}; "
                             f"found {header}")
    position = {name: header.index(name) for name in CLICKS_COLUMNS}
    columns: dict[str, list] = {name: [] for name in CLICKS_COLUMNS}
    lines: list[int] = []
    row_number = 0
    try:
        for fields in reader:
            if not fields:  # blank line
                continue
            row_number += 1
            location = _Location(source, reader.line_num, row_number)
            if len(fields) != len(header):
                raise location.error(None, f"expected {len(header)} fields (as in the header), got {len(fields)}")
            values = {name: fields[position[name]] for name in CLICKS_COLUMNS}
            for name in ("dataset", "image_stem", "full_stem"):
                if values[name] == "":
                    raise location.error(name, "must not be empty")
            if values["click_type"] not in CLICK_TYPES:
                raise location.error("click_type", f"must be one of {CLICK_TYPES}, got {values['click_type']!r}")
            if values["device"] not in DEVICES:
                raise location.error("device", f"must be one of {DEVICES}, got {values['device']!r}")
            numbers = {name: _parse_int(values[name], location, name, 1 if name in ("w", "h") else None)
                       for name in _INT_COLUMNS}
            if strict:
                _check_row_strict(values, location)
            for name in _TEXT_COLUMNS:
                columns[name].append(values[name])
            for name in _INT_COLUMNS:
                columns[name].append(numbers[name])
            lines.append(reader.line_num)
    except csv.Error as error:
        raise ClicksCsvError(f"{source}: line {reader.line_num}: malformed CSV ({error})") from None
    arrays = {name: np.array(columns[name], dtype=str) for name in _TEXT_COLUMNS}
    arrays.update({name: np.array(columns[name], dtype=np.int64) for name in _INT_COLUMNS})
    table = ClicksTable(source=source, line=np.array(lines, dtype=np.int64), **arrays)
    if strict:
        _check_tasks_consistent(table)
    return table


def read_clicks_csv(path_or_file: PathOrFile, *, strict: bool = True) -> ClicksTable:
    """Reads and validates a clicks CSV file (see module doc).

    Args:
      path_or_file: path of the CSV, or an open text stream.
      strict: apply the cross-field rules (default True).
    Returns:
      ClicksTable.
    Raises:
      ClicksCsvError (a ValueError) naming the problem's line, row and column;
      FileNotFoundError when the path does not exist.
    """
    if isinstance(path_or_file, io.TextIOBase) or hasattr(path_or_file, "read"):
        return parse_clicks_csv(path_or_file, source=getattr(path_or_file, "name", "<stream>"), strict=strict)
    path = pathlib.Path(path_or_file)
    with open(path, newline="", encoding="utf-8") as stream:
        return parse_clicks_csv(stream, source=str(path), strict=strict)


def task_stems(table: ClicksTable, *, dataset: str | None = None, image_stems: Iterable[str] | None = None,
               available_image_stems: Iterable[str] | None = None) -> list[str]:
    """Task keys (``full_stem``) of a dataset, in order of first appearance (§1.2 steps 1-2).

    Args:
      table: the clicks table.
      dataset: restrict to this ``dataset`` value (None = all rows).
      image_stems: restrict to rows whose ``image_stem`` is in this split (None = all).
      available_image_stems: keep only tasks whose image stem (recovered from the
        full stem, :func:`image_stem_of`) exists in the dataset folder; None = keep all.
    Returns:
      list of full stems.
    """
    if dataset is not None or image_stems is not None:
        table = table.filter(dataset=dataset, image_stems=image_stems)
    stems = list(table.rows_by_task)
    if available_image_stems is None:
        return stems
    available = set(available_image_stems)
    return [stem for stem in stems if image_stem_of(stem) in available]


def task_clicks(table: ClicksTable, full_stem: str, *, device: str | None = None,
                max_side: int | None = None) -> TaskClicks:
    """Clicks of one task in image pixels (§1.2 step 3, reference ``Clicks.clicks``).

    ``x <- clip(x, 0, w - 1)``, ``y <- clip(y, 0, h - 1)`` with the task's CSV ``w, h``
    (of its first row); with ``max_side`` the frame is capped (:func:`limited_image_size`)
    and ``x <- floor(x w' / w)``, ``y <- floor(y h' / h)``.

    Args:
      table: clicks table (typically filtered to one dataset).
      full_stem: the task key.
      device: ``pc``, ``mobile`` or None (both, default).
      max_side: longest-side cap of the dataset loader (TETRIS: ``TETRIS_MAX_SIDE``), None = no cap.
    Returns:
      TaskClicks; ``xs``/``ys`` may be empty when ``device`` has no click in this task.
    Raises:
      KeyError if the task is not in the table; ValueError for a bad ``device``.
    """
    if device is not None and device not in DEVICES:
        raise ValueError(f"device must be one of {DEVICES} or None, got {device!r}")
    try:
        rows = table.rows_by_task[full_stem]
    except KeyError:
        raise KeyError(f"task {full_stem!r} is not in {table.source}") from None
    first = rows[0]
    if device is not None:
        rows = rows[table.device[rows] == device]
    width, height = int(table.w[first]), int(table.h[first])
    xs = np.clip(table.x[rows], 0, width - 1)
    ys = np.clip(table.y[rows], 0, height - 1)
    if max_side is not None:
        capped_width, capped_height = limited_image_size(width, height, max_side)
        xs = (xs * capped_width / width).astype(np.int64)
        ys = (ys * capped_height / height).astype(np.int64)
        width, height = capped_width, capped_height
    return TaskClicks(full_stem=str(full_stem), dataset=str(table.dataset[first]),
                      image_stem=str(table.image_stem[first]), object_stem=str(table.object_stem[first]),
                      model_type=str(table.model_type[first]), click_type=str(table.click_type[first]),
                      xs=xs.astype(np.int64), ys=ys.astype(np.int64), devices=table.device[rows],
                      width=width, height=height)


def read_split_file(path: Union[str, os.PathLike]) -> list[str]:
    """Image stems of a split file (``TETRIS_train.txt`` / ``TETRIS_val.txt``): one per line, blank lines skipped."""
    with open(path, encoding="utf-8") as stream:
        return [line.rstrip("\r\n") for line in stream if line.rstrip("\r\n")]


def pad_clicks(xs: Sequence[int] | np.ndarray, ys: Sequence[int] | np.ndarray,
               num_slots: int) -> tuple[np.ndarray, np.ndarray]:
    """Fixed-size point slots for the jitted map and metric functions.

    Args:
      xs, ys: int[n] click columns and rows.
      num_slots: number of slots S >= n.
    Returns:
      ``(points int32[S, 2] (x, y), valid bool[S])``; padding slots hold (0, 0) and False.
    """
    xs, ys = np.asarray(xs), np.asarray(ys)
    if xs.ndim != 1 or xs.shape != ys.shape:
        raise ValueError(f"xs and ys must be 1-D of one length, got shapes {xs.shape} and {ys.shape}")
    if xs.shape[0] > num_slots:
        raise ValueError(f"num_slots={num_slots} is smaller than the number of clicks ({xs.shape[0]})")
    points = np.zeros((num_slots, 2), np.int32)
    points[: xs.shape[0], 0] = xs
    points[: xs.shape[0], 1] = ys
    valid = np.zeros((num_slots,), bool)
    valid[: xs.shape[0]] = True
    return points, valid
