"""Running a protocol into a run directory and ending a command: processes, the engine, tables, exit codes.

`start_processes` checks the process flags (and ``--out`` / ``--progress``)
before anything is computed; `run_protocol` runs a batch function over the
instances with `jaxseg_robust.runner.engine.run` (resume, records, progress);
`finish` writes and prints the per-dataset table and returns the exit code of
`jaxseg_robust.exit_codes` (0 ok, 1 some instances failed, 2 nothing
succeeded); `report_error` prints ``jaxseg-robust COMMAND: error: ...``.
"""

from __future__ import annotations

import pathlib
import sys
from collections.abc import Callable, Mapping, Sequence

from jaxseg_robust.commands.flags import CommandError, parse_frame_policy
from jaxseg_robust.commands.loading import LoadedModel
from jaxseg_robust.exit_codes import EXIT_FAILURE, EXIT_OK, EXIT_PARTIAL


def startup_line(text: str, stream=None) -> None:
    """Prints a start-up step (``loading sam_vit_b ...``, ``compiling ...``) to stderr, flushed."""
    print(text, file=sys.stderr if stream is None else stream, flush=True)


def check_outputs(args) -> None:
    """Checks ``--out`` is a writable run directory (or can be created as one), ``--progress`` can be shown and
    ``--frame`` is a frame policy.

    Runs before any model is loaded or anything computed; creates nothing.

    Raises:
      CommandError: naming the flag (an unwritable --out, --progress tqdm without tqdm, a bad --frame).
    """
    if getattr(args, "frame", None):
        parse_frame_policy(args.frame)
    from jaxseg_robust.runner.progress import check_progress_mode  # noqa: PLC0415
    from jaxseg_robust.runner.rundir import check_writable_dir  # noqa: PLC0415

    try:
        if getattr(args, "out", None) is not None:
            check_writable_dir(args.out, "--out")
        if getattr(args, "progress", None) is not None:
            check_progress_mode(args.progress)
    except ValueError as error:
        raise CommandError(str(error)) from None


def start_processes(args) -> tuple[int | None, int | None]:
    """Checks the process flags and starts ``jax.distributed`` when asked; call before anything uses JAX.

    Also checks ``--out``, ``--progress`` and ``--frame`` (`check_outputs`), so every run
    command refuses an unwritable run directory or a bad frame before it loads or computes anything.

    Args:
      args: parsed flags with ``distributed``, ``process_index``, ``process_count``.

    Returns:
      ``(process_index, process_count)`` for the engine: both None (one
      process, or ``--distributed``: the engine asks JAX) or the given share.

    Raises:
      CommandError: naming the flag (one of the pair missing, I >= N, a
        share given together with --distributed, or no cluster to join).
    """
    index, count = getattr(args, "process_index", None), getattr(args, "process_count", None)
    if (index is None) != (count is None):
        raise CommandError("--process-index and --process-count go together")
    if index is not None and index >= count:
        raise CommandError(f"--process-index must be < --process-count ({count}); got {index}")
    if getattr(args, "distributed", False):
        if index is not None:
            raise CommandError("--distributed takes the share from jax.process_index(); drop --process-index")
        import jax  # noqa: PLC0415

        try:
            jax.distributed.initialize()
        except (RuntimeError, ValueError) as error:
            raise CommandError(f"--distributed: jax.distributed.initialize() failed: {error}") from None
    check_outputs(args)
    return index, count


def run_protocol(args, *, instances: Sequence, batch_fn: Callable, config: Mapping, model: LoadedModel,
                 finalize: Callable | None = None, mesh=None, check: Callable | None | str = "object"):
    """Runs ``batch_fn`` over ``instances`` into ``args.out`` with the engine (resume, records, progress).

    Args:
      args: the parsed run flags (``--out``, ``--batch-size``, ``--frame`` when the command has it, else
        every image in its own frame, ``--progress``, ...).
      model: anything with the ``fingerprint`` of the weights (a `LoadedModel`).
      config: the manifest's config; ``--precision`` is added as ``matmul_precision`` and every jitted
        program of the run is traced under it (`jaxseg_robust.runner.precision.matmul_precision`).
      check: host check of each loaded instance: "object" (`data.instances.require_object`: a prompt
        needs an object), a callable, or None.

    Returns:
      The engine's `RunSummary`.

    Raises:
      CommandError: manifest mismatch, busy run directory, aborted run, bad run directory.
    """
    from jaxseg_robust.data.buckets import ExactFrame  # noqa: PLC0415
    from jaxseg_robust.data.instances import require_object  # noqa: PLC0415
    from jaxseg_robust.runner.engine import RunAbortedError, run  # noqa: PLC0415
    from jaxseg_robust.runner.precision import CONFIG_KEY as PRECISION_KEY  # noqa: PLC0415
    from jaxseg_robust.runner.precision import matmul_precision  # noqa: PLC0415
    from jaxseg_robust.runner.program import BatchProgram  # noqa: PLC0415
    from jaxseg_robust.runner.rundir import ManifestMismatchError, RunDirectoryBusyError  # noqa: PLC0415

    requested = parse_frame_policy(args.frame) if getattr(args, "frame", None) else ExactFrame()
    policy = batch_fn.frame_policy(requested) if isinstance(batch_fn, BatchProgram) else requested
    if policy is not requested:
        # the network sees the frame itself (click-map models): padding would change its outputs
        print(f"note: --model {model.name} runs every image in its own frame (its network sees the padded "
              f"frame, so --frame {args.frame} would change its outputs)", file=sys.stderr)
    check = require_object if check == "object" else check
    process_index, process_count = getattr(args, "process_index", None), getattr(args, "process_count", None)
    precision = args.precision
    try:
        with matmul_precision(precision):
            return run(instances, batch_fn, args.out, args.batch_size, config={**config, PRECISION_KEY: precision},
                       model_fingerprint=model.fingerprint, frame_policy=policy, finalize=finalize,
                       process_index=process_index, process_count=process_count, check=check, mesh=mesh,
                       allow_manifest_mismatch=args.allow_manifest_mismatch,
                       retry_failed=args.retry_failed, abort_after_consecutive_failures=args.abort_after,
                       progress=args.progress)
    except ManifestMismatchError as error:
        raise CommandError(f"{error}".replace("allow_mismatch=True (CLI: --allow-manifest-mismatch)",
                                              "--allow-manifest-mismatch")) from None
    except (RunDirectoryBusyError, RunAbortedError) as error:
        raise CommandError(str(error)) from None
    except (ValueError, OSError) as error:
        raise CommandError(f"{type(error).__name__}: {error}") from None


def exit_code(summary, recorded_ok: int) -> int:
    """CLI exit code of a finished run: 2 if nothing is recorded as ok, 1 if some instance failed, else 0."""
    if recorded_ok == 0:
        return EXIT_FAILURE
    return EXIT_PARTIAL if summary.exit_code != EXIT_OK else EXIT_OK


def report_error(command: str, message: str, stream=None) -> int:
    """Prints ``jaxseg-robust COMMAND: error: MESSAGE`` to stderr; returns EXIT_FAILURE."""
    print(f"jaxseg-robust {command}: error: {message}", file=sys.stderr if stream is None else stream)
    return EXIT_FAILURE


def resized_count(run_dir) -> tuple[int, int]:
    """(instances whose latest record holds ``"resized"``, instances recorded) over every records file of a run."""
    from jaxseg_robust.runner.records import latest_records, read_run_records  # noqa: PLC0415

    latest = latest_records(read_run_records(run_dir))
    return sum("resized" in record for record in latest.values()), len(latest)


def resized_line(run_dir) -> str | None:
    """The run summary's count of resized instances (``3 of 7 instances were resized ...``), or None when none was."""
    resized, recorded = resized_count(run_dir)
    if not resized:
        return None
    return (f"{resized} of {recorded} instances were resized on load (longest side over --max-side, or the TETRIS "
            "cap); their results are in the resized frame and each record's \"resized\" field maps them back")


def print_outcome(summary, table: str, files: Sequence[pathlib.Path], resized: str | None = None,
                  stream=None) -> None:
    """Prints the run summary (counts, failures), the table, where the files are and, last, how many
    instances were resized (``resized``: `resized_line`, None when none was)."""
    out = sys.stdout if stream is None else stream
    print(summary.format(), file=out)
    print("", file=out)
    print(table, file=out)
    for path in files:
        print(f"wrote {path}", file=out)
    if resized is not None:
        print(resized, file=out)


def write_tables(run_dir, markdown: str, csv_text: str, stem: str = "summary") -> list[pathlib.Path]:
    """Writes ``<stem>.md`` and ``<stem>.csv`` into the run directory; returns their paths."""
    from jaxseg_robust.reports.report_files import write_table_files  # noqa: PLC0415

    return list(write_table_files(run_dir, stem, markdown, csv_text).values())


def process_index_of(args) -> int:
    """This process's index among the run's processes (names its timings file)."""
    if getattr(args, "process_index", None) is not None:
        return int(args.process_index)
    if getattr(args, "distributed", False):
        import jax  # noqa: PLC0415

        return int(jax.process_index())
    return 0


def timed_finalize_of(args, batch_fn, finalize=None, clicks: int = 0):
    """The engine ``finalize`` of a timed `runner.program.BatchProgram` (``batch_fn``): its timings and
    compile events into ``args.out`` (`reports.artifacts.timed_finalize`), then ``finalize``."""
    from jaxseg_robust.reports.artifacts import timed_finalize  # noqa: PLC0415

    return timed_finalize(args.out, batch_fn.compile_log, clicks, process_index_of(args), finalize)


def finish(command: str, args, summary, markdown: str, csv_text: str) -> int:
    """The common end of a prompt-protocol command: write and print the tables, return the exit code.

    The tables get the run's seconds per instance (device and wall) and its compile seconds
    (`jaxseg_robust.reports.timing_summary`) before they are written and printed.

    Args:
      command: the sub-command name (for messages).
      args: parsed flags (``args.out`` is the run directory).
      summary: the engine's `RunSummary` of this call.
      markdown, csv_text: the per-dataset table of every record in the run directory; ``summary.md`` gets
        the count of resized instances below it (`resized_line`, when any was).

    Returns:
      `exit_code` over everything recorded in the run directory.
    """
    from jaxseg_robust.reports.timing_summary import add_timing  # noqa: PLC0415
    from jaxseg_robust.runner.engine import recorded_counts  # noqa: PLC0415

    markdown, csv_text = add_timing(args.out, markdown, csv_text)
    resized = resized_line(args.out)
    files = write_tables(args.out, markdown if resized is None else f"{markdown}\n\n{resized}\n", csv_text)
    print_outcome(summary, markdown, files, resized)
    code = exit_code(summary, recorded_counts(args.out)["ok"])
    if code == EXIT_FAILURE:
        report_error(command, f"no instance succeeded (see the failures above and {args.out}/records*.jsonl)")
    return code


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
