"""GPCIS (CVPR 2023): a DeepLabV3+ ResNet-50 click-map network with a Gaussian-process head (docs/models/gpcis.md)."""
