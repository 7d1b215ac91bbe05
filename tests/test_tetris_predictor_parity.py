"""TETRIS on click-map models through the authors' predictor, against a torch restatement of their
per-click loop.

docs/protocols/tetris.md, "Families". RITM HRNet-18s (zoom ``fixed400``) and
SimpleClick ViT-xT (``fixed448``) with seeded random
weights (clicks sharpened so that the zoom-in moves, tests/click_parity_utils.py)
is saved in the authors' checkpoint format and converted with ``python -m
ports``. The reference (experiments/benchmarks/isegm_tetris_reference.py,
``predictor_trajectory``) runs the authors' loop on their network modules
through their own ``ZoomIn`` (``fixed<N>``) and ``AddHorizontalFlip``; ours is
``make_click_batch_fn(mode="minmax", predictor="authors")`` with the same
zoom. Both render the disks with the same exact-area coverage. On a real
DAVIS image, 2 clicks x 3 iterates, MIN and MAX, compared: iterate 0's IoU
per click, the accepted IoU per click and the accepted clicks.

Tolerances: iterate 0 of click 1 sees identical inputs, so only float32
rounding differs (XLA vs oneDNN products): |dIoU| <= 1e-3 as in the
RClicks parity test. Later iterates follow Adam steps on gradients that
carry that rounding (and the soft disks' coverage rounding). Adam's step has
the size of its learning rate whatever the gradient's magnitude, so where a
gradient component is near zero, the rounding can change that step's
direction, and the accepted click moves by up to about one step (an
iterate accepted differently would differ by whole steps and fail the
bound). So: IoUs within 5e-3;
at least 3 of the 4 accepted clicks (2 clicks, MIN and MAX) within 0.25
image pixels of the reference's; every one within one Adam step (the
learning rate through the click's crop scale) per coordinate. A wrong
step size, direction or acceptance rule moves clicks by
several steps. The numbers are printed. (RITM HRNet-18s's MIN click 2 lands
2.99 pixels, 0.83 of its 3.6-pixel step, from the reference's on AMD
family-26 machines and within 0.25 pixels on the earlier machines; its IoU
differs by 3.6e-4.)
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

pytestmark = [pytest.mark.parity, pytest.mark.slow]
torch = pytest.importorskip("torch")

import click_parity_utils as cu  # noqa: E402

SEED = 11
CLICKS, ITERATES = 2, 3
MODELS = [("ritm", "hrnet18s", 400), ("simpleclick", "vit_xt", 448)]  # (repository, variant, zoom size)


@pytest.mark.parametrize("kind,variant,target", MODELS, ids=[f"{k}_{v}" for k, v, _ in MODELS])
def test_tetris_through_the_predictor_matches_the_authors_loop(request, tmp_path, kind, variant, target):
    import jax  # noqa: PLC0415

    from jaxseg_robust.attacks.clicks import make_click_batch_fn  # noqa: PLC0415
    from jaxseg_robust.data.buckets import pad_batch  # noqa: PLC0415
    from jaxseg_robust.data.instances import make_instance  # noqa: PLC0415
    from jaxseg_robust.models import zoo  # noqa: PLC0415
    from jaxseg_robust.models.clickmap.isegm import authors_options  # noqa: PLC0415

    cu.require_repo(kind)
    image, gt, source = cu.load_real(request)
    ckpt = tmp_path / "random.pth"
    ref = cu.spawn(cu.torch_tetris_side, kind, variant, SEED, image, gt, target, CLICKS, ITERATES, str(ckpt))
    cu.port(kind, ckpt, tmp_path / "converted")
    seg, params, _ = zoo.load_params(tmp_path / "converted")
    options = authors_options(seg.config.family)
    assert options.zoom_in.target_hw == (target, target) and options.with_flip
    seg = dataclasses.replace(seg, evaluation=options)
    program = make_click_batch_fn(seg, params, mode="minmax", n_clicks=CLICKS, n_opt_steps=ITERATES, thr=0.49)
    out = jax.device_get(program(pad_batch([make_instance("s", image, gt.astype(np.int8), dataset="DAVIS")],
                                           gt.shape, 1)))
    worst = {"start": 0.0, "iou": 0.0, "steps": 0.0}
    close = []
    for mode in ("min", "max"):
        ours, theirs = out[mode], ref[mode]
        d_start = np.abs(np.asarray(ours["start_iou"][0], np.float64) - theirs["start_iou"])
        d_iou = np.abs(np.asarray(ours["iou"][0], np.float64) - theirs["iou"])
        our_clicks = np.asarray(ours["clicks_xy"][0], np.float64)[:, ::-1]  # (x, y) -> the reference's (row, col)
        d_click = np.abs(our_clicks - theirs["clicks"])
        in_steps = d_click / theirs["step"]
        print(f"\nTETRIS PREDICTOR PARITY {kind}_{variant} {mode} [{source}]: |d start IoU| {d_start.tolist()}, "
              f"|d IoU| {d_iou.tolist()}, |d click| {d_click.max(axis=1).tolist()} px, "
              f"in Adam steps {in_steps.max(axis=1).round(3).tolist()}\n"
              f"  ours iou {np.round(ours['iou'][0], 5).tolist()} clicks {np.round(our_clicks, 3).tolist()}\n"
              f"  ref  iou {np.round(theirs['iou'], 5).tolist()} clicks {np.round(theirs['clicks'], 3).tolist()}")
        assert d_start[0] <= 1e-3
        close += (d_click.max(axis=1) <= 0.25).tolist()
        worst = {"start": max(worst["start"], d_start.max()), "iou": max(worst["iou"], d_iou.max()),
                 "steps": max(worst["steps"], in_steps.max())}
    assert worst["iou"] <= 5e-3 and worst["steps"] <= 1.0, worst
    assert sum(close) >= len(close) - 1, close
