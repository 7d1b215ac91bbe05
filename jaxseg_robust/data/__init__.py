"""jaxseg_robust.data."""
