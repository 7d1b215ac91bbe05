"""The one batch program every prompt protocol runs through: `BatchProgram`.

A prompt protocol (TETRIS, BREPS, the grids, RClicks, the baseline clicker)
is a frozen, hashable object with a pure per-instance function (see
`BatchProtocol` and docs/ARCHITECTURE.md, "How to add a protocol"). This
module turns it into a batch function for `jaxseg_robust.runner.engine.run`
(``PaddedBatch -> dict of arrays [B, ...]``), the same object for the library,
the tests and the command line:

host side (`BatchProgram.__call__`, NumPy):
  check the batch (`check_batch`), crop every slot to its image size and run
  ``segmenter.preprocess(image, frame_hw=bucket frame)`` (outputs then live in
  the padded frame), ask the protocol for its per-slot host inputs
  (``protocol.host_inputs``: boxes, click-model inputs, ...), stack everything
  on a leading axis B, compute the per-instance Boundary IoU band widths, and
  place the arrays like the batch (sharded over the engine's ``data`` mesh);

device side (`DeviceProgram`, one ``jax.jit``):
  ``features = segmenter.embed(params, model_input)`` once for the batch, then
  ``jax.vmap`` of ``protocol.instance`` over the instances.

The engine calls `BatchProgram.dispatch` with the padded batch on the host:
the host preparation runs on the host's CPU device (`host_device`; nothing
is read back from an accelerator) and the arguments are placed once; the
call returns while the device computes (`ProgramBatch`), so the engine can
prepare the next batch meanwhile (docs/ARCHITECTURE.md, "The batch loop").

One program per (segmenter, protocol) pair is shared by every `BatchProgram`
of the process (`device_program`), compiled ahead of its first batch per input
signature (shapes, dtypes, placement) and announced (``announce``).

Compiles and retraces are handled here and nowhere else (`CompiledFunction`):
a bucket (frame, batch size, placement) compiled a second time raises
`RetraceError` (a protocol whose host inputs change shape between batches of
one bucket, say), so does a second trace for one signature, and ``traces``
counts every trace for the tests. A protocol that runs several programs with
host decisions between them (the perturbation battery) is a
`HostDrivenProtocol`: its programs are `CompiledFunction`s and
`HostDrivenProgram` gives it the timing and compile events of a timed
`BatchProgram` (docs/ARCHITECTURE.md, "The batch loop").
"""

from __future__ import annotations

import dataclasses
import functools
import contextlib
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import chex
import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from jaxseg_robust.data.buckets import ExactFrame, FramePolicy
from jaxseg_robust.metrics.masks import boundary_widths
from jaxseg_robust.models.base import FRAME_POLICY_EXACT, Transform, check_segmenter, family_rules
from jaxseg_robust.runner.dispatch import BatchInFlight, DispatchingBatchFunction, ReadyClock
from jaxseg_robust.runner.compile_cache import cache_hits, listen_for_cache_hits

TIMING_KEY = "_timing"  # optional output: {"batch_seconds", "batch_wall_seconds", "batch_instances",
#                         "batch_started", "batch_ended"} [B] (`batch_timing`)


@dataclasses.dataclass(frozen=True)
class CompileEvent:
    """One compile of a bucket's program (its seconds are in no per-instance time).

    Attributes:
      program: what was compiled (the announcement's description, e.g. "TETRIS program (minmax)").
      frame: (Hf, Wf) the bucket frame in pixels; batch: B, the batch size it was compiled for.
      seconds: wall seconds of ``lower(...).compile()`` (a program from the cache: reading it).
      ended_at: Unix seconds when the compile ended (NaN: not known).
      from_cache: JAX loaded the executable from its persistent compilation cache
        (`jaxseg_robust.runner.compile_cache`) instead of compiling it.
    """

    program: str
    frame: tuple[int, int]
    batch: int
    seconds: float
    ended_at: float = math.nan
    from_cache: bool = False


class CompileLog:
    """Compile events in the order they happened, until a run directory writer takes them (`drain`)."""

    def __init__(self):
        self.pending: list[CompileEvent] = []
        self._lock = threading.Lock()  # the engine's loop adds, its record writer drains

    def add(self, event: CompileEvent) -> None:
        """Keeps ``event`` until the next `drain`."""
        with self._lock:
            self.pending.append(event)

    def drain(self) -> list[CompileEvent]:
        """The events added since the last call (and forgets them)."""
        with self._lock:
            events, self.pending = self.pending, []
        return events


class RetraceError(RuntimeError):
    """A bucket's program was traced a second time (a bug: the inputs' shapes changed within a bucket)."""


@flax.struct.dataclass
class InstanceInputs:
    """What a protocol's per-instance function gets (one instance; the program vmaps over B of them).

    Attributes:
      features: the instance's cached image features (``segmenter.embed``).
      transform: its `Transform` (``frame_hw`` = the bucket frame (Hf, Wf)).
      gt: int8[Hf, Wf] 1 object / 0 background / -1 ignore and outside the image.
      width: i32[] Boundary IoU band width of the image (`metrics.masks.boundary_widths`).
      seed: u32[] the instance's seed (a hash of its key, `data.buckets.instance_seed`).
      extras: mapping of the protocol's host inputs of this instance (``host_inputs``).
    """

    features: Any
    transform: Transform
    gt: jnp.ndarray
    width: jnp.ndarray
    seed: jnp.ndarray
    extras: Any


@dataclasses.dataclass(frozen=True)
class HostSlot:
    """One slot of a batch on the host, for ``protocol.host_inputs``.

    Attributes:
      image: uint8[H, W, 3] the slot's image (cropped to its size).
      gt: int8[H, W] its ground truth (cropped).
      frame: (Hf, Wf) the bucket frame.
      seed: the slot's per-instance seed.
      valid: False for the placeholder slots of a ragged tail (outputs discarded).
      transform: the `Transform` of ``segmenter.preprocess``.
      model_input: the preprocessed image.
    """

    image: np.ndarray
    gt: np.ndarray
    frame: tuple[int, int]
    seed: int
    valid: bool
    transform: Transform
    model_input: Any


class BatchProtocol(Protocol):
    """What a prompt protocol provides (frozen dataclass: hashable, static).

    Attributes:
      name: the protocol's name (compile announcements).
      dilation_ratio: Boundary IoU band ratio of the widths the program passes.

    ``host_inputs(segmenter, slot: HostSlot) -> Mapping[str, np.ndarray]``:
      per-slot host inputs, equal shapes for every slot of a bucket (``{}``
      when none). ``instance(segmenter, params, aux_params, inputs:
      InstanceInputs) -> Mapping[str, pytree]``: the pure per-instance
      protocol (jit- and vmap-safe; ``aux_params``: a second parameter pytree,
      e.g. RClicks' click model, or None).
    """

    name: str
    dilation_ratio: float

    def host_inputs(self, segmenter, slot: HostSlot) -> Mapping[str, np.ndarray]: ...

    def instance(self, segmenter, params, aux_params, inputs: InstanceInputs) -> Mapping: ...



class ConfigProtocol:
    """Base of a `BatchProtocol` that keeps its settings in ``self.config`` and needs no host inputs.

    ``dilation_ratio`` is ``self.config.dilation_ratio``; ``host_inputs`` is ``{}``
    for every slot. Subclasses are frozen dataclasses with a ``config`` field or property.
    """

    @property
    def dilation_ratio(self) -> float:
        """Boundary IoU band ratio of the widths the program passes."""
        return self.config.dilation_ratio

    def host_inputs(self, segmenter, slot) -> dict:
        """No host inputs."""
        return {}

# ---- host side ------------------------------------------------------------------------------

def check_batch(batch) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The batch's (image uint8[B, Hf, Wf, 3], gt int8[B, Hf, Wf], size int[B, 2]) as host arrays.

    Raises:
      ValueError: the shapes do not fit together (naming all three).
    """
    images = np.asarray(batch.image)
    gts = np.asarray(batch.gt)
    sizes = np.asarray(batch.size)
    if gts.ndim != 3 or images.shape[:3] != gts.shape or sizes.shape != (gts.shape[0], 2):
        raise ValueError(f"batch must hold image [B, Hf, Wf, 3], gt [B, Hf, Wf], size [B, 2]; got "
                         f"{images.shape}, {gts.shape}, {sizes.shape}")
    return images, gts, sizes


def stack_trees(trees):
    """Stacks pytrees of equal structure leaf by leaf on a new leading axis (e.g. B `Transform`s -> one)."""
    return jax.tree.map(lambda *leaves: jnp.stack(leaves), *trees)


def _stack_host(trees):
    if not trees or not jax.tree.leaves(trees[0]):
        return {}
    return jax.tree.map(lambda *leaves: np.stack([np.asarray(leaf) for leaf in leaves]), *trees)


def place_like(tree, reference):
    """device_put ``tree`` with ``reference``'s sharding when it is a sharded jax Array."""
    sharding = getattr(reference, "sharding", None)
    if isinstance(sharding, jax.sharding.NamedSharding):
        return jax.device_put(tree, sharding)
    return tree


@functools.lru_cache(maxsize=1)
def host_device():
    """The host's CPU device, where host preparation creates its arrays (None when JAX has no CPU backend)."""
    try:
        return jax.devices("cpu")[0]
    except RuntimeError:
        return None


def _on_host():
    """Context in which new jax arrays live on `host_device` (a GPU run reads nothing back from the GPU)."""
    device = host_device()
    return contextlib.nullcontext() if device is None else jax.default_device(device)


def host_arguments(segmenter, protocol, batch, sharding=None) -> tuple:
    """The device program's batch arguments of a `PaddedBatch` (see the module docstring).

    Args:
      batch: the `PaddedBatch` (host arrays, or placed on a mesh).
      sharding: where to place the arguments; None: like ``batch.gt`` (unchanged when it is a host array).

    Returns:
      (model_input [B, ...], `Transform` [B], gt int8[B, Hf, Wf], width i32[B], seed u32[B],
      extras {name: [B, ...]}), placed.
    """
    with _on_host():
        args = _host_arrays(segmenter, protocol, batch)
    return place_like(args, batch.gt) if sharding is None else jax.device_put(args, sharding)


def _host_arrays(segmenter, protocol, batch) -> tuple:
    """The unplaced `host_arguments` (crop, preprocess, host inputs, stack, band widths)."""
    images, gts, sizes = check_batch(batch)
    frame = (int(gts.shape[1]), int(gts.shape[2]))
    seeds = np.asarray(batch.seed).astype(np.uint32).reshape(-1)
    valid = np.asarray(getattr(batch, "instance_valid", np.ones(gts.shape[0], bool)), bool).reshape(-1)
    inputs, transforms, extras = [], [], []
    for slot in range(gts.shape[0]):
        height, width = (int(v) for v in sizes[slot])
        image, gt = images[slot, :height, :width], gts[slot, :height, :width]
        model_input, transform = segmenter.preprocess(image, frame_hw=frame)
        inputs.append(model_input)
        transforms.append(transform)
        extras.append(dict(protocol.host_inputs(segmenter, HostSlot(
            image=image, gt=gt, frame=frame, seed=int(seeds[slot]), valid=bool(valid[slot]),
            transform=transform, model_input=model_input))))
    return (jnp.stack(inputs), stack_trees(transforms), gts, boundary_widths(sizes, protocol.dilation_ratio),
            seeds, _stack_host(extras))


# ---- device side ----------------------------------------------------------------------------

def _signature(args) -> tuple:
    """Shapes, dtypes, weak types and placements of every leaf (the jit cache key of the arguments)."""
    return tuple((tuple(np.shape(leaf)), str(getattr(leaf, "dtype", type(leaf))), bool(getattr(leaf, "weak_type", False)),
                  str(getattr(leaf, "sharding", None))) for leaf in jax.tree.leaves(args))


def _bucket(args) -> tuple:
    """(gt shape [B, Hf, Wf], gt placement, parameter signature): one compiled program per bucket,
    placement and parameter set."""
    gt = args[4]
    return tuple(np.shape(gt)), str(getattr(gt, "sharding", None)), _signature(args[:2])


class CompiledFunction:
    """``fn(*args) -> pytree`` jitted and compiled ahead of time once per input signature and matmul precision.

    The one compile cache and retrace check of the library: every prompt protocol's `DeviceProgram`
    and each program of the perturbation battery (`HostDrivenProgram`) compile through one.

    Args:
      name: what the program is called in messages.
      fn: a pure function of array arguments.
      signature: ``args -> hashable`` key of the compile cache (default: every leaf's shape, dtype,
        weak type and placement).
      bucket: ``args -> hashable`` or None: the bucket of a signature; a bucket compiled a second
        time under another signature raises `RetraceError` (None: no bucket check).

    Attributes:
      traces: how many times ``fn`` was traced; a second trace for one signature raises `RetraceError`.
      compiles: executables built; compile_seconds, run_seconds: wall seconds compiling and in
        `__call__` (which waits for the outputs).
      last_compile_seconds: seconds of the compile the last `compiled` call made (0.0: none).
      last_from_cache: whether that compile read the executable from JAX's persistent cache.
    """

    def __init__(self, name: str, fn: Callable, *, signature: Callable | None = None,
                 bucket: Callable | None = None):
        listen_for_cache_hits()
        self.name, self.fn = name, fn
        self.signature = signature or _signature
        self.bucket = bucket
        self.traces = self.compiles = 0
        self.compile_seconds = self.run_seconds = self.last_compile_seconds = 0.0
        self.last_from_cache = False
        self.jitted = jax.jit(self._traced)
        self._executables: dict = {}
        self._buckets: dict = {}

    def _traced(self, *args):
        self.traces += 1  # runs once per trace
        return self.fn(*args)

    def _check_bucket(self, args, key, precision):
        """The bucket of ``args`` (recorded by `compiled` once its program compiled: a failed trace, say of an
        image size the model refuses, leaves the bucket free and the next instance gets the same error)."""
        bucket = self.bucket(args)
        if (bucket, precision) in self._buckets:
            old = self._buckets[bucket, precision]
            changed = [i for i, (a, b) in enumerate(zip(old, key)) if a != b] if len(old) == len(key) else "count"
            raise RetraceError(f"the {self.name} of bucket {bucket[0]} was compiled twice: the per-batch "
                               f"arguments changed (leaves {changed}); host inputs must have one shape per bucket")
        return bucket

    def compiled(self, args, before_compile: Callable[[], None] | None = None):
        """The executable for ``args``' signature, traced, lowered and compiled the first time (and timed).

        ``before_compile`` is called just before a compile (an announcement).

        Raises:
          RetraceError: the bucket was compiled before under another signature, or ``fn`` was traced
            more than once for one signature.
        """
        # the matmul precision programs are traced under (`runner.precision`) is part of jit's cache key
        precision = jax.config.jax_default_matmul_precision
        signature = self.signature(args)
        key = (precision, signature)
        self.last_compile_seconds, self.last_from_cache = 0.0, False
        if key in self._executables:
            return self._executables[key]
        bucket = None if self.bucket is None else self._check_bucket(args, signature, precision)
        if before_compile is not None:
            before_compile()
        traces, hits, start = self.traces, cache_hits(), time.perf_counter()
        executable = self._executables[key] = self.jitted.lower(*args).compile()
        if bucket is not None:
            self._buckets[bucket, precision] = signature
        self.last_compile_seconds = time.perf_counter() - start
        self.last_from_cache = cache_hits() > hits
        self.compile_seconds += self.last_compile_seconds
        self.compiles += 1
        if self.traces > traces + 1:
            raise RetraceError(f"the {self.name} was traced {self.traces - traces} times for one signature")
        return executable

    def __call__(self, *args):
        """Runs the compiled program on ``args`` and waits for its outputs (their time goes to ``run_seconds``)."""
        executable = self.compiled(args)
        start = time.perf_counter()
        args = jax.device_put(args, executable.input_shardings[0])  # equivalent placements -> the compiled one
        outputs = jax.block_until_ready(executable(*args))
        self.run_seconds += time.perf_counter() - start
        return outputs


class DeviceProgram:
    """The jitted device side of one (segmenter, protocol) pair: embed once, vmap the protocol.

    Attributes:
      function: its `CompiledFunction` (one compile per bucket and placement; a retrace is an error).
      last_compile: the `CompileEvent` of the last `compiled` call, None when it found the program compiled.
    """

    def __init__(self, segmenter, protocol):
        self.segmenter = segmenter
        self.protocol = protocol
        self.last_compile: CompileEvent | None = None
        self.function = CompiledFunction(f"{protocol.name} program", self._run, bucket=_bucket)

    @property
    def traces(self) -> int:
        """How many times the program was traced (one per bucket and placement)."""
        return self.function.traces

    def _run(self, params, aux_params, model_input, transform, gt, width, seed, extras):
        features = self.segmenter.embed(params, model_input)
        inputs = InstanceInputs(features=features, transform=transform, gt=gt, width=width, seed=seed,
                                extras=extras)
        return jax.vmap(lambda one: self.protocol.instance(self.segmenter, params, aux_params, one))(inputs)

    def compiled(self, args, announce: Callable[[str], None] | None = None, description: str | None = None):
        """The compiled program for ``args`` (params, aux_params, then the `host_arguments`), compiling it once.

        ``announce`` is told "compiling the <description> for bucket HxW, batch B (first batch) ..."
        before a compile (``description`` default: "<protocol name> program").

        A program is compiled once per argument signature and matmul precision (`jaxseg_robust.runner.precision`:
        a run at another precision in the same process gets its own program).

        Raises:
          RetraceError: this bucket and placement was compiled before with other argument shapes.
        """
        batch, frame_h, frame_w = _bucket(args)[0]
        what = description or f"{self.protocol.name} program"

        def tell():
            if announce is not None:
                announce(f"compiling the {what} for bucket {frame_h}x{frame_w}, batch {batch} (first batch) ...")
        compiles = self.function.compiles
        program = self.function.compiled(args, tell)
        self.last_compile = None
        if self.function.compiles > compiles:
            self.last_compile = CompileEvent(what, (int(frame_h), int(frame_w)), int(batch),
                                             self.function.last_compile_seconds, time.time(),
                                             from_cache=self.function.last_from_cache)
        return program


def batch_timing(valid, device_seconds: float, wall_seconds: float, started: float = math.nan,
                 ended: float = math.nan) -> dict:
    """The ``TIMING_KEY`` output of a batch: each field [B] (the batch's numbers, repeated per slot).

    Args:
      valid: bool[B] the real instances of the batch.
      device_seconds, wall_seconds: the batch's device and wall seconds, compile excluded (`BatchProgram`).
      started, ended: Unix seconds when the batch's host preparation began and its device work ended
        (the device busy share of `reports.timing_summary`; NaN: not known).
    """
    valid = np.asarray(valid, bool)
    return {"batch_seconds": np.full(valid.shape, device_seconds, np.float64),
            "batch_wall_seconds": np.full(valid.shape, wall_seconds, np.float64),
            "batch_instances": np.full(valid.shape, int(valid.sum()), np.int64),
            "batch_started": np.full(valid.shape, started, np.float64),
            "batch_ended": np.full(valid.shape, ended, np.float64)}


def unix_time(perf_seconds: float) -> float:
    """Unix seconds of a ``time.perf_counter`` reading of this process."""
    return time.time() - (time.perf_counter() - perf_seconds)


class ProgramBatch(BatchInFlight):
    """A batch `BatchProgram.dispatch` started: the device outputs, their ready time, the batch's timing.

    Device seconds of the batch: from when the device could start it (its launch, or the end of the
    previous batch of the same program, whichever is later) until its outputs were ready (`ReadyClock`);
    wall seconds: its host preparation (compile excluded) plus those device seconds.
    """

    def __init__(self, program: "BatchProgram", outputs, valid, begin: float, launched: float,
                 compile_seconds: float, previous: ReadyClock | None):
        self.program, self.outputs, self.valid = program, outputs, valid
        self.begin, self.launched, self.compile_seconds = begin, launched, compile_seconds
        self.previous = previous  # the ready clock of the program's batch dispatched before this one
        self.clock = ReadyClock(outputs)

    def ready(self) -> bool:
        """Whether the device has finished the batch."""
        return self.clock.is_set()

    def _device_start(self) -> float:
        start = self.launched
        if self.previous is not None:
            with contextlib.suppress(Exception):  # a failed previous batch ended when it failed
                start = max(start, self.previous.wait())
        return start

    def result(self) -> dict:
        """The outputs (device arrays) with ``TIMING_KEY`` when the program is timed."""
        ready_at = self.clock.wait()
        device_seconds = ready_at - min(self._device_start(), ready_at)
        self.program.last_seconds = device_seconds
        outputs = dict(self.outputs)
        chex.assert_tree_shape_prefix(outputs, (int(self.valid.shape[0]),))
        if self.program.timed:
            host_seconds = self.launched - self.begin - self.compile_seconds
            outputs[TIMING_KEY] = batch_timing(self.valid, device_seconds, host_seconds + device_seconds,
                                               unix_time(self.begin), unix_time(ready_at))
        return outputs


def family_frame_policy(segmenter, requested: FramePolicy) -> FramePolicy:
    """The frame policy a batch program runs ``segmenter`` under: ``requested``, or every image in its
    own frame (`ExactFrame`) where the family's network sees the padded frame (``FamilyRules.frame_policy``
    "exact": click-map models without a zoom-in; padding would change their outputs)."""
    if family_rules(segmenter).frame_policy == FRAME_POLICY_EXACT and not isinstance(requested, ExactFrame):
        return ExactFrame()
    return requested


@functools.lru_cache(maxsize=32)
def device_program(segmenter, protocol) -> DeviceProgram:
    """The process-wide `DeviceProgram` of a (segmenter, protocol) pair (both hashable, static)."""
    return DeviceProgram(segmenter, protocol)


class BatchProgram(DispatchingBatchFunction):
    """``PaddedBatch -> dict of arrays [B, ...]`` for `jaxseg_robust.runner.engine.run`: one protocol, one model.

    Calling it waits for the results; the engine calls `dispatch` instead, which returns while the
    device computes (a `ProgramBatch`).

    Attributes:
      segmenter, params: the model (params replicated over the mesh for several devices).
      protocol: the `BatchProtocol`.
      aux_params: a second parameter pytree the protocol reads (e.g. a click model's), or None.
      announce: ``text -> None`` told before a bucket's program is compiled (None: silent).
      description: what the announcement calls the program (default: the protocol's
        ``description``, else "<name> program").
      timed: also output ``TIMING_KEY`` [B]: ``batch_seconds`` (device time: from the compiled call,
        or the end of the previous batch still on the device, until its outputs are ready),
        ``batch_wall_seconds`` (host preparation from the `PaddedBatch` (crop, ``preprocess``, host
        inputs, band widths, placement) plus that device time; loading the images before and writing
        records after are not in it), ``batch_instances`` (real instances in the batch) and
        ``batch_started`` / ``batch_ended`` (Unix seconds: host preparation began, outputs ready).
        Compile time is in none of them (`compile_log`).
      last_seconds: device seconds of the last compiled call.
      compile_log: a `CompileLog` of the buckets this object compiled (one `CompileEvent` each).
    """

    def __init__(self, segmenter, params, protocol, *, aux_params=None, announce=None, description=None,
                 timed: bool = False):
        check_segmenter(segmenter)
        self.segmenter = segmenter
        self.params = params
        self.protocol = protocol
        self.aux_params = aux_params
        self.announce = announce
        self.description = description or getattr(protocol, "description", None)
        self.timed = timed
        self.last_seconds = math.nan
        self.compile_log = CompileLog()
        self._device = device_program(segmenter, protocol)
        self._last_clock: ReadyClock | None = None

    def with_timing(self) -> "BatchProgram":
        """The same program (same protocol, model and compile cache) with ``timed=True``."""
        return BatchProgram(self.segmenter, self.params, self.protocol, aux_params=self.aux_params,
                            announce=self.announce, description=self.description, timed=True)

    def frame_policy(self, requested: FramePolicy) -> FramePolicy:
        """The frame policy this program's model runs under (`family_frame_policy`)."""
        return family_frame_policy(self.segmenter, requested)

    @property
    def traces(self) -> int:
        """Traces of the shared device program so far (one per bucket and placement)."""
        return self._device.traces

    @property
    def config(self):
        """The protocol's settings (its ``config`` when it has one, else the protocol itself)."""
        return getattr(self.protocol, "config", self.protocol)

    def dispatch(self, batch, sharding=None) -> ProgramBatch:
        """Host preparation of a `PaddedBatch`, its compile when new, then the compiled call, not waited for.

        Args:
          batch: the `PaddedBatch` (host arrays, or placed on the mesh).
          sharding: placement of the arguments (the engine's ``data`` sharding); None: like ``batch.gt``.
        """
        begin = time.perf_counter()
        args = (self.params, self.aux_params, *host_arguments(self.segmenter, self.protocol, batch, sharding))
        program = self._device.compiled(args, self.announce, self.description)
        compile_seconds = 0.0
        if self._device.last_compile is not None:
            self.compile_log.add(self._device.last_compile)
            compile_seconds = self._device.last_compile.seconds
        launched = time.perf_counter()
        outputs = program(*args)
        valid = np.asarray(batch.instance_valid, bool).reshape(-1)
        dispatched = ProgramBatch(self, outputs, valid, begin, launched, compile_seconds, self._last_clock)
        self._last_clock = dispatched.clock
        return dispatched

    def __call__(self, batch) -> dict:
        """Runs the protocol on a `PaddedBatch` and waits for its outputs (`dispatch`, then its result)."""
        return self.dispatch(batch).result()


class HostDrivenProtocol(Protocol):
    """A protocol that runs several compiled programs on a batch with host decisions between them
    (the perturbation battery, `jaxseg_robust.attacks.perturb.battery_program`).

    Attributes:
      name: what its compile events call it.

    ``functions() -> Sequence[CompiledFunction]``: every program it runs (their compile and run
    seconds make the batch's timing). ``run_batch(batch) -> Mapping[str, array [B, ...]]``: the
    outputs of one `PaddedBatch` placed on the mesh.
    """

    name: str

    def functions(self) -> Sequence[CompiledFunction]: ...

    def run_batch(self, batch) -> Mapping: ...


class HostDrivenProgram:
    """``PaddedBatch -> dict of arrays [B, ...]`` of a `HostDrivenProtocol`, timed like a timed `BatchProgram`.

    Device seconds of a batch: what its compiled programs ran (each call waits for its outputs); wall
    seconds: the whole batch (host work between the programs included) minus the compile seconds, which
    go to ``compile_log`` (one `CompileEvent` per batch that compiled: a new bucket; ``from_cache`` when
    JAX read every program it compiled from its persistent compilation cache,
    `jaxseg_robust.runner.compile_cache`).

    Attributes:
      protocol: the `HostDrivenProtocol`.
      compile_log: a `CompileLog`.
    """

    def __init__(self, protocol: HostDrivenProtocol):
        listen_for_cache_hits()
        self.protocol = protocol
        self.compile_log = CompileLog()

    def _totals(self) -> tuple[float, float, int]:
        functions = list({id(f): f for f in self.protocol.functions()}.values())
        return (sum(f.compile_seconds for f in functions), sum(f.run_seconds for f in functions),
                sum(f.compiles for f in functions))

    def __call__(self, batch) -> dict:
        totals, hits = self._totals(), cache_hits()
        begin, started = time.perf_counter(), time.time()
        outputs = dict(self.protocol.run_batch(batch))
        wall = time.perf_counter() - begin
        compiled, ran, compiles = (after - before for after, before in zip(self._totals(), totals))
        if compiles > 0:
            batch_size, frame_h, frame_w = np.shape(batch.gt)
            self.compile_log.add(CompileEvent(self.protocol.name, (int(frame_h), int(frame_w)), int(batch_size),
                                              compiled, started + compiled,
                                              from_cache=cache_hits() - hits >= compiles > 0))
        outputs[TIMING_KEY] = batch_timing(batch.instance_valid, ran, wall - compiled, started, started + wall)
        return outputs


__all__ = ["TIMING_KEY", "CompileEvent", "CompileLog", "batch_timing", "unix_time", "RetraceError", "InstanceInputs",
           "HostSlot", "BatchProtocol", "ConfigProtocol", "check_batch", "stack_trees", "place_like", "host_device", "host_arguments",
           "CompiledFunction", "DeviceProgram", "device_program", "ProgramBatch", "BatchProgram",
           "HostDrivenProtocol", "HostDrivenProgram"]
