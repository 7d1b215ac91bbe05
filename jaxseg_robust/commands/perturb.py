"""`jaxseg-robust perturb`: the L∞ image-perturbation battery on a dense or prompted model, resumable.

Runs the attacks of docs/protocols/perturbation.md (PAdam-CE/Cos, the
four SEA losses, DAG-0.001/0.003, PDPGD, ALMA prox, plus the clean image as a
candidate) on every instance of the datasets, through
`jaxseg_robust.runner.engine.run`: one append-only record per instance (the
per-candidate confusion matrices, forward/backward counts), so a killed run
resumes where it stopped and the worst case per image can be recomputed
offline. At the end it prints the clean vs robust table and writes the
report of `jaxseg_robust.reports.perturb` into ``RUN_DIR/report``.

Models (``--model``):
  * a converted dense model directory (``python -m ports dense u2netp|deeplabv3``):
    images -> per-pixel logits;
  * a SAM-family zoo name or converted directory (SAM, MobileSAM, SAM-HQ) with
    fixed prompts: one tight box of the GT object per image (BREPS's inclusive
    tight box); the image is perturbed, the mask is scored
    (`jaxseg_robust.models.dense.prompted`). ``--random-init`` gives a zoo
    name random weights (smoke runs only).

Labels: ``--labels gt`` (default) scores against the datasets' binary masks
(object = class 1; the ignore band is void) and needs a two-class model;
``--labels prediction`` scores against the model's own clean prediction
(any number of classes, e.g. a 21-class DeepLabV3 on binary datasets).
ALMA prox needs a model with >= 3 classes (its DLR constraint uses the
top-3 logits), so it is refused for binary models.

Images are attacked at their own size (no spatial padding, spec §10.5; one
compilation per attack and image size); ``--max-side`` (default 2048, the
size guard of every command, 0 = none) downsizes larger images first
(Pillow bilinear, masks nearest), which changes the threat model to the
downsized image; the record of such an instance says so (``"resized"``:
original size, scale, how results map back).
"""

from __future__ import annotations

import argparse
import dataclasses
import fractions
import os
import pathlib
import sys
from typing import Any, NamedTuple

import numpy as np

from jaxseg_robust.cli import EXIT_FAILURE, EXIT_OK
from jaxseg_robust.commands.prompt_common import (
    DEFAULT_MAX_SIDE,
    MAX_SIDE_HELP,
    CommandError,
    add_process_arguments,
    start_processes,
)

ATTACK_GROUPS = {
    "padam-ce": ("padam_ce",), "padam-cos": ("padam_cos",), "padam": ("padam_ce", "padam_cos"),
    "sea": ("sea_mce", "sea_bce", "sea_jsd", "sea_msl"), "sea-mce": ("sea_mce",), "sea-bce": ("sea_bce",),
    "sea-jsd": ("sea_jsd",), "sea-msl": ("sea_msl",), "dag": ("dag_0.001", "dag_0.003"),
    "dag-0.001": ("dag_0.001",), "dag-0.003": ("dag_0.003",), "alma-prox": ("alma_prox",), "pdpgd": ("pdpgd",),
}
DEFAULT_ATTACKS = "padam-ce,padam-cos,sea,dag,alma-prox,pdpgd"
LABEL_MODES = ("gt", "prediction")
EXAMPLE_KEYS = ("image", "adversarial", "labels", "valid", "clean_pred", "adv_pred")

EPILOG = """\
examples:
  jaxseg-robust perturb --model ~/models/u2netp --datasets GrabCut,Berkeley \\
      --data-root ~/datasets --attacks padam-ce,padam-cos,sea,dag,pdpgd --eps 8/255 --out runs/u2netp
  jaxseg-robust perturb --model mobile_sam --datasets DAVIS --data-root ~/datasets \\
      --attacks padam-cos,sea --out runs/mobile_sam_box      (tight GT box as the fixed prompt)
  jaxseg-robust perturb --model ~/models/deeplabv3 --labels prediction --datasets my_photos/ \\
      --attacks dag,alma-prox,pdpgd --out runs/deeplab
  jaxseg-robust perturb --out runs/u2netp --report-only      (rebuild tables and plots)

attacks: padam-ce, padam-cos (or padam), sea (= sea-mce, sea-bce, sea-jsd, sea-msl), dag
(= dag-0.001, dag-0.003), alma-prox, pdpgd, or all. The clean image is always a candidate.
--datasets: registered names (GrabCut, Berkeley, DAVIS, COCO_MVal, TETRIS) found under
--data-root / $JAXSEG_ROBUST_DATA, or folders with images/ + masks/ (mask rule --mask-rule).
Rerunning the same command resumes; a changed config is refused unless --allow-manifest-mismatch.
exit codes: 0 every instance ok, 1 some instances failed (listed), 2 bad arguments / nothing ran.
"""


def register(subparsers) -> None:
    """Adds the ``perturb`` sub-command."""
    parser = subparsers.add_parser(
        "perturb", help="L∞ image-perturbation attack battery (ECCV'24) on a dense or prompted model",
        description="Attack a segmentation model with the L∞ image-perturbation battery of Halmosi et al. "
        "(ECCV'24): PAdam, SEA (APGD), DAG, ALMA prox, PDPGD and their per-image worst case; resumable.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="converted dense model dir, or SAM-family zoo name / converted dir")
    parser.add_argument("--random-init", action="store_true",
                        help="give a SAM-family zoo name random weights (smoke runs only)")
    parser.add_argument("--attacks", default=DEFAULT_ATTACKS, help="comma list (default %(default)s; or 'all')")
    parser.add_argument("--eps", default="8/255", help="L∞ radius in image units, e.g. 8/255 or 0.03 (default %(default)s)")
    parser.add_argument("--datasets", help="comma list of dataset names or image/mask folders")
    parser.add_argument("--data-root", default=None, help="datasets root (default $JAXSEG_ROBUST_DATA)")
    parser.add_argument("--mask-rule", default=">128", help="mask rule of plain folders (default %(default)s)")
    parser.add_argument("--on-bad-pair", choices=("fail", "skip", "error"), default="fail",
                        help="unreadable/unmatched files: record as failed (default), skip, or stop")
    parser.add_argument("--out", required=True, help="run directory (created; resumed when it exists)")
    parser.add_argument("--labels", choices=LABEL_MODES, default="gt",
                        help="score against the GT masks (binary models) or the model's clean prediction")
    parser.add_argument("--single-mask", action="store_true",
                        help="SAM-family: single-mask output instead of the best of 3 by predicted IoU")
    parser.add_argument("--void-policy", choices=("ignore", "as_background"), default="ignore",
                        help="max-damage attacks on void (ignore band) pixels (default %(default)s)")
    parser.add_argument("--sea-schedule", choices=("progressive", "single"), default="progressive")
    parser.add_argument("--padam-steps", type=int, default=200)
    parser.add_argument("--sea-iterations", type=int, default=300)
    parser.add_argument("--dag-iterations", type=int, default=200)
    parser.add_argument("--alma-steps", type=int, default=500)
    parser.add_argument("--pdpgd-steps", type=int, default=500)
    parser.add_argument("--batch-size", type=int, default=1, help="instances per batch (default %(default)s)")
    parser.add_argument("--max-side", "--max_side", type=int, default=DEFAULT_MAX_SIDE, metavar="PX",
                        help=MAX_SIDE_HELP)
    parser.add_argument("--limit", type=int, default=None, help="only the first N instances of each dataset")
    parser.add_argument("--seed", type=int, default=0, help="base PRNG seed of the random starts")
    parser.add_argument("--examples", type=int, default=4, help="instances whose images are saved for the report")
    parser.add_argument("--progress", choices=("auto", "tqdm", "plain", "none"), default="auto")
    parser.add_argument("--retry-failed", action="store_true", help="rerun instances recorded as failed")
    parser.add_argument("--allow-manifest-mismatch", action="store_true",
                        help="resume into a run directory made with a different config")
    parser.add_argument("--no-report", action="store_true", help="do not write RUN_DIR/report")
    parser.add_argument("--report-only", action="store_true", help="only rebuild the report of --out")
    add_process_arguments(parser)
    parser.set_defaults(func=run)


def _error(message: str) -> None:
    print(f"jaxseg-robust perturb: error: {message}", file=sys.stderr)


# ---------------------------------------------------------------------------- arguments

def parse_epsilon(text: str) -> float:
    """``"8/255"`` or ``"0.031"`` -> float in (0, 1]; ValueError naming --eps otherwise."""
    try:
        value = float(fractions.Fraction(str(text).strip()))
    except (ValueError, ZeroDivisionError):
        raise ValueError(f"--eps must be a number or a fraction like 8/255, got {text!r}") from None
    if not 0 < value <= 1:
        raise ValueError(f"--eps must be in (0, 1] (image units), got {text!r} = {value}")
    return value


def parse_attacks(text: str) -> tuple[str, ...]:
    """Comma list of attack names/groups -> battery candidate names (C-R order, no duplicates)."""
    from jaxseg_robust.attacks.perturb.ensemble import CANDIDATE_ORDER  # noqa: PLC0415

    items = [item.strip().lower().replace("_", "-") for item in str(text).split(",") if item.strip()]
    if not items:
        raise ValueError("--attacks is empty")
    wanted = set()
    for item in items:
        if item == "all":
            wanted.update(name for group in ATTACK_GROUPS.values() for name in group)
        elif item in ATTACK_GROUPS:
            wanted.update(ATTACK_GROUPS[item])
        else:
            raise ValueError(f"--attacks: unknown attack {item!r}; known: {', '.join(ATTACK_GROUPS)}, all")
    return tuple(name for name in CANDIDATE_ORDER if name in wanted)


def _check_positive_ints(args) -> None:
    for flag in ("padam_steps", "sea_iterations", "dag_iterations", "alma_steps", "pdpgd_steps", "batch_size"):
        if getattr(args, flag) < 1:
            raise ValueError(f"--{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}")
    if args.limit is not None and args.limit < 1:
        raise ValueError(f"--limit must be >= 1, got {args.limit}")
    if args.max_side < 0:
        raise ValueError(f"--max-side must be >= 0 (0: no size guard), got {args.max_side}")
    if args.examples < 0:
        raise ValueError(f"--examples must be >= 0, got {args.examples}")
    if args.sea_schedule == "progressive" and int(0.3 * args.sea_iterations) < 1:
        raise ValueError(f"--sea-iterations must be >= 4 with the progressive schedule (three stages of "
                         f"⌊0.3N⌋, ⌊0.3N⌋ and the rest), got {args.sea_iterations}")


# ---------------------------------------------------------------------------- the model

class Target(NamedTuple):
    """The attacked model: ``logits_fn(params, images) -> logits`` plus what the run records.

    Attributes:
      description: model name / dir and kind, for the manifest.
      model: a `DenseModel` (``PromptedSegmenter`` for SAM-family models).
      params: parameters (for SAM-family models, the segmenter's; prompts are added per batch).
      prompted: True for SAM-family models (params need per-image prompts).
      fingerprint: of the parameters.
    """

    description: dict
    model: Any
    params: Any
    prompted: bool
    fingerprint: str


def load_target(name_or_dir: str, *, random_init: bool = False, multimask_output: bool = True) -> Target:
    """Loads ``--model``: a converted dense directory, or a SAM-family zoo name / directory.

    Raises:
      ValueError: unknown name, or ``--random-init`` with something other than a zoo name.
      FileNotFoundError / jaxseg_robust.models.store.StoreError: missing or damaged weights.
    """
    import jax  # noqa: PLC0415
    import jax.numpy as jnp  # noqa: PLC0415

    from jaxseg_robust.models import dense, zoo  # noqa: PLC0415
    from jaxseg_robust.models.dense import deeplabv3, u2net  # noqa: PLC0415
    from jaxseg_robust.models.dense.prompted import PromptedSegmenter  # noqa: PLC0415
    from jaxseg_robust.runner.fingerprints import fingerprint_params  # noqa: PLC0415
    from jaxseg_robust.models import store  # noqa: PLC0415

    path = pathlib.Path(os.path.expanduser(name_or_dir))
    if random_init:
        if path.is_dir() or name_or_dir not in zoo.known_names():
            raise ValueError(f"--random-init needs a zoo name ({', '.join(zoo.known_names())}), got {name_or_dir!r}")
        segmenter = zoo.segmenter(name_or_dir)
        params = segmenter.init(jax.random.key(0))
        description = {"model": name_or_dir, "kind": "prompted", "weights": "random-init"}
    elif path.is_dir() and store.read_meta(path)["family"] in (u2net.FAMILY, deeplabv3.FAMILY):
        model, variables = dense.load_converted(path)
        params = jax.tree.map(jnp.asarray, variables)
        description = {"model": str(path.resolve()), "kind": "dense", "family": store.read_meta(path)["family"]}
        return Target(description, model, params, False, fingerprint_params(params))
    else:
        segmenter, params, meta = zoo.load_params(name_or_dir)
        description = {"model": name_or_dir, "kind": "prompted", "family": meta["family"]}
    model = PromptedSegmenter(segmenter, multimask_output=multimask_output)
    description.update(prompt="tight GT box", multimask_output=multimask_output)
    return Target(description, model, params, True, fingerprint_params(params))


# ---------------------------------------------------------------------------- the data

def cap_size(refs, max_side: int | None) -> list:
    """The size guard (`jaxseg_robust.data.datasets.guard_size`): larger instances are downsized on load."""
    from jaxseg_robust.data.datasets import guard_size  # noqa: PLC0415

    return guard_size(refs, max_side)


def list_instances(datasets: str, data_root, mask_rule: str, limit: int | None, on_bad_pair: str = "fail") -> list:
    """``--datasets`` entries (registered names or image/mask folders) -> InstanceRefs.

    A folder whose name is a registered kind (``grabcut``, ``davis``, ...) is read as that
    kind, any other folder as ``images/ + masks/`` with ``mask_rule``. ``on_bad_pair``
    ("fail" by default: an unreadable or unmatched file becomes a failed instance, the run
    goes on) is passed to the listing.
    """
    from jaxseg_robust.data.datasets import find_kind, load_dataset, load_datasets  # noqa: PLC0415
    from jaxseg_robust.data.masks_io import is_default_rule  # noqa: PLC0415

    items = [item.strip() for item in str(datasets).split(",") if item.strip()]
    if not items:
        raise ValueError("--datasets is empty")
    plain = [item for item in items if pathlib.Path(os.path.expanduser(item)).is_dir()
             and find_kind(pathlib.Path(os.path.expanduser(item)).name) is None]
    if not plain and not is_default_rule(mask_rule):
        raise ValueError("--mask-rule applies to plain image/mask folders in --datasets; the registered datasets "
                         f"({', '.join(items)}) decode their masks by their own rule")
    refs = []
    for item in items:
        path = pathlib.Path(os.path.expanduser(item))
        if path.is_dir():
            kind = find_kind(path.name)
            kind_name = kind.name if kind is not None else "folder"
            options = {"rule": mask_rule} if kind_name == "folder" else {}
            listed = load_dataset(path, kind=kind_name, name=path.name, on_bad_pair=on_bad_pair, **options)
        else:
            listed = load_datasets(item, data_root, options={item: {"on_bad_pair": on_bad_pair}})
        refs.extend(listed[:limit] if limit is not None else listed)
    return refs


# ---------------------------------------------------------------------------- the batch function

@dataclasses.dataclass
class ExampleSaver:
    """Saves the images of the first ``limit`` finished instances into ``folder`` (for the report)."""

    folder: pathlib.Path
    limit: int
    names: tuple[str, ...]

    def count(self) -> int:
        """Example files already there."""
        return len(list(self.folder.glob("*.npz"))) if self.folder.is_dir() else 0

    def maybe_save(self, instance, outputs, payload) -> None:
        """Writes ``<dataset>__<id>.npz`` while fewer than ``limit`` examples exist."""
        if self.limit <= 0 or self.count() >= self.limit:
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in f"{instance.dataset}__{instance.id}")
        np.savez_compressed(self.folder / f"{safe}.npz", name=instance.name,
                            attack=self.names[payload["worst_miou"]], miou_clean=payload["miou_clean"],
                            miou_adv=payload["miou_worst"], **{k: np.asarray(outputs[k]) for k in EXAMPLE_KEYS})


def make_batch_fn(target: Target, candidates, battery_config, labels_mode: str, seed: int):
    """``PaddedBatch -> outputs [B, ...]``: the battery, the per-image worst image and predictions."""
    import jax  # noqa: PLC0415
    import jax.numpy as jnp  # noqa: PLC0415

    from jaxseg_robust.attacks.perturb import instance_keys, run_battery  # noqa: PLC0415
    from jaxseg_robust.models.dense.prompted import box_prompts, with_prompts  # noqa: PLC0415

    model = target.model
    logits_fn = model.apply
    num_classes = battery_config.num_classes
    background = battery_config.background_class
    base_key = jax.random.key(seed)
    predict = jax.jit(lambda params, images: jnp.argmax(logits_fn(params, images), axis=-1).astype(jnp.int32))

    def batch_fn(batch):
        images = jnp.asarray(batch.image).astype(jnp.float32) / 255.0
        gt = jnp.asarray(batch.gt).astype(jnp.int32)
        params = target.params
        if target.prompted:
            params = with_prompts(params, box_prompts(gt, model.low_res_size))
        clean_pred = predict(params, images)
        if labels_mode == "gt":
            labels, valid = gt, jnp.asarray(batch.valid) & (gt >= 0)
        else:
            labels, valid = clean_pred, jnp.asarray(batch.valid)
        keys = instance_keys(base_key, jnp.asarray(batch.seed))
        result = run_battery(candidates, logits_fn, params, images, labels, valid, keys, num_classes=num_classes,
                             background_class=background, keep_worst=(("miou", True),))
        worst = result.worst_images[("miou", True)]
        return {"confusions": np.swapaxes(result.confusions, 0, 1), "forwards": result.forwards.T,
                "backwards": result.backwards.T, "image": np.asarray(batch.image),
                "adversarial": worst.astype(np.float16), "labels": np.asarray(labels, np.int16),
                "valid": np.asarray(valid), "clean_pred": np.asarray(clean_pred, np.int16),
                "adv_pred": np.asarray(predict(params, jnp.asarray(worst)), np.int16)}

    return batch_fn


def make_finalize(saver: ExampleSaver, background_class: int):
    """Host-side payload of one instance (statistics only) + example images for the report."""
    import jax.numpy as jnp  # noqa: PLC0415

    from jaxseg_robust.attacks.perturb import per_image_scores  # noqa: PLC0415

    def finalize(instance, outputs):
        confusions = np.asarray(outputs["confusions"], np.int64)
        mious = np.asarray(per_image_scores(jnp.asarray(confusions, jnp.float32), metric="miou",
                                            background_class=background_class), np.float64)
        finite = np.where(np.isfinite(mious), mious, np.inf)
        worst = int(np.argmin(finite)) if np.isfinite(finite).any() else 0
        payload = {"confusions": confusions, "forwards": np.asarray(outputs["forwards"]),
                   "backwards": np.asarray(outputs["backwards"]), "height": int(instance.image.shape[0]),
                   "width": int(instance.image.shape[1]), "miou_clean": float(mious[0]),
                   "miou_worst": float(mious[worst]), "worst_miou": worst}
        saver.maybe_save(instance, outputs, payload)
        return payload

    return finalize


# ---------------------------------------------------------------------------- the command

def _report(out: pathlib.Path, write: bool) -> None:
    from jaxseg_robust.reports import perturb as report  # noqa: PLC0415

    run = report.load_run(out)
    print(report.summary_markdown(run))
    wins = report.win_counts(run)
    if run.keys:
        print("per-image worst case (by mIoU): " + ", ".join(f"{w['attack']} {w['wins_miou']}" for w in wins))
    if write:
        paths = report.write_report(out)
        print(f"wrote {paths['report']}")


def run(args) -> int:
    """Runs the command; returns an exit code of `jaxseg_robust.cli`."""
    out = pathlib.Path(args.out)
    if args.report_only:
        try:
            _report(out, write=True)
        except (FileNotFoundError, ValueError) as error:
            _error(str(error))
            return EXIT_FAILURE
        return EXIT_OK
    try:
        process_index, process_count = start_processes(args)
        if not args.model or not args.datasets:
            raise ValueError("give --model and --datasets (or --report-only)")
        _check_positive_ints(args)
        epsilon = parse_epsilon(args.eps)
        attacks = parse_attacks(args.attacks)
        target = load_target(args.model, random_init=args.random_init, multimask_output=not args.single_mask)
        num_classes = int(target.model.num_classes)
        if args.labels == "gt" and num_classes != 2:
            raise ValueError(f"--labels gt scores binary masks but {args.model} has {num_classes} classes; "
                             f"use --labels prediction")
        if "alma_prox" in attacks and num_classes < 3:
            raise ValueError(f"alma-prox needs a model with >= 3 classes (its DLR constraint uses the top-3 "
                             f"logits); {args.model} has {num_classes}: drop it from --attacks")
        instances = cap_size(list_instances(args.datasets, args.data_root, args.mask_rule, args.limit,
                                            args.on_bad_pair), args.max_side)
        if not instances:
            raise ValueError(f"no instances in --datasets {args.datasets}")
    except Exception as error:  # noqa: BLE001 - every setup problem is a bad-argument exit
        _error(f"{type(error).__name__}: {error}" if not isinstance(error, (ValueError, CommandError))
               else str(error))
        return EXIT_FAILURE

    from jaxseg_robust.attacks.perturb.ensemble import BatteryConfig, build_battery  # noqa: PLC0415
    from jaxseg_robust.runner.engine import run as run_engine  # noqa: PLC0415

    background = target.model.background_class
    battery = BatteryConfig(num_classes=num_classes, epsilon=epsilon, void_policy=args.void_policy,
                            background_class=0 if background is None else int(background),
                            sea_schedule=args.sea_schedule, attacks=attacks, padam_steps=args.padam_steps,
                            sea_iterations=args.sea_iterations, dag_iterations=args.dag_iterations,
                            alma_steps=args.alma_steps, pdpgd_steps=args.pdpgd_steps)
    candidates = build_battery(target.model.apply, battery)
    names = tuple(c.name for c in candidates)
    config = {"protocol": "perturb", **target.description, "candidates": list(names), "num_classes": num_classes,
              "background_class": background, "epsilon": epsilon, "epsilon_text": args.eps, "labels": args.labels,
              "void_policy": args.void_policy, "sea_schedule": args.sea_schedule,
              "budgets": {"padam_steps": args.padam_steps, "sea_iterations": args.sea_iterations,
                          "dag_iterations": args.dag_iterations, "alma_steps": args.alma_steps,
                          "pdpgd_steps": args.pdpgd_steps},
              "reference_quirks": battery.reference_quirks, "max_side": args.max_side, "seed": args.seed}
    saver = ExampleSaver(out / "examples", args.examples, names)
    print(f"perturb: {len(instances)} instances, attacks {', '.join(names[1:])}, ε = {args.eps}, "
          f"model {target.description['model']} ({target.description['kind']})", flush=True)
    try:
        summary = run_engine(instances, make_batch_fn(target, candidates, battery, args.labels, args.seed), out,
                             args.batch_size, config=config, model_fingerprint=target.fingerprint,
                             finalize=make_finalize(saver, battery.background_class),
                             allow_manifest_mismatch=args.allow_manifest_mismatch,
                             retry_failed=args.retry_failed, progress=args.progress,
                             process_index=process_index, process_count=process_count)
    except (ValueError, RuntimeError, OSError) as error:
        _error(f"{type(error).__name__}: {error}")
        return EXIT_FAILURE
    print(summary.format())
    _report(out, write=not args.no_report)
    from jaxseg_robust.runner.engine import recorded_counts  # noqa: PLC0415

    if recorded_counts(out)["ok"] == 0:
        _error("no instance could be processed")
        return EXIT_FAILURE
    return summary.exit_code
