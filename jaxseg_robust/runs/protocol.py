"""The seam every protocol spec implements: check, load, plan, summarize (docs/ARCHITECTURE.md, "One run").

`jaxseg_robust.runs.evaluate` runs every protocol the same way:

  spec.check()                                   values, before anything is loaded
  spec.load_instances(data, say)                 the instances (prompt protocols: `runs.loading`)
  spec.load_model(model, instances, mesh, say)   the model (and what the protocol derives from the data)
  spec.plan(model, instances, run_dir, say)      a `RunPlan`: the batch program, manifest config, finalize
  engine                                          `jaxseg_robust.runner.engine.run` of the plan
  spec.summarize(run_dir, plan)                   a `RunTables`: the table of every record in the run directory

A protocol spec is a frozen dataclass of the protocol's settings that
subclasses `ProtocolSpec`; its class attributes declare what differs between
protocols (the command name, the default batch size, the TETRIS cap), never
probed.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import ClassVar

from jaxseg_robust.runs.loading import load_instances, load_model
from jaxseg_robust.runs.spec import DataSpec, ModelSpec, RunError

Say = Callable[[str], None]


@dataclasses.dataclass(frozen=True)
class RunPlan:
    """What the engine runs (`jaxseg_robust.runner.engine.run`).

    Attributes:
      instances: the instances to run (a protocol may drop some, e.g. BREPS user mode: those without boxes).
      batch_fn: the timed `jaxseg_robust.runner.program.BatchProgram` (or any engine batch function with
        ``frame_policy`` and ``compile_log``).
      config: the manifest's config (compared on resume).
      fingerprint: ``sha256:...`` of the weights.
      finalize: ``(instance, outputs) -> payload`` of the engine (None: the outputs as they are).
      check: host check of each loaded instance (None: none).
      frame: a frame policy text that replaces the engine spec's (None: the engine spec's).
      clicks: clicks one instance computes (the divisor of seconds per click in the timings; 0: none).
    """

    instances: Sequence
    batch_fn: object
    config: Mapping
    fingerprint: str
    finalize: Callable | None = None
    check: Callable | None = None
    frame: str | None = None
    clicks: int = 0


@dataclasses.dataclass(frozen=True)
class RunTables:
    """A run's summary: the per-dataset table (Markdown and CSV; None: the protocol wrote its own files)
    and further files the protocol wrote (figures, per-click CSVs)."""

    markdown: str
    csv: str | None
    files: tuple = ()


class ProtocolSpec(abc.ABC):
    """Base of the protocol specs: the prompt protocols' loading; subclasses add ``check``, ``plan`` and
    ``summarize``.

    Class attributes:
      command: the protocol's name (the CLI sub-command, the manifest's ``protocol``).
      default_batch_size: instances per jitted call when the engine spec gives none.
      default_tetris_max_side: the TETRIS dataset's cap when the data spec gives none (None: the listing's).
    """

    command: ClassVar[str] = ""
    default_batch_size: ClassVar[int] = 1
    default_tetris_max_side: ClassVar[int | None] = None

    def check(self) -> None:
        """Raises `RunError` for settings that cannot run, before anything is loaded."""

    def load_instances(self, data: DataSpec, say: Say):
        """The run's instances: a list of instance refs (`jaxseg_robust.runs.loading.load_instances`), or what a
        protocol's ``load_model`` and ``plan`` read instead (perturb: its semantic or folder instances)."""
        return load_instances(data, default_tetris_max_side=self.default_tetris_max_side, say=say)

    def load_model(self, model: ModelSpec | None, instances, mesh, say: Say):
        """What the protocol's ``plan`` runs: a `LoadedModel` (`jaxseg_robust.runs.loading.load_model`), or a
        protocol's own (RClicks: with its click model and user clicks; perturb: the attacked `Target`).

        Raises:
          RunError: no model (``model`` None) for a protocol that evaluates one.
        """
        if model is None:
            raise RunError(f"the {self.command} protocol evaluates a model: give {{model}}")
        say(f"loading {model.name} ...")
        return load_model(model, mesh=mesh)

    @abc.abstractmethod
    def plan(self, model, instances, run_dir, say: Say) -> RunPlan:
        """The `RunPlan` of the protocol on ``model`` and ``instances`` (what ``load_model`` and
        ``load_instances`` returned)."""

    @abc.abstractmethod
    def summarize(self, run_dir, plan: RunPlan, say: Say) -> RunTables:
        """The table of every record in ``run_dir`` (and further files)."""
