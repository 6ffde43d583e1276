"""Speed-up at equal loss: how much less compute each controller needs to reach a reference's
final validation loss, episode by episode.

In episode ``i`` the reference controller ends at training FLOPs ``C_i`` (its budget, under a
budget) with validation loss ``L_i``. Another controller's curve of (cumulative training FLOPs,
validation loss) at the end of each epoch reaches ``L_i`` first at ``F_i`` (`flops_to_reach`:
linear between the two epochs that bracket it; at most its first epoch's FLOPs when that epoch
is already there), and its speed-up is ``C_i / F_i``: 2 means it got there with half the
reference's compute, below 1 that it needed more. The reference against itself is 1 when its
loss only falls. A controller that never reaches ``L_i`` in its own episode has no ratio there.

Summary per controller (`speedups`): the episodes that reached, ``k of n``, and over those the
geometric mean of the ratios with a Student t interval on their logarithms (`stats.estimate`, the
interval the comparison uses everywhere: ratios are skewed, their logarithms much less, and a
log-ratio interval turns back into a ratio interval that cannot go below 0). The mean of the
episodes that reached says nothing about the others: with ``k < n`` it overstates the speed-up,
which the table shows by printing ``k of n`` next to it; with ``k = 0`` there is no mean.

Example::

    rows = speedups(records, reference="static")
    print("\\n".join(markdown(rows, "static")))
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from esper_lightning.app.compare.stats import CONFIDENCE, estimate
from esper_lightning.app.compare.table import Records, records_by_controller

LOSSES, FLOPS = "loss_curve", "train_flops_curve"


def flops_to_reach(flops: Sequence[float], losses: Sequence[float],
                   target: float) -> float | None:
    """The training FLOPs at which a curve of (FLOPs, loss) points first reaches ``target``:
    linear between the last point above it and the first at or below it; the first point's
    FLOPs when that one is already there; None when no point is.

    Example::

        flops_to_reach([10, 20, 30], [3.0, 2.0, 1.0], 1.5)  # 25.0
    """
    for i, (f, loss) in enumerate(zip(flops, losses, strict=True)):
        if loss <= target:
            if i == 0:
                return float(f)
            f0, l0 = flops[i - 1], losses[i - 1]
            return float(f0 + (f - f0) * (l0 - target) / (l0 - loss))
    return None


@dataclass(frozen=True)
class Speedup:
    """One controller's speed-up over the reference's final loss.

    Attributes:
        controller: its name.
        ratios: by episode index, reference FLOPs / FLOPs needed, None where never reached.
        geometric_mean: of the reached ratios (None when none reached).
        ci: the t interval of that geometric mean (None below two reached episodes).
        confidence: level of the interval.
    """

    controller: str
    ratios: dict[int, float | None]
    geometric_mean: float | None
    ci: tuple[float, float] | None
    confidence: float = CONFIDENCE

    @property
    def reached(self) -> int:
        return sum(r is not None for r in self.ratios.values())


def speedups(records: Records, reference: str, *,
             confidence: float = CONFIDENCE) -> list[Speedup]:
    """Every controller's speed-up per episode index it shares with ``reference``; empty when
    the episodes recorded no FLOP curve (tables written before FLOPs were metered, or episodes
    nobody metered).

    Raises:
        ValueError: ``reference`` has no episodes.
    """
    groups = records_by_controller(records)
    if reference not in groups:
        raise ValueError(f"speed-up reference {reference!r} has no episodes; played: "
                         f"{', '.join(groups)}")
    known = [r for eps in groups.values() for r in eps]
    if not all(r[LOSSES] and r[FLOPS] and r[FLOPS][-1] > 0 for r in known):
        return []
    ends = {r.episode_index: (r[FLOPS][-1], r[LOSSES][-1]) for r in groups[reference]}
    rows = []
    for name, episodes in groups.items():
        ratios: dict[int, float | None] = {}
        for r in episodes:
            if r.episode_index not in ends:
                continue
            budget, target = ends[r.episode_index]
            needed = flops_to_reach(r[FLOPS], r[LOSSES], target)
            ratios[r.episode_index] = None if needed is None else budget / needed
        rows.append(_summary(name, ratios, confidence))
    return rows


def _summary(name: str, ratios: dict[int, float | None], confidence: float) -> Speedup:
    reached = [r for r in ratios.values() if r is not None]
    if not reached:
        return Speedup(name, ratios, None, None, confidence)
    logs = estimate(np.log(reached), confidence=confidence)
    ci = None if logs.ci is None else (math.exp(logs.ci[0]), math.exp(logs.ci[1]))
    return Speedup(name, ratios, math.exp(logs.mean), ci, confidence)


def markdown(rows: Sequence[Speedup], reference: str) -> list[str]:
    """A Markdown section of the speed-ups (nothing when there are none)."""
    if not rows:
        return []
    level = f"{rows[0].confidence:.0%}"
    lines = ["", "## Speed-up at equal loss", "",
             f"Training FLOPs of {reference} at its end over the FLOPs each controller needs to "
             f"reach {reference}'s final validation loss in the same episode (linear between "
             "the epochs that bracket it): above 1 it got there with less compute. Geometric "
             f"mean of the episodes that reached it, {level} t interval on the log ratios; "
             "an episode that never reaches it has no ratio, and a mean over fewer than all "
             "episodes overstates the speed-up.", "",
             f"| controller | reached | speed-up [{level} CI] |", "|---|---:|---:|"]
    for row in rows:
        mean = "n/a" if row.geometric_mean is None else f"{row.geometric_mean:.2f}×"
        if row.ci is not None:
            mean += f" [{row.ci[0]:.2f}, {row.ci[1]:.2f}]"
        lines.append(f"| {row.controller} | {row.reached} of {len(row.ratios)} | {mean} |")
    return lines


def as_json(rows: Sequence[Speedup], reference: str) -> dict[str, Any]:
    """The speed-ups as plain data (``summary.json``'s ``speedup``)."""
    return {"reference": reference, "controllers": [
        {"controller": r.controller, "reached": r.reached, "episodes": len(r.ratios),
         "geometric_mean": r.geometric_mean, "ci": None if r.ci is None else list(r.ci),
         "ratios": {str(i): v for i, v in sorted(r.ratios.items())},
         "confidence": r.confidence} for r in rows]}


__all__ = ["Speedup", "as_json", "flops_to_reach", "markdown", "speedups"]
