"""Per-instance side files of a run directory: predicted masks, protocol timings and compile times.

Records (``records*.jsonl``) hold numbers only and no timings, so that the
same instance gives the same line in an uninterrupted run and after a resume.
What a report needs beyond them is written by the prompt commands beside the
records, one file or line per instance:

  ``RUN_DIR/masks/<dataset>/<id>.<name>.png``
      a predicted binary mask at the evaluated image size (1-bit PNG: a
      480 x 640 mask takes a few kB), ``name`` = the trajectory or attack
      (TETRIS ``min`` / ``max`` / ``baseline``: the mask after the last
      click; BREPS ``min`` / ``max``: the mask of the best box). Written
      atomically (temporary file, then rename). ``<dataset>`` and ``<id>``
      are `file_stem` s: names that are not plain file names get a hash
      suffix, so two instances never share a file.
  ``RUN_DIR/timings[.process<k>].jsonl``
      one JSON line per instance and evaluation, written by every protocol
      (`timed_finalize`): ``dataset``, ``id``, ``batch_seconds`` (device
      time of the batch: from the jitted call, or the end of the batch
      before it on the device, until its outputs are ready),
      ``batch_wall_seconds`` (wall time of the batch: the host preparation
      of the padded batch and that call; `runner.program.BatchProgram`,
      perturb: its batch function), ``batch_instances`` (real instances in
      that batch), ``seconds`` and ``wall_seconds`` (the two divided by
      batch_instances: the instance's share; ``seconds`` is the device
      time), ``clicks`` (clicks computed for the instance over all its
      trajectories; 0 for protocols without clicks), ``batch_started`` and
      ``batch_ended`` (Unix seconds: the batch's host preparation began,
      its device work ended) and ``session`` (one token per command run
      that wrote the line). Each bucket's program is compiled before its
      first timed call, so neither time includes compiling. The last line
      of an instance wins (a rerun after a kill may time it again). Lines
      written before the wall time was recorded have no ``wall_seconds``
      (read as NaN), nor before the device busy share was, the last three.
  ``RUN_DIR/compile.jsonl``
      one JSON line per compiled bucket program (`append_compile_events`):
      ``program`` (what was compiled), ``frame`` [H, W], ``batch``,
      ``seconds`` (compile wall seconds), ``from_cache`` (true: JAX read
      the executable from its persistent compilation cache,
      `runner.compile_cache`; lines written before it existed have none,
      read as false), ``process``, ``ended`` (Unix seconds when it ended)
      and ``session`` (as in the timings). Every session of
      a run directory (a resume) compiles its buckets again and adds lines.
      perturb also appends one session summary line per run (``programs``,
      ``compiles``, ``compile_seconds``, ...; no ``seconds``), which
      `read_compile_events` skips.

Run directories written before these files existed simply have none:
`read_mask` returns None, `read_timings` an empty mapping and
`read_compile_events` an empty list, and the reports leave the mask overlays
and the timing columns out.
"""

from __future__ import annotations

import io
import json
import math
import os
import pathlib
import uuid
from collections.abc import Mapping

import numpy as np

from jaxseg_robust.hashing import file_stem

MASKS_DIR = "masks"
TIMINGS_GLOB = "timings*.jsonl"
COMPILE_LOG = "compile.jsonl"


def mask_path(run_dir, key: tuple[str, str], name: str) -> pathlib.Path:
    """``RUN_DIR/masks/<dataset>/<id>.<name>.png`` of instance ``key`` = (dataset, id)."""
    return pathlib.Path(run_dir) / MASKS_DIR / file_stem(key[0]) / f"{file_stem(key[1])}.{file_stem(name)}.png"


def write_mask(run_dir, key: tuple[str, str], name: str, mask) -> pathlib.Path:
    """Writes a bool[H, W] mask as a 1-bit PNG (atomically); returns its path."""
    from PIL import Image  # noqa: PLC0415

    array = np.asarray(mask)
    if array.ndim != 2:
        raise ValueError(f"mask {name!r} of {key[0]}/{key[1]} must be 2-D; got shape {array.shape}")
    path = mask_path(run_dir, key, name)
    path.parent.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    Image.fromarray(array.astype(bool)).save(buffer, format="PNG", optimize=True)
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_bytes(buffer.getvalue())
    os.replace(temporary, path)
    return path


def read_mask(run_dir, key: tuple[str, str], name: str, size: tuple[int, int] | None = None) -> np.ndarray | None:
    """The bool[H, W] mask written by `write_mask`, or None (never written, unreadable, or not of ``size``)."""
    from PIL import Image  # noqa: PLC0415

    path = mask_path(run_dir, key, name)
    try:
        with Image.open(path) as image:
            mask = np.asarray(image.convert("1"), bool)
    except (OSError, ValueError):
        return None
    if size is not None and mask.shape != tuple(int(v) for v in size):
        return None
    return mask


def store_masks(run_dir, instance, outputs: Mapping, top_level: str | None = None) -> dict:
    """Moves predicted masks out of one instance's outputs into `write_mask` files; returns the rest.

    Args:
      run_dir: the run directory.
      instance: the loaded instance (``key``, ``size`` (H, W)).
      outputs: its slot of the batch outputs; every sub-mapping ``outputs[name]`` with a
        ``"mask"`` [Hf, Wf] entry gives the file ``<id>.<name>.png``.
      top_level: the name of a top-level ``outputs["mask"]`` (a single-trajectory protocol), or None.

    Returns:
      ``outputs`` without the masks (each mask cropped to the instance's size and written).
    """
    height, width = (int(v) for v in instance.size)
    payload = dict(outputs)
    if top_level is not None and "mask" in payload:
        write_mask(run_dir, instance.key, top_level, np.asarray(payload.pop("mask"))[:height, :width])
    for name, part in list(payload.items()):
        if isinstance(part, Mapping) and "mask" in part:
            part = dict(part)
            write_mask(run_dir, instance.key, name, np.asarray(part.pop("mask"))[:height, :width])
            payload[name] = part
    return payload


def timings_path(run_dir, process_index: int = 0) -> pathlib.Path:
    """``RUN_DIR/timings.jsonl`` (process 0) or ``RUN_DIR/timings.process<k>.jsonl``."""
    suffix = "" if not process_index else f".process{int(process_index)}"
    return pathlib.Path(run_dir) / f"timings{suffix}.jsonl"


def timing_line(key: tuple[str, str], batch_seconds: float, batch_instances: int, clicks: int,
                batch_wall_seconds: float = math.nan, span: tuple[float, float] = (math.nan, math.nan),
                session: str = "") -> dict:
    """One timing entry (see the module docstring): device seconds ``batch_seconds`` and wall seconds
    ``batch_wall_seconds`` of the batch, and each divided by ``batch_instances``; ``span`` = (batch_started,
    batch_ended) in Unix seconds; ``session``: the writing run's token."""
    batch_instances = max(int(batch_instances), 1)
    return {"dataset": key[0], "id": key[1], "batch_seconds": float(batch_seconds),
            "batch_wall_seconds": float(batch_wall_seconds), "batch_instances": batch_instances,
            "seconds": float(batch_seconds) / batch_instances,
            "wall_seconds": float(batch_wall_seconds) / batch_instances, "clicks": int(clicks),
            "batch_started": float(span[0]), "batch_ended": float(span[1]), "session": str(session)}


def session_token() -> str:
    """A new token naming one command run's timing and compile lines (the device busy share's sessions)."""
    return uuid.uuid4().hex[:12]


def append_timing(run_dir, entry: Mapping, process_index: int = 0) -> None:
    """Appends one `timing_line` to the process's timings file (one ``write`` of one line)."""
    path = timings_path(run_dir, process_index)
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(dict(entry), sort_keys=True) + "\n")


def timed_finalize(run_dir, compile_log, clicks: int = 0, process_index: int = 0, finalize=None):
    """An engine ``finalize`` that moves a batch's timing out of the outputs into the side files.

    Each instance's ``TIMING_KEY`` output (`runner.program.batch_timing`) becomes its `timing_line`
    in ``timings[.process<k>].jsonl`` and the compile events ``compile_log`` gathered since the last
    call are appended to ``compile.jsonl``; the rest of the outputs goes to ``finalize`` (None: kept
    as the payload). Records therefore hold no timings.

    Args:
      run_dir: the run directory.
      compile_log: the batch function's `runner.program.CompileLog`.
      clicks: clicks one instance computes (the divisor of seconds per click; 0 without clicks).
      process_index: this process's index (names its timings file).
      finalize: the protocol's own ``finalize(instance, outputs) -> payload``, or None.

    Every line it writes names one new `session_token`.
    """
    from jaxseg_robust.runner.program import TIMING_KEY  # noqa: PLC0415

    session = session_token()

    def finalize_timed(instance, outputs):
        outputs = dict(outputs)
        timing = outputs.pop(TIMING_KEY, None)
        append_compile_events(run_dir, compile_log.drain(), process_index, session)
        if timing is not None:
            span = (float(timing.get("batch_started", math.nan)), float(timing.get("batch_ended", math.nan)))
            append_timing(run_dir, timing_line(instance.key, float(timing["batch_seconds"]),
                                               int(timing["batch_instances"]), clicks,
                                               float(timing["batch_wall_seconds"]), span, session), process_index)
        return outputs if finalize is None else finalize(instance, outputs)

    return finalize_timed


def append_compile_events(run_dir, events, process_index: int = 0, session: str = "") -> None:
    """Appends one ``compile.jsonl`` line per `runner.program.CompileEvent` (nothing for none)."""
    lines = [json.dumps({"program": e.program, "frame": list(e.frame), "batch": int(e.batch),
                         "seconds": float(e.seconds), "from_cache": bool(e.from_cache), "process": int(process_index),
                         "ended": float(e.ended_at), "session": str(session)}, sort_keys=True) + "\n"
             for e in events]
    if lines:
        with open(pathlib.Path(run_dir) / COMPILE_LOG, "a", encoding="utf-8") as handle:
            handle.write("".join(lines))


def append_compile_summary(run_dir, summary: dict) -> None:
    """Appends a session's compile / run totals (perturb: `attacks.perturb.programs.compile_summary`) to
    ``compile.jsonl`` (a line without ``seconds``, which `read_compile_events` skips)."""
    with open(pathlib.Path(run_dir) / COMPILE_LOG, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(summary) + "\n")


def read_compile_events(run_dir) -> list[dict]:
    """The bucket compile lines of ``compile.jsonl`` (those with ``seconds``), in order; ``[]`` when none."""
    path = pathlib.Path(run_dir) / COMPILE_LOG
    if not path.is_file():
        return []
    events = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            entry = json.loads(line)
            entry["seconds"] = float(entry["seconds"])
        except (ValueError, KeyError, TypeError):
            continue  # a cut-off line, or perturb's session summary
        events.append(entry)
    return events


def read_timing_lines(run_dir) -> list[dict]:
    """Every timing entry of every timings file, in file order; ``[]`` when there is none.

    Lines that are cut off (a kill mid-write) or malformed are skipped: a
    timing only feeds the report's seconds columns.
    """
    lines = []
    for path in sorted(pathlib.Path(run_dir).glob(TIMINGS_GLOB)):
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                entry = json.loads(line)
                str(entry["dataset"]), str(entry["id"]), float(entry["seconds"])
            except (ValueError, KeyError, TypeError):
                continue
            lines.append(entry)
    return lines


def read_timings(run_dir) -> dict[tuple[str, str], dict]:
    """(dataset, id) -> the last entry of `read_timing_lines`; ``{}`` when there is none."""
    return {(str(entry["dataset"]), str(entry["id"])): entry for entry in read_timing_lines(run_dir)}


__all__ = ["MASKS_DIR", "COMPILE_LOG", "append_compile_summary", "file_stem", "mask_path", "write_mask", "read_mask", "store_masks",
           "timings_path", "timing_line", "session_token", "append_timing", "timed_finalize",
           "append_compile_events", "read_compile_events", "read_timing_lines", "read_timings"]
