"""Full-model parity of MobileSAM (``zoo`` name ``mobile_sam``) with the ``mobile_sam`` package.

MobileSAM's ``build_sam_vit_t`` model (TinyViT encoder, SAM's prompt encoder
and decoder) gets seeded random weights and BatchNorm statistics, is saved
with ``torch.save``, converted with ``python -m ports mobile_sam`` and
compared end to end on a real image at 1024 (harness and tolerances:
tests/sam_parity_utils.py): image embeddings; low-res logits, upsampled
masks and IoU predictions for one point, several points, a box, box + points
and mask input, with and without multimask output; Dice-loss gradients
w.r.t. point and box coordinates vs torch autograd.

The reference is put in eval mode after its weights are set (MobileSAM's
README usage), so its TinyViT uses the checkpoint's attention biases as the
port does (see ports/mobile_sam.py for the builder's stale-cache quirk).
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

pytestmark = pytest.mark.parity

torch = pytest.importorskip("torch")
pytest.importorskip("mobile_sam")

from sam_parity_utils import (CASES, GRAD_CASES, RefSpec, check_embeddings,  # noqa: E402
                              check_gradients, check_predictions, run_parity)

from jaxseg_robust.models.sam.registry import MOBILE_SAM_CONFIG  # noqa: E402
from ports.keytable import PortError  # noqa: E402
from ports.mobile_sam import convert_mobile_sam  # noqa: E402
from ports.sam import official_mask_decoder_shapes, official_prompt_encoder_shapes  # noqa: E402

SPEC = RefSpec("mobile_sam", "vit_t", "mobile_sam", seed=3)


@pytest.fixture(scope="module")
def results(request, tmp_path_factory):
    return run_parity(SPEC, request, tmp_path_factory, "mobile_sam")


def test_image_embeddings(results):
    check_embeddings(results)


@pytest.mark.parametrize("case", CASES)
def test_predictions(results, case):
    check_predictions(results, case)


@pytest.mark.parametrize("case", GRAD_CASES)
def test_dice_gradients_wrt_prompt_coordinates(results, case):
    check_gradients(results, case)


def _reference_state_dict(package: str, key: str) -> dict:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import importlib  # noqa: PLC0415

        model = importlib.import_module(package).sam_model_registry[key]()
    return {k: v.detach().numpy() for k, v in model.state_dict().items()}


def test_builder_state_dict_converts_and_other_families_are_refused():
    state = _reference_state_dict("mobile_sam", "vit_t")
    shapes = {k: v.shape for k, v in state.items() if not k.startswith("image_encoder.")}
    assert shapes == {**official_prompt_encoder_shapes(MOBILE_SAM_CONFIG),
                      **official_mask_decoder_shapes(MOBILE_SAM_CONFIG)}
    params = convert_mobile_sam(state)
    np.testing.assert_array_equal(params["mask_decoder"]["iou_token"],
                                  state["mask_decoder.iou_token.weight"])
    hq_tiny = _reference_state_dict("segment_anything_hq", "vit_tiny")
    with pytest.raises(PortError, match="mask_decoder.hf_token.weight.*ports sam_hq"):
        convert_mobile_sam(hq_tiny)
