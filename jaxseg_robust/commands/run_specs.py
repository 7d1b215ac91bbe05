"""The command line's flags mapped once onto the run spec (`jaxseg_robust.runs.spec`), and the spec's
fields named back as flags in messages.

Every run command builds its `RunSpec` from the shared flag groups here
(`run_spec_of`: `model_spec_of`, `data_spec_of`, `engine_spec_of`) and its own
protocol spec; `FlagNames` turns a field named in a `RunError` (``{n_clicks}``) into
the flag that sets it (``--n-clicks``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from jaxseg_robust.runs.spec import DataSpec, EngineSpec, ModelSpec, RunSpec

# fields whose flag is not "--" + the field with "-" for "_"
COMMON_FLAGS = {"folders": "--folder", "random_seed": "--random-weights", "run_dir": "--out"}


class FlagNames(Mapping):
    """field -> flag: ``"--" + field.replace("_", "-")`` unless ``overrides`` (and `COMMON_FLAGS`) say otherwise."""

    def __init__(self, **overrides: str):
        self.overrides = {**COMMON_FLAGS, **overrides}

    def __getitem__(self, field: str) -> str:
        return self.overrides.get(field, "--" + field.replace("_", "-"))

    def __iter__(self) -> Iterator[str]:
        return iter(self.overrides)

    def __len__(self) -> int:
        return len(self.overrides)


def model_spec_of(args) -> ModelSpec:
    """The `ModelSpec` of ``--model``, ``--random-weights`` and ``--compute-dtype``."""
    return ModelSpec(args.model, random_seed=args.random_weights, compute_dtype=args.compute_dtype)


def data_spec_of(args) -> DataSpec:
    """The `DataSpec` of the data flag group (``--datasets`` is a comma list)."""
    datasets = tuple(item.strip() for item in str(args.datasets or "").split(",") if item.strip())
    return DataSpec(datasets=datasets, data_root=args.data_root,
                    folders=tuple((images, masks) for images, masks in args.folder), limit=args.limit,
                    max_side=args.max_side, tetris_max_side=args.tetris_max_side, mask_rule=args.mask_rule,
                    mask_ignore=args.mask_ignore, on_bad_pair=args.on_bad_pair)


def engine_spec_of(args, frame: str | None) -> EngineSpec:
    """The `EngineSpec` of the run and process flag groups and ``--precision``; ``frame``: ``--frame`` of a
    command that has it (None: every image in its own frame)."""
    return EngineSpec(batch_size=args.batch_size, frame=frame, precision=args.precision, progress=args.progress,
                      retry_failed=args.retry_failed, allow_manifest_mismatch=args.allow_manifest_mismatch,
                      abort_after=args.abort_after, process_index=args.process_index,
                      process_count=args.process_count, distributed=args.distributed)


def run_spec_of(args, protocol, frame: str | None) -> RunSpec:
    """The `RunSpec` of the shared flag groups and ``protocol`` (the command's protocol spec); ``frame``: as
    `engine_spec_of`."""
    return RunSpec(model=model_spec_of(args), protocol=protocol, data=data_spec_of(args),
                   engine=engine_spec_of(args, frame=frame))
