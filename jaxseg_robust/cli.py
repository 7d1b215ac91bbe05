"""The `jaxseg-robust` command line: a thin dispatcher over `jaxseg_robust.commands`.

Exit codes (every command):
  0  success: every item was processed;
  1  partial failure: the run finished but some items failed (they are named
     in the output and in the run's records);
  2  failure: bad arguments or nothing could be processed, or an unexpected
     internal error (one line naming it; set JAXSEG_ROBUST_TRACEBACK=1 to
     see the traceback);
  130  interrupted (Ctrl-C, or SIGTERM as a batch scheduler sends before its
     kill): one line, no traceback; rerunning the same command resumes
     (records are written once per batch).

Before a command runs, JAX's persistent compilation cache is pointed where
``--compile-cache DIR|off`` (before the command), ``$JAXSEG_ROBUST_COMPILE_CACHE``
or the per-user default says (`use_compile_cache`,
`jaxseg_robust.runner.compile_cache`).

Warnings (a mask that is not two-valued, skipped files, ...) print as
``warning: MESSAGE`` on stderr, without the source file and line of the code
that raised them (`format_warning`; set for the command line only).
"""

from __future__ import annotations

import os
import signal
import sys
import traceback
import warnings

from jaxseg_robust.commands import COMMAND_MODULES, build_parser
from jaxseg_robust.exit_codes import EXIT_FAILURE, EXIT_INTERRUPTED, EXIT_OK, EXIT_PARTIAL
from jaxseg_robust.models.store import quiet_closed_loop_hook

__all__ = ["COMMAND_MODULES", "EXIT_FAILURE", "EXIT_INTERRUPTED", "EXIT_OK", "EXIT_PARTIAL", "TRACEBACK_ENV_VAR",
           "build_parser", "main"]

TRACEBACK_ENV_VAR = "JAXSEG_ROBUST_TRACEBACK"

def format_warning(message, category, filename, lineno, line=None) -> str:
    """`warnings.formatwarning` of the command line: ``warning: MESSAGE`` and a newline, no source path or line."""
    del category, filename, lineno, line
    return f"warning: {message}\n"


def use_compile_cache(option: str | None, command: str) -> bool:
    """Points JAX's persistent compilation cache where ``--compile-cache`` (``option``), its environment
    variable or the default says (`jaxseg_robust.runner.compile_cache.switch_compile_cache`); False after
    printing one line when the directory the user named cannot be used."""
    from jaxseg_robust.runner.compile_cache import switch_compile_cache  # noqa: PLC0415

    try:
        warning = switch_compile_cache(option)
    except (ValueError, OSError) as error:
        print(f"{command}: error: compile cache: {error} (choose another with --compile-cache DIR, or "
              "--compile-cache off)", file=sys.stderr, flush=True)
        return False
    if warning is not None:
        print(f"warning: {warning}", file=sys.stderr, flush=True)
    return True


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt


def _stop_on_sigterm():
    """Makes SIGTERM stop a command like Ctrl-C (clean stop, resumable); returns the previous handler.

    A batch scheduler's SIGTERM would otherwise end the process like a kill,
    and the run's in-flight journal would count the batch as one that killed it.
    """
    try:
        return signal.signal(signal.SIGTERM, _raise_interrupt)
    except (ValueError, OSError):  # not the main thread: leave signals alone
        return None


def main(argv: list[str] | None = None) -> int:
    """Parses ``argv`` and runs the chosen sub-command; returns its exit code.

    Ctrl-C anywhere prints one line and returns `EXIT_INTERRUPTED`; any
    exception a command did not turn into a message prints one line naming
    it (plus the traceback when ``$JAXSEG_ROBUST_TRACEBACK`` is set) and
    returns `EXIT_FAILURE`, never the "partial" code 1. While it runs, warnings
    print as one ``warning: ...`` line (`format_warning`) and the tracebacks of
    reads a damaged checkpoint left in flight are dropped
    (`jaxseg_robust.models.store.quiet_closed_loop_hook`).
    """
    previous_format, warnings.formatwarning = warnings.formatwarning, format_warning
    previous_hook = sys.unraisablehook
    sys.unraisablehook = quiet_closed_loop_hook(previous_hook)
    try:
        return _main(argv)
    finally:
        warnings.formatwarning = previous_format
        sys.unraisablehook = previous_hook


def _main(argv: list[str] | None) -> int:
    """`main` without the warning format and the unraisable hook."""
    command = "jaxseg-robust"
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        if args.func is None:  # no sub-command
            parser.print_help()
            return EXIT_FAILURE
        command = f"jaxseg-robust {args.command}"
        if not use_compile_cache(args.compile_cache, command):
            return EXIT_FAILURE
        previous = _stop_on_sigterm()
        try:
            return int(args.func(args))
        finally:
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)
    except KeyboardInterrupt:
        print(f"{command}: interrupted; rerun the same command to resume", file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED
    except Exception as error:  # noqa: BLE001 - the exit-code contract: never a bare traceback, never 1
        if os.environ.get(TRACEBACK_ENV_VAR):
            traceback.print_exc()
            hint = ""
        else:
            hint = f" (rerun with {TRACEBACK_ENV_VAR}=1 for the traceback)"
        print(f"{command}: internal error: {type(error).__name__}: {error}{hint}", file=sys.stderr, flush=True)
        return EXIT_FAILURE


if __name__ == "__main__":
    sys.exit(main())
