"""Box geometry for the BREPS box attack: tight boxes, IoU, CIoU, the Gamma realism prior.

Boxes are ``(x1, y1, x2, y2)`` on a trailing axis of size 4, in pixels of a
stated frame. Continuous quantities (area, IoU, CIoU) use ``w = x2 - x1`` and
``h = y2 - y1`` without the +1 of inclusive pixel counting, exactly as the
reference code (torchvision) does, even though tight boxes are stored as
inclusive pixel indices (docs/protocols/breps.md §2.4).

Everything is pure and jit/vmap/grad-safe. Where the reference produces a
NaN or an infinity, the *values* here are the same IEEE values, but the
gradients are made finite with the double-``where`` pattern (§8
pitfall 9): at identical boxes, zero-width/-height boxes, 0 x 0 boxes and
X = 0 in the realism term, ``jax.grad`` returns finite numbers (torch returns
NaN in several of these cases). Deviations from the torch gradient are
listed in each docstring.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax.scipy.special import gammaln, xlogy

# Gamma prior over the CIoU loss X of human boxes (BREPS code, full precision;
# the paper rounds to k = 1.789, theta = 0.121). Scale parametrisation:
# torch.distributions.Gamma(concentration=k, rate=1/theta).
GAMMA_K = 1.7891955953866256
GAMMA_THETA = 0.12104836378138935
# torchvision.ops.complete_box_iou_loss default eps (union, diagonal, alpha).
CIOU_EPS = 1e-7
# The box BREPS uses for an empty mask.
EMPTY_MASK_BOX = (0, 0, 1, 1)


def _as_boxes(boxes, name: str) -> jnp.ndarray:
    """Floating array with a trailing axis of size 4 (ints upcast to f32, like torchvision)."""
    boxes = jnp.asarray(boxes)
    if boxes.ndim < 1 or boxes.shape[-1] != 4:
        raise ValueError(f"{name} must have a trailing axis of size 4 (x1, y1, x2, y2); got shape {boxes.shape}")
    if not jnp.issubdtype(boxes.dtype, jnp.floating):
        boxes = boxes.astype(jnp.float32)
    return boxes


def _clamp_like_torch(value, low, high):
    """``torch.clamp``: clipped value; gradient 1 inside the closed range [low, high], else 0."""
    return jnp.where(value < low, low, jnp.where(value > high, high, value))


def _divide_finite_grad(numerator, denominator):
    """``numerator / denominator`` with IEEE values; zero gradient where the denominator is 0."""
    is_zero = denominator == 0
    safe_denominator = jnp.where(is_zero, jnp.ones_like(denominator), denominator)
    return jnp.where(is_zero, jax.lax.stop_gradient(numerator / denominator), numerator / safe_denominator)


@jax.custom_jvp
def _atan_of_ratio(width, height):
    """``atan(width / height)`` with IEEE values (±pi/2 for height 0, NaN for 0/0)."""
    return jnp.arctan(width / height)


@_atan_of_ratio.defjvp
def _atan_of_ratio_jvp(primals, tangents):
    # d atan(w/h) = (h dw - w dh) / (w^2 + h^2): equal to the chain rule for
    # h != 0, the finite one-sided limit at h == 0 (torch: 0 * inf = NaN), and
    # taken as 0 at w == h == 0.
    width, height = primals
    d_width, d_height = tangents
    squared_norm = width * width + height * height
    defined = squared_norm > 0
    safe_norm = jnp.where(defined, squared_norm, jnp.ones_like(squared_norm))
    tangent = jnp.where(defined, (height * d_width - width * d_height) / safe_norm, 0.0)
    return _atan_of_ratio(width, height), tangent


def _adding_leaves_unchanged(value, addend: float) -> jnp.ndarray:
    """Whether ``fl(value + addend) == value`` in round-to-nearest-even, from ``value``'s bits.

    Decided from the exponent and last mantissa bit of ``value`` (`jnp.frexp`), so
    the answer cannot change with how a compiler fuses the addition into
    neighbouring multiplications.

    Args:
      value: [...] float array (finite, > 0 for a True answer).
      addend: a non-negative Python float.

    Returns:
      bool[...].
    """
    mantissa, exponent = jnp.frexp(value)
    digits = jnp.finfo(value.dtype).nmant + 1  # significand bits, the implicit one included
    half_spacing = jnp.ldexp(jnp.ones_like(value), exponent - digits - 1)
    last_bit_even = jnp.mod(jnp.ldexp(mantissa, digits), 2.0) == 0.0
    rounds_back = (addend < half_spacing) | ((addend == half_spacing) & last_bit_even)
    return (value > 0) & jnp.isfinite(value) & rounds_back


def tight_box(mask) -> jnp.ndarray:
    """Tight bounding box of a mask in inclusive pixel indices (BREPS §2.4).

    ``(x1, y1, x2, y2) = (min col, min row, max col, max row)`` of the pixels
    with ``mask > 0`` (so a {-1, 0, 1} GT with ignore pixels gives the box of
    G+, and an interpolated float mask the box of its non-zero support).
    An empty mask gives ``(0, 0, 1, 1)``. Static shapes only (no ``nonzero``).

    Args:
      mask: [..., H, W] bool or numeric mask.

    Returns:
      i32[..., 4] box (x1, y1, x2, y2); a one-pixel mask at (r, c) gives (c, r, c, r).
    """
    mask = jnp.asarray(mask)
    if mask.ndim < 2:
        raise ValueError(f"mask must have shape [..., H, W]; got {mask.shape}")
    height, width = mask.shape[-2:]
    foreground = mask if mask.dtype == jnp.bool_ else mask > 0
    row_has = jnp.any(foreground, axis=-1)  # [..., H]
    col_has = jnp.any(foreground, axis=-2)  # [..., W]
    y1 = jnp.argmax(row_has, axis=-1)
    y2 = height - 1 - jnp.argmax(row_has[..., ::-1], axis=-1)
    x1 = jnp.argmax(col_has, axis=-1)
    x2 = width - 1 - jnp.argmax(col_has[..., ::-1], axis=-1)
    box = jnp.stack([x1, y1, x2, y2], axis=-1).astype(jnp.int32)
    nonempty = jnp.any(row_has, axis=-1)[..., None]
    return jnp.where(nonempty, box, jnp.asarray(EMPTY_MASK_BOX, jnp.int32))


def box_area(boxes) -> jnp.ndarray:
    """Continuous area ``(x2 - x1) * (y2 - y1)`` (no +1; negative for unordered boxes).

    Args:
      boxes: [..., 4] (x1, y1, x2, y2).

    Returns:
      [...] areas in squared pixels.
    """
    boxes = _as_boxes(boxes, "boxes")
    return (boxes[..., 2] - boxes[..., 0]) * (boxes[..., 3] - boxes[..., 1])


def box_iou(boxes1, boxes2, *, eps: float = 0.0) -> jnp.ndarray:
    """Elementwise continuous box IoU (torchvision ``box_iou`` formula), broadcasting.

    ``inter = max(0, min(x2) - max(x1)) * max(0, min(y2) - max(y1))``,
    ``IoU = inter / (area1 + area2 - inter + eps)``. With ``eps = 0`` two
    zero-area boxes give NaN (value as torchvision; the gradient is zero there).

    Args:
      boxes1, boxes2: [..., 4] (x1, y1, x2, y2), broadcast against each other.
      eps: added to the union.

    Returns:
      [...] IoU.
    """
    boxes1 = _as_boxes(boxes1, "boxes1")
    boxes2 = _as_boxes(boxes2, "boxes2")
    overlap_x = jnp.minimum(boxes1[..., 2], boxes2[..., 2]) - jnp.maximum(boxes1[..., 0], boxes2[..., 0])
    overlap_y = jnp.minimum(boxes1[..., 3], boxes2[..., 3]) - jnp.maximum(boxes1[..., 1], boxes2[..., 1])
    inter_w = jnp.maximum(overlap_x, 0.0)
    inter_h = jnp.maximum(overlap_y, 0.0)
    inter = inter_w * inter_h
    union = box_area(boxes1) + box_area(boxes2) - inter
    return _divide_finite_grad(inter, union + eps)


def pairwise_box_iou(boxes1, boxes2, *, eps: float = 0.0) -> jnp.ndarray:
    """All-pairs continuous box IoU (torchvision ``box_iou``).

    Args:
      boxes1: [N, 4]; boxes2: [M, 4] (x1, y1, x2, y2).
      eps: added to the union.

    Returns:
      [N, M] IoU matrix.
    """
    boxes1 = _as_boxes(boxes1, "boxes1")
    boxes2 = _as_boxes(boxes2, "boxes2")
    if boxes1.ndim != 2 or boxes2.ndim != 2:
        raise ValueError(f"boxes1 and boxes2 must have shapes [N, 4] and [M, 4]; got {boxes1.shape}, {boxes2.shape}")
    return box_iou(boxes1[:, None, :], boxes2[None, :, :], eps=eps)


def complete_box_iou_loss(boxes1, boxes2, *, eps: float = CIOU_EPS) -> jnp.ndarray:
    """CIoU loss exactly as ``torchvision.ops.complete_box_iou_loss(reduction='none')``.

    ::

        inter = (min x2 - max x1)(min y2 - max y1) if both > 0 else 0
        IoU   = inter / (w1 h1 + w2 h2 - inter + eps)
        c2    = (max x2 - min x1)^2 + (max y2 - min y1)^2 + eps
        rho2  = squared distance of the box centres
        v     = 4/pi^2 (atan(w2/h2) - atan(w1/h1))^2       (0/0 -> NaN)
        alpha = stop_gradient(v / (1 - IoU + v + eps))
        loss  = 1 - IoU + rho2/c2 + alpha v

    No relu, clipping or ordering is applied (see `breps_ciou_loss`). Values,
    NaNs and infinities equal torchvision's (up to float rounding). Note that
    torchvision forwards its ``eps`` only to alpha and always uses 1e-7 in the
    IoU and the diagonal; here ``eps`` is used in all three (identical at the
    default).

    Gradients equal torch's wherever torch's are finite and are finite
    everywhere: a zero-height (width) box differentiates atan(w/h) with the
    one-sided limit -dh/w (torch: NaN); where the value is NaN (a 0 x 0 box,
    or 0/0 in the IoU) or alpha is not finite the corresponding term gets zero
    gradient; at ties of min/max the gradient is split evenly (as torch).

    Args:
      boxes1, boxes2: [..., 4] (x1, y1, x2, y2) float boxes of equal (or
        broadcastable) shape; ints are upcast to f32.
      eps: see above.

    Returns:
      [...] loss, >= 0 for ordered boxes.
    """
    boxes1 = _as_boxes(boxes1, "boxes1")
    boxes2 = _as_boxes(boxes2, "boxes2")
    x1, y1, x2, y2 = (boxes1[..., i] for i in range(4))
    x1g, y1g, x2g, y2g = (boxes2[..., i] for i in range(4))

    inter_x1 = jnp.maximum(x1, x1g)
    inter_y1 = jnp.maximum(y1, y1g)
    inter_x2 = jnp.minimum(x2, x2g)
    inter_y2 = jnp.minimum(y2, y2g)
    overlaps = (inter_y2 > inter_y1) & (inter_x2 > inter_x1)
    inter = jnp.where(overlaps, (inter_x2 - inter_x1) * (inter_y2 - inter_y1), 0.0)
    union = (x2 - x1) * (y2 - y1) + (x2g - x1g) * (y2g - y1g) - inter
    iou = _divide_finite_grad(inter, union + eps)
    # An ordered box compared with itself: torch's IoU is fl(A / fl(A + eps)) = 1 exactly when
    # adding eps to the area A rounds back to A (an unordered one has no intersection: IoU 0), and equal aspect ratios give the same arctangent, so the
    # loss is exactly 0. XLA may contract the area products into fused multiply-adds and evaluate
    # atan with different code in vectorised and scalar lanes, which left ~1e-23 instead of 0
    # depending on the batch width; both identities are therefore imposed from the inputs' bits.
    identical = jnp.all(boxes1 == boxes2, axis=-1)
    iou = jnp.where(identical & overlaps & _adding_leaves_unchanged((x2 - x1) * (y2 - y1), eps), 1.0, iou)

    enclosing_x1 = jnp.minimum(x1, x1g)
    enclosing_y1 = jnp.minimum(y1, y1g)
    enclosing_x2 = jnp.maximum(x2, x2g)
    enclosing_y2 = jnp.maximum(y2, y2g)
    diagonal_squared = (enclosing_x2 - enclosing_x1) ** 2 + (enclosing_y2 - enclosing_y1) ** 2 + eps
    centers_squared = ((x2 + x1) / 2 - (x1g + x2g) / 2) ** 2 + ((y2 + y1) / 2 - (y1g + y2g) / 2) ** 2
    diou_loss = 1 - iou + _divide_finite_grad(centers_squared, diagonal_squared)

    atan_gt = _atan_of_ratio(x2g - x1g, y2g - y1g)
    atan_pred = _atan_of_ratio(x2 - x1, y2 - y1)
    aspect_undefined = jnp.isnan(atan_gt) | jnp.isnan(atan_pred)
    same_aspect = jax.lax.stop_gradient((x2g - x1g) / (y2g - y1g) == (x2 - x1) / (y2 - y1))
    atan_difference = jnp.where(aspect_undefined | same_aspect, 0.0, atan_gt - atan_pred)
    v = (4 / (math.pi**2)) * atan_difference**2
    alpha = jax.lax.stop_gradient(v / (1 - iou + v + eps))
    alpha_finite = jnp.isfinite(alpha)
    aspect_term = jnp.where(
        alpha_finite,
        jnp.where(alpha_finite, alpha, 0.0) * v,
        jax.lax.stop_gradient(alpha * v),
    )
    loss = diou_loss + aspect_term
    return jnp.where(aspect_undefined, jnp.nan, loss)


def breps_ciou_loss(box, tight, *, eps: float = CIOU_EPS, relu_box: bool = True) -> jnp.ndarray:
    """The BREPS box distance X = nan_to_num(CIoU(relu(box), tight)) (§4.2).

    ``relu`` on the optimised box is applied here when ``relu_box`` (the BREPS
    code's behaviour: negative coordinates clamp to 0 with zero gradient);
    `complete_box_iou_loss` itself never applies it. ``nan_to_num`` maps
    NaN -> 0 (e.g. a 0 x 0 box: one-pixel GT) and ±inf -> ± the dtype's max,
    with zero gradient at those entries (as torch's ``nan_to_num``).

    Args:
      box: [..., 4] optimised box (x1, y1, x2, y2), same frame as ``tight``.
      tight: [..., 4] tight GT box (float).
      eps: CIoU eps.
      relu_box: static; apply ``relu`` to ``box`` first.

    Returns:
      [...] X, finite; X == 0 for box == tight when the box area is large
      enough for ``area + 1e-7 == area`` in float32.
    """
    box = _as_boxes(box, "box")
    if relu_box:
        box = jax.nn.relu(box)
    return jnp.nan_to_num(complete_box_iou_loss(box, tight, eps=eps))


def gamma_log_prob(x, k=GAMMA_K, theta=GAMMA_THETA) -> jnp.ndarray:
    """Gamma log-density, as ``torch.distributions.Gamma(k, rate=1/theta).log_prob``.

    ``log p(x) = k log(1/theta) + (k - 1) log x - x/theta - lgamma(k)``,
    computed in torch's order (``xlogy`` terms). At x = 0 it is -inf for
    k > 1 (gradient not finite; use `breps_realism_log_prob` in objectives).
    For x < 0 it is NaN like torch without argument validation (torch with
    validation, its default, raises; scipy returns -inf).

    Args:
      x: [...] values (BREPS: the CIoU loss X).
      k: concentration (shape) k > 0.
      theta: scale theta > 0 (rate 1/theta).

    Returns:
      [...] log-density in x's float dtype (f32 for ints).
    """
    x = jnp.asarray(x)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        x = x.astype(jnp.float32)
    rate = 1 / theta
    return xlogy(k, rate) + xlogy(k - 1, x) - rate * x - gammaln(jnp.asarray(k, x.dtype))


def breps_realism_log_prob(x, k=GAMMA_K, theta=GAMMA_THETA) -> jnp.ndarray:
    """BREPS realism term log p(X) with the skip rule, finite-gradient (§4.3-4.4).

    Returns `gamma_log_prob` where ``X > 0`` and 0 (term skipped, zero
    gradient) where ``X == 0`` — the reference drops ``-lambda log p`` when
    X == 0, e.g. at iterate 0 (box == tight box) or after NaN -> 0. Written with
    a double ``where`` so that ``jax.grad`` is finite at X == 0. X < 0 is
    unreachable when the tight box is ordered (IoU < 1 then); the reference
    would produce NaN or a validation error there, this function skips the
    term too. Objective: ``L = s * Dice - lambda * breps_realism_log_prob(X)``.

    Args:
      x: [...] BREPS box distance X (`breps_ciou_loss`).
      k, theta: Gamma shape and scale.

    Returns:
      [...] log p(X) or 0.
    """
    x = jnp.asarray(x)
    active = x > 0
    safe_x = jnp.where(active, x, jnp.ones_like(x))
    return jnp.where(active, gamma_log_prob(safe_x, k, theta), 0.0)


def _per_axis(boxes, sx, sy) -> jnp.ndarray:
    sx = jnp.asarray(sx, boxes.dtype)
    sy = jnp.asarray(sy, boxes.dtype)
    return jnp.stack(jnp.broadcast_arrays(sx, sy, sx, sy), axis=-1)


def scale_boxes(boxes, sx, sy) -> jnp.ndarray:
    """Maps boxes into another frame: ``(x1 sx, y1 sy, x2 sx, y2 sy)``.

    Evaluation frame -> SAM resized frame uses the per-axis factors
    ``sx = w'/W``, ``sy = h'/H`` (notation).

    Args:
      boxes: [..., 4]; ints are upcast to f32.
      sx, sy: scalars or [...] per-box factors.

    Returns:
      [..., 4] scaled boxes.
    """
    boxes = _as_boxes(boxes, "boxes")
    return boxes * _per_axis(boxes, sx, sy)


def unscale_boxes(boxes, sx, sy) -> jnp.ndarray:
    """Inverse of `scale_boxes` by division (``x / sx``, ``y / sy``), as the reference reports boxes.

    Args:
      boxes: [..., 4]; sx, sy: scalars or [...] factors (non-zero).

    Returns:
      [..., 4] boxes in the original frame.
    """
    boxes = _as_boxes(boxes, "boxes")
    return boxes / _per_axis(boxes, sx, sy)


def clip_boxes(boxes, x_range, y_range) -> jnp.ndarray:
    """Clamps x1, x2 to ``x_range`` and y1, y2 to ``y_range`` (``torch.clamp`` semantics).

    E.g. the BREPS reported box: ``x_range = (1, w' - 1)``, ``y_range = (1, h' - 1)``;
    the jitter baseline: ``(0, W' - 1)``, ``(0, H' - 1)``.

    Args:
      boxes: [..., 4].
      x_range, y_range: (low, high) pairs of scalars (may be traced).

    Returns:
      [..., 4] clamped boxes; gradient 1 inside the closed ranges, 0 outside.
    """
    boxes = _as_boxes(boxes, "boxes")
    (x_low, x_high), (y_low, y_high) = x_range, y_range
    x = _clamp_like_torch(boxes[..., 0::2], x_low, x_high)
    y = _clamp_like_torch(boxes[..., 1::2], y_low, y_high)
    return jnp.stack([x[..., 0], y[..., 0], x[..., 1], y[..., 1]], axis=-1)


def order_box_corners(boxes) -> jnp.ndarray:
    """Reorders corners so that x1 <= x2 and y1 <= y2 (min/max per axis).

    Args:
      boxes: [..., 4] possibly unordered boxes.

    Returns:
      [..., 4] ``(min(x1,x2), min(y1,y2), max(x1,x2), max(y1,y2))``.
    """
    boxes = _as_boxes(boxes, "boxes")
    x_low = jnp.minimum(boxes[..., 0], boxes[..., 2])
    x_high = jnp.maximum(boxes[..., 0], boxes[..., 2])
    y_low = jnp.minimum(boxes[..., 1], boxes[..., 3])
    y_high = jnp.maximum(boxes[..., 1], boxes[..., 3])
    return jnp.stack([x_low, y_low, x_high, y_high], axis=-1)


def clip_and_order_boxes(boxes, width, height) -> jnp.ndarray:
    """The BREPS paper's box projection (``clip_and_order=True``, §7.2 row 7).

    Orders the corners (`order_box_corners`) and clips x to ``[0, width - 1]``
    and y to ``[0, height - 1]`` (inclusive pixel-index range of the frame the
    box lives in, as the reference clips boxes elsewhere). The reference code
    applies neither (its default).

    Args:
      boxes: [..., 4].
      width, height: frame size in pixels (scalars, may be traced).

    Returns:
      [..., 4] ordered boxes inside the frame.
    """
    return clip_boxes(order_box_corners(boxes), (0, width - 1), (0, height - 1))
