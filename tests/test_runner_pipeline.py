"""The engine's batch loop overlaps host and device work (runner/pipeline.py) and still loses nothing:
loading of group k + 1 and the call of batch k + 1 come before batch k's results are consumed, records are
made on a writer thread while the loop goes on, and an interruption writes the batches already computed."""

from __future__ import annotations

import pathlib
import sys
import threading

import jax
import numpy as np
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import runner_toy as toy  # noqa: E402

from jaxseg_robust.data.instances import InstanceRef  # noqa: E402
from jaxseg_robust.runner.dispatch import DispatchedOutputs, DispatchingBatchFunction  # noqa: E402
from jaxseg_robust.runner.engine import run  # noqa: E402
from jaxseg_robust.runner.inflight import InflightJournal  # noqa: E402
from jaxseg_robust.runner.records import latest_records, read_run_records  # noqa: E402
from jaxseg_robust.runner.sharding import data_mesh, data_sharding  # noqa: E402

CONFIG = {"toy": 1}
COUNT, BATCH = 6, 2  # one size: batches [0, 1], [2, 3], [4, 5]


class Timeline:
    """Events of the loader, the batch function and finalize, in the order they happened (thread-safe)."""

    def __init__(self):
        self.events: list[tuple[str, object]] = []
        self._lock = threading.Lock()

    def add(self, kind: str, what) -> None:
        with self._lock:
            self.events.append((kind, what))

    def index(self, kind: str, what) -> int:
        return self.events.index((kind, what))


def _same_size_instances():
    return toy.toy_instances(COUNT, sizes=((7, 9),))


def _refs(instances, timeline: Timeline):
    """Lazy references whose loader notes when it starts."""

    def loader(instance):
        timeline.add("load", instance.id)
        return instance

    return [InstanceRef(i.id, *i.size, loader=lambda i=i: loader(i), dataset=i.dataset, fingerprint=i.id)
            for i in instances]


def _reference():
    return {i.key: toy.reference_payload(i) for i in _same_size_instances()}


def _payloads(run_dir) -> dict:
    return {key: record["payload"] for key, record in latest_records(read_run_records(run_dir)).items()}


def test_the_next_group_loads_and_is_dispatched_before_the_previous_results_are_consumed(tmp_path):
    timeline = Timeline()
    calls = {"n": 0}

    def batch_fn(batch):
        calls["n"] += 1
        timeline.add("call", calls["n"])
        return toy.toy_batch_fn(batch)

    def finalize(instance, outputs):
        timeline.add("finalize", instance.id)
        return outputs

    summary = run(_refs(_same_size_instances(), timeline), batch_fn, tmp_path, BATCH, config=CONFIG,
                  progress="none", finalize=finalize)
    assert (summary.ok, summary.failed) == (COUNT, 0)
    for k in (1, 2):  # batch k holds im{2k-2}, im{2k-1}; batch k + 1 starts with im{2k}
        consumed = timeline.index("finalize", f"im{2 * k - 2:03d}")
        assert timeline.index("load", f"im{2 * k:03d}") < consumed
        assert timeline.index("call", k + 1) < consumed
    assert _payloads(tmp_path) == _reference()


def test_records_are_made_on_a_writer_thread_while_the_loop_goes_on(tmp_path):
    third_call = threading.Event()
    seen = {}
    calls = {"n": 0}

    def batch_fn(batch):
        calls["n"] += 1
        if calls["n"] == 3:
            third_call.set()
        return toy.toy_batch_fn(batch)

    def finalize(instance, outputs):  # batch 1's records wait until the loop has called batch 3
        if instance.id == "im000":
            seen["waited"] = third_call.wait(timeout=60)
        seen.setdefault("threads", set()).add(threading.current_thread() is threading.main_thread())
        return outputs

    summary = run(_same_size_instances(), batch_fn, tmp_path, BATCH, config=CONFIG, progress="none",
                  finalize=finalize)
    assert seen == {"waited": True, "threads": {False}} and summary.ok == COUNT
    assert _payloads(tmp_path) == _reference()


def test_an_interruption_after_a_batch_computed_leaves_its_records_on_disk(tmp_path):
    calls = {"n": 0}

    def interrupted(batch):
        calls["n"] += 1
        if calls["n"] == 2:  # Ctrl-C while the host prepares batch 2: batch 1 is computed, not yet written
            raise KeyboardInterrupt
        return toy.toy_batch_fn(batch)

    instances = _same_size_instances()
    with pytest.raises(KeyboardInterrupt):
        run(instances, interrupted, tmp_path, BATCH, config=CONFIG, progress="none")
    assert _payloads(tmp_path) == {key: value for key, value in _reference().items() if key[1] in ("im000", "im001")}
    with InflightJournal(tmp_path) as journal:
        assert journal.open(set(_payloads(tmp_path))) == {}  # the groups without records were released
    summary = run(instances, toy.toy_batch_fn, tmp_path, BATCH, config=CONFIG, progress="none")
    assert (summary.skipped, summary.ok) == (2, 4) and _payloads(tmp_path) == _reference()


class HostBatchSpy(DispatchingBatchFunction):
    """Declares that it takes the host batch; notes what it was given, then runs the toy function."""

    def __init__(self):
        self.given = []

    def dispatch(self, batch, sharding):
        self.given.append((type(batch.image), type(batch.seed), sharding))
        return DispatchedOutputs(toy.toy_batch_fn(jax.device_put(batch, sharding)))


def test_a_dispatching_batch_function_gets_the_host_batch_and_the_data_sharding(tmp_path):
    spy = HostBatchSpy()
    summary = run(_same_size_instances(), spy, tmp_path, BATCH, config=CONFIG, progress="none")
    assert summary.ok == COUNT and _payloads(tmp_path) == _reference()
    assert spy.given == [(np.ndarray, np.ndarray, data_sharding(data_mesh()))] * 3


def test_a_failed_writer_stops_the_run_and_releases_what_it_did_not_write(tmp_path):
    def finalize(instance, outputs):
        if instance.id == "im002":
            raise SystemExit("stop")  # not an instance failure: the run stops
        return outputs

    with pytest.raises(SystemExit):
        run(_same_size_instances(), toy.toy_batch_fn, tmp_path, BATCH, config=CONFIG, progress="none",
            finalize=finalize)
    written = _payloads(tmp_path)
    assert set(key[1] for key in written) == {"im000", "im001"}
    with InflightJournal(tmp_path) as journal:
        assert journal.open(set(written)) == {}
