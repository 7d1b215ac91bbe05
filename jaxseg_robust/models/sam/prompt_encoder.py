"""SAM's prompt encoder with fixed-shape, masked prompt slots.

Behaviour matched to ``segment_anything.modeling.prompt_encoder``:
  * random Fourier position encoding: coordinates in the model frame get
    +0.5 (pixel centres), are divided by the padded input size (x by its
    width, y by its height; 1024), mapped to [-1, 1], multiplied by a
    Gaussian matrix f32[2, C/2] and 2*pi, then ``[sin, cos]``;
  * point tokens: PE + ``point_embeddings[label]`` (0 negative, 1 positive);
    a padding point is ``not_a_point_embed`` with no PE;
  * box: two corner tokens, PE + ``point_embeddings[2]`` / ``[3]``;
  * SAM appends one padding point when points are given without a box; it
    is a real token the decoder attends to;
  * mask input: conv2x2/2 -> LN2d(1e-6) -> GELU -> conv2x2/2 -> LN2d(1e-6)
    -> GELU -> conv1x1; without a mask, ``no_mask_embed`` at every pixel.

Fixed-shape layout used here (one compiled function for every prompt mix):
``N`` point slots, then the padding point, then the two box corners
(``N + 3`` sparse tokens) with a validity mask:
  * point slot i is valid iff ``labels[i] != -1``;
  * the padding point is valid iff some point is valid and there is no box;
  * the corners are valid iff ``has_box``.
Invalid tokens are masked out of attention in the decoder, so the result
equals the reference run on exactly the valid prompts (token order does not
matter to attention). Invalid tokens hold finite values with no gradient
path to the coordinates.
"""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

from jaxseg_robust.models.sam.layers import Linear, LowRankDense, gelu, layer_norm


class PositionEmbeddingRandom(nn.Module):
    """Random-Fourier position encoding; param ``positional_encoding_gaussian_matrix`` f32[2, F]."""

    num_pos_feats: int = 128
    scale: float = 1.0

    def setup(self):
        self.gaussian = self.param("positional_encoding_gaussian_matrix",
                                   nn.initializers.normal(self.scale), (2, self.num_pos_feats))

    def encode(self, coords01: jnp.ndarray) -> jnp.ndarray:
        """f32[..., 2] (x, y) in [0, 1] -> f32[..., 2F] ``[sin, cos]`` features."""
        c = 2.0 * coords01 - 1.0
        c = c @ self.gaussian
        c = (2 * np.pi) * c
        return jnp.concatenate([jnp.sin(c), jnp.cos(c)], axis=-1)

    def dense(self, hw: tuple[int, int]) -> jnp.ndarray:
        """f32[h, w, 2F] encoding of the pixel centres of an h x w grid."""
        h, w = hw
        y = (jnp.arange(h, dtype=jnp.float32) + 0.5) / h
        x = (jnp.arange(w, dtype=jnp.float32) + 0.5) / w
        grid = jnp.stack(jnp.broadcast_arrays(x[None, :], y[:, None]), axis=-1)
        return self.encode(grid)

    def with_coords(self, coords: jnp.ndarray, image_hw: tuple[int, int]) -> jnp.ndarray:
        """f32[..., 2] (x, y) model-frame coordinates (already +0.5) -> f32[..., 2F]."""
        size = jnp.asarray([image_hw[1], image_hw[0]], jnp.float32)
        return self.encode(coords.astype(jnp.float32) / size)


class MaskDownscaling(nn.Module):
    """Mask input f32[4E, 4E] -> rank-``mask_in_chans`` factors f32[E, E, mask_in_chans].

    The last 1x1 conv (``proj``) is kept apart: the dense embedding is
    ``factors @ proj.kernel + proj.bias`` (see `LowRankDense`).
    """

    mask_in_chans: int = 16
    embed_dim: int = 256
    eps: float = 1e-6

    def setup(self):
        c = self.mask_in_chans
        self.conv1 = nn.Conv(c // 4, (2, 2), strides=(2, 2), padding="VALID")
        self.norm1 = layer_norm(self.eps)
        self.conv2 = nn.Conv(c, (2, 2), strides=(2, 2), padding="VALID")
        self.norm2 = layer_norm(self.eps)
        self.proj = Linear(c, self.embed_dim)

    def factors(self, mask: jnp.ndarray) -> jnp.ndarray:
        """f32[4E, 4E] -> f32[E, E, mask_in_chans] (everything but the last 1x1 conv)."""
        x = mask[..., None].astype(jnp.float32)
        x = gelu(self.norm1(self.conv1(x)))
        return gelu(self.norm2(self.conv2(x)))

    def __call__(self, mask: jnp.ndarray) -> jnp.ndarray:
        """f32[4E, 4E] -> f32[E, E, embed_dim] (the full reference computation)."""
        return self.proj(self.factors(mask))


class PromptEncoder(nn.Module):
    """Encodes one padded prompt set into sparse tokens, their validity and a dense embedding.

    Params: ``pe_layer/positional_encoding_gaussian_matrix``,
    ``point_embeddings_{0..3}`` f32[1, C], ``not_a_point_embed`` f32[1, C],
    ``mask_downscaling/{conv1,norm1,conv2,norm2,proj}``, ``no_mask_embed`` f32[1, C].
    """

    embed_dim: int = 256
    image_embedding_size: tuple[int, int] = (64, 64)
    input_image_size: tuple[int, int] = (1024, 1024)
    mask_in_chans: int = 16

    def setup(self):
        c = self.embed_dim
        normal = nn.initializers.normal(1.0)  # torch nn.Embedding init
        self.pe_layer = PositionEmbeddingRandom(c // 2)
        self.point_embeddings = [self.param(f"point_embeddings_{i}", normal, (1, c))
                                 for i in range(4)]
        self.not_a_point_embed = self.param("not_a_point_embed", normal, (1, c))
        self.mask_downscaling = MaskDownscaling(self.mask_in_chans, c)
        self.no_mask_embed = self.param("no_mask_embed", normal, (1, c))

    def dense_pe(self) -> jnp.ndarray:
        """f32[E, E, C] position encoding of the image-embedding grid (``get_dense_pe``)."""
        return self.pe_layer.dense(self.image_embedding_size)

    def embed_points(self, points: jnp.ndarray, labels: jnp.ndarray) -> jnp.ndarray:
        """Point tokens as the reference builds them (label -1 -> ``not_a_point_embed``).

        Args:
          points: f32[N, 2] (x, y) in the model frame (before the +0.5 shift).
          labels: i32[N] in {-1, 0, 1}.

        Returns:
          f32[N, C].
        """
        pe = self.pe_layer.with_coords(points + 0.5, self.input_image_size)
        labels = labels[:, None]
        emb = jnp.where(labels == 1, pe + self.point_embeddings[1],
                        jnp.where(labels == 0, pe + self.point_embeddings[0],
                                  jnp.broadcast_to(self.not_a_point_embed, pe.shape)))
        return emb

    def embed_box(self, box: jnp.ndarray) -> jnp.ndarray:
        """f32[4] (x1, y1, x2, y2) model frame -> f32[2, C] corner tokens."""
        corners = box.reshape(2, 2) + 0.5
        pe = self.pe_layer.with_coords(corners, self.input_image_size)
        return pe + jnp.concatenate([self.point_embeddings[2], self.point_embeddings[3]], axis=0)

    def embed_mask(self, mask_logits: jnp.ndarray, has_mask: jnp.ndarray) -> LowRankDense:
        """Dense embedding f32[E, E, C] in low-rank form.

        Args:
          mask_logits: f32[4E, 4E] previous low-res logits.
          has_mask: bool[]; without a mask the embedding is ``no_mask_embed``
            at every pixel (factors zero).
        """
        factors = self.mask_downscaling.factors(mask_logits)
        proj = self.mask_downscaling.proj
        return LowRankDense(
            factors=jnp.where(has_mask, factors, jnp.zeros_like(factors)),
            weight=proj.kernel,
            bias=jnp.where(has_mask, proj.bias, self.no_mask_embed[0]),
        )

    def __call__(self, points, labels, box, has_box, mask_logits, has_mask):
        """Encodes one padded prompt set (all coordinates in the model frame).

        Args:
          points: f32[N, 2] (x, y); labels: i32[N] (1, 0, or -1 = unused slot).
          box: f32[4] (x1, y1, x2, y2); has_box: bool[].
          mask_logits: f32[4E, 4E]; has_mask: bool[].

        Returns:
          (sparse f32[N + 3, C], valid bool[N + 3], dense `LowRankDense` [E, E]).
        """
        labels = labels.astype(jnp.int32)
        point_valid = labels != -1
        has_box = jnp.asarray(has_box, bool)
        has_mask = jnp.asarray(has_mask, bool)
        # Unused inputs are replaced before use (double-where), so even
        # non-finite values there give finite outputs and zero gradients.
        points = jnp.where(point_valid[:, None], points, 0.0)
        box = jnp.where(has_box, box, 0.0)
        mask_logits = jnp.where(has_mask, mask_logits, 0.0)
        point_tokens = self.embed_points(points, jnp.where(point_valid, labels, -1))
        pad_valid = jnp.any(point_valid) & ~has_box
        box_tokens = self.embed_box(box)
        sparse = jnp.concatenate([point_tokens, self.not_a_point_embed, box_tokens], axis=0)
        valid = jnp.concatenate([point_valid, pad_valid[None], jnp.stack([has_box, has_box])])
        # Keep invalid tokens finite and cut their gradient path to the coordinates.
        sparse = jnp.where(valid[:, None], sparse, jnp.broadcast_to(self.not_a_point_embed,
                                                                     sparse.shape))
        dense = self.embed_mask(mask_logits, has_mask)
        return sparse, valid, dense
