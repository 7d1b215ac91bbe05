"""The in-flight journal: a batch that SIGKILLs its process is retried one instance at a time,
and the instance that kills it again is recorded as failed (an out-of-memory kill never loops)."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys

TESTS = pathlib.Path(__file__).parent
sys.path.insert(0, str(TESTS))
import runner_toy as toy  # noqa: E402

from jaxseg_robust.runner.engine import run  # noqa: E402
from jaxseg_robust.runner.inflight import KILLED_TWICE, InflightJournal, journal_path, kill_counts  # noqa: E402
from jaxseg_robust.runner.records import latest_records, read_run_records  # noqa: E402

COUNT, BATCH, POISONED = 8, 2, 2  # instances 0, 2, 4, 6 share one size: batches [0, 2], [4, 6]

SCRIPT = f"""
import os, signal, sys
import numpy as np
sys.path.insert(0, {str(TESTS)!r})
import runner_toy as toy
from jaxseg_robust.runner.engine import run

def killing(batch):  # dies like the out-of-memory killer strikes: SIGKILL, no cleanup, no record
    live = np.asarray(batch.instance_valid) & (np.asarray(batch.image[:, 0, 0, 0]) == toy.POISON_RED)
    if live.any():
        os.kill(os.getpid(), signal.SIGKILL)
    return toy.toy_batch_fn(batch)

instances = toy.toy_instances({COUNT})
instances[{POISONED}] = toy.poison(instances[{POISONED}])
summary = run(instances, killing, sys.argv[1], {BATCH}, config={{"toy": 1}}, progress="none")
print(summary)
sys.exit(summary.exit_code)
"""


def _run_child(run_dir) -> subprocess.CompletedProcess:
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    return subprocess.run([sys.executable, "-c", SCRIPT, str(run_dir)], env=env, capture_output=True, text=True,
                          timeout=300)


def test_a_batch_that_kills_its_process_is_retried_alone_then_recorded_as_failed(tmp_path):
    run_dir = tmp_path / "run"
    first = _run_child(run_dir)
    assert first.returncode == -signal.SIGKILL, first.stderr[-2000:]
    journal = [json.loads(line) for line in journal_path(run_dir).read_text().splitlines()]
    in_flight = journal[-1]["start"]
    assert ["toy", f"im{POISONED:03d}"] in in_flight and len(in_flight) == BATCH  # written before the batch ran
    recorded_first = set(latest_records(read_run_records(run_dir)))

    second = _run_child(run_dir)  # the suspects run alone: the innocent one succeeds, the culprit kills again
    assert second.returncode == -signal.SIGKILL, second.stderr[-2000:]
    latest = latest_records(read_run_records(run_dir))
    innocent = [tuple(key) for key in in_flight if key[1] != f"im{POISONED:03d}"]
    assert all(latest[key]["status"] == "ok" for key in innocent)
    assert ("toy", f"im{POISONED:03d}") not in latest and recorded_first < set(latest)

    third = _run_child(run_dir)  # killed twice: recorded as failed without running it, the rest finishes
    assert third.returncode == 1, third.stderr[-2000:]
    assert "killed the process twice (out of memory?)" in third.stdout
    latest = latest_records(read_run_records(run_dir))
    assert len(latest) == COUNT
    failed = {key: r for key, r in latest.items() if r["status"] == "failed"}
    culprit = ("toy", f"im{POISONED:03d}")
    assert list(failed) == [culprit] and failed[culprit]["error"] == KILLED_TWICE
    reference = {i.key: toy.reference_payload(i) for i in toy.toy_instances(COUNT)}
    for key, record in latest.items():
        if record["status"] == "ok":
            assert record["payload"] == reference[key]
    with InflightJournal(run_dir) as journal:  # every key has a record now: nothing is suspect any more
        assert journal.open(set(latest)) == {}
    assert journal_path(run_dir).read_text() == ""  # and the journal was compacted to nothing


def test_an_exception_or_ctrl_c_releases_the_group_and_counts_no_kill(tmp_path):
    instances = toy.toy_instances(4)

    def interrupting(batch):
        raise KeyboardInterrupt

    try:
        run(instances, interrupting, tmp_path, 2, config={"toy": 1}, progress="none")
    except KeyboardInterrupt:
        pass
    with InflightJournal(tmp_path) as journal:
        assert journal.open(set()) == {}  # started and released: nobody was killed
    summary = run(instances, toy.toy_batch_fn, tmp_path, 2, config={"toy": 1}, progress="none")
    assert (summary.ok, summary.failed) == (4, 0)


def test_kill_counts_and_compaction(tmp_path):
    a, b, c = ("d", "a"), ("d", "b"), ("d", "c")
    entries = [{"start": [list(a), list(b)]}, {"start": [list(b)]}, {"start": [list(c)]}, {"release": [list(c)]}]
    assert kill_counts(entries, recorded=set()) == {a: 1, b: 2}
    assert kill_counts(entries, recorded={b}) == {a: 1}
    path = journal_path(tmp_path, 3)
    assert path.name == "inflight.process3.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in entries) + '{"start": [["d", "cut')  # a cut last line
    with InflightJournal(tmp_path, 3) as journal:
        assert journal.open(recorded={a}) == {b: 2}
    with InflightJournal(tmp_path, 3) as journal:  # the rewrite keeps exactly what is still unresolved
        assert journal.open(recorded=set()) == {b: 2}


def test_several_groups_in_flight_each_resolve_alone(tmp_path):
    """With prefetching a few groups are in flight at once: finishing one leaves the others in flight,
    releasing all releases only those, and a kill counts once against every member of each."""
    a, b, c = ("d", "a"), ("d", "b"), ("d", "c")
    with InflightJournal(tmp_path) as journal:
        journal.open(set())
        first, second, third = journal.start([a]), journal.start([b]), journal.start([c])
        journal.finish(second)
        assert journal.in_flight() == 2
    with InflightJournal(tmp_path) as journal:  # died here (b got its record): a and c were in flight
        assert journal.open({b}) == {a: 1, c: 1}
        journal.finish(journal.start([a]))
        journal.start([c])
        journal.release()
        assert journal.in_flight() == 0
    with InflightJournal(tmp_path) as journal:  # a recorded, c released: c keeps only its kill
        assert journal.open({a, b}) == {c: 1}
    assert first != third
