"""RClicks rounds on RITM through the authors' predictor, against their predictor loop fed the same clicks.

docs/protocols/rclicks.md §5.5. RITM HRNet-18s with seeded random weights
(clicks sharpened so that the zoom-in moves, tests/click_parity_utils.py) is
saved in the authors' checkpoint format and converted with ``python -m ports``.
Our RClicks program (Base, two clicking groups drawn from the DT click model,
8 rounds, and two real-style first-round clicks; `ClickMapSegmenter` with
``evaluation = rclicks_options("ritm")``: flip, zoom 400 x 400 from the first
click) runs on a real DAVIS image; the clicks it chose are then fed, trajectory
by trajectory, to the authors' ``BasePredictor`` (``set_input_image``, then per
round ``get_prediction(clicker)``: zoom-in, flip, previous prediction fed
back), whose IoUs (``get_iou`` of ``> 0.49``) must match ours per round.

Tolerance |dIoU| <= 1e-3: the clicks are identical, so only float32 rounding
differs (XLA vs oneDNN convolutions, 1.65e-5 of the logits' scale measured in
tests/test_click_models_parity.py); it can flip a pixel whose probability lies
within rounding of 0.49 (one pixel moves the IoU by 1/|union|, ~1e-5 here) or,
rarely, of 0.5 in the zoom-in's ROI box. The numbers are printed.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

pytestmark = pytest.mark.parity
torch = pytest.importorskip("torch")

import click_parity_utils as cu  # noqa: E402

ROUNDS = 8
TARGET = 400
SEED = 11  # the build of the NoC parity case ritm_hrnet18s_fixed400


def test_rclicks_rounds_match_the_authors_predictor_loop(request, tmp_path):
    import jax  # noqa: PLC0415

    from jaxseg_robust.clicksim.click_models import DistanceTransformClickModel  # noqa: PLC0415
    from jaxseg_robust.clicksim.evaluation import RClicksConfig, make_rclicks_batch_fn  # noqa: PLC0415
    from jaxseg_robust.data.buckets import pad_batch  # noqa: PLC0415
    from jaxseg_robust.data.instances import make_instance  # noqa: PLC0415
    from jaxseg_robust.models import zoo  # noqa: PLC0415
    from jaxseg_robust.models.clickmap.isegm import rclicks_options  # noqa: PLC0415

    cu.require_repo("ritm")
    image, gt, source = cu.load_real(request)
    ckpt = tmp_path / "random.pth"
    cu.spawn(cu.torch_rclicks_side, "ritm", "hrnet18s", SEED, image, gt, TARGET, [], str(ckpt))
    cu.port("ritm", ckpt, tmp_path / "converted")
    ckpt.unlink()
    seg, params, _ = zoo.load_params(tmp_path / "converted")
    options = rclicks_options("ritm")
    assert options.zoom_in.target_hw == (TARGET, TARGET) and options.with_flip
    seg = dataclasses.replace(seg, evaluation=options)
    instance = make_instance("sample", image, gt.astype(np.int8), dataset="DAVIS")
    rows, cols = np.nonzero(gt)
    users = np.array([[cols[len(cols) // 3], rows[len(rows) // 3]], [cols[-1], rows[-1]]])
    config = RClicksConfig(num_rounds=ROUNDS, num_groups=2, threshold=0.49, seed=3)
    fn = make_rclicks_batch_fn(seg, params, DistanceTransformClickModel(), config=config,
                               user_clicks={("DAVIS", "sample"): users})
    out = jax.device_get(fn(pad_batch([instance], gt.shape, 1)))
    ours = [out["base_iou"][0], *out["group_iou"][0], *out["user_iou"][0][:len(users)]]
    clicks = [out["base_clicks"][0], *out["group_clicks"][0]]
    trajectories = [[(y, x, p) for x, y, p in c.tolist()] for c in clicks]
    trajectories += [[(y, x, 1)] for x, y in users.tolist()]
    ref = cu.spawn(cu.torch_rclicks_side, "ritm", "hrnet18s", SEED, image, gt, TARGET, trajectories, None)
    d_iou = [np.abs(np.asarray(a, np.float64) - b).max() for a, b in zip(ours, ref["ious"])]
    print(f"\nRCLICKS PARITY ritm_hrnet18s [{source}]: max |dIoU| per trajectory (Base, G1, G2, 2 user "
          f"clicks) = {np.round(d_iou, 6).tolist()}")
    for name, a, b in zip(["Base", "G1", "G2", "user1", "user2"], ours, ref["ious"]):
        a = np.round(np.asarray(a, np.float64), 4).tolist()
        print(f"  {name}: ours {a}\n  {' ' * len(name)}  ref  {np.round(b, 4).tolist()}")
    assert len(set(map(tuple, np.concatenate(clicks)[:, :2].tolist()))) > ROUNDS  # the groups clicked elsewhere
    assert max(np.ptp(a) for a in ours[:3]) > 0.05  # the predictions (and the zoom) moved
    assert max(d_iou) <= 1e-3
