"""Strength parity of the whole battery against the ECCV'24 authors' code, at the paper's budgets.

Same model, same images, every attack of the battery run twice: ours (JAX, `build_battery` /
`run_battery`) and the authors' battery (``rse.build_attacks`` of
szegedai/Robust-Segmentation-Evaluation, which calls its own PAdam and APGD and adv-lib 0.2.8's
DAG, PDPGD and ALMA prox), both at ε = 8/255 with the paper's budgets (PAdam 200 steps, SEA 300
iterations, DAG 200, PDPGD 500, ALMA prox 500). Both sides' adversarial images are scored by
the same (JAX) model: pooled accuracy, CmIoU and NmIoU (with background) per attack and for
the per-image worst case over the attacks and the clean image (worst by per-image mIoU for
the mIoU columns, by pixel accuracy for the accuracy column, as §5 of
docs/protocols/perturbation.md).

Model and data: the tests' toy segmentation network (``tests/perturb_toy.py``: three convs,
4 classes, trained for 150 Adam steps on synthetic colour-shape scenes; its PyTorch twin has
the same weights) on fresh synthetic 32x32 scenes where it is ~99 % accurate and an 8/255
perturbation can flip every pixel: a model the strong attacks should break, so that weak and
strong implementations separate. The random starts (PAdam, SEA) come from different
generators on the two sides (JAX keys vs torch's global generator), so the max-damage rows
differ by the spread of random restarts; ``--seeds`` repeats both sides with several seeds
to measure that spread. DAG, PDPGD and ALMA prox are deterministic.

Our battery is run twice: with the released code's SEA settings (``sea_schedule="single"``,
the masked MSL tracked loss: the setting that corresponds to ``rse.build_attacks``) and with
the project defaults (progressive radius schedule, the paper's reading; §8.2 #1-#2).

    JAXSEG_RSE_REPO=/path/to/Robust-Segmentation-Evaluation \\
        python experiments/battery_parity.py --images 8 --seeds 0,1 --markdown table.md

Needs torch, adv-lib 0.2.8 and the rse checkout (the ``reference`` extra).
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import time

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
for path in (REPO_ROOT, REPO_ROOT / "tests"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import perturb_toy as toy  # noqa: E402
from jaxseg_robust.attacks.perturb import (  # noqa: E402
    CANDIDATE_LABELS,
    BatteryConfig,
    build_battery,
    image_confusions,
    instance_keys,
    run_battery,
)
from jaxseg_robust.reports.perturb_scores import dataset_metrics  # noqa: E402

EPSILON = 8 / 255
METRICS = ("accuracy", "cmiou", "nmiou")
# rse.ATTACKS names -> our candidate names, in the released code's order.
RSE_NAMES = {"padam-ce": "padam_ce", "padam-cos": "padam_cos", "apgd-mask-ce-avg": "sea_mce",
             "apgd-segpgd-loss": "sea_bce", "apgd-js-avg": "sea_jsd", "apgd-mask-norm-corrlog-avg": "sea_msl",
             "dag-001": "dag_0.001", "dag-003": "dag_0.003", "pdpgd": "pdpgd", "alma-prox": "alma_prox"}
SIDES = ("ours_single", "ours_progressive", "reference")


def load_rse(root: pathlib.Path):
    """``rse`` (the authors' package: ``build_attacks``, ``ATTACKS``) imported from a checkout.

    adv-lib's optional visdom / torchvision imports get stand-ins where those are missing
    (``tests/attack_reference.py``).
    """
    from attack_reference import import_with_stand_ins

    existing = sys.modules.get("rse")
    if existing is not None and not hasattr(existing, "build_attacks"):
        del sys.modules["rse"]  # a namespace stand-in (tests/attack_reference.py), not the package
    if not (root / "rse" / "__init__.py").is_file():
        raise FileNotFoundError(f"{root} has no rse/__init__.py (a Robust-Segmentation-Evaluation checkout)")
    sys.path.insert(0, str(root))
    try:
        return import_with_stand_ins("rse")
    finally:
        sys.path.remove(str(root))


def toy_data(images: int, seed: int):
    """(params, images f32[B,32,32,3], labels int32[B,32,32]) of the trained toy model."""
    params = toy.trained_params()
    x, y = toy.synthetic_batch(7_000 + seed, images)
    return params, np.asarray(x), np.asarray(y)


def scores_of(params, adversarial, labels) -> tuple[np.ndarray, dict]:
    """(confusions int32[B,C,C], dataset metrics) of the JAX toy model on ``adversarial``."""
    logits = toy.logits_fn(params, jnp.asarray(adversarial))
    confusions = np.asarray(image_confusions(logits, jnp.asarray(labels), jnp.ones(labels.shape, bool),
                                             num_classes=toy.NUM_CLASSES))
    return confusions, dataset_metrics(confusions)


def run_ours(params, images, labels, seed: int, schedule: str) -> dict[str, np.ndarray]:
    """Our battery (clean + ten attacks): name -> confusions int32[B, C, C]."""
    msl_track = "masked" if schedule == "single" else None
    config = BatteryConfig(num_classes=toy.NUM_CLASSES, epsilon=EPSILON, sea_schedule=schedule, msl_track=msl_track)
    candidates = build_battery(toy.logits_fn, config)
    keys = instance_keys(jax.random.key(seed), np.arange(len(images)))
    result = run_battery(candidates, toy.logits_fn, params, jnp.asarray(images), jnp.asarray(labels),
                         jnp.ones(labels.shape, bool), keys, num_classes=toy.NUM_CLASSES)
    return dict(zip(result.names, result.confusions))


def run_reference(rse, params, images, labels, seed: int) -> dict[str, np.ndarray]:
    """The authors' battery (clean + ten attacks) on the torch twin: name -> confusions."""
    import torch
    import torch._dynamo

    torch.manual_seed(seed)
    torch.set_num_threads(1)  # OpenMP workers spin when the cores are shared: one thread runs steadily
    net = toy.torch_module(params)
    for parameter in net.parameters():
        parameter.requires_grad_(False)
    x = torch.from_numpy(np.ascontiguousarray(images.transpose(0, 3, 1, 2)))
    y = torch.from_numpy(labels.astype(np.int64))
    names = [name for name in rse.ATTACKS if name != "no-attack"]
    out = {"clean": scores_of(params, images, labels)[0]}
    with torch._dynamo.config.patch(disable=True):  # ALMA prox's ternary search, eager (see tests/attack_reference.py)
        for name, attack in zip(names, rse.build_attacks(names, toy.NUM_CLASSES, eps=EPSILON)):
            with torch.enable_grad():
                adversarial = attack(net, x, y).detach().numpy().transpose(0, 2, 3, 1)
            if np.abs(adversarial - images).max() > EPSILON + 1e-6:
                raise AssertionError(f"{name} left the ε-ball")
            out[RSE_NAMES[name]] = scores_of(params, adversarial, labels)[0]
    return out


def worst_case(confusions: dict[str, np.ndarray]) -> dict[str, float]:
    """Dataset metrics of the per-image worst case over all candidates (clean first, strict <)."""
    from jaxseg_robust.attacks.perturb import per_image_scores, select_worst

    names = ["clean"] + [n for n in RSE_NAMES.values() if n in confusions]
    stack = np.stack([confusions[n] for n in names])  # [K, B, C, C]
    result = {}
    for metric, score in (("accuracy", "accuracy"), ("cmiou", "miou"), ("nmiou", "miou")):
        scores = np.stack([np.asarray(per_image_scores(jnp.asarray(c), metric=score)) for c in stack])
        index, _ = select_worst(scores)
        chosen = stack[np.asarray(index), np.arange(stack.shape[1])]
        result[metric] = dataset_metrics(chosen)[metric]
    return result


def table_rows(runs: dict[str, list[dict[str, np.ndarray]]]) -> list[dict]:
    """Per-attack rows: for each side and metric the mean over seeds (and min/max)."""
    rows = []
    for name in ["clean", *RSE_NAMES.values(), "worst"]:
        row = {"attack": "worst case" if name == "worst" else CANDIDATE_LABELS[name]}
        for side, per_seed in runs.items():
            for metric in METRICS:
                values = [worst_case(c)[metric] if name == "worst" else dataset_metrics(c[name])[metric]
                          for c in per_seed]
                row[f"{side}_{metric}"] = (float(np.mean(values)), float(np.min(values)), float(np.max(values)))
        rows.append(row)
    return rows


def markdown(rows: list[dict], sides=SIDES) -> str:
    """Markdown table in %: per metric, ours (single), ours (progressive), reference; seed mean [min–max]."""
    titles = {"ours_single": "ours (single)", "ours_progressive": "ours (progressive)", "reference": "authors"}
    head = ["attack"] + [f"{m_title} {titles[s]}" for m_title in ("Acc", "CmIoU", "NmIoU") for s in sides]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        cells = [row["attack"]]
        for metric in METRICS:
            for side in sides:
                mean, low, high = row[f"{side}_{metric}"]
                cells.append(f"{100 * mean:.1f}" if high - low < 5e-4 else
                             f"{100 * mean:.1f} [{100 * low:.1f}–{100 * high:.1f}]")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def compare(images: int, seeds, rse, log=print, sides=SIDES) -> list[dict]:
    """Runs the sides (default all three) for every seed on the same images; returns `table_rows`."""
    runs = {side: [] for side in sides}
    params, x, y = toy_data(images, 0)
    for seed in seeds:
        for side in sides:
            start = time.perf_counter()
            if side == "reference":
                runs[side].append(run_reference(rse, params, x, y, seed))
            else:
                runs[side].append(run_ours(params, x, y, seed, side.split("_")[1]))
            log(f"seed {seed} {side}: {time.perf_counter() - start:.1f} s")
    return table_rows(runs)


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=8, help="synthetic 32x32 scenes")
    parser.add_argument("--seeds", default="0,1", help="comma list of seeds (JAX keys / torch.manual_seed)")
    parser.add_argument("--rse", default=os.environ.get("JAXSEG_RSE_REPO"), help="rse checkout ($JAXSEG_RSE_REPO)")
    parser.add_argument("--markdown", default=None, help="also write the table to this file")
    args = parser.parse_args(argv)
    if not args.rse:
        parser.error("no rse checkout: pass --rse or set $JAXSEG_RSE_REPO")
    rse = load_rse(pathlib.Path(args.rse).expanduser())
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    rows = compare(args.images, seeds, rse, log=lambda s: print(s, flush=True))
    table = markdown(rows)
    print(table)
    if args.markdown:
        pathlib.Path(args.markdown).write_text(table + "\n")
    return rows


if __name__ == "__main__":
    main()
