"""SAM-style resizing: longest-side resize, antialiased image resize, logit upsampling.

Three kinds of bilinear resampling appear in the SAM pipeline, and each must
match the PyTorch reference it replaces:

* the image to the model frame, float path (``ResizeLongestSide.apply_image_torch``,
  used by the prompt attacks): torch ``interpolate(bilinear, align_corners=False,
  antialias=True)``. Its weights depend on float32 rounding inside torch
  (``center = scale * (i + 0.5)`` in float32 drifts for large ``i``), so the taps
  are computed on the host emulating that arithmetic (`antialias_taps`); exact
  float64 weights (or ``jax.image.resize``) differ by up to ~0.01 grey levels.
* small static resizes without antialias (the 256 -> 1024 logit upsampling, the
  relative-position table interpolation): torch ``interpolate(linear/bilinear,
  align_corners=False)`` = half-pixel centres, source index clamped at 0, right
  neighbour clamped at the last sample (`linear_taps`).
* the final crop-and-resize of logits to the original frame with *traced*
  sizes (`upsample_sam_logits`): the model-frame map is cropped to ``(h', w')``
  and resized to ``(H, W)`` inside a static output frame, so images of
  different sizes padded into one bucket share one compiled function.

A "tap table" is a pair ``(index i32[out, K], weight f32[out, K])``: output
sample ``o`` along an axis is ``sum_k weight[o, k] * x[index[o, k]]``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

Taps = tuple  # (index int32[out, K], weight float32[out, K])


def longest_side_shape(height: int, width: int, long_side: int) -> tuple[int, int]:
    """(h', w') of an ``height x width`` image resized so its longest side is ``long_side``.

    SAM's rule (``ResizeLongestSide.get_preprocess_shape``): ``s = long_side /
    max(H, W)``, ``h' = int(H * s + 0.5)``, ``w' = int(W * s + 0.5)`` in float64.

    Raises:
      ValueError: if a size is not a positive integer.
    """
    for name, value in (("height", height), ("width", width), ("long_side", long_side)):
        if int(value) != value or value <= 0:
            raise ValueError(f"{name} must be a positive integer; got {value!r}")
    scale = long_side * 1.0 / max(height, width)
    return int(height * scale + 0.5), int(width * scale + 0.5)


def antialias_taps(in_size: int, out_size: int) -> Taps:
    """Tap table of torch's antialiased bilinear resize along one axis (host, numpy).

    Emulates ``torch.nn.functional.interpolate(mode="bilinear",
    align_corners=False, antialias=True)`` for float tensors on CPU: a triangle
    filter widened by the downsampling factor, evaluated at the input pixels in
    ``[xmin, xmin + xsize)`` around ``center = scale * (o + 0.5)`` and
    normalised to sum 1, with torch's float32 intermediate rounding.

    Args:
      in_size: number of input samples (> 0).
      out_size: number of output samples (> 0).

    Returns:
      (index int32[out_size, K], weight float32[out_size, K]); unused taps have
      weight 0 and index 0.
    """
    if in_size <= 0 or out_size <= 0:
        raise ValueError(f"in_size and out_size must be positive; got {in_size}, {out_size}")
    f32 = np.float32
    scale = f32(in_size) / f32(out_size)
    support = scale if scale >= 1.0 else f32(1.0)
    invscale = f32(1.0 / np.float64(scale)) if scale >= 1.0 else f32(1.0)
    outs = np.arange(out_size)
    center = (scale * (outs + f32(0.5)).astype(f32)).astype(f32)
    xmin = np.maximum(((center - support).astype(f32).astype(np.float64) + 0.5).astype(np.int64), 0)
    xmax = np.minimum(((center + support).astype(f32).astype(np.float64) + 0.5).astype(np.int64),
                      in_size)
    xsize = xmax - xmin
    k = int(xsize.max())
    j = np.arange(k)[None, :]
    pos = (j + xmin[:, None]).astype(f32)
    dist = ((pos - center[:, None]).astype(f32).astype(np.float64) + 0.5) * np.float64(invscale)
    dist = np.abs(dist.astype(f32))
    weight = np.where(dist < 1.0, (1.0 - dist.astype(np.float64)).astype(f32), f32(0.0))
    weight = np.where(j < xsize[:, None], weight, f32(0.0)).astype(f32)
    total = np.zeros((out_size,), f32)
    for t in range(k):  # float32 accumulation in tap order, as torch does
        total = (total + weight[:, t]).astype(f32)
    weight = np.where(total[:, None] != 0, weight / np.where(total == 0, 1, total)[:, None], 0)
    index = np.where(j < xsize[:, None], j + xmin[:, None], 0)
    return index.astype(np.int32), weight.astype(f32)


def linear_taps_at(src: np.ndarray, in_size: int) -> Taps:
    """Tap table of linear interpolation at source positions ``src`` (host, numpy).

    Args:
      src: float[out_size] non-negative source positions in input samples; their
        dtype is the arithmetic of the weights (float32 or float64).
      in_size: input samples (> 0).

    Returns:
      (index int32[out_size, 2], weight ``src.dtype``[out_size, 2]): left sample
      ``floor(src)`` and right sample, both clamped at ``in_size - 1``, with weights
      ``(1 - l, l)``, ``l = clip(src - floor(src), 0, 1)``.
    """
    f = src.dtype.type
    i0 = np.minimum(np.floor(src).astype(np.int64), in_size - 1)
    lam = np.clip(src - i0.astype(f), 0.0, 1.0).astype(f)
    i1 = np.where(i0 < in_size - 1, i0 + 1, i0)
    index = np.stack([i0, i1], axis=1).astype(np.int32)
    weight = np.stack([f(1.0) - lam, lam], axis=1).astype(f)
    return index, weight


def linear_taps(in_size: int, out_size: int, dtype=np.float32) -> Taps:
    """Tap table of torch's (bi)linear resize without antialias, one axis (host, numpy).

    ``interpolate(mode="linear"/"bilinear", align_corners=False)``: source
    position ``s = (in/out) * (o + 0.5) - 0.5`` clamped at 0, left sample
    ``floor(s)``, right sample clamped at ``in_size - 1``; float32 arithmetic
    with torch's fused multiply-add (bit-exact source positions), or float64
    arithmetic with ``dtype=np.float64`` (torch on double tensors).

    Returns:
      (index int32[out_size, 2], weight ``dtype``[out_size, 2]).
    """
    if in_size <= 0 or out_size <= 0:
        raise ValueError(f"in_size and out_size must be positive; got {in_size}, {out_size}")
    f = np.dtype(dtype).type
    scale = f(in_size) / f(out_size)
    # torch's CPU kernel contracts ``scale * (o + 0.5) - 0.5`` into one fused
    # multiply-add (a single float32 rounding); float64 then one cast emulates it.
    centres = (np.arange(out_size) + f(0.5)).astype(f).astype(np.float64)
    src = (np.float64(scale) * centres - 0.5).astype(f)
    return linear_taps_at(np.maximum(src, f(0.0)), in_size)


def apply_taps(x: jnp.ndarray, taps: Taps, axis: int) -> jnp.ndarray:
    """Resamples ``x`` along ``axis`` with a tap table.

    A host (numpy) table that upsamples by an integer factor with the same taps
    in every period (`periodic_phases`: torch's bilinear resize by 2, 4, 8)
    is applied phase by phase with static slices (`_apply_phases`), whose
    reverse pass is pads and sums; otherwise with one gather per tap, whose
    reverse pass is a scatter-add (slow on the CPU). Both compute every output
    sample as the same products summed in the same order (XLA may contract a
    product and a sum into one fused multiply-add in either: 1 ulp).

    Args:
      x: array [..., n_in, ...] (any float dtype).
      taps: (index int[n_out, K] into ``range(n_in)``, weight float[n_out, K]).
      axis: the axis to resample.

    Returns:
      Array with ``x.shape[axis]`` replaced by ``n_out``; dtype of ``x``.
    """
    axis = axis % x.ndim
    if isinstance(taps[0], np.ndarray) and isinstance(taps[1], np.ndarray):
        phases = periodic_phases(taps[0], taps[1], x.shape[axis])
        if phases is not None:
            return _apply_phases(x, phases, taps, axis)
    return _gather_taps(x, taps, axis)


def _gather_taps(x: jnp.ndarray, taps: Taps, axis: int) -> jnp.ndarray:
    """`apply_taps` by gathers: output sample ``o`` is ``sum_k x[index[o, k]] * weight[o, k]``."""
    index, weight = jnp.asarray(taps[0]), jnp.asarray(taps[1], dtype=x.dtype)
    shape = [1] * x.ndim
    shape[axis] = index.shape[0]
    out = None
    # One gather per tap (no [..., out, K, ...] intermediate): XLA on CPU fuses each
    # gather with its multiply-add, far faster than gathering all taps at once
    # (docs/benchmarking.md, "Measurements behind design choices").
    for k in range(index.shape[1]):
        term = jnp.take(x, index[:, k], axis=axis, mode="clip") * weight[:, k].reshape(shape)
        out = term if out is None else out + term
    return out


Phase = tuple  # (lo, hi, offsets int[K], weights float[K]) of one phase, see `periodic_phases`


def periodic_phases(index: np.ndarray, weight: np.ndarray, in_size: int) -> list[Phase] | None:
    """The periodic structure of an integer-factor upsampling tap table, or None (host).

    With ``n_out = s * n_in`` (``s >= 2``), phase ``r`` is the output samples
    ``o = s i + r``. It is periodic on ``lo <= i < hi`` when there every tap
    reads ``x[i + offset_k]`` with the weight ``weight_k`` of the phase's middle
    sample; the rows outside that range (the clamped borders: at most a few)
    keep their own taps.

    Returns:
      One ``(lo, hi, offsets, weights)`` per phase, or None when ``n_out`` is
      not a multiple ``s >= 2`` of ``in_size``, or a phase's middle sample reads
      a clamped (repeated) index, or a phase has no periodic range of at least
      half its samples.
    """
    n_out = index.shape[0]
    if in_size < 2 or n_out % in_size or n_out // in_size < 2:
        return None
    s = n_out // in_size
    rows = np.arange(in_size)
    phases = []
    for r in range(s):
        idx, wt = index[r::s], weight[r::s]
        mid = in_size // 2
        offsets, weights = idx[mid] - mid, wt[mid]
        if np.any(np.diff(offsets) <= 0):  # a clamped middle row: the table is too short
            return None
        good = np.all((idx - rows[:, None] == offsets) & (wt == weights), axis=1)
        lo = mid
        while lo > 0 and good[lo - 1]:
            lo -= 1
        hi = mid + 1
        while hi < in_size and good[hi]:
            hi += 1
        if 2 * (hi - lo) < in_size:
            return None
        phases.append((lo, hi, offsets.astype(np.int64), weights))
    return phases


def _tap_sum(x: jnp.ndarray, starts, length: int, weights, axis: int) -> jnp.ndarray:
    """``sum_k x[starts[k] : starts[k] + length] * weights[k]`` along ``axis`` (static slices, summed
    in tap order; the reverse pass pads instead of scattering)."""
    out = None
    for start, weight in zip(starts, weights):
        term = jax.lax.slice_in_dim(x, int(start), int(start) + length, axis=axis) * jnp.asarray(weight, x.dtype)
        out = term if out is None else out + term
    return out


def _apply_phases(x: jnp.ndarray, phases: list[Phase], taps: Taps, axis: int) -> jnp.ndarray:
    """`apply_taps` phase by phase: shifted slices for the periodic rows, one-sample slices for the
    others, the phases interleaved along ``axis`` (stack then reshape)."""
    index, weight = taps
    n_in, s = x.shape[axis], len(phases)
    outs = []
    for r, (lo, hi, offsets, weights) in enumerate(phases):
        rows = [_tap_sum(x, index[r + s * i], 1, weight[r + s * i], axis) for i in range(lo)]
        rows.append(_tap_sum(x, lo + offsets, hi - lo, weights, axis))
        rows += [_tap_sum(x, index[r + s * i], 1, weight[r + s * i], axis) for i in range(hi, n_in)]
        outs.append(rows[0] if len(rows) == 1 else jnp.concatenate(rows, axis=axis))
    stacked = jnp.stack(outs, axis=axis + 1)
    return stacked.reshape(x.shape[:axis] + (n_in * s,) + x.shape[axis + 1:])


def resize_bilinear_antialias(image: jnp.ndarray, out_hw: tuple[int, int]) -> jnp.ndarray:
    """Antialiased bilinear resize of an image, matching torch (float path of SAM).

    Equals ``F.interpolate(x, out_hw, mode="bilinear", align_corners=False,
    antialias=True)`` on the CHW float tensor to float32 rounding (width is
    resampled first, then height, as in torch's separable kernel).

    Args:
      image: f32[H, W, C] (any value range, e.g. 0..255).
      out_hw: static (h', w').

    Returns:
      f32[h', w', C].
    """
    if image.ndim != 3:
        raise ValueError(f"image must have shape [H, W, C]; got {image.shape}")
    h_in, w_in = image.shape[0], image.shape[1]
    x = apply_taps(image, antialias_taps(w_in, int(out_hw[1])), axis=1)
    return apply_taps(x, antialias_taps(h_in, int(out_hw[0])), axis=0)


def resize_bilinear_antialias_host(image: np.ndarray, out_hw: tuple[int, int]) -> np.ndarray:
    """`resize_bilinear_antialias` in numpy on the host (no compilation per image size).

    Args:
      image: [H, W, C] numpy array (any real dtype; computed in float32).
      out_hw: (h', w').

    Returns:
      float32[h', w', C], equal to torch's antialiased bilinear resize to
      float32 rounding.
    """
    x = np.asarray(image, np.float32)
    if x.ndim != 3:
        raise ValueError(f"image must have shape [H, W, C]; got {x.shape}")
    for axis, size in ((1, int(out_hw[1])), (0, int(out_hw[0]))):
        index, weight = antialias_taps(x.shape[axis], size)
        shape = [1] * 3
        shape[axis] = size
        out = np.zeros(x.shape[:axis] + (size,) + x.shape[axis + 1:], np.float32)
        for k in range(index.shape[1]):
            out += np.take(x, index[:, k], axis=axis) * weight[:, k].reshape(shape)
        x = out
    return x


def resize_bilinear(x: jnp.ndarray, out_hw: tuple[int, int]) -> jnp.ndarray:
    """Bilinear resize without antialias of the last two axes (static sizes).

    Matches torch ``interpolate(mode="bilinear", align_corners=False)`` (also
    for downsampling, where ``jax.image.resize`` would antialias by default).

    Args:
      x: f32[..., h, w].
      out_hw: static (H, W).

    Returns:
      f32[..., H, W].
    """
    x = apply_taps(x, linear_taps(x.shape[-1], int(out_hw[1])), axis=-1)
    return apply_taps(x, linear_taps(x.shape[-2], int(out_hw[0])), axis=-2)


def traced_linear_taps(out_len: int, in_len: jnp.ndarray, out_valid: jnp.ndarray) -> Taps:
    """Bilinear tap table with traced sizes: ``in_len`` samples -> ``out_valid`` samples.

    Half-pixel centres as torch ``align_corners=False``: for output ``o``,
    ``s = (in_len / out_valid) * (o + 0.5) - 0.5`` clamped at 0, taps
    ``floor(s)`` and ``min(floor(s) + 1, in_len - 1)`` (edge clamping at the
    crop boundary ``in_len``). Outputs ``o >= out_valid`` get valid but
    meaningless taps; mask them afterwards. Computed in float32 without
    torch's fused multiply-add, so a source position may differ from torch's
    by one float32 ulp (a relative logit difference below ~1e-6).

    Args:
      out_len: static number of output samples (the frame length).
      in_len: i32[] number of valid input samples (>= 1).
      out_valid: i32[] number of valid output samples (>= 1).

    Returns:
      (index i32[out_len, 2], weight f32[out_len, 2]).
    """
    in_len = jnp.maximum(jnp.asarray(in_len, jnp.int32), 1)
    out_valid = jnp.maximum(jnp.asarray(out_valid, jnp.int32), 1)
    scale = in_len.astype(jnp.float32) / out_valid.astype(jnp.float32)
    src = scale * (jnp.arange(out_len, dtype=jnp.float32) + 0.5) - 0.5
    src = jnp.maximum(src, 0.0)
    i0 = jnp.minimum(jnp.floor(src).astype(jnp.int32), in_len - 1)
    lam = jnp.clip(src - i0.astype(jnp.float32), 0.0, 1.0)
    i1 = jnp.where(i0 < in_len - 1, i0 + 1, i0)
    return jnp.stack([i0, i1], axis=1), jnp.stack([1.0 - lam, lam], axis=1)


def _compose_taps(outer: Taps, inner: Taps) -> Taps:
    """Taps of ``outer`` applied to the result of ``inner`` (both along one axis).

    ``outer`` indexes the ``inner`` output grid; the composition indexes the
    ``inner`` input directly: [out, K_outer * K_inner].
    """
    o_idx, o_w = outer
    i_idx, i_w = jnp.asarray(inner[0]), jnp.asarray(inner[1])
    idx = jnp.take(i_idx, o_idx, axis=0, mode="clip")  # [out, Ko, Ki]
    w = jnp.take(i_w, o_idx, axis=0, mode="clip") * o_w[..., None]
    n = idx.shape[0]
    return idx.reshape(n, -1), w.reshape(n, -1)


def upsample_sam_logits(
    low_res: jnp.ndarray,
    resized_hw: jnp.ndarray,
    original_hw: jnp.ndarray,
    frame_hw: tuple[int, int],
    *,
    model_size: int = 1024,
    fill_value: float = -1e4,
) -> jnp.ndarray:
    """SAM's ``postprocess_masks`` with traced sizes into a static frame.

    Reproduces: bilinear (no antialias, half-pixel) ``low_res`` -> model frame
    ``model_size x model_size``, crop ``[:h', :w']``, bilinear (no antialias) to
    ``(H, W)``. The two resamplings are composed per axis into one tap table
    (4 taps per axis), so the model-frame map is never materialised.

    Args:
      low_res: f32[..., h, w] low-resolution logits (SAM: 256 x 256).
      resized_hw: i32[2] (h', w'), the image size inside the model frame.
      original_hw: i32[2] (H, W), the original image size (H <= frame_hw[0],
        W <= frame_hw[1]).
      frame_hw: static (Hf, Wf) output frame.
      model_size: static side of the square model input (SAM: 1024).
      fill_value: value of frame pixels outside the original image.

    Returns:
      f32[..., Hf, Wf]: upsampled logits; pixels with row >= H or col >= W
      hold ``fill_value``.
    """
    h_low, w_low = low_res.shape[-2], low_res.shape[-1]
    resized_hw = jnp.asarray(resized_hw, jnp.int32)
    original_hw = jnp.asarray(original_hw, jnp.int32)
    rows = _compose_taps(traced_linear_taps(frame_hw[0], resized_hw[0], original_hw[0]),
                         linear_taps(h_low, model_size))
    cols = _compose_taps(traced_linear_taps(frame_hw[1], resized_hw[1], original_hw[1]),
                         linear_taps(w_low, model_size))
    x = apply_taps(low_res, cols, axis=-1)
    x = apply_taps(x, rows, axis=-2)
    inside = ((jnp.arange(frame_hw[0]) < original_hw[0])[:, None]
              & (jnp.arange(frame_hw[1]) < original_hw[1])[None, :])
    return jnp.where(inside, x, jnp.asarray(fill_value, x.dtype))


def pad_to_square(x: jnp.ndarray, size: int) -> jnp.ndarray:
    """Zero-pads f32[h, w, C] at the bottom/right to f32[size, size, C] (SAM's ``preprocess``)."""
    h, w = x.shape[0], x.shape[1]
    if h > size or w > size:
        raise ValueError(f"image of size {h}x{w} does not fit a {size}x{size} frame")
    return jnp.pad(x, ((0, size - h), (0, size - w), (0, 0)))


def scale_factors(original_hw: tuple[int, int], resized_hw: tuple[int, int]) -> np.ndarray:
    """f32[2] (sx, sy) = (w'/W, h'/H): per-axis factors original frame -> model frame."""
    (h, w), (hr, wr) = original_hw, resized_hw
    if min(h, w, hr, wr) <= 0:
        raise ValueError(f"sizes must be positive; got original {original_hw}, resized {resized_hw}")
    return np.array([wr / w, hr / h], np.float32)


__all__ = [
    "longest_side_shape", "antialias_taps", "linear_taps_at", "linear_taps", "apply_taps",
    "resize_bilinear_antialias", "resize_bilinear_antialias_host", "resize_bilinear",
    "traced_linear_taps",
    "upsample_sam_logits", "pad_to_square", "scale_factors",
]
