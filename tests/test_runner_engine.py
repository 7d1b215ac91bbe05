"""Tests of the evaluation engine: correctness of padded batches, compile count, resume, failures."""

from __future__ import annotations

import json

import functools
import io
import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import checkify

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import runner_toy as toy  # noqa: E402

from jaxseg_robust.data.buckets import FixedFrame, RoundUpFrame, crop_to_size  # noqa: E402
from jaxseg_robust.data.instances import Instance, InstanceError, InstanceRef, require_object  # noqa: E402
from jaxseg_robust.runner.engine import (  # noqa: E402
    BatchFunctionError,
    RunAbortedError,
    recorded_counts,
    run,
)
from jaxseg_robust.runner.records import latest_records, read_run_records  # noqa: E402
from jaxseg_robust.runner.rundir import ManifestMismatchError  # noqa: E402
from jaxseg_robust.runner.sharding import data_mesh, jit_data_parallel, replicate  # noqa: E402

CONFIG = {"protocol": "toy"}


def _run(instances, batch_fn, run_dir, batch_size=3, **kwargs):
    return run(instances, batch_fn, run_dir, batch_size, config=CONFIG, progress="none", **kwargs)


def _by_key(run_dir) -> dict:
    return latest_records(read_run_records(run_dir))


@pytest.fixture(scope="module")
def instances():
    return toy.toy_instances(11)


@pytest.fixture(scope="module")
def reference(instances, tmp_path_factory):
    """Records of one uninterrupted run."""
    run_dir = tmp_path_factory.mktemp("reference")
    _run(instances, toy.toy_batch_fn, run_dir)
    return _by_key(run_dir)


@pytest.mark.parametrize("policy", [None, RoundUpFrame(8), FixedFrame(13, 10)])
def test_records_equal_unpadded_numpy_reference(instances, reference, tmp_path, policy):
    kwargs = {} if policy is None else {"frame_policy": policy}
    summary = _run(instances, toy.toy_batch_fn, tmp_path, batch_size=4, **kwargs)
    assert (summary.ok, summary.failed, summary.skipped, summary.exit_code) == (11, 0, 0, 0)
    records = _by_key(tmp_path)
    assert len(records) == 11
    for instance in instances:
        record = records[instance.key]
        assert record["status"] == "ok" and record["error"] is None
        assert record["payload"] == toy.reference_payload(instance), instance.id
    assert records == reference  # batch size and frame policy do not change results
    assert recorded_counts(tmp_path) == {"ok": 11, "failed": 0, "instances": 11}


def test_one_trace_per_bucket_shape(instances, tmp_path):
    batch_fn, traces = toy.make_toy_batch_fn()
    poisoned = list(instances) + [toy.poison(toy.toy_instances(1, sizes=((7, 9),), dataset="p")[0])]
    summary = _run(poisoned, toy.make_raising_batch_fn(batch_fn), tmp_path, batch_size=2)
    # sizes (7, 9) x 7, (12, 5) x 3, (4, 4) x 2: 4 + 2 + 1 batches incl. ragged tails, a failed batch
    # and its one-at-a-time retries; 3 bucket shapes -> 3 traces.
    assert traces["n"] == 3
    assert (summary.ok, summary.failed) == (11, 1)
    round_up_fn, round_up_traces = toy.make_toy_batch_fn()
    _run(instances, round_up_fn, tmp_path / "round", batch_size=2, frame_policy=RoundUpFrame(16))
    assert round_up_traces["n"] == 1  # every size fits 16 x 16: a single compiled shape


def test_jit_data_parallel_with_replicated_params(instances, reference, tmp_path):
    mesh = data_mesh()
    counter = {"n": 0}

    def evaluate(params, batch):
        counter["n"] += 1
        pred = batch.image[..., 0] <= params["threshold"]
        return {"pred_area": jnp.sum(pred & batch.valid, axis=(1, 2))}

    jitted = jit_data_parallel(evaluate, mesh, replicated_argnums=(0,))
    params = replicate({"threshold": jnp.uint8(127)}, mesh)
    _run(instances, functools.partial(jitted, params), tmp_path, mesh=mesh)
    records = _by_key(tmp_path)
    assert {k: r["payload"]["pred_area"] for k, r in records.items()} == {
        k: r["payload"]["pred_area"] for k, r in reference.items()}
    assert counter["n"] == 3


def test_finalize_crops_spatial_outputs(instances, tmp_path):
    @jax.jit
    def masks(batch):
        return {"pred": (batch.image[..., 0] <= 127) & batch.valid, "size": batch.size}

    def finalize(instance, outputs):
        assert outputs["pred"].shape == (13, 10)  # one slot, padded frame
        return {"pred": crop_to_size(outputs["pred"], instance.size), "size": outputs["size"]}

    _run(instances, masks, tmp_path, frame_policy=FixedFrame(13, 10), finalize=finalize)
    records = _by_key(tmp_path)
    for instance in instances:
        payload = records[instance.key]["payload"]
        assert payload["size"] == list(instance.size)
        np.testing.assert_array_equal(np.array(payload["pred"]), instance.image[..., 0] <= 127)


def test_resume_after_interrupt_equals_uninterrupted_run(instances, reference, tmp_path):
    calls = {"n": 0}

    def interrupted(batch):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt  # like Ctrl-C in the middle of the run
        return toy.toy_batch_fn(batch)

    with pytest.raises(KeyboardInterrupt):
        _run(instances, interrupted, tmp_path)
    partial = read_run_records(tmp_path)
    assert len(partial) == 5  # the (4, 4) bucket (2) and one batch of 3 of the (7, 9) bucket survive
    summary = _run(instances, toy.toy_batch_fn, tmp_path)
    assert (summary.skipped, summary.ok, summary.failed) == (5, 6, 0)
    lines = read_run_records(tmp_path)
    assert len(lines) == 11 and len({(r["dataset"], r["id"]) for r in lines}) == 11  # no duplicates
    assert _by_key(tmp_path) == reference
    again = _run(instances, toy.toy_batch_fn, tmp_path)
    assert (again.skipped, again.ok) == (11, 0) and len(read_run_records(tmp_path)) == 11


def _checkify_batch_fn():
    def per_instance(image):
        checkify.check(image[0, 0, 0] != toy.POISON_RED, "poisoned pixel value {v}", v=image[0, 0, 0])
        return jnp.sum(image[..., 0] <= 127)

    checked = jax.jit(checkify.checkify(jax.vmap(per_instance)))

    def batch_fn(batch):
        error, area = checked(batch.image)
        error.throw()
        return {"area": area}

    return batch_fn


@pytest.mark.parametrize("kind", ["host", "checkify"])
def test_failure_isolation(instances, reference, tmp_path, kind):
    bad = toy.poison(instances[4])
    data = instances[:4] + [bad] + instances[5:]
    batch_fn = toy.make_raising_batch_fn() if kind == "host" else _checkify_batch_fn()
    summary = _run(data, batch_fn, tmp_path)
    assert (summary.ok, summary.failed, summary.exit_code) == (10, 1, 1)
    records = _by_key(tmp_path)
    failed = records[bad.key]
    assert failed["status"] == "failed" and failed["payload"] == {}
    expected = "ValueError: poisoned instance in slots [0]" if kind == "host" else "poisoned pixel value 13"
    assert expected in failed["error"] and "Traceback" in failed["traceback"]
    assert all(r["status"] == "ok" for k, r in records.items() if k != bad.key)
    if kind == "host":  # the batch-mates retried one at a time give the batched results
        assert {k: r for k, r in records.items() if k != bad.key} == {
            k: r for k, r in reference.items() if k != bad.key}
    assert summary.failures == ((bad.name, failed["error"]),)
    assert f"failed {bad.name}: " in summary.format() and "10 ok, 1 failed" in str(summary)
    rerun = _run(data, batch_fn, tmp_path)  # failed instances are not rerun by default
    assert (rerun.ok, rerun.failed, rerun.skipped, rerun.skipped_failed, rerun.exit_code) == (0, 0, 11, 1, 1)
    fixed = _run(data, toy.toy_batch_fn if kind == "host" else batch_fn, tmp_path, retry_failed=True)
    if kind == "host":
        assert (fixed.ok, fixed.skipped, fixed.exit_code) == (1, 10, 0)
        assert _by_key(tmp_path)[bad.key]["status"] == "ok"
    else:
        assert (fixed.failed, fixed.exit_code) == (1, 1)


def test_host_side_failures_never_reach_the_device(instances, tmp_path):
    seen = []

    @jax.jit
    def spy_fn(batch):
        return toy.toy_batch_fn(batch)

    def batch_fn(batch):
        live = np.asarray(batch.instance_valid)
        seen.extend(np.asarray(batch.seed)[live].tolist())
        return spy_fn(batch)

    good = instances[:3]
    bad_values = Instance("bad_values", good[0].image, np.full(good[0].gt.shape, 5, np.int8), "toy")
    empty = Instance("empty", good[0].image, np.zeros(good[0].gt.shape, np.int8), "toy")

    def broken_loader():
        raise OSError("cannot decode broken.png")

    broken = InstanceRef("broken", 7, 9, loader=broken_loader, dataset="toy", source_paths=("broken.png",))
    wrong_size = InstanceRef("wrong_size", 7, 8, loader=lambda: Instance("wrong_size", good[0].image, good[0].gt,
                                                                         "toy"), dataset="toy", fingerprint="t")
    huge = toy.toy_instances(1, sizes=((20, 20),), dataset="big")[0]
    lazy = InstanceRef(good[1].id + "_lazy", *good[1].size,
                       loader=lambda: Instance(good[1].id + "_lazy", good[1].image, good[1].gt, "toy"),
                       dataset="toy", fingerprint="t")
    no_image = Instance("no_image", None, good[0].gt, "toy")
    data = [*good, bad_values, empty, broken, wrong_size, huge, lazy, no_image]
    summary = _run(data, batch_fn, tmp_path, frame_policy=FixedFrame(13, 10), check=require_object)
    assert (summary.ok, summary.failed) == (4, 6)
    records = _by_key(tmp_path)
    errors = {key[1]: r["error"] for key, r in records.items() if r["status"] == "failed"}
    assert errors == {
        "bad_values": "InstanceError: toy/bad_values: gt holds values [5] outside {-1, 0, 1}",
        "empty": "InstanceError: toy/empty: gt has no object pixel (value 1)",
        "broken": "OSError: cannot decode broken.png",
        "no_image": "InstanceError: toy/no_image: image must be a numpy array, got NoneType",
        "wrong_size": "InstanceError: toy/wrong_size: declared size (H, W) = (7, 8) but the loaded image is (7, 9)",
        huge.id: f"InstanceError: big/{huge.id}: size (H, W) = (20, 20) does not fit the frame (13, 10) of policy "
                 "'fixed:13x10'",
    }
    from jaxseg_robust.data.buckets import instance_seed  # noqa: PLC0415

    assert sorted(seen) == sorted(instance_seed(k) for k, r in records.items() if r["status"] == "ok")
    lazy_payload = records[lazy.key]["payload"]
    assert {k: v for k, v in lazy_payload.items() if k != "seed"} == {
        k: v for k, v in toy.reference_payload(good[1]).items() if k != "seed"}


def test_contract_violations_stop_the_run(instances, tmp_path):
    with pytest.raises(BatchFunctionError, match="must return a mapping"):
        _run(instances, lambda batch: (batch.size,), tmp_path / "a")
    with pytest.raises(BatchFunctionError, match=r"output \['total'\] has shape \[\]"):
        _run(instances, lambda batch: {"total": jnp.sum(batch.size)}, tmp_path / "b")


def test_systematic_failure_aborts_keeping_records(instances, tmp_path):
    def always_fails(batch):
        raise RuntimeError("shape bug")

    # streaks are counted per batch: the (4, 4) bucket (2 instances), then a batch of 5 reaches the limit
    with pytest.raises(RunAbortedError, match="7 instances in a row failed.*RuntimeError: shape bug"):
        _run(instances, always_fails, tmp_path, batch_size=5, abort_after_consecutive_failures=5)
    assert [r["status"] for r in read_run_records(tmp_path)] == ["failed"] * 7
    summary = _run(instances, toy.toy_batch_fn, tmp_path, batch_size=5, retry_failed=True)
    assert (summary.ok, summary.skipped) == (11, 0)


def test_bad_arguments(instances, tmp_path):
    with pytest.raises(InstanceError, match="duplicate instance key 'toy/im000'"):
        _run([instances[0], instances[0]], toy.toy_batch_fn, tmp_path)
    with pytest.raises(InstanceError, match="expected an Instance"):
        _run([instances[0], "x"], toy.toy_batch_fn, tmp_path)
    with pytest.raises(ValueError, match="batch_size must be a positive int"):
        _run(instances, toy.toy_batch_fn, tmp_path, batch_size=0)
    with pytest.raises(ValueError, match="process_index must be in"):
        _run(instances, toy.toy_batch_fn, tmp_path, process_index=2, process_count=2)


def test_manifest_mismatch_through_run(instances, tmp_path):
    _run(instances[:3], toy.toy_batch_fn, tmp_path)
    with pytest.raises(ManifestMismatchError, match=r"config.protocol: recorded \"toy\", now \"other\""):
        run(instances[:3], toy.toy_batch_fn, tmp_path, 3, config={"protocol": "other"}, progress="none")
    with pytest.raises(ManifestMismatchError, match="engine.frame_policy"):
        _run(instances[:3], toy.toy_batch_fn, tmp_path, frame_policy=RoundUpFrame(4))
    changed = [toy.poison(instances[0]), *instances[1:]]
    with pytest.raises(ManifestMismatchError, match="fingerprints.dataset"):
        _run(changed, toy.toy_batch_fn, tmp_path)
    summary = _run(changed, toy.toy_batch_fn, tmp_path, allow_manifest_mismatch=True)
    assert (summary.skipped, summary.ok) == (3, 8)


def test_a_grown_dataset_resumes_and_a_changed_one_is_explained_by_key(instances, tmp_path):
    _run(instances[:3], toy.toy_batch_fn, tmp_path)
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert sorted(manifest["instances"]["toy"]) == ["im000", "im001", "im002"]
    grown = _run(instances[:5], toy.toy_batch_fn, tmp_path)  # raising --limit: nothing recorded is invalidated
    assert (grown.skipped, grown.ok) == (3, 2)
    assert sorted(json.loads((tmp_path / "manifest.json").read_text())["instances"]["toy"]) == [
        f"im{i:03d}" for i in range(5)]
    # a repaired (changed) file and a dropped instance, both recorded, plus two new ones
    edited = [toy.poison(instances[1]), instances[0], *instances[3:7]]
    with pytest.raises(ManifestMismatchError) as info:
        _run(edited, toy.toy_batch_fn, tmp_path)
    message = str(info.value)
    assert "2 added (toy/im005, toy/im006)" in message
    assert "1 removed (toy/im002 [recorded])" in message
    assert "1 changed (toy/im001 [recorded])" in message
    assert "sha256:" not in message  # no bare hashes
    # a changed instance that has no record yet invalidates nothing either
    fresh = tmp_path / "fresh"
    first = _run(instances[:6], toy.toy_batch_fn, fresh, process_index=0, process_count=2)
    assert 0 < first.ok < 6
    recorded = latest_records(read_run_records(fresh))
    other = next(i for i, instance in enumerate(instances[:6]) if instance.key not in recorded)
    edited = list(instances[:6])
    edited[other] = toy.poison(edited[other])
    again = _run(edited, toy.toy_batch_fn, fresh, process_index=0, process_count=2)
    assert (again.skipped, again.ok) == (first.ok, 0)


def test_processes_split_the_work(instances, reference, tmp_path):
    first = _run(instances, toy.toy_batch_fn, tmp_path, process_index=0, process_count=2)
    second = _run(instances, toy.toy_batch_fn, tmp_path, process_index=1, process_count=2)
    assert first.ok + second.ok == 11 and first.elsewhere == second.ok and 0 < first.ok < 11
    assert sorted(p.name for p in tmp_path.glob("records*.jsonl")) == ["records.jsonl", "records.process1.jsonl"]
    assert _by_key(tmp_path) == reference
    single = _run(instances, toy.toy_batch_fn, tmp_path)  # a rerun with one process skips everything
    assert (single.skipped, single.ok) == (11, 0)


def test_plain_progress_and_summary_text(instances, tmp_path, monkeypatch):
    stream = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stream)
    summary = run(instances, toy.toy_batch_fn, tmp_path, 4, config=CONFIG, progress="plain")
    assert f"{tmp_path.name}: 11/11 (100.0%) ok=11 failed=0" in stream.getvalue()
    assert str(summary).startswith(f"{tmp_path}: 11 instances: 11 ok, 0 failed, 0 skipped")
