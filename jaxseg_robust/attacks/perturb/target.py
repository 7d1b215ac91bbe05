"""The model the battery attacks: a converted dense model, or a SAM-family model with fixed prompts.

docs/protocols/perturbation.md, "Models". A dense directory is loaded by the zoo's one dense loader
(`jaxseg_robust.models.zoo.load_dense`); a SAM-family zoo name or directory by `zoo.load_params` (or
random weights) and wrapped as a `jaxseg_robust.models.dense.prompted.PromptedSegmenter` (one tight GT
box per image).
"""

from __future__ import annotations

import os
import pathlib
from typing import Any, NamedTuple

import jax

from jaxseg_robust.models import zoo
from jaxseg_robust.models.base import family_rules
from jaxseg_robust.models.dense.prompted import PromptedSegmenter
from jaxseg_robust.runner.fingerprints import fingerprint_params


class Target(NamedTuple):
    """The attacked model: ``model.apply(params, images) -> logits`` plus what the run records.

    Attributes:
      description: model name / dir and kind, for the manifest.
      model: a `DenseModel` (``PromptedSegmenter`` for SAM-family models).
      params: parameters (for SAM-family models, the segmenter's; prompts are added per batch).
      prompted: True for SAM-family models (params need per-image prompts).
      fingerprint: of the parameters.
    """

    description: dict
    model: Any
    params: Any
    prompted: bool
    fingerprint: str


def load_dense_target(path: pathlib.Path) -> Target:
    """A converted dense directory as a `Target` (variables placed on the default device)."""
    model, variables = zoo.load_dense(path)
    params = jax.device_put(variables)  # a transfer; jnp.asarray would compile one program per leaf shape
    description = {"model": str(path.resolve()), "kind": "dense", "family": zoo.family_of_directory(path)}
    return Target(description, model, params, False, fingerprint_params(params))


def load_target(name_or_dir: str, *, random_seed: int | None = None, multimask_output: bool = True,
                compute_dtype: str | None = None) -> Target:
    """Loads ``--model``: a converted dense directory, or a SAM-family zoo name / directory.

    Args:
      random_seed: ``--random-weights`` (old spelling ``--random-init``): seeded random weights of a zoo name.
      multimask_output: SAM-family: the best of 3 candidates (True) or the single-mask output.
      compute_dtype: SAM-family image-encoder dtype (``--compute-dtype``).

    Raises:
      ValueError: unknown name, random weights for something other than a zoo name, a compute
        dtype for a dense model.
      FileNotFoundError / jaxseg_robust.models.store.StoreError: missing or damaged weights.
    """
    path = pathlib.Path(os.path.expanduser(name_or_dir))
    if random_seed is not None:
        if path.is_dir() or name_or_dir not in zoo.known_names():
            raise ValueError(f"--random-weights needs a zoo name ({', '.join(zoo.known_names())}), "
                             f"got {name_or_dir!r}")
        segmenter = zoo.segmenter(name_or_dir, compute_dtype=compute_dtype)
        params = segmenter.init(jax.random.key(random_seed))
        weights = "random-init" if random_seed == 0 else f"random-init:{random_seed}"
        description = {"model": name_or_dir, "kind": "prompted", "weights": weights}
    elif zoo.holds_dense(path):
        if compute_dtype is not None:
            raise ValueError("--compute-dtype applies to SAM-family models, not to a dense model")
        return load_dense_target(path)
    else:
        segmenter, params, meta = zoo.load_params(name_or_dir, compute_dtype=compute_dtype)
        description = {"model": name_or_dir, "kind": "prompted", "family": meta["family"]}
    refuse_other_frames(segmenter, name_or_dir)
    model = PromptedSegmenter(segmenter, multimask_output=multimask_output)
    description.update(prompt="tight GT box", multimask_output=multimask_output)
    return Target(description, model, params, True, fingerprint_params(params))


def refuse_other_frames(segmenter, name: str) -> None:
    """Raises ValueError unless ``segmenter``'s family takes boxes in SAM's image frame.

    `PromptedSegmenter` prompts with the tight GT box and runs SAM's image path
    (longest side resized, padded to a square): the families whose rules declare
    ``accepts_boxes`` and ``resized_frame`` (`jaxseg_robust.models.base.FamilyRules`:
    SAM, MobileSAM, SAM-HQ, RobustSAM). Click-map models have no box input; SAM 2
    / HQ-SAM 2 / SAM 3 resize to their square without keeping the aspect ratio.
    """
    rules = family_rules(segmenter)
    if not rules.accepts_boxes:
        raise ValueError(f"{name}: the perturbation battery prompts with the tight ground-truth box and the "
                         f"{rules.family} family takes clicks only")
    if not rules.resized_frame:
        raise ValueError(f"{name}: the perturbation battery's tight-box target runs SAM's image frame "
                         f"(longest side resized, padded to a square), which the {rules.family} family does "
                         "not use; use SAM, MobileSAM, SAM-HQ or RobustSAM")
