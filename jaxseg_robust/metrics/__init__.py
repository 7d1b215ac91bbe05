"""jaxseg_robust.metrics."""
