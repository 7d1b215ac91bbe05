"""Seconds per instance (device and wall) and compile seconds of a run, for every protocol's summary table.

Reads the side files of `jaxseg_robust.reports.artifacts` (``timings*.jsonl``,
``compile.jsonl``) and adds to a protocol's per-dataset table:

  sec_device    mean device seconds per instance of the dataset: the batch's device
                time until its outputs are ready, divided over the batch's instances;
  sec_wall      mean wall seconds per instance: the batch's host preparation and
                that call, divided the same way (`jaxseg_robust.runner.program.BatchProgram`);
  compile_sec   the run directory's total compile seconds (every bucket program of
                every session; in no per-instance time), the same in every row; the
                Markdown line also says how many programs came from JAX's persistent
                compilation cache (`jaxseg_robust.runner.compile_cache`).

The ``mean`` row of a table with several datasets averages the dataset rows, as
the tables' other columns do. The Markdown gets a small table of its own under
the protocol's table plus one line with the compile total; the CSV gets the three
columns (full precision; NaN where a dataset has no timed instance). Pure
functions of the read entries, except `add_timing`, which reads the run directory.

The compile line ends with the **device busy share** (`device_busy`): of the
wall time after compile, the part during which the device was computing a
batch, e.g. "device busy 83 % of 41.2 s after compile". Per session (one
command run: the ``session`` of the timing and compile lines), the wall span
runs from the host preparation of its first batch to the end of its last
batch's device work, less the compiles inside it; the busy time is the union
of the batches' device intervals (``batch_ended - batch_seconds`` to
``batch_ended``), less the same compiles. Sessions add up (a resumed run, the
processes of a multi-process run). Lines written before the timestamps were
recorded leave the share out.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import math
from collections.abc import Callable, Iterable, Mapping, Sequence

from jaxseg_robust.reports.tables import MEAN_ROW, markdown_table, nanmean

TIMING_CSV_COLUMNS = ("sec_device", "sec_wall", "compile_sec")


@dataclasses.dataclass(frozen=True)
class DatasetSeconds:
    """One dataset's seconds per instance.

    Attributes:
      dataset: the dataset's name (or ``"mean"``).
      timed: instances with a timing line.
      device, wall: mean device / wall seconds per instance (NaN when none, or a line without wall time).
    """

    dataset: str
    timed: int
    device: float
    wall: float


@dataclasses.dataclass(frozen=True)
class DeviceBusy:
    """Seconds the device computed (``busy``) in the wall time after compile (``wall``), over ``sessions``."""

    busy: float
    wall: float
    sessions: int

    @property
    def share(self) -> float:
        """busy / wall (NaN for no wall time)."""
        return self.busy / self.wall if self.wall > 0 else math.nan


@dataclasses.dataclass(frozen=True)
class CompileTotal:
    """The compile lines of a run directory: how many bucket programs were compiled, their seconds, and how
    many of them JAX read from its persistent compilation cache."""

    programs: int
    seconds: float
    from_cache: int = 0


def dataset_seconds(timings: Mapping[tuple[str, str], Mapping], datasets: Iterable[str]) -> list[DatasetSeconds]:
    """`DatasetSeconds` of each of ``datasets`` (in order) from `artifacts.read_timings` entries.

    A ``"mean"`` among ``datasets`` averages the rows of the other datasets.
    """
    rows = []
    for name in datasets:
        if name == MEAN_ROW:
            continue
        entries = [entry for (dataset, _), entry in timings.items() if dataset == name]
        rows.append(DatasetSeconds(name, len(entries), nanmean(float(e["seconds"]) for e in entries),
                                   nanmean(float(e.get("wall_seconds", math.nan)) for e in entries)))
    if MEAN_ROW in datasets:
        rows.append(DatasetSeconds(MEAN_ROW, sum(r.timed for r in rows), nanmean(r.device for r in rows),
                                   nanmean(r.wall for r in rows)))
    return rows


def compile_total(events: Iterable[Mapping]) -> CompileTotal:
    """`CompileTotal` of `artifacts.read_compile_events` lines."""
    events = list(events)
    seconds = [float(event["seconds"]) for event in events]
    return CompileTotal(len(seconds), float(sum(seconds)), sum(bool(event.get("from_cache")) for event in events))


Interval = tuple[float, float]


def merged_intervals(intervals: Iterable[Interval]) -> list[Interval]:
    """The union of (start, end) intervals as sorted disjoint intervals (empty or non-finite ones dropped)."""
    result: list[list[float]] = []
    for start, end in sorted((float(a), float(b)) for a, b in intervals
                             if math.isfinite(a) and math.isfinite(b) and b > a):
        if result and start <= result[-1][1]:
            result[-1][1] = max(result[-1][1], end)
        else:
            result.append([start, end])
    return [(start, end) for start, end in result]


def overlap_seconds(first: Sequence[Interval], second: Sequence[Interval]) -> float:
    """Length of the intersection of two `merged_intervals` results."""
    total, i, j = 0.0, 0, 0
    while i < len(first) and j < len(second):
        total += max(0.0, min(first[i][1], second[j][1]) - max(first[i][0], second[j][0]))
        if first[i][1] < second[j][1]:
            i += 1
        else:
            j += 1
    return total


def _session_busy(lines: Sequence[Mapping], compiles: Sequence[Interval]) -> tuple[float, float]:
    """(busy, wall) seconds after compile of one session's timing lines (module docstring)."""
    batches = {(float(e["batch_started"]), float(e["batch_ended"]), float(e["batch_seconds"])) for e in lines}
    span = (min(b[0] for b in batches), max(b[1] for b in batches))
    device = merged_intervals((max(span[0], end - seconds), end) for _, end, seconds in batches)
    compiles = merged_intervals(compiles)
    wall = (span[1] - span[0]) - overlap_seconds([span], compiles)
    busy = sum(end - start for start, end in device) - overlap_seconds(device, compiles)
    return busy, wall


def device_busy(timing_lines: Iterable[Mapping], compile_events: Iterable[Mapping]) -> DeviceBusy | None:
    """`DeviceBusy` of `artifacts.read_timing_lines` and `artifacts.read_compile_events` entries
    (module docstring); None when no line has the batch timestamps."""
    sessions: dict[str, list[Mapping]] = {}
    for entry in timing_lines:
        stamps = (entry.get("batch_started", math.nan), entry.get("batch_ended", math.nan))
        if all(isinstance(v, (int, float)) and math.isfinite(v) for v in stamps):
            sessions.setdefault(str(entry.get("session", "")), []).append(entry)
    if not sessions:
        return None
    compiles: dict[str, list[Interval]] = {}
    for event in compile_events:
        ended = float(event.get("ended", math.nan))
        compiles.setdefault(str(event.get("session", "")), []).append((ended - float(event["seconds"]), ended))
    totals = [_session_busy(lines, compiles.get(name, [])) for name, lines in sessions.items()]
    return DeviceBusy(sum(t[0] for t in totals), sum(t[1] for t in totals), len(totals))


def _busy_text(busy: DeviceBusy | None) -> str:
    if busy is None or not math.isfinite(busy.share):
        return ""
    return f"; device busy {100 * busy.share:.0f} % of {busy.wall:.1f} s after compile"


def _seconds_text(value: float) -> str:
    return "–" if not math.isfinite(value) else f"{value:.3g}"


def timing_markdown(rows: Iterable[DatasetSeconds], compiled: CompileTotal, busy: DeviceBusy | None = None) -> str:
    """The seconds table (s/instance device, s/instance wall per dataset) and the compile line, ending with
    the device busy share when ``busy`` has one."""
    table = markdown_table(("dataset", "timed", "s/instance device", "s/instance wall"),
                           ([r.dataset, str(r.timed), _seconds_text(r.device), _seconds_text(r.wall)] for r in rows))
    return (f"{table}\n\ncompile: {compiled.seconds:.1f} s for {compiled.programs} bucket program(s), "
            f"{compiled.from_cache} from the cache, in no per-instance time (device: the jitted batch call; wall: "
            "with the batch's host preparation)"
            f"{_busy_text(busy)}")


def _with_columns(csv_text: str, seconds_of: Callable[[dict], DatasetSeconds | None],
                  compiled: CompileTotal) -> str:
    """``csv_text`` with `TIMING_CSV_COLUMNS` after its own: ``seconds_of(row)`` (None: NaN) and the compile total."""
    reader = csv.DictReader(io.StringIO(csv_text))
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=[*(reader.fieldnames or ()), *TIMING_CSV_COLUMNS], lineterminator="\n")
    writer.writeheader()
    for line in reader:
        row = seconds_of(line)
        writer.writerow({**line, "sec_device": repr(math.nan if row is None else row.device),
                         "sec_wall": repr(math.nan if row is None else row.wall),
                         "compile_sec": repr(compiled.seconds)})
    return out.getvalue()


def csv_with_timing(csv_text: str, rows: Iterable[DatasetSeconds], compiled: CompileTotal) -> str:
    """``csv_text`` (a table whose first column is ``dataset``) with `TIMING_CSV_COLUMNS` added to every row.

    Raises:
      ValueError: the table has no ``dataset`` column.
    """
    by_name = {row.dataset: row for row in rows}
    fields = next(csv.reader(io.StringIO(csv_text)), [])
    if "dataset" not in fields:
        raise ValueError(f"a summary CSV needs a dataset column; got {fields}")
    return _with_columns(csv_text, lambda line: by_name.get(line["dataset"]), compiled)


def add_timing(run_dir, markdown: str, csv_text: str) -> tuple[str, str]:
    """(Markdown, CSV) of a protocol's summary table with the run directory's seconds added (module docstring)."""
    from jaxseg_robust.reports.artifacts import read_compile_events, read_timing_lines, read_timings  # noqa: PLC0415

    # a table of several rows per dataset (one per model, say) gets one seconds row per dataset
    datasets = list(dict.fromkeys(line["dataset"] for line in csv.DictReader(io.StringIO(csv_text))))
    rows = dataset_seconds(read_timings(run_dir), datasets)
    events = read_compile_events(run_dir)
    compiled, busy = compile_total(events), device_busy(read_timing_lines(run_dir), events)
    return f"{markdown}\n\n{timing_markdown(rows, compiled, busy)}", csv_with_timing(csv_text, rows, compiled)


def add_run_timing(run_dir, markdown: str, csv_text: str) -> tuple[str, str]:
    """As `add_timing` for a table without a dataset column (perturb: one row per attack): the seconds table
    lists the timed datasets (and their ``mean`` with several), and every CSV row gets the run's
    seconds (that mean, or the one dataset's) and the compile total."""
    from jaxseg_robust.reports.artifacts import read_compile_events, read_timing_lines, read_timings  # noqa: PLC0415

    timings = read_timings(run_dir)
    datasets = list(dict.fromkeys(dataset for dataset, _ in timings))
    rows = dataset_seconds(timings, datasets + ([MEAN_ROW] if len(datasets) > 1 else []))
    events = read_compile_events(run_dir)
    compiled, busy = compile_total(events), device_busy(read_timing_lines(run_dir), events)
    overall = rows[-1] if rows else None
    return (f"{markdown}\n\n{timing_markdown(rows, compiled, busy)}",
            _with_columns(csv_text, lambda line: overall, compiled))


__all__ = ["TIMING_CSV_COLUMNS", "DatasetSeconds", "DeviceBusy", "CompileTotal", "dataset_seconds", "compile_total",
           "merged_intervals", "overlap_seconds", "device_busy", "timing_markdown", "csv_with_timing", "add_timing", "add_run_timing"]
