"""Batches in flight: a batch function's call returns before the device has finished it.

JAX dispatches a jitted call asynchronously: the call returns arrays whose
values the device is still computing, and only reading them (``device_get``,
``np.asarray``, ``block_until_ready``) waits. The engine's loop
(`jaxseg_robust.runner.pipeline`) uses this to hand the device batch k + 1
before it waits for the results of batch k. This module is the small contract
between the loop and a batch function:

  * `BatchInFlight`: what a dispatched batch is until its results are needed
    (``ready()`` without waiting, ``result()`` waiting).
  * `DispatchingBatchFunction`: a batch function that declares it takes the
    padded batch **on the host** and places its own arguments
    (``dispatch(batch, sharding) -> BatchInFlight``);
    `jaxseg_robust.runner.program.BatchProgram` is one. It prepares its
    inputs from the host arrays, so nothing goes from the device back to the
    host before the results.
  * every other batch function (a plain jitted function, the perturbation
    battery) gets the batch placed on the mesh (`sharding.shard_batch`) and
    its outputs are wrapped in `DispatchedOutputs`.

`ReadyClock` records when a dispatched batch's outputs became ready, on a
small waiting thread, so that a batch's device seconds are measured even when
the host is busy elsewhere at that moment (see `BatchProgram`).
"""

from __future__ import annotations

import abc
import threading
import time
from collections.abc import Mapping

import jax

from jaxseg_robust.runner.sharding import data_sharding, shard_batch


class BatchInFlight(abc.ABC):
    """A dispatched batch: its outputs, once the device has computed them."""

    @abc.abstractmethod
    def ready(self) -> bool:
        """Whether the outputs are computed (never waits)."""

    @abc.abstractmethod
    def result(self) -> Mapping:
        """The outputs ``{name: arrays [B, ...]}`` (waits for the device; re-raises its errors)."""


class DispatchingBatchFunction(abc.ABC):
    """A batch function that takes the host `PaddedBatch` and the placement of its arguments."""

    @abc.abstractmethod
    def dispatch(self, batch, sharding) -> BatchInFlight:
        """Prepares ``batch`` (NumPy arrays [B, ...]) on the host, places the arguments with ``sharding``
        (a `jax.sharding.Sharding` of the leading axis, or None: like ``batch.gt``) and starts the device
        work without waiting for it."""


def _is_ready(leaf) -> bool:
    return leaf.is_ready() if isinstance(leaf, jax.Array) else True


class DispatchedOutputs(BatchInFlight):
    """The outputs of a plain batch function's call (jax Arrays may still be computing)."""

    def __init__(self, outputs):
        self.outputs = outputs

    def ready(self) -> bool:
        """Whether every jax Array among the outputs is computed."""
        return all(_is_ready(leaf) for leaf in jax.tree.leaves(self.outputs))

    def result(self):
        """The outputs, computed."""
        return jax.block_until_ready(self.outputs)


def dispatch_batch(batch_fn, batch, mesh) -> BatchInFlight:
    """Starts ``batch_fn`` on the host `PaddedBatch` ``batch`` over ``mesh`` (see the module docstring)."""
    if isinstance(batch_fn, DispatchingBatchFunction):
        return batch_fn.dispatch(batch, data_sharding(mesh))
    return DispatchedOutputs(batch_fn(shard_batch(batch, mesh)))


class ReadyClock:
    """Waits on a thread until ``outputs`` are computed and keeps the moment (``time.perf_counter``).

    Attributes:
      ready_at: perf_counter seconds when the outputs were ready (None before).
      error: what waiting raised (a device error), or None.
    """

    def __init__(self, outputs):
        self.ready_at: float | None = None
        self.error: BaseException | None = None
        self._done = threading.Event()
        threading.Thread(target=self._wait, args=(outputs,), name="jaxseg-ready", daemon=True).start()

    def _wait(self, outputs) -> None:
        try:
            jax.block_until_ready(outputs)
        except BaseException as error:  # noqa: BLE001 - handed to the thread that reads the results
            self.error = error
        finally:
            self.ready_at = time.perf_counter()
            self._done.set()

    def is_set(self) -> bool:
        """Whether the outputs are ready (or failed)."""
        return self._done.is_set()

    def wait(self) -> float:
        """Waits for the outputs (a Ctrl-C interrupts the wait); returns ``ready_at``; re-raises ``error``."""
        while not self._done.wait(0.5):
            pass
        if self.error is not None:
            raise self.error
        return self.ready_at


__all__ = ["BatchInFlight", "DispatchingBatchFunction", "DispatchedOutputs", "dispatch_batch", "ReadyClock"]
