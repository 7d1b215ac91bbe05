"""A ``COCOeval`` with pycocotools' API, computed by this project's evaluator.

Follows docs/protocols/boundary_ap_pq.md ("The COCOeval-compatible class").
Existing scripts switch with one import::

    from jaxseg_robust.evaluation.cocoeval import COCOeval
    E = COCOeval(cocoGt, cocoDt, "segm")      # or "boundary", as boundary-iou-api's COCOeval
    E.params.imgIds = ...; E.params.useCats = 0; ...
    E.evaluate(); E.accumulate(); E.summarize(); E.stats

``cocoGt`` / ``cocoDt`` are pycocotools ``COCO`` objects (``cocoDt`` from
``loadRes``: each result's ``area`` is used as ``loadRes`` set it) or this
project's inputs: a ground-truth path, dict or loaded ``GroundTruth``, and a
results path or list. ``params``, ``evalImgs``, ``eval`` (``precision``,
``recall``, ``scores``, ``counts``), ``ious`` and ``stats`` have pycocotools'
names, shapes and values. Bounding-box and keypoint IoU are not provided.
"""

from __future__ import annotations

import copy
import datetime

import numpy as np

from jaxseg_robust.evaluation.instances import (
    IOU_TYPES,
    InstanceEvalConfig,
    InstanceEvaluation,
    ScoredBlocks,
    prepare_instances,
    score_blocks,
)
from jaxseg_robust.data.coco_instances import collection_paused, load_ground_truth
from jaxseg_robust.evaluation.mask_counts import count_pairs
from jaxseg_robust.evaluation.partials import merge_partials, save_partial
from jaxseg_robust.metrics import coco_ap
from jaxseg_robust.metrics.masks import DEFAULT_DILATION_RATIO


class Params:
    """pycocotools' evaluation parameters for ``segm`` / ``boundary``: the same attributes and defaults.

    Attributes:
      imgIds, catIds: evaluated image and category ids (all of the ground truth by default).
      iouThrs: float64 [T]; recThrs: float64 [R]; maxDets: detections per image and category
        (three values: the summary reads them by position); areaRng: [A] ``[low, high]`` in
        pixels; areaRngLbl: their names; useCats: 1 per category, 0 category-agnostic.
    """

    def __init__(self, iouType: str = "segm"):
        self.imgIds: list = []
        self.catIds: list = []
        self.iouThrs = coco_ap.IOU_THRESHOLDS.copy()
        self.recThrs = coco_ap.RECALL_THRESHOLDS.copy()
        self.maxDets = [1, 10, 100]
        self.areaRng = [list(pair) for pair in coco_ap.AREA_RANGES]
        self.areaRngLbl = list(coco_ap.AREA_LABELS)
        self.useCats = 1
        self.iouType = iouType

    @classmethod
    def of(cls, config: InstanceEvalConfig, scope) -> Params:
        """The params of an evaluation's settings and scope (``instances.Scope``)."""
        ap_params, params = config.params, cls(config.iou_type)
        params.imgIds, params.catIds = list(scope.image_ids), list(scope.member_ids)
        params.iouThrs, params.recThrs = ap_params.ious, ap_params.recalls
        params.maxDets, params.useCats = list(ap_params.max_dets), int(config.use_cats)
        params.areaRng = [list(pair) for pair in ap_params.area_ranges]
        params.areaRngLbl = list(ap_params.area_labels)
        return params

    def ap_params(self) -> coco_ap.APParams:
        """These settings as ``coco_ap.APParams`` (ValueError on unusable ones)."""
        return coco_ap.APParams(max_dets=tuple(int(m) for m in self.maxDets),
                                iou_thresholds=tuple(float(t) for t in self.iouThrs),
                                recall_thresholds=tuple(float(r) for r in self.recThrs),
                                area_ranges=tuple((low, high) for low, high in self.areaRng),
                                area_labels=tuple(self.areaRngLbl))


def _pycocotools_coco():
    """pycocotools' ``COCO`` class, or None when pycocotools is not installed."""
    try:
        from pycocotools.coco import COCO  # noqa: PLC0415 - optional dependency
    except ImportError:
        return None
    return COCO


def _is_coco(source) -> bool:
    coco_type = _pycocotools_coco()
    return coco_type is not None and isinstance(source, coco_type)


SUMMARY_LINE = " {:<18} {} @[ IoU={:<9} | area={:>6s} | maxDets={:>3d} ] = {:0.3f}"
_SUMMARY_SETTINGS = (  # (AP or AR, IoU, area label, index into maxDets; None: 100), COCOeval's _summarizeDets
    (1, None, "all", None), (1, 0.5, "all", 2), (1, 0.75, "all", 2), (1, None, "small", 2), (1, None, "medium", 2),
    (1, None, "large", 2), (0, None, "all", 0), (0, None, "all", 1), (0, None, "all", 2), (0, None, "small", 2),
    (0, None, "medium", 2), (0, None, "large", 2),
)


def summary_lines(stats, iou_thresholds, max_dets) -> list[str]:
    """The 12 lines ``COCOeval.summarize`` prints for ``stats`` (its ``iouThrs`` range and ``maxDets``)."""
    lines = []
    for value, (ap, iou, area, max_det) in zip(stats, _SUMMARY_SETTINGS):
        title, kind = ("Average Precision", "(AP)") if ap else ("Average Recall", "(AR)")
        iou_text = f"{iou_thresholds[0]:0.2f}:{iou_thresholds[-1]:0.2f}" if iou is None else f"{iou:0.2f}"
        shown = coco_ap.COCO_AP_MAX_DETS if max_det is None else int(max_dets[max_det])
        lines.append(SUMMARY_LINE.format(title, kind, iou_text, area, shown, value))
    return lines


def _block_eval(scored: ScoredBlocks, matches: coco_ap.Matches, block: int, area: int, params: Params,
                starts: tuple[np.ndarray, np.ndarray]) -> dict:
    """pycocotools' ``evaluateImg`` result of one block and area range (``starts``: each block's first
    ground truth and first detection)."""
    table = scored.table
    gt_first, dt_first = int(starts[0][block]), int(starts[1][block])
    gts = slice(gt_first, gt_first + int(table.n_gt[block]))
    dts = slice(dt_first, dt_first + int(table.n_dt[block]))
    gt_ignore = matches.gt_ignore[area, gts].astype(int)
    gt_order = np.argsort(gt_ignore, kind="mergesort")
    gt_ids, dt_ids = scored.gt_ids[gts], scored.dt_ids[dts]
    partner = matches.dt_partner[area, :, dts]
    dt_matches = np.zeros(partner.shape)
    gt_matches = np.zeros((partner.shape[0], gt_order.size))
    position = np.empty(gt_order.size, np.int64)
    position[gt_order] = np.arange(gt_order.size)
    for t, d in zip(*np.nonzero(partner >= 0)):  # rank order within each threshold: the last match wins
        dt_matches[t, d] = gt_ids[partner[t, d]]
        gt_matches[t, position[partner[t, d]]] = dt_ids[d]
    image_id, category_id = scored.keys[block]
    return {"image_id": image_id, "category_id": category_id, "aRng": params.areaRng[area],
            "maxDet": params.maxDets[-1], "dtIds": list(dt_ids), "gtIds": [gt_ids[g] for g in gt_order],
            "dtMatches": dt_matches, "gtMatches": gt_matches, "dtScores": table.dt_score[dts].tolist(),
            "gtIgnore": np.array(gt_ignore[gt_order].tolist()),  # as the reference builds it (float when empty)
            "dtIgnore": matches.dt_ignore[area, :, dts]}


def _eval_images(scored: ScoredBlocks, matches: coco_ap.Matches, params: Params) -> list:
    """``evalImgs``: category-major, then area range, then image (None where a block is empty)."""
    categories = {c: k for k, c in enumerate(scored.scope.category_ids)}
    images = {i: n for n, i in enumerate(scored.scope.image_ids)}
    n_area, n_image = len(params.areaRng), len(images)
    out = [None] * (len(categories) * n_area * n_image)
    starts = (coco_ap.piece_starts(scored.table.n_gt), coco_ap.piece_starts(scored.table.n_dt))
    for block, (image_id, category_id) in enumerate(scored.keys):
        for area in range(n_area):
            out[(categories[category_id] * n_area + area) * n_image + images[image_id]] = (
                _block_eval(scored, matches, block, area, params, starts))
    return out


def _json_ready(value):
    """A value of an evalImgs entry as JSON holds it (arrays as nested lists, NumPy scalars as numbers)."""
    if isinstance(value, (np.ndarray, np.generic)):
        return value.tolist()
    if isinstance(value, list):
        return [_json_ready(item) for item in value]
    return value


def eval_images_json(evaluation: InstanceEvaluation) -> list[dict]:
    """The ``evalImgs`` of a COCO evaluation (e.g. merged partials) as JSON-ready dicts, empty blocks left out.

    The matching is redone with each detection's partner (``coco_ap.match_blocks``); the entries are
    :class:`COCOeval`'s, in its order, arrays as nested lists.
    """
    config, scored = evaluation.config, evaluation.blocks
    if config.dataset != "coco":
        raise ValueError(f"evalImgs are COCOeval's; a {config.dataset!r} evaluation has none")
    matches = coco_ap.match_blocks(scored.table, config.params, with_partners=True)
    entries = _eval_images(scored, matches, Params.of(config, scored.scope))
    return [{key: _json_ready(value) for key, value in entry.items()} for entry in entries if entry is not None]


def _block_ious(scored: ScoredBlocks) -> dict:
    """``ious``: (image id, category id) -> float64 [D, G] similarities (detections by score, capped)."""
    table = scored.table
    starts = coco_ap.piece_starts(table.n_dt * table.n_gt)
    out = {}
    for block, key in enumerate(scored.keys):
        n_dt, n_gt = int(table.n_dt[block]), int(table.n_gt[block])
        out[key] = table.ious[starts[block]:starts[block] + n_dt * n_gt].reshape(n_dt, n_gt) if n_dt and n_gt else []
    return out


class COCOeval:
    """pycocotools' ``COCOeval`` (and boundary-iou-api's, with ``iouType="boundary"``) on this evaluator.

    Args:
      cocoGt: pycocotools ``COCO`` of the ground truth, or a ground-truth path / dict / ``GroundTruth``.
      cocoDt: pycocotools ``COCO`` of the results (``cocoGt.loadRes(...)``), or a results path / list.
      iouType: ``"segm"`` (mask AP) or ``"boundary"`` (Boundary AP).
      dilation_ratio: Boundary AP's band width relative to the image diagonal.
      progress, mask_path, chunk_masks: as ``InstanceEvalConfig`` (no progress display by default).
    """

    def __init__(self, cocoGt=None, cocoDt=None, iouType: str = "segm",
                 dilation_ratio: float = DEFAULT_DILATION_RATIO, *, progress: str = "none",
                 mask_path: str = "auto", chunk_masks: int = 64):
        if iouType not in IOU_TYPES:
            raise ValueError(f"iouType {iouType!r} is not provided; this COCOeval evaluates {IOU_TYPES}")
        self.cocoGt, self.cocoDt = cocoGt, cocoDt
        self.params = Params(iouType)
        self.dilation_ratio = dilation_ratio
        self._run_settings = {"progress": progress, "mask_path": mask_path, "chunk_masks": chunk_masks}
        self.evalImgs: list = []
        self.eval: dict = {}
        self.stats = np.zeros(0)
        self.ious: dict = {}
        self._gt = None if cocoGt is None else load_ground_truth(cocoGt.dataset if _is_coco(cocoGt) else cocoGt)
        self._scored: ScoredBlocks | None = None
        self._merged: ScoredBlocks | None = None
        if self._gt is not None:
            self.params.imgIds = sorted(self._gt.image_ids)
            self.params.catIds = sorted(self._gt.category_ids)

    @classmethod
    def from_partials(cls, paths) -> COCOeval:
        """The evaluation of the merged partial files of several processes (:meth:`save_partial`).

        Its ``evaluate`` / ``accumulate`` / ``summarize`` give the single-process numbers; its params
        are those the partials were evaluated with.
        """
        scored, config = merge_partials(paths)
        if config.dataset != "coco":
            raise ValueError(f"COCOeval merges COCO evaluations; these partials are {config.dataset!r} ones "
                             "(merge them with jaxseg_robust.evaluation.partials.evaluate_partials)")
        evaluator = cls(iouType=config.iou_type, dilation_ratio=config.dilation_ratio)
        evaluator.params = Params.of(config, scored.scope)
        evaluator._merged = scored
        return evaluator

    def _config(self) -> InstanceEvalConfig:
        p = self.params
        return InstanceEvalConfig(iou_type=p.iouType, dilation_ratio=self.dilation_ratio, ap_params=p.ap_params(),
                                  image_ids=tuple(p.imgIds), category_ids=tuple(p.catIds), use_cats=bool(p.useCats),
                                  **self._run_settings)

    def _score(self, config: InstanceEvalConfig) -> ScoredBlocks:
        if self._merged is not None:
            return self._merged
        if self._gt is None or self.cocoDt is None:
            raise ValueError("COCOeval needs cocoGt and cocoDt to evaluate")
        from_coco = _is_coco(self.cocoDt)
        results = self.cocoDt.dataset["annotations"] if from_coco else self.cocoDt
        with collection_paused():  # as evaluate_instances
            prepared = prepare_instances(self._gt, results, config, area_field=from_coco)
            return score_blocks(prepared, count_pairs(prepared.works, config.count_settings), config)

    def evaluate(self) -> None:
        """Per-image evaluation of ``params``' images and categories: fills ``evalImgs`` and ``ious``.

        As the reference, first sorts ``params.imgIds`` (unique), ``catIds`` (unique, per-category
        evaluations) and ``maxDets``.
        """
        p = self.params
        p.imgIds = list(np.unique(p.imgIds))
        if p.useCats:
            p.catIds = list(np.unique(p.catIds))
        p.maxDets = sorted(p.maxDets)
        config = self._config()
        self._paramsEval = copy.deepcopy(self.params)
        self._evaluated_config = config
        self._scored = self._score(config)
        self._matches = coco_ap.match_blocks(self._scored.table, config.params, with_partners=True)
        self._ap_params = config.params
        self.ious = _block_ious(self._scored)
        self.evalImgs = _eval_images(self._scored, self._matches, self._paramsEval)

    def accumulate(self) -> None:
        """Fills ``eval``: ``precision`` [T, R, K, A, M], ``recall`` [T, K, A, M], ``scores``, ``counts``."""
        if self._scored is None:
            raise RuntimeError("Please run evaluate() first")
        n_categories = len(self._scored.scope.category_ids)
        acc = coco_ap.accumulate(self._scored.table, self._matches, n_categories, self._ap_params, with_scores=True)
        self.eval = {"params": self._paramsEval, "counts": list(acc.precision.shape),
                     "date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M:%S"),
                     "precision": acc.precision, "recall": acc.recall, "scores": acc.scores}

    def summarize(self) -> None:
        """Computes ``stats`` (the 12 summary numbers) and prints pycocotools' summary lines."""
        if not self.eval:
            raise RuntimeError("Please run accumulate() first")
        acc = coco_ap.Accumulated(self.eval["precision"], self.eval["recall"])
        self.stats = np.array(list(coco_ap.coco_summary(acc, self._ap_params).values()))
        print("\n".join(summary_lines(self.stats, self._paramsEval.iouThrs, self._paramsEval.maxDets)))

    def save_partial(self, path, inputs: dict | None = None):
        """Saves this process's evaluated share (after :meth:`evaluate`) for :meth:`from_partials`."""
        if self._scored is None:
            raise RuntimeError("Please run evaluate() first")
        return save_partial(path, self._scored, self._evaluated_config, inputs)

    def __str__(self) -> str:
        if not len(self.stats):
            return "COCOeval (not summarized)"
        return "\n".join(summary_lines(self.stats, self._paramsEval.iouThrs, self._paramsEval.maxDets))


__all__ = ["Params", "COCOeval", "SUMMARY_LINE", "summary_lines", "eval_images_json"]
