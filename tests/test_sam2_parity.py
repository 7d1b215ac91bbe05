"""Numeric parity of the Flax SAM 2 / SAM 2.1 against the official ``sam2`` code.

For each of the eight official configurations (and the tiny test model) the
official model is built with ``build_sam2`` and its yaml config, every tensor
is randomised, the state dict is saved in the released checkpoint format and
converted with ``python -m ports sam2``; both sides then run the image
predictor on a real image (see tests/sam2_parity_utils.py for every output
compared). Needs ``$JAXSEG_SAM2_REPO`` (skips cleanly without it).

Tolerances: logits, IoU predictions, object scores and features within 1e-4
x their scale (max |value|), the float32 noise of two implementations that
sum in different orders; Dice-loss gradients w.r.t. point and box
coordinates within 1e-3 relative (L2). Each test prints its numbers (``-s``).
Everything but the tiny model and Hiera-T is also marked slow; run the large
ones one at a time (``-k large``) to bound memory.
"""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.parity

torch = pytest.importorskip("torch")

from sam2_parity_utils import (CASES, GRAD_CASES, TEST_SPEC, check_features,  # noqa: E402
                               check_gradients, check_predictions, official_spec, run_parity)

from jaxseg_robust.models.sam2.config import official_config  # noqa: E402
from ports.sam2 import VIDEO_PARTS, official_sam2_image_shapes, video_part  # noqa: E402

FAST = {("hiera_tiny", "2.1")}
CONFIGS = [pytest.param((TEST_SPEC, None), id="sam2_test")] + [
    pytest.param((official_spec(variant, version, seed=10 * i + j), (variant, version)),
                 id=f"sam{version}_{variant}",
                 marks=() if (variant, version) in FAST else pytest.mark.slow)
    for i, variant in enumerate(("hiera_tiny", "hiera_small", "hiera_base_plus", "hiera_large"))
    for j, version in enumerate(("2", "2.1"))
]


@pytest.fixture(scope="module", params=CONFIGS)
def results(request, tmp_path_factory):
    spec, official = request.param
    out = run_parity(spec, request, tmp_path_factory)
    return out + (official,)


def test_official_key_layout(results):
    """Our list of the official image-path keys equals the official model's; the rest is video."""
    spec, _, ref, _, out_dir, official = results
    shapes = ref["official_shapes"]
    image = {k: v for k, v in shapes.items() if video_part(k) is None}
    if official is not None:
        assert image == official_sam2_image_shapes(official_config(*official))
        skipped = (out_dir / "skipped_video_keys.txt").read_text().splitlines()[1:]
        assert sorted(line.split("\t")[0] for line in skipped) == sorted(set(shapes) - set(image))
    parts = {video_part(k) for k in shapes} - {None}
    assert parts <= {name for _, name in VIDEO_PARTS} and "memory attention" in parts


def test_features(results):
    check_features(results[:5])


@pytest.mark.parametrize("case", CASES)
def test_predictions(results, case):
    check_predictions(results[:5], case)


@pytest.mark.parametrize("case,multimask", GRAD_CASES)
def test_dice_gradients_wrt_prompt_coordinates(results, case, multimask):
    check_gradients(results[:5], case, multimask)


def test_bicubic_position_embedding_matches_torch():
    """`bicubic_matrix` is torch's bicubic kernel (a = -0.75, half-pixel, clamped borders)."""
    from jaxseg_robust.models.sam2.hiera import bicubic_matrix

    rng = np.random.default_rng(0)
    for n_in, n_out in [(14, 256), (7, 256), (3, 32), (14, 14), (7, 5), (2, 9)]:
        x = rng.normal(size=(1, 3, n_in, n_in)).astype(np.float32)
        want = torch.nn.functional.interpolate(torch.from_numpy(x), size=(n_out, n_out),
                                               mode="bicubic").numpy()
        m = bicubic_matrix(n_in, n_out).astype(np.float64)
        got = np.einsum("Hh,Ww,bchw->bcHW", m, m, x.astype(np.float64))
        np.testing.assert_allclose(got, want, atol=2e-6, err_msg=f"{n_in} -> {n_out}")
