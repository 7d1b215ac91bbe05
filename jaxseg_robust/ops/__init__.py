"""jaxseg_robust.ops."""
