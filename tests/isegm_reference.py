"""Loading the authors' isegm code (RITM, SimpleClick, CFR-ICL) for parity tests and benchmarks.

The three repositories are read from local checkouts named by
``JAXSEG_RITM_REPO``, ``JAXSEG_SIMPLECLICK_REPO`` and ``JAXSEG_CFRICL_REPO``
(never copied into the project). All three ship a top-level package called
``isegm``, so one process imports one of them (the parity harness runs each
reference in a spawned process).

Their code imports libraries the models do not use at inference; inside this
harness only (never in the library) `install_stubs` provides, through
``sys.modules``, minimal stand-ins for what is missing:

* ``torchvision.transforms.ToTensor`` (uint8 HWC -> float CHW / 255, the only
  use by the predictor) and a bare ``torchvision`` module;
* ``timm.models.layers`` (DropPath, to_2tuple, trunc_normal_: used by Swin
  models SimpleClick does not build);
* ``mmcv`` 1.x names imported by SimpleClick's head module: ``ConvModule`` (a
  conv with bias followed by ReLU, which is what mmcv's ConvModule computes
  for ``norm_cfg=None, act_cfg=ReLU`` -- the only use in the head, with the
  same parameter names ``conv.weight`` / ``conv.bias``), ``BaseModule``
  (``nn.Module`` with an ``init_cfg``), no-op ``auto_fp16`` / ``force_fp32``
  decorators and a registry that only records names;
* ``isegm.data.datasets`` (dataset classes imported by ``inference/utils``) and
  ``torch.utils.tensorboard`` (the training logger imported by ``utils/log``);
* ``tqdm`` (a progress bar that RITM's ``inference/evaluation`` imports; the
  stand-in iterates without one);
* ``np.int`` / ``np.bool`` (removed from numpy; RITM's HRNet and clicker use them).
"""

from __future__ import annotations

import os
import pathlib
import sys
import types

import numpy as np

REPO_ENV = {"ritm": "JAXSEG_RITM_REPO", "simpleclick": "JAXSEG_SIMPLECLICK_REPO",
            "cfricl": "JAXSEG_CFRICL_REPO", "adaptiveclick": "JAXSEG_ADAPTIVECLICK_REPO"}


def repo_path(kind: str) -> pathlib.Path | None:
    """The checkout of a reference (``kind`` in REPO_ENV), or None when not configured."""
    value = os.environ.get(REPO_ENV[kind], "")
    if not value:
        return None
    path = pathlib.Path(value).expanduser()
    return path if (path / "isegm").is_dir() else None


def _module(name: str, **attrs) -> types.ModuleType:
    mod = types.ModuleType(name)
    mod.__dict__.update(attrs)
    sys.modules[name] = mod
    return mod


def _torchvision_stub() -> None:
    import torch  # noqa: PLC0415

    class ToTensor:
        def __call__(self, image):
            x = torch.from_numpy(np.ascontiguousarray(image))
            return x.permute(2, 0, 1).float().div(255.0)

    tv = _module("torchvision")
    tv.transforms = _module("torchvision.transforms", ToTensor=ToTensor)


def _timm_stub() -> None:
    import torch.nn as nn  # noqa: PLC0415

    class DropPath(nn.Identity):
        def __init__(self, *args, **kwargs):
            super().__init__()

    def to_2tuple(x):
        return tuple(x) if isinstance(x, (list, tuple)) else (x, x)

    _module("timm")
    _module("timm.models")
    _module("timm.models.layers", DropPath=DropPath, to_2tuple=to_2tuple,
            trunc_normal_=nn.init.trunc_normal_)


class _Registry:
    def __init__(self, *args, **kwargs):
        self.modules = {}

    def register_module(self, *args, **kwargs):
        def deco(cls):
            self.modules[cls.__name__] = cls
            return cls
        return deco


def _mmcv_stub() -> None:
    import torch.nn as nn  # noqa: PLC0415

    class ConvModule(nn.Module):
        def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0,
                     conv_cfg=None, norm_cfg=None, act_cfg=None, **kwargs):
            super().__init__()
            if norm_cfg is not None:
                raise NotImplementedError("the harness ConvModule has no norm")
            self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, stride, padding,
                                  bias=True)
            act = (act_cfg or {}).get("type") if act_cfg is not None else "ReLU"
            self.activate = nn.ReLU() if act == "ReLU" else nn.Identity()

        def forward(self, x):
            return self.activate(self.conv(x))

    class BaseModule(nn.Module):
        def __init__(self, init_cfg=None):
            super().__init__()
            self.init_cfg = init_cfg

    def passthrough(*args, **kwargs):
        if args and callable(args[0]) and len(args) == 1 and not kwargs:
            return args[0]
        return lambda fn: fn

    def unavailable(*args, **kwargs):
        raise NotImplementedError("not available in the parity harness")

    mmcv = _module("mmcv")
    mmcv.cnn = _module("mmcv.cnn", ConvModule=ConvModule, build_conv_layer=unavailable,
                       build_norm_layer=unavailable, MODELS=_Registry())
    _module("mmcv.cnn.bricks")
    _module("mmcv.cnn.bricks.registry", ATTENTION=_Registry())
    mmcv.runner = _module("mmcv.runner", BaseModule=BaseModule, auto_fp16=passthrough,
                          force_fp32=passthrough, get_dist_info=lambda: (0, 1))
    _module("mmcv.runner.base_module", BaseModule=BaseModule)
    mmcv.utils = _module("mmcv.utils", Registry=_Registry, build_from_cfg=unavailable,
                         get_logger=lambda *a, **k: __import__("logging").getLogger("mmcv"),
                         mkdir_or_exist=unavailable)
    mmcv.fileio = _module("mmcv.fileio", FileClient=object, load=unavailable)
    mmcv.parallel = _module("mmcv.parallel", is_module_wrapper=lambda m: False)


def _tensorboard_stub() -> None:
    import torch.utils  # noqa: PLC0415

    torch.utils.tensorboard = _module("torch.utils.tensorboard",
                                      SummaryWriter=type("SummaryWriter", (), {}))


def _datasets_stub() -> None:
    names = ("GrabCutDataset", "BerkeleyDataset", "DavisDataset", "SBDEvaluationDataset",
             "PascalVocDataset", "BraTSDataset", "ssTEMDataset", "OAIZIBDataset", "OAIDataset",
             "HARDDataset")
    _module("isegm.data.datasets", **{n: type(n, (), {}) for n in names})


def _tqdm_stub() -> None:
    def tqdm(iterable=None, *args, **kwargs):
        return iterable

    _module("tqdm", tqdm=tqdm, tqdm_notebook=tqdm)


def install_stubs() -> None:
    """Installs the stand-ins listed in the module docstring (only for missing modules)."""
    if not hasattr(np, "int"):
        np.int = int
    if not hasattr(np, "bool"):
        np.bool = bool
    for name, make in (("torchvision", _torchvision_stub), ("timm", _timm_stub),
                       ("mmcv", _mmcv_stub), ("torch.utils.tensorboard", _tensorboard_stub),
                       ("tqdm", _tqdm_stub)):
        try:
            __import__(name)
        except ImportError:
            make()


def import_reference(kind: str):
    """Puts the ``kind`` checkout on ``sys.path`` (after the stubs); returns its path."""
    path = repo_path(kind)
    if path is None:
        raise RuntimeError(f"${REPO_ENV[kind]} does not point to a checkout with an isegm package")
    install_stubs()
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))
    import isegm.data  # noqa: F401,PLC0415  (the real package, before its datasets stub)
    _datasets_stub()
    return path


def randomize_(model, seed: int) -> None:
    """Seeded values of a sensible scale for every float tensor of an isegm model.

    Weights with >= 2 axes N(0, 1/fan_in) (ConvTranspose2d: fan_in = in
    channels, the first axis); norm scales 1 + 0.1 N(0, 1); biases and running
    means 0.1 N(0, 1); running variances U(0.5, 1.5); position embeddings and
    the class token 0.2 N(0, 1); RITM's ScaleLayer 0.05 + 0.02 |N(0, 1)|.
    """
    import torch  # noqa: PLC0415

    transposed = {name for name, mod in model.named_modules()
                  if isinstance(mod, torch.nn.ConvTranspose2d)}
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, t in model.state_dict().items():
            if not t.is_floating_point():
                continue
            noise = torch.randn(t.shape, generator=gen)
            module = name.rsplit(".", 1)[0]
            if name.endswith("running_var"):
                t.copy_(0.5 + torch.rand(t.shape, generator=gen))
            elif name.endswith(("pos_embed", "cls_token")):
                t.copy_(0.2 * noise)
            elif name.endswith(".scale"):
                t.copy_(0.05 + 0.02 * noise.abs())
            elif t.ndim >= 2:
                fan_in = t.shape[0] if module in transposed else t[0].numel()
                t.copy_(noise / np.sqrt(fan_in))
            elif name.endswith("weight"):
                t.copy_(1.0 + 0.1 * noise)
            else:
                t.copy_(0.1 * noise)


# ---- the released configurations, as the authors' model scripts build them ----------------

RITM_ARGS = {
    "hrnet18": dict(width=18, ocr_width=64),
    "hrnet18s": dict(width=18, ocr_width=48, small=True),
    "hrnet32": dict(width=32, ocr_width=128),
    # models/noniterative_baselines/hrnet18_ocr64_cocolvis.py (coco_lvis_h18_baseline.pth): no previous mask
    "hrnet18_baseline": dict(width=18, ocr_width=64, with_prev_mask=False),
}
# SimpleClick models/iter_mask/plainvit_{xtiny,base,large,huge}448_cocolvis_itermask.py
# (CFR-ICL's ViT-H script builds the same network).
SIMPLECLICK_ARGS = {
    "vit_xt": dict(patch=16, dim=160, depth=8, heads=4, out_dims=[96, 192, 288, 384], channels=128),
    "vit_b": dict(patch=16, dim=768, depth=12, heads=12, out_dims=[128, 256, 512, 1024],
                  channels=256),
    "vit_l": dict(patch=16, dim=1024, depth=24, heads=16, out_dims=[192, 384, 768, 1536],
                  channels=256),
    "vit_h": dict(patch=14, dim=1280, depth=32, heads=16, out_dims=[240, 480, 960, 1920],
                  channels=256),
}


def build_ritm(variant: str):
    """RITM's ``HRNetModel`` as in ``models/iter_mask/hrnet*_itermask_3p.py`` (untrained; the baseline as in
    ``models/noniterative_baselines/hrnet18_ocr64_cocolvis.py``)."""
    from isegm.model.is_hrnet_model import HRNetModel  # noqa: PLC0415

    return HRNetModel(with_aux_output=True, use_leaky_relu=True, use_rgb_conv=False,
                      use_disks=True, norm_radius=5, **{"with_prev_mask": True, **RITM_ARGS[variant]})


def build_simpleclick(variant: str):
    """SimpleClick's ``PlainVitModel`` as in its ``plainvit_*448_cocolvis_itermask.py`` (untrained)."""
    from isegm.model.is_plainvit_model import PlainVitModel  # noqa: PLC0415
    from isegm.model.modeling.transformer_helper.cross_entropy_loss import (
        CrossEntropyLoss,  # noqa: PLC0415
    )

    a = SIMPLECLICK_ARGS[variant]
    backbone = dict(img_size=(448, 448), patch_size=(a["patch"], a["patch"]), in_chans=3,
                    embed_dim=a["dim"], depth=a["depth"], num_heads=a["heads"], mlp_ratio=4,
                    qkv_bias=True)
    neck = dict(in_dim=a["dim"], out_dims=a["out_dims"])
    head = dict(in_channels=a["out_dims"], in_index=[0, 1, 2, 3], dropout_ratio=0.1,
                num_classes=1, loss_decode=CrossEntropyLoss(), align_corners=False,
                upsample="x1", channels=a["channels"])
    return PlainVitModel(use_disks=True, norm_radius=5, with_prev_mask=True,
                         backbone_params=backbone, neck_params=neck, head_params=head,
                         random_split=False)


def save_isegm_checkpoint(model, path) -> None:
    """The authors' checkpoint format (isegm ``save_checkpoint``)."""
    import torch  # noqa: PLC0415

    torch.save({"state_dict": model.state_dict(), "config": model._config}, str(path))


def points_tensor(clicks):
    """isegm ``get_points_nd`` for one list of (row, col, is_positive) clicks in order.

    Returns a float32 tensor [1, 2 n, 3]: positives then negatives, each padded
    with (-1, -1, -1) to the larger count, third value the click index.
    """
    import torch  # noqa: PLC0415

    pos = [(r, c, i) for i, (r, c, p) in enumerate(clicks) if p]
    neg = [(r, c, i) for i, (r, c, p) in enumerate(clicks) if not p]
    n = max(1, len(pos), len(neg))
    pad = [(-1, -1, -1)]
    return torch.tensor([pos + pad * (n - len(pos)) + neg + pad * (n - len(neg))],
                        dtype=torch.float32)


# RITM's click maps (previous mask, positive and negative disks) enter HRNet-18s added to the stem's
# features, where seeded random 1x1-conv weights give them ~1/10 of the image's scale: the image
# then decides the logits (std ~9) and a click moves them by < 1 (measured, seed 11, 400 x 400).
RITM_CLICK_GAIN = 100.0
# Foreground share of the first-click prediction the output bias is set to: RITM's click blobs
# (radius ~30 px at 400 x 400) cover ~1.8 % of the input; SimpleClick's click patches spread wider.
FOREGROUND_SHARE = {"ritm": 0.03, "simpleclick": 0.15, "cfricl": 0.15}
# SimpleClick's click patches enter the ViT added to the image's patch embedding; x 8 (as CFR-ICL)
# moved the logits near a click by 0.03 and the NoC loop predicted nothing after click 1 (ViT-xT,
# seed 12: IoU 0.115, then 0); the disk channels x 256 with the head oriented towards the click give
# IoUs that follow the clicks (measured over 10 clicks: ViT-xT seed 12 0.09-0.24, ViT-B seed 15
# 0.13-0.385).
SIMPLECLICK_CLICK_GAIN = 256.0


def _first_click_logits(model, image, target: int, click: bool):
    """``model(...)["instances"]`` [1, 1, target, target] on the image resized to target x target,
    no previous mask, one positive click at the centre (or none)."""
    import torch  # noqa: PLC0415

    x = torch.from_numpy(image.copy()).permute(2, 0, 1)[None].float() / 255
    x = torch.nn.functional.interpolate(x, size=(target, target), mode="bilinear",
                                        align_corners=True)
    x = torch.cat([x, torch.zeros_like(x[:, :1])], 1)
    centre = [target // 2, target // 2, 0] if click else [-1, -1, -1]
    points = torch.tensor([[centre, [-1, -1, -1]]], dtype=torch.float32)
    return model(x, points)["instances"]


def sharpen_clicks_(model, kind: str, image, target: int) -> None:
    """Makes a random network follow its clicks, so the NoC loop's zoom-in moves.

    With plain random weights the prediction hardly depends on the clicks
    (covering all or none of the image), so every ROI would be the whole
    image. The click input's weights are scaled up (SimpleClick: the disk channels of the click
    patch embedding x `SIMPLECLICK_CLICK_GAIN`, then the head's sign chosen so that a click
    raises the logits within 40 px of it more than elsewhere; for CFR-ICL only its disk channels x 8, the previous-mask channel left
    as drawn: scaled too, the mask fed back through the cascade turned 89 % of the image
    foreground (seed 13), while SimpleClick without it stays near IoU 0.11 (seed 12); RITM: ``ScaleLayer`` to 1 and the click maps' 1x1 conv
    x `RITM_CLICK_GAIN`, then the sign of the output layer chosen so that a
    click raises the logits within 30 px of it: a large input through the
    random ReLU network moves them one way whatever its sign, and that way was
    down for the seeds tried), and the output bias shifted so that
    `FOREGROUND_SHARE` of the first-click prediction at the zoom-in size
    (centre click) is foreground: for RITM a blob around the click.
    """
    import torch  # noqa: PLC0415

    with torch.no_grad():
        if kind == "ritm":
            model.maps_transform[3].scale.fill_(1.0)
            model.maps_transform[0].weight.mul_(RITM_CLICK_GAIN)
            head = model.feature_extractor.cls_head
            moved = (_first_click_logits(model, image, target, True)
                     - _first_click_logits(model, image, target, False))[0, 0]
            rows, cols = np.ogrid[:target, :target]
            near = torch.from_numpy((rows - target // 2) ** 2 + (cols - target // 2) ** 2 < 30 ** 2)
            if float(moved[near].mean()) < 0:
                head.weight.neg_()
                head.bias.neg_()
            bias = head.bias
        elif kind == "cfricl":
            # CFR-ICL: disk channels only (channel 0 is the previous mask)
            model.patch_embed_coords.proj.weight[:, 1:].mul_(8.0)
            bias = model.head.conv_seg.bias
        else:
            # the disk channels only: the previous mask (channel 0) scaled too held ViT-B's prediction
            # fixed after click 1 (seed 15, IoU 0.106-0.108 at gains 8 to 256)
            model.patch_embed_coords.proj.weight[:, 1:].mul_(SIMPLECLICK_CLICK_GAIN)
            head = model.head.conv_seg
            moved = (_first_click_logits(model, image, target, True)
                     - _first_click_logits(model, image, target, False))[0, 0]
            rows, cols = np.ogrid[:target, :target]
            near = torch.from_numpy((rows - target // 2) ** 2 + (cols - target // 2) ** 2 < 40 ** 2)
            if float(moved[near].mean()) < float(moved[~near].mean()):
                head.weight.neg_()
                head.bias.neg_()
            bias = head.bias
        logits = _first_click_logits(model, image, target, True)
        bias.sub_(torch.quantile(logits.flatten(), 1 - FOREGROUND_SHARE[kind]))
