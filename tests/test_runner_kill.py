"""Kill test: SIGKILL a running evaluation at random moments; nothing completed is lost or duplicated."""

from __future__ import annotations

import os
import pathlib
import random
import signal
import subprocess
import sys
import time

import pytest

TESTS = pathlib.Path(__file__).parent
sys.path.insert(0, str(TESTS))
import runner_toy as toy  # noqa: E402

from jaxseg_robust.runner.engine import run  # noqa: E402
from jaxseg_robust.runner.inflight import KILLED_TWICE  # noqa: E402
from jaxseg_robust.runner.records import latest_records, read_records, read_run_records  # noqa: E402

COUNT, BATCH, SLEEP_S = 24, 2, 0.12
CONFIG = {"toy": 1}  # what runner_toy.main records


def _line_count(path: pathlib.Path) -> int:
    try:
        return path.read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


def _start(run_dir: pathlib.Path) -> subprocess.Popen:
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    return subprocess.Popen(
        [sys.executable, str(TESTS / "runner_toy.py"), str(run_dir), str(COUNT), str(BATCH), str(SLEEP_S)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )


def _wait_for(condition, process: subprocess.Popen, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if process.poll() is not None:
            return  # finished (or crashed: checked by the caller)
        if time.monotonic() > deadline:
            process.kill()
            pytest.fail("the run did not reach the kill point in time")
        time.sleep(0.01)


def test_sigkill_at_random_moments_loses_at_most_the_batch_in_flight(tmp_path):
    reference_dir = tmp_path / "reference"
    run(toy.toy_instances(COUNT), toy.toy_batch_fn, reference_dir, BATCH, config=CONFIG, progress="none")
    reference = latest_records(read_run_records(reference_dir))
    run_dir = tmp_path / "killed"
    records_file = run_dir / "records.jsonl"
    rng = random.Random(20240607)
    survived: dict = {}
    # kill moments: right after start-up (manifest written, maybe no record yet), then after
    # a random number of completed records plus a random fraction of a batch's sleep.
    plans = [("manifest", 0), ("records", rng.randint(1, 6)), ("records", rng.randint(8, 14))]
    killed_mid_run = 0
    for kind, threshold in plans:
        process = _start(run_dir)
        if kind == "manifest":
            _wait_for(lambda: (run_dir / "manifest.json").exists(), process)
        else:
            _wait_for(lambda threshold=threshold: _line_count(records_file) >= threshold, process)
        time.sleep(rng.uniform(0.0, SLEEP_S))
        if process.poll() is None:
            process.send_signal(signal.SIGKILL)
            killed_mid_run += 1
        process.wait(timeout=60)
        assert process.returncode in (0, -signal.SIGKILL), process.stderr.read().decode()[-3000:]
        process.stderr.close()
        lines = read_records(records_file)  # parses; a cut last line is tolerated
        keys = [(r["dataset"], r["id"]) for r in lines]
        assert len(keys) == len(set(keys)), "an instance was recorded twice"
        assert set(survived) <= set(keys), "a completed instance was lost"
        assert len(keys) >= threshold, "records seen before the kill were lost"
        for record in lines:  # an instance in flight at two kills may be recorded as killed twice (runner.inflight)
            assert record == reference[(record["dataset"], record["id"])] or record["error"] == KILLED_TWICE
        survived = dict(zip(keys, lines))
    assert killed_mid_run >= 2 and 0 < len(survived) < COUNT
    summary = run(toy.toy_instances(COUNT), toy.toy_batch_fn, run_dir, BATCH, config=CONFIG, progress="none",
                  retry_failed=True)
    survived_ok = sum(record["status"] == "ok" for record in survived.values())
    assert summary.skipped == survived_ok and summary.ok == COUNT - survived_ok
    final = read_run_records(run_dir)
    killed_twice = sum(record["status"] == "failed" for record in survived.values())
    assert len(final) == COUNT + killed_twice and latest_records(final) == reference
