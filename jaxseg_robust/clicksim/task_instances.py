"""The tasks of the clickability evaluation as runner instances: one per ``full_stem`` (first, fn and fp rounds).

Reference: docs/protocols/rclicks.md §1.2 (error masks, previous masks) and "Clickability evaluation"
(C-R ``clickmap.py`` ``Clicks``, ``scripts/evaluate_click_models.py``).

A task instance is the image of its instance with *task labels* in ``gt`` (int8[H, W]), so that the one
batch program carries both masks a click model reads, the object ``G`` and the error region ``R``:

  ===== ============================================================
  label meaning
  ===== ============================================================
  -1    ignore (only in first-round tasks, whose labels are the instance's own ``gt``)
  0     neither object nor error region
  1     error region on the object  (``R ∧ G``)
  2     object outside the error region (``G ∧ ¬R``)
  3     error region outside the object (``R ∧ ¬G``)
  ===== ============================================================

``G = label ∈ {1, 2}``, ``R = label ∈ {1, 3}`` (`task_object`, `task_region`). A first-round task is the
instance itself (``R = G = gt == 1``, its key unchanged); an fn / fp task has the key
``(dataset, full_stem)`` and loads its previous mask ``<folder>/<full_stem>.png`` (red channel / 255,
`clicksim.previous_mask`): ``E = G·(1 − P)`` (fn) or ``(1 − G)·P`` (fp), float32, and
``R = uint8(255·E) ≠ 0`` — the binary region the DT baseline reads; for a binary previous mask (0 / 255)
it is ``E`` itself, and every click model sees the authors' error mask.
"""

from __future__ import annotations

import functools
import os
import pathlib
from collections.abc import Mapping, Sequence

import numpy as np

from jaxseg_robust.clicksim.previous_mask import check_previous_mask, previous_mask_path, read_previous_mask
from jaxseg_robust.clicksim.user_clicks import ClickTask
from jaxseg_robust.data.instances import Instance, InstanceError, InstanceRef
from jaxseg_robust.data.masks_io import MaskReadError

__all__ = ["TASK_NUM_CLASSES", "error_region", "task_labels", "task_object", "task_region", "task_members",
           "require_task_masks"]

TASK_NUM_CLASSES = 4  # labels 0..3 of the table in the module docstring (and -1)
_REGION_ON_OBJECT, _OBJECT_ONLY, _REGION_OFF_OBJECT = 1, 2, 3


def task_object(labels: np.ndarray) -> np.ndarray:
    """bool[..., H, W]: the object ``G`` of task labels (labels 1 and 2)."""
    labels = np.asarray(labels)
    return (labels == _REGION_ON_OBJECT) | (labels == _OBJECT_ONLY)


def task_region(labels: np.ndarray) -> np.ndarray:
    """bool[..., H, W]: the error region ``R`` of task labels (labels 1 and 3)."""
    labels = np.asarray(labels)
    return (labels == _REGION_ON_OBJECT) | (labels == _REGION_OFF_OBJECT)


def task_labels(object_mask: np.ndarray, region: np.ndarray) -> np.ndarray:
    """int8[H, W] task labels of the object ``G`` and the error region ``R`` (bool[H, W] each)."""
    object_mask, region = np.asarray(object_mask, bool), np.asarray(region, bool)
    labels = np.zeros(object_mask.shape, np.int8)
    labels[object_mask & region] = _REGION_ON_OBJECT
    labels[object_mask & ~region] = _OBJECT_ONLY
    labels[~object_mask & region] = _REGION_OFF_OBJECT
    return labels


def error_region(object_mask: np.ndarray, previous: np.ndarray, click_type: str) -> np.ndarray:
    """bool[H, W]: ``uint8(255·E) ≠ 0`` of the error mask ``E`` of an fn or fp round (§1.2, float32 as the
    authors' code computes it).

    Args:
      object_mask: bool[H, W] the object ``G`` (ignore pixels as background).
      previous: float32[H, W] the previous mask ``P`` in [0, 1].
      click_type: ``"fn"`` (``E = G·(1 − P)``) or ``"fp"`` (``E = (1 − G)·P``).
    """
    gt = np.asarray(object_mask, np.float32)
    previous = np.asarray(previous, np.float32)
    if click_type == "fn":
        error = gt * (np.float32(1.0) - previous)
    elif click_type == "fp":
        error = (np.float32(1.0) - gt) * previous
    else:
        raise ValueError(f"click_type must be 'fn' or 'fp', got {click_type!r}")
    return (error * np.float32(255.0)).astype(np.uint8) != 0


def _load_round_task(member, task: ClickTask, previous_path: pathlib.Path) -> Instance:
    """The fn / fp task instance of ``member`` (labels of its object and the round's error region)."""
    instance = member.load()
    previous = read_previous_mask(previous_path)
    if previous.shape != tuple(instance.size):
        raise MaskReadError(f"{previous_path}: previous mask is {previous.shape[0]}x{previous.shape[1]} (HxW), "
                            f"the image of {instance.name} is {instance.size[0]}x{instance.size[1]}")
    object_mask = np.asarray(instance.gt) == 1
    region = error_region(object_mask, previous, task.click_type)
    if not region.any():
        raise InstanceError(f"{instance.dataset}/{task.full_stem}: the {task.click_type} error region of "
                            f"{previous_path} and the ground truth is empty")
    return Instance(id=task.full_stem, image=instance.image, gt=task_labels(object_mask, region),
                    dataset=instance.dataset, source_paths=tuple(instance.source_paths) + (str(previous_path),),
                    num_classes=TASK_NUM_CLASSES)


def task_members(instances: Sequence, tasks: Mapping[tuple[str, str], Sequence[ClickTask]],
                 previous_masks: str | os.PathLike | None) -> tuple[list, dict]:
    """The runner members of the tasks and the task of each member's key.

    Args:
      instances: the run's `Instance`s / `InstanceRef`s.
      tasks: ``{instance key: its ClickTasks}`` (`clicksim.user_clicks.click_tasks`).
      previous_masks: the folder of the fn / fp previous masks; None: first-round tasks only.
    Returns:
      (members: the first-round task's instance itself, an `InstanceRef` per fn / fp task, in instance then
      CSV order; ``{member key: ClickTask}``).
    Raises:
      ValueError: a previous mask is missing, unreadable or not of its instance's size (naming the file,
      `check_previous_mask`; only headers are read), or a task key is taken twice.
    """
    members, by_key = [], {}
    for member in instances:
        for task in tasks.get(member.key, ()):
            if task.click_type == "first":
                one = member
            elif previous_masks is None:
                continue
            else:
                path = previous_mask_path(previous_masks, task.full_stem)
                check_previous_mask(path, member.size)
                height, width = member.size
                one = InstanceRef(id=task.full_stem, height=height, width=width, dataset=member.dataset,
                                  loader=functools.partial(_load_round_task, member, task, path),
                                  source_paths=tuple(member.source_paths) + (str(path),))
            if one.key in by_key:
                raise ValueError(f"task {one.dataset}/{one.id} ({task.click_type}) has the key of another task")
            members.append(one)
            by_key[one.key] = task
    return members, by_key


def require_task_masks(instance: Instance) -> None:
    """The runner's check of a loaded task instance: it has object and error-region pixels.

    Raises:
      InstanceError: naming the instance.
    """
    if not task_object(instance.gt).any():
        raise InstanceError(f"{instance.name}: gt has no object pixel (value 1)")
    if not task_region(instance.gt).any():
        raise InstanceError(f"{instance.name}: the task has no error-region pixel")
