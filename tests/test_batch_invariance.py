"""Every protocol gives the same records whatever the batch size, the padding slots and the device count.

Four synthetic instances of different sizes (40x48, 56x64, 64x50, 33x61) share one 64x64 bucket
(``--frame round:64``), so each batch mixes sizes inside one padded frame. Each protocol runs with
the embedded model ``sam_demo`` at batch sizes 1, 2 and 4 in this process, and at batch size 1 on
four fake CPU devices in a subprocess (every batch then carries three padding slots, sharded over
the devices). The records must agree:

* exactly for everything discrete: statuses, integers (baseline-clicker clicks, NoC, steps, counts
  of accepted iterates), booleans (acceptance per iterate), strings and list lengths;
* within ``FLOAT_RTOL`` / ``FLOAT_ATOL`` for floats. XLA's CPU kernels for convolutions and matrix
  products tile the batch dimension differently for different batch sizes, so one instance's
  logits differ between batch sizes by float32 rounding (~1e-7 relative). That reaches records in
  two ways: an optimised prompt coordinate moves by an ulp (3e-5 px at 176 px after five Adam
  steps) and, rarely, a pixel whose logit lies within that rounding of the threshold flips, which
  moves an IoU by 1/|union| (1.5e-5 for a 65,000-pixel union). Both stay far below the tolerances;
  a real dependence on the batch (such as the BREPS realism term that switched on only in the
  16-lane program, see docs/protocols/breps.md) changes IoUs by 1e-2 and discrete fields.

BREPS runs in the default selection (its realism term once depended on the batch width); TETRIS,
the grids, RClicks and the perturbation battery are `slow` (about 100 s each for four compiled programs).
The battery runs on the prompted ``sam_demo`` target and four instances of one size, since
``perturb`` buckets by exact image size (mixed sizes would only compile more programs).
"""

from __future__ import annotations

import math
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from jaxseg_robust import cli
from jaxseg_robust.runner.records import latest_records, read_run_records

from tests.cli_helpers import run_captured

SIZES = ((40, 48), (56, 64), (64, 50), (33, 61))
BATCH_SIZES = (1, 2, 4)
FLOAT_RTOL = 1e-4
FLOAT_ATOL = 1e-4
# Wall-clock fields: differ between any two runs.
TIME_KEYS = frozenset({"seconds", "elapsed", "seconds_per_click", "seconds_per_instance", "timing"})

PROTOCOLS = {
    "tetris": ["tetris", "--n-clicks", "3", "--n-opt-steps", "3", "--baseline-clicks", "3"],
    "breps": ["breps", "--n-opt-steps", "5"],
    "click_grid": ["grid", "--kind", "click", "--stride", "8"],
    "box_grid": ["grid", "--kind", "box", "--stride", "8"],
    "rclicks": ["rclicks", "--clickability", "dt", "--n-clicks", "3", "--groups", "2"],
    "perturb": ["perturb", "--attacks", "padam-ce,dag,pdpgd", "--eps", "8/255", "--padam-steps", "2",
                "--dag-iterations", "2", "--pdpgd-steps", "2",
                "--no-report", "--examples", "0"],
}
SLOW = {"tetris", "click_grid", "box_grid", "rclicks", "perturb"}


def write_instances(folder: pathlib.Path, sizes=SIZES) -> None:
    """``folder/{images,masks}/s<i>.png``: an elliptic bright object on a dark noisy background."""
    (folder / "images").mkdir(parents=True)
    (folder / "masks").mkdir()
    for index, (height, width) in enumerate(sizes):
        rng = np.random.default_rng(index)
        yy, xx = np.mgrid[:height, :width]
        cy, cx = rng.uniform(0.4, 0.6) * height, rng.uniform(0.4, 0.6) * width
        mask = ((yy - cy) / (0.3 * height)) ** 2 + ((xx - cx) / (0.25 * width)) ** 2 <= 1
        image = rng.integers(0, 80, (height, width, 3)).astype(np.uint8)
        image[mask] = (image[mask] // 2 + 150).astype(np.uint8)
        Image.fromarray(image).save(folder / "images" / f"s{index}.png")
        Image.fromarray(mask.astype(np.uint8) * 255).save(folder / "masks" / f"s{index}.png")


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> pathlib.Path:
    folder = tmp_path_factory.mktemp("invariance") / "toy"
    write_instances(folder)
    return folder


@pytest.fixture(scope="module")
def same_size_folder(tmp_path_factory) -> pathlib.Path:
    """Four 40x48 instances: ``perturb`` compiles its battery per exact image size, so one size keeps it short."""
    folder = tmp_path_factory.mktemp("invariance_perturb") / "toy"
    write_instances(folder, sizes=(SIZES[0],) * 4)
    return folder


def protocol_argv(protocol: str, folder: pathlib.Path, out: pathlib.Path, batch_size: int) -> list[str]:
    data = (["--datasets", str(folder)] if protocol == "perturb"
            else ["--folder", str(folder / "images"), str(folder / "masks"), "--frame", "round:64"])
    return [*PROTOCOLS[protocol], "--model", "sam_demo", *data, "--progress", "none", "--out", str(out),
            "--batch-size", str(batch_size)]


def differences(reference, other, path: str = "") -> list[str]:
    """Where two records differ beyond the module's rules (an empty list when they agree)."""
    if isinstance(reference, dict) and isinstance(other, dict):
        if set(reference) != set(other):
            return [f"{path}: keys {sorted(set(reference) ^ set(other))}"]
        return [d for key in reference if key not in TIME_KEYS
                for d in differences(reference[key], other[key], f"{path}/{key}")]
    if isinstance(reference, list) and isinstance(other, list):
        if len(reference) != len(other):
            return [f"{path}: lengths {len(reference)} != {len(other)}"]
        return [d for index, (a, b) in enumerate(zip(reference, other))
                for d in differences(a, b, f"{path}[{index}]")]
    if isinstance(reference, float) or isinstance(other, float):
        if not isinstance(reference, (int, float)) or not isinstance(other, (int, float)) \
                or isinstance(reference, bool) or isinstance(other, bool):
            return [f"{path}: {reference!r} != {other!r}"]
        if math.isnan(reference) and math.isnan(other):
            return []
        if math.isclose(reference, other, rel_tol=FLOAT_RTOL, abs_tol=FLOAT_ATOL):
            return []
        return [f"{path}: {reference!r} != {other!r}"]
    return [] if reference == other else [f"{path}: {reference!r} != {other!r}"]


def records_of(out: pathlib.Path) -> dict:
    records = latest_records(read_run_records(out))
    assert records and all(r["status"] == "ok" for r in records.values()), records
    return records


def assert_same_records(reference: dict, other: dict, label: str) -> None:
    assert set(reference) == set(other), label
    found = [f"{key}{d}" for key in reference for d in differences(reference[key], other[key])]
    assert not found, f"{label}: {len(found)} differences, first: {found[:8]}"


def test_differences_catches_what_it_must():
    """The comparison itself: discrete changes and float changes beyond tolerance are found."""
    assert differences({"a": [1, 2.0]}, {"a": [1, 2.0 + 1e-6]}) == []
    assert differences({"a": 1}, {"a": 2}) and differences({"a": True}, {"a": False})
    assert differences({"a": 0.5}, {"a": 0.5 + 1e-3}) and differences({"a": [1]}, {"a": [1, 2]})
    assert differences({"a": 1.0}, {"b": 1.0}) and differences({"a": float("nan")}, {"a": 0.0})
    assert differences({"seconds": 1.0}, {"seconds": 9.0}) == []


def run_in_fake_devices(argv: list[str], devices: int) -> subprocess.CompletedProcess:
    flags = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={devices}".strip()
    env = dict(os.environ, XLA_FLAGS=flags, JAX_PLATFORMS="cpu")
    code = f"import sys; from jaxseg_robust import cli; sys.exit(cli.main({argv!r}))"
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=1800)


@pytest.mark.parametrize("protocol", [pytest.param(p, marks=pytest.mark.slow) if p in SLOW else p for p in PROTOCOLS])
def test_records_do_not_depend_on_batch_size_or_device_count(protocol, request, tmp_path):
    folder = request.getfixturevalue("same_size_folder" if protocol == "perturb" else "folder")
    runs = {}
    for batch_size in BATCH_SIZES:
        out = tmp_path / f"batch{batch_size}"
        code, _, err = run_captured(protocol_argv(protocol, folder, out, batch_size))
        assert code == cli.EXIT_OK, err[-2000:]
        runs[batch_size] = records_of(out)
    for batch_size in BATCH_SIZES[1:]:
        assert_same_records(runs[1], runs[batch_size], f"{protocol}: batch 1 vs {batch_size}")
    out = tmp_path / "devices4"
    result = run_in_fake_devices(protocol_argv(protocol, folder, out, 1), devices=4)
    assert result.returncode == cli.EXIT_OK, result.stderr[-3000:]
    assert '"devices": 4' in (out / "manifest.json").read_text()
    assert_same_records(runs[1], records_of(out), f"{protocol}: 1 device vs 4 devices (batch 1 -> 4 slots)")
