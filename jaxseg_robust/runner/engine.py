"""The evaluation engine: instances in, one durable record per instance out.

`run` is model-agnostic. A protocol (a grid, an attack, simulated users)
supplies a *batch function*::

    batch_fn(batch: PaddedBatch) -> Mapping[str, pytree of arrays [B, ...]]

a pure, jitted function of a device-sharded `PaddedBatch` (see
`jaxseg_robust.data.buckets`: image, gt, valid, size, instance_valid, seed,
each with leading axis B = the padded batch size) returning per-instance
outputs, every leaf with leading axis B. Parameters are passed by closure over
a jitted function that takes them as an argument, e.g.
``batch_fn = functools.partial(jitted_eval, replicate(params, mesh))``, so
weights are never baked into the compiled program as constants.

What `run` does:
  1. opens (or creates) the run directory and checks its manifest
     (`jaxseg_robust.runner.rundir`): config, model and dataset fingerprints,
     frame policy; a dataset that only gained instances (or changed ones
     without a record) resumes, anything else is refused naming the
     instances added, removed or changed;
  2. reads the records already there and skips every recorded instance
     (failed ones too, unless ``retry_failed``);
  3. buckets the rest by padded frame (``frame_policy``, default exact size);
  4. per batch of a bucket: loads and validates each instance on the host (a
     failure here records that instance as failed, it never reaches the
     device), pads the batch to B slots (B = ``batch_size`` rounded up to a
     multiple of the device count; the ragged tail is padded with placeholder
     slots, so every batch of a bucket has one shape and compiles once),
     shards it over the ``'data'`` mesh, calls ``batch_fn``, copies the
     outputs to the host and drops the placeholder slots;
  5. turns each instance's outputs into a payload (``finalize(instance,
     outputs)``, default: the outputs themselves) and appends one record per
     instance, flushed and fsynced once per batch.

Steps 4 and 5 overlap with the device's work (`jaxseg_robust.runner.pipeline`,
docs/ARCHITECTURE.md, "The batch loop"): the device waits for the host only
when loading and preparing a batch takes longer than computing one.

Failure policy:
  * an exception from ``batch_fn`` (or from fetching its results) fails the
    batch; its instances are then retried one at a time, each in a batch of
    the same shape (no recompilation), so one bad instance is isolated and
    recorded as failed with its error while the others succeed;
  * an exception while loading, validating (`validate_instance`, plus the
    optional ``check``) or finalizing an instance fails only that instance;
  * a batch function that breaks its output contract (not a mapping, a leaf
    without the leading axis B) raises `BatchFunctionError`: that is a bug,
    not bad data;
  * after ``abort_after_consecutive_failures`` instances in a row failed in
    the batch function or finalize (counted per batch: a batch with any
    success resets the count; a systematic error, e.g. a shape bug), the run
    stops with `RunAbortedError`; everything recorded so far stays,
    and a fixed rerun picks up the failed instances with ``retry_failed=True``;
  * ``KeyboardInterrupt`` and ``SystemExit`` stop the run after the batches
    already on the device are computed and written (a second Ctrl-C stops at
    once); a kill stops it at once: the records written are on disk, the
    groups in flight are lost, and rerunning the same command resumes;
  * a kill (SIGKILL, e.g. out of memory) of the process is not left to loop:
    each group's keys go to the in-flight journal (`jaxseg_robust.runner.inflight`)
    before it is loaded and run; the next run runs the members of every group
    that was in flight when its process died one at a time, and records an instance that
    killed the process twice as failed ("killed the process twice (out of
    memory?)") without running it again (``retry_failed`` retries it).

Resized instances: a member with a ``resize_note`` mapping (e.g. a
`jaxseg_robust.data.datasets.ResizedInstanceRef`, made by the size guard of every
command)
gets it as the record's ``"resized"`` field (original size, scale, how
results map back).

Multi-host runs (``jax.distributed``):
  Call ``jax.distributed.initialize()`` in every process, then the same `run`
  with the same instance list, config and run directory on a file system all
  hosts share. Each process builds its mesh over its own
  ``jax.local_devices()`` and evaluates only the instances it owns (a stable
  hash of the key, `process_owns`), so hosts never synchronise and a slow or
  failing host delays only its share. Whichever process starts first writes the
manifest (the others check it; none waits); process k
  appends to ``records.process<k>.jsonl``; resuming reads every records file,
  so a rerun with a different number of hosts skips whatever any host
  finished. ``process_index`` / ``process_count`` default to
  ``jax.process_index()`` / ``jax.process_count()`` and can be given
  explicitly to split a dataset over independent jobs without
  ``jax.distributed``.
"""

from __future__ import annotations

import dataclasses
import functools
import time
import traceback
from collections.abc import Callable, Mapping, Sequence

import jax
import numpy as np

from jaxseg_robust.data.buckets import (
    ExactFrame,
    FramePolicy,
    bucket_instances,
    chunks,
    policy_description,
)
from jaxseg_robust.data.instances import (
    AnyInstance,
    Instance,
    InstanceError,
    instance_name,
    validate_instance,
    validate_key,
)
from jaxseg_robust.runner.fingerprints import fingerprints_of
from jaxseg_robust.runner.inflight import KILLED_TWICE, InflightJournal
from jaxseg_robust.runner.pipeline import BatchStages, ComputedGroup, PlannedGroup, run_groups, slot_outputs
from jaxseg_robust.runner.progress import check_progress_mode, make_progress
from jaxseg_robust.runner.records import (
    STATUS_FAILED,
    STATUS_OK,
    RecordWriter,
    done_keys,
    latest_records,
    make_record,
    read_run_records,
)
from jaxseg_robust.runner.rundir import open_run_dir
from jaxseg_robust.runner.sharding import data_mesh, padded_batch_size, process_owns

EXIT_OK = 0
EXIT_PARTIAL = 1
_TRACEBACK_CHARS = 4000
_LISTED_FAILURES = 10


class BatchFunctionError(RuntimeError):
    """The batch function broke its output contract (a programming error; the run stops)."""


class RunAbortedError(RuntimeError):
    """Too many consecutive instances failed in the batch function; records so far are kept."""


@dataclasses.dataclass(frozen=True)
class RunSummary:
    """What one `run` call did.

    Attributes:
      run_dir: the run directory.
      total: instances given.
      ok: instances that succeeded in this call.
      failed: instances recorded as failed in this call.
      skipped: instances already recorded before this call (not rerun).
      skipped_failed: how many of the skipped are recorded as failed.
      elsewhere: instances owned by other processes (multi-process runs).
      failures: (instance name, error text) of this call's failures.
      wall_s: wall-clock seconds of this call.
    """

    run_dir: str
    total: int
    ok: int
    failed: int
    skipped: int
    skipped_failed: int
    elsewhere: int
    failures: tuple[tuple[str, str], ...]
    wall_s: float

    @property
    def exit_code(self) -> int:
        """0 when no instance of this process's share is recorded as failed, else 1 (CLI EXIT_PARTIAL)."""
        return EXIT_OK if self.failed + self.skipped_failed == 0 else EXIT_PARTIAL

    def format(self) -> str:
        """A few lines for the terminal: counts, then up to 10 failures."""
        text = (f"{self.run_dir}: {self.total} instances: {self.ok} ok, {self.failed} failed, "
                f"{self.skipped} skipped (already recorded")
        text += f", {self.skipped_failed} of them failed)" if self.skipped_failed else ")"
        if self.elsewhere:
            text += f", {self.elsewhere} left to other processes"
        text += f" in {self.wall_s:.1f} s"
        for name, error in self.failures[:_LISTED_FAILURES]:
            text += f"\n  failed {name}: {error}"
        if len(self.failures) > _LISTED_FAILURES:
            text += f"\n  ... and {len(self.failures) - _LISTED_FAILURES} more (see the records)"
        return text

    def __str__(self) -> str:
        return self.format()


def error_text(error: BaseException) -> str:
    """``"ExceptionType: message"`` as stored in a failed record."""
    return f"{type(error).__name__}: {error}"


def _failed_record(key, error: BaseException) -> dict:
    trace = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    return make_record(key, STATUS_FAILED, error=error_text(error), traceback_text=trace[-_TRACEBACK_CHARS:])


def _check_outputs(outputs, slots: int) -> None:
    if not isinstance(outputs, Mapping):
        raise BatchFunctionError(f"batch_fn must return a mapping of str to arrays, got {type(outputs).__name__}")
    for path, leaf in jax.tree_util.tree_flatten_with_path(outputs)[0]:
        shape = np.shape(leaf)
        if not shape or shape[0] != slots:
            raise BatchFunctionError(
                f"batch_fn output {jax.tree_util.keystr(path)} has shape {list(shape)}; every output needs the "
                f"leading instance axis of size {slots}"
            )


def _finish(instance: Instance, mine, finalize) -> dict:
    """The ok record of ``instance`` from its slot's host outputs (raises if finalize fails)."""
    payload = finalize(instance, mine) if finalize is not None else mine
    if not isinstance(payload, Mapping):
        raise TypeError(f"finalize must return a mapping, got {type(payload).__name__}")
    return make_record(instance.key, STATUS_OK, payload=payload)


def _load(member: AnyInstance, check) -> Instance:
    instance = member.load()
    validate_instance(instance)
    if check is not None:
        check(instance)
    return instance


def _group_records(computed: ComputedGroup, finalize) -> tuple[list[dict], int]:
    """Records of a computed group (input order) and how many failed in batch_fn / finalize."""
    group = computed.group
    records = {key: _failed_record(key, error) for key, error in group.failed.items()}
    compute_failures = 0
    for slot, instance in enumerate(group.loaded):
        try:
            records[instance.key] = _finish(instance, slot_outputs(computed, slot, instance), finalize)
        except BatchFunctionError:
            raise
        except Exception as error:  # noqa: BLE001
            records[instance.key] = _failed_record(instance.key, error)
            compute_failures += 1
    return [_noted(records[member.key], member) for member in group.members], compute_failures


def _noted(record: dict, member: AnyInstance) -> dict:
    """``record`` with the member's ``resize_note`` (if any) as its ``"resized"`` field."""
    note = getattr(member, "resize_note", None)
    if note:
        record["resized"] = dict(note)
    return record


@dataclasses.dataclass
class _Recorder:
    """The record stage of one session (runs on the pipeline's writer thread)."""

    writer: RecordWriter
    journal: InflightJournal
    tally: "_Tally"
    bar: object
    finalize: Callable | None
    limit: int | None
    path: object

    def write(self, computed: ComputedGroup) -> None:
        """Finalizes, writes and counts one group; raises `RunAbortedError` at the failure limit."""
        records, compute_failures = _group_records(computed, self.finalize)
        self.writer.write_batch(records)
        self.journal.finish(computed.group.token)
        self.bar.update(*self.tally.add(records, compute_failures))
        tally = self.tally
        if self.limit is not None and tally.streak >= self.limit:
            raise RunAbortedError(
                f"{tally.streak} instances in a row failed in batch_fn/finalize (last: "
                f"{tally.failures[-1][1]}); the {tally.ok + tally.failed} records of this session "
                f"are saved in {self.path}. Fix the cause and rerun with retry_failed=True."
            )


@dataclasses.dataclass
class _Tally:
    """Running counts of a session; ``streak`` counts consecutive batch_fn/finalize failures."""

    ok: int = 0
    failed: int = 0
    streak: int = 0
    failures: list = dataclasses.field(default_factory=list)

    def add(self, records: list[dict], compute_failures: int) -> tuple[int, int]:
        """Counts one written batch; returns its (ok, failed)."""
        batch_ok = sum(record["status"] == STATUS_OK for record in records)
        self.ok += batch_ok
        self.failed += len(records) - batch_ok
        self.failures += [(instance_name(r["dataset"], r["id"]), r["error"])
                          for r in records if r["status"] == STATUS_FAILED]
        self.streak = 0 if batch_ok else self.streak + compute_failures
        return batch_ok, len(records) - batch_ok


def _split_suspects(members: Sequence[AnyInstance], kills: Mapping) -> tuple[list, list, list]:
    """(members to batch as usual, members killed once: run alone, members killed twice: recorded as failed)."""
    clean = [member for member in members if not kills.get(member.key)]
    singles = [member for member in members if kills.get(member.key) == 1]
    doomed = [member for member in members if kills.get(member.key, 0) >= 2]
    return clean, singles, doomed


def _check_keys(instances: Sequence[AnyInstance]) -> None:
    seen = set()
    for instance in instances:
        validate_key(instance)
        if instance.key in seen:
            raise InstanceError(f"duplicate instance key {instance_name(*instance.key)!r}")
        seen.add(instance.key)


def _positive_int_or_none(name: str, value) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(f"{name} must be a positive int or None, got {value!r}")


def run(
    instances: Sequence[AnyInstance],
    batch_fn: Callable,
    run_dir,
    batch_size: int,
    *,
    config: Mapping | None = None,
    model_fingerprint: str | None = None,
    frame_policy: FramePolicy = ExactFrame(),
    finalize: Callable[[Instance, Mapping], Mapping] | None = None,
    check: Callable[[Instance], None] | None = None,
    mesh=None,
    allow_manifest_mismatch: bool = False,
    retry_failed: bool = False,
    dataset_fingerprint_mode: str = "stat",
    abort_after_consecutive_failures: int | None = 32,
    progress: str = "auto",
    process_index: int | None = None,
    process_count: int | None = None,
) -> RunSummary:
    """Evaluates ``instances`` with ``batch_fn`` into the run directory ``run_dir``, resuming.

    Args:
      instances: `Instance`s and/or `InstanceRef`s with unique keys (dataset, id).
      batch_fn: ``PaddedBatch -> Mapping[str, arrays [B, ...]]``, jitted (see
        the module docstring); B is the padded batch size.
      run_dir: run directory (created if missing).
      batch_size: instances per batch; rounded up to a multiple of the device count.
      config: JSON-able description of the evaluation (protocol, model name,
        hyper-parameters, ...), recorded and compared on resume.
      model_fingerprint: e.g. `fingerprint_params(params)`; recorded and compared.
      frame_policy: how instance sizes map to padded frames (default exact size).
      finalize: ``(instance, outputs of its slot as NumPy) -> payload mapping``,
        host-side (e.g. crop masks with `crop_to_size`, derive metrics); default:
        the outputs themselves.
      check: extra host-side check of a loaded instance (e.g.
        `require_object`); raising fails that instance.
      mesh: a `data_mesh` (default: all local devices).
      allow_manifest_mismatch: resume into a directory whose manifest differs.
      retry_failed: rerun instances recorded as failed (their new record supersedes the old).
      dataset_fingerprint_mode: ``"stat"`` or ``"content"`` (see `dataset_fingerprint`).
      abort_after_consecutive_failures: stop with `RunAbortedError` after this
        many instances in a row failed in ``batch_fn``/``finalize``; None never stops.
      progress: ``"auto"``, ``"tqdm"``, ``"plain"`` or ``"none"``.
      process_index, process_count: this process's share of a multi-process
        run (default: ``jax.process_index()``, ``jax.process_count()``).

    Returns:
      The `RunSummary` of this call.

    Raises:
      InstanceError: a malformed or duplicate key (before anything runs).
      ManifestMismatchError, RunDirectoryBusyError: see `open_run_dir`.
      BatchFunctionError: ``batch_fn`` broke its output contract.
      RunAbortedError: see ``abort_after_consecutive_failures``.
      ValueError: bad arguments.
    """
    start = time.monotonic()
    instances = list(instances)
    _check_keys(instances)
    _positive_int_or_none("abort_after_consecutive_failures", abort_after_consecutive_failures)
    check_progress_mode(progress)
    process_index = jax.process_index() if process_index is None else process_index
    process_count = jax.process_count() if process_count is None else process_count
    if not 0 <= process_index < process_count:
        raise ValueError(f"process_index must be in [0, {process_count}), got {process_index}")
    mesh = data_mesh() if mesh is None else mesh
    slots = padded_batch_size(batch_size, mesh)
    devices = list(mesh.devices.flat)
    dataset_hash, per_instance = fingerprints_of(instances, dataset_fingerprint_mode)
    fingerprints = {"model": model_fingerprint, "dataset": dataset_hash}
    engine = {"frame_policy": policy_description(frame_policy), "dataset_fingerprint_mode": dataset_fingerprint_mode}
    session = {
        "batch_size": batch_size, "padded_batch_size": slots, "devices": len(devices),
        "device_kind": devices[0].device_kind, "backend": devices[0].platform,
        "process_index": process_index, "process_count": process_count, "retry_failed": retry_failed,
    }
    with open_run_dir(run_dir, config=config, fingerprints=fingerprints, engine=engine, session=session,
                      allow_mismatch=allow_manifest_mismatch, process_index=process_index,
                      instance_fingerprints=per_instance) as directory, \
            InflightJournal(directory.path, process_index) as journal:
        latest = latest_records(read_run_records(directory.path))
        kills = journal.open(latest)
        skip = done_keys(latest, include_failed=not retry_failed)
        owned = [i for i in instances if process_owns(i.key, process_index, process_count)]
        todo = [i for i in owned if i.key not in skip]
        skipped_failed = sum(latest[i.key]["status"] == STATUS_FAILED for i in owned if i.key in skip)
        buckets, rejected = bucket_instances(todo, frame_policy)
        tally = _Tally()
        shown = progress if process_index == 0 and todo else "none"
        bar = make_progress(len(todo), shown, desc=directory.path.name)
        try:
            with RecordWriter(directory.records_path) as writer:
                rejected_records = [_failed_record(instance.key, error) for instance, error in rejected]
                writer.write_batch(rejected_records)
                bar.update(*tally.add(rejected_records, 0))
                plan = []
                for bucket in buckets:
                    members, singles, doomed = _split_suspects(bucket.members, kills)
                    doomed_records = [_noted(make_record(member.key, STATUS_FAILED, error=KILLED_TWICE), member)
                                      for member in doomed]
                    writer.write_batch(doomed_records)
                    bar.update(*tally.add(doomed_records, 0))
                    plan += [PlannedGroup(group, bucket.frame) for group in chunks(members, slots)]
                    plan += [PlannedGroup([member], bucket.frame, alone=True) for member in singles]
                recorder = _Recorder(writer, journal, tally, bar, finalize, abort_after_consecutive_failures,
                                     directory.path)
                run_groups(BatchStages(
                    batch_fn=batch_fn, mesh=mesh, slots=slots, load_member=functools.partial(_load, check=check),
                    check_outputs=_check_outputs, start_group=journal.start, release_all=journal.release,
                    write_group=recorder.write, contract_error=BatchFunctionError), plan)
        finally:
            bar.close()
    return RunSummary(
        run_dir=str(directory.path), total=len(instances), ok=tally.ok, failed=tally.failed,
        skipped=len(owned) - len(todo), skipped_failed=skipped_failed,
        elsewhere=len(instances) - len(owned), failures=tuple(tally.failures), wall_s=time.monotonic() - start,
    )


def recorded_counts(run_dir) -> dict[str, int]:
    """Counts over every records file of a run directory (all processes): ``ok``, ``failed``, ``instances``."""
    latest = latest_records(read_run_records(run_dir))
    ok = sum(record["status"] == STATUS_OK for record in latest.values())
    return {"ok": ok, "failed": len(latest) - ok, "instances": len(latest)}
