"""The structure of the TETRIS batch program (issue 30: compile once, and fast).

The program is read as the StableHLO JAX hands XLA (`compiled_hlo.ops_by_while_depth`); nothing is
compiled. The loops' initial carries are batched from the start, so tracing batches each loop body
once per vmap (`batched_like_instance`). What the compile time depends on is how many copies of the model's decoder are traced into
it: one forward and backward pass in the loop over iterates, none beside it, and one trace for MIN and
MAX together (vmapped). `experiments/benchmarks/program_structure.py` prints the sizes of every
protocol's program.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
from compiled_hlo import ops_by_while_depth, while_depth

from jaxseg_robust.attacks.clicks import ClickProtocol, TetrisConfig
from jaxseg_robust.data.buckets import pad_batch
from jaxseg_robust.data.instances import Instance
from jaxseg_robust.models import zoo
from jaxseg_robust.runner.program import BatchProgram, host_arguments

FRAME = (32, 32)


@pytest.fixture(scope="module")
def model():
    segmenter = zoo.segmenter("sam_tiny")
    return segmenter, segmenter.init(0)


@pytest.fixture(scope="module")
def batch():
    rng = np.random.default_rng(0)
    gt = np.zeros((24, 30), np.int8)
    gt[6:18, 8:22] = 1
    instances = [Instance(id=str(i), image=rng.integers(0, 256, (24, 30, 3), dtype=np.uint8), gt=gt, dataset="t")
                 for i in range(2)]
    return pad_batch(instances, FRAME, 2)


def program_text(model, batch, protocol) -> str:
    """The StableHLO text of the batch program the command line compiles for ``protocol``."""
    segmenter, params = model
    program = BatchProgram(segmenter, params, protocol)
    args = (params, None, *host_arguments(segmenter, protocol, batch))
    return program._device.function.jitted.trace(*args).lower().as_text()  # noqa: SLF001 - the engine's very program


def dots(text: str) -> dict[int, int]:
    return ops_by_while_depth(text, "dot_general")


ATTACK = TetrisConfig(mode="min", n_clicks=2, n_opt_steps=3)


def test_the_attack_traces_the_decoder_only_inside_its_iterate_loop(model, batch):
    segmenter, params = model
    model_input = host_arguments(segmenter, ClickProtocol(attack=ATTACK), batch)[0]
    embed = dots(jax.jit(segmenter.embed).trace(params, model_input).lower().as_text())
    attack = dots(program_text(model, batch, ClickProtocol(attack=ATTACK)))
    # outside the loop over iterates (depth 2: clicks, then iterates) only the embedding's products: the last
    # iterate is evaluated in the loop, not by a second copy of the decoder after it
    assert sum(count for depth, count in attack.items() if depth < 2) == sum(embed.values())
    assert sum(count for depth, count in attack.items() if depth >= 2) > 0
    baseline = dots(program_text(model, batch, ClickProtocol(baseline=TetrisConfig(mode="baseline", n_clicks=2))))
    assert sum(baseline.values()) - sum(embed.values()) > 0  # the baseline's one forward pass, in its click loop


def test_min_and_max_are_one_trace(model, batch):
    single = program_text(model, batch, ClickProtocol(attack=ATTACK))
    both = program_text(model, batch, ClickProtocol(attack=ATTACK, minmax=True))
    assert dots(both) == dots(single)
    assert while_depth(both) == while_depth(single)


def test_loop_carries_start_batched_like_the_instance_with_their_values_unchanged():
    from types import SimpleNamespace  # noqa: PLC0415

    import jax.numpy as jnp  # noqa: PLC0415

    from jaxseg_robust.attacks.click_state import batched_like_instance  # noqa: PLC0415

    carry = {"zeros": jnp.zeros(3), "nan": jnp.float32(jnp.nan), "inf": jnp.float32(jnp.inf),
             "labels": jnp.full((2,), -1, jnp.int32), "open": jnp.ones((2, 2), bool)}

    def start(sign, learning_rate):
        return batched_like_instance(carry, SimpleNamespace(sign=sign, learning_rate=learning_rate))

    signs, rates = jnp.array([-1.0, 1.0]), jnp.array([7.07, 0.5])
    out = jax.vmap(start)(signs, rates)
    for name, value in carry.items():
        expected = np.broadcast_to(np.asarray(value), (2, *np.shape(value)))
        assert out[name].dtype == value.dtype
        np.testing.assert_array_equal(np.asarray(out[name]), expected)
    assert not np.signbit(np.asarray(out["zeros"])).any()  # +0.0, not -0.0
    # batched under either vmap (MIN/MAX: the sign; instances: the step size), so scan batches its body once
    with pytest.raises(ValueError):
        jax.vmap(start, in_axes=(0, None), out_axes=None)(signs, jnp.float32(1.0))
    with pytest.raises(ValueError):
        jax.vmap(start, in_axes=(None, 0), out_axes=None)(jnp.float32(1.0), rates)
    assert jax.vmap(lambda s: carry, out_axes=None)(signs) is not None  # constants alone stay unbatched
