"""The authors' SAM 3 code, for parity tests (``$JAXSEG_SAM3_REPO``).

``JAXSEG_SAM3_REPO`` names a checkout of facebookresearch/sam3 (the folder
holding ``sam3/``); `import_reference` puts it on ``sys.path`` and imports the
modules of the interactive path. Nothing of it is copied into this repository.
Importing ``sam3`` pulls in its training data code, which imports ``decord``
(a video decoder, not installable here and not used by the image path); the
harness registers an empty stand-in module for it and for nothing else.

`build_reference(config, seed)` builds, from the reference modules and with
the arguments of ``model_builder._create_vit_backbone`` / ``_create_vit_neck``
/ ``build_tracker`` at our config's sizes, the two parts
``Sam3Processor.set_image`` and ``Sam3Image.predict_inst`` use:
``backbone`` (``SAM3VLBackbone`` over ``Sam3DualViTDetNeck(add_sam2_neck=True)``
over ``ViT``; no text encoder) and ``inst_interactive_predictor``
(``SAM3InteractiveImagePredictor`` over ``Sam3TrackerBase``, whose video memory
modules are inert stand-ins without parameters: they are not on this path).
Every float tensor gets seeded random values of a sensible scale.
`official_state_dict` is that model's state dict in the layout of ``sam3.pt``
(``detector.`` + backbone keys, ``tracker.`` + tracker keys), which the
authors' own ``model_builder._load_checkpoint`` maps back.
"""

from __future__ import annotations

import importlib
import os
import pathlib
import sys
import types
import warnings

import numpy as np

REPO_ENV = "JAXSEG_SAM3_REPO"
EMBEDDING_NAMES = ("iou_token.weight", "mask_tokens.weight", "obj_score_token.weight",
                   "point_embeddings", "not_a_point_embed.weight", "no_mask_embed.weight",
                   "positional_encoding_gaussian_matrix")
CONV_TRANSPOSE_NAMES = ("dconv_2x2", "output_upscaling")
PREDICTOR_PREFIX = "inst_interactive_predictor.model."


def repo_path() -> pathlib.Path | None:
    """The SAM 3 checkout named by ``$JAXSEG_SAM3_REPO``, or None when not configured."""
    value = os.environ.get(REPO_ENV, "")
    if not value:
        return None
    path = pathlib.Path(value).expanduser()
    return path if (path / "sam3" / "model" / "vitdet.py").is_file() else None


def import_reference() -> types.SimpleNamespace:
    """The reference modules of the interactive path, from the checkout."""
    path = repo_path()
    if path is None:
        raise RuntimeError(f"${REPO_ENV} does not point to a SAM 3 checkout")
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))
    if "decord" not in sys.modules:  # video decoding of the training data code only
        stand_in = types.ModuleType("decord")
        stand_in.cpu = stand_in.VideoReader = None
        sys.modules["decord"] = stand_in
    names = ("vitdet", "necks", "vl_combiner", "position_encoding", "sam3_tracker_base",
             "sam1_task_predictor", "sam3_image", "sam3_image_processor")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        modules = {n: importlib.import_module(f"sam3.model.{n}") for n in names}
        modules["model_builder"] = importlib.import_module("sam3.model_builder")
    return types.SimpleNamespace(**modules)


def _tracker(ref, config):
    """``build_tracker``'s ``Sam3TrackerBase`` at ``config``'s sizes, memory modules inert."""
    import torch  # noqa: PLC0415

    class EncoderOnly(torch.nn.Module):  # what __init__ reads of the memory transformer
        decoder = None
        d_model = config.d_model

    return ref.sam3_tracker_base.Sam3TrackerBase(
        backbone=None, transformer=EncoderOnly(), maskmem_backbone=torch.nn.Module(),
        num_maskmem=7, image_size=config.image_size, backbone_stride=config.encoder.patch_size,
        multimask_output_in_sam=True, multimask_output_for_tracking=True,
        multimask_min_pt_num=0, multimask_max_pt_num=1, max_cond_frames_in_attn=4,
        sam_mask_decoder_extra_args={
            "dynamic_multimask_via_stability": config.dynamic_multimask_via_stability,
            "dynamic_multimask_stability_delta": config.dynamic_multimask_stability_delta,
            "dynamic_multimask_stability_thresh": config.dynamic_multimask_stability_thresh})


def reference_model(ref, config):
    """A module with ``backbone`` and ``inst_interactive_predictor``, as ``Sam3Image`` has them."""
    import torch  # noqa: PLC0415

    enc = config.encoder
    vit = ref.vitdet.ViT(
        img_size=enc.img_size, pretrain_img_size=enc.pretrain_img_size, patch_size=enc.patch_size,
        embed_dim=enc.embed_dim, depth=enc.depth, num_heads=enc.num_heads, mlp_ratio=enc.mlp_ratio,
        norm_layer="LayerNorm", drop_path_rate=0.1, qkv_bias=True, use_abs_pos=True,
        tile_abs_pos=True, global_att_blocks=tuple(enc.global_att_blocks), rel_pos_blocks=(),
        use_rope=True, use_interp_rope=True, window_size=enc.window_size,
        pretrain_use_cls_token=True, retain_cls_token=False, ln_pre=True, ln_post=False,
        return_interm_layers=False, bias_patch_embed=False)
    position = ref.position_encoding.PositionEmbeddingSine(
        num_pos_feats=config.d_model, normalize=True, scale=None, temperature=10000)
    neck = ref.necks.Sam3DualViTDetNeck(position_encoding=position, d_model=config.d_model,
                                        scale_factors=[4.0, 2.0, 1.0, 0.5], trunk=vit,
                                        add_sam2_neck=True)
    model = torch.nn.Module()
    model.backbone = ref.vl_combiner.SAM3VLBackbone(visual=neck, text=None, scalp=1)
    predictor = ref.sam1_task_predictor.SAM3InteractiveImagePredictor(_tracker(ref, config))
    g = config.embedding_size  # the predictor hard-codes the 1008 px grids (288, 144, 72)
    predictor._bb_feat_sizes = [(4 * g, 4 * g), (2 * g, 2 * g), (g, g)]
    model.inst_interactive_predictor = predictor
    return model


def randomize_(model, seed: int) -> None:
    """Seeded values of a sensible scale for every float tensor (complex RoPE tables untouched).

    Token and prompt embeddings N(0, 1); ``pos_embed`` 0.2 N(0, 1); weights with
    >= 2 axes N(0, 1 / fan_in) (ConvTranspose2d: fan_in = input channels, the
    first axis); 1-D weights (norm scales) 1 + 0.1 N(0, 1); biases 0.1 N(0, 1).
    """
    import torch  # noqa: PLC0415

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, t in model.state_dict().items():
            if not t.is_floating_point():
                continue
            noise = torch.randn(t.shape, generator=gen)
            if any(k in name for k in EMBEDDING_NAMES):
                t.copy_(noise)
            elif name.endswith("pos_embed"):
                t.copy_(0.2 * noise)
            elif t.ndim >= 2:
                transposed = any(k in name for k in CONV_TRANSPOSE_NAMES) and t.ndim == 4
                fan_in = t.shape[0] if transposed else t[0].numel()
                t.copy_(noise / np.sqrt(fan_in))
            elif name.endswith("weight"):
                t.copy_(1.0 + 0.1 * noise)
            else:
                t.copy_(0.1 * noise)


def build_reference(config, seed: int):
    """(reference modules, randomised reference model in eval mode) for a `Sam3Config`."""
    ref = import_reference()
    model = reference_model(ref, config)
    randomize_(model, seed)
    model.eval()
    return ref, model


def official_state_dict(model) -> dict:
    """``model``'s tensors under the keys of ``sam3.pt`` (``detector.*``, ``tracker.*``)."""
    out = {}
    for key, value in model.state_dict().items():
        if key.startswith(PREDICTOR_PREFIX):
            out["tracker." + key[len(PREDICTOR_PREFIX):]] = value
        else:
            out["detector." + key] = value
    return out


def cuda_transform(resolution: int):
    """``Sam3Processor.transform`` with the arithmetic torchvision runs on a CUDA image.

    ``v2.Resize`` of a uint8 image resizes in float32 and rounds back (``round_()``)
    on CUDA; on the CPU it runs its own uint8 kernel. The authors run SAM 3 on
    CUDA, so the CPU parity run uses this transform (docs/models/sam3.md).
    """
    import torch  # noqa: PLC0415
    from torchvision.transforms import v2  # noqa: PLC0415

    return v2.Compose([
        v2.ToDtype(torch.float32, scale=False),
        v2.Resize(size=(resolution, resolution)),
        v2.Lambda(lambda x: x.round().clamp(0, 255) / 255.0),
        v2.Normalize(mean=[0.5, 0.5, 0.5], std=[0.5, 0.5, 0.5]),
    ])


def processor(ref, model, *, cuda_arithmetic: bool = True):
    """The authors' ``Sam3Processor`` on the CPU (with `cuda_transform` unless told otherwise)."""
    resolution = model.inst_interactive_predictor.model.image_size
    out = ref.sam3_image_processor.Sam3Processor(model, resolution=resolution, device="cpu")
    if cuda_arithmetic:
        out.transform = cuda_transform(resolution)
    return out


def set_image(ref, model, image: np.ndarray) -> dict:
    """``Sam3Processor.set_image`` on a uint8[H, W, 3] RGB image (as a PIL image, the notebook's input)."""
    from PIL import Image  # noqa: PLC0415

    return processor(ref, model).set_image(Image.fromarray(image))


def decode_with_grad(model, state: dict, coords=None, labels=None, box=None, *,
                     multimask_output: bool = True):
    """``SAM3InteractiveImagePredictor._predict`` after ``predict_inst``'s feature set-up, with autograd.

    Args:
      coords: torch f32[1, N, 2] points in original-image pixels (may require grad); labels i32[1, N].
      box: torch f32[1, 4] in original-image pixels (may require grad).

    Returns:
      (masks [1, C, H, W] logits at the original size, hole filling included; iou [1, C]).
    """
    import torch  # noqa: PLC0415

    predictor = model.inst_interactive_predictor
    tracker = predictor.model
    h, w = state["original_height"], state["original_width"]
    scale = torch.tensor([tracker.image_size / w, tracker.image_size / h], dtype=torch.float32)
    _, feats, _, _ = tracker._prepare_backbone_features(state["backbone_out"]["sam2_backbone_out"])
    feats[-1] = feats[-1] + tracker.no_mem_embed
    maps = [f.permute(1, 2, 0).view(1, -1, *size)
            for f, size in zip(feats[::-1], predictor._bb_feat_sizes[::-1])][::-1]
    points = []
    if box is not None:
        points.append((box.reshape(-1, 2, 2) * scale, torch.tensor([[2, 3]], dtype=torch.int)))
    if coords is not None:
        points.append((coords * scale, labels))
    concat = (torch.cat([p[0] for p in points], dim=1), torch.cat([p[1] for p in points], dim=1))
    sparse, dense = tracker.sam_prompt_encoder(points=concat, boxes=None, masks=None)
    low, iou, _, _ = tracker.sam_mask_decoder(
        image_embeddings=maps[-1], image_pe=tracker.sam_prompt_encoder.get_dense_pe(),
        sparse_prompt_embeddings=sparse, dense_prompt_embeddings=dense,
        multimask_output=multimask_output, repeat_image=False, high_res_features=maps[:-1])
    return predictor._transforms.postprocess_masks(low, (h, w)), iou


def predict_inst(ref, model, state: dict, **kwargs):
    """``Sam3Image.predict_inst`` (masks, iou, low-res) on the reference model."""
    return ref.sam3_image.Sam3Image.predict_inst(model, state, **kwargs)


__all__ = ["REPO_ENV", "build_reference", "cuda_transform", "decode_with_grad", "import_reference",
           "official_state_dict", "predict_inst", "processor", "randomize_", "reference_model",
           "repo_path", "set_image"]
