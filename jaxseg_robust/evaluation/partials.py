"""Split COCO / LVIS evaluations: each process scores a share of the images, one merge gives the whole.

Follows docs/protocols/boundary_ap_pq.md ("Several processes"). A process
evaluates its images (``InstanceEvalConfig.images_of`` or an ``image_ids``
subset) and saves its scored blocks (`jaxseg_robust.evaluation.instances.ScoredBlocks`:
per (image, category) block the ground truths, the detections and their
pair similarities) with :func:`save_partial`. Matching works block by block
and a block belongs to one image, so the merge lays the saved blocks out in
the single-process order (category, then image) and matches and accumulates
them once: every number equals the single-process evaluation's.

A partial file is an ``.npz`` archive (no pickles): the ``coco_ap.Blocks``
arrays, plus a JSON document ``meta`` holding the settings, the scope, the
block keys, the annotation / detection ids and the counts.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import zipfile

import numpy as np

from jaxseg_robust.data.coco_instances import CocoFormatError
from jaxseg_robust.evaluation.instances import (
    InstanceEvalConfig,
    InstanceEvaluation,
    Scope,
    ScoredBlocks,
    summarise_blocks,
)
from jaxseg_robust.metrics import coco_ap

PARTIAL_FORMAT = "jaxseg_robust coco partial evaluation 1"
SUMMED_COUNTS = ("images", "ground_truths", "detections_read", "detections_evaluated")


def settings_record(config: InstanceEvalConfig) -> dict:
    """The settings that decide the numbers, JSON-able (what the partials of one evaluation share)."""
    return {"iou_type": config.iou_type, "dataset": config.dataset, "dilation_ratio": config.dilation_ratio,
            "lvis_max_dets": config.lvis_max_dets, "use_cats": config.use_cats,
            "ap_params": json.loads(json.dumps(dataclasses.asdict(config.params)))}


def config_of(settings: dict) -> InstanceEvalConfig:
    """The InstanceEvalConfig of a :func:`settings_record` (its AP settings as tuples again)."""
    params = dict(settings["ap_params"])
    params["area_ranges"] = tuple(tuple(pair) for pair in params["area_ranges"])
    params = coco_ap.APParams(**{key: tuple(value) if isinstance(value, list) else value
                                 for key, value in params.items()})
    return InstanceEvalConfig(iou_type=settings["iou_type"], dataset=settings["dataset"],
                              dilation_ratio=settings["dilation_ratio"], lvis_max_dets=settings["lvis_max_dets"],
                              use_cats=settings["use_cats"], ap_params=params)


def save_partial(path, scored: ScoredBlocks, config: InstanceEvalConfig, inputs: dict | None = None) -> pathlib.Path:
    """Writes the scored blocks of a share of the images to ``path`` (an ``.npz`` archive; the name is kept).

    Args:
      path: the file to write; scored: the share's blocks (``InstanceEvaluation.blocks`` of
        `jaxseg_robust.evaluation.instances.evaluate_instances`); config: its settings.
      inputs: what identifies the input files (e.g. their SHA-256); the merge refuses
        partials whose ``inputs`` differ.
    """
    meta = {"format": PARTIAL_FORMAT, "settings": settings_record(config), "inputs": inputs or {},
            "images_of": list(config.images_of) if config.images_of else None,
            "scope": dataclasses.asdict(scored.scope), "keys": [list(key) for key in scored.keys],
            "gt_ids": scored.gt_ids, "dt_ids": scored.dt_ids, "counts": scored.counts}
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as handle:
        np.savez(handle, meta=np.array(json.dumps(meta)),
                 **{field: getattr(scored.table, field) for field in coco_ap.Blocks._fields})
    return path


@dataclasses.dataclass
class Partial:
    """One loaded partial file: ``meta`` (the JSON document), ``scored`` (its blocks), ``path``."""

    meta: dict
    scored: ScoredBlocks
    path: pathlib.Path


def load_partial(path) -> Partial:
    """Reads a :func:`save_partial` file (CocoFormatError naming the file when it is not one)."""
    path = pathlib.Path(path)
    if not path.is_file():
        raise CocoFormatError(f"partial file {path} does not exist")
    if not zipfile.is_zipfile(path):
        raise CocoFormatError(f"partial file {path} is not a partial evaluation (not an .npz archive)")
    try:
        with np.load(path, allow_pickle=False) as archive:
            meta = json.loads(str(archive["meta"]))
            table = coco_ap.Blocks(*(archive[field] for field in coco_ap.Blocks._fields))
    except (OSError, ValueError, KeyError, zipfile.BadZipFile, json.JSONDecodeError) as error:
        raise CocoFormatError(f"partial file {path} is not a partial evaluation: {error}") from None
    if not isinstance(meta, dict) or meta.get("format") != PARTIAL_FORMAT:
        raise CocoFormatError(f"partial file {path} is not a partial evaluation of this format ({PARTIAL_FORMAT})")
    scope = Scope(**meta["scope"])
    scored = ScoredBlocks(table, [tuple(key) for key in meta["keys"]], meta["gt_ids"], meta["dt_ids"], scope,
                          meta["counts"])
    return Partial(meta, scored, path)


def _check_compatible(parts: list[Partial]) -> None:
    """CocoFormatError naming the file when partials differ in settings, inputs or categories, overlap,
    or (shares made with ``images_of``) leave images of their selection out."""
    first = parts[0]
    shares = all(part.meta["images_of"] for part in parts)
    for part in parts[1:]:
        for field in ("settings", "inputs"):
            if part.meta[field] != first.meta[field]:
                raise CocoFormatError(f"partial file {part.path}: its {field} differ from those of {first.path}")
        for field in ("selected_images", "category_ids", "member_ids")[0 if shares else 1:]:
            if part.meta["scope"][field] != first.meta["scope"][field]:
                raise CocoFormatError(f"partial file {part.path}: its {field.replace('_', ' ')} differ from "
                                      f"those of {first.path}")
    owner: dict = {}
    for part in parts:
        for image_id in part.scored.scope.image_ids:
            if image_id in owner:
                raise CocoFormatError(f"partial files {owner[image_id]} and {part.path} both evaluate image "
                                      f"{image_id!r}")
            owner[image_id] = part.path
    missing = [image_id for image_id in first.scored.scope.selected_images if image_id not in owner]
    if shares and missing:
        raise CocoFormatError(f"the partial files leave {len(missing)} of the {len(owner) + len(missing)} images "
                              f"unevaluated (first: {missing[0]!r}); merge every share")


def merge_partials(paths) -> tuple[ScoredBlocks, InstanceEvalConfig]:
    """The scored blocks of the whole evaluation from the partial files of all its shares.

    The whole covers the images of all the partials (with ``images_of`` shares:
    their common selection, every share required).

    Returns:
      (the blocks in the single-process order, the shared settings).

    Raises:
      CocoFormatError: a file that is not a partial evaluation, partials of different
        evaluations, shares that overlap or leave images out.
    """
    parts = [load_partial(path) for path in paths]
    if not parts:
        raise CocoFormatError("no partial files to merge")
    _check_compatible(parts)
    keys = [key for part in parts for key in part.scored.keys]
    table = coco_ap.concatenate_blocks([part.scored.table for part in parts])
    images = sorted(image_id for part in parts for image_id in part.scored.scope.image_ids)
    image_index = {image_id: i for i, image_id in enumerate(images)}
    order = np.array(sorted(range(len(keys)), key=lambda b: (int(table.category[b]), image_index[keys[b][0]])),
                     np.int64)
    gt_ids = [i for part in parts for i in part.scored.gt_ids]
    dt_ids = [i for part in parts for i in part.scored.dt_ids]
    scope = dataclasses.replace(parts[0].scored.scope, image_ids=images, selected_images=images)
    counts = {name: sum(part.scored.counts[name] for part in parts) for name in SUMMED_COUNTS}
    scored = ScoredBlocks(coco_ap.take_blocks(table, order), [keys[b] for b in order],
                          [gt_ids[i] for i in coco_ap.piece_elements(table.n_gt, order)],
                          [dt_ids[i] for i in coco_ap.piece_elements(table.n_dt, order)], scope, counts)
    return scored, config_of(parts[0].meta["settings"])


def evaluate_partials(paths, *, with_matches: bool = False) -> InstanceEvaluation:
    """The evaluation of the merged partial files (:func:`merge_partials`): the single-process numbers."""
    scored, config = merge_partials(paths)
    return summarise_blocks(scored, config, with_matches=with_matches)


__all__ = ["PARTIAL_FORMAT", "settings_record", "config_of", "save_partial", "Partial", "load_partial",
           "merge_partials", "evaluate_partials"]
