"""Fixed small CLI runs of every prompt protocol and their records in a comparable form.

Used by `tests/test_regression_records.py` (compare with the golden records
in ``tests/golden/``) and to write those goldens (``python
tests/regression_runs.py synthetic|real``, run at a commit whose numbers are
the reference). Each run is a real ``jaxseg-robust`` command with the
embedded model ``sam_demo`` and tiny settings; what is compared is every
record's status and payload (minus ``source``, which holds absolute paths),
the grid heatmap files and the predicted-mask side files.
"""

from __future__ import annotations

import json
import math
import pathlib
import sys

import numpy as np

GOLDEN_DIR = pathlib.Path(__file__).resolve().parent / "golden"
MODEL = ["--model", "sam_demo"]
COMMON = ["--progress", "none", "--batch-size", "2"]

# (run name, command argv after the data flags). Tiny settings: few clicks, iterates, steps. Compiling
# each command's program dominates the time, so the default suite runs the four engines' main programs
# (`DEFAULT_RUNS`) and the slow selection adds the others.
RUNS = (
    ("tetris", ["tetris", "--n-clicks", "3", "--n-opt-steps", "3", "--lr-mult", "4", "--baseline-clicks", "3"]),
    ("breps", ["breps", "--n-opt-steps", "4"]),
    ("grid_click", ["grid", "--kind", "click", "--stride", "6", "--prefix", "baseline", "--chunk-size", "16"]),
    ("rclicks", ["rclicks", "--clickability", "dt", "--n-clicks", "3", "--groups", "2", "--plot-groups", "0"]),
    ("breps_jitter", ["breps", "--mode", "jitter"]),
    ("grid_box", ["grid", "--kind", "box", "--stride", "12", "--chunk-size", "32"]),
)
DEFAULT_RUNS = ("tetris", "breps", "grid_click", "rclicks")

# Integers, booleans and strings compare exactly (clicks of the clicker, boxes of integers, flags,
# steps; masks are PNG pixel values). Floats under a key that names an IoU (iou, biou, selection_iou,
# auc_iou, mean_iou, iou_reference, ...; `is_iou_like`) are ratios of pixel counts, so one changed
# pixel moves them by >= 1 / (H W) (>= 5e-4 on a 40 x 48 image): 1e-6 absolute means "the same masks"
# while allowing float32 rounding of the division. Other floats (losses, learning rates, optimised
# click and box coordinates, CIoU, corner heat maps) are compared relatively at 1e-5 (with the 1e-6
# absolute floor), which allows float32 reassociation inside XLA's fused kernels and nothing else.
ABS_TOL = 1e-6
REL_TOL = 1e-5


def _png_array(path: pathlib.Path) -> list:
    from PIL import Image  # noqa: PLC0415

    return np.asarray(Image.open(path)).astype(np.uint8).tolist()


def _side_files(run_dir: pathlib.Path) -> dict:
    """Grid heatmaps (npz) and predicted masks (png) of a run directory, by relative path."""
    files = {}
    for path in sorted(run_dir.rglob("*.npz")):
        with np.load(path) as data:
            files[path.relative_to(run_dir).as_posix()] = {name: data[name].tolist() for name in data.files}
    for path in sorted((run_dir / "masks").rglob("*.png")) if (run_dir / "masks").is_dir() else []:
        files[path.relative_to(run_dir).as_posix()] = _png_array(path)
    return files


def _jsonable(value):
    """NaN / inf as strings (JSON has none), everything else unchanged."""
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    return value


def collect(run_dir: pathlib.Path) -> dict:
    """{"records": {"dataset/id": {"status", "payload"}}, "files": ...} of one run directory."""
    from jaxseg_robust.runner.records import latest_records, read_run_records  # noqa: PLC0415

    records = {}
    for key, record in sorted(latest_records(read_run_records(run_dir)).items()):
        payload = {k: v for k, v in (record.get("payload") or {}).items() if k != "source"}
        records["/".join(key)] = {"status": record["status"], "payload": payload}
    return _jsonable({"records": records, "files": _side_files(run_dir)})


def run_all(data_flags: list[str], out_root: pathlib.Path, names=None) -> dict:
    """Runs the entries of `RUNS` named in ``names`` (default all) on the data; returns {run name:
    `collect`}; raises on a non-zero exit."""
    from jaxseg_robust import cli  # noqa: PLC0415

    results = {}
    for name, argv in RUNS:
        if names is not None and name not in names:
            continue
        out = out_root / name
        code = cli.main([*argv, *MODEL, *data_flags, "--out", str(out), *COMMON])
        if code != cli.EXIT_OK:
            raise AssertionError(f"{name}: exit code {code}")
        results[name] = collect(out)
    return results


def synthetic_folder(root: pathlib.Path) -> list[str]:
    """Three generated 40 x 48 image/mask pairs (`cli_helpers.make_folder`); returns the --folder flags."""
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
    from cli_helpers import folder_flags, make_folder  # noqa: PLC0415

    return folder_flags(make_folder(root, bad=False))


def real_flags(real_root: pathlib.Path) -> list[str]:
    """Two GrabCut (ignore band) and two DAVIS images of the real data, downsized to 96 px."""
    return ["--datasets", "GrabCut,DAVIS", "--data-root", str(real_root), "--limit", "2", "--max-side", "96"]


def golden_path(variant: str) -> pathlib.Path:
    """``tests/golden/records_<variant>.json``.

    One golden per variant serves both XLA optimisation levels (the default test
    selection compiles with level 0, tests/conftest.py): at the reference commit the
    level-0 and the default-level records of the synthetic runs were equal within the
    tolerances above.
    """
    return GOLDEN_DIR / f"records_{variant}.json"


def is_iou_like(where: str) -> bool:
    """Whether the value at ``where`` (a "/key/key[i]" path) is an IoU-like ratio (its key names an IoU)."""
    keys = [part.split("[")[0] for part in where.split("/") if part]
    return bool(keys) and "iou" in keys[-1].lower()


def compare(actual, expected, where: str = "") -> list[str]:
    """Differences between two collected trees (see the tolerances above); empty when equal."""
    if isinstance(expected, dict):
        if not isinstance(actual, dict) or set(actual) != set(expected):
            got = sorted(actual) if isinstance(actual, dict) else type(actual).__name__
            return [f"{where}: keys {got} != {sorted(expected)}"]
        return [d for key in expected for d in compare(actual[key], expected[key], f"{where}/{key}")]
    if isinstance(expected, list):
        if not isinstance(actual, list) or len(actual) != len(expected):
            return [f"{where}: {actual!r:.80} != {expected!r:.80} (length)"]
        return [d for i, (a, e) in enumerate(zip(actual, expected)) for d in compare(a, e, f"{where}[{i}]")]
    if isinstance(expected, float) or (isinstance(expected, int) and isinstance(actual, float)):
        a, e = float(actual), float(expected)
        if abs(a - e) <= (ABS_TOL if is_iou_like(where) else max(ABS_TOL, REL_TOL * abs(e))):
            return []
        return [f"{where}: {a!r} != {e!r}"]
    if actual != expected or type(actual) is not type(expected):
        return [f"{where}: {actual!r} != {expected!r}"]
    return []


def main(argv: list[str]) -> int:
    """``python tests/regression_runs.py synthetic|real [REAL_ROOT]``: writes the golden file of ``variant``."""
    import tempfile  # noqa: PLC0415

    variant = argv[0]
    with tempfile.TemporaryDirectory() as tmp:
        root = pathlib.Path(tmp)
        if variant == "synthetic":
            flags = synthetic_folder(root / "data")
        else:
            flags = real_flags(pathlib.Path(argv[1]))
        results = run_all(flags, root / "runs")
    GOLDEN_DIR.mkdir(exist_ok=True)
    golden_path(variant).write_text(json.dumps(results, sort_keys=True, separators=(",", ":")) + "\n")
    print(f"wrote {golden_path(variant)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
