"""Per-dataset tables of a run's records: rows, grouping by dataset, means, Markdown and CSV text (pure).

The prompt-protocol reports (`jaxseg_robust.reports.breps`, `.grid`,
`.tetris`) are one table each: a `DatasetRow` per dataset in first-seen order
and, with several datasets, a ``mean`` row (`with_mean_row`). Each row holds
its ok / failed instance counts and ``values``: column name -> float, a
fraction in [0, 1] unless the protocol says otherwise (e.g. NoC in clicks).
The CSV text keeps full precision (``repr``); the Markdown table is what the
terminal shows (fractions x100 via `percent`). Nothing here reads or writes
files (`jaxseg_robust.reports.report_files` does).
"""

from __future__ import annotations

import csv
import dataclasses
import io
import math
from collections.abc import Callable, Iterable, Mapping, Sequence

import numpy as np

MEAN_ROW = "mean"


@dataclasses.dataclass(frozen=True)
class DatasetRow:
    """One dataset's line of a table.

    Attributes:
      dataset: dataset name (or ``"mean"`` for the average over datasets).
      ok: instances recorded as ok; failed: instances recorded as failed.
      values: column -> value (a fraction in [0, 1] unless the table says otherwise; NaN when nothing defined).
      undefined: ok instances with a NaN in one of the row's per-instance values, for tables whose
        means skip NaNs and say how many they skipped (BREPS); 0 in the others.
    """

    dataset: str
    ok: int
    failed: int
    values: Mapping[str, float]
    undefined: int = 0


def number(value) -> float:
    """A record scalar as float (JSON null -> NaN)."""
    return math.nan if value is None else float(value)


def nanmean(values: Iterable[float]) -> float:
    """Mean of ``values`` with NaNs skipped (float64); NaN when none is left."""
    array = np.asarray(list(values), np.float64)
    array = array[~np.isnan(array)]
    return float(array.mean()) if array.size else math.nan


def percent(value: float) -> str:
    """A fraction as a percentage with two decimals (``0.5 -> "50.00"``; NaN -> ``"nan"``)."""
    return "nan" if math.isnan(value) else f"{100.0 * value:.2f}"


def group_by_dataset(records: Iterable[Mapping], convert: Callable[[Mapping], object] | None = None,
                     what: str = "run") -> tuple[dict[str, list], dict[str, int]]:
    """Splits a run's records by dataset (first-seen order): ok ones kept, the others counted as failed.

    Args:
      records: latest record per instance: dicts with ``dataset``, ``id``, ``status``
        and, when ok, ``payload``.
      convert: payload -> what is kept of an ok record (default: the payload);
        a KeyError or TypeError it raises (a missing field: a record of another
        protocol) becomes a ValueError naming the record.
      what: what kind of run the records should be of, for that message (``"BREPS 'min' run"``).

    Returns:
      (dataset -> list of the kept ok payloads, dataset -> count of failed
      records); both have every dataset as a key, in first-seen order.

    Raises:
      ValueError: ``convert`` failed on an ok record's payload.
    """
    ok: dict[str, list] = {}
    failed: dict[str, int] = {}
    for record in records:
        dataset = str(record.get("dataset", ""))
        ok.setdefault(dataset, [])
        failed.setdefault(dataset, 0)
        if record.get("status") != "ok":
            failed[dataset] += 1
            continue
        payload = record.get("payload") or {}
        if convert is None:
            ok[dataset].append(payload)
            continue
        try:
            ok[dataset].append(convert(payload))
        except (KeyError, TypeError) as error:
            raise ValueError(f"record {dataset}/{record.get('id')} has no field {error} of a {what}") from None
    return ok, failed


def with_mean_row(rows: Sequence[DatasetRow], columns: Sequence[str], *, skip_nan: bool = True) -> tuple:
    """``rows`` plus, when there are several, a ``mean`` row: counts summed, each column averaged.

    The average runs over the rows with ok instances; ``skip_nan`` leaves NaN
    values out of it (else a NaN propagates, as the TETRIS reference's ``np.mean``).

    Returns:
      tuple of `DatasetRow`s.
    """
    rows = tuple(rows)
    if len(rows) <= 1:
        return rows
    means = {}
    for column in columns:
        values = [row.values[column] for row in rows if row.ok]
        if skip_nan:
            means[column] = nanmean(values)
        else:
            means[column] = float(np.asarray(values, np.float64).mean()) if values else math.nan
    return (*rows, DatasetRow(MEAN_ROW, sum(r.ok for r in rows), sum(r.failed for r in rows), means,
                              sum(r.undefined for r in rows)))


def markdown_table(headers: Sequence[str], rows: Iterable[Sequence[str]], *, align_numbers: bool = True) -> str:
    """A Markdown table of text cells (no trailing newline).

    Args:
      headers: column headers.
      rows: each a sequence of cell texts, as many as ``headers``.
      align_numbers: right-align every column but the first (``|---|---:|``); else ``|---|---|``.
    """
    rule = ["---"] + ["---:" if align_numbers else "---"] * (len(headers) - 1)
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join(rule) + "|"]
    lines += ["| " + " | ".join(cells) + " |" for cells in rows]
    return "\n".join(lines)


def csv_text(header: Sequence[str], rows: Iterable[Sequence]) -> str:
    """CSV text (``\\n`` line ends) of a header and rows of cells."""
    handle = io.StringIO()
    writer = csv.writer(handle, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    return handle.getvalue()


def exact_values(row: DatasetRow, columns: Sequence[str]) -> list[str]:
    """The row's values of ``columns`` as CSV cells at full precision (``repr`` of the float)."""
    return [repr(float(row.values[column])) for column in columns]


# How a table's tight-box prompt was decoded (docs/protocols/breps.md §4.6, grids.md §5.2): "multimask" = the
# multimask output and the model's selection (SAM: argmax of the predicted IoUs), "single" = the single-mask output.
TIGHT_DECODINGS = {"multimask": "multimask + selection", "single": "single mask"}


def tight_header(header: str, decoding: str) -> str:
    """A Markdown header of a tight-box column with its decoding rule: ``IoU-Tight@BBox (multimask + selection)``,
    ``IoU-Tight (resized, single mask)``."""
    label = TIGHT_DECODINGS[decoding]
    return f"{header[:-1]}, {label})" if header.endswith(")") else f"{header} ({label})"


def tight_column(column: str, decoding: str) -> str:
    """The CSV name of a tight-box column with its decoding rule: ``iou_tight`` -> ``iou_tight_multimask``,
    ``iou_tight_resized`` -> ``iou_tight_single_resized``; other columns unchanged."""
    if decoding not in TIGHT_DECODINGS:
        raise ValueError(f"decoding must be one of {sorted(TIGHT_DECODINGS)}; got {decoding!r}")
    return column.replace("_tight", f"_tight_{decoding}", 1)


CLICK_CSV_HEADER = ("dataset", "id", "trajectory", "click", "x", "y", "label", "iou", "biou")


def click_csv_text(rows: Iterable[tuple]) -> str:
    """The per-instance, per-click CSV (RITM's ``--save-ious`` as a table): one row per instance x click.

    Args:
      rows: ``(dataset, id, trajectory, click (1-based), x, y, label, iou, biou)``; ``x, y`` the click
        in original-image pixels (docs/ARCHITECTURE.md, "Clicks in records"), ``label`` 1 positive /
        0 negative (``""`` for all three when the record holds no clicks); iou / biou a float, NaN or
        None (JSON null: undefined, e.g. an empty union) or, for biou, ``""`` when the record holds
        none (RClicks runs written before it recorded BIoU).

    Returns:
      CSV text with header `CLICK_CSV_HEADER`; floats at full precision (``repr``), undefined as ``nan``.
    """
    def cell(value):
        if isinstance(value, str):
            return value
        return repr(number(value))

    def coordinate(value):
        if isinstance(value, str):
            return value
        value = float(value)
        return str(int(value)) if value.is_integer() else repr(value)

    return csv_text(CLICK_CSV_HEADER, ([dataset, name, trajectory, int(click), coordinate(x), coordinate(y),
                                        label if label == "" else int(label), cell(iou), cell(biou)]
                                       for dataset, name, trajectory, click, x, y, label, iou, biou in rows))


__all__ = ["MEAN_ROW", "DatasetRow", "number", "nanmean", "percent", "group_by_dataset", "with_mean_row",
           "markdown_table", "csv_text", "exact_values", "TIGHT_DECODINGS", "tight_header", "tight_column",
           "CLICK_CSV_HEADER", "click_csv_text"]
