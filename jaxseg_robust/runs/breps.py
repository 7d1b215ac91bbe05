"""`BrepsSpec`: BREPS box robustness of a model that takes boxes (SAM, MobileSAM, SAM 2, SAM-HQ) as a run spec.

Modes (docs/protocols/breps.md §4, defaults = the reference code):
  minmax  (default) the MIN and the MAX box attacks on one embedding per image:
          IoU-Tight/Min/Max/Δ@BBox per dataset;
  min, max  one attack (with IoU-Tight@BBox);
  tight   the tight GT box with single-mask output (the jitter/user scripts' baseline);
  jitter  the 10 jittered tight boxes of §4.8 (seed ``seed``, shift ``jitter_pow``);
  user    real user boxes (§4.9) from ``user_boxes`` (a CSV ``image_id,x1,y1,x2,y2[,user]``,
          evaluation-frame pixels, image_id = the instance id or ``dataset/id``) or
          ``user_box_masks`` (the BREPS layout: one PNG per box, ``<stem>_1_<user>.png``);
          instances without a user box are not evaluated.

Records: the batch program's outputs (`jaxseg_robust.attacks.fixed_boxes.make_box_batch_fn`),
with the per-iterate trajectory (boxes, losses, IoU/BIoU per step) when
``record_trajectory``, and ``source`` (the image file and evaluated size); the
attacks' best-box masks go to ``masks/``; user mode: per user box its IoU,
BIoU, resized-frame IoU, box and user id.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import ClassVar

import numpy as np

from jaxseg_robust.runs.loading import LoadedModel, model_config, refuse_click_only, resolve_threshold
from jaxseg_robust.runs.protocol import ProtocolSpec, RunPlan, RunTables, Say
from jaxseg_robust.runs.spec import RunError

MODES = ("minmax", "min", "max", "tight", "jitter", "user")
ATTACK_MODES = ("minmax", "min", "max")
BOX_FRAMES = ("evaluation", "resized")
USER_SLOT_MULTIPLE = 16  # user-box slots per instance are rounded up to this (fewer compiled shapes)
DEFAULT_LONG_SIDE = 1024  # SAM's input side: the prompt masks' resized frame of families without one
# BrepsConfig's parameter names as the spec's fields (the attack's messages name its own parameters)
CONFIG_FIELDS = (("n_steps", "{n_opt_steps}"), ("lr_mult", "{lr_mult}"), ("lam ", "{lambda_mult} "),
                 ("thr ", "{thresh} "))


@dataclasses.dataclass(frozen=True)
class BrepsSpec(ProtocolSpec):
    """The BREPS protocol's settings (module docstring; docs/protocols/breps.md).

    Attributes:
      mode: "minmax", "min", "max", "tight", "jitter" or "user".
      n_opt_steps: attacks: evaluated iterates per attack (the tight box + n-1 Adam updates).
      lr_mult: attacks: Adam lr = lr_mult * sqrt(H^2 + W^2) / (1024 sqrt 2), pixels.
      lambda_mult: attacks: weight of the Gamma realism term over CIoU.
      thresh: probability threshold of the attack's masks (None: the model family's).
      clip_and_order: attacks: order and clip the box to the image after every update (the paper's variant).
      record_trajectory: attacks: store the per-step boxes, losses and IoUs in the records.
      box_frame: tight / jitter / user_box_masks: boxes drawn in the image frame ("evaluation") or in
        SAM's 1024-resized frame ("resized", as the reference scripts).
      integer_boxes: tight / jitter: truncate box coordinates to int as the reference.
      jitter_pow: jitter: largest shift as a fraction of the box size (> 0).
      seed: jitter: Python random seed, reset for every image as the reference.
      user_boxes: user mode: path of a CSV ``image_id,x1,y1,x2,y2[,user]`` in image pixels.
      user_box_masks: user mode: folder of BREPS prompt PNGs ``<image stem>_1_<user>.png``.
    """

    command: ClassVar[str] = "breps"
    default_batch_size: ClassVar[int] = 4

    mode: str = "minmax"
    n_opt_steps: int = 50
    lr_mult: float = 9.0
    lambda_mult: float = 0.1
    thresh: float | None = None
    clip_and_order: bool = False
    record_trajectory: bool = True
    box_frame: str = "evaluation"
    integer_boxes: bool = True
    jitter_pow: float = 0.3
    seed: int = 42
    user_boxes: str | None = None
    user_box_masks: str | None = None

    def check(self) -> None:
        """Raises `RunError` naming the field for a bad value or combination, before anything is loaded."""
        from jaxseg_robust.attacks.boxes import BrepsConfig  # noqa: PLC0415

        if self.mode not in MODES:
            raise RunError(f"{{mode}} must be one of {', '.join(MODES)}; got {self.mode!r}")
        if self.box_frame not in BOX_FRAMES:
            raise RunError(f"{{box_frame}} must be one of {', '.join(BOX_FRAMES)}; got {self.box_frame!r}")
        try:
            BrepsConfig(mode="min", n_steps=self.n_opt_steps, lr_mult=self.lr_mult, lam=self.lambda_mult,
                        thr=0.5 if self.thresh is None else self.thresh)
        except ValueError as error:
            text = str(error)
            for name, field in CONFIG_FIELDS:
                text = text.replace(name, field)
            raise RunError(text) from None
        self.check_user_sources()
        if not 0.0 < self.jitter_pow:
            raise RunError(f"{{jitter_pow}} must be > 0; got {self.jitter_pow}")

    def check_user_sources(self) -> None:
        """User mode takes exactly one box source, the other modes none.

        Raises:
          RunError: naming ``{user_boxes}`` / ``{user_box_masks}`` and ``{mode}``.
        """
        given = [field for field, value in (("{user_boxes}", self.user_boxes),
                                            ("{user_box_masks}", self.user_box_masks)) if value]
        if self.mode == "user":
            if len(given) != 1:
                raise RunError("{mode} user needs exactly one of {user_boxes} CSV or {user_box_masks} DIR")
            if self.user_boxes and self.box_frame == "resized":
                raise RunError("{user_boxes} CSV boxes are in image pixels; {box_frame} resized applies to "
                               "{user_box_masks} only")
        elif given:
            raise RunError(f"{given[0]} needs {{mode}} user (got {{mode}} {self.mode})")

    def manifest_config(self, model: LoadedModel, thresh: float, user_fingerprint: str | None = None) -> dict:
        """The run configuration recorded in (and compared on resume with) the manifest: only the mode's
        settings (``thresh``: the resolved threshold; ``user_fingerprint``: the user box source's)."""
        config = model_config(self.command, model, mode=self.mode)
        if self.mode in ATTACK_MODES:
            config.update(n_opt_steps=self.n_opt_steps, lr_mult=self.lr_mult, lambda_mult=self.lambda_mult,
                          thresh=thresh, clip_and_order=self.clip_and_order,
                          record_trajectory=self.record_trajectory)
            return config
        config.update(box_frame=self.box_frame)
        if self.mode in ("tight", "jitter"):
            config.update(integer_boxes=self.integer_boxes)
        if self.mode == "jitter":
            config.update(jitter_pow=self.jitter_pow, seed=self.seed)
        if self.mode == "user":
            config.update(user_boxes=user_fingerprint)
        return config

    def box_program(self, model: LoadedModel, thresh: float, run_dir, say: Say):
        """(timed batch program, finalize) of the attack, tight and jitter modes
        (`jaxseg_robust.attacks.fixed_boxes.make_box_batch_fn`); the attacks' finalize stores their masks."""
        from jaxseg_robust.attacks.fixed_boxes import make_box_batch_fn  # noqa: PLC0415

        options = {"max_shift_frac": self.jitter_pow, "seed": self.seed} if self.mode == "jitter" else None
        attack = self.mode in ATTACK_MODES
        try:
            program = make_box_batch_fn(
                model.segmenter, model.params, mode=self.mode, n_steps=self.n_opt_steps, lr_mult=self.lr_mult,
                lam=self.lambda_mult, thr=thresh, clip_and_order=self.clip_and_order,
                record_trajectory=self.record_trajectory, box_frame=self.box_frame,
                integer_boxes=self.integer_boxes, jitter_options=options, return_mask=attack, announce=say)
        except ValueError as error:
            raise RunError(str(error)) from None
        return program.with_timing(), (store_masks_finalize(run_dir, self.mode) if attack else None)

    def plan(self, model: LoadedModel, instances: Sequence, run_dir, say: Say) -> RunPlan:
        """The timed `BatchProgram` of the mode; user mode runs only the instances with user boxes (the
        others are named in a note)."""
        from jaxseg_robust.data.instances import require_object  # noqa: PLC0415
        from jaxseg_robust.reports.sources import with_image_source  # noqa: PLC0415

        refuse_click_only(model, f"breps {{mode}} {self.mode}")
        thresh = resolve_threshold(self.thresh, model)
        if self.mode != "user":
            program, finalize = self.box_program(model, thresh, run_dir, say)
            return RunPlan(instances, program, self.manifest_config(model, thresh), model.fingerprint,
                           finalize=with_image_source(finalize), check=require_object)
        boxes, fingerprint, notes = read_user_boxes(self, instances, user_box_long_side(model))
        for note in notes:
            say(f"warning: {note}")
        without = len(instances) - len(boxes)
        if without:
            say(f"note: {without} instance(s) have no user box and are not evaluated")
        try:
            program = user_box_program(model, boxes, self.box_frame, say)
        except ValueError as error:
            raise RunError(str(error)) from None
        return RunPlan([instance for instance in instances if instance.key in boxes], program,
                       self.manifest_config(model, thresh, fingerprint), model.fingerprint,
                       finalize=with_image_source(user_box_finalize(boxes, self.box_frame)), check=require_object)

    def summarize(self, run_dir, plan: RunPlan, say: Say) -> RunTables:
        """The per-dataset BREPS table of the mode (`jaxseg_robust.reports.breps`)."""
        from jaxseg_robust.reports.breps import breps_table, load_run_records, to_csv, to_markdown  # noqa: PLC0415

        table = breps_table(load_run_records(run_dir), self.mode)
        return RunTables(to_markdown(table), to_csv(table))


# ---- user boxes ----------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class InstanceBoxes:
    """The user boxes of one instance: ``boxes`` f32[n, 4] (x1, y1, x2, y2 in the spec's ``box_frame``,
    pixels) and the user id of each."""

    boxes: np.ndarray
    users: tuple[str, ...]


def user_box_long_side(model: LoadedModel) -> int:
    """The input side of the model's resized frame (SAM family), which gives the prompt masks'
    resized-frame boxes; other families take boxes in the evaluation frame only (1024: the resized
    boxes are then unused)."""
    from jaxseg_robust.attacks.fixed_boxes import has_resized_frame  # noqa: PLC0415

    return int(model.segmenter.config.image_size) if has_resized_frame(model.segmenter) else DEFAULT_LONG_SIDE


def _read_box_source(spec: BrepsSpec, long_side: int) -> tuple[list, str]:
    """(the `jaxseg_robust.data.user_boxes` boxes of the spec's source, its fingerprint)."""
    from jaxseg_robust.data.user_boxes import UserBoxError, read_user_box_masks, read_user_boxes_csv  # noqa: PLC0415
    from jaxseg_robust.runner.fingerprints import file_sha256, fingerprint_path  # noqa: PLC0415

    try:
        if spec.user_boxes:
            return read_user_boxes_csv(spec.user_boxes), file_sha256(spec.user_boxes)
        return (read_user_box_masks(spec.user_box_masks, resized_long_side=long_side),
                fingerprint_path(spec.user_box_masks))
    except (UserBoxError, OSError) as error:
        raise RunError(str(error)) from None


def read_user_boxes(spec: BrepsSpec, instances: Sequence,
                    long_side: int = DEFAULT_LONG_SIDE) -> tuple[dict, str, list[str]]:
    """Reads the spec's ``user_boxes`` / ``user_box_masks`` and assigns the boxes to ``instances``.

    ``long_side`` is the model's input side: prompt masks' resized-frame boxes
    (``box_frame="resized"``) are taken from the mask resized to it, as the reference does.

    Returns:
      (instance key -> `InstanceBoxes`, fingerprint of the box source,
      warnings: boxes of images that are not instances).

    Raises:
      RunError: malformed files, ambiguous image ids, no instance with boxes.
    """
    by_id: dict[str, list] = {}
    for instance in instances:
        by_id.setdefault(instance.id, []).append(instance.key)
        by_id.setdefault(f"{instance.dataset}/{instance.id}", []).append(instance.key)
    boxes, fingerprint = _read_box_source(spec, long_side)
    grouped: dict[tuple, list] = {}
    unknown: dict[str, int] = {}
    for box in boxes:
        keys = by_id.get(box.image_id, [])
        if len(keys) > 1:
            raise RunError(f"{box.source}: image id {box.image_id!r} names {len(keys)} instances "
                           f"({', '.join('/'.join(k) for k in keys)}); write it as dataset/id")
        if not keys:
            unknown[box.image_id] = unknown.get(box.image_id, 0) + 1
            continue
        value = box.box_resized if spec.box_frame == "resized" else box.box
        grouped.setdefault(keys[0], []).append((value, box.user))
    if not grouped:
        raise RunError("no user box belongs to an instance of the datasets (image_id = instance id, "
                       "or dataset/id)")
    notes = []
    if unknown:
        shown = ", ".join(sorted(unknown)[:5]) + (" ..." if len(unknown) > 5 else "")
        notes.append(f"{sum(unknown.values())} user box(es) of {len(unknown)} image id(s) that are not "
                     f"instances were ignored: {shown}")
    assigned = {key: InstanceBoxes(np.asarray([v for v, _ in items], np.float32),
                                   tuple(u for _, u in items)) for key, items in grouped.items()}
    return assigned, fingerprint, notes


def user_box_program(model: LoadedModel, user_boxes: Mapping, box_frame: str, say: Say):
    """The timed `BatchProgram` of the user boxes (`jaxseg_robust.attacks.fixed_boxes.fixed_box_protocol`):
    each instance's boxes by its seed, in slots rounded up to `USER_SLOT_MULTIPLE`.

    Raises:
      RunError: two instances with the same seed.
    """
    from jaxseg_robust.attacks.fixed_boxes import fixed_box_protocol  # noqa: PLC0415
    from jaxseg_robust.data.buckets import instance_seed  # noqa: PLC0415
    from jaxseg_robust.runner.program import BatchProgram  # noqa: PLC0415

    by_seed = {}
    for key, boxes in user_boxes.items():
        seed = instance_seed(key)
        if seed in by_seed:
            raise RunError(f"instance seed collision for {'/'.join(key)}; rename one instance")
        by_seed[seed] = boxes.boxes
    most = max(len(boxes.boxes) for boxes in user_boxes.values())
    protocol = fixed_box_protocol(model.segmenter, "user", box_frame=box_frame, user_boxes=by_seed,
                                  slots=-(-most // USER_SLOT_MULTIPLE) * USER_SLOT_MULTIPLE)
    return BatchProgram(model.segmenter, model.params, protocol, announce=say, timed=True)


def user_box_finalize(boxes_by_key: Mapping, box_frame: str):
    """The user mode's ``finalize``: the instance's own boxes only (trimmed from the padded slots), with user ids."""

    def finalize(instance, outputs) -> dict:
        entry = boxes_by_key[instance.key]
        n = len(entry.boxes)
        payload = {name: np.asarray(outputs[name])[:n] for name in ("iou", "biou", "iou_resized", "boxes")}
        payload["users"] = list(entry.users)
        payload["box_frame"] = box_frame
        return payload

    return finalize


def store_masks_finalize(run_dir, mode: str):
    """The attack modes' ``finalize``: each attack's best-box mask into ``RUN_DIR/masks/<dataset>/<id>.<attack>.png``.

    The payload is what it was without the masks (`jaxseg_robust.reports.artifacts.store_masks`);
    the masks are an extra output of the same program, so the recorded numbers do not change.
    """
    from jaxseg_robust.reports.artifacts import store_masks  # noqa: PLC0415

    def finalize(instance, outputs) -> dict:
        return store_masks(run_dir, instance, outputs, top_level=None if mode == "minmax" else mode)

    return finalize
