"""Which instances a report draws: ``--plot-instances worst N | first N`` (docs/ARCHITECTURE.md, "Figures").

A report draws its per-instance figures for at most N ok instances per
dataset. ``first N`` takes them in record order; ``worst N`` takes the N with
the lowest *hardness score* first, where each protocol's report states its
score (a float, lower = worse; NaN = unknown, ranked after every known score):

  tetris   the MIN trajectory's IoU-AuC@K (K of the table), else the first
           recorded trajectory's (baseline, max);
  breps    the MIN attack's IoU; the tight box's IoU when the run has no MIN;
  grid     ``iou_min`` (the worst single click / centred box of the grid);
  rclicks  the mean IoU over the rounds of the simulated users (the mean of
           the groups' IoU-AuC), else of the baseline clicker when no group ran.

Failed instances are never drawn. Ties keep record order.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping

MODES = ("worst", "first")


@dataclasses.dataclass(frozen=True)
class PlotInstances:
    """The ``--plot-instances`` choice: ``mode`` "worst" or "first", ``count`` instances per dataset (>= 0)."""

    mode: str = "worst"
    count: int = 4

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"plot-instances mode must be one of {MODES}; got {self.mode!r}")
        if isinstance(self.count, bool) or not isinstance(self.count, int) or self.count < 0:
            raise ValueError(f"plot-instances count must be an int >= 0; got {self.count!r}")

    def __str__(self) -> str:
        return f"{self.mode} {self.count}"


DEFAULT_PLOT_INSTANCES = PlotInstances()


def parse_plot_instances(mode: str, count: str) -> PlotInstances:
    """`PlotInstances` of the two command-line words (``"worst", "4"``).

    Raises:
      ValueError: an unknown mode or a count that is not an int >= 0 (the message names the value).
    """
    try:
        number = int(count)
    except (TypeError, ValueError):
        raise ValueError(f"plot-instances count must be an int >= 0; got {count!r}") from None
    return PlotInstances(str(mode), number)


def _score_key(score: float) -> tuple[int, float]:
    return (1, 0.0) if score is None or math.isnan(score) else (0, float(score))


def instances_to_plot(records: Iterable[Mapping], choice: PlotInstances,
                      hardness: Callable[[Mapping], float]) -> list[Mapping]:
    """The ok records in the order their figures are drawn (the report stops at ``choice.count`` per dataset).

    Args:
      records: a run's latest records (``dataset``, ``id``, ``status``, ``payload``).
      choice: `PlotInstances`; "first" keeps record order, "worst" sorts by ``hardness(record)``
        ascending (NaN last, ties in record order).
      hardness: the protocol's score of one ok record (lower = worse; see the module docstring).

    Returns:
      Every ok record (a record whose figure cannot be drawn is skipped by the
      report and the next one is taken), failed records left out.
    """
    ok = [record for record in records if record.get("status") == "ok"]
    if choice.mode == "first":
        return ok
    return sorted(ok, key=lambda record: _score_key(hardness(record)))


__all__ = ["MODES", "PlotInstances", "DEFAULT_PLOT_INSTANCES", "parse_plot_instances", "instances_to_plot"]
