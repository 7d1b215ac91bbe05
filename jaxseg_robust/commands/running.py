"""Running a command's run spec and ending the command: start-up lines, the outcome, errors, exit codes.

`run_spec` runs a `jaxseg_robust.runs.RunSpec` with `jaxseg_robust.runs.evaluate`,
prints the run summary and the per-dataset table (`print_outcome`) and returns
the exit code of `jaxseg_robust.exit_codes` (0 ok, 1 some instances failed, 2
nothing succeeded or a setting that cannot run); `report_error` prints
``jaxseg-robust COMMAND: error: ...``.
"""

from __future__ import annotations

import pathlib
import sys
from collections.abc import Mapping, Sequence

from jaxseg_robust.exit_codes import EXIT_FAILURE


def startup_line(text: str, stream=None) -> None:
    """Prints a start-up step (``loading sam_vit_b ...``, ``compiling ...``) to stderr, flushed."""
    print(text, file=sys.stderr if stream is None else stream, flush=True)


def report_error(command: str, message: str, stream=None) -> int:
    """Prints ``jaxseg-robust COMMAND: error: MESSAGE`` to stderr; returns EXIT_FAILURE."""
    print(f"jaxseg-robust {command}: error: {message}", file=sys.stderr if stream is None else stream)
    return EXIT_FAILURE


def report_warning(command: str, message: str, stream=None) -> None:
    """Prints ``jaxseg-robust COMMAND: warning: MESSAGE`` to stderr, flushed."""
    print(f"jaxseg-robust {command}: warning: {message}", file=sys.stderr if stream is None else stream, flush=True)


def print_outcome(summary, table: str, files: Sequence[pathlib.Path], resized: str | None = None,
                  stream=None) -> None:
    """Prints the run summary (counts, failures), the table, where the files are and, last, how many
    instances were resized (``resized``: None when none was)."""
    out = sys.stdout if stream is None else stream
    print(summary.format(), file=out)
    print("", file=out)
    print(table, file=out)
    for path in files:
        print(f"wrote {path}", file=out)
    if resized is not None:
        print(resized, file=out)


def run_spec(command: str, spec, run_dir, names: Mapping[str, str]) -> int:
    """Runs ``spec`` into ``run_dir`` (`jaxseg_robust.runs.evaluate`), prints the outcome and the table,
    and returns the exit code; a `RunError` is printed as one line naming the flags (``names``)."""
    from jaxseg_robust.runs import RunError, evaluate  # noqa: PLC0415

    try:
        result = evaluate(spec, run_dir, say=startup_line, field_names=names)
    except RunError as error:
        return report_error(command, error.render(names))
    except ValueError as error:
        return report_error(command, str(error))
    print_outcome(result.summary, result.tables.markdown, result.files, result.resized)
    if result.exit_code == EXIT_FAILURE:
        report_error(command, f"no instance succeeded (see the failures above and {run_dir}/records*.jsonl)")
    return result.exit_code
