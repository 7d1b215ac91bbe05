"""The float32 matrix-product precision a run's jitted programs are traced under.

``--precision`` of every command that runs a model (`commands.flags.add_precision_flag`)
names one of `MATMUL_PRECISIONS`; `matmul_precision` applies it with
``jax.default_matmul_precision`` around the run, and the run manifest records it
under ``config.matmul_precision`` (`CONFIG_KEY`), so a run directory is never resumed
at another precision (`runner.rundir.check_matmul_precision`).

  default   XLA's default: on an NVIDIA GPU float32 products run as TF32-like passes
            (less accurate than ``highest`` and faster; docs/benchmarking.md,
            "Matmul precision"); on XLA:CPU full float32
  high      JAX's middle setting (three bfloat16 passes on a TPU; XLA:GPU may run float32 products
            as at ``default``: the GPU suite's precision step measures it); full float32 on XLA:CPU
  highest   full float32 everywhere

XLA:CPU runs float32 products in full precision whatever the setting, so the CPU
numbers (and the regression records) are the same at every precision. The choice of
``default`` as the default is provisional until the GPU suite's "precision" step
measures the distance of each setting to the torch float32 reference
(docs/benchmarking.md, "Matmul precision").
"""

from __future__ import annotations

import contextlib

import jax

MATMUL_PRECISIONS = ("default", "high", "highest")
DEFAULT_MATMUL_PRECISION = "default"
CONFIG_KEY = "matmul_precision"  # the run manifest's config key
RECORDED_BEFORE_THE_FLAG = DEFAULT_MATMUL_PRECISION  # what a manifest without the key ran at


def check_precision(name: str) -> str:
    """``name`` if it is one of `MATMUL_PRECISIONS`.

    Raises:
      ValueError: one line naming the value and the choices.
    """
    if name not in MATMUL_PRECISIONS:
        raise ValueError(f"matmul precision must be one of {', '.join(MATMUL_PRECISIONS)}; got {name!r}")
    return name


@contextlib.contextmanager
def matmul_precision(name: str):
    """Context in which every float32 matrix product or convolution traced without an explicit
    ``precision=`` runs at ``name`` (one of `MATMUL_PRECISIONS`; the jit cache keys on it, so a
    program traced under another setting is traced again).

    Raises:
      ValueError: ``name`` is not a precision (`check_precision`).
    """
    with jax.default_matmul_precision(check_precision(name)):
        yield


def recorded_precision(config) -> str:
    """The precision a manifest's ``config`` records (`RECORDED_BEFORE_THE_FLAG` when it predates the key)."""
    return (config or {}).get(CONFIG_KEY, RECORDED_BEFORE_THE_FLAG)
