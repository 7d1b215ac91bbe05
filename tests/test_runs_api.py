"""The run spec and `evaluate` (`jaxseg_robust.runs`): a protocol run from Python is the command line's run.

The TETRIS command maps its flags once to a `RunSpec` and runs `evaluate`; the
same spec written by hand gives the same records and manifest. A bad value is a
`RunError` naming the field (the CLI names the flag). The flags stop at the
command: the traced walk of a CLI run shows where the ``argparse.Namespace`` goes.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest

import jaxseg_robust
from jaxseg_robust import cli, runs
from jaxseg_robust.commands.run_specs import FlagNames
from jaxseg_robust.runner.records import latest_records, read_run_records

from call_walk import trace_walk
from cli_helpers import folder_flags, make_folder

CLICKS, STEPS, BASELINE_CLICKS = 3, 2, 3


def tetris_spec(folder) -> runs.RunSpec:
    return runs.RunSpec(
        model=runs.ModelSpec("sam_tiny"),
        protocol=runs.TetrisSpec(mode="min", n_clicks=CLICKS, n_opt_steps=STEPS, lr_mult=4.0,
                                 baseline_clicks=BASELINE_CLICKS),
        data=runs.DataSpec(folders=((str(folder / "images"), str(folder / "masks")),)),
        engine=runs.EngineSpec(batch_size=2, progress="none"))


def tetris_argv(folder, out) -> list[str]:
    return ["tetris", "--model", "sam_tiny", *folder_flags(folder), "--out", str(out), "--mode", "min",
            "--n-clicks", str(CLICKS), "--n-opt-steps", str(STEPS), "--lr-mult", "4",
            "--baseline-clicks", str(BASELINE_CLICKS), "--batch-size", "2", "--progress", "none"]


@pytest.fixture(scope="module")
def runs_of_both(tmp_path_factory):
    """The same TETRIS run from the CLI (its walk traced) and from `evaluate`."""
    root = tmp_path_factory.mktemp("runs_api")
    folder = make_folder(root)
    walk = trace_walk(tetris_argv(folder, root / "cli"), "commands/tetris.py")
    lines = []
    result = runs.evaluate(tetris_spec(folder), root / "library", say=lines.append)
    return root, walk, result, lines


def payloads(run_dir) -> dict:
    return {key: (record["status"], record.get("payload"), record.get("error"))
            for key, record in latest_records(read_run_records(run_dir)).items()}


def manifest_config(run_dir) -> dict:
    return json.loads((run_dir / "manifest.json").read_text())["config"]


def test_evaluate_writes_the_records_and_manifest_of_the_cli(runs_of_both):
    root, walk, result, _ = runs_of_both
    assert walk.exit_code == result.exit_code == 1  # two of the folder's five pairs are bad
    assert payloads(root / "library") == payloads(root / "cli")
    assert manifest_config(root / "library") == manifest_config(root / "cli")
    assert (result.summary.ok, result.summary.failed) == (3, 2)


def test_evaluate_returns_the_table_and_writes_the_summary_files(runs_of_both):
    root, _, result, lines = runs_of_both
    written = {path.name for path in result.files}
    assert {"summary.md", "summary.csv"} <= written
    assert (root / "library" / "summary.md").read_text().startswith(result.tables.markdown)
    assert "toy" in result.tables.csv.splitlines()[1]
    assert any(line.startswith("loading sam_tiny") for line in lines)  # start-up lines go to `say`


def test_the_flags_stop_at_the_command(runs_of_both):
    """The parsed flags reach the command and the flag-to-spec mapping only; nothing below calls back into
    the command module (the run is one call: ``run``)."""
    _, walk, _, _ = runs_of_both
    assert walk.args_files == {"commands/tetris.py", "commands/run_specs.py"}
    expected = {("cli.py", "run"), ("commands/__init__.py", "register")}
    returns = [entry for entry in walk.entries if entry not in expected and entry[1] != "<module>"]  # not the import
    assert returns == []
    assert ("cli.py", "run") in walk.entries


def test_a_bad_value_is_a_run_error_naming_the_field(tmp_path):
    folder = make_folder(tmp_path, bad=False)
    spec = dataclasses.replace(tetris_spec(folder), protocol=runs.TetrisSpec(n_clicks=1))
    with pytest.raises(runs.RunError, match=r"^n_clicks must be >= 2") as raised:
        runs.evaluate(spec, tmp_path / "never")
    assert raised.value.render(FlagNames()).startswith("--n-clicks must be >= 2")
    assert not (tmp_path / "never").exists()  # refused before anything is written


def test_the_command_line_names_the_flag(tmp_path, capsys):
    folder = make_folder(tmp_path, bad=False)
    argv = tetris_argv(folder, tmp_path / "out") + ["--frame", "round:0"]
    assert cli.main(argv) == 2
    assert "--frame must be 'exact', 'round:N' or 'fixed:HxW'" in capsys.readouterr().err


def test_specs_are_frozen():
    spec = runs.TetrisSpec()
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.n_clicks = 5  # type: ignore[misc]


def test_the_package_root_exports_the_api_lazily():
    assert jaxseg_robust.evaluate is runs.evaluate and jaxseg_robust.TetrisSpec is runs.TetrisSpec
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        jaxseg_robust.nothing  # noqa: B018
    code = ("import sys, jaxseg_robust; assert 'jaxseg_robust.runs' not in sys.modules; "
            "jaxseg_robust.RunSpec; assert 'jaxseg_robust.runs' in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_prompt_protocol_without_a_model_is_refused(tmp_path):
    folder = make_folder(tmp_path, bad=False)
    spec = dataclasses.replace(tetris_spec(folder), model=None)
    with pytest.raises(runs.RunError, match="the tetris protocol evaluates a model: give model"):
        runs.evaluate(spec, tmp_path / "never", say=lambda text: None)
