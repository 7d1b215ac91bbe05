"""The authors' GPCIS code (zmhhmz/GPCIS_CVPR2023) for parity tests.

``$JAXSEG_GPCIS_REPO`` names a checkout (the folder holding ``isegm/``), never
copied into the project. `build_reference` imports its ``GpModel``
(``isegm/model/is_gp_resnet50.py``) with the release's arguments
(``models/gp_sbd_resnet50.py``: ResNet-50, LeakyReLU maps transform, disks,
previous mask), fills every tensor with seeded random values
(`cdnet_reference.randomise_`) and puts it in inference mode
(``set_status(training=False)``: eps 1e-7, ``eval()``). Their ``DeepLabV3Plus``
hard-codes the ResNet-50 channel counts, so only the ResNet-50 is built.

Libraries its package imports but inference does not use (tensorboard, ...)
get the stand-ins of tests/isegm_reference.py (`install_stubs`).

GPCIS, RITM and SimpleClick all ship a top-level package ``isegm``: the
loader drops another checkout's ``isegm`` modules from ``sys.modules`` before
importing this one.
"""

from __future__ import annotations

import os
import pathlib
import sys

import numpy as np

REPO_ENV = "JAXSEG_GPCIS_REPO"
RELEASE_ARGS = {"backbone": "resnet50", "use_leaky_relu": True, "use_disks": True, "binary_prev_mask": False,
                "with_prev_mask": True}


def repo_path() -> pathlib.Path | None:
    """The GPCIS checkout named by ``$JAXSEG_GPCIS_REPO``, or None when not configured."""
    value = os.environ.get(REPO_ENV, "")
    if not value:
        return None
    path = pathlib.Path(value).expanduser()
    return path if (path / "isegm" / "model" / "is_gp_resnet50.py").is_file() else None


def import_gpmodel():
    """The checkout's ``GpModel`` class (its ``isegm`` package first on ``sys.path``)."""
    path = repo_path()
    if path is None:
        raise RuntimeError(f"${REPO_ENV} does not name a GPCIS checkout")
    loaded = sys.modules.get("isegm")
    if loaded is not None and not str(getattr(loaded, "__path__", [""])[0]).startswith(str(path)):
        for name in [n for n in sys.modules if n == "isegm" or n.startswith("isegm.")]:
            del sys.modules[name]
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))
    from isegm_reference import install_stubs  # noqa: PLC0415

    install_stubs()  # torch.utils.tensorboard (imported by isegm/utils/log.py), np.int, ...
    from isegm.model.is_gp_resnet50 import GpModel  # noqa: PLC0415

    return GpModel


def build_reference(seed: int):
    """A seeded random ``GpModel`` in inference mode (see the module docstring)."""
    from cdnet_reference import randomise_  # noqa: PLC0415

    model = import_gpmodel()(**RELEASE_ARGS)
    randomise_(model, seed)
    model.set_status(training=False)
    return model.eval()


def save_official(model, path) -> None:
    """``torch.save({"state_dict", "config"})`` as isegm's ``save_checkpoint`` writes it."""
    import torch  # noqa: PLC0415

    torch.save({"state_dict": model.state_dict(), "config": model._config}, path)


def points_nd(points_xy: np.ndarray, labels: np.ndarray):
    """isegm ``get_points_nd`` of one click list: f32[1, 2 n, 3] (row, col, index), positives first,
    each half padded with (-1, -1, -1) to the larger count."""
    import torch  # noqa: PLC0415

    order = [i for i in range(len(labels)) if labels[i] >= 0]
    pos = [(points_xy[i, 1], points_xy[i, 0], k) for k, i in enumerate(order) if labels[i] == 1]
    neg = [(points_xy[i, 1], points_xy[i, 0], k) for k, i in enumerate(order) if labels[i] == 0]
    n = max(1, len(pos), len(neg))
    rows = pos + [(-1, -1, -1)] * (n - len(pos)) + neg + [(-1, -1, -1)] * (n - len(neg))
    return torch.tensor([rows], dtype=torch.float32)


def reference_logits(model, image: np.ndarray, prev: np.ndarray, points_xy: np.ndarray, labels: np.ndarray,
                     maps=None):
    """``GpModel(image, points)["instances"][0, 0]`` (logits f32[H, W], a torch tensor).

    Args:
      image: f32[H, W, 3] in [0, 1]; prev: f32[H, W] previous probability map.
      points_xy, labels: clicks (x, y) in input pixels and 1 / 0 / -1.
      maps: optional torch f32[1, 2, H, W] positive / negative click maps used instead of the
        model's disks (a leaf to differentiate w.r.t.); the GP still reads ``points_xy``.
    """
    import torch  # noqa: PLC0415
    import torch.nn.functional as F  # noqa: PLC0415

    x = torch.cat([torch.from_numpy(image).permute(2, 0, 1), torch.from_numpy(prev)[None]], 0)[None].float()
    points = points_nd(points_xy, labels)
    if maps is None:
        return model(x, points)["instances"][0, 0]
    image_n, prev_mask = model.prepare_input(x)
    coord = model.maps_transform(torch.cat([prev_mask, maps], 1))
    feature = F.normalize(model.model(image_n, coord), dim=1)
    feature = F.interpolate(feature, size=image_n.size()[2:], mode="bilinear", align_corners=True)
    feature = torch.cat([feature, image_n], 1)
    pss, label_list = model.prepare_points_labels(points, feature)
    prior = model.Pathwise_GP_prior(feature, model.omega)
    out, _ = model.Pathwise_GP_update(points, feature, pss, label_list, prior, model.omega)
    return out[0, 0]


def reference_trajectory(model, image: np.ndarray, gt: np.ndarray, n_clicks: int, zoom_in_params: dict,
                         infer_size: int, threshold: float = 0.49):
    """The authors' evaluation loop (``evaluate_sample`` without an initial mask, so no progressive
    merge): isegm's clicker on ``gt`` bool[H, W], GPCIS's ``BaselinePredictor`` (zoom-in, ``ResizeTrans``
    to ``infer_size``, sigmoid) on ``image`` uint8[H, W, 3].

    Returns:
      (clicks [(row, col, is_positive)], probability maps f32[n_clicks, H, W]).
    """
    import torch  # noqa: PLC0415

    import_gpmodel()
    from isegm.inference.clicker import Clicker  # noqa: PLC0415
    from isegm.inference.predictors import get_predictor  # noqa: PLC0415

    predictor = get_predictor(model, "NoBRS", torch.device("cpu"), infer_size=infer_size,
                              prob_thresh=threshold, zoom_in_params=zoom_in_params)
    clicker = Clicker(gt_mask=gt.astype(np.int32))
    pred_mask = np.zeros_like(gt, dtype=bool)
    probs = []
    with torch.no_grad():
        predictor.set_input_image(image)
        for _ in range(n_clicks):
            clicker.make_next_click(pred_mask)
            prob = predictor.get_prediction(clicker)
            pred_mask = prob > threshold
            probs.append(prob)
    clicks = [(int(c.coords[0]), int(c.coords[1]), bool(c.is_positive)) for c in clicker.clicks_list]
    return clicks, np.stack(probs)
