"""The token value along a growing arm's run: where the worth of its early tokens goes.

`estimators` reads a growing arm's token value ``v`` once, at the end of its fully decayed run
(`fit.token_value`: what a token seen before the last growth is worth in tokens of the final
size; 1 all, 0 nothing). This reads it at every curve point between the last growth and the
arm's decay, against its final size's WSD stable phase (`estimators.stable_curves`) of the same
episode, so a run shows whether the early phase's worth is lost at the growth or over the
steps after it. At point ``k`` (the arm's FLOPs ``c_k``, tokens ``n_k``, loss ``L_k``), with
``g`` the FLOPs before the last growth and ``φ`` the final size's FLOPs per token::

    v_k = token_value(F⁻¹(L_k) / c_k, n_k φ / c_k, g / c_k)
        = (F⁻¹(L_k) - (c_k - g)) / (n_k φ - (c_k - g))

``F⁻¹(L)`` the compute the final size's stable phase needs to reach ``L`` (`fit.Curve.
flops_to_reach`); ``c_k - g`` is what the final size would need if the early tokens were worth
nothing (the arm is the final size after its last growth), ``n_k φ`` what it would need if
each were worth one of its own.

**Read only at one peak rate.** Two runs in a stable phase are comparable mid-run only at the
same peak rate: at a lower one the loss sits lower for the smaller step's noise alone, which
would read as worth the arm never had. So the final size's stable phase is taken at the arm's
peak rate after its growth (its one rate, or the last of its phase rates), and an arm whose
rate the final size was not trained at is not read (`Along.skipped` says so); an arm with a
rate per phase re-warms after its growth (`plan`), and its first points are read through that
re-warm as they are. A point whose
loss the stable phase never reaches, or reaches before its first point, gives no reading and
is counted (`AlongRun.beyond`, `AlongRun.before`): the mean at a point is over the episodes
read there, so where some are left out it leans the other way. Curves are read on the blocks
the plan reads them on (`plan.Plan.curve_split`), the mean over episodes with a t interval
(`fit.mean_t`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from esper_lightning.app.frontier.arms import parse_arm
from esper_lightning.app.frontier.estimators import (
    DECAY_FRACTION,
    final_size,
    frontier_rows,
    sizes_of,
    stable_curves,
)
from esper_lightning.app.frontier.fit import Curve, mean_t, token_value
from esper_lightning.app.frontier.plan import rate_order, rate_text, row_rate

__all__ = ["Along", "AlongRun", "along_runs"]


@dataclass(frozen=True)
class AlongRun:
    """One growing arm at one budget (× base): at each fraction of the budget read, the token
    value's mean and t interval over the episodes read there, and how many there were."""

    arm: str
    budget: float
    rate: float
    fractions: tuple[float, ...]
    values: tuple[tuple[float, float, float], ...]
    episodes: tuple[int, ...]
    beyond: int = 0
    before: int = 0

    @property
    def bounds(self) -> int:
        """Points not read: a loss below the stable phase's last point (``beyond``: worth at
        least what that point reads) or above its first (``before``: at most)."""
        return self.beyond + self.before


@dataclass(frozen=True)
class Along:
    """Every growing arm's readings (`AlongRun`), and each arm and budget not read with why."""

    runs: tuple[AlongRun, ...]
    skipped: tuple[str, ...]


def along_runs(rows: Sequence[Mapping[str, Any]], decay_fraction: float = DECAY_FRACTION,
               arms: Sequence[Mapping[str, Any]] | None = None) -> Along:
    """The token value along every growing arm's run in ``rows`` (one study's) against its
    final size (module docstring), at every budget and rate the arm trained; ``arms``: read
    only these of its growing arms' rows (a report's chosen rates), the final sizes' stable
    phases still from every row of ``rows``."""
    frontier = frontier_rows(rows)
    sizes = set(sizes_of(frontier))
    growing = [r for r in frontier_rows(rows if arms is None else arms)
               if r["arm"] not in sizes]
    runs, skipped = [], []
    for arm in sorted({r["arm"] for r in growing}):
        final = final_size(frontier, arm)
        last_tau = parse_arm(arm).taus[-1]
        ours = [r for r in growing if r["arm"] == arm]
        for budget, rate in sorted({(r["budget"], row_rate(r)) for r in ours},
                                   key=lambda pair: (pair[0], rate_order(pair[1]))):
            mine = [r for r in ours if r["budget"] == budget and row_rate(r) == rate
                    and r.get("curve")]  # an episode without its curve is left out
            where = f"{arm} at {budget:g}× (lr {rate_text(rate)})"
            if not mine:
                skipped.append(f"{where}: no curve")
                continue
            peak = rate[-1] if isinstance(rate, tuple) else rate
            stable = stable_curves(frontier, final, peak, decay_fraction)
            if not stable:
                skipped.append(f"{where}: no {final} run at its peak rate {peak:g}")
                continue
            runs.append(_read(arm, budget, peak, mine, stable, _cost(frontier, final),
                              last_tau, decay_fraction))
    return Along(tuple(runs), tuple(skipped))


def _cost(rows: Sequence[Mapping[str, Any]], size: str) -> float:
    """The fixed size's FLOPs per token (the same in every run of it, up to rounding)."""
    mine = [r["spent_flops"] / r["tokens"] for r in rows if r["arm"] == size]
    return sum(mine) / len(mine)


def _read(arm: str, budget: float, peak: float, mine: Sequence[Mapping[str, Any]],
          stable: Mapping[int, Curve], cost: float, last_tau: float, decay_fraction: float
          ) -> AlongRun:
    """The readings of one arm at one budget: each point after the growth, before the decay,
    in every episode whose final size has a stable phase."""
    by_point: dict[float, list[float]] = {}
    beyond = before = 0
    for row in mine:
        if int(row["episode"]) not in stable:
            continue
        flops, grown = row["budget_flops"], last_tau * row["budget_flops"]
        for c, n, loss in row["curve"]:
            if not grown < c <= (1.0 - decay_fraction) * flops:
                continue
            curve = stable[int(row["episode"])]
            reach = curve.flops_to_reach(loss)
            if reach is None or reach == curve.flops[0]:  # outside its points: no reading
                beyond, before = beyond + (reach is None), before + (reach is not None)
                continue
            by_point.setdefault(round(c / flops, 6), []).append(
                token_value(reach / c, n * cost / c, grown / c))
    fractions = tuple(sorted(by_point))
    return AlongRun(arm, budget, peak, fractions,
                    tuple(mean_t(by_point[f]) for f in fractions),
                    tuple(len(by_point[f]) for f in fractions), beyond, before)
