"""CDNet's pixel diffusion module (ClickSEG ``isegm/model/modeling/cdnet/PDM.py``): docs/models/cdnet.md.

``PDM(num_iter=5, dilations=[1, 2, 4, 8])`` refines the (flip-averaged)
logits on the image the network saw, without parameters:

1. the logits ``m`` become ``s = 2 (sigmoid(m) - 0.5)``; ``s`` is zeroed where
   ``|s| <= 0.25`` and ``+ 10 pos - 10 neg`` (the radius-5 click disks) is
   added;
2. affinities to the 8 neighbours at each dilation d (replicate padding by
   d): ``a = -|x - x_n| / (1e-8 + 0.1 std)``, where ``std`` is the unbiased
   standard deviation of the 9 neighbourhood values (centre included) over
   all dilations, per colour channel; ``a`` is averaged over the colour
   channels and soft-maxed over the 32 neighbours;
3. five times ``s <- sum_n softmax_n * s_n`` (the neighbours' values, replicate
   padded), then the unzeroed ``2 (sigmoid(m) - 0.5)`` is added back.

The result is a logit-like map whose sigmoid the predictor thresholds at 0.5.
Everything is differentiable in the click maps (TETRIS's gradient reaches the
clicks through the ``10 pos - 10 neg`` term too).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

DILATIONS = (1, 2, 4, 8)
NUM_ITER = 5
CLICK_AMPLITUDE = 10.0
KEEP_ABOVE = 0.25
# The 8 neighbours in the authors' kernel order (row offset, column offset) in units of the dilation.
NEIGHBOURS = ((-1, -1), (-1, 0), (-1, 1), (0, -1), (0, 1), (1, -1), (1, 0), (1, 1))
WINDOW = ((-1, -1), (-1, 0), (-1, 1), (0, -1), (0, 0), (0, 1), (1, -1), (1, 0), (1, 1))


def shifted(x: jnp.ndarray, offsets, dilations=DILATIONS) -> jnp.ndarray:
    """Neighbour values with replicate padding: f32[H, W, ...] -> f32[P, H, W, ...], P = len(dilations) *
    len(offsets), dilation-major (isegm's ``torch.cat`` over dilations of the shift kernels)."""
    h, w = x.shape[0], x.shape[1]
    rows, cols = jnp.arange(h), jnp.arange(w)
    out = []
    for d in dilations:
        for dr, dc in offsets:
            r = jnp.clip(rows + dr * d, 0, h - 1)
            c = jnp.clip(cols + dc * d, 0, w - 1)
            out.append(x[r][:, c])
    return jnp.stack(out)


def diffusion_weights(image: jnp.ndarray) -> jnp.ndarray:
    """Soft-maxed neighbour affinities of an image f32[H, W, 3] in [0, 1] -> f32[32, H, W]."""
    differences = image[None] - shifted(image, NEIGHBOURS)  # [32, H, W, 3]
    # The window's standard deviation of its differences to the centre (the same value, shift-invariant):
    # near-equal values subtract exactly, so a tiny spread is not buried under the rounding of a mean
    # of the raw values (float32), which the division by 0.1 std would amplify.
    std = jnp.std(shifted(image, WINDOW) - image[None], axis=0, ddof=1)  # [H, W, 3]
    affinity = -jnp.abs(differences) / (1e-8 + 0.1 * std[None])
    return jax.nn.softmax(jnp.mean(affinity, axis=-1), axis=0)


def pixel_diffusion(image: jnp.ndarray, logits: jnp.ndarray, click_maps: jnp.ndarray) -> jnp.ndarray:
    """ClickSEG ``PDM.forward(image, mask, click_map)`` for one image.

    Args:
      image: f32[H, W, 3] in [0, 1] (the network's input grid, not normalised).
      logits: f32[H, W] the network's (flip-averaged) logits on that grid.
      click_maps: f32[H, W, 2] [pos, neg] radius-5 disks on that grid.

    Returns:
      f32[H, W]: the diffused map (a logit: the predictor thresholds its sigmoid at 0.5).
    """
    residual = (jax.nn.sigmoid(logits) - 0.5) * 2.0
    mask = residual * (jnp.abs(residual) > KEEP_ABOVE)
    mask = mask + click_maps[..., 0] * CLICK_AMPLITUDE - click_maps[..., 1] * CLICK_AMPLITUDE
    weights = diffusion_weights(image)

    def step(m, _):
        return jnp.sum(shifted(m, NEIGHBOURS) * weights, axis=0), None

    mask, _ = jax.lax.scan(step, mask, None, length=NUM_ITER)
    return mask + residual
