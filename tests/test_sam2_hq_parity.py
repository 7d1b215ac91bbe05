"""Numeric parity of the Flax HQ-SAM 2 against the official code (SysCV/sam-hq, folder ``sam-hq2``).

The official model is built with ``build_sam2`` and its yaml config
(``configs/sam2.1/sam2.1_hq_hiera_l.yaml``; the tiny test model ``sam2_hq_tiny``
as hydra overrides of it), every tensor is randomised, the state dict is
saved in the released checkpoint format (``{"model": state_dict}``) and
converted with ``python -m ports sam2_hq`` (the tiny model with the same
strict converter); both sides then run the image predictor on a real image:
image features, logits, low-res logits and IoU for one point, three points, a
box, box + points (each also with a mask input), multimask on and off, both
sides of the dynamic fallback, object scores, ``hq_token_only``, the
Segmenter's ``decode`` with padded slots, the decoder on the reference's
features, and Dice-loss gradients w.r.t. point and box coordinates (see
tests/sam2_parity_utils.py, shared with SAM 2).

The official package is also named ``sam2``, so it is imported from
``$JAXSEG_SAM_HQ2_REPO`` (the ``sam-hq2`` folder of a SysCV/sam-hq checkout;
needs hydra-core and iopath) in a spawned process of its own, never beside
facebookresearch/sam2; the tests skip cleanly without it.

Tolerances: logits, IoU predictions, object scores and features within 1e-4
x their scale (max |value|), the float32 noise of two implementations that
sum in different orders; Dice-loss gradients within 1e-3 relative (L2). Each
test prints its numbers (``-s``). Hiera-L is also marked slow.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.parity

torch = pytest.importorskip("torch")

from sam2_parity_utils import (CASES, GRAD_CASES, TEST_OVERRIDES, Sam2Spec,  # noqa: E402
                               check_features, check_gradients, check_hq_token_only,
                               check_predictions, run_parity)

from jaxseg_robust.models.sam2.config import official_hq_config  # noqa: E402
from ports.sam2 import VIDEO_PARTS, video_part  # noqa: E402
from ports.sam2_hq import official_sam2_hq_image_shapes  # noqa: E402

ENV_REPO = "JAXSEG_SAM_HQ2_REPO"
YAML = "configs/sam2.1/sam2.1_hq_hiera_l.yaml"
TEST_SPEC = Sam2Spec("sam2_hq_tiny", YAML, TEST_OVERRIDES, seed=13, repo_env=ENV_REPO,
                     port="sam2_hq")
LARGE_SPEC = Sam2Spec("sam2.1_hq_hiera_large", YAML, seed=17, repo_env=ENV_REPO, port="sam2_hq")
CONFIGS = [pytest.param((TEST_SPEC, False), id="sam2_hq_tiny"),
           pytest.param((LARGE_SPEC, True), id="sam2.1_hq_hiera_large", marks=pytest.mark.slow)]


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
    assert "sam_mask_decoder.hf_token.weight" in image
    if official:
        assert image == official_sam2_hq_image_shapes(official_hq_config("hiera_large"))
        skipped = (out_dir / "skipped_video_keys.txt").read_text().splitlines()[1:]
        assert sorted(line.split("\t")[0] for line in skipped) == sorted(set(shapes) - set(image))
    parts = {video_part(k) for k in shapes} - {None}
    assert parts <= {name for _, name in VIDEO_PARTS} and "memory attention" in parts


def test_features(results):
    check_features(results[:5])


@pytest.mark.parametrize("case", CASES)
def test_predictions(results, case):
    check_predictions(results[:5], case)


@pytest.mark.parametrize("case", CASES)
def test_hq_token_only(results, case):
    check_hq_token_only(results[:5], case)


@pytest.mark.parametrize("case,multimask", GRAD_CASES)
def test_dice_gradients_wrt_prompt_coordinates(results, case, multimask):
    check_gradients(results[:5], case, multimask)
