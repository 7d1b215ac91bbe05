"""JAX's persistent compilation cache of the command line (`jaxseg_robust.runner.compile_cache`).

The test session runs with the cache off (tests/conftest.py); the tests here pass their own temporary
``--compile-cache DIR`` and switch the cache off again when they end.
"""

from __future__ import annotations

import pathlib

import jax
import pytest
from cli_helpers import folder_flags, make_folder, run_cli

from jaxseg_robust import cli
from jaxseg_robust.reports.artifacts import read_compile_events
from jaxseg_robust.runner import compile_cache
from jaxseg_robust.runner.program import device_program


def breps_argv(folder, out, *global_flags: str) -> list[str]:
    """A small BREPS run of sam_tiny (one instance, 3 iterates) with the global flags before the command."""
    return [*global_flags, "breps", "--model", "sam_tiny", *folder_flags(folder), "--out", str(out), "--limit", "1",
            "--n_opt_steps", "3", "--progress", "none"]


def forget_compiled_programs() -> None:
    """Drops the process's compiled programs, as a new process starts without them."""
    device_program.cache_clear()
    jax.clear_caches()


@pytest.fixture
def cache_switched_off_after():
    """Switches the cache off (the session's setting) when the test ends."""
    yield
    compile_cache.configure_compile_cache(None)
    forget_compiled_programs()


def test_the_cache_directory_follows_flag_then_environment_then_default(tmp_path):
    environ = {"XDG_CACHE_HOME": str(tmp_path / "xdg")}
    assert compile_cache.resolve_cache_dir(None, environ) == tmp_path / "xdg" / "jaxseg_robust" / "jax"
    assert compile_cache.default_cache_dir({}) == pathlib.Path("~/.cache/jaxseg_robust/jax").expanduser()
    environ[compile_cache.JAX_ENV_VAR] = str(tmp_path / "jax")
    assert compile_cache.resolve_cache_dir(None, environ) == tmp_path / "jax"
    environ[compile_cache.ENV_VAR] = str(tmp_path / "mine")
    assert compile_cache.resolve_cache_dir(None, environ) == tmp_path / "mine"
    assert compile_cache.resolve_cache_dir(str(tmp_path / "flag"), environ) == tmp_path / "flag"
    assert compile_cache.resolve_cache_dir("off", environ) is None
    environ[compile_cache.ENV_VAR] = "OFF"
    assert compile_cache.resolve_cache_dir(None, environ) is None
    environ[compile_cache.ENV_VAR] = " "
    with pytest.raises(ValueError, match=compile_cache.ENV_VAR):
        compile_cache.resolve_cache_dir(None, environ)


def test_a_second_run_loads_its_program_from_the_cache(tmp_path, capsys, cache_switched_off_after):
    folder = make_folder(tmp_path, bad=False)
    cache = tmp_path / "cache"
    code, _, err = run_cli(breps_argv(folder, tmp_path / "first", "--compile-cache", str(cache)), capsys)
    assert code == cli.EXIT_OK, err
    assert any(cache.iterdir())
    first = read_compile_events(tmp_path / "first")
    assert len(first) == 1 and first[0]["from_cache"] is False
    forget_compiled_programs()
    code, stdout, err = run_cli(breps_argv(folder, tmp_path / "second", "--compile-cache", str(cache)), capsys)
    assert code == cli.EXIT_OK, err
    second = read_compile_events(tmp_path / "second")
    assert len(second) == 1 and second[0]["from_cache"] is True
    assert second[0]["seconds"] < first[0]["seconds"] / 2
    assert f"compile: {second[0]['seconds']:.1f} s for 1 bucket program(s), 1 from the cache" in stdout
    assert "1 from the cache" in (tmp_path / "second" / "summary.md").read_text()


def test_compile_cache_off_writes_nothing(tmp_path, capsys, monkeypatch, cache_switched_off_after):
    folder = make_folder(tmp_path, bad=False)
    cache = tmp_path / "cache"
    monkeypatch.setenv(compile_cache.ENV_VAR, str(cache))
    code, stdout, err = run_cli(breps_argv(folder, tmp_path / "run", "--compile-cache", "off"), capsys)
    assert code == cli.EXIT_OK, err
    assert not cache.exists()
    events = read_compile_events(tmp_path / "run")
    assert len(events) == 1 and events[0]["from_cache"] is False
    assert "1 bucket program(s), 0 from the cache" in stdout


def test_a_default_directory_that_cannot_be_made_leaves_the_cache_off(tmp_path, cache_switched_off_after):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    warning = compile_cache.switch_compile_cache(None, {"XDG_CACHE_HOME": str(blocker)})
    assert warning.startswith("the compilation cache is off:") and "--compile-cache DIR" in warning
    assert jax.config.jax_compilation_cache_dir is None
    with pytest.raises(OSError):  # a directory the user named must work
        compile_cache.switch_compile_cache(None, {compile_cache.ENV_VAR: str(blocker / "cache")})
    assert compile_cache.switch_compile_cache(None, {compile_cache.ENV_VAR: str(tmp_path / "c")}) is None
    assert jax.config.jax_compilation_cache_dir == str(tmp_path / "c") and (tmp_path / "c").is_dir()


def test_a_cache_directory_that_cannot_be_made_exits_2(tmp_path, capsys, cache_switched_off_after):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    code, _, err = run_cli(["--compile-cache", str(blocker / "cache"), "report", str(tmp_path), "--out",
                            str(tmp_path / "report")], capsys)
    assert code == cli.EXIT_FAILURE
    assert err.startswith("jaxseg-robust report: error: compile cache:") and str(blocker) in err
    assert len(err.strip().splitlines()) == 1
