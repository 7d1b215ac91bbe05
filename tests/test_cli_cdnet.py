"""`jaxseg-robust tetris` and `rclicks` with ``--model cdnet_tiny`` (ClickSEG's predictor: resize, flip, PDM).

No protocol code is written for CDNet: these runs go through the same
commands, batch program and records as the other click-map families'
(tests/test_cli_tetris.py and tests/test_rclicks_cli.py hold the protocols'
own checks). The papers' rows for CDNet are TETRIS and RClicks.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from jaxseg_robust import cli

from cli_helpers import GOOD, HEIGHT, WIDTH, folder_flags, make_folder, records_by_status, run_captured

pytestmark = pytest.mark.slow

MODEL = "cdnet_tiny"
STEPS, CLICKS = 2, 2


def run_command(tmp_path_factory, name: str, argv_tail: list[str]):
    root = tmp_path_factory.mktemp(name)
    folder = make_folder(root, bad=False)
    out = root / "run"
    argv = [name, "--model", MODEL, *folder_flags(folder), "--out", str(out), "--progress", "none",
            "--batch-size", "2", *argv_tail]
    return out, *run_captured(argv)


@pytest.fixture(scope="module")
def tetris_run(tmp_path_factory):
    return run_command(tmp_path_factory, "tetris", ["--n_clicks", str(CLICKS), "--n_opt_steps", str(STEPS),
                                                    "--lr_mult", "4", "--baseline-clicks", "3"])


@pytest.fixture(scope="module")
def rclicks_run(tmp_path_factory):
    return run_command(tmp_path_factory, "rclicks", ["--clickability", "dt", "--n-clicks", "3", "--groups", "2"])


def manifest_of(out) -> dict:
    return json.loads((out / "manifest.json").read_text())


def test_tetris_runs_cdnet_tiny(tetris_run):
    out, code, stdout, stderr = tetris_run
    assert code == cli.EXIT_OK, stderr
    assert f"loading {MODEL} ..." in stderr
    ok, failed, _ = records_by_status(out)
    assert set(ok) == set(GOOD) and not failed
    for record in ok.values():
        payload = record["payload"]
        assert len(payload["min"]["iou"]) == len(payload["max"]["clicks_xy"]) == CLICKS
        clicks = np.asarray([c for t in ("min", "max", "baseline") for c in payload[t]["clicks_xy"]])
        assert (clicks >= 0).all() and (clicks[:, 0] <= WIDTH - 1).all() and (clicks[:, 1] <= HEIGHT - 1).all()
        assert all(0 <= v <= 1 for t in ("min", "max", "baseline") for v in payload[t]["iou"])
        assert payload["min"]["iou"][0] <= payload["max"]["iou"][0]
    assert manifest_of(out)["config"]["model_source"] == "random:0"
    assert "3 instances: 3 ok" in stdout
    zoom = manifest_of(out)["config"]["isegm"]["zoom_in"]  # adv-clicks' evaluate_model_cdnet.py zoom-in
    assert zoom["native_crop"] and zoom["skip_clicks"] == 0 and tuple(zoom["target_hw"]) == (64, 64)


def test_rclicks_runs_cdnet_tiny(rclicks_run):
    out, code, stdout, stderr = rclicks_run
    assert code == cli.EXIT_OK, stderr
    ok, failed, _ = records_by_status(out)
    assert set(ok) == set(GOOD) and not failed
    assert "NoC3@90 Sample" in stdout and "| toy |" in stdout
    assert manifest_of(out)["config"]["model_source"] == "random:0"
    zoom = manifest_of(out)["config"]["isegm"]["zoom_in"]  # rclicks' evaluate_model_cdnet.py zoom-in
    assert zoom["native_crop"] and zoom["skip_clicks"] == 1 and tuple(zoom["target_hw"]) == (64, 64)
