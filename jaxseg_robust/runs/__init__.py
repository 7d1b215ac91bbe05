"""Run specs and `evaluate`: every protocol run from Python as the command line runs it (docs/ARCHITECTURE.md,
"One run"; README, "From Python").

A `RunSpec` holds a `ModelSpec`, a `DataSpec`, an `EngineSpec` and one
protocol spec (`TetrisSpec`, ...); ``evaluate(spec, run_dir)`` lists the
instances, loads the model, runs the protocol's batch program with the engine
(resume, records, timings) and writes the per-dataset table.
"""

from jaxseg_robust.runs.breps import BrepsSpec
from jaxseg_robust.runs.clickability import ClickabilitySpec
from jaxseg_robust.runs.execute import RunResult, evaluate
from jaxseg_robust.runs.grid import GridSpec
from jaxseg_robust.runs.loading import LoadedModel, load_instances, load_model
from jaxseg_robust.runs.perturb import PerturbSpec
from jaxseg_robust.runs.protocol import ProtocolSpec, RunPlan, RunTables
from jaxseg_robust.runs.rclicks import RClicksSpec
from jaxseg_robust.runs.spec import DataSpec, EngineSpec, ModelSpec, RunError, RunSpec
from jaxseg_robust.runs.tetris import TetrisSpec

__all__ = ["BrepsSpec", "ClickabilitySpec", "DataSpec", "EngineSpec", "GridSpec", "LoadedModel", "ModelSpec",
           "PerturbSpec", "ProtocolSpec", "RClicksSpec", "RunError", "RunPlan", "RunResult", "RunSpec", "RunTables",
           "TetrisSpec", "evaluate", "load_instances", "load_model"]
