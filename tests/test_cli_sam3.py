"""Every prompt protocol from the command line on the tiny random-weight SAM 3 (``sam3_tiny``).

No protocol code is written for the family: ``breps``, ``tetris``, ``grid``
(clicks) and ``rclicks`` run it through the Segmenter seam. The BREPS run's
tight-box IoU is recomputed with the library (`Sam3Segmenter.decode` on the
recorded box, multimask with the best predicted IoU, logits > 0) and must
equal the record, so the run went through SAM 3's preprocessing, features and
hole filling.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from jaxseg_robust.models import zoo
from jaxseg_robust.prompts.types import make_prompts

from cli_helpers import GOOD, folder_flags, make_folder, records_by_status, run_captured

pytestmark = pytest.mark.slow  # each command compiles the tiny ViT and its protocol

MODEL = "sam3_tiny"


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_folder(tmp_path_factory.mktemp("sam3_cli"), bad=False)


def run(folder, name: str, *tail: str):
    out = folder.parent / name
    argv = [name, "--model", MODEL, *folder_flags(folder), "--out", str(out), "--progress", "none",
            "--batch-size", "3", *tail]
    return out, *run_captured(argv)


def _manifest(out) -> dict:
    return json.loads((out / "manifest.json").read_text())


def _all_ok(out, code, stderr) -> dict:
    assert code == 0, stderr
    ok, failed, _ = records_by_status(out)
    assert sorted(ok) == sorted(GOOD) and not failed
    assert _manifest(out)["config"]["model"] == MODEL
    return ok


def _iou(mask: np.ndarray, gt: np.ndarray) -> float:
    return float((mask & gt).sum() / (mask | gt).sum())


def test_breps_tight_box_iou_is_sam3s_output(folder):
    out, code, stdout, stderr = run(folder, "breps", "--n_opt_steps", "3", "--lr_mult", "60")
    ok = _all_ok(out, code, stderr)
    assert _manifest(out)["config"]["thresh"] == 0.5 and "| toy | 3 | 0 |" in stdout
    segmenter = zoo.segmenter(MODEL)
    params = segmenter.init(0)  # the weights of `--model sam3_tiny` (random:0)
    low = segmenter.config.low_res_size
    for stem in GOOD:
        image = np.asarray(Image.open(folder / "images" / f"{stem}.png").convert("RGB"))
        gt = np.asarray(Image.open(folder / "masks" / f"{stem}.png")) > 127
        model_input, transform = segmenter.preprocess(image)
        features = segmenter.embed(params, model_input)
        trajectory = ok[stem]["payload"]["max"]["trajectory"]
        prompts = make_prompts(None, None, np.asarray(trajectory["box"][0], np.float32), num_slots=1,
                               mask_shape=(low, low))
        prediction = segmenter.decode(params, features, prompts, transform, multimask_output=True)
        assert _iou(np.asarray(prediction.logits) > 0, gt) == pytest.approx(trajectory["iou"][0], abs=1e-6)


def test_tetris_runs_every_instance(folder):
    out, code, _, stderr = run(folder, "tetris", "--n_clicks", "2", "--n_opt_steps", "2", "--lr_mult", "4",
                               "--baseline-clicks", "2")
    for record in _all_ok(out, code, stderr).values():
        payload = record["payload"]
        assert set(payload) >= {"min", "max", "baseline"}
        assert len(payload["max"]["iou"]) == 2 and len(payload["baseline"]["iou"]) == 2
        assert payload["min"]["iou"][-1] <= payload["max"]["iou"][-1]
    assert _manifest(out)["config"]["attack"]["thr"] == 0.5


def test_click_grid_runs_every_instance(folder):
    out, code, _, stderr = run(folder, "grid", "--kind", "click", "--stride", "8", "--chunk-size", "32")
    for record in _all_ok(out, code, stderr).values():
        payload = record["payload"]
        assert 0.0 <= payload["iou_min"] <= payload["iou_max"] <= 1.0


def test_rclicks_runs_every_instance(folder):
    out, code, _, stderr = run(folder, "rclicks", "--clickability", "dt", "--n-clicks", "3")
    for record in _all_ok(out, code, stderr).values():
        assert record["payload"]
