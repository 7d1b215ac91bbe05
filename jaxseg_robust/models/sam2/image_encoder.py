"""SAM 2's image encoder: the Hiera trunk and the FPN neck (``ImageEncoder(trunk, neck, scalp=1)``).

Behaviour matched to ``sam2.modeling.backbones.image_encoder`` (see
docs/models/sam2.md): each of the four trunk outputs gets a 1x1 conv to
``d_model`` channels (``convs_0`` for the lowest resolution, as the official
``convs`` list); going from low to high resolution, a level listed in
``fpn_top_down_levels`` adds the previous level upsampled 2x by nearest
neighbour (sum fusion); the lowest-resolution level is then dropped
(``scalp = 1``). The neck's sine position encodings feed only the video
memory attention and are not computed.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax.numpy as jnp

from jaxseg_robust.models.sam2.config import Sam2Config
from jaxseg_robust.models.sam2.hiera import Hiera


def upsample_nearest_2x(x: jnp.ndarray) -> jnp.ndarray:
    """``F.interpolate(scale_factor=2, mode="nearest")`` on f32[B, H, W, C] -> f32[B, 2H, 2W, C]."""
    return jnp.repeat(jnp.repeat(x, 2, axis=1), 2, axis=2)


class FpnNeck(nn.Module):
    """Params ``convs_{i}/{kernel, bias}`` (1x1 convs, kernel [1, 1, C_i, d_model])."""

    d_model: int
    top_down_levels: tuple[int, ...] = (2, 3)
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, xs: tuple[jnp.ndarray, ...]) -> tuple[jnp.ndarray, ...]:
        """Trunk outputs (highest resolution first) -> FPN levels f32[B, H_i, W_i, d_model]."""
        n = len(xs) - 1
        out: list[jnp.ndarray | None] = [None] * len(xs)
        prev = None
        for i in range(n, -1, -1):
            lateral = nn.Conv(self.d_model, (1, 1), dtype=self.dtype,
                              name=f"convs_{n - i}")(xs[i].astype(self.dtype)).astype(jnp.float32)
            if i in self.top_down_levels and prev is not None:
                prev = lateral + upsample_nearest_2x(prev)
            else:
                prev = lateral
            out[i] = prev
        return tuple(out)


class Sam2ImageEncoder(nn.Module):
    """f32[B, S, S, 3] (normalised) -> the three FPN levels kept (strides 4, 8, 16).

    Param tree: ``trunk/...`` (`Hiera`), ``neck/convs_{0..3}``.
    """

    config: Sam2Config
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jnp.ndarray) -> tuple[jnp.ndarray, jnp.ndarray, jnp.ndarray]:
        """Returns (f32[B, S/4, S/4, d], f32[B, S/8, S/8, d], f32[B, S/16, S/16, d])."""
        cfg = self.config
        if x.ndim != 4 or x.shape[1:] != (cfg.image_size, cfg.image_size, 3):
            raise ValueError(f"SAM 2 image encoder input must be [B, {cfg.image_size}, "
                             f"{cfg.image_size}, 3]; got {x.shape}")
        stages = Hiera(cfg.encoder, dtype=self.dtype, name="trunk")(x)
        levels = FpnNeck(cfg.d_model, tuple(cfg.fpn_top_down_levels), dtype=self.dtype,
                         name="neck")(stages)
        return levels[0], levels[1], levels[2]


__all__ = ["upsample_nearest_2x", "FpnNeck", "Sam2ImageEncoder"]
