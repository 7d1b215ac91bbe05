"""jaxseg_robust.runner: the model-agnostic evaluation shell.

Run directories with a manifest (`rundir`), append-only per-instance records
(`records`), model and dataset fingerprints (`fingerprints`), the in-flight
journal that survives a SIGKILL (`inflight`), data-parallel
sharding over local devices (`sharding`), progress display (`progress`) and
the engine that ties them together (`engine.run`).
"""

from jaxseg_robust.runner.engine import (
    BatchFunctionError,
    RunAbortedError,
    RunSummary,
    recorded_counts,
    run,
)
from jaxseg_robust.runner.fingerprints import (
    dataset_fingerprint,
    fingerprint_params,
    fingerprint_path,
    instance_fingerprints,
)
from jaxseg_robust.runner.records import read_run_records
from jaxseg_robust.runner.rundir import ManifestMismatchError, RunDirectoryBusyError
from jaxseg_robust.runner.sharding import data_mesh, jit_data_parallel, replicate

__all__ = [
    "BatchFunctionError",
    "ManifestMismatchError",
    "RunAbortedError",
    "RunDirectoryBusyError",
    "RunSummary",
    "data_mesh",
    "dataset_fingerprint",
    "fingerprint_params",
    "fingerprint_path",
    "instance_fingerprints",
    "jit_data_parallel",
    "read_run_records",
    "recorded_counts",
    "replicate",
    "run",
]
