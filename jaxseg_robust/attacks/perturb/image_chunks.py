"""The battery's programs on an accelerator: the batch attacked a few images at a time inside one program.

docs/protocols/perturbation.md, "Accelerator memory".

An attack program ``(params, images, labels, valid, keys, attack_index,
member[, region]) -> AttackResult`` holds one forward + backward pass of the
model for its whole batch. XLA's GPU compiler asked 65-263 GiB for the
battery's programs on 512 x 682 PSPNet-R50 images (260.75 GiB for one of
them), where XLA:CPU compiles the same programs to one pass, about 1.1 GiB
per image (docs/models/semseg.md, "Compiled memory"). On an accelerator the
program therefore runs the attack on chunks of at most ``limit`` images,
one after the other (``lax.map``), so its memory is that of one chunk's
pass whatever the batch (at 4 x 512 x 682 in chunks of one image, XLA:CPU
compiles it to 0.29x of a batch-4 pass); on the CPU it runs the whole batch
as before (its programs and records are unchanged). One place chooses:
`per_platform` (``lax.platform_dependent``).

Both variants give the same per-image results: every attack treats the
images of a batch independently (common.py), and its batch-level shortcuts
(DAG's stop when no image is active, APGD's jump when every image is frozen)
only skip iterations in which the skipped images do not change and are not
counted.
"""

from __future__ import annotations

from typing import Callable

import jax
from jax import lax

from jaxseg_robust.attacks.perturb.common import check_steps

# (params, images, labels, valid, keys, attack_index, member[, region]) -> AttackResult, every leaf [B, ...].
AttackProgram = Callable[..., object]
# Images per attack pass on an accelerator (BatteryConfig.accelerator_chunk's default).
DEFAULT_ACCELERATOR_CHUNK = 1


def chunk_size(batch: int, limit: int) -> int:
    """The largest divisor of ``batch`` that is at most ``limit``: images per chunk (static ints >= 1)."""
    batch, limit = check_steps(batch, "batch"), check_steps(limit, "limit")
    return max(size for size in range(1, min(batch, limit) + 1) if batch % size == 0)


def _split(leaf, chunks: int):
    """[B, ...] -> [chunks, B / chunks, ...]."""
    return leaf.reshape((chunks, leaf.shape[0] // chunks) + leaf.shape[1:])


def _merge(leaf):
    """[chunks, size, ...] -> [chunks * size, ...]."""
    return leaf.reshape((leaf.shape[0] * leaf.shape[1],) + leaf.shape[2:])


def in_chunks(program: AttackProgram, limit: int) -> AttackProgram:
    """``program`` run on chunks of at most ``limit`` images in sequence inside one program (same outputs).

    Args:
      program: an attack program of the battery (see the module docstring).
      limit: most images per chunk; the chunk is `chunk_size` of the batch.

    Returns:
      A program with the same arguments and outputs (leaves [B, ...]) whose
      compiled memory is that of one chunk's attack.
    """
    check_steps(limit, "limit")

    def chunked(params, images, labels, valid, keys, attack_index, member, region=None):
        batched = (images, labels, valid, keys) + (() if region is None else (region,))
        chunks = images.shape[0] // chunk_size(images.shape[0], limit)
        if chunks == 1:
            return program(params, *batched[:4], attack_index, member, *batched[4:])

        def one_chunk(parts):
            return program(params, *parts[:4], attack_index, member, *parts[4:])

        results = lax.map(one_chunk, jax.tree.map(lambda leaf: _split(leaf, chunks), batched))
        return jax.tree.map(_merge, results)
    return chunked


def per_platform(program: AttackProgram, accelerator_chunk: int) -> AttackProgram:
    """``program`` on the CPU, `in_chunks` of ``accelerator_chunk`` images elsewhere (one compiled program)."""
    chunked = in_chunks(program, accelerator_chunk)

    def chosen(params, images, labels, valid, keys, attack_index, member, region=None):
        shared = (params, attack_index, member)
        batched = (images, labels, valid, keys) + (() if region is None else (region,))

        def variant(run):
            def call(shared_args, batched_args):
                (params_, index_, member_), parts = shared_args, batched_args
                return run(params_, *parts[:4], index_, member_, *parts[4:])
            return call
        return lax.platform_dependent(shared, batched, cpu=variant(program), default=variant(chunked))
    return chosen
