"""`GridSpec`: exhaustive prompt grids (TETRIS click heatmaps, BREPS centred (h, w) box heatmaps) as a run spec.

Kinds (docs/protocols/grids.md §5, `jaxseg_robust.attacks.grid`):
  click  one positive click at every ``stride``-th pixel (first-click grid,
         multimask + argmax), or with ``prefix="baseline"`` the second click
         after the fixed baseline first click; ``region`` restricts the
         positions (image / object / the baseline's error region). Per
         instance: IoU and BIoU heatmaps, their min / max and where, and the
         baseline click's scores.
  box    centred boxes of every (h, w) in 0..2H x 0..2W (step ``stride``)
         around the tight box's centre, single-mask output: IoU / BIoU heatmaps
         over (h, w), min / max, the tight box's scores and the §5.3 corner
         heatmap (unless ``corner_heatmap`` is False).

Records: the scalar results per instance (min / max / baseline scores and
positions, grid sizes), ``source`` (the image file and evaluated size) and
``heatmaps``: the path (relative to the run directory) of
``heatmaps/<dataset>/<id>.npz`` holding the heatmaps cropped to the instance's
image (NumPy arrays; a stride-1 heatmap of a large image would not fit a JSON line).
"""

from __future__ import annotations

import dataclasses
import math
import os
import pathlib
from collections.abc import Sequence
from typing import ClassVar

import numpy as np

from jaxseg_robust.attacks.grid import CLICK_PREFIXES, CLICK_REGIONS, DEFAULT_CHUNK_SIZE, DEFAULT_STRIDE
from jaxseg_robust.runs.loading import LoadedModel, model_config, refuse_click_only, resolve_threshold
from jaxseg_robust.runs.protocol import ProtocolSpec, RunPlan, RunTables, Say
from jaxseg_robust.runs.spec import DataSpec, RunError

KINDS = ("click", "box")
HEATMAPS_DIR = "heatmaps"
CLICK_MAPS = ("iou", "biou", "evaluated", "rows", "cols")
BOX_MAPS = ("iou", "biou", "iou_reference", "valid", "heights", "widths", "corner_heatmap")


@dataclasses.dataclass(frozen=True)
class GridSpec(ProtocolSpec):
    """The grid protocol's settings (module docstring; docs/protocols/grids.md).

    Attributes:
      kind: "click" (click positions) or "box" (centred box sizes).
      stride: grid step, pixels (click positions, or box heights / widths).
      chunk_size: prompts decoded together per instance (memory ~ batch size x chunk size decodes).
      region: click grid: which positions are decoded, "image", "object" or "error" (the baseline's error region).
      prefix: click grid: "none" (the first click) or "baseline" (the second click after the baseline first click).
      thresh: click grid: probability threshold of the masks (None: the model family's).
      multimask: multimask output + argmax predicted IoU (None: the kind's default, True for clicks,
        False for boxes as comp_hw.py).
      corner_heatmap: box grid: also compute the §5.3 corner heatmap.
    """

    command: ClassVar[str] = "grid"
    default_batch_size: ClassVar[int] = 1  # memory ~ batch size x chunk size decodes

    kind: str = "click"
    stride: int = DEFAULT_STRIDE
    chunk_size: int = DEFAULT_CHUNK_SIZE
    region: str = "image"
    prefix: str = "none"
    thresh: float | None = None
    multimask: bool | None = None
    corner_heatmap: bool = True

    def check(self) -> None:
        """Raises `RunError` naming the field for a bad value or a setting of the other kind."""
        if self.kind not in KINDS:
            raise RunError(f"{{kind}} must be one of {', '.join(KINDS)}; got {self.kind!r}")
        if self.stride < 1 or self.chunk_size < 1:
            raise RunError(f"{{stride}} and {{chunk_size}} must be >= 1; got {self.stride}, {self.chunk_size}")
        for field, value, choices in (("region", self.region, CLICK_REGIONS), ("prefix", self.prefix, CLICK_PREFIXES)):
            if value not in choices:
                raise RunError(f"{{{field}}} must be one of {', '.join(choices)}; got {value!r}")
        if self.kind == "box":
            for field, value, default in (("region", self.region, "image"), ("prefix", self.prefix, "none")):
                if value != default:
                    raise RunError(f"{{{field}}} applies to {{kind}} click")
        elif not self.corner_heatmap:
            raise RunError("{corner_heatmap} applies to {kind} box")
        if self.thresh is not None and not 0.0 <= self.thresh < 1.0:
            raise RunError(f"{{thresh}} must be in [0, 1); got {self.thresh}")

    def multimask_output(self) -> bool:
        """The multimask setting: ``multimask``, or the kind's default (clicks yes, boxes no)."""
        return (self.kind == "click") if self.multimask is None else bool(self.multimask)

    def load_instances(self, data: DataSpec, say: Say) -> list:
        """The run's instances, with the stride checked against their sizes (`check_stride`)."""
        instances = super().load_instances(data, say)
        check_stride(self.kind, self.stride, instances, say)
        return instances

    def manifest_config(self, model: LoadedModel, thresh: float) -> dict:
        """The run configuration recorded in (and compared on resume with) the manifest (``thresh``: the
        resolved threshold); a click grid's ``records_format`` names its records' layout
        (`jaxseg_robust.runner.rundir.check_records_format`)."""
        from jaxseg_robust.attacks.grid.clicks import RECORDS_FORMAT  # noqa: PLC0415
        from jaxseg_robust.runner.rundir import RECORDS_FORMAT_KEY  # noqa: PLC0415

        config = model_config(self.command, model, kind=self.kind)
        config.update(stride=self.stride, multimask_output=self.multimask_output())
        if self.kind == "click":
            config.update(region=self.region, prefix=self.prefix, thresh=thresh)
            config[RECORDS_FORMAT_KEY] = RECORDS_FORMAT
        else:
            config.update(corner_heatmap=self.corner_heatmap)
        return config

    def batch_program(self, model: LoadedModel, thresh: float, say: Say):
        """The timed `jaxseg_robust.attacks.grid` batch program (a `jaxseg_robust.runner.program.BatchProgram`)
        of the kind."""
        from jaxseg_robust.attacks.grid import make_box_grid_batch_fn, make_click_grid_batch_fn  # noqa: PLC0415

        try:
            if self.kind == "click":
                program = make_click_grid_batch_fn(
                    model.segmenter, model.params, stride=self.stride, chunk_size=self.chunk_size,
                    region=self.region, prefix=self.prefix, thr=thresh, multimask_output=self.multimask_output(),
                    announce=say)
            else:
                program = make_box_grid_batch_fn(
                    model.segmenter, model.params, stride=self.stride, chunk_size=self.chunk_size,
                    multimask_output=self.multimask_output(), corner_heatmap=self.corner_heatmap, announce=say)
        except ValueError as error:
            raise RunError(str(error)) from None
        return program.with_timing()

    def plan(self, model: LoadedModel, instances: Sequence, run_dir, say: Say) -> RunPlan:
        """The timed grid program; the finalize writes each instance's heatmaps file (`heatmap_finalize`)."""
        from jaxseg_robust.data.instances import require_object  # noqa: PLC0415
        from jaxseg_robust.reports.sources import with_image_source  # noqa: PLC0415

        if self.kind == "box":
            refuse_click_only(model, "grid {kind} box")
        thresh = resolve_threshold(self.thresh, model)
        return RunPlan(instances, self.batch_program(model, thresh, say), self.manifest_config(model, thresh),
                       model.fingerprint, finalize=with_image_source(heatmap_finalize(run_dir, self.kind, self.stride)),
                       check=require_object)

    def summarize(self, run_dir, plan: RunPlan, say: Say) -> RunTables:
        """The per-dataset grid table (`jaxseg_robust.reports.grid`)."""
        from jaxseg_robust.reports.grid import grid_table, to_csv, to_markdown  # noqa: PLC0415
        from jaxseg_robust.reports.report_files import load_run_records  # noqa: PLC0415

        table = grid_table(load_run_records(run_dir), self.kind, self.multimask_output())
        return RunTables(to_markdown(table), to_csv(table))


def prompt_count(kind: str, stride: int, height: int, width: int) -> int:
    """Prompts in one instance's grid: click positions ``ceil(H/s) ceil(W/s)`` on the image, or centred
    box sizes ``(2H//s + 1) (2W//s + 1)`` (heights and widths 0, s, ... <= 2H, 2W)."""
    if kind == "click":
        return -(-height // stride) * -(-width // stride)
    return (2 * height // stride + 1) * (2 * width // stride + 1)


def check_stride(kind: str, stride: int, instances: Sequence, say: Say) -> None:
    """Refuses a ``stride`` that leaves one prompt per instance everywhere (min = max = that prompt).

    When only some instances are that small, says so (naming up to three) and goes on.

    Raises:
      RunError: naming ``{stride}``, the largest image and the largest stride that still gives a grid.
    """
    single = [ref for ref in instances if prompt_count(kind, stride, *ref.size) <= 1]
    what = "click position" if kind == "click" else "box size (0 x 0)"
    if single and len(single) == len(instances):
        height, width = max((ref.size for ref in instances), key=lambda size: max(size))
        limit = max(height, width) - 1 if kind == "click" else 2 * max(height, width)
        raise RunError(f"{{stride}} {stride} leaves a single {what} in every image (the largest is "
                       f"{height}x{width}): min and max would be that one prompt; use {{stride}} {limit} or less")
    if single:
        names = ", ".join(f"{ref.name} ({ref.size[0]}x{ref.size[1]})" for ref in single[:3])
        more = f" and {len(single) - 3} more" if len(single) > 3 else ""
        say(f"warning: {{stride}} {stride} leaves a single {what} in {names}{more}")


# ---- records ---------------------------------------------------------------------------------

def heatmap_path(dataset: str, instance_id: str) -> pathlib.Path:
    """``heatmaps/<dataset>/<id>.npz`` relative to the run directory (names that are not file-name-safe
    are made safe and get a short hash of the original, `jaxseg_robust.hashing.file_stem`, so two
    instances never share a file)."""
    from jaxseg_robust.hashing import file_stem  # noqa: PLC0415

    return pathlib.Path(HEATMAPS_DIR) / file_stem(dataset) / f"{file_stem(instance_id)}.npz"


def _nan_extreme(values: np.ndarray, which) -> float:
    finite = values[np.isfinite(values)]
    return float(which(finite)) if finite.size else math.nan


def crop_outputs(kind: str, outputs: dict, size: tuple[int, int], stride: int) -> tuple[dict, dict]:
    """Splits one instance's grid outputs into (scalars for the record, heatmaps cropped to the image).

    Args:
      kind: "click" or "box".
      outputs: the instance's batch outputs (NumPy; frame-sized grids).
      size: (H, W) of the image, pixels.
      stride: the grid stride, pixels.

    Returns:
      (payload dict, arrays dict). Click heatmaps keep the ``ceil(H / s) x
      ceil(W / s)`` positions inside the image; box heatmaps the sizes ``0..2H``
      x ``0..2W``; the corner heatmap the image's pixels.
    """
    height, width = size
    maps = CLICK_MAPS if kind == "click" else BOX_MAPS
    if kind == "click":
        rows, cols = -(-height // stride), -(-width // stride)
        crop = {"iou": (rows, cols), "biou": (rows, cols), "evaluated": (rows, cols), "rows": (rows,),
                "cols": (cols,)}
    else:
        rows, cols = 2 * height // stride + 1, 2 * width // stride + 1
        crop = {"iou": (rows, cols), "biou": (rows, cols), "iou_reference": (rows, cols), "valid": (rows, cols),
                "heights": (rows,), "widths": (cols,), "corner_heatmap": (height, width)}
    arrays = {}
    for name in maps:
        if name in outputs:
            value = np.asarray(outputs[name])
            arrays[name] = value[tuple(slice(0, n) for n in crop[name])]
    payload = {name: value for name, value in outputs.items() if name not in maps}
    if kind == "box":
        payload["biou_min"] = _nan_extreme(arrays["biou"], np.min)
        payload["biou_max"] = _nan_extreme(arrays["biou"], np.max)
    payload["grid_shape"] = list(arrays["iou"].shape)
    return payload, arrays


def write_heatmaps(run_dir, relative: pathlib.Path, arrays: dict) -> None:
    """Writes ``arrays`` to ``run_dir / relative`` (compressed npz; atomic replace)."""
    target = pathlib.Path(run_dir) / relative
    target.parent.mkdir(parents=True, exist_ok=True)
    temporary = target.with_name(target.name + ".tmp.npz")
    np.savez_compressed(temporary, **arrays)
    os.replace(temporary, target)


def heatmap_finalize(run_dir, kind: str, stride: int):
    """The engine's ``finalize``: crop, write the heatmaps file, return the payload with its ``heatmaps`` path."""

    def finalize(instance, outputs) -> dict:
        payload, arrays = crop_outputs(kind, outputs, instance.size, stride)
        relative = heatmap_path(instance.dataset, instance.id)
        write_heatmaps(run_dir, relative, arrays)
        payload["heatmaps"] = relative.as_posix()
        return payload

    return finalize
