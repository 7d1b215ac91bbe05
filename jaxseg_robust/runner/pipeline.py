"""The engine's batch loop: host work overlaps device work, and nothing computed is lost.

`run_groups` evaluates a plan of `PlannedGroup`s (members of one bucket, at
most one batch, and its frame) in three overlapping stages:

  load     (one worker thread, one group ahead): load and validate each
           member (a failure records that member alone), pad the group into a
           host `PaddedBatch`;
  compute  (the calling thread): dispatch batch k (host preparation, placement,
           the asynchronous device call; `runner.dispatch`), then start loading
           group k + 1, then wait for the results of batch k - 1 and copy them
           to the host. So the device has batch k queued while it computes
           k - 1, and the host prepares k + 1 while it computes k;
  record   (one writer thread): finalize each instance, append the group's
           records (flushed and fsynced), close its in-flight journal entry,
           count, update the progress bar, check the abort limit.

Threads, not grain's worker processes (docs/ARCHITECTURE.md, "The batch
loop", says why), with bounded queues: one group loading, at most two batches
dispatched, at most two groups waiting for the writer, so host memory stays a
few batches.

Reliability (docs/ARCHITECTURE.md, "The batch loop"):

  * each group's keys go to the in-flight journal before it is loaded; with
    the overlap a few groups are in flight at once, and a kill counts
    against all of them (`runner.inflight`);
  * a suspect group (``alone``: its member was in flight when a process died)
    runs with nothing else in flight: everything before it is written first,
    and nothing after it is loaded until its records are written, so a
    second kill by it loses nothing else;
  * a batch whose dispatch or results fail is retried one instance at a time
    in a batch of the same shape, synchronously (no recompilation);
  * a ``KeyboardInterrupt`` (or ``SystemExit``) waits for the batches already
    on the device and writes their records before it propagates (a second
    Ctrl-C stops that wait); groups that got no records are released in the
    journal;
  * any other error (a broken output contract, a failing write, the abort
    limit) lets the writer finish what it was given, releases the rest and
    propagates.
"""

from __future__ import annotations

import collections
import dataclasses
import queue
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import jax
import numpy as np

from jaxseg_robust.data.buckets import Frame, PaddedBatch, pad_batch
from jaxseg_robust.data.instances import AnyInstance, Instance
from jaxseg_robust.runner.dispatch import BatchInFlight, dispatch_batch

MAX_DISPATCHED = 2  # batches handed to the device and not yet copied back
MAX_UNWRITTEN = 2  # computed groups waiting for the record writer


@dataclasses.dataclass(frozen=True)
class PlannedGroup:
    """One group of the plan: ``members`` (one bucket, at most one batch), their ``frame`` (Hf, Wf), and
    ``alone``: run it with nothing else in flight (a suspect of a kill)."""

    members: Sequence[AnyInstance]
    frame: Frame
    alone: bool = False


@dataclasses.dataclass
class LoadedGroup:
    """A group after the load stage.

    Attributes:
      members: the group's instances or references, in input order.
      frame: (Hf, Wf) the bucket frame.
      token: its in-flight journal token.
      loaded: the members that loaded and validated (`Instance`s), in order.
      failed: key -> error of each member that did not load or validate.
      batch: the host `PaddedBatch` of ``loaded`` (None when nothing loaded).
    """

    members: list
    frame: Frame
    token: int
    loaded: list[Instance]
    failed: dict
    batch: PaddedBatch | None


@dataclasses.dataclass
class LaunchedGroup:
    """A group whose batch was dispatched (``in_flight``), or whose dispatch failed (``in_flight`` None)."""

    group: LoadedGroup
    in_flight: BatchInFlight | None


@dataclasses.dataclass
class ComputedGroup:
    """A group with host outputs: of the whole batch (``outputs``), or per instance after a failed batch
    (``alone``: key -> outputs of slot 0, or the exception of that instance)."""

    group: LoadedGroup
    outputs: dict | None
    alone: dict


@dataclasses.dataclass(frozen=True)
class BatchStages:
    """What the stages need (`runner.engine.run` builds it).

    Attributes:
      batch_fn: the batch function (`runner.dispatch`).
      mesh: the ``data`` mesh; slots: B, the padded batch size.
      load_member: ``member -> Instance`` (load, validate, check; raises for a bad member).
      check_outputs: ``(outputs, slots) -> None``, raising `BatchFunctionError` on a broken contract.
      start_group: ``keys -> token`` (the in-flight journal's start); release_all: ``() -> None``.
      write_group: ``ComputedGroup -> None``, the record stage (runs on the writer thread).
      contract_error: the exception type that is a bug, never retried per instance.
    """

    batch_fn: Callable
    mesh: object
    slots: int
    load_member: Callable
    check_outputs: Callable
    start_group: Callable
    release_all: Callable
    write_group: Callable
    contract_error: type


def load_group(stages: BatchStages, members: Sequence[AnyInstance], frame: Frame, token: int) -> LoadedGroup:
    """The load stage of one group (runs on the loader thread)."""
    loaded, failed = [], {}
    for member in members:
        try:
            loaded.append(stages.load_member(member))
        except Exception as error:  # noqa: BLE001 - a bad instance fails alone
            failed[member.key] = error
    batch = pad_batch(loaded, frame, stages.slots) if loaded else None
    return LoadedGroup(list(members), frame, token, loaded, failed, batch)


def launch(stages: BatchStages, group: LoadedGroup) -> LaunchedGroup:
    """Dispatches the group's batch; a failing dispatch leaves ``in_flight`` None (retried per instance)."""
    if group.batch is None:
        return LaunchedGroup(group, None)
    try:
        return LaunchedGroup(group, dispatch_batch(stages.batch_fn, group.batch, stages.mesh))
    except stages.contract_error:
        raise
    except Exception:  # noqa: BLE001 - isolate the culprit in `complete`
        return LaunchedGroup(group, None)


def fetch(stages: BatchStages, in_flight: BatchInFlight) -> dict:
    """Waits for a dispatched batch and copies its outputs to the host (checking the output contract)."""
    outputs = jax.device_get(in_flight.result())
    stages.check_outputs(outputs, stages.slots)
    return outputs


def _alone(stages: BatchStages, instance: Instance, frame: Frame):
    """Host outputs of ``instance`` alone in a batch of the same shape, or the exception it raised."""
    try:
        return fetch(stages, dispatch_batch(stages.batch_fn, pad_batch([instance], frame, stages.slots),
                                            stages.mesh))
    except stages.contract_error:
        raise
    except Exception as error:  # noqa: BLE001 - recorded as this instance's failure
        return error


def complete(stages: BatchStages, launched: LaunchedGroup) -> ComputedGroup:
    """The compute stage's second half: the batch's host outputs, or each instance run alone."""
    group = launched.group
    if launched.in_flight is not None:
        try:
            return ComputedGroup(group, fetch(stages, launched.in_flight), {})
        except stages.contract_error:
            raise
        except Exception:  # noqa: BLE001 - the batch failed: each instance alone below
            pass
    if not group.loaded:
        return ComputedGroup(group, None, {})
    return ComputedGroup(group, None, {i.key: _alone(stages, i, group.frame) for i in group.loaded})


def slot_outputs(computed: ComputedGroup, slot: int, instance: Instance):
    """The host outputs of ``instance`` (slot ``slot`` of the batch); raises the error of a failed one."""
    if computed.outputs is not None:
        return jax.tree_util.tree_map(lambda leaf: np.asarray(leaf)[slot], computed.outputs)
    alone = computed.alone[instance.key]
    if isinstance(alone, BaseException):
        raise alone
    return jax.tree_util.tree_map(lambda leaf: np.asarray(leaf)[0], alone)


class RecordThread:
    """The record stage: one thread writing computed groups in order (see the module docstring).

    ``put`` never blocks (a Ctrl-C cannot land between a computed group and its hand-over); the compute
    stage calls `wait_below` before it dispatches more. The first error of ``write`` stops the
    thread: later groups stay unwritten (released by the caller) and `put` / `close` raise it.
    """

    def __init__(self, write: Callable[[ComputedGroup], None]):
        self._write = write
        self._queue: queue.Queue = queue.Queue()
        self._error: BaseException | None = None
        self._written = threading.Condition()  # notified after each group
        self._thread = threading.Thread(target=self._loop, name="jaxseg-records", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                if self._error is None:
                    self._write(item)
            except BaseException as error:  # noqa: BLE001 - handed to the compute stage
                self._error = error
            finally:
                with self._written:
                    self._queue.task_done()
                    self._written.notify_all()

    def raise_error(self) -> None:
        """Re-raises the writer's error, if any."""
        if self._error is not None:
            raise self._error

    def put(self, computed: ComputedGroup) -> None:
        """Hands a computed group to the writer (raises the writer's error instead, if it has one)."""
        self.raise_error()
        self._queue.put(computed)

    def wait_below(self, count: int) -> None:
        """Waits until fewer than ``count`` groups wait for the writer (interruptible)."""
        with self._written:
            while self._queue.unfinished_tasks >= count and self._error is None:
                self._written.wait(0.5)
        self.raise_error()

    def close(self) -> None:
        """Lets the writer finish every group it was given, then stops it (raises nothing)."""
        self._queue.put(None)
        while self._thread.is_alive():
            self._thread.join(0.5)


def _salvage(stages: BatchStages, dispatched: collections.deque, records: RecordThread) -> None:
    """On an interrupt: the batches on the device are waited for and written (a second Ctrl-C stops it)."""
    try:
        while dispatched:
            records.put(complete(stages, dispatched[0]))
            dispatched.popleft()
    except BaseException:  # noqa: BLE001 - a second interrupt or a failing batch: the rest is released
        pass


def _start_load(stages: BatchStages, loader: ThreadPoolExecutor, planned: PlannedGroup):
    """(token, future) of loading ``planned``, its journal entry written first."""
    token = stages.start_group([member.key for member in planned.members])
    return token, loader.submit(load_group, stages, planned.members, planned.frame, token)


def _prefetch(stages: BatchStages, loader: ThreadPoolExecutor, plan: Sequence[PlannedGroup], index: int):
    """`_start_load` of plan[index] unless it is past the end or runs alone (then loaded when its turn comes)."""
    if index >= len(plan) or plan[index].alone:
        return None
    return _start_load(stages, loader, plan[index])


def _drain(stages: BatchStages, dispatched: collections.deque, records: RecordThread) -> None:
    """Completes every dispatched batch in order and waits until the writer has written them all."""
    while dispatched:
        records.put(complete(stages, dispatched[0]))
        dispatched.popleft()
    records.wait_below(1)


def _wait_load(pending: tuple[int, Future] | None) -> None:
    """Lets a load still running finish (its group is released by the caller)."""
    if pending is not None and not pending[1].cancel():
        try:
            pending[1].result()
        except BaseException:  # noqa: BLE001 - the group is released anyway
            pass


def run_groups(stages: BatchStages, plan: Sequence[PlannedGroup]) -> None:
    """Evaluates ``plan`` through the three stages (module docstring).

    Raises:
      whatever stopped the loop (``contract_error``, the writer's error, an interrupt), after the writer
      has written what it was given and every group without records has been released.
    """
    if not plan:
        return
    records = RecordThread(stages.write_group)
    dispatched: collections.deque = collections.deque()
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="jaxseg-load") as loader:
        pending = _prefetch(stages, loader, plan, 0)
        try:
            for index, planned in enumerate(plan):
                if pending is None:  # a group that runs alone: everything before it is written first
                    _drain(stages, dispatched, records)
                    pending = _start_load(stages, loader, planned)
                records.wait_below(MAX_UNWRITTEN)
                loaded, pending = pending[1].result(), None
                dispatched.append(launch(stages, loaded))
                if planned.alone:
                    _drain(stages, dispatched, records)
                pending = _prefetch(stages, loader, plan, index + 1)
                while len(dispatched) >= MAX_DISPATCHED:
                    records.put(complete(stages, dispatched[0]))
                    dispatched.popleft()
            _drain(stages, dispatched, records)
        except (KeyboardInterrupt, SystemExit):
            _salvage(stages, dispatched, records)
            raise
        finally:
            _wait_load(pending)
            records.close()
            stages.release_all()
    records.raise_error()


__all__ = ["MAX_DISPATCHED", "MAX_UNWRITTEN", "PlannedGroup", "LoadedGroup", "LaunchedGroup", "ComputedGroup", "BatchStages",
           "load_group", "launch", "fetch", "complete", "slot_outputs", "RecordThread", "run_groups"]
