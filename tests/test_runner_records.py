"""Tests of the append-only JSON Lines records."""

from __future__ import annotations

import json
import math

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from jaxseg_robust.runner.records import (
    RecordsError,
    RecordWriter,
    done_keys,
    encode_record,
    latest_records,
    make_record,
    read_records,
    read_run_records,
    to_jsonable,
)


def test_to_jsonable_converts_arrays_and_scalars():
    payload = {
        "f32": np.float32(0.1),
        "i64": np.int64(7),
        "b": np.bool_(True),
        "arr": np.arange(6, dtype=np.int16).reshape(2, 3),
        "jax": jnp.array([0.5, 1.5], jnp.float32),
        "nested": {"t": (1, 2.5, None, "s")},
        "bools": np.array([True, False]),
        "bf16": jnp.array([1.5, -2.0], jnp.bfloat16),
        "bf16_scalar": jnp.bfloat16(0.25),
        "f64": np.float64(0.1),
    }
    out = to_jsonable(payload)
    assert out == {
        "f32": float(np.float32(0.1)), "i64": 7, "b": True, "arr": [[0, 1, 2], [3, 4, 5]],
        "jax": [0.5, 1.5], "nested": {"t": [1, 2.5, None, "s"]}, "bools": [True, False],
        "bf16": [1.5, -2.0], "bf16_scalar": 0.25, "f64": 0.1,
    }
    assert type(out["i64"]) is int and type(out["b"]) is bool and type(out["f64"]) is float


@pytest.mark.parametrize(
    "payload, message",
    [
        ({1: 2}, "payload: mapping keys must be str"),
        ({"a": {"b": object()}}, "payload.a.b: cannot store a object"),
        ({"a": [np.array(["x"])]}, r"payload.a\[0\]: arrays must be bool, integer or float"),
    ],
)
def test_to_jsonable_names_the_bad_key(payload, message):
    with pytest.raises(RecordsError, match=message):
        to_jsonable(payload)


@given(st.lists(st.floats(allow_nan=True, allow_infinity=True, width=32), max_size=6))
def test_float32_values_round_trip_exactly(values):
    array = np.array(values, np.float32)
    line = encode_record(make_record(("d", "i"), "ok", {"v": array}))
    back = np.array(json.loads(line)["payload"]["v"], np.float32)
    np.testing.assert_array_equal(back, array)  # NaN == NaN for assert_array_equal


def test_make_record_fields():
    ok = make_record(("d", "a"), "ok", {"x": 1})
    assert ok == {"dataset": "d", "id": "a", "status": "ok", "error": None, "payload": {"x": 1}}
    failed = make_record(("d", "b"), "failed", error="ValueError: x", traceback_text="tb")
    assert failed["payload"] == {} and failed["traceback"] == "tb" and failed["error"] == "ValueError: x"
    with pytest.raises(RecordsError, match="status must be one of"):
        make_record(("d", "a"), "done")


def test_writer_appends_and_reader_reads(tmp_path):
    path = tmp_path / "records.jsonl"
    with RecordWriter(path) as writer:
        assert writer.write_batch([make_record(("d", str(i)), "ok", {"i": i}) for i in range(3)]) == 3
        writer.write_batch([])
    with RecordWriter(path) as writer:
        writer.write_batch([make_record(("d", "3"), "ok", {"i": 3})])
    records = read_records(path)
    assert [r["payload"]["i"] for r in records] == [0, 1, 2, 3]
    assert read_records(tmp_path / "absent.jsonl") == []


def test_truncated_last_line_is_ignored_and_cut_before_appending(tmp_path):
    path = tmp_path / "records.jsonl"
    complete = encode_record(make_record(("d", "a"), "ok", {"v": [1, 2]}))
    partial = encode_record(make_record(("d", "b"), "ok", {"v": [3, 4]}))
    for cut in range(len(partial)):  # every possible kill point inside the second line
        path.write_text(complete + partial[:cut])
        assert [r["id"] for r in read_records(path)] == ["a"]
        with RecordWriter(path) as writer:
            assert writer.repaired_bytes == cut
            writer.write_batch([make_record(("d", "c"), "ok", {})])
        assert path.read_text() == complete + encode_record(make_record(("d", "c"), "ok", {}))
    path.write_text('{"dataset": "d", "id": "x"')  # nothing complete at all
    assert read_records(path) == []
    RecordWriter(path).close()
    assert path.read_text() == ""


def test_corrupt_complete_line_is_an_error_naming_file_and_line(tmp_path):
    path = tmp_path / "records.jsonl"
    good = encode_record(make_record(("d", "a"), "ok", {}))
    path.write_text(good + "not json\n" + good)
    with pytest.raises(RecordsError, match=r"records.jsonl:2: not valid JSON"):
        read_records(path)
    path.write_text(good + '{"dataset": "d", "id": "b", "status": "maybe", "payload": {}}\n')
    with pytest.raises(RecordsError, match=r"records.jsonl:2: unknown status 'maybe'"):
        read_records(path)
    path.write_text('{"dataset": "d", "status": "ok", "payload": {}}\n')
    with pytest.raises(RecordsError, match=r":1: field 'id' missing"):
        read_records(path)


def test_latest_record_wins_and_done_keys(tmp_path):
    with RecordWriter(tmp_path / "records.jsonl") as writer:
        writer.write_batch([make_record(("d", "a"), "failed", error="E: x"), make_record(("d", "b"), "ok", {})])
        writer.write_batch([make_record(("d", "a"), "ok", {"retried": True})])
    with RecordWriter(tmp_path / "records.process1.jsonl") as writer:
        writer.write_batch([make_record(("d", "c"), "failed", error="E: y")])
    latest = latest_records(read_run_records(tmp_path))
    assert latest[("d", "a")]["payload"] == {"retried": True}
    assert done_keys(latest) == {("d", "a"), ("d", "b"), ("d", "c")}
    assert done_keys(latest, include_failed=False) == {("d", "a"), ("d", "b")}


def test_nan_payloads_are_kept():
    line = encode_record(make_record(("d", "a"), "ok", {"iou": float("nan"), "x": float("inf")}))
    back = json.loads(line)["payload"]
    assert math.isnan(back["iou"]) and back["x"] == math.inf
