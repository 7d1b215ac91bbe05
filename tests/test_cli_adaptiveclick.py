"""`jaxseg-robust tetris`, `rclicks` and `grid --kind click` with ``--model adaptiveclick_tiny`` on a generated folder.

No protocol code is written for AdaptiveClick: it is a click-map family
(`ClickMapSegmenter` with `AdaptiveClickConfig`), so TETRIS and RClicks run
through the authors' isegm predictor (flip, zoom-in 448) and the click grid
runs the network on the whole frame, whose sides must then be multiples of 32
(the images here are 64 x 96). BREPS and the box grid refuse the family (clicks
only), as for RITM / SimpleClick.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from jaxseg_robust import cli

from cli_helpers import records_by_status, run_captured

pytestmark = pytest.mark.slow

MODEL = "adaptiveclick_tiny"
HW = (64, 96)
NAMES = ("a0", "a1")
COMMANDS = {
    "tetris": ["tetris", "--n-clicks", "2", "--n_opt_steps", "2", "--baseline-clicks", "2"],
    "rclicks": ["rclicks", "--clickability", "dt", "--n-clicks", "2", "--groups", "2"],
    "grid": ["grid", "--kind", "click", "--stride", "16"],
}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """Two 64 x 96 images with an elliptic object each (brighter than the noise around it)."""
    root = tmp_path_factory.mktemp("adaptiveclick_cli")
    images, masks = root / "images", root / "masks"
    images.mkdir()
    masks.mkdir()
    rng = np.random.default_rng(0)
    rows, cols = np.ogrid[:HW[0], :HW[1]]
    for index, name in enumerate(NAMES):
        gt = ((rows - 30 - 4 * index) / 16.0) ** 2 + ((cols - 45 + 6 * index) / 24.0) ** 2 <= 1
        image = rng.integers(0, 120, HW + (3,), dtype=np.uint8)
        image[gt] += 120
        Image.fromarray(image).save(images / f"{name}.png")
        Image.fromarray(gt.astype(np.uint8) * 255).save(masks / f"{name}.png")
    return root, ["--folder", str(images), str(masks), "--progress", "none"]


@pytest.fixture(scope="module", params=sorted(COMMANDS))
def command_run(request, folder):
    root, data = folder
    out = root / request.param
    code, stdout, stderr = run_captured([*COMMANDS[request.param], "--model", MODEL, *data, "--out", str(out)])
    return request.param, out, code, stdout, stderr


def test_click_protocols_run_adaptiveclick_tiny(command_run):
    command, out, code, stdout, stderr = command_run
    assert code == cli.EXIT_OK, stderr
    ok, failed, _ = records_by_status(out)
    assert set(ok) == set(NAMES) and not failed
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["config"]["model_source"] == "random:0"
    payload = ok["a0"]["payload"]
    if command == "tetris":
        assert manifest["config"]["attack"]["thr"] == 0.49
        for mode in ("min", "max"):
            assert len(payload[mode]["iou"]) == 2 and all(0 <= v <= 1 for v in payload[mode]["iou"])
            assert payload[mode]["has_mask_input"] == [False, True]
            clicks = np.asarray(payload[mode]["clicks_xy"])
            assert (clicks >= 0).all() and (clicks[:, 0] <= HW[1] - 1).all() and (clicks[:, 1] <= HW[0] - 1).all()
    if command == "rclicks":
        assert manifest["config"]["settings"]["threshold"] == 0.49
    # the whole-frame network (grid) runs every image in its own frame; the predictor's zoom-in does not need to
    assert ("runs every image in its own frame" in stderr) == (command == "grid"), stderr


@pytest.mark.parametrize("argv", [["breps"], ["grid", "--kind", "box"]])
def test_box_protocols_refuse_adaptiveclick(folder, argv):
    root, data = folder
    code, _, stderr = run_captured([*argv, "--model", MODEL, *data, "--out", str(root / ("refused_" + argv[0]))])
    assert code == 2
    assert MODEL in stderr and "clicks only" in stderr


def test_whole_frame_grid_names_the_size_the_network_refuses(tmp_path):
    """40 x 48 images (cli_helpers' folder) are no multiples of 32: every instance fails with the model's
    reason (not a retrace error from the second instance on), and the command exits with code 2."""
    from cli_helpers import GOOD, folder_flags, make_folder  # noqa: PLC0415

    folder = make_folder(tmp_path, bad=False)
    out = tmp_path / "run"
    code, stdout, _ = run_captured(["grid", "--kind", "click", "--stride", "16", "--model", MODEL,
                                    *folder_flags(folder), "--out", str(out), "--progress", "none"])
    assert code == 2
    _, failed, _ = records_by_status(out)
    assert set(failed) == set(GOOD)
    for name in GOOD:
        line = next(line for line in stdout.splitlines() if f"failed toy/{name}:" in line)
        assert "AdaptiveClick (tiny) needs input sides that are positive multiples of 32; got 40x48" in line
