"""TranSalNet_Res (Lou et al., Neurocomputing 2022) as Flax linen modules, NHWC, inference mode.

    net = TranSalNet(TRANSALNET_RES)
    variables = net.init_variables(jax.random.key(0))        # or ports.transalnet
    saliency = net.apply(variables, image)                    # f32[B, H, W] in (0, 1)

``image`` is f32[B, H, W, 3] RGB in [0, 1] at ``config.input_hw`` (288 x 384), not
mean/std normalised (the authors feed ``uint8 / 255``). Structure, following the
authors' ``TranSalNet_Res.py`` (docs/models/transalnet.md):

* backbone: torchvision ResNet-50 (v1.5, stride on the 3x3 conv; the Bottleneck of
  `jaxseg_robust.models.dense.deeplabv3`), stem 7x7/2 conv, BN, ReLU, 3x3/2 max pool;
  the outputs of layer2 (stride 8), layer3 (16) and layer4 (32) feed the decoder;
* three transformer encoders (``TransEncoder``): 1x1 conv patch embedding, learned
  position embeddings, pre-LayerNorm blocks (multi-head self-attention, GELU MLP; eps
  1e-6), final LayerNorm, back to the feature grid;
* decoder: TransEncoder1(layer4) -> conv1/BN/ReLU -> nearest x2, times
  TransEncoder2(layer3), ReLU -> conv2/BN/ReLU -> x2, times TransEncoder3(layer2), ReLU
  -> conv3/BN/ReLU -> x2 -> conv4/BN/ReLU -> x2 -> conv5/BN/ReLU -> x2 -> conv6/BN/ReLU
  -> conv7 -> sigmoid. 3x3 convs with bias, BatchNorm with running statistics.

Variables: ``{"params", "batch_stats"}``; the official key layout is mapped in
``ports/transalnet.py``.
"""

from __future__ import annotations

import os

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxseg_robust.models.dense.deeplabv3 import EXPANSION, Bottleneck
from jaxseg_robust.models.dense.layers import conv2d
from jaxseg_robust.models.saliency.config import FAMILY, TranSalNetConfig

COLLECTIONS = ("params", "batch_stats")


def _batch_norm(eps: float, name: str) -> nn.BatchNorm:
    return nn.BatchNorm(use_running_average=True, epsilon=eps, name=name)


def upsample_nearest2(x: jnp.ndarray) -> jnp.ndarray:
    """torch ``Upsample(scale_factor=2, mode="nearest")`` on f32[B, h, w, C] -> f32[B, 2h, 2w, C]."""
    return jnp.repeat(jnp.repeat(x, 2, axis=-3), 2, axis=-2)


class ResNetStages(nn.Module):
    """torchvision ResNet without pooling head; returns (layer2, layer3, layer4) features."""

    config: TranSalNetConfig

    @nn.compact
    def __call__(self, x: jnp.ndarray) -> tuple[jnp.ndarray, ...]:
        """f32[B, H, W, 3] -> features at strides 8, 16, 32 with 8w, 16w, 32w channels (w = width)."""
        cfg = self.config
        x = conv2d(cfg.resnet_width, 7, stride=2, use_bias=False, name="conv1")(x)
        x = nn.relu(_batch_norm(cfg.bn_eps, "bn1")(x))
        x = nn.max_pool(x, (3, 3), strides=(2, 2), padding=((1, 1), (1, 1)))
        in_channels, outputs = cfg.resnet_width, []
        for stage, n_blocks in enumerate(cfg.resnet_blocks):
            planes = cfg.resnet_width * 2 ** stage
            stride = 1 if stage == 0 else 2
            downsample = stride != 1 or in_channels != planes * EXPANSION
            for j in range(n_blocks):
                x = Bottleneck(planes, stride if j == 0 else 1, 1, downsample and j == 0, cfg.bn_eps,
                               name=f"layer{stage + 1}_{j}")(x)
            in_channels = planes * EXPANSION
            outputs.append(x)
        return tuple(outputs[1:])


class Attention(nn.Module):
    """Multi-head self-attention of the authors' ``Attention`` (query/key/value/out Linear layers)."""

    hidden: int
    heads: int

    @nn.compact
    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        """f32[B, N, D] -> f32[B, N, D]."""
        batch, tokens, _ = x.shape
        head_dim = self.hidden // self.heads

        def split(name):
            y = nn.Dense(self.hidden, name=name)(x)
            return y.reshape(batch, tokens, self.heads, head_dim).transpose(0, 2, 1, 3)

        query, key, value = split("query"), split("key"), split("value")
        scores = jnp.einsum("bhqd,bhkd->bhqk", query, key) / jnp.sqrt(jnp.float32(head_dim))
        context = jnp.einsum("bhqk,bhkd->bhqd", jax.nn.softmax(scores, axis=-1), value)
        context = context.transpose(0, 2, 1, 3).reshape(batch, tokens, self.hidden)
        return nn.Dense(self.hidden, name="out")(context)


class TransformerBlock(nn.Module):
    """Pre-norm block: ``x + attn(LN(x))``, then ``x + fc2(gelu(fc1(LN(x))))`` (exact GELU)."""

    hidden: int
    heads: int
    mlp_dim: int
    eps: float

    @nn.compact
    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        """f32[B, N, D] -> f32[B, N, D]."""
        x = x + Attention(self.hidden, self.heads, name="attn")(
            nn.LayerNorm(epsilon=self.eps, name="attention_norm")(x))
        h = nn.LayerNorm(epsilon=self.eps, name="ffn_norm")(x)
        h = nn.Dense(self.mlp_dim, name="fc1")(h)
        h = nn.Dense(self.hidden, name="fc2")(nn.gelu(h, approximate=False))
        return x + h


class TransEncoder(nn.Module):
    """1x1 conv embedding + position embeddings + transformer, back to the grid."""

    hidden: int
    heads: int
    layers: int
    mlp_dim: int
    eps: float

    @nn.compact
    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        """f32[B, h, w, C] -> f32[B, h, w, hidden]."""
        batch, h, w, _ = x.shape
        tokens = conv2d(self.hidden, 1, name="patch_embeddings")(x).reshape(batch, h * w, self.hidden)
        position = self.param("position_embeddings", nn.initializers.zeros, (1, h * w, self.hidden))
        tokens = tokens + position
        for i in range(self.layers):
            tokens = TransformerBlock(self.hidden, self.heads, self.mlp_dim, self.eps, name=f"layer_{i}")(tokens)
        tokens = nn.LayerNorm(epsilon=self.eps, name="encoder_norm")(tokens)
        return tokens.reshape(batch, h, w, self.hidden)


class Decoder(nn.Module):
    """The authors' ``_Decoder``: transformer-gated fusion of the three backbone outputs."""

    config: TranSalNetConfig

    def _encoder(self, index: int, name: str) -> TransEncoder:
        cfg = self.config
        hidden = cfg.hidden_sizes[index]
        return TransEncoder(hidden, cfg.num_heads[index], cfg.num_layers[index], hidden * cfg.mlp_ratio,
                            cfg.ln_eps, name=name)

    def _conv_bn_relu(self, x, features: int, index: int) -> jnp.ndarray:
        x = conv2d(features, 3, name=f"conv{index}")(x)
        return nn.relu(_batch_norm(self.config.bn_eps, f"batchnorm{index}")(x))

    @nn.compact
    def __call__(self, features: tuple[jnp.ndarray, ...]) -> jnp.ndarray:
        """(stride 8, 16, 32 features) -> f32[B, H, W] saliency in (0, 1)."""
        cfg = self.config
        x3, x4, x5 = features
        x5 = upsample_nearest2(self._conv_bn_relu(self._encoder(0, "TransEncoder1")(x5), cfg.hidden_sizes[1], 1))
        x4 = nn.relu(x5 * self._encoder(1, "TransEncoder2")(x4))
        x4 = upsample_nearest2(self._conv_bn_relu(x4, cfg.hidden_sizes[2], 2))
        x3 = nn.relu(x4 * self._encoder(2, "TransEncoder3")(x3))
        x3 = upsample_nearest2(self._conv_bn_relu(x3, cfg.decoder_channels[0], 3))
        x2 = upsample_nearest2(self._conv_bn_relu(x3, cfg.decoder_channels[1], 4))
        x2 = self._conv_bn_relu(x2, cfg.decoder_channels[2], 5)
        x1 = self._conv_bn_relu(upsample_nearest2(x2), cfg.decoder_channels[3], 6)
        return jax.nn.sigmoid(conv2d(1, 3, name="conv7")(x1)[..., 0])


class TranSalNet(nn.Module):
    """Backbone + decoder: f32[B, H, W, 3] in [0, 1] -> saliency f32[B, H, W] in (0, 1)."""

    config: TranSalNetConfig

    @nn.compact
    def __call__(self, image: jnp.ndarray) -> jnp.ndarray:
        """``image`` at ``config.input_hw``; returns the sigmoid saliency at the same size."""
        if tuple(image.shape[-3:-1]) != tuple(self.config.input_hw):
            raise ValueError(f"TranSalNet takes images of {tuple(self.config.input_hw)}; got "
                             f"{tuple(image.shape[-3:-1])} (its position embeddings fix the size)")
        return Decoder(self.config, name="decoder")(ResNetStages(self.config, name="backbone")(image))

    def init_variables(self, key: jax.Array) -> dict:
        """Random variables {"params", "batch_stats"} (Flax default init), under ``jit``."""
        image = jnp.zeros((1, *self.config.input_hw, 3), jnp.float32)
        return dict(jax.jit(lambda k: self.init({"params": k}, image))(key))

    def variable_shapes(self) -> dict:
        """ShapeDtypeStruct tree of all variables, without computing anything."""
        image = jax.ShapeDtypeStruct((1, *self.config.input_hw, 3), jnp.float32)
        return dict(jax.eval_shape(lambda i: self.init({"params": jax.random.key(0)}, i), image))


def load_converted(model_dir: str | os.PathLike) -> tuple[TranSalNetConfig, dict]:
    """Loads a directory written by ``python -m ports transalnet``.

    Returns:
      (config, variables {"params", "batch_stats"} of numpy float32 arrays).

    Raises:
      jaxseg_robust.models.store.StoreError: missing/damaged directory, another family, or
        variables that do not match the config's network.
    """
    from jaxseg_robust.models import store  # noqa: PLC0415

    variables, meta = store.load(model_dir)
    if meta["family"] != FAMILY:
        raise store.StoreError(f"{model_dir} holds a '{meta['family']}' model, not {FAMILY}")
    config = TranSalNetConfig.from_dict(meta["config"])
    store.check_tree(variables, TranSalNet(config).variable_shapes(), what=os.fspath(model_dir))
    return config, variables
