"""GPCIS's pathwise Gaussian-process head as pure functions (docs/models/gpcis.md).

GPCIS (Zhou et al., CVPR 2023) turns a per-pixel feature map into logits with
a Gaussian process whose inducing points are the clicks. For one image, with
``f`` the feature map f32[h, w, D] (D = d + 3: ``d`` L2-normalised deep
features, then the 3 normalised RGB channels) and the clicks' features
``z`` f32[N, D]:

* random Fourier features ``phi(x) = sqrt(2 / L) sin(theta(x))`` (``theta`` a
  linear map D -> L) and the prior sample ``prior(x) = phi(x) . omega``;
* the kernel ``k(a, b) = exp(-sum_j s_j (a_j - b_j)^2 / 2) + w exp(-|a_rgb -
  b_rgb|^2 / 2)`` with ``s = exp(logsigma2)`` over the ``d`` deep channels and
  ``w = softplus(weights)`` (the authors' ``Pathwise_GP_update``);
* click targets ``u = softplus(u_mlp(z)) * label`` (label +1 positive, -1
  negative) and the pathwise update
  ``logits(x) = prior(x) + k(x, z) (K + eps I)^-1 (u - prior(z))``.

Clicks enter as **indices**: a click at (x, y) of the network input reads the
feature pixel ``(floor(clamp(y)), floor(clamp(x)))`` (torch's ``.long()`` of
the clamped coordinate), so the head is not differentiable in the click
position; `gp_logits` stops the gradient there (the TETRIS authors' GPCIS
wrapper rebuilds the point tensor from the optimised click's values, which
detaches it; docs/protocols/tetris.md, "Families").

**Two clicks on one pixel** (``coincident_click_groups``): clicks whose indices
coincide read one feature vector, so ``K`` has equal rows and ``K + eps I``
(``eps`` = 1e-7 at inference) is singular up to ``eps``; the authors' float32
``torch.inverse`` then returns noise amplified ~1/eps. The rule here: such
clicks form **one inducing point whose target is the mean of their targets**
(equal labels: the click counted once; a positive and a negative click: target
0, i.e. the prior's value is pulled to 0 there). This is the exact-arithmetic
limit of the authors' formula as eps -> 0 (the antisymmetric part of the
targets multiplies equal kernel rows and cancels). Padding clicks (label -1)
and clicks outside the grid take no part, as in ``prepare_points_labels``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

RGB_CHANNELS = 3
INFERENCE_EPS = 1e-7


def random_features(params: dict, x: jnp.ndarray) -> jnp.ndarray:
    """phi(x) = sqrt(2 / L) sin(theta(x)): f32[..., D] -> f32[..., L]."""
    weight = params["theta"]["weight"]
    proj = jnp.einsum("...d,dl->...l", x, weight, precision=jax.lax.Precision.HIGHEST)
    proj = proj + params["theta"]["bias"]
    return jnp.sqrt(2.0 / weight.shape[1]) * jnp.sin(proj)


def prior_sample(params: dict, x: jnp.ndarray) -> jnp.ndarray:
    """The GP prior sample phi(x) . omega: f32[..., D] -> f32[...] (eval: ``omega`` itself)."""
    phi = random_features(params, x)
    return jnp.einsum("...l,l->...", phi, params["omega"][:, 0], precision=jax.lax.Precision.HIGHEST)


def click_targets(params: dict, z: jnp.ndarray, signs: jnp.ndarray) -> jnp.ndarray:
    """u = softplus(u_mlp(z)) * sign: z f32[N, D], signs f32[N] (+1 / -1) -> f32[N]."""
    mlp = params["u_mlp"]
    hidden = jax.nn.relu(jnp.dot(z, mlp["0"]["weight"], precision=jax.lax.Precision.HIGHEST) + mlp["0"]["bias"])
    out = jnp.dot(hidden, mlp["2"]["weight"], precision=jax.lax.Precision.HIGHEST) + mlp["2"]["bias"]
    return jax.nn.softplus(out[:, 0]) * signs


def kernel_matrix(params: dict, a: jnp.ndarray, b: jnp.ndarray) -> jnp.ndarray:
    """k(a_i, b_j): a f32[N, D], b f32[M, D] -> f32[N, M] (see the module docstring)."""
    scale = jnp.exp(params["logsigma2"])
    deep = a[:, None, :-RGB_CHANNELS] - b[None, :, :-RGB_CHANNELS]
    rgb = a[:, None, -RGB_CHANNELS:] - b[None, :, -RGB_CHANNELS:]
    weight = jax.nn.softplus(params["weights"][0])
    return (jnp.exp(-jnp.sum(scale * deep * deep, axis=-1) / 2)
            + weight * jnp.exp(-jnp.sum(rgb * rgb, axis=-1) / 2))


def pixel_kernel(params: dict, feature: jnp.ndarray, z: jnp.ndarray) -> jnp.ndarray:
    """k(x, z_n) for every pixel: feature f32[h, w, D], z f32[N, D] -> f32[h, w, N].

    The authors' expanded form ``exp(<x, z>_s - |x|_s^2 / 2 - |z|_s^2 / 2)``
    (a matrix product, not an [h, w, N, D] difference)."""
    scale = jnp.exp(params["logsigma2"])
    hp = jax.lax.Precision.HIGHEST
    fd, zd = feature[..., :-RGB_CHANNELS], z[:, :-RGB_CHANNELS]
    fr, zr = feature[..., -RGB_CHANNELS:], z[:, -RGB_CHANNELS:]
    deep = (jnp.einsum("hwd,nd->hwn", fd * scale, zd, precision=hp)
            - jnp.sum(scale * fd * fd, axis=-1)[..., None] / 2 - jnp.sum(scale * zd * zd, axis=-1) / 2)
    rgb = (jnp.einsum("hwd,nd->hwn", fr, zr, precision=hp)
           - jnp.sum(fr * fr, axis=-1)[..., None] / 2 - jnp.sum(zr * zr, axis=-1) / 2)
    return jnp.exp(deep) + jax.nn.softplus(params["weights"][0]) * jnp.exp(rgb)


def click_indices(points: jnp.ndarray, labels: jnp.ndarray, grid_hw: tuple[int, int]):
    """Feature-pixel indices of clicks, as the authors' ``prepare_points_labels`` takes them.

    Args:
      points: f32[N, 2] clicks (x, y) in network-input pixels.
      labels: i32[N] 1 positive, 0 negative, -1 padding.
      grid_hw: (h, w) of the feature map (the network input).

    Returns:
      (rows i32[N], cols i32[N], valid bool[N]): a click counts where it is not
      padding and ``0 <= y < h``, ``0 <= x < w``; indices are ``floor`` of the
      clamped coordinates, with no gradient.
    """
    points = jax.lax.stop_gradient(points)
    x, y = points[:, 0], points[:, 1]
    h, w = grid_hw
    valid = (labels >= 0) & (jnp.minimum(x, y) >= 0) & (y < h) & (x < w)
    rows = jnp.floor(jnp.clip(y, 0, h - 1)).astype(jnp.int32)
    cols = jnp.floor(jnp.clip(x, 0, w - 1)).astype(jnp.int32)
    return rows, cols, valid


def coincident_click_groups(rows: jnp.ndarray, cols: jnp.ndarray, valid: jnp.ndarray):
    """Which valid clicks share a pixel: (members f32[N, N], representative bool[N]).

    ``members[i, j]`` is 1 where click ``j`` is valid and on the pixel of the
    representative click ``i`` (the first valid click on its pixel), else 0;
    ``representative[i]`` marks those first clicks (the inducing points)."""
    same = (rows[:, None] == rows[None, :]) & (cols[:, None] == cols[None, :]) & valid[:, None] & valid[None, :]
    earlier = jnp.tril(same, k=-1)
    representative = valid & ~jnp.any(earlier, axis=1)
    members = (same & representative[:, None]).astype(jnp.float32)
    return members, representative


def gp_logits(params: dict, feature: jnp.ndarray, points: jnp.ndarray, labels: jnp.ndarray,
              eps: float = INFERENCE_EPS) -> jnp.ndarray:
    """GPCIS's logits of one image (the authors' ``Pathwise_GP_prior`` + ``Pathwise_GP_update``).

    Args:
      params: the head's parameters (``theta``, ``omega`` f32[L, 1], ``logsigma2``
        f32[d], ``u_mlp``, ``weights`` f32[1]).
      feature: f32[h, w, D] deep features and normalised RGB of the network input.
      points: f32[N, 2] clicks (x, y) in network-input pixels (no gradient flows).
      labels: i32[N] 1 / 0 / -1 (padding).
      eps: the jitter on K's diagonal (``eps2``: 1e-7 at inference).

    Returns:
      f32[h, w] logits; the prior alone where no click is valid. Clicks on one
      pixel merge into one inducing point (module docstring).
    """
    h, w = feature.shape[:2]
    rows, cols, valid = click_indices(points, labels, (h, w))
    members, representative = coincident_click_groups(rows, cols, valid)
    z = feature[rows, cols]                                   # [N, D]
    signs = jnp.where(labels == 1, 1.0, -1.0)
    residual = click_targets(params, z, signs) - prior_sample(params, z)
    counts = jnp.maximum(jnp.sum(members, axis=1), 1.0)
    target = jnp.where(representative, members @ residual / counts, 0.0)
    active = representative[:, None] & representative[None, :]
    gram = jnp.where(active, kernel_matrix(params, z, z), 0.0)
    gram = gram + jnp.diag(jnp.where(representative, eps, 1.0))
    weights = jnp.linalg.solve(gram, target)                 # 0 for inactive slots
    update = jnp.einsum("hwn,n->hw", pixel_kernel(params, feature, z), weights,
                        precision=jax.lax.Precision.HIGHEST)
    return prior_sample(params, feature) + update
