"""The one batch program (`jaxseg_robust.runner.program`): host side, one compile per bucket, retrace check.

A toy segmenter and protocol (cheap to compile) stand in for the real ones;
every prompt protocol goes through the same `BatchProgram`.
"""

from __future__ import annotations

import dataclasses
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxseg_robust.data.buckets import pad_batch
from jaxseg_robust.data.instances import make_instance
from jaxseg_robust.models.base import Prediction, Transform
from jaxseg_robust.runner.program import (
    TIMING_KEY,
    BatchProgram,
    CompiledFunction,
    HostDrivenProgram,
    RetraceError,
    device_program,
    host_arguments,
    host_device,
)


@dataclasses.dataclass(frozen=True)
class ToySegmenter:
    """preprocess: the image as float in the frame; embed: times params."""

    probability_threshold = 0.5

    def preprocess(self, image, *, frame_hw=None):
        image = np.asarray(image, np.float32)
        frame = image.shape[:2] if frame_hw is None else frame_hw
        padded = np.zeros((*frame, 3), np.float32)
        padded[:image.shape[0], :image.shape[1]] = image
        size = jnp.asarray(image.shape[:2], jnp.int32)
        return jnp.asarray(padded), Transform(size, size, jnp.ones(2, jnp.float32), tuple(frame))

    def embed(self, params, model_input):
        return model_input * params

    def decode(self, params, features, prompts, transform, *, multimask_output=True):
        logits = jnp.mean(features, axis=-1)
        return Prediction(logits=logits, low_res_logits=logits[None], scores=jnp.zeros(1), index=jnp.int32(0))

    def feedback_shape(self, frame_hw):
        return tuple(frame_hw)

    def feedback(self, prediction):
        return prediction.logits


@dataclasses.dataclass(frozen=True)
class ToyProtocol:
    """Sums the features inside the image; adds the host input ``bias`` (shape from ``slots``)."""

    slots: int = 1
    name = "toy"
    dilation_ratio = 0.02
    grow: bool = dataclasses.field(default=False, compare=False)

    def host_inputs(self, segmenter, slot):
        count = self.slots + (slot.frame[0] if self.grow and slot.seed % 2 else 0)
        return {"bias": np.full((count,), float(slot.gt.sum()), np.float32)}

    def instance(self, segmenter, params, aux_params, inputs):
        rows = jnp.arange(inputs.gt.shape[0]) < inputs.transform.original_hw[0]
        cols = jnp.arange(inputs.gt.shape[1]) < inputs.transform.original_hw[1]
        inside = rows[:, None] & cols[None, :]
        total = jnp.sum(jnp.where(inside[..., None], inputs.features, 0.0))
        return {"total": total, "bias": inputs.extras["bias"], "width": inputs.width, "seed": inputs.seed}


def _instance(name, height, width, value):
    image = np.full((height, width, 3), value, np.uint8)
    gt = np.zeros((height, width), np.int8)
    gt[: height // 2] = 1
    return make_instance(name, image, gt, dataset="toy")


INSTANCES = [_instance("a", 6, 7, 1), _instance("b", 5, 8, 2), _instance("c", 8, 8, 3)]


def test_host_side_and_device_side(capsys):
    lines = []
    program = BatchProgram(ToySegmenter(), jnp.float32(2.0), ToyProtocol(), announce=lines.append, timed=True)
    out = jax.device_get(program(pad_batch(INSTANCES[:2], (8, 8), 3)))
    np.testing.assert_allclose(out["total"], [2 * 6 * 7 * 3, 2 * 2 * 5 * 8 * 3, 2 * 6 * 7 * 3])
    np.testing.assert_allclose(out["bias"][:, 0], [21, 16, 21])  # the padding slot repeats the first
    assert out["width"].tolist() == [1, 1, 1] and out[TIMING_KEY]["batch_instances"].tolist() == [2, 2, 2]
    assert lines == ["compiling the toy program for bucket 8x8, batch 3 (first batch) ..."]
    program(pad_batch(INSTANCES[2:], (8, 8), 3))  # same bucket: no compile, no announcement
    assert len(lines) == 1 and program.traces == 1
    # a second program with equal settings shares the compiled program
    again = BatchProgram(ToySegmenter(), jnp.float32(3.0), ToyProtocol(), announce=lines.append)
    np.testing.assert_allclose(jax.device_get(again(pad_batch(INSTANCES[:1], (8, 8), 3)))["total"][0], 3 * 6 * 7 * 3)
    assert again.traces == 1 and len(lines) == 1
    program(pad_batch(INSTANCES[:1], (8, 10), 3))  # a new bucket compiles once more
    assert program.traces == 2 and "bucket 8x10" in lines[-1]


def test_timing_outputs_and_compile_log():
    """Device and wall seconds per batch (wall >= device), one compile event per bucket compiled by this
    object (none for a bucket compiled before, nor for a program that shares the compile)."""
    untimed = BatchProgram(ToySegmenter(), jnp.float32(2.0), ToyProtocol(slots=5))
    assert TIMING_KEY not in untimed(pad_batch(INSTANCES[:2], (12, 12), 2))
    [event] = untimed.compile_log.drain()
    assert (event.program, event.frame, event.batch) == ("toy program", (12, 12), 2) and event.seconds > 0
    program = untimed.with_timing()
    timing = jax.device_get(program(pad_batch(INSTANCES[2:], (12, 12), 2)))[TIMING_KEY]
    assert program.traces == 1 and program.compile_log.drain() == [] and untimed.compile_log.drain() == []
    assert timing["batch_instances"].tolist() == [1, 1]
    assert np.all(timing["batch_wall_seconds"] >= timing["batch_seconds"]) and np.all(timing["batch_seconds"] > 0)
    assert timing["batch_seconds"][0] == program.last_seconds
    program(pad_batch(INSTANCES[:1], (12, 16), 2))
    assert [e.frame for e in program.compile_log.drain()] == [(12, 16)]


@dataclasses.dataclass(frozen=True)
class PreparedOnTheHost(ToySegmenter):
    """preprocess notes the device of the arrays it creates."""

    devices: list = dataclasses.field(default_factory=list, compare=False, hash=False)

    def preprocess(self, image, *, frame_hw=None):
        model_input, transform = super().preprocess(image, frame_hw=frame_hw)
        self.devices.append(frozenset(model_input.devices()))
        return model_input, transform


def test_dispatch_prepares_on_the_host_places_once_and_times_each_batch_from_the_previous_end():
    """Two batches dispatched back to back: their outputs equal the synchronous call's; each one's device
    seconds start no earlier than its host preparation and than the end of the batch before it."""
    segmenter = PreparedOnTheHost()
    program = BatchProgram(segmenter, jnp.float32(2.0), ToyProtocol(slots=4), timed=True)
    sharding = jax.sharding.NamedSharding(jax.sharding.Mesh(np.array(jax.devices()), ("data",)),
                                          jax.sharding.PartitionSpec("data"))
    first_batch, second_batch = pad_batch(INSTANCES[:2], (12, 12), 2), pad_batch(INSTANCES[2:], (12, 12), 2)
    args = host_arguments(segmenter, program.protocol, first_batch, sharding)
    assert all(leaf.sharding == sharding for leaf in jax.tree.leaves(args))
    assert set(segmenter.devices) == {frozenset({host_device()})}
    first, second = program.dispatch(first_batch, sharding), program.dispatch(second_batch, sharding)
    a, b = jax.device_get(first.result()), jax.device_get(second.result())
    assert first.ready() and second.ready()
    np.testing.assert_allclose(a["total"], jax.device_get(program(first_batch))["total"])
    np.testing.assert_allclose(b["total"][:1], [2 * 8 * 8 * 3 * 3])
    ta, tb = a[TIMING_KEY], b[TIMING_KEY]
    assert ta["batch_started"][0] <= ta["batch_ended"][0] - ta["batch_seconds"][0]
    assert tb["batch_ended"][0] - tb["batch_seconds"][0] >= ta["batch_ended"][0] - 1e-3
    assert np.all(tb["batch_wall_seconds"] >= tb["batch_seconds"]) and tb["batch_instances"].tolist() == [1, 1]


def test_a_bucket_whose_host_inputs_change_shape_is_a_retrace_error():
    device_program.cache_clear()
    program = BatchProgram(ToySegmenter(), jnp.float32(1.0), ToyProtocol(slots=2, grow=True))
    batch = pad_batch(INSTANCES[:2], (8, 8), 2)
    seeds = np.asarray(batch.seed)
    even = batch.replace(seed=seeds - seeds % 2)
    program(even)
    with pytest.raises(RetraceError, match="compiled twice"):
        program(even.replace(seed=even.seed + 1))


def test_each_matmul_precision_gets_its_own_compiled_program():
    """The programs are compiled ahead of time, so the precision must be part of their key (else a second run
    at another precision in one process would reuse the first one's executable)."""
    from jaxseg_robust.runner.precision import matmul_precision  # noqa: PLC0415

    device_program.cache_clear()
    lines = []
    program = BatchProgram(ToySegmenter(), jnp.float32(1.0), ToyProtocol(slots=3), announce=lines.append)
    batch = pad_batch(INSTANCES[:2], (8, 8), 2)
    for precision in ("highest", "default", "highest"):
        with matmul_precision(precision):
            program(batch)
    assert program.traces == 2 and len(lines) == 2  # highest, default; the second highest reuses the first


def test_malformed_batches_and_non_segmenters_are_refused():
    with pytest.raises(ValueError, match="lacks feedback_shape, feedback"):
        BatchProgram(types.SimpleNamespace(preprocess=0, embed=0, decode=0, probability_threshold=0.5), 1.0,
                     ToyProtocol())
    program = BatchProgram(ToySegmenter(), jnp.float32(1.0), ToyProtocol())
    bad = types.SimpleNamespace(image=np.zeros((2, 8, 8, 3), np.uint8), gt=np.zeros((2, 8, 7), np.int8),
                                size=np.zeros((2, 2), np.int32), seed=np.zeros(2, np.uint32))
    with pytest.raises(ValueError, match="batch must hold"):
        program(bad)


def test_a_compiled_function_compiles_once_per_signature_and_refuses_a_bucket_compiled_twice():
    """The one compile cache: a known signature runs the cached executable (no trace, no compile); with a
    bucket, the same bucket under another signature (here: another dtype) is a RetraceError."""
    function = CompiledFunction("double", lambda x: x * 2, bucket=lambda args: (np.shape(args[0]),))
    np.testing.assert_array_equal(function(jnp.arange(3.0)), [0.0, 2.0, 4.0])
    assert (function.traces, function.compiles) == (1, 1) and function.compile_seconds > 0
    np.testing.assert_array_equal(function(jnp.ones(3)), [2.0, 2.0, 2.0])
    assert (function.traces, function.compiles) == (1, 1) and function.last_compile_seconds == 0.0
    function(jnp.ones(4))  # a new bucket
    assert (function.traces, function.compiles) == (2, 2)
    with pytest.raises(RetraceError, match="the double of bucket .3,. was compiled twice"):
        function(jnp.ones(3, jnp.int32))


def test_a_failed_trace_leaves_its_bucket_free():
    """A program whose trace raises (a model refusing a frame size) gives the same error at every try, not a
    RetraceError from the second on."""
    def refuse_odd(x):
        if x.shape[0] % 2:
            raise ValueError(f"odd size {x.shape[0]}")
        return x * 2

    function = CompiledFunction("even", refuse_odd, bucket=lambda args: (np.shape(args[0]),))
    for _ in range(2):
        with pytest.raises(ValueError, match="odd size 3"):
            function(jnp.ones(3))
    np.testing.assert_array_equal(function(jnp.ones(2)), [2.0, 2.0])


@dataclasses.dataclass
class SummingProtocol:
    """A host-driven protocol: two compiled programs with a host decision between them."""

    name = "summing"
    square: CompiledFunction = dataclasses.field(default_factory=lambda: CompiledFunction("square", jnp.square))
    total: CompiledFunction = dataclasses.field(
        default_factory=lambda: CompiledFunction("total", lambda x: jnp.sum(x, axis=(1, 2))))

    def functions(self):
        return [self.square, self.total]

    def run_batch(self, batch):
        gt = jnp.asarray(batch.gt, jnp.float32)
        squared = self.square(gt) if bool(np.asarray(batch.instance_valid).all()) else gt
        return {"total": np.asarray(self.total(squared))}


def test_a_host_driven_protocol_gets_the_timing_and_compile_events_of_the_one_program():
    program = HostDrivenProgram(SummingProtocol())
    batch = pad_batch(INSTANCES[:2], (8, 8), 2)
    first = program(batch)
    # the object's pixels (1) plus the padding's (-1 squared): 21 + 22 and 16 + 24
    np.testing.assert_array_equal(first["total"], [43, 40])
    [event] = program.compile_log.drain()
    assert (event.program, event.frame, event.batch, event.from_cache) == ("summing", (8, 8), 2, False)
    assert event.seconds > 0
    timing = first[TIMING_KEY]
    assert timing["batch_instances"].tolist() == [2, 2] and np.all(timing["batch_seconds"] > 0)
    assert np.all(timing["batch_ended"] >= timing["batch_started"])
    second = program(pad_batch(INSTANCES[2:], (8, 8), 2))  # same bucket, a padding slot: no compile
    assert program.compile_log.drain() == [] and second[TIMING_KEY]["batch_instances"].tolist() == [1, 1]
    assert program.protocol.square.traces == program.protocol.total.traces == 1
