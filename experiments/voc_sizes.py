"""Distinct attacked sizes of a PASCAL VOC / Cityscapes split, exact and with ``--pad-to-multiple N``.

Each distinct (H, W) compiles one set of the battery's programs (at most six,
docs/protocols/perturbation.md §10.5); ``--pad-to-multiple N`` replaces the
image sizes by their frames (§10.6). Reads image headers only.

    python experiments/voc_sizes.py --data-root DATA [--dataset voc] [--multiples 32,64,128]
"""

from __future__ import annotations

import argparse
import collections

from jaxseg_robust.data import semantic
from jaxseg_robust.data.buckets import RoundUpFrame


def main(argv=None) -> None:
    """Prints the number of distinct sizes, the most common ones, and the frame counts per multiple."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-root", required=True)
    parser.add_argument("--dataset", choices=("voc", "cityscapes"), default="voc")
    parser.add_argument("--split", default="val")
    parser.add_argument("--multiples", default="16,32,64,128")
    args = parser.parse_args(argv)
    refs = semantic.list_semantic_dataset(args.dataset, args.data_root, split=args.split)
    sizes = collections.Counter((ref.height, ref.width) for ref in refs)
    print(f"{len(refs)} images, {len(sizes)} distinct attacked sizes; most common: "
          + ", ".join(f"{h}x{w} ({n})" for (h, w), n in sizes.most_common(8)))
    for multiple in (int(m) for m in args.multiples.split(",")):
        frames = collections.Counter(RoundUpFrame(multiple)(size) for size in sizes.elements())
        padded = sum(n * (fh * fw) for (fh, fw), n in frames.items())
        pixels = sum(n * (h * w) for (h, w), n in sizes.items())
        print(f"--pad-to-multiple {multiple}: {len(frames)} frames, padding adds {100 * (padded / pixels - 1):.1f} % "
              f"pixels")


if __name__ == "__main__":
    main()
