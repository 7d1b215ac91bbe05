"""Ground-truth clickability maps from real clicks, and the UD / DT baseline click maps.

Reference: docs/protocols/rclicks.md §1.2 (error masks), §2 (ground-truth maps),
§4 (baseline click models), §8.2 rows 1-3 and 21 (paper/code disagreements).

Conventions
-----------
* Arrays are ``[H, W]`` = ``[row, col]``; click points are ``int32[N, 2]`` in
  ``(x, y)`` = (column, row) integer pixels, **no** +0.5 offset anywhere (the
  reference indexes ``map[y, x]``). A fixed number of point slots with a
  ``valid`` mask lets one compiled function serve every task of a bucket.
* Points are clipped into the image (the reader of §1.2 clips the same way).
* Every map function is pure ``jnp``; hyper-parameters that set kernel sizes
  (``sigma``, ``soft_sigma``, the options) are static, so the functions are
  wrapped in ``jax.jit`` with those arguments static and compose with ``vmap``.

Ground-truth map (§2, code variant = default)::

    sigma_px = sigma * diag(H, W) / diag(1080, 1920)        # sigma_units="reference"
    A  = blur(sum_k impulse(x_k, y_k)) / max(...)          # OpenCV kernel, zero border
    E~ = gaussian_filter(E, r), r = floor(5 diag / (500 sqrt 2))   # soft_sigma="code"
    C  = E~ * A                                            # normalization="code": not summed to 1

Paper variants (§8.2): ``soft_sigma="paper"`` (r = 1 % of the diagonal, not
floored), ``sigma_units="pixels"`` (sigma used as given), ``normalization="paper"``
(``C / sum C``). The code variant equals the paper's after the KLD / sampling
normalisation for row 2, so only rows 1 and 3 change a sampled distribution.

The blur is computed exactly as a separable correlation with zero padding, but
without materialising the impulse image: ``blur(S)[y, x] = sum_k w g(y - y_k)
g(x - x_k)`` with the truncated, normalised OpenCV kernel ``g`` -- one
``[N, H]^T @ [N, W]`` product (O(N H W), independent of the kernel size).
The soft error mask is likewise two products with banded ``[H, H]`` / ``[W, W]``
matrices that fold scipy's reflect border in (exact zeros stay zero; a direct
single-channel convolution with a 137-tap kernel is far slower under XLA on CPU,
see experiments/benchmarks/bench_clicksim.py).
"""

from __future__ import annotations

import functools
import math
from typing import Literal, Union

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxseg_robust.ops.distance import distance_transform_edt

__all__ = [
    "REFERENCE_DIAGONAL",
    "DEFAULT_SIGMA",
    "CLICK_TYPES",
    "click_type_code",
    "scaled_sigma",
    "opencv_kernel_size",
    "opencv_gaussian_kernel",
    "soft_mask_sigma",
    "scipy_gaussian_kernel",
    "click_density",
    "soft_error_mask",
    "gt_clickability_map",
    "error_mask",
    "uniform_map",
    "distance_transform_map",
]

# sqrt(1920**2 + 1080**2): the screen diagonal in which sigma is expressed (§2 step 1, §8.2 #3).
REFERENCE_DIAGONAL = math.sqrt(1920.0 ** 2 + 1080.0 ** 2)
# Sigma of the released clickability model (CM_5).
DEFAULT_SIGMA = 5.0
# Click types of the clicks CSV, in the order of their integer codes.
CLICK_TYPES = ("first", "fn", "fp")
# Impulse height of one click before blurring (the reference's max_value); irrelevant after max-normalisation.
_IMPULSE_MAX_VALUE = 255.0
# scipy.ndimage.gaussian_filter default truncation (kernel radius = int(truncate * sigma + 0.5)).
_SCIPY_TRUNCATE = 4.0

SoftSigma = Union[Literal["code", "paper"], float, int]


def click_type_code(click_type: str) -> int:
    """Integer code of a click type: ``first`` -> 0, ``fn`` -> 1, ``fp`` -> 2.

    Args:
      click_type: one of ``CLICK_TYPES``.
    Returns:
      Python int, usable as a traced ``click_type`` in :func:`error_mask`.
    """
    if click_type not in CLICK_TYPES:
        raise ValueError(f"click_type must be one of {CLICK_TYPES}, got {click_type!r}")
    return CLICK_TYPES.index(click_type)


def _check_positive(value: float, name: str) -> float:
    value = float(value)
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {value}")
    return value


def _check_image_size(height: int, width: int) -> tuple[int, int]:
    height, width = int(height), int(width)
    if height < 1 or width < 1:
        raise ValueError(f"image size must be positive, got height={height}, width={width}")
    return height, width


def scaled_sigma(sigma: float, height: int, width: int,
                 sigma_units: Literal["reference", "pixels"] = "reference") -> float:
    """Gaussian sigma in image pixels (§2 step 1).

    Args:
      sigma: the map hyper-parameter ``CM_sigma`` (released model: 5).
      height, width: image size in pixels.
      sigma_units: ``"reference"`` (code, default): sigma is in pixels of a 1920x1080
        screen and is scaled by ``diag(H, W) / 2202.907``; ``"pixels"`` (paper
        reading, §8.2 #3): sigma is used as given.
    Returns:
      Python float, sigma in pixels of the ``H x W`` image.
    """
    sigma = _check_positive(sigma, "sigma")
    height, width = _check_image_size(height, width)
    if sigma_units == "reference":
        return sigma * math.sqrt(height ** 2 + width ** 2) / REFERENCE_DIAGONAL
    if sigma_units == "pixels":
        return sigma
    raise ValueError(f"sigma_units must be 'reference' or 'pixels', got {sigma_units!r}")


def opencv_kernel_size(sigma_px: float) -> int:
    """Odd Gaussian kernel size ``ceil(7 sigma)`` (+1 if even), the reference's ``get_defualt_ksize``.

    Args:
      sigma_px: sigma in pixels, > 0.
    Returns:
      Python int >= 1 (1 when ``sigma_px <= 1/7``: no blur).
    """
    sigma_px = _check_positive(sigma_px, "sigma_px")
    size = int(math.ceil(7.0 * sigma_px))
    return size + (size + 1) % 2


def opencv_gaussian_kernel(sigma_px: float) -> np.ndarray:
    """1-D Gaussian kernel of OpenCV ``getGaussianKernel(opencv_kernel_size(sigma), sigma)``.

    Computed in float64 (``exp(-x**2 / (2 sigma**2))`` at ``x = i - (k-1)/2``,
    divided by its sum) and rounded to float32, as OpenCV does for float images.

    Args:
      sigma_px: sigma in pixels, > 0.
    Returns:
      float32[k] kernel, k odd, sums to 1.
    """
    size = opencv_kernel_size(sigma_px)
    offsets = np.arange(size, dtype=np.float64) - (size - 1) / 2.0
    values = np.exp(-0.5 / (sigma_px * sigma_px) * offsets * offsets)
    return (values / values.sum()).astype(np.float32)


def soft_mask_sigma(height: int, width: int, rule: SoftSigma = "code") -> float:
    """Sigma of the soft error mask, in pixels (§2 step 5, §8.2 #1).

    Args:
      height, width: image size in pixels.
      rule: ``"code"`` (default): ``floor(5 diag / (500 sqrt 2))`` (~0.707 % of the
        diagonal, floored; 0 below a 141-pixel diagonal); ``"paper"``: the click
        radius = 1 % of the diagonal (not floored); a number: used as given (>= 0).
    Returns:
      Python float >= 0 (0 means no smoothing).
    """
    height, width = _check_image_size(height, width)
    diagonal = math.sqrt(height ** 2 + width ** 2)
    if isinstance(rule, str):
        if rule == "code":
            return float(int(5 * diagonal / (500 * math.sqrt(2))))
        if rule == "paper":
            return 0.01 * diagonal
        raise ValueError(f"soft_sigma must be 'code', 'paper' or a number >= 0, got {rule!r}")
    value = float(rule)
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"soft_sigma must be 'code', 'paper' or a number >= 0, got {rule!r}")
    return value


def scipy_gaussian_kernel(sigma: float, truncate: float = _SCIPY_TRUNCATE) -> np.ndarray:
    """1-D kernel of ``scipy.ndimage.gaussian_filter`` (radius ``int(truncate sigma + 0.5)``).

    Args:
      sigma: sigma in pixels, > 0.
      truncate: kernel half-width in sigmas (scipy default 4).
    Returns:
      float64[2 r + 1] kernel, sums to 1.
    """
    sigma = _check_positive(sigma, "sigma")
    radius = int(truncate * sigma + 0.5)
    offsets = np.arange(-radius, radius + 1, dtype=np.float64)
    values = np.exp(-0.5 / (sigma * sigma) * offsets * offsets)
    return values / values.sum()


def _as_points(points_xy: jax.Array, valid: jax.Array | None) -> tuple[jax.Array, jax.Array]:
    points_xy = jnp.asarray(points_xy)
    if points_xy.ndim != 2 or points_xy.shape[-1] != 2:
        raise ValueError(f"points_xy must have shape [N, 2] (x, y), got {points_xy.shape}")
    if points_xy.shape[0] < 1:
        raise ValueError("points_xy must hold at least one point slot")
    if valid is None:
        valid = jnp.ones(points_xy.shape[:1], bool)
    valid = jnp.asarray(valid)
    if valid.shape != points_xy.shape[:1]:
        raise ValueError(f"valid must have shape {points_xy.shape[:1]}, got {valid.shape}")
    return points_xy, valid.astype(bool)


def _check_map(array: jax.Array, name: str) -> jax.Array:
    array = jnp.asarray(array)
    if array.ndim != 2 or array.shape[0] < 1 or array.shape[1] < 1:
        raise ValueError(f"{name} must be a non-empty 2-D array [H, W], got shape {array.shape}; "
                         "use jax.vmap for batches")
    return array


def _axis_profile(coords: jax.Array, size: int, kernel: np.ndarray) -> jax.Array:
    """``g(i - c_k)`` for every point k and position i of one axis: float32[N, size]."""
    radius = (kernel.shape[0] - 1) // 2
    offset = jnp.arange(size, dtype=jnp.int32)[None, :] - coords[:, None]
    index = jnp.clip(offset + radius, 0, 2 * radius)
    return jnp.where(jnp.abs(offset) <= radius, jnp.asarray(kernel)[index], 0.0)


@functools.partial(jax.jit, static_argnames=("height", "width", "sigma", "sigma_units"))
def click_density(points_xy: jax.Array, valid: jax.Array | None = None, *, height: int, width: int,
                  sigma: float = DEFAULT_SIGMA,
                  sigma_units: Literal["reference", "pixels"] = "reference") -> jax.Array:
    """Blurred, peak-normalised click impulses ``A`` (§2 steps 1-4, reference ``render_gaze_map``).

    Each valid click adds ``255 * 2 pi sigma_px**2 / N`` at ``[y, x]`` (duplicates
    accumulate); the impulse image is blurred with the OpenCV Gaussian (odd size
    ``ceil(7 sigma_px)``, zero border) and divided by its maximum.

    Args:
      points_xy: int[N, 2] click positions (x, y) in pixels; clipped into the image.
      valid: optional bool[N]; False slots are ignored (padding).
      height, width: static image size.
      sigma: static map sigma (``CM_sigma``), see :func:`scaled_sigma`.
      sigma_units: static, ``"reference"`` (code) or ``"pixels"`` (paper reading).
    Returns:
      float32[H, W] in [0, 1] with peak 1; all zeros when no slot is valid.
    """
    points_xy, valid = _as_points(points_xy, valid)
    height, width = _check_image_size(height, width)
    sigma_px = scaled_sigma(sigma, height, width, sigma_units)
    kernel = opencv_gaussian_kernel(sigma_px)
    xs = jnp.clip(points_xy[:, 0].astype(jnp.int32), 0, width - 1)
    ys = jnp.clip(points_xy[:, 1].astype(jnp.int32), 0, height - 1)
    count = jnp.sum(valid)
    weight = jnp.where(valid, _IMPULSE_MAX_VALUE * 2.0 * math.pi * sigma_px ** 2
                       / jnp.maximum(count, 1), 0.0).astype(jnp.float32)
    rows = _axis_profile(ys, height, kernel) * weight[:, None]
    cols = _axis_profile(xs, width, kernel)
    blurred = jnp.matmul(rows.T, cols, precision=lax.Precision.HIGHEST)
    peak = jnp.max(blurred)
    return jnp.where(peak > 0, blurred / jnp.where(peak > 0, peak, 1.0), 0.0)


def _reflect_blur_matrix(size: int, kernel: np.ndarray) -> jax.Array:
    """``[size, size]`` matrix of a 1-D correlation with scipy ``mode='reflect'`` borders.

    Row ``i`` holds ``kernel[j]`` at column ``reflect(i + j - r)``, where the
    half-sample symmetric extension ``d c b a | a b c d | d c b a`` repeats with
    period ``2 size`` (so any radius works, also one larger than the axis); taps
    that fold onto the same column add up.
    """
    radius = (kernel.shape[0] - 1) // 2
    rows = jnp.arange(size, dtype=jnp.int32)[:, None]
    taps = jnp.arange(kernel.shape[0], dtype=jnp.int32)[None, :]
    position = (rows + taps - radius) % (2 * size)
    columns = jnp.where(position >= size, 2 * size - 1 - position, position)
    weights = jnp.broadcast_to(jnp.asarray(kernel, jnp.float32)[None, :], columns.shape)
    return jnp.zeros((size, size), jnp.float32).at[jnp.broadcast_to(rows, columns.shape), columns].add(weights)


@functools.partial(jax.jit, static_argnames=("sigma",))
def soft_error_mask(error_mask: jax.Array, sigma: float) -> jax.Array:
    """``scipy.ndimage.gaussian_filter(error_mask, sigma)`` with the defaults (reflect, truncate 4).

    Args:
      error_mask: float[H, W] error mask ``E`` (values in [0, 1], soft allowed).
      sigma: static sigma in pixels (see :func:`soft_mask_sigma`); 0 returns ``E``
        unchanged (scipy skips axes with sigma ~ 0).
    Returns:
      float32[H, W] smoothed mask.
    """
    error_mask = _check_map(error_mask, "error_mask").astype(jnp.float32)
    sigma = float(sigma)
    if not math.isfinite(sigma) or sigma < 0:
        raise ValueError(f"sigma must be a finite number >= 0, got {sigma}")
    if sigma <= 1e-15:
        return error_mask
    kernel = scipy_gaussian_kernel(sigma)
    height, width = error_mask.shape
    # Separable blur as two banded matrix products: exact zeros stay zero and the cost
    # does not grow with the radius (direct 1-channel conv: see the module doc).
    rows = jnp.matmul(_reflect_blur_matrix(height, kernel), error_mask, precision=lax.Precision.HIGHEST)
    return jnp.matmul(rows, _reflect_blur_matrix(width, kernel).T, precision=lax.Precision.HIGHEST)


@functools.partial(jax.jit, static_argnames=("sigma", "soft_sigma", "sigma_units", "normalization"))
def gt_clickability_map(points_xy: jax.Array, valid: jax.Array | None, error_mask: jax.Array, *,
                        sigma: float = DEFAULT_SIGMA, soft_sigma: SoftSigma = "code",
                        sigma_units: Literal["reference", "pixels"] = "reference",
                        normalization: Literal["code", "paper"] = "code") -> jax.Array:
    """Ground-truth clickability map ``C`` of one click task (§2, reference ``ClickMaps``).

    Args:
      points_xy: int[N, 2] the task's clicks (x, y) in pixels of the ``H x W`` frame.
      valid: optional bool[N] (None = all valid).
      error_mask: float[H, W] error mask ``E`` of the task (:func:`error_mask`).
      sigma: static map sigma ``CM_sigma`` (released model: 5).
      soft_sigma: static soft-mask rule, see :func:`soft_mask_sigma` (default ``"code"``).
      sigma_units: static, see :func:`scaled_sigma` (default ``"reference"``).
      normalization: static; ``"code"`` (default): ``C = E~ * A`` with ``A`` peak-1,
        not summed to 1 (the KLD loss and the samplers normalise); ``"paper"``:
        ``C / sum C`` (sums to 1; all zeros when ``C`` is all zero).
    Returns:
      float32[H, W] non-negative map.
    """
    error_mask = _check_map(error_mask, "error_mask").astype(jnp.float32)
    height, width = error_mask.shape
    density = click_density(points_xy, valid, height=height, width=width, sigma=sigma,
                            sigma_units=sigma_units)
    smoothed = soft_error_mask(error_mask, soft_mask_sigma(height, width, soft_sigma))
    clickability = smoothed * density
    if normalization == "code":
        return clickability
    if normalization == "paper":
        total = jnp.sum(clickability)
        return jnp.where(total > 0, clickability / jnp.where(total > 0, total, 1.0), 0.0)
    raise ValueError(f"normalization must be 'code' or 'paper', got {normalization!r}")


def error_mask(gt_mask: jax.Array, previous_mask: jax.Array | None, click_type) -> jax.Array:
    """Error mask ``E`` of a click task (§1.2 step 6).

    ``first``: ``E = G``; ``fn``: ``E = G (1 - P_prev)``; ``fp``: ``E = (1 - G) P_prev``.

    Args:
      gt_mask: bool or float[H, W] GT object mask ``G`` (ignore pixels already 0).
      previous_mask: float[H, W] previous-round mask ``P_prev`` in [0, 1] (soft, not
        re-binarised); None only for ``first`` tasks.
      click_type: ``"first"``, ``"fn"``, ``"fp"`` or its int code (may be traced, so
        tasks of different types can be vmapped together).
    Returns:
      float32[H, W] error mask in [0, 1].
    """
    gt = _check_map(gt_mask, "gt_mask").astype(jnp.float32)
    if previous_mask is None:
        if not (isinstance(click_type, str) and click_type == "first"):
            raise ValueError("previous_mask is required unless click_type is 'first'")
        return gt
    previous = _check_map(previous_mask, "previous_mask").astype(jnp.float32)
    if previous.shape != gt.shape:
        raise ValueError(f"previous_mask shape {previous.shape} differs from gt_mask shape {gt.shape}")
    code = click_type_code(click_type) if isinstance(click_type, str) else jnp.asarray(click_type)
    return jnp.select([code == 0, code == 1], [gt, gt * (1.0 - previous)], (1.0 - gt) * previous)


def _divide_by_max(values: jax.Array) -> jax.Array:
    peak = jnp.max(values)
    return jnp.where(peak > 0, values / jnp.where(peak > 0, peak, 1.0), 0.0)


@jax.jit
def uniform_map(error_mask: jax.Array) -> jax.Array:
    """UD baseline click map ``E / max(E)`` (§4, reference ``uniform_model``).

    Args:
      error_mask: float[H, W] error mask, values >= 0.
    Returns:
      float32[H, W] in [0, 1]; all zeros when ``E`` is all zero (the reference divides 0 by 0).
    """
    return _divide_by_max(_check_map(error_mask, "error_mask").astype(jnp.float32))


@functools.partial(jax.jit, static_argnames=("pad_border",))
def distance_transform_map(error_mask: jax.Array, *, pad_border: bool = False) -> jax.Array:
    """DT baseline click map: exact EDT of the error region divided by its max (§4, ``distance_transform_model``).

    The region is ``uint8(E * 255) != 0``, i.e. ``float32(E) * 255 >= 1`` (a soft
    error mask below 1/255 is background, as in the reference's uint8 cast).

    Args:
      error_mask: float[H, W] error mask in [0, 1].
      pad_border: static; False (code, §8.2 #21): the image border is not background;
        True: the border counts as background (the benchmark clicker's convention).
    Returns:
      float32[H, W] in [0, 1]; all zeros for an empty region; all ones when the
      region covers the whole image without ``pad_border`` (OpenCV returns a
      constant there too).
    """
    error_mask = _check_map(error_mask, "error_mask").astype(jnp.float32)
    region = error_mask * 255.0 >= 1.0
    return _divide_by_max(distance_transform_edt(region, pad_border=pad_border))
