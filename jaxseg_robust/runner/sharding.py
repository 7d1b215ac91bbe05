"""Data-parallel sharding of instance batches over the local devices.

One code path serves one CPU and N accelerators: a 1-axis `Mesh` named
``'data'`` over ``jax.local_devices()``; every batch leaf is split along its
leading (instance) axis, which is padded to a multiple of the device count;
parameters are replicated. Instances are independent, so no collective runs
between devices and results do not depend on the device count for batch
functions whose per-instance computation does not depend on the batch size.

Multi-process (multi-host) runs: each process builds the mesh over its own
local devices and evaluates the instances it owns (`process_owns`, a stable
hash of the key), so hosts never wait on each other and a slow or failed host
affects only its share. See `jaxseg_robust.runner.engine` for the full recipe.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from jaxseg_robust.hashing import key_digest

DATA_AXIS = "data"


def data_mesh(devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A 1-axis mesh named ``'data'`` over ``devices`` (default: ``jax.local_devices()``).

    Raises:
      ValueError: ``devices`` is empty.
    """
    devices = list(jax.local_devices() if devices is None else devices)
    if not devices:
        raise ValueError("devices must not be empty")
    return Mesh(np.array(devices), (DATA_AXIS,), axis_types=(AxisType.Auto,))


def data_sharding(mesh: Mesh) -> NamedSharding:
    """Sharding that splits a leaf's leading axis over the ``'data'`` axis."""
    return NamedSharding(mesh, PartitionSpec(DATA_AXIS))


def replicated_sharding(mesh: Mesh) -> NamedSharding:
    """Sharding that keeps a full copy of a leaf on every device of ``mesh``."""
    return NamedSharding(mesh, PartitionSpec())


def padded_batch_size(batch_size: int, mesh: Mesh) -> int:
    """``batch_size`` rounded up to a multiple of the mesh's device count.

    Raises:
      ValueError: ``batch_size`` is not a positive int.
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    devices = mesh.devices.size
    return -(-batch_size // devices) * devices


def pad_leading(tree, size: int):
    """Pads every leaf's leading axis to ``size`` by repeating its first row (host NumPy).

    Args:
      tree: pytree of arrays [B, ...] with one common B in [1, size].
      size: target leading size.

    Returns:
      The same pytree with leaves [size, ...] (NumPy arrays).

    Raises:
      ValueError: naming the leaf, on a scalar leaf, mismatched B, B = 0 or B > size.
    """
    leaves, treedef = jax.tree_util.tree_flatten_with_path(tree)
    padded = []
    common = None
    for path, leaf in leaves:
        array = np.asarray(leaf)
        name = jax.tree_util.keystr(path) or "<root>"
        if array.ndim == 0:
            raise ValueError(f"leaf {name} is a scalar; batch leaves need a leading instance axis")
        common = array.shape[0] if common is None else common
        if array.shape[0] != common or not 1 <= common <= size:
            raise ValueError(f"leaf {name} has leading size {array.shape[0]}; expected {common} in [1, {size}]")
        fill = np.repeat(array[:1], size - array.shape[0], axis=0)
        padded.append(np.concatenate([array, fill], axis=0))
    return jax.tree_util.tree_unflatten(treedef, padded)


def shard_batch(tree, mesh: Mesh):
    """Places a batch on the mesh, each leaf split along its leading axis.

    Args:
      tree: pytree of arrays [B, ...], B divisible by the device count
        (use `padded_batch_size` / `pad_leading`).
      mesh: a `data_mesh`.

    Returns:
      The pytree of `jax.Array`s sharded with `data_sharding`.

    Raises:
      ValueError: naming the leaf whose leading axis is missing or not divisible.
    """
    devices = mesh.devices.size
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        shape = np.shape(leaf)
        if not shape or shape[0] % devices:
            raise ValueError(
                f"leaf {jax.tree_util.keystr(path) or '<root>'} has shape {list(shape)}; its leading axis must be "
                f"divisible by the {devices} devices of the mesh (pad with pad_leading)"
            )
    return jax.device_put(tree, data_sharding(mesh))


def replicate(tree, mesh: Mesh):
    """Places a pytree (e.g. model parameters) on every device of ``mesh``."""
    return jax.device_put(tree, replicated_sharding(mesh))


def jit_data_parallel(fn: Callable, mesh: Mesh, *, replicated_argnums: Sequence[int] = ()) -> Callable:
    """``jax.jit`` of ``fn`` with data-parallel shardings on the way in and out.

    Positional parameters listed in ``replicated_argnums`` (e.g. model
    parameters) are replicated; every other positional parameter and every
    output leaf is split along its leading (instance) axis.

    Args:
      fn: pure function of a fixed number of positional pytree arguments
        (no ``*args``), returning a pytree of per-instance arrays [B, ...].
      mesh: a `data_mesh`.
      replicated_argnums: indices of parameters to replicate.

    Returns:
      The jitted function.

    Raises:
      ValueError: ``fn`` takes ``*args`` or a replicated index is out of range.
    """
    parameters = inspect.signature(fn).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in parameters):
        raise ValueError("fn must take a fixed number of positional arguments, not *args")
    count = sum(p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
                for p in parameters)
    replicated = {int(i) for i in replicated_argnums}
    if not replicated <= set(range(count)):
        raise ValueError(f"replicated_argnums {sorted(replicated)} out of range for {count} arguments")
    data, full = data_sharding(mesh), replicated_sharding(mesh)
    in_shardings = tuple(full if i in replicated else data for i in range(count))
    return jax.jit(fn, in_shardings=in_shardings, out_shardings=data)


def process_owns(key: tuple[str, str], process_index: int, process_count: int) -> bool:
    """Whether process ``process_index`` of ``process_count`` evaluates the instance ``key``.

    A stable hash of the key (SHA-256, not Python's salted ``hash``), so every
    process agrees on the partition without communicating, whatever the order
    or the done-set each process sees.

    Raises:
      ValueError: ``process_index`` not in [0, process_count).
    """
    if not 0 <= process_index < process_count:
        raise ValueError(f"process_index must be in [0, {process_count}), got {process_index}")
    if process_count == 1:
        return True
    return int.from_bytes(key_digest(key)[:8], "little") % process_count == process_index
