"""RITM (HRNet + OCR click-map models): config, HRNet backbone, network. See docs/models/click_models.md."""
