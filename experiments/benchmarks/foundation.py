"""Foundation benchmark: Boundary IoU, EDT and connected components in one run.

Runs `bench_boundary_iou` (jitted Boundary IoU vs the official OpenCV pipeline
and scipy, single pair and a vmapped batch) and `bench_distance_components`
(exact EDT and connected components vs scipy, single mask and a vmapped batch)
in one process on the same machine, on 1024x1024 masks, and prints every
timing as a ratio against its reference (> 1 means jaxseg_robust is faster).

Run: ``python experiments/benchmarks/foundation.py [--batch 64] [--repeats 5]``
with the allocator settings of docs/benchmarking.md for fair CPU
timings (the sub-benchmarks print the environment they ran with).
"""

from __future__ import annotations

import argparse
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import bench_boundary_iou  # noqa: E402
import bench_distance_components  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    """Parses flags, runs both sub-benchmarks and prints their tables."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=64, help="masks per vmapped batch")
    parser.add_argument("--repeats", type=int, default=5, help="timed repetitions (medians)")
    args = parser.parse_args(argv)
    print("== Boundary IoU ==", flush=True)
    bench_boundary_iou.main(["--batch", str(args.batch), "--repeats", str(args.repeats)])
    print("\n== EDT and connected components ==", flush=True)
    bench_distance_components.main(["--batch", str(args.batch), "--repeats", str(args.repeats)])


if __name__ == "__main__":
    main()
