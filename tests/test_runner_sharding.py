"""Tests of data-parallel sharding helpers, and of the engine on 4 fake CPU devices."""

from __future__ import annotations

import collections
import os
import pathlib
import subprocess
import sys
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxseg_robust.runner.records import latest_records, read_run_records
from jaxseg_robust.runner.sharding import (
    DATA_AXIS,
    data_mesh,
    jit_data_parallel,
    pad_leading,
    padded_batch_size,
    process_owns,
    replicate,
    shard_batch,
)

TESTS = pathlib.Path(__file__).parent
sys.path.insert(0, str(TESTS))
import runner_toy as toy  # noqa: E402

from jaxseg_robust.runner.engine import run  # noqa: E402


def test_mesh_and_batch_size():
    mesh = data_mesh()
    assert mesh.axis_names == (DATA_AXIS,) and mesh.devices.size == len(jax.local_devices())
    assert padded_batch_size(5, mesh) % mesh.devices.size == 0 and padded_batch_size(5, mesh) >= 5
    four = types.SimpleNamespace(devices=np.empty(4))  # only the device count matters
    assert [padded_batch_size(b, four) for b in (1, 4, 5, 8, 9)] == [4, 4, 8, 8, 12]
    with pytest.raises(ValueError, match="batch_size must be a positive int"):
        padded_batch_size(0, mesh)
    with pytest.raises(ValueError, match="devices must not be empty"):
        data_mesh([])


def test_pad_leading_repeats_the_first_row():
    tree = {"a": np.arange(6).reshape(3, 2), "b": [np.array([True, False, True])]}
    padded = pad_leading(tree, 5)
    np.testing.assert_array_equal(padded["a"], [[0, 1], [2, 3], [4, 5], [0, 1], [0, 1]])
    np.testing.assert_array_equal(padded["b"][0], [True, False, True, True, True])
    with pytest.raises(ValueError, match=r"leaf \['a'\] has leading size 3; expected 3 in \[1, 2\]"):
        pad_leading(tree, 2)
    with pytest.raises(ValueError, match=r"leaf \['b'\] has leading size 2"):
        pad_leading({"a": np.zeros(3), "b": np.zeros(2)}, 4)
    with pytest.raises(ValueError, match="is a scalar"):
        pad_leading({"s": np.float32(1)}, 4)


def test_shard_batch_and_jit_data_parallel():
    mesh = data_mesh()
    batch = {"x": np.arange(8, dtype=np.float32).reshape(4, 2)}
    sharded = shard_batch(batch, mesh)
    assert sharded["x"].sharding.spec == jax.sharding.PartitionSpec(DATA_AXIS)
    with pytest.raises(ValueError, match=r"leaf \['s'\] has shape \[\]"):
        shard_batch({"s": np.float32(1)}, mesh)

    def scaled(params, batch):
        return {"y": batch["x"] * params["w"]}

    fn = jit_data_parallel(scaled, mesh, replicated_argnums=(0,))
    out = fn(replicate({"w": jnp.float32(2)}, mesh), sharded)
    np.testing.assert_array_equal(out["y"], batch["x"] * 2)
    assert out["y"].sharding.spec == jax.sharding.PartitionSpec(DATA_AXIS)
    with pytest.raises(ValueError, match="not \\*args"):
        jit_data_parallel(lambda *args: args, mesh)
    with pytest.raises(ValueError, match="out of range"):
        jit_data_parallel(scaled, mesh, replicated_argnums=(2,))


def test_process_owns_is_a_stable_partition():
    keys = [("d", f"x{i}") for i in range(300)]
    owners = [[k for k in keys if process_owns(k, p, 3)] for p in range(3)]
    assert sorted(sum(owners, [])) == sorted(keys)  # disjoint and complete
    assert all(70 < len(o) < 130 for o in owners)  # roughly balanced
    assert all(process_owns(k, 0, 1) for k in keys)
    assert collections.Counter(process_owns(("d", "x0"), p, 3) for p in range(3))[True] == 1
    with pytest.raises(ValueError, match="process_index must be in"):
        process_owns(keys[0], 3, 3)


def test_four_fake_devices_give_the_records_of_one(tmp_path):
    """11 instances, batch 3 -> 4 slots on 4 devices: ragged tails in every bucket; records equal 1 device."""
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4", JAX_PLATFORMS="cpu")
    result = subprocess.run(
        [sys.executable, str(TESTS / "runner_toy.py"), str(tmp_path / "four"), "11", "3", "0"],
        env=env, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "DEVICES 4" in result.stdout
    manifest_session = (tmp_path / "four" / "manifest.json").read_text()
    assert '"padded_batch_size": 4' in manifest_session and '"devices": 4' in manifest_session
    one = tmp_path / "one"
    run(toy.toy_instances(11), toy.make_sleepy_batch_fn(0.0), one, 3, config={"toy": 1}, progress="none")
    four_records = latest_records(read_run_records(tmp_path / "four"))
    assert len(four_records) == 11
    assert four_records == latest_records(read_run_records(one))
