"""Tests of the progress display (tqdm optional, plain fallback)."""

from __future__ import annotations

import io
import sys

import pytest

from jaxseg_robust.runner.progress import NoProgress, PlainProgress, make_progress


def test_plain_progress_lines():
    stream = io.StringIO()
    bar = PlainProgress(4, desc="run7", stream=stream, interval_s=0.0)
    bar.update(2, 1)
    bar.close()
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("run7: 3/4 (75.0%) ok=2 failed=1 elapsed 00:00 eta ")
    assert lines[1].startswith("run7: 3/4 (75.0%) ok=2 failed=1")


def test_plain_progress_is_quiet_between_intervals():
    stream = io.StringIO()
    bar = PlainProgress(10, stream=stream, interval_s=3600.0)
    for _ in range(5):
        bar.update(1, 0)
    assert stream.getvalue() == ""
    bar.close()
    assert "5/10 (50.0%)" in stream.getvalue()


def test_auto_falls_back_to_plain_without_tqdm(monkeypatch):
    monkeypatch.setitem(sys.modules, "tqdm", None)
    monkeypatch.setitem(sys.modules, "tqdm.auto", None)
    assert isinstance(make_progress(3, "auto", stream=io.StringIO()), PlainProgress)
    with pytest.raises(ImportError):
        make_progress(3, "tqdm", stream=io.StringIO())


def test_modes():
    assert isinstance(make_progress(3, "none"), NoProgress)
    with pytest.raises(ValueError, match="progress mode must be one of"):
        make_progress(3, "fancy")
    pytest.importorskip("tqdm")
    stream = io.StringIO()
    bar = make_progress(3, "tqdm", desc="r", stream=stream)
    bar.update(2, 1)
    bar.close()
    assert "3/3" in stream.getvalue() and (bar.ok, bar.failed) == (2, 1)
