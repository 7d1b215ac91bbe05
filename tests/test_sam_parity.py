"""Numeric parity of the Flax SAM against the official ``segment_anything`` package.

For each variant the official model is built with its builder (no
checkpoint), EVERY tensor is overwritten with seeded random values of a
sensible scale (``pos_embed`` and ``rel_pos_*``, zero in the official init,
included), the state dict is saved with ``torch.save`` and converted with our
CLI (``python -m ports sam``), and both models run on a real image at full
1024 size: image embeddings; low-res logits, upsampled mask logits and IoU
predictions for one point, several points, a box, box + points and mask input,
with and without multimask output; gradients of a Dice loss w.r.t. point and
box coordinates (torch autograd through the same official modules). The
harness is shared with MobileSAM and SAM-HQ: tests/sam_parity_utils.py.

Tolerances: logits and embeddings within 1e-4 x their scale (max |value|);
gradients within 1e-3 relative (L2). Each test prints its measured numbers
(run with ``-s`` to see them). ViT-L/H are also marked slow; run them one at
a time (``-k vit_l``) to bound memory.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest

pytestmark = pytest.mark.parity

torch = pytest.importorskip("torch")
sam_pkg = pytest.importorskip("segment_anything")

from sam_parity_utils import (CASES, GRAD_CASES, RefSpec, check_embeddings,  # noqa: E402
                              check_gradients, check_predictions, load_image_and_target,
                              max_err, run_parity)

from jaxseg_robust.models import zoo  # noqa: E402
from jaxseg_robust.ops.resize import longest_side_shape  # noqa: E402

SPECS = {v: RefSpec("segment_anything", v, "sam", seed=i) for i, v in
         enumerate(("vit_b", "vit_l", "vit_h"))}
VARIANTS = [
    pytest.param("vit_b", id="vit_b"),
    pytest.param("vit_l", id="vit_l", marks=pytest.mark.slow),
    pytest.param("vit_h", id="vit_h", marks=pytest.mark.slow),
]


@pytest.fixture(scope="module", params=VARIANTS)
def results(request, tmp_path_factory):
    variant = request.param
    return run_parity(SPECS[variant], request, tmp_path_factory, f"sam_{variant}")


def test_model_inputs_match_both_reference_image_paths(request):
    image, _, _ = load_image_and_target(request)
    from segment_anything.utils.transforms import ResizeLongestSide

    seg = zoo.segmenter("sam_vit_b")
    mean = torch.tensor(seg.config.pixel_mean).view(-1, 1, 1)
    std = torch.tensor(seg.config.pixel_std).view(-1, 1, 1)

    def torch_preprocess(x):
        x = (x - mean) / std
        return torch.nn.functional.pad(x, (0, 1024 - x.shape[-1], 0, 1024 - x.shape[-2]))

    pil = ResizeLongestSide(1024).apply_image(image)
    want_pil = torch_preprocess(torch.as_tensor(pil).permute(2, 0, 1).float())
    got_pil, _ = dataclasses.replace(seg, image_resize="pil").preprocess(image)
    np.testing.assert_allclose(np.asarray(got_pil), want_pil.permute(1, 2, 0).numpy(), atol=1e-6)
    # float path: apply_image_torch's interpolate at SAM's (h', w')
    hw = longest_side_shape(*image.shape[:2], 1024)
    x = torch.as_tensor(image).permute(2, 0, 1)[None].float()
    resized = torch.nn.functional.interpolate(x, hw, mode="bilinear", align_corners=False,
                                              antialias=True)
    want_float = torch_preprocess(resized[0]).permute(1, 2, 0).numpy()
    got_float, _ = seg.preprocess(image)
    err, scale = max_err(got_float, want_float)
    print(f"\nPARITY model input (float path): max_abs_err={err:.3g} scale={scale:.3g}")
    assert err <= 1e-5 * scale


def test_image_embeddings(results):
    check_embeddings(results)


@pytest.mark.parametrize("case", CASES)
def test_predictions(results, case):
    check_predictions(results, case)


@pytest.mark.parametrize("case", GRAD_CASES)
def test_dice_gradients_wrt_prompt_coordinates(results, case):
    check_gradients(results, case)


def test_rel_pos_helpers_match_reference():
    from segment_anything.modeling import image_encoder as ref_enc

    from jaxseg_robust.models.sam.image_encoder import get_rel_pos, window_partition

    rng = np.random.default_rng(0)
    for q, k, length in [(14, 14, 27), (14, 14, 15), (8, 16, 31), (16, 8, 20), (64, 64, 127)]:
        table = rng.normal(size=(length, 8)).astype(np.float32)
        want = ref_enc.get_rel_pos(q, k, torch.from_numpy(table)).numpy()
        got = np.asarray(get_rel_pos(q, k, jnp.asarray(table)))
        np.testing.assert_allclose(got, want, atol=1e-6, err_msg=f"q={q} k={k} L={length}")
    x = rng.normal(size=(2, 10, 13, 4)).astype(np.float32)
    want, pad = ref_enc.window_partition(torch.from_numpy(x), 4)
    got, pad_j = window_partition(jnp.asarray(x), 4)
    assert tuple(pad) == tuple(pad_j)
    np.testing.assert_array_equal(np.asarray(got), want.numpy())

