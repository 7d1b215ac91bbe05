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
