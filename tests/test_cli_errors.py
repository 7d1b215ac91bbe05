"""The exit-code contract of every command: user errors and internal errors exit 2 in one line, before any
compute where possible; Ctrl-C (and SIGTERM) exit 130 in one line; never a traceback, never 1 for a crash."""

from __future__ import annotations

import os
import signal
import sys

import pytest

from cli_helpers import folder_flags, make_folder, run_cli
from jaxseg_robust import cli
from jaxseg_robust.commands import score as score_command
from jaxseg_robust.runs import execute as run_execute
from jaxseg_robust.runs import perturb as perturb_spec

UNWRITABLE = "/proc/jaxseg_robust_no_such_dir"


def _fail_if_called(*args, **kwargs):
    raise AssertionError("computed before the output path was checked")


def _one_line(err: str) -> str:
    """The one message line of ``err`` besides the documented start-up lines (``loading ...``, ``compiling ...``)."""
    lines = [line for line in err.splitlines()
             if line.strip() and not line.startswith(("loading ", "compiling "))]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


def test_score_checks_out_before_scoring(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(score_command, "score_buckets", _fail_if_called)
    code, _, err = run_cli(["score", "--example", str(tmp_path / "ex"), "--out", f"{UNWRITABLE}/s.csv"], capsys)
    assert code == cli.EXIT_FAILURE
    line = _one_line(err)
    assert line.startswith("jaxseg-robust score: error: --out /proc/") and "not writable" in line


def test_perturb_checks_out_before_loading_the_model(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(perturb_spec, "load_target", _fail_if_called)
    code, _, err = run_cli(["perturb", "--model", "sam_tiny", "--random-init", "--datasets", str(tmp_path),
                            "--out", f"{UNWRITABLE}/p"], capsys)
    assert code == cli.EXIT_FAILURE
    line = _one_line(err)
    assert line.startswith("jaxseg-robust perturb: error: --out /proc/") and "not writable" in line


@pytest.mark.parametrize("command", ["grid", "tetris", "breps", "rclicks"])
def test_run_commands_check_out_and_progress_before_anything(tmp_path, capsys, monkeypatch, command):
    monkeypatch.setitem(sys.modules, "tqdm", None)  # tqdm not installed
    folder = make_folder(tmp_path, bad=False)
    extra = {"grid": ["--kind", "box"], "rclicks": ["--clickability", "dt"]}.get(command, [])
    base = [command, *extra, "--model", "sam_tiny", *folder_flags(folder)]
    code, _, err = run_cli([*base, "--out", f"{UNWRITABLE}/run"], capsys)
    assert code == cli.EXIT_FAILURE and "--out /proc/" in _one_line(err)
    out = tmp_path / "run"
    code, _, err = run_cli([*base, "--out", str(out), "--progress", "tqdm"], capsys)
    assert code == cli.EXIT_FAILURE
    assert "--progress tqdm needs the tqdm package" in _one_line(err)
    assert not out.exists()  # refused before the manifest was written


def _interrupt(*args, **kwargs):
    raise KeyboardInterrupt


def _terminate(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGTERM)  # what a batch scheduler sends before its kill
    raise AssertionError("SIGTERM did not stop the command")


@pytest.mark.parametrize("stop", [_interrupt, _terminate])
@pytest.mark.parametrize("command", ["score", "grid", "perturb"])
def test_ctrl_c_exits_130_in_one_line(tmp_path, capsys, monkeypatch, command, stop):
    folder = make_folder(tmp_path, bad=False)
    if command == "score":
        monkeypatch.setattr(score_command, "score_buckets", stop)
        argv = ["score", "--example", str(tmp_path / "ex")]
    elif command == "grid":
        monkeypatch.setattr(run_execute, "run_plan", stop)
        argv = ["grid", "--kind", "box", "--model", "sam_tiny", *folder_flags(folder), "--out", str(tmp_path / "r")]
    else:
        monkeypatch.setattr(perturb_spec, "load_target", stop)
        argv = ["perturb", "--model", "sam_tiny", "--random-init", "--datasets", str(folder),
                "--out", str(tmp_path / "p")]
    before = signal.getsignal(signal.SIGTERM)
    code, _, err = run_cli(argv, capsys)
    assert code == cli.EXIT_INTERRUPTED == 130
    assert _one_line(err) == f"jaxseg-robust {command}: interrupted; rerun the same command to resume"
    assert signal.getsignal(signal.SIGTERM) is before  # the handler is restored


def test_an_internal_error_exits_2_in_one_line_and_shows_the_traceback_on_request(tmp_path, capsys, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(score_command, "score_buckets", broken)
    argv = ["score", "--example", str(tmp_path / "ex")]
    code, _, err = run_cli(argv, capsys)
    assert code == cli.EXIT_FAILURE
    assert _one_line(err) == ("jaxseg-robust score: internal error: RuntimeError: boom "
                              f"(rerun with {cli.TRACEBACK_ENV_VAR}=1 for the traceback)")
    monkeypatch.setenv(cli.TRACEBACK_ENV_VAR, "1")
    code, _, err = run_cli(argv, capsys)
    assert code == cli.EXIT_FAILURE
    assert "Traceback" in err and err.rstrip().endswith("internal error: RuntimeError: boom")


def test_a_damaged_converted_model_is_one_line_naming_the_file(tmp_path, capsys):
    from jaxseg_robust.models import store, zoo

    model = tmp_path / "sam_tiny_converted"
    store.save(model, zoo.segmenter("sam_tiny").init(0), family="sam", variant="tiny",
               config=zoo.get("sam_tiny").config.to_dict())
    for file in sorted((model / "params" / "d").iterdir()):  # garble the array data, convert nothing
        file.write_bytes(b"garbled" * 5)
    folder = make_folder(tmp_path, bad=False)
    code, _, err = run_cli(["tetris", "--model", str(model), *folder_flags(folder), "--out", str(tmp_path / "run"),
                            "--progress", "none"], capsys)
    assert code == cli.EXIT_FAILURE
    line = _one_line(err)
    assert line.startswith(f"jaxseg-robust tetris: error: --model {model}: {model / 'params' / 'd'}/")
    assert "the parameter checkpoint is damaged or incomplete" in line and len(line) < 400
    assert "Event loop is closed" not in err and not (tmp_path / "run" / "records.jsonl").exists()


@pytest.mark.parametrize("command", [["tetris"], ["breps"], ["grid", "--kind", "click"],
                                     ["rclicks", "--clickability", "dt"]], ids=lambda c: c[0])
def test_a_dense_model_given_to_a_prompt_protocol_says_it_takes_no_prompts(tmp_path, capsys, command):
    import numpy as np

    from jaxseg_robust.models import store

    model = tmp_path / "u2netp"
    store.save(model, {"w": np.zeros(2)}, family="u2netp", variant="u2netp", config={})
    folder = make_folder(tmp_path, bad=False)
    code, _, err = run_cli([*command, "--model", str(model), *folder_flags(folder), "--out", str(tmp_path / "run"),
                            "--progress", "none"], capsys)
    assert code == cli.EXIT_FAILURE
    line = _one_line(err)
    assert line.startswith(f"jaxseg-robust {command[0]}: error: --model {model}: {model} holds a 'u2netp' model, "
                           "a dense model (image -> per-pixel logits) that takes no prompts")
    assert "unknown model family" not in line


def test_a_bad_frame_is_refused_before_the_model_loads(tmp_path, capsys, monkeypatch):
    from jaxseg_robust.models import zoo

    monkeypatch.setattr(zoo, "segmenter", _fail_if_called)  # sam_tiny's random weights
    monkeypatch.setattr(zoo, "load_params", _fail_if_called)  # converted weights
    folder = make_folder(tmp_path, bad=False)
    for command in (["tetris"], ["breps"], ["grid", "--kind", "click"], ["rclicks", "--clickability", "dt"]):
        code, _, err = run_cli([*command, "--model", "sam_tiny", *folder_flags(folder), "--frame", "round:0",
                                "--out", str(tmp_path / "run"), "--progress", "none"], capsys)
        assert code == cli.EXIT_FAILURE
        assert _one_line(err) == (f"jaxseg-robust {command[0]}: error: --frame must be 'exact', 'round:N' or "
                                  "'fixed:HxW' with positive numbers; got 'round:0'")
        assert not (tmp_path / "run").exists()


def test_report_of_a_missing_directory_says_it_does_not_exist(tmp_path, capsys):
    missing = tmp_path / "nonexistent"
    code, _, err = run_cli(["report", str(missing)], capsys)
    assert code == cli.EXIT_FAILURE
    assert _one_line(err) == (f"jaxseg-robust report: error: {missing} does not exist (give a run directory or a "
                              "folder of run directories)")
    (tmp_path / "file.txt").write_text("x")
    code, _, err = run_cli(["report", str(tmp_path / "file.txt")], capsys)
    assert code == cli.EXIT_FAILURE and "file.txt is not a directory" in _one_line(err)


def test_warnings_print_as_one_line_without_a_source_path(tmp_path):
    import subprocess

    import numpy as np
    from PIL import Image

    folder = make_folder(tmp_path, bad=False)
    noise = np.random.default_rng(5).integers(0, 256, (40, 48), dtype=np.uint8)
    Image.fromarray(noise).save(folder / "masks" / "a1.png")  # a photo-like mask: a warning naming the file
    script = ("import sys, warnings; from jaxseg_robust import cli; code = cli.main(sys.argv[1:]); "
              "warnings.warn('after the command'); sys.exit(code)")
    argv = ["tetris", "--model", "sam_tiny", "--mode", "baseline", "--n-clicks", "2", *folder_flags(folder),
            "--out", str(tmp_path / "run"), "--progress", "none", "--frame", "exact"]
    done = subprocess.run([sys.executable, "-c", script, *argv], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert done.returncode == cli.EXIT_OK, done.stderr
    lines = done.stderr.splitlines()
    warned = [line for line in lines if "not a two-valued mask" in line]
    assert len(warned) == 1 and warned[0].startswith(f"warning: toy/a1: {folder / 'masks' / 'a1.png'}: not a ")
    assert not any(".py:" in line or ": UserWarning" in line for line in lines[:-1])  # no source while it runs
    assert lines[-1] == "<string>:1: UserWarning: after the command"  # Python's own format once it is done
