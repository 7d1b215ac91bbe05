"""`jaxseg_robust.ops.conv.conv_general_dilated`: same values and gradients as lax, canonical gradient conv in loops."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from compiled_hlo import loop_body_text, outside_loop_text
from jax import lax

from jaxseg_robust.models.dense.layers import conv2d
from jaxseg_robust.ops.conv import conv_general_dilated

CONFIGS = [  # (kernel, stride, dilation, padding)
    (3, 1, 1, ((1, 1), (1, 1))),
    (3, 2, 1, ((1, 1), (1, 1))),
    (3, 1, 2, ((2, 2), (2, 2))),
    (1, 2, 1, ((0, 0), (0, 0))),
    (3, 1, 1, "SAME"),
    (2, 2, 1, "VALID"),
]


@pytest.mark.parametrize("kernel, stride, dilation, padding", CONFIGS)
def test_values_and_gradients_match_lax(kernel, stride, dilation, padding):
    x = jax.random.normal(jax.random.key(0), (2, 9, 11, 5))
    w = jax.random.normal(jax.random.key(1), (kernel, kernel, 5, 7))
    numbers = ("NHWC", "HWIO", "NHWC")

    def loss(conv, x, w):
        y = conv(x, w, (stride, stride), padding, rhs_dilation=(dilation, dilation), dimension_numbers=numbers,
                 precision=lax.Precision.HIGHEST)
        return jnp.sum(jnp.sin(y)), y

    (value, y), grads = jax.value_and_grad(lambda x, w: loss(conv_general_dilated, x, w), (0, 1), has_aux=True)(x, w)
    (value_ref, y_ref), grads_ref = jax.value_and_grad(lambda x, w: loss(lax.conv_general_dilated, x, w), (0, 1),
                                                       has_aux=True)(x, w)
    if kernel == 1 or (kernel == stride and dilation == 1):  # a matrix product: another summation order
        np.testing.assert_allclose(np.asarray(y), np.asarray(y_ref), rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(float(value), float(value_ref), rtol=1e-6)
    else:
        np.testing.assert_array_equal(np.asarray(y), np.asarray(y_ref))  # the forward pass is the same op
        assert float(value) == float(value_ref)
    for got, want in zip(grads, grads_ref):  # another conv layout: summation order may differ
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)


def test_input_gradient_conv_is_canonical_inside_a_loop():
    """Every conv of an attack-style fori_loop reads an HWIO kernel as ``01io`` (XLA:CPU's fast form)."""
    layer = conv2d(6, 3, stride=2, dilation=1, use_bias=False)
    dilated = conv2d(4, 3, dilation=2, use_bias=False)
    x = jnp.zeros((1, 12, 10, 3))
    params = (layer.init(jax.random.key(0), x), dilated.init(jax.random.key(1), jnp.zeros((1, 6, 5, 6))))

    def model(p, v):
        return dilated.apply(p[1], jnp.tanh(layer.apply(p[0], v)))

    def attack(p, v):
        step = lambda _, d: d + 1e-3 * jax.grad(lambda u: jnp.sum(model(p, v + u) ** 2))(d)
        return lax.fori_loop(0, 3, step, jnp.zeros_like(v))

    text = jax.jit(attack).lower(params, x).compile().as_text()
    labels = re.findall(r"convolution\(.*?dim_labels=(\S+?),", text)
    assert labels, "no convolution in the compiled program"
    assert all("_01io->" in label for label in labels), labels
    # The gradient's re-laid-out kernels (reversed, features swapped) are built once, before the loop.
    reverse = r"= \S+ reverse\("
    assert not re.search(reverse, loop_body_text(text))
    assert len(re.findall(reverse, outside_loop_text(text))) == 2  # one per convolution


@pytest.mark.parametrize("stride, padding", [((1, 1), "VALID"), ((2, 2), "SAME"), ((3, 2), ((0, 0), (0, 0)))])
def test_pointwise_conv_is_a_matrix_product(stride, padding):
    """1 x 1 unpadded NHWC convs compile to a dot (no convolution), strided ones on the strided pixels."""
    x = jax.random.normal(jax.random.key(2), (2, 9, 7, 5))
    w = jax.random.normal(jax.random.key(3), (1, 1, 5, 3))
    numbers = ("NHWC", "HWIO", "NHWC")
    got = conv_general_dilated(x, w, stride, padding, dimension_numbers=numbers)
    want = lax.conv_general_dilated(x, w, stride, padding, dimension_numbers=numbers,
                                    precision=lax.Precision.HIGHEST)
    assert got.shape == want.shape
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)
    grad = jax.jit(jax.grad(lambda v, k: jnp.sum(jnp.sin(conv_general_dilated(v, k, stride, padding,
                                                                               dimension_numbers=numbers))),
                            (0, 1)))
    text = grad.lower(x, w).compile().as_text()
    assert "convolution(" not in text
    assert re.search(r"= \S+ (dot\(|fusion\(.*calls=%\S*[xy]nn)", text) or re.search(r"%[xy]nn_fusion", text), \
        "no matrix product compiled"


def test_padded_or_grouped_pointwise_keeps_the_convolution():
    """A padded 1 x 1 conv changes the output size and a grouped one mixes no groups: both stay lax convs."""
    x = jax.random.normal(jax.random.key(4), (1, 6, 6, 4))
    numbers = ("NHWC", "HWIO", "NHWC")
    padded = conv_general_dilated(x, jnp.ones((1, 1, 4, 2)), (1, 1), ((1, 1), (1, 1)), dimension_numbers=numbers)
    assert padded.shape == (1, 8, 8, 2)
    np.testing.assert_array_equal(np.asarray(padded[:, 0]), 0.0)
    grouped = conv_general_dilated(x, jnp.ones((1, 1, 2, 4)), (1, 1), "VALID", dimension_numbers=numbers,
                                   feature_group_count=2)
    want = lax.conv_general_dilated(x, jnp.ones((1, 1, 2, 4)), (1, 1), "VALID", dimension_numbers=numbers,
                                    feature_group_count=2)
    np.testing.assert_array_equal(np.asarray(grouped), np.asarray(want))


@pytest.mark.parametrize("size, kernel, padding", [((8, 12), (2, 2), "VALID"), ((9, 13), (2, 3), ((0, 0), (0, 0))),
                                                   ((16, 16), (4, 4), "SAME"), ((7, 10), (1, 2), "VALID")])
def test_patch_conv_is_a_matrix_product(size, kernel, padding):
    """Windows that tile the image (kernel = strides, unpadded): the lax values and gradients, and no convolution.

    Sizes that are not a multiple of the window drop the last partial row / column, as the convolution does.
    """
    x = jax.random.normal(jax.random.key(5), (2, *size, 3))
    w = jax.random.normal(jax.random.key(6), (*kernel, 3, 4))
    numbers = ("NHWC", "HWIO", "NHWC")

    def loss(conv, v, k):
        return jnp.sum(jnp.sin(conv(v, k, kernel, padding, dimension_numbers=numbers,
                                    precision=lax.Precision.HIGHEST)))

    got = conv_general_dilated(x, w, kernel, padding, dimension_numbers=numbers, precision=lax.Precision.HIGHEST)
    want = lax.conv_general_dilated(x, w, kernel, padding, dimension_numbers=numbers,
                                    precision=lax.Precision.HIGHEST)
    assert got.shape == want.shape == (2, size[0] // kernel[0], size[1] // kernel[1], 4)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)
    grads = jax.grad(lambda v, k: loss(conv_general_dilated, v, k), (0, 1))(x, w)
    grads_ref = jax.grad(lambda v, k: loss(lax.conv_general_dilated, v, k), (0, 1))(x, w)
    for got_grad, want_grad in zip(grads, grads_ref):
        np.testing.assert_allclose(np.asarray(got_grad), np.asarray(want_grad), rtol=1e-5, atol=1e-5)
    text = jax.jit(jax.grad(lambda v, k: loss(conv_general_dilated, v, k), (0, 1))).lower(x, w).compile().as_text()
    assert "convolution(" not in text


def test_overlapping_or_padded_windows_keep_the_convolution():
    """A kernel larger than its stride, a SAME pad that pads, or a dilated kernel: lax's convolution."""
    x = jax.random.normal(jax.random.key(7), (1, 9, 9, 2))
    numbers = ("NHWC", "HWIO", "NHWC")
    for kernel, stride, padding, dilation in [((3, 3), (2, 2), "VALID", (1, 1)), ((2, 2), (2, 2), "SAME", (1, 1)),
                                              ((2, 2), (2, 2), "VALID", (2, 2))]:
        w = jnp.ones((*kernel, 2, 3))
        fn = jax.jit(lambda v, w=w, s=stride, p=padding, d=dilation: conv_general_dilated(
            v, w, s, p, rhs_dilation=d, dimension_numbers=numbers))
        assert "convolution(" in fn.lower(x).compile().as_text(), (kernel, stride, padding, dilation)
        want = lax.conv_general_dilated(x, w, stride, padding, rhs_dilation=dilation, dimension_numbers=numbers)
        np.testing.assert_allclose(np.asarray(fn(x)), np.asarray(want), rtol=1e-6, atol=1e-5)
