"""jaxseg_robust.prompts."""
