"""Attacks on segmentation models: prompt attacks and image-perturbation attacks (perturb/)."""
