"""HRNet backbone of RITM (isegm ``HighResolutionNet``), NHWC, torch parameter names.

Mirrors ``isegm/model/modeling/hrnet_ocr.py`` of the RITM code: stem (two 3x3
stride-2 convs; the click features are added after the first one), layer1 of
Bottleneck blocks, stages 2-4 of `HighResolutionModule`s joined by transition
layers, and the aggregation of the four branches. Every upsampling is bilinear
with ``align_corners=True`` (the module default there). Module names follow
the torch attribute paths (``layer1/0/conv1``, ``transition2/2/0/0``,
``stage3/1/fuse_layers/2/0/1/0``) so the port is one-to-one.
"""

from __future__ import annotations

from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxseg_robust.models.clickability.resize import upsample_align_corners
from jaxseg_robust.models.clickmap.layers import BatchNorm2d, Conv2d
from jaxseg_robust.models.ritm.config import RitmConfig
from jaxseg_robust.ops.fusion import fusion_boundary


def resize_to(x: jnp.ndarray, hw: tuple[int, int]) -> jnp.ndarray:
    """Bilinear ``align_corners=True`` resize of f32[..., h, w, C] to ``hw`` (identity if equal)."""
    if tuple(x.shape[-3:-1]) == tuple(hw):
        return x
    return upsample_align_corners(x, hw, axes=(-3, -2))


def block_output(module: nn.Module, x: jnp.ndarray) -> jnp.ndarray:
    """``x`` behind a fusion boundary anchored on the module's first parameter.

    Every residual block and fuse row ends with one, so XLA:CPU materialises
    each block output instead of recomputing the whole residual stream in
    every later fusion (`jaxseg_robust.ops.fusion`).
    """
    return fusion_boundary(x, jax.tree.leaves(module.variables["params"])[0])


class ConvBN(nn.Module):
    """``Sequential(Conv2d(bias=False), BatchNorm2d[, ReLU])`` as children "0" and "1"."""

    in_channels: int
    out_channels: int
    kernel_size: int = 3
    stride: int = 1
    relu: bool = True

    @nn.compact
    def __call__(self, x):
        pad = self.kernel_size // 2
        x = Conv2d(self.in_channels, self.out_channels, self.kernel_size, self.stride, pad,
                   bias=False, name="0")(x)
        x = BatchNorm2d(self.out_channels, name="1")(x)
        return jax.nn.relu(x) if self.relu else x


class BasicBlock(nn.Module):
    """``BasicBlockV1b`` (expansion 1), stride 1, no downsample (HRNet branches)."""

    planes: int

    @nn.compact
    def __call__(self, x):
        p = self.planes
        out = jax.nn.relu(BatchNorm2d(p, name="bn1")(Conv2d(p, p, 3, 1, 1, bias=False,
                                                            name="conv1")(x)))
        out = BatchNorm2d(p, name="bn2")(Conv2d(p, p, 3, 1, 1, bias=False, name="conv2")(out))
        return block_output(self, jax.nn.relu(out + x))


class Bottleneck(nn.Module):
    """``BottleneckV1b`` (expansion 4), stride 1, with a 1x1 conv + BN downsample when asked."""

    inplanes: int
    planes: int
    downsample: bool = False

    @nn.compact
    def __call__(self, x):
        p, q = self.planes, self.planes * 4
        out = jax.nn.relu(BatchNorm2d(p, name="bn1")(
            Conv2d(self.inplanes, p, 1, bias=False, name="conv1")(x)))
        out = jax.nn.relu(BatchNorm2d(p, name="bn2")(
            Conv2d(p, p, 3, 1, 1, bias=False, name="conv2")(out)))
        out = BatchNorm2d(q, name="bn3")(Conv2d(p, q, 1, bias=False, name="conv3")(out))
        residual = x
        if self.downsample:
            residual = ConvBN(self.inplanes, q, 1, relu=False, name="downsample")(x)
        return block_output(self, jax.nn.relu(out + residual))


class Branch(nn.Module):
    """One HRNet branch: ``num_blocks`` BasicBlocks named "0".."n-1"."""

    channels: int
    num_blocks: int

    @nn.compact
    def __call__(self, x):
        for i in range(self.num_blocks):
            x = BasicBlock(self.channels, name=str(i))(x)
        return x


class DownChain(nn.Module):
    """Fuse path j -> i for j < i: (i - j) stride-2 3x3 conv + BN; ReLU on all but the last."""

    in_channels: int
    out_channels: int
    steps: int

    @nn.compact
    def __call__(self, x):
        for k in range(self.steps):
            last = k == self.steps - 1
            out = self.out_channels if last else self.in_channels
            x = ConvBN(self.in_channels, out, 3, 2, relu=not last, name=str(k))(x)
        return x


class FuseRow(nn.Module):
    """Fuse layers into branch ``i`` (children "j": 1x1 conv + BN for j > i, `DownChain` for j < i)."""

    channels: Sequence[int]
    i: int

    @nn.compact
    def __call__(self, xs: list):
        i, ch = self.i, self.channels
        target_hw = xs[i].shape[-3:-1]
        y = None
        for j, x in enumerate(xs):
            if j == i:
                term = x
            elif j > i:
                term = resize_to(ConvBN(ch[j], ch[i], 1, relu=False, name=str(j))(x), target_hw)
            else:
                term = DownChain(ch[j], ch[i], i - j, name=str(j))(x)
            y = term if y is None else y + term
        return block_output(self, jax.nn.relu(y))


class FuseLayers(nn.Module):
    """``fuse_layers``: one `FuseRow` per output branch (SUM fuse)."""

    channels: Sequence[int]

    @nn.compact
    def __call__(self, xs: list) -> list:
        return [FuseRow(self.channels, i, name=str(i))(xs) for i in range(len(self.channels))]


class Branches(nn.Module):
    """``branches``: one `Branch` per resolution."""

    channels: Sequence[int]
    num_blocks: int

    @nn.compact
    def __call__(self, xs: list) -> list:
        return [Branch(c, self.num_blocks, name=str(i))(x)
                for i, (c, x) in enumerate(zip(self.channels, xs))]


class HighResolutionModule(nn.Module):
    """Branches then the SUM fuse of every branch into every branch (isegm
    ``HighResolutionModule``; a single branch is returned unfused)."""

    channels: Sequence[int]
    num_blocks: int

    @nn.compact
    def __call__(self, xs: list) -> list:
        xs = Branches(self.channels, self.num_blocks, name="branches")(xs)
        if len(self.channels) == 1:
            return xs
        return FuseLayers(self.channels, name="fuse_layers")(xs)


class Stage(nn.Module):
    """``stageN``: ``modules`` HighResolutionModules named "0".."m-1"."""

    channels: Sequence[int]
    modules: int
    num_blocks: int

    @nn.compact
    def __call__(self, xs: list) -> list:
        for m in range(self.modules):
            xs = HighResolutionModule(self.channels, self.num_blocks, name=str(m))(xs)
        return xs


class NewBranch(nn.Module):
    """Transition to a new (lower-resolution) branch: stride-2 `ConvBN`s named "0".."k-1"."""

    widths: Sequence[int]

    @nn.compact
    def __call__(self, x):
        for j in range(len(self.widths) - 1):
            x = ConvBN(self.widths[j], self.widths[j + 1], 3, 2, name=str(j))(x)
        return x


class Transition(nn.Module):
    """Transition from ``pre`` to ``cur`` branch widths (isegm ``_make_transition_layer``)."""

    pre: Sequence[int]
    cur: Sequence[int]

    @nn.compact
    def __call__(self, ys: list) -> list:
        out = []
        n_pre = len(self.pre)
        for i, c in enumerate(self.cur):
            if i < n_pre:
                x = ys[i]
                if c != self.pre[i]:
                    x = ConvBN(self.pre[i], c, 3, 1, name=str(i))(x)
            else:
                steps = i + 1 - n_pre
                widths = [self.pre[-1]] * steps + [c]
                x = NewBranch(tuple(widths), name=str(i))(ys[-1])
            out.append(x)
        return out


class Layer1(nn.Module):
    """``layer1``: Bottleneck blocks 64 -> 256 (the first one with a downsample)."""

    num_blocks: int

    @nn.compact
    def __call__(self, x):
        for i in range(self.num_blocks):
            x = Bottleneck(64 if i == 0 else 256, 64, downsample=i == 0, name=str(i))(x)
        return x


def hrnet_features(config: RitmConfig, x, additional_features=None):
    """HRNet features, built as children of the calling module (torch has no "hrnet" level:
    ``feature_extractor.conv1``, ``feature_extractor.stage2``, ...). Call it from a
    ``@nn.compact`` method.

    Args:
      config: the model's `RitmConfig`.
      x: f32[B, H, W, 3] normalised image.
      additional_features: f32[B, ceil(H/2), ceil(W/2), 64] transformed click maps, added
        after the first stem conv (None: nothing added).

    Returns:
      f32[B, ceil(H/4), ceil(W/4), 15 width]: the four branches upsampled
      (``align_corners=True``) to the first one and concatenated.
    """
    cfg = config
    x = jax.nn.relu(BatchNorm2d(64, name="bn1")(Conv2d(3, 64, 3, 2, 1, bias=False,
                                                      name="conv1")(x)))
    if additional_features is not None:
        x = x + additional_features
    x = jax.nn.relu(BatchNorm2d(64, name="bn2")(Conv2d(64, 64, 3, 2, 1, bias=False,
                                                      name="conv2")(x)))
    ys = [Layer1(cfg.num_blocks, name="layer1")(x)]
    pre = (256,)
    for stage, modules in zip((2, 3, 4), cfg.stage_modules):
        cur = tuple(cfg.width * 2 ** b for b in range(stage))
        ys = Transition(pre, cur, name=f"transition{stage - 1}")(ys)
        ys = Stage(cur, modules, cfg.num_blocks, name=f"stage{stage}")(ys)
        pre = cur
    hw = ys[0].shape[-3:-1]
    return jnp.concatenate([ys[0]] + [resize_to(y, hw) for y in ys[1:]], axis=-1)
