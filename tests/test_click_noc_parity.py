"""The isegm NoC loop (zoom-in, flip, CFR-ICL cascade) against the authors' evaluation loop.

The authors' ``evaluate_sample`` with their predictor (tests/click_parity_utils.py,
`torch_noc_side`) runs 20 clicks without early stop on seeded random weights;
`jaxseg_robust.models.clickmap.noc.noc_trajectory` runs the converted weights
with `authors_options`: RITM in its ``fixed400`` mode, SimpleClick at 448,
CFR-ICL at 448 with the adaptive 5-step cascade at the first click (the
cascade is predictor code, tested here on a ViT-xT network built by the CFR-ICL
repository; ViT-H itself is slow). Clicks must be identical and the IoU of
every click equal up to threshold flips (|dIoU| <= 1e-3; the numbers are printed); the
IoUs must move (range > 0.05), else the random network ignored its clicks and the
loop proved nothing.
"""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.parity
torch = pytest.importorskip("torch")

import click_parity_utils as cu  # noqa: E402

CASES = [
    pytest.param("ritm", "hrnet18s", 11, 400, False, "ritm", id="ritm_hrnet18s_fixed400"),
    pytest.param("simpleclick", "vit_xt", 12, 448, False, "simpleclick", id="simpleclick_vit_xt"),
    pytest.param("cfricl", "vit_xt", 13, 448, True, "cfr_icl", id="cfr_icl_cascade_vit_xt"),
    pytest.param("ritm", "hrnet18", 14, 400, False, "ritm", id="ritm_hrnet18_fixed400",
                 marks=pytest.mark.slow),
    pytest.param("simpleclick", "vit_b", 15, 448, False, "simpleclick", id="simpleclick_vit_b",
                 marks=pytest.mark.slow),
]
N_CLICKS = 20


@pytest.mark.parametrize("kind,variant,seed,target,cascade,family", CASES)
def test_noc_loop_matches_authors(kind, variant, seed, target, cascade, family, request,
                                  tmp_path):
    import jax  # noqa: PLC0415
    import jax.numpy as jnp  # noqa: PLC0415

    from jaxseg_robust.models import zoo  # noqa: PLC0415
    from jaxseg_robust.models.clickmap.isegm import authors_options  # noqa: PLC0415
    from jaxseg_robust.models.clickmap.noc import NocConfig, noc_trajectory  # noqa: PLC0415

    cu.require_repo(kind)
    image, gt, source = cu.load_real(request)
    ckpt = tmp_path / "random.pth"
    ref = cu.spawn(cu.torch_noc_side, kind, variant, seed, image, gt, target, N_CLICKS,
                   cascade, str(ckpt))
    cu.port(kind, ckpt, tmp_path / "converted")
    ckpt.unlink()
    seg, params, _ = zoo.load_params(tmp_path / "converted")
    options = authors_options(family)
    assert options.zoom_in.target_hw == (target, target)
    config = NocConfig(n_clicks=N_CLICKS, options=options)
    x, transform = seg.preprocess(image)
    run = jax.jit(lambda p, img, hw, g, v: noc_trajectory(seg, p, img, hw, g, v, config))
    out = run(params, x, transform.original_hw, jnp.asarray(gt), jnp.ones(gt.shape, bool))
    clicks = np.concatenate([np.asarray(out["clicks"]),
                             np.asarray(out["positive"]).astype(int)[:, None]], axis=1)
    ious = np.asarray(out["ious"], np.float64)
    n_same = int(np.argmin(np.all(clicks == ref["clicks"], axis=1).tolist() + [False]))
    d_iou = np.abs(ious - ref["ious"])
    p_err, _ = cu.max_err(np.asarray(out["prob"]), ref["probs"])
    print(f"\nNOC PARITY {request.node.callspec.id} [{source}]: identical clicks "
          f"{n_same}/{N_CLICKS}; max |dIoU| = {d_iou.max():.3g}; last-map max |dprob| = "
          f"{p_err:.3g}\n  ref IoUs {np.round(ref['ious'], 4).tolist()}\n  our IoUs "
          f"{np.round(ious, 4).tolist()}")
    assert np.ptp(ref["ious"]) > 0.05  # the predictions (and the zoom) moved with the clicks
    np.testing.assert_array_equal(clicks, ref["clicks"])
    assert d_iou.max() <= 1e-3
