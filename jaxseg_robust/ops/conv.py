"""A convolution whose input gradient keeps XLA:CPU's fast convolution inside loops.

`conv_general_dilated` equals ``lax.conv_general_dilated`` in value and in
both gradients; only the input gradient is written differently. JAX's
transpose rule computes the input gradient as a convolution with the kernel's
input and output feature axes swapped in the *dimension numbers* (``01oi``
for an HWIO kernel). XLA:CPU canonicalises such a convolution to its Eigen
kernel by inserting a transpose, but only in a program's entry computation:
inside a ``while`` body (every ``fori_loop`` attack of the perturbation
battery, docs/protocols/perturbation.md) the ``01oi`` convolution falls back
to a generic loop, costlier per iteration than the whole forward+backward
pass of a ResNet-50 (docs/benchmarking.md, "Measurements behind design
choices"). Here the kernel is transposed explicitly before the transpose rule
runs, so the gradient convolution is already in the canonical ``01io`` form
wherever it is compiled. The kernel that gradient reads (spatially reversed,
features swapped) is moreover built as a `hoistable` value, so XLA computes it
once before a loop instead of on every iteration (`ops.loop_invariant`).

A pointwise (1 x 1, unpadded) convolution on NHWC / HWIO is computed as a
strided slice and a matrix product, which XLA:CPU's dot runs faster than its
convolution kernel, and both gradients are products too. So is a convolution
whose windows tile the image (kernel size equal to the strides, unpadded: a
ViT patch embedding, a 2 x 2 stride-2 downsampling): the windows flattened,
times the kernel as a matrix, whose input gradient needs no reversed kernel
either. Figures for both: docs/benchmarking.md, "Where XLA:CPU loses time".
Grouped convolutions and input (lhs) dilation use
``lax.conv_general_dilated`` unchanged. Used by the dense models' convolutions
(`models/dense/layers.conv2d`) and the click-map models'
(`models/clickmap/layers.Conv2d`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from jaxseg_robust.ops.loop_invariant import hoistable


def _swap_kernel_features(kernel, numbers: lax.ConvDimensionNumbers):
    """(kernel with its in/out feature axes swapped, the dimension numbers that read it the same way)."""
    out_axis, in_axis = numbers.rhs_spec[0], numbers.rhs_spec[1]
    swapped = jnp.swapaxes(kernel, out_axis, in_axis)
    rhs_spec = (in_axis, out_axis, *numbers.rhs_spec[2:])
    return swapped, lax.ConvDimensionNumbers(numbers.lhs_spec, rhs_spec, numbers.out_spec)


_NHWC = lax.ConvDimensionNumbers((0, 3, 1, 2), (3, 2, 0, 1), (0, 3, 1, 2))


def _is_plain_nhwc(lhs, numbers, feature_group_count, batch_group_count, *dilations) -> bool:
    """True for a 4-D NHWC / HWIO / NHWC convolution, ungrouped, with every given dilation 1 (or None)."""
    if numbers != _NHWC or lhs.ndim != 4 or feature_group_count != 1 or batch_group_count != 1:
        return False
    return all(dilation is None or all(d == 1 for d in dilation) for dilation in dilations)


def _zero_pairs(padding) -> bool:
    """True when explicit ``(low, high)`` padding pairs are all zero."""
    return all(tuple(pair) == (0, 0) for pair in padding)


def _is_pointwise(lhs, rhs, padding, lhs_dilation, numbers, feature_group_count, batch_group_count) -> bool:
    """True when the convolution is a 1 x 1 kernel on NHWC / HWIO, unpadded, ungrouped, input undilated."""
    if not _is_plain_nhwc(lhs, numbers, feature_group_count, batch_group_count, lhs_dilation):
        return False
    if rhs.shape[:2] != (1, 1):
        return False
    if isinstance(padding, str):
        return padding in ("VALID", "SAME")  # a 1 x 1 window pads nothing in either mode
    return _zero_pairs(padding)


def pointwise_conv(x, kernel, strides=(1, 1), *, precision=None, preferred_element_type=None):
    """1 x 1 convolution f32[N, H, W, I], f32[1, 1, I, O] -> f32[N, ceil(H/sh), ceil(W/sw), O].

    Equals ``lax.conv_general_dilated`` with NHWC / HWIO / NHWC numbers and no
    padding: the strided pixels, times the kernel's [I, O] matrix.
    """
    sh, sw = strides
    if (sh, sw) != (1, 1):
        x = x[:, ::sh, ::sw, :]
    return lax.dot_general(x, kernel[0, 0], (((3,), (0,)), ((), ())), precision=precision,
                           preferred_element_type=preferred_element_type)


def _is_patchwise(lhs, rhs, window_strides, padding, lhs_dilation, rhs_dilation, numbers, feature_group_count,
                  batch_group_count) -> bool:
    """True for a k_h x k_w kernel with strides (k_h, k_w) on NHWC / HWIO, larger than 1 x 1: the windows
    tile the image without overlap (unpadded, ungrouped, undilated)."""
    if not _is_plain_nhwc(lhs, numbers, feature_group_count, batch_group_count, lhs_dilation, rhs_dilation):
        return False
    window = tuple(rhs.shape[:2])
    if window != tuple(window_strides) or window == (1, 1):
        return False
    if padding == "SAME":  # pads nothing only where the size is a multiple of the window
        return all(size % k == 0 for size, k in zip(lhs.shape[1:3], window))
    if isinstance(padding, str):
        return padding == "VALID"
    return _zero_pairs(padding)


def patch_conv(x, kernel, *, precision=None, preferred_element_type=None):
    """Non-overlapping k_h x k_w convolution, strides (k_h, k_w): f32[N, H, W, I], f32[k_h, k_w, I, O] ->
    f32[N, H // k_h, W // k_w, O].

    Equals ``lax.conv_general_dilated`` with NHWC / HWIO / NHWC numbers, no
    padding and strides equal to the kernel size (a ViT patch embedding, a
    2 x 2 stride-2 downsampling): each output pixel's window, flattened in
    (row, column, channel) order, times the kernel as a [k_h k_w I, O]
    matrix. Rows and columns past the last whole window are dropped, as the
    convolution drops them.
    """
    kh, kw, cin, cout = kernel.shape
    n, h, w, c = x.shape
    oh, ow = h // kh, w // kw
    windows = x[:, :oh * kh, :ow * kw, :].reshape(n, oh, kh, ow, kw, c).transpose(0, 1, 3, 2, 4, 5)
    windows = windows.reshape(n, oh, ow, kh * kw * c)
    return lax.dot_general(windows, kernel.reshape(kh * kw * cin, cout), (((3,), (0,)), ((), ())),
                           precision=precision, preferred_element_type=preferred_element_type)


def conv_general_dilated(lhs, rhs, window_strides, padding, lhs_dilation=None, rhs_dilation=None,
                         dimension_numbers=None, feature_group_count: int = 1, batch_group_count: int = 1,
                         precision=None, preferred_element_type=None):
    """Drop-in ``lax.conv_general_dilated`` (same arguments and result) with a loop-friendly input gradient.

    Usable as ``flax.linen.Conv(..., conv_general_dilated=conv_general_dilated)``.
    """
    plain = lambda x, k, numbers: lax.conv_general_dilated(  # noqa: E731
        x, k, window_strides, padding, lhs_dilation=lhs_dilation, rhs_dilation=rhs_dilation,
        dimension_numbers=numbers, feature_group_count=feature_group_count,
        batch_group_count=batch_group_count, precision=precision, preferred_element_type=preferred_element_type)
    numbers = lax.conv_dimension_numbers(lhs.shape, rhs.shape, dimension_numbers)
    if _is_pointwise(lhs, rhs, padding, lhs_dilation, numbers, feature_group_count, batch_group_count):
        return pointwise_conv(lhs, rhs, window_strides, precision=precision,
                              preferred_element_type=preferred_element_type)
    if _is_patchwise(lhs, rhs, window_strides, padding, lhs_dilation, rhs_dilation, numbers, feature_group_count,
                     batch_group_count):
        return patch_conv(lhs, rhs, precision=precision, preferred_element_type=preferred_element_type)
    dilated_input = lhs_dilation is not None and any(d != 1 for d in lhs_dilation)
    if feature_group_count != 1 or batch_group_count != 1 or dilated_input:
        return plain(lhs, rhs, numbers)
    if isinstance(padding, str):  # "SAME" / "VALID" as explicit pairs (the same pads lax derives)
        dilation = rhs_dilation or (1,) * len(window_strides)
        window = [(rhs.shape[axis] - 1) * d + 1 for axis, d in zip(numbers.rhs_spec[2:], dilation)]
        padding = lax.padtype_to_pads([lhs.shape[axis] for axis in numbers.lhs_spec[2:]], window, window_strides,
                                      padding)

    @jax.custom_vjp
    def conv(x, kernel):
        return plain(x, kernel, numbers)

    def forward(x, kernel):
        return plain(x, kernel, numbers), (x, kernel)

    def backward(residuals, cotangent):
        x, kernel = residuals
        swapped, swapped_numbers = _swap_kernel_features(kernel, numbers)
        spatial = tuple(swapped_numbers.rhs_spec[2:])
        flipped = hoistable(lax.rev(swapped, spatial))  # computed once before an attack loop
        # The transpose rule reverses the kernel again; XLA folds rev(rev(k)) to k.
        grad_x = jax.linear_transpose(lambda v: plain(v, lax.rev(flipped, spatial), swapped_numbers),
                                      x)(cotangent)[0]
        grad_kernel = jax.linear_transpose(lambda k: plain(x, k, numbers), kernel)(cotangent)[0]
        return grad_x, grad_kernel

    conv.defvjp(forward, backward)
    return conv(lhs, rhs)
