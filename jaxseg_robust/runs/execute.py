"""`evaluate`: one run spec into one run directory, for every protocol (docs/ARCHITECTURE.md, "One run").

    from jaxseg_robust import runs
    spec = runs.RunSpec(model=runs.ModelSpec("sam_vit_b"), data=runs.DataSpec(datasets=("GrabCut",)),
                        protocol=runs.TetrisSpec(mode="minmax"))
    result = runs.evaluate(spec, "runs/tetris_sam_vit_b")
    print(result.markdown)

The path is the same for every protocol and for the command line: check the
settings, list the instances, load the model, plan the batch program, run it
with the engine (resume, records, timings), write the per-dataset table.
Rerunning the same spec into the same directory resumes.
"""

from __future__ import annotations

import dataclasses
import pathlib
import sys
from collections.abc import Callable, Mapping

from jaxseg_robust.exit_codes import EXIT_FAILURE, EXIT_OK, EXIT_PARTIAL
from jaxseg_robust.runs.protocol import RunPlan, RunTables, Say
from jaxseg_robust.runs.spec import EngineSpec, RunError, RunSpec, parse_frame, render_fields


@dataclasses.dataclass(frozen=True)
class RunResult:
    """What `evaluate` did.

    Attributes:
      run_dir: the run directory.
      summary: the engine's `jaxseg_robust.runner.engine.RunSummary` of this call.
      tables: the per-dataset table of every record in the run directory, with the run's seconds.
      files: the summary files written (``summary.md``, ``summary.csv``) and the protocol's others.
      resized: the count of instances resized on load (a line), or None when none was.
      exit_code: `jaxseg_robust.exit_codes`: 0 every instance ok, 1 some failed, 2 none recorded as ok.
    """

    run_dir: pathlib.Path
    summary: object
    tables: RunTables
    files: tuple[pathlib.Path, ...]
    resized: str | None
    exit_code: int


def stderr_lines(text: str) -> None:
    """The default ``say``: one line on stderr, flushed."""
    print(text, file=sys.stderr, flush=True)


def start_processes(engine: EngineSpec) -> None:
    """Checks the process share and starts ``jax.distributed`` when asked; before anything uses JAX.

    Raises:
      RunError: one of the pair missing, I >= N, a share given together with ``distributed``, or no
        cluster to join.
    """
    index, count = engine.process_index, engine.process_count
    if (index is None) != (count is None):
        raise RunError("{process_index} and {process_count} go together")
    if index is not None and index >= count:
        raise RunError(f"{{process_index}} must be < {{process_count}} ({count}); got {index}")
    if engine.distributed:
        if index is not None:
            raise RunError("{distributed} takes the share from jax.process_index(); drop {process_index}")
        import jax  # noqa: PLC0415

        try:
            jax.distributed.initialize()
        except (RuntimeError, ValueError) as error:
            raise RunError(f"{{distributed}}: jax.distributed.initialize() failed: {error}") from None


def check_outputs(engine: EngineSpec, run_dir) -> None:
    """Checks the run directory is writable (or can be created), the progress mode and the frame; creates
    nothing.

    Raises:
      RunError: naming the field.
    """
    from jaxseg_robust.runner.progress import check_progress_mode  # noqa: PLC0415
    from jaxseg_robust.runner.rundir import check_writable_dir  # noqa: PLC0415

    parse_frame(engine.frame)
    try:
        check_writable_dir(run_dir, "{run_dir}")
        check_progress_mode(engine.progress)
    except ValueError as error:
        raise RunError(str(error)) from None


def process_index_of(engine: EngineSpec) -> int:
    """This process's index among the run's processes (names its timings file)."""
    if engine.process_index is not None:
        return int(engine.process_index)
    if engine.distributed:
        import jax  # noqa: PLC0415

        return int(jax.process_index())
    return 0


def frame_policy_of(plan: RunPlan, engine: EngineSpec, model_name: str | None, say: Say):
    """The frame policy the run uses: the plan's or the engine spec's, unless the batch program's model sees
    the frame itself (click-map models: every image in its own frame, said with a note)."""
    from jaxseg_robust.runner.program import BatchProgram  # noqa: PLC0415

    text = plan.frame if plan.frame is not None else engine.frame
    requested = parse_frame(text)
    policy = plan.batch_fn.frame_policy(requested) if isinstance(plan.batch_fn, BatchProgram) else requested
    if policy is not requested:
        say(f"note: {{model}} {model_name} runs every image in its own frame (its network sees the padded "
            f"frame, so {{frame}} {text} would change its outputs)")
    return policy


def run_plan(plan: RunPlan, spec: RunSpec, run_dir, mesh, say: Say):
    """Runs ``plan`` with the engine into ``run_dir`` under the engine spec's precision; its `RunSummary`.

    Raises:
      RunError: manifest mismatch, busy run directory, aborted run, bad run directory.
    """
    from jaxseg_robust.reports.artifacts import timed_finalize  # noqa: PLC0415
    from jaxseg_robust.runner.engine import RunAbortedError, run  # noqa: PLC0415
    from jaxseg_robust.runner.precision import CONFIG_KEY, DEFAULT_MATMUL_PRECISION, matmul_precision  # noqa: PLC0415
    from jaxseg_robust.runner.rundir import ManifestMismatchError, RunDirectoryBusyError  # noqa: PLC0415

    engine = spec.engine
    policy = frame_policy_of(plan, engine, None if spec.model is None else spec.model.name, say)
    finalize = timed_finalize(run_dir, plan.batch_fn.compile_log, plan.clicks, process_index_of(engine), plan.finalize)
    precision = DEFAULT_MATMUL_PRECISION if engine.precision is None else engine.precision
    batch_size = spec.protocol.default_batch_size if engine.batch_size is None else engine.batch_size
    try:
        with matmul_precision(precision):
            return run(plan.instances, plan.batch_fn, run_dir, batch_size, config={**plan.config, CONFIG_KEY: precision},
                       model_fingerprint=plan.fingerprint, frame_policy=policy, finalize=finalize,
                       process_index=engine.process_index, process_count=engine.process_count, check=plan.check,
                       mesh=mesh, allow_manifest_mismatch=engine.allow_manifest_mismatch,
                       retry_failed=engine.retry_failed, abort_after_consecutive_failures=engine.abort_after,
                       progress=engine.progress)
    except ManifestMismatchError as error:
        raise RunError(f"{error}".replace("allow_mismatch=True (CLI: --allow-manifest-mismatch)",
                                          "{allow_manifest_mismatch}")) from None
    except (RunDirectoryBusyError, RunAbortedError) as error:
        raise RunError(str(error)) from None
    except (ValueError, OSError) as error:
        raise RunError(f"{type(error).__name__}: {error}") from None


def resized_line(run_dir) -> str | None:
    """The count of instances resized on load (``3 of 7 instances were resized ...``), or None when none was."""
    from jaxseg_robust.runner.records import latest_records, read_run_records  # noqa: PLC0415

    latest = latest_records(read_run_records(run_dir))
    resized = sum("resized" in record for record in latest.values())
    if not resized:
        return None
    return (f"{resized} of {len(latest)} instances were resized on load (longest side over {{max_side}}, or the "
            "TETRIS cap); their results are in the resized frame and each record's \"resized\" field maps them back")


def write_summary(run_dir, tables: RunTables, resized: str | None) -> tuple[RunTables, tuple[pathlib.Path, ...]]:
    """Adds the run's seconds to the table and writes ``summary.md`` / ``summary.csv`` (the count of resized
    instances below the Markdown); (the timed tables, the files written). A protocol that wrote its own
    summary (``csv`` None) is left as it is."""
    from jaxseg_robust.reports.report_files import write_table_files  # noqa: PLC0415
    from jaxseg_robust.reports.timing_summary import add_timing  # noqa: PLC0415

    if tables.csv is None:
        return tables, tuple(tables.files)
    markdown, csv_text = add_timing(run_dir, tables.markdown, tables.csv)
    written = write_table_files(run_dir, "summary", markdown if resized is None else f"{markdown}\n\n{resized}\n",
                                csv_text)
    return RunTables(markdown, csv_text, tables.files), (*written.values(), *tables.files)


def exit_code_of(summary, run_dir) -> int:
    """0 when every instance is ok, 1 when some failed, 2 when nothing in the run directory is recorded as ok."""
    from jaxseg_robust.runner.engine import recorded_counts  # noqa: PLC0415

    if recorded_counts(run_dir)["ok"] == 0:
        return EXIT_FAILURE
    return EXIT_PARTIAL if summary.exit_code != EXIT_OK else EXIT_OK


def evaluate(spec: RunSpec, run_dir, *, say: Callable[[str], None] | None = None,
             field_names: Mapping[str, str] | None = None) -> RunResult:
    """Runs ``spec`` into ``run_dir`` (module docstring); rerunning resumes.

    Args:
      spec: the run spec.
      run_dir: the run directory (created; a directory of another spec is refused unless
        ``spec.engine.allow_manifest_mismatch``).
      say: told each start-up line (loading, compiling, notes; default: stderr).
      field_names: how the lines and errors name the spec's fields (the command line passes its flags;
        default: the field names).

    Returns:
      The `RunResult` (the table, the files written, the exit code).

    Raises:
      RunError: a setting that cannot run, missing data or model, a run directory of another spec.
    """
    from jaxseg_robust.runner.sharding import data_mesh  # noqa: PLC0415

    tell = stderr_lines if say is None else say

    def say_line(text: str) -> None:
        tell(render_fields(text, field_names))

    run_dir = pathlib.Path(run_dir)
    start_processes(spec.engine)
    check_outputs(spec.engine, run_dir)
    protocol = spec.protocol
    protocol.check()
    instances = protocol.load_instances(spec.data, say_line)
    mesh = data_mesh()
    model = protocol.load_model(spec.model, instances, mesh, say_line)
    plan = protocol.plan(model, instances, run_dir, say_line)
    summary = run_plan(plan, spec, run_dir, mesh, say_line)
    resized = resized_line(run_dir)
    resized = None if resized is None else render_fields(resized, field_names)
    tables, files = write_summary(run_dir, protocol.summarize(run_dir, plan, say_line), resized)
    return RunResult(run_dir, summary, tables, files, resized, exit_code_of(summary, run_dir))
