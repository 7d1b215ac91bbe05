"""Seconds per instance (device, wall) and the compile total added to a protocol's summary table."""

from __future__ import annotations

import csv
import io
import math

import pytest

from jaxseg_robust.reports import artifacts
from jaxseg_robust.reports.timing_summary import (
    CompileTotal,
    DeviceBusy,
    add_run_timing,
    add_timing,
    compile_total,
    csv_with_timing,
    dataset_seconds,
    device_busy,
    merged_intervals,
    overlap_seconds,
    timing_markdown,
)
from jaxseg_robust.runner.program import CompileEvent

TIMINGS = {("A", "1"): {"seconds": 1.0, "wall_seconds": 2.0}, ("A", "2"): {"seconds": 3.0, "wall_seconds": 4.0},
           ("B", "1"): {"seconds": 5.0}}  # a line written before wall times were recorded


def test_dataset_means_and_the_mean_row():
    rows = dataset_seconds(TIMINGS, ["A", "B", "C", "mean"])
    assert [(r.dataset, r.timed, r.device) for r in rows] == [("A", 2, 2.0), ("B", 1, 5.0), ("C", 0, rows[2].device),
                                                               ("mean", 3, 3.5)]
    assert rows[0].wall == 3.0 and math.isnan(rows[1].wall) and math.isnan(rows[2].device)
    assert rows[3].wall == 3.0  # the mean of the dataset rows that have one
    assert compile_total([{"seconds": 1.25}, {"seconds": 2.0}]) == CompileTotal(2, 3.25, 0)
    # issue 30: programs JAX read from its persistent cache are counted (older lines have no from_cache)
    events = [{"seconds": 9.0, "from_cache": False}, {"seconds": 0.5, "from_cache": True}, {"seconds": 1.0}]
    assert compile_total(events) == CompileTotal(3, 10.5, 1)
    assert "compile: 10.5 s for 3 bucket program(s), 1 from the cache, in no per-instance time" in \
        timing_markdown([], compile_total(events))


def test_csv_gets_three_columns_by_dataset_and_markdown_a_table_and_the_compile_line():
    rows = dataset_seconds(TIMINGS, ["A", "B", "mean"])
    table = "dataset,ok,iou\nA,2,0.5\nB,1,0.25\nmean,3,0.375\n"
    parsed = list(csv.DictReader(io.StringIO(csv_with_timing(table, rows, CompileTotal(2, 3.25)))))
    assert [r["iou"] for r in parsed] == ["0.5", "0.25", "0.375"]  # the table's own columns unchanged
    assert [float(r["sec_device"]) for r in parsed] == [2.0, 5.0, 3.5]
    assert parsed[0]["sec_wall"] == "3.0" and parsed[1]["sec_wall"] == "nan"
    assert {r["compile_sec"] for r in parsed} == {"3.25"}
    markdown = timing_markdown(rows, CompileTotal(2, 3.25))
    assert "| A | 2 | 2 | 3 |" in markdown and "| B | 1 | 5 | – |" in markdown
    assert "compile: 3.2 s for 2 bucket program(s)" in markdown
    with pytest.raises(ValueError, match="dataset column"):
        csv_with_timing("name,iou\nA,0.5\n", rows, CompileTotal(0, 0.0))


def test_add_timing_reads_the_run_directory(tmp_path):
    artifacts.append_timing(tmp_path, artifacts.timing_line(("A", "1"), 0.5, 1, 0, 0.75))
    artifacts.append_compile_events(tmp_path, [CompileEvent("p", (8, 8), 1, 2.0),
                                                CompileEvent("p", (8, 16), 1, 0.25, from_cache=True)])
    assert [e["from_cache"] for e in artifacts.read_compile_events(tmp_path)] == [False, True]
    markdown, csv_text = add_timing(tmp_path, "| dataset |\n|---|\n| A |", "dataset\nA\n")
    assert markdown.startswith("| dataset |\n|---|\n| A |\n\n| dataset | timed | s/instance device |")
    assert csv_text == "dataset,sec_device,sec_wall,compile_sec\nA,0.5,0.75,2.25\n"
    assert "compile: 2.2 s for 2 bucket program(s), 1 from the cache" in markdown
    assert "device busy" not in markdown  # a line without the batch timestamps: no share


def test_interval_union_and_overlap():
    assert merged_intervals([(5, 7), (1, 3), (2, 4), (6, 6), (math.nan, 9)]) == [(1, 4), (5, 7)]
    assert overlap_seconds([(1, 4), (5, 7)], [(3, 6)]) == 2.0
    assert overlap_seconds([(0, 10)], []) == 0.0


def _synthetic_run(run_dir):
    """Two sessions. s1: batches A (host from 100, device 102-112) and B (host from 104, device 116-124),
    a compile 100-103; s2: one batch (host from 500, device 502-504); and an old line without stamps."""
    def line(key, seconds, span, session, instances=1):
        artifacts.append_timing(run_dir, artifacts.timing_line(key, seconds, instances, 0, seconds + 1, span, session))

    line(("A", "1"), 10.0, (100.0, 112.0), "s1", 2)
    line(("A", "2"), 10.0, (100.0, 112.0), "s1", 2)  # the same batch: counted once
    line(("A", "3"), 8.0, (104.0, 124.0), "s1")
    line(("B", "1"), 2.0, (500.0, 504.0), "s2")
    line(("B", "2"), 7.0, (math.nan, math.nan), "")
    artifacts.append_compile_events(run_dir, [CompileEvent("p", (8, 8), 2, 3.0, 103.0)], 0, "s1")
    artifacts.append_compile_events(run_dir, [CompileEvent("p", (8, 8), 1, 50.0, 560.0)], 0, "s2")  # after s2's span


def test_device_busy_share_of_a_synthetic_run(tmp_path):
    _synthetic_run(tmp_path)
    busy = device_busy(artifacts.read_timing_lines(tmp_path), artifacts.read_compile_events(tmp_path))
    # s1: wall 24 - 3 (compile) = 21, busy 10 + 8 - 1 (102-103 is compile) = 17; s2: wall 4, busy 2
    assert busy == DeviceBusy(19.0, 25.0, 2) and busy.share == pytest.approx(0.76)
    markdown, _ = add_timing(tmp_path, "| dataset |\n|---|\n| A |", "dataset\nA\nB\n")
    compile_line = markdown.splitlines()[-1]
    assert compile_line.startswith("compile: 53.0 s for 2 bucket program(s), 0 from the cache, in no per-instance time")
    assert compile_line.endswith("; device busy 76 % of 25.0 s after compile")
    run_markdown, _ = add_run_timing(tmp_path, "| attack |", "attack\nx\n")
    assert run_markdown.endswith("; device busy 76 % of 25.0 s after compile")
    assert device_busy([{"seconds": 1.0, "batch_seconds": 1.0}], []) is None
    assert math.isnan(DeviceBusy(0.0, 0.0, 1).share) and "device busy" not in timing_markdown(
        [], CompileTotal(0, 0.0), DeviceBusy(0.0, 0.0, 1))
