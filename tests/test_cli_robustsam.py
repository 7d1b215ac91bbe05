"""`jaxseg-robust breps` and `tetris` with ``--model robustsam_tiny`` (the robust decoder path) on a generated folder.

No protocol code is written for RobustSAM: these runs go through the same
commands, batch program and records as SAM's (tests/test_cli_breps.py,
tests/test_cli_tetris.py hold the protocols' own checks).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from jaxseg_robust import cli

from cli_helpers import GOOD, HEIGHT, WIDTH, folder_flags, make_folder, records_by_status, run_captured

pytestmark = pytest.mark.slow

MODEL = "robustsam_tiny"
STEPS, CLICKS = 2, 2


def run_command(tmp_path_factory, name: str, argv_tail: list[str]):
    root = tmp_path_factory.mktemp(name)
    folder = make_folder(root, bad=False)
    out = root / "run"
    argv = [name, "--model", MODEL, *folder_flags(folder), "--out", str(out), "--progress", "none",
            "--batch-size", "2", *argv_tail]
    return out, *run_captured(argv)


@pytest.fixture(scope="module")
def breps_run(tmp_path_factory):
    return run_command(tmp_path_factory, "breps", ["--n_opt_steps", str(STEPS), "--lr_mult", "60"])


@pytest.fixture(scope="module")
def tetris_run(tmp_path_factory):
    return run_command(tmp_path_factory, "tetris", ["--n_clicks", str(CLICKS), "--n_opt_steps", str(STEPS),
                                                    "--lr_mult", "4", "--baseline-clicks", "3"])


def check_manifest(out) -> None:
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["config"]["model_source"] == "random:0"
    assert manifest["fingerprints"]["model"].startswith("sha256:")


def test_breps_runs_robustsam_tiny(breps_run):
    out, code, stdout, stderr = breps_run
    assert code == cli.EXIT_OK, stderr
    assert f"loading {MODEL} ..." in stderr
    ok, failed, _ = records_by_status(out)
    assert set(ok) == set(GOOD) and not failed
    for record in ok.values():
        payload = record["payload"]
        low, tight, high = (payload["min"]["selection_iou"], payload["tight_selection_iou"],
                            payload["max"]["selection_iou"])
        assert 0 <= low <= tight <= high <= 1
        assert len(payload["max"]["trajectory"]["box_resized"]) == STEPS
        assert payload["tight_box"][0] <= payload["tight_box"][2] < WIDTH
    check_manifest(out)
    assert "3 instances: 3 ok" in stdout


def test_tetris_runs_robustsam_tiny(tetris_run):
    out, code, stdout, stderr = tetris_run
    assert code == cli.EXIT_OK, stderr
    ok, failed, _ = records_by_status(out)
    assert set(ok) == set(GOOD) and not failed
    for record in ok.values():
        payload = record["payload"]
        assert len(payload["min"]["iou"]) == len(payload["max"]["clicks_xy"]) == CLICKS
        clicks = np.asarray([c for t in ("min", "max", "baseline") for c in payload[t]["clicks_xy"]])
        assert (clicks >= 0).all() and (clicks[:, 0] <= WIDTH - 1).all() and (clicks[:, 1] <= HEIGHT - 1).all()
        assert all(0 <= v <= 1 for t in ("min", "max", "baseline") for v in payload[t]["iou"])
    check_manifest(out)
    assert "3 instances: 3 ok" in stdout
