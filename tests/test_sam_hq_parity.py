"""Full-model parity of SAM-HQ with the official ``segment_anything_hq`` package.

For ViT-B (default parity run), ViT-L/H (also slow; run one at a time,
``-k vit_l``) and the TinyViT variant, the official builder's model gets
seeded random weights (every tensor, the HQ modules included), is saved with
``torch.save``, converted with ``python -m ports sam_hq`` and compared end to
end on a real image at 1024 (harness and tolerances:
tests/sam_parity_utils.py): image embeddings and the early ViT feature;
low-res logits, upsampled masks and IoU predictions for one point, several
points, a box, box + points and mask input, for every combination of
``multimask_output`` and ``hq_token_only`` (SamPredictor.predict's
selection); Dice-loss gradients w.r.t. point and box coordinates vs torch
autograd (default options: multimask, SAM + HQ mask).
"""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.parity

torch = pytest.importorskip("torch")
hq_pkg = pytest.importorskip("segment_anything_hq")

from sam_parity_utils import (CASES, GRAD_CASES, RefSpec, build_reference,  # noqa: E402
                              check_embeddings, check_gradients, check_predictions, run_parity)

from jaxseg_robust.models.sam.registry import SAM_HQ_CONFIGS  # noqa: E402
from ports.keytable import PortError  # noqa: E402
from ports.sam_hq import convert_sam_hq, infer_hq_variant, official_sam_hq_shapes  # noqa: E402

SPECS = {v: RefSpec("segment_anything_hq", v, "sam_hq", seed=10 + i, hq=True)
         for i, v in enumerate(("vit_b", "vit_l", "vit_h", "vit_tiny"))}
VARIANTS = [
    pytest.param("vit_b", id="vit_b"),
    pytest.param("vit_tiny", id="vit_tiny"),
    pytest.param("vit_l", id="vit_l", marks=pytest.mark.slow),
    pytest.param("vit_h", id="vit_h", marks=pytest.mark.slow),
]


@pytest.fixture(scope="module", params=VARIANTS)
def results(request, tmp_path_factory):
    variant = request.param
    return run_parity(SPECS[variant], request, tmp_path_factory, f"sam_hq_{variant}")


def test_image_embeddings_and_early_feature(results):
    check_embeddings(results)


@pytest.mark.parametrize("case", CASES)
def test_predictions(results, case):
    check_predictions(results, case)


@pytest.mark.parametrize("case", GRAD_CASES)
def test_dice_gradients_wrt_prompt_coordinates(results, case):
    check_gradients(results, case)


@pytest.mark.parametrize("variant", ["vit_b", "vit_l", "vit_h"])
def test_official_shapes_match_the_reference_builders(variant):
    with torch.device("meta"):
        model = hq_pkg.sam_model_registry[variant]()
    got = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    assert got == official_sam_hq_shapes(SAM_HQ_CONFIGS[variant])


def test_tiny_vit_variant_state_dict_converts_strictly():
    _, model = build_reference(SPECS["vit_tiny"])
    state = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    config = SAM_HQ_CONFIGS["vit_tiny"]
    assert {k: v.shape for k, v in state.items() if not k.startswith("image_encoder.")} == \
        official_sam_hq_shapes(config, include_encoder=False)
    assert infer_hq_variant(state) == "vit_tiny"
    params = convert_sam_hq(state, config)
    np.testing.assert_array_equal(params["mask_decoder"]["compress_vit_feat"]["upscale1"]["kernel"],
                                  state["mask_decoder.compress_vit_feat.0.weight"].transpose(2, 3, 0, 1))
    missing = {k: v for k, v in state.items() if k != "mask_decoder.embedding_maskfeature.3.bias"}
    with pytest.raises(PortError, match="mask_decoder.embedding_maskfeature.3.bias' is missing"):
        convert_sam_hq(missing, config)
    sam_like = {k: v for k, v in state.items() if "hf_" not in k and "compress" not in k
                and "embedding_" not in k}
    with pytest.raises(PortError, match="MobileSAM checkpoint.*ports mobile_sam"):
        convert_sam_hq(sam_like, config)
