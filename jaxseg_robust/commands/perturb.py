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

Images are attacked at their own size (no spatial padding, §10.5; one
compilation per attack and image size) unless ``--pad-to-multiple N`` pads
them into frames of multiples of N (§10.6: fewer compilations, the padding is
void and never perturbed, but the model sees it); ``--max-side`` (default 2048, the
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
from typing import Any, NamedTuple

import numpy as np

from jaxseg_robust.exit_codes import EXIT_OK
from jaxseg_robust.commands.flags import (
    DEVICE_EPILOG,
    CommandError,
    add_dataset_arguments,
    add_flag,
    add_model_arguments,
    add_run_arguments,
    non_negative_int,
    positive_float,
    positive_int,
)
from jaxseg_robust.commands.loading import load_instances
from jaxseg_robust.commands.running import (
    report_error,
    resized_line,
    run_protocol,
    start_processes,
    timed_finalize_of,
)
from jaxseg_robust.runner.engine import recorded_counts

ATTACK_GROUPS = {
    "padam-ce": ("padam_ce",), "padam-cos": ("padam_cos",), "padam": ("padam_ce", "padam_cos"),
    "sea": ("sea_mce", "sea_bce", "sea_jsd", "sea_msl"), "sea-mce": ("sea_mce",), "sea-bce": ("sea_bce",),
    "sea-jsd": ("sea_jsd",), "sea-msl": ("sea_msl",), "dag": ("dag_0.001", "dag_0.003"),
    "dag-0.001": ("dag_0.001",), "dag-0.003": ("dag_0.003",), "alma-prox": ("alma_prox",), "pdpgd": ("pdpgd",),
}
DEFAULT_ATTACKS = "padam-ce,padam-cos,sea,dag,alma-prox,pdpgd"
LABEL_MODES = ("gt", "prediction")
SEMANTIC_DATASETS = ("voc", "cityscapes")
SELECTION_CHOICES = ("auto", "with-background", "without-background")
SELECTION_VALUES = {"auto": None, "with-background": True, "without-background": False}
COMMAND = "perturb"
COMPILE_LOG = "compile.jsonl"
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
""" + DEVICE_EPILOG + "\n"


def register(subparsers) -> None:
    """Adds the ``perturb`` sub-command (the model, data and run flag groups of every command, plus the battery's)."""
    parser = subparsers.add_parser(
        "perturb", help="L∞ image-perturbation attack battery (ECCV'24) on a dense or prompted model",
        description="Attack a segmentation model with the L∞ image-perturbation battery of Halmosi et al. "
        "(ECCV'24): PAdam, SEA (APGD), DAG, ALMA prox, PDPGD and their per-image worst case; resumable.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_arguments(parser, required=False,
                        what="; or a converted dense model directory (u2netp, deeplabv3, semseg, upernet)")
    add_dataset_arguments(parser)
    semantic = parser.add_argument_group("semantic-segmentation datasets (the paper's protocol)")
    semantic.add_argument("--dataset", choices=SEMANTIC_DATASETS, default=None,
                          help="PASCAL VOC 2012 or Cityscapes under --data-root (instead of --datasets; default: "
                               "none, the --datasets / --folder masks)")
    semantic.add_argument("--split", default="val", help="dataset split (default %(default)s)")
    semantic.add_argument("--resize", default=None, metavar="RULE",
                          help="shorter:N, longer:N, fixed:HxW or none (default: the paper's, VOC shorter:512, "
                               "Cityscapes fixed:512x1024)")
    add_run_arguments(parser, default_batch_size=1, default_frame=None)  # images are attacked at their own size
    add_flag(semantic, "--pad-to-multiple", type=non_negative_int, default=0, metavar="N",
             help="opt-in: pad image and labels to H, W rounded up to a multiple of N (one compiled program set "
                  "per padded size; padding is void and never perturbed, but the model sees it as context, so "
                  "numbers can differ from the paper's; docs §10.6). Default 0: every image at its own size")
    group = parser.add_argument_group("perturbation battery")
    group.add_argument("--attacks", default=DEFAULT_ATTACKS, help="comma list (default %(default)s; or 'all')")
    group.add_argument("--eps", default="8/255", help="L∞ radius in image units, e.g. 8/255 or 0.03 (default %(default)s)")
    group.add_argument("--labels", choices=LABEL_MODES, default="gt",
                       help="score against the GT masks (binary models) or the model's clean prediction "
                            "(default %(default)s)")
    add_flag(group, "--single-mask", action="store_true",
             help="SAM-family: single-mask output instead of the best of 3 by predicted IoU (default: the best "
                  "of 3)")
    add_flag(group, "--void-policy", choices=("ignore", "as_background"), default=None,
             help="max-damage attacks on void pixels (default: as_background for --dataset voc, else ignore)")
    add_flag(group, "--sea-schedule", choices=("progressive", "single"), default="progressive",
             help="SEA's loss schedule: progressive (the paper's three phases) or single (default %(default)s)")
    add_flag(group, "--msl-track", choices=("masked", "unmasked"), default=None,
             help="SEA-MSL tracked loss (default: follow --sea-schedule; docs §8.2 #2)")
    add_flag(group, "--alma-lr-init", type=positive_float, default=1e-4,
             help="ALMA prox initial step (default %(default)s, the released code; Rony et al.: 1e-3)")
    add_flag(group, "--include-clean", action=argparse.BooleanOptionalAction, default=True,
             help="the clean image as the first candidate of the worst case (default on)")
    add_flag(group, "--select-with-background", choices=SELECTION_CHOICES, default="auto",
             help="worst-case selection score: each metric variant's own (auto), or always the with- / "
                  "without-background score (default %(default)s)")
    add_flag(group, "--reference-quirks", action=argparse.BooleanOptionalAction, default=True,
             help="reproduce the reference code's SEA start-accuracy and ALMA derivative quirks (default on)")
    for flag, default in (("--padam-steps", 200), ("--sea-iterations", 300), ("--dag-iterations", 200),
                          ("--alma-steps", 500), ("--pdpgd-steps", 500)):
        add_flag(group, flag, type=positive_int, default=default, help="(default %(default)s)")
    group.add_argument("--seed", type=int, default=0, help="base PRNG seed of the random starts (default %(default)s)")
    add_flag(group, "--examples", type=non_negative_int, default=4,
             help="instances whose images are saved for the report (default %(default)s)")
    add_flag(group, "--no-report", action="store_true",
             help="do not write RUN_DIR/report (default: written after the run)")
    add_flag(group, "--report-only", action="store_true",
             help="only rebuild the report of --out (default: run the battery, then report)")
    parser.set_defaults(func=run)


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


def check_schedule(args) -> None:
    """The progressive SEA schedule needs three stages (ValueError naming --sea-iterations)."""
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


def load_target(name_or_dir: str, *, random_seed: int | None = None, multimask_output: bool = True,
                compute_dtype: str | None = None) -> Target:
    """Loads ``--model``: a converted dense directory, or a SAM-family zoo name / directory.

    Args:
      random_seed: ``--random-weights`` (old spelling ``--random-init``): seeded random weights of a zoo name.
      multimask_output: SAM-family: the best of 3 candidates (True) or the single-mask output.
      compute_dtype: SAM-family image-encoder dtype (``--compute-dtype``).

    Raises:
      ValueError: unknown name, random weights for something other than a zoo name, a compute
        dtype for a dense model.
      FileNotFoundError / jaxseg_robust.models.store.StoreError: missing or damaged weights.
    """
    import jax  # noqa: PLC0415

    from jaxseg_robust.models import dense, zoo  # noqa: PLC0415
    from jaxseg_robust.models.dense import deeplabv3, semseg, u2net, upernet  # noqa: PLC0415
    from jaxseg_robust.models.dense.prompted import PromptedSegmenter  # noqa: PLC0415
    from jaxseg_robust.runner.fingerprints import fingerprint_params  # noqa: PLC0415
    from jaxseg_robust.models import store  # noqa: PLC0415

    path = pathlib.Path(os.path.expanduser(name_or_dir))
    if random_seed is not None:
        if path.is_dir() or name_or_dir not in zoo.known_names():
            raise ValueError(f"--random-weights needs a zoo name ({', '.join(zoo.known_names())}), "
                             f"got {name_or_dir!r}")
        segmenter = zoo.segmenter(name_or_dir, compute_dtype=compute_dtype)
        params = segmenter.init(jax.random.key(random_seed))
        weights = "random-init" if random_seed == 0 else f"random-init:{random_seed}"
        description = {"model": name_or_dir, "kind": "prompted", "weights": weights}
    elif path.is_dir() and store.read_meta(path)["family"] in (u2net.FAMILY, deeplabv3.FAMILY, semseg.FAMILY,
                                                               upernet.FAMILY):
        if compute_dtype is not None:
            raise ValueError("--compute-dtype applies to SAM-family models, not to a dense model")
        model, variables = dense.load_converted(path)
        params = jax.device_put(variables)  # a transfer; jnp.asarray would compile one program per leaf shape
        description = {"model": str(path.resolve()), "kind": "dense", "family": store.read_meta(path)["family"]}
        return Target(description, model, params, False, fingerprint_params(params))
    else:
        segmenter, params, meta = zoo.load_params(name_or_dir, compute_dtype=compute_dtype)
        description = {"model": name_or_dir, "kind": "prompted", "family": meta["family"]}
    model = PromptedSegmenter(segmenter, multimask_output=multimask_output)
    description.update(prompt="tight GT box", multimask_output=multimask_output)
    return Target(description, model, params, True, fingerprint_params(params))


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
        height, width = instance.image.shape[:2]  # the image inside a padded frame
        np.savez_compressed(self.folder / f"{safe}.npz", name=instance.name,
                            attack=self.names[payload["worst_miou"]], miou_clean=payload["miou_clean"],
                            miou_adv=payload["miou_worst"],
                            **{k: np.asarray(outputs[k])[:height, :width] for k in EXAMPLE_KEYS})


def make_batch_fn(target: Target, candidates, battery_config, labels_mode: str, seed: int, padded: bool = False):
    """``PaddedBatch -> outputs [B, ...]`` as a `TimedBattery`: the battery, the per-image worst image and
    predictions, and the batch's timing.

    ``padded``: the batch's frames are padded spatially (``--pad-to-multiple``,
    §10.6): ``batch.valid`` is then the attack region (nothing outside it is
    attacked, perturbed or counted).
    """
    import jax  # noqa: PLC0415
    import jax.numpy as jnp  # noqa: PLC0415

    from jaxseg_robust.attacks.perturb import instance_keys, run_battery, score_program  # noqa: PLC0415
    from jaxseg_robust.attacks.perturb.programs import CompiledProgram  # noqa: PLC0415
    from jaxseg_robust.models.dense.prompted import tight_box_prompts, with_prompts  # noqa: PLC0415

    model = target.model
    logits_fn = model.apply
    num_classes = battery_config.num_classes
    background = battery_config.background_class
    base_key = jax.random.key(seed)
    predict = CompiledProgram("predict", lambda params, images: jnp.argmax(logits_fn(params, images),
                                                                           axis=-1).astype(jnp.int32))

    def batch_fn(batch):
        images = jnp.asarray(batch.image).astype(jnp.float32) / 255.0
        gt = jnp.asarray(batch.gt).astype(jnp.int32)
        params = target.params
        if target.prompted:
            params = with_prompts(params, tight_box_prompts(gt, model.low_res_size))
        clean_pred = predict(params, images)
        if labels_mode == "gt":
            labels, valid = gt, jnp.asarray(batch.valid) & (gt >= 0)
        else:
            labels, valid = clean_pred, jnp.asarray(batch.valid)
        keys = instance_keys(base_key, jnp.asarray(batch.seed))
        region = jnp.asarray(batch.valid) if padded else None
        result = run_battery(candidates, logits_fn, params, images, labels, valid, keys, num_classes=num_classes,
                             background_class=background, keep_worst=(("miou", True),), region=region)
        worst = result.worst_images[("miou", True)]
        if "clean" in result.names:
            clean_confusions = result.confusions[result.names.index("clean")]
        else:
            clean_confusions = np.asarray(score_program(logits_fn, num_classes)(params, images, labels, valid))
        return {"confusions": np.swapaxes(result.confusions, 0, 1), "clean_confusion": clean_confusions,
                "forwards": result.forwards.T,
                "backwards": result.backwards.T, "image": np.asarray(batch.image),
                "adversarial": worst.astype(np.float16), "labels": np.asarray(labels, np.int16),
                "valid": np.asarray(valid), "clean_pred": np.asarray(clean_pred, np.int16),
                "adv_pred": np.asarray(predict(params, jnp.asarray(worst)), np.int16)}

    programs = [c.program for c in candidates if c.program is not None]
    return TimedBattery(batch_fn, [*programs, score_program(logits_fn, num_classes), predict])


class TimedBattery:
    """The battery's batch function with ``TIMING_KEY`` outputs and a compile log, as a timed
    `jaxseg_robust.runner.program.BatchProgram` has them (`reports.artifacts.timed_finalize` reads both).

    Device seconds of a batch: what the battery's compiled programs ran (each call waits for its
    outputs); wall seconds: the whole batch function (host work between the programs included),
    minus the compile seconds, which go to ``compile_log`` (one `CompileEvent` per batch that compiled:
    a new image size, or padded frame; ``from_cache`` when JAX read every program it compiled from its
    persistent compilation cache, `jaxseg_robust.runner.compile_cache`).

    Attributes:
      compile_log: the `runner.program.CompileLog`.
    """

    def __init__(self, batch_fn, programs):
        from jaxseg_robust.runner.compile_cache import listen_for_cache_hits  # noqa: PLC0415
        from jaxseg_robust.runner.program import CompileLog  # noqa: PLC0415

        listen_for_cache_hits()
        self.batch_fn = batch_fn
        self.programs = list({id(program): program for program in programs}.values())
        self.compile_log = CompileLog()

    def _totals(self) -> tuple[float, float, int]:
        return (sum(p.compile_seconds for p in self.programs), sum(p.run_seconds for p in self.programs),
                sum(p.compiles for p in self.programs))

    def __call__(self, batch) -> dict:
        import time  # noqa: PLC0415

        from jaxseg_robust.runner.compile_cache import cache_hits  # noqa: PLC0415
        from jaxseg_robust.runner.program import TIMING_KEY, CompileEvent, batch_timing  # noqa: PLC0415

        totals, hits = self._totals(), cache_hits()
        begin, started = time.perf_counter(), time.time()
        outputs = dict(self.batch_fn(batch))
        wall = time.perf_counter() - begin
        compiled, ran, compiles = (after - before for after, before in zip(self._totals(), totals))
        if compiled > 0:  # from the cache: JAX read every program this batch compiled from its persistent cache
            gt_shape = np.shape(batch.gt)
            self.compile_log.add(CompileEvent("perturbation battery", (int(gt_shape[1]), int(gt_shape[2])),
                                              int(gt_shape[0]), compiled, started + compiled,
                                              from_cache=cache_hits() - hits >= compiles > 0))
        outputs[TIMING_KEY] = batch_timing(batch.instance_valid, ran, wall - compiled, started, started + wall)
        return outputs


def make_finalize(saver: ExampleSaver, background_class: int):
    """Host-side payload of one instance (statistics only) + example images for the report.

    The payload: per-candidate ``confusions`` int[K, C, C], ``clean_confusion``
    int[C, C], attack costs, the image size, the clean and worst per-image
    mIoU (with background) and the indices of the per-image worst candidates by
    mIoU and by accuracy (§5; NaN scores never selected).
    """
    import jax.numpy as jnp  # noqa: PLC0415

    from jaxseg_robust.attacks.perturb import per_image_scores, select_worst  # noqa: PLC0415

    def scores(confusions, metric):
        return per_image_scores(jnp.asarray(confusions, jnp.float32), metric=metric, background_class=background_class)

    def finalize(instance, outputs):
        confusions = np.asarray(outputs["confusions"], np.int64)
        clean = np.asarray(outputs["clean_confusion"], np.int64)
        mious = np.asarray(scores(confusions, "miou"), np.float64)
        worst = int(select_worst(mious[:, None])[0][0])
        worst_accuracy = int(select_worst(np.asarray(scores(confusions, "accuracy"))[:, None])[0][0])
        payload = {"confusions": confusions, "clean_confusion": clean,
                   "forwards": np.asarray(outputs["forwards"]), "backwards": np.asarray(outputs["backwards"]),
                   "height": int(instance.image.shape[0]), "width": int(instance.image.shape[1]),
                   "miou_clean": float(np.asarray(scores(clean[None], "miou"))[0]),
                   "miou_worst": float(mious[worst]), "worst_miou": worst, "worst_accuracy": worst_accuracy}
        saver.maybe_save(instance, outputs, payload)
        return payload

    return finalize


# ---------------------------------------------------------------------------- the command

def _report(out: pathlib.Path, write: bool) -> None:
    from jaxseg_robust.reports import perturb as report  # noqa: PLC0415
    from jaxseg_robust.reports.report_files import write_table_files  # noqa: PLC0415
    from jaxseg_robust.reports.timing_summary import add_run_timing  # noqa: PLC0415

    run = report.load_run(out)
    markdown, csv_text = add_run_timing(out, report.summary_markdown(run), report.summary_csv(run))
    print(markdown)
    write_table_files(out, "summary", markdown, csv_text)  # RUN_DIR/summary.md / .csv, as every protocol's
    wins = report.win_counts(run)
    if run.keys:
        print("per-image worst case (by mIoU): " + ", ".join(f"{w['attack']} {w['wins_miou']}" for w in wins))
    if write:
        paths = report.write_report(out)
        print(f"wrote {paths['report']}")


def run(args) -> int:
    """Runs the command; returns an exit code of `jaxseg_robust.exit_codes`."""
    out = pathlib.Path(args.out)
    if args.report_only:
        try:
            _report(out, write=True)
        except (FileNotFoundError, ValueError) as error:
            return report_error(COMMAND, str(error))
        return EXIT_OK
    try:
        start_processes(args)
        target, instances, battery = prepare(args)
        summary, compiled = run_battery_into(args, target, instances, battery)
    except (CommandError, ValueError, OSError) as error:  # StoreError and DatasetError are ValueErrors
        return report_error(COMMAND, str(error) if isinstance(error, (CommandError, ValueError))
                            else f"{type(error).__name__}: {error}")
    print(summary.format())
    from jaxseg_robust.attacks.perturb.programs import format_compile_summary  # noqa: PLC0415

    print(f"perturb: {format_compile_summary(compiled)}")
    _report(out, write=not args.no_report)
    resized = resized_line(out)
    if resized is not None:
        print(resized)
    if recorded_counts(out)["ok"] == 0:
        return report_error(COMMAND, "no instance could be processed")
    return summary.exit_code


def prepare(args):
    """Checks the flags, loads the model and lists the instances: (`Target`, instances, `BatteryConfig`).

    Raises:
      ValueError / CommandError: naming the flag (nothing is computed before).
    """
    from jaxseg_robust.attacks.perturb.ensemble import BatteryConfig  # noqa: PLC0415

    if args.dataset and (args.datasets or args.folder):
        raise CommandError("give either --dataset (voc, cityscapes) or --datasets / --folder, not both")
    if not args.model or not (args.datasets or args.folder or args.dataset):
        raise CommandError("give --model and --dataset or --datasets (or --report-only)")
    if args.resize is not None and not args.dataset:
        raise CommandError("--resize applies to --dataset voc|cityscapes (use --max-side with --datasets)")
    check_schedule(args)
    epsilon = parse_epsilon(args.eps)
    attacks = parse_attacks(args.attacks)
    target = load_target(args.model, random_seed=args.random_weights, multimask_output=not args.single_mask,
                         compute_dtype=args.compute_dtype)
    num_classes = int(target.model.num_classes)
    if args.dataset:
        expected = semantic_classes(args.dataset)
        if num_classes != expected:
            raise ValueError(f"--dataset {args.dataset} has {expected} classes but {args.model} predicts "
                             f"{num_classes}")
    elif args.labels == "gt" and num_classes != 2:
        raise ValueError(f"--labels gt scores binary masks but {args.model} has {num_classes} classes; "
                         f"use --labels prediction")
    if "alma_prox" in attacks and num_classes < 3:
        raise ValueError(f"alma-prox needs a model with >= 3 classes (its DLR constraint uses the top-3 "
                         f"logits); {args.model} has {num_classes}: drop it from --attacks")
    instances = load_semantic_instances(args, num_classes) if args.dataset else load_instances(args)
    background = target.model.background_class
    battery = BatteryConfig(num_classes=num_classes, epsilon=epsilon, void_policy=void_policy_of(args),
                            background_class=0 if background is None else int(background),
                            sea_schedule=args.sea_schedule, msl_track=args.msl_track,
                            alma_lr_init=args.alma_lr_init, reference_quirks=args.reference_quirks,
                            include_clean=args.include_clean,
                            select_with_background=SELECTION_VALUES[args.select_with_background],
                            attacks=attacks, padam_steps=args.padam_steps, sea_iterations=args.sea_iterations,
                            dag_iterations=args.dag_iterations, alma_steps=args.alma_steps,
                            pdpgd_steps=args.pdpgd_steps)
    return target, instances, battery


def semantic_classes(dataset: str) -> int:
    """C of ``--dataset`` (VOC 21, Cityscapes 19)."""
    from jaxseg_robust.data.semantic import CLASS_COUNTS  # noqa: PLC0415

    return CLASS_COUNTS[dataset]


def void_policy_of(args) -> str:
    """``--void-policy``, or its default: ``as_background`` for PASCAL VOC (§1.2), else ``ignore``."""
    if args.void_policy is not None:
        return args.void_policy
    return "as_background" if args.dataset == "voc" else "ignore"


def resize_rule_of(args):
    """The `ResizeRule` of ``--resize`` or the paper's protocol of ``--dataset``."""
    from jaxseg_robust.data import semantic  # noqa: PLC0415

    if args.resize is None:
        return semantic.VOC_PROTOCOL if args.dataset == "voc" else semantic.CITYSCAPES_PROTOCOL
    return semantic.parse_resize_rule(args.resize)


def load_semantic_instances(args, num_classes: int) -> list:
    """Lazy multi-class instances of ``--dataset`` under ``--data-root`` (``--split``, ``--resize``, ``--limit``).

    Raises:
      CommandError: no data root, or a listing error (it names the missing folder or file).
    """
    from jaxseg_robust.data import semantic  # noqa: PLC0415

    root = args.data_root or os.environ.get("JAXSEG_ROBUST_DATA")
    if not root:
        raise CommandError("--dataset needs --data-root DIR (or $JAXSEG_ROBUST_DATA)")
    try:
        refs = semantic.list_semantic_dataset(args.dataset, root, split=args.split, resize=resize_rule_of(args))
    except ValueError as error:  # SemanticDatasetError, a bad --resize
        raise CommandError(str(error)) from None
    return semantic.instance_refs(refs if args.limit is None else refs[:args.limit], num_classes)


def run_battery_into(args, target: Target, instances, battery):
    """Runs the battery over the instances into ``args.out`` (`jaxseg_robust.runner.engine.run`).

    Returns:
      (the engine's `RunSummary`, the battery's compile summary: programs,
      traces, compiles, compile_seconds, run_seconds; also appended to
      ``RUN_DIR/compile.jsonl``).
    """
    from jaxseg_robust.attacks.perturb.ensemble import battery_compile_summary, build_battery  # noqa: PLC0415

    candidates = build_battery(target.model.apply, battery)
    names = tuple(c.name for c in candidates)
    config = {"protocol": "perturb", **target.description, "candidates": list(names),
              "num_classes": battery.num_classes, "background_class": target.model.background_class,
              "epsilon": battery.epsilon, "epsilon_text": args.eps, "labels": args.labels,
              "void_policy": battery.void_policy, "sea_schedule": args.sea_schedule,
              "msl_track": battery.msl_track, "alma_lr_init": battery.alma_lr_init,
              "include_clean": battery.include_clean, "select_with_background": battery.select_with_background,
              "budgets": {"padam_steps": args.padam_steps, "sea_iterations": args.sea_iterations,
                          "dag_iterations": args.dag_iterations, "alma_steps": args.alma_steps,
                          "pdpgd_steps": args.pdpgd_steps},
              "reference_quirks": battery.reference_quirks, "max_side": args.max_side, "seed": args.seed}
    if args.dataset:
        from jaxseg_robust.data.semantic import rule_text  # noqa: PLC0415

        config.update(dataset=args.dataset, split=args.split, resize=rule_text(resize_rule_of(args)))
        del config["max_side"]
    padded = args.pad_to_multiple > 0
    if padded:
        config["pad_to_multiple"] = args.pad_to_multiple
        args = argparse.Namespace(**{**vars(args), "frame": f"round:{args.pad_to_multiple}"})
    saver = ExampleSaver(pathlib.Path(args.out) / "examples", args.examples, names)
    attacked = ", ".join(name for name in names if name != "clean")
    print(f"perturb: {len(instances)} instances, attacks {attacked}, ε = {args.eps}, "
          f"model {target.description['model']} ({target.description['kind']})", flush=True)
    batch_fn = make_batch_fn(target, candidates, battery, args.labels, args.seed, padded)
    summary = run_protocol(args, instances=instances, config=config, model=target, check=None, batch_fn=batch_fn,
                           finalize=timed_finalize_of(args, batch_fn, make_finalize(saver, battery.background_class)))
    compiled = battery_compile_summary(candidates, target.model.apply, battery.num_classes)
    write_compile_summary(pathlib.Path(args.out), compiled)
    return summary, compiled


def write_compile_summary(out: pathlib.Path, compiled: dict) -> None:
    """Appends this session's compile / run times (`programs.compile_summary`) to ``RUN_DIR/compile.jsonl``."""
    import json  # noqa: PLC0415

    with (out / COMPILE_LOG).open("a") as handle:
        handle.write(json.dumps(compiled) + "\n")
