"""JAX's persistent compilation cache for the command line: where it lives, switching it, and counting its hits.

A batch program compiles in seconds on the CPU and in minutes on a GPU (the
TETRIS program); with the cache a second run of the same command, in a new
process, loads every bucket's executable from disk instead
(docs/ARCHITECTURE.md, "Compilation cache"). The directory, in order of
precedence:

  ``--compile-cache DIR`` / ``--compile-cache off``   (the global flag of `jaxseg-robust`)
  ``$JAXSEG_ROBUST_COMPILE_CACHE`` (a directory or ``off``)
  ``$JAX_COMPILATION_CACHE_DIR`` (JAX's own variable)
  ``$XDG_CACHE_HOME/jaxseg_robust/jax``, else ``~/.cache/jaxseg_robust/jax``

Programs that compile in at least `MIN_COMPILE_SECONDS` are written, whatever
their size; JAX keys an entry by the program, the devices, the compile options
and XLA_FLAGS, so a changed model, setting or flag compiles afresh.
`cache_hits` counts the programs JAX loaded from the cache in this process
(``runner.program.DeviceProgram`` records, per bucket, whether its program
came from there).
"""

from __future__ import annotations

import os
import pathlib
import threading
from collections.abc import Mapping

ENV_VAR = "JAXSEG_ROBUST_COMPILE_CACHE"
JAX_ENV_VAR = "JAX_COMPILATION_CACHE_DIR"
OFF = "off"
MIN_COMPILE_SECONDS = 0.25  # a batch program takes seconds; the eager ops of the host side take milliseconds
CACHE_HIT_EVENT = "/jax/compilation_cache/cache_hits"

_hits = 0
_hits_lock = threading.Lock()
_listening = False


def default_cache_dir(environ: Mapping[str, str] | None = None) -> pathlib.Path:
    """``$XDG_CACHE_HOME/jaxseg_robust/jax``, or ``~/.cache/jaxseg_robust/jax`` without XDG_CACHE_HOME."""
    environ = os.environ if environ is None else environ
    base = environ.get("XDG_CACHE_HOME") or str(pathlib.Path("~/.cache").expanduser())
    return pathlib.Path(base) / "jaxseg_robust" / "jax"


def resolve_cache_dir(option: str | None, environ: Mapping[str, str] | None = None) -> pathlib.Path | None:
    """The cache directory of the precedence in the module docstring; None when the cache is off.

    Args:
      option: ``--compile-cache`` (a directory or ``"off"``), None when not given.
      environ: the environment (default ``os.environ``).

    Raises:
      ValueError: an empty value, naming where it came from.
    """
    environ = os.environ if environ is None else environ
    for value, source in ((option, "--compile-cache"), (environ.get(ENV_VAR), f"${ENV_VAR}")):
        if value is None:
            continue
        if not value.strip():
            raise ValueError(f"{source} must be a directory or '{OFF}'; got an empty value")
        return None if value.strip().lower() == OFF else pathlib.Path(value).expanduser()
    jax_dir = environ.get(JAX_ENV_VAR)
    return pathlib.Path(jax_dir).expanduser() if jax_dir else default_cache_dir(environ)


def _count_hit(event: str, **kwargs) -> None:
    global _hits
    if event == CACHE_HIT_EVENT:
        with _hits_lock:
            _hits += 1


def listen_for_cache_hits() -> None:
    """Registers (once per process) the `jax.monitoring` listener behind `cache_hits`."""
    global _listening
    import jax.monitoring  # noqa: PLC0415

    with _hits_lock:
        if _listening:
            return
        _listening = True
    jax.monitoring.register_event_listener(_count_hit)


def cache_hits() -> int:
    """Programs JAX has loaded from the persistent cache in this process since `listen_for_cache_hits`."""
    return _hits


def configure_compile_cache(directory: pathlib.Path | None) -> None:
    """Points JAX's persistent compilation cache at ``directory`` (created), or switches it off (None).

    Takes effect for the next compile (JAX's cache object is reset), so a process may move it.

    Raises:
      OSError: the directory cannot be created.
    """
    import jax  # noqa: PLC0415
    from jax.experimental.compilation_cache import compilation_cache  # noqa: PLC0415

    listen_for_cache_hits()
    if directory is not None:
        directory.mkdir(parents=True, exist_ok=True)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_SECONDS)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)  # -1: any size
    jax.config.update("jax_compilation_cache_dir", None if directory is None else str(directory))
    compilation_cache.reset_cache()


def switch_compile_cache(option: str | None, environ: Mapping[str, str] | None = None) -> str | None:
    """`resolve_cache_dir` then `configure_compile_cache`: what the command line does before a command.

    A default directory that cannot be created (a read-only home) leaves the cache off and returns a
    warning saying so; a directory the user named must work.

    Returns:
      None, or the warning text.

    Raises:
      ValueError: an empty ``--compile-cache`` or ``$JAXSEG_ROBUST_COMPILE_CACHE``.
      OSError: the directory the flag or an environment variable names cannot be created.
    """
    environ = os.environ if environ is None else environ
    directory = resolve_cache_dir(option, environ)
    named = option is not None or bool(environ.get(ENV_VAR)) or bool(environ.get(JAX_ENV_VAR))
    try:
        configure_compile_cache(directory)
    except OSError as error:
        if named:
            raise
        configure_compile_cache(None)
        return f"the compilation cache is off: {error} (choose a directory with --compile-cache DIR)"
    return None


__all__ = ["ENV_VAR", "JAX_ENV_VAR", "OFF", "MIN_COMPILE_SECONDS", "CACHE_HIT_EVENT", "default_cache_dir",
           "resolve_cache_dir", "listen_for_cache_hits", "cache_hits", "configure_compile_cache",
           "switch_compile_cache"]
