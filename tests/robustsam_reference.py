"""The authors' RobustSAM code, for parity tests (``$JAXSEG_ROBUSTSAM_REPO``).

``JAXSEG_ROBUSTSAM_REPO`` names a checkout of robustsam/RobustSAM (the folder
holding ``robust_segment_anything/``); `import_reference` puts it on
``sys.path`` and imports the package (its ``eval.py`` / training code is not
needed). Nothing of it is copied into this repository.

`build_reference(config, seed)` builds the reference ``Sam`` for one of our
`RobustSamConfig`s from the reference modules (for ViT-B/L/H exactly what its
``build_sam_vit_{b,l,h}`` builds; tests/test_robustsam_parity.py checks the
state-dict layout against those builders), overwrites every float tensor with
seeded random values of a sensible scale and puts it in eval mode.

`reference_decode` is the reference predictor's decoder call
(``SamPredictor.predict_torch``) with the decoder path made explicit: the
predictor always passes ``clear=True``; the authors' ``Sam.predict`` passes
``clear=False``.
"""

from __future__ import annotations

import functools
import importlib
import os
import pathlib
import sys
import warnings

import numpy as np

REPO_ENV = "JAXSEG_ROBUSTSAM_REPO"
PACKAGE = "robust_segment_anything"
EMBEDDING_NAMES = ("iou_token.weight", "mask_tokens.weight", "custom_robust_token.weight",
                   "point_embeddings", "not_a_point_embed.weight", "no_mask_embed.weight",
                   "positional_encoding_gaussian_matrix")


def repo_path() -> pathlib.Path | None:
    """The RobustSAM checkout named by ``$JAXSEG_ROBUSTSAM_REPO``, or None when not configured."""
    value = os.environ.get(REPO_ENV, "")
    if not value:
        return None
    path = pathlib.Path(value).expanduser()
    return path if (path / PACKAGE).is_dir() else None


def import_reference():
    """The reference package ``robust_segment_anything`` from the checkout."""
    path = repo_path()
    if path is None:
        raise RuntimeError(f"${REPO_ENV} does not point to a RobustSAM checkout")
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return importlib.import_module(PACKAGE)


def reference_model(pkg, config):
    """The reference ``Sam`` for a `RobustSamConfig` (ViT encoder), built from its modules."""
    import torch  # noqa: PLC0415

    modeling = pkg.modeling
    enc, dec, c = config.encoder, config.decoder, config.prompt_embed_dim
    image_encoder = modeling.ImageEncoderViT(
        depth=enc.depth, embed_dim=enc.embed_dim, img_size=config.image_size, mlp_ratio=enc.mlp_ratio,
        norm_layer=functools.partial(torch.nn.LayerNorm, eps=1e-6), num_heads=enc.num_heads,
        patch_size=enc.patch_size, qkv_bias=True, use_rel_pos=True,
        global_attn_indexes=list(enc.global_attn_indexes), window_size=enc.window_size, out_chans=c)
    prompt_encoder = modeling.PromptEncoder(
        embed_dim=c, image_embedding_size=(config.embedding_size, config.embedding_size),
        input_image_size=(config.image_size, config.image_size), mask_in_chans=config.mask_in_chans)
    transformer = modeling.TwoWayTransformer(depth=dec.transformer_depth, embedding_dim=c,
                                             mlp_dim=dec.transformer_mlp_dim,
                                             num_heads=dec.transformer_num_heads)
    mask_decoder = modeling.MaskDecoder(
        opt=None, num_multimask_outputs=dec.num_multimask_outputs, transformer=transformer,
        transformer_dim=c, iou_head_depth=dec.iou_head_depth,
        iou_head_hidden_dim=dec.iou_head_hidden_dim, vit_dim=enc.embed_dim)
    return modeling.Sam(image_encoder=image_encoder, prompt_encoder=prompt_encoder,
                        mask_decoder=mask_decoder, pixel_mean=list(config.pixel_mean),
                        pixel_std=list(config.pixel_std))


def randomize_(model, seed: int) -> None:
    """Seeded values of a sensible scale for every float tensor of the reference model.

    Token and prompt embeddings N(0, 1); ``pos_embed`` / ``rel_pos_*`` 0.2 N(0, 1);
    weights with >= 2 axes N(0, 1 / fan_in) (ConvTranspose2d: fan_in = input
    channels, the first axis); 1-D weights (norm scales) 1 + 0.1 N(0, 1);
    BatchNorm running variances U(0.5, 1.5); biases and running means 0.1 N(0, 1).
    Integer buffers (BatchNorm counters) are left alone.
    """
    import torch  # noqa: PLC0415

    transposed = {name for name, mod in model.named_modules()
                  if isinstance(mod, torch.nn.ConvTranspose2d)}
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, t in model.state_dict().items():
            if not t.is_floating_point():
                continue
            if name.endswith("running_var"):
                t.copy_(0.5 + torch.rand(t.shape, generator=gen))
                continue
            noise = torch.randn(t.shape, generator=gen)
            module = name.rsplit(".", 1)[0]
            if any(k in name for k in EMBEDDING_NAMES):
                t.copy_(noise)
            elif name.endswith(("pos_embed", "rel_pos_h", "rel_pos_w")):
                t.copy_(0.2 * noise)
            elif t.ndim >= 2:
                fan_in = t.shape[0] if module in transposed else t[0].numel()
                t.copy_(noise / np.sqrt(fan_in))
            elif name.endswith("weight"):
                t.copy_(1.0 + 0.1 * noise)
            else:
                t.copy_(0.1 * noise)


def build_reference(config, seed: int):
    """(package, randomised reference model in eval mode) for a `RobustSamConfig`."""
    pkg = import_reference()
    model = reference_model(pkg, config)
    randomize_(model, seed)
    model.eval()
    return pkg, model


def reference_decode(model, predictor, *, coords=None, labels=None, boxes=None, mask_input=None,
                     multimask_output: bool, clear: bool):
    """``SamPredictor.predict_torch`` with ``clear`` passed to the decoder (prompts in the resized frame).

    Returns:
      (masks [1, C', H, W] logits at the original size, iou [1, C], low-res [1, C', 4E, 4E]);
      C' = C except on the robust path with ``multimask_output``, where the
      reference returns K x K - 1 channels (see docs/models/robustsam.md).
    """
    points = None if coords is None else (coords, labels)
    sparse, dense = model.prompt_encoder(points=points, boxes=boxes, masks=mask_input)
    low, iou, _, _ = model.mask_decoder(
        image_embeddings=predictor.features[0], image_pe=model.prompt_encoder.get_dense_pe(),
        sparse_prompt_embeddings=sparse, dense_prompt_embeddings=dense,
        encoder_features=predictor.features[1][0].unsqueeze(0), multimask_output=multimask_output,
        clear=clear)
    masks = model.postprocess_masks(low, predictor.input_size, predictor.original_size)
    return masks, iou, low


__all__ = ["REPO_ENV", "build_reference", "import_reference", "randomize_", "reference_decode",
           "reference_model", "repo_path"]
