"""Deterministic synthetic images with exact object masks, of graded difficulty.

Used to train the small embedded demonstration SAM-architecture model and as
the always-available data of the demo command and of tests. Pure NumPy,
host-side. Sample ``i`` is a pure function of ``(seed, i)`` and the
configuration, so a training loop can draw any sample directly.

Two axes of difficulty:
  * object **family** (`FAMILIES`, intrinsic difficulty `FAMILY_DIFFICULTY`):
    convex, thin (2-6 px strokes), ring (holes), multi_part (2-4 disjoint
    parts), non_convex (stars, C-shapes, crosses), border (cut by the image
    border), small (< 2 % of the image); contracts in `families`;
  * **scene difficulty** (`DIFFICULTIES`: easy, medium, hard): object/background
    contrast, background kind (flat, gradient, smooth noise, stripes, checker,
    multi-scale noise), object paint (flat, gradient, texture), distractors of
    similar appearance that are not part of the mask, pixel noise; see `scenes`.

Masks are exact: the set of pixel centres ``(c + 0.5, r + 0.5)`` inside the
shape; the image is painted with anti-aliased coverage that is ``>= 0.5``
exactly on the mask (`geometry.rasterize`).

Entry points: `synthetic_sample`, `synthetic_samples`, `synthetic_instances`,
`synthetic_instance_refs`, `write_synthetic_folder` (images/ + masks/ for the
datasets ``folder`` kind), `gt_tight_box`, `preview_grid`; `render_sample`
renders one ``(seed, index, family, difficulty, size)`` directly.
"""

from jaxseg_robust.data.synthetic.dataset import (
    DATASET_NAME,
    DEFAULT_SEED,
    DEMO_SIZES,
    GENERATOR_VERSION,
    TRAIN_SIZES,
    SyntheticConfig,
    sample_record,
    synthetic_instance_refs,
    synthetic_instances,
    synthetic_sample,
    synthetic_samples,
    write_synthetic_folder,
)
from jaxseg_robust.data.synthetic.families import FAMILIES, FAMILY_DIFFICULTY, FAMILY_SHAPES, GenerationError
from jaxseg_robust.data.synthetic.preview import preview_grid
from jaxseg_robust.data.synthetic.prompts import gt_tight_box
from jaxseg_robust.data.synthetic.scenes import DIFFICULTIES, LEVELS, SyntheticSample, measured_contrast, render_sample

__all__ = [
    "DATASET_NAME", "DEFAULT_SEED", "DEMO_SIZES", "DIFFICULTIES", "FAMILIES", "FAMILY_DIFFICULTY", "FAMILY_SHAPES",
    "GENERATOR_VERSION", "LEVELS", "TRAIN_SIZES", "GenerationError", "SyntheticConfig", "SyntheticSample",
    "gt_tight_box", "measured_contrast", "preview_grid", "render_sample", "sample_record",
    "synthetic_instance_refs", "synthetic_instances", "synthetic_sample", "synthetic_samples",
    "write_synthetic_folder",
]
