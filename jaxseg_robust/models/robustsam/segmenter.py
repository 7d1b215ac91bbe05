"""`RobustSamSegmenter`: RobustSAM behind the Segmenter protocol (docs/models/robustsam.md).

A `SamSegmenter` whose mask decoder is `RobustMaskDecoder`; everything the
protocols see (preprocessing, prompt frames, multimask selection by predicted
IoU, the low-res feedback map, ``resized_logits``) is SAM's, as the BREPS
wrapper (``ISModelRobustSAM``, a subclass of its ``ISModelSAM``) uses RobustSAM
through its ``SamPredictor``. Differences, from ``config.decoder_path``:

  * "clear" (the zoo's models; ``SamPredictor.predict_torch``'s default):
    ``embed`` and ``decode`` compute SAM's outputs with RobustSAM's weights;
  * "robust" (``clear=False``): ``embed`` also runs the decoder's two
    prompt-independent Fourier feature blocks on the ViT's first
    global-attention block output and on the image embedding, once per image,
    and keeps their sum (``SamFeatures.interm_embeddings = (f32[4E, 4E, C/8],)``,
    `RobustMaskDecoder.encoder_features`); the decoder reads the robust output
    tokens and those features.

``decode`` stays pure, vmappable and differentiable in the prompt coordinates
on both paths.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp

from jaxseg_robust.models.base import FamilyRules, Transform
from jaxseg_robust.models.robustsam.config import RobustSamConfig
from jaxseg_robust.models.robustsam.mask_decoder import RobustMaskDecoder
from jaxseg_robust.models.sam.segmenter import SamFeatures, SamSegmenter, check_image_embeddings
from jaxseg_robust.prompts.types import Prompts


@dataclasses.dataclass(frozen=True)
class RobustSamSegmenter(SamSegmenter):
    """RobustSAM segmenter (static configuration; weights are passed as ``params``).

    Attributes:
      config: a `RobustSamConfig` (its ``decoder_path`` picks the output).
      image_resize: as `SamSegmenter`.
    """

    config: RobustSamConfig
    image_resize: str = "float"
    # the SAM family's rules under RobustSAM's name: the BREPS wrapper is ISModelSAM's
    rules: ClassVar[FamilyRules] = FamilyRules(family="robustsam", resized_frame=True)

    def __post_init__(self):
        super().__post_init__()
        if not isinstance(self.config, RobustSamConfig):
            raise ValueError(f"RobustSamSegmenter needs a RobustSamConfig; got "
                             f"{type(self.config).__name__}")

    @property
    def mask_decoder(self) -> RobustMaskDecoder:
        """The linen RobustSAM mask decoder on ``config.decoder_path``."""
        cfg = self.config
        return RobustMaskDecoder(cfg.prompt_embed_dim, cfg.decoder, vit_dim=cfg.vit_dim,
                                 robust=cfg.robust)

    def _decoder_extra_inputs(self) -> tuple:
        """A dummy early feature f32[E, E, D] (`RobustMaskDecoder.every_output` takes it at init)."""
        e = self.config.embedding_size
        return (jnp.zeros((e, e, self.config.vit_dim)),)

    def _init_mask_decoder(self, key, *args) -> dict:
        """Every decoder parameter, both paths' (`RobustMaskDecoder.every_output`)."""
        return self.mask_decoder.init(key, *args, method=RobustMaskDecoder.every_output)["params"]

    def embed(self, params, model_input: jnp.ndarray) -> SamFeatures:
        """f32[S, S, 3] (or [B, S, S, 3]) -> `SamFeatures`, batched alike.

        Returns:
          SamFeatures(image_embeddings f32[(B,) E, E, C]); on the robust path also
          ``interm_embeddings=(f32[(B,) 4E, 4E, C/8],)``, the robust encoder
          features (`RobustMaskDecoder.encoder_features` of the first
          global-attention block output and the image embedding).
        """
        if not self.config.robust:
            return super().embed(params, model_input)
        x, single = self._batched_input(model_input)
        emb, interm = self.encode_image(params, x, collect_interm=True)
        decoder = {"params": params["mask_decoder"]}
        robust = jax.vmap(lambda e, f: self.mask_decoder.apply(
            decoder, e, f, method=RobustMaskDecoder.encoder_features))(emb, interm[0])
        if single:
            emb, robust = emb[0], robust[0]
        return SamFeatures(image_embeddings=emb, interm_embeddings=(robust,))

    def _robust_features(self, features: SamFeatures) -> jnp.ndarray | None:
        """The robust encoder features of one image on the robust path (ValueError if absent), else None."""
        if not self.config.robust:
            return None
        cfg = self.config
        want = (cfg.low_res_size, cfg.low_res_size, cfg.prompt_embed_dim // 8)
        interm = features.interm_embeddings
        if not interm or tuple(interm[0].shape) != want:
            got = [tuple(a.shape) for a in interm] if interm else "nothing"
            raise ValueError(f"features.interm_embeddings must hold the robust encoder features "
                             f"{list(want)} of one image (make features with "
                             f"RobustSamSegmenter.embed; vmap over batches); got {got}")
        return interm[0]

    def decode_low_res(self, params, features: SamFeatures, prompts: Prompts,
                       transform: Transform):
        """All K mask candidates at low resolution for one prompt set.

        Args: as `SamSegmenter.decode_low_res`; ``features`` from `embed`.

        Returns:
          (low_res f32[K, 4E, 4E] logits, iou f32[K]); candidate 0 is the
          single-mask output, as SAM's.
        """
        emb = check_image_embeddings(features.image_embeddings, self.config)
        robust = self._robust_features(features)
        sparse, valid, dense = self.encode_prompts(params, prompts, transform)
        return self.mask_decoder.apply({"params": params["mask_decoder"]}, emb,
                                       self.dense_pe(params), sparse, valid, dense, robust)


__all__ = ["RobustSamSegmenter"]
