"""Model configs (frozen dataclasses) to and from the JSON dict a converted model's config.json holds.

Every family's config has a ``to_dict`` / ``from_dict`` pair; the JSON side of
both is here, so that every family writes its config the same way and refuses
an unknown field the same way. The directory layout around the dict is
`jaxseg_robust.models.store`'s (docs/ARCHITECTURE.md, "Packages").
"""

from __future__ import annotations

import dataclasses
from typing import Any


def json_tuples(value: Any) -> Any:
    """JSON lists -> tuples, recursively (dataclass fields are tuples); other values as they are."""
    if isinstance(value, list):
        return tuple(json_tuples(v) for v in value)
    if isinstance(value, dict):
        return {k: json_tuples(v) for k, v in value.items()}
    return value


def config_to_dict(config: Any) -> dict:
    """The JSON-representable dict of a flat config dataclass: its constructor fields
    (``init=False`` fields such as a fixed ``family`` are left out), tuples as lists."""
    values = {f.name: getattr(config, f.name) for f in dataclasses.fields(config) if f.init}
    return {k: list(v) if isinstance(v, tuple) else v for k, v in values.items()}


def dataclass_from_dict(cls: type, data: dict, *, what: str) -> Any:
    """Builds dataclass ``cls`` from a JSON dict (lists become tuples, recursively).

    Raises:
      ValueError: a key that is no constructor field of ``cls`` (naming it and the
        known ones), or a dict ``cls`` cannot be built from (a missing field); the
        message starts with ``what``.
    """
    names = {f.name for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ValueError(f"{what}: unknown field(s) {unknown} for {cls.__name__}; known: {sorted(names)}")
    try:
        return cls(**{k: json_tuples(v) for k, v in data.items()})
    except TypeError as err:
        raise ValueError(f"{what}: cannot build {cls.__name__}: {err}") from None


__all__ = ["json_tuples", "config_to_dict", "dataclass_from_dict"]
