"""A growing arm's speed-up by several estimators, against one width's frontier or several
widths', and as the growth literature measures it, from studies' rows alone (NumPy, SciPy).

**Four estimators** of the speed-up at budget ``C`` against the frontier of the fixed sizes:

* *pooled power law* (the headline): each fixed size's episode-mean curve (its mean loss at
  each budget over the episodes) fitted by `fit.PowerLaw`, the frontier the lower envelope of
  the fits (a size measured at fewer budgets than a fit needs enters as measured:
  `smooth_sizes`), the arm's episode-mean loss read against it (`fit.speedup`). Its interval is a
  jackknife t over episodes (`fit.jackknife_t` of the log speed-up, each episode left out in
  turn): the estimate is a smooth function of episode means, whose variance the jackknife
  estimates. A per-episode refit and a t over its values would estimate another quantity (the
  mean of per-episode speed-ups, each against its own episode's minimum over sizes, with
  three parameters fitted to four to six noisy points of one episode).
* *pooled piecewise*: the same with the mean curves linear in ``log C`` between budgets
  (`fit.Curve`), jackknifed alike.
* *per-episode power law* and *per-episode piecewise* (the latter is `report.speedups`, the
  study's own table): each episode's frontier and the arm's loss in that episode, the geometric
  mean over episodes with its bootstrap and t intervals (`fit.geometric_summary`).

**Two biases** part them (`Estimate.chord`, `minimum_bias`). A chord linear in ``log C`` lies
above a convex curve, so between budgets a piecewise frontier is too high and a speed-up read
against it too large: the *chord* effect is the speed-up against the chords through a fitted
law's own points at the measured budgets over the speed-up against the law itself (pooled).
An episode's frontier is the minimum over sizes of that episode's losses, each with its noise,
so it sits below the envelope of the means where sizes are close: the *minimum* effect is, per
budget, the mean of the episodes' minima minus the envelope of the means (bits), and it makes a
per-episode speed-up too small.

**Across widths** (`Pool` over several studies, each of its own episodes: no pairing between
them) the frontier is the envelope of every fixed size of every width, in absolute FLOPs; the
jackknife leaves out one episode of one study at a time and its degrees of freedom are
Welch-Satterthwaite's.

**As the literature measures** (`literature`): against the arm's own final size alone, both
fully decayed at each budget (the final size's compute to reach the arm's loss, over the
arm's), and the arm's time to the final size's loss at ``C`` (``C`` over the arm's compute to
reach it, on the arm's own fitted curve), beside the frontier's; and where the speed-up
against the final size comes from: ``s = 1 - τ + v (c - 1 + τ)`` with ``c`` the token ceiling
(`fit.token_ceiling`; ``c - 1 + τ = τ r`` for one growth, ``r`` the final size's FLOPs per token
over the first size's), ``v`` what a token seen before the last growth is worth in tokens of the
final size (`fit.token_value`).

**Read mid-run, from curves** (`curve_readings`; a row's ``curve``, `plan`'s ``curve_points``):
the literature's own readings, each on the same fixed blocks (the curves', of the split the
table reads: `plan.Plan.curve_split`), on episode-mean curves (each read linear in ``log C``
between its points) with a jackknife t interval over the episodes that have the curves, and None
(*no curve*) where the rows lack them. With ``A`` the growing arm, ``F`` its final size and ``C``
a budget of the arm:

* *one long schedule* (``long``): both trained once to the plan's largest budget on one decay
  (`plan`'s ``long_schedule``) and read mid-run: ``F_long⁻¹(A_long(C)) / C``, the compute
  ``F``'s long run needs to reach the loss ``A``'s long run has at ``C``, over ``C``;
* *WSD stable phase* (``stable``): ``F_stable⁻¹(A_C(C)) / C``, the compute ``F``'s run to its
  largest budget needs before its decay (the points of its branched budgets at that rate
  before theirs, `train`) to reach the loss ``A`` ends its own fully decayed run of ``C`` at;
* *to the final size's loss* (``reach``, and ``reach_tokens``): ``C / A_C⁻¹(F_C(C))``, ``C``
  over the compute ``A``'s run of ``C`` needs, read on its own curve, to reach the loss ``F``
  ends its run of ``C`` at; in tokens, ``F``'s tokens at ``C`` over ``A``'s at that point.

``X⁻¹(L)`` is the first compute at which curve ``X`` is at or below ``L`` (`fit.Curve.
flops_to_reach`); a loss a curve never reaches, or reaches before its first point, leaves a
bound (`fit.speedup`, `fit.reach_speedup`). The frontier's readings divide by the frontier of
every fixed size, each fully decayed at each budget and tuned there; these by one size, the
arm's final, read where it is not decayed (long, stable) or where the arm is not (reach).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from esper_lightning.app.frontier.arms import parse_arm
from esper_lightning.app.frontier.fit import (
    POWER_POINTS,
    Curve,
    PowerLaw,
    Speedup,
    Summary,
    curves_by_episode,
    frontier,
    geometric_summary,
    jackknife_t,
    reach_speedup,
    speedup,
    time_to_target,
    token_ceiling,
    token_value,
)
from esper_lightning.app.frontier.plan import Rate, row_rate
from esper_lightning.errors import ConfigError

__all__ = ["CHORD", "PIECEWISE", "POWER", "CurveReadings", "Estimate", "Literature", "Pool",
           "Pooled", "complete_episodes", "cross_envelope", "curve_readings", "estimates",
           "final_size", "frontier_rows", "literature", "long_rows", "mean_curve", "minimum_bias",
           "row_curve", "sizes_of", "stable_curves", "stage_size", "too_few_budgets"]

#: How a curve is read between its budgets: a fitted power law, chords linear in log C through
#: the measured points, or chords through the fitted law's own points (the chord effect alone).
POWER, PIECEWISE, CHORD = "power law", "piecewise", "chords of the power law"

#: The kept episodes of each study of a pool (one frozen set per study).
Keep = tuple[frozenset[int], ...]
#: The share of a run its WSD decay takes where no plan says (`plan.Plan.decay_fraction`).
DECAY_FRACTION = 0.2


def frontier_rows(rows: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The rows of the frontier's runs, each fully decayed at its budget: every row but a long
    run's (``schedule`` set, `plan.Unit.schedule`; a row of an older study has none)."""
    return [r for r in rows if not r.get("schedule")]


def long_rows(rows: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The rows of long runs (one decay over the plan's largest budget, read mid-run)."""
    return [r for r in rows if r.get("schedule")]


#: A fixed size's name: ``S<depth>``, with ``w<width>`` where it names its width.
_SIZE = re.compile(r"S(?P<depth>\d+)(?:w(?P<width>\d+))?")


def sizes_of(rows: Iterable[Mapping[str, Any]]) -> list[str]:
    """The fixed sizes among the rows' arms (``S<k>``, ``S<k>w<width>``), by width (the
    plan's first) and depth."""
    def order(name: str) -> tuple[int, int]:
        size = _SIZE.fullmatch(name)
        return (int(size["width"] or 0), int(size["depth"])) if size else (-1, 0)

    return sorted({r["arm"] for r in rows if r["arm"].startswith("S")}, key=order)


def stage_size(arm: str, stage: int) -> str:
    """The fixed size a growing arm is at stage ``stage`` (0: born; -1: final), by its name:
    ``G1-4@...`` is S1 then S4, ``G1w32-4w64@...`` S1w32 then S4w64.

    Example:
        >>> stage_size("G1-2-4@0.15,0.4:identity", -1), stage_size("G1w32-4w64@0.1:copy", 0)
        ('S4', 'S1w32')
    """
    return "S" + arm[1:].split("@")[0].split("-")[stage]


def final_size(rows: Sequence[Mapping[str, Any]], arm: str) -> str:
    """The fixed size among ``rows`` that growing ``arm`` ends as: `stage_size`'s name, or, in
    a study whose shape has the final width (where the fixed sizes are named without it: S4 in
    a width-64 plan is S4w64), the size of the final depth whose rows have the arm's final
    parameter count. A name the rows do not hold is returned as it is (its reader refuses it).

    Example:
        >>> rows = [{"arm": "S4", "params": 218496},
        ...         {"arm": "G1w32-4w64@0.1:identity", "params": 218496}]
        >>> final_size(rows, "G1w32-4w64@0.1:identity"), final_size(rows, "G1-4@0.1:copy")
        ('S4', 'S4')
    """
    name = stage_size(arm, -1)
    arms = {r["arm"] for r in rows}
    bare = name.split("w")[0]
    if name in arms or bare not in arms:
        return name
    grown = {r["params"] for r in rows if r["arm"] == arm}
    return bare if grown and grown == {r["params"] for r in rows if r["arm"] == bare} else name


def complete_episodes(rows: Sequence[Mapping[str, Any]]) -> list[int]:
    """The episodes in which every fixed size has every one of its budgets (a frontier of an
    episode needs them all; an interrupted study's last episode may not have them yet)."""
    sizes = sizes_of(rows)
    wanted = {s: {r["budget"] for r in rows if r["arm"] == s} for s in sizes}
    episodes = sorted({int(r["episode"]) for r in rows})
    return [e for e in episodes if all(
        wanted[s] <= {r["budget"] for r in rows if r["arm"] == s and r["episode"] == e}
        for s in sizes)]


def smooth(curve: Curve, kind: str) -> Curve:
    """``curve`` read the ``kind`` way (`POWER`, `PIECEWISE` or `CHORD`)."""
    if kind == PIECEWISE:
        return curve
    law = PowerLaw.fit(curve)
    if kind == POWER:
        return law.curve(curve.flops)
    return Curve(curve.flops, np.asarray(law.at(curve.flops), dtype=float))


def smooth_sizes(curves: Sequence[Curve], kind: str) -> list[Curve]:
    """Each fixed size's curve read the ``kind`` way, for an envelope: a size measured at fewer
    budgets than a power law with an offset needs (`fit.POWER_POINTS`; `short_sizes`) enters
    a fitted envelope as measured, linear in ``log C`` between its budgets, as long as one size
    is fitted (a frontier of chords alone is no power-law estimate).

    Raises:
        ValueError: No size has budgets enough for a fit (one line, `fit.PowerLaw.fit`'s).
    """
    if kind == PIECEWISE:
        return list(curves)
    fitted = [c for c in curves if len(c.flops) >= POWER_POINTS]
    if not fitted:
        PowerLaw.fit(min(curves, key=lambda c: len(c.flops)))  # raises, naming the budgets
    return [smooth(c, kind) if len(c.flops) >= POWER_POINTS else c for c in curves]


def short_sizes(rows: Iterable[Mapping[str, Any]]) -> list[str]:
    """The fixed sizes of ``rows`` measured at fewer budgets than a power law with an offset
    needs: `smooth_sizes` reads them as measured in a fitted envelope."""
    rows = list(rows)
    return [s for s in sizes_of(rows)
            if len({r["budget"] for r in rows if r["arm"] == s}) < POWER_POINTS]


@dataclass(frozen=True)
class Pooled:
    """A pooled estimate: its value, its jackknife t interval (NaN where it has none: one
    episode, or a value some leave-one-out only bounds), whether it is a bound (``"above"``:
    at least; ``"below"``: at most) and the episodes it pools."""

    value: float
    low: float
    high: float
    censored: str | None
    n: int


class Pool:
    """The rows of one or several studies (each of its own episodes, at its chosen rates),
    averaged over kept episodes; frontiers are built once per set of kept episodes.

    Args:
        studies: Each study's rows (its fixed sizes, and any growing arms).
        loss: The loss column read.
        labels: A prefix per study for its sizes' names (e.g. ``w32 ``), so sizes of several
            studies stay apart.
    """

    def __init__(self, studies: Sequence[Sequence[Mapping[str, Any]]], loss: str,
                 labels: Sequence[str] = ("",)):
        if len(labels) != len(studies):
            raise ValueError(f"a pool of {len(studies)} studies needs as many labels, got "
                             f"{list(labels)}")
        self.loss = loss
        self.labels = tuple(labels)
        self.episodes = tuple(frozenset(complete_episodes(rows)) for rows in studies)
        self.rows = tuple([r for r in rows if r["episode"] in kept]
                          for rows, kept in zip(studies, self.episodes, strict=True))
        self._fronts: dict[tuple[str, Keep], Curve] = {}

    @property
    def everything(self) -> Keep:
        """Every complete episode of every study."""
        return self.episodes

    def curve(self, study: int, arm: str, keep: Keep) -> Curve:
        """``arm``'s mean loss over the kept episodes of ``study``, at each of its budgets."""
        points: dict[float, list[float]] = {}
        for row in self.rows[study]:
            if row["arm"] == arm and row["episode"] in keep[study]:
                points.setdefault(float(row["budget_flops"]), []).append(float(row[self.loss]))
        return Curve.of((c, float(np.mean(v))) for c, v in points.items())

    def mean_loss(self, study: int, arm: str, budget: float, keep: Keep) -> float:
        """``arm``'s mean loss at ``budget`` (× base) over the kept episodes of ``study``."""
        return float(np.mean([r[self.loss] for r in self.rows[study] if r["arm"] == arm
                              and r["budget"] == budget and r["episode"] in keep[study]]))

    def sizes(self) -> list[tuple[int, str]]:
        """Every fixed size of every study, as ``(study, size)``."""
        return [(g, s) for g, rows in enumerate(self.rows) for s in sizes_of(rows)]

    def front(self, keep: Keep, kind: str = POWER) -> Curve:
        """The lower envelope of every study's sizes' mean curves, read the ``kind`` way."""
        key = (kind, keep)
        if key not in self._fronts:
            self._fronts[key] = frontier(smooth_sizes(
                [self.curve(g, s, keep) for g, s in self.sizes()], kind))
        return self._fronts[key]

    def estimate(self, value: Callable[[Keep], Speedup | float], log: bool = True) -> Pooled:
        """``value`` on every episode, with its jackknife t interval (of its log when ``log``:
        a speed-up; a bound (`Speedup.censored`) anywhere leaves no interval)."""
        return _jackknifed(value, self.episodes, log)


def _jackknifed(value: Callable[[Keep], Speedup | float], episodes: Keep, log: bool = True
                ) -> Pooled:
    """``value`` on ``episodes`` (each study's), with the jackknife t interval of leaving out
    one episode of one study at a time (`Pool.estimate`)."""
    def read(keep: Keep) -> tuple[float, str | None]:
        got = value(keep)
        if isinstance(got, Speedup):
            return got.value, got.censored
        return float(got), None

    full, censored = read(episodes)
    n = sum(len(kept) for kept in episodes)
    if min(len(kept) for kept in episodes) < 2:  # a study of one episode: no spread
        return Pooled(full, math.nan, math.nan, censored, n)
    # Per study, every episode left out in turn (the others' kept whole).
    left_out = [[tuple(kept - {e} if g == group else other for g, other in enumerate(episodes))
                 for e in sorted(kept)] for group, kept in enumerate(episodes)]
    loo = [[read(keep) for keep in group] for group in left_out]
    if censored or any(c for group in loo for _, c in group):
        return Pooled(full, math.nan, math.nan, censored, n)
    scale = math.log if log else float
    low, high, _ = jackknife_t(scale(full), [[scale(v) for v, _ in g] for g in loo])
    back = math.exp if log else float
    return Pooled(full, back(low) if not math.isnan(low) else low,
                  back(high) if not math.isnan(high) else high, None, n)


@dataclass(frozen=True)
class Estimate:
    """A growing arm at one budget by the four estimators (module docstring), and the chord
    effect (the pooled speed-up against the fitted laws' chords over that against the laws,
    minus 1; NaN where either is a bound)."""

    arm: str
    budget: float
    power: Pooled
    piecewise: Pooled
    episode_power: Summary
    episode_piecewise: Summary
    chord: float


def growing_arms(rows: Iterable[Mapping[str, Any]]) -> list[str]:
    """The growing arms among the rows' arms (every arm that is not a fixed size)."""
    rows = list(rows)
    return sorted({r["arm"] for r in rows} - set(sizes_of(rows)))


class Pools:
    """`Pool` of studies whose ``study``-th is kept to the episodes a growing arm played at a
    budget (a tuning arm may have played fewer episodes than the fixed sizes), one per set."""

    def __init__(self, studies: Sequence[Sequence[Mapping[str, Any]]], loss: str,
                 labels: Sequence[str] = ("",)):
        self.studies, self.loss, self.labels = studies, loss, labels
        self._pools: dict[tuple[int, frozenset[int]], Pool] = {}

    def of(self, study: int, arm: str, budget: float) -> Pool:
        """The pool in which ``study`` holds the episodes of ``arm`` at ``budget`` alone."""
        rows = self.studies[study]
        played = frozenset(r["episode"] for r in rows if r["arm"] == arm
                           and r["budget"] == budget)
        if (study, played) not in self._pools:
            kept = [r for r in rows if r["episode"] in played]
            self._pools[(study, played)] = Pool(
                [kept if g == study else other for g, other in enumerate(self.studies)],
                self.loss, self.labels)
        return self._pools[(study, played)]


def estimates(rows: Sequence[Mapping[str, Any]], loss: str) -> list[Estimate]:
    """Every growing arm of one study at every budget it trained, by the four estimators."""
    pools = Pools([rows], loss)
    per_episode = {kind: _per_episode(rows, loss, kind) for kind in (POWER, PIECEWISE)}
    results = []
    for arm in growing_arms(rows):
        for budget in sorted({r["budget"] for r in rows if r["arm"] == arm}):
            flops = budget * _base(rows)
            pool = pools.of(0, arm, budget)
            pooled = {kind: pool.estimate(_against_front(pool, 0, arm, budget, flops, kind))
                      for kind in (POWER, PIECEWISE)}
            chord = _against_front(pool, 0, arm, budget, flops, CHORD)(pool.everything)
            power = pooled[POWER]
            bounded = chord.censored or power.censored
            results.append(Estimate(
                arm, budget, power, pooled[PIECEWISE], per_episode[POWER][(arm, budget)],
                per_episode[PIECEWISE][(arm, budget)],
                math.nan if bounded else chord.value / power.value - 1.0))
    return results


def _base(rows: Sequence[Mapping[str, Any]]) -> float:
    """The study's base budget in FLOPs (a row's budget FLOPs over its multiple)."""
    return float(rows[0]["budget_flops"]) / float(rows[0]["budget"])


def _against_front(pool: Pool, study: int, arm: str, budget: float, flops: float, kind: str
                   ) -> Callable[[Keep], Speedup]:
    """The pooled speed-up of ``arm`` at ``budget`` against the pool's frontier, per keep."""
    return lambda keep: speedup(pool.mean_loss(study, arm, budget, keep), flops,
                                pool.front(keep, kind))


def _per_episode(rows: Sequence[Mapping[str, Any]], loss: str, kind: str
                 ) -> dict[tuple[str, float], Summary]:
    """Every growing arm's per-episode speed-ups against its episode's frontier read the
    ``kind`` way: geometric mean, bootstrap and t intervals (`fit.geometric_summary`)."""
    episodes = complete_episodes(rows)
    curves = {s: curves_by_episode(rows, s, loss) for s in sizes_of(rows)}
    fronts = {e: frontier(smooth_sizes([c[e] for c in curves.values()], kind))
              for e in episodes}
    results = {}
    for arm in growing_arms(rows):
        mine = [r for r in rows if r["arm"] == arm and r["episode"] in fronts]
        for budget in sorted({r["budget"] for r in mine}):
            results[(arm, budget)] = geometric_summary([
                speedup(r[loss], r["budget_flops"], fronts[r["episode"]])
                for r in mine if r["budget"] == budget])
    return results


@dataclass(frozen=True)
class EnvelopePoint:
    """The frontier of one study at one measured budget two ways: the envelope of the sizes'
    mean losses (and the size holding it), and the mean over episodes of each episode's
    minimum over sizes (nats)."""

    budget: float
    flops: float
    envelope: float
    holder: str
    episodes: float


def minimum_bias(rows: Sequence[Mapping[str, Any]], loss: str) -> list[EnvelopePoint]:
    """The per-episode minimum's effect at every budget the fixed sizes measured."""
    pool = Pool([rows], loss)
    sizes = sizes_of(pool.rows[0])
    means = {s: pool.curve(0, s, pool.everything) for s in sizes}
    per_episode = {s: curves_by_episode(pool.rows[0], s, loss) for s in sizes}
    points = []
    for budget in sorted({r["budget"] for r in pool.rows[0] if r["arm"] in sizes}):
        flops = budget * _base(pool.rows[0])
        at = {s: means[s].at(flops) for s in sizes if not math.isnan(means[s].at(flops))}
        holder = min(at, key=at.__getitem__)
        minima = [min(v for v in (per_episode[s][e].at(flops) for s in sizes)
                      if not math.isnan(v)) for e in sorted(pool.episodes[0])]
        points.append(EnvelopePoint(budget, flops, at[holder], holder, float(np.mean(minima))))
    return points


@dataclass(frozen=True)
class CrossPoint:
    """The envelope of several widths' sizes at one budget (FLOPs): each size's mean loss
    there (piecewise, NaN outside its budgets), the envelope read piecewise and by the fitted
    laws, and which size holds each."""

    flops: float
    losses: dict[str, float]
    piecewise: float
    piecewise_holder: str
    power: float
    power_holder: str


def cross_envelope(pool: Pool) -> list[CrossPoint]:
    """The cross-width envelope at every budget any size of the pool measured."""
    keep = pool.everything
    names = [f"{pool.labels[g]}{s}" for g, s in pool.sizes()]
    means = [pool.curve(g, s, keep) for g, s in pool.sizes()]
    laws = smooth_sizes(means, POWER)
    points = []
    for flops in sorted({float(c) for curve in means for c in curve.flops}):
        losses = {n: c.at(flops) for n, c in zip(names, means, strict=True)}
        fitted = {n: c.at(flops) for n, c in zip(names, laws, strict=True)}
        piece = min((n for n in names if not math.isnan(losses[n])), key=losses.__getitem__)
        power = min((n for n in names if not math.isnan(fitted[n])), key=fitted.__getitem__)
        points.append(CrossPoint(flops, losses, losses[piece], piece, fitted[power], power))
    return points


@dataclass(frozen=True)
class Literature:
    """A growing arm of one study at one budget, measured the frontier's ways and the
    literature's (module docstring): against its width's frontier (pooled power law; and
    per-episode piecewise, the study's own table), against the frontier of every width's
    sizes, against its final size alone, its time to the final size's loss; and where the
    speed-up against its final size comes from (``ratio`` r, ``tau`` its last growth's share,
    ``ceiling`` c, the token value v pooled; and per episode piecewise, the study's own token
    table: the speed-up against the final size and v as a mean and t interval); and the
    literature's readings mid-run, from curves (`CurveReadings`, each None where the rows have
    no curve for it). ``target`` reads the arm's own fitted curve: None for an arm trained at
    fewer budgets than a power law needs (`too_few_budgets`)."""

    arm: str
    width: int
    budget: float
    frontier: Pooled
    today: Summary
    cross: Pooled
    final: Pooled
    target: Pooled | None
    ratio: float
    tau: float
    ceiling: float
    value: Pooled
    today_final: Summary
    today_value: tuple[float, float, float]
    long: Pooled | None = None
    stable: Pooled | None = None
    reach: Pooled | None = None
    reach_tokens: Pooled | None = None


def literature(studies: Sequence[tuple[int, Sequence[Mapping[str, Any]]]], loss: str,
               decay_fractions: Sequence[float] = ()) -> list[Literature]:
    """Every growing arm of every study (``(width, rows)``, one study per width; its long runs'
    rows among them) measured every way (`Literature`); ``decay_fractions``: each study's
    plan's (`DECAY_FRACTION` for each when not given), where its stable phases end."""
    widths = [w for w, _ in studies]
    if len(set(widths)) != len(widths):
        raise ConfigError(f"one study per width across widths, got widths {widths}")
    decays = list(decay_fractions) or [DECAY_FRACTION] * len(studies)
    cross = Pools([frontier_rows(rows) for _, rows in studies], loss, [f"w{w} " for w in widths])
    results = []
    for g, (width, everything) in enumerate(studies):
        rows, long = frontier_rows(everything), long_rows(everything)
        own = Pools([rows], loss)
        today = _per_episode(rows, loss, PIECEWISE)
        short = too_few_budgets(rows)
        for arm in growing_arms(rows):
            for budget in sorted({r["budget"] for r in rows if r["arm"] == arm}):
                pool = own.of(0, arm, budget)
                kept = [r for r in long if r["episode"] in pool.episodes[0]]
                readings = curve_readings([*pool.rows[0], *kept], arm, budget, decays[g])
                results.append(_measured(cross.of(g, arm, budget), pool, g, width, arm, budget,
                                         today[(arm, budget)], readings, arm not in short))
    return results


def too_few_budgets(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The growing arms of ``rows`` (a frontier's: `frontier_rows`) that have no time to the
    final size's loss in `literature`: trained at fewer budgets than a power law of their own
    needs (`fit.POWER_POINTS`; that reading is on the arm's fitted curve)."""
    return [arm for arm in growing_arms(rows)
            if len({r["budget"] for r in rows if r["arm"] == arm}) < POWER_POINTS]


def _measured(cross: Pool, own: Pool, study: int, width: int, arm: str, budget: float,
              today: Summary, readings: CurveReadings, fitted: bool) -> Literature:
    """One arm at one budget of study ``study`` of the pool ``cross`` (`literature`); its time
    to the final size's loss where ``fitted`` (enough budgets for a power law of its own)."""
    rows = own.rows[0]
    flops = budget * _base(rows)
    final = final_size(rows, arm)
    tau = parse_arm(arm).taus[-1]
    ceiling = float(np.mean([token_ceiling(r["tokens"], _cost(rows, final), r["budget_flops"])
                             for r in rows if r["arm"] == arm and r["budget"] == budget]))

    def against_final(keep: Keep) -> Speedup:
        return speedup(own.mean_loss(0, arm, budget, keep), flops,
                       smooth(own.curve(0, final, keep), POWER))

    def to_target(keep: Keep) -> Speedup:
        return time_to_target(smooth(own.curve(0, arm, keep), POWER), flops,
                              smooth(own.curve(0, final, keep), POWER))

    def value(keep: Keep) -> Speedup:
        against = against_final(keep)
        return Speedup(token_value(against.value, ceiling, tau), against.censored)

    today_final, today_value = _episode_values(rows, own.loss, arm, budget, tau)
    return Literature(
        arm, width, budget, own.estimate(_against_front(own, 0, arm, budget, flops, POWER)),
        today, cross.estimate(_against_front(cross, study, arm, budget, flops, POWER)),
        own.estimate(against_final), own.estimate(to_target) if fitted else None,
        _ratio(rows, final, stage_size(arm, 0)), tau, ceiling,
        own.estimate(value, log=False), today_final, today_value, readings.long,
        readings.stable, readings.reach, readings.reach_tokens)


def _ratio(rows: Sequence[Mapping[str, Any]], final: str, born: str) -> float:
    """r, the final size's FLOPs per token over the born size's; NaN where the rows hold no
    born size (a width-64 study's rows have no S1w32: r is then read from a study that does)."""
    if not any(r["arm"] == born for r in rows):
        return math.nan
    return _cost(rows, final) / _cost(rows, born)


def _cost(rows: Sequence[Mapping[str, Any]], size: str) -> float:
    """A fixed size's FLOPs per token (mean over its rows; the rows must hold it)."""
    mine = [r["spent_flops"] / r["tokens"] for r in rows if r["arm"] == size]
    if not mine:
        raise ConfigError(f"the rows hold no fixed size {size}, which a growing arm's token "
                          "ceiling needs")
    return float(np.mean(mine))


def _episode_values(rows: Sequence[Mapping[str, Any]], loss: str, arm: str, budget: float,
                    tau: float) -> tuple[Summary, tuple[float, float, float]]:
    """The speed-up against the final size's piecewise curve of the same episode (geometric
    mean, `fit.geometric_summary`) and the token value with that episode's ceiling (mean and
    95 % t interval: the jackknife of a mean is its t interval): the study's own token table."""
    final = final_size(rows, arm)
    curves, cost = curves_by_episode(rows, final, loss), _cost(rows, final)
    mine = [r for r in rows if r["arm"] == arm and r["budget"] == budget]
    ups = [speedup(r[loss], r["budget_flops"], curves[r["episode"]]) for r in mine]
    values = [token_value(up.value, token_ceiling(r["tokens"], cost, r["budget_flops"]), tau)
              for up, r in zip(ups, mine, strict=True)]
    mean = float(np.mean(values))
    if len(values) < 2:
        return geometric_summary(ups), (mean, math.nan, math.nan)
    low, high, _ = jackknife_t(mean, [[(sum(values) - v) / (len(values) - 1) for v in values]])
    return geometric_summary(ups), (mean, low, high)


# --- the literature's readings, from curves -------------------------------------------------------
def row_curve(row: Mapping[str, Any], until: float | None = None) -> Curve | None:
    """A row's curve (its points up to ``until`` FLOPs; None: the row has none)."""
    points = [(f, nats) for f, _, nats in row.get("curve") or ()
              if until is None or f <= until]
    return Curve.of(points) if points else None


def mean_curve(curves: Sequence[Curve]) -> Curve:
    """The episodes' mean curve at the first curve's points (each curve read there linear in
    ``log C``; a point outside some curve is left out). The curves of one arm have the same
    points in every episode (a step's FLOPs do not depend on its data), so it is exact there."""
    flops = curves[0].flops
    losses = np.mean([[c.at(f) for f in flops] for c in curves], axis=0)
    inside = ~np.isnan(losses)
    return Curve(flops[inside], losses[inside])


@dataclass(frozen=True)
class CurveReadings:
    """A growing arm at one budget read as the literature reads it, mid-run (module
    docstring): against its final size on one long schedule, against that size's WSD stable
    phase, and its compute (and tokens) to that size's fully decayed loss; each None where the
    rows lack the curves it needs."""

    long: Pooled | None = None
    stable: Pooled | None = None
    reach: Pooled | None = None
    reach_tokens: Pooled | None = None


def curve_readings(rows: Sequence[Mapping[str, Any]], arm: str, budget: float,
                   decay_fraction: float = DECAY_FRACTION) -> CurveReadings:
    """``arm`` at ``budget`` (× base) read from the curves of ``rows`` (one study's, at the
    chosen rates, its long runs' among them; `CurveReadings`)."""
    frontier, long = frontier_rows(rows), long_rows(rows)
    final = final_size(rows, arm)
    mine = [r for r in frontier if r["arm"] == arm and r["budget"] == budget]
    if not mine:
        return CurveReadings()
    flops = float(mine[0]["budget_flops"])
    reach, tokens = _reach_readings(frontier, arm, final, budget, flops)
    return CurveReadings(_long_reading(long, arm, final, flops),
                         _stable_reading(frontier, arm, final, budget, flops, decay_fraction),
                         reach, tokens)


def _by_episode(rows: Iterable[Mapping[str, Any]], arm: str, budget: float | None = None
                ) -> dict[int, Mapping[str, Any]]:
    """``arm``'s rows with a curve by episode (at ``budget``; None: any)."""
    return {int(r["episode"]): r for r in rows if r["arm"] == arm and r.get("curve")
            and (budget is None or r["budget"] == budget)}


def _over_episodes(episodes: frozenset[int], value: Callable[[frozenset[int]], Speedup]
                   ) -> Pooled:
    """``value`` on every episode of one study, with its jackknife t interval of the log
    (none for one episode, or where some leave-one-out value is only a bound)."""
    return _jackknifed(lambda keep: value(keep[0]), (episodes,))


def _long_reading(long: Sequence[Mapping[str, Any]], arm: str, final: str, flops: float
                  ) -> Pooled | None:
    """``F_long⁻¹(A_long(C)) / C`` (module docstring); None without both long runs on one
    schedule of one budget, or where ``C`` is outside the arm's long curve."""
    mine, theirs = _by_episode(long, arm), _by_episode(long, final)
    episodes = frozenset(mine) & frozenset(theirs)
    runs = {(r["schedule"], r["budget_flops"]) for e in episodes for r in (mine[e], theirs[e])}
    if len(runs) != 1:  # none, or two schedules that are not one long schedule
        return None
    a = {e: row_curve(mine[e]) for e in episodes}
    f = {e: row_curve(theirs[e]) for e in episodes}
    if math.isnan(mean_curve([a[e] for e in episodes]).at(flops)):
        return None

    def value(keep: frozenset[int]) -> Speedup:
        loss = mean_curve([a[e] for e in sorted(keep)]).at(flops)
        return speedup(loss, flops, mean_curve([f[e] for e in sorted(keep)]))

    return _over_episodes(episodes, value)


def _stable_reading(frontier: Sequence[Mapping[str, Any]], arm: str, final: str, budget: float,
                    flops: float, decay_fraction: float) -> Pooled | None:
    """``F_stable⁻¹(A_C(C)) / C`` (module docstring): the final size's stable phase is its
    largest budget's run before the decay, with the points its other budgets at that rate
    read on the same run before theirs (a branched cooldown shares it)."""
    sized = [r for r in frontier if r["arm"] == final and r.get("curve")]
    if not sized:
        return None
    top = max(sized, key=lambda r: r["budget"])
    curves = stable_curves(sized, final, row_rate(top), decay_fraction)
    ends = {e: row_curve(r).loss[-1] for e, r in _by_episode(frontier, arm, budget).items()}
    episodes = frozenset(ends) & frozenset(curves)
    if not episodes:
        return None
    return _over_episodes(episodes, lambda keep: speedup(
        float(np.mean([ends[e] for e in keep])), flops,
        mean_curve([curves[e] for e in sorted(keep)])))


def stable_curves(rows: Iterable[Mapping[str, Any]], size: str, rate: Rate,
                  decay_fraction: float = DECAY_FRACTION) -> dict[int, Curve]:
    """Each episode's WSD stable phase of fixed ``size`` at peak ``rate``: the curve points of
    its rows at that rate before each row's decay (its budgets at one rate branch from one run,
    so their points before their decays lie on it). Episodes without such points are left out.
    """
    stable: dict[int, dict[float, float]] = {}
    for r in rows:
        if r["arm"] == size and r.get("curve") and row_rate(r) == rate:
            points = stable.setdefault(int(r["episode"]), {})
            for f, _, nats in r["curve"]:
                if f <= (1.0 - decay_fraction) * r["budget_flops"]:
                    points.setdefault(f, nats)
    return {e: Curve.of(p.items()) for e, p in stable.items() if p}


def _reach_readings(frontier: Sequence[Mapping[str, Any]], arm: str, final: str, budget: float,
                    flops: float) -> tuple[Pooled | None, Pooled | None]:
    """``C / A_C⁻¹(F_C(C))`` in FLOPs and in tokens (module docstring)."""
    mine, theirs = _by_episode(frontier, arm, budget), _by_episode(frontier, final, budget)
    episodes = frozenset(mine) & frozenset(theirs)
    if not episodes:
        return None, None

    def read(keep: frozenset[int], tokens: bool) -> Speedup:
        runs = [mine[e]["curve"] for e in sorted(keep)]
        target = float(np.mean([theirs[e]["curve"][-1][2] for e in keep]))
        got = reach_speedup(mean_curve([row_curve(mine[e]) for e in sorted(keep)]), flops,
                            target)
        if not tokens:
            return got
        at = flops / got.value  # where the arm reaches the target (or the bound's point)
        spent = float(np.mean([np.interp(at, [p[0] for p in run], [p[1] for p in run])
                               for run in runs]))
        theirs_tokens = float(np.mean([theirs[e]["curve"][-1][1] for e in keep]))
        return Speedup(theirs_tokens / spent, got.censored)

    return (_over_episodes(episodes, lambda keep: read(keep, False)),
            _over_episodes(episodes, lambda keep: read(keep, True)))
