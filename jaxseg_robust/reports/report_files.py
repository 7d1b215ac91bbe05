"""The files of a report: a run's records in, table files, example plots and ``report.md`` out.

A protocol's report (`jaxseg_robust.reports.tetris.write_report`, ...) reads
the latest record of every instance (`load_run_records`), writes its table as
``<stem>.md`` / ``<stem>.csv`` (`write_table_files`) into the report folder
(`report_folder`, default ``RUN_DIR/report``), draws plots for a few example
instances per dataset (`example_records`, file names from `file_stem`) and
ends with ``report.md`` (`write_report_page`: the page's parts plus a
"Failed instances" section).
"""

from __future__ import annotations

import hashlib
import pathlib
import re
from collections.abc import Callable, Iterable, Iterator, Mapping

REPORT_DIR = "report"


def load_run_records(run_dir) -> list[dict]:
    """The latest record of every instance of a run directory (all processes' files)."""
    from jaxseg_robust.runner.records import latest_records, read_run_records  # noqa: PLC0415

    return list(latest_records(read_run_records(pathlib.Path(run_dir))).values())


HASH_MARK = "~"  # never produced by `sanitize_name`, so a marked stem cannot equal an unmarked one
_HASH_CHARS = 8


def sanitize_name(text: str) -> str:
    """``text`` with every run of characters outside ``[A-Za-z0-9._-]`` replaced by ``_`` (stripped; "x" if empty).

    Not injective ("a b" and "a_b" give "a_b"): file names use `file_stem` / `safe_name`.
    """
    return re.sub(r"[^A-Za-z0-9._-]+", "_", str(text)).strip("_") or "x"


def file_stem(*parts: str) -> str:
    """An injective, file-name-safe stem for a key such as ``(dataset, id)``: distinct keys, distinct files.

    The parts are sanitized (`sanitize_name`) and joined with ``_``; when that
    could lose information (a part was changed by sanitizing, or a part other
    than the last holds ``_``, so the join could be split two ways) the stem
    gets ``~`` and the first 8 hex digits of the SHA-256 of the parts, e.g.
    ``("toy", "a b") -> "toy_a_b~1c0e…"`` while ``("toy", "a_b") -> "toy_a_b"``.
    Stable across runs and machines (the hash depends only on the parts).
    """
    if not parts:
        raise ValueError("file_stem needs at least one part")
    texts = [str(part) for part in parts]
    safe = [sanitize_name(text) for text in texts]
    ambiguous = any(a != b for a, b in zip(safe, texts)) or any("_" in text for text in safe[:-1])
    stem = "_".join(safe)
    if not ambiguous:
        return stem
    digest = hashlib.sha256("\x00".join(texts).encode("utf-8", "surrogatepass")).hexdigest()[:_HASH_CHARS]
    return f"{stem}{HASH_MARK}{digest}"


def safe_name(text: str) -> str:
    """An injective file-name-safe version of one dataset or instance name (`file_stem` of one part)."""
    return file_stem(text)


def failed_lines(records: Iterable[Mapping]) -> list[str]:
    """``- dataset/id: error`` for every failed record."""
    return [f"- {r.get('dataset')}/{r.get('id')}: {r.get('error')}" for r in records if r.get("status") != "ok"]


def report_folder(run_dir, out_dir=None) -> pathlib.Path:
    """``out_dir`` (default ``RUN_DIR/report``), created if missing."""
    out = pathlib.Path(out_dir) if out_dir is not None else pathlib.Path(run_dir) / REPORT_DIR
    out.mkdir(parents=True, exist_ok=True)
    return out


def write_table_files(out_dir, stem: str, markdown: str, csv_text: str) -> dict[str, pathlib.Path]:
    """Writes ``<stem>.md`` (plus a final newline) and ``<stem>.csv`` into ``out_dir``.

    Returns:
      ``{"<stem>_md": path, "<stem>_csv": path}``.
    """
    out_dir = pathlib.Path(out_dir)
    paths = {f"{stem}_md": out_dir / f"{stem}.md", f"{stem}_csv": out_dir / f"{stem}.csv"}
    paths[f"{stem}_md"].write_text(markdown + "\n", encoding="utf-8")
    paths[f"{stem}_csv"].write_text(csv_text, encoding="utf-8")
    return paths


def example_records(records: Iterable[Mapping], max_examples: int, load: Callable[[Mapping], object],
                    missing: list[str]) -> Iterator[tuple[Mapping, object]]:
    """Yields ``(record, load(record))`` for up to ``max_examples`` ok records per dataset, in record order.

    A record whose ``load`` returns None (its image or heatmap file is gone)
    is not counted: its ``dataset/id`` is appended to ``missing`` and the next
    record of the dataset is tried.
    """
    shown: dict[str, int] = {}
    for record in records:
        if record.get("status") != "ok" or shown.get(record["dataset"], 0) >= max_examples:
            continue
        loaded = load(record)
        if loaded is None:
            missing.append(f"{record['dataset']}/{record['id']}")
            continue
        shown[record["dataset"]] = shown.get(record["dataset"], 0) + 1
        yield record, loaded


def write_report_page(out_dir, parts: list[str], records: Iterable[Mapping],
                      paths: dict[str, pathlib.Path]) -> dict[str, pathlib.Path]:
    """Writes ``report.md``: ``parts`` (lines) plus a "Failed instances" section when any record failed.

    Returns:
      ``paths`` with ``"report"`` added.
    """
    failed = failed_lines(records)
    if failed:
        parts = [*parts, "## Failed instances", "", *failed, ""]
    paths["report"] = pathlib.Path(out_dir) / "report.md"
    paths["report"].write_text("\n".join(parts), encoding="utf-8")
    return paths


__all__ = ["REPORT_DIR", "load_run_records", "sanitize_name", "file_stem", "safe_name", "failed_lines",
           "report_folder", "write_table_files", "example_records", "write_report_page"]
