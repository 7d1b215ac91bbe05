"""jaxseg_robust.models."""
