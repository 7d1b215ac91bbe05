"""Small building blocks shared by SAM-family prompt encoders and mask decoders.

* `Linear`: a dense layer with explicit input size whose kernel can be read
  before it is called (needed to push low-rank terms through a projection).
* `LowRankDense`: a dense (per-pixel) embedding stored as ``factors @ weight +
  bias`` with few factors. SAM's dense prompt embedding is either a constant
  vector (no mask) or a 1x1 convolution of a 16-channel map (mask input), so
  every linear projection of ``image + dense`` splits into a prompt-independent
  part (shared across prompts under ``vmap``) plus a cheap rank-16 part.
* `PatchConvTranspose`: a transposed convolution whose kernel equals its
  stride (no overlap), computed as one matmul and a pixel shuffle.
* `MLP`: SAM's ``MLP`` (Linear, ReLU between layers, optional sigmoid).
* `layer_norm`: torch-equivalent LayerNorm (two-pass variance).
"""

from __future__ import annotations

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp


def layer_norm(eps: float, name: str | None = None) -> nn.LayerNorm:
    """LayerNorm over the last axis matching torch (E[(x-mean)^2], float32 statistics)."""
    return nn.LayerNorm(epsilon=eps, use_fast_variance=False, dtype=jnp.float32, name=name)


def torch_linear_init(fan_in: int):
    """Uniform(-1/sqrt(fan_in), 1/sqrt(fan_in)): torch's default Linear/Conv init scale."""
    bound = 1.0 / max(fan_in, 1) ** 0.5

    def init(key, shape, dtype=jnp.float32):
        return jax.random.uniform(key, shape, dtype, -bound, bound)

    return init


@flax.struct.dataclass
class LowRankDense:
    """A per-pixel embedding ``factors @ weight + bias``.

    Attributes:
      factors: f32[..., R] per-pixel factors (e.g. [h, w, 16] or [h * w, 16]).
      weight: f32[R, C].
      bias: f32[C].
    """

    factors: jnp.ndarray
    weight: jnp.ndarray
    bias: jnp.ndarray

    def materialize(self) -> jnp.ndarray:
        """f32[..., C] the dense embedding."""
        return self.factors @ self.weight + self.bias

    def project(self, kernel: jnp.ndarray) -> "LowRankDense":
        """The embedding after a bias-free linear map ``x @ kernel`` (kernel f32[C, D])."""
        return LowRankDense(self.factors, self.weight @ kernel, self.bias @ kernel)

    def flatten_spatial(self) -> "LowRankDense":
        """[h, w, R] factors -> [h * w, R]."""
        return self.replace(factors=self.factors.reshape(-1, self.factors.shape[-1]))


class Linear(nn.Module):
    """``y = x @ kernel + bias`` with kernel f32[in_features, out_features].

    Param names match ``nn.Dense`` (``kernel``, ``bias``).
    """

    in_features: int
    out_features: int
    use_bias: bool = True

    def setup(self):
        init = torch_linear_init(self.in_features)
        self.kernel = self.param("kernel", init, (self.in_features, self.out_features))
        if self.use_bias:
            self.bias = self.param("bias", init, (self.out_features,))

    def __call__(self, x: jnp.ndarray, extra: LowRankDense | None = None) -> jnp.ndarray:
        """f32[..., in] -> f32[..., out]; with ``extra``, the map of ``x + extra``.

        ``extra.factors`` must broadcast against ``x``'s leading axes.
        """
        y = x @ self.kernel
        if self.use_bias:
            y = y + self.bias
        if extra is not None:
            y = y + extra.project(self.kernel).materialize()
        return y


class PatchConvTranspose(nn.Module):
    """Transposed conv with kernel = stride = ``patch`` (no padding): f32[h, w, Cin] -> f32[h*p, w*p, F].

    ``out[p*i + a, p*j + b, o] = sum_c x[i, j, c] * kernel[a, b, c, o] + bias[o]``,
    i.e. torch ``ConvTranspose2d(Cin, F, kernel_size=p, stride=p)`` with its
    weight [Cin, F, p, p] transposed to [p, p, Cin, F] (no flip). `patches`
    gives the same numbers before the pixel shuffle, f32[..., p, p, F] per
    input pixel, so per-pixel work can follow without moving data.
    """

    in_features: int
    features: int
    patch: int = 2

    def setup(self):
        p = self.patch
        init = torch_linear_init(self.features * p * p)
        self.kernel = self.param("kernel", init, (p, p, self.in_features, self.features))
        self.bias = self.param("bias", init, (self.features,))

    def patches(self, x: jnp.ndarray) -> jnp.ndarray:
        """f32[..., Cin] -> f32[..., p, p, F] (one output patch per input pixel)."""
        return jnp.einsum("...c,abco->...abo", x, self.kernel) + self.bias

    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        """f32[..., h, w, Cin] -> f32[..., h*p, w*p, F]."""
        y = self.patches(x)  # [..., h, w, p, p, F]
        h, w, p = x.shape[-3], x.shape[-2], self.patch
        y = jnp.swapaxes(y, -4, -3)  # [..., h, p, w, p, F]
        return y.reshape(*x.shape[:-3], h * p, w * p, self.features)


class MLP(nn.Module):
    """SAM's MLP: ``num_layers`` Linear layers, ReLU between them, optional sigmoid.

    Params ``layers_{i}/{kernel,bias}``.
    """

    input_dim: int
    hidden_dim: int
    output_dim: int
    num_layers: int
    sigmoid_output: bool = False

    @nn.compact
    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        dims = [self.input_dim] + [self.hidden_dim] * (self.num_layers - 1) + [self.output_dim]
        for i in range(self.num_layers):
            x = Linear(dims[i], dims[i + 1], name=f"layers_{i}")(x)
            if i < self.num_layers - 1:
                x = jax.nn.relu(x)
        return jax.nn.sigmoid(x) if self.sigmoid_output else x


def gelu(x: jnp.ndarray) -> jnp.ndarray:
    """Exact (erf) GELU, torch ``nn.GELU()``."""
    return jax.nn.gelu(x, approximate=False)


class MLPBlock(nn.Module):
    """``lin2(act(lin1(x)))`` (torch ``MLPBlock``); ``activation`` "relu" or "gelu" (exact)."""

    dim: int
    hidden_dim: int
    activation: str = "relu"

    def setup(self):
        if self.activation not in ("relu", "gelu"):
            raise ValueError(f"activation must be 'relu' or 'gelu'; got {self.activation!r}")
        self.lin1 = Linear(self.dim, self.hidden_dim)
        self.lin2 = Linear(self.hidden_dim, self.dim)

    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        """f32[..., dim] -> f32[..., dim]."""
        h = self.lin1(x)
        h = jax.nn.relu(h) if self.activation == "relu" else gelu(h)
        return self.lin2(h)


__all__ = ["layer_norm", "torch_linear_init", "LowRankDense", "Linear", "PatchConvTranspose",
           "MLP", "MLPBlock", "gelu"]
