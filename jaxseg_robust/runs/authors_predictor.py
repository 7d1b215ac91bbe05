"""Whether a click-map model runs under the authors' isegm predictor, chosen for a run's datasets.

RClicks and TETRIS run RITM / SimpleClick / CFR-ICL through the authors'
predictor (zoom-in, flip, CFR-ICL's cascade) unless the spec's ``isegm`` is
"off". Which options a family gets is the model's own choice
(`jaxseg_robust.models.base.with_predictor`; the click-map models read their
family, CFR-ICL included, from the converted model's config); this module maps
the setting and the run's datasets (DAVIS zooms larger, one size per run) onto
it (docs/models/click_models.md, docs/protocols/rclicks.md §5.5,
docs/protocols/tetris.md "Families"). Other families pass through unchanged.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from jaxseg_robust.models.base import family_rules, predictor_view, with_predictor
from jaxseg_robust.runs.loading import LoadedModel
from jaxseg_robust.runs.spec import RunError

ISEGM_CHOICES = ("authors", "off")


def with_authors_predictor(model: LoadedModel, instances: Sequence, isegm: str, options_of: str,
                           protocol: str) -> tuple[LoadedModel, dict | None]:
    """``model`` with the authors' predictor for a click-map model, and its settings.

    Args:
      model: the loaded model; instances: the run's instances (their datasets pick the zoom size).
      isegm: "authors" or "off".
      options_of: whose authors' options, a protocol: "tetris" (docs/protocols/tetris.md "Families") or
        "rclicks" (docs/protocols/rclicks.md §5.5), for the family the model declares
        (`FamilyRules.family`, CFR-ICL included).
      protocol: the protocol's name in the error message.

    Returns:
      (the `LoadedModel`, JSON-able options or None when the family has no authors' predictor or
      ``isegm`` is "off").

    Raises:
      RunError: the datasets need different zoom sizes (DAVIS with others).
    """
    if not family_rules(model.segmenter).authors_predictor:
        return model, None
    without = with_predictor(model.segmenter, False)
    if isegm == "off":
        return dataclasses.replace(model, segmenter=without), None
    davis = {instance.dataset.upper() == "DAVIS" for instance in instances}
    if len(davis) > 1:
        raise RunError(f"the {protocol} authors zoom DAVIS to a larger size than the other datasets (RITM 600 "
                       "vs 400, SimpleClick / CFR-ICL 672 vs 448) and one run has one size: evaluate DAVIS "
                       "in its own run directory (or set {isegm} off)")
    names = {instance.dataset.upper() for instance in instances}
    # the run's one dataset (GPCIS's RClicks options also read SBD and TETRIS), else DAVIS or none
    dataset = next(iter(names)) if len(names) == 1 else ("DAVIS" if True in davis else None)
    family = family_rules(model.segmenter).family
    segmenter = with_predictor(without, True, dataset, options_of)
    options = predictor_view(segmenter).options
    return dataclasses.replace(model, segmenter=segmenter), {"family": family, **dataclasses.asdict(options)}
