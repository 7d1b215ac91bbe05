"""AdaptiveClick's click-aware mask-adaptive decoder (``ClickAwareMaskAdaptiveDecoder``), NHWC.

Mask2Former's ``MultiScaleMaskedTransformerDecoder`` as the authors run it
(``isegm/model/is_adaptiveclick_model.py`` and
``mask2former_helper/mask2former_transformer_decoder.py``):

* ``num_queries`` learnable queries (``query_feat``) with learnable positions
  (``query_embed``) attend, layer by layer, to the levels [stride 32, 16, 8]
  in turn (sine positions plus ``level_embed``): masked cross-attention, then
  self-attention, then an FFN, each post-norm;
* the prediction heads after the input and after every layer: ``decoder_norm``,
  the class logits (``class_embed``: ``num_classes + 1``), the mask logits
  ``mask_embed(q) . mask_features`` at stride 4;
* the **attention mask** of the next layer: a query may attend where its mask,
  resized (bilinear) to the next level, has sigmoid >= 0.5, **or** (the
  click-aware part, for the queries whose class argmax is 1) where the
  positive-click disk map, max-pooled (3x3, stride 2, pad 1)
  ``log2(input / level)`` times and resized to the level, is >= 0.5; a query
  blocked everywhere may attend everywhere. The masks are thresholds, so no
  gradient flows through them (the authors ``detach`` them);
* the output (``segment_inference``): ``sum_q sigmoid(class_q)[1] mask_q``,
  upsampled to the input (bilinear, ``align_corners=True``): the values
  isegm's predictor treats as logits.

Parameter names follow the torch module paths
(``transformer_cross_attention_layers/0/multihead_attn/in_proj_weight``).
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxseg_robust.models.adaptiveclick.config import AdaptiveClickConfig, pooling_steps
from jaxseg_robust.models.adaptiveclick.pixel_decoder import sine_position_embedding
from jaxseg_robust.models.clickability.resize import upsample_align_corners
from jaxseg_robust.models.clickmap.layers import LayerNorm, Linear
from jaxseg_robust.models.simpleclick.network import resize_bilinear_nhwc


class MultiheadAttention(nn.Module):
    """torch ``nn.MultiheadAttention`` (``in_proj_weight`` stored [in, 3 out]): queries f32[B, Lq, C],
    keys / values f32[B, Lk, C], ``blocked`` bool[B, heads, Lq, Lk] or None -> f32[B, Lq, C]."""

    dim: int
    heads: int

    @nn.compact
    def __call__(self, query, key, value, blocked=None):
        c, h = self.dim, self.heads
        weight = self.param("in_proj_weight", nn.initializers.zeros, (c, 3 * c)).astype(query.dtype)
        bias = self.param("in_proj_bias", nn.initializers.zeros, (3 * c,)).astype(query.dtype)

        def heads_first(x, part):
            y = x @ weight[:, part * c:(part + 1) * c] + bias[part * c:(part + 1) * c]
            return y.reshape(y.shape[0], y.shape[1], h, c // h).transpose(0, 2, 1, 3)

        q = heads_first(query, 0) * jnp.asarray((c // h) ** -0.5, query.dtype)
        k, v = heads_first(key, 1), heads_first(value, 2)
        scores = jnp.einsum("bhqd,bhkd->bhqk", q, k)
        if blocked is not None:
            scores = jnp.where(blocked, -jnp.inf, scores)
        out = jnp.einsum("bhqk,bhkd->bhqd", jax.nn.softmax(scores, axis=-1), v)
        out = out.transpose(0, 2, 1, 3).reshape(query.shape)
        return Linear(c, c, name="out_proj")(out)


class CrossAttentionLayer(nn.Module):
    """``CrossAttentionLayer`` (post-norm): queries attend to a level's tokens where not blocked."""

    dim: int
    heads: int

    @nn.compact
    def __call__(self, tgt, memory, blocked, pos, query_pos):
        out = MultiheadAttention(self.dim, self.heads, name="multihead_attn")(tgt + query_pos, memory + pos,
                                                                              memory, blocked)
        return LayerNorm(self.dim, name="norm")(tgt + out)


class SelfAttentionLayer(nn.Module):
    """``SelfAttentionLayer`` (post-norm)."""

    dim: int
    heads: int

    @nn.compact
    def __call__(self, tgt, query_pos):
        q = tgt + query_pos
        out = MultiheadAttention(self.dim, self.heads, name="self_attn")(q, q, tgt)
        return LayerNorm(self.dim, name="norm")(tgt + out)


class FFNLayer(nn.Module):
    """``FFNLayer`` (post-norm, ReLU)."""

    dim: int
    hidden: int

    @nn.compact
    def __call__(self, tgt):
        out = Linear(self.hidden, self.dim, name="linear2")(jax.nn.relu(Linear(self.dim, self.hidden,
                                                                               name="linear1")(tgt)))
        return LayerNorm(self.dim, name="norm")(tgt + out)


class MaskMLP(nn.Module):
    """``mask_embed``: three Linear layers (children "layers/0..2"), ReLU between."""

    dim: int
    out_dim: int

    @nn.compact
    def __call__(self, x):
        return Layers3(self.dim, self.out_dim, name="layers")(x)


class Layers3(nn.Module):
    """The ``layers`` ModuleList of `MaskMLP`."""

    dim: int
    out_dim: int

    @nn.compact
    def __call__(self, x):
        x = jax.nn.relu(Linear(self.dim, self.dim, name="0")(x))
        x = jax.nn.relu(Linear(self.dim, self.dim, name="1")(x))
        return Linear(self.dim, self.out_dim, name="2")(x)


class Stack(nn.Module):
    """A torch ``ModuleList`` of one layer kind: ``stack(i, *inputs)`` applies child ``str(i)``."""

    kind: type
    args: tuple

    @nn.compact
    def __call__(self, i: int, *inputs):
        return self.kind(*self.args, name=str(i))(*inputs)


def max_pool_3x3_s2(x: jnp.ndarray) -> jnp.ndarray:
    """torch ``MaxPool2d(3, stride=2, padding=1)`` (padding is -inf) of f32[..., H, W]."""
    lead = x.shape[:-2]
    y = jax.lax.reduce_window(x.reshape((-1,) + x.shape[-2:]), -jnp.inf, jax.lax.max, (1, 3, 3), (1, 2, 2),
                              ((0, 0), (1, 1), (1, 1)))
    return y.reshape(lead + y.shape[-2:])


def click_level_map(positive: jnp.ndarray, hw: tuple[int, int]) -> jnp.ndarray:
    """The positive-click map f32[B, H, W] at a level (h, w): pooled ``pooling_steps`` times, then
    resized bilinearly (``align_corners=False``): f32[B, h, w]."""
    pooled = positive
    for _ in range(pooling_steps(positive.shape[-1], hw[1])):
        pooled = max_pool_3x3_s2(pooled)
    return resize_bilinear_nhwc(pooled[..., None], hw)[..., 0]


def attention_blocked(mask_logits: jnp.ndarray, click_queries: jnp.ndarray, positive: jnp.ndarray,
                      hw: tuple[int, int], heads: int) -> jnp.ndarray:
    """The next layer's attention mask: bool[B, heads, Q, h w], True where a query may not attend.

    Args:
      mask_logits: f32[B, Q, H4, W4] the queries' mask logits.
      click_queries: f32[B, Q] the class argmax (1: the click-aware mask applies).
      positive: f32[B, H, W] the positive-click disk map at the input size.
      hw: the level's (h, w).
    """
    b, q = mask_logits.shape[:2]
    resized = resize_bilinear_nhwc(mask_logits.transpose(0, 2, 3, 1), hw)  # [B, h, w, Q]
    blocked = jax.nn.sigmoid(resized) < 0.5
    clicks = click_queries[:, None, None, :] * click_level_map(positive, hw)[..., None]
    blocked = blocked & (clicks < 0.5)
    blocked = blocked.reshape(b, -1, q).transpose(0, 2, 1)  # [B, Q, h w]
    blocked = jax.lax.stop_gradient(blocked)
    return jnp.broadcast_to(blocked[:, None], (b, heads, q, hw[0] * hw[1]))


class ClickAwareDecoder(nn.Module):
    """``click_aware_decoder``: levels [res5, res4, res3] f32[B, h, w, C], mask features
    f32[B, H4, W4, C], positive-click map f32[B, H, W] -> (class logits f32[B, Q, K + 1],
    mask logits f32[B, Q, H4, W4]) of the last layer."""

    config: AdaptiveClickConfig

    @nn.compact
    def __call__(self, levels, mask_features, positive):
        cfg = self.config
        c, heads, nq = cfg.hidden_dim, cfg.num_heads_decoder, cfg.num_queries
        b = mask_features.shape[0]
        dtype = mask_features.dtype
        level_embed = self._embedding("level_embed", len(levels), c)
        sizes = [tuple(int(v) for v in x.shape[-3:-1]) for x in levels]
        pos = [jnp.asarray(sine_position_embedding(hw, c // 2)).reshape(1, -1, c).astype(dtype) for hw in sizes]
        src = [x.reshape(b, -1, c) + level_embed[i].astype(dtype) for i, x in enumerate(levels)]
        query_pos = jnp.broadcast_to(self._embedding("query_embed", nq, c).astype(dtype), (b, nq, c))
        output = jnp.broadcast_to(self._embedding("query_feat", nq, c).astype(dtype), (b, nq, c))
        norm = LayerNorm(c, name="decoder_norm")
        class_embed = Linear(c, cfg.num_classes + 1, name="class_embed")
        mask_embed = MaskMLP(c, cfg.mask_dim, name="mask_embed")

        def heads_of(out, hw):
            x = norm(out)
            classes = class_embed(x)
            masks = jnp.einsum("bqc,bhwc->bqhw", mask_embed(x), mask_features)
            click_queries = jnp.argmax(classes, axis=-1).astype(dtype)
            return classes, masks, attention_blocked(masks, click_queries, positive, hw, heads)

        cross = Stack(CrossAttentionLayer, (c, heads), name="transformer_cross_attention_layers")
        selfs = Stack(SelfAttentionLayer, (c, heads), name="transformer_self_attention_layers")
        ffns = Stack(FFNLayer, (c, cfg.decoder_ffn_dim), name="transformer_ffn_layers")
        classes, masks, blocked = heads_of(output, sizes[0])
        for i in range(cfg.decoder_layers):
            level = i % len(levels)
            blocked = blocked & ~jnp.all(blocked, axis=-1, keepdims=True)
            output = cross(i, output, src[level], blocked, pos[level], query_pos)
            output = selfs(i, output, query_pos)
            output = ffns(i, output)
            classes, masks, blocked = heads_of(output, sizes[(i + 1) % len(levels)])
        return classes, masks

    def _embedding(self, name: str, rows: int, dim: int) -> jnp.ndarray:
        """An ``nn.Embedding``'s table f32[rows, dim] (child ``name``, parameter "weight")."""
        return EmbeddingTable(rows, dim, name=name)()


class EmbeddingTable(nn.Module):
    """torch ``nn.Embedding``'s ``weight`` f32[rows, dim]."""

    rows: int
    dim: int

    @nn.compact
    def __call__(self):
        return self.param("weight", nn.initializers.zeros, (self.rows, self.dim))


def segment_inference(classes: jnp.ndarray, masks: jnp.ndarray, hw: tuple[int, int]) -> jnp.ndarray:
    """The authors' ``segment_inference``: ``sum_q sigmoid(classes)[q, 1:] masks_q`` at the input size
    (bilinear, ``align_corners=True``): f32[B, H, W] (one class). The authors pass the size as
    (W, H), the same for the square inputs their predictor gives (docs/models/adaptiveclick.md)."""
    up = upsample_align_corners(masks, hw, axes=(-2, -1))
    weights = jax.nn.sigmoid(classes)[..., 1:]
    return jnp.einsum("bqk,bqhw->bkhw", weights, up)[:, 0]
