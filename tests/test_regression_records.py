"""Regression: fixed small runs of every prompt protocol give the golden records.

The runs (`regression_runs.RUNS`): TETRIS (MIN/MAX + baseline), BREPS
(MIN/MAX and jitter), the click grid (baseline prefix) and the box grid, and
RClicks (dt click model, two groups), each a real ``jaxseg-robust`` command
with the embedded model ``sam_demo``. Records, grid heatmaps and predicted
masks must equal the goldens in ``tests/golden/`` (written with
``python tests/regression_runs.py synthetic|real`` at the commit whose
numbers are the reference; tolerances in `regression_runs`: integers, boxes
of integers, clicks of the baseline and every mask exact; IoU-like ratios
1e-6 absolute; continuous values 1e-5 relative). One golden per variant
serves both XLA optimisation levels (`regression_runs.golden_path`).
"""

from __future__ import annotations

import json

import pytest

import regression_runs as R


def _check(results, variant: str) -> None:
    path = R.golden_path(variant)
    if not path.is_file():
        pytest.skip(f"no golden records {path.name}; write them with `python tests/regression_runs.py {variant}` "
                    "at the reference commit")
    golden = json.loads(path.read_text())
    expected = {name: golden[name] for name in results}
    differences = R.compare(json.loads(json.dumps(results)), expected)
    assert not differences, "\n".join(differences[:30]) + f"\n({len(differences)} differences)"


def test_synthetic_runs_give_the_golden_records(tmp_path):
    """TETRIS, BREPS MIN/MAX, the click grid and RClicks (the default suite's share)."""
    flags = R.synthetic_folder(tmp_path / "data")
    _check(R.run_all(flags, tmp_path / "runs", R.DEFAULT_RUNS), "synthetic")


@pytest.mark.slow
def test_synthetic_fixed_box_and_box_grid_runs_give_the_golden_records(tmp_path):
    """BREPS jitter boxes and the box grid."""
    flags = R.synthetic_folder(tmp_path / "data")
    names = [name for name, _ in R.RUNS if name not in R.DEFAULT_RUNS]
    _check(R.run_all(flags, tmp_path / "runs", names), "synthetic")


@pytest.mark.slow
def test_real_image_runs_give_the_golden_records(real_data_dir, tmp_path):
    """Every run on two GrabCut (with the ignore band) and two DAVIS images, downsized to 96 px."""
    _check(R.run_all(R.real_flags(real_data_dir), tmp_path / "runs"), "real")


def test_compare_reports_changed_numbers_and_structure():
    golden = {"a": {"iou": 0.5, "n": 3, "clicks": [[1, 2]], "s": "nan"}}
    assert R.compare(json.loads(json.dumps(golden)), golden) == []
    assert R.compare({"a": {"iou": 0.5 + 2e-6, "n": 3, "clicks": [[1, 2]], "s": "nan"}}, golden)
    assert R.compare({"a": {"iou": 0.5, "n": 4, "clicks": [[1, 2]], "s": "nan"}}, golden)
    assert R.compare({"a": {"iou": 0.5, "n": 3, "clicks": [[1, 2, 3]], "s": "nan"}}, golden)
    assert R.compare({"a": {"iou": 0.5, "n": 3, "clicks": [[1, 2]], "s": 0.1}}, golden)
    assert R.compare({"a": {"iou": 0.5, "n": 3, "clicks": [[1, 2]]}}, golden)
    assert R.compare({"a": {"iou": 0.5 + 4e-7, "n": 3, "clicks": [[1, 2]], "s": "nan"}}, golden) == []
    # continuous values (not IoU-like) compare relatively
    assert R.compare({"a": {"loss": 100.0 * (1 + 5e-6)}}, {"a": {"loss": 100.0}}) == []
    assert R.compare({"a": {"loss": 100.0 * (1 + 5e-5)}}, {"a": {"loss": 100.0}})
    assert R.is_iou_like("/tetris/records/toy/a0/payload/min/selection_iou[2]")
