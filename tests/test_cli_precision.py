"""--precision on every command that runs a model: parsed, applied around the run's programs, recorded."""

from __future__ import annotations


import jax
import pytest

from jaxseg_robust.commands import build_parser, demo
from jaxseg_robust import runs
from jaxseg_robust.commands.run_specs import FlagNames
from jaxseg_robust.runner.program import CompileLog
from jaxseg_robust.runs.execute import run_plan
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


class ToyProgram:
    """The toy batch function with a compile log, as `runs.execute.run_plan` reads it; records the matmul
    precision it runs under."""

    def __init__(self):
        self.compile_log = CompileLog()
        self.seen = []

    def __call__(self, batch):
        self.seen.append(jax.config.jax_default_matmul_precision)
        return toy_batch_fn(batch)


def _spec(precision: str) -> runs.RunSpec:
    return runs.RunSpec(model=runs.ModelSpec("toy"), protocol=runs.TetrisSpec(),
                        engine=runs.EngineSpec(frame="exact", progress="none", precision=precision))


def test_run_plan_traces_the_batch_program_at_the_precision_and_records_it(tmp_path):
    program = ToyProgram()
    plan = runs.RunPlan(toy_instances(3), program, {"protocol": "toy"}, "sha256:toy")
    out = tmp_path / "run"
    summary = run_plan(plan, _spec("highest"), out, None, print)
    assert summary.ok == 3 and program.seen and set(program.seen) == {"highest"}
    assert jax.config.jax_default_matmul_precision is None  # restored after the run
    assert read_manifest(out)["config"] == {"protocol": "toy", "matmul_precision": "highest"}
    with pytest.raises(runs.RunError) as info:
        run_plan(plan, _spec("default"), out, None, print)
    message = info.value.render(FlagNames())
    assert "\n" not in message and "--precision highest" in message
