"""The frozen run spec: what one evaluation run is, as values (model, data, protocol, engine settings).

A `RunSpec` is everything `jaxseg_robust.runs.evaluate` needs besides the run
directory; the command line builds one from its flags, a notebook writes one
by hand (README, "From Python"). The protocol part is one of the protocol
specs of this package (`TetrisSpec`, `BrepsSpec`, `GridSpec`, `RClicksSpec`,
`PerturbSpec`), each a frozen dataclass of the protocol's settings
(docs/ARCHITECTURE.md, "One run").

`RunError` is the one error a run spec raises when it cannot run (a bad
value, a missing dataset, a run directory made with other settings). Its text
names the spec's fields in braces (``{n_clicks} must be >= 2``); `RunError.render`
names them otherwise, which is how the command line says ``--n-clicks``.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping

from jaxseg_robust.data.masks_io import DEFAULT_RULE
from jaxseg_robust.data.size_guard import DEFAULT_MAX_SIDE

FIELD_MARK = re.compile(r"\{([a-z][a-z0-9_]*)\}")
FRAME_POLICIES = "'exact', 'round:N' or 'fixed:HxW'"


def render_fields(template: str, names: Mapping[str, str] | None = None) -> str:
    """``template`` with each ``{field}`` replaced by ``names[field]`` (the bare field name when absent)."""
    names = names or {}
    return FIELD_MARK.sub(lambda match: names.get(match.group(1), match.group(1)), template)


class RunError(ValueError):
    """A run that cannot start or go on; ``template`` names the spec fields involved as ``{field}``."""

    def __init__(self, template: str):
        self.template = template
        super().__init__(render_fields(template))

    def render(self, names: Mapping[str, str] | None = None) -> str:
        """The message with the fields named by ``names`` (e.g. the command line's flags)."""
        return render_fields(self.template, names)


def mark_fields(text: str, fields) -> str:
    """``text`` (a lower layer's message) with each of ``fields`` that it names as a word marked ``{field}``."""
    for field in sorted(fields, key=len, reverse=True):
        text = re.sub(rf"(?<![\w{{-]){re.escape(field)}(?![\w}}])", f"{{{field}}}", text)
    return text


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """The model a run evaluates.

    Attributes:
      name: a zoo name (weights converted into ``$JAXSEG_ROBUST_MODELS``) or a directory made by
        ``python -m ports``.
      random_seed: seeded random weights instead of the converted ones (zoo names only; test models
        without official weights get seed 0 unless this says otherwise).
      compute_dtype: the image encoder's compute dtype, "float32" or "bfloat16" (None: the model's).
    """

    name: str
    random_seed: int | None = None
    compute_dtype: str | None = None


@dataclasses.dataclass(frozen=True)
class DataSpec:
    """The instances a run evaluates (docs/ARCHITECTURE.md, "One run"; the listing rules are `runs.loading`'s).

    Attributes:
      datasets: benchmark names under ``data_root`` (GrabCut, Berkeley, DAVIS, COCO_MVal, TETRIS) or
        existing folders (read as the benchmark their name says, else as images/ + masks/).
      data_root: the folder of the benchmark folders (None: ``$JAXSEG_ROBUST_DATA``).
      folders: (images folder, masks folder) pairs matched by file stem; each dataset is named after
        the images folder's parent.
      limit: only the first N instances of each dataset (None: all).
      max_side: the size guard: longer images are downsized on load, pixels (0: none).
      tetris_max_side: the TETRIS dataset's protocol cap of the longest side, pixels (None: the
        protocol's, 1024 or RClicks' 2048; 0: original size).
      mask_rule: the foreground rule of plain folders' masks ('>N', '>=N', '==N', '!=N').
      mask_ignore: the pixel value of ignored pixels in plain folders' masks (None: none).
      on_bad_pair: a file that cannot be paired or read: "fail" (record a failed instance), "skip" or
        "error" (stop).
    """

    datasets: tuple[str, ...] = ()
    data_root: str | None = None
    folders: tuple[tuple[str, str], ...] = ()
    limit: int | None = None
    max_side: int = DEFAULT_MAX_SIDE
    tetris_max_side: int | None = None
    mask_rule: str = DEFAULT_RULE
    mask_ignore: int | None = None
    on_bad_pair: str = "fail"


@dataclasses.dataclass(frozen=True)
class EngineSpec:
    """How the engine runs the instances (`jaxseg_robust.runner.engine.run`).

    Attributes:
      batch_size: instances per jitted call (None: the protocol's default).
      frame: the padded frame of a batch: 'exact', 'round:N' or 'fixed:HxW' (None: every image in its
        own frame).
      precision: float32 matmul precision of the run's programs, "highest", "high" or "default"
        (`jaxseg_robust.runner.precision`; None: the project's default).
      progress: "auto", "tqdm", "plain" or "none".
      retry_failed: rerun instances recorded as failed.
      allow_manifest_mismatch: resume into a run directory made with other settings.
      abort_after: stop after this many instances in a row fail in the model.
      process_index, process_count: this process's share of a run split over independent processes
        (both None: the whole run, or ``jax.process_index()`` with ``distributed``).
      distributed: call ``jax.distributed.initialize()`` first and take the share from JAX.
    """

    batch_size: int | None = None
    frame: str | None = "round:64"
    precision: str | None = None
    progress: str = "auto"
    retry_failed: bool = False
    allow_manifest_mismatch: bool = False
    abort_after: int = 32
    process_index: int | None = None
    process_count: int | None = None
    distributed: bool = False


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """One evaluation run: ``model`` on ``data`` under ``protocol`` (a protocol spec), run as ``engine`` says;
    ``model`` is None only for a protocol that evaluates no segmenter (RClicks' clickability evaluation)."""

    protocol: object
    model: ModelSpec | None = None
    data: DataSpec = DataSpec()
    engine: EngineSpec = EngineSpec()


def parse_frame(text: str | None):
    """``'exact'`` | ``'round:N'`` | ``'fixed:HxW'`` | None -> a `jaxseg_robust.data.buckets` frame policy
    (None: `ExactFrame`, every image in its own frame).

    Raises:
      RunError: naming ``{frame}``.
    """
    from jaxseg_robust.data.buckets import ExactFrame, FixedFrame, RoundUpFrame  # noqa: PLC0415

    if text is None:
        return ExactFrame()
    value = str(text).strip().lower()
    if value == "exact":
        return ExactFrame()
    match = re.fullmatch(r"round:(\d+)", value)
    if match and int(match.group(1)) >= 1:
        return RoundUpFrame(int(match.group(1)))
    match = re.fullmatch(r"fixed:(\d+)x(\d+)", value)
    if match and min(int(match.group(1)), int(match.group(2))) >= 1:
        return FixedFrame(int(match.group(1)), int(match.group(2)))
    raise RunError(f"{{frame}} must be {FRAME_POLICIES} with positive numbers; got {text!r}")
