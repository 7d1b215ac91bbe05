"""Tests of run directories (manifest, mismatch refusal, lock) and fingerprints."""

from __future__ import annotations

import json
import os
import threading
import time

import jax.numpy as jnp
import numpy as np
import pytest

from jaxseg_robust.data.instances import Instance, InstanceRef, make_instance
from jaxseg_robust.runner.fingerprints import dataset_fingerprint, fingerprint_params, fingerprint_path
from jaxseg_robust.runner.rundir import (
    MANIFEST_NAME,
    ManifestMismatchError,
    RecordsFormatError,
    RunDirectoryBusyError,
    build_manifest,
    open_run_dir,
    read_manifest,
    records_path,
)

FINGERPRINTS = {"model": "sha256:aa", "dataset": "sha256:bb"}
ENGINE = {"frame_policy": "exact"}


def _open(path, **overrides):
    kwargs = {"config": {"protocol": "grid", "n": 3}, "fingerprints": FINGERPRINTS, "engine": ENGINE} | overrides
    return open_run_dir(path, **kwargs)


def test_manifest_is_written_and_reopened(tmp_path):
    with _open(tmp_path / "run", session={"batch_size": 4}) as directory:
        assert directory.records_path == tmp_path / "run" / "records.jsonl"
    manifest = read_manifest(tmp_path / "run")
    assert manifest["config"] == {"protocol": "grid", "n": 3}
    assert manifest["fingerprints"] == FINGERPRINTS and manifest["engine"] == ENGINE
    assert manifest["format"].startswith("jaxseg_robust.run/")
    versions = manifest["sessions"][0]["versions"]
    assert {"python", "jax", "jaxlib", "flax", "numpy", "jaxseg_robust"} <= set(versions)
    assert manifest["sessions"][0]["batch_size"] == 4
    with _open(tmp_path / "run", config={"n": 3, "protocol": "grid"}):  # key order does not matter
        pass
    assert len(read_manifest(tmp_path / "run")["sessions"]) == 2
    assert records_path(tmp_path, 2).name == "records.process2.jsonl"


@pytest.mark.parametrize(
    "overrides, expected",
    [
        ({"config": {"protocol": "grid", "n": 4}}, "config.n: recorded 3, now 4"),
        ({"config": {"protocol": "grid"}}, "config.n: recorded 3, now absent"),
        ({"fingerprints": {"model": "sha256:cc", "dataset": "sha256:bb"}},
         'fingerprints.model: recorded "sha256:aa", now "sha256:cc"'),
        ({"engine": {"frame_policy": "round_up:32"}}, 'engine.frame_policy: recorded "exact", now "round_up:32"'),
    ],
)
def test_mismatch_is_refused_with_a_clear_error_unless_overridden(tmp_path, overrides, expected):
    _open(tmp_path).close()
    with pytest.raises(ManifestMismatchError) as info:
        _open(tmp_path, **overrides)
    assert expected in str(info.value) and "allow_mismatch=True" in str(info.value)
    before = read_manifest(tmp_path)
    assert len(before["sessions"]) == 1  # a refused resume leaves the manifest alone
    _open(tmp_path, allow_mismatch=True, **overrides).close()
    after = read_manifest(tmp_path)
    assert after["config"] == before["config"] and after["fingerprints"] == before["fingerprints"]
    assert after["sessions"][-1]["overridden_mismatches"] == [expected]


@pytest.mark.parametrize("recorded", [None, "tetris/1"])
def test_records_of_another_layout_are_refused_in_one_line_even_when_overridden(tmp_path, recorded):
    old = {"protocol": "tetris", "n": 3} | ({} if recorded is None else {"records_format": recorded})
    _open(tmp_path, config=old).close()
    new = {"protocol": "tetris", "n": 3, "records_format": "tetris/2"}
    for allow in (False, True):
        with pytest.raises(RecordsFormatError) as info:
            _open(tmp_path, config=new, allow_mismatch=allow)
        message = str(info.value)
        assert "\n" not in message and str(tmp_path) in message and "'tetris/2'" in message
        assert ("an older layout" if recorded is None else "'tetris/1'") in message
    assert isinstance(info.value, ManifestMismatchError)  # the commands report it as a mismatch (exit 2)
    assert len(read_manifest(tmp_path)["sessions"]) == 1  # nothing was resumed
    _open(tmp_path / "new", config=new).close()
    _open(tmp_path / "new", config=new).close()  # the same layout resumes
    _open(tmp_path / "plain").close()
    _open(tmp_path / "plain").close()  # a protocol that names no layout is not concerned


def test_lock_refuses_a_second_run_and_is_released(tmp_path):
    first = _open(tmp_path)
    with pytest.raises(RunDirectoryBusyError, match="in use by another run"):
        _open(tmp_path)
    _open(tmp_path, process_index=1).close()  # another process index has its own lock
    first.close()
    _open(tmp_path).close()


def test_any_process_may_start_first_and_never_waits(tmp_path):
    # process 1 of 2 arrives first: it creates the manifest itself (it used to wait 600 s for process 0)
    started = time.monotonic()
    with _open(tmp_path / "b", process_index=1, session={"who": 1}) as directory:
        assert directory.records_path.name == "records.process1.jsonl"
    assert time.monotonic() - started < 5
    assert read_manifest(tmp_path / "b")["sessions"][0]["who"] == 1
    _open(tmp_path / "b", session={"who": 0}).close()  # process 0 checks it and appends its session
    assert [s["who"] for s in read_manifest(tmp_path / "b")["sessions"]] == [1, 0]
    with pytest.raises(ManifestMismatchError):
        _open(tmp_path / "b", process_index=1, config={"other": True})


def test_processes_arriving_together_create_one_manifest(tmp_path):
    errors, barrier = [], threading.Barrier(6)

    def arrive(index):
        try:
            barrier.wait()
            _open(tmp_path / "c", process_index=index, session={"who": index}).close()
        except Exception as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=arrive, args=(index,)) for index in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert not errors
    manifest = read_manifest(tmp_path / "c")
    assert manifest["config"] == {"protocol": "grid", "n": 3}
    assert 1 <= len(manifest["sessions"]) <= 2  # the creator's, plus process 0's if it was not the creator
    assert not list((tmp_path / "c").glob(".manifest.json.*"))  # no temporary file left behind


def test_bad_config_and_paths(tmp_path):
    with pytest.raises(ValueError, match="config.fn: cannot store a builtin_function_or_method as JSON"):
        _open(tmp_path, config={"fn": print})
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="exists and is not a directory"):
        _open(tmp_path / "file")
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / MANIFEST_NAME).write_text("{")
    with pytest.raises(ValueError, match="manifest.json: not valid JSON"):
        _open(tmp_path / "broken")


def test_version_change_warns(tmp_path):
    _open(tmp_path).close()
    manifest = read_manifest(tmp_path)
    manifest["sessions"][0]["versions"]["jax"] = "0.0.1"
    (tmp_path / MANIFEST_NAME).write_text(json.dumps(manifest))
    with pytest.warns(RuntimeWarning, match=r"jax 0.0.1 -> "):
        _open(tmp_path).close()


def test_build_manifest_is_canonical():
    a = build_manifest({"t": (1, 2), "x": np.float32(0.5)}, {"model": None}, {})
    assert a["config"] == {"t": [1, 2], "x": 0.5} and a["fingerprints"] == {"model": None}


def test_params_fingerprint_is_stable_and_sensitive():
    params = {"dense": {"kernel": jnp.ones((3, 2)), "bias": jnp.zeros((2,))}, "scale": np.float32(2.0)}
    base = fingerprint_params(params)
    assert base.startswith("sha256:") and len(base) == 7 + 64
    assert fingerprint_params({"scale": np.float32(2.0), "dense": {"bias": np.zeros(2, np.float32),
                                                                   "kernel": np.ones((3, 2), np.float32)}}) == base
    changed = {"dense": {"kernel": jnp.ones((3, 2)).at[0, 0].set(1.0000001), "bias": jnp.zeros((2,))},
               "scale": np.float32(2.0)}
    renamed = {"dense": {"w": jnp.ones((3, 2)), "bias": jnp.zeros((2,))}, "scale": np.float32(2.0)}
    recast = {"dense": {"kernel": jnp.ones((3, 2), jnp.bfloat16), "bias": jnp.zeros((2,))}, "scale": np.float32(2.0)}
    reshaped = {"dense": {"kernel": jnp.ones((2, 3)), "bias": jnp.zeros((2,))}, "scale": np.float32(2.0)}
    assert len({base, *(fingerprint_params(p) for p in (changed, renamed, recast, reshaped))}) == 5


def test_path_fingerprint(tmp_path):
    (tmp_path / "ckpt" / "sub").mkdir(parents=True)
    (tmp_path / "ckpt" / "a.bin").write_bytes(b"abc")
    (tmp_path / "ckpt" / "sub" / "b.bin").write_bytes(b"def")
    first = fingerprint_path(tmp_path / "ckpt")
    assert fingerprint_path(tmp_path / "ckpt") == first
    (tmp_path / "ckpt" / "sub" / "b.bin").write_bytes(b"deg")
    assert fingerprint_path(tmp_path / "ckpt") != first
    assert fingerprint_path(tmp_path / "ckpt" / "a.bin") != fingerprint_path(tmp_path / "ckpt" / "sub" / "b.bin")
    with pytest.raises(FileNotFoundError):
        fingerprint_path(tmp_path / "nothing")


def _file_instance(tmp_path, name: str, content: bytes):
    path = tmp_path / f"{name}.png"
    path.write_bytes(content)
    image, gt = np.zeros((2, 3, 3), np.uint8), np.zeros((2, 3), np.int8)
    return make_instance(name, image, gt, dataset="d", source_paths=[str(path)])


def test_dataset_fingerprint_modes(tmp_path):
    a, b = _file_instance(tmp_path, "a", b"1234"), _file_instance(tmp_path, "b", b"5678")
    stat = dataset_fingerprint([a, b])
    assert dataset_fingerprint([b, a]) == stat  # order-free
    content = dataset_fingerprint([a, b], mode="content")
    assert content != stat
    (tmp_path / "b.png").write_bytes(b"5679")  # same size: only content mode sees it
    assert dataset_fingerprint([a, b]) == stat and dataset_fingerprint([a, b], mode="content") != content
    (tmp_path / "b.png").write_bytes(b"56790")
    assert dataset_fingerprint([a, b]) != stat
    os.remove(tmp_path / "b.png")  # a missing file is hashed as missing, not an error
    assert dataset_fingerprint([a, b]) not in (stat, dataset_fingerprint([a]))
    with pytest.raises(ValueError, match="mode must be one of"):
        dataset_fingerprint([a], mode="mtime")


def test_dataset_fingerprint_in_memory_and_refs():
    one = make_instance("x", np.zeros((2, 2, 3), np.uint8), np.zeros((2, 2), bool))
    other = Instance("x", one.image.copy(), one.gt.copy())
    other.image[0, 0, 0] = 1
    assert dataset_fingerprint([one]) != dataset_fingerprint([other])
    ref = InstanceRef("r", 2, 2, loader=lambda: one, fingerprint="v1:r")
    assert dataset_fingerprint([ref]) != dataset_fingerprint([InstanceRef("r", 2, 2, loader=lambda: one,
                                                                          fingerprint="v2:r")])
    with pytest.raises(ValueError, match="^r: cannot fingerprint an InstanceRef"):
        dataset_fingerprint([InstanceRef("r", 2, 2, loader=lambda: one)])


def test_an_older_run_directory_gains_per_instance_fingerprints_and_says_why_it_cannot_name_changes(tmp_path):
    _open(tmp_path).close()  # as an older version wrote it: no "instances" section
    assert "instances" not in read_manifest(tmp_path)
    table = {("toy", "a"): "0" * 16, ("toy", "b"): "1" * 16}
    _open(tmp_path, instance_fingerprints=table).close()
    assert read_manifest(tmp_path)["instances"] == {"toy": {"a": "0" * 16, "b": "1" * 16}}
    old = tmp_path / "old"
    _open(old).close()
    with pytest.raises(ManifestMismatchError, match="predates per-instance fingerprints"):
        _open(old, fingerprints={"model": "sha256:aa", "dataset": "sha256:cc"}, instance_fingerprints=table)
