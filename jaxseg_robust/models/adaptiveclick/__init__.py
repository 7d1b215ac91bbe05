"""AdaptiveClick (ViT + SimpleFPN + Mask2Former-style click-aware decoder): docs/models/adaptiveclick.md."""
