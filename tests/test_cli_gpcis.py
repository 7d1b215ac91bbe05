"""`jaxseg-robust tetris`, `rclicks` and `grid --kind click` with ``--model gpcis_tiny`` on a generated folder.

No protocol code is written for GPCIS: these runs go through the same commands,
batch program and records as the other click-map models, with the authors'
GPCIS predictor (native-resolution zoom-in, resize to the 384 x 384 network
input) by default; box protocols refuse the family (clicks only).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from jaxseg_robust import cli

from cli_helpers import GOOD, HEIGHT, WIDTH, folder_flags, make_folder, records_by_status, run_captured

pytestmark = pytest.mark.slow

MODEL = "gpcis_tiny"
STEPS, CLICKS = 2, 2


def run_command(tmp_path_factory, name: str, argv_tail: list[str]):
    root = tmp_path_factory.mktemp(name)
    folder = make_folder(root, bad=False)
    out = root / "run"
    argv = [name, "--model", MODEL, *folder_flags(folder), "--out", str(out), "--progress", "none",
            "--batch-size", "3", *argv_tail]
    return out, *run_captured(argv)


@pytest.fixture(scope="module")
def tetris_run(tmp_path_factory):
    return run_command(tmp_path_factory, "tetris", ["--n_clicks", str(CLICKS), "--n_opt_steps", str(STEPS),
                                                    "--lr_mult", "4", "--baseline-clicks", "3"])


def test_tetris_runs_gpcis_tiny_through_the_authors_predictor(tetris_run):
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
    manifest = json.loads((out / "manifest.json").read_text())
    predictor = manifest["config"]["isegm"]
    assert predictor["family"] == "gpcis" and not predictor["with_flip"]
    assert predictor["zoom_in"]["target_hw"] == [384, 384] and predictor["zoom_in"]["native_crop"]
    assert "3 instances: 3 ok" in stdout


def test_rclicks_runs_gpcis_tiny(tmp_path_factory):
    out, code, stdout, stderr = run_command(tmp_path_factory, "rclicks", ["--clickability", "dt", "--n-clicks", "3",
                                                                          "--groups", "2"])
    assert code == cli.EXIT_OK, stderr
    ok, failed, _ = records_by_status(out)
    assert set(ok) == set(GOOD) and not failed
    for record in ok.values():
        assert np.shape(record["payload"]["base_biou"]) == (3,)
        assert all(0.0 <= v <= 1.0 for v in np.ravel(record["payload"]["group_biou"]) if v is not None)


def test_click_grid_runs_gpcis_tiny(tmp_path_factory):
    out, code, stdout, stderr = run_command(tmp_path_factory, "grid", ["--kind", "click", "--stride", "8"])
    assert code == cli.EXIT_OK, stderr
    ok, failed, _ = records_by_status(out)
    assert set(ok) == set(GOOD) and not failed


def test_box_protocols_refuse_gpcis(tmp_path_factory):
    out, code, stdout, stderr = run_command(tmp_path_factory, "breps", ["--n_opt_steps", "1"])
    assert code == 2
    assert "gpcis" in stderr and "box" in stderr
