"""jaxseg_robust: JAX-native robustness evaluation for segmentation models."""

__version__ = "0.1.0"
