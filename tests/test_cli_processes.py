"""The process flags of the run commands: independent jobs splitting one run, and `jax.distributed` start-up."""

from __future__ import annotations

import jax
import pytest

from cli_helpers import GOOD, assert_command_error, folder_flags, make_folder, run_cli
from jaxseg_robust import cli
from jaxseg_robust.runner.records import read_records
from jaxseg_robust.runner.rundir import records_path


def box_grid_argv(folder, out, *extra: str) -> list[str]:
    return ["grid", "--kind", "box", "--model", "sam_tiny", *folder_flags(folder), "--out", str(out),
            "--stride", "16", "--progress", "none", *extra]


def test_two_jobs_split_the_run_and_either_resumes_the_whole(tmp_path, capsys):
    folder = make_folder(tmp_path, bad=False)
    out = tmp_path / "run"
    shares = []
    for index in (1, 0):  # array jobs start in any order: process 1 may create the run directory itself
        code, _, err = run_cli(box_grid_argv(folder, out, "--process-index", str(index), "--process-count", "2"),
                               capsys)
        assert code == cli.EXIT_OK, err
        path = records_path(out, index)  # records.jsonl for process 0, records.process<k>.jsonl otherwise
        shares.append({record["id"] for record in read_records(path)} if path.is_file() else set())
    shares.reverse()
    assert not shares[0] & shares[1]
    assert shares[0] | shares[1] == set(GOOD)
    # a single-process rerun finds every instance done
    code, stdout, err = run_cli(box_grid_argv(folder, out), capsys)
    assert code == cli.EXIT_OK, err
    assert f"0 ok, 0 failed, {len(GOOD)} skipped" in stdout


@pytest.mark.parametrize("extra, message", [
    (["--process-index", "0"], "--process-index and --process-count go together"),
    (["--process-count", "2"], "--process-index and --process-count go together"),
    (["--process-index", "2", "--process-count", "2"], "--process-index must be < --process-count"),
    (["--distributed", "--process-index", "0", "--process-count", "2"], "--distributed"),
])
def test_bad_process_flags_are_errors_naming_them(tmp_path, capsys, extra, message):
    folder = make_folder(tmp_path, bad=False)
    assert_command_error("grid", box_grid_argv(folder, tmp_path / "run", *extra), capsys, message)
    assert not (tmp_path / "run").exists()


def test_distributed_starts_jax_distributed_before_anything_else(tmp_path, capsys, monkeypatch):
    calls = []

    def initialize(*args, **kwargs):
        calls.append((args, kwargs))
        raise ValueError("no cluster detected (test)")

    monkeypatch.setattr(jax.distributed, "initialize", initialize)
    folder = make_folder(tmp_path, bad=False)
    data = folder_flags(folder)
    for command in (["grid", "--kind", "box", "--stride", "16", *data], ["tetris", *data], ["breps", *data],
                    ["rclicks", "--clickability", "dt", *data],
                    ["perturb", "--datasets", f"{folder / 'images'}", "--random-init"]):
        argv = [*command, "--model", "sam_tiny", "--out", str(tmp_path / "run"), "--distributed"]
        code, _, err = run_cli(argv, capsys)
        assert code == cli.EXIT_FAILURE and "no cluster detected" in err, (command, err)
    assert len(calls) == 5
    assert not (tmp_path / "run").exists()  # nothing ran
