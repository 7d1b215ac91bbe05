"""SAM's two-way transformer with token masking and shared image-side work.

Behaviour matched to ``segment_anything.modeling.transformer``: each block
runs (1) token self-attention (no PE on the first block), (2) token->image
cross-attention, (3) a ReLU MLP on tokens, (4) image->token cross-attention,
each followed by a LayerNorm (eps 1e-5); a final token->image attention and
LayerNorm follow the blocks. Cross-attentions project to ``C / 2`` channels
(``attention_downsample_rate`` 2); logits are divided by ``sqrt(head_dim)``
after the product.

Two additions, neither changing the result:
  * ``token_valid`` masks keys: unused prompt slots take no part in token
    self-attention or in image->token attention (the only places tokens are
    keys), so padded prompt sets reproduce the reference on the valid prompts;
  * the first block receives the image side as ``image + dense`` in factored
    form (`LowRankDense`): its three image-side projections are computed as
    ``proj(image [+ pe])`` (independent of the prompt, hence computed once
    when ``decode`` is vmapped over prompt sets) plus a rank-16 term of the
    dense prompt embedding.
"""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxseg_robust.models.sam.layers import Linear, LowRankDense, MLPBlock, layer_norm


def masked_softmax(logits: jnp.ndarray, key_valid: jnp.ndarray | None) -> jnp.ndarray:
    """Softmax over the last axis, ignoring keys where ``key_valid`` is False.

    Args:
      logits: f32[..., Nq, Nk].
      key_valid: bool[Nk] or None (all keys valid). At least one key must be valid.
    """
    if key_valid is not None:
        logits = jnp.where(key_valid, logits, -jnp.inf)
    return jax.nn.softmax(logits, axis=-1)


class Attention(nn.Module):
    """Multi-head attention with optional down-projection and key masking.

    Params ``{q,k,v}_proj`` (C -> C / downsample_rate) and ``out_proj``.
    """

    embedding_dim: int
    num_heads: int
    downsample_rate: int = 1

    def setup(self):
        internal = self.embedding_dim // self.downsample_rate
        if internal % self.num_heads:
            raise ValueError(f"num_heads {self.num_heads} must divide the internal dim {internal}")
        self.q_proj = Linear(self.embedding_dim, internal)
        self.k_proj = Linear(self.embedding_dim, internal)
        self.v_proj = Linear(self.embedding_dim, internal)
        self.out_proj = Linear(internal, self.embedding_dim)

    def __call__(self, q, k, v, key_valid=None, *, q_extra: LowRankDense | None = None,
                 k_extra: LowRankDense | None = None, v_extra: LowRankDense | None = None):
        """Attention of queries f32[Nq, C] over keys/values f32[Nk, C] -> f32[Nq, C].

        ``*_extra`` (optional) are added to the corresponding input before its
        projection, by linearity (see `Linear`). ``key_valid`` bool[Nk] masks keys.
        """
        q = self.q_proj(q, q_extra)
        k = self.k_proj(k, k_extra)
        v = self.v_proj(v, v_extra)
        heads = self.num_heads
        qh = q.reshape(q.shape[0], heads, -1).transpose(1, 0, 2)
        kh = k.reshape(k.shape[0], heads, -1).transpose(1, 0, 2)
        vh = v.reshape(v.shape[0], heads, -1).transpose(1, 0, 2)
        logits = jnp.einsum("hqc,hkc->hqk", qh, kh) / math.sqrt(qh.shape[-1])
        weights = masked_softmax(logits, key_valid)
        out = jnp.einsum("hqk,hkc->qhc", weights, vh).reshape(q.shape[0], -1)
        return self.out_proj(out)

    def attend_folded(self, q, k, v):
        """``self(q, k, v)`` for few queries over many keys, without projecting the keys.

        Each head's logit ``(q Wq + bq)_h . (k Wk + bk)_h`` is computed as
        ``k . (Wk_h (q Wq + bq)_h) + bk_h . (q Wq + bq)_h`` and the values as
        ``(sum_k w_k v_k) Wv_h + bv_h`` (softmax weights sum to one), so the
        [Nk, C] x [C, C / rate] key and value projections become products with
        ``heads * Nq`` columns: cheaper whenever ``heads * Nq < C / rate``. The
        result equals `__call__`'s to float32 rounding (sums in another order).

        Args:
          q: f32[Nq, C] queries; k, v: f32[Nk, C] keys and values (all valid).

        Returns:
          f32[Nq, C].
        """
        heads = self.num_heads
        qp = self.q_proj(q)
        nq, internal = qp.shape
        dh = internal // heads
        qh = qp.reshape(nq, heads, dh)
        k_kernel = self.k_proj.kernel.reshape(-1, heads, dh)  # [C, H, dh]
        folded = jnp.einsum("qhd,chd->hqc", qh, k_kernel)  # [H, Nq, C]
        offset = jnp.einsum("qhd,hd->hq", qh, self.k_proj.bias.reshape(heads, dh))
        logits = (jnp.einsum("hqc,kc->hqk", folded, k) + offset[..., None]) / math.sqrt(dh)
        weights = jax.nn.softmax(logits, axis=-1)
        mean_v = jnp.einsum("hqk,kc->hqc", weights, v)  # [H, Nq, C]
        out = (jnp.einsum("hqc,chd->qhd", mean_v, self.v_proj.kernel.reshape(-1, heads, dh))
               + self.v_proj.bias.reshape(heads, dh))
        return self.out_proj(out.reshape(nq, internal))


class TwoWayAttentionBlock(nn.Module):
    """One two-way block; params ``self_attn``, ``norm1..4``, ``cross_attn_token_to_image``,
    ``mlp/{lin1,lin2}``, ``cross_attn_image_to_token``."""

    embedding_dim: int
    num_heads: int
    mlp_dim: int = 2048
    attention_downsample_rate: int = 2
    skip_first_layer_pe: bool = False
    norm_eps: float = 1e-5

    def setup(self):
        c = self.embedding_dim
        self.self_attn = Attention(c, self.num_heads)
        self.norm1 = layer_norm(self.norm_eps)
        self.cross_attn_token_to_image = Attention(c, self.num_heads,
                                                   self.attention_downsample_rate)
        self.norm2 = layer_norm(self.norm_eps)
        self.mlp = MLPBlock(c, self.mlp_dim, activation="relu")
        self.norm3 = layer_norm(self.norm_eps)
        self.norm4 = layer_norm(self.norm_eps)
        self.cross_attn_image_to_token = Attention(c, self.num_heads,
                                                   self.attention_downsample_rate)

    def __call__(self, queries, keys, query_pe, key_pe, token_valid=None,
                 keys_dense: LowRankDense | None = None):
        """One block.

        Args:
          queries: f32[T, C] tokens; query_pe: f32[T, C] (the initial tokens).
          keys: f32[HW, C] image tokens; key_pe: f32[HW, C].
          token_valid: bool[T] or None.
          keys_dense: if given, the image side is ``keys + keys_dense`` (only
            the first block uses this form).

        Returns:
          (queries f32[T, C], keys f32[HW, C]).
        """
        if self.skip_first_layer_pe:
            queries = self.self_attn(queries, queries, queries, token_valid)
        else:
            q = queries + query_pe
            queries = queries + self.self_attn(q, q, queries, token_valid)
        queries = self.norm1(queries)

        q = queries + query_pe
        k = keys + key_pe
        queries = queries + self.cross_attn_token_to_image(q, k, keys, k_extra=keys_dense,
                                                           v_extra=keys_dense)
        queries = self.norm2(queries)

        queries = self.norm3(queries + self.mlp(queries))

        q = queries + query_pe
        attn = self.cross_attn_image_to_token(k, q, queries, token_valid, q_extra=keys_dense)
        if keys_dense is not None:
            keys = keys + keys_dense.materialize()
        keys = self.norm4(keys + attn)
        return queries, keys


class TwoWayTransformer(nn.Module):
    """Params ``layers_{i}/...``, ``final_attn_token_to_image``, ``norm_final_attn``.

    ``num_read_tokens`` (optional): only the first n tokens are read after the
    transformer (the decoder's output tokens); the final token->image attention
    then runs for them alone in the folded form (`Attention.attend_folded`),
    and the transformer returns those n tokens.
    """

    depth: int = 2
    embedding_dim: int = 256
    num_heads: int = 8
    mlp_dim: int = 2048
    attention_downsample_rate: int = 2
    norm_eps: float = 1e-5
    num_read_tokens: int | None = None

    def setup(self):
        self.layers = [
            TwoWayAttentionBlock(self.embedding_dim, self.num_heads, self.mlp_dim,
                                 self.attention_downsample_rate, skip_first_layer_pe=(i == 0),
                                 norm_eps=self.norm_eps)
            for i in range(self.depth)
        ]
        self.final_attn_token_to_image = Attention(self.embedding_dim, self.num_heads,
                                                   self.attention_downsample_rate)
        self.norm_final_attn = layer_norm(self.norm_eps)

    def __call__(self, image_embedding, image_pe, tokens, token_valid=None,
                 dense: LowRankDense | None = None):
        """Runs the transformer.

        Args:
          image_embedding: f32[HW, C] image tokens (without the dense prompt).
          image_pe: f32[HW, C].
          tokens: f32[T, C] output + prompt tokens (also their PE).
          token_valid: bool[T] or None.
          dense: the dense prompt embedding with factors f32[HW, R], or None.

        Returns:
          (tokens f32[T, C] (f32[num_read_tokens, C] when set), image tokens f32[HW, C]).
        """
        queries, keys = tokens, image_embedding
        pending = dense
        for layer in self.layers:
            queries, keys = layer(queries, keys, tokens, image_pe, token_valid, pending)
            pending = None
        if pending is not None:
            keys = keys + pending.materialize()
        if self.num_read_tokens is None:
            attn = self.final_attn_token_to_image(queries + tokens, keys + image_pe, keys)
        else:
            n = self.num_read_tokens
            if n > tokens.shape[0]:
                raise ValueError(f"num_read_tokens {n} exceeds the {tokens.shape[0]} tokens")
            queries, tokens = queries[:n], tokens[:n]
            attn = self.final_attn_token_to_image.attend_folded(queries + tokens,
                                                                keys + image_pe, keys)
        queries = self.norm_final_attn(queries + attn)
        return queries, keys
