"""jaxseg_robust.models.sam."""
