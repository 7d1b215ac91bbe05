"""The TETRIS attack loop for RITM-style (click-map) models, restated in torch, one instance at a time.

Benchmark reference for ``bench_click_models.py --stages tetris``. It is a
*restatement*, not an import: the TETRIS authors' click-attack release
(github.com/image-seg/adv-clicks, ``isegm/model/is_model.py``,
``ISModel.forward_optimizable``; ``isegm/model/ops.py``,
``DistMapsDifferentable``; ``isegm/inference/predictors/base.py`` and
``evaluation.py``) cannot be imported here: it renders the disks with pydiffvg
(a CUDA build), moves tensors to ``.cuda()`` unconditionally, reads the
flipped half of a batch of two (it assumes the flip transform) and needs
segmentation_models_pytorch. The loop below keeps its structure and its cost
per iterate, on the authors' own network modules (``maps_transform``,
``backbone_forward`` of the RITM / SimpleClick checkout):

  per click: the RITM clicker on ``pred > thr`` (OpenCV distance transforms of
  the 1-padded FN / FP maps, first maximum, float clicks marked at their
  rounded pixel); the location-loss distance maps ``cv2.distanceTransform`` of
  the non-FN / non-FP pixels of ``prev > 0.5``; the fixed clicks rendered once
  without gradient; a fresh ``torch.optim.Adam`` on the click (x, y) with
  ``lr = lr_mult 5 sqrt(h^2 + w^2) / (400 sqrt 2)`` of the network input;
  per iterate: the click's disk rendered differentiably (centre
  ``clamp(x + 0.5, 0, w - 1)``), the clamped per-sign sum with the fixed
  clicks, the previous probability map in front, the network, bilinear
  (``align_corners=True``) to the input, sigmoid, ``Lloc = mean(disk * DT)``,
  ``L = Lloc + s Dice / 1000`` (binary soft Dice, eps 1e-7, 0 on an empty
  target), IoU and Boundary IoU of ``P > thr`` in NumPy on the host,
  acceptance (``Lloc <= 1.05 * last accepted`` and a lexicographically better
  (IoU, BIoU)), then ``loss.backward()`` and an Adam step after *every*
  iterate (the last one included, as the authors' loop); the accepted
  iterate's probability map is the next click's previous mask and its
  clipped (row, col) the stored click. MIN and MAX are separate runs
  (``--optim_min`` selects one mode per run).

`predictor_trajectory` runs the loop through the authors' predictor
transforms (their ``ZoomIn`` in its ``fixed<N>`` mode and ``AddHorizontalFlip``,
imported from the RITM checkout): what the authors' attack does and what the
library's click-map attack does by default (docs/protocols/tetris.md,
"Families"). `tetris_trajectory` is the whole-image loop (no zoom-in, no
flip; the library's ``--isegm off``). In both, the disk is the library's
exact area coverage (its deterministic surrogate of pydiffvg's 2 x 2-sample
rendering), restated below with torch ops on the disk's window only (exact,
and cheaper than pydiffvg's whole-canvas rendering: favourable to the
reference).
"""

from __future__ import annotations

import math

import numpy as np


def _torch():
    import torch  # noqa: PLC0415

    return torch


def _half_chord(u, radius):
    torch = _torch()
    return torch.sqrt(torch.clamp(radius - u.abs(), min=0.0) * (radius + u.abs()))


def _half_disk_area_left_of(t, radius):
    torch = _torch()
    t = torch.clamp(t, -radius, radius)
    s = _half_chord(t, radius)
    return 0.5 * (t * s + radius * radius * torch.atan2(t, s)) + 0.25 * math.pi * radius * radius


def _chord_below(u, v, radius):
    torch = _torch()
    half = _half_chord(u, radius)
    return torch.clamp(torch.minimum(v, half) + half, min=0.0)


def _quadrant_area(x, y, radius):
    """Area of {u^2 + v^2 <= R^2, u <= x, v <= y} (closed form; no gradient)."""
    torch = _torch()
    x = torch.clamp(x, -radius, radius)
    y = torch.clamp(y, -radius, radius)
    cut = _half_chord(y, radius)
    x_cut = torch.minimum(torch.maximum(x, -cut), cut)
    strip = _half_disk_area_left_of(x_cut, radius) - _half_disk_area_left_of(-cut, radius)
    rectangle = y * (x_cut + cut)
    return torch.where(y >= 0, 2.0 * _half_disk_area_left_of(x, radius) - strip + rectangle,
                       strip + rectangle)


def _quadrant_function():
    torch = _torch()

    class QuadrantArea(torch.autograd.Function):
        """The quadrant area with its exact derivative (dA/dx, dA/dy = the chords at x and y)."""

        @staticmethod
        def forward(ctx, x, y, radius):
            ctx.save_for_backward(x, y)
            ctx.radius = radius
            return _quadrant_area(x, y, radius)

        @staticmethod
        def backward(ctx, grad):
            x, y = ctx.saved_tensors
            return (grad * _chord_below(x, y, ctx.radius), grad * _chord_below(y, x, ctx.radius),
                    None)

    return QuadrantArea


def area_disk(center, rows: int, cols: int, radius: float):
    """f32[rows, cols] exact area of the disk (centre (x, y), canvas units) inside each pixel.

    Only the disk's bounding window is evaluated and padded with zeros (exact: the
    coverage is 0 elsewhere), so the rendering costs the reference next to nothing.
    """
    torch = _torch()
    cx, cy = (float(v) for v in center.detach().cpu())
    x0, x1 = max(0, int(np.floor(cx - radius)) - 1), min(cols, int(np.ceil(cx + radius)) + 1)
    y0, y1 = max(0, int(np.floor(cy - radius)) - 1), min(rows, int(np.ceil(cy + radius)) + 1)
    corner_x = torch.arange(x0, x1 + 1, dtype=center.dtype, device=center.device)[None, :] - center[0]
    corner_y = torch.arange(y0, y1 + 1, dtype=center.dtype, device=center.device)[:, None] - center[1]
    corner_x, corner_y = torch.broadcast_tensors(corner_x, corner_y)
    quadrant = _quadrant_function().apply(corner_x, corner_y, radius)
    area = quadrant[1:, 1:] - quadrant[:-1, 1:] - quadrant[1:, :-1] + quadrant[:-1, :-1]
    area = torch.clamp(area, 0.0, 1.0)
    return torch.nn.functional.pad(area, (x0, cols - x1, y0, rows - y1))


def click_disk(xy, rows: int, cols: int, radius: float):
    """The TETRIS disk of a click (x, y): centre ``clamp(x + 0.5, 0, cols - 1)`` (y likewise)."""
    torch = _torch()
    x = torch.clamp(xy[0] + 0.5, 0, cols - 1)
    y = torch.clamp(xy[1] + 0.5, 0, rows - 1)
    return area_disk(torch.stack([x, y]), rows, cols, radius)


def next_click(gt, pred, not_clicked):
    """The RITM clicker: (is_positive, row, col) on bool maps (no ignore pixels)."""
    import cv2  # noqa: PLC0415

    fn = np.pad(gt & ~pred, 1).astype(np.uint8)
    fp = np.pad(~gt & pred, 1).astype(np.uint8)
    dt_fn = cv2.distanceTransform(fn, cv2.DIST_L2, 0)[1:-1, 1:-1] * not_clicked
    dt_fp = cv2.distanceTransform(fp, cv2.DIST_L2, 0)[1:-1, 1:-1] * not_clicked
    positive = dt_fn.max() > dt_fp.max()
    chosen = dt_fn if positive else dt_fp
    row, col = np.unravel_index(int(np.argmax(chosen)), chosen.shape)
    return bool(positive), int(row), int(col)


def boundary_width(height: int, width: int, ratio: float = 0.02) -> int:
    """Boundary IoU band ``max(1, round(ratio * diagonal))`` (docs/protocols/boundary_iou.md)."""
    return max(1, round(ratio * math.hypot(height, width)))


def _boundary(mask, d: int):
    import cv2  # noqa: PLC0415

    padded = cv2.copyMakeBorder(mask.astype(np.uint8), 1, 1, 1, 1, cv2.BORDER_CONSTANT, value=0)
    eroded = cv2.erode(padded, np.ones((3, 3), np.uint8), iterations=d)[1:-1, 1:-1]
    return (mask.astype(np.uint8) - eroded) > 0


def scores(pred, gt, d: int) -> tuple[float, float]:
    """(IoU, Boundary IoU) of bool masks; 0 on an empty union (the acceptance's scores)."""
    union = (pred | gt).sum()
    iou = (pred & gt).sum() / union if union else 0.0
    bp, bg = _boundary(pred, d), _boundary(gt, d)
    bunion = (bp | bg).sum()
    return float(iou), float((bp & bg).sum() / bunion if bunion else 0.0)


def tetris_trajectory(model, image, gt, *, maximise: bool, n_clicks: int = 10, n_iterates: int = 11,
                      thr: float = 0.49, radius: float = 5.0, lr_mult: float = 1.0,
                      tolerance: float = 1.05, dice_weight: float = 1e-3, device: str = "cpu") -> dict:
    """One MIN or MAX TETRIS trajectory of one instance (module docstring).

    Args:
      model: the authors' isegm model (eval mode, on ``device``).
      image: uint8[H, W, 3], the network input itself (no zoom-in).
      gt: bool[H, W] object mask.
      maximise: MAX (True) or MIN (False).

    Returns:
      {"iou": [K], "biou": [K], "start_iou": [K] (iterate 0 of each click),
       "clicks": [K, 2] (row, col), "step": [K, 2] (one Adam step, the learning rate, in image
       pixels along rows and columns)}.
    """
    torch = _torch()
    height, width = gt.shape
    x = torch.from_numpy(image.copy()).permute(2, 0, 1)[None].float().div(255).to(device)
    img, _ = model.prepare_input(torch.cat([x, torch.zeros_like(x[:, :1])], 1))
    target = torch.from_numpy(gt.astype(np.float32)).to(device)
    has_target = float(gt.any())
    d = boundary_width(height, width)
    lr = lr_mult * 5 * math.hypot(height, width) / (400 * math.sqrt(2))
    sign = 1.0 if maximise else -1.0
    prob = torch.zeros((1, 1, height, width), device=device)
    prob_np = np.zeros((height, width), np.float32)
    not_clicked = np.ones((height, width), np.float32)
    fixed = torch.zeros((2, height, width), device=device)
    out = {"iou": [], "biou": [], "start_iou": [], "clicks": [], "step": []}
    for _ in range(n_clicks):
        positive, row, col = next_click(gt, prob_np > thr, not_clicked)
        prev = prob_np > 0.5
        dt = error_distance(gt, prev, positive, device)
        channel = 0 if positive else 1
        q = torch.tensor([float(col), float(row)], device=device, requires_grad=True)
        optimizer = torch.optim.Adam([q], lr=lr)
        best, best_loc, stored = ((-2.0, -2.0) if maximise else (2.0, 2.0)), 1e50, None
        for step in range(n_iterates):
            optimizer.zero_grad()
            disk = click_disk(q, height, width, radius)
            new = torch.stack([disk, torch.zeros_like(disk)] if positive else [torch.zeros_like(disk), disk])
            maps = torch.clamp(fixed + new, 0, 1)[None]
            features = model.maps_transform(torch.cat([prob, maps], 1))
            logits = model.backbone_forward(img, features)["instances"]
            logits = torch.nn.functional.interpolate(logits, size=(height, width), mode="bilinear",
                                                     align_corners=True)
            p = torch.sigmoid(logits)[0, 0]
            loc = (disk * dt).mean()
            inter = (p * target).sum()
            dice = (1 - 2 * inter / torch.clamp(p.sum() + target.sum(), min=1e-7)) * has_target
            loss = loc + sign * dice * dice_weight
            p_np = p.detach().cpu().numpy()
            now = scores(p_np > thr, gt, d)
            if step == 0:
                out["start_iou"].append(now[0])
            loc_value = float(loc.detach())
            if loc_value <= tolerance * best_loc and (now > best if maximise else now < best):
                best, best_loc = now, loc_value
                qx, qy = (float(v) for v in q.detach().cpu())
                stored = (p_np, (min(max(qy, 0.0), height - 1.0), min(max(qx, 0.0), width - 1.0)))
            loss.backward()  # after every iterate, the last one included (the authors' loop)
            optimizer.step()
        prob_np, (r, c) = stored
        prob = torch.from_numpy(prob_np)[None, None].to(device)
        with torch.no_grad():
            fixed[channel] = torch.clamp(fixed[channel] + click_disk(torch.tensor([c, r], device=device),
                                                                     height, width, radius), 0, 1)
        not_clicked[min(round(r), height - 1), min(round(c), width - 1)] = 0
        out["iou"].append(best[0])
        out["biou"].append(best[1])
        out["clicks"].append((r, c))
        out["step"].append((lr, lr))  # the image is the network input
    return {k: np.asarray(v, np.float64) for k, v in out.items()}


def _transformed(zoom, flip, image_t, prob, gt, clicks):
    """The authors' ``apply_transforms`` of one click: their ``ZoomIn`` then ``AddHorizontalFlip`` on
    (image, previous map) and on the GT (``> 0.5``); returns (input [2, 4, h, w], gt [2, 1, h, w],
    crop clicks of the unflipped half)."""
    torch = _torch()
    x, tclicks = zoom.transform(torch.cat([image_t, prob], 1), [clicks])
    x, tclicks = flip.transform(x, tclicks)
    g, _ = zoom.transform(torch.from_numpy(gt.astype(np.float32))[None, None], [clicks])
    g, _ = flip.transform(g, [clicks])
    return x, (g > 0.5).float(), tclicks[0]


def predictor_trajectory(model, image, gt, *, target_hw, maximise: bool, n_clicks: int = 10, n_iterates: int = 11,
                         thr: float = 0.49, radius: float = 5.0, lr_mult: float = 1.0, tolerance: float = 1.05,
                         dice_weight: float = 1e-3, device: str = "cpu") -> dict:
    """`tetris_trajectory` through the authors' predictor transforms (docs/protocols/tetris.md, "Families").

    Per click, as the authors' ``get_prediction`` + ``forward_optimizable``: their ``ZoomIn``
    (``skip_clicks=-1``, ``target_size=target_hw``: the ``fixed<N>`` mode) and ``AddHorizontalFlip``
    (imported from the RITM checkout on ``sys.path``) transform image, previous map and GT with the
    baseline click among the clicks; the click is optimised in crop pixels (step from the crop's
    diagonal, the location loss on the crop from the cropped GT and previous map ``> 0.5``, Dice
    over both halves, the mirrored half's click maps the pixel mirror); each iterate's prediction
    is flip-averaged (logits), sigmoid, pasted back by ``ZoomIn.inv_transform`` and scored against
    the full GT; the accepted click (clipped to the crop) maps back by the zoom-in's inverse, and
    the accepted map is the zoom-in's previous map for the next click.

    Returns:
      as `tetris_trajectory` (``step`` through each click's crop scale).
    """
    torch = _torch()
    from isegm.inference.clicker import Click  # noqa: PLC0415
    from isegm.inference.transforms.flip import AddHorizontalFlip  # noqa: PLC0415
    from isegm.inference.transforms.zoom_in import ZoomIn  # noqa: PLC0415

    height, width = gt.shape
    zoom, flip = ZoomIn(target_size=tuple(target_hw), skip_clicks=-1), AddHorizontalFlip()
    image_t = torch.from_numpy(image.copy()).permute(2, 0, 1)[None].float().div(255).to(device)
    d, sign = boundary_width(height, width), (1.0 if maximise else -1.0)
    prob_np = np.zeros((height, width), np.float32)
    not_clicked = np.ones((height, width), np.float32)
    clicks, out = [], {"iou": [], "biou": [], "start_iou": [], "clicks": [], "step": []}
    for _ in range(n_clicks):
        positive, row, col = next_click(gt, prob_np > thr, not_clicked)
        clicks.append(Click(is_positive=bool(positive), coords=(float(row), float(col))))
        x, g, tclicks = _transformed(zoom, flip, image_t, torch.from_numpy(prob_np)[None, None].to(device), gt,
                                     clicks)
        g = g.to(device)
        img, prev = model.prepare_input(x)
        h, w = img.shape[2:]
        fixed = torch.zeros((2, h, w), device=device)
        with torch.no_grad():
            for click in tclicks[:-1]:
                k = 0 if click.is_positive else 1
                disk = click_disk(torch.tensor([click.coords[1], click.coords[0]], device=device), h, w, radius)
                fixed[k] = torch.clamp(fixed[k] + disk, 0, 1)
        gt_c = g[0, 0].cpu().numpy().astype(np.uint8)
        prev_c = ((0.5 * (prev[0] + torch.flip(prev[1], dims=[2])))[0].cpu().numpy() > 0.5)
        dt = error_distance(gt_c.astype(bool), prev_c, positive, device)
        q = torch.tensor([tclicks[-1].coords[1], tclicks[-1].coords[0]], dtype=torch.float32, device=device,
                         requires_grad=True)
        lr = lr_mult * 5 * math.hypot(h, w) / (400 * math.sqrt(2))
        optimizer = torch.optim.Adam([q], lr=lr)
        best, best_loc, stored = ((-2.0, -2.0) if maximise else (2.0, 2.0)), 1e50, None
        for step in range(n_iterates):
            optimizer.zero_grad()
            disk = click_disk(q, h, w, radius)
            new = torch.stack([disk, torch.zeros_like(disk)] if positive else [torch.zeros_like(disk), disk])
            maps = torch.clamp(fixed + new, 0, 1)[None]
            maps = torch.cat([maps, torch.flip(maps, (3,))])
            logits = model.backbone_forward(img, model.maps_transform(torch.cat([prev, maps], 1)))["instances"]
            logits = torch.nn.functional.interpolate(logits, size=(h, w), mode="bilinear", align_corners=True)
            p = torch.sigmoid(logits)
            loc = (disk * dt).mean()
            dice = (1 - 2 * (p * g).sum() / torch.clamp(p.sum() + g.sum(), min=1e-7)) * float(g.sum() > 0)
            loss = loc + sign * dice * dice_weight
            with torch.no_grad():
                full = zoom.inv_transform(torch.sigmoid(flip.inv_transform(logits.detach())))[0, 0].cpu().numpy()
            now = scores(full > thr, gt, d)
            if step == 0:
                out["start_iou"].append(now[0])
            if float(loc.detach()) <= tolerance * best_loc and (now > best if maximise else now < best):
                best, best_loc = now, float(loc.detach())
                stored = (full.copy(), [float(v) for v in q.detach().cpu()])
            loss.backward()
            optimizer.step()
        prob_np, (qx, qy) = stored
        zoom._prev_probs = prob_np[None, None].copy()  # the accepted map (inv_transform kept the last iterate's)
        rmin, rmax, cmin, cmax = zoom._object_roi
        r = min(max(qy, 0.0), h - 1.0) * (rmax - rmin + 1) / h + rmin
        c = min(max(qx, 0.0), w - 1.0) * (cmax - cmin + 1) / w + cmin
        clicks[-1] = Click(is_positive=bool(positive), coords=(r, c))
        not_clicked[min(round(r), height - 1), min(round(c), width - 1)] = 0
        out["iou"].append(best[0])
        out["biou"].append(best[1])
        out["clicks"].append((r, c))
        out["step"].append((lr * (rmax - rmin + 1) / h, lr * (cmax - cmin + 1) / w))
    return {k: np.asarray(v, np.float64) for k, v in out.items()}


def cv2_distance(zero_where):
    """f32 Euclidean distance to the nearest pixel where ``zero_where`` is False (OpenCV, exact)."""
    import cv2  # noqa: PLC0415

    return cv2.distanceTransform(zero_where.astype(np.uint8), cv2.DIST_L2, 0)


def error_distance(gt, prev, positive: bool, device):
    """The location loss's distance map: `cv2_distance` of the complement of the click's error
    region (false negatives for a positive click, false positives for a negative one); bool
    [h, w] masks in, a float tensor [h, w] on ``device`` out."""
    region = (gt & ~prev) if positive else (~gt & prev)
    return _torch().from_numpy(cv2_distance(~region)).to(device)
