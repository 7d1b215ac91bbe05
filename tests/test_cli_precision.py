"""--precision on every command that runs a model: parsed, applied around the run's programs, recorded."""

from __future__ import annotations

import argparse
import types

import jax
import pytest

from jaxseg_robust.commands import build_parser, demo
from jaxseg_robust.commands.flags import CommandError
from jaxseg_robust.commands.running import run_protocol
from jaxseg_robust.runner.rundir import read_manifest

from runner_toy import toy_batch_fn, toy_instances

MODEL_COMMANDS = {
    "tetris": ["--model", "sam_tiny", "--out", "x"],
    "breps": ["--model", "sam_tiny", "--out", "x"],
    "grid": ["--model", "sam_tiny", "--out", "x", "--kind", "click"],
    "rclicks": ["--model", "sam_tiny", "--out", "x", "--clickability", "dt"],
    "perturb": ["--model", "sam_tiny", "--out", "x"],
    "demo": [],
}


@pytest.mark.parametrize("command", sorted(MODEL_COMMANDS))
def test_every_model_command_takes_precision_with_default_as_default(command):
    parser = build_parser()
    assert parser.parse_args([command, *MODEL_COMMANDS[command]]).precision == "default"
    for name in ("highest", "high", "default"):
        assert parser.parse_args([command, *MODEL_COMMANDS[command], "--precision", name]).precision == name


def test_a_bad_precision_is_an_argparse_error(capsys):
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(["breps", *MODEL_COMMANDS["breps"], "--precision", "tf32"])
    assert info.value.code == 2 and "--precision: invalid choice: 'tf32'" in capsys.readouterr().err


def test_the_demo_passes_its_precision_to_every_sub_run(tmp_path):
    parser = build_parser()
    for protocol in demo.PROTOCOLS:
        argv = demo.sub_run_argv(protocol, "sam_tiny", tmp_path, tmp_path / protocol, demo.SIZES["tiny"], "none",
                                 "highest")
        assert parser.parse_args(argv).precision == "highest"


def _args(out, precision: str) -> argparse.Namespace:
    return build_parser().parse_args(["breps", "--model", "sam_tiny", "--out", str(out), "--progress", "none",
                                      "--frame", "exact", "--precision", precision])


def test_run_protocol_traces_the_batch_program_at_the_precision_and_records_it(tmp_path):
    seen = []

    def batch_fn(batch):
        seen.append(jax.config.jax_default_matmul_precision)
        return toy_batch_fn(batch)

    model = types.SimpleNamespace(name="toy", fingerprint="sha256:toy", segmenter=None)
    instances = toy_instances(3)
    out = tmp_path / "run"
    summary = run_protocol(_args(out, "highest"), instances=instances, batch_fn=batch_fn,
                           config={"protocol": "toy"}, model=model, check=None)
    assert summary.ok == 3 and seen and set(seen) == {"highest"}
    assert jax.config.jax_default_matmul_precision is None  # restored after the run
    assert read_manifest(out)["config"] == {"protocol": "toy", "matmul_precision": "highest"}
    with pytest.raises(CommandError) as info:
        run_protocol(_args(out, "default"), instances=instances, batch_fn=batch_fn, config={"protocol": "toy"},
                     model=model, check=None)
    assert "\n" not in str(info.value) and "--precision highest" in str(info.value)
