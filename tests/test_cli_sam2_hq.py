"""`jaxseg-robust breps` and `tetris` on the tiny random-weight HQ-SAM 2 (``sam2_hq_tiny``).

No protocol code is written for the family: both commands run it through the
Segmenter seam. The BREPS run's tight-box IoU is recomputed with the library
(`Sam2HQSegmenter.decode` on the recorded box, multimask with the best
predicted IoU, logits > 0) and must equal the record; the same box without the
HQ mask gives another IoU, so the run went through HQ-SAM 2's output.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from jaxseg_robust.models import zoo
from jaxseg_robust.models.sam2.segmenter import Sam2Segmenter
from jaxseg_robust.prompts.types import make_prompts

from cli_helpers import GOOD, folder_flags, make_folder, records_by_status, run_captured

pytestmark = pytest.mark.slow  # each command compiles the tiny Hiera and its protocol (70-190 s here)

MODEL = "sam2_hq_tiny"


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_folder(tmp_path_factory.mktemp("sam2_hq_cli"), bad=False)


@pytest.fixture(scope="module")
def breps_run(folder):
    out = folder.parent / "breps"
    code, stdout, stderr = run_captured(["breps", "--model", MODEL, *folder_flags(folder), "--out", str(out),
                                         "--n_opt_steps", "3", "--lr_mult", "60", "--batch-size", "3",
                                         "--progress", "none"])
    return out, code, stdout, stderr


def _manifest(out) -> dict:
    return json.loads((out / "manifest.json").read_text())


def _iou(mask: np.ndarray, gt: np.ndarray) -> float:
    return float((mask & gt).sum() / (mask | gt).sum())


def test_breps_runs_every_instance_with_the_family_threshold(breps_run):
    out, code, stdout, stderr = breps_run
    assert code == 0, stderr
    ok, failed, _ = records_by_status(out)
    assert sorted(ok) == sorted(GOOD) and not failed
    for record in ok.values():
        assert set(record["payload"]) >= {"min", "max"}
    config = _manifest(out)["config"]
    assert config["model"] == MODEL and config["model_source"] == "random:0" and config["thresh"] == 0.5
    assert "| toy | 3 | 0 |" in stdout


def test_breps_tight_box_iou_is_hq_sam2s_output(breps_run, folder):
    out, code, _, stderr = breps_run
    assert code == 0, stderr
    ok, _, _ = records_by_status(out)
    segmenter = zoo.segmenter(MODEL)
    params = segmenter.init(0)  # the weights of `--model sam2_hq_tiny` (random:0)
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
        low_res, iou = segmenter.decode_low_res(params, features, prompts, transform)
        sam, _, index = Sam2Segmenter.select(segmenter, low_res[:-1], iou, multimask_output=True)
        sam_only = np.asarray(segmenter.upsample(sam[index], transform)) > 0
        assert abs(_iou(sam_only, gt) - trajectory["iou"][0]) > 1e-3


def test_tetris_runs_every_instance(folder):
    out = folder.parent / "tetris"
    code, _, stderr = run_captured(["tetris", "--model", MODEL, *folder_flags(folder), "--out", str(out),
                                    "--n_clicks", "2", "--n_opt_steps", "2", "--lr_mult", "4",
                                    "--baseline-clicks", "2", "--batch-size", "3", "--progress", "none"])
    assert code == 0, stderr
    ok, failed, _ = records_by_status(out)
    assert sorted(ok) == sorted(GOOD) and not failed
    for record in ok.values():
        payload = record["payload"]
        assert set(payload) >= {"min", "max", "baseline"}
        assert len(payload["max"]["iou"]) == 2 and len(payload["baseline"]["iou"]) == 2
    config = _manifest(out)["config"]
    assert config["model"] == MODEL and config["attack"]["thr"] == 0.5
