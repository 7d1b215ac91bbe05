"""RobustSAM's extra decoder modules (``robust_segment_anything/modeling/components.py``).

All maps are one image, channels-last f32[H, W, Ch]; the reference's layout
is [B, Ch, H, W] with B = 1. Names follow the reference's modules:

  * `SelectiveConv` (``SKDown`` / ``SelectiveConv`` / ``Selector``): two bias-free
    3 x 3 convolutions, one of ``LeakyReLU(BatchNorm(x))`` (eval mode: running
    statistics), one of ``LeakyReLU(InstanceNorm(x))`` (per channel over the
    map, eps 1e-5, no affine), mixed per channel and per 4 x 4 cell of the map
    by a softmax over the two branches;
  * `ChannelAttention` (``CABlock``): global mean, Linear -> ReLU -> Linear ->
    sigmoid, channel gates;
  * `FourierMagnitude` (``FGMBlock``): a 1 x 1 convolution of the 2-D FFT's
    magnitude at the FFT's own phase, back by the inverse FFT (real part);
  * `DegradationBlock` (``DNCBlock_combined``, ``FGMBlock`` and the 3 x 3
    ``conv_layer`` after it, as the feature blocks chain them for ``clear=False``);
  * `TokenBlock` (AOTG's ``TokenBlock``): two instance norms of a token over its
    C features, then an MLP on its first C / K features (see `TokenBlock`).

LeakyReLU slope 0.01 (torch's default); BatchNorm eps 1e-5.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxseg_robust.models.robustsam.config import SELECTOR_CELLS, SQUEEZE_RATIO
from jaxseg_robust.models.sam.layers import Linear, torch_linear_init
from jaxseg_robust.models.sam.mask_decoder_hq import Conv3x3
from jaxseg_robust.models.sam.tiny_vit import FrozenBatchNorm

NORM_EPS = 1e-5  # torch BatchNorm2d / InstanceNorm defaults
LEAKY_SLOPE = 0.01  # torch LeakyReLU default


def instance_norm(x: jnp.ndarray, axes: tuple[int, ...], eps: float = NORM_EPS) -> jnp.ndarray:
    """torch InstanceNorm (no affine, no running statistics): normalise over ``axes`` (biased variance)."""
    mean = jnp.mean(x, axis=axes, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=axes, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + eps)


def leaky_relu(x: jnp.ndarray) -> jnp.ndarray:
    """torch ``LeakyReLU()`` (slope 0.01)."""
    return jax.nn.leaky_relu(x, LEAKY_SLOPE)


def cell_means(x: jnp.ndarray, cells: int = SELECTOR_CELLS) -> jnp.ndarray:
    """f32[H, W, Ch] -> f32[cells, cells, Ch]: means of equal blocks (``AdaptiveAvgPool2d``, H, W multiples)."""
    h, w, ch = x.shape
    return x.reshape(cells, h // cells, cells, w // cells, ch).mean(axis=(1, 3))


def repeat_cells(x: jnp.ndarray, hw: tuple[int, int]) -> jnp.ndarray:
    """f32[cells, cells, Ch] -> f32[H, W, Ch]: nearest upsampling by whole blocks."""
    cells = x.shape[0]
    return jnp.repeat(jnp.repeat(x, hw[0] // cells, axis=0), hw[1] // cells, axis=1)


class BiasFreeConv3x3(nn.Module):
    """3 x 3 convolution, stride 1, padding 1, no bias; param ``kernel`` f32[3, 3, Cin, F]."""

    in_features: int
    features: int

    @nn.compact
    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        """f32[H, W, Cin] -> f32[H, W, F] (cross-correlation, as torch)."""
        kernel = self.param("kernel", torch_linear_init(9 * self.in_features),
                            (3, 3, self.in_features, self.features))
        y = jax.lax.conv_general_dilated(x[None], kernel, (1, 1), ((1, 1), (1, 1)),
                                         dimension_numbers=("NHWC", "HWIO", "NHWC"))
        return y[0]


class Selector(nn.Module):
    """The reference's ``Selector``: branch weights per channel and per 4 x 4 cell.

    Params ``fc`` (16 Ch -> Ch, no bias), ``att_conv1`` / ``att_conv2`` (Ch -> 16 Ch).
    """

    channels: int

    def setup(self):
        flat = self.channels * SELECTOR_CELLS ** 2
        self.fc = Linear(flat, flat // SQUEEZE_RATIO, use_bias=False)
        self.att_conv1 = Linear(flat // SQUEEZE_RATIO, flat)
        self.att_conv2 = Linear(flat // SQUEEZE_RATIO, flat)

    def __call__(self, x: jnp.ndarray) -> tuple[jnp.ndarray, jnp.ndarray]:
        """f32[H, W, Ch] -> the two branch weights, f32[H, W, Ch] each (they sum to 1)."""
        cells = SELECTOR_CELLS
        pooled = cell_means(x).transpose(2, 0, 1).reshape(-1)  # torch order (Ch, 4, 4)
        hidden = jax.nn.relu(self.fc(pooled))

        def weights(layer):
            return layer(hidden).reshape(self.channels, cells, cells).transpose(1, 2, 0)

        both = jax.nn.softmax(jnp.stack([weights(self.att_conv1), weights(self.att_conv2)]), axis=0)
        hw = (x.shape[0], x.shape[1])
        return repeat_cells(both[0], hw), repeat_cells(both[1], hw)


class SelectiveConv(nn.Module):
    """The reference's ``SKDown`` (one ``SelectiveConv``, ``first=False``): f32[H, W, Ch] -> f32[H, W, Ch].

    Params ``conv1``, ``conv2`` (3 x 3, no bias), ``bn`` (`FrozenBatchNorm`), ``selector``.
    """

    channels: int

    def setup(self):
        self.conv1 = BiasFreeConv3x3(self.channels, self.channels)
        self.conv2 = BiasFreeConv3x3(self.channels, self.channels)
        self.bn = FrozenBatchNorm(self.channels, epsilon=NORM_EPS)
        self.selector = Selector(self.channels)

    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        out1 = self.conv1(leaky_relu(self.bn(x)))
        out2 = self.conv2(leaky_relu(instance_norm(x, (0, 1))))
        att1, att2 = self.selector(out1 + out2)
        return out1 * att1 + out2 * att2


class ChannelAttention(nn.Module):
    """The reference's ``CABlock``: f32[H, W, Ch] -> f32[H, W, Ch]; params ``lin1``, ``lin2``."""

    channels: int

    def setup(self):
        self.lin1 = Linear(self.channels, self.channels // SQUEEZE_RATIO)
        self.lin2 = Linear(self.channels // SQUEEZE_RATIO, self.channels)

    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        gates = jax.nn.sigmoid(self.lin2(jax.nn.relu(self.lin1(x.mean(axis=(0, 1))))))
        return x * gates


class FourierMagnitude(nn.Module):
    """The reference's ``FGMBlock``: f32[H, W, Ch] -> f32[H, W, Ch]; param ``conv`` (1 x 1, a `Linear`).

    ``real(ifft2(conv(|F|) * exp(i angle(F))))`` with ``F = fft2(x)`` over H, W
    (complex64; the phase as ``cos`` / ``sin`` of ``angle``, as the reference).
    """

    channels: int

    def setup(self):
        self.conv = Linear(self.channels, self.channels)

    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        spectrum = jnp.fft.fft2(x.astype(jnp.float32), axes=(0, 1))
        magnitude = self.conv(jnp.abs(spectrum))
        phase = jnp.angle(spectrum)
        return jnp.real(jnp.fft.ifft2(jax.lax.complex(magnitude * jnp.cos(phase),
                                                      magnitude * jnp.sin(phase)), axes=(0, 1)))


class DegradationBlock(nn.Module):
    """What a RobustSAM feature block does before its up/down-sampling when ``clear=False``.

    ``conv_layer(FGM(CA(concat(x, SKDown(x)))))``: f32[H, W, Ch] -> f32[H, W, Ch].
    Params ``selective_conv``, ``channel_attention`` (the reference's
    ``dnc_block_combined``), ``fourier`` (``fgm_block``), ``conv_layer`` (3 x 3,
    2 Ch -> Ch, with bias).
    """

    channels: int

    def setup(self):
        c = self.channels
        self.selective_conv = SelectiveConv(c)
        self.channel_attention = ChannelAttention(2 * c)
        self.fourier = FourierMagnitude(2 * c)
        self.conv_layer = Conv3x3(2 * c, c)

    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        x = x.astype(jnp.float32)
        both = self.channel_attention(jnp.concatenate([x, self.selective_conv(x)], axis=-1))
        return self.conv_layer(self.fourier(both))


class TokenBlock(nn.Module):
    """AOTG's ``TokenBlock`` for one robust output token: f32[C] -> f32[C].

    The reference normalises the token twice over its C features (two
    ``InstanceNorm1d`` of a [1, C] input), views it as K rows of C / K and runs
    ``Linear(C/K, C/K) -> ReLU -> Linear(C/K, C)`` on every row. For one prompt
    set the decoder's masks read row 0 only (the other rows become output
    channels no selection returns; docs/models/robustsam.md), so this computes
    row 0. Params ``lin1``, ``lin2``.
    """

    channels: int
    rows: int

    def setup(self):
        width = self.channels // self.rows
        self.lin1 = Linear(width, width)
        self.lin2 = Linear(width, self.channels)

    def __call__(self, token: jnp.ndarray) -> jnp.ndarray:
        normed = instance_norm(instance_norm(token, (-1,)), (-1,))
        first_row = normed[..., : self.channels // self.rows]
        return self.lin2(jax.nn.relu(self.lin1(first_row)))


__all__ = ["BiasFreeConv3x3", "ChannelAttention", "DegradationBlock", "FourierMagnitude",
           "SelectiveConv", "Selector", "TokenBlock", "cell_means", "instance_norm", "leaky_relu",
           "repeat_cells"]
