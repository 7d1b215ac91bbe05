"""Strength parity of our min-norm attacks (DAG, ALMA prox, PDPGD) against adv-lib 0.2.8.

On the same model and the same images, each attack runs once in JAX (ours) and once in
PyTorch (adv-lib, called as the paper's code C-R calls it), both outputs are clipped into
the ε-ball as in the battery (spec §1.1, §4.0), and both are scored with the same model:
robust pooled accuracy, CmIoU and NmIoU (with background), plus the per-attack gaps
ours - adv-lib (negative = ours is stronger).

    python experiments/strength_parity.py --models u2netp,deeplabv3 --images-per-dataset 1 \\
        --size 64 --dag-steps 50 --alma-steps 50 --pdpgd-steps 50

Models and data: see ``experiments/perturb_reference.py`` (U²-Net-p with its real weights on
the shared real images vs their GT masks; torchvision DeepLabV3-ResNet50 with random weights
vs its own clean predictions). Budgets default to the battery's (DAG 200, ALMA 500, PDPGD 500),
which take hours on a CPU; pass smaller ones for a quick table. The table is printed as
Markdown and, with ``--csv``, written as CSV.
"""

from __future__ import annotations

import argparse
import csv
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import perturb_reference as ref  # noqa: E402

METRICS = ("accuracy", "cmiou", "nmiou")


def compare(pair: ref.ModelPair, batch: ref.Batch, attacks, budget: ref.Budget, epsilon: float,
            log=print) -> list[dict]:
    """Runs every attack on both sides; returns one row per attack (clean row first).

    Returns:
      dicts with ``model``, ``attack``, ``steps``, ``<metric>_ours``, ``<metric>_advlib``,
      ``<metric>_gap`` (fractions), ``seconds_ours``, ``seconds_advlib``.
    """
    y, m = ref.targets(pair, batch)
    clean = ref.robust_scores(pair, batch.images, batch)
    rows = [{"model": pair.name, "attack": "clean", "steps": 0,
             **{f"{k}_{side}": clean[k] for k in METRICS for side in ("ours", "advlib")},
             **{f"{k}_gap": 0.0 for k in METRICS}, "seconds_ours": 0.0, "seconds_advlib": 0.0}]
    for attack in attacks:
        ours = ref.ours_runner(pair, attack, budget, epsilon)
        theirs = ref.advlib_runner(pair, attack, budget, epsilon)
        start = time.perf_counter()
        adv_ours = np.asarray(ours(jnp.asarray(batch.images), jnp.asarray(y), jnp.asarray(m)).images)
        seconds_ours = time.perf_counter() - start
        start = time.perf_counter()
        adv_theirs = theirs(batch.images, y, m)
        seconds_theirs = time.perf_counter() - start
        for name, adv in (("ours", adv_ours), ("adv-lib", adv_theirs)):
            linf = float(np.abs(adv - batch.images).max())
            if linf > epsilon + 1e-6:
                raise AssertionError(f"{attack} ({name}) left the ε-ball: {linf} > {epsilon}")
        s_ours, s_theirs = ref.robust_scores(pair, adv_ours, batch), ref.robust_scores(pair, adv_theirs, batch)
        row = {"model": pair.name, "attack": attack, "steps": budget.of(attack),
               **{f"{k}_ours": s_ours[k] for k in METRICS}, **{f"{k}_advlib": s_theirs[k] for k in METRICS},
               **{f"{k}_gap": s_ours[k] - s_theirs[k] for k in METRICS},
               "seconds_ours": seconds_ours, "seconds_advlib": seconds_theirs}
        rows.append(row)
        log(f"  {pair.name} {attack}: acc {s_ours['accuracy']:.4f} (ours) vs {s_theirs['accuracy']:.4f} "
            f"(adv-lib), {seconds_ours:.1f} s vs {seconds_theirs:.1f} s (ours includes compilation)")
    return rows


def markdown(rows: list[dict]) -> str:
    """The comparison table in Markdown (percentages)."""
    head = ("| model | attack | steps | Acc ours | Acc adv-lib | ΔAcc | CmIoU ours | CmIoU adv-lib | ΔCmIoU "
            "| NmIoU ours | NmIoU adv-lib | ΔNmIoU |")
    lines = [head, "|" + "---|" * 12]
    for r in rows:
        cells = [r["model"], r["attack"], str(r["steps"])]
        for k in METRICS:
            cells += [f"{100 * r[f'{k}_ours']:.2f}", f"{100 * r[f'{k}_advlib']:.2f}", f"{100 * r[f'{k}_gap']:+.2f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[dict]:
    """Parses flags, runs the comparison, prints the table; returns the rows."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="u2netp,deeplabv3", help="comma list of u2netp, deeplabv3")
    parser.add_argument("--attacks", default=",".join(ref.ATTACKS), help="comma list of " + ", ".join(ref.ATTACKS))
    parser.add_argument("--data", default=str(ref.DEFAULT_REAL_DATA), help="shared real data folder")
    parser.add_argument("--images-per-dataset", type=int, default=1, help="instances per real dataset")
    parser.add_argument("--size", type=int, default=64, help="working resolution (square, pixels)")
    parser.add_argument("--epsilon", type=float, default=8 / 255, help="L∞ radius (image units)")
    parser.add_argument("--dag-steps", type=int, default=200)
    parser.add_argument("--alma-steps", type=int, default=500)
    parser.add_argument("--pdpgd-steps", type=int, default=500)
    parser.add_argument("--csv", default=None, help="also write the rows to this CSV")
    args = parser.parse_args(argv)
    budget = ref.Budget(dag=args.dag_steps, alma=args.alma_steps, pdpgd=args.pdpgd_steps)
    wanted = tuple(a.strip() for a in args.attacks.split(",") if a.strip())
    unknown = sorted(set(wanted) - set(ref.ATTACKS))
    if unknown:
        parser.error(f"unknown attacks {unknown}; known: {', '.join(ref.ATTACKS)}")
    rows = []
    base = ref.real_batch(args.data, args.images_per_dataset, args.size)
    print(f"{len(base.names)} images at {args.size}x{args.size}: {', '.join(base.names)}; "
          f"ε = {args.epsilon:.5f}; budgets {budget}", flush=True)
    for name in [n.strip() for n in args.models.split(",") if n.strip()]:
        pair = ref.model_pair(name)
        batch = ref.with_model_labels(pair, base) if pair.labels_from_model else base
        attacks = ref.attacks_for(pair, wanted)
        skipped = sorted(set(wanted) - set(attacks))
        if skipped:
            print(f"  {name}: skipping {skipped} (ALMA prox's DLR needs >= 3 classes; {name} has "
                  f"{pair.num_classes})", flush=True)
        rows += compare(pair, batch, attacks, budget, args.epsilon, log=lambda s: print(s, flush=True))
    print()
    print(markdown(rows))
    if args.csv:
        with open(args.csv, "w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
        print(f"wrote {args.csv}")
    return rows


if __name__ == "__main__":
    main()
