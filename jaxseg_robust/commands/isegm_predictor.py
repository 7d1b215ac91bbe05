"""Which of the authors' isegm predictors a click-map model runs under, chosen from the command's flags.

RClicks and TETRIS run RITM / SimpleClick / CFR-ICL through the authors'
predictor (zoom-in, flip, CFR-ICL's cascade) unless ``--isegm off``; the
family (CFR-ICL is a SimpleClick network whose checkpoint name says ICL) and
the datasets (DAVIS zooms larger) pick the options
(docs/models/click_models.md, docs/protocols/rclicks.md §5.5,
docs/protocols/tetris.md "Families"). SAM-family models pass through unchanged.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib

from jaxseg_robust.commands.flags import CommandError


def _isegm_family(args, model) -> str:
    """"cfr_icl" when ``--model`` or the converted checkpoint's file name says ICL, else the config's family."""
    names = [str(args.model)]
    config_file = pathlib.Path(model.source) / "config.json"
    if config_file.is_file():
        source = json.loads(config_file.read_text()).get("source") or {}
        names.append(str(source.get("path", "")))
    if any("icl" in pathlib.Path(name).name.lower() for name in names):
        return "cfr_icl"
    return model.segmenter.config.family


def with_authors_predictor(args, model, instances, options_of, command: str = "RClicks"):
    """``model`` with the authors' predictor for a click-map model, and its settings.

    Args:
      args: the parsed flags (``--isegm authors|off``, ``--model``).
      model: the `LoadedModel`; instances: the run's instances (their datasets pick the zoom size).
      options_of: ``(family, dataset) -> IsegmOptions``: `isegm.rclicks_options` for RClicks
        (docs/protocols/rclicks.md §5.5), `isegm.authors_options` for TETRIS
        (docs/protocols/tetris.md "Families").
      command: the protocol's name in the error message.

    Returns:
      (the `LoadedModel`, JSON-able options or None when the model is not a click-map
      model or ``--isegm off``).

    Raises:
      CommandError: the datasets need different zoom sizes (DAVIS with others).
    """
    segmenter = model.segmenter
    if args.isegm == "off" or not hasattr(segmenter, "evaluation"):
        if hasattr(segmenter, "evaluation") and segmenter.evaluation is not None:
            model = dataclasses.replace(model, segmenter=dataclasses.replace(segmenter, evaluation=None))
        return model, None
    davis = {instance.dataset.upper() == "DAVIS" for instance in instances}
    if len(davis) > 1:
        raise CommandError(f"the {command} authors zoom DAVIS to a larger size than the other datasets (RITM 600 "
                           "vs 400, SimpleClick / CFR-ICL 672 vs 448) and one run has one size: evaluate DAVIS "
                           "in its own --out (or pass --isegm off)")
    family = _isegm_family(args, model)
    options = options_of(family, "DAVIS" if True in davis else None)
    model = dataclasses.replace(model, segmenter=dataclasses.replace(segmenter, evaluation=options))
    return model, {"family": family, **dataclasses.asdict(options)}
