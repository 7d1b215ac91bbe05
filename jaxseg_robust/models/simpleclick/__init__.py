"""SimpleClick / CFR-ICL (plain-ViT click-map models): config, ViT, network. See docs/models/click_models.md."""
