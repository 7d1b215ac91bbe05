"""The authors' AdaptiveClick model (lab206/AdaptiveClick) for parity tests, from ``$JAXSEG_ADAPTIVECLICK_REPO``.

The checkout is never copied into the project. Its ``isegm`` package is imported
through `isegm_reference.import_reference` (the same harness stubs: ``mmcv``'s
names imported by SimpleClick's Swin head module, which AdaptiveClick's
``is_plainvit_model`` import pulls in but never builds; missing ``tqdm`` /
tensorboard / dataset classes). Everything the model computes is the authors'
code: ``AdaptiveClickModel`` with its ViT, SimpleFPN, ``MSDeformAttnPixelDecoder``
(``ms_deform_attn_core_pytorch``, the pure-torch sampling the authors call) and
``ClickAwareMaskAdaptiveDecoder``. Its config is the authors' own yaml
(``configs/adaptiveclick_plainvit_base448.yaml`` + ``base_configuration.yaml``)
as ``init_model`` builds it (an ``easydict`` with ``crop_size``, a ``torch.device``
and the training paths as ``pathlib`` paths, so the saved checkpoint pickles what
the released ones do); the tiny variant overrides the widths as
`jaxseg_robust.models.adaptiveclick.config.TINY`. Needs ``fvcore``, ``easydict``
and ``addict`` (the authors' imports).
"""

from __future__ import annotations

import pathlib

import isegm_reference as ir

KIND = "adaptiveclick"
YAML = "configs/adaptiveclick_plainvit_base448.yaml"
# Overrides of the yaml for jaxseg_robust.models.adaptiveclick.config.TINY.
TINY_OVERRIDES = {
    "BACKBONE": dict(EMBED_DIM=32, DEPTH=4, NUM_HEADS=2),
    "SIMPLE_FEATURE_PYRAMID": dict(IN_DIM=32, OUT_DIMS=[8, 16, 24, 32]),
    "SEM_SEG_HEAD": dict(CONVS_DIM=32, MASK_DIM=32, TRANSFORMER_ENC_LAYERS=1),
    "MASK_FORMER": dict(HIDDEN_DIM=32, NUM_OBJECT_QUERIES=3, NHEADS=4, DIM_FEEDFORWARD=64, DEC_LAYERS=4),
}
CROP = {"tiny": (224, 224), "vit_b": (448, 448)}


def model_config(variant: str):
    """The authors' ``init_model`` config of ``variant`` ("vit_b" or "tiny")."""
    import torch  # noqa: PLC0415
    from easydict import EasyDict  # noqa: PLC0415
    from fvcore.common.config import CfgNode  # noqa: PLC0415

    root = ir.import_reference(KIND)
    cfg = CfgNode.load_yaml_with_base(str(root / YAML), allow_unsafe=True)
    if variant == "tiny":
        for section, values in TINY_OVERRIDES.items():
            cfg["MODEL"][section].update(values)
    # the training script's arguments merged in, as init_model does (paths and the device)
    cfg.update(device=torch.device("cpu"), random_split=False, EXPS_PATH=pathlib.Path("/tmp/experiments"),
               LVIS_v1_PATH=pathlib.Path("/tmp/datasets/LVIS"))
    cfg = EasyDict(cfg)
    cfg.crop_size = CROP[variant]
    cfg.num_max_points = 24
    return cfg


def build_adaptiveclick(variant: str):
    """``AdaptiveClickModel(cfg, with_prev_mask=True, use_disks=True, norm_radius=5)`` (untrained, eval mode)."""
    cfg = model_config(variant)
    from isegm.model.is_adaptiveclick_model import AdaptiveClickModel  # noqa: PLC0415

    return AdaptiveClickModel(cfg, with_prev_mask=True, use_disks=True, norm_radius=5).eval()


def seeded_checkpoint(variant: str, seed: int, path: str):
    """Builds the model, draws seeded weights (`isegm_reference.randomize_`), saves it in the authors'
    format; returns the model."""
    model = build_adaptiveclick(variant)
    ir.randomize_(model, seed)
    ir.save_isegm_checkpoint(model, path)
    return model


# AdaptiveClick's click patches enter the ViT added to the image's patch embedding, as SimpleClick's:
# the disk channels x 256 (isegm_reference.SIMPLECLICK_CLICK_GAIN) make a random network follow its clicks.
CLICK_GAIN = 256.0
NEAR_PX = 40


def authors_forward_from_maps(model, x, maps):
    """``AdaptiveClickModel.forward`` from the click maps f[1, C, h, w] on (the authors' disks are not
    differentiable): the forward's own lines with ``get_coord_features`` replaced by ``maps``."""
    image, _ = model.prepare_input(x)
    click_aware_features = maps[:, 1]
    coord_features = model.patch_embed_coords(maps)
    backbone_features = model.backbone.forward_backbone(image, coord_features, shuffle=model.random_split)
    mask_features, _, multi_scale_features = model.pixel_decoder(backbone_features,
                                                                 model.backbone.patch_embed.grid_size)
    predictions = model.click_aware_decoder(multi_scale_features, mask_features, click_aware_features)
    return model.segment_inference(predictions, image.size())


def _centre_click_logits(model, image, target: int, click: bool):
    """``model(...)["instances"]`` [target, target] of the image resized to the target, no previous
    mask, one positive click at the centre (or none)."""
    import torch  # noqa: PLC0415

    x = torch.from_numpy(image.copy()).permute(2, 0, 1)[None].float() / 255
    x = torch.nn.functional.interpolate(x, size=(target, target), mode="bilinear", align_corners=True)
    x = torch.cat([x, torch.zeros_like(x[:, :1])], 1)
    centre = [target // 2, target // 2, 0] if click else [-1, -1, -1]
    with torch.no_grad():
        return model(x, torch.tensor([[centre, [-1, -1, -1]]], dtype=torch.float32))["instances"][0, 0]


def sharpen_clicks_(model, image, target: int) -> None:
    """Makes a random network follow its clicks (so the NoC loop's zoom-in moves): the disk channels of
    the click patch embedding x `CLICK_GAIN`, and the mask features negated (``mask_features`` conv)
    when a centre click lowers the logits near it more than elsewhere."""
    import numpy as np  # noqa: PLC0415
    import torch  # noqa: PLC0415

    with torch.no_grad():
        model.patch_embed_coords.proj.weight[:, 1:].mul_(CLICK_GAIN)
        moved = _centre_click_logits(model, image, target, True) - _centre_click_logits(model, image, target, False)
        rows, cols = np.ogrid[:target, :target]
        near = torch.from_numpy((rows - target // 2) ** 2 + (cols - target // 2) ** 2 < NEAR_PX ** 2)
        if float(moved[near].mean()) < float(moved[~near].mean()):
            model.pixel_decoder.mask_features.weight.neg_()
            model.pixel_decoder.mask_features.bias.neg_()


def torch_logits_side(seed: int, inputs: list, ckpt: str) -> dict:
    """Spawned: the tiny model with seeded weights saved to ``ckpt``; ``model(x, points)["instances"]``
    f32[h, w] of every input (name, image uint8[h, w, 3], clicks (row, col, positive), prev f32[h, w])."""
    import torch  # noqa: PLC0415

    model = seeded_checkpoint("tiny", seed, ckpt)
    out = {}
    for name, image, clicks, prev in inputs:
        x = torch.cat([torch.from_numpy(image.copy()).permute(2, 0, 1)[None].float() / 255,
                       torch.from_numpy(prev)[None, None]], 1)
        with torch.no_grad():
            out[name] = model(x, ir.points_tensor(clicks))["instances"][0, 0].numpy().copy()
    return out


def torch_grad_side(seed: int, cases: list, ckpt: str) -> dict:
    """Spawned: dL/dmaps f64[C, h, w] of L = sum(logits * weights) for every case (name, image,
    prev f32[h, w], maps f32[C, h, w], weights f32[h, w]), float32, through `authors_forward_from_maps`."""
    import torch  # noqa: PLC0415

    model = seeded_checkpoint("tiny", seed, ckpt)
    out = {}
    for name, image, prev, maps, weights in cases:
        x = torch.cat([torch.from_numpy(image.copy()).permute(2, 0, 1)[None].float() / 255,
                       torch.from_numpy(prev)[None, None]], 1)
        m = torch.from_numpy(maps)[None].requires_grad_(True)
        loss = (authors_forward_from_maps(model, x, m)[0, 0] * torch.from_numpy(weights)).sum()
        (grad,) = torch.autograd.grad(loss, m)
        out[name] = grad[0].double().numpy().copy()
    return out


def torch_noc_side(seed: int, image, gt, target: int, n_clicks: int, ckpt: str) -> dict:
    """Spawned: the authors' ``evaluate_sample`` (no early stop) with the predictor their
    ``scripts/evaluate_model.py`` builds (NoBRS, flip, zoom-in ``target`` from the first click,
    position embedding re-interpolated to it) on the tiny model with seeded, sharpened weights."""
    import numpy as np  # noqa: PLC0415

    import torch  # noqa: PLC0415

    ir.import_reference(KIND)
    from isegm.inference.evaluation import evaluate_sample  # noqa: PLC0415
    from isegm.inference.predictors import get_predictor  # noqa: PLC0415
    from isegm.model.modeling.pos_embed import interpolate_pos_embed_inference  # noqa: PLC0415

    model = build_adaptiveclick("tiny")
    ir.randomize_(model, seed)
    trained_pos_embed = model.backbone.pos_embed.detach().clone()
    interpolate_pos_embed_inference(model.backbone, (target, target), "cpu")
    sharpen_clicks_(model, image, target)
    # the checkpoint keeps the trained (224 px) position embedding, as a released one does
    state = {**model.state_dict(), "backbone.pos_embed": trained_pos_embed}
    torch.save({"state_dict": state, "config": model._config}, ckpt)
    predictor = get_predictor(model, "NoBRS", "cpu", prob_thresh=0.49,
                              zoom_in_params={"skip_clicks": -1, "target_size": (target, target)})
    clicks, ious, probs = evaluate_sample(image, gt.astype(np.int32), predictor, max_iou_thr=1.01,
                                          pred_thr=0.49, max_clicks=n_clicks)
    return {"clicks": np.array([[int(c.coords[0]), int(c.coords[1]), int(c.is_positive)] for c in clicks]),
            "ious": np.asarray(ious, np.float64), "probs": np.asarray(probs, np.float32)}
